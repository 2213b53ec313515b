//! The job file: its shape, `--set` overrides, and validation that reports
//! every problem at once.
//!
//! Keys are snake_case with unit suffixes. Unknown keys are errors: they are
//! collected by `serde_ignored` rather than `deny_unknown_fields`, which would
//! stop at the first one. `[source]`, `[backend]` and `[output]` hold one
//! kind's parameters each (see [`params`]). Relative paths are taken from the
//! job file's directory (see [`paths`]), so a job runs the same from any
//! directory, cron's included.

mod location;
mod params;
pub mod paths;
pub mod shard;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::validate::known_model_dimensions;

use self::params::{one_line, Parsed};
pub use self::params::{
    ApiParams, BackendConfig, BackendKind, BackendParams, BackendShared, EncodingFormat,
    FilesSource, LocalParams, OutputConfig, OutputKind, OutputParams, ParquetOutput,
    PgvectorOutput, RecordsSource, SourceConfig, SourceKind, VectorIndex, DEFAULT_API_KEY_ENV,
    HNSW_MAX_DIMENSIONS, METADATA_TABLE_SUFFIX,
};
pub use self::params::{OnInvalid, STDIN, STDIN_NAME};
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
    /// `o200k_base`, or the path of a Hugging Face `tokenizer.json`, so that
    /// chunks fit the model's window as the model counts. A local model
    /// counts with its own.
    pub tokenizer: Option<String>,
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

