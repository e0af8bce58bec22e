//! Glue for each subcommand: read inputs, run an analysis, render.

pub mod oom;
pub mod reconcile;
pub mod redact;
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

/// The device a command looks at: the one asked for (which must have a segment or a
/// trace entry), else the viewer's default.
fn resolve_device(snap: &Snapshot, path: &str, asked: Option<i64>) -> Result<i64> {
    match asked {
        Some(d) if snap.devices().contains(&d) => Ok(d),
        Some(d) => bail!(
            "{path}: device {d} has no segment and no trace entry; devices: {:?}",
            snap.devices()
        ),
        None => default_device(snap)
            .ok_or_else(|| anyhow!("{path}: no device has a segment or a trace entry")),
    }
}

/// Refuses to go on when the output file exists and --force was not given.
fn check_output(output: Option<&Path>, force: bool) -> Result<()> {
    if let Some(o) = output
        && o.exists()
        && !force
    {
        bail!(
            "{}: already exists; use --force to overwrite it",
            o.display()
        );
    }
    Ok(())
}

/// Reads and merges device logs (nvidia-smi CSV or NVML JSON lines).
fn read_device_logs(
    paths: &[std::path::PathBuf],
    utc_offset_minutes: i32,
) -> Result<vramlens::devlog::DeviceLog> {
    let clock = vramlens::devlog::ClockOptions { utc_offset_minutes };
    let mut logs = Vec::new();
    for path in paths {
        let text =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        logs.push(
            vramlens::devlog::read_device_log(&String::from_utf8_lossy(&text), clock)
                .with_context(|| format!("failed to read device log {}", path.display()))?,
        );
    }
    Ok(vramlens::devlog::merge(logs))
}
