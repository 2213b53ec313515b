//! A pgvector output table as [`StoredRows`]: the rows a run finds there,
//! offered for reuse by content hash.
//!
//! Rows are addressed by their place in a scan ordered by `id`; the scan
//! keeps the ids in that order (their bytes, and 8 bytes a row), so that
//! [`StoredRows::read`] can ask the table for rows by primary key.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio_postgres::Client;

use super::db::{Database, Names};
use crate::job::Shard;
use crate::store::{ReadRow, Row, StoreError, StoredRows};

/// Rows fetched at a time while scanning.
const SCAN_ROWS: i32 = 8192;

/// An output table, read through its own connection from a blocking thread.
pub(crate) struct TableRows {
    db: Arc<Database>,
    names: Names,
    handle: Handle,
    client: Client,
    dimensions: usize,
    metadata: BTreeMap<String, String>,
    /// The shard whose rows these are; `None`, all of the table's.
    shard: Option<Shard>,
    /// The ids of the last scan, one after another, and where each ends.
    ids: String,
    ends: Vec<usize>,
}

impl TableRows {
    pub fn new(
        db: Arc<Database>,
        names: Names,
        (handle, client): (Handle, Client),
        dimensions: usize,
        metadata: BTreeMap<String, String>,
        shard: Option<Shard>,
    ) -> TableRows {
        TableRows {
            db,
            names,
            handle,
            client,
            dimensions,
            metadata,
            shard,
            ids: String::new(),
            ends: Vec::new(),
        }
    }

    fn id(&self, row: usize) -> Option<&str> {
        let end = *self.ends.get(row)?;
        let start = if row == 0 { 0 } else { self.ends[row - 1] };
        self.ids.get(start..end)
    }

    fn failed(&self, action: &str, e: &tokio_postgres::Error) -> StoreError {
        StoreError::corrupt(self.name(), format!("{action}: {}", self.db.describe(e)))
    }
}

impl StoredRows for TableRows {
    fn name(&self) -> String {
        format!("table {} in {}", self.names.display(), self.db.place)
    }

    fn dimensions(&self) -> usize {
        self.dimensions
    }

    fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    fn scan(&mut self, with_ids: bool, visit: &mut dyn FnMut(Row<'_>)) -> Result<(), StoreError> {
        let handle = self.handle.clone();
        let sql = format!(
            "SELECT id, content_hash FROM {} WHERE {} ORDER BY id",
            self.names.table(),
            super::split::rows_of_owner(self.shard)
        );
        let mut ids = String::new();
        let mut ends = Vec::new();
        let result: Result<(), (String, Option<tokio_postgres::Error>)> = handle.block_on(async {
            let tx = self
                .client
                .transaction()
                .await
                .map_err(|e| ("cannot start reading".to_string(), Some(e)))?;
            let portal = tx
                .bind(sql.as_str(), &[])
                .await
                .map_err(|e| ("cannot read the rows".to_string(), Some(e)))?;
            let mut row_number = 0u64;
            loop {
                let rows = tx
                    .query_portal(&portal, SCAN_ROWS)
                    .await
                    .map_err(|e| ("cannot read the rows".to_string(), Some(e)))?;
                if rows.is_empty() {
                    break;
                }
                for row in &rows {
                    row_number += 1;
                    let id: &str = row.get(0);
                    let hash: Option<&str> = row.get(1);
                    let Some(content_hash) = hash.and_then(parse_hash) else {
                        return Err((
                            format!("row {row_number} (id {id:?}): content_hash is not a SHA-256"),
                            None,
                        ));
                    };
                    ids.push_str(id);
                    ends.push(ids.len());
                    visit(Row {
                        content_hash,
                        id: with_ids.then_some(id),
                    });
                }
            }
            tx.commit()
                .await
                .map_err(|e| ("cannot finish reading".to_string(), Some(e)))
        });
        match result {
            Ok(()) => {
                self.ids = ids;
                self.ends = ends;
                Ok(())
            }
            Err((action, Some(e))) => Err(self.failed(&action, &e)),
            Err((message, None)) => Err(StoreError::corrupt(self.name(), message)),
        }
    }

    fn read(&mut self, rows: &[usize], found: &mut ReadRow<'_>) -> Result<(), StoreError> {
        let mut wanted: HashMap<&str, usize> = HashMap::with_capacity(rows.len());
        for (k, &row) in rows.iter().enumerate() {
            let id = self.id(row).ok_or_else(|| {
                StoreError::corrupt(self.name(), format!("row {} was not scanned", row + 1))
            })?;
            wanted.insert(id, k);
        }
        let ids: Vec<&str> = rows.iter().filter_map(|&row| self.id(row)).collect();
        let sql = format!(
            "SELECT id, content_hash, embedding FROM {} WHERE id = ANY($1)",
            self.names.table()
        );
        let result = self
            .handle
            .block_on(self.client.query(sql.as_str(), &[&ids]));
        let fetched = result.map_err(|e| self.failed("cannot read vectors", &e))?;
        let mut placed: Vec<Option<([u8; 32], Vec<f32>)>> = vec![None; rows.len()];
        for row in &fetched {
            let id: &str = row.get(0);
            let Some(&k) = wanted.get(id) else {
                continue;
            };
            let hash = row
                .get::<_, Option<&str>>(1)
                .and_then(parse_hash)
                .unwrap_or([0; 32]);
            let vector: pgvector::Vector = row
                .try_get(2)
                .map_err(|e| self.failed("cannot read a vector", &e))?;
            placed[k] = Some((hash, vector.to_vec()));
        }
        // The store takes rows in the order it asked for them.
        for (k, entry) in placed.iter().enumerate() {
            if let Some((hash, vector)) = entry {
                found(k, hash, vector);
            }
        }
        Ok(())
    }
}

fn parse_hash(hex_text: &str) -> Option<[u8; 32]> {
    let mut hash = [0u8; 32];
    hex::decode_to_slice(hex_text, &mut hash).ok()?;
    Some(hash)
}
