//! The database of a pgvector output: connecting with the password from the
//! environment, the pgvector extension, the names of the table and its
//! metadata table, and the layout the table must have.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::{Client, GenericClient, NoTls};

use super::PgError;
use super::{PgvectorOutput, METADATA_TABLE_SUFFIX};
use crate::contract::{ColumnType, COLUMNS, EMBEDDING, SCHEMA_VERSION_KEY};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach the database; never shows the password.
pub(crate) struct Database {
    config: tokio_postgres::Config,
    /// `host:port/database`, for messages.
    pub place: String,
    user: String,
    password_env: Option<String>,
}

impl Database {
    /// Reads `output.url` and the password from `output.password_env`.
    pub fn new(params: &PgvectorOutput) -> Result<Database, PgError> {
        // The job checks refuse a URL with a password before this; so no
        // message here quotes the URL.
        let mut config = tokio_postgres::Config::from_str(&params.url)
            .map_err(|e| PgError::Url(format!("not a usable PostgreSQL URL: {e}")))?;
        if config.get_password().is_some() {
            return Err(PgError::Url(
                "holds a password (not shown): remove it and put it in the environment \
                 variable named by `output.password_env`"
                    .to_string(),
            ));
        }
        let password = match &params.password_env {
            Some(name) => match std::env::var(name) {
                Ok(value) if !value.is_empty() => Some(value),
                _ => {
                    return Err(PgError::Url(format!(
                        "the database password is missing: set the environment variable \
                         {name} (named by `output.password_env`)"
                    )))
                }
            },
            None => None,
        };
        if let Some(password) = &password {
            // Scrubbed, in every form, from whatever the program writes.
            crate::secret::register(password);
            config.password(password.as_bytes());
        }
        config
            .connect_timeout(CONNECT_TIMEOUT)
            .application_name("embedjob");
        let user = config
            .get_user()
            .map(str::to_string)
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_default();
        let place = place(&config);
        Ok(Database {
            config,
            place,
            user,
            password_env: params.password_env.clone(),
        })
    }

    /// A new connection, served by a task on the current runtime.
    pub async fn connect(&self) -> Result<Client, PgError> {
        let (client, connection) = self
            .config
            .connect(NoTls)
            .await
            .map_err(|e| self.connect_error(&e))?;
        tokio::spawn(async move {
            // Its errors reach the client as a closed connection.
            let _ = connection.await;
        });
        Ok(client)
    }

    fn connect_error(&self, e: &tokio_postgres::Error) -> PgError {
        let message = self.describe(e);
        let place = self.place.clone();
        if let Some(db) = e.as_db_error() {
            let code = db.code().code();
            // 28P01 invalid_password, 28000 invalid_authorization_specification.
            let hint = if code.starts_with("28") {
                match &self.password_env {
                    Some(name) => format!(" (the password is read from {name})"),
                    None => {
                        " (no `output.password_env` is set, so no password was sent)".to_string()
                    }
                }
            } else {
                String::new()
            };
            return PgError::Refused {
                place,
                user: self.user.clone(),
                message: format!("{message}{hint}"),
            };
        }
        if message.contains("password missing") {
            return PgError::Refused {
                place,
                user: self.user.clone(),
                message: "the server asks for a password: name the environment variable \
                          that holds it in `output.password_env`"
                    .to_string(),
            };
        }
        if message.starts_with("invalid") || message.starts_with("authentication") {
            return PgError::Refused {
                place,
                user: self.user.clone(),
                message,
            };
        }
        PgError::Unreachable { place, message }
    }

    /// An error's message and causes, with the password scrubbed.
    pub fn describe(&self, e: &tokio_postgres::Error) -> String {
        let text = match e.as_db_error() {
            Some(db) => {
                let mut text = db.message().to_string();
                if let Some(detail) = db.detail() {
                    text.push_str(&format!(" ({detail})"));
                }
                if let Some(hint) = db.hint() {
                    text.push_str(&format!("; {hint}"));
                }
                text
            }
            None => {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(e);
                while let Some(cause) = source {
                    let cause = cause.to_string();
                    if !text.contains(&cause) {
                        text.push_str(": ");
                        text.push_str(&cause);
                    }
                    source = cause_of(source);
                }
                text
            }
        };
        // The password is registered (`Database::new`): any form of it, or a
        // piece of one, a server or proxy echoed is removed here too.
        crate::secret::scrub(&text).into_owned()
    }
}

fn cause_of<'a>(
    e: Option<&'a (dyn std::error::Error + 'static)>,
) -> Option<&'a (dyn std::error::Error + 'static)> {
    e.and_then(std::error::Error::source)
}

/// `host:port/database`, without the user or anything secret.
fn place(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = config
        .get_dbname()
        .or_else(|| config.get_user())
        .unwrap_or("");
    format!("{host}:{port}/{database}")
}

/// The table of a pgvector output and the names around it, quoted for SQL.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    schema: Option<String>,
    name: String,
}

