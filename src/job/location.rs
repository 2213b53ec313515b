//! Where in a job file a problem is: line and column, for TOML syntax errors
//! and for problems that name a key the file holds.

/// Line and column (both 1-based, the column counted in characters) of
/// byte `offset` in `text`.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |at| at + 1);
    let column = before[start..].chars().count() + 1;
    (line, column)
}

/// Where the key at dotted `path` (e.g. `backend.concurrency`) is written in
/// `text`, when the file writes it.
fn key_location(text: &str, path: &str) -> Option<(usize, usize)> {
    let table = toml::de::DeTable::parse(text).ok()?;
    let mut current = table.get_ref();
    let mut segments = path.split('.').peekable();
    while let Some(segment) = segments.next() {
        let (key, value) = current
            .iter()
            .find(|(key, _)| key.get_ref().as_ref() == segment)?;
        if segments.peek().is_none() {
            return Some(line_column(text, key.span().start));
        }
        match value.get_ref() {
            toml::de::DeValue::Table(inner) => current = inner,
            _ => return None,
        }
    }
    None
}

/// `problem` with the line and column of the first key it quotes in
/// backticks, when the file writes that key and `--set` does not set it
/// (or a table holding it) in `overridden`: the value at fault is then not
/// the file's.
pub(super) fn locate(text: &str, problem: String, overridden: &[&str]) -> String {
    let Some(path) = problem.split('`').nth(1) else {
        return problem;
    };
    let path = path.trim_start_matches('[').trim_end_matches(']');
    let set = overridden.iter().any(|key| {
        path == *key || path.starts_with(&format!("{key}.")) || key.starts_with(&format!("{path}."))
    });
    if set {
        return problem;
    }
    match key_location(text, path) {
        Some((line, column)) => format!("line {line}, column {column}: {problem}"),
        None => problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_become_lines_and_columns() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 6), (2, 1));
        assert_eq!(line_column(text, text.find('=').unwrap()), (1, 3));
        assert_eq!(line_column(text, text.rfind('=').unwrap()), (2, 4));
        assert_eq!(line_column(text, 999), (3, 1));
    }

    #[test]
    fn a_problem_naming_a_written_key_gets_its_place() {
        let text = "name = \"x\"\n[backend]\nkind = \"api\"\n  concurrency = 0\n";
        let problem = "`backend.concurrency` must be between 1 and 1024";
        assert_eq!(
            locate(text, problem.into(), &[]),
            "line 4, column 3: `backend.concurrency` must be between 1 and 1024"
        );
        // A value `--set` gave is not the file's.
        assert_eq!(
            locate(text, problem.into(), &["backend.concurrency"]),
            problem
        );
        assert_eq!(locate(text, problem.into(), &["backend"]), problem);
        assert_eq!(
            locate(text, "missing `[output]`".into(), &[]),
            "missing `[output]`"
        );
        assert_eq!(
            locate(text, "unknown key `backend.typo`".into(), &[]),
            "unknown key `backend.typo`"
        );
        assert_eq!(locate(text, "no key here".into(), &[]), "no key here");
    }
}
