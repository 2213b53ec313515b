//! `[source]`, `[backend]` and `[output]`: sections that hold one kind's
//! parameters.
//!
//! A section's `kind` is read first and looked up among the kinds its
//! stage registers (see [`Kinds`]); that kind then reads the rest of the
//! section into its own parameters (a [`Kind`] in the kind's own folder),
//! and the job keeps them behind [`SourceParams`], [`BackendParams`] or
//! [`OutputParams`]. This module knows no kind by name: a key that belongs
//! to another registered kind is reported as not applying to this one, and
//! any other unknown key as unknown. `#[serde(tag = "kind")]` is not used:
//! through it `serde_ignored` would not see the unknown keys inside.

use std::any::Any;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::{ChunkingConfig, Shard};

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
    let read = read::<T>(section, table);
    (read.value, read.unknown, read.problems)
}

/// What [`deserialize`] found: the value, the unknown keys, every problem,
/// and among them each key of the wrong type with its problem.
struct Read<T> {
    value: Option<T>,
    unknown: Vec<String>,
    problems: Vec<String>,
    wrong_types: Vec<(String, String)>,
}

fn read<T: DeserializeOwned>(section: &str, table: &toml::Table) -> Read<T> {
    let mut table = table.clone();
    let mut problems = Vec::new();
    let mut wrong_types: Vec<(String, String)> = Vec::new();
    loop {
        let (result, unknown) = deserialize_once::<T>(toml::Value::Table(table.clone()));
        let e = match result {
            Ok(value) => {
                return Read {
                    value: problems.is_empty().then_some(value),
                    unknown,
                    problems,
                    wrong_types,
                }
            }
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
            (Some(field), _) if at == "." && wrong_types.iter().any(|(k, _)| k == field) => {}
            (Some(field), _) if at == "." => {
                problems.push(format!("`{section}.{field}` is required"))
            }
            (_, Some(key)) if table.remove(&key).is_some() => {
                let problem = format!("`{section}.{at}`: {inner}");
                problems.push(problem.clone());
                wrong_types.push((key, problem));
                continue;
            }
            _ if at == "." => problems.push(format!("`{section}`: {inner}")),
            _ => problems.push(format!("`{section}.{at}`: {inner}")),
        }
        return Read {
            value: None,
            unknown,
            problems,
            wrong_types,
        };
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

// ---------------------------------------------------------------- kinds

/// One kind of a section, as its stage registers it: its name, its keys,
/// and how it reads its parameters. `P` is the section's parameters
/// (`dyn SourceParams`, `dyn BackendParams` or `dyn OutputParams`).
pub trait Kind<P: ?Sized>: Sync {
    /// The section's `kind` that names it.
    fn name(&self) -> &'static str;
    /// Its own keys, so that another kind can tell them from unknown ones.
    fn keys(&self) -> &'static [&'static str];
    /// Reads the section (less `kind`), reporting its problems in `table`.
    fn parse(&self, table: &mut KindTable<'_>) -> Option<Box<P>>;
}

/// Every kind the stages register, in the order their messages list them.
pub struct Kinds {
    pub source: Vec<&'static dyn Kind<dyn SourceParams>>,
    pub backend: Vec<&'static dyn Kind<dyn BackendParams>>,
    pub output: Vec<&'static dyn Kind<dyn OutputParams>>,
}

/// A section being read by its kind: the table, and the problems found.
pub struct KindTable<'a> {
    section: &'static str,
    kind: &'static str,
    table: &'a toml::Table,
    others: Vec<(&'static str, &'static [&'static str])>,
    /// For `[backend]`: the keys its shared part did not know. A key only
    /// one of the two parts knows is known.
    shared_unknown: Option<Vec<String>>,
    problems: Vec<String>,
    /// Set when the section's kind is not known (of the wrong type, not a
    /// kind there is): the section is read by every kind only to find its
    /// keys of the wrong type, each with its problem, and nothing else is
    /// reported.
    wrong_types: Option<Vec<(String, String)>>,
}

impl KindTable<'_> {
    /// `source`, `backend` or `output`.
    pub fn section(&self) -> &'static str {
        self.section
    }

    /// The kind reading the section.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Deserializes the section into `T`, reporting the keys of other kinds,
    /// the unknown keys and the keys of the wrong type.
    pub fn deserialize<T: DeserializeOwned>(&mut self) -> Option<T> {
        let read = read::<T>(self.section, self.table);
        if let Some(wrong) = self.wrong_types.as_mut() {
            wrong.extend(read.wrong_types);
            return read.value;
        }
        let (value, unknown, error) = (read.value, read.unknown, read.problems);
        match self.shared_unknown.take() {
            Some(shared) => {
                self.problems.extend(error);
                let unknown = unknown.into_iter().filter(|key| shared.contains(key));
                self.report_unknown(unknown);
            }
            None => {
                self.report_unknown(unknown);
                self.problems.extend(error);
            }
        }
        value
    }

    /// Adds a problem of the section.
    pub fn problem(&mut self, problem: String) {
        if self.wrong_types.is_none() {
            self.problems.push(problem);
        }
    }

    /// Reports each key no part of the section knew: as belonging to another
    /// kind when one of the others has it, else as unknown.
    fn report_unknown(&mut self, unknown: impl IntoIterator<Item = String>) {
        let (section, kind) = (self.section, self.kind);
        for key in unknown {
            let elsewhere = self
                .others
                .iter()
                .any(|(other, keys)| *other != kind && keys.contains(&key.as_str()));
            if elsewhere {
                self.problems.push(format!(
                    "`{section}.{key}` does not apply to kind \"{kind}\""
                ));
            } else {
                self.problems.push(format!("unknown key `{section}.{key}`"));
            }
        }
    }
}

/// Reads a kinded section: its `kind` (`default` when absent), then the
/// rest by that kind. `shared_unknown` as in [`KindTable`].
fn parse_kinded<P: ?Sized + 'static>(
    section: &'static str,
    table: &toml::Table,
    kind: &'static dyn Kind<P>,
    kinds: &[&'static dyn Kind<P>],
    shared_unknown: Option<Vec<String>>,
    problems: &mut Vec<String>,
) -> Option<Box<P>> {
    let mut read = KindTable {
        section,
        kind: kind.name(),
        table,
        others: kinds.iter().map(|k| (k.name(), k.keys())).collect(),
        shared_unknown,
        problems: Vec::new(),
        wrong_types: None,
    };
    let value = kind.parse(&mut read);
    problems.extend(read.problems);
    value
}

/// Reads a kinded section by `kind`; without one (its `kind` was refused),
/// still reports each key of the wrong type for every kind that has the
/// key, so that a bad `kind` hides no other problem.
fn parse_or_check<P: ?Sized + 'static>(
    section: &'static str,
    table: &toml::Table,
    kind: Option<&'static dyn Kind<P>>,
    kinds: &[&'static dyn Kind<P>],
    shared_unknown: Option<Vec<String>>,
    problems: &mut Vec<String>,
) -> Option<Box<P>> {
    if let Some(kind) = kind {
        return parse_kinded(section, table, kind, kinds, shared_unknown, problems);
    }
    // Each key with its first problem, and how many kinds found it wrong.
    let mut wrong: Vec<(String, String, usize)> = Vec::new();
    for &kind in kinds {
        let mut read = KindTable {
            section,
            kind: kind.name(),
            table,
            others: Vec::new(),
            shared_unknown: None,
            problems: Vec::new(),
            wrong_types: Some(Vec::new()),
        };
        let _ = kind.parse(&mut read);
        for (key, problem) in read.wrong_types.unwrap_or_default() {
            match wrong.iter_mut().find(|(k, _, _)| *k == key) {
                Some((_, _, count)) => *count += 1,
                None => wrong.push((key, problem, 1)),
            }
        }
    }
    // A key is reported once, when every kind that has it finds it wrong:
    // a value one of them would take may be meant for that one.
    for (key, problem, count) in wrong {
        let having = kinds
            .iter()
            .filter(|k| k.keys().contains(&key.as_str()))
            .count();
        if count >= having {
            problems.push(problem);
        }
    }
    None
}

/// `[source]`: its kind's parameters.
pub(super) fn parse_source(mut table: toml::Table, kinds: &Kinds) -> Parsed<Box<dyn SourceParams>> {
    let mut problems = Vec::new();
    let all = &kinds.source;
    let kind = take_kind("source", "SourceKind", &mut table, all, None, &mut problems);
    let value = parse_or_check("source", &table, kind, all, None, &mut problems);
    Parsed { value, problems }
}

/// `[backend]`: the shared keys, and its kind's own (`api` when absent).
pub(super) fn parse_backend(mut table: toml::Table, kinds: &Kinds) -> Parsed<BackendConfig> {
    let mut problems = Vec::new();
    let all = &kinds.backend;
    let kind = take_kind(
        "backend",
        "BackendKind",
        &mut table,
        all,
        Some("api"),
        &mut problems,
    );
    let (shared, unknown_shared, error) = deserialize::<BackendShared>("backend", &table);
    problems.extend(error);
    let params = parse_or_check(
        "backend",
        &table,
        kind,
        all,
        Some(unknown_shared),
        &mut problems,
    );
    let value = shared
        .zip(params)
        .map(|(shared, params)| BackendConfig { shared, params });
    Parsed { value, problems }
}

/// `[output]`: its kind's parameters (`parquet` when absent).
pub(super) fn parse_output(mut table: toml::Table, kinds: &Kinds) -> Parsed<Box<dyn OutputParams>> {
    let mut problems = Vec::new();
    let all = &kinds.output;
    let kind = take_kind(
        "output",
        "OutputKind",
        &mut table,
        all,
        Some("parquet"),
        &mut problems,
    );
    let value = parse_or_check("output", &table, kind, all, None, &mut problems);
    Parsed { value, problems }
}

/// Takes `kind` out of a section, defaulting to `default` when absent.
/// `type_name` is how serde would name the list of kinds, so that the
/// messages read as they always have.
fn take_kind<P: ?Sized + 'static>(
    section: &str,
    type_name: &'static str,
    table: &mut toml::Table,
    kinds: &[&'static dyn Kind<P>],
    default: Option<&str>,
    problems: &mut Vec<String>,
) -> Option<&'static dyn Kind<P>> {
    let find = |name: &str| kinds.iter().copied().find(|k| k.name() == name);
    match table.remove("kind") {
        None => {
            let kind = default.and_then(find);
            if kind.is_none() {
                problems.push(format!("`{section}.kind` is required"));
            }
            kind
        }
        Some(value) => {
            let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
            let visitor = KindVisitor {
                type_name,
                names: &names,
            };
            match serde::Deserializer::deserialize_enum(value, type_name, &[], visitor) {
                Ok(name) => find(&name),
                Err(e) => {
                    problems.push(format!("`{section}.kind`: {}", one_line(&e.to_string())));
                    None
                }
            }
        }
    }
}

