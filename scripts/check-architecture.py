#!/usr/bin/env python3
"""Checks what docs/architecture.md says that can be checked without a build.

    scripts/check-architecture.py [--self-check]

The page is the map a newcomer reads first, and its names and counts went stale with no one
noticing: a review found three of the ten claims it checked false (one of them: four test
binaries, where there were five). Prose cannot be checked, but much of the page is names and
numbers, and those can:

  - every backticked path (`src/fleet/local.rs`, `tests/common`, `owners/owned.rs` within its
    floor's section) exists, and every .rs file of src/ is named somewhere on the page;
  - every backticked Rust name (`FleetApi`, `Process::fleet`, `policy::consent::Board`,
    `tool_list!`, `call.after`) is in src/, a `Type::member` in a file that defines or
    implements the type, a `module::item` in that module's file;
  - every setting (`taskAfterMillis`), environment variable (`$SMOL_CLOUD_URL`), tool
    (`run-command`), binary (`smol-spec diff`), `cargo test --test` target and URI is real;
  - the floors table has one section per floor naming the same modules, and its modules are
    src/lib.rs's;
  - what the page marks as counted or listed matches the tree: `<!-- count: NAME -->five<!--
    /count -->` and `<!-- list: NAME -->...<!-- /list -->`, each NAME computed below from the
    code (the test binaries and their number, the binaries, every entry of scripts/, the files
    above floor 3 that name a fleet kind, the progress batching interval);
  - every top-level folder is named, and every relative link and its anchor resolves.

Each failure prints the page's line, the claim and what the code says, and the exit status is
1. Python's standard library only, and no build: scripts/test.sh runs it first. `--self-check`
breaks claims in a copy of the page and expects each to be caught, so that a check that can no
longer fail does not pass for one.
"""

import fnmatch
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DOC = "docs/architecture.md"

# Names the page uses for what does not exist on purpose: its example of a new tool.
HYPOTHETICAL = {"snapshot-machine", "SnapshotArgs", "Snapshot", "Tool::SnapshotMachine"}

# Path-like names that are not paths of this repository: what the server writes at run time
# (a workspace copy's `tree/` and `base.git`, the credential bindings' record) and an MCP method.
NOT_REPO_PATHS = {"tree/", "base.git", "machines.json", "tasks/get"}

# src/ files the page need not name: a folder's front door, and the crate root (the floors).
FRONT_DOORS = {"mod.rs", "lib.rs"}

# Files of src/ the page may leave unnamed for a while (a section being rewritten): each fails
# the check once the page names it, so that the list does not outlive its reason. None now.
PENDING: set = set()

# Without git: what is in the tree but no part of the project (build output, installed packages).
SKIPPED_DIRS = {".git", "target", "node_modules", ".venv", ".smolvm", "__pycache__"}

PATH_EXTENSIONS = (
    ".rs", ".md", ".sh", ".py", ".mjs", ".js", ".json", ".toml", ".txt", ".yaml", ".cfg",
    ".html", ".css", ".snap",
)
NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}


