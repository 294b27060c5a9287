//! The server's workflows as MCP skills (the skills extension, SEP-2640, final; rmcp 3.11):
//! short markdown guides, one per workflow, that an agent reads before such a task rather than
//! piecing the workflow together from tool descriptions. Each is `skill://<name>/SKILL.md`, a
//! resource (`resources/list`, `resources/read`) and an entry of `skills/list` and `skills/get`,
//! whose manifest is that one file with its sha256 and size.
//!
//! The texts are compiled in (`skills/<name>/SKILL.md`). A skill whose workflow this server's
//! settings cannot let work is not offered, as a tool argument is not: the user's project in
//! (workspace-in) needs a host directory (`mountAllow`), credentials a bound secret on the local
//! fleet. `tests/offline/skills.rs` holds every tool, argument, result field and setting a skill
//! names to the catalog and the settings, and their sizes to their bounds.

use crate::fleet::FleetKind;
use crate::policy::error::quote;
use crate::process::Mode;
use rmcp::ErrorData;
use rmcp::model::{
    Resource, ResourceContents, Skill, SkillFrontmatter, SkillResource, SkillResources,
};

/// One skill's compiled-in text.
struct SkillText {
    name: &'static str,
    text: &'static str,
    needs: Needs,
}

/// What a skill's workflow needs of the server's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    Nothing,
    HostDirectories,
    LocalCredentials,
}

/// A skill of `src/protocol/skills/NAME/SKILL.md` and what it needs.
macro_rules! skill {
    ($name:literal, $needs:ident) => {
        SkillText {
            name: $name,
            text: include_str!(concat!("skills/", $name, "/SKILL.md")),
            needs: Needs::$needs,
        }
    };
}

const SKILLS: &[SkillText] = &[
    skill!("set-up-once-fork-many", Nothing),
    skill!("workspace-in", HostDirectories),
    skill!("fan-out-compare-keep", Nothing),
    skill!("egress-the-user-widens", Nothing),
    skill!("credentials-unseen", LocalCredentials),
    skill!("long-jobs-and-tasks", Nothing),
    skill!("terminals-and-services", Nothing),
];

/// The most bytes one skill's text may have, and all of them together: a skill is read by a
/// model before a task, so it is a page, not a manual (the extension's own bound, 16 MiB a
/// skill, is for skills with files beside them).
pub const MAX_SKILL_BYTES: usize = 4096;
pub const MAX_ALL_SKILLS_BYTES: usize = 24 * 1024;

const SCHEME: &str = "skill://";
const SKILL_FILE: &str = "/SKILL.md";

/// What this server's settings let work, deciding which skills it offers.
#[derive(Debug, Clone, Copy)]
pub struct Offered {
    pub host_directories: bool,
    pub local_credentials: bool,
}

impl Offered {
    pub fn of(mode: Mode, host_directories: bool, credentials_bound: bool) -> Offered {
        Offered {
            host_directories,
            local_credentials: credentials_bound && mode != Mode::Single(FleetKind::Cloud),
        }
    }

    fn allows(self, needs: Needs) -> bool {
        match needs {
            Needs::Nothing => true,
            Needs::HostDirectories => self.host_directories,
            Needs::LocalCredentials => self.local_credentials,
        }
    }
}

/// A skill's `SKILL.md` URI.
pub fn uri(name: &str) -> String {
    format!("{SCHEME}{name}{SKILL_FILE}")
}

/// Whether a URI is in the skills' scheme (so that a read of one this server does not offer
/// says so in the skills' words, not the machine resources').
pub fn is_skill_uri(uri: &str) -> bool {
    uri.starts_with(SCHEME)
}

/// The names of the skills offered, in order (for the server's instructions).
pub fn names(offered: Offered) -> Vec<&'static str> {
    SKILLS
        .iter()
        .filter(|s| offered.allows(s.needs))
        .map(|s| s.name)
        .collect()
}

/// The server instructions' pointer to the skills: their URIs, to read before such a task.
pub fn pointer(offered: Offered) -> String {
    format!(
        "Workflow guides (skills; read one before such a task, with resources/read or \
         skills/get): {SCHEME}<name>{SKILL_FILE} for {}.",
        names(offered).join(", ")
    )
}

