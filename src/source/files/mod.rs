//! Plain text files named by globs, directories or single paths, gzip- or
//! zstd-compressed or not.
//!
//! Files found by a directory walk or a glob are filtered by
//! `source.include` / `source.exclude` and, unless `source.on_invalid =
//! "error"`, passed over when they are not UTF-8 text (a binary file, an
//! archive) or hold more than [`MAX_DOCUMENT_BYTES`] once decompressed:
//! counted, and the first few named in the summary. A file named
//! on its own is always read, and is an error when it is not text.

mod config;

pub use self::config::{FilesParams, Kind, OnInvalid};

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use walkdir::WalkDir;

use super::input::{read_whole, WholeError};
use super::{io_error, path_text, Document, SkippedFiles, Source, SourceError, SourceStats};
use crate::bounded::MAX_DOCUMENT_BYTES;

/// A file to read, with the id it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    path: PathBuf,
    doc_id: String,
    /// Named on its own rather than found by a directory walk or a glob.
    named: bool,
    /// Which file it is, however it was reached.
    file: FileId,
}

/// Every file is listed at open (paths only, so a glob that matches nothing
/// stops the job before any work) and read one at a time afterwards.
pub struct FilesSource {
    entries: std::vec::IntoIter<Entry>,
    on_invalid: OnInvalid,
    stats: SourceStats,
    skipped: SkippedFiles,
}

/// `include` and `exclude`, matched against a file's id: its path below
/// the directory or glob root that found it. `*` crosses `/` too, so `*.md`
/// means markdown files at any depth.
struct Filter {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
}

/// A glob as `source.paths`, `include` and `exclude` write it; a `\\` is
/// a character like any other, as in a path.
fn glob(pattern: &str, literal_separator: bool) -> Result<globset::Glob, SourceError> {
    GlobBuilder::new(pattern)
        .literal_separator(literal_separator)
        .backslash_escape(false)
        .build()
        .map_err(|e| SourceError::Pattern {
            pattern: pattern.to_string(),
            message: e.kind().to_string(),
        })
}

impl Filter {
    fn new(params: &FilesParams) -> Result<Filter, SourceError> {
        let compile = |patterns: &[String]| -> Result<Option<GlobSet>, SourceError> {
            if patterns.is_empty() {
                return Ok(None);
            }
            let mut set = GlobSetBuilder::new();
            for pattern in patterns {
                set.add(glob(pattern, false)?);
            }
            set.build().map(Some).map_err(|e| SourceError::Pattern {
                pattern: patterns.join(", "),
                message: e.to_string(),
            })
        };
        Ok(Filter {
            include: compile(&params.include)?,
            exclude: compile(&params.exclude)?,
        })
    }

    fn is_active(&self) -> bool {
        self.include.is_some() || self.exclude.is_some()
    }

    fn keeps(&self, entry: &Entry) -> bool {
        if entry.named {
            return true;
        }
        let id = entry.doc_id.as_str();
        self.include.as_ref().is_none_or(|set| set.is_match(id))
            && !self.exclude.as_ref().is_some_and(|set| set.is_match(id))
    }
}

impl FilesSource {
    pub fn open(params: &FilesParams) -> Result<Self, SourceError> {
        let paths = &params.paths;
        if paths.is_empty() {
            return Err(SourceError::NoMatch {
                pattern: "(no `source.paths` given)".to_string(),
            });
        }
        let filter = Filter::new(params)?;
        let mut entries = Vec::new();
        // A file reached twice (through a link, or by two entries) is read once.
        let mut seen = std::collections::HashSet::new();
        for pattern in paths {
            let mut found = expand(pattern)?;
            if found.is_empty() {
                return Err(SourceError::NoMatch {
                    pattern: pattern.clone(),
                });
            }
            found.retain(|entry| filter.keeps(entry));
            // Within one pattern the order is by id, so it doesn't depend on
            // the file system; patterns keep the order the job gives them.
            found.sort_by(|a, b| a.doc_id.cmp(&b.doc_id).then_with(|| a.path.cmp(&b.path)));
            entries.extend(found.into_iter().filter(|e| seen.insert(e.file.clone())));
        }
        if entries.is_empty() && filter.is_active() {
            return Err(SourceError::NoMatch {
                pattern: format!(
                    "{} (with `source.include` {:?} and `source.exclude` {:?})",
                    paths.join(", "),
                    params.include,
                    params.exclude
                ),
            });
        }
        Ok(FilesSource {
            entries: entries.into_iter(),
            on_invalid: params.on_invalid,
            stats: SourceStats::default(),
            skipped: SkippedFiles::default(),
        })
    }

