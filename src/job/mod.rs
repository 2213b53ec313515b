//! The job file: its shape, `--set` overrides, and validation that reports
//! every problem at once.
//!
//! Keys are snake_case with unit suffixes. Unknown keys are errors: they are
//! collected by `serde_ignored` rather than `deny_unknown_fields`, which would
//! stop at the first one. `[source]`, `[backend]` and `[output]` hold one
//! kind's parameters each, read by the kind its stage registers (see
//! [`params`]): this module depends on no stage. Relative paths are taken
//! from the job file's directory (see [`paths`]), so a job runs the same from
//! any directory, cron's included.

mod location;
mod params;
pub mod paths;
pub mod shard;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use self::params::{one_line, parse_backend, parse_output, parse_source, Parsed};
pub use self::params::{
    BackendConfig, BackendParams, BackendShared, Concurrency, Erased, Kind, KindTable, Kinds,
    OutputConfig, OutputParams, SourceConfig, SourceParams, DEFAULT_MAX_CONCURRENCY,
};
pub use self::shard::Shard;

#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub name: String,
    pub source: SourceConfig,
    pub chunking: ChunkingConfig,
    pub backend: BackendConfig,
    pub output: OutputConfig,
    pub pipeline: PipelineConfig,
    pub budget: BudgetConfig,
    /// Which chunk sizes the job sets; the others fit the model (see
    /// [`Job::chunking_for`]).
    pub chunk_sizes_set: ChunkSizesSet,
    /// The part of the input this run embeds (`--shard`), set by
    /// [`Job::split`]; `None`, all of it.
    pub shard: Option<Shard>,
}

/// Whether the job (or `--set`) gives `chunking.max_tokens` and
/// `chunking.overlap_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkSizesSet {
    pub max_tokens: bool,
    pub overlap_tokens: bool,
}

/// Chunk size when the job sets none and the model's window allows it.
pub const DEFAULT_MAX_TOKENS: usize = 512;
/// Overlap for [`DEFAULT_MAX_TOKENS`]; a smaller chunk overlaps in proportion.
pub const DEFAULT_OVERLAP_TOKENS: usize = 50;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChunkingConfig {
    pub max_tokens: usize,
    pub overlap_tokens: usize,
    /// Split along markdown structure: `true`, `false`, or absent to decide
    /// by file extension (`.md`, `.markdown`).
    pub markdown: Option<bool>,
    /// What counts tokens for an api backend: `cl100k_base` (absent),
    /// `o200k_base`, `bert-base-uncased` (built in), or the path of a Hugging
    /// Face `tokenizer.json`, so that chunks fit the model's window as the
    /// model counts. A local model counts with its own.
    pub tokenizer: Option<String>,
    /// Besides `max_tokens`, the most word pieces (`bert-base-uncased`'s
    /// count) a chunk's text may hold: where a job counts in an encoding,
    /// what a probe found a self-hosted server reads of its densest text,
    /// in those pieces. Not read from the job file.
    #[serde(skip)]
    pub wordpieces: Option<usize>,
}

/// The tokenizer counting when `chunking.tokenizer` is absent.
pub const DEFAULT_TOKENIZER: &str = "cl100k_base";

impl Default for ChunkingConfig {
    fn default() -> Self {
        ChunkingConfig {
            max_tokens: DEFAULT_MAX_TOKENS,
            overlap_tokens: DEFAULT_OVERLAP_TOKENS,
            markdown: None,
            tokenizer: None,
            wordpieces: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PipelineConfig {
    /// Capacity of each channel between stages, in items (documents, batches or results).
    pub channel_capacity: usize,
    /// Seconds between progress lines on stderr.
    pub progress_seconds: f64,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            channel_capacity: 16,
            progress_seconds: 5.0,
        }
    }
}

/// A cap on what one run may be billed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetConfig {
    /// The most one run may cost, in the currency of the model's prices
    /// (`pricing.input_per_1k`, `output_per_1k`); unset, no cap.
    pub max_cost: Option<f64>,
}