impl Names {
    pub fn new(params: &PgvectorOutput) -> Names {
        let (schema, name) = params.table_parts();
        Names::of(schema, name)
    }

    pub fn of(schema: Option<&str>, name: &str) -> Names {
        Names {
            schema: schema.map(str::to_string),
            name: name.to_string(),
        }
    }

    fn qualified(&self, name: &str) -> String {
        match &self.schema {
            Some(schema) => format!("{}.{}", quote(schema), quote(name)),
            None => quote(name),
        }
    }

    /// The table, for SQL.
    pub fn table(&self) -> String {
        self.qualified(&self.name)
    }

    /// The metadata table beside it, for SQL.
    pub fn metadata(&self) -> String {
        self.qualified(&format!("{}{METADATA_TABLE_SUFFIX}", self.name))
    }

    /// The HNSW index's name (unqualified: an index lives in its table's schema).
    pub fn index(&self) -> String {
        quote(&format!("{}_hnsw", self.name))
    }

    /// The metadata table, for messages.
    pub fn metadata_display(&self) -> String {
        format!("{}{METADATA_TABLE_SUFFIX}", self.display())
    }

    /// The table, for messages.
    pub fn display(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}", self.name),
            None => self.name.clone(),
        }
    }

    /// A 64-bit key for the advisory lock that makes finishing runs on this
    /// table take turns.
    pub fn lock_key(&self) -> i64 {
        let hash = crate::types::content_hash(&format!("embedjob table {}", self.table()));
        let mut first = [0u8; 8];
        first.copy_from_slice(&hash[..8]);
        i64::from_be_bytes(first)
    }
}

/// The key of the advisory lock that runs finishing on `output.table`
/// (`schema.name` or `name`) take in turn, with `pg_advisory_xact_lock`: a
/// session holding it with `pg_advisory_lock` keeps every run on the table
/// from finishing until it lets go, as a maintenance window may.
pub fn finishing_lock_key(table: &str) -> i64 {
    let names = match table.split_once('.') {
        Some((schema, name)) => Names::of(Some(schema), name),
        None => Names::of(None, table),
    };
    names.lock_key()
}

pub(crate) fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// The pgvector extension in a database: the schema that holds its type
/// and operators, and its version.
#[derive(Debug, Clone)]
pub(crate) struct Extension {
    /// Quoted, to qualify `vector`, `vector_cosine_ops` and `<=>`.
    pub schema: String,
    pub version: String,
}

impl Extension {
    /// The `vector(dimensions)` type, qualified.
    pub fn vector(&self, dimensions: usize) -> String {
        format!("{}.vector({dimensions})", self.schema)
    }

    /// The cosine distance operator, qualified.
    pub fn cosine_distance(&self) -> String {
        format!("OPERATOR({}.<=>)", self.schema)
    }

    /// Whether this version has HNSW indexes (0.5.0 and later).
    pub fn has_hnsw(&self) -> bool {
        let mut parts = self
            .version
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) >= (0, 5)
    }
}

/// Finds the pgvector extension, creating it when it is available but not
/// yet created in this database.
pub(crate) async fn extension(db: &Database, client: &Client) -> Result<Extension, PgError> {
    if let Some(found) = find_extension(db, client).await? {
        return Ok(found);
    }
    if let Err(e) = client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS vector")
        .await
    {
        // Runs starting at once (the shards of a job) race to create it: one wins.
        if let Some(found) = find_extension(db, client).await? {
            return Ok(found);
        }
        return Err(PgError::Extension {
            place: db.place.clone(),
            message: format!(
                "it is not created in this database, and `CREATE EXTENSION vector` failed: {}",
                db.describe(&e)
            ),
        });
    }
    find_extension(db, client)
        .await?
        .ok_or_else(|| PgError::Extension {
            place: db.place.clone(),
            message: "`CREATE EXTENSION vector` succeeded but the extension is not listed"
                .to_string(),
        })
}

async fn find_extension(db: &Database, client: &Client) -> Result<Option<Extension>, PgError> {
    let row = client
        .query_opt(
            "SELECT n.nspname::text, e.extversion::text FROM pg_extension e \
             JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'",
            &[],
        )
        .await
        .map_err(|e| PgError::Unreachable {
            place: db.place.clone(),
            message: db.describe(&e),
        })?;
    Ok(row.map(|row| Extension {
        schema: quote(row.get::<_, &str>(0)),
        version: row.get::<_, String>(1),
    }))
}

/// What is known of an existing output table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub dimensions: usize,
    pub has_index: bool,
}

