//! An incremental decoder for `text/event-stream` bodies.
//!
//! Bytes arrive in arbitrary pieces: an event, a line, or even a UTF-8
//! character may be split across network reads, so the decoder buffers raw
//! bytes and only decodes whole lines.

/// Upper bound on one buffered event, so a stream that never ends a line
/// cannot grow memory without limit.
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, Default)]
pub struct SseDecoder {
    pending: Vec<u8>,
    data: Option<String>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("an event is longer than {MAX_EVENT_BYTES} bytes")]
    TooLong,
    #[error("the stream is not valid UTF-8")]
    InvalidUtf8,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes in; returns the data of every event completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, SseError> {
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(offset) = memchr::memchr(b'\n', &pending[start..]) {
            let end = start + offset;
            let mut line = &pending[start..end];
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            let line = std::str::from_utf8(line).map_err(|_| SseError::InvalidUtf8)?;
            if let Some(event) = self.line(line) {
                events.push(event);
            }
            start = end + 1;
        }
        pending.drain(..start);
        self.pending = pending;
        let buffered = self.pending.len() + self.data.as_ref().map_or(0, String::len);
        if buffered > MAX_EVENT_BYTES {
            return Err(SseError::TooLong);
        }
        Ok(events)
    }

    /// Ends the stream; returns the events that had no closing blank line.
    pub fn finish(&mut self) -> Result<Vec<String>, SseError> {
        let rest = std::mem::take(&mut self.pending);
        let mut events = Vec::new();
        if !rest.is_empty() {
            let line = std::str::from_utf8(&rest).map_err(|_| SseError::InvalidUtf8)?;
            events.extend(self.line(line.strip_suffix('\r').unwrap_or(line)));
        }
        events.extend(self.data.take());
        Ok(events)
    }

    fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field != "data" {
            // `event:`, `id:` and `retry:` carry nothing a chat reply needs.
            return None;
        }
        // Each `data:` line is normally a whole event. Servers that omit the
        // blank line between events are tolerated: a new line after complete
        // JSON starts a new event instead of being glued onto it.
        match self.data.take() {
            Some(previous) if is_complete(&previous) => {
                self.data = Some(value.to_string());
                Some(previous)
            }
            Some(mut previous) => {
                previous.push('\n');
                previous.push_str(value);
                self.data = Some(previous);
                None
            }
            None => {
                self.data = Some(value.to_string());
                None
            }
        }
    }
}

fn is_complete(data: &str) -> bool {
    data == "[DONE]" || serde_json::from_str::<serde::de::IgnoredAny>(data).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_pieces(body: &[u8], piece: usize) -> Vec<String> {
        let mut decoder = SseDecoder::new();
        let mut events = Vec::new();
        for chunk in body.chunks(piece) {
            events.extend(decoder.push(chunk).unwrap());
        }
        events.extend(decoder.finish().unwrap());
        events
    }

    #[test]
    fn events_survive_any_split() {
        let body = "data: {\"a\":\"é\"}\r\n\r\n: keep-alive\n\nevent: x\ndata: {\"b\":2}\n\ndata: [DONE]\n\n";
        for piece in 1..body.len() {
            assert_eq!(
                decode_in_pieces(body.as_bytes(), piece),
                vec!["{\"a\":\"é\"}", "{\"b\":2}", "[DONE]"],
                "split every {piece} bytes"
            );
        }
    }

    #[test]
    fn missing_blank_lines_and_multiline_data() {
        let body = b"data: {\"a\":1}\ndata: {\"b\":2}\ndata: [DONE]";
        assert_eq!(
            decode_in_pieces(body, 3),
            vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"]
        );
        let body = b"data: {\"a\":\ndata: 1}\n\n";
        assert_eq!(decode_in_pieces(body, 4), vec!["{\"a\":\n1}"]);
    }

    #[test]
    fn runaway_line_is_an_error() {
        let mut decoder = SseDecoder::new();
        let blob = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert_eq!(decoder.push(&blob), Err(SseError::TooLong));
    }
}
