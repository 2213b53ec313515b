//! Per-kind parameters of `[source]`, `[backend]` and `[output]`.
//!
//! A section's `kind` is read first; then the rest of the section is
//! deserialized into that kind's own parameters (and, for the backend, into
//! the keys every kind shares). A key that belongs to another kind is
//! reported as not applying to this one, and any other unknown key as
//! unknown. `#[serde(tag = "kind")]` is not used: through it `serde_ignored`
//! would not see the unknown keys inside.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub const DEFAULT_API_KEY_ENV: &str = "EMBEDJOB_API_KEY";

/// How stdin is named in messages and in the output's `source` column.
pub const STDIN_NAME: &str = "<stdin>";

/// A section's parameters, as deserialized, with the problems found.
pub(super) struct Parsed<T> {
    pub value: Option<T>,
    pub problems: Vec<String>,
}

/// Deserializes `table` (the section `section`) into `T`, collecting the
/// keys `T` does not know and every key of the wrong type: a key that fails
/// is set aside and the rest are read again, so that each is reported, not
/// only the first.
pub(super) fn deserialize<T: DeserializeOwned>(
    section: &str,
    table: &toml::Table,
) -> (Option<T>, Vec<String>, Vec<String>) {
    let mut table = table.clone();
    let mut problems = Vec::new();
    let mut set_aside: Vec<String> = Vec::new();
    loop {
        let (result, unknown) = deserialize_once::<T>(toml::Value::Table(table.clone()));
        let e = match result {
            Ok(value) => return (problems.is_empty().then_some(value), unknown, problems),
            Err(e) => e,
        };
        let inner = one_line(&e.inner().to_string());
        let at = e.path().to_string();
        let key = match e.path().iter().next() {
            Some(serde_path_to_error::Segment::Map { key }) => Some(key.clone()),
            _ => None,
        };
        match (missing_field(&inner), key) {
            // A required key of the wrong type was set aside; it is reported already.
            (Some(field), _) if at == "." && set_aside.iter().any(|k| k == field) => {}
            (Some(field), _) if at == "." => {
                problems.push(format!("`{section}.{field}` is required"))
            }
            (_, Some(key)) if table.remove(&key).is_some() => {
                problems.push(format!("`{section}.{at}`: {inner}"));
                set_aside.push(key);
                continue;
            }
            _ if at == "." => problems.push(format!("`{section}`: {inner}")),
            _ => problems.push(format!("`{section}.{at}`: {inner}")),
        }
        return (None, unknown, problems);
    }
}

/// One attempt at `value`, with the keys `T` does not know.
pub(super) fn deserialize_once<T: DeserializeOwned>(
    value: toml::Value,
) -> (
    Result<T, serde_path_to_error::Error<toml::de::Error>>,
    Vec<String>,
) {
    let mut unknown = Vec::new();
    let mut note_unknown = |path: serde_ignored::Path| unknown.push(path.to_string());
    let deserializer = serde_ignored::Deserializer::new(value, &mut note_unknown);
    let result = serde_path_to_error::deserialize::<_, T>(deserializer);
    (result, unknown)
}

fn missing_field(message: &str) -> Option<&str> {
    message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
}

pub(super) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Takes `kind` out of a section, defaulting to `default` when absent.
fn take_kind<K: DeserializeOwned>(
    section: &str,
    table: &mut toml::Table,
    default: Option<K>,
    problems: &mut Vec<String>,
) -> Option<K> {
    match table.remove("kind") {
        None => {
            if default.is_none() {
                problems.push(format!("`{section}.kind` is required"));
            }
            default
        }
        Some(value) => match K::deserialize(value) {
            Ok(kind) => Some(kind),
            Err(e) => {
                problems.push(format!("`{section}.kind`: {}", one_line(&e.to_string())));
                None
            }
        },
    }
}

