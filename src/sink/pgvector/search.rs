//! The nearest rows of a pgvector output, found by the database itself with
//! pgvector's cosine distance operator (and its HNSW index, when the table
//! has one); and what the last run on it recorded.

use std::collections::BTreeMap;

use super::columns::{self, PgValue};
use super::db::{self, Database, Names};
use super::PgError;
use super::PgvectorOutput;
use crate::contract::METADATA_COLUMNS_KEY;
use crate::query::{Found, Hit};

/// The keys `shard`'s last finished run (or, without one, the whole job's)
/// recorded in the metadata table; empty before its first.
pub async fn recorded(
    params: &PgvectorOutput,
    shard: Option<crate::job::Shard>,
) -> Result<BTreeMap<String, String>, PgError> {
    let database = Database::new(params)?;
    let names = Names::new(params);
    let client = database.connect().await?;
    let all = db::read_metadata(&database, &client, &names).await?;
    Ok(super::split::Namespaces::new(all)
        .of(shard)
        .cloned()
        .unwrap_or_default())
}

/// The `k` rows nearest to `query` by cosine distance, best first, with the
/// table's metadata. `hnsw.ef_search` is raised to `k` so that an index
/// scan can return that many.
///
/// A row whose distance is not a number (its vector is all zeros, or holds
/// a NaN or an infinity where pgvector let one in) or is missing is never a
/// result; such rows are counted, with one scan of the table. Shards of the
/// table that read different inputs are a warning: a document may be there twice.
pub async fn search(
    params: &PgvectorOutput,
    query: &[f32],
    k: usize,
) -> Result<(BTreeMap<String, String>, Found), PgError> {
    let database = Database::new(params)?;
    let names = Names::new(params);
    let mut client = database.connect().await?;
    let extension = db::extension(&database, &client).await?;
    let Some(layout) = db::layout(&database, &client, &names).await? else {
        return Err(PgError::Layout {
            table: names.display(),
            message: "does not exist yet: run the job first".to_string(),
        });
    };
    let all = db::read_metadata(&database, &client, &names).await?;
    let spaces = super::split::Namespaces::new(all);
    let metadata = spaces.table_view();
    let warnings = spaces.inputs_searched(&names.display());
    if layout.dimensions != query.len() {
        return Err(PgError::Data {
            table: names.display(),
            message: format!(
                "holds {}-dimensional vectors, the query's has {}",
                layout.dimensions,
                query.len()
            ),
        });
    }
    let failed = |e: tokio_postgres::Error| PgError::Query {
        table: names.display(),
        action: "cannot search",
        message: database.describe(&e),
    };
    // The metadata columns the table's rows were written with, and still has.
    let found = db::table_columns(&database, &client, &names)
        .await?
        .unwrap_or_default();
    let metadata_columns: Vec<_> = columns::parse_record(metadata.get(METADATA_COLUMNS_KEY))
        .into_iter()
        .filter(|c| found.get(c.name()).map(String::as_str) == Some(c.sql()))
        .collect();
    let limit = i64::try_from(k).unwrap_or(i64::MAX);
    let sql = search_sql(
        &names.table(),
        &extension.cosine_distance(),
        &metadata_columns,
    );
    let damaged_sql = damaged_sql(&names.table(), &extension.cosine_distance());
    let vector = pgvector::Vector::from(query.to_vec());
    let tx = client.transaction().await.map_err(failed)?;
    if layout.has_index {
        // At most 1000, pgvector's limit; k is checked to stay within it.
        tx.batch_execute(&format!("SET LOCAL hnsw.ef_search = {}", k.clamp(40, 1000)))
            .await
            .map_err(failed)?;
    }
    let rows = tx.query(&sql, &[&vector, &limit]).await.map_err(failed)?;
    let damaged: i64 = tx
        .query_one(&damaged_sql, &[&vector])
        .await
        .map_err(failed)?
        .get(0);
    tx.commit().await.map_err(failed)?;
    let hits = rows
        .iter()
        .filter(|row| row.get::<_, Option<f64>>(3).is_some_and(f64::is_finite))
        .enumerate()
        .map(|(i, row)| {
            let distance: f64 = row.get(3);
            let mut shown = serde_json::Map::new();
            for (j, column) in metadata_columns.iter().enumerate() {
                let value = row
                    .try_get::<_, PgValue>(4 + j)
                    .map_err(|e| PgError::Data {
                        table: names.display(),
                        message: format!(
                            "row {:?}: column {:?}: {e}",
                            row.get::<_, String>(0),
                            column.name()
                        ),
                    })?;
                shown.insert(column.name().to_string(), value.to_json());
            }
            Ok(Hit {
                rank: i + 1,
                score: 1.0 - distance,
                id: row.get(0),
                doc_id: row.get::<_, Option<String>>(1).unwrap_or_default(),
                text: row.get(2),
                metadata: shown,
            })
        })
        .collect::<Result<_, PgError>>()?;
    let passed_over = u64::try_from(damaged).unwrap_or(0);
    Ok((
        metadata,
        Found {
            hits,
            passed_over,
            warnings,
        },
    ))
}

/// The query counting the rows whose distance to `$1` is not a finite
/// number: PostgreSQL orders NaN after every number, so `< 'Infinity'`
/// is false for NaN, for an infinity and (through `coalesce`) for NULL.
fn damaged_sql(table: &str, distance: &str) -> String {
    format!(
        "SELECT count(*) FROM {table} \
         WHERE NOT coalesce((embedding {distance} $1) < 'Infinity'::float8, false)"
    )
}

/// The query of the `$2` rows nearest to `$1`, with their metadata columns.
fn search_sql(table: &str, distance: &str, metadata: &[columns::PgColumn]) -> String {
    let extra: String = metadata
        .iter()
        .map(|c| format!(", {}", db::quote(c.name())))
        .collect();
    format!(
        "SELECT id, doc_id, text, embedding {distance} $1 AS distance{extra} FROM {table} \
         ORDER BY embedding {distance} $1 LIMIT $2"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_selects_the_metadata_columns_after_the_distance() {
        let metadata = [
            columns::PgColumn("lang".into(), "text".into()),
            columns::PgColumn("Day".into(), "date".into()),
        ];
        assert_eq!(
            search_sql("\"t\"", "OPERATOR(v.<=>)", &metadata),
            "SELECT id, doc_id, text, embedding OPERATOR(v.<=>) $1 AS distance, \"lang\", \
             \"Day\" FROM \"t\" ORDER BY embedding OPERATOR(v.<=>) $1 LIMIT $2"
        );
        assert_eq!(
            search_sql("t", "<=>", &[]),
            "SELECT id, doc_id, text, embedding <=> $1 AS distance FROM t \
             ORDER BY embedding <=> $1 LIMIT $2"
        );
    }
}