def files():
    """The repository's files as git sees them (tracked, or new and not ignored), so that what a
    build or an install leaves in the tree is not taken for the project's; without git, every
    file outside the folders of build output and installed packages."""
    try:
        listed = subprocess.run(
            ["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            check=True, capture_output=True, text=True,
        ).stdout.split("\0")
        return [f for f in listed if f and os.path.isfile(os.path.join(ROOT, f))]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
            rel = os.path.relpath(dirpath, ROOT).replace(os.sep, "/")
            found += [(rel + "/" + f).removeprefix("./") for f in filenames]
        return found


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def cargo_entries(cargo, table, key):
    """`key` of each `[[table]]` of Cargo.toml."""
    found = []
    for block in re.split(r"^\[", cargo, flags=re.M):
        if block.startswith("[" + table + "]]"):
            m = re.search(r"^" + key + r'\s*=\s*"([^"]+)"', block, re.M)
            if m:
                found.append(m.group(1))
    return found


class Tree:
    """What the page is compared with, read once."""

    def __init__(self):
        self.paths = set()  # every file and folder, relative; a folder ends with '/'
        for f in files():
            self.paths.add(f)
            parts = f.split("/")
            for i in range(1, len(parts)):
                self.paths.add("/".join(parts[:i]) + "/")
        self.top = {p.rstrip("/") for p in self.paths if "/" not in p.rstrip("/")}
        self.rust = {}  # each src/ file's code, its comment lines taken out
        for p in sorted(self.paths):
            if p.startswith("src/") and p.endswith(".rs"):
                lines = read(p).splitlines()
                self.rust[p] = "\n".join(l for l in lines if not l.lstrip().startswith("//"))
        self.code = "\n".join(self.rust.values())
        self.words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", self.code))
        config = self.rust["src/process/config.rs"]
        self.setting_keys = set(re.findall(r'\bkey:\s*"([A-Za-z]+)"', config))
        self.setting_envs = set(re.findall(r'\benv:\s*"([A-Z0-9_]+)"', config))
        self.specs = "\n".join(
            read(p) for p in self.paths if p.startswith("specs/") and p.endswith(".json"))
        cargo = read("Cargo.toml")
        self.bins = cargo_entries(cargo, "bin", "name")
        # A binary's own file is named by the page's list of binaries, checked against these.
        self.bin_sources = set(cargo_entries(cargo, "bin", "path"))
        self.test_binaries = sorted(
            set(cargo_entries(cargo, "test", "name"))
            | {p.split("/")[1] for p in self.paths if re.fullmatch(r"tests/[^/]+/main\.rs", p)})
        self.tools = re.findall(r'=>\s*"([a-z-]+)"\s*\{', self.rust["src/policy/tools/tool.rs"])
        self.lib_modules = re.findall(r"^pub mod (\w+);", self.rust["src/lib.rs"], re.M)

    def defines(self, path, name):
        """Whether the file at `path` defines `name`: an item, a macro, a re-export, or (for a
        capitalized name) an enum variant."""
        text = self.rust.get(path, "")
        n = re.escape(name)
        return bool(
            re.search(r"\b(?:fn|struct|enum|trait|type|const|static|mod|union)\s+" + n + r"\b",
                      text)
            or re.search(r"macro_rules!\s*" + n + r"\b", text)
            or (name[0].isupper() and re.search(r"^\s*" + n + r"\s*(?:[,({=]|$)", text, re.M))
            or re.search(r"\bpub use [^;]*\b" + n + r"\b", text)
        )

    def module_files(self, segments):
        """The files of a module path of the crate (`policy::jobs`: src/policy/jobs/mod.rs)."""
        base = "src/" + "/".join(segments)
        return [p for p in (base + ".rs", base + "/mod.rs") if p in self.rust]

    def files_named(self, stem):
        """Every module called `stem` in src/ (`args`: src/policy/tools/args.rs)."""
        return [p for p in self.rust
                if p.endswith("/" + stem + ".rs") or p.endswith("/" + stem + "/mod.rs")]

    def type_files(self, name):
        """The files that define or implement the type or trait `name`."""
        n = re.escape(name)
        pattern = re.compile(r"\b(?:struct|enum|trait)\s+" + n + r"\b"
                             r"|\bimpl\b[^{;]*?\b" + n + r"\b\s*(?:<[^{]*>)?\s*\{")
        return [p for p, text in self.rust.items() if pattern.search(text)]


class Page:
    """The page: its text, its sections, the backticked names and the marked regions."""

    def __init__(self, text):
        self.text = text
        self.starts = [0] + [m.end() for m in re.finditer(r"\n", text)]
        self.headings = [(m.start(), m.group(1), m.group(2))
                         for m in re.finditer(r"^(#{2,3}) (.+)$", text, re.M)]

    def line(self, offset):
        return sum(1 for s in self.starts if s <= offset)

    def heading_at(self, offset):
        current = ""
        for start, _, title in self.headings:
            if start > offset:
                break
            current = title
        return current

    def regions(self, kind):
        """(name, start, end, inner text) of each `<!-- kind: name -->...<!-- /kind -->`."""
        pattern = re.compile(r"<!-- " + kind + r": ([\w-]+) -->(.*?)<!-- /" + kind + r" -->",
                             re.S)
        return [(m.group(1), m.start(), m.end(), m.group(2)) for m in pattern.finditer(self.text)]

    def ticks(self, start=0, end=None):
        """(offset, text) of each backticked name between `start` and `end`."""
        end = len(self.text) if end is None else end
        for m in re.finditer(r"`([^`]+)`", self.text[start:end]):
            yield start + m.start(), m.group(1).strip()


class Check:
    def __init__(self, page, tree):
        self.page = page
        self.tree = tree
        self.claims = 0
        self.failures = []
        self.sections = {}  # a floor's section title -> the src/ paths of its modules
        for _, level, title in page.headings:
            m = re.match(r"\d+\. (.*)$", title)
            if level == "###" and m:
                self.sections[title] = ["src/" + n for n in re.findall(r"`(\w+)`", m.group(1))]

    def claim(self, offset, what, ok, code_says):
        self.claims += 1
        if not ok:
            self.failures.append((self.page.line(offset), what, code_says))

    # Paths ----------------------------------------------------------------------------------

    @staticmethod
    def path_like(token):
        if "://" in token or token in NOT_REPO_PATHS or not re.fullmatch(r"[\w.\-*<>/]+", token):
            return False
        return "/" in token or token.endswith(PATH_EXTENSIONS)

    def resolve(self, token, offset):
        """The paths `token` names: from the top when it starts with a top-level entry; else
        within the modules of its floor's section (or src/ outside one), its last segments
        matching; a `<placeholder>` or `*` matches any name."""
        pattern = re.sub(r"<[^>]+>", "*", token)
        want_dir = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        depth = pattern.count("/") + 1

        def kind_fits(path):
            return path.endswith("/") or not want_dir

        if pattern.split("/")[0] in self.tree.top:
            return [p for p in self.tree.paths
                    if kind_fits(p) and fnmatch.fnmatchcase(p.rstrip("/"), pattern)]

        def under(base):
            # A module is a folder (src/fleet/...) or one file (src/generated.rs).
            return [p for p in self.tree.paths
                    if kind_fits(p) and (p.startswith(base + "/") or p == base + ".rs")
                    and fnmatch.fnmatchcase("/".join(p.rstrip("/").split("/")[-depth:]), pattern)]

        found = [p for base in self.sections.get(self.page.heading_at(offset), ["src"])
                 for p in under(base)]
        if not found and "/" in pattern:  # `policy/tools/views.rs` named from another floor
            found = under("src")
        return found

    def paths(self, skip):
        named = set()
        for offset, token in self.page.ticks():
            if offset in skip or not self.path_like(token):
                continue
            found = self.resolve(token, offset)
            in_floor = self.page.heading_at(offset) in self.sections
            # Outside a floor's section, a bare file name names a file only when just one fits.
            if "/" in token or in_floor or len(found) == 1:
                named |= set(found)
            where = "" if token.split("/")[0] in self.tree.top else " under " + ", ".join(
                self.sections.get(self.page.heading_at(offset), ["src"]))
            self.claim(offset, f"`{token}`", found, "no such file or folder" + where)
        end = len(self.page.text)
        for path in sorted(self.tree.rust):
            if path.rsplit("/", 1)[-1] in FRONT_DOORS or path in self.tree.bin_sources:
                continue
            if path in PENDING:
                self.claim(end, f"PENDING {path}", path not in named,
                           "the page names it now: take it off PENDING in this script")
                continue
            self.claim(end, path, path in named,
                       "a source file the page does not name: say what it holds in its floor's "
                       "section")
        for path in sorted(PENDING):
            self.claim(end, f"PENDING {path}", path in self.tree.rust,
                       "no such file: take it off PENDING in this script")

    # Rust names, settings, tools, binaries --------------------------------------------------

    def rust_path(self, token):
        """Whether `a::b::C`, `Type::member` or `module::item` names something in src/."""
        segments = token.split("::")
        *parents, last = segments
        tree = self.tree
        if parents[0] in tree.lib_modules:  # from the crate's root
            i = len(parents)
            while i > 0 and not tree.module_files(parents[:i]):
                i -= 1
            found, rest = tree.module_files(parents[:i]), parents[i:]
            if rest:  # `module::Type::member`
                return any(tree.defines(f, rest[0]) for f in found) and any(
                    tree.defines(f, last) for f in tree.type_files(rest[-1]))
            return any(tree.defines(f, last) for f in found) or bool(tree.module_files(segments))
        if parents[0][0].isupper():  # `Type::member`
            return any(tree.defines(f, last) for f in tree.type_files(parents[-1]))
        return any(tree.defines(f, last) for f in tree.files_named(parents[-1]))

    def names(self, skip):
        tree = self.tree
        for offset, token in self.page.ticks():
            if (offset in skip or token in HYPOTHETICAL or token in NOT_REPO_PATHS
                    or self.path_like(token)):
                continue
            said = f"`{token}`"
            bare = re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", token)  # `Process::new(config)`
            if "cargo test" in token:
                m = re.search(r"--test (\w+)(?: (\w+))?", token)
                if m:
                    binary, module = m.groups()
                    ok = binary in tree.test_binaries and (
                        module is None or f"tests/{binary}/{module}.rs" in tree.paths)
                    self.claim(offset, said, ok, f"the test binaries are {tree.test_binaries}, "
                               f"and a module is a file tests/{binary}/<module>.rs")
            elif "$" in token:
                for var in re.findall(r"\$([A-Z0-9_]+)", token):
                    self.claim(offset, said, var in tree.setting_envs,
                               f"${var} is no setting's variable (src/process/config.rs)")
            elif "://" in token:
                self.claim(offset, said, token in tree.code, "no such URI in src/")
            elif re.fullmatch(r"\w+!", bare) or re.match(r"\w+! \{", token):
                name = token.split("!")[0]
                self.claim(offset, said, re.search(r"macro_rules!\s*" + name + r"\b", tree.code),
                           "no such macro in src/")
            elif re.fullmatch(r"[A-Za-z_]\w*(::[A-Za-z_]\w*)+", bare):
                self.claim(offset, said, self.rust_path(bare), "not defined where the path says")
            elif (re.fullmatch(r"\w+(\([\w.]*\))?(\.\w+(\([\w.]*\))?)*", token)
                  and ("(" in token or "." in token)):
                # `call()`, `call.after`, `call.fleet(target)`, `capabilities().lacks(..)`: every
                # function called or method named (not the receiver, a variable) is a `fn`.
                fns = set(re.findall(r"(\w+)\(", token)) | set(re.findall(r"\.(\w+)", token))
                ok = all(re.search(r"\bfn\s+" + f + r"\b", tree.code) for f in fns)
                self.claim(offset, said, ok, "no such function in src/")
            elif re.fullmatch(r"smol-[a-z-]+ [a-z]+", token):
                binary, command = token.split(" ")
                source = f"src/bin/{binary}.rs"
                ok = binary in tree.bins and re.search(
                    r"\b" + command.capitalize() + r"\b", tree.rust.get(source, ""))
                self.claim(offset, said, ok,
                           f"the binaries are {tree.bins}; a command is a variant in {source}")
            elif re.fullmatch(r"[a-z]+(-[a-z]+)+", token):
                self.claim(offset, said, token in tree.tools or token in tree.bins,
                           "neither a tool (src/policy/tools/tool.rs) nor a binary (Cargo.toml)")
            elif re.fullmatch(r"[a-z]+[A-Z][A-Za-z]*", token):
                ok = token in tree.setting_keys or f'"{token}"' in tree.specs or token in tree.code
                self.claim(offset, said, ok, "no setting (src/process/config.rs), no field of a "
                           "vendored spec and no name in src/")
            elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
                # A type, a variant, a constant, a function or a field: a word of the code.
                self.claim(offset, said, token in tree.words, "no such name in src/")
            elif re.fullmatch(r"[\w:]+<[\w :<>]+>", token):  # `Arc<dyn Store>`
                self.claim(offset, said, token in tree.code, "not written so in src/")
            elif re.fullmatch(r"[a-z]+-", token):  # `mach-`
                self.claim(offset, said, f'"{token}' in tree.code, "no such prefix in src/")
            elif re.fullmatch(r"[a-z_]+\*", token):  # `classify_*`
                self.claim(offset, said, re.search(r"\bfn\s+" + token[:-1] + r"\w+", tree.code),
                           "no such function in src/")
            elif re.fullmatch(r"-?\d+", token):
                self.claim(offset, said, token in tree.code, "no such number in src/")

    # Floors, counts, lists, folders, links --------------------------------------------------

    def floor_rows(self):
        """(offset, number, modules) of each row of the floors table."""
        text = self.page.text
        start, end = text.find("<!-- floors: begin"), text.find("<!-- floors: end")
        if start < 0 or end < start:
            return None
        return [(start + m.start(), int(m.group(1)), re.findall(r"`(\w+)`", m.group(2)))
                for m in re.finditer(r"^\| (\d+) \| ([^|]+) \|", text[start:end], re.M)]

    def floors(self):
        rows = self.floor_rows()
        self.claim(0, "the floors table", rows, "no <!-- floors: begin --> ... end markers")
        if not rows:
            return
        at = rows[0][0]
        numbers = [n for _, n, _ in rows]
        self.claim(at, "floors numbered 1 to N", numbers == list(range(1, len(rows) + 1)),
                   f"the table has {numbers}")
        listed = sorted(m for _, _, ms in rows for m in ms)
        self.claim(at, "the floors' modules are src/lib.rs's", listed == sorted(self.tree.lib_modules),
                   f"src/lib.rs has {sorted(self.tree.lib_modules)}, the table {listed}")
        sections = {int(t.split(".")[0]): (s, re.findall(r"`(\w+)`", t))
                    for s, level, t in self.page.headings if level == "###" and re.match(r"\d+\. ", t)}
        for offset, number, modules in rows:
            where, named = sections.get(number, (offset, None))
            self.claim(where, f"section {number}. of floor {number}", named == modules,
                       f"floor {number} is {modules} in the table; its section names {named}")
        for number, (where, _) in sections.items():
            self.claim(where, f"section {number}.", number in numbers, "no such floor in the table")

    def counters(self):
        tree = self.tree
        batch = re.search(r"OUTPUT_EVERY: Duration = Duration::from_millis\((\d+)\)",
                          tree.rust["src/policy/progress.rs"])
        return {
            "test-binaries": (len(tree.test_binaries),
                              f"tests/*/main.rs and Cargo.toml's [[test]]: {tree.test_binaries}"),
            "progress-batch-ms": (int(batch.group(1)) if batch else None,
                                  "OUTPUT_EVERY in src/policy/progress.rs"),
        }

    def counts(self):
        counters = self.counters()
        used = set()
        for name, start, _, inner in self.page.regions("count"):
            used.add(name)
            word = inner.strip().lower()
            said = int(word) if word.isdigit() else NUMBER_WORDS.get(word)
            if name not in counters:
                self.claim(start, f"count {name}", False, "no such count in this script")
                continue
            value, source = counters[name]
            self.claim(start, f"{inner.strip()} ({name})", said == value, f"{value}: {source}")
        for name in sorted(set(counters) - used):
            self.claim(0, f"count {name}", False,
                       "the page no longer marks it: mark the claim again, or drop the count here")

    def fleet_kind_files(self):
        """The src/ files above floor 3 whose code, tests aside, names `FleetKind::Local` or
        `FleetKind::Cloud`: where the policy and above still tell the fleets apart by name."""
        above = {m for _, n, ms in self.floor_rows() or [] if n > 3 for m in ms}
        found = set()
        for path, code in self.tree.rust.items():
            if path.split("/")[1].removesuffix(".rs") not in above:
                continue
            code = re.split(r"^#\[cfg\(test\)\]\s*\n\s*mod \w+", code, flags=re.M)[0]
            if re.search(r"FleetKind::(?:Local|Cloud)\b", code):
                found.add(path.removeprefix("src/"))
        return found

    def call_named_files(self):
        """The src/ files outside policy/tools/call/ whose code names the `Call` type: a handler
        that did would be handed the whole call rather than the parts its signature names."""
        found = set()
        for path, code in self.tree.rust.items():
            if path.startswith("src/policy/tools/call"):
                continue
            if re.search(r"\bCall\s*<|\bcall::Call\b|\buse\s+call::Call\b", code):
                found.add(path.removeprefix("src/"))
        return found

    def list_kinds(self):
        """Each list the page may mark: which of its backticked names are items, what they must
        be, and where that comes from."""
        tree = self.tree
        scripts = {p.removeprefix("scripts/") for p in tree.paths
                   if p.startswith("scripts/") and p.rstrip("/").count("/") == 1}
        return {
            "binaries": (lambda t: re.fullmatch(r"smol[a-z0-9-]*", t), set(tree.bins),
                         "Cargo.toml's [[bin]]"),
            "test-binaries": (lambda t: re.fullmatch(r"[a-z_]+", t), set(tree.test_binaries),
                              "tests/*/main.rs and Cargo.toml's [[test]]"),
            "scripts": (lambda t: re.fullmatch(r"[\w.*-]+/?", t), scripts, "scripts/"),
            "fleet-kind-named": (lambda t: t.endswith(".rs"), self.fleet_kind_files(),
                                 "the files above floor 3 naming FleetKind::Local or ::Cloud"),
            "call-named": (lambda t: t.endswith(".rs"), self.call_named_files(),
                           "the files outside policy/tools/call/ naming the Call type"),
        }

    def list_items(self):
        """The offsets of the names the lists check, which the other checks leave alone."""
        kinds = self.list_kinds()
        return {offset for name, start, end, _ in self.page.regions("list") if name in kinds
                for offset, t in self.page.ticks(start, end) if kinds[name][0](t)}

    def lists(self):
        kinds = self.list_kinds()
        used = set()
        for name, start, end, _ in self.page.regions("list"):
            used.add(name)
            if name not in kinds:
                self.claim(start, f"list {name}", False, "no such list in this script")
                continue
            is_item, actual, source = kinds[name]
            items = [(offset, t) for offset, t in self.page.ticks(start, end) if is_item(t)]
            for offset, item in items:
                self.claim(offset, f"`{item}` in the {name}",
                           any(fnmatch.fnmatchcase(a, item) for a in actual), f"not in {source}")
            missing = sorted(a for a in actual
                             if not any(fnmatch.fnmatchcase(a, i) for _, i in items))
            self.claim(start, f"the {name} listed", not missing, f"{source} also has {missing}")
        for name in sorted(set(kinds) - used):
            self.claim(0, f"list {name}", False,
                       "the page no longer marks it: mark the list again, or drop it here")

    def folders(self):
        named = {t for _, t in self.page.ticks()}
        for top in sorted(self.tree.top):
            if top + "/" in self.tree.paths:
                self.claim(len(self.page.text), f"the folder {top}/", top + "/" in named,
                           "a top-level folder the page does not name")

    def links(self):
        for m in re.finditer(r"\]\(([^)\s]+)\)", self.page.text):
            target = m.group(1)
            if re.match(r"\w+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(os.path.dirname(DOC), file or os.path.basename(DOC)))
            ok = path in self.tree.paths
            says = f"no {path}"
            if ok and anchor:
                slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                         for h in re.findall(r"^#+ (.+)$", read(path), re.M)}
                ok, says = anchor in slugs, f"no heading #{anchor} in {path}"
            self.claim(m.start(), f"the link {target}", ok, says)

    def run(self):
        skip = self.list_items()
        self.floors()
        self.counts()
        self.lists()
        self.paths(skip)
        self.names(skip)
        self.folders()
        self.links()
        return self


def check(text, tree):
    return Check(Page(text), tree).run()


def self_check(tree):
    """Each claim broken in a copy of the page is caught, on the line broken."""
    text = read(DOC)
    breaks = [
        ("a count", "<!-- count: test-binaries -->five<", "<!-- count: test-binaries -->four<"),
        ("a listed test binary", "`shared`<!-- /list -->", "`sharing`<!-- /list -->"),
        ("a listed script", "`load.sh`", "`loads.sh`"),
        ("a file naming Call", "`policy/tools/mod.rs`<!-- /list -->",
         "`policy/tools/args.rs`<!-- /list -->"),
        ("a file of a floor", "`shadow.rs`", "`shadows.rs`"),
        ("a repository path", "`tests/offline/layering.rs`", "`tests/offline/layers.rs`"),
        ("a type's method", "`Process::fleet`", "`Process::fleets`"),
        ("a module's item", "`policy::consent::Board`", "`policy::consent::Boards`"),
        ("a setting", "`taskAfterMillis`", "`taskAfterMilliseconds`"),
        ("a tool", "`run-command`", "`run-commands`"),
        ("a floor's section", "### 2. `fleet`, `workspace`", "### 2. `fleet`"),
        ("a link's anchor", "testing.md#the-test-binaries", "testing.md#the-test-binary"),
    ]
    failed = bool(check(text, tree).failures)
    if failed:
        print("check-architecture --self-check: the page itself fails; run without --self-check",
              file=sys.stderr)
    for what, old, new in breaks:
        if old not in text:
            print(f"check-architecture --self-check: the page has no {old!r} to break ({what})",
                  file=sys.stderr)
            failed = True
            continue
        line = text[: text.index(old)].count("\n") + 1
        broken = check(text.replace(old, new, 1), tree)
        if not any(l == line for l, _, _ in broken.failures):
            print(f"check-architecture --self-check: {what} broken on line {line} "
                  f"({old!r} to {new!r}) was not caught", file=sys.stderr)
            failed = True
    if failed:
        return 1
    print(f"check-architecture --self-check: {len(breaks)} claims broken, each caught")
    return 0


def main(argv):
    if argv[1:] not in ([], ["--self-check"]):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    tree = Tree()
    if argv[1:]:
        return self_check(tree)
    result = check(read(DOC), tree)
    for line, what, says in result.failures:
        print(f"{DOC}:{line}: {what}: {says}", file=sys.stderr)
    if result.failures:
        print(f"check-architecture: {len(result.failures)} of {result.claims} claims of {DOC} "
              "are false", file=sys.stderr)
        return 1
    print(f"check-architecture: {result.claims} claims checked, all true ({DOC})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