/// The ranges numbers in a job file must fall in: large enough to work,
/// small enough that no size or duration computed from them can overflow.
pub const MIN_TIMEOUT_SECONDS: f64 = 0.001;
pub const MAX_TIMEOUT_SECONDS: f64 = 86_400.0;
pub const MAX_DIMENSIONS: usize = 65_536;
pub const MAX_CHANNEL_CAPACITY: usize = 65_536;
pub const MAX_INPUTS_PER_REQUEST: usize = 65_536;
pub const MAX_TOKENS: usize = 1_000_000_000;
pub const MAX_RETRIES: usize = 1_000;
pub const MAX_ROW_GROUP_BYTES: u64 = 1 << 32;

/// A number of seconds as a duration, when it is a timeout this program
/// accepts (between [`MIN_TIMEOUT_SECONDS`] and [`MAX_TIMEOUT_SECONDS`]).
pub fn seconds_in_range(seconds: Option<f64>) -> Option<std::time::Duration> {
    let seconds = seconds.filter(|s| (MIN_TIMEOUT_SECONDS..=MAX_TIMEOUT_SECONDS).contains(s))?;
    Some(std::time::Duration::from_secs_f64(seconds))
}

/// Every problem found in a job file, reported together.
#[derive(Debug, Clone, PartialEq)]
pub struct JobErrors {
    pub file: PathBuf,
    pub problems: Vec<String>,
}

impl fmt::Display for JobErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "{}: {n} problem{}",
            self.file.display(),
            if n == 1 { "" } else { "s" }
        )?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for JobErrors {}

/// Reads, overrides and validates a job file, its kinded sections read by
/// `kinds`. Relative paths in it (and in `overrides`) are taken from the job
/// file's directory; problems about a key the file writes give its line and
/// column.
pub fn load(path: &Path, overrides: &[String], kinds: &Kinds) -> Result<Job, JobErrors> {
    let fail = |problems: Vec<String>| JobErrors {
        file: path.to_path_buf(),
        problems,
    };
    let text = read_job_file(path).map_err(|e| fail(vec![e]))?;
    let default_name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "job".to_string());
    let overridden: Vec<&str> = overrides
        .iter()
        .filter_map(|o| o.split_once('=').map(|(key, _)| key.trim()))
        .collect();
    let mut job = parse(&text, &default_name, overrides, kinds).map_err(|problems| {
        fail(
            problems
                .into_iter()
                .map(|p| location::locate(&text, p, &overridden))
                .collect(),
        )
    })?;
    job.resolve_paths(path.parent().unwrap_or(Path::new("")));
    Ok(job)
}

/// The job file's text, read only up to [`crate::bounded::MAX_JOB_FILE_BYTES`],
/// so a path such as `/dev/zero` is an error rather than exhausted memory.
fn read_job_file(path: &Path) -> Result<String, String> {
    use crate::bounded::{self, BoundedError, MAX_JOB_FILE_BYTES};
    let cannot = |e: std::io::Error| format!("cannot read the job file: {e}");
    let file = std::fs::File::open(path).map_err(cannot)?;
    let bytes = bounded::read_to_end(file, MAX_JOB_FILE_BYTES).map_err(|e| match e {
        BoundedError::TooLarge { limit } => format!(
            "cannot read the job file: more than {}, the most a job file may hold",
            bounded::describe(limit)
        ),
        BoundedError::Io(e) => cannot(e),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        format!("cannot read the job file: not valid UTF-8 (first bad byte at offset {offset})")
    })
}

