//! The stored files: uploads and the output and error files of batches,
//! each a file in the simulator's temporary directory.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use super::{unix_now, Batches};
use crate::simulate::error::ApiError;

/// Bytes sent per chunk of a file's content.
const CHUNK: usize = 64 * 1024;

/// A file the API holds; its bytes on disk are removed when the last
/// holder (the store, a batch reading it, a download) lets go.
#[derive(Debug)]
pub(crate) struct StoredFile {
    pub id: String,
    pub filename: String,
    pub purpose: String,
    pub bytes: u64,
    pub created_at: u64,
    pub path: PathBuf,
}

impl Drop for StoredFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl StoredFile {
    pub fn json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": null,
        })
    }
}

impl Batches {
    /// A fresh path in the simulator's directory, which is made if need be.
    pub(crate) fn new_path(&self) -> io::Result<(String, PathBuf)> {
        std::fs::create_dir_all(&self.dir)?;
        let id = self.new_id("file-");
        let path = self.dir.join(&id);
        Ok((id, path))
    }

    /// Keeps a written file under `id`, or refuses it when the store is full.
    pub(crate) fn keep(
        &self,
        id: String,
        path: PathBuf,
        filename: String,
        purpose: &str,
        bytes: u64,
    ) -> Result<Arc<StoredFile>, ApiError> {
        let file = Arc::new(StoredFile {
            id: id.clone(),
            filename,
            purpose: purpose.to_string(),
            bytes,
            created_at: unix_now(),
            path,
        });
        let mut state = self.state();
        if state.stored_bytes.saturating_add(bytes) > self.config.max_stored_bytes {
            return Err(ApiError::bad_request(format!(
                "The files stored would pass the storage limit of {} bytes; \
                 delete files to make room.",
                self.config.max_stored_bytes
            )));
        }
        state.stored_bytes += bytes;
        state.files.insert(id, Arc::clone(&file));
        Ok(file)
    }

    /// Keeps a batch's output or error file, whatever the store holds: the
    /// service writes its results even when a user's uploads fill it.
    pub(crate) fn keep_output(
        &self,
        id: String,
        path: PathBuf,
        filename: String,
        bytes: u64,
    ) -> String {
        let file = Arc::new(StoredFile {
            id: id.clone(),
            filename,
            purpose: "batch_output".to_string(),
            bytes,
            created_at: unix_now(),
            path,
        });
        let mut state = self.state();
        state.stored_bytes += bytes;
        state.files.insert(id.clone(), file);
        id
    }

    pub(crate) fn file(&self, id: &str) -> Result<Arc<StoredFile>, ApiError> {
        self.state()
            .files
            .get(id)
            .cloned()
            .ok_or_else(|| no_such_file(id))
    }

    /// Forgets the file; its bytes go once no batch or download reads them.
    pub(crate) fn delete(&self, id: &str) -> Result<(), ApiError> {
        let mut state = self.state();
        let file = state.files.remove(id).ok_or_else(|| no_such_file(id))?;
        state.stored_bytes = state.stored_bytes.saturating_sub(file.bytes);
        Ok(())
    }
}

pub(crate) fn no_such_file(id: &str) -> ApiError {
    ApiError {
        param: Some("file_id".to_string()),
        ..ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("No such File object: {id}"),
        )
    }
}

/// The file's bytes as a body sent in chunks as they are read.
pub(crate) async fn content(file: Arc<StoredFile>) -> io::Result<Body> {
    let reader = tokio::fs::File::open(&file.path).await?;
    let chunks = futures::stream::try_unfold(
        (reader, file, vec![0u8; CHUNK]),
        |(mut reader, file, mut buf)| async move {
            let n = reader.read(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            let chunk = bytes::Bytes::copy_from_slice(&buf[..n]);
            Ok::<_, io::Error>(Some((chunk, (reader, file, buf))))
        },
    );
    Ok(Body::from_stream(chunks))
}