/// Reports each key no part of a section knew: as belonging to another kind
/// when one of `others` (kind name, its keys) has it, else as unknown.
fn report_unknown(
    section: &str,
    kind: &str,
    unknown: impl IntoIterator<Item = String>,
    others: &[(&str, &[&str])],
    problems: &mut Vec<String>,
) {
    for key in unknown {
        let elsewhere = others
            .iter()
            .any(|(other, keys)| *other != kind && keys.contains(&key.as_str()));
        if elsewhere {
            problems.push(format!(
                "`{section}.{key}` does not apply to kind \"{kind}\""
            ));
        } else {
            problems.push(format!("unknown key `{section}.{key}`"));
        }
    }
}

// ---------------------------------------------------------------- source

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Files,
    Jsonl,
    Csv,
    Parquet,
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceKind::Files => "files",
            SourceKind::Jsonl => "jsonl",
            SourceKind::Csv => "csv",
            SourceKind::Parquet => "parquet",
        })
    }
}

/// `[source]`: one kind's parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceConfig {
    Files(FilesSource),
    Jsonl(RecordsSource),
    Csv(RecordsSource),
    Parquet(RecordsSource),
}

/// `kind = "files"`: text files found by globs, directories or names.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct FilesSource {
    /// Globs, directories or files.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Globs a file's id (its path below the directory or glob root that
    /// found it) must match; empty: every file.
    #[serde(default)]
    pub include: Vec<String>,
    /// Globs of files to leave out, matched like `include`.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// What to do with a file found by a directory or glob that is not
    /// UTF-8 text. A file named on its own is always an error.
    #[serde(default)]
    pub on_invalid: OnInvalid,
}

/// `source.on_invalid`: files that are not UTF-8 text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnInvalid {
    /// Pass them over, counted and named in the summary.
    #[default]
    Skip,
    /// Stop the job with an error naming the file.
    Error,
}

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

/// The `path` that names stdin.
pub const STDIN: &str = "-";