/// Reads a kind's name as a unit variant among `names`, with serde's own
/// messages for a name that is not one.
struct KindVisitor<'n> {
    type_name: &'static str,
    names: &'n [&'n str],
}

impl<'de> serde::de::Visitor<'de> for KindVisitor<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "enum {}", self.type_name)
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<String, A::Error> {
        use serde::de::{Error, VariantAccess};
        let (name, variant): (String, _) = data.variant()?;
        if !self.names.contains(&name.as_str()) {
            return Err(A::Error::custom(unknown_variant(&name, self.names)));
        }
        variant.unit_variant()?;
        Ok(name)
    }
}

/// serde's message for an unknown variant.
fn unknown_variant(name: &str, names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.as_slice() {
        [] => format!("unknown variant `{name}`, there are no variants"),
        [one] => format!("unknown variant `{name}`, expected {one}"),
        [a, b] => format!("unknown variant `{name}`, expected {a} or {b}"),
        all => format!(
            "unknown variant `{name}`, expected one of {}",
            all.join(", ")
        ),
    }
}

/// What every kind's parameters can be asked, whatever their type.
pub trait Erased: Any + fmt::Debug + Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Whether `other` is parameters of the same type, equal to these.
    fn same_as(&self, other: &dyn Any) -> bool;
}

