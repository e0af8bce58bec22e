//! Glue for each subcommand: read inputs, run an analysis, render.

pub mod flamegraph;
pub mod oom;
pub mod reconcile;
pub mod segments;
pub mod summary;
pub mod timeline;
pub mod top;

use anyhow::{Context, Result, anyhow, bail};
use std::io::Write;
use std::path::Path;

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

/// Attribution options from the command line (patterns compiled, rules file read).
fn attribution_options(
    a: &crate::cli::AttributionArgs,
) -> Result<vramlens::analysis::attribution::AttributionOptions> {
    let pattern = |flag: &str, p: &Option<String>| -> Result<Option<regex::Regex>> {
        p.as_deref()
            .map(|p| regex::Regex::new(p).map_err(|e| anyhow!("--{flag} {p:?}: {e}")))
            .transpose()
    };
    let rules = match &a.rules {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read rules file {}", path.display()))?;
            vramlens::analysis::attribution::parse_rules(&text)
                .map_err(|e| anyhow!("{}: {e}", path.display()))?
        }
        None => Vec::new(),
    };
    Ok(vramlens::analysis::attribution::AttributionOptions {
        keep: pattern("keep", &a.keep)?,
        skip: pattern("skip", &a.skip)?,
        rules,
    })
}
