//! JSON Lines: one JSON object per line, streamed a line at a time.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::{io_error, open_file, path_text, Document, Source, SourceError, SourceStats};

pub struct JsonlSource {
    path: PathBuf,
    source: Arc<str>,
    reader: BufReader<std::fs::File>,
    text_field: String,
    id_field: Option<String>,
    /// Reused for every line, so a long file costs one line of memory.
    line: Vec<u8>,
    line_number: u64,
    offset: u64,
    last_row: Option<u64>,
    stats: SourceStats,
}

impl JsonlSource {
    pub fn open(
        path: &Path,
        text_field: &str,
        id_field: Option<&str>,
    ) -> Result<Self, SourceError> {
        let file = open_file(path)?;
        Ok(JsonlSource {
            path: path.to_path_buf(),
            source: Arc::from(path_text(path)),
            reader: BufReader::new(file),
            text_field: text_field.to_string(),
            id_field: id_field.map(str::to_string),
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
        self.stats.documents += 1;
        self.last_row = Some(self.line_number);
        Ok(Some(Document {
            doc_id,
            source: Arc::clone(&self.source),
            text,
        }))
    }
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
    fn next_document(&mut self) -> Result<Option<Document>, SourceError> {
        loop {
            self.offset += self.line.len() as u64;
            self.line.clear();
            let read = self
                .reader
                .read_until(b'\n', &mut self.line)
                .map_err(|e| io_error(&self.path, e))?;
            if read == 0 {
                return Ok(None);
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