impl<T: Any + fmt::Debug + Send + Sync + PartialEq> Erased for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn same_as(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>().is_some_and(|other| other == self)
    }
}

// ---------------------------------------------------------------- source

/// One source kind's parameters (`[source]`), as its folder defines them.
pub trait SourceParams: Erased {
    fn kind(&self) -> &'static str;
    fn clone_box(&self) -> Box<dyn SourceParams>;
    /// Takes relative paths and globs from `base` (stdin stays stdin).
    fn resolve_paths(&mut self, base: &Path);
    /// The problems found once the whole job file is read.
    fn problems(&self, p: &mut Vec<String>);
    /// The input, for messages: its path, or its list of globs.
    fn describe(&self) -> String;
    /// Whether the input is stdin, which can be read only once.
    fn is_stdin(&self) -> bool {
        false
    }
}

/// `[source]`: one kind's parameters.
#[derive(Debug)]
pub struct SourceConfig {
    pub params: Box<dyn SourceParams>,
}

impl SourceConfig {
    pub fn new(params: impl SourceParams) -> Self {
        SourceConfig {
            params: Box::new(params),
        }
    }

    pub fn kind(&self) -> &'static str {
        self.params.kind()
    }

    /// The parameters, when they are of kind `T`.
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.params.as_any().downcast_ref()
    }

    pub fn describe(&self) -> String {
        self.params.describe()
    }

    pub fn is_stdin(&self) -> bool {
        self.params.is_stdin()
    }
}

