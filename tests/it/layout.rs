//! The shape of `src/`: no import cycle between modules, and no module
//! longer than a reader takes in at once.
//!
//! Modules are read as text: comments, string and character literals and
//! `#[cfg(test)]` items are taken out, then every `crate::…`, `super::…`
//! and `self::…` path names the module it reaches into. Two sibling modules
//! (children of the same parent, the crate's top-level modules included)
//! depend on each other when code anywhere inside one names the other;
//! those edges, at every level, must form no cycle. A parent and its own
//! children are not compared: a folder's `mod.rs` wires its files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lines of code (not blank, not only a comment, not in a test item) a
/// module file may hold.
const MAX_LINES_OF_CODE: usize = 700;

/// Files that are test code as a whole.
const TEST_FILES: [&str; 2] = ["testing.rs", "pipeline/tests.rs"];

#[test]
fn no_import_cycle_between_the_modules_of_src() {
    let modules = read_src();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for module in &modules {
        for target in &module.references {
            // The first place where the two paths part: those are siblings.
            let common = module
                .path
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= module.path.len() || common >= target.len() {
                continue; // a module and its own ancestor or descendant
            }
            let from = module.path[..=common].to_vec();
            let to = target[..=common].to_vec();
            if modules.iter().any(|m| m.path == to) {
                edges.entry(from).or_default().insert(to);
            }
        }
    }
    let cycles = find_cycles(&edges);
    assert!(
        cycles.is_empty(),
        "import cycles between modules of src/ (each line: a module, what it uses, …, back to \
         the first):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn no_module_of_src_is_longer_than_the_bound() {
    let long: Vec<String> = read_src()
        .into_iter()
        .filter(|m| m.lines_of_code > MAX_LINES_OF_CODE)
        .map(|m| format!("{}: {} lines of code", m.file.display(), m.lines_of_code))
        .collect();
    assert!(
        long.is_empty(),
        "modules over {MAX_LINES_OF_CODE} lines of code (blank lines, comments and test items \
         not counted): split them along what they do:\n{}",
        long.join("\n")
    );
}

/// The checker itself: a cycle is found, and what must not count does not.
#[test]
fn the_layout_reader_sees_paths_in_code_only() {
    let text = r##"
use crate::{alpha::One, beta::{Two, gamma::Three}};
use super::delta;
// crate::commented::Out
/// [`x`](crate::doc::Link)
fn f() { let s = "crate::quoted::Out"; let r = r#"crate::raw::Out"#; let c = '{'; crate::epsilon::go(); }
#[cfg(test)]
mod tests { use crate::testonly::X; }
#[cfg(test)]
fn helper() { crate::testfn::y(); }
"##;
    let code = code_only(text);
    let refs = references(&["zeta".to_string(), "eta".to_string()], &code);
    // A group names its prefix too (`beta`), which reaches only the module.
    let names: BTreeSet<String> = refs.iter().map(|r| r.join("::")).collect();
    let expected: BTreeSet<String> = [
        "alpha::One",
        "beta",
        "beta::Two",
        "beta::gamma::Three",
        "zeta::delta",
        "epsilon::go",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, expected);
    assert_eq!(count_lines_of_code(&code), 3, "two `use` lines and `fn f`");

    let edge = |a: &str, b: &str| (vec![a.to_string()], vec![b.to_string()]);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (a, b) in [
        edge("a", "b"),
        edge("b", "c"),
        edge("c", "a"),
        edge("c", "d"),
    ] {
        edges.entry(a).or_default().insert(b);
    }
    assert_eq!(find_cycles(&edges), vec!["a -> b -> c -> a".to_string()]);
    edges
        .get_mut(&vec!["c".to_string()])
        .unwrap()
        .remove(&vec!["a".to_string()]);
    assert!(find_cycles(&edges).is_empty());
}

struct Module {
    /// `pipeline::dispatch` as `["pipeline", "dispatch"]`; the crate root is `[]`.
    path: Vec<String>,
    file: PathBuf,
    /// Every module path the code names (with the item's name at the end,
    /// which the comparison of siblings never reaches).
    references: Vec<Vec<String>>,
    lines_of_code: usize,
}

fn read_src() -> Vec<Module> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect_rs(&src, &mut files);
    files.sort();
    assert!(files.len() > 20, "src/ has its modules: {files:?}");
    files
        .into_iter()
        .filter_map(|file| {
            let relative = file.strip_prefix(&src).expect("below src/").to_path_buf();
            let name = relative.to_string_lossy().replace('\\', "/");
            if TEST_FILES.contains(&name.as_str()) || name == "main.rs" {
                return None;
            }
            let path = module_path(&name);
            let text = std::fs::read_to_string(&file).expect("a source file reads");
            let code = code_only(&text);
            Some(Module {
                references: references(&path, &code),
                lines_of_code: count_lines_of_code(&code),
                path,
                file: relative,
            })
        })
        .collect()
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ lists") {
        let path = entry.expect("an entry of src/").path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `lib.rs` → `[]`, `job/mod.rs` → `["job"]`, `job/shard.rs` → `["job", "shard"]`.
fn module_path(relative: &str) -> Vec<String> {
    let stem = relative.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(String::from).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The text with comments, string and character literals blanked (line
/// breaks kept) and every `#[cfg(test)]` item removed.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep_breaks = |slice: &[char], out: &mut String| {
        out.extend(slice.iter().filter(|c| **c == '\n'));
    };
    while i < chars.len() {
        let rest = &chars[i..];
        if rest.starts_with(&['/', '/']) {
            let end = rest.iter().position(|c| *c == '\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with(&['/', '*']) {
            let mut depth = 0usize;
            let mut j = 0;
            while j < rest.len() {
                if rest[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            keep_breaks(&rest[..j.min(rest.len())], &mut out);
            i += j;
        } else if let Some(len) = raw_string_len(rest) {
            out.push_str("\"\"");
            keep_breaks(&rest[..len], &mut out);
            i += len;
        } else if rest[0] == '"' || rest.starts_with(&['b', '"']) {
            let start = usize::from(rest[0] == 'b');
            let mut j = start + 1;
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            keep_breaks(&rest[..j.min(rest.len())], &mut out);
            i += j + 1;
        } else if rest[0] == '\'' {
            // A character literal ('x', '\n', '\u{7f}') or a lifetime ('a).
            let len = if rest.get(1) == Some(&'\\') {
                rest.iter().skip(2).position(|c| *c == '\'').map(|p| p + 3)
            } else if rest.get(2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            match len {
                Some(len) => {
                    out.push_str("' '");
                    i += len;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    without_test_items(&out)
}

/// `r"…"`, `r#"…"#`, `br"…"`: the literal's length, when one starts here.
fn raw_string_len(rest: &[char]) -> Option<usize> {
    let start = match rest {
        ['r', ..] => 1,
        ['b', 'r', ..] => 2,
        _ => return None,
    };
    let hashes = rest[start..].iter().take_while(|c| **c == '#').count();
    if rest.get(start + hashes) != Some(&'"') {
        return None;
    }
    let body = start + hashes + 1;
    let mut j = body;
    while j < rest.len() {
        if rest[j] == '"'
            && rest[j + 1..]
                .iter()
                .take(hashes)
                .filter(|c| **c == '#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(rest.len())
}

/// Removes each item after a `#[cfg(test)]`: up to its first `;` outside
/// brackets, or to the brace that closes its first block.
fn without_test_items(code: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let (mut depth, mut braces) = (0i32, false);
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                '{' => {
                    depth += 1;
                    braces = true;
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 && braces {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        out.extend(item[..end].chars().filter(|c| *c == '\n'));
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

fn count_lines_of_code(code: &str) -> usize {
    code.lines()
        .filter(|line| line.chars().any(|c| !c.is_whitespace()))
        .count()
}

/// Every path the code names from `crate`, `super` or `self`, as module
/// paths from the crate root, with brace groups of `use` expanded.
fn references(module: &[String], code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for anchor in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(anchor).map(|p| p + from) {
            from = at + anchor.len();
            let before = at.checked_sub(1).map(|i| bytes[i]);
            if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
                continue; // part of a longer path or name (`$crate::`, `x::self::`)
            }
            let base: Vec<String> = match anchor {
                "crate::" => Vec::new(),
                "self::" => module.to_vec(),
                _ => {
                    // `super::super::x`: count the steps up.
                    let mut up = 1;
                    while code[from..].starts_with("super::") {
                        up += 1;
                        from += "super::".len();
                    }
                    module[..module.len().saturating_sub(up)].to_vec()
                }
            };
            expand(&code[from..], base, &mut found);
        }
    }
    found
}

/// Reads `a::b::{c, d::e}` at the start of `text`, adding each full path to `out`.
fn expand(text: &str, mut path: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut rest = text.trim_start();
    loop {
        let name_len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if name_len > 0 {
            path.push(rest[..name_len].to_string());
            rest = &rest[name_len..];
            if let Some(next) = rest.strip_prefix("::") {
                rest = next.trim_start();
                continue;
            }
            out.push(path);
            return;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        let part = group[start..i].trim();
                        if !part.is_empty() && part != "self" {
                            expand(part, path.clone(), out);
                        }
                        start = i + 1;
                        if c == '}' {
                            break;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
        return;
    }
}

/// Each cycle once, as `a -> b -> … -> a`, found by a depth-first search
/// from every module in order (a cycle is reported from its smallest member).
fn find_cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    let name = |p: &Vec<String>| p.join("::");
    let mut cycles = BTreeSet::new();
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((node, trail)) = stack.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if next == start {
                    let mut text: Vec<String> = trail.iter().map(name).collect();
                    text.push(name(start));
                    cycles.insert(text.join(" -> "));
                } else if next > start && seen.insert(next.clone()) {
                    let mut longer = trail.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    cycles.into_iter().collect()
}
