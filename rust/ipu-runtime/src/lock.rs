//! Hardware ownership: an advisory `flock` on a lock file, held for the life
//! of a device session.
//!
//! `flock` locks belong to the open file description, and the kernel drops
//! them when the owning process exits for any reason (including SIGKILL), so
//! a crashed owner never leaves a device locked. The owner's pid is written
//! into the file after locking purely so that a waiting process can say who
//! it waits for; nothing relies on it.

use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a waiting process retries the lock.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Why ownership could not be taken.
#[derive(Debug)]
pub enum LockError {
    /// The lock file (or its directory) could not be created or opened.
    Io {
        /// The lock file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// Another process held the lock for the whole timeout.
    Timeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
        /// The owner's pid as recorded in the file, if readable.
        owner_pid: Option<u32>,
    },
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Io { path, error } => {
                write!(f, "hardware lock {}: {error}", path.display())
            }
            LockError::Timeout {
                path,
                waited,
                owner_pid,
            } => {
                write!(
                    f,
                    "timed out after {:.1} s waiting for hardware ownership: {} is held by ",
                    waited.as_secs_f64(),
                    path.display()
                )?;
                match owner_pid {
                    Some(pid) => write!(f, "process {pid}"),
                    None => write!(f, "another process"),
                }
            }
        }
    }
}

impl std::error::Error for LockError {}

/// Exclusive ownership of a device; released when dropped (or when the
/// process exits).
#[derive(Debug)]
pub struct DeviceLock {
    path: PathBuf,
    // Keeping the file open keeps the flock.
    _file: File,
}

impl DeviceLock {
    /// The lock file of hardware device `index`: `<dir>/ipu<index>.lock`.
    pub fn path_for_device(dir: &Path, index: u32) -> PathBuf {
        dir.join(format!("ipu{index}.lock"))
    }

    /// The lock directory: `$IPU_LOCK_DIR`, or `/tmp/ipu-stack-locks`.
    pub fn default_dir() -> PathBuf {
        std::env::var_os("IPU_LOCK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp/ipu-stack-locks"))
    }

    /// Takes the lock at `path`, waiting at most `timeout` for another owner
    /// to release it. Logs once when it has to wait, and when it acquires.
    pub fn acquire(path: &Path, timeout: Duration) -> Result<DeviceLock, LockError> {
        let io = |error| LockError::Io {
            path: path.to_path_buf(),
            error,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let start = Instant::now();
        let mut logged_wait = false;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {
                    if !logged_wait {
                        let owner = read_owner(&mut file);
                        tracing::info!(
                            path = %path.display(),
                            owner_pid = owner.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
                            timeout_ms = timeout.as_millis() as u64,
                            "waiting for hardware ownership"
                        );
                        logged_wait = true;
                    }
                    let waited = start.elapsed();
                    if waited >= timeout {
                        return Err(LockError::Timeout {
                            path: path.to_path_buf(),
                            waited,
                            owner_pid: read_owner(&mut file),
                        });
                    }
                    std::thread::sleep(POLL_INTERVAL.min(timeout - waited));
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        // Record the owner for the benefit of waiters' messages.
        let record = (|| -> std::io::Result<()> {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            writeln!(file, "{}", std::process::id())?;
            file.flush()
        })();
        if let Err(e) = record {
            tracing::warn!(path = %path.display(), error = %e, "could not record the lock owner's pid");
        }
        tracing::info!(
            path = %path.display(),
            waited_ms = start.elapsed().as_millis() as u64,
            "acquired hardware ownership"
        );
        Ok(DeviceLock {
            path: path.to_path_buf(),
            _file: file,
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DeviceLock {
    fn drop(&mut self) {
        tracing::info!(path = %self.path.display(), "released hardware ownership");
    }
}

fn read_owner(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_in_one_process_times_out_then_succeeds_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ipu0.lock");
        let first = DeviceLock::acquire(&path, Duration::from_secs(1)).unwrap();
        // flock locks belong to the open file description, so a second open
        // in the same process contends like another process would.
        let err = DeviceLock::acquire(&path, Duration::from_millis(60)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("timed out"), "{text}");
        assert!(
            text.contains(&format!("process {}", std::process::id())),
            "{text}"
        );
        drop(first);
        DeviceLock::acquire(&path, Duration::from_millis(60)).unwrap();
    }

    #[test]
    fn unwritable_lock_directory_is_a_clear_error() {
        let err = DeviceLock::acquire(
            Path::new("/proc/ipu-stack-no-such/ipu0.lock"),
            Duration::ZERO,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("hardware lock /proc/ipu-stack-no-such/ipu0.lock:"),
            "{err}"
        );
    }
}
