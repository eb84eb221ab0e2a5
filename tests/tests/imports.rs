//! The import graph of every crate of the workspace has no cycles, checked on the real sources.
//!
//! Nodes are module files (`src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`). An edge `a → b`
//! is a path in `a` that starts `crate::`, `super::` or `self::` (in a `use`, brace groups
//! included, or in code) and names module `b`, the deepest module the path reaches. Edges
//! between a module and its ancestors or descendants do not count: a parent declares and
//! re-exports its children, and a child may name its parent's items; those are the module
//! tree, not imports. What is checked is that siblings and cousins do not import each other in
//! a circle, so every crate's modules can be read bottom up.
//!
//! Test code is left out: files in a `tests` module (`tests.rs`, `tests/…`) and a file's tail
//! from `#[cfg(test)] mod …` on. Comments (doc links included) are skipped. Each binary under
//! `src/bin/<name>/` is a crate of its own.
//!
//! The harness has two more rules (issue #32): its longest import chain is at most
//! [`HARNESS_MAX_DEPTH`] modules, and no check group (`groups::<name>`) imports another.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use flex_tests::{workspace_members, workspace_root};

/// A module path, `[]` for the crate root.
type Module = Vec<String>;

/// One crate's modules: module path → source text (test code removed).
struct Crate {
    name: String,
    modules: BTreeMap<Module, String>,
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of `file` relative to its crate's source directory.
fn module_of(rel: &Path) -> Module {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// `text` with comments removed and string and character literals emptied, so that neither
/// hides nor invents a path.
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    // Keeps line breaks inside what is removed, so test tails are still found by line.
    let newline = |ch: char, out: &mut String| {
        if ch == '\n' {
            out.push('\n');
        }
    };
    while i < c.len() {
        let prev_ident = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        match c[i] {
            '/' if c.get(i + 1) == Some(&'/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if c.get(i + 1) == Some(&'*') => {
                let mut depth = 0;
                while i < c.len() {
                    if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        newline(c[i], &mut out);
                        i += 1;
                    }
                }
            }
            'r' if !prev_ident && matches!(c.get(i + 1), Some('"' | '#')) => {
                let mut j = i + 1;
                let mut hashes = 0;
                while c.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if c.get(j) != Some(&'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                while j < c.len() {
                    if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    newline(c[j], &mut out);
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    if c[i] == '\\' {
                        i += 1;
                    }
                    if let Some(&ch) = c.get(i) {
                        newline(ch, &mut out);
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("\"\"");
            }
            '\'' => {
                // A character literal ('x', '\n', '\'') or a lifetime ('a).
                if c.get(i + 1) == Some(&'\\') {
                    let mut j = i + 3;
                    while j < c.len() && c[j] != '\'' {
                        j += 1;
                    }
                    i = j + 1;
                    out.push_str("' '");
                } else if c.get(i + 2) == Some(&'\'') {
                    i += 3;
                    out.push_str("' '");
                } else {
                    out.push('\'');
                    i += 1;
                }
            }
            ch => {
                out.push(ch);
                i += 1;
            }
        }
    }
    out
}

/// `text` without comments, literals and its test tail.
fn production_text(text: &str) -> String {
    let stripped = strip(text);
    let mut out = String::new();
    let mut lines = stripped.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            let next = lines.peek().map(|l| l.trim_start()).unwrap_or("");
            if next.starts_with("mod ") || next.starts_with("pub(crate) mod ") {
                break;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The crates of the workspace: each member's library (or binary) tree under `src/`, and each
/// binary under `src/bin/<name>/`.
fn crates() -> Vec<Crate> {
    let root = workspace_root();
    let mut out = Vec::new();
    for member in workspace_members() {
        let src = root.join(&member).join("src");
        let mut files = Vec::new();
        rs_files(&src, &mut files);
        let mut trees: BTreeMap<String, BTreeMap<Module, String>> = BTreeMap::new();
        for f in files {
            let rel = f.strip_prefix(&src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let (krate, within) = if first == "bin" {
                let mut c = rel.components();
                c.next();
                let name = c.next().unwrap().as_os_str().to_string_lossy().to_string();
                let rest: PathBuf = c.collect();
                if rest.as_os_str().is_empty() {
                    continue; // src/bin/<name>.rs: a one-file binary
                }
                (format!("{member} (bin {name})"), rest)
            } else if rel == Path::new("main.rs") && src.join("lib.rs").exists() {
                continue; // a thin main beside the library
            } else {
                (member.clone(), rel.to_path_buf())
            };
            if within.components().any(|c| c.as_os_str() == "generated") {
                continue;
            }
            let module = module_of(&within);
            if module.iter().any(|m| m == "tests") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            trees
                .entry(krate)
                .or_default()
                .insert(module, production_text(&text));
        }
        for (name, modules) in trees {
            out.push(Crate { name, modules });
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Sep,
    Open,
    Close,
    Comma,
    Other,
}

fn tokens(text: &str) -> Vec<Tok> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(text[s..i].to_string()));
            continue;
        }
        if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push(Tok::Sep);
            i += 2;
            continue;
        }
        match c {
            b'{' => out.push(Tok::Open),
            b'}' => out.push(Tok::Close),
            b',' => out.push(Tok::Comma),
            c if c.is_ascii_whitespace() => {}
            _ => out.push(Tok::Other),
        }
        i += 1;
    }
    out
}

/// Parses a path (with brace groups) at `toks[i]`, pushing every full path to `out`.
/// Returns the index after it.
fn parse_path(toks: &[Tok], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(i) {
            Some(Tok::Ident(s)) => {
                // `self` inside a group is the group's prefix itself.
                if s != "self" || path.is_empty() {
                    path.push(s.clone());
                }
                i += 1;
            }
            Some(Tok::Open) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Close) => {
                            i += 1;
                            break;
                        }
                        Some(Tok::Comma) => i += 1,
                        None => return i,
                        _ => i = parse_path(toks, i, &path, out),
                    }
                }
                return i;
            }
            _ => break,
        }
        if toks.get(i) == Some(&Tok::Sep) {
            i += 1;
        } else {
            break;
        }
    }
    out.push(path);
    i
}

