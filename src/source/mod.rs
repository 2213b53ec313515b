//! Sources: where documents come from. Each kind streams documents one at a
//! time, so memory is bounded by a document (or a Parquet record batch), not
//! by the input.
//!
//! [`open`] does every check that needs no reading of the data up front (the
//! files exist, globs match, the Parquet and CSV columns exist with usable
//! types), so a bad job stops before any work or cost.
//!
//! Row numbers in errors and in record ids are 1-based everywhere: the line
//! for JSON Lines, the data row (the header not counted) for CSV, and the row
//! within the file for Parquet.
//!
//! Text files, JSON Lines and CSV may be gzip- or zstd-compressed
//! ([`input`]); JSON Lines and CSV may come from stdin (`path = "-"`).
//! Records carry `source.metadata_fields` along, typed ([`metadata`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::job::{SourceConfig, SourceParams};
use crate::parquet_io::FileError;
use crate::types::{id_key, Document, MetadataSchema};

mod csv;
mod files;
pub(crate) mod input;
mod jsonl;
mod metadata;
mod parquet;
pub mod records;

pub use self::files::{FilesParams, OnInvalid};
pub use self::records::{RecordsParams, RecordsSource, STDIN, STDIN_NAME};

/// Every kind of source, one line each, in the order messages list them.
const KINDS: &[&dyn SourceKind] = &[&files::Kind, &jsonl::KIND, &csv::KIND, &parquet::KIND];

/// A kind of source: its parameters (read as a [`crate::job::Kind`]) and how
/// it opens them. A new kind is a folder here and a line in [`KINDS`].
pub trait SourceKind: crate::job::Kind<dyn SourceParams> {
    /// Opens the input, checking what can be checked before reading it.
    fn open(&self, params: &dyn SourceParams) -> Result<Box<dyn Source>, SourceError>;
}

/// The source kinds, for reading a job file.
pub fn kinds() -> Vec<&'static dyn crate::job::Kind<dyn SourceParams>> {
    // Each kind, seen as the job file's reader of its section.
    let mut all: Vec<&'static dyn crate::job::Kind<dyn SourceParams>> = Vec::new();
    for &kind in KINDS {
        all.push(kind);
    }
    all
}

/// `params` as the kind's own type.
pub(crate) fn params_of<T: 'static>(params: &dyn SourceParams) -> Result<&T, SourceError> {
    params
        .as_any()
        .downcast_ref()
        .ok_or_else(|| SourceError::Kind {
            kind: params.kind().to_string(),
        })
}

/// Names of files passed over that a source keeps, for the summary.
pub const SKIPPED_NAMES_KEPT: usize = 5;

/// Files passed over (not UTF-8 text, binary, or over the size limit): how
/// many, and the first few with why.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SkippedFiles {
    pub count: u64,
    /// The first [`SKIPPED_NAMES_KEPT`] of them.
    pub first: Vec<String>,
    /// Why each of `first` was passed over, in the same order.
    pub reasons: Vec<String>,
}

impl SkippedFiles {
    /// Counts a file passed over, keeping the first few names and reasons.
    pub fn push(&mut self, name: String, reason: String) {
        self.count += 1;
        if self.first.len() < SKIPPED_NAMES_KEPT {
            self.first.push(name);
            self.reasons.push(reason);
        }
    }

    /// `2 files: a.bin (a NUL byte at offset 3, so it is binary), b.gz (more
    /// than 64 MiB (decompressed), …)`, and how many more.
    pub fn text(&self) -> String {
        let named: Vec<String> = self
            .first
            .iter()
            .enumerate()
            .map(|(at, name)| match self.reasons.get(at) {
                Some(reason) => format!("{name} ({reason})"),
                None => name.clone(),
            })
            .collect();
        format!(
            "{}: {}",
            crate::display::counted(self.count, "file"),
            crate::display::listed(&named, self.count)
        )
    }
}

