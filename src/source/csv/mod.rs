//! CSV with a header row, streamed a record at a time, from a file or
//! stdin, plain or compressed.
//!
//! Records are read as bytes so that invalid UTF-8 is reported with its row
//! rather than as a bare decoding error, and only in the columns used.

mod config;

pub use self::config::KIND;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ::csv::{ByteRecord, ErrorKind, Reader, ReaderBuilder};
use arrow::datatypes::DataType;

use super::{input, io_error, metadata, path_text, Document, Source, SourceError, SourceStats};
use crate::bounded::{self, RecordBudget, MAX_LINE_BYTES};
use crate::source::records::RecordsSource;
use crate::types::{MetaValue, MetadataSchema};

pub struct CsvSource {
    path: PathBuf,
    source: Arc<str>,
    reader: Reader<Box<dyn Read + Send>>,
    text_column: usize,
    /// The id column's index and header.
    id_column: Option<(usize, String)>,
    /// The metadata columns' indices, in the schema's order.
    metadata_columns: Vec<usize>,
    metadata: Option<Arc<MetadataSchema>>,
    text_field: String,
    /// Reused for every record.
    record: ByteRecord,
    /// Where the next record starts, in bytes of the input, for its budget.
    record_start: Arc<AtomicU64>,
    last_row: Option<u64>,
    stats: SourceStats,
}

impl CsvSource {
    #[cfg(test)]
    pub fn open(
        path: &Path,
        text_field: &str,
        id_field: Option<&str>,
    ) -> Result<Self, SourceError> {
        Self::open_records(&RecordsSource {
            path: path.to_path_buf(),
            text_field: text_field.to_string(),
            id_field: id_field.map(str::to_string),
            metadata_fields: Vec::new(),
        })
    }

    /// Opens the records a job names; its metadata columns are strings.
    pub fn open_records(records: &RecordsSource) -> Result<Self, SourceError> {
        let path = records.path.as_path();
        let text_field = records.text_field.as_str();
        let id_field = records.id_field.as_deref();
        // The parser grows a record until it ends, so a quoted field that
        // never closes would take all the memory there is without a budget.
        let (budget, record_start) = RecordBudget::new(input::open(path)?, MAX_LINE_BYTES);
        let input: Box<dyn Read + Send> = Box::new(budget);
        let mut reader = ReaderBuilder::new().has_headers(true).from_reader(input);
        let headers = reader
            .byte_headers()
            .map_err(|e| csv_error(path, e, 1))?
            .clone();
        if headers.is_empty() {
            return Err(SourceError::Empty {
                input: path_text(path),
                passed: String::new(),
            });
        }
        let text_column = find_column(path, &headers, text_field)?;
        let id_column = match id_field {
            Some(field) => Some((find_column(path, &headers, field)?, field.to_string())),
            None => None,
        };
        let fields = &records.metadata_fields;
        let metadata_columns = fields
            .iter()
            .map(|field| find_column(path, &headers, field))
            .collect::<Result<Vec<_>, _>>()?;
        let metadata = (!fields.is_empty())
            .then(|| metadata::schema(fields, vec![DataType::Utf8; fields.len()]));
        Ok(CsvSource {
            path: path.to_path_buf(),
            source: Arc::from(path_text(path)),
            reader,
            text_column,
            id_column,
            metadata_columns,
            metadata,
            text_field: text_field.to_string(),
            record: ByteRecord::new(),
            record_start,
            last_row: None,
            stats: SourceStats::default(),
        })
    }
}

