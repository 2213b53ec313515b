//! JSON Lines: one JSON object per line, streamed a line at a time, from a
//! file or stdin, plain or compressed.

mod config;

pub use self::config::KIND;

use std::collections::VecDeque;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::DataType;
use serde_json::Value;

use super::metadata::{self, Seen};
use super::{input, io_error, path_text, Document, Source, SourceError, SourceStats};
use crate::bounded::{self, BoundedError, MAX_LINE_BYTES};
use crate::source::records::RecordsSource;
use crate::types::MetadataSchema;

/// Lines of stdin read ahead to type the metadata fields; a file is read
/// through once instead.
const STDIN_SAMPLE_LINES: usize = 1000;

/// The next line into `line`, at most [`MAX_LINE_BYTES`] long, so a line
/// that never ends (a compressed one costs little to send) is an error
/// naming its row rather than all the memory there is.
fn read_line(
    reader: &mut Box<dyn BufRead + Send>,
    path: &Path,
    line: &mut Vec<u8>,
    number: u64,
) -> Result<usize, SourceError> {
    bounded::read_line(reader, line, MAX_LINE_BYTES).map_err(|e| match e {
        BoundedError::Io(e) => io_error(path, e),
        BoundedError::TooLarge { limit } => SourceError::Row {
            path: path.to_path_buf(),
            row: number,
            message: format!(
                "a line of more than {} (decompressed), the most a line may hold",
                bounded::describe(limit)
            ),
        },
    })
}

pub struct JsonlSource {
    path: PathBuf,
    source: Arc<str>,
    reader: Box<dyn BufRead + Send>,
    text_field: String,
    id_field: Option<String>,
    metadata: Option<Arc<MetadataSchema>>,
    /// Lines read ahead (from stdin, to type the metadata), read before the
    /// reader's next.
    pending: VecDeque<Vec<u8>>,
    /// How many lines typed the metadata, when fewer than all of them.
    sampled: Option<usize>,
    /// Reused for every line, so a long file costs one line of memory.
    line: Vec<u8>,
    line_number: u64,
    offset: u64,
    last_row: Option<u64>,
    stats: SourceStats,
}