/// The table's layout, or `None` when there is no table yet. A table that
/// is not in the output's layout, or has no metadata table beside it, is
/// refused: it is not embedjob's to change.
pub(crate) async fn layout(
    db: &Database,
    client: &impl GenericClient,
    names: &Names,
) -> Result<Option<Layout>, PgError> {
    let failed = |e: tokio_postgres::Error| PgError::Unreachable {
        place: db.place.clone(),
        message: db.describe(&e),
    };
    let row = client
        .query_one(
            "SELECT to_regclass($1)::oid, to_regclass($2)::oid",
            &[&names.table(), &names.metadata()],
        )
        .await
        .map_err(failed)?;
    let (table, metadata): (Option<u32>, Option<u32>) = (row.get(0), row.get(1));
    let Some(table) = table else {
        return Ok(None);
    };
    let refuse = |message: String| PgError::Layout {
        table: names.display(),
        message,
    };
    if metadata.is_none() {
        return Err(refuse(format!(
            "the table exists but was not made by embedjob (there is no {}{METADATA_TABLE_SUFFIX} \
             beside it); choose another `output.table`",
            names.display()
        )));
    }
    let rows = client
        .query(
            "SELECT a.attname::text, t.typname::text, a.atttypmod FROM pg_attribute a \
             JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped",
            &[&table],
        )
        .await
        .map_err(failed)?;
    let found: BTreeMap<String, (String, i32)> = rows
        .iter()
        .map(|r| {
            (
                r.get::<_, String>(0),
                (r.get::<_, String>(1), r.get::<_, i32>(2)),
            )
        })
        .collect();
    let mut dimensions = 0;
    for column in COLUMNS {
        let kind = standard_sql(column.column_type);
        let expected = match kind {
            "text" => "text",
            "bigint" => "int8",
            _ => "vector",
        };
        let column = column.name;
        match found.get(column) {
            Some((actual, modifier)) if actual == expected => {
                if column == EMBEDDING {
                    dimensions = usize::try_from(*modifier).unwrap_or(0);
                }
            }
            Some((actual, _)) => {
                return Err(refuse(format!(
                    "column {column} is {actual}, not {kind} as embedjob writes it"
                )))
            }
            None => {
                return Err(refuse(format!(
                    "has no column {column}: not a table in embedjob's layout"
                )))
            }
        }
    }
    let has_index = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&index_regclass(names)],
        )
        .await
        .map_err(failed)?
        .get::<_, bool>(0);
    Ok(Some(Layout {
        dimensions,
        has_index,
    }))
}

/// The index's name as `to_regclass` takes it: qualified like its table.
fn index_regclass(names: &Names) -> String {
    match &names.schema {
        Some(schema) => format!("{}.{}", quote(schema), names.index()),
        None => names.index(),
    }
}

/// The table's columns and their types, as `format_type` spells them;
/// `None` when there is no table.
pub(crate) async fn table_columns(
    db: &Database,
    client: &impl GenericClient,
    names: &Names,
) -> Result<Option<BTreeMap<String, String>>, PgError> {
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
            &[&names.table()],
        )
        .await
        .map_err(|e| PgError::Query {
            table: names.display(),
            action: "cannot read the table's columns",
            message: db.describe(&e),
        })?;
    Ok((!rows.is_empty()).then(|| {
        rows.iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect()
    }))
}

/// The metadata table's keys and values; empty when it does not exist.
pub(crate) async fn read_metadata(
    db: &Database,
    client: &impl GenericClient,
    names: &Names,
) -> Result<BTreeMap<String, String>, PgError> {
    let failed = |e: tokio_postgres::Error| PgError::Query {
        table: names.display(),
        action: "cannot read the metadata",
        message: db.describe(&e),
    };
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&names.metadata()])
        .await
        .map_err(failed)?
        .get(0);
    if !exists {
        return Ok(BTreeMap::new());
    }
    // Only a table embedjob made is read or written: exactly its two columns,
    // and the schema version it writes in the transaction that creates it.
    let columns: Vec<(String, String)> = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&names.metadata()],
        )
        .await
        .map_err(failed)?
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect();
    let ours = [("key", "text"), ("value", "text")];
    let shaped = columns.len() == ours.len()
        && columns
            .iter()
            .zip(ours)
            .all(|((n, t), (on, ot))| n == on && t == ot);
    let rows = if shaped {
        client
            .query(&format!("SELECT key, value FROM {}", names.metadata()), &[])
            .await
            .map_err(failed)?
    } else {
        Vec::new()
    };
    let keys: BTreeMap<String, String> = rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect();
    let marked = keys
        .keys()
        .any(|k| k == SCHEMA_VERSION_KEY || k.ends_with(&format!(":{SCHEMA_VERSION_KEY}")));
    if !shaped || !marked {
        return Err(PgError::Foreign {
            table: names.display(),
            metadata: names.metadata_display(),
        });
    }
    Ok(keys)
}

/// The SQL type of a standard column (the vector's is the extension's).
pub(crate) fn standard_sql(column_type: ColumnType) -> &'static str {
    match column_type {
        ColumnType::Utf8 => "text",
        // PostgreSQL has no unsigned integers: one size up.
        ColumnType::UInt32 | ColumnType::UInt64 => "bigint",
        ColumnType::Vector => "vector",
    }
}
