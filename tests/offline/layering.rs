//! No file of src/, nor folder two or three levels down, is part of a circle of uses (the floors
//! themselves are kept by the compiler: floors.rs). A use is every path in the code (`use`
//! trees, inline paths, attributes, macro bodies), resolved to the file that defines the item
//! through imports, re-exports and globs. Files are parsed with syn: comments and strings are not
//! code, nor are `#[cfg(test)]` items; a `mod child;` declaration is not a use.

use proc_macro2::{Spacing, TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use syn::visit::Visit;

type Edges = BTreeMap<String, BTreeMap<String, usize>>;

#[derive(Default)]
struct SourceFile {
    module: Vec<String>,       // `crate::a::b` for src/a/b.rs and src/a/b/mod.rs
    defines: BTreeSet<String>, // items defined, at any depth
    imports: BTreeMap<String, Vec<String>>, // name brought in by `use`, to the path as written
    globs: Vec<Vec<String>>,   // `use x::*`
    children: BTreeSet<String>, // `mod x;`
    paths: Vec<(Vec<String>, usize)>, // every path as written, with its line
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    let test = |a: &syn::Attribute| a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test");
    attrs.iter().any(|a| a.path().is_ident("cfg") && test(a))
}

impl<'a> Visit<'a> for SourceFile {
    fn visit_item(&mut self, item: &'a syn::Item) {
        use syn::Item::*;
        let (attrs, name) = match item {
            Mod(i) => (&i.attrs, Some(&i.ident)),
            Struct(i) => (&i.attrs, Some(&i.ident)),
            Enum(i) => (&i.attrs, Some(&i.ident)),
            Fn(i) => (&i.attrs, Some(&i.sig.ident)),
            Trait(i) => (&i.attrs, Some(&i.ident)),
            Type(i) => (&i.attrs, Some(&i.ident)),
            Const(i) => (&i.attrs, Some(&i.ident)),
            Static(i) => (&i.attrs, Some(&i.ident)),
            Union(i) => (&i.attrs, Some(&i.ident)),
            Macro(i) => (&i.attrs, i.ident.as_ref()),
            Impl(i) => (&i.attrs, None),
            Use(i) => (&i.attrs, None),
            _ => return syn::visit::visit_item(self, item),
        };
        if is_test(attrs) {
            return;
        }
        self.defines.extend(name.map(ToString::to_string));
        match item {
            Mod(m) if m.content.is_none() => drop(self.children.insert(m.ident.to_string())),
            Use(u) if u.leading_colon.is_none() => self.use_tree(&u.tree, Vec::new()),
            Use(_) => {}
            _ => syn::visit::visit_item(self, item),
        }
    }
    fn visit_impl_item(&mut self, item: &'a syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !is_test(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }
    fn visit_path(&mut self, path: &'a syn::Path) {
        if path.leading_colon.is_none() {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = path.segments[0].ident.span().start().line;
            self.paths.push((segments, line));
        }
        syn::visit::visit_path(self, path);
    }
    /// `pub(super)` names where an item is seen from, not what it uses.
    fn visit_visibility(&mut self, _: &'a syn::Visibility) {}
    fn visit_macro(&mut self, mac: &'a syn::Macro) {
        self.visit_path(&mac.path);
        self.token_paths(mac.tokens.clone());
    }
    fn visit_meta_list(&mut self, list: &'a syn::MetaList) {
        self.visit_path(&list.path);
        self.token_paths(list.tokens.clone());
    }
}

impl SourceFile {
    fn use_tree(&mut self, tree: &syn::UseTree, mut path: Vec<String>) {
        let (ident, name) = match tree {
            syn::UseTree::Path(p) => {
                return self.use_tree(&p.tree, [path, vec![p.ident.to_string()]].concat());
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
        if ident != "self" {
            path.push(ident.to_string()); // `use a::b::{self}` brings `b` in
        }
        self.paths.push((path.clone(), ident.span().start().line));
        let name = if name == "self" {
            path.last().cloned()
        } else {
            Some(name.to_string())
        };
        if let Some(name) = name.filter(|n| n != "_") {
            self.imports.insert(name, path);
        }
    }

    /// Every `a::b...` in a macro's tokens; one that follows `::` continues a path or names
    /// another crate.
    fn token_paths(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let sep = |k: usize| match (tokens.get(k), tokens.get(k + 1)) {
            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) => {
                a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':'
            }
            _ => false,
        };
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.token_paths(g.stream()),
                TokenTree::Ident(first) if sep(i + 1) && !(i >= 2 && sep(i - 2)) => {
                    let mut path = vec![first.to_string()];
                    while let (true, Some(TokenTree::Ident(next))) = (sep(i + 1), tokens.get(i + 3))
                    {
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

struct Tree(BTreeMap<String, SourceFile>, BTreeMap<String, String>); // files; module to file

impl Tree {
    fn new(sources: Vec<(String, String)>) -> Tree {
        let mut tree = Tree(BTreeMap::new(), BTreeMap::new());
        for (relative, text) in sources {
            let mut module = vec!["crate".to_owned()];
            module.extend(
                relative
                    .trim_end_matches(".rs")
                    .split('/')
                    .map(str::to_owned),
            );
            module.retain(|m| m != "mod" && m != "lib");
            let mut file = SourceFile {
                module,
                ..SourceFile::default()
            };
            file.visit_file(&syn::parse_file(&text).unwrap_or_else(|e| panic!("{relative}: {e}")));
            tree.1.insert(file.module.join("::"), relative.clone());
            tree.0.insert(relative, file);
        }
        tree
    }

    /// `path` as written in `file`, made `crate::...`, or `None` when it leaves the crate.
    fn absolute(&self, file: &SourceFile, path: &[String]) -> Option<Vec<String>> {
        let (first, mut here) = (path.first()?.as_str(), file.module.clone());
        match first {
            "crate" | "smol_mcp" => return Some([&["crate".to_owned()], &path[1..]].concat()),
            "self" => return Some([&here, &path[1..]].concat()),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                here.truncate(here.len().saturating_sub(ups));
                return Some([&here, &path[ups..]].concat());
            }
            name if file.children.contains(name) => return Some([&here, path].concat()),
            _ => {}
        }
        // An import's own path is relative to the file that has it.
        let full = self
            .absolute(file, file.imports.get(first)?)
            .filter(|t| t != path)?;
        Some([&full, &path[1..]].concat())
    }

    /// The file that defines what `path` names, following re-exports; and whether the name was
    /// found defined there (a module itself counts).
    fn resolve(&self, path: &[String], depth: usize) -> Option<(String, bool)> {
        let prefix = (1..=path.len())
            .rev()
            .find(|&n| self.1.contains_key(&path[..n].join("::")))?;
        let (name, rest) = (self.1[&path[..prefix].join("::")].clone(), &path[prefix..]);
        let (file, Some(item)) = (&self.0[&name], rest.first()) else {
            return Some((name, true));
        };
        if file.defines.contains(item) || depth > 8 {
            return Some((name, file.defines.contains(item)));
        }
        let via_import = file.imports.get(item).and_then(|t| self.absolute(file, t));
        if let Some(found) =
            via_import.and_then(|t| self.resolve(&[&t, &rest[1..]].concat(), depth + 1))
        {
            return Some(found);
        }
        let via_globs = file.globs.iter().filter_map(|g| self.absolute(file, g));
        via_globs
            .filter_map(|g| self.resolve(&[&g, rest].concat(), depth + 1))
            .find(|(_, defined)| *defined)
            .or(Some((name, false)))
    }

    fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (name, file) in &self.0 {
            let out = edges.entry(name.clone()).or_default();
            for (path, line) in &file.paths {
                let target = self.absolute(file, path).and_then(|p| self.resolve(&p, 0));
                if let Some((target, _)) = target.filter(|(t, _)| t != name) {
                    out.entry(target).or_insert(*line);
                }
            }
        }
        edges
    }

    /// Each circle, files first, then folders: `a <-> b <-> c`.
    fn circles(&self) -> Vec<String> {
        let (edges, mut found) = (self.edges(), Vec::new());
        // Files, then folders two and three levels down (`crate::policy`, `crate::policy::tools`);
        // a folder and the folders inside it are not two.
        for depth in [0, 2, 3] {
            let key = |f: &str| match depth {
                0 => f.to_owned(),
                _ => self.0[f]
                    .module
                    .iter()
                    .take(depth)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("::"),
            };
            let nested = |a: &str, b: &str| {
                a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
            };
            let mut grouped: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (from, to) in edges
                .iter()
                .flat_map(|(f, t)| t.keys().map(move |t| (key(f), key(t))))
            {
                let out = grouped.entry(from.clone()).or_default();
                if from != to && !nested(&from, &to) {
                    out.insert(to);
                }
            }
            found.extend(circles(&grouped));
        }
        found
    }
}

/// Each set of nodes that reach one another, once.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    let reach = |from: &str| {
        let (mut seen, mut stack) = (BTreeSet::new(), vec![from.to_owned()]);
        while let Some(at) = stack.pop() {
            let next = edges.get(&at).into_iter().flatten();
            stack.extend(next.filter(|n| seen.insert(n.to_string())).cloned());
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<String>> =
        edges.keys().map(|k| (k.as_str(), reach(k))).collect();
    let mut found = BTreeSet::new();
    for (node, reached) in &reaches {
        if reached.contains(*node) {
            let with = reaches.iter().filter(|(_, r)| r.contains(*node));
            let circle: Vec<&str> = with
                .map(|(m, _)| *m)
                .filter(|m| reached.contains(*m))
                .collect();
            found.insert(circle.join(" <-> "));
        }
    }
    found
}

fn sources(dir: &std::path::Path, under: &str, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let (path, name) = (
            entry.path(),
            entry.file_name().to_string_lossy().into_owned(),
        );
        if path.is_dir() && name != "bin" {
            sources(&path, &format!("{under}{name}/"), out); // the binaries stand on top
        } else if name.ends_with(".rs") {
            out.push((
                format!("{under}{name}"),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
}

#[test]
fn no_file_or_folder_of_src_is_in_a_circle() {
    let mut files = Vec::new();
    sources(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        "",
        &mut files,
    );
    let tree = Tree::new(files);
    // The reader sees what it must: a use the compiler needs.
    assert!(tree.edges()["policy/tools/call.rs"].contains_key("process/mod.rs"));
    let circles = tree.circles();
    assert!(
        circles.is_empty(),
        "circles of uses:\n{}",
        circles.join("\n")
    );
}

/// The check on small trees of its own: it must see each kind of use, and nothing else.
#[test]
fn the_reader_sees_every_kind_of_use_and_ignores_comments_strings_and_tests() {
    let tree = |files: &[(&str, &str)]| {
        let lib = ("lib.rs".to_owned(), "pub mod low; pub mod high;".to_owned());
        let files = files.iter().map(|(p, t)| (p.to_string(), t.to_string()));
        Tree::new([lib].into_iter().chain(files).collect())
    };
    let clean = tree(&[
        (
            "low/mod.rs",
            "//! Not code: crate::high::Thing\npub mod a;\npub use a::Thing;\nconst S: &str = \"crate::high::Thing\";\nconst R: &str = r#\"crate::high::x\"#;\nfn f<'a>(x: &'a str) -> char { 'x' }\n#[cfg(test)]\nmod tests { use crate::high::Thing; }\nimpl Thing { #[cfg(test)] fn t() { crate::high::g(); } }",
        ),
        ("low/a.rs", "pub struct Thing;"),
        (
            "high/mod.rs",
            "use crate::low::Thing;\npub fn g() -> Thing { Thing }",
        ),
    ]);
    let edges = clean.edges();
    assert_eq!(edges["low/mod.rs"].keys().collect::<Vec<_>>(), ["low/a.rs"]);
    assert_eq!(
        edges["high/mod.rs"].keys().collect::<Vec<_>>(),
        ["low/a.rs"],
        "a re-export is followed"
    );
    let uses_high = |low: &str| {
        let edges = tree(&[
            ("low/mod.rs", low),
            ("high/mod.rs", "pub fn g() -> u8 { 1 }"),
        ])
        .edges();
        edges["low/mod.rs"].get("high/mod.rs").copied()
    };
    assert_eq!(
        uses_high("\npub fn f() { crate::high::g(); }"),
        Some(2),
        "inline, on line 2"
    );
    assert_eq!(
        uses_high("pub fn f() { println!(\"{}\", crate::high::g()); }"),
        Some(1),
        "in a macro"
    );
    assert_eq!(
        uses_high("use crate::high;\npub fn f() { high::g(); }"),
        Some(1),
        "through an import"
    );
    assert_eq!(
        uses_high("use super::high::*;\npub fn f() { g(); }"),
        Some(1),
        "through a glob"
    );
    assert_eq!(
        uses_high("#[derive(crate::high::g)]\npub struct S;"),
        Some(1),
        "in an attribute"
    );
    assert_eq!(
        uses_high("pub fn f() { ::high::g(); }"),
        None,
        "another crate"
    );
    let child = tree(&[
        ("low/mod.rs", "mod a;"),
        (
            "low/a.rs",
            "pub(super) fn f() {}\npub(in crate::low) fn g() {}",
        ),
    ]);
    assert!(
        child.edges()["low/a.rs"].is_empty(),
        "a visibility is not a use"
    );
    let circle = tree(&[
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
    assert_eq!(circle.circles(), ["low/a.rs <-> low/b.rs <-> low/mod.rs"]);
    let folders = tree(&[
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
    assert_eq!(folders.circles(), ["crate::low::a <-> crate::low::b"]);
}
