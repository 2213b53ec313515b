//! The pgvector sink: the output is a PostgreSQL table that stays in sync
//! with the input from one run to the next.
//!
//! ```text
//! docs_chunks             id (primary key), doc_id, chunk_index, source, byte_start,
//!                         byte_end, text, content_hash, token_count, embedding vector(dim),
//!                         then a typed column per `source.metadata_fields`
//! docs_chunks_embedjob    key, value: the run's model, dimensions, fingerprint, usage,
//!                         metadata columns
//! ```
//!
//! A run writes its rows with binary `COPY`, a batch at a time, into a
//! temporary table of its own session. [`Sink::finish`] then changes the
//! output table in one transaction: the rows of changed and deleted chunks
//! are deleted, the run's rows upserted by `id`, and the metadata replaced.
//! Until then the table is as the last finished run left it, so a run that
//! is killed changes nothing there; what it paid for is in the job's
//! checkpoint, and the next run carries on from it. Rows held unchanged are
//! never sent to the sink (see [`Sink::keeps_rows`]).
//!
//! A run whose metadata columns are not those the table's rows were written
//! with (a field added, removed or retyped) gives the table its columns and
//! writes all its rows again, with vectors reused, not paid for again.
//!
//! The shards of a job write one table together (see [`split`]): each
//! reads, replaces and deletes only the rows of its own documents, and
//! records its metadata under its own name.

mod columns;
mod config;
mod db;
mod rows;
mod search;
mod split;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::runtime::Handle;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Transaction};

use self::columns::{PgColumn, PgValue};
use self::db::{Database, Extension, Layout, Names};
use self::rows::TableRows;
use self::split::{Namespaces, Owner};
use super::{Sink, SinkError, SinkReport};
use crate::contract::{
    check_batch, standard_pairs, COLUMNS, COST_KEY, FINGERPRINT_KEY, GENERATION_KEY,
    METADATA_COLUMNS_KEY,
};
use crate::job::Shard;
use crate::store::StoredRows;
use crate::types::{EmbeddedBatch, MetadataSchema, OutputMetadata};
use crate::warnings::Warnings;

pub use self::config::{
    Kind, PgvectorOutput, VectorIndex, HNSW_MAX_DIMENSIONS, METADATA_TABLE_SUFFIX,
};
pub use self::split::rows_of as shard_condition;
pub use self::{
    db::finishing_lock_key,
    search::{recorded, search},
};

/// The temporary table a run stages its rows in.
const STAGING: &str = "pg_temp.embedjob_staging";
/// Rows are buffered up to this size (vectors and text) and copied in one
/// statement: fewer round trips, and a writer that is rarely busy, so that
/// the checkpoint is committed as answers arrive.
const COPY_BYTES: usize = 4 * 1024 * 1024;
/// Ids deleted per statement.
const DELETE_BATCH: usize = 10_000;

/// A problem with a pgvector output. Every variant names the database or
/// the table; none shows the password.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("`output.url`: {0}")]
    Url(String),
    #[error("cannot reach the database at {place}: {message}")]
    Unreachable { place: String, message: String },
    #[error("the database at {place} refused to let user {user:?} in: {message}")]
    Refused {
        place: String,
        user: String,
        message: String,
    },
    #[error(
        "the database at {place} has no pgvector extension: {message}; install pgvector on \
         the server, or have its owner run `CREATE EXTENSION vector` in this database"
    )]
    Extension { place: String, message: String },
    #[error("table {table}: {message}")]
    Layout { table: String, message: String },
    #[error("table {table}: {action}: {message}")]
    Query {
        table: String,
        action: &'static str,
        message: String,
    },
    #[error("table {table}: {message}")]
    Data { table: String, message: String },
    #[error(
        "table {table} was changed by another run since this run read it; run the job \
         again (what this run paid for is kept in its checkpoint)"
    )]
    Changed { table: String },
    #[error(
        "table {table}: {others} made {its} rows under another configuration than this \
         run's; run this one with --fresh to replace them (they then embed their documents \
         again), or run them under this configuration"
    )]
    Split {
        table: String,
        others: String,
        its: &'static str,
    },
    #[error(
        "table {table}: {metadata} was not made by embedjob (it lacks embedjob's columns \
         `key` and `value` or its `embedjob.schema_version` row), and embedjob changes nothing \
         it did not make; set `output.table` to another name"
    )]
    Foreign { table: String, metadata: String },
    #[error(
        "table {table} belongs to job {owner:?} (its `embedjob.job` in {table}_embedjob), \
         not to this job {job:?}; set `output.table` to another table, or run this job with \
         --fresh to take the table over (job {owner:?}'s rows are then removed)"
    )]
    Owned {
        table: String,
        owner: String,
        job: String,
    },
}

