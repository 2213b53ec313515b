//! Plain text files named by globs, directories or single paths.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::{io_error, path_text, Document, Source, SourceError, SourceStats};

/// A file to read, with the id it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    path: PathBuf,
    doc_id: String,
}

/// Every file is listed at open (paths only, so a glob that matches nothing
/// stops the job before any work) and read one at a time afterwards.
pub struct FilesSource {
    entries: std::vec::IntoIter<Entry>,
    stats: SourceStats,
}

impl FilesSource {
    pub fn open(paths: &[String]) -> Result<Self, SourceError> {
        if paths.is_empty() {
            return Err(SourceError::NoMatch {
                pattern: "(no `source.paths` given)".to_string(),
            });
        }
        let mut entries = Vec::new();
        for pattern in paths {
            let mut found = expand(pattern)?;
            if found.is_empty() {
                return Err(SourceError::NoMatch {
                    pattern: pattern.clone(),
                });
            }
            // Within one pattern the order is by id, so it doesn't depend on
            // the file system; patterns keep the order the job gives them.
            found.sort_by(|a, b| a.doc_id.cmp(&b.doc_id).then_with(|| a.path.cmp(&b.path)));
            entries.extend(found);
        }
        Ok(FilesSource {
            entries: entries.into_iter(),
            stats: SourceStats::default(),
        })
    }
}

impl Source for FilesSource {
    fn next_document(&mut self) -> Result<Option<Document>, SourceError> {
        for entry in self.entries.by_ref() {
            let bytes = std::fs::read(&entry.path).map_err(|e| io_error(&entry.path, e))?;
            let text = String::from_utf8(bytes).map_err(|e| SourceError::Utf8 {
                path: entry.path.clone(),
                offset: e.utf8_error().valid_up_to() as u64,
            })?;
            if text.trim().is_empty() {
                self.stats.skipped_empty += 1;
                continue;
            }
            self.stats.documents += 1;
            return Ok(Some(Document {
                doc_id: entry.doc_id,
                source: Arc::from(path_text(&entry.path)),
                text,
            }));
        }
        Ok(None)
    }

    fn stats(&self) -> SourceStats {
        self.stats
    }
}

fn has_glob_syntax(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// The files one `paths` entry names, each with its id.
fn expand(pattern: &str) -> Result<Vec<Entry>, SourceError> {
    let path = Path::new(pattern);
    if !has_glob_syntax(pattern) || path.exists() {
        return expand_path(pattern, path);
    }
    let root = glob_root(pattern);
    let matches = glob::glob(pattern).map_err(|e| SourceError::Pattern {
        pattern: pattern.to_string(),
        message: e.to_string(),
    })?;
    let mut entries = Vec::new();
    for found in matches {
        let found = found.map_err(|e| {
            let path = e.path().to_path_buf();
            io_error(&path, e.into())
        })?;
        if found.is_file() {
            let doc_id = relative_id(&found, &root);
            entries.push(Entry {
                path: found,
                doc_id,
            });
        }
    }
    Ok(entries)
}

fn expand_path(pattern: &str, path: &Path) -> Result<Vec<Entry>, SourceError> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SourceError::NoMatch {
                pattern: pattern.to_string(),
            })
        }
        Err(e) => return Err(io_error(path, e)),
    };
    if metadata.is_dir() {
        let mut entries = Vec::new();
        walk(path, path, &mut entries)?;
        Ok(entries)
    } else if metadata.is_file() {
        let doc_id = path.file_name().map_or_else(
            || path_text(path),
            |name| name.to_string_lossy().into_owned(),
        );
        Ok(vec![Entry {
            path: path.to_path_buf(),
            doc_id,
        }])
    } else {
        Ok(Vec::new())
    }
}

/// Every regular file under `dir`. Links to files are followed; links to
/// directories are not, so a link cycle cannot loop forever.
fn walk(root: &Path, dir: &Path, entries: &mut Vec<Entry>) -> Result<(), SourceError> {
    let listing = std::fs::read_dir(dir).map_err(|e| io_error(dir, e))?;
    for item in listing {
        let item = item.map_err(|e| io_error(dir, e))?;
        let path = item.path();
        let file_type = item.file_type().map_err(|e| io_error(&path, e))?;
        if file_type.is_dir() {
            walk(root, &path, entries)?;
        } else if file_type.is_file() || (file_type.is_symlink() && path.is_file()) {
            let doc_id = relative_id(&path, root);
            entries.push(Entry { path, doc_id });
        }
    }
    Ok(())
}

/// The longest leading part of a glob without glob syntax: `docs/**/*.md`
/// has the root `docs`, and `*.md` the empty root.
fn glob_root(pattern: &str) -> PathBuf {
    let mut root = PathBuf::new();
    for component in Path::new(pattern).components() {
        if has_glob_syntax(&component.as_os_str().to_string_lossy()) {
            break;
        }
        root.push(component);
    }
    root
}

