//! Files that appear complete or not at all: written under a temporary name in
//! the same directory, fsynced, then renamed over the final name.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::SinkError;

/// A temporary file that is removed when dropped, unless it was committed.
#[derive(Debug)]
pub(crate) struct TempFile {
    temp_path: PathBuf,
    final_path: PathBuf,
    committed: bool,
}

impl TempFile {
    /// Creates `.{name}.tmp-{pid}` next to `final_path`, creating the parent
    /// directory if it is missing.
    pub(crate) fn create(final_path: &Path) -> Result<(Self, File), SinkError> {
        let name = final_path
            .file_name()
            .ok_or_else(|| SinkError::InvalidPath {
                path: final_path.to_path_buf(),
            })?;
        let dir = parent_dir(final_path);
        fs::create_dir_all(dir).map_err(|source| SinkError::Io {
            path: dir.to_path_buf(),
            action: "cannot create the output directory",
            source,
        })?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".tmp-{}", std::process::id()));
        let temp_path = dir.join(temp_name);
        let file = File::create(&temp_path).map_err(|source| SinkError::Io {
            path: temp_path.clone(),
            action: "cannot create the temporary file",
            source,
        })?;
        let temp = TempFile {
            temp_path,
            final_path: final_path.to_path_buf(),
            committed: false,
        };
        Ok((temp, file))
    }

    pub(crate) fn temp_path(&self) -> &Path {
        &self.temp_path
    }

    pub(crate) fn final_path(&self) -> &Path {
        &self.final_path
    }

    /// Fsyncs `file` (the temporary file, fully written), renames it over the
    /// final path and fsyncs the directory so that the rename itself is durable.
    pub(crate) fn commit(mut self, file: File) -> Result<(), SinkError> {
        file.sync_all().map_err(|source| SinkError::Io {
            path: self.temp_path.clone(),
            action: "cannot sync the temporary file",
            source,
        })?;
        // Closed before the rename: some platforms refuse to rename an open file.
        drop(file);
        fs::rename(&self.temp_path, &self.final_path).map_err(|source| SinkError::Io {
            path: self.final_path.clone(),
            action: "cannot move the temporary file into place",
            source,
        })?;
        self.committed = true;
        sync_dir(parent_dir(&self.final_path))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            // Nothing useful can be done if this fails; the name marks it as temporary.
            let _ = fs::remove_file(&self.temp_path);
        }
    }
}

/// The directory holding `path`; `.` for a bare file name.
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Removes `path` if it exists, durably.
pub(crate) fn remove_if_exists(path: &Path) -> Result<bool, SinkError> {
    match fs::remove_file(path) {
        Ok(()) => {
            sync_dir(parent_dir(path))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(SinkError::Io {
            path: path.to_path_buf(),
            action: "cannot remove the stale file",
            source,
        }),
    }
}

#[cfg(unix)]
pub(crate) fn sync_dir(dir: &Path) -> Result<(), SinkError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| SinkError::Io {
            path: dir.to_path_buf(),
            action: "cannot sync the directory",
            source,
        })
}

/// Directories cannot be opened for syncing here; the rename is as durable as
/// the platform makes it.
#[cfg(not(unix))]
pub(crate) fn sync_dir(_dir: &Path) -> Result<(), SinkError> {
    Ok(())
}

/// `path` with `suffix` appended to its file name: `out/a.parquet` →
/// `out/a.parquet{suffix}`.
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}