/// Every path in `text` that starts `crate`, `super` or `self` followed by `::`.
fn paths(text: &str) -> Vec<Vec<String>> {
    let toks = tokens(text);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let starts = matches!(&toks[i], Tok::Ident(s) if s == "crate" || s == "super" || s == "self")
            && toks.get(i + 1) == Some(&Tok::Sep)
            && !matches!(i.checked_sub(1).map(|j| &toks[j]), Some(Tok::Sep));
        if starts {
            i = parse_path(&toks, i, &[], &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// The module a path written in `from` names: the deepest existing module along it.
fn resolve(from: &Module, path: &[String], modules: &BTreeMap<Module, String>) -> Option<Module> {
    let mut base: Module = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => from.clone(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop()?;
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    let mut found = base.clone();
    let mut cur = base;
    for seg in rest {
        cur.push(seg.clone());
        if modules.contains_key(&cur) {
            found = cur.clone();
        } else {
            break;
        }
    }
    Some(found)
}

fn related(a: &Module, b: &Module) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn edges(c: &Crate) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut g: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, text) in &c.modules {
        let e = g.entry(m.clone()).or_default();
        for p in paths(text) {
            if let Some(t) = resolve(m, &p, &c.modules)
                && !related(m, &t)
            {
                e.insert(t);
            }
        }
    }
    g
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(g: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct St<'a> {
        g: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        next: usize,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a Module) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        if let Some(ws) = s.g.get(v) {
            for w in ws {
                let Some((w, _)) = s.g.get_key_value(w) else {
                    continue;
                };
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if s.on.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = St {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

#[test]
fn no_crate_has_an_import_cycle() {
    let crates = crates();
    assert!(
        crates
            .iter()
            .any(|c| c.name == "agent" && c.modules.len() > 30)
    );
    let mut report = Vec::new();
    for c in &crates {
        let g = edges(c);
        for comp in cycles(&g) {
            let members: BTreeSet<&Module> = comp.iter().collect();
            let detail: Vec<String> = comp
                .iter()
                .map(|m| {
                    let to: Vec<String> = g[m]
                        .iter()
                        .filter(|t| members.contains(t))
                        .map(name)
                        .collect();
                    format!("{} → {}", name(m), to.join(", "))
                })
                .collect();
            report.push(format!("{}: {}", c.name, detail.join("; ")));
        }
    }
    assert!(report.is_empty(), "import cycles:\n{}", report.join("\n"));
}

/// The checker itself: a cycle between siblings is found, through brace groups, `super::` and a
/// path in code; parent/child references and test tails are not edges.
#[test]
fn the_checker_finds_sibling_cycles_and_ignores_the_module_tree() {
    let mut modules = BTreeMap::new();
    let m = |s: &str| -> Module {
        if s.is_empty() {
            Vec::new()
        } else {
            s.split("::").map(String::from).collect()
        }
    };
    modules.insert(m(""), production_text("pub mod a;\npub use a::X;\n"));
    modules.insert(
        m("a"),
        production_text(concat!(
            "use super::{b::{self, Y}, Z};\n",
            "// crate::c::W in a comment\n",
            "const S: &str = \"//\";\n",
            "fn q(x: &'static str) -> char { '\"' }\n",
            "/* crate::d */ const R: &str = r#\"crate::d\"#;\n",
        )),
    );
    modules.insert(m("b"), production_text("fn f() { crate::c::g(); }\n"));
    modules.insert(
        m("e"),
        production_text("fn f(s: &str) -> bool { s.contains(\"//\") || crate::d::x() }\n"),
    );
    modules.insert(
        m("c"),
        production_text("use crate::a::X;\n#[cfg(test)]\nmod tests {\n use crate::b; }\n"),
    );
    modules.insert(m("d"), production_text("use crate::a::X;\n"));
    let c = Crate {
        name: "t".into(),
        modules,
    };
    let g = edges(&c);
    assert_eq!(g[&m("a")], BTreeSet::from([m("b")]));
    assert_eq!(g[&m("b")], BTreeSet::from([m("c")]));
    assert_eq!(g[&m("c")], BTreeSet::from([m("a")]));
    assert!(g[&m("")].is_empty(), "a parent's re-export is not an edge");
    assert_eq!(
        g[&m("e")],
        BTreeSet::from([m("d")]),
        "a `//` in a string is no comment"
    );
    assert_eq!(cycles(&g), vec![vec![m("a"), m("b"), m("c")]]);
}

/// The agent's layers (ARCHITECTURE.md): the adapters and stores use neither the machinery, the
/// clients nor the flows; the machinery (`machine/`) does not use the clients or the flows; the
/// clients do not use the flows.
#[test]
fn the_agents_layers_only_look_down() {
    let agent = crates().into_iter().find(|c| c.name == "agent").unwrap();
    let g = edges(&agent);
    let layer = |m: &Module| -> Option<usize> {
        match m.first().map(String::as_str) {
            Some("config" | "state" | "systemd" | "task" | "logging" | "version") => Some(2),
            Some("machine") => Some(3),
            Some("kubeclient" | "goalclient") => Some(4),
            Some("flows") => Some(5),
            Some("cli" | "entrypoint" | "butane") => Some(6),
            _ => None,
        }
    };
    let mut up = Vec::new();
    for (from, tos) in &g {
        for to in tos {
            if let (Some(a), Some(b)) = (layer(from), layer(to))
                && b > a
            {
                up.push(format!("{} → {}", name(from), name(to)));
            }
        }
    }
    assert!(g.keys().any(|m| layer(m) == Some(5)), "no flows found");
    assert!(
        up.is_empty(),
        "imports that look up a layer:\n{}",
        up.join("\n")
    );
}

/// The longest chain of imports in `g` (acyclic: [`no_crate_has_an_import_cycle`] checks it),
/// as the modules along it, importer first; ties go to the first module in order. A module in a
/// cycle ends the chain there rather than looping.
fn longest_chain(g: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Module> {
    fn from<'a>(
        g: &'a BTreeMap<Module, BTreeSet<Module>>,
        v: &'a Module,
        memo: &mut BTreeMap<&'a Module, Vec<Module>>,
        open: &mut BTreeSet<&'a Module>,
    ) -> Vec<Module> {
        if let Some(c) = memo.get(v) {
            return c.clone();
        }
        if !open.insert(v) {
            return Vec::new();
        }
        let mut best: Vec<Module> = Vec::new();
        for w in g.get(v).into_iter().flatten() {
            let Some((w, _)) = g.get_key_value(w) else {
                continue;
            };
            let c = from(g, w, memo, open);
            if c.len() > best.len() {
                best = c;
            }
        }
        open.remove(v);
        best.insert(0, v.clone());
        memo.insert(v, best.clone());
        best
    }
    let mut memo = BTreeMap::new();
    let mut open = BTreeSet::new();
    let mut best = Vec::new();
    for v in g.keys() {
        let c = from(g, v, &mut memo, &mut open);
        if c.len() > best.len() {
            best = c;
        }
    }
    best
}

/// The harness's crate (its library).
fn harness() -> Crate {
    crates().into_iter().find(|c| c.name == "harness").unwrap()
}

/// How deep the harness's imports may chain, in modules (issue #32; 9 before its groups were
/// split, on dbf9709): a module is read with at most five layers of the harness under it.
const HARNESS_MAX_DEPTH: usize = 6;

#[test]
fn the_harness_imports_at_most_six_deep() {
    let c = harness();
    assert!(c.modules.len() > 30, "the harness's modules were not found");
    let chain = longest_chain(&edges(&c));
    assert!(
        chain.len() <= HARNESS_MAX_DEPTH,
        "the harness's imports chain {} modules deep (at most {HARNESS_MAX_DEPTH}):\n{}",
        chain.len(),
        chain.iter().map(name).collect::<Vec<_>>().join(" → ")
    );
}

/// A check group (`groups::<name>`, with its private submodules) imports the shared kit, never
/// another group.
#[test]
fn no_harness_group_imports_another() {
    let c = harness();
    let g = edges(&c);
    let group = |m: &Module| -> Option<String> {
        (m.first().map(String::as_str) == Some("groups"))
            .then(|| m.get(1).cloned())
            .flatten()
    };
    let groups: BTreeSet<String> = g.keys().filter_map(group).collect();
    assert!(
        groups.len() >= 12,
        "the group modules were not found under groups::: {groups:?}"
    );
    let mut across = Vec::new();
    for (from, tos) in &g {
        for to in tos {
            if let (Some(a), Some(b)) = (group(from), group(to))
                && a != b
            {
                across.push(format!("{} → {}", name(from), name(to)));
            }
        }
    }
    assert!(
        across.is_empty(),
        "group modules that import another group:\n{}",
        across.join("\n")
    );
}

/// The depth function itself: the longest of several chains, through a shared tail, counted in
/// modules; an edge to a module outside the graph is ignored.
#[test]
fn longest_chain_counts_modules_along_the_deepest_path() {
    let m = |s: &str| -> Module { s.split("::").map(String::from).collect() };
    let mut g: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    let mut edge = |a: &str, b: &str| {
        g.entry(m(a)).or_default().insert(m(b));
        g.entry(m(b)).or_default();
    };
    edge("a", "b");
    edge("b", "z");
    edge("c", "d");
    edge("d", "e");
    edge("e", "z");
    edge("d", "z");
    edge("f", "c");
    g.entry(m("a")).or_default().insert(m("nowhere"));
    assert_eq!(
        longest_chain(&g),
        vec![m("f"), m("c"), m("d"), m("e"), m("z")]
    );
    assert_eq!(longest_chain(&BTreeMap::new()), Vec::<Module>::new());
    let single = BTreeMap::from([(m("x"), BTreeSet::new())]);
    assert_eq!(longest_chain(&single), vec![m("x")]);
}