/// `path` relative to `root`, with forward slashes on every platform.
fn relative_id(path: &Path, root: &Path) -> String {
    // `./docs` and `docs` are the same root; glob output may drop the `./`.
    let normal = |p: &Path| -> PathBuf {
        p.components()
            .filter(|c| !matches!(c, Component::CurDir))
            .collect()
    };
    let path = normal(path);
    let root = normal(root);
    let relative = path.strip_prefix(&root).unwrap_or(&path);
    relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::super::testing::{first_error, ids, read_all};
    use super::*;

    fn write(root: &Path, relative: &str, text: &[u8]) {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "docs/b.md", b"# B");
        write(dir.path(), "docs/a.md", b"# A");
        write(dir.path(), "docs/guide/intro.md", b"Intro");
        write(dir.path(), "docs/guide/notes.txt", b"Notes");
        write(dir.path(), "docs/blank.md", b"  \n\t\n");
        write(dir.path(), "docs/empty.md", b"");
        dir
    }

    fn open_one(pattern: &Path) -> FilesSource {
        FilesSource::open(&[path_text(pattern)]).unwrap()
    }

    #[test]
    fn a_glob_names_files_relative_to_its_root_in_order() {
        let dir = tree();
        let pattern = dir.path().join("docs").join("**").join("*.md");
        let mut source = open_one(&pattern);
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["a.md", "b.md", "guide/intro.md"]);
        assert_eq!(documents[0].text, "# A");
        assert_eq!(
            &*documents[2].source,
            path_text(&dir.path().join("docs/guide/intro.md"))
        );
        assert_eq!(
            source.stats(),
            SourceStats {
                documents: 3,
                skipped_null: 0,
                skipped_empty: 2
            }
        );
    }

    #[test]
    fn a_glob_root_stops_at_the_first_wildcard() {
        assert_eq!(glob_root("docs/**/*.md"), PathBuf::from("docs"));
        assert_eq!(glob_root("docs/guide*/x.md"), PathBuf::from("docs"));
        assert_eq!(glob_root("*.md"), PathBuf::new());
        assert_eq!(glob_root("a/b/[ab].md"), PathBuf::from("a/b"));
        assert_eq!(
            relative_id(Path::new("docs/x/y.md"), Path::new("./docs")),
            "x/y.md"
        );
    }

    #[test]
    fn a_directory_is_walked_recursively_for_every_file() {
        let dir = tree();
        let mut source = open_one(&dir.path().join("docs"));
        let documents = read_all(&mut source).unwrap();
        assert_eq!(
            ids(&documents),
            ["a.md", "b.md", "guide/intro.md", "guide/notes.txt"]
        );
        assert_eq!(source.stats().skipped_empty, 2);
    }

    #[test]
    fn a_single_file_is_named_by_its_file_name() {
        let dir = tree();
        let path = dir.path().join("docs/guide/intro.md");
        let documents = read_all(&mut open_one(&path)).unwrap();
        assert_eq!(ids(&documents), ["intro.md"]);
        assert_eq!(&*documents[0].source, path_text(&path));
    }

    #[test]
    fn entries_keep_the_order_the_job_gives() {
        let dir = tree();
        let mut source = FilesSource::open(&[
            path_text(&dir.path().join("docs/guide")),
            path_text(&dir.path().join("docs/b.md")),
        ])
        .unwrap();
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["intro.md", "notes.txt", "b.md"]);
    }

    #[test]
    fn a_pattern_or_path_that_matches_nothing_is_an_error_naming_it() {
        let dir = tree();
        for missing in [dir.path().join("docs/*.rst"), dir.path().join("nowhere")] {
            let Err(error) = FilesSource::open(&[path_text(&missing)]) else {
                panic!("{} matched", missing.display());
            };
            assert!(matches!(error, SourceError::NoMatch { .. }), "{error}");
            assert!(error.is_found_at_open());
            assert!(error.to_string().contains(&path_text(&missing)), "{error}");
        }
        std::fs::create_dir(dir.path().join("hollow")).unwrap();
        let Err(error) = FilesSource::open(&[path_text(&dir.path().join("hollow"))]) else {
            panic!("an empty directory matched");
        };
        assert!(matches!(error, SourceError::NoMatch { .. }), "{error}");
    }

    #[test]
    fn a_malformed_glob_is_an_error_at_open() {
        let dir = tree();
        let Err(error) = FilesSource::open(&[path_text(&dir.path().join("docs/[a.md"))]) else {
            panic!("a malformed glob was accepted");
        };
        assert!(matches!(error, SourceError::Pattern { .. }), "{error}");
        assert!(error.is_found_at_open());
    }

    #[test]
    fn invalid_utf8_names_the_file_and_offset() {
        let dir = tree();
        write(dir.path(), "docs/bad.md", b"ok text \xff\xfe more");
        let mut source = open_one(&dir.path().join("docs"));
        let error = first_error(&mut source);
        assert!(
            matches!(error, SourceError::Utf8 { offset: 8, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("bad.md"), "{error}");
        assert!(error.to_string().contains("offset 8"), "{error}");
    }

    #[test]
    fn only_blank_files_leave_nothing() {
        let dir = tree();
        let mut source = open_one(&dir.path().join("docs").join("[be]*.md"));
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["b.md"]);
        let mut source = open_one(&dir.path().join("docs").join("[e]*.md"));
        assert!(read_all(&mut source).unwrap().is_empty());
        assert_eq!(source.stats().skipped_empty, 1);
    }
}
