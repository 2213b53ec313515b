//! A `multipart/form-data` upload read as it arrives with axum's `Multipart`:
//! the `file` part written to disk chunk by chunk, the small fields kept.

use std::path::Path;

use axum::extract::Multipart;
use axum::http::StatusCode;
use tokio::io::AsyncWriteExt;

/// The most bytes of a small field (`purpose`, or any other field, dropped).
const MAX_SMALL: usize = 16 * 1024;

/// Room in the body beyond the file for the small fields and the parts' headers.
pub(crate) const FORM_OVERHEAD: u64 = 1024 * 1024;

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

impl MultipartError {
    /// A parse error, or the body passing the route's limit, which only a
    /// file over `max_file` can make it do.
    fn read(error: &axum::extract::multipart::MultipartError, max_file: u64) -> Self {
        if error.status() == StatusCode::PAYLOAD_TOO_LARGE {
            MultipartError::TooLarge(max_file)
        } else {
            MultipartError::Malformed(error.body_text())
        }
    }
}

/// Reads the upload, writing its `file` part to `dest` (at most `max_file` bytes).
pub(crate) async fn receive(
    mut form: Multipart,
    dest: &Path,
    max_file: u64,
) -> Result<Upload, MultipartError> {
    let read = |error| MultipartError::read(&error, max_file);
    let mut upload = Upload::default();
    while let Some(mut field) = form.next_field().await.map_err(read)? {
        match field.name() {
            Some("file") if upload.bytes.is_some() => {
                return Err(MultipartError::Malformed("more than one file part".into()))
            }
            Some("file") => {
                upload.filename = field.file_name().map(str::to_string);
                let mut file = tokio::fs::File::create(dest).await?;
                let mut written = 0u64;
                while let Some(chunk) = field.chunk().await.map_err(read)? {
                    written += chunk.len() as u64;
                    if written > max_file {
                        return Err(MultipartError::TooLarge(max_file));
                    }
                    file.write_all(&chunk).await?;
                }
                file.flush().await?;
                upload.bytes = Some(written);
            }
            name => {
                let keep = name == Some("purpose");
                let mut value = Vec::new();
                let mut length = 0;
                while let Some(chunk) = field.chunk().await.map_err(read)? {
                    length += chunk.len();
                    if length > MAX_SMALL {
                        return Err(MultipartError::Malformed("a form field is too long".into()));
                    }
                    if keep {
                        value.extend_from_slice(&chunk);
                    }
                }
                if keep {
                    upload.purpose = Some(String::from_utf8_lossy(&value).trim().to_string());
                }
            }
        }
    }
    Ok(upload)
}