/// What a source read and what it passed over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceStats {
    pub documents: u64,
    pub skipped_null: u64,
    pub skipped_empty: u64,
}

/// A problem with the input. Every variant names the file, and the row or
/// column where there is one.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: cannot read: {error}")]
    Io {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    #[error("{pattern}: no input files match")]
    NoMatch { pattern: String },
    #[error("{pattern}: not a valid glob pattern: {message}")]
    Pattern { pattern: String, message: String },
    #[error("{path}: not valid UTF-8 (first bad byte at offset {offset})")]
    Utf8 { path: PathBuf, offset: u64 },
    /// `what` names the thing that has a limit: "a document", "a line".
    #[error("{path}: more than {limit} (decompressed), the most {what} may hold")]
    TooLarge {
        path: PathBuf,
        limit: String,
        what: &'static str,
    },
    #[error("{path}: not text: {reason}")]
    NotText { path: PathBuf, reason: String },
    #[error("{path}: row {row}: {message}")]
    Row {
        path: PathBuf,
        row: u64,
        message: String,
    },
    #[error("{path}: column {column:?}: {message}")]
    Column {
        path: PathBuf,
        column: String,
        message: String,
    },
    #[error("{path}: not a readable Parquet file: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("duplicate document id {id:?}: in {first} and again in {second}")]
    DuplicateId {
        id: String,
        first: String,
        second: String,
    },
    /// `passed` says what was passed over and why, when anything was.
    #[error("{input}: the input has no documents with text{passed}")]
    Empty { input: String, passed: String },
    #[error("`source.kind = \"{kind}\"`: parameters this source cannot read")]
    Kind { kind: String },
}

impl From<FileError> for SourceError {
    fn from(error: FileError) -> Self {
        match error {
            FileError::NotFound { path } => SourceError::NotFound { path },
            FileError::Fs(crate::fsio::FsError::Io { path, source, .. }) => SourceError::Io {
                path,
                error: source,
            },
            FileError::Corrupt { path, message } => SourceError::Corrupt { path, message },
            other => SourceError::Corrupt {
                path: PathBuf::new(),
                message: other.to_string(),
            },
        }
    }
}

impl SourceError {
    /// Problems found when opening the input, before any work starts: a
    /// missing file, a glob that matches nothing or is malformed, a missing
    /// or non-string column. The rest come up while reading the data.
    pub fn is_found_at_open(&self) -> bool {
        matches!(
            self,
            SourceError::NotFound { .. }
                | SourceError::NoMatch { .. }
                | SourceError::Pattern { .. }
                | SourceError::Column { .. }
                | SourceError::Kind { .. }
        )
    }
}

/// A stream of documents. Reading blocks, so sources run off the async runtime.
pub trait Source: Send {
    /// The next document with text, or `None` at the end. Null and empty
    /// texts are skipped and counted, not returned.
    fn next_document(&mut self) -> Result<Option<Document>, SourceError>;
    fn stats(&self) -> SourceStats;
    /// The 1-based row, within its file, of the document last returned; `None`
    /// when documents are whole files. Lets errors point at the record.
    fn last_row(&self) -> Option<u64> {
        None
    }
    /// Files passed over because they are not text.
    fn skipped_files(&self) -> SkippedFiles {
        SkippedFiles::default()
    }
    /// The columns `source.metadata_fields` add to the output, when the
    /// job names some: known on opening, before any document is read.
    fn metadata_schema(&self) -> Option<Arc<MetadataSchema>> {
        None
    }
}

/// Opens the input a job names, checking up front everything that can be
/// checked without reading the data.
///
/// The source returned also rejects a document id seen twice
/// ([`SourceError::DuplicateId`]) and an input that ends without a single
/// document ([`SourceError::Empty`]).
pub fn open(config: &SourceConfig) -> Result<Box<dyn Source>, SourceError> {
    let inner = open_unchecked(config)?;
    Ok(Box::new(Checked::new(inner, config.clone())))
}

