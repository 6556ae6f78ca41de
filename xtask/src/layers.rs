//! `cargo xtask layers`: the module structure of the library crates, checked.
//!
//! Every `crate::`, `super::` and `self::` path in a crate's non-test code is resolved to the
//! module it names (the longest known module prefix). A reference from module `a::x::..` to
//! module `a::y::..` is an edge `x -> y` between the siblings `x` and `y` of `a`; references
//! between a module and its own ancestors or descendants are not sibling edges (a `mod.rs`
//! holds what its children implement). Two rules are checked:
//!
//! - no cycle between sibling modules, at any depth (Tarjan's strongly connected components
//!   over each parent's sibling graph);
//! - each entry of [`SEALED`] imports nothing of its crate outside itself (the HTTP/1.1 layer
//!   knows nothing of the proxy that uses it).
//!
//! Items and modules under `#[cfg(test)]` (so the `tests.rs` files they declare) are skipped:
//! tests may reach across.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use syn::visit::Visit;

use crate::shell;

/// The library crates checked: (name shown, source root).
const CRATES: &[(&str, &str)] = &[
    ("warmpath-agent", "agent/src/lib.rs"),
    ("warmpath-bench", "bench/src/lib.rs"),
    ("warmpath-sim", "sim/src/lib.rs"),
    ("warmpath-tokenizer", "tokenizer/src/lib.rs"),
];

/// Modules that may import nothing else of their crate: (crate, module path).
const SEALED: &[(&str, &str)] = &[("warmpath-agent", "http")];

/// A module path from the crate root (`[]` is the root).
type ModPath = Vec<String>;

/// One resolved reference: from a module to a module, where it was written.
#[derive(Debug, Clone)]
struct Reference {
    from: ModPath,
    to: ModPath,
    at: String,
}

/// Runs the check over every crate of [`CRATES`]; an error lists every finding.
pub fn check() -> Result<()> {
    let root = shell::workspace_root();
    let mut report = String::new();
    for (name, lib) in CRATES {
        let refs =
            crate_references(&root, &root.join(lib)).with_context(|| format!("reading {name}"))?;
        let findings = findings(name, &refs);
        println!(
            "{name}: {} references between modules, {} findings",
            refs.len(),
            findings.len()
        );
        for f in findings {
            let _ = writeln!(report, "{name}: {f}");
        }
    }
    if !report.is_empty() {
        bail!("module structure:\n{report}");
    }
    println!("no cycles between sibling modules; sealed modules import only themselves");
    Ok(())
}

/// Cycles and sealed-module violations among `refs`, as lines.
fn findings(krate: &str, refs: &[Reference]) -> Vec<String> {
    let mut out = Vec::new();
    for (sealed_crate, sealed) in SEALED {
        if *sealed_crate != krate {
            continue;
        }
        let sealed: ModPath = sealed.split("::").map(String::from).collect();
        for r in refs {
            if r.from.starts_with(&sealed) && !r.to.starts_with(&sealed) {
                out.push(format!(
                    "{} (sealed) imports {} at {}",
                    sealed.join("::"),
                    display(&r.to),
                    r.at
                ));
            }
        }
    }
    // parent -> sibling graph: child -> (child -> an example reference)
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, String>>> = BTreeMap::new();
    for r in refs {
        let common = r.from.iter().zip(&r.to).take_while(|(a, b)| a == b).count();
        if common == r.from.len() || common == r.to.len() {
            continue; // ancestor or descendant
        }
        graphs
            .entry(r.from[..common].to_vec())
            .or_default()
            .entry(r.from[common].clone())
            .or_default()
            .entry(r.to[common].clone())
            .or_insert_with(|| format!("{} -> {} at {}", display(&r.from), display(&r.to), r.at));
    }
    for (parent, graph) in &graphs {
        for component in strongly_connected(graph) {
            let mut line = format!(
                "cycle between modules of {}: {}",
                display(parent),
                component.iter().cloned().collect::<Vec<_>>().join(", ")
            );
            for a in &component {
                for (b, example) in &graph[a] {
                    if component.contains(b) {
                        let _ = write!(line, "\n    {example}");
                    }
                }
            }
            out.push(line);
        }
    }
    out
}

fn display(path: &[String]) -> String {
    if path.is_empty() {
        "crate".into()
    } else {
        path.join("::")
    }
}

