//! The floors of src/ hold: no module uses one on a higher floor, and no file is part of a
//! circle of files. The floors are the table in docs/architecture.md, read here, so that the
//! picture a reader sees is the one this test enforces.
//!
//! What counts as a use: every path in the code (in `use` declarations and inline, such as
//! `crate::policy::tools::call(...)`, `super::Catalog`, or `tools::Tool` through an import),
//! resolved to the file that defines the item, following re-exports. Comments, doc comments,
//! string literals and `#[cfg(test)]` items are not code here. A `mod child;` declaration is
//! not a use; a parent that uses its child's items is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One floor of the table: its number and the top-level modules on it.
#[derive(Debug, Clone)]
struct Floor {
    number: u32,
    modules: Vec<String>,
}

/// Reads the floors from the table between the `floors:` markers of docs/architecture.md:
/// rows `| N | `a`, `b` | what it owns |`.
fn floors_from(doc: &str) -> Vec<Floor> {
    let start = doc
        .find("<!-- floors: begin")
        .expect("docs/architecture.md has no <!-- floors: begin --> marker");
    let end = doc[start..]
        .find("<!-- floors: end")
        .expect("docs/architecture.md has no <!-- floors: end --> marker")
        + start;
    let mut floors = Vec::new();
    for line in doc[start..end].lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 {
            continue;
        }
        let Ok(number) = cells[1].parse::<u32>() else {
            continue;
        };
        let modules = cells[2]
            .split(',')
            .map(|m| m.trim().trim_matches('`').to_owned())
            .filter(|m| !m.is_empty())
            .collect();
        floors.push(Floor { number, modules });
    }
    floors
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

