//! `kind = "jsonl"`: JSON Lines, one record a line. Its parameters are the records'
//! (see `source::records`).

use super::JsonlSource;
use crate::source::records::RecordsKind;

/// The `jsonl` kind.
pub static KIND: RecordsKind = RecordsKind {
    name: "jsonl",
    reads_stdin: true,
    open: |records| Ok(Box::new(JsonlSource::open_records(records)?)),
};