/// Strongly connected components of more than one node (Tarjan).
fn strongly_connected(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("v was visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("v was visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

// === reading a crate ===

/// Every reference between modules of the crate rooted at `lib`.
fn crate_references(root: &Path, lib: &Path) -> Result<Vec<Reference>> {
    let mut files = Vec::new();
    let mut modules = BTreeSet::new();
    collect(lib, Vec::new(), &mut files, &mut modules)?;
    let mut refs = Vec::new();
    for (file, module, ast) in &files {
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        let mut v = Paths {
            modules: &modules,
            stack: vec![module.clone()],
            file: &shown,
            out: &mut refs,
        };
        for item in &ast.items {
            v.visit_item(item);
        }
    }
    Ok(refs)
}

/// Parses `file` (module `module`) and, recursively, the files of its `mod x;` items.
fn collect(
    file: &Path,
    module: ModPath,
    files: &mut Vec<(PathBuf, ModPath, syn::File)>,
    modules: &mut BTreeSet<ModPath>,
) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let ast = syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
    modules.insert(module.clone());
    // Where `mod x;` of this file looks: next to lib.rs/mod.rs, else in a folder of its name.
    let dir = match file.file_name().and_then(|n| n.to_str()) {
        Some("lib.rs" | "mod.rs" | "main.rs") => file.parent().map(Path::to_path_buf),
        _ => file.parent().map(|p| {
            p.join(
                file.file_stem()
                    .expect("a .rs file has a stem")
                    .to_string_lossy()
                    .as_ref(),
            )
        }),
    }
    .context("a source file has a folder")?;
    declare_inline(&ast.items, &module, modules);
    for item in &ast.items {
        let syn::Item::Mod(m) = item else { continue };
        if m.content.is_some() || is_test(&m.attrs) {
            continue;
        }
        let name = m.ident.to_string();
        let explicit = m.attrs.iter().find_map(|a| {
            let syn::Meta::NameValue(nv) = &a.meta else {
                return None;
            };
            if !nv.path.is_ident("path") {
                return None;
            }
            let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
            else {
                return None;
            };
            Some(dir.join(s.value()))
        });
        let path = explicit
            .or_else(|| {
                [
                    dir.join(format!("{name}.rs")),
                    dir.join(&name).join("mod.rs"),
                ]
                .into_iter()
                .find(|p| p.is_file())
            })
            .with_context(|| format!("{}: no file for `mod {name};`", file.display()))?;
        let mut child = module.clone();
        child.push(name);
        collect(&path, child, files, modules)?;
    }
    files.push((file.to_path_buf(), module, ast));
    Ok(())
}

/// Records inline `mod x { ... }` modules (not test ones) as known modules.
fn declare_inline(items: &[syn::Item], module: &ModPath, modules: &mut BTreeSet<ModPath>) {
    for item in items {
        if let syn::Item::Mod(m) = item
            && let Some((_, inner)) = &m.content
            && !is_test(&m.attrs)
        {
            let mut child = module.clone();
            child.push(m.ident.to_string());
            modules.insert(child.clone());
            declare_inline(inner, &child, modules);
        }
    }
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// Collects module-to-module references of one file.
struct Paths<'a> {
    modules: &'a BTreeSet<ModPath>,
    /// The module being walked (inline modules push onto it).
    stack: Vec<ModPath>,
    file: &'a str,
    out: &'a mut Vec<Reference>,
}

impl Paths<'_> {
    fn here(&self) -> &ModPath {
        self.stack
            .last()
            .expect("the file's module is at the bottom")
    }

    /// Resolves `segments` (as written, from `crate`, `super` or `self`) to a known module.
    fn record(&mut self, segments: &[String], line: usize) {
        let mut target: ModPath = match segments.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("self") | Some("super") => self.here().clone(),
            _ => return,
        };
        let mut rest = &segments[1..];
        if segments[0] == "super" {
            target.pop();
        }
        while rest.first().is_some_and(|s| s == "super") {
            target.pop();
            rest = &rest[1..];
        }
        // Longest known module prefix.
        for s in rest {
            let mut next = target.clone();
            next.push(s.clone());
            if !self.modules.contains(&next) {
                break;
            }
            target = next;
        }
        if &target != self.here() {
            self.out.push(Reference {
                from: self.here().clone(),
                to: target,
                at: format!("{}:{line}", self.file),
            });
        }
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if is_test(attrs) {
            return;
        }
        if let syn::Item::Mod(m) = item {
            if let Some((_, items)) = &m.content {
                let mut child = self.here().clone();
                child.push(m.ident.to_string());
                self.stack.push(child);
                for i in items {
                    self.visit_item(i);
                }
                self.stack.pop();
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut prefixes = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut prefixes);
        let line = u.use_token.span.start().line;
        for p in prefixes {
            self.record(&p, line);
        }
    }

    /// `pub(crate)` and `pub(in path)` say who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = p
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        self.record(&segments, line);
        syn::visit::visit_path(self, p);
    }
}

