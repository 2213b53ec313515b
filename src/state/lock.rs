//! One run of a job at a time: an advisory lock on `<stem>.lock`.
//!
//! The lock is the operating system's (`flock`), held through an open file,
//! so the kernel releases it when the process dies however it dies. A lock
//! file left behind by a killed run therefore holds no lock, and the next run
//! takes it over. The file records who holds it, for the message a second
//! run prints.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use super::StateError;
use crate::fsio::FsError;

/// The lock of one job's output, released (and its file removed) on drop.
#[derive(Debug)]
pub struct JobLock {
    path: PathBuf,
    // Holding the open file holds the lock.
    file: File,
    /// What the file said when it was taken over from a process that is gone.
    pub taken_over: Option<String>,
}

impl JobLock {
    /// Takes the lock held through the file `path`, or fails at once with
    /// [`StateError::Locked`] naming the holder.
    pub fn acquire(path: &Path) -> Result<JobLock, StateError> {
        let path = path.to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)
                .map_err(FsError::io(dir, "cannot create the output directory"))?;
        }
        let io = |action: &'static str| {
            let io = FsError::io(&path, action);
            move |source| StateError::from(io(source))
        };
        loop {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io("cannot open the lock file"))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    return Err(StateError::Locked {
                        path,
                        holder: holder.trim().to_string(),
                    });
                }
                Err(TryLockError::Error(source)) => {
                    return Err(io("cannot lock the lock file")(source))
                }
            }
            // The previous holder removes the file as it lets go; a lock taken
            // on a file that is no longer at `path` guards nothing.
            if !same_file(&file, &path) {
                continue;
            }
            let mut previous = String::new();
            let _ = file.read_to_string(&mut previous);
            let previous = previous.trim().to_string();
            file.set_len(0)
                .and_then(|()| file.rewind())
                .and_then(|()| {
                    writeln!(
                        file,
                        "pid {} since {}",
                        std::process::id(),
                        httpdate::fmt_http_date(std::time::SystemTime::now())
                    )
                })
                .and_then(|()| file.sync_all())
                .map_err(io("cannot write the lock file"))?;
            return Ok(JobLock {
                path,
                file,
                taken_over: (!previous.is_empty()).then_some(previous),
            });
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for JobLock {
    fn drop(&mut self) {
        // Removed while still held, so that no other run locks a file about to vanish.
        let _ = fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateLocation;

    fn lock_path(output: &Path) -> PathBuf {
        StateLocation::beside(output).lock()
    }

    #[test]
    fn a_second_lock_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out/docs.parquet");
        let first = JobLock::acquire(&lock_path(&output)).unwrap();
        assert_eq!(first.path(), dir.path().join("out/docs.parquet.lock"));
        match JobLock::acquire(&lock_path(&output)) {
            Err(StateError::Locked { path, holder }) => {
                assert_eq!(path, lock_path(&output));
                assert!(
                    holder.contains(&format!("pid {}", std::process::id())),
                    "{holder}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        drop(first);
        assert!(!lock_path(&output).exists(), "released locks leave no file");
        let again = JobLock::acquire(&lock_path(&output)).unwrap();
        assert!(again.taken_over.is_none());
    }

    #[test]
    fn a_lock_file_without_a_live_holder_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("docs.parquet");
        fs::write(lock_path(&output), "pid 999999 since yesterday\n").unwrap();
        let lock = JobLock::acquire(&lock_path(&output)).unwrap();
        assert_eq!(
            lock.taken_over.as_deref(),
            Some("pid 999999 since yesterday")
        );
        let text = fs::read_to_string(lock_path(&output)).unwrap();
        assert!(text.starts_with(&format!("pid {} since", std::process::id())));
    }
}