    /// The file's text; `None` when it is not text and is to be passed over.
    fn read(&mut self, entry: &Entry) -> Result<Option<String>, SourceError> {
        let problem = match read_whole(&entry.path, MAX_DOCUMENT_BYTES) {
            Err(WholeError::Io(error)) => return Err(error),
            Err(WholeError::TooLarge { limit }) => SourceError::TooLarge {
                path: entry.path.clone(),
                limit: crate::bounded::describe(limit),
                what: "a document",
            },
            Err(WholeError::Undecodable(reason)) => SourceError::NotText {
                path: entry.path.clone(),
                reason,
            },
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => match text.find('\0') {
                    None => return Ok(Some(text)),
                    Some(at) => SourceError::NotText {
                        path: entry.path.clone(),
                        reason: format!("a NUL byte at offset {at}, so it is binary"),
                    },
                },
                Err(e) => SourceError::Utf8 {
                    path: entry.path.clone(),
                    offset: e.utf8_error().valid_up_to() as u64,
                },
            },
        };
        if entry.named || self.on_invalid == OnInvalid::Error {
            return Err(problem);
        }
        let reason = match problem {
            SourceError::Utf8 { offset, .. } => {
                format!("not valid UTF-8: first bad byte at offset {offset}")
            }
            SourceError::NotText { reason, .. } => reason,
            SourceError::TooLarge { limit, what, .. } => {
                format!("more than {limit} (decompressed), the most {what} may hold")
            }
            other => other.to_string(),
        };
        self.skipped.push(path_text(&entry.path), reason);
        Ok(None)
    }
}

impl Source for FilesSource {
    fn next_document(&mut self) -> Result<Option<Document>, SourceError> {
        while let Some(entry) = self.entries.next() {
            let Some(text) = self.read(&entry)? else {
                continue;
            };
            if text.trim().is_empty() {
                self.stats.skipped_empty += 1;
                continue;
            }
            self.stats.documents += 1;
            return Ok(Some(Document {
                doc_id: entry.doc_id,
                source: Arc::from(path_text(&entry.path)),
                text,
                metadata: None,
            }));
        }
        Ok(None)
    }

    fn stats(&self) -> SourceStats {
        self.stats
    }

    fn skipped_files(&self) -> SkippedFiles {
        self.skipped.clone()
    }
}

fn has_glob_syntax(text: &str) -> bool {
    text.contains(['*', '?', '[', '{'])
}

/// The files one `paths` entry names, each with its id.
fn expand(pattern: &str) -> Result<Vec<Entry>, SourceError> {
    let path = Path::new(pattern);
    if !has_glob_syntax(pattern) || path.exists() {
        return expand_path(pattern, path);
    }
    let matcher = glob(pattern, true)?.compile_matcher();
    let root = glob_root(pattern);
    let listed = if root.as_os_str().is_empty() {
        Path::new(".")
    } else {
        root.as_path()
    };
    if !listed.is_dir() {
        return Ok(Vec::new());
    }
    let after_root = Path::new(pattern).components().count() - root.components().count();
    let depth = if pattern.contains("**") {
        usize::MAX
    } else {
        after_root
    };
    walk(&root, depth, |path| {
        matcher.is_match(path).then(|| relative_id(path, &root))
    })
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
        walk(path, usize::MAX, |found| Some(relative_id(found, path)))
    } else if metadata.is_file() {
        let doc_id = path.file_name().map_or_else(
            || path_text(path),
            |name| name.to_string_lossy().into_owned(),
        );
        Ok(vec![Entry {
            path: path.to_path_buf(),
            doc_id,
            named: true,
            file: FileId::of(path, &metadata),
        }])
    } else {
        Ok(Vec::new())
    }
}

