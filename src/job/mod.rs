//! The job file: its shape, `--set` overrides, and validation that reports
//! every problem at once.
//!
//! Keys are snake_case with unit suffixes. Unknown keys are errors: they are
//! collected by `serde_ignored` rather than `deny_unknown_fields`, which would
//! stop at the first one. `[source]`, `[backend]` and `[output]` hold one
//! kind's parameters each (see [`params`]). Relative paths are taken from the
//! directory the command runs in.

mod params;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::validate::known_model_dimensions;

use self::params::{one_line, Parsed};
pub use self::params::{
    ApiParams, BackendConfig, BackendKind, BackendParams, BackendShared, FilesSource, LocalParams,
    OutputConfig, OutputKind, OutputParams, ParquetOutput, RecordsSource, SourceConfig, SourceKind,
    DEFAULT_API_KEY_ENV,
};

#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub name: String,
    pub source: SourceConfig,
    pub chunking: ChunkingConfig,
    pub backend: BackendConfig,
    pub output: OutputConfig,
    pub pipeline: PipelineConfig,
    pub budget: BudgetConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChunkingConfig {
    pub max_tokens: usize,
    pub overlap_tokens: usize,
    /// Split along markdown structure: `true`, `false`, or absent to decide
    /// by file extension (`.md`, `.markdown`).
    pub markdown: Option<bool>,
}

impl Default for ChunkingConfig {
    fn default() -> Self {
        ChunkingConfig {
            max_tokens: 512,
            overlap_tokens: 50,
            markdown: None,
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
    /// The most one run may cost, in the currency of the model's
    /// `pricing.input_per_1k`; unset, no cap.
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

/// Reads, overrides and validates a job file.
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
    parse(&text, &default_name, overrides).map_err(fail)
}

/// Parses job-file text with overrides applied; `default_name` names a job that doesn't.
pub fn parse(text: &str, default_name: &str, overrides: &[String]) -> Result<Job, Vec<String>> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| vec![toml_error(&e)])?;
    let mut problems = Vec::new();
    for assignment in overrides {
        if let Err(problem) = apply_override(&mut table, assignment) {
            problems.push(problem);
        }
    }
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
        backend_problems(backend, chunking.as_ref(), &mut p);
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
            })
        }
        _ => Err(problems),
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

fn toml_error(e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => format!(
            "not valid TOML at byte {}: {}",
            span.start,
            one_line(e.message())
        ),
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
            if known != declared {
                p.push(format!(
                    "`backend.dimensions` is {declared} but model {model} returns vectors of length {known}"
                ));
            }
        }
    }
    match &backend.params {
        BackendParams::Api(api) => api_problems(b, api, p),
        BackendParams::Local(local) => local_problems(local, p),
    }
}

impl Job {
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
        f
    }
}

fn api_problems(b: &BackendShared, api: &ApiParams, p: &mut Vec<String>) {
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
                paths: vec!["a".into(), "b".into()]
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