impl PgError {
    /// Problems of configuration, found before any work starts.
    pub fn is_found_before_work(&self) -> bool {
        matches!(
            self,
            PgError::Url(_)
                | PgError::Refused { .. }
                | PgError::Extension { .. }
                | PgError::Layout { .. }
                | PgError::Foreign { .. }
                | PgError::Owned { .. }
        )
    }
}

/// What `held` found, to tell at the end whether this run builds on the
/// table's rows (and removes what is gone) or replaces them.
#[derive(Debug, Clone)]
struct Basis {
    /// The generations that must not have changed when the run finishes.
    watched: BTreeMap<Owner, String>,
    fingerprint: Option<String>,
    /// The table's rows of this run's documents were written with other
    /// metadata columns: the run writes them all again.
    rewrite: bool,
}

/// The staging table, once the first batch has set the vector length.
struct Staging {
    dimensions: usize,
    types: Vec<Type>,
}

/// Writes a job's rows to a pgvector table (see the module's documentation).
pub struct PgvectorSink {
    db: Arc<Database>,
    names: Names,
    extension: Extension,
    index: VectorIndex,
    handle: Handle,
    client: Client,
    /// The table as it was when the sink was opened.
    layout: Option<Layout>,
    basis: Mutex<Option<Basis>>,
    staging: Option<Staging>,
    /// The input's metadata columns, and as the table holds them.
    metadata: Option<Arc<MetadataSchema>>,
    columns: Result<Vec<PgColumn>, String>,
    /// Batches not yet copied to the staging table, with their metadata
    /// values as the table takes them, and their size.
    pending: Vec<(EmbeddedBatch, Vec<Vec<PgValue>>)>,
    pending_bytes: usize,
    staged: u64,
    removals: Vec<String>,
    /// The shard whose rows this sink holds; `None`, all of them.
    shard: Owner,
    /// The job writing, and whether it takes the table over (`--fresh`).
    job: Option<String>,
    fresh: bool,
}

impl PgvectorSink {
    /// Connects, finds (or creates) the pgvector extension and checks the
    /// table, if there is one already: every problem of configuration is
    /// found here, before any work.
    pub async fn open(
        params: &PgvectorOutput,
        shard: Option<Shard>,
    ) -> Result<PgvectorSink, PgError> {
        let db = Arc::new(Database::new(params)?);
        let client = db.connect().await?;
        let extension = db::extension(&db, &client).await?;
        if params.index == VectorIndex::Hnsw && !extension.has_hnsw() {
            return Err(PgError::Extension {
                place: db.place.clone(),
                message: format!(
                    "its version {} has no HNSW index (0.5.0 or later has); set \
                     `output.index = \"none\"` or upgrade pgvector",
                    extension.version
                ),
            });
        }
        let names = Names::new(params);
        let layout = db::layout(&db, &client, &names).await?;
        // A metadata table embedjob did not make is refused before any work.
        db::read_metadata(&db, &client, &names).await?;
        Ok(PgvectorSink {
            db,
            names,
            extension,
            index: params.index,
            handle: Handle::current(),
            client,
            layout,
            basis: Mutex::new(None),
            staging: None,
            metadata: None,
            columns: Ok(Vec::new()),
            pending: Vec::new(),
            pending_bytes: 0,
            staged: 0,
            removals: Vec::new(),
            shard,
            job: None,
            fresh: false,
        })
    }

