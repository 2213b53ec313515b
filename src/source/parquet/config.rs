//! `kind = "parquet"`: Parquet files (a file or a directory), never stdin. Its parameters are the records'
//! (see `source::records`).

use super::ParquetSource;
use crate::job::{KindTable, SourceParams};
use crate::source::records::{self, RecordsParams, RECORDS_KEYS};
use crate::source::{params_of, Source, SourceError, SourceKind};

pub struct Kind;

impl crate::job::Kind<dyn SourceParams> for Kind {
    fn name(&self) -> &'static str {
        "parquet"
    }

    fn keys(&self) -> &'static [&'static str] {
        RECORDS_KEYS
    }

    fn parse(&self, table: &mut KindTable<'_>) -> Option<Box<dyn SourceParams>> {
        records::parse(table, false)
    }
}

impl SourceKind for Kind {
    fn open(&self, params: &dyn SourceParams) -> Result<Box<dyn Source>, SourceError> {
        let params: &RecordsParams = params_of(params)?;
        Ok(Box::new(ParquetSource::open_records(&params.records)?))
    }
}
