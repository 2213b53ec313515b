//! The parameters every kind of records shares (`jsonl`, `csv`,
//! `parquet`): the input, the text field, the id field and the metadata
//! fields.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::job::{KindTable, SourceParams};
use crate::source::{params_of, Source, SourceError, SourceKind};

/// The `path` that names stdin.
pub const STDIN: &str = "-";

/// How stdin is named in messages and in the output's `source` column.
pub const STDIN_NAME: &str = "<stdin>";

/// The keys of every records kind.
pub const RECORDS_KEYS: &[&str] = &["path", "text_field", "id_field", "metadata_fields"];

/// `kind = "jsonl" | "csv" | "parquet"`: records with a text field.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordsSource {
    /// A file (or, for parquet, a directory of files); `-` is stdin (jsonl, csv).
    pub path: PathBuf,
    pub text_field: String,
    pub id_field: Option<String>,
    /// Fields carried into the output as columns of their own: column names,
    /// or for JSON, dotted paths into objects.
    pub metadata_fields: Vec<String>,
}

impl RecordsSource {
    /// Whether the records come from stdin (`path = "-"`).
    pub fn is_stdin(&self) -> bool {
        self.path.as_os_str() == STDIN
    }
}

/// A records kind's parameters: the kind, whether it reads stdin, and the
/// records'.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordsParams {
    pub kind: &'static str,
    pub reads_stdin: bool,
    pub records: RecordsSource,
}

/// Records as written, before the required keys are checked.
#[derive(Debug, Clone, Deserialize)]
struct RawRecords {
    path: Option<PathBuf>,
    text_field: Option<String>,
    id_field: Option<String>,
    #[serde(default)]
    metadata_fields: Vec<String>,
}

/// Reads a records kind's section; `reads_stdin`, whether `path = "-"` may
/// name stdin.
pub fn parse(table: &mut KindTable<'_>, reads_stdin: bool) -> Option<Box<dyn SourceParams>> {
    let raw: RawRecords = table.deserialize()?;
    let kind = table.kind();
    let path = raw.path.filter(|p| !p.as_os_str().is_empty());
    if path.is_none() {
        table.problem(format!("`source.path` is required for kind \"{kind}\""));
    }
    let text_field = raw.text_field.filter(|f| !f.is_empty());
    if text_field.is_none() {
        table.problem(format!(
            "`source.text_field` is required for kind \"{kind}\""
        ));
    }
    let records = RecordsSource {
        path: path?,
        text_field: text_field?,
        id_field: raw.id_field,
        metadata_fields: raw.metadata_fields,
    };
    Some(Box::new(RecordsParams {
        kind,
        reads_stdin,
        records,
    }))
}

impl SourceParams for RecordsParams {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn clone_box(&self) -> Box<dyn SourceParams> {
        Box::new(self.clone())
    }

    fn resolve_paths(&mut self, base: &Path) {
        if !self.records.is_stdin() {
            self.records.path = crate::job::paths::relative_to(base, &self.records.path);
        }
    }

    fn problems(&self, p: &mut Vec<String>) {
        if self.records.is_stdin() && !self.reads_stdin {
            p.push(
                "`source.path` \"-\" (stdin) is for kinds \"jsonl\" and \"csv\"; \
                 Parquet must be read from a file"
                    .to_string(),
            );
        }
        crate::contract::metadata_problems(&self.records.metadata_fields, p);
    }

    fn describe(&self) -> String {
        if self.records.is_stdin() {
            STDIN_NAME.to_string()
        } else {
            self.records.path.display().to_string()
        }
    }

    fn is_stdin(&self) -> bool {
        self.records.is_stdin()
    }
}

/// A kind of records (jsonl, csv, parquet): the records' parameters, read
/// the same way for each, and the kind's own reader.
pub struct RecordsKind {
    pub name: &'static str,
    /// Whether `path = "-"` (stdin) is allowed.
    pub reads_stdin: bool,
    pub open: fn(&RecordsSource) -> Result<Box<dyn Source>, SourceError>,
}

impl crate::job::Kind<dyn SourceParams> for RecordsKind {
    fn name(&self) -> &'static str {
        self.name
    }

    fn keys(&self) -> &'static [&'static str] {
        RECORDS_KEYS
    }

    fn parse(&self, table: &mut KindTable<'_>) -> Option<Box<dyn SourceParams>> {
        parse(table, self.reads_stdin)
    }
}

impl SourceKind for RecordsKind {
    fn open(&self, params: &dyn SourceParams) -> Result<Box<dyn Source>, SourceError> {
        let params: &RecordsParams = params_of(params)?;
        (self.open)(&params.records)
    }
}