    /// Another job's, when the table belongs to one: a table holds one job's rows.
    fn owned_by_another(&self, spaces: &Namespaces) -> Result<(), PgError> {
        check_owner(&self.names, spaces, self.job.as_deref(), self.fresh)
    }

    fn query_error(&self, action: &'static str, e: &tokio_postgres::Error) -> PgError {
        PgError::Query {
            table: self.names.display(),
            action,
            message: self.db.describe(e),
        }
    }

    fn data_error(&self, message: String) -> PgError {
        PgError::Data {
            table: self.names.display(),
            message,
        }
    }

    /// The table's metadata columns; a column a table cannot hold is a
    /// problem of configuration.
    fn pg_columns(&self) -> Result<&[PgColumn], PgError> {
        self.columns.as_deref().map_err(|message| PgError::Layout {
            table: self.names.display(),
            message: message.clone(),
        })
    }

    /// Creates the staging table for vectors of `dimensions` values.
    fn stage(&mut self, dimensions: usize) -> Result<(), PgError> {
        if self.staging.is_some() {
            return Ok(());
        }
        let columns = self.pg_columns()?;
        let create = columns::create_table(
            "embedjob_staging",
            &self.extension,
            dimensions,
            true,
            columns,
        );
        let metadata_types: Vec<Type> = columns
            .iter()
            .map(|c| columns::pg_type(c.sql()).unwrap_or(Type::TEXT))
            .collect();
        let probe = format!("SELECT NULL::{}", self.extension.vector(dimensions));
        let client = &self.client;
        let vector_type = self.handle.block_on(async {
            client.batch_execute(&create).await?;
            let statement = client.prepare(&probe).await?;
            Ok::<_, tokio_postgres::Error>(statement.columns()[0].type_().clone())
        });
        let vector_type = vector_type.map_err(|e| self.query_error("cannot stage rows", &e))?;
        let types = COLUMNS
            .iter()
            .map(|c| match db::standard_sql(c.column_type) {
                "text" => Type::TEXT,
                "bigint" => Type::INT8,
                _ => vector_type.clone(),
            })
            .chain(metadata_types)
            .collect();
        self.staging = Some(Staging { dimensions, types });
        Ok(())
    }

    /// Checks a batch against the output contract ([`check_batch`]) and
    /// for what PostgreSQL cannot store (a NUL character in text, an offset
    /// beyond `bigint`, a date beyond its range); returns its metadata
    /// values as the table takes them.
    fn check(&self, batch: &EmbeddedBatch) -> Result<Vec<Vec<PgValue>>, PgError> {
        let dimensions = self
            .staging
            .as_ref()
            .map_or(batch.vectors.dimensions, |s| s.dimensions);
        check_batch(batch, dimensions, self.metadata.as_ref())
            .and_then(|()| columns::row_values(batch))
            .map_err(|e| self.data_error(e.to_string()))
    }