/// Reads, overrides and validates a job file. Relative paths in it (and in
/// `overrides`) are taken from the job file's directory; problems about a
/// key the file writes give its line and column.
pub fn load(path: &Path, overrides: &[String]) -> Result<Job, JobErrors> {
    let fail = |problems: Vec<String>| JobErrors {
        file: path.to_path_buf(),
        problems,
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| fail(vec![format!("cannot read the job file: {e}")]))?;
    let default_name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "job".to_string());
    let overridden: Vec<&str> = overrides
        .iter()
        .filter_map(|o| o.split_once('=').map(|(key, _)| key.trim()))
        .collect();
    let mut job = parse(&text, &default_name, overrides).map_err(|problems| {
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

/// Parses job-file text with overrides applied; `default_name` names a job
/// that doesn't. Paths are left as written.
pub fn parse(text: &str, default_name: &str, overrides: &[String]) -> Result<Job, Vec<String>> {
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
    let source = sections.take_kinded("source", true, SourceConfig::parse, &mut problems);
    let chunking: Option<ChunkingConfig> = sections.take("chunking", false, &mut problems);
    let backend = sections.take_kinded("backend", false, BackendConfig::parse, &mut problems);
    let output = sections.take_kinded("output", true, OutputConfig::parse, &mut problems);
    let pipeline: Option<PipelineConfig> = sections.take("pipeline", false, &mut problems);
    let budget: Option<BudgetConfig> = sections.take("budget", false, &mut problems);
    for key in sections.rest() {
        problems.push(format!("unknown key `{key}`"));
    }
    // A section that failed doesn't stop the checks of the sections that didn't.
    let chunking = (!sections.failed("chunking")).then(|| chunking.unwrap_or_default());
    let backend = (!sections.failed("backend")).then(|| backend.unwrap_or_default());
    let pipeline = pipeline.unwrap_or_default();
    let budget = budget.unwrap_or_default();
    let name = name.unwrap_or_else(|| default_name.to_string());
    let mut p = Vec::new();
    name_problems(&name, &mut p);
    if let Some(source) = &source {
        source.problems(&mut p);
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
        output.problems(&mut p);
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

    /// Takes a section that has a `kind`, parsed by `parse`.
    fn take_kinded<T>(
        &mut self,
        key: &str,
        required: bool,
        parse: fn(toml::Table) -> Parsed<T>,
        problems: &mut Vec<String>,
    ) -> Option<T> {
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
        let parsed = parse(table);
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
            "`chunking.tokenizer` must name cl100k_base, o200k_base or a tokenizer.json file"
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
    if !(1..=1024).contains(&b.concurrency) {
        p.push(format!(
            "`backend.concurrency` must be between 1 and 1024, not {}",
            b.concurrency
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
    match &backend.params {
        BackendParams::Api(api) => {
            api_problems(b, api, p);
            if let (Some(window), Some(c)) = (api.context_window, chunking) {
                if (c.max_tokens as u64) > window {
                    p.push(format!(
                        "`chunking.max_tokens` ({}) is larger than `backend.context_window` ({window})",
                        c.max_tokens
                    ));
                }
            }
        }
        BackendParams::Local(local) => {
            local_problems(local, p);
            if chunking.is_some_and(|c| c.tokenizer.is_some()) {
                p.push(
                    "`chunking.tokenizer` does not apply to backend kind \"local\": the model counts with its own"
                        .to_string(),
                );
            }
        }
    }
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
    /// documents; a Parquet output's `path` names a directory, where the
    /// shard writes its own file; the job's `requests_per_minute`,
    /// `tokens_per_minute` and `budget.max_cost` are shared out among the
    /// shards.
    pub fn split(&mut self, shard: Shard) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        if let OutputParams::Parquet(parquet) = &mut self.output.params {
            let dir = parquet.path.clone();
            if dir.is_file() {
                problems.push(format!(
                    "`output.path` {} is a file; with --shard it names a directory, where \
                     each shard writes its own part-IIIII-of-NNNNN.parquet",
                    dir.display()
                ));
            }
            match shard.foreign_files(&dir) {
                Ok(foreign) if foreign.is_empty() => {}
                Ok(foreign) => problems.push(format!(
                    "`output.path` {} holds files of the job split into another number of \
                     shards than {}: {}; they hold this shard's documents too: remove them \
                     (and their state in {}), or give the job another `output.path`",
                    dir.display(),
                    shard.count,
                    foreign
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    Shard::state_dir(&dir).display()
                )),
                Err(e) => {
                    problems.push(format!("`output.path` {}: cannot list: {e}", dir.display()))
                }
            }
            parquet.path = dir.join(shard.file_name());
        }
        if let BackendParams::Api(api) = &mut self.backend.params {
            let count = shard.count;
            let share = |key: &str, total: u64, problems: &mut Vec<String>| {
                if total > 0 && total < u64::from(count) {
                    problems.push(format!(
                        "`backend.{key}` is {total} for the whole job: split {count} ways, \
                         a shard would get less than 1"
                    ));
                }
                total / u64::from(count)
            };
            let requests = share(
                "requests_per_minute",
                u64::from(api.requests_per_minute),
                &mut problems,
            );
            api.requests_per_minute = u32::try_from(requests).unwrap_or(u32::MAX);
            api.tokens_per_minute =
                share("tokens_per_minute", api.tokens_per_minute, &mut problems);
        }
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
        let stem = self.output.state_stem(&self.name);
        let Some(shard) = self.shard else {
            return stem;
        };
        match &self.output.params {
            OutputParams::Parquet(_) => {
                let dir = crate::fsio::parent_dir(&stem);
                Shard::state_dir(dir).join(shard.file_name())
            }
            OutputParams::Pgvector(_) => {
                crate::fsio::with_suffix(&stem, &format!(".{}", shard.name()))
            }
        }
    }

    /// Takes every relative path of the job from `base`, the job file's
    /// directory (see [`paths`]).
    pub fn resolve_paths(&mut self, base: &Path) {
        self.source.resolve_paths(base);
        self.backend.resolve_paths(base);
        self.output.resolve_paths(base);
        if let Some(tokenizer) = &mut self.chunking.tokenizer {
            if !crate::chunk::named_encoding(tokenizer) {
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
    if crate::chunk::named_encoding(tokenizer) {
        return tokenizer.to_string();
    }
    match std::fs::read(tokenizer) {
        Ok(bytes) => {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(&bytes);
            format!("{tokenizer} (sha256 {})", &hex::encode(digest)[..16])
        }
        Err(_) => tokenizer.to_string(),
    }
}

fn api_problems(b: &BackendShared, api: &ApiParams, p: &mut Vec<String>) {
    if let Some(path) = &api.api_path {
        let trimmed = path.trim();
        if !(trimmed.is_empty() || trimmed.starts_with('/'))
            || trimmed.contains(['?', '#', ' '])
            || trimmed.contains("//")
        {
            p.push(format!(
                "`backend.api_path` {path:?} must be empty or a path such as \"/v1\""
            ));
        }
    }
    if api.context_window == Some(0) {
        p.push("`backend.context_window` must be at least 1".to_string());
    }
    if !(1..=params::MAX_STALL_TIMEOUT_SECONDS).contains(&api.stall_timeout_seconds) {
        p.push(format!(
            "`backend.stall_timeout_seconds` must be between 1 and {}, not {}",
            params::MAX_STALL_TIMEOUT_SECONDS,
            api.stall_timeout_seconds
        ));
    }
    for (key, price) in [
        ("input_per_1k", api.input_per_1k),
        ("output_per_1k", api.output_per_1k),
    ] {
        if let Some(price) = price.filter(|p| !p.is_finite() || *p < 0.0) {
            p.push(format!(
                "`backend.{key}` must be a price of 0 or more, not {price}"
            ));
        }
    }
    if api.max_retries > MAX_RETRIES {
        p.push(format!(
            "`backend.max_retries` must be at most {MAX_RETRIES}, not {}",
            api.max_retries
        ));
    }
    match &api.base_url {
        None => p.push("`backend.base_url` is required for kind \"api\"".to_string()),
        Some(url) => {
            if let Err(e) = reqwest::Url::parse(url) {
                p.push(format!("`backend.base_url` {url:?} is not a URL: {e}"));
            }
        }
    }
    if b.model.as_deref().is_none_or(str::is_empty) {
        p.push("`backend.model` is required for kind \"api\"".to_string());
    }
    if api.api_key_env.is_empty() {
        p.push("`backend.api_key_env` must name an environment variable".to_string());
    } else if std::env::var(&api.api_key_env).map_or(true, |k| k.trim().is_empty()) {
        p.push(format!(
            "the API key is missing: set the environment variable {} (named by `backend.api_key_env`)",
            api.api_key_env
        ));
    }
}

fn local_problems(local: &LocalParams, p: &mut Vec<String>) {
    if let Some(threads) = local.threads {
        if !(1..=1024).contains(&threads) {
            p.push(format!(
                "`backend.threads` must be between 1 and 1024, not {threads}"
            ));
        }
    }
    if let Some(size) = local.batch_size {
        if !(1..=4096).contains(&size) {
            p.push(format!(
                "`backend.batch_size` must be between 1 and 4096, not {size}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parquet(job: &Job) -> &ParquetOutput {
        match &job.output.params {
            OutputParams::Parquet(p) => p,
            OutputParams::Pgvector(_) => panic!("not a Parquet output"),
        }
    }

    const MINIMAL: &str = r#"
        [source]
        kind = "files"
        paths = ["docs"]
        [backend]
        kind = "local"
        [output]
        path = "out/docs.parquet"
    "#;

    #[test]
    fn defaults_fill_the_rest() {
        let job = parse(MINIMAL, "docs", &[]).unwrap();
        assert_eq!(job.name, "docs");
        assert_eq!(job.chunking, ChunkingConfig::default());
        assert_eq!(job.backend.shared.concurrency, 8);
        assert!(parquet(&job).include_text);
    }

    #[test]
    fn overrides_take_toml_or_plain_strings() {
        let job = parse(
            MINIMAL,
            "docs",
            &[
                "chunking.max_tokens=128".into(),
                "chunking.overlap_tokens=0".into(),
                "output.include_text=false".into(),
                "backend.model=my-model".into(),
                "source.paths=[\"a\", \"b\"]".into(),
            ],
        )
        .unwrap();
        assert_eq!(job.chunking.max_tokens, 128);
        assert!(!parquet(&job).include_text);
        assert_eq!(job.backend.shared.model.as_deref(), Some("my-model"));
        assert_eq!(
            job.source,
            SourceConfig::Files(FilesSource {
                paths: vec!["a".into(), "b".into()],
                ..FilesSource::default()
            })
        );
    }

    #[test]
    fn every_problem_is_reported_together() {
        let text = r#"
            name = "x"
            colour = "blue"
            [source]
            kind = "files"
            paths = ["docs"]
            glob = "*.md"
            [chunking]
            max_tokens = "many"
            [backend]
            kind = "local"
            concurrency = 0
            speed = 3
            [output]
            path = "out.parquet"
        "#;
        let problems = parse(text, "x", &["backend.typo=1".into()]).unwrap_err();
        let all = problems.join("\n");
        for needle in [
            "`colour`",
            "`source.glob`",
            "`chunking.max_tokens`",
            "`backend.speed`",
            "`backend.typo`",
        ] {
            assert!(all.contains(needle), "{needle} missing from:\n{all}");
        }
    }

    #[test]
    fn semantic_problems_are_reported_together() {
        let problems = parse(
            MINIMAL,
            "docs",
            &[
                "chunking.overlap_tokens=600".into(),
                "backend.concurrency=0".into(),
                "backend.model=svc-embed-1".into(),
                "backend.dimensions=3072".into(),
                "source.path=x.jsonl".into(),
            ],
        )
        .unwrap_err();
        assert_eq!(problems.len(), 4, "{problems:#?}");
    }

    #[test]
    fn local_settings_are_checked_and_kept_to_local() {
        let job = parse(
            MINIMAL,
            "docs",
            &["backend.threads=2".into(), "backend.batch_size=16".into()],
        )
        .unwrap();
        let local = job.backend.local().unwrap();
        assert_eq!(local.threads, Some(2));
        assert_eq!(local.batch_size, Some(16));
        let defaults = parse(MINIMAL, "docs", &[]).unwrap();
        let local = defaults.backend.local().unwrap();
        assert_eq!((local.threads, local.batch_size), (None, None));

        let problems = parse(
            MINIMAL,
            "docs",
            &["backend.threads=0".into(), "backend.batch_size=0".into()],
        )
        .unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems[0].contains("`backend.threads`"), "{problems:?}");
        assert!(problems[1].contains("`backend.batch_size`"), "{problems:?}");

        let problems = parse(
            MINIMAL,
            "docs",
            &[
                "backend.kind=api".into(),
                "backend.base_url=http://127.0.0.1:9".into(),
                "backend.model=svc-embed-1".into(),
                "backend.api_key_env=PATH".into(),
                "backend.model_dir=models/m".into(),
                "backend.threads=2".into(),
                "backend.batch_size=8".into(),
            ],
        )
        .unwrap_err();
        for key in ["model_dir", "threads", "batch_size"] {
            let needle = format!("`backend.{key}` does not apply to kind \"api\"");
            assert!(
                problems.contains(&needle),
                "{needle} missing from {problems:#?}"
            );
        }
        assert_eq!(problems.len(), 3, "{problems:#?}");
    }

    const PGVECTOR: &str = r#"
        name = "docs index"
        [source]
        kind = "files"
        paths = ["docs"]
        [backend]
        kind = "local"
        [output]
        kind = "pgvector"
        url = "postgresql://embedjob@127.0.0.1:5432/search"
        table = "docs_chunks"
    "#;

    #[test]
    fn a_shard_writes_its_own_file_keeps_its_own_state_and_takes_its_part_of_the_limits() {
        let api = [
            "backend.kind=api".to_string(),
            "backend.base_url=http://127.0.0.1:9".to_string(),
            "backend.model=m".to_string(),
            "backend.api_key_env=PATH".to_string(),
            "backend.requests_per_minute=40".to_string(),
            "backend.tokens_per_minute=100000".to_string(),
            "budget.max_cost=2.0".to_string(),
        ];
        let mut job = parse(MINIMAL, "docs", &api).unwrap();
        job.split(Shard::new(1, 4).unwrap()).unwrap();
        assert_eq!(
            parquet(&job).path,
            Path::new("out/docs.parquet/part-00001-of-00004.parquet")
        );
        assert_eq!(
            job.state_stem(),
            Path::new("out/docs.parquet.embedjob/part-00001-of-00004.parquet")
        );
        let api_params = job.backend.api().unwrap();
        assert_eq!(api_params.requests_per_minute, 10);
        assert_eq!(api_params.tokens_per_minute, 25_000);
        assert_eq!(job.budget.max_cost, Some(0.5));

        let mut job = parse(MINIMAL, "docs", &api).unwrap();
        let problems = job.split(Shard::new(0, 41).unwrap()).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("`backend.requests_per_minute` is 40"));

        let mut job = parse(PGVECTOR, "docs", &[]).unwrap();
        job.split(Shard::new(2, 4).unwrap()).unwrap();
        assert_eq!(
            job.state_stem(),
            Path::new(".embedjob/docs_index.docs_chunks.part-00002-of-00004")
        );
    }

    #[test]
    fn a_pgvector_output_takes_its_keys_and_names_its_state_after_job_and_table() {
        let job = parse(PGVECTOR, "docs", &["output.index=hnsw".into()]).unwrap();
        let OutputParams::Pgvector(pg) = &job.output.params else {
            panic!("not a pgvector output");
        };
        assert_eq!(pg.index, VectorIndex::Hnsw);
        assert_eq!(pg.password_env, None);
        assert_eq!(
            job.output.state_stem(&job.name),
            Path::new(".embedjob/docs_index.docs_chunks")
        );
        let problems = parse(PGVECTOR, "docs", &["output.path=x".into()]).unwrap_err();
        assert_eq!(
            problems,
            ["`output.path` does not apply to kind \"pgvector\""],
            "{problems:#?}"
        );
        let problems = parse(PGVECTOR, "docs", &["output.index=ivf".into()]).unwrap_err();
        assert!(problems[0].contains("`output.index`"), "{problems:#?}");
    }

    #[test]
    fn a_pgvector_url_with_a_password_is_refused_without_quoting_it() {
        for url in [
            "postgresql://embedjob:hunter2secret@127.0.0.1/search",
            "postgresql://embedjob@127.0.0.1/search?password=hunter2secret",
        ] {
            let problems = parse(PGVECTOR, "docs", &[format!("output.url=\"{url}\"")]).unwrap_err();
            assert_eq!(problems.len(), 1, "{problems:#?}");
            assert!(problems[0].contains("holds a password (not shown)"));
            assert!(!problems[0].contains("hunter2secret"));
        }
        let problems = parse(
            PGVECTOR,
            "docs",
            &[
                "output.url=\"mysql://h/db\"".into(),
                "output.table=\"Docs-Chunks\"".into(),
                "output.password_env=EMBEDJOB_SURELY_UNSET_VARIABLE".into(),
            ],
        )
        .unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:#?}");
        let long = format!("output.table={}", "t".repeat(55));
        let problems = parse(PGVECTOR, "docs", &[long]).unwrap_err();
        assert!(problems[0].contains("too long"), "{problems:#?}");
        assert!(parse(PGVECTOR, "docs", &["output.table=search.docs_2".into()]).is_ok());
    }

    #[test]
    fn chunk_sizes_left_out_fit_the_window_and_the_request() {
        let job = parse(MINIMAL, "docs", &[]).unwrap();
        assert_eq!(job.chunk_sizes_set, ChunkSizesSet::default());
        let sizes = |job: &Job, window| {
            let c = job.chunking_for(window);
            (c.max_tokens, c.overlap_tokens)
        };
        assert_eq!(sizes(&job, None), (512, 50));
        assert_eq!(sizes(&job, Some(8192)), (512, 50));
        assert_eq!(sizes(&job, Some(254)), (254, 25));
        assert_eq!(sizes(&job, Some(128)), (128, 13));
        assert_eq!(sizes(&job, Some(1)), (1, 0));
        let capped = parse(
            MINIMAL,
            "docs",
            &["backend.max_tokens_per_request=300".into()],
        )
        .unwrap();
        assert_eq!(sizes(&capped, Some(8192)), (300, 29));
        // Sizes the job sets are kept, whatever the window (the run then refuses them).
        let set = parse(MINIMAL, "docs", &["chunking.max_tokens=400".into()]).unwrap();
        assert_eq!(sizes(&set, Some(254)), (400, 39));
        let overlap = parse(MINIMAL, "docs", &["chunking.overlap_tokens=10".into()]).unwrap();
        assert_eq!(sizes(&overlap, Some(254)), (254, 10));
        // Only a chunk size the job sets must fit the request limit at parse time.
        assert!(parse(
            MINIMAL,
            "docs",
            &["backend.max_tokens_per_request=300".into()]
        )
        .is_ok());
        assert!(parse(
            MINIMAL,
            "docs",
            &[
                "backend.max_tokens_per_request=300".into(),
                "chunking.max_tokens=400".into()
            ]
        )
        .is_err());
    }

    #[test]
    fn a_tokenizer_file_is_taken_from_the_job_files_directory_and_a_name_stays_a_name() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("jobs");
        std::fs::create_dir(&jobs).unwrap();
        let path = jobs.join("t.toml");
        let job_text = |tokenizer: &str| {
            format!(
                "[source]\nkind = \"files\"\npaths = [\"docs\"]\n[chunking]\ntokenizer = \"{tokenizer}\"\n\
                 [backend]\nkind = \"api\"\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"m\"\n\
                 api_key_env = \"PATH\"\n[output]\npath = \"out.parquet\"\n"
            )
        };
        std::fs::write(&path, job_text("../tok/tokenizer.json")).unwrap();
        let job = load(&path, &[]).unwrap();
        assert_eq!(
            job.chunking.tokenizer.as_deref().map(Path::new),
            Some(dir.path().join("tok/tokenizer.json").as_path())
        );
        std::fs::write(&path, job_text("o200k_base")).unwrap();
        let job = load(&path, &[]).unwrap();
        assert_eq!(job.chunking.tokenizer.as_deref(), Some("o200k_base"));
    }

    #[test]
    fn relative_paths_are_taken_from_the_job_files_directory() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("jobs");
        std::fs::create_dir(&jobs).unwrap();
        let path = jobs.join("docs.toml");
        std::fs::write(
            &path,
            "[source]\nkind = \"files\"\npaths = [\"../docs/**/*.md\", \"/abs/notes\"]\n\
             [backend]\nkind = \"local\"\nmodel_dir = \"models/m\"\n[output]\npath = \"out/docs.parquet\"\n",
        )
        .unwrap();
        let job = load(&path, &["output.path=../shared/x.parquet".into()]).unwrap();
        let SourceConfig::Files(files) = &job.source else {
            panic!("{:?}", job.source);
        };
        assert_eq!(
            files.paths,
            [
                format!("{}/docs/**/*.md", dir.path().display()),
                "/abs/notes".to_string()
            ]
        );
        assert_eq!(
            job.output.state_stem(&job.name),
            dir.path().join("shared/x.parquet")
        );
        assert_eq!(
            job.backend.local().unwrap().model_dir.as_deref(),
            Some(jobs.join("models/m").as_path())
        );
        // Stdin stays stdin.
        std::fs::write(
            &path,
            "[source]\nkind = \"jsonl\"\npath = \"-\"\ntext_field = \"t\"\n[backend]\nkind = \"local\"\n\
             [output]\npath = \"o.parquet\"\n",
        )
        .unwrap();
        let job = load(&path, &[]).unwrap();
        assert!(job.source.is_stdin());
        assert_eq!(job.source.describe(), "<stdin>");
    }

    #[test]
    fn source_keys_of_the_new_kinds_are_checked() {
        let records = "[source]\nkind = \"jsonl\"\npath = \"x.jsonl\"\ntext_field = \"text\"\n\
                       [backend]\nkind = \"local\"\n[output]\npath = \"o.parquet\"\n";
        let problems = parse(
            records,
            "x",
            &[
                "source.metadata_fields=[\"url\", \"meta..x\", \"embedding\", \"a.b\", \"a_b\"]"
                    .into(),
            ],
        )
        .unwrap_err();
        let all = problems.join("\n");
        assert_eq!(problems.len(), 3, "{all}");
        assert!(all.contains("\"meta..x\" is not a field name"), "{all}");
        assert!(
            all.contains("column \"embedding\", which the output already has"),
            "{all}"
        );
        assert!(
            all.contains("\"a.b\" and \"a_b\" would both be written as column \"a_b\""),
            "{all}"
        );
        let problems = parse(records, "x", &["source.include=[\"*.md\"]".into()]).unwrap_err();
        assert_eq!(
            problems,
            ["`source.include` does not apply to kind \"jsonl\""]
        );
        let problems = parse(MINIMAL, "x", &["source.on_invalid=ignore".into()]).unwrap_err();
        assert!(
            problems[0].contains("`source.on_invalid`")
                && problems[0].contains("`skip` or `error`"),
            "{problems:?}"
        );
        let problems = parse(MINIMAL, "x", &["source.include=[\"[\"]".into()]).unwrap_err();
        assert!(problems[0].contains("not a valid glob"), "{problems:?}");
        let job = parse(MINIMAL, "x", &["source.on_invalid=error".into()]).unwrap();
        let SourceConfig::Files(files) = &job.source else {
            panic!()
        };
        assert_eq!(files.on_invalid, OnInvalid::Error);
    }

    #[test]
    fn missing_sections_and_bad_toml() {
        let problems = parse("name = \"x\"", "x", &[]).unwrap_err();
        assert!(problems.iter().any(|p| p.contains("[source]")));
        assert!(problems.iter().any(|p| p.contains("[output]")));
        let problems = parse("name = ", "x", &[]).unwrap_err();
        assert!(problems[0].starts_with("not valid TOML"), "{problems:?}");
        let problems = parse(MINIMAL, "x", &["novalue".into()]).unwrap_err();
        assert!(problems[0].contains("KEY=VALUE"));
    }
}