impl Clone for SourceConfig {
    fn clone(&self) -> Self {
        SourceConfig {
            params: self.params.clone_box(),
        }
    }
}

impl PartialEq for SourceConfig {
    fn eq(&self, other: &Self) -> bool {
        self.params.same_as(other.params.as_any())
    }
}

// ---------------------------------------------------------------- backend

/// One backend kind's own parameters (`[backend]`, besides the shared keys).
pub trait BackendParams: Erased {
    fn kind(&self) -> &'static str;
    fn clone_box(&self) -> Box<dyn BackendParams>;
    /// Takes relative paths from `base`.
    fn resolve_paths(&mut self, _base: &Path) {}
    /// The problems found once the whole job file is read; `chunking` when
    /// the job sets `chunking.max_tokens`.
    fn problems(
        &self,
        shared: &BackendShared,
        chunking: Option<&ChunkingConfig>,
        p: &mut Vec<String>,
    );
    /// This kind's part of making the job one shard of `shard.count`.
    fn split(&mut self, _shard: Shard, _problems: &mut Vec<String>) {}
    /// The client-side limits on requests and tokens per minute (0: none),
    /// for a kind that sends requests to a service.
    fn per_minute_limits(&self) -> Option<(u32, u64)> {
        None
    }
}

/// `[backend]`: the keys every kind shares, and one kind's own.
#[derive(Debug)]
pub struct BackendConfig {
    pub shared: BackendShared,
    pub params: Box<dyn BackendParams>,
}

impl BackendConfig {
    pub fn kind(&self) -> &'static str {
        self.params.kind()
    }

    /// The kind's own keys, when they are of kind `T`.
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.params.as_any().downcast_ref()
    }
}

impl Clone for BackendConfig {
    fn clone(&self) -> Self {
        BackendConfig {
            shared: self.shared.clone(),
            params: self.params.clone_box(),
        }
    }
}

impl PartialEq for BackendConfig {
    fn eq(&self, other: &Self) -> bool {
        self.shared == other.shared && self.params.same_as(other.params.as_any())
    }
}

/// The keys of `[backend]` that every kind takes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct BackendShared {
    pub model: Option<String>,
    pub dimensions: Option<usize>,
    pub max_inputs_per_request: usize,
    pub max_tokens_per_request: usize,
    /// Requests in flight (api), or requests waiting for the model (local):
    /// a number, or `"auto"` to find it from the service's round-trip times.
    pub concurrency: Concurrency,
    /// The most requests in flight `"auto"` may reach.
    pub max_concurrency: usize,
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
            concurrency: Concurrency::Auto,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            timeout_seconds: 60.0,
        }
    }
}