/// A file or directory, told apart from others however it is reached: its
/// device and inode.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FileId(u64, u64, PathBuf);

impl FileId {
    #[cfg(unix)]
    fn of(_path: &Path, metadata: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId(metadata.dev(), metadata.ino(), PathBuf::new())
    }

    #[cfg(not(unix))]
    fn of(path: &Path, _metadata: &std::fs::Metadata) -> FileId {
        FileId(
            0,
            0,
            std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        )
    }
}

/// Every regular file under `root`, at most `depth` directories down, that
/// `id` gives an id to. Links are followed and each directory is entered
/// once: a link back up the tree (`me -> .`, a loop of links) is passed
/// over, so a walk always ends and no file is found twice by it. Entries are
/// visited in name order, so which path reaches a file first does not depend
/// on the file system.
fn walk(
    root: &Path,
    depth: usize,
    mut id: impl FnMut(&Path) -> Option<String>,
) -> Result<Vec<Entry>, SourceError> {
    // The current directory is listed as `.`, and its files named without the `./`.
    let listed = if root.as_os_str().is_empty() {
        Path::new(".")
    } else {
        root
    };
    let mut entered = HashSet::new();
    let walker = WalkDir::new(listed)
        .follow_links(true)
        .max_depth(depth)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|found| {
            // A directory at the last level is not entered, so not counted as entered.
            !found.file_type().is_dir()
                || found.depth() >= depth
                || found
                    .metadata()
                    .is_ok_and(|metadata| entered.insert(FileId::of(found.path(), &metadata)))
        });
    let mut entries = Vec::new();
    for found in walker {
        let found = match found {
            Ok(found) => found,
            Err(e) if e.loop_ancestor().is_some() => continue,
            Err(e) => {
                let path = e.path().unwrap_or(listed).to_path_buf();
                // A dangling link is no file; a directory that cannot be listed is an error.
                if std::fs::metadata(&path).is_err() {
                    continue;
                }
                return Err(io_error(&path, e.into()));
            }
        };
        let Ok(metadata) = found.metadata() else {
            continue;
        };
        if !metadata.is_file() {
            continue;
        }
        let path = if root.as_os_str().is_empty() {
            found.path().strip_prefix(".").unwrap_or(found.path())
        } else {
            found.path()
        };
        if let Some(doc_id) = id(path) {
            entries.push(Entry {
                path: path.to_path_buf(),
                doc_id,
                named: false,
                file: FileId::of(path, &metadata),
            });
        }
    }
    Ok(entries)
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

    fn params(paths: &[&Path]) -> FilesParams {
        FilesParams {
            paths: paths.iter().map(|p| path_text(p)).collect(),
            ..FilesParams::default()
        }
    }

    fn open_one(pattern: &Path) -> FilesSource {
        FilesSource::open(&params(&[pattern])).unwrap()
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
        let mut source = FilesSource::open(&params(&[
            &dir.path().join("docs/guide"),
            &dir.path().join("docs/b.md"),
        ]))
        .unwrap();
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["intro.md", "notes.txt", "b.md"]);
    }

    #[test]
    fn a_pattern_or_path_that_matches_nothing_is_an_error_naming_it() {
        let dir = tree();
        for missing in [dir.path().join("docs/*.rst"), dir.path().join("nowhere")] {
            let Err(error) = FilesSource::open(&params(&[&missing])) else {
                panic!("{} matched", missing.display());
            };
            assert!(matches!(error, SourceError::NoMatch { .. }), "{error}");
            assert!(error.is_found_at_open());
            assert!(error.to_string().contains(&path_text(&missing)), "{error}");
        }
        std::fs::create_dir(dir.path().join("hollow")).unwrap();
        let Err(error) = FilesSource::open(&params(&[&dir.path().join("hollow")])) else {
            panic!("an empty directory matched");
        };
        assert!(matches!(error, SourceError::NoMatch { .. }), "{error}");
    }

    #[test]
    fn a_malformed_glob_is_an_error_at_open() {
        let dir = tree();
        let Err(error) = FilesSource::open(&params(&[&dir.path().join("docs/[a.md")])) else {
            panic!("a malformed glob was accepted");
        };
        assert!(matches!(error, SourceError::Pattern { .. }), "{error}");
        assert!(error.is_found_at_open());
    }

    #[test]
    fn invalid_utf8_is_an_error_naming_the_file_and_offset_when_asked_or_named() {
        let dir = tree();
        write(dir.path(), "docs/bad.md", b"ok text \xff\xfe more");
        let strict = FilesParams {
            on_invalid: OnInvalid::Error,
            ..params(&[&dir.path().join("docs")])
        };
        let named = params(&[&dir.path().join("docs/bad.md")]);
        for params in [strict, named] {
            let mut source = FilesSource::open(&params).unwrap();
            let error = first_error(&mut source);
            assert!(
                matches!(error, SourceError::Utf8 { offset: 8, .. }),
                "{error}"
            );
            assert!(error.to_string().contains("bad.md"), "{error}");
            assert!(error.to_string().contains("offset 8"), "{error}");
        }
    }

    #[test]
    fn files_that_are_not_text_are_passed_over_counted_and_named() {
        let dir = tree();
        write(dir.path(), "docs/bad.md", b"ok text \xff\xfe more");
        write(
            dir.path(),
            "docs/image.png",
            b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
        );
        write(dir.path(), "docs/utf16.txt", b"h\0i\0");
        write(dir.path(), "docs/broken.gz", &[0x1f, 0x8b, 8, 0, 1, 2, 3]);
        let mut source = open_one(&dir.path().join("docs"));
        let documents = read_all(&mut source).unwrap();
        assert_eq!(
            ids(&documents),
            ["a.md", "b.md", "guide/intro.md", "guide/notes.txt"]
        );
        let skipped = source.skipped_files();
        assert_eq!(skipped.count, 4);
        let names: Vec<&str> = skipped
            .first
            .iter()
            .map(|p| p.rsplit('/').next().unwrap())
            .collect();
        assert_eq!(names, ["bad.md", "broken.gz", "image.png", "utf16.txt"]);

        // Named on its own, a binary file is an error that says why.
        let mut source = open_one(&dir.path().join("docs/utf16.txt"));
        let error = first_error(&mut source);
        assert!(matches!(error, SourceError::NotText { .. }), "{error}");
        assert!(error.to_string().contains("NUL byte"), "{error}");
        let mut source = open_one(&dir.path().join("docs/broken.gz"));
        let error = first_error(&mut source);
        assert!(error.to_string().contains("cannot decompress"), "{error}");
    }

    #[test]
    fn regression_a_compression_bomb_is_passed_over_or_named_with_the_limit() {
        use super::super::input::{tests::bomb, Codec};
        let dir = tree();
        let total = 2 * MAX_DOCUMENT_BYTES;
        write(
            dir.path(),
            "docs/bomb.txt.gz",
            &bomb(Codec::Gzip, b"zzz", total),
        );
        write(
            dir.path(),
            "docs/bomb.zst",
            &bomb(Codec::Zstd, b"zzz", total),
        );
        let mut source = open_one(&dir.path().join("docs"));
        let documents = read_all(&mut source).unwrap();
        assert_eq!(documents.len(), 4);
        let skipped = source.skipped_files();
        assert_eq!(skipped.count, 2);
        assert!(
            skipped.first.iter().all(|p| p.contains("bomb")),
            "{skipped:?}"
        );
        let strict = FilesParams {
            on_invalid: OnInvalid::Error,
            ..params(&[&dir.path().join("docs")])
        };
        let named = params(&[&dir.path().join("docs/bomb.zst")]);
        for params in [strict, named] {
            let mut source = FilesSource::open(&params).unwrap();
            let error = first_error(&mut source).to_string();
            assert!(error.contains("bomb"), "{error}");
            assert!(error.contains("more than 64 MiB"), "{error}");
        }
    }

    #[test]
    fn compressed_files_are_read_as_their_text() {
        let dir = tree();
        let gz = super::super::input::tests::gzip(b"# Zipped\n\nHello.");
        write(dir.path(), "docs/zipped.md.gz", &gz);
        write(
            dir.path(),
            "docs/squeezed.txt.zst",
            &zstd::encode_all(&b"Squeezed text."[..], 3).unwrap(),
        );
        let mut source = open_one(&dir.path().join("docs"));
        let documents = read_all(&mut source).unwrap();
        let texts: std::collections::BTreeMap<&str, &str> = documents
            .iter()
            .map(|d| (d.doc_id.as_str(), d.text.as_str()))
            .collect();
        assert_eq!(texts["zipped.md.gz"], "# Zipped\n\nHello.");
        assert_eq!(texts["squeezed.txt.zst"], "Squeezed text.");
        assert_eq!(source.skipped_files().count, 0);
    }

    #[test]
    fn include_and_exclude_match_ids_below_the_root() {
        let dir = tree();
        let only = |include: &[&str], exclude: &[&str]| {
            let params = FilesParams {
                include: include.iter().map(|s| (*s).to_string()).collect(),
                exclude: exclude.iter().map(|s| (*s).to_string()).collect(),
                ..params(&[&dir.path().join("docs")])
            };
            let mut source = FilesSource::open(&params)?;
            let documents = read_all(&mut source).unwrap();
            Ok::<_, SourceError>(
                ids(&documents)
                    .into_iter()
                    .map(str::to_string)
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(
            only(&["*.md"], &[]).unwrap(),
            ["a.md", "b.md", "guide/intro.md"]
        );
        assert_eq!(only(&[], &["guide/**"]).unwrap(), ["a.md", "b.md"]);
        assert_eq!(
            only(&["*.md", "*.txt"], &["b.*", "**/intro.md"]).unwrap(),
            ["a.md", "guide/notes.txt"]
        );
        let Err(error) = only(&["*.rst"], &[]) else {
            panic!("an include that keeps nothing was accepted");
        };
        assert!(matches!(error, SourceError::NoMatch { .. }), "{error}");
        assert!(error.to_string().contains("*.rst"), "{error}");
        // A file named on its own is read whatever the filters say.
        let params = FilesParams {
            exclude: vec!["*.md".into()],
            ..params(&[&dir.path().join("docs/a.md")])
        };
        let documents = read_all(&mut FilesSource::open(&params).unwrap()).unwrap();
        assert_eq!(ids(&documents), ["a.md"]);
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

    #[test]
    fn braces_list_alternatives() {
        let dir = tree();
        let params = FilesParams {
            include: vec!["*.{txt,rst}".into()],
            ..params(&[&dir.path().join("docs")])
        };
        let documents = read_all(&mut FilesSource::open(&params).unwrap()).unwrap();
        assert_eq!(ids(&documents), ["guide/notes.txt"]);
        let mut source = open_one(&dir.path().join("docs").join("{a,b}.md"));
        assert_eq!(ids(&read_all(&mut source).unwrap()), ["a.md", "b.md"]);
    }

    #[cfg(unix)]
    #[test]
    fn links_are_followed_each_directory_entered_once_and_dangling_ones_passed_over() {
        use std::os::unix::fs::symlink;
        let dir = tree();
        let docs = dir.path().join("docs");
        symlink(".", docs.join("me")).unwrap();
        symlink("..", docs.join("guide/up")).unwrap();
        symlink("nowhere.md", docs.join("dangling.md")).unwrap();
        // Before `guide` in name order, so `guide` is reached through it first.
        symlink("guide", docs.join("another")).unwrap();
        let documents = read_all(&mut open_one(&docs)).unwrap();
        assert_eq!(
            ids(&documents),
            ["a.md", "another/intro.md", "another/notes.txt", "b.md"]
        );
        let documents = read_all(&mut open_one(&docs.join("**").join("*.md"))).unwrap();
        assert_eq!(ids(&documents), ["a.md", "another/intro.md", "b.md"]);
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_below_the_globs_depth_does_not_hide_one_within_it() {
        let dir = tree();
        let docs = dir.path().join("docs");
        std::fs::create_dir(docs.join("aside")).unwrap();
        std::os::unix::fs::symlink("../guide", docs.join("aside/guide")).unwrap();
        let documents = read_all(&mut open_one(&docs.join("*").join("*.md"))).unwrap();
        assert_eq!(ids(&documents), ["guide/intro.md"]);
    }
}