/// The output column a metadata field is written to: its name, with the
/// dots of a JSON path made underscores (`meta.lang` → `meta_lang`), so that
/// SQL can name it without quotes.
pub fn metadata_column(field: &str) -> String {
    field.replace('.', "_")
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

const FILES_KEYS: &[&str] = &["paths", "include", "exclude", "on_invalid"];
const RECORDS_KEYS: &[&str] = &["path", "text_field", "id_field", "metadata_fields"];
const SOURCE_KINDS: &[(&str, &[&str])] = &[
    ("files", FILES_KEYS),
    ("jsonl", RECORDS_KEYS),
    ("csv", RECORDS_KEYS),
    ("parquet", RECORDS_KEYS),
];

impl SourceConfig {
    pub fn kind(&self) -> SourceKind {
        match self {
            SourceConfig::Files(_) => SourceKind::Files,
            SourceConfig::Jsonl(_) => SourceKind::Jsonl,
            SourceConfig::Csv(_) => SourceKind::Csv,
            SourceConfig::Parquet(_) => SourceKind::Parquet,
        }
    }

    /// The records' parameters, for the kinds that read records.
    pub fn records(&self) -> Option<&RecordsSource> {
        match self {
            SourceConfig::Files(_) => None,
            SourceConfig::Jsonl(r) | SourceConfig::Csv(r) | SourceConfig::Parquet(r) => Some(r),
        }
    }

    /// The input, for messages: its path, or its list of globs.
    pub fn describe(&self) -> String {
        match self {
            SourceConfig::Files(files) => files.paths.join(", "),
            SourceConfig::Jsonl(r) | SourceConfig::Csv(r) | SourceConfig::Parquet(r) => {
                if r.is_stdin() {
                    STDIN_NAME.to_string()
                } else {
                    r.path.display().to_string()
                }
            }
        }
    }

    /// Whether the input is stdin, which can be read only once.
    pub fn is_stdin(&self) -> bool {
        self.records().is_some_and(RecordsSource::is_stdin)
    }

    /// Takes relative paths and globs from `base` (stdin stays stdin).
    pub(super) fn resolve_paths(&mut self, base: &Path) {
        match self {
            SourceConfig::Files(files) => {
                for pattern in &mut files.paths {
                    *pattern = super::paths::pattern_relative_to(base, pattern);
                }
            }
            SourceConfig::Jsonl(r) | SourceConfig::Csv(r) | SourceConfig::Parquet(r) => {
                if !r.is_stdin() {
                    r.path = super::paths::relative_to(base, &r.path);
                }
            }
        }
    }

    pub(super) fn parse(mut table: toml::Table) -> Parsed<SourceConfig> {
        let mut problems = Vec::new();
        let Some(kind) = take_kind::<SourceKind>("source", &mut table, None, &mut problems) else {
            return Parsed {
                value: None,
                problems,
            };
        };
        let name = kind.to_string();
        let value = if kind == SourceKind::Files {
            let (value, unknown, error) = deserialize::<FilesSource>("source", &table);
            report_unknown("source", &name, unknown, SOURCE_KINDS, &mut problems);
            problems.extend(error);
            value.map(SourceConfig::Files)
        } else {
            let (raw, unknown, error) = deserialize::<RawRecords>("source", &table);
            report_unknown("source", &name, unknown, SOURCE_KINDS, &mut problems);
            problems.extend(error);
            raw.and_then(|raw| records(kind, raw, &mut problems))
        };
        Parsed { value, problems }
    }

    pub(super) fn problems(&self, p: &mut Vec<String>) {
        match self {
            SourceConfig::Files(files) => {
                if files.paths.is_empty() {
                    p.push(
                        "`source.paths` must list at least one glob or directory for kind \"files\""
                            .to_string(),
                    );
                }
                for (key, patterns) in [("include", &files.include), ("exclude", &files.exclude)] {
                    for pattern in patterns {
                        // As the files source compiles them.
                        let compiled = globset::GlobBuilder::new(pattern)
                            .backslash_escape(false)
                            .build();
                        if let Err(e) = compiled {
                            p.push(format!(
                                "`source.{key}`: {pattern:?} is not a valid glob: {}",
                                e.kind()
                            ));
                        }
                    }
                }
            }
            SourceConfig::Jsonl(r) | SourceConfig::Csv(r) | SourceConfig::Parquet(r) => {
                if r.is_stdin() && self.kind() == SourceKind::Parquet {
                    p.push(
                        "`source.path` \"-\" (stdin) is for kinds \"jsonl\" and \"csv\"; \
                         Parquet must be read from a file"
                            .to_string(),
                    );
                }
                metadata_problems(&r.metadata_fields, p);
            }
        }
    }
}

/// The columns every output has, which a metadata field may not take.
const OUTPUT_COLUMNS: &[&str] = &[
    "id",
    "doc_id",
    "chunk_index",
    "source",
    "byte_start",
    "byte_end",
    "text",
    "content_hash",
    "token_count",
    "embedding",
];

/// Problems with a `source.metadata_fields` list: names that are not field
/// names or paths, or whose columns would clash with the output's or each
/// other's.
pub fn metadata_problems(fields: &[String], p: &mut Vec<String>) {
    let mut columns: Vec<(String, &str)> = Vec::new();
    for field in fields {
        if field.is_empty() || field.split('.').any(str::is_empty) {
            p.push(format!(
                "`source.metadata_fields`: {field:?} is not a field name or a dotted path"
            ));
            continue;
        }
        let column = metadata_column(field);
        if OUTPUT_COLUMNS.contains(&column.as_str()) {
            p.push(format!(
                "`source.metadata_fields`: {field:?} would be written as column {column:?}, \
                 which the output already has"
            ));
        } else if let Some((_, other)) = columns.iter().find(|(c, _)| *c == column) {
            p.push(format!(
                "`source.metadata_fields`: {other:?} and {field:?} would both be written as column {column:?}"
            ));
        } else {
            columns.push((column, field));
        }
    }
}

fn records(kind: SourceKind, raw: RawRecords, problems: &mut Vec<String>) -> Option<SourceConfig> {
    let path = raw.path.filter(|p| !p.as_os_str().is_empty());
    if path.is_none() {
        problems.push(format!("`source.path` is required for kind \"{kind}\""));
    }
    let text_field = raw.text_field.filter(|f| !f.is_empty());
    if text_field.is_none() {
        problems.push(format!(
            "`source.text_field` is required for kind \"{kind}\""
        ));
    }
    let records = RecordsSource {
        path: path?,
        text_field: text_field?,
        id_field: raw.id_field,
        metadata_fields: raw.metadata_fields,
    };
    Some(match kind {
        SourceKind::Jsonl => SourceConfig::Jsonl(records),
        SourceKind::Csv => SourceConfig::Csv(records),
        SourceKind::Parquet | SourceKind::Files => SourceConfig::Parquet(records),
    })
}

// ---------------------------------------------------------------- backend

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Api,
    Local,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Api => "api",
            BackendKind::Local => "local",
        })
    }
}