impl JsonlSource {
    #[cfg(test)]
    pub fn open(
        path: &std::path::Path,
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

    /// Opens the records a job names, typing its metadata fields: from every
    /// line of a file (read through once more for it), or from the first
    /// [`STDIN_SAMPLE_LINES`] lines of stdin.
    pub fn open_records(records: &RecordsSource) -> Result<Self, SourceError> {
        let path = &records.path;
        let mut reader = input::open(path)?;
        let fields = &records.metadata_fields;
        let mut pending = VecDeque::new();
        let mut sampled = None;
        let metadata = if fields.is_empty() {
            None
        } else if input::is_stdin(path) {
            let mut seen = vec![Seen::default(); fields.len()];
            while pending.len() < STDIN_SAMPLE_LINES {
                let mut line = Vec::new();
                let number = pending.len() as u64 + 1;
                let read = read_line(&mut reader, path, &mut line, number)?;
                if read == 0 {
                    break;
                }
                note_line(&line, fields, &mut seen);
                pending.push_back(line);
            }
            if pending.len() == STDIN_SAMPLE_LINES {
                sampled = Some(STDIN_SAMPLE_LINES);
            }
            Some(type_fields(fields, &seen))
        } else {
            let mut seen = vec![Seen::default(); fields.len()];
            let mut again = input::open(path)?;
            let mut line = Vec::new();
            let mut number = 0;
            loop {
                line.clear();
                number += 1;
                let read = read_line(&mut again, path, &mut line, number)?;
                if read == 0 {
                    break;
                }
                note_line(&line, fields, &mut seen);
            }
            Some(type_fields(fields, &seen))
        };
        Ok(JsonlSource {
            path: path.clone(),
            source: Arc::from(path_text(path)),
            reader,
            text_field: records.text_field.clone(),
            id_field: records.id_field.clone(),
            metadata,
            pending,
            sampled,
            line: Vec::new(),
            line_number: 0,
            offset: 0,
            last_row: None,
            stats: SourceStats::default(),
        })
    }

    fn row_error(&self, message: String) -> SourceError {
        SourceError::Row {
            path: self.path.clone(),
            row: self.line_number,
            message,
        }
    }

    /// One line's document, or `None` when it is blank or its text is
    /// skipped.
    fn parse_line(&mut self) -> Result<Option<Document>, SourceError> {
        let line = match std::str::from_utf8(&self.line) {
            Ok(line) => line,
            Err(e) => {
                let at = e.valid_up_to();
                return Err(self.row_error(format!(
                    "not valid UTF-8 (first bad byte at byte {} of the line, offset {} in the file)",
                    at + 1,
                    self.offset + at as u64
                )));
            }
        };
        if line.trim().is_empty() {
            return Ok(None);
        }
        let value: Value = match serde_json::from_str(line) {
            Ok(value) => value,
            Err(e) => return Err(self.row_error(format!("not valid JSON: {e}"))),
        };
        let Value::Object(mut object) = value else {
            return Err(self.row_error(format!("expected a JSON object, found {}", kind(&value))));
        };
        let text = match object.remove(&self.text_field) {
            None | Some(Value::Null) => {
                self.stats.skipped_null += 1;
                return Ok(None);
            }
            Some(Value::String(text)) => text,
            Some(other) => {
                return Err(self.row_error(format!(
                    "field {:?} is {}, not a string",
                    self.text_field,
                    kind(&other)
                )))
            }
        };
        if text.trim().is_empty() {
            self.stats.skipped_empty += 1;
            return Ok(None);
        }
        let doc_id = match &self.id_field {
            None => self.line_number.to_string(),
            Some(field) => match object.get(field) {
                Some(Value::String(id)) if !id.is_empty() => id.clone(),
                Some(Value::String(_)) => {
                    return Err(self.row_error(format!("id field {field:?} is an empty string")))
                }
                Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                None | Some(Value::Null) => {
                    return Err(self.row_error(format!("id field {field:?} is missing or null")))
                }
                Some(other) => {
                    return Err(self.row_error(format!(
                        "id field {field:?} is {}, not a string or an integer",
                        kind(other)
                    )))
                }
            },
        };
        let metadata = match &self.metadata {
            None => None,
            Some(schema) => {
                // The text was taken out of the object; a field that names it
                // gets it back.
                let text_value = Value::String(text.clone());
                let mut values = Vec::with_capacity(schema.fields.len());
                for field in &schema.fields {
                    let value = if field.field == self.text_field {
                        Some(&text_value)
                    } else {
                        metadata::lookup(&object, &field.field)
                    };
                    let value = metadata::json_value(value, &field.data_type)
                        .map_err(|found| self.type_error(&field.field, &field.data_type, &found))?;
                    values.push(value);
                }
                Some(metadata::record(schema, values))
            }
        };
        self.stats.documents += 1;
        self.last_row = Some(self.line_number);
        Ok(Some(Document {
            doc_id,
            source: Arc::clone(&self.source),
            text,
            metadata,
        }))
    }

    /// A metadata value that the type learnt from the first lines of stdin
    /// cannot hold.
    fn type_error(&self, field: &str, data_type: &DataType, found: &str) -> SourceError {
        let lines = self.sampled.unwrap_or(0);
        self.row_error(format!(
            "metadata field {field:?} is {found}, but the first {lines} lines made it {} column; \
             give the input as a file, whose every line types the fields",
            metadata::type_name(data_type)
        ))
    }
}

/// Notes the kinds of the metadata values of one line, if it is a JSON
/// object (other lines are reported when they are read).
fn note_line(line: &[u8], fields: &[String], seen: &mut [Seen]) {
    let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(line) else {
        return;
    };
    for (field, seen) in fields.iter().zip(seen.iter_mut()) {
        seen.note(metadata::lookup(&object, field));
    }
}

fn type_fields(fields: &[String], seen: &[Seen]) -> Arc<MetadataSchema> {
    metadata::schema(fields, seen.iter().map(|s| s.data_type()).collect())
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Source for JsonlSource {
    fn metadata_schema(&self) -> Option<Arc<MetadataSchema>> {
        self.metadata.clone()
    }

    fn next_document(&mut self) -> Result<Option<Document>, SourceError> {
        loop {
            self.offset += self.line.len() as u64;
            self.line.clear();
            if let Some(line) = self.pending.pop_front() {
                self.line = line;
            } else {
                let number = self.line_number + 1;
                let read = read_line(&mut self.reader, &self.path, &mut self.line, number)?;
                if read == 0 {
                    return Ok(None);
                }
            }
            self.line_number += 1;
            if let Some(document) = self.parse_line()? {
                return Ok(Some(document));
            }
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
    use std::path::Path;

    use super::super::testing::{first_error, ids, read_all};
    use super::*;

    fn file(content: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.jsonl");
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    fn assert_row_error(error: &SourceError, row: u64, needle: &str) {
        let message = error.to_string();
        assert!(
            matches!(error, SourceError::Row { row: r, .. } if *r == row),
            "expected row {row}: {message}"
        );
        assert!(message.contains("records.jsonl"), "{message}");
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }

    #[test]
    fn regression_a_line_that_never_ends_is_an_error_naming_its_row() {
        use super::super::input::{tests::bomb, Codec};
        let dir = tempfile::tempdir().unwrap();
        for (codec, name) in [
            (Codec::Gzip, "records.jsonl.gz"),
            (Codec::Zstd, "records.jsonl"),
        ] {
            let path = dir.path().join(name);
            let mut line = b"{\"text\": \"".to_vec();
            line.extend([b'a'; 4096]);
            std::fs::write(&path, bomb(codec, &line, 4 * MAX_LINE_BYTES)).unwrap();
            // Without metadata, and with it (the file is read once more to type it).
            for fields in [vec![], vec!["id".to_string()]] {
                let records = RecordsSource {
                    path: path.clone(),
                    text_field: "text".into(),
                    id_field: None,
                    metadata_fields: fields,
                };
                let error = match JsonlSource::open_records(&records) {
                    Err(error) => error,
                    Ok(mut source) => first_error(&mut source),
                };
                assert_row_error(&error, 1, "a line of more than 64 MiB");
            }
        }
    }

    #[test]
    fn records_stream_with_ids_texts_and_skips() {
        let (_dir, path) = file(
            b"{\"id\": \"x\", \"text\": \"first\"}\r\n\
              \n\
              {\"id\": 42, \"text\": \"second\", \"extra\": [1, 2]}\n\
              {\"id\": \"n\", \"text\": null}\n\
              {\"id\": \"m\"}\n\
              {\"id\": \"e\", \"text\": \" \"}\n\
              {\"text\": \"third\", \"id\": \"z\"}",
        );
        let mut source = JsonlSource::open(&path, "text", Some("id")).unwrap();
        let documents = read_all(&mut source).unwrap();
        assert_eq!(ids(&documents), ["x", "42", "z"]);
        let texts: Vec<_> = documents.iter().map(|d| d.text.as_str()).collect();
        assert_eq!(texts, ["first", "second", "third"]);
        assert_eq!(&*documents[0].source, path_text(&path));
        assert_eq!(source.last_row(), Some(7));
        assert_eq!(
            source.stats(),
            SourceStats {
                documents: 3,
                skipped_null: 2,
                skipped_empty: 1
            }
        );
    }

    #[test]
    fn without_an_id_field_the_line_number_is_the_id() {
        let (_dir, path) = file(b"{\"text\": \"a\"}\n\n{\"text\": \"b\"}\n");
        let documents = read_all(&mut JsonlSource::open(&path, "text", None).unwrap()).unwrap();
        assert_eq!(ids(&documents), ["1", "3"]);
    }

    #[test]
    fn a_number_for_the_text_names_the_row_and_field() {
        let (_dir, path) = file(b"{\"text\": \"a\"}\n{\"text\": 12}\n");
        let error = first_error(&mut JsonlSource::open(&path, "text", None).unwrap());
        assert_row_error(&error, 2, "field \"text\" is a number");
        let (_dir, path) = file(b"{\"body\": {\"k\": 1}}\n");
        let error = first_error(&mut JsonlSource::open(&path, "body", None).unwrap());
        assert_row_error(&error, 1, "field \"body\" is an object");
    }

    #[test]
    fn a_line_that_is_not_json_names_the_line() {
        let (_dir, path) = file(b"{\"text\": \"a\"}\n\n{\"text\": \"b\"\n");
        let error = first_error(&mut JsonlSource::open(&path, "text", None).unwrap());
        assert_row_error(&error, 3, "not valid JSON");
        let (_dir, path) = file(b"[1, 2]\n");
        let error = first_error(&mut JsonlSource::open(&path, "text", None).unwrap());
        assert_row_error(&error, 1, "expected a JSON object, found an array");
    }

    #[test]
    fn invalid_utf8_names_the_line_and_offset() {
        let (_dir, path) = file(b"{\"text\": \"a\"}\n{\"text\": \"b\xc3\x28\"}\n");
        let error = first_error(&mut JsonlSource::open(&path, "text", None).unwrap());
        assert_row_error(&error, 2, "not valid UTF-8");
        assert!(
            error.to_string().contains("offset 25 in the file"),
            "{error}"
        );
    }

    fn with_metadata(path: &Path, fields: &[&str]) -> JsonlSource {
        JsonlSource::open_records(&RecordsSource {
            path: path.to_path_buf(),
            text_field: "text".into(),
            id_field: None,
            metadata_fields: fields.iter().map(|f| (*f).to_string()).collect(),
        })
        .unwrap()
    }

    #[test]
    fn metadata_fields_are_typed_from_every_line_and_reached_by_dotted_paths() {
        use crate::types::MetaValue;
        let (_dir, path) = file(
            br#"{"text": "a", "url": "https://a", "n": 1, "meta": {"lang": "en"}, "ok": true}
{"text": "b", "n": 2, "meta": {"lang": "fr"}, "mixed": "x"}
{"text": "c", "url": null, "n": 2.5, "mixed": 3}
"#,
        );
        let mut source = with_metadata(&path, &["url", "n", "meta.lang", "ok", "mixed", "text"]);
        let documents = read_all(&mut source).unwrap();
        let schema = &documents[0].metadata.as_ref().unwrap().schema;
        let columns: Vec<(&str, String)> = schema
            .fields
            .iter()
            .map(|f| (f.column.as_str(), f.data_type.to_string()))
            .collect();
        assert_eq!(
            columns,
            [
                ("url", "Utf8".to_string()),
                ("n", "Float64".to_string()),
                ("meta_lang", "Utf8".to_string()),
                ("ok", "Boolean".to_string()),
                ("mixed", "Utf8".to_string()),
                ("text", "Utf8".to_string()),
            ]
        );
        let values = |i: usize| documents[i].metadata.as_ref().unwrap().values.to_vec();
        assert_eq!(
            values(0),
            [
                MetaValue::Text("https://a".into()),
                MetaValue::Float(1.0),
                MetaValue::Text("en".into()),
                MetaValue::Bool(true),
                MetaValue::Null,
                MetaValue::Text("a".into()),
            ]
        );
        assert_eq!(values(1)[0], MetaValue::Null);
        assert_eq!(values(1)[4], MetaValue::Text("x".into()));
        assert_eq!(values(2)[1], MetaValue::Float(2.5));
        assert_eq!(values(2)[4], MetaValue::Text("3".into()));
    }

    #[test]
    fn compressed_lines_read_as_plain_ones() {
        let text = b"{\"text\": \"a\"}\n{\"text\": \"b\"}\n";
        let (_dir, path) = file(&super::super::input::tests::gzip(text));
        let documents = read_all(&mut JsonlSource::open(&path, "text", None).unwrap()).unwrap();
        assert_eq!(ids(&documents), ["1", "2"]);
        let (_dir, path) = file(&zstd::encode_all(&text[..], 3).unwrap());
        let documents = read_all(&mut JsonlSource::open(&path, "text", None).unwrap()).unwrap();
        assert_eq!(ids(&documents), ["1", "2"]);
    }

    #[test]
    fn a_bad_id_names_the_row() {
        for (line, needle) in [
            (
                &b"{\"text\": \"a\", \"id\": 1.5}\n"[..],
                "is a number, not a string or an integer",
            ),
            (b"{\"text\": \"a\"}\n", "is missing or null"),
            (b"{\"text\": \"a\", \"id\": \"\"}\n", "is an empty string"),
        ] {
            let (_dir, path) = file(line);
            let error = first_error(&mut JsonlSource::open(&path, "text", Some("id")).unwrap());
            assert_row_error(&error, 1, needle);
        }
    }
}