    /// Writes the batches buffered so far to the staging table, in one `COPY`.
    fn copy_pending(&mut self) -> Result<(), PgError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let types = self
            .staging
            .as_ref()
            .map(|s| s.types.clone())
            .unwrap_or_default();
        let copy = format!(
            "COPY {STAGING} ({}) FROM STDIN (FORMAT binary)",
            columns::column_list(self.pg_columns()?)
        );
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let client = &self.client;
        let result = self.handle.block_on(async {
            let sink = client.copy_in(&copy).await?;
            let writer = BinaryCopyInWriter::new(sink, &types);
            futures::pin_mut!(writer);
            for (batch, metadata) in &pending {
                let rows = batch.chunks.iter().zip(batch.vectors.rows()).zip(metadata);
                for ((chunk, vector), metadata) in rows {
                    let hash = chunk.content_hash_hex();
                    // Checked to fit by `check`.
                    let start = i64::try_from(chunk.byte_start).unwrap_or(i64::MAX);
                    let end = i64::try_from(chunk.byte_end).unwrap_or(i64::MAX);
                    let embedding = pgvector::Vector::from(vector.to_vec());
                    let standard: [&(dyn ToSql + Sync); 10] = [
                        &chunk.id,
                        &&*chunk.doc_id,
                        &i64::from(chunk.chunk_index),
                        &&*chunk.source,
                        &start,
                        &end,
                        &chunk.text,
                        &hash,
                        &i64::from(chunk.token_count),
                        &embedding,
                    ];
                    let mut row: Vec<&(dyn ToSql + Sync)> = standard.to_vec();
                    row.extend(metadata.iter().map(|v| v as &(dyn ToSql + Sync)));
                    writer.as_mut().write(&row).await?;
                }
            }
            writer.finish().await
        });
        let rows = result.map_err(|e| self.query_error("cannot write rows", &e))?;
        self.staged += rows;
        Ok(())
    }

    /// The key-value pairs the metadata table holds after this run.
    fn metadata_pairs(
        metadata: &OutputMetadata,
        dimensions: usize,
        generation: u64,
        columns: &[PgColumn],
    ) -> Vec<(String, String)> {
        let mut pairs: BTreeMap<String, String> =
            standard_pairs(metadata, dimensions).into_iter().collect();
        pairs.insert(GENERATION_KEY.to_string(), generation.to_string());
        if let Some(cost) = metadata.cost.filter(|c| c.is_finite()) {
            pairs.insert(COST_KEY.to_string(), cost.to_string());
        }
        if !columns.is_empty() {
            pairs.insert(METADATA_COLUMNS_KEY.to_string(), columns::record(columns));
        }
        for (key, value) in &metadata.extra {
            pairs.entry(key.clone()).or_insert_with(|| value.clone());
        }
        pairs.into_iter().collect()
    }
}

impl Sink for PgvectorSink {
    fn target(&self) -> String {
        format!("table {} at {}", self.names.display(), self.db.place)
    }

    fn held(&self) -> Result<Option<Box<dyn StoredRows>>, SinkError> {
        // A metadata column no table can have is found before any work.
        self.pg_columns()?;
        let Some(layout) = self.layout else {
            // No table yet: one made meanwhile by another run is found when this one finishes.
            let all = self.handle.block_on(async {
                let client = self.db.connect().await?;
                db::read_metadata(&self.db, &client, &self.names).await
            })?;
            let spaces = Namespaces::new(all);
            self.owned_by_another(&spaces)?;
            if let Ok(mut basis) = self.basis.lock() {
                *basis = Some(Basis {
                    watched: spaces.watched(self.shard, GENERATION_KEY),
                    fingerprint: None,
                    rewrite: false,
                });
            }
            return Ok(None);
        };
        let (client, all, found) = self.handle.block_on(async {
            let client = self.db.connect().await?;
            let metadata = db::read_metadata(&self.db, &client, &self.names).await?;
            let found = db::table_columns(&self.db, &client, &self.names).await?;
            Ok::<_, PgError>((client, metadata, found))
        })?;
        let spaces = Namespaces::new(all);
        self.owned_by_another(&spaces)?;
        // A column of the table's own, in the way of a metadata column, is found before any work.
        let made = spaces
            .all()
            .flat_map(|(_, keys)| columns::parse_record(keys.get(METADATA_COLUMNS_KEY)))
            .map(|c| c.0)
            .collect();
        columns::reconcile(
            "",
            &found.unwrap_or_default(),
            self.pg_columns()?,
            &made,
            &made,
        )
        .map_err(|message| PgError::Layout {
            table: self.names.display(),
            message,
        })?;
        let metadata = spaces.basis_for(self.shard);
        let written_with = columns::parse_record(metadata.get(METADATA_COLUMNS_KEY));
        let rewrite = written_with != self.pg_columns()?;
        if let Ok(mut basis) = self.basis.lock() {
            *basis = Some(Basis {
                watched: spaces.watched(self.shard, GENERATION_KEY),
                fingerprint: metadata.get(FINGERPRINT_KEY).cloned(),
                rewrite,
            });
        }
        Ok(Some(Box::new(TableRows::new(
            Arc::clone(&self.db),
            self.names.clone(),
            (self.handle.clone(), client),
            layout.dimensions,
            metadata,
            self.shard,
        ))))
    }

