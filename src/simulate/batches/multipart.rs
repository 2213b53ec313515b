//! A `multipart/form-data` upload read as it arrives: the `file` part
//! written to disk, the small fields kept, memory bounded whatever is sent.

use std::path::Path;

use axum::body::Body;
use futures::StreamExt;
use memchr::memmem;
use tokio::io::AsyncWriteExt;

/// The most bytes of a part's headers, of a small field, or before the first boundary.
const MAX_SMALL: usize = 16 * 1024;

/// What an upload carried besides the file's bytes.
#[derive(Debug, Default)]
pub(crate) struct Upload {
    pub purpose: Option<String>,
    pub filename: Option<String>,
    /// The file part's length; `None` when there was no `file` part.
    pub bytes: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum MultipartError {
    #[error("{0}")]
    Malformed(String),
    #[error("the file is larger than {0} bytes")]
    TooLarge(u64),
    #[error("cannot store the file: {0}")]
    Io(#[from] std::io::Error),
}

/// The boundary of a `multipart/form-data` content type.
pub(crate) fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|param| {
        let (name, value) = param.split_once('=')?;
        let value = value.trim().trim_matches('"');
        (name.trim().eq_ignore_ascii_case("boundary") && !value.is_empty() && value.len() <= 200)
            .then(|| value.to_string())
    })
}

struct Reader {
    stream: axum::body::BodyDataStream,
    buf: Vec<u8>,
}

impl Reader {
    /// Appends the next chunk; false at the end of the body.
    async fn more(&mut self) -> Result<bool, MultipartError> {
        match self.stream.next().await {
            Some(Ok(chunk)) => {
                self.buf.extend_from_slice(&chunk);
                Ok(true)
            }
            Some(Err(error)) => Err(MultipartError::Malformed(format!(
                "the upload was cut off: {error}"
            ))),
            None => Ok(false),
        }
    }

    /// Reads until `needle` is in the buffer, within `MAX_SMALL` bytes; its position.
    async fn find(&mut self, needle: &[u8], what: &str) -> Result<usize, MultipartError> {
        loop {
            if let Some(at) = memmem::find(&self.buf, needle) {
                return Ok(at);
            }
            if self.buf.len() > MAX_SMALL || !self.more().await? {
                return Err(MultipartError::Malformed(format!(
                    "the multipart body has no {what}"
                )));
            }
        }
    }
}

/// Where a part's bytes go.
enum Sink {
    File(tokio::fs::File, u64),
    Field(Vec<u8>),
    /// Another field: dropped, its length still bounded.
    Ignored(usize),
}

impl Sink {
    async fn take(&mut self, bytes: &[u8], max_file: u64) -> Result<(), MultipartError> {
        match self {
            Sink::File(file, written) => {
                *written += bytes.len() as u64;
                if *written > max_file {
                    return Err(MultipartError::TooLarge(max_file));
                }
                file.write_all(bytes).await?;
            }
            Sink::Field(value) => {
                if value.len() + bytes.len() > MAX_SMALL {
                    return Err(MultipartError::Malformed("a form field is too long".into()));
                }
                value.extend_from_slice(bytes);
            }
            Sink::Ignored(length) => {
                *length += bytes.len();
                if *length > MAX_SMALL {
                    return Err(MultipartError::Malformed("a form field is too long".into()));
                }
            }
        }
        Ok(())
    }
}