/// `backend.max_concurrency` when the job does not set it.
pub const DEFAULT_MAX_CONCURRENCY: usize = 64;

/// `backend.concurrency`: a fixed number of requests, or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Concurrency {
    /// Found from the service's round-trip times, up to `backend.max_concurrency`.
    #[default]
    Auto,
    Fixed(usize),
}

impl BackendShared {
    /// The most requests in flight: the fixed number, or `auto`'s ceiling.
    pub fn most_in_flight(&self) -> usize {
        match self.concurrency {
            Concurrency::Auto => self.max_concurrency,
            Concurrency::Fixed(n) => n,
        }
    }
}

impl std::fmt::Display for Concurrency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Concurrency::Auto => f.write_str("auto"),
            Concurrency::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl<'de> Deserialize<'de> for Concurrency {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Concurrency;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number of requests or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Concurrency, E> {
                // Out of range numbers are reported by the job's checks.
                Ok(Concurrency::Fixed(usize::try_from(n).unwrap_or(usize::MAX)))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Concurrency, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(n), &self)),
                }
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Concurrency, E> {
                if text == "auto" {
                    Ok(Concurrency::Auto)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(text), &self))
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

// ---------------------------------------------------------------- output

/// One sink kind's parameters (`[output]`), as its folder defines them.
pub trait OutputParams: Erased {
    fn kind(&self) -> &'static str;
    fn clone_box(&self) -> Box<dyn OutputParams>;
    /// Takes a relative output path (or state folder) from `base`.
    fn resolve_paths(&mut self, base: &Path);
    /// The problems found once the whole job file is read.
    fn problems(&self, p: &mut Vec<String>);
    /// The path the state of job `job_name` (or of its `shard`) is named
    /// after (see `crate::state`).
    fn state_stem(&self, job_name: &str, shard: Option<Shard>) -> PathBuf;
    /// This kind's part of making the job one shard of `shard.count`.
    fn split(&mut self, _shard: Shard, _problems: &mut Vec<String>) {}
    /// The file the output is written to, for an output that is one file.
    fn output_file(&self) -> Option<&Path> {
        None
    }
    /// The size at which the output flushes a row group, when it has one.
    fn row_group_bytes(&self) -> Option<u64> {
        None
    }
    /// For a job not split whose output holds the outputs of a split job's
    /// shards: how many shards. An output that is neither is a problem.
    fn shards_held(&self) -> Result<Option<u32>, String> {
        Ok(None)
    }
}

/// `[output]`: one sink kind's parameters.
#[derive(Debug)]
pub struct OutputConfig {
    pub params: Box<dyn OutputParams>,
}

impl OutputConfig {
    pub fn kind(&self) -> &'static str {
        self.params.kind()
    }

    /// The parameters, when they are of kind `T`.
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.params.as_any().downcast_ref()
    }

    /// The path the job's state is named after (see `crate::state`): a
    /// Parquet output's own path; for a table, `<state_dir>/<job>.<table>`.
    pub fn state_stem(&self, job_name: &str) -> PathBuf {
        self.params.state_stem(job_name, None)
    }
}

impl Clone for OutputConfig {
    fn clone(&self) -> Self {
        OutputConfig {
            params: self.params.clone_box(),
        }
    }
}

impl PartialEq for OutputConfig {
    fn eq(&self, other: &Self) -> bool {
        self.params.same_as(other.params.as_any())
    }
}

#[cfg(test)]
mod tests {
    //! `job/` with kinds of its own, standing in for the stages' registries.

    use super::*;

    /// Kind "a" takes `x`; kind "b" takes `y`.
    #[derive(Debug, Clone, PartialEq, Deserialize)]
    struct A {
        x: u32,
    }

    #[derive(Debug, Clone, PartialEq, Deserialize)]
    struct B {
        #[serde(default)]
        y: u32,
    }

