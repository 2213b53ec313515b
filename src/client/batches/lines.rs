//! A batch file's content read line by line as it arrives, never whole: at
//! most one line (up to its bound) and one read of the body are held.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::BatchLine;
use crate::client::{flat, ApiError, ErrorKind};
use crate::secret::Scrubber;

/// Why the lines stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SplitError {
    /// Line `line` (counted from 1) is longer than `max` bytes.
    TooLong { line: u64, max: usize },
    /// The body ended inside line `line`: it was cut off.
    Truncated { line: u64 },
}

/// Cuts bytes, as they arrive in pieces, into lines. A line is its bytes
/// without the `\n` (or `\r\n`) that ends it; blank lines are skipped.
#[derive(Debug)]
pub(super) struct LineSplitter {
    /// What is left of the last piece pushed.
    pending: Bytes,
    /// The start of a line that began in an earlier piece.
    partial: Vec<u8>,
    max: usize,
    /// The number of the line being read, from 1.
    line: u64,
}

impl LineSplitter {
    pub(super) fn new(max: usize) -> Self {
        LineSplitter {
            pending: Bytes::new(),
            partial: Vec::new(),
            max,
            line: 1,
        }
    }

    /// Adds the next piece of the body; only once [`Self::next_line`] has
    /// said it needs more.
    pub(super) fn push(&mut self, piece: Bytes) {
        debug_assert!(self.pending.is_empty());
        self.pending = piece;
    }

    /// The next whole line and its number, or `None` when more bytes are needed.
    pub(super) fn next_line(&mut self) -> Result<Option<(u64, Bytes)>, SplitError> {
        while !self.pending.is_empty() {
            let number = self.line;
            let Some(end) = memchr::memchr(b'\n', &self.pending) else {
                // One byte more than the bound is room for the `\r` of a `\r\n`.
                if self.partial.len() + self.pending.len() > self.max.saturating_add(1) {
                    return Err(self.too_long(number));
                }
                self.partial.extend_from_slice(&self.pending);
                self.pending.clear();
                return Ok(None);
            };
            let piece = self.pending.split_to(end + 1);
            self.line += 1;
            let mut line = if self.partial.is_empty() {
                piece.slice(..end)
            } else {
                self.partial.extend_from_slice(&piece[..end]);
                Bytes::from(std::mem::take(&mut self.partial))
            };
            if line.last() == Some(&b'\r') {
                line.truncate(line.len() - 1);
            }
            if line.len() > self.max {
                return Err(self.too_long(number));
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Ok(Some((number, line)));
            }
        }
        Ok(None)
    }

    /// The body has ended: an error if it ended inside a line.
    pub(super) fn finish(&mut self) -> Result<(), SplitError> {
        if self.partial.iter().all(u8::is_ascii_whitespace) {
            Ok(())
        } else {
            Err(SplitError::Truncated { line: self.line })
        }
    }

    fn too_long(&mut self, line: u64) -> SplitError {
        self.partial = Vec::new();
        self.pending.clear();
        SplitError::TooLong {
            line,
            max: self.max,
        }
    }
}

/// Reads one line of an output or error file, a bare `NaN` or `Infinity`
/// in it read as the synchronous answers' are.
pub(super) fn parse_line(line: &[u8]) -> serde_json::Result<BatchLine> {
    serde_json::from_slice(line).or_else(|e| match flat::with_non_finite_quoted(line) {
        Cow::Owned(quoted) => serde_json::from_slice(&quoted),
        Cow::Borrowed(_) => Err(e),
    })
}

struct Lines {
    bytes: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    splitter: LineSplitter,
    file: String,
    endpoint: String,
    scrubber: Arc<Scrubber>,
    done: bool,
}

impl Lines {
    async fn next(&mut self) -> Option<Result<BatchLine, ApiError>> {
        loop {
            if self.done {
                return None;
            }
            match self.splitter.next_line() {
                Ok(Some((number, line))) => {
                    return Some(parse_line(&line).map_err(|e| {
                        self.fail(
                            ErrorKind::Permanent,
                            format!(
                                "line {number} of file {} is not a batch output line ({e})",
                                self.file
                            ),
                        )
                    }));
                }
                Ok(None) => {}
                Err(e) => {
                    self.done = true;
                    return Some(Err(self.split_error(&e)));
                }
            }
            match self.bytes.next().await {
                Some(Ok(piece)) => self.splitter.push(piece),
                Some(Err(e)) => {
                    self.done = true;
                    let error = ApiError::from_transport(&self.endpoint, &e);
                    return Some(Err(error.redact(&self.scrubber)));
                }
                None => {
                    self.done = true;
                    return self
                        .splitter
                        .finish()
                        .err()
                        .map(|e| Err(self.split_error(&e)));
                }
            }
        }
    }

    fn split_error(&self, error: &SplitError) -> ApiError {
        match error {
            SplitError::TooLong { line, max } => self.fail(
                ErrorKind::Permanent,
                format!(
                    "line {line} of file {} is longer than {max} bytes, more than a line \
                     of this file can be",
                    self.file
                ),
            ),
            SplitError::Truncated { line } => self.fail(
                ErrorKind::Transient,
                format!(
                    "the content of file {} was cut off inside line {line}",
                    self.file
                ),
            ),
        }
    }

    fn fail(&self, kind: ErrorKind, message: String) -> ApiError {
        let mut error = ApiError::transient(&self.endpoint, message);
        error.kind = kind;
        error.redact(&self.scrubber)
    }
}

/// The lines of `response`'s body, the content of file `file`.
pub(super) fn stream(
    response: reqwest::Response,
    file: String,
    endpoint: String,
    max_line_bytes: usize,
    scrubber: Arc<Scrubber>,
) -> impl Stream<Item = Result<BatchLine, ApiError>> + Send + 'static {
    let lines = Lines {
        bytes: Box::pin(response.bytes_stream()),
        splitter: LineSplitter::new(max_line_bytes),
        file,
        endpoint,
        scrubber,
        done: false,
    };
    futures::stream::unfold(lines, |mut lines| async move {
        let item = lines.next().await?;
        Some((item, lines))
    })
}
