//! `kind = "csv"`: CSV with a header row. Its parameters are the records'
//! (see `source::records`).

use super::CsvSource;
use crate::source::records::RecordsKind;

/// The `csv` kind.
pub static KIND: RecordsKind = RecordsKind {
    name: "csv",
    reads_stdin: true,
    open: |records| Ok(Box::new(CsvSource::open_records(records)?)),
};
