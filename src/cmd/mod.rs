//! Glue for each subcommand: read inputs, run an analysis, render.

pub mod oom;
pub mod output;
pub mod reconcile;
pub mod segments;
pub mod summary;
pub mod timeline;

use anyhow::{Context, Result, anyhow, bail};
use output::{check_output, write_new_file};
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

/// Several errors, one line each on stderr (e.g. every bad file of `summary`).
#[derive(Debug)]
pub struct Failures(pub Vec<anyhow::Error>);

impl std::fmt::Display for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e:#}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failures {}