    /// Unless the rows it holds were written with other metadata columns
    /// (known once [`Sink::held`] has read the table).
    fn keeps_rows(&self) -> bool {
        self.basis
            .lock()
            .map_or(true, |basis| !matches!(&*basis, Some(b) if b.rewrite))
    }

    fn job(&mut self, name: &str, fresh: bool) {
        self.job = Some(name.to_string());
        self.fresh = fresh;
    }

    fn columns(&mut self, schema: Arc<MetadataSchema>) {
        self.columns = columns::metadata_columns(&schema);
        self.metadata = Some(schema);
    }

    fn write(&mut self, batch: &EmbeddedBatch) -> Result<(), SinkError> {
        if batch.chunks.is_empty() {
            return Ok(());
        }
        let values = self.check(batch)?;
        self.stage(batch.vectors.dimensions)?;
        self.pending_bytes += batch.vectors.values.len() * 4
            + batch.chunks.iter().map(|c| c.text.len()).sum::<usize>();
        self.pending.push((batch.clone(), values));
        if self.pending_bytes >= COPY_BYTES {
            self.copy_pending()?;
        }
        Ok(())
    }

    fn remove(&mut self, ids: &[String]) -> Result<(), SinkError> {
        self.removals.extend_from_slice(ids);
        Ok(())
    }

    fn finish(mut self: Box<Self>, metadata: &OutputMetadata) -> Result<SinkReport, SinkError> {
        self.copy_pending()?;
        let basis = self.basis.lock().ok().and_then(|b| b.clone());
        let fingerprint = metadata.extra.get(FINGERPRINT_KEY);
        // Builds on the table only when it read the table's rows, and they
        // were made under this run's configuration; else it replaces them.
        let builds_on = basis
            .clone()
            .filter(|b| b.fingerprint.as_ref() == fingerprint);
        let dimensions = match (metadata.dimensions, self.layout) {
            (0, Some(layout)) => layout.dimensions,
            (d, _) => d,
        };
        if self.index == VectorIndex::Hnsw && dimensions > HNSW_MAX_DIMENSIONS {
            return Err(self
                .data_error(format!(
                    "`output.index = \"hnsw\"`: pgvector indexes vectors of at most \
                     {HNSW_MAX_DIMENSIONS} dimensions, these have {dimensions}; set \
                     `output.index = \"none\"`"
                ))
                .into());
        }
        let columns = self.pg_columns()?.to_vec();
        let mut sink = *self;
        let merge = Merge {
            rewrite: builds_on.as_ref().is_some_and(|b| b.rewrite),
            columns: &columns,
            db: &sink.db,
            names: &sink.names,
            shard: sink.shard,
            extension: &sink.extension,
            index: sink.index,
            staged: sink.staged,
            removals: &sink.removals,
            builds_on: builds_on.as_ref(),
            read: basis.as_ref(),
            job: sink.job.as_deref(),
            fresh: sink.fresh,
            dimensions,
            metadata,
            warnings: Warnings::new(),
        };
        sink.handle.block_on(merge.run(&mut sink.client))?;
        Ok(SinkReport {
            rows: sink.staged,
            warnings: merge.warnings.take().into_iter().map(|w| w.text).collect(),
        })
    }