    struct Named<T>(
        &'static str,
        &'static [&'static str],
        std::marker::PhantomData<T>,
    );

    impl<T> Kind<dyn SourceParams> for Named<T>
    where
        T: SourceParams + DeserializeOwned + Sync,
    {
        fn name(&self) -> &'static str {
            self.0
        }
        fn keys(&self) -> &'static [&'static str] {
            self.1
        }
        fn parse(&self, table: &mut KindTable<'_>) -> Option<Box<dyn SourceParams>> {
            let params: T = table.deserialize()?;
            Some(Box::new(params))
        }
    }

    macro_rules! fake_source {
        ($t:ty, $name:literal) => {
            impl SourceParams for $t {
                fn kind(&self) -> &'static str {
                    $name
                }
                fn clone_box(&self) -> Box<dyn SourceParams> {
                    Box::new(self.clone())
                }
                fn resolve_paths(&mut self, _base: &Path) {}
                fn problems(&self, _p: &mut Vec<String>) {}
                fn describe(&self) -> String {
                    String::new()
                }
            }
        };
    }
    fake_source!(A, "a");
    fake_source!(B, "b");

    /// Kind "c" takes `x` too, as text.
    #[derive(Debug, Clone, PartialEq, Deserialize)]
    struct C {
        x: String,
    }
    fake_source!(C, "c");

    static KIND_A: Named<A> = Named("a", &["x"], std::marker::PhantomData);
    static KIND_C: Named<C> = Named("c", &["x"], std::marker::PhantomData);
    static KIND_B: Named<B> = Named("b", &["y"], std::marker::PhantomData);

    fn source(text: &str) -> Parsed<Box<dyn SourceParams>> {
        let kinds = Kinds {
            source: vec![&KIND_A, &KIND_B],
            backend: Vec::new(),
            output: Vec::new(),
        };
        parse_source(toml::from_str(text).unwrap(), &kinds)
    }

    #[test]
    fn a_section_is_read_by_the_kind_it_names_and_another_kinds_keys_are_told_apart() {
        let parsed = source("kind = \"a\"\nx = 1\n");
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        let a = parsed.value.unwrap();
        assert_eq!(a.as_any().downcast_ref::<A>(), Some(&A { x: 1 }));

        let parsed = source("kind = \"b\"\nx = 1\nz = 2\n");
        assert_eq!(
            parsed.problems,
            [
                "`source.x` does not apply to kind \"b\"",
                "unknown key `source.z`"
            ]
        );
        let parsed = source("kind = \"a\"\nx = \"one\"\n");
        assert_eq!(
            parsed.problems,
            ["`source.x`: invalid type: string \"one\", expected u32 in `x`"]
        );
        assert!(parsed.value.is_none());
        let parsed = source("kind = \"a\"\n");
        assert_eq!(parsed.problems, ["`source.x` is required"]);
        let parsed = source("kind = \"c\"\n");
        assert_eq!(
            parsed.problems,
            ["`source.kind`: unknown variant `c`, expected `a` or `b`"]
        );
        let parsed = source("x = 1\n");
        assert_eq!(parsed.problems, ["`source.kind` is required"]);
    }

    #[test]
    fn without_a_kind_a_key_is_of_the_wrong_type_only_when_every_kind_that_has_it_refuses_it() {
        let kinds = Kinds {
            source: vec![&KIND_A, &KIND_B, &KIND_C],
            backend: Vec::new(),
            output: Vec::new(),
        };
        let parse = |text: &str| parse_source(toml::from_str(text).unwrap(), &kinds).problems;
        // `c` would take it: it may be meant for `c`.
        assert_eq!(
            parse("kind = 1\nx = \"one\"\n"),
            ["`source.kind`: invalid type: unit variant, expected string only"]
        );
        // No kind takes it: named once, with the first kind's reason.
        assert_eq!(
            parse("kind = \"d\"\nx = true\ny = \"two\"\n"),
            [
                "`source.kind`: unknown variant `d`, expected one of `a`, `b`, `c`",
                "`source.x`: invalid type: boolean `true`, expected u32 in `x`",
                "`source.y`: invalid type: string \"two\", expected u32 in `y`",
            ]
        );
    }
}