/// The index of the one header named `name`.
fn find_column(path: &Path, headers: &ByteRecord, name: &str) -> Result<usize, SourceError> {
    let matches: Vec<usize> = headers
        .iter()
        .enumerate()
        .filter(|(_, header)| *header == name.as_bytes())
        .map(|(i, _)| i)
        .collect();
    let column_error = |message: String| SourceError::Column {
        path: path.to_path_buf(),
        column: name.to_string(),
        message,
    };
    match matches.as_slice() {
        [index] => Ok(*index),
        [] => {
            let available: Vec<String> = headers
                .iter()
                .map(|h| format!("{:?}", String::from_utf8_lossy(h)))
                .collect();
            Err(column_error(format!(
                "no such column in the header row; the columns are {}",
                available.join(", ")
            )))
        }
        several => Err(column_error(format!(
            "the header row names it {} times (columns {}), so it is ambiguous",
            several.len(),
            several
                .iter()
                .map(|i| (i + 1).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// A reading error, placed at its data row (the header is row 0).
fn csv_error(path: &Path, error: ::csv::Error, fallback_row: u64) -> SourceError {
    let row = error
        .position()
        .map_or(fallback_row, ::csv::Position::record);
    let line = error.position().map(::csv::Position::line);
    let at_line = line.map(|l| format!(" (line {l})")).unwrap_or_default();
    let description = error.to_string();
    let message = match error.into_kind() {
        ErrorKind::Io(e) => match bounded::record_too_large(&e) {
            Some(limit) => format!(
                "a record of more than {} (decompressed), the most a record may hold \
                 (a quoted field that never closes?)",
                bounded::describe(limit)
            ),
            None => return io_error(path, e),
        },
        ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("has {len} fields but the header row has {expected_len}{at_line}"),
        _ => format!("cannot parse{at_line}: {description}"),
    };
    SourceError::Row {
        path: path.to_path_buf(),
        row,
        message,
    }
}

impl CsvSource {
    fn row_error(&self, row: u64, line: u64, message: String) -> SourceError {
        SourceError::Row {
            path: self.path.clone(),
            row,
            message: format!("{message} (line {line})"),
        }
    }

    fn cell(&self, column: usize, name: &str, row: u64, line: u64) -> Result<&str, SourceError> {
        let bytes = self.record.get(column).unwrap_or_default();
        std::str::from_utf8(bytes).map_err(|e| {
            let at = e.valid_up_to();
            self.row_error(
                row,
                line,
                format!(
                    "column {name:?} is not valid UTF-8 (first bad byte at byte {} of the cell)",
                    at + 1
                ),
            )
        })
    }
}

impl CsvSource {
    /// The record's metadata cells: strings, and null for an empty cell.
    fn metadata_of(
        &self,
        row: u64,
        line: u64,
    ) -> Result<Option<Arc<crate::types::Metadata>>, SourceError> {
        let Some(schema) = &self.metadata else {
            return Ok(None);
        };
        let mut values = Vec::with_capacity(self.metadata_columns.len());
        for (&column, field) in self.metadata_columns.iter().zip(&schema.fields) {
            let cell = self.cell(column, &field.field, row, line)?;
            values.push(if cell.is_empty() {
                MetaValue::Null
            } else {
                MetaValue::Text(cell.into())
            });
        }
        Ok(Some(metadata::record(schema, values)))
    }
}

impl Source for CsvSource {
    fn metadata_schema(&self) -> Option<Arc<MetadataSchema>> {
        self.metadata.clone()
    }

    fn next_document(&mut self) -> Result<Option<Document>, SourceError> {
        loop {
            let fallback_row = self.last_row.unwrap_or(0) + 1;
            let more = self
                .reader
                .read_byte_record(&mut self.record)
                .map_err(|e| csv_error(&self.path, e, fallback_row))?;
            self.record_start
                .store(self.reader.position().byte(), Ordering::Relaxed);
            if !more {
                return Ok(None);
            }
            let (row, line) = self
                .record
                .position()
                .map_or((fallback_row, 0), |p| (p.record(), p.line()));
            self.last_row = Some(row);
            let text = self.cell(self.text_column, &self.text_field, row, line)?;
            if text.trim().is_empty() {
                self.stats.skipped_empty += 1;
                continue;
            }
            let text = text.to_string();
            let doc_id = match &self.id_column {
                None => row.to_string(),
                Some((column, name)) => {
                    let id = self.cell(*column, name, row, line)?;
                    if id.is_empty() {
                        return Err(self.row_error(
                            row,
                            line,
                            format!("id column {name:?} is empty"),
                        ));
                    }
                    id.to_string()
                }
            };
            let metadata = self.metadata_of(row, line)?;
            self.stats.documents += 1;
            return Ok(Some(Document {
                doc_id,
                source: Arc::clone(&self.source),
                text,
                metadata,
            }));
        }
    }

    fn stats(&self) -> SourceStats {
        self.stats
    }

    fn last_row(&self) -> Option<u64> {
        self.last_row
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{first_error, ids, read_all};
    use super::*;

    fn file(content: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("table.csv");
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    #[test]
    fn regression_a_quoted_field_that_never_closes_is_an_error_naming_its_row() {
        use super::super::input::{tests::bomb, Codec};
        let dir = tempfile::tempdir().unwrap();
        let head = b"id,text\na,fine\nb,\"opened";
        let body = b"and never closed, over many lines\n";
        let total = 4 * MAX_LINE_BYTES;
        let mut gz = super::super::input::tests::gzip(head);
        gz.extend(bomb(Codec::Gzip, body, total));
        let mut zst = zstd::encode_all(&head[..], 3).unwrap();
        zst.extend(bomb(Codec::Zstd, body, total));
        // And a record that has no newline at all, with no quotes.
        let endless = bomb(Codec::Gzip, b"x", total);
        for (name, bytes, row) in [
            ("table.csv.gz", gz, 2),
            ("table.csv.zst", zst, 2),
            ("endless.csv", endless, 0),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            let error = match CsvSource::open(&path, "text", None) {
                Err(error) => error,
                Ok(mut source) => {
                    assert_eq!(source.next_document().unwrap().unwrap().text, "fine");
                    first_error(&mut source)
                }
            };
            let message = error.to_string();
            assert!(message.contains(name), "{message}");
            assert!(message.contains("more than 64 MiB"), "{message}");
            if row > 0 {
                assert!(
                    matches!(error, SourceError::Row { row: r, .. } if r == row),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn rows_stream_with_ids_texts_and_skips() {
        let (_dir, path) = file(
            b"\xef\xbb\xbfid,title,body\n\
              a,One,first text\n\
              b,Two,\"second, quoted\n  over two lines\"\n\
              c,Three,\n\
              d,Four,\"  \"\n\
              e,Five,last\n",
        );
        let mut source = CsvSource::open(&path, "body", Some("id")).unwrap();
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["a", "b", "e"]);
        assert_eq!(documents[1].text, "second, quoted\n  over two lines");
        assert_eq!(&*documents[2].source, path_text(&path));
        assert_eq!(source.last_row(), Some(5));
        assert_eq!(
            source.stats(),
            SourceStats {
                documents: 3,
                skipped_null: 0,
                skipped_empty: 2
            }
        );
    }

    #[test]
    fn without_an_id_column_the_data_row_is_the_id() {
        let (_dir, path) = file(b"text\none\n\"\"\nthree\n");
        let documents = read_all(&mut CsvSource::open(&path, "text", None).unwrap()).unwrap();
        assert_eq!(ids(&documents), ["1", "3"]);
    }

    #[test]
    fn a_missing_column_lists_the_headers() {
        let (_dir, path) = file(b"id,title,body\na,b,c\n");
        for (text, id) in [("text", None), ("body", Some("key"))] {
            let Err(error) = CsvSource::open(&path, text, id) else {
                panic!("opened without the column");
            };
            assert!(matches!(error, SourceError::Column { .. }), "{error}");
            assert!(error.is_found_at_open());
            let message = error.to_string();
            assert!(message.contains("table.csv"), "{message}");
            assert!(message.contains("\"id\", \"title\", \"body\""), "{message}");
        }
    }

    #[test]
    fn a_repeated_header_is_ambiguous() {
        let (_dir, path) = file(b"text,text\na,b\n");
        let Err(error) = CsvSource::open(&path, "text", None) else {
            panic!("opened with an ambiguous column");
        };
        assert!(error.to_string().contains("columns 1, 2"), "{error}");
    }

    #[test]
    fn invalid_utf8_names_the_row_and_column() {
        let (_dir, path) = file(b"id,text\na,fine\nb,\"two\nlines\"\nc,bad \xff here\n");
        let error = first_error(&mut CsvSource::open(&path, "text", Some("id")).unwrap());
        let message = error.to_string();
        assert!(
            matches!(error, SourceError::Row { row: 3, .. }),
            "{message}"
        );
        assert!(message.contains("table.csv"), "{message}");
        assert!(
            message.contains("column \"text\" is not valid UTF-8"),
            "{message}"
        );
        assert!(message.contains("line 5"), "{message}");
    }

    #[test]
    fn invalid_utf8_in_an_unused_column_is_ignored() {
        let (_dir, path) = file(b"notes,text\n\xff,fine\n");
        let documents = read_all(&mut CsvSource::open(&path, "text", None).unwrap()).unwrap();
        assert_eq!(ids(&documents), ["1"]);
    }

    #[test]
    fn a_short_row_names_the_row() {
        let (_dir, path) = file(b"id,text\na,one\nb\n");
        let error = first_error(&mut CsvSource::open(&path, "text", Some("id")).unwrap());
        let message = error.to_string();
        assert!(
            matches!(error, SourceError::Row { row: 2, .. }),
            "{message}"
        );
        assert!(
            message.contains("has 1 fields but the header row has 2"),
            "{message}"
        );
    }

    #[test]
    fn an_empty_id_names_the_row() {
        let (_dir, path) = file(b"id,text\n,one\n");
        let error = first_error(&mut CsvSource::open(&path, "text", Some("id")).unwrap());
        assert!(matches!(error, SourceError::Row { row: 1, .. }), "{error}");
        assert!(
            error.to_string().contains("id column \"id\" is empty"),
            "{error}"
        );
    }

    #[test]
    fn metadata_cells_are_strings_and_empty_ones_null() {
        use crate::types::MetaValue;
        let compressed =
            zstd::encode_all(&b"id,url,lang,text\na,https://a,en,one\nb,,fr,two\n"[..], 3).unwrap();
        let (_dir, path) = file(&compressed);
        let mut source = CsvSource::open_records(&RecordsSource {
            path,
            text_field: "text".into(),
            id_field: Some("id".into()),
            metadata_fields: vec!["url".into(), "lang".into()],
        })
        .unwrap();
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["a", "b"]);
        let values = |i: usize| documents[i].metadata.as_ref().unwrap().values.to_vec();
        assert_eq!(
            values(0),
            [
                MetaValue::Text("https://a".into()),
                MetaValue::Text("en".into())
            ]
        );
        assert_eq!(values(1), [MetaValue::Null, MetaValue::Text("fr".into())]);
        let (_dir, path) = file(b"id,text\na,one\n");
        let Err(error) = CsvSource::open_records(&RecordsSource {
            path,
            text_field: "text".into(),
            id_field: None,
            metadata_fields: vec!["url".into()],
        }) else {
            panic!("a missing metadata column was accepted");
        };
        assert!(error.is_found_at_open(), "{error}");
        assert!(error.to_string().contains("\"url\""), "{error}");
    }

    #[test]
    fn an_empty_file_is_empty() {
        let (_dir, path) = file(b"");
        let Err(error) = CsvSource::open(&path, "text", None) else {
            panic!("opened an empty file");
        };
        assert!(matches!(error, SourceError::Empty { .. }), "{error}");
        assert!(error.to_string().contains("table.csv"), "{error}");
    }
}