/// `[backend]`: the keys every kind shares, and one kind's own.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub shared: BackendShared,
    pub params: BackendParams,
}

/// The keys of `[backend]` that every kind takes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct BackendShared {
    pub model: Option<String>,
    pub dimensions: Option<usize>,
    pub max_inputs_per_request: usize,
    pub max_tokens_per_request: usize,
    /// Requests in flight (api), or requests waiting for the model (local).
    pub concurrency: usize,
    /// How long a request may take; also how long a stopping run waits for
    /// the requests in flight.
    pub timeout_seconds: f64,
}

impl Default for BackendShared {
    fn default() -> Self {
        BackendShared {
            model: None,
            dimensions: None,
            max_inputs_per_request: 128,
            max_tokens_per_request: 32_000,
            concurrency: 8,
            timeout_seconds: 60.0,
        }
    }
}

/// One backend kind's own keys.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendParams {
    Api(ApiParams),
    Local(LocalParams),
}

/// How vectors travel in an embeddings response (`backend.encoding_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    /// Ask for base64, take floats if they come, and ask for floats for the
    /// rest of the run if the service refuses the parameter.
    #[default]
    Auto,
    /// JSON numbers: the parameter is not sent.
    Float,
    /// Little-endian `f32`s in base64, as OpenAI sends them; a refusal stops the run.
    Base64,
}

impl fmt::Display for EncodingFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EncodingFormat::Auto => "auto",
            EncodingFormat::Float => "float",
            EncodingFormat::Base64 => "base64",
        })
    }
}

/// `kind = "api"`: an OpenAI-style service.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ApiParams {
    pub base_url: Option<String>,
    /// The path the API's routes sit under (`/v1` when absent; `""` for
    /// servers that serve them at the root, as infinity does by default).
    pub api_path: Option<String>,
    /// The model's context window, in tokens, for servers that do not list
    /// it; it takes precedence over the listing.
    pub context_window: Option<u64>,
    /// The price per 1000 input tokens, for servers that do not list it; it
    /// takes precedence over the listing.
    pub input_per_1k: Option<f64>,
    pub encoding_format: EncodingFormat,
    /// The environment variable that holds the API key (never the key itself).
    pub api_key_env: String,
    /// 0 = no client-side limit.
    pub requests_per_minute: u32,
    /// 0 = no client-side limit.
    pub tokens_per_minute: u64,
    pub max_retries: usize,
    /// The service answers under another model name than the one asked for
    /// (an alias, a gateway); accepted with a warning instead of refused.
    pub server_renames_models: bool,
    /// The run stops (exit 4, resumable) when nothing has succeeded for this
    /// many seconds while the service's quota refuses or holds back requests.
    pub stall_timeout_seconds: u64,
}

impl Default for ApiParams {
    fn default() -> Self {
        ApiParams {
            base_url: None,
            api_path: None,
            context_window: None,
            input_per_1k: None,
            encoding_format: EncodingFormat::Auto,
            api_key_env: DEFAULT_API_KEY_ENV.to_string(),
            requests_per_minute: 0,
            tokens_per_minute: 0,
            max_retries: 8,
            server_renames_models: false,
            stall_timeout_seconds: DEFAULT_STALL_TIMEOUT_SECONDS,
        }
    }
}

