//! Reads that stop at a limit: a whole document, a line, a record or a side
//! file is read into memory only up to a documented size, so a compression
//! bomb, an endless line or `/dev/zero` is an error rather than exhausted
//! memory.

use std::io::{self, BufRead, Read};

const MIB: u64 = 1024 * 1024;

/// The most a document may hold once decompressed (a `files` input).
pub const MAX_DOCUMENT_BYTES: u64 = 64 * MIB;

/// The most one JSONL line or one CSV record may hold once decompressed.
pub const MAX_LINE_BYTES: u64 = 64 * MIB;

/// The most a `chunking.tokenizer` file may hold.
pub const MAX_TOKENIZER_BYTES: u64 = 64 * MIB;

/// The most a certificate file (`SSL_CERT_FILE`) may hold: a system's whole
/// bundle is a few hundred kilobytes.
pub const MAX_CA_FILE_BYTES: u64 = 16 * MIB;

/// The most a job file may hold: a job file is a few kilobytes of TOML.
pub const MAX_JOB_FILE_BYTES: u64 = 16 * MIB;

/// A limit as messages state it.
pub fn describe(limit: u64) -> String {
    if limit > 0 && limit.is_multiple_of(MIB) {
        format!("{} MiB", limit / MIB)
    } else {
        format!("{limit} bytes")
    }
}

/// Why a bounded read failed.
#[derive(Debug, thiserror::Error)]
pub enum BoundedError {
    #[error("more than {}", describe(*limit))]
    TooLarge { limit: u64 },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// All of `reader`, or [`BoundedError::TooLarge`] when it holds more than
/// `limit` bytes; at most `limit + 1` bytes are ever read.
pub fn read_to_end(reader: impl Read, limit: u64) -> Result<Vec<u8>, BoundedError> {
    let mut out = Vec::new();
    reader.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(BoundedError::TooLarge { limit });
    }
    Ok(out)
}

/// Appends the next line (with its `\n`, when it has one) to `line`, as
/// [`BufRead::read_until`] does, or fails when the line holds more than
/// `limit` bytes before its `\n`; at most `limit + 1` bytes are read.
pub fn read_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    limit: u64,
) -> Result<usize, BoundedError> {
    let start = line.len();
    let read = reader
        .take(limit.saturating_add(1))
        .read_until(b'\n', line)?;
    if read as u64 > limit && line[start..].last() != Some(&b'\n') {
        return Err(BoundedError::TooLarge { limit });
    }
    Ok(read)
}

/// A reader that fails once more than `limit` bytes were read since the
/// position its owner last marked, for parsers (CSV) that buffer a record
/// as it grows. `slack` covers what the parser reads ahead of its position.
pub struct RecordBudget<R> {
    inner: R,
    read: u64,
    mark: std::sync::Arc<std::sync::atomic::AtomicU64>,
    limit: u64,
}

impl<R> RecordBudget<R> {
    /// `inner` with a budget of `limit` bytes past each mark; the handle
    /// marks where the current record starts, in bytes of `inner`.
    pub fn new(inner: R, limit: u64) -> (Self, std::sync::Arc<std::sync::atomic::AtomicU64>) {
        let mark = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        (
            RecordBudget {
                inner,
                read: 0,
                mark: mark.clone(),
                limit,
            },
            mark,
        )
    }
}

/// The error a [`RecordBudget`] reads as, to be told apart from other I/O.
#[derive(Debug, thiserror::Error)]
#[error("a record of more than {}", describe(*limit))]
pub struct RecordTooLarge {
    pub limit: u64,
}

/// Bytes a buffered parser may hold past its position (csv's buffer is
/// 8 KiB; this leaves room for any such buffer).
pub const READ_AHEAD: u64 = 64 * 1024;

impl<R: Read> Read for RecordBudget<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mark = self.mark.load(std::sync::atomic::Ordering::Relaxed);
        if self.read.saturating_sub(mark) > self.limit + READ_AHEAD {
            return Err(io::Error::other(RecordTooLarge { limit: self.limit }));
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// The [`RecordTooLarge`] an I/O error carries, if it is one.
pub fn record_too_large(error: &io::Error) -> Option<u64> {
    error
        .get_ref()
        .and_then(|e| e.downcast_ref::<RecordTooLarge>())
        .map(|e| e.limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_one_byte_past_the_limit() {
        assert_eq!(read_to_end(&b"abcd"[..], 4).unwrap(), b"abcd");
        let endless = io::repeat(b'x');
        assert!(matches!(
            read_to_end(endless, 1000),
            Err(BoundedError::TooLarge { limit: 1000 })
        ));
        let mut line = Vec::new();
        let mut lines = &b"abcd\nabcde\nabcd"[..];
        assert_eq!(read_line(&mut lines, &mut line, 4).unwrap(), 5);
        line.clear();
        assert!(read_line(&mut lines, &mut line, 4).is_err());
        let mut endless = io::BufReader::new(io::repeat(b'x'));
        assert!(read_line(&mut endless, &mut Vec::new(), 1 << 20).is_err());
        // A budget counts from the last mark: many records within the
        // limit pass, one record over it fails.
        let (mut budget, mark) = RecordBudget::new(io::repeat(b'x').take(10_000), 100);
        let mut buf = [0u8; 10];
        let mut total = 0;
        while let Ok(n @ 1..) = budget.read(&mut buf) {
            total += n as u64;
            mark.store(total, std::sync::atomic::Ordering::Relaxed);
        }
        assert_eq!(total, 10_000);
        let (mut budget, _mark) = RecordBudget::new(io::repeat(b'x'), 100);
        let error = io::copy(&mut budget, &mut io::sink()).unwrap_err();
        assert_eq!(record_too_large(&error), Some(100));
        let mut last = &b"abcd"[..];
        assert_eq!(read_line(&mut last, &mut Vec::new(), 4).unwrap(), 4);
    }
}
