//! Paths in a job file are taken from the job file's directory, not from the
//! directory the command runs in, so that a job runs the same by hand and
//! from cron. `--set` values are taken the same way.

use std::path::{Component, Path, PathBuf};

/// `path` as seen from `base` (the job file's directory): unchanged when it
/// is absolute or `base` is empty, else joined to `base`, with `dir/..`
/// pairs taken out where `dir` is not a symbolic link.
pub fn relative_to(base: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() || base.as_os_str().is_empty() {
        return path.to_path_buf();
    }
    tidy(&base.join(path))
}

/// A glob or path from `source.paths`, as seen from `base`. The base is
/// escaped when the pattern is a glob, so that brackets in a directory name
/// are not read as glob syntax.
pub fn pattern_relative_to(base: &Path, pattern: &str) -> String {
    let path = Path::new(pattern);
    if path.is_absolute() || base.as_os_str().is_empty() {
        return pattern.to_string();
    }
    let joined = tidy(&base.join(path));
    let is_glob = pattern.contains(['*', '?', '[', '{']);
    if !is_glob {
        return joined.to_string_lossy().into_owned();
    }
    // The tidied base is a prefix of the joined pattern only when no `..`
    // of the pattern reached into it; then it is escaped on its own.
    let base = tidy(base);
    match joined.strip_prefix(&base) {
        Ok(rest) if !base.as_os_str().is_empty() => format!(
            "{}/{}",
            globset::escape(&base.to_string_lossy()),
            rest.to_string_lossy()
        ),
        _ => joined.to_string_lossy().into_owned(),
    }
}

/// Drops `.` and takes out `dir/..` where `dir` is a plain directory (not a
/// symbolic link, whose `..` is elsewhere).
fn tidy(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                let last_is_normal =
                    matches!(out.components().next_back(), Some(Component::Normal(_)));
                let is_link =
                    std::fs::symlink_metadata(&out).is_ok_and(|m| m.file_type().is_symlink());
                if last_is_normal && !is_link {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_hang_from_the_job_files_directory() {
        let base = Path::new("/srv/jobs");
        assert_eq!(
            relative_to(base, Path::new("out/x.parquet")),
            Path::new("/srv/jobs/out/x.parquet")
        );
        assert_eq!(
            relative_to(base, Path::new("../data/x.jsonl")),
            Path::new("/srv/data/x.jsonl")
        );
        assert_eq!(
            relative_to(base, Path::new("/abs/x.jsonl")),
            Path::new("/abs/x.jsonl")
        );
        assert_eq!(
            relative_to(Path::new(""), Path::new("out/x.parquet")),
            Path::new("out/x.parquet")
        );
        assert_eq!(
            relative_to(Path::new("jobs"), Path::new("../docs")),
            Path::new("docs")
        );
        assert_eq!(
            relative_to(Path::new("jobs"), Path::new("../../docs")),
            Path::new("../docs")
        );
    }

    #[test]
    fn globs_keep_their_syntax_and_the_base_is_escaped() {
        assert_eq!(
            pattern_relative_to(Path::new("/srv/jobs"), "../docs/**/*.md"),
            "/srv/docs/**/*.md"
        );
        assert_eq!(
            pattern_relative_to(Path::new("/srv/[x]"), "docs/*.md"),
            "/srv/[[]x[]]/docs/*.md"
        );
        assert_eq!(
            pattern_relative_to(Path::new("/srv/jobs"), "docs"),
            "/srv/jobs/docs"
        );
        assert_eq!(pattern_relative_to(Path::new(""), "*.md"), "*.md");
    }

    #[test]
    fn a_parent_of_a_symbolic_link_is_not_taken_out() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real/jobs");
        std::fs::create_dir_all(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            relative_to(&link, Path::new("../docs")),
            link.join("../docs")
        );
    }
}