/// `kind = "local"`: the embedded fastembed model.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct LocalParams {
    /// The directory holding `model.onnx` and the tokenizer files. Absent:
    /// `EMBEDJOB_MODEL_DIR`, else `models/<model>` in the cache that
    /// `scripts/setup-local` fills.
    pub model_dir: Option<PathBuf>,
    /// ONNX Runtime intra-op threads. Absent: every available core.
    pub threads: Option<usize>,
    /// Texts per inference call, grouped by similar length. Absent: 32.
    pub batch_size: Option<usize>,
}

/// `backend.stall_timeout_seconds` when the job does not set it.
pub const DEFAULT_STALL_TIMEOUT_SECONDS: u64 = 600;
/// The longest `backend.stall_timeout_seconds`: a week.
pub const MAX_STALL_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;

const API_KEYS: &[&str] = &[
    "base_url",
    "api_path",
    "context_window",
    "input_per_1k",
    "encoding_format",
    "api_key_env",
    "requests_per_minute",
    "tokens_per_minute",
    "max_retries",
    "server_renames_models",
    "stall_timeout_seconds",
];
const LOCAL_KEYS: &[&str] = &["model_dir", "threads", "batch_size"];
const BACKEND_KINDS: &[(&str, &[&str])] = &[("api", API_KEYS), ("local", LOCAL_KEYS)];

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            shared: BackendShared::default(),
            params: BackendParams::Api(ApiParams::default()),
        }
    }
}

impl BackendConfig {
    pub fn kind(&self) -> BackendKind {
        match self.params {
            BackendParams::Api(_) => BackendKind::Api,
            BackendParams::Local(_) => BackendKind::Local,
        }
    }

    /// The api kind's own keys, when the kind is api.
    pub fn api(&self) -> Option<&ApiParams> {
        match &self.params {
            BackendParams::Api(api) => Some(api),
            BackendParams::Local(_) => None,
        }
    }

    /// The local kind's own keys, when the kind is local.
    pub fn local(&self) -> Option<&LocalParams> {
        match &self.params {
            BackendParams::Local(local) => Some(local),
            BackendParams::Api(_) => None,
        }
    }

    /// Takes a relative `model_dir` from `base`.
    pub(super) fn resolve_paths(&mut self, base: &Path) {
        if let BackendParams::Local(LocalParams {
            model_dir: Some(dir),
            ..
        }) = &mut self.params
        {
            *dir = super::paths::relative_to(base, dir);
        }
    }

    pub(super) fn parse(mut table: toml::Table) -> Parsed<BackendConfig> {
        let mut problems = Vec::new();
        let kind = take_kind("backend", &mut table, Some(BackendKind::Api), &mut problems);
        let (shared, unknown_shared, error) = deserialize::<BackendShared>("backend", &table);
        problems.extend(error);
        let Some(kind) = kind else {
            return Parsed {
                value: None,
                problems,
            };
        };
        let (params, unknown_own, error) = match kind {
            BackendKind::Api => {
                let (p, u, e) = deserialize::<ApiParams>("backend", &table);
                (p.map(BackendParams::Api), u, e)
            }
            BackendKind::Local => {
                let (p, u, e) = deserialize::<LocalParams>("backend", &table);
                (p.map(BackendParams::Local), u, e)
            }
        };
        problems.extend(error);
        // Unknown to both the shared keys and this kind's own.
        let unknown = unknown_own
            .into_iter()
            .filter(|key| unknown_shared.contains(key));
        report_unknown(
            "backend",
            &kind.to_string(),
            unknown,
            BACKEND_KINDS,
            &mut problems,
        );
        let value = shared
            .zip(params)
            .map(|(shared, params)| BackendConfig { shared, params });
        Parsed { value, problems }
    }
}

// ---------------------------------------------------------------- output

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    Parquet,
    Pgvector,
}

impl fmt::Display for OutputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputKind::Parquet => "parquet",
            OutputKind::Pgvector => "pgvector",
        })
    }
}