    /// The staging table goes with the session: the output table is untouched.
    fn abort(self: Box<Self>) {}
}

/// Refuses a table another job wrote (its `embedjob.job`), unless this run
/// takes it over with `--fresh`.
fn check_owner(
    names: &Names,
    spaces: &Namespaces,
    job: Option<&str>,
    fresh: bool,
) -> Result<(), PgError> {
    match job.filter(|_| !fresh).and_then(|job| spaces.other_job(job)) {
        Some(owner) => Err(PgError::Owned {
            table: names.display(),
            owner: owner.to_string(),
            job: job.unwrap_or_default().to_string(),
        }),
        None => Ok(()),
    }
}

/// The one transaction that makes a run's rows appear in the table.
struct Merge<'a> {
    db: &'a Database,
    names: &'a Names,
    shard: Owner,
    extension: &'a Extension,
    index: VectorIndex,
    staged: u64,
    removals: &'a [String],
    builds_on: Option<&'a Basis>,
    /// What the run read of the table, whether it builds on it or replaces it.
    read: Option<&'a Basis>,
    /// Builds on the table's rows but writes all of its own again.
    rewrite: bool,
    job: Option<&'a str>,
    fresh: bool,
    /// The table's metadata columns after this run.
    columns: &'a [PgColumn],
    /// Of the run's vectors, or of the table's when the run wrote none.
    dimensions: usize,
    metadata: &'a OutputMetadata,
    /// What the merge found worth a warning.
    warnings: Warnings,
}

