//! The crate reads top to bottom: no import circle between the files of `src/`, the
//! classifiers import nothing from the write path or the layer, the layer and the write path
//! never import each other, `write/` imports only downward through its layers (core, durable,
//! the front ends, the facade), and nothing but the root imports `operation/`. The graph is read from the sources themselves (every
//! `crate::`, `super::` and `self::` path, comments left out, a parent's `pub use self::..`
//! re-exports of its children not counted: a facade sits above what it re-exports), so that a
//! new import that closes a circle fails here, naming it.
//!
//! `TSR_LAYERING_SRC=/path/to/src cargo test --test layer -- layering::` reads another tree (to see the
//! test fail on an older one).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path (`write::pool`, `classify`, `""` for the root) for each file of the tree.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a readable source tree") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let rel = file
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                parts.pop();
            }
            (parts.join("::"), file)
        })
        .collect()
}

/// The text with `//` comments taken out (re-exports kept).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text with `//` comments (doc comments included) and `pub use self::..;` re-exports
/// taken out.
fn code_of(text: &str) -> String {
    let code = without_comments(text);
    let mut out = String::new();
    let mut rest = code.as_str();
    while let Some(at) = find_reexport(rest) {
        out.push_str(&rest[..at]);
        let end = rest[at..].find(';').map_or(rest.len(), |e| at + e + 1);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where the next `pub use self::` or `pub(crate) use self::` (or `pub(super) ..`) starts.
fn find_reexport(code: &str) -> Option<usize> {
    [
        "pub use self::",
        "pub(crate) use self::",
        "pub(super) use self::",
    ]
    .iter()
    .filter_map(|needle| code.find(needle))
    .min()
}

/// Every `crate::a::b`, `super::a::b` and `self::a::b` path in `code`, as written.
fn paths(code: &str) -> Vec<(String, Vec<String>)> {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = Vec::new();
    for kind in ["crate", "super", "self"] {
        let needle = format!("{kind}::");
        let mut from = 0;
        while let Some(at) = code[from..].find(&needle) {
            let start = from + at;
            from = start + needle.len();
            if start > 0 && (ident(bytes[start - 1]) || bytes[start - 1] == b':') {
                continue;
            }
            let mut segments = Vec::new();
            let mut i = start + needle.len();
            loop {
                let s = i;
                while i < bytes.len() && ident(bytes[i]) {
                    i += 1;
                }
                if s == i {
                    break;
                }
                segments.push(code[s..i].to_owned());
                if code[i..].starts_with("::") {
                    i += 2;
                } else {
                    break;
                }
            }
            // `super::*` (a test module's glob of its own file) names no other module.
            if !segments.is_empty() {
                found.push((kind.to_owned(), segments));
            }
        }
    }
    found
}

/// What each module re-exports (`pub use`, `pub(crate) use`, `pub(super) use`): for each
/// (module, name), the full path of the item it names, so that `crate::DbError` is read as
/// the `error` module it comes from, not as the root.
fn reexports(modules: &BTreeMap<String, PathBuf>) -> BTreeMap<(String, String), Vec<String>> {
    let mut found = BTreeMap::new();
    for (module, file) in modules {
        let code = without_comments(&std::fs::read_to_string(file).expect("a readable file"));
        let own: Vec<String> = if module.is_empty() {
            Vec::new()
        } else {
            module.split("::").map(str::to_owned).collect()
        };
        let is_dir = file.ends_with("mod.rs") || file.ends_with("lib.rs");
        let mut rest = code.as_str();
        while let Some(at) = ["pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .filter_map(|needle| rest.find(needle).map(|i| (i, needle.len())))
            .min()
        {
            let start = at.0 + at.1;
            let end = rest[start..].find(';').map_or(rest.len(), |e| start + e);
            let statement = rest[start..end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .replace(":: ", "::")
                .replace("{ ", "{")
                .replace(" }", "}");
            rest = &rest[end..];
            let (prefix, items) = match statement.find('{') {
                Some(open) => (
                    statement[..open].trim_end_matches("::").to_owned(),
                    statement[open + 1..statement.rfind('}').unwrap_or(statement.len())]
                        .split(',')
                        .map(|item| item.trim().to_owned())
                        .collect::<Vec<_>>(),
                ),
                None => (String::new(), vec![statement.clone()]),
            };
            for item in items
                .iter()
                .filter(|item| !item.is_empty() && item.as_str() != "*")
            {
                let (path, name) = match item.split_once(" as ") {
                    Some((path, alias)) => (path.to_owned(), alias.to_owned()),
                    None => (
                        item.clone(),
                        item.rsplit("::").next().unwrap_or(item).to_owned(),
                    ),
                };
                let whole = if prefix.is_empty() {
                    path
                } else {
                    format!("{prefix}::{path}")
                };
                let mut segments: Vec<String> = whole.split("::").map(str::to_owned).collect();
                let full: Vec<String> = match segments[0].as_str() {
                    "crate" => segments.split_off(1),
                    "super" => own[..own.len().saturating_sub(1)]
                        .iter()
                        .cloned()
                        .chain(segments.split_off(1))
                        .collect(),
                    "self" if is_dir => own.iter().cloned().chain(segments.split_off(1)).collect(),
                    _ if is_dir
                        && modules.contains_key(
                            &own.iter()
                                .chain(&segments[..1])
                                .cloned()
                                .collect::<Vec<_>>()
                                .join("::"),
                        ) =>
                    {
                        own.iter().cloned().chain(segments).collect()
                    }
                    _ => continue,
                };
                found.insert((module.clone(), name), full);
            }
        }
    }
    found
}

/// The file-level import graph: which module's file names which other module. A path
/// through a re-export (the root's `crate::DbError`, a facade's `super::Name`) counts as an
/// import of the module the item is defined in.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    let reexports = reexports(&modules);
    let resolve = |segments: &[String]| -> Option<String> {
        let mut path = segments.to_vec();
        for _ in 0..16 {
            let module = (0..=path.len())
                .rev()
                .map(|n| path[..n].join("::"))
                .find(|candidate| modules.contains_key(candidate))?;
            let depth = if module.is_empty() {
                0
            } else {
                module.split("::").count()
            };
            match path
                .get(depth)
                .and_then(|name| reexports.get(&(module.clone(), name.clone())))
            {
                Some(target) => {
                    path = target
                        .iter()
                        .cloned()
                        .chain(path[depth + 1..].iter().cloned())
                        .collect();
                }
                None => return Some(module),
            }
        }
        None
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("a readable file");
        let is_dir = file.ends_with("mod.rs") || file.ends_with("lib.rs");
        let own: Vec<String> = if module.is_empty() {
            Vec::new()
        } else {
            module.split("::").map(str::to_owned).collect()
        };
        let parent = &own[..own.len().saturating_sub(1)];
        for (kind, segments) in paths(&code_of(&text)) {
            let full: Vec<String> = match kind.as_str() {
                "crate" => segments,
                "super" => parent.iter().cloned().chain(segments).collect(),
                _ if is_dir => own.iter().cloned().chain(segments).collect(),
                _ => continue,
            };
            if let Some(target) = resolve(&full).filter(|t| t != module && !t.is_empty()) {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

/// The circles of the graph: its strongly connected components of more than one module.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    let nodes: BTreeSet<&str> = edges
        .iter()
        .flat_map(|(v, ws)| std::iter::once(v.as_str()).chain(ws.iter().map(String::as_str)))
        .collect();
    for v in nodes {
        if !tarjan.index.contains_key(v) {
            tarjan.visit(v);
        }
    }
    tarjan.found
}

fn src() -> PathBuf {
    std::env::var_os("TSR_LAYERING_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The modules of the layer: the service, its response future, the state its clones share,
/// the replayed body, the counters, the decision and the policy.
const LAYER: [&str; 7] = [
    "service", "future", "shared", "body", "metrics", "decide", "policy",
];

fn is_in(module: &str, family: &str) -> bool {
    module == family || module.starts_with(&format!("{family}::"))
}

#[test]
fn no_import_circle_in_src() {
    let circles = circles(&graph(&src()));
    assert!(
        circles.is_empty(),
        "import circles in src/ (each a set of modules that import each other): {circles:#?}"
    );
}

/// The same at the level of the root's modules (a directory counts as one): `classify` may not
/// import a module that imports `classify` back, even through different files.
fn top_level(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |module: &str| module.split("::").next().unwrap_or_default().to_owned();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges {
        for to in to {
            if top(from) != top(to) {
                out.entry(top(from)).or_default().insert(top(to));
            }
        }
    }
    out
}

#[test]
fn no_import_circle_between_the_roots_modules() {
    let circles = circles(&top_level(&graph(&src())));
    assert!(
        circles.is_empty(),
        "import circles between the root's modules (a directory counts as one): {circles:#?}"
    );
}

#[test]
fn the_classifiers_import_nothing_of_the_write_path_or_the_layer() {
    let edges = graph(&src());
    let wrong: Vec<String> = edges
        .iter()
        .filter(|(from, _)| is_in(from, "classify"))
        .flat_map(|(from, to)| to.iter().map(move |to| (from, to)))
        .filter(|(_, to)| is_in(to, "write") || LAYER.iter().any(|layer| is_in(to, layer)))
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect();
    assert!(wrong.is_empty(), "classify/ imports upward: {wrong:#?}");
}

#[test]
fn the_layer_and_the_write_path_never_import_each_other() {
    let edges = graph(&src());
    let wrong: Vec<String> = edges
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |to| (from, to)))
        .filter(|(from, to)| {
            let from_layer = LAYER.iter().any(|layer| is_in(from, layer));
            let to_layer = LAYER.iter().any(|layer| is_in(to, layer));
            (from_layer && is_in(to, "write")) || (is_in(from, "write") && to_layer)
        })
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "the layer and the write path import each other: {wrong:#?}"
    );
}

/// The write module's layers, bottom first (ARCHITECTURE.md, "Layering"): a file imports only
/// from its own layer and those below it, and the front ends (layer 2) not from each other.
const WRITE_LAYERS: [(&str, usize); 6] = [
    ("write::core", 0),
    ("write::durable", 1),
    ("write::queue", 2),
    ("write::sqlx", 2),
    ("write::thread", 2),
    ("write", 3),
];

/// The layer of a module of `write/` (its longest matching prefix), and that prefix.
fn write_layer(module: &str) -> Option<(usize, &'static str)> {
    WRITE_LAYERS
        .iter()
        .filter(|(prefix, _)| is_in(module, prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|&(prefix, layer)| (layer, prefix))
}

/// The imports of `write/` that run upward, or across from one front end to another.
fn write_imports_upward(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    edges
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |to| (from, to)))
        .filter_map(|(from, to)| {
            let (from_layer, from_part) = write_layer(from)?;
            let (to_layer, to_part) = write_layer(to)?;
            let upward = to_layer > from_layer;
            let across = to_layer == from_layer && from_layer == 2 && from_part != to_part;
            (upward || across)
                .then(|| format!("{from} (layer {from_layer}) -> {to} (layer {to_layer})"))
        })
        .collect()
}

#[test]
fn the_write_module_imports_only_downward() {
    let wrong = write_imports_upward(&graph(&src()));
    assert!(
        wrong.is_empty(),
        "write/ imports upward (core < durable < the front ends queue, sqlx, thread < the \
         facade), or from one front end into another: {wrong:#?}"
    );
}

/// `operation/` (outside HTTP) sits beside the layer: it uses the layer's decision, policy and
/// counters, the classifiers and the request core, and nothing of the write path; nothing but
/// the crate's root imports it.
#[test]
fn operation_is_imported_by_nothing_and_imports_no_write_path() {
    let edges = graph(&src());
    let wrong: Vec<String> = edges
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |to| (from, to)))
        .filter(|(from, to)| {
            (is_in(to, "operation") && !is_in(from, "operation"))
                || (is_in(from, "operation") && is_in(to, "write"))
        })
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect();
    assert!(wrong.is_empty(), "operation/'s place broken: {wrong:#?}");
}

/// The layers' check itself, on a tree made for it: an import from the bottom layer up to a
/// front end, and one from a front end into another, are found; downward ones are not.
#[test]
fn the_layers_check_finds_an_upward_import() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    for folder in ["write", "write/core", "write/sqlx", "write/thread"] {
        std::fs::create_dir_all(src.join(folder)).unwrap();
    }
    std::fs::write(src.join("lib.rs"), "mod write;\n").unwrap();
    std::fs::write(
        src.join("write/mod.rs"),
        "mod core;\nmod sqlx;\nmod thread;\n",
    )
    .unwrap();
    std::fs::write(src.join("write/core/mod.rs"), "pub(crate) mod turn;\n").unwrap();
    std::fs::write(src.join("write/sqlx/mod.rs"), "pub(crate) mod pool;\n").unwrap();
    std::fs::write(
        src.join("write/thread/mod.rs"),
        "use crate::write::core::turn::Turn;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("write/sqlx/pool.rs"),
        "use crate::write::core::turn::Turn;\n",
    )
    .unwrap();
    std::fs::write(src.join("write/core/turn.rs"), "pub struct Turn;\n").unwrap();
    assert!(
        write_imports_upward(&graph(src)).is_empty(),
        "downward only"
    );
    std::fs::write(
        src.join("write/core/turn.rs"),
        "pub struct Turn(crate::write::sqlx::pool::Pool);\n",
    )
    .unwrap();
    std::fs::write(
        src.join("write/thread/mod.rs"),
        "use crate::write::sqlx::pool::Pool;\n",
    )
    .unwrap();
    let wrong = write_imports_upward(&graph(src));
    assert_eq!(wrong.len(), 2, "{wrong:#?}");
}

/// The reader itself: a circle of three files, written the ways the crate's files write
/// paths, is found; a parent's re-export of its child is not an import.
#[test]
fn the_reader_finds_a_circle_and_skips_re_exports() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("w")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod w;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::w::pool::Pool; // crate::b\n").unwrap();
    std::fs::write(
        src.join("w/mod.rs"),
        "mod pool;\nmod tx;\npub use self::tx::Tx;\n",
    )
    .unwrap();
    std::fs::write(src.join("w/pool.rs"), "use super::tx::Tx;\n").unwrap();
    std::fs::write(
        src.join("w/tx.rs"),
        "/// see crate::a\nfn f() { super::pool::Pool::new(); }\n",
    )
    .unwrap();
    let edges = graph(src);
    assert_eq!(circles(&edges), vec![vec!["w::pool", "w::tx"]]);
    assert!(
        !edges.contains_key("w"),
        "a re-export is no import: {edges:?}"
    );
    assert!(!edges["w::tx"].contains("a"), "a comment is no import");
    std::fs::write(src.join("w/tx.rs"), "pub struct Tx;\n").unwrap();
    assert!(circles(&graph(src)).is_empty());

    // A path through the root's re-export is an import of the module that defines the item:
    // `a` names `crate::Tx` (the root's `pub use w::Tx`), `w::tx` names `crate::a::A`.
    std::fs::write(src.join("lib.rs"), "mod a;\nmod w;\npub use w::Tx;\n").unwrap();
    std::fs::write(src.join("a.rs"), "pub struct A(crate::Tx);\n").unwrap();
    std::fs::write(src.join("w/tx.rs"), "pub struct Tx(crate::a::A);\n").unwrap();
    assert_eq!(circles(&graph(src)), vec![vec!["a", "w::tx"]]);
}