/// `[output]`: one sink kind's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputConfig {
    pub params: OutputParams,
}

#[derive(Debug, Clone, PartialEq)]
pub enum OutputParams {
    Parquet(ParquetOutput),
    Pgvector(PgvectorOutput),
}

/// `kind = "parquet"` (the default): one Parquet file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ParquetOutput {
    pub path: PathBuf,
    #[serde(default = "default_true")]
    pub include_text: bool,
    /// A row group is flushed once its buffered vectors and text reach this size.
    #[serde(default = "default_row_group_bytes")]
    pub row_group_bytes: u64,
}

fn default_true() -> bool {
    true
}

fn default_row_group_bytes() -> u64 {
    16 * 1024 * 1024
}

/// `kind = "pgvector"`: a PostgreSQL table with the pgvector extension,
/// kept in sync with the input from one run to the next.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PgvectorOutput {
    /// `postgresql://user@host:port/database`, without a password.
    pub url: String,
    /// The environment variable holding the password (never the password itself).
    #[serde(default)]
    pub password_env: Option<String>,
    /// The table, `name` or `schema.name`; its metadata sits beside it in
    /// `<name>_embedjob`.
    pub table: String,
    /// An approximate index on `embedding`: `"none"` (exact search) or
    /// `"hnsw"` (cosine distance).
    #[serde(default)]
    pub index: VectorIndex,
    /// Where the job's lock, checkpoint, failures file and summary live,
    /// named `<job name>.<table>` (default `.embedjob`).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
}

/// `output.index` of a pgvector output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VectorIndex {
    #[default]
    None,
    Hnsw,
}

/// The most dimensions pgvector (0.6) indexes with HNSW.
pub const HNSW_MAX_DIMENSIONS: usize = 2000;

/// PostgreSQL's identifier limit (NAMEDATALEN - 1), in bytes.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// The suffix of a pgvector output's metadata table.
pub const METADATA_TABLE_SUFFIX: &str = "_embedjob";

fn default_state_dir() -> PathBuf {
    PathBuf::from(".embedjob")
}

impl PgvectorOutput {
    /// `(schema, name)`: the schema is `None` when the table is not qualified.
    pub fn table_parts(&self) -> (Option<&str>, &str) {
        match self.table.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, self.table.as_str()),
        }
    }

    fn problems(&self, p: &mut Vec<String>) {
        url_problems(&self.url, p);
        match &self.password_env {
            Some(name) if name.is_empty() => {
                p.push("`output.password_env` must name an environment variable".to_string());
            }
            Some(name) if std::env::var(name).map_or(true, |v| v.is_empty()) => p.push(format!(
                "the database password is missing: set the environment variable {name} \
                 (named by `output.password_env`)"
            )),
            _ => {}
        }
        let (schema, name) = self.table_parts();
        let identifier = |part: &str| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if !schema.is_none_or(identifier) || !identifier(name) {
            p.push(format!(
                "`output.table` {:?} must be a lowercase name or schema.name \
                 (letters a-z, digits and _, not starting with a digit)",
                self.table
            ));
        } else if name.len() + METADATA_TABLE_SUFFIX.len() > MAX_IDENTIFIER_BYTES
            || schema.is_some_and(|s| s.len() > MAX_IDENTIFIER_BYTES)
        {
            p.push(format!(
                "`output.table` {:?} is too long: at most {} characters for the name, \
                 so that `<name>{METADATA_TABLE_SUFFIX}` fits PostgreSQL's {MAX_IDENTIFIER_BYTES}",
                self.table,
                MAX_IDENTIFIER_BYTES - METADATA_TABLE_SUFFIX.len()
            ));
        }
        if self.state_dir.as_os_str().is_empty() {
            p.push("`output.state_dir` must not be empty".to_string());
        }
    }
}