/// Bytes of the input [`sample`] reads at most: all of a small input, the
/// start of a large one.
pub const SAMPLE_READ_BYTES: usize = 16 << 20;

/// Pieces [`sample`] takes at most.
pub const SAMPLE_PIECES: usize = 256;

/// Pieces of the input's text of up to `piece_bytes` bytes each, spread
/// evenly over its first [`SAMPLE_READ_BYTES`] (at most [`SAMPLE_PIECES`]
/// of them, within one document each, of whole words where it has spaces
/// (`whole_words`), in the input's order): text to
/// measure how a server counts the job's own text on, from its whole
/// length rather than its first documents. Empty for stdin, which can be
/// read once only, and for an input that cannot be read (the run says why).
pub fn sample(config: &SourceConfig, piece_bytes: usize) -> Vec<String> {
    if config.is_stdin() || piece_bytes == 0 {
        return Vec::new();
    }
    let Ok(mut source) = open_unchecked(config) else {
        return Vec::new();
    };
    let mut texts = Vec::new();
    let mut read = 0usize;
    while read < SAMPLE_READ_BYTES {
        let Ok(Some(document)) = source.next_document() else {
            break;
        };
        let mut text = document.text;
        text.truncate(crate::secret::floor_char(&text, SAMPLE_READ_BYTES - read));
        read += text.len();
        texts.push(text);
    }
    let stride = piece_bytes.max(read.div_ceil(SAMPLE_PIECES));
    let mut pieces = Vec::new();
    let mut offset = 0usize;
    for text in &texts {
        // The sample points (multiples of the stride) within this document.
        let mut at = offset.next_multiple_of(stride) - offset;
        while at < text.len() {
            let start = crate::secret::ceil_char(text, at);
            let end = crate::secret::floor_char(text, start.saturating_add(piece_bytes));
            let piece = whole_words(text, start, end);
            if !piece.is_empty() {
                pieces.push(piece.to_string());
            }
            at += stride;
        }
        offset += text.len();
    }
    pieces
}

/// `text[start..end]`, trimmed, less the part of a word cut at either end
/// where it has a space to end at instead: a tokenizer counts a word's
/// fragment otherwise than the word, and the sample is to measure how it
/// counts the job's text.
fn whole_words(text: &str, start: usize, end: usize) -> &str {
    let mut piece = &text[start..end];
    if start > 0 && !text[..start].ends_with(char::is_whitespace) {
        if let Some(at) = piece.find(char::is_whitespace) {
            piece = &piece[at..];
        }
    }
    if end < text.len() && !text[end..].starts_with(char::is_whitespace) {
        if let Some(at) = piece.rfind(char::is_whitespace) {
            piece = &piece[..at];
        }
    }
    piece.trim()
}

fn open_unchecked(config: &SourceConfig) -> Result<Box<dyn Source>, SourceError> {
    let kind = KINDS
        .iter()
        .find(|kind| kind.name() == config.kind())
        .ok_or_else(|| SourceError::Kind {
            kind: config.kind().to_string(),
        })?;
    kind.open(config.params.as_ref())
}

/// A path for messages and for [`Document::source`]; stdin is `<stdin>`.
pub(crate) fn path_text(path: &Path) -> String {
    if input::is_stdin(path) {
        return STDIN_NAME.to_string();
    }
    path.to_string_lossy().into_owned()
}

/// Opens a file, telling a missing file (a config problem) from other I/O errors.
pub(crate) fn open_file(path: &Path) -> Result<std::fs::File, SourceError> {
    std::fs::File::open(path).map_err(|error| io_error(path, error))
}

pub(crate) fn io_error(path: &Path, error: std::io::Error) -> SourceError {
    if error.kind() == std::io::ErrorKind::NotFound {
        SourceError::NotFound {
            path: path.to_path_buf(),
        }
    } else {
        SourceError::Io {
            path: path.to_path_buf(),
            error,
        }
    }
}