/// Every skill this server has, offered or not, with its text: for the tests that hold the
/// texts to the catalog.
pub fn all_texts() -> Vec<(&'static str, &'static str)> {
    SKILLS.iter().map(|s| (s.name, s.text)).collect()
}

/// A skill's frontmatter: the `name:` and `description:` lines between the opening and the
/// closing `---`.
pub fn frontmatter(text: &str) -> Result<(String, String), String> {
    let rest = text
        .strip_prefix("---\n")
        .ok_or("a skill starts with a --- line")?;
    let (head, _) = rest
        .split_once("\n---\n")
        .ok_or("a skill's frontmatter ends with a --- line")?;
    let field = |key: &str| {
        head.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    };
    let name = field("name").ok_or("a skill's frontmatter has a name")?;
    let description = field("description").ok_or("a skill's frontmatter has a description")?;
    Ok((name, description))
}

fn entry(skill: &SkillText) -> Result<Skill, ErrorData> {
    let (name, description) = frontmatter(skill.text)
        .map_err(|why| ErrorData::internal_error(format!("skill {}: {why}", skill.name), None))?;
    let uri = uri(skill.name);
    let manifest = vec![SkillResource::from_bytes(
        uri.clone(),
        skill.text.as_bytes(),
    )];
    Ok(Skill::new(
        uri,
        SkillFrontmatter::new(name, description),
        SkillResources::Files(manifest),
    ))
}

/// `skills/list`: the skills offered.
pub fn list(offered: Offered) -> Result<Vec<Skill>, ErrorData> {
    SKILLS
        .iter()
        .filter(|s| offered.allows(s.needs))
        .map(entry)
        .collect()
}

/// The skill a `SKILL.md` URI names, when offered; otherwise -32602 naming the ones there are
/// (the extension's answer for an unknown skill), and why one is not offered.
fn find(offered: Offered, uri: &str) -> Result<&'static SkillText, ErrorData> {
    let named = uri
        .strip_prefix(SCHEME)
        .and_then(|rest| rest.strip_suffix(SKILL_FILE));
    let found = named.and_then(|name| SKILLS.iter().find(|s| s.name == name));
    match found {
        Some(skill) if offered.allows(skill.needs) => Ok(skill),
        Some(skill) => Err(ErrorData::invalid_params(
            format!(
                "skill {} is not offered on this server: {}",
                quote(uri),
                match skill.needs {
                    Needs::HostDirectories =>
                        "no host directory is open to machines (the operator's mountAllow setting)",
                    Needs::LocalCredentials =>
                        "no secrets are bound for local machines (the operator's credentials setting)",
                    Needs::Nothing => "it is not",
                }
            ),
            None,
        )),
        None => Err(ErrorData::invalid_params(
            format!(
                "no skill {}; the skills are {}",
                quote(uri),
                names(offered)
                    .iter()
                    .map(|n| self::uri(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None,
        )),
    }
}

/// `skills/get`.
pub fn get(offered: Offered, uri: &str) -> Result<Skill, ErrorData> {
    entry(find(offered, uri)?)
}

/// The skills' `SKILL.md` files as resources, for `resources/list`.
pub fn resources(offered: Offered) -> Vec<Resource> {
    SKILLS
        .iter()
        .filter(|s| offered.allows(s.needs))
        .filter_map(|s| {
            let (_, description) = frontmatter(s.text).ok()?;
            Some(
                Resource::new(uri(s.name), s.name)
                    .with_description(description)
                    .with_mime_type("text/markdown")
                    .with_size(s.text.len() as u64),
            )
        })
        .collect()
}

/// `resources/read` of a skill's file: exactly the bytes its manifest's digest was made of.
pub fn read(offered: Offered, uri: &str) -> Result<Vec<ResourceContents>, ErrorData> {
    let skill = find(offered, uri)?;
    Ok(vec![
        ResourceContents::text(skill.text, uri).with_mime_type("text/markdown"),
    ])
}