/// Parses job-file text with overrides applied; `default_name` names a job
/// that doesn't. Paths are left as written.
pub fn parse(
    text: &str,
    default_name: &str,
    overrides: &[String],
    kinds: &Kinds,
) -> Result<Job, Vec<String>> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| vec![toml_error(text, &e)])?;
    let mut problems = Vec::new();
    for assignment in overrides {
        if let Err(problem) = apply_override(&mut table, assignment) {
            problems.push(problem);
        }
    }
    let chunk_sizes_set = chunk_sizes_set(&table);
    let mut sections = Sections::new(table);
    let name: Option<String> = sections.take("name", false, &mut problems);
    let source = sections
        .take_table("source", true, &mut problems)
        .and_then(|table| sections.parsed("source", parse_source(table, kinds), &mut problems))
        .map(|params| SourceConfig { params });
    let chunking: Option<ChunkingConfig> = sections.take("chunking", false, &mut problems);
    // An absent `[backend]` is its default kind with its defaults.
    let backend = sections
        .take_table("backend", false, &mut problems)
        .or_else(|| (!sections.failed("backend")).then(toml::Table::new))
        .and_then(|table| sections.parsed("backend", parse_backend(table, kinds), &mut problems));
    let output = sections
        .take_table("output", true, &mut problems)
        .and_then(|table| sections.parsed("output", parse_output(table, kinds), &mut problems))
        .map(|params| OutputConfig { params });
    let pipeline: Option<PipelineConfig> = sections.take("pipeline", false, &mut problems);
    let budget: Option<BudgetConfig> = sections.take("budget", false, &mut problems);
    for key in sections.rest() {
        problems.push(format!("unknown key `{key}`"));
    }
    // A section that failed doesn't stop the checks of the sections that didn't.
    let chunking = (!sections.failed("chunking")).then(|| chunking.unwrap_or_default());
    let pipeline = pipeline.unwrap_or_default();
    let budget = budget.unwrap_or_default();
    let name = name.unwrap_or_else(|| default_name.to_string());
    let mut p = Vec::new();
    name_problems(&name, &mut p);
    if let Some(source) = &source {
        source.params.problems(&mut p);
    }
    if let Some(chunking) = &chunking {
        chunking_problems(chunking, &mut p);
    }
    if let Some(backend) = &backend {
        let set = chunking.as_ref().filter(|_| chunk_sizes_set.max_tokens);
        backend_problems(backend, set, &mut p);
    }
    budget_problems(&budget, &mut p);
    if let Some(output) = &output {
        output.params.problems(&mut p);
    }
    pipeline_problems(&pipeline, &mut p);
    problems.extend(p);
    match (source, chunking, backend, output) {
        (Some(source), Some(chunking), Some(backend), Some(output)) if problems.is_empty() => {
            Ok(Job {
                name,
                source,
                chunking,
                backend,
                output,
                pipeline,
                budget,
                chunk_sizes_set,
                shard: None,
            })
        }
        _ => Err(problems),
    }
}

fn chunk_sizes_set(table: &toml::Table) -> ChunkSizesSet {
    let chunking = table.get("chunking").and_then(toml::Value::as_table);
    let has = |key: &str| chunking.is_some_and(|c| c.contains_key(key));
    ChunkSizesSet {
        max_tokens: has("max_tokens"),
        overlap_tokens: has("overlap_tokens"),
    }
}

/// The top-level table, taken apart one section at a time so that every
/// section's problems are collected, not only the first.
struct Sections {
    table: toml::Table,
    /// The sections that failed to deserialize.
    failed: Vec<String>,
}

impl Sections {
    fn new(table: toml::Table) -> Self {
        Sections {
            table,
            failed: Vec::new(),
        }
    }

    fn take<T: DeserializeOwned>(
        &mut self,
        key: &str,
        required: bool,
        problems: &mut Vec<String>,
    ) -> Option<T> {
        let Some(value) = self.table.remove(key) else {
            if required {
                problems.push(format!("missing `[{key}]`"));
            }
            return None;
        };
        let (result, unknown, found) = match value {
            toml::Value::Table(table) => params::deserialize::<T>(key, &table),
            other => {
                let (result, unknown) = params::deserialize_once::<T>(other);
                let found = result
                    .as_ref()
                    .err()
                    .map(|e| format!("`{key}`: {}", one_line(&e.inner().to_string())));
                (result.ok(), unknown, found.into_iter().collect())
            }
        };
        for path in &unknown {
            problems.push(format!("unknown key `{key}.{path}`"));
        }
        if result.is_none() {
            self.failed.push(key.to_string());
        }
        problems.extend(found);
        result
    }

    /// Takes a section that has a `kind`, as a table.
    fn take_table(
        &mut self,
        key: &str,
        required: bool,
        problems: &mut Vec<String>,
    ) -> Option<toml::Table> {
        let Some(value) = self.table.remove(key) else {
            if required {
                problems.push(format!("missing `[{key}]`"));
            }
            return None;
        };
        let toml::Value::Table(table) = value else {
            problems.push(format!(
                "`{key}`: expected a table, found {}",
                value.type_str()
            ));
            self.failed.push(key.to_string());
            return None;
        };
        Some(table)
    }

