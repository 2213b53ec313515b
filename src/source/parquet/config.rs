//! `kind = "parquet"`: Parquet files (a file or a directory), never stdin. Its parameters are the records'
//! (see `source::records`).

use super::ParquetSource;
use crate::source::records::RecordsKind;

/// The `parquet` kind.
pub static KIND: RecordsKind = RecordsKind {
    name: "parquet",
    reads_stdin: false,
    open: |records| Ok(Box::new(ParquetSource::open_records(records)?)),
};