/// Reads the upload, writing its `file` part to `dest` (at most `max_file` bytes).
pub(crate) async fn receive(
    boundary: &str,
    body: Body,
    dest: &Path,
    max_file: u64,
) -> Result<Upload, MultipartError> {
    let mut reader = Reader {
        stream: body.into_data_stream(),
        buf: Vec::new(),
    };
    let open = format!("--{boundary}").into_bytes();
    let delimiter = format!("\r\n--{boundary}").into_bytes();
    let at = reader.find(&open, "boundary").await?;
    reader.buf.drain(..at + open.len());
    let mut upload = Upload::default();
    loop {
        while reader.buf.len() < 2 {
            if !reader.more().await? {
                return Err(MultipartError::Malformed("the upload ends early".into()));
            }
        }
        if reader.buf.starts_with(b"--") {
            return Ok(upload);
        }
        if !reader.buf.starts_with(b"\r\n") {
            return Err(MultipartError::Malformed(
                "a boundary is not followed by a line end".into(),
            ));
        }
        reader.buf.drain(..2);
        let end = reader.find(b"\r\n\r\n", "end of a part's headers").await?;
        let headers = String::from_utf8_lossy(&reader.buf[..end]).into_owned();
        reader.buf.drain(..end + 4);
        let (name, filename) = disposition(&headers);
        let mut sink = match name.as_deref() {
            Some("file") if upload.bytes.is_some() => {
                return Err(MultipartError::Malformed("more than one file part".into()))
            }
            Some("file") => {
                upload.filename = filename;
                Sink::File(tokio::fs::File::create(dest).await?, 0)
            }
            Some("purpose") => Sink::Field(Vec::new()),
            _ => Sink::Ignored(0),
        };
        loop {
            if let Some(at) = memmem::find(&reader.buf, &delimiter) {
                sink.take(&reader.buf[..at], max_file).await?;
                reader.buf.drain(..at + delimiter.len());
                break;
            }
            // Keep what could be the start of the delimiter.
            let keep = delimiter.len() - 1;
            if reader.buf.len() > keep {
                let cut = reader.buf.len() - keep;
                sink.take(&reader.buf[..cut], max_file).await?;
                reader.buf.drain(..cut);
            }
            if !reader.more().await? {
                return Err(MultipartError::Malformed(
                    "the upload ends in a part".into(),
                ));
            }
        }
        match sink {
            Sink::File(mut file, written) => {
                file.flush().await?;
                upload.bytes = Some(written);
            }
            Sink::Field(value) => {
                upload.purpose = Some(String::from_utf8_lossy(&value).trim().to_string());
            }
            Sink::Ignored(_) => {}
        }
    }
}

/// The `name` and `filename` of a part's `Content-Disposition`.
fn disposition(headers: &str) -> (Option<String>, Option<String>) {
    let Some(line) = headers.lines().find(|line| {
        line.split_once(':')
            .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("content-disposition"))
    }) else {
        return (None, None);
    };
    let value = |key: &str| {
        line.split(';').find_map(|param| {
            let (name, value) = param.split_once('=')?;
            (name.trim().eq_ignore_ascii_case(key))
                .then(|| value.trim().trim_matches('"').to_string())
        })
    };
    (value("name"), value("filename"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_are_read_quoted_or_not() {
        assert_eq!(
            boundary("multipart/form-data; boundary=abc").as_deref(),
            Some("abc")
        );
        assert_eq!(
            boundary("Multipart/Form-Data; charset=utf-8; boundary=\"a b\"").as_deref(),
            Some("a b")
        );
        assert_eq!(boundary("application/json"), None);
        assert_eq!(boundary("multipart/form-data"), None);
    }

    #[tokio::test]
    async fn a_file_split_across_chunks_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        let content = b"{\"a\":1}\n\r\n--not-it\n".repeat(1000);
        let mut body = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n".to_vec();
        body.extend_from_slice(&content);
        body.extend_from_slice(b"\r\n--XyZ--\r\n");
        // Chunks of 7 bytes cut the delimiter at every place.
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = body
            .chunks(7)
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
            .collect();
        let body = Body::from_stream(futures::stream::iter(chunks));
        let upload = receive("XyZ", body, &dest, 1 << 20).await.unwrap();
        assert_eq!(upload.purpose.as_deref(), Some("batch"));
        assert_eq!(upload.filename.as_deref(), Some("in.jsonl"));
        assert_eq!(upload.bytes, Some(content.len() as u64));
        assert_eq!(std::fs::read(&dest).unwrap(), content);
    }

    #[tokio::test]
    async fn a_file_over_the_limit_and_a_cut_body_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("f");
        let body = |tail: &str| {
            Body::from(format!(
                "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.jsonl\"\r\n\r\n0123456789{tail}"
            ))
        };
        let over = receive("b", body("\r\n--b--"), &dest, 5).await;
        assert!(matches!(over, Err(MultipartError::TooLarge(5))), "{over:?}");
        let cut = receive("b", body(""), &dest, 100).await;
        assert!(matches!(cut, Err(MultipartError::Malformed(_))), "{cut:?}");
        // Any other field is bounded too, whatever its length.
        let other = format!(
            "--b\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\n{}\r\n--b--",
            "x".repeat(MAX_SMALL + 1)
        );
        let long = receive("b", Body::from(other), &dest, 100).await;
        assert!(
            matches!(long, Err(MultipartError::Malformed(_))),
            "{long:?}"
        );
    }
}