impl Merge<'_> {
    fn failed(&self, action: &'static str) -> impl Fn(tokio_postgres::Error) -> PgError + '_ {
        move |e| PgError::Query {
            table: self.names.display(),
            action,
            message: self.db.describe(&e),
        }
    }

    async fn run(&self, client: &mut Client) -> Result<(), PgError> {
        let tx = client
            .transaction()
            .await
            .map_err(self.failed("cannot start the transaction"))?;
        // Finishing runs on one table take turns; readers see the old rows until the commit.
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&self.names.lock_key()],
        )
        .await
        .map_err(self.failed("cannot lock the table"))?;
        let spaces = Namespaces::new(db::read_metadata(self.db, &tx, self.names).await?);
        // Checked again under the lock: another job may have finished since this run read the table.
        check_owner(self.names, &spaces, self.job, self.fresh)?;
        // Also when it replaces the rows: they may be another run's, finished since.
        if let Some(basis) = self.read {
            if spaces.watched(self.shard, GENERATION_KEY) != basis.watched {
                return Err(PgError::Changed {
                    table: self.names.display(),
                });
            }
        }
        let generation = spaces.next_generation(self.shard);
        let conflicts = spaces.conflicts(self.shard, self.metadata.extra.get(FINGERPRINT_KEY));
        if !conflicts.is_empty() && self.builds_on.is_some() {
            let others: Vec<String> = conflicts.iter().map(|o| split::describe(*o)).collect();
            return Err(PgError::Split {
                table: self.names.display(),
                its: if others.len() == 1 { "its" } else { "their" },
                others: others.join(", "),
            });
        }
        let mut replaced = conflicts.clone();
        replaced.push(self.shard);
        replaced.extend(spaces.superseded(self.shard));
        self.prepare(&tx, &spaces, &conflicts).await?;
        self.reconcile(&tx, &spaces, &replaced).await?;
        self.write_rows(&tx).await?;
        self.write_metadata(&tx, generation, &spaces.stored_keys(&replaced))
            .await?;
        // Not refused: the first shard re-run after the input changed always differs.
        let (table, extra) = (self.names.display(), &self.metadata.extra);
        if let Some(warning) = spaces.inputs_after(&table, self.shard, extra, &conflicts) {
            self.warnings.warn(warning);
        }
        tx.commit()
            .await
            .map_err(self.failed("cannot commit the run's rows"))
    }

    /// Empties (or, for another vector length, drops) a table this run
    /// replaces, and creates what is missing. A shard empties its own rows,
    /// and those of other shards made under another configuration.
    async fn prepare(
        &self,
        tx: &Transaction<'_>,
        spaces: &Namespaces,
        conflicts: &[Owner],
    ) -> Result<(), PgError> {
        let table = self.names.table();
        let layout = db::layout(self.db, tx, self.names).await?;
        match layout {
            Some(layout) if self.builds_on.is_none() && layout.dimensions != self.dimensions => {
                // Replaced under another configuration (--fresh): another vector length.
                tx.batch_execute(&format!("DROP TABLE {table}"))
                    .await
                    .map_err(self.failed("cannot replace the table"))?;
            }
            Some(_) if self.builds_on.is_none() => {
                let keepers = spaces.keepers(self.shard, conflicts);
                for gone in conflicts {
                    tx.batch_execute(&format!(
                        "DELETE FROM {table} WHERE {}",
                        split::rows_only_of(*gone, &keepers)
                    ))
                    .await
                    .map_err(self.failed("cannot remove rows made under another configuration"))?;
                    if self.shard.is_none() {
                        // A run of the whole job replaces every row anyway.
                        continue;
                    }
                    self.warnings.warn(format!(
                        "table {}: removed the rows {} made under another configuration; \
                         they are embedded again on its next run",
                        self.names.display(),
                        split::describe(*gone)
                    ));
                }
                tx.batch_execute(&format!(
                    "DELETE FROM {table} WHERE {}",
                    split::rows_of_owner(self.shard)
                ))
                .await
                .map_err(self.failed("cannot replace the rows"))?;
            }
            Some(_) if self.rewrite => {
                // Rows written again are updated in place, keeping the table's own columns.
                let staged = if self.staged > 0 {
                    format!(" AND NOT EXISTS (SELECT 1 FROM {STAGING} s WHERE s.id = {table}.id)")
                } else {
                    String::new()
                };
                tx.batch_execute(&format!(
                    "DELETE FROM {table} WHERE {}{staged}",
                    split::rows_of_owner(self.shard)
                ))
                .await
                .map_err(self.failed("cannot replace the rows"))?;
            }
            _ => {}
        }
        if self.dimensions > 0 {
            let create =
                columns::create_table(&table, self.extension, self.dimensions, false, self.columns);
            tx.batch_execute(&create)
                .await
                .map_err(self.failed("cannot create the table"))?;
        }
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, value text NOT NULL)",
            self.names.metadata()
        ))
        .await
        .map_err(self.failed("cannot create the metadata table"))
    }

    /// Gives the table this run's metadata columns (see [`columns::reconcile`]):
    /// those of runs whose rows stay after this one are kept.
    async fn reconcile(
        &self,
        tx: &Transaction<'_>,
        spaces: &Namespaces,
        replaced: &[Owner],
    ) -> Result<(), PgError> {
        let Some(found) = db::table_columns(self.db, tx, self.names).await? else {
            return Ok(());
        };
        let mut made = std::collections::BTreeSet::new();
        let mut kept = std::collections::BTreeSet::new();
        for (owner, keys) in spaces.all() {
            for column in columns::parse_record(keys.get(METADATA_COLUMNS_KEY)) {
                if !replaced.contains(&owner) {
                    kept.insert(column.name().to_string());
                }
                made.insert(column.0);
            }
        }
        let table = self.names.table();
        let statements =
            columns::reconcile(&table, &found, self.columns, &made, &kept).map_err(|message| {
                PgError::Data {
                    table: self.names.display(),
                    message,
                }
            })?;
        for statement in statements {
            tx.batch_execute(&statement)
                .await
                .map_err(self.failed("cannot give the table its metadata columns"))?;
        }
        Ok(())
    }

    /// Deletes the rows of changed and deleted chunks and upserts the run's.
    async fn write_rows(&self, tx: &Transaction<'_>) -> Result<(), PgError> {
        let table = self.names.table();
        if self.builds_on.is_some() {
            let delete = format!("DELETE FROM {table} WHERE id = ANY($1)");
            for ids in self.removals.chunks(DELETE_BATCH) {
                tx.execute(delete.as_str(), &[&ids])
                    .await
                    .map_err(self.failed("cannot delete the rows of changed and deleted chunks"))?;
            }
        }
        if self.staged > 0 {
            let upsert = columns::upsert(&table, STAGING, self.columns);
            tx.batch_execute(&upsert)
                .await
                .map_err(self.failed("cannot write the run's rows"))?;
        }
        if self.index == VectorIndex::Hnsw && self.dimensions > 0 {
            let index = format!(
                "CREATE INDEX IF NOT EXISTS {} ON {table} USING hnsw (embedding {}.vector_cosine_ops)",
                self.names.index(),
                self.extension.schema
            );
            tx.batch_execute(&index)
                .await
                .map_err(self.failed("cannot build the HNSW index"))?;
        }
        Ok(())
    }

    /// Replaces this run's keys (and `replaced`, the keys of runs whose
    /// rows it replaced) with the run's metadata, named for its shard.
    async fn write_metadata(
        &self,
        tx: &Transaction<'_>,
        generation: u64,
        replaced: &[String],
    ) -> Result<(), PgError> {
        let pairs =
            PgvectorSink::metadata_pairs(self.metadata, self.dimensions, generation, self.columns);
        let (keys, values): (Vec<String>, Vec<String>) = pairs
            .into_iter()
            .map(|(k, v)| (Namespaces::key(self.shard, &k), v))
            .unzip();
        let metadata_table = self.names.metadata();
        tx.execute(
            format!("DELETE FROM {metadata_table} WHERE key = ANY($1)").as_str(),
            &[&replaced],
        )
        .await
        .map_err(self.failed("cannot write the metadata"))?;
        let insert = format!(
            "INSERT INTO {metadata_table} (key, value) SELECT * FROM unnest($1::text[], $2::text[])"
        );
        tx.execute(insert.as_str(), &[&keys, &values])
            .await
            .map_err(self.failed("cannot write the metadata"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Usage;

    #[test]
    fn the_metadata_table_records_the_runs_keys_generation_and_columns() {
        let metadata = OutputMetadata {
            model: "svc-embed-1".into(),
            dimensions: 3,
            backend: "api".into(),
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 0,
                total_tokens: 10,
            },
            requests: 2,
            cost: Some(0.5),
            extra: [
                (FINGERPRINT_KEY.to_string(), "{}".to_string()),
                ("embedjob.model".to_string(), "not this".to_string()),
            ]
            .into(),
        };
        let columns = [PgColumn("lang".into(), "text".into())];
        let pairs: BTreeMap<String, String> =
            PgvectorSink::metadata_pairs(&metadata, 3, 4, &columns)
                .into_iter()
                .collect();
        assert_eq!(pairs[GENERATION_KEY], "4");
        assert_eq!(pairs[COST_KEY], "0.5");
        assert_eq!(pairs[METADATA_COLUMNS_KEY], r#"[["lang","text"]]"#);
        assert_eq!(pairs[FINGERPRINT_KEY], "{}");
        assert_eq!(
            pairs["embedjob.model"], "svc-embed-1",
            "a standard key wins"
        );
        assert_eq!(
            pairs["embedjob.schema_version"],
            crate::contract::SCHEMA_VERSION
        );
        let without = PgvectorSink::metadata_pairs(&metadata, 3, 1, &[]);
        assert!(without.iter().all(|(k, _)| k != METADATA_COLUMNS_KEY));
    }
}
