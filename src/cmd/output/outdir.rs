//! What `export` reads of its output folder, which other writers share (the shards of a
//! job, on shared storage): files it did not write are opened without following a link
//! or waiting on a pipe, only when they are regular files, and read up to a limit; and
//! the lock that tells a staging folder whose writer is alive from one a killed run left.
//!
//! Why a lock and not a process id: the writers of one folder may run on other machines
//! or in other PID namespaces, where a process id names nothing (or another process). An
//! advisory lock (`flock`) held on a file in the staging folder for the writer's lifetime
//! is released by the kernel when the writer ends, however it ends. Locks are trusted only
//! between writers on one kernel: a lock file records the kernel it was taken on (its
//! boot id), and a folder locked on another kernel is never judged, because some shared
//! file systems keep `flock` local to each machine.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// The file in a staging folder that its writer holds locked.
pub const LOCK_FILE: &str = "lock";

/// The first line of a lock file; the second is the kernel the lock was taken on.
const LOCK_HEADER: &str = "vramlens export staging";

/// How old a staging folder with no lock file must be to be removed: a writer makes its
/// lock file an instant after the folder, and a folder without one is from a run killed
/// in that instant or from a release that wrote none.
pub const UNLOCKED_STALE_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// Why a file of the output folder was not read.
#[derive(Debug)]
pub enum NotRead {
    /// A link, a pipe, a device, a folder: what it is.
    NotRegular(&'static str),
    /// Longer than the limit (its size).
    TooLong(u64),
    Io(io::Error),
}

impl std::fmt::Display for NotRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotRead::NotRegular(what) => write!(f, "is {what}, not a file export wrote"),
            NotRead::TooLong(n) => write!(
                f,
                "is {}, longer than the {} export reads",
                vramlens::units::bytes(*n),
                vramlens::units::bytes(MAX_READ_BYTES)
            ),
            NotRead::Io(e) => write!(f, "cannot be read: {e}"),
        }
    }
}

/// The most bytes read of one file of the output folder (a manifest of a few hundred
/// thousand files).
pub const MAX_READ_BYTES: u64 = 256 << 20;

/// What a file type is, in words.
fn kind(ft: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a named pipe";
        }
        if ft.is_char_device() || ft.is_block_device() {
            return "a device";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a folder"
    } else {
        "not a regular file"
    }
}

/// Opens a file for reading without following a link (the last component) and without
/// waiting for a pipe's writer.
fn open_no_follow(path: &Path) -> io::Result<File> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    options.open(path)
}

/// Reads a file of the output folder that another writer may have put there: only a
/// regular file (checked on the file opened, so nothing swapped in between is read), at
/// most [`MAX_READ_BYTES`].
pub fn read_regular(path: &Path) -> Result<Vec<u8>, NotRead> {
    let link = fs::symlink_metadata(path).map_err(NotRead::Io)?;
    if !link.file_type().is_file() {
        return Err(NotRead::NotRegular(kind(&link.file_type())));
    }
    let file = match open_no_follow(path) {
        Ok(f) => f,
        // A link put there since the check (O_NOFOLLOW's error).
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(NotRead::NotRegular("a symbolic link"));
        }
        Err(e) => return Err(NotRead::Io(e)),
    };
    let meta = file.metadata().map_err(NotRead::Io)?;
    if !meta.file_type().is_file() {
        return Err(NotRead::NotRegular(kind(&meta.file_type())));
    }
    if meta.len() > MAX_READ_BYTES {
        return Err(NotRead::TooLong(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // A file that grows while read is still cut at the limit.
    file.take(MAX_READ_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(NotRead::Io)?;
    if bytes.len() as u64 > MAX_READ_BYTES {
        return Err(NotRead::TooLong(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The kernel this process runs on, as every process on it sees it whatever its PID
/// namespace (Linux: the boot id); `None` where it cannot be told.
fn kernel_id() -> Option<String> {
    let id = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| id.to_string())
}

/// Takes the lock of a file without waiting: `Ok(true)` when taken (held until the file
/// is closed), `Ok(false)` when another holds it.
#[cfg(unix)]
fn try_lock(file: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this File owns; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

#[cfg(not(unix))]
fn try_lock(_file: &File) -> io::Result<bool> {
    Err(io::Error::other("no advisory locks here"))
}

/// Makes the lock file of a new staging folder and takes its lock, which the returned
/// file holds until it is closed (when the process ends, however it ends). `None` where
/// locks cannot be taken: the folder is then never judged stale by a lock (only by age).
pub fn lock_staging(dir: &Path) -> io::Result<Option<File>> {
    use std::io::Write;
    let Some(kernel) = kernel_id() else {
        return Ok(None);
    };
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dir.join(LOCK_FILE))?;
    if !try_lock(&file).unwrap_or(false) {
        return Ok(None);
    }
    // Written once the lock is held: a reader that finds the kernel named finds it locked.
    file.write_all(format!("{LOCK_HEADER}\n{kernel}\n").as_bytes())?;
    Ok(Some(file))
}

/// Is the staging folder one whose writer has ended? Only when that can be known: its
/// lock file names this kernel and its lock can be taken (then its writer ended), or it
/// has no lock file and has not changed for [`UNLOCKED_STALE_AFTER`]. A folder locked on
/// another machine, or whose lock is held, is another writer's.
pub fn is_stale(dir: &Path) -> bool {
    let lock = dir.join(LOCK_FILE);
    match fs::symlink_metadata(&lock) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let changed = fs::symlink_metadata(dir).and_then(|m| m.modified());
            return changed.is_ok_and(|t| {
                SystemTime::now()
                    .duration_since(t)
                    .is_ok_and(|age| age >= UNLOCKED_STALE_AFTER)
            });
        }
        Err(_) => return false,
        Ok(m) if !m.file_type().is_file() => return false,
        Ok(_) => {}
    }
    let Some(kernel) = kernel_id() else {
        return false;
    };
    let Ok(file) = open_no_follow(&lock) else {
        return false;
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut text = String::new();
    if (&file).take(256).read_to_string(&mut text).is_err() {
        return false;
    }
    if text != format!("{LOCK_HEADER}\n{kernel}\n") {
        return false;
    }
    // Taken: its writer has ended; held until this file is closed, as the folder goes.
    try_lock(&file).unwrap_or(false)
}