/// Wraps a source with the checks that span all of it, unique ids and a
/// non-empty result.
///
/// Ids are remembered as 64-bit hashes, about 9 bytes a document. A hash
/// seen before sends the check back to the start of the input, to find the
/// document that had the same id and where it was; when none had (two ids
/// with the same hash), the document is let through.
struct Checked {
    inner: Box<dyn Source>,
    config: SourceConfig,
    seen: HashSet<u64>,
    /// Documents read so far.
    read: u64,
    /// Documents returned so far.
    returned: u64,
    finished: bool,
}

impl Checked {
    fn new(inner: Box<dyn Source>, config: SourceConfig) -> Self {
        Checked {
            inner,
            config,
            seen: HashSet::new(),
            read: 0,
            returned: 0,
            finished: false,
        }
    }

    /// The next document of the input, its id checked.
    fn next_checked(&mut self) -> Result<Option<Document>, SourceError> {
        if self.finished {
            return Ok(None);
        }
        let Some(document) = self.inner.next_document()? else {
            self.finished = true;
            if self.inner.stats().documents == 0 {
                return Err(SourceError::Empty {
                    input: self.config.describe(),
                    passed: passed_over(
                        self.config.kind(),
                        self.inner.stats(),
                        &self.inner.skipped_files(),
                    ),
                });
            }
            return Ok(None);
        };
        if !self.seen.insert(id_key(&document.doc_id)) {
            if let Some(first) = self.first_place(&document.doc_id)? {
                return Err(SourceError::DuplicateId {
                    id: document.doc_id.clone(),
                    first,
                    second: location(&document.source, self.inner.last_row()),
                });
            }
        }
        self.read += 1;
        Ok(Some(document))
    }

    /// The place of the document, among the first `self.read`, whose id
    /// is `id`, read again from the input. Stdin cannot be read again: there
    /// the id is taken to repeat (two ids sharing a 64-bit hash are rare
    /// enough to be called a repeat).
    fn first_place(&self, id: &str) -> Result<Option<String>, SourceError> {
        if self.config.is_stdin() {
            return Ok(Some(format!("an earlier row of {}", STDIN_NAME)));
        }
        let mut again = open_unchecked(&self.config)?;
        for _ in 0..self.read {
            let Some(document) = again.next_document()? else {
                break;
            };
            if document.doc_id == id {
                return Ok(Some(location(&document.source, again.last_row())));
            }
        }
        Ok(None)
    }
}