    /// The value of a kinded section, its problems added to `problems`.
    fn parsed<T>(&mut self, key: &str, parsed: Parsed<T>, problems: &mut Vec<String>) -> Option<T> {
        if parsed.value.is_none() {
            self.failed.push(key.to_string());
        }
        problems.extend(parsed.problems);
        parsed.value
    }

    fn failed(&self, key: &str) -> bool {
        self.failed.iter().any(|k| k == key)
    }

    fn rest(&mut self) -> Vec<String> {
        std::mem::take(&mut self.table).keys().cloned().collect()
    }
}

fn toml_error(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let (line, column) = location::line_column(text, span.start);
            format!(
                "not valid TOML at line {line}, column {column}: {}",
                one_line(e.message())
            )
        }
        None => format!("not valid TOML: {}", one_line(e.message())),
    }
}

/// Applies `a.b.c=value`. The value is read as TOML when it is valid TOML
/// (`4`, `true`, `["x"]`, `"quoted"`), else taken as a plain string.
pub fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<(), String> {
    let (path, raw) = assignment
        .split_once('=')
        .ok_or_else(|| format!("--set {assignment:?}: expected KEY=VALUE"))?;
    let path = path.trim();
    let keys: Vec<&str> = path.split('.').collect();
    if keys.iter().any(|k| k.is_empty()) {
        return Err(format!(
            "--set {assignment:?}: {path:?} is not a dotted key path"
        ));
    }
    let value = parse_value(raw.trim());
    let (last, parents) = keys.split_last().expect("split yields at least one key");
    let mut current = table;
    for key in parents {
        let entry = current
            .entry((*key).to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = match entry {
            toml::Value::Table(inner) => inner,
            _ => return Err(format!("--set {path}: `{key}` is not a table")),
        };
    }
    current.insert((*last).to_string(), value);
    Ok(())
}

fn parse_value(raw: &str) -> toml::Value {
    #[derive(Deserialize)]
    struct Holder {
        v: toml::Value,
    }
    match toml::from_str::<Holder>(&format!("v = {raw}")) {
        Ok(holder) => holder.v,
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

fn name_problems(name: &str, p: &mut Vec<String>) {
    if name.trim().is_empty() {
        p.push("`name` must not be empty".to_string());
    }
}

fn chunking_problems(c: &ChunkingConfig, p: &mut Vec<String>) {
    if c.tokenizer.as_deref().is_some_and(|t| t.trim().is_empty()) {
        p.push(
            "`chunking.tokenizer` must name cl100k_base, o200k_base, bert-base-uncased or a \
             tokenizer.json file"
                .to_string(),
        );
    }
    if c.max_tokens == 0 {
        p.push("`chunking.max_tokens` must be at least 1".to_string());
    }
    if c.max_tokens > MAX_TOKENS {
        p.push(format!(
            "`chunking.max_tokens` must be at most {MAX_TOKENS}, not {}",
            c.max_tokens
        ));
    }
    if c.overlap_tokens >= c.max_tokens.max(1) {
        p.push(format!(
            "`chunking.overlap_tokens` ({}) must be less than `chunking.max_tokens` ({})",
            c.overlap_tokens, c.max_tokens
        ));
    }
}

fn budget_problems(budget: &BudgetConfig, p: &mut Vec<String>) {
    if let Some(cost) = budget.max_cost {
        if !cost.is_finite() || cost <= 0.0 {
            p.push(format!(
                "`budget.max_cost` must be a positive amount, not {cost}"
            ));
        }
    }
}

fn pipeline_problems(pipeline: &PipelineConfig, p: &mut Vec<String>) {
    if !(1..=MAX_CHANNEL_CAPACITY).contains(&pipeline.channel_capacity) {
        p.push(format!(
            "`pipeline.channel_capacity` must be between 1 and {MAX_CHANNEL_CAPACITY}, not {}",
            pipeline.channel_capacity
        ));
    }
    let every = pipeline.progress_seconds;
    if !(every.is_finite() && (0.1..=86_400.0).contains(&every)) {
        p.push(format!(
            "`pipeline.progress_seconds` must be between 0.1 and 86400, not {every}"
        ));
    }
}

fn backend_problems(
    backend: &BackendConfig,
    chunking: Option<&ChunkingConfig>,
    p: &mut Vec<String>,
) {
    let b = &backend.shared;
    if !(1..=MAX_INPUTS_PER_REQUEST).contains(&b.max_inputs_per_request) {
        p.push(format!(
            "`backend.max_inputs_per_request` must be between 1 and {MAX_INPUTS_PER_REQUEST}, not {}",
            b.max_inputs_per_request
        ));
    }
    if b.max_tokens_per_request > MAX_TOKENS {
        p.push(format!(
            "`backend.max_tokens_per_request` must be at most {MAX_TOKENS}, not {}",
            b.max_tokens_per_request
        ));
    }
    if let Some(c) = chunking.filter(|c| b.max_tokens_per_request < c.max_tokens) {
        p.push(format!(
            "`backend.max_tokens_per_request` ({}) must be at least `chunking.max_tokens` ({}), or a chunk could never be sent",
            b.max_tokens_per_request, c.max_tokens
        ));
    }
    if let Concurrency::Fixed(n) = b.concurrency {
        if !(1..=1024).contains(&n) {
            p.push(format!(
                "`backend.concurrency` must be between 1 and 1024 or \"auto\", not {n}"
            ));
        }
    }
    if !(1..=1024).contains(&b.max_concurrency) {
        p.push(format!(
            "`backend.max_concurrency` must be between 1 and 1024, not {}",
            b.max_concurrency
        ));
    }
    if seconds_in_range(Some(b.timeout_seconds)).is_none() {
        p.push(format!(
            "`backend.timeout_seconds` must be between {MIN_TIMEOUT_SECONDS} and {MAX_TIMEOUT_SECONDS}, not {}",
            b.timeout_seconds
        ));
    }
    if let Some(d) = b.dimensions.filter(|d| !(1..=MAX_DIMENSIONS).contains(d)) {
        p.push(format!(
            "`backend.dimensions` must be between 1 and {MAX_DIMENSIONS}, not {d}"
        ));
    }
    if let (Some(model), Some(declared)) = (&b.model, b.dimensions) {
        if let Some(known) = known_model_dimensions(model) {
            if declared > known {
                p.push(format!(
                    "`backend.dimensions` is {declared} but model {model} returns vectors of length {known}: \
                     it can shorten them, not lengthen them"
                ));
            }
        }
    }
    backend.params.problems(b, chunking, p);
}

impl Job {
    /// The chunking a run uses with a model whose chunks may hold `window`
    /// tokens of text and whose requests `max_tokens_per_request`: the sizes
    /// the job sets, and for those it leaves out, chunks that fit the window
    /// and the request (at most [`DEFAULT_MAX_TOKENS`]) with an overlap in
    /// proportion (50 tokens for 512).
    pub fn chunking_for(&self, window: Option<u64>) -> ChunkingConfig {
        let mut chunking = self.chunking.clone();
        if !self.chunk_sizes_set.max_tokens {
            let window = window.map_or(usize::MAX, |w| usize::try_from(w).unwrap_or(usize::MAX));
            chunking.max_tokens = DEFAULT_MAX_TOKENS
                .min(window)
                .min(self.backend.shared.max_tokens_per_request)
                .max(1);
        }
        if !self.chunk_sizes_set.overlap_tokens {
            let scaled = (chunking.max_tokens * DEFAULT_OVERLAP_TOKENS + DEFAULT_MAX_TOKENS / 2)
                / DEFAULT_MAX_TOKENS;
            chunking.overlap_tokens = scaled.min(chunking.max_tokens - 1);
        }
        chunking
    }

    /// Makes this run shard `shard` of the job: it reads only the shard's
    /// documents; the output and the backend take their parts (a Parquet
    /// output's `path` names a directory, where the shard writes its own
    /// file; the api's rate limits are shared out), and so is
    /// `budget.max_cost`.
    pub fn split(&mut self, shard: Shard) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        self.output.params.split(shard, &mut problems);
        self.backend.params.split(shard, &mut problems);
        // The job's budget, like its rate limits, is the whole job's.
        self.budget.max_cost = self.budget.max_cost.map(|c| c / f64::from(shard.count));
        self.shard = Some(shard);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// The path the job's state is named after (see `crate::state`): a
    /// shard's is its own, beside the output directory for Parquet, and
    /// with the shard's name for a table.
    pub fn state_stem(&self) -> PathBuf {
        self.output.params.state_stem(&self.name, self.shard)
    }

    /// Takes every relative path of the job from `base`, the job file's
    /// directory (see [`paths`]).
    pub fn resolve_paths(&mut self, base: &Path) {
        self.source.params.resolve_paths(base);
        self.backend.params.resolve_paths(base);
        self.output.params.resolve_paths(base);
        if let Some(tokenizer) = &mut self.chunking.tokenizer {
            if !named_tokenizer(tokenizer) {
                *tokenizer = paths::relative_to(base, Path::new(tokenizer.as_str()))
                    .to_string_lossy()
                    .into_owned();
            }
        }
    }

    /// The settings that decide what a chunk's vector is; a change to any of
    /// them invalidates vectors made before.
    pub fn fingerprint_fields(&self) -> BTreeMap<&'static str, String> {
        let mut f = BTreeMap::new();
        f.insert("backend.kind", self.backend.kind().to_string());
        f.insert(
            "backend.model",
            self.backend.shared.model.clone().unwrap_or_default(),
        );
        f.insert(
            "backend.dimensions",
            self.backend
                .shared
                .dimensions
                .map(|d| d.to_string())
                .unwrap_or_default(),
        );
        f.insert("chunking.max_tokens", self.chunking.max_tokens.to_string());
        f.insert(
            "chunking.overlap_tokens",
            self.chunking.overlap_tokens.to_string(),
        );
        f.insert("chunking.markdown", format!("{:?}", self.chunking.markdown));
        // Absent under the default, so that vectors made before the key existed stay reusable.
        if let Some(tokenizer) = self
            .chunking
            .tokenizer
            .as_deref()
            .filter(|t| *t != DEFAULT_TOKENIZER)
        {
            f.insert("chunking.tokenizer", tokenizer_identity(tokenizer));
        }
        f
    }
}

/// A tokenizer as the fingerprint records it: its name, or a file's path
/// with the start of the SHA-256 of its content, so that an edited file counts
/// as another tokenizer.
fn tokenizer_identity(tokenizer: &str) -> String {
    if named_tokenizer(tokenizer) {
        return tokenizer.to_string();
    }
    // Bounded as the chunker's read is: past the limit the chunker refuses it.
    let bytes = std::fs::File::open(tokenizer).ok().and_then(|file| {
        crate::bounded::read_to_end(file, crate::bounded::MAX_TOKENIZER_BYTES).ok()
    });
    match bytes {
        Some(bytes) => {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(&bytes);
            format!("{tokenizer} (sha256 {})", &hex::encode(digest)[..16])
        }
        None => tokenizer.to_string(),
    }
}

/// Whether `chunking.tokenizer` names one of OpenAI's encodings, built in:
/// a count that is not a self-hosted model's own.
pub fn named_encoding(tokenizer: &str) -> bool {
    matches!(tokenizer, "cl100k_base" | "o200k_base")
}

/// `chunking.tokenizer`'s name for `bert-base-uncased`'s WordPiece tokenizer,
/// built in: the count of all-MiniLM, BGE, E5, GTE and most embedding models
/// self-hosted servers run, `[CLS]` and `[SEP]` reserved in the window.
pub const BERT_WORDPIECE: &str = "bert-base-uncased";

/// Whether `chunking.tokenizer` names a built-in tokenizer rather than a file.
pub fn named_tokenizer(tokenizer: &str) -> bool {
    named_encoding(tokenizer) || tokenizer == BERT_WORDPIECE
}

/// The models that count their tokens in an encoding embedjob has:
/// OpenAI's embedding models (`text-embedding-3-small`, `-large`,
/// `text-embedding-ada-002`) count, and bill, `cl100k_base` tokens.
const COUNTED_IN_CL100K: &str = "text-embedding-";

/// Whether `model` counts its tokens as `tokenizer` does: its window and
/// its bill are then in the job's own count.
pub fn counts_as(model: &str, tokenizer: &str) -> bool {
    tokenizer == DEFAULT_TOKENIZER && model.starts_with(COUNTED_IN_CL100K)
}

/// The vector length of the models the service documents.
pub fn known_model_dimensions(model: &str) -> Option<usize> {
    match model {
        "svc-embed-1" => Some(1024),
        "svc-embed-1-l" => Some(3072),
        _ => None,
    }
}