/// The tokens of Rust source that matter for paths, each with its line: comments, string,
/// byte-string, raw-string and char literals and lifetimes are left out.
fn tokens(source: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let newlines = |from: usize, to: usize, chars: &[char]| {
        chars[from..to.min(chars.len())]
            .iter()
            .filter(|c| **c == '\n')
            .count()
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied().unwrap_or('\0');
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == '*' {
            let (mut depth, start) = (0usize, i);
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += newlines(start, i, &chars);
        } else if (c == 'r' || (c == 'b' && next == 'r')) && {
            let at = if c == 'b' { i + 2 } else { i + 1 };
            let mut j = at;
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            chars.get(j) == Some(&'"') && (i == 0 || !is_ident_char(chars[i - 1]))
        } {
            // A raw string: r"..." or r#"..."# (and b-prefixed), no escapes inside.
            let start = i;
            i += if c == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while chars[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            line += newlines(start, i, &chars);
        } else if c == '"' || (c == 'b' && next == '"') {
            let start = i;
            i += if c == 'b' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            line += newlines(start, i, &chars);
        } else if c == '\'' || (c == 'b' && next == '\'') {
            let at = if c == 'b' { i + 1 } else { i };
            let after = chars.get(at + 1).copied().unwrap_or('\0');
            if after == '\\' {
                // An escaped char literal: '\n', '\'', '\u{..}'.
                i = at + 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(at + 2) == Some(&'\'') {
                i = at + 3;
            } else if c == 'b' {
                out.push((Token::Ident("b".into()), line));
                i += 1;
            } else {
                // A lifetime or a label.
                i += 1;
                while i < chars.len() && is_ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if is_ident_char(c) && !c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && is_ident_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let word = word.strip_prefix("r#").map(str::to_owned).unwrap_or(word);
            out.push((Token::Ident(word), line));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (is_ident_char(chars[i]) || chars[i] == '.') {
                if chars[i] == '.' && !chars.get(i + 1).is_some_and(char::is_ascii_digit) {
                    break;
                }
                i += 1;
            }
        } else if c == ':' && next == ':' {
            out.push((Token::PathSep, line));
            i += 2;
        } else {
            out.push((Token::Punct(c), line));
            i += 1;
        }
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The tokens without the items under `#[cfg(test)]`: what the test build alone compiles may
/// use anything.
fn without_test_items(tokens: Vec<(Token, usize)>) -> Vec<(Token, usize)> {
    let is = |t: &Token, c: char| *t == Token::Punct(c);
    let ident = |t: &Token, w: &str| matches!(t, Token::Ident(x) if x == w);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let cfg_test = i + 6 < tokens.len()
            && is(&tokens[i].0, '#')
            && is(&tokens[i + 1].0, '[')
            && ident(&tokens[i + 2].0, "cfg")
            && is(&tokens[i + 3].0, '(')
            && ident(&tokens[i + 4].0, "test")
            && is(&tokens[i + 5].0, ')')
            && is(&tokens[i + 6].0, ']');
        if !cfg_test {
            out.push(tokens[i].clone());
            i += 1;
            continue;
        }
        // Skip the attribute, then the item: up to a `;` at depth 0 or through its braces.
        i += 7;
        let mut depth = 0i32;
        while i < tokens.len() {
            match &tokens[i].0 {
                Token::Punct('{') | Token::Punct('(') | Token::Punct('[') => depth += 1,
                Token::Punct('}') | Token::Punct(')') | Token::Punct(']') => {
                    depth -= 1;
                    if depth == 0 && tokens[i].0 == Token::Punct('}') {
                        i += 1;
                        break;
                    }
                }
                Token::Punct(';') if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
    }
    out
}

/// One `use` leaf: the name it brings in (`None` for a glob) and the path as written.
#[derive(Debug, Clone)]
struct UseLeaf {
    name: Option<String>,
    path: Vec<String>,
}

/// The leaves of one use tree, from the tokens after `use` up to its `;`.
fn use_leaves(tree: &[Token], prefix: &[String], out: &mut Vec<UseLeaf>) {
    // Split at top-level commas.
    let mut parts: Vec<&[Token]> = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, t) in tree.iter().enumerate() {
        match t {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => depth -= 1,
            Token::Punct(',') if depth == 0 => {
                parts.push(&tree[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..]);
    for part in parts {
        let mut path = prefix.to_vec();
        let mut k = 0;
        let mut rename = None;
        let mut glob = false;
        while k < part.len() {
            match &part[k] {
                Token::Ident(w) if w == "as" => {
                    if let Some(Token::Ident(alias)) = part.get(k + 1) {
                        rename = Some(alias.clone());
                    }
                    k += 2;
                }
                Token::Ident(w) => {
                    path.push(w.clone());
                    k += 1;
                }
                Token::PathSep => k += 1,
                Token::Punct('*') => {
                    glob = true;
                    k += 1;
                }
                Token::Punct('{') => {
                    // The group runs to the part's end (its closing brace is last).
                    let inner = &part[k + 1..part.len().saturating_sub(1)];
                    use_leaves(inner, &path, out);
                    path.clear();
                    break;
                }
                _ => k += 1,
            }
        }
        if path.is_empty() {
            continue;
        }
        if glob {
            out.push(UseLeaf { name: None, path });
            continue;
        }
        // `use a::b::{self}` brings `b` in.
        if path.last().is_some_and(|l| l == "self") {
            path.pop();
        }
        let name = rename.or_else(|| path.last().cloned());
        if name.as_deref() != Some("_") {
            out.push(UseLeaf { name, path });
        }
    }
}

/// What one source file holds that matters here.
#[derive(Debug, Default)]
struct SourceFile {
    /// `crate::a::b` for src/a/b.rs and src/a/b/mod.rs.
    module: Vec<String>,
    /// Items it defines (structs, enums, fns, traits, types, consts, statics, mods, macros).
    defines: BTreeSet<String>,
    /// Names its `use` declarations bring in, with the path each stands for (as written).
    imports: BTreeMap<String, Vec<String>>,
    /// Glob imports (`pub use model::*`).
    globs: Vec<Vec<String>>,
    /// Child modules it declares (`mod x;`), which a path may start with.
    children: BTreeSet<String>,
    /// Every path in the code, with its line, as written.
    paths: Vec<(Vec<String>, usize)>,
}

fn parse(module: Vec<String>, source: &str) -> SourceFile {
    let tokens = without_test_items(tokens(source));
    let mut file = SourceFile {
        module,
        ..SourceFile::default()
    };
    let definers = [
        "struct", "enum", "fn", "trait", "type", "const", "static", "union", "mod",
    ];
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].0 {
            Token::Ident(w) if w == "use" => {
                let line = tokens[i].1;
                let end = tokens[i..]
                    .iter()
                    .position(|(t, _)| *t == Token::Punct(';'))
                    .map_or(tokens.len(), |p| i + p);
                let tree: Vec<Token> = tokens[i + 1..end].iter().map(|(t, _)| t.clone()).collect();
                let mut leaves = Vec::new();
                use_leaves(&tree, &[], &mut leaves);
                for leaf in leaves {
                    file.paths.push((leaf.path.clone(), line));
                    match leaf.name {
                        Some(name) => {
                            file.imports.insert(name, leaf.path);
                        }
                        None => file.globs.push(leaf.path),
                    }
                }
                i = end + 1;
            }
            Token::Ident(w) if definers.contains(&w.as_str()) => {
                if let Some((Token::Ident(name), _)) = tokens.get(i + 1) {
                    file.defines.insert(name.clone());
                    if w == "mod" && tokens.get(i + 2).map(|t| &t.0) == Some(&Token::Punct(';')) {
                        file.children.insert(name.clone());
                    }
                }
                i += 1;
            }
            Token::Ident(w) if w == "macro_rules" => {
                if let Some((Token::Ident(name), _)) = tokens.get(i + 2) {
                    file.defines.insert(name.clone());
                }
                i += 1;
            }
            Token::Ident(first)
                if tokens.get(i + 1).map(|t| &t.0) == Some(&Token::PathSep)
                    && (i == 0 || tokens[i - 1].0 != Token::PathSep) =>
            {
                let line = tokens[i].1;
                let mut path = vec![first.clone()];
                let mut k = i + 1;
                while tokens.get(k).map(|t| &t.0) == Some(&Token::PathSep) {
                    match tokens.get(k + 1).map(|t| &t.0) {
                        Some(Token::Ident(w)) => {
                            path.push(w.clone());
                            k += 2;
                        }
                        _ => break,
                    }
                }
                file.paths.push((path, line));
                i = k;
            }
            _ => i += 1,
        }
    }
    file
}

/// The module a file is, from its path under src/.
fn module_of(relative: &Path) -> Vec<String> {
    let mut module = vec!["crate".to_owned()];
    let parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    for (k, part) in parts.iter().enumerate() {
        let last = k + 1 == parts.len();
        if !last {
            module.push(part.clone());
        } else if part != "mod.rs" && part != "lib.rs" {
            module.push(part.trim_end_matches(".rs").to_owned());
        }
    }
    module
}

/// What the check found wrong, one line each.
#[derive(Debug, Default)]
struct Findings {
    upward: Vec<String>,
    circles: Vec<String>,
    unplaced: Vec<String>,
}

struct Tree {
    files: BTreeMap<String, SourceFile>,
    /// Module path (joined with ::) to the file that is that module.
    by_module: BTreeMap<String, String>,
}

impl Tree {
    fn new(sources: Vec<(String, String)>) -> Tree {
        let mut files = BTreeMap::new();
        let mut by_module = BTreeMap::new();
        for (relative, text) in sources {
            let module = module_of(Path::new(&relative));
            by_module.insert(module.join("::"), relative.clone());
            files.insert(relative, parse(module, &text));
        }
        Tree { files, by_module }
    }

    /// `path` as written in `file`, made absolute (`crate::...`), or `None` when it leaves the
    /// crate (std, rmcp, an enum's variant of a type defined right there).
    fn absolute(&self, file: &SourceFile, path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        let mut here = file.module.clone();
        match first.as_str() {
            "crate" | "smol_mcp" => {
                let mut p = vec!["crate".to_owned()];
                p.extend_from_slice(&path[1..]);
                Some(p)
            }
            "self" => {
                here.extend_from_slice(&path[1..]);
                Some(here)
            }
            "super" => {
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    here.pop();
                    rest = &rest[1..];
                }
                here.extend_from_slice(rest);
                Some(here)
            }
            name if file.children.contains(name) => {
                here.extend_from_slice(path);
                Some(here)
            }
            name => {
                let target = file.imports.get(name)?;
                // An import's own path is relative to the file that has it.
                let mut full = self.absolute(file, target).filter(|t| t != path)?;
                full.extend_from_slice(&path[1..]);
                Some(full)
            }
        }
    }

    /// The file that defines what `path` (absolute) names, following re-exports; and whether
    /// the name was found defined there (a module itself counts).
    fn resolve(&self, path: &[String], depth: usize) -> Option<(String, bool)> {
        let mut prefix = path.len();
        let file_name = loop {
            if prefix == 0 {
                return None;
            }
            if let Some(f) = self.by_module.get(&path[..prefix].join("::")) {
                break f.clone();
            }
            prefix -= 1;
        };
        let rest = &path[prefix..];
        let Some(name) = rest.first() else {
            return Some((file_name, true));
        };
        let file = &self.files[&file_name];
        if file.defines.contains(name) || depth > 8 {
            return Some((file_name, file.defines.contains(name)));
        }
        if let Some(target) = file.imports.get(name)
            && let Some(mut full) = self.absolute(file, target)
        {
            full.extend_from_slice(&rest[1..]);
            if let Some(found) = self.resolve(&full, depth + 1) {
                return Some(found);
            }
        }
        for glob in &file.globs {
            if let Some(mut full) = self.absolute(file, glob) {
                full.extend_from_slice(rest);
                if let Some((f, true)) = self.resolve(&full, depth + 1) {
                    return Some((f, true));
                }
            }
        }
        Some((file_name, false))
    }

    /// Every file each file uses, with the first line of each use.
    fn edges(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        let mut edges: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for (name, file) in &self.files {
            let out = edges.entry(name.clone()).or_default();
            for (path, line) in &file.paths {
                let Some(absolute) = self.absolute(file, path) else {
                    continue;
                };
                if let Some((target, _)) = self.resolve(&absolute, 0)
                    && target != *name
                {
                    out.entry(target).or_insert(*line);
                }
            }
        }
        edges
    }

    fn top_module(&self, file: &str) -> String {
        self.files[file]
            .module
            .get(1)
            .cloned()
            .unwrap_or_else(|| "crate".into())
    }

    fn check(&self, floors: &[Floor]) -> Findings {
        let mut findings = Findings::default();
        let floor_of = |module: &str| {
            floors
                .iter()
                .find(|f| f.modules.iter().any(|m| m == module))
                .map(|f| f.number)
        };
        let edges = self.edges();
        for file in self.files.keys() {
            let top = self.top_module(file);
            if top != "crate" && floor_of(&top).is_none() {
                findings
                    .unplaced
                    .push(format!("src/{file}: module `{top}` is on no floor"));
            }
        }
        for (from, targets) in &edges {
            let (Some(mine), from_top) = (floor_of(&self.top_module(from)), self.top_module(from))
            else {
                continue;
            };
            for (to, line) in targets {
                let to_top = self.top_module(to);
                if let Some(theirs) = floor_of(&to_top)
                    && theirs > mine
                {
                    findings.upward.push(format!(
                        "src/{from}:{line}: `{from_top}` (floor {mine}) uses src/{to} of `{to_top}` (floor {theirs})"
                    ));
                }
            }
        }
        // A circle: a file that reaches itself; then a module (folder) that does, files taken
        // together by the module they are in, two and three levels down (`policy`,
        // `policy::tools`). Each is reported once.
        let mut seen_circles = BTreeSet::new();
        for start in edges.keys() {
            if let Some(circle) = circle_through(&edges, start) {
                let mut key = circle[1..].to_vec();
                key.sort();
                if seen_circles.insert(key) {
                    let lines: Vec<String> = circle
                        .windows(2)
                        .map(|w| format!("src/{}:{} -> src/{}", w[0], edges[&w[0]][&w[1]], w[1]))
                        .collect();
                    findings.circles.push(lines.join(", "));
                }
            }
        }
        for depth in [2, 3] {
            let module_of = |file: &str| {
                let module = &self.files[file].module;
                module[..module.len().min(depth)].join("::")
            };
            let mut modules: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
            for (from, targets) in &edges {
                let out = modules.entry(module_of(from)).or_default();
                for to in targets.keys() {
                    let (a, b) = (module_of(from), module_of(to));
                    // A module's own files and its parent's file are not two modules.
                    if a != b
                        && !a.starts_with(&format!("{b}::"))
                        && !b.starts_with(&format!("{a}::"))
                    {
                        out.entry(b).or_insert(0);
                    }
                }
            }
            for start in modules.keys() {
                if let Some(circle) = circle_through(&modules, start) {
                    let mut key = circle[1..].to_vec();
                    key.sort();
                    if seen_circles.insert(key) {
                        findings
                            .circles
                            .push(format!("modules: {}", circle.join(" -> ")));
                    }
                }
            }
        }
        findings
    }
}

/// The shortest way from `start` back to itself, as the files on it (first and last the same).
fn circle_through(
    edges: &BTreeMap<String, BTreeMap<String, usize>>,
    start: &str,
) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(at) = queue.pop_front() {
        for next in edges.get(at).into_iter().flat_map(|t| t.keys()) {
            if next == start {
                let mut way = vec![start.to_owned(), at.to_owned()];
                let mut cur = at;
                while cur != start {
                    cur = came_from[cur];
                    way.push(cur.to_owned());
                }
                way.reverse();
                way.dedup();
                if way.len() == 1 {
                    way.push(start.to_owned());
                }
                if way.first() != way.last() {
                    way.push(start.to_owned());
                }
                return Some(way);
            }
            if next != start && !came_from.contains_key(next.as_str()) {
                came_from.insert(next, at);
                queue.push_back(next);
            }
        }
    }
    None
}

fn sources(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path: PathBuf = entry.unwrap().path();
            if path.is_dir() {
                // The binaries are the top of the house and live outside the library.
                if path.file_name().is_some_and(|n| n != "bin") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((relative, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn project_floors() -> Vec<Floor> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .unwrap();
    floors_from(&doc)
}

#[test]
fn no_module_uses_one_on_a_higher_floor_and_no_file_is_in_a_circle() {
    let floors = project_floors();
    assert!(
        floors.len() >= 5,
        "docs/architecture.md's floors table reads as {floors:?}"
    );
    let tree = Tree::new(sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")));
    let edges: usize = tree.edges().values().map(BTreeMap::len).sum();
    println!(
        "{} files, {edges} uses between them, {} floors",
        tree.files.len(),
        floors.len()
    );
    // The reader itself sees what it must: a use the compiler needs is found.
    assert!(
        tree.edges()["policy/tools/call.rs"].contains_key("process/mod.rs"),
        "the reader no longer sees call.rs use the process"
    );
    let findings = tree.check(&floors);
    assert!(
        findings.unplaced.is_empty(),
        "modules missing from the floors table of docs/architecture.md:\n{}",
        findings.unplaced.join("\n")
    );
    assert!(
        findings.upward.is_empty(),
        "uses of a higher floor (what a lower floor needs from a higher one is a trait or a type \
         of the lower floor; see docs/architecture.md):\n{}",
        findings.upward.join("\n")
    );
    assert!(
        findings.circles.is_empty(),
        "circles of files:\n{}",
        findings.circles.join("\n")
    );
}

/// The check on a small tree of its own: it must see each kind of use, and nothing else.
#[test]
fn the_check_finds_upward_uses_and_circles_and_ignores_comments_strings_and_tests() {
    let floors = vec![
        Floor {
            number: 1,
            modules: vec!["low".into()],
        },
        Floor {
            number: 2,
            modules: vec!["high".into()],
        },
    ];
    let tree = |files: &[(&str, &str)]| {
        Tree::new(
            files
                .iter()
                .map(|(p, t)| (p.to_string(), t.to_string()))
                .collect(),
        )
    };
    let clean = tree(&[
        ("lib.rs", "pub mod low; pub mod high;"),
        (
            "low/mod.rs",
            "//! Not code: crate::high::Thing\npub mod a;\npub use a::Thing;\n\
             const S: &str = \"crate::high::Thing\";\nconst R: &str = r#\"crate::high::x\"#;\n\
             fn f<'a>(x: &'a str) -> char { 'x' }\n\
             #[cfg(test)]\nmod tests { use crate::high::Thing; }",
        ),
        ("low/a.rs", "pub struct Thing;"),
        (
            "high/mod.rs",
            "use crate::low::Thing;\npub fn g() -> Thing { Thing }",
        ),
    ]);
    let found = clean.check(&floors);
    assert!(found.upward.is_empty(), "{:?}", found.upward);
    assert!(found.circles.is_empty(), "{:?}", found.circles);
    // The re-export is followed to the file that defines the item.
    assert!(clean.edges()["high/mod.rs"].contains_key("low/a.rs"));

    let upward = tree(&[
        ("lib.rs", "pub mod low; pub mod high;"),
        ("low/mod.rs", "pub fn f() { crate::high::g(); }"),
        ("high/mod.rs", "pub fn g() {}"),
    ]);
    let found = upward.check(&floors);
    assert_eq!(found.upward.len(), 1, "{:?}", found.upward);
    assert!(
        found.upward[0].starts_with("src/low/mod.rs:1:"),
        "{:?}",
        found.upward
    );

    let through_import = tree(&[
        ("lib.rs", "pub mod low; pub mod high;"),
        ("low/mod.rs", "use crate::high;\npub fn f() { high::g(); }"),
        ("high/mod.rs", "pub fn g() {}"),
    ]);
    assert_eq!(through_import.check(&floors).upward.len(), 1);

    let circle = tree(&[
        ("lib.rs", "pub mod low; pub mod high;"),
        (
            "low/mod.rs",
            "mod a; mod b; pub struct Top; fn f() -> a::A { a::A }",
        ),
        (
            "low/a.rs",
            "pub struct A; fn g() -> super::b::B { super::b::B }",
        ),
        (
            "low/b.rs",
            "pub struct B; fn h() -> super::Top { super::Top }",
        ),
        ("high/mod.rs", ""),
    ]);
    let found = circle.check(&floors);
    assert_eq!(found.circles.len(), 1, "{:?}", found.circles);
    for file in ["low/mod.rs", "low/a.rs", "low/b.rs"] {
        assert!(found.circles[0].contains(file), "{:?}", found.circles);
    }

    // Two folders of one floor that use each other through different files.
    let folders = tree(&[
        ("lib.rs", "pub mod low; pub mod high;"),
        ("low/mod.rs", "pub mod a; pub mod b;"),
        ("low/a/mod.rs", "pub mod x; pub mod y;"),
        ("low/a/x.rs", "pub struct X;"),
        (
            "low/a/y.rs",
            "pub fn y() -> crate::low::b::q::Q { crate::low::b::q::Q }",
        ),
        ("low/b/mod.rs", "pub mod p; pub mod q;"),
        (
            "low/b/p.rs",
            "pub fn p() -> crate::low::a::x::X { crate::low::a::x::X }",
        ),
        ("low/b/q.rs", "pub struct Q;"),
        ("high/mod.rs", ""),
    ]);
    let found = folders.check(&floors);
    assert_eq!(
        found.circles,
        ["modules: crate::low::a -> crate::low::b -> crate::low::a"]
    );

    let unplaced = tree(&[("lib.rs", "pub mod attic;"), ("attic/mod.rs", "")]);
    assert_eq!(unplaced.check(&floors).unplaced.len(), 1);
}
