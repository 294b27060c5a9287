//! The floors of src/ hold: no module uses one on a higher floor, and no file is part of a
//! circle of files. The floors are the table in docs/architecture.md, read here, so that the
//! picture a reader sees is the one this test enforces.
//!
//! What counts as a use: every path in the code (in `use` declarations and inline, such as
//! `crate::policy::tools::call(...)`, `super::Catalog`, or `tools::Tool` through an import,
//! macro bodies included), resolved to the file that defines the item, following re-exports.
//! Files are parsed with syn, so comments, doc comments and string literals are not code here;
//! nor are `#[cfg(test)]` items. A `mod child;` declaration is not a use; a parent that uses its
//! child's items is.

use proc_macro2::{Spacing, TokenStream, TokenTree};
use quote::ToTokens;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit_mut::VisitMut;

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

/// `#[cfg(test)]`: what the test build alone compiles may use anything.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

/// Takes the test items and the `use` declarations out of a file as it walks it (the paths of
/// the rest are read from its tokens), noting what each use brings in and what is defined.
impl VisitMut for SourceFile {
    fn visit_file_mut(&mut self, file: &mut syn::File) {
        file.items.retain(|item| self.keep(item));
        syn::visit_mut::visit_file_mut(self, file);
    }
    fn visit_item_mod_mut(&mut self, module: &mut syn::ItemMod) {
        if let Some((_, items)) = &mut module.content {
            items.retain(|item| self.keep(item));
        }
        syn::visit_mut::visit_item_mod_mut(self, module);
    }
    fn visit_block_mut(&mut self, block: &mut syn::Block) {
        block.stmts.retain(|stmt| match stmt {
            syn::Stmt::Item(item) => self.keep(item),
            _ => true,
        });
        syn::visit_mut::visit_block_mut(self, block);
    }
    fn visit_item_impl_mut(&mut self, item: &mut syn::ItemImpl) {
        item.items.retain(|i| match i {
            syn::ImplItem::Const(c) => !is_test(&c.attrs),
            syn::ImplItem::Fn(f) => !is_test(&f.attrs),
            syn::ImplItem::Type(t) => !is_test(&t.attrs),
            _ => true,
        });
        syn::visit_mut::visit_item_impl_mut(self, item);
    }
}

impl SourceFile {
    /// Whether `item` stays for the token walk: a `use` is read here, a test item goes.
    fn keep(&mut self, item: &syn::Item) -> bool {
        let (attrs, name) = match item {
            syn::Item::Use(u) => {
                if !is_test(&u.attrs) && u.leading_colon.is_none() {
                    self.use_tree(&u.tree, Vec::new());
                }
                return false;
            }
            syn::Item::Mod(m) => {
                if m.content.is_none() && !is_test(&m.attrs) {
                    self.children.insert(m.ident.to_string());
                }
                (&m.attrs, Some(&m.ident))
            }
            syn::Item::Struct(i) => (&i.attrs, Some(&i.ident)),
            syn::Item::Enum(i) => (&i.attrs, Some(&i.ident)),
            syn::Item::Fn(i) => (&i.attrs, Some(&i.sig.ident)),
            syn::Item::Trait(i) => (&i.attrs, Some(&i.ident)),
            syn::Item::Type(i) => (&i.attrs, Some(&i.ident)),
            syn::Item::Const(i) => (&i.attrs, Some(&i.ident)),
            syn::Item::Static(i) => (&i.attrs, Some(&i.ident)),
            syn::Item::Union(i) => (&i.attrs, Some(&i.ident)),
            syn::Item::Macro(i) => (&i.attrs, i.ident.as_ref()),
            syn::Item::Impl(i) => (&i.attrs, None),
            _ => return true,
        };
        if is_test(attrs) {
            return false;
        }
        if let Some(name) = name {
            self.defines.insert(name.to_string());
        }
        true
    }

    /// The leaves of a use tree: each path with its line, and the name it brings in.
    fn use_tree(&mut self, tree: &syn::UseTree, mut path: Vec<String>) {
        let (ident, name) = match tree {
            syn::UseTree::Path(p) => {
                path.push(p.ident.to_string());
                return self.use_tree(&p.tree, path);
            }
            syn::UseTree::Group(g) => {
                return g.items.iter().for_each(|t| self.use_tree(t, path.clone()));
            }
            syn::UseTree::Glob(g) => {
                self.paths
                    .push((path.clone(), g.star_token.spans[0].start().line));
                return self.globs.push(path);
            }
            syn::UseTree::Name(n) => (&n.ident, &n.ident),
            syn::UseTree::Rename(r) => (&r.ident, &r.rename),
        };
        // `use a::b::{self}` brings `b` in.
        if ident != "self" {
            path.push(ident.to_string());
        }
        let name = if ident == "self" && name == "self" {
            path.last().cloned()
        } else {
            Some(name.to_string())
        };
        self.paths.push((path.clone(), ident.span().start().line));
        if let Some(name) = name.filter(|n| n != "_") {
            self.imports.insert(name, path);
        }
    }

    /// Every `a::b...` of two segments or more in the tokens, macro bodies included; a path
    /// that starts with `::` names another crate.
    fn token_paths(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let path_sep = |k: usize| match (tokens.get(k), tokens.get(k + 1)) {
            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) => {
                a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':'
            }
            _ => false,
        };
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.token_paths(g.stream()),
                TokenTree::Ident(first) if path_sep(i + 1) && !(i >= 2 && path_sep(i - 2)) => {
                    let mut path = vec![first.to_string()];
                    while path_sep(i + 1) {
                        let Some(TokenTree::Ident(next)) = tokens.get(i + 3) else {
                            break;
                        };
                        path.push(next.to_string().trim_start_matches("r#").to_owned());
                        i += 3;
                    }
                    self.paths.push((path, first.span().start().line));
                }
                _ => {}
            }
            i += 1;
        }
    }
}

fn parse(module: Vec<String>, source: &str) -> SourceFile {
    let mut file = SourceFile {
        module,
        ..SourceFile::default()
    };
    let mut tree = syn::parse_file(source).unwrap_or_else(|e| panic!("{:?}: {e}", file.module));
    file.visit_file_mut(&mut tree);
    file.token_paths(tree.into_token_stream());
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

    let in_a_macro = tree(&[
        ("lib.rs", "pub mod low; pub mod high;"),
        (
            "low/mod.rs",
            "pub fn f() { println!(\"{}\", crate::high::g()); }",
        ),
        ("high/mod.rs", "pub fn g() -> u8 { 1 }"),
    ]);
    assert_eq!(in_a_macro.check(&floors).upward.len(), 1);

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