/// What an input with no documents passed over, and why, for
/// [`SourceError::Empty`]: `; passed over 2 files: a.bin (…), b.bin (…);
/// 1 file with no text`. Empty when nothing was.
fn passed_over(kind: &str, stats: SourceStats, skipped: &SkippedFiles) -> String {
    use crate::display::counted;
    // Whole files are the documents of the files kind; records are rows.
    let noun = if kind == "files" { "file" } else { "row" };
    let mut parts = Vec::new();
    if skipped.count > 0 {
        parts.push(skipped.text());
    }
    if stats.skipped_empty > 0 {
        parts.push(format!(
            "{} with only blank text",
            counted(stats.skipped_empty, noun)
        ));
    }
    if stats.skipped_null > 0 {
        parts.push(format!(
            "{} with a null text",
            counted(stats.skipped_null, noun)
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("; passed over {}", parts.join("; "))
    }
}

fn location(source: &str, row: Option<u64>) -> String {
    match row {
        Some(row) => format!("{source} row {row}"),
        None => source.to_string(),
    }
}

impl Source for Checked {
    fn next_document(&mut self) -> Result<Option<Document>, SourceError> {
        let document = self.next_checked()?;
        self.returned += u64::from(document.is_some());
        Ok(document)
    }

    /// The documents returned; the rows passed over (null, empty) are the
    /// inner source's.
    fn stats(&self) -> SourceStats {
        SourceStats {
            documents: self.returned,
            ..self.inner.stats()
        }
    }

    fn last_row(&self) -> Option<u64> {
        self.inner.last_row()
    }

    fn skipped_files(&self) -> SkippedFiles {
        self.inner.skipped_files()
    }

    fn metadata_schema(&self) -> Option<Arc<MetadataSchema>> {
        self.inner.metadata_schema()
    }
}

#[cfg(test)]
pub(crate) mod testing {
    pub use super::files::FilesParams as FilesSource;
    pub use super::records::{RecordsParams, RecordsSource};
    use super::*;

    /// The kinds of source, for tests.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum SourceKind {
        Jsonl,
        Csv,
        Parquet,
    }

    impl std::fmt::Display for SourceKind {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(match self {
                SourceKind::Jsonl => "jsonl",
                SourceKind::Csv => "csv",
                SourceKind::Parquet => "parquet",
            })
        }
    }

    /// Reads a source to its end, or to its first error.
    pub fn read_all(source: &mut dyn Source) -> Result<Vec<Document>, SourceError> {
        let mut documents = Vec::new();
        while let Some(document) = source.next_document()? {
            documents.push(document);
        }
        Ok(documents)
    }

    /// Reads until the first error and returns it, failing if there is none.
    pub fn first_error(source: &mut dyn Source) -> SourceError {
        loop {
            match source.next_document() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("expected an error, the source ended cleanly"),
                Err(error) => return error,
            }
        }
    }

    pub fn config(kind: SourceKind, path: &Path, text: &str, id: Option<&str>) -> SourceConfig {
        let records = RecordsSource {
            path: path.to_path_buf(),
            text_field: text.to_string(),
            id_field: id.map(str::to_string),
            metadata_fields: Vec::new(),
        };
        let (kind, reads_stdin) = match kind {
            SourceKind::Jsonl => ("jsonl", true),
            SourceKind::Csv => ("csv", true),
            SourceKind::Parquet => ("parquet", false),
        };
        SourceConfig::new(RecordsParams {
            kind,
            reads_stdin,
            records,
        })
    }

    pub fn ids(documents: &[Document]) -> Vec<&str> {
        documents.iter().map(|d| d.doc_id.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::SourceKind;
    use super::testing::*;
    use super::*;

    #[test]
    fn a_sample_is_pieces_spread_over_the_input_and_never_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let docs = dir.path().join("docs");
        std::fs::create_dir(&docs).unwrap();
        std::fs::write(docs.join("a.txt"), "first document").unwrap();
        std::fs::write(docs.join("b.txt"), "é".repeat(100)).unwrap();
        let folder = SourceConfig::new(testing::FilesSource {
            paths: vec![path_text(&docs)],
            ..testing::FilesSource::default()
        });
        // A small input: a piece at every stride of 20 bytes of the 214
        // read, within one document each and cut on characters' boundaries.
        let pieces = sample(&folder, 20);
        assert_eq!(pieces[0], "first document");
        assert_eq!(pieces[1], "é".repeat(10), "from byte 20, 6 into b.txt");
        assert_eq!(pieces.len(), 1 + 10, "{pieces:?}");
        assert_eq!(sample(&folder, 5)[0], "first");
        assert_eq!(sample(&folder, 8)[0], "first", "not a word's fragment");
        // Words cut at either end are left out, where there is a space.
        assert_eq!(whole_words("alpha beta gamma", 2, 13), "beta");
        assert_eq!(whole_words("alpha beta gamma", 0, 16), "alpha beta gamma");
        assert_eq!(whole_words("alpha beta", 6, 10), "beta");
        assert_eq!(whole_words("alphabet", 2, 6), "phab");
        // A large one: no more than SAMPLE_PIECES pieces, from its whole
        // length: 1,000 files, each 40 in turn of one letter.
        let many = dir.path().join("many");
        std::fs::create_dir(&many).unwrap();
        for i in 0..1000u16 {
            let letter = char::from(b'a' + u8::try_from(i / 40).unwrap());
            let text = letter.to_string().repeat(18);
            std::fs::write(many.join(format!("{i:04}.txt")), text).unwrap();
        }
        let folder = SourceConfig::new(testing::FilesSource {
            paths: vec![path_text(&many)],
            ..testing::FilesSource::default()
        });
        let pieces = sample(&folder, 10);
        assert!(pieces.len() <= SAMPLE_PIECES, "{}", pieces.len());
        let letters: std::collections::BTreeSet<char> =
            pieces.iter().filter_map(|p| p.chars().next()).collect();
        assert_eq!(letters.len(), 25, "every part of the input: {letters:?}");
        let stdin = config(SourceKind::Jsonl, Path::new("-"), "text", None);
        assert!(sample(&stdin, 1000).is_empty());
        let missing = config(
            SourceKind::Jsonl,
            &dir.path().join("none.jsonl"),
            "text",
            None,
        );
        assert!(sample(&missing, 1000).is_empty());
    }

    /// An input whose every file was passed over said only that it had no
    /// documents, not which files were passed over nor why.
    #[test]
    fn regression_an_input_of_skipped_files_did_not_name_them_or_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let docs = dir.path().join("docs");
        std::fs::create_dir(&docs).unwrap();
        let files: [(&str, &[u8]); 8] = [
            ("a.md", b"ok \xff\xfe"),
            ("b.png", b"\x89PNG\r\n\x1a\n\0\0"),
            ("c.gz", &[0x1f, 0x8b, 8, 0, 1, 2, 3]),
            ("d.txt", b"h\0i\0"),
            ("e.bin", b"\xc3\x28"),
            ("f.bin", b"\0"),
            ("g.bin", b"\xff"),
            ("h.md", b" \n\t"),
        ];
        for (name, bytes) in files {
            std::fs::write(docs.join(name), bytes).unwrap();
        }
        let folder = SourceConfig::new(testing::FilesSource {
            paths: vec![path_text(&docs)],
            ..testing::FilesSource::default()
        });
        let mut source = open(&folder).unwrap();
        let error = first_error(source.as_mut());
        assert!(matches!(error, SourceError::Empty { .. }), "{error}");
        let message = error.to_string();
        // The first few by name, each with its reason, and how many more.
        for named in [
            "a.md (not valid UTF-8: first bad byte at offset 3)",
            "b.png (not valid UTF-8: first bad byte at offset 0)",
            "c.gz (cannot decompress",
            "d.txt (a NUL byte at offset 1, so it is binary)",
            "e.bin (not valid UTF-8: first bad byte at offset 0)",
        ] {
            assert!(message.contains(named), "{named:?} missing from {message}");
        }
        assert!(message.contains("passed over 7 files: "), "{message}");
        assert!(message.contains("and 2 more"), "{message}");
        assert!(!message.contains("f.bin"), "{message}");
        assert!(message.contains("1 file with only blank text"), "{message}");

        // Records: the rows passed over, and why.
        let path = dir.path().join("in.jsonl");
        std::fs::write(
            &path,
            "{\"text\": null}\n{\"text\": \"  \"}\n{\"text\": null}\n",
        )
        .unwrap();
        let mut source = open(&config(SourceKind::Jsonl, &path, "text", None)).unwrap();
        let message = first_error(source.as_mut()).to_string();
        assert!(message.contains("1 row with only blank text"), "{message}");
        assert!(message.contains("2 rows with a null text"), "{message}");
        assert!(!message.contains("not UTF-8"), "{message}");
    }

    #[test]
    fn a_repeated_id_names_both_places() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(
            &path,
            "{\"id\": \"a\", \"text\": \"one\"}\n{\"id\": \"b\", \"text\": \"two\"}\n{\"id\": \"a\", \"text\": \"three\"}\n",
        )
        .unwrap();
        let mut source = open(&config(SourceKind::Jsonl, &path, "text", Some("id"))).unwrap();
        let error = first_error(source.as_mut());
        assert!(matches!(error, SourceError::DuplicateId { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("\"a\""), "{message}");
        assert!(message.contains("in.jsonl row 1"), "{message}");
        assert!(message.contains("in.jsonl row 3"), "{message}");
    }

    #[test]
    fn two_ids_with_the_same_hash_are_both_let_through() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(
            &path,
            "{\"id\": \"a\", \"text\": \"one\"}\n{\"id\": \"b\", \"text\": \"two\"}\n",
        )
        .unwrap();
        let config = config(SourceKind::Jsonl, &path, "text", Some("id"));
        let mut source = Checked::new(open_unchecked(&config).unwrap(), config);
        // As if "b" hashed as "a" does, or as some earlier id.
        source.seen.insert(id_key("b"));
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["a", "b"]);
    }

    #[test]
    fn an_integer_id_and_a_string_id_with_the_same_text_collide() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(
            &path,
            "{\"id\": 7, \"text\": \"one\"}\n{\"id\": \"7\", \"text\": \"two\"}\n",
        )
        .unwrap();
        let mut source = open(&config(SourceKind::Jsonl, &path, "text", Some("id"))).unwrap();
        let error = first_error(source.as_mut());
        assert!(
            matches!(error, SourceError::DuplicateId { ref id, .. } if id == "7"),
            "{error}"
        );
    }

    #[test]
    fn the_same_file_name_under_two_directories_is_a_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["one", "two"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
            std::fs::write(dir.path().join(sub).join("a.md"), "# A").unwrap();
        }
        let config = SourceConfig::new(FilesSource {
            paths: vec![
                path_text(&dir.path().join("one")),
                path_text(&dir.path().join("two")),
            ],
            ..FilesSource::default()
        });
        let mut source = open(&config).unwrap();
        let error = first_error(source.as_mut());
        let message = error.to_string();
        assert!(
            matches!(error, SourceError::DuplicateId { .. }),
            "{message}"
        );
        let first = path_text(&dir.path().join("one").join("a.md"));
        let second = path_text(&dir.path().join("two").join("a.md"));
        assert!(message.contains(&first), "{message}");
        assert!(message.contains(&second), "{message}");
    }

    #[test]
    fn an_input_without_documents_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, "\n{\"text\": null}\n{\"text\": \"  \"}\n").unwrap();
        let mut source = open(&config(SourceKind::Jsonl, &path, "text", None)).unwrap();
        let error = first_error(source.as_mut());
        assert!(matches!(error, SourceError::Empty { .. }), "{error}");
        assert!(error.to_string().contains("in.jsonl"), "{error}");
        assert_eq!(
            source.stats(),
            SourceStats {
                documents: 0,
                skipped_null: 1,
                skipped_empty: 1
            }
        );
        // The error is reported once; the stream then stays ended.
        assert!(source.next_document().unwrap().is_none());
    }

    #[test]
    fn a_missing_file_is_found_at_open() {
        let dir = tempfile::tempdir().unwrap();
        for kind in [SourceKind::Jsonl, SourceKind::Csv, SourceKind::Parquet] {
            let path = dir.path().join("absent");
            let Err(error) = open(&config(kind, &path, "text", None)) else {
                panic!("{kind}: opened a missing file");
            };
            assert!(
                matches!(error, SourceError::NotFound { .. }),
                "{kind}: {error}"
            );
            assert!(error.is_found_at_open(), "{kind}: {error}");
            assert!(error.to_string().contains("absent"), "{kind}: {error}");
        }
    }

    #[test]
    fn which_errors_are_found_at_open() {
        let path = PathBuf::from("x");
        assert!(SourceError::Column {
            path: path.clone(),
            column: "text".into(),
            message: "missing".into()
        }
        .is_found_at_open());
        assert!(SourceError::NoMatch {
            pattern: "*.md".into()
        }
        .is_found_at_open());
        assert!(!SourceError::Utf8 { path, offset: 0 }.is_found_at_open());
        assert!(!SourceError::Empty {
            input: "x".into(),
            passed: String::new()
        }
        .is_found_at_open());
    }
}