/// A database URL must be a `postgresql://` URL that holds no password:
/// the password comes from `output.password_env`. Nothing of the URL is
/// quoted back, so that a password typed into it is not shown either.
fn url_problems(url: &str, p: &mut Vec<String>) {
    let parsed = match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "postgresql" | "postgres") => parsed,
        Ok(_) => {
            p.push(
                "`output.url` must be a postgresql:// URL, e.g. \
                 postgresql://user@127.0.0.1:5432/database"
                    .to_string(),
            );
            return;
        }
        Err(e) => {
            p.push(format!("`output.url` is not a URL: {e}"));
            return;
        }
    };
    let in_query = parsed
        .query_pairs()
        .any(|(key, _)| key.eq_ignore_ascii_case("password"));
    if parsed.password().is_some() || in_query {
        p.push(
            "`output.url` holds a password (not shown): remove it and put it in the \
             environment variable named by `output.password_env`"
                .to_string(),
        );
    }
}

const PARQUET_OUTPUT_KEYS: &[&str] = &["path", "include_text", "row_group_bytes"];
const PGVECTOR_OUTPUT_KEYS: &[&str] = &["url", "password_env", "table", "index", "state_dir"];
const OUTPUT_KINDS: &[(&str, &[&str])] = &[
    ("parquet", PARQUET_OUTPUT_KEYS),
    ("pgvector", PGVECTOR_OUTPUT_KEYS),
];

impl OutputConfig {
    pub fn kind(&self) -> OutputKind {
        match self.params {
            OutputParams::Parquet(_) => OutputKind::Parquet,
            OutputParams::Pgvector(_) => OutputKind::Pgvector,
        }
    }

    /// Takes a relative output path (or state folder) from `base`.
    pub(super) fn resolve_paths(&mut self, base: &Path) {
        match &mut self.params {
            OutputParams::Parquet(parquet) => {
                parquet.path = super::paths::relative_to(base, &parquet.path);
            }
            OutputParams::Pgvector(pg) => {
                pg.state_dir = super::paths::relative_to(base, &pg.state_dir);
            }
        }
    }

    /// The path the job's state is named after (see `crate::state`): a
    /// Parquet output's own path; for a table, `<state_dir>/<job>.<table>`.
    pub fn state_stem(&self, job_name: &str) -> PathBuf {
        match &self.params {
            OutputParams::Parquet(parquet) => parquet.path.clone(),
            OutputParams::Pgvector(pg) => {
                let name: String = job_name
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                pg.state_dir.join(format!("{name}.{}", pg.table))
            }
        }
    }

    pub(super) fn parse(mut table: toml::Table) -> Parsed<OutputConfig> {
        let mut problems = Vec::new();
        let kind = take_kind(
            "output",
            &mut table,
            Some(OutputKind::Parquet),
            &mut problems,
        );
        let value = match kind {
            Some(OutputKind::Parquet) => {
                let (value, unknown, error) = deserialize::<ParquetOutput>("output", &table);
                report_unknown("output", "parquet", unknown, OUTPUT_KINDS, &mut problems);
                problems.extend(error);
                value.map(|p| OutputConfig {
                    params: OutputParams::Parquet(p),
                })
            }
            Some(OutputKind::Pgvector) => {
                let (value, unknown, error) = deserialize::<PgvectorOutput>("output", &table);
                report_unknown("output", "pgvector", unknown, OUTPUT_KINDS, &mut problems);
                problems.extend(error);
                value.map(|p| OutputConfig {
                    params: OutputParams::Pgvector(p),
                })
            }
            None => None,
        };
        Parsed { value, problems }
    }

    pub(super) fn problems(&self, p: &mut Vec<String>) {
        match &self.params {
            OutputParams::Parquet(parquet) => {
                if parquet.path.as_os_str().is_empty() {
                    p.push("`output.path` must not be empty".to_string());
                }
                if !(1024..=super::MAX_ROW_GROUP_BYTES).contains(&parquet.row_group_bytes) {
                    p.push(format!(
                        "`output.row_group_bytes` must be between 1024 and {}, not {}",
                        super::MAX_ROW_GROUP_BYTES,
                        parquet.row_group_bytes
                    ));
                }
            }
            OutputParams::Pgvector(pg) => pg.problems(p),
        }
    }
}