/// Every full path a `use` tree names.
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut p = prefix.clone();
            if n.ident != "self" {
                p.push(n.ident.to_string());
            }
            out.push(p);
        }
        syn::UseTree::Rename(r) => {
            let mut p = prefix.clone();
            if r.ident != "self" {
                p.push(r.ident.to_string());
            }
            out.push(p);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(from: &str, to: &str) -> Reference {
        let split = |s: &str| -> ModPath {
            s.split("::")
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect()
        };
        Reference {
            from: split(from),
            to: split(to),
            at: "f.rs:1".into(),
        }
    }

    #[test]
    fn a_sibling_cycle_is_found_at_its_depth() {
        let refs = [
            r("proxy::h1::client", "proxy::workers"),
            r("proxy::workers", "proxy::h1"),
        ];
        let f = findings("x", &refs);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].starts_with("cycle between modules of proxy: h1, workers"),
            "{f:?}"
        );
    }

    #[test]
    fn parents_and_children_and_one_way_edges_are_not_cycles() {
        let refs = [
            r("proxy", "proxy::h1"),
            r("proxy::h1", "proxy"),
            r("proxy::handle", "routing"),
            r("routing::scorers", "kv_index"),
        ];
        assert!(findings("x", &refs).is_empty());
    }

    #[test]
    fn a_sealed_module_reaching_out_is_named() {
        let refs = [r("http::server", "http"), r("http::server", "proxy::error")];
        let f = findings("warmpath-agent", &refs);
        assert_eq!(f, ["http (sealed) imports proxy::error at f.rs:1"]);
    }

    #[test]
    fn paths_resolve_to_the_longest_known_module() {
        let modules: BTreeSet<ModPath> = [
            vec![],
            vec!["a".to_string()],
            vec!["a".to_string(), "b".to_string()],
            vec!["c".to_string()],
        ]
        .into_iter()
        .collect();
        let mut out = Vec::new();
        let mut p = Paths {
            modules: &modules,
            stack: vec![vec!["a".into(), "b".into()]],
            file: "f.rs",
            out: &mut out,
        };
        let seg = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
        p.record(&seg("crate::c::Thing"), 3);
        p.record(&seg("super::super::c::d"), 4);
        p.record(&seg("super::Item"), 5);
        p.record(&seg("self::Local"), 6);
        p.record(&seg("std::io"), 7);
        let got: Vec<_> = out.iter().map(|r| (display(&r.to), r.at.clone())).collect();
        assert_eq!(
            got,
            [
                ("c".to_string(), "f.rs:3".to_string()),
                ("c".to_string(), "f.rs:4".to_string()),
                ("a".to_string(), "f.rs:5".to_string()),
            ]
        );
    }

    #[test]
    fn visibility_is_not_a_use_but_a_path_in_a_body_is() {
        let modules: BTreeSet<ModPath> =
            [vec![], vec!["http".to_string()], vec!["proxy".to_string()]]
                .into_iter()
                .collect();
        let file: syn::File = syn::parse_str(
            "pub(crate) fn f() { crate::proxy::g() }\n#[cfg(test)]\nmod tests { fn t() { crate::proxy::h() } }",
        )
        .unwrap();
        let mut out = Vec::new();
        let mut p = Paths {
            modules: &modules,
            stack: vec![vec!["http".into()]],
            file: "f.rs",
            out: &mut out,
        };
        for item in &file.items {
            p.visit_item(item);
        }
        let got: Vec<_> = out.iter().map(|r| display(&r.to)).collect();
        assert_eq!(got, ["proxy"]);
    }
}
