//! Glue for each subcommand: read inputs, run an analysis, render.

pub mod oom;
pub mod reconcile;
pub mod segments;
pub mod summary;
pub mod timeline;

use anyhow::{Context, Result, anyhow, bail};
use std::io::Write;
use std::path::Path;
use vramlens::model::Snapshot;

/// The viewer's default device: the longest trace, else the first device with segments.
fn default_device(snap: &Snapshot) -> Option<i64> {
    let longest = snap
        .device_traces
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .max_by_key(|(d, t)| (t.len(), std::cmp::Reverse(*d)))
        .map(|(d, _)| d as i64);
    longest.or_else(|| snap.devices().first().copied())
}

/// Writes `path` through a temporary file beside it, so a failure leaves nothing behind.
fn write_new_file(
    path: &Path,
    force: bool,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    if path.exists() && !force {
        bail!(
            "{}: already exists; use --force to overwrite it",
            path.display()
        );
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a file name", path.display()))?;
    let tmp = dir.join(format!(".{}.vramlens-tmp", name.to_string_lossy()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        write(&mut f)?;
        f.flush()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}
