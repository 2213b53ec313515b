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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `pieces` in order, then ends the body: the lines, or the first error.
    fn split(max: usize, pieces: &[&[u8]]) -> Result<Vec<(u64, Vec<u8>)>, SplitError> {
        let mut splitter = LineSplitter::new(max);
        let mut lines = Vec::new();
        for piece in pieces {
            splitter.push(Bytes::copy_from_slice(piece));
            while let Some((number, line)) = splitter.next_line()? {
                lines.push((number, line.to_vec()));
            }
            assert!(splitter.partial.len() <= max + 1, "held past the bound");
        }
        splitter.finish()?;
        Ok(lines)
    }

    fn owned(lines: &[(u64, &str)]) -> Vec<(u64, Vec<u8>)> {
        lines
            .iter()
            .map(|(n, l)| (*n, l.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn lines_across_pieces_with_either_ending() {
        let got = split(16, &[b"ab", b"c\r", b"\nde\nf", b"g\r\n"]).unwrap();
        assert_eq!(got, owned(&[(1, "abc"), (2, "de"), (3, "fg")]));
    }

    #[test]
    fn blank_lines_are_skipped_but_counted() {
        let got = split(16, &[b"\na\n\r\n  \nb\n\n"]).unwrap();
        assert_eq!(got, owned(&[(2, "a"), (5, "b")]));
        assert_eq!(split(16, &[b""]).unwrap(), owned(&[]));
    }

    #[test]
    fn a_line_at_the_bound_passes_and_one_past_it_fails() {
        assert_eq!(split(3, &[b"abc\n"]).unwrap(), owned(&[(1, "abc")]));
        assert_eq!(
            split(3, &[b"ab", b"c\r", b"\n"]).unwrap(),
            owned(&[(1, "abc")])
        );
        let too_long = SplitError::TooLong { line: 2, max: 3 };
        assert_eq!(split(3, &[b"abc\nabcd\n"]), Err(too_long.clone()));
        // Found before the line ends: a line with no end is not held whole.
        assert_eq!(
            split(3, &[b"abc\nab", b"cd", b"efgh"]),
            Err(too_long.clone())
        );
        assert_eq!(split(3, &[b"abc\nabc\r\r\n"]), Err(too_long));
    }

    #[test]
    fn a_body_cut_inside_a_line_is_truncated() {
        assert_eq!(
            split(16, &[b"a\nb", b"c"]),
            Err(SplitError::Truncated { line: 2 })
        );
        assert_eq!(split(16, &[b"a\n  "]).unwrap(), owned(&[(1, "a")]));
    }

    #[test]
    fn hostile_lines_do_not_panic() {
        for line in [
            &b""[..],
            b"null",
            b"[]",
            b"{}",
            b"{\"custom_id\":5}",
            b"{\"custom_id\":\"a\",\"response\":7}",
            b"{\"custom_id\":\"a\",\"error\":[1]}",
            b"\xff\xfe",
            b"{\"custom_id\":\"a\",\"response\":{\"body\":{\"data\":[NaN]}}}",
        ] {
            let _ = parse_line(line);
        }
    }

    proptest! {
        #[test]
        fn any_cut_of_the_body_gives_the_same_lines(
            lines in proptest::collection::vec("[a-z {}\":,]{0,12}", 0..12),
            crlf in proptest::collection::vec(any::<bool>(), 12),
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            let mut body = Vec::new();
            let mut expected = Vec::new();
            for (i, line) in lines.iter().enumerate() {
                body.extend_from_slice(line.as_bytes());
                body.extend_from_slice(if crlf[i] { b"\r\n" } else { b"\n" });
                if !line.trim().is_empty() {
                    expected.push((i as u64 + 1, line.as_bytes().to_vec()));
                }
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([body.len()]) {
                pieces.push(&body[from..cut]);
                from = cut;
            }
            prop_assert_eq!(split(12, &pieces).unwrap(), expected);
        }

        #[test]
        fn any_bytes_split_or_fail_without_panic(
            pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            max in 0usize..32,
        ) {
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            if let Ok(lines) = split(max, &pieces) {
                for (_, line) in lines {
                    prop_assert!(line.len() <= max);
                    let _ = parse_line(&line);
                }
            }
        }
    }
}
