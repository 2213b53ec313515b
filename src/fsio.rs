//! Files that appear complete or not at all: written under a temporary name in
//! the same directory, fsynced, then renamed over the final name. Every
//! stage that leaves a file behind (the Parquet output, checkpoint parts, the
//! summary, the failures file, the manifest) writes it through here.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A file that could not be written, moved or removed. Every variant names it.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{path}: {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: not a file path")]
    InvalidPath { path: PathBuf },
}

impl FsError {
    pub fn io(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> FsError {
        let path = path.to_path_buf();
        move |source| FsError::Io {
            path,
            action,
            source,
        }
    }
}

/// A temporary file that is removed when dropped, unless it was committed.
#[derive(Debug)]
pub struct TempFile {
    temp_path: PathBuf,
    final_path: PathBuf,
    committed: bool,
}

impl TempFile {
    /// Creates `.{name}.tmp-{pid}` next to `final_path`, creating the parent
    /// directory if it is missing.
    pub fn create(final_path: &Path) -> Result<(Self, File), FsError> {
        let name = final_path.file_name().ok_or_else(|| FsError::InvalidPath {
            path: final_path.to_path_buf(),
        })?;
        let dir = parent_dir(final_path);
        fs::create_dir_all(dir).map_err(|source| FsError::Io {
            path: dir.to_path_buf(),
            action: "cannot create the output directory",
            source,
        })?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".tmp-{}", std::process::id()));
        let temp_path = dir.join(temp_name);
        let file = File::create(&temp_path).map_err(|source| FsError::Io {
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

    pub fn temp_path(&self) -> &Path {
        &self.temp_path
    }

    pub fn final_path(&self) -> &Path {
        &self.final_path
    }

    /// Fsyncs `file` (the temporary file, fully written), renames it over the
    /// final path and fsyncs the directory so that the rename itself is durable.
    pub fn commit(mut self, file: File) -> Result<(), FsError> {
        file.sync_all().map_err(|source| FsError::Io {
            path: self.temp_path.clone(),
            action: "cannot sync the temporary file",
            source,
        })?;
        // Closed before the rename: some platforms refuse to rename an open file.
        drop(file);
        fs::rename(&self.temp_path, &self.final_path).map_err(|source| FsError::Io {
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

/// Writes a growing file's data to disk in the background while it is being
/// written, so that the `fsync` that commits it finds little left to write:
/// the kernel otherwise keeps up to half a minute of writes in memory, and
/// the commit of a large output would wait for all of it at the end of a run.
/// One thread a file; requests made while one is pending are folded into it.
/// An error is kept and returned by [`Writeback::finish`]: once a sync has
/// failed, a later one may not report it again.
#[derive(Debug)]
pub struct Writeback {
    requests: std::sync::mpsc::SyncSender<()>,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
    path: PathBuf,
}

impl Writeback {
    /// Starts the thread that syncs `file` (a handle of its own), named `path` in errors.
    pub fn start(file: &File, path: &Path) -> Result<Writeback, FsError> {
        let file = file
            .try_clone()
            .map_err(FsError::io(path, "cannot reopen the temporary file"))?;
        let (requests, pending) = std::sync::mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("writeback".into())
            .spawn(move || {
                for () in pending {
                    file.sync_data()?;
                }
                Ok(())
            })
            .map_err(FsError::io(path, "cannot start the thread that syncs it"))?;
        Ok(Writeback {
            requests,
            thread,
            path: path.to_path_buf(),
        })
    }

    /// Asks for what was written so far to go to disk, unless a sync is pending.
    pub fn request(&self) {
        // Full: a sync is pending and will cover it; gone: its error waits for `finish`.
        let _ = self.requests.try_send(());
    }

    /// Waits for the syncs asked for; the first error any of them met.
    pub fn finish(self) -> Result<(), FsError> {
        let Writeback {
            requests,
            thread,
            path,
        } = self;
        drop(requests);
        let synced = thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the thread that syncs it stopped")));
        synced.map_err(FsError::io(&path, "cannot sync the temporary file"))
    }
}

/// Whether `file` is the temporary name of one of `finals` (file names in
/// the same directory), left by a process that is gone: `.{final}.tmp-{pid}`.
/// Another file that only looks like one (another job's, whose name starts
/// like this one's, or a live process's) is not.
pub fn is_stale_temporary(file: &str, finals: &[&str]) -> bool {
    let Some((name, pid)) = file
        .strip_prefix('.')
        .and_then(|rest| rest.rsplit_once(".tmp-"))
    else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    finals.contains(&name) && !process_is_alive(pid)
}

/// Whether process `pid` still runs. Where that cannot be told, a process
/// other than this one counts as gone: the caller holds the job's lock, so no
/// other run of the job can be writing.
fn process_is_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        false
    }
}

/// The directory holding `path`; `.` for a bare file name.
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Removes `path` if it exists, durably.
pub fn remove_if_exists(path: &Path) -> Result<bool, FsError> {
    match fs::remove_file(path) {
        Ok(()) => {
            sync_dir(parent_dir(path))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(FsError::Io {
            path: path.to_path_buf(),
            action: "cannot remove the stale file",
            source,
        }),
    }
}

#[cfg(unix)]
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| FsError::Io {
            path: dir.to_path_buf(),
            action: "cannot sync the directory",
            source,
        })
}

/// Directories cannot be opened for syncing here; the rename is as durable as
/// the platform makes it.
#[cfg(not(unix))]
pub fn sync_dir(_dir: &Path) -> Result<(), FsError> {
    Ok(())
}

/// `path` with `suffix` appended to its file name: `out/a.parquet` →
/// `out/a.parquet{suffix}`.
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Writes `value` as pretty-printed JSON to `path`, complete or not at all:
/// through a temporary file in the same directory (created if missing), fsynced
/// and renamed over `path`.
pub fn write_json_atomically(path: &Path, value: &serde_json::Value) -> Result<(), FsError> {
    let (temp, file) = TempFile::create(path)?;
    let temp_path = temp.temp_path().to_path_buf();
    let mut writer = BufWriter::new(file);
    serde_json::to_writer_pretty(&mut writer, value).map_err(|source| FsError::Json {
        path: temp_path.clone(),
        source,
    })?;
    writer
        .write_all(b"\n")
        .map_err(FsError::io(&temp_path, "cannot write"))?;
    let file = writer
        .into_inner()
        .map_err(|e| FsError::io(&temp_path, "cannot write")(e.into_error()))?;
    temp.commit(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::names;

    #[test]
    fn summary_is_written_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out/docs.parquet.summary.json");

        write_json_atomically(&path, &serde_json::json!({"rows": 1})).unwrap();
        write_json_atomically(&path, &serde_json::json!({"rows": 2, "cost": null})).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with('\n'));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value, serde_json::json!({"rows": 2, "cost": null}));
        assert_eq!(
            names(&dir.path().join("out")),
            ["docs.parquet.summary.json"]
        );
    }

    #[test]
    fn only_the_temporaries_of_the_given_names_and_of_dead_processes_are_stale() {
        let finals = ["a.parquet", "a.parquet.summary.json"];
        let dead = 999_999_999;
        assert!(is_stale_temporary(
            &format!(".a.parquet.tmp-{dead}"),
            &finals
        ));
        assert!(is_stale_temporary(
            &format!(".a.parquet.summary.json.tmp-{dead}"),
            &finals
        ));
        for other in [
            format!(".a.parquet.b.parquet.tmp-{dead}"),
            format!(".a.parquet.b.parquet.summary.json.tmp-{dead}"),
            format!(".a.parquet.tmp-{}", std::process::id()),
            ".a.parquet.tmp-x".to_string(),
            format!("a.parquet.tmp-{dead}"),
            "a.parquet".to_string(),
        ] {
            assert!(!is_stale_temporary(&other, &finals), "{other}");
        }
    }

    #[test]
    fn a_path_without_a_file_name_is_an_error() {
        let error = write_json_atomically(Path::new("/"), &serde_json::json!({})).unwrap_err();
        assert!(matches!(error, FsError::InvalidPath { .. }), "{error}");
    }

    #[test]
    #[cfg(unix)]
    fn a_background_sync_that_failed_is_reported_when_the_file_is_finished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docs.parquet");
        let file = File::create(&path).unwrap();
        let writeback = Writeback::start(&file, &path).unwrap();
        for _ in 0..3 {
            writeback.request();
        }
        writeback.finish().unwrap();

        // A pipe cannot be synced (EINVAL): the error waits for `finish`.
        let (_reader, writer) = std::io::pipe().unwrap();
        let pipe = File::from(std::os::fd::OwnedFd::from(writer));
        let writeback = Writeback::start(&pipe, &path).unwrap();
        writeback.request();
        let error = writeback.finish().unwrap_err().to_string();
        assert!(
            error.starts_with(&format!(
                "{}: cannot sync the temporary file",
                path.display()
            )),
            "{error}"
        );
    }
}
