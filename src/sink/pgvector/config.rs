//! `kind = "pgvector"`: its parameters and their checks, read in every
//! build; the check of its index against the model's vectors, its state's
//! name, how it opens and how its table is searched (cargo feature
//! `pgvector`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::exit::Failure;
use crate::job::{KindTable, OutputParams, Shard};
use crate::query::Found;
use crate::sink::{params_of, Sink, SinkError, SinkKind};

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

pub struct Kind;

impl crate::job::Kind<dyn OutputParams> for Kind {
    fn name(&self) -> &'static str {
        "pgvector"
    }

    fn keys(&self) -> &'static [&'static str] {
        &["url", "password_env", "table", "index", "state_dir"]
    }

    fn parse(&self, table: &mut KindTable<'_>) -> Option<Box<dyn OutputParams>> {
        let params: PgvectorOutput = table.deserialize()?;
        Some(Box::new(params))
    }
}

impl SinkKind for Kind {
    /// Connects, so that a wrong address or password is found before any work.
    fn open<'a>(
        &'a self,
        params: &'a dyn OutputParams,
        shard: Option<Shard>,
    ) -> BoxFuture<'a, Result<Box<dyn Sink>, SinkError>> {
        Box::pin(async move {
            let params: &PgvectorOutput = params_of(params)?;
            open(params, shard).await
        })
    }

    /// pgvector's HNSW index holds vectors of at most 2000 dimensions; when
    /// the model's are known to be longer, the job is refused before any work.
    fn check(
        &self,
        params: &dyn OutputParams,
        dimensions: Option<usize>,
        model: &str,
    ) -> Result<(), SinkError> {
        let pg: &PgvectorOutput = params_of(params)?;
        match dimensions {
            Some(d) if pg.index == VectorIndex::Hnsw && d > HNSW_MAX_DIMENSIONS => {
                Err(SinkError::Refused(format!(
                    "`output.index = \"hnsw\"`: pgvector indexes vectors of at most \
                     {HNSW_MAX_DIMENSIONS} dimensions, model {model} makes {d}; set \
                     `output.index = \"none\"` (exact search)"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The job's keys in the table's metadata table.
    fn recorded<'a>(
        &'a self,
        params: &'a dyn OutputParams,
        shard: Option<Shard>,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, SinkError>> {
        Box::pin(async move {
            let pg: &PgvectorOutput = params_of(params)?;
            recorded(pg, shard).await
        })
    }

    fn search<'a>(
        &'a self,
        params: &'a dyn OutputParams,
        vector: Vec<f32>,
        model: &'a str,
        k: usize,
    ) -> BoxFuture<'a, Result<Found, Failure>> {
        Box::pin(async move {
            let pg: &PgvectorOutput = params_of(params).map_err(crate::sink::failure)?;
            search(pg, vector, model, k).await
        })
    }
}

#[cfg(feature = "pgvector")]
async fn open(params: &PgvectorOutput, shard: Option<Shard>) -> Result<Box<dyn Sink>, SinkError> {
    Ok(Box::new(super::PgvectorSink::open(params, shard).await?))
}

#[cfg(not(feature = "pgvector"))]
async fn open(_params: &PgvectorOutput, _shard: Option<Shard>) -> Result<Box<dyn Sink>, SinkError> {
    Err(SinkError::NotBuilt("pgvector"))
}

#[cfg(feature = "pgvector")]
async fn recorded(
    pg: &PgvectorOutput,
    shard: Option<Shard>,
) -> Result<BTreeMap<String, String>, SinkError> {
    Ok(super::recorded(pg, shard).await?)
}

#[cfg(not(feature = "pgvector"))]
async fn recorded(
    _pg: &PgvectorOutput,
    _shard: Option<Shard>,
) -> Result<BTreeMap<String, String>, SinkError> {
    Err(SinkError::NotBuilt("pgvector"))
}

/// The nearest rows of the table, after checking the model that made them.
#[cfg(feature = "pgvector")]
async fn search(
    pg: &PgvectorOutput,
    vector: Vec<f32>,
    model: &str,
    k: usize,
) -> Result<Found, Failure> {
    let (metadata, found) = super::search(pg, &vector, k)
        .await
        .map_err(|e| crate::sink::failure(e.into()))?;
    crate::query::check_model(
        &format!("table {}", pg.table),
        &metadata,
        model,
        vector.len(),
    )
    .map_err(crate::sink::query_failure)?;
    Ok(found)
}

#[cfg(not(feature = "pgvector"))]
async fn search(
    _pg: &PgvectorOutput,
    _vector: Vec<f32>,
    _model: &str,
    _k: usize,
) -> Result<Found, Failure> {
    Err(crate::sink::failure(SinkError::NotBuilt("pgvector")))
}

impl PgvectorOutput {
    /// `(schema, name)`: the schema is `None` when the table is not qualified.
    pub fn table_parts(&self) -> (Option<&str>, &str) {
        match self.table.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, self.table.as_str()),
        }
    }
}

impl OutputParams for PgvectorOutput {
    fn kind(&self) -> &'static str {
        "pgvector"
    }

    fn clone_box(&self) -> Box<dyn OutputParams> {
        Box::new(self.clone())
    }

    fn resolve_paths(&mut self, base: &Path) {
        self.state_dir = crate::job::paths::relative_to(base, &self.state_dir);
    }

    fn problems(&self, p: &mut Vec<String>) {
        url_problems(&self.url, p);
        match &self.password_env {
            Some(name) if name.is_empty() => {
                p.push("`output.password_env` must name an environment variable".to_string());
            }
            Some(name) => match std::env::var(name) {
                // Registered as soon as it is read: a server may echo it.
                Ok(password) if !password.is_empty() => crate::secret::register(&password),
                _ => p.push(format!(
                    "the database password is missing: set the environment variable {name} \
                     (named by `output.password_env`)"
                )),
            },
            None => {}
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

    /// `<state_dir>/<job>.<table>`, and a shard's with its name after it.
    fn state_stem(&self, job_name: &str, shard: Option<Shard>) -> PathBuf {
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
        let stem = self.state_dir.join(format!("{name}.{}", self.table));
        match shard {
            None => stem,
            Some(shard) => crate::fsio::with_suffix(&stem, &format!(".{}", shard.name())),
        }
    }
}

/// A database URL must be a `postgresql://` URL that holds no password:
/// the password comes from `output.password_env`. Nothing of the URL is
/// quoted back, so that a password typed into it is not shown either.
fn url_problems(url: &str, p: &mut Vec<String>) {
    // The user name of a database URL is no secret; a password or a
    // credential parameter in it is, and is refused below.
    let credentials = crate::secret::UrlCredentials::of(url);
    credentials.register(false);
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
    // This build connects without TLS: a mode that demands it would fail
    // later as an "invalid connection string" or a refused handshake.
    for (key, value) in parsed.query_pairs() {
        if key != "sslmode" {
            continue;
        }
        match value.as_ref() {
            "disable" | "prefer" => {}
            "allow" | "require" | "verify-ca" | "verify-full" => p.push(format!(
                "`output.url` sets sslmode={value}, which needs TLS, and TLS is not supported \
                 by this build: use sslmode=disable or prefer, or reach the database \
                 through a local TLS tunnel"
            )),
            _ => p.push(
                "`output.url` sets an unknown sslmode: use sslmode=disable or prefer \
                 (TLS is not supported by this build)"
                    .to_string(),
            ),
        }
    }
    if credentials.any(false) {
        p.push(
            "`output.url` holds a password (not shown): remove it and put it in the \
             environment variable named by `output.password_env`"
                .to_string(),
        );
    }
}
