//! `vramlens oom`: post-mortem of the OOMs in a snapshot and/or a log.

use crate::cli::OomArgs;
use anyhow::{Context, Result, anyhow, bail};
use std::io::{IsTerminal, Write};
use vramlens::analysis::oom::{OomOptions, OomReport, SCHEMA_VERSION, analyze_oom};
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::oom_log::{parse_oom_messages_from, parse_size};
use vramlens::render::oom::write_oom_text;
use vramlens::render::{Style, write_json};

pub fn run(args: &OomArgs, out: &mut dyn Write) -> Result<()> {
    if args.snapshot.is_none() && args.log.is_none() {
        bail!("give a SNAPSHOT, a --log FILE with OOM messages, or both");
    }
    let device_total_bytes = args
        .device_total
        .as_deref()
        .map(|s| {
            parse_size(s).ok_or_else(|| {
                anyhow!("--device-total {s:?}: expected a size such as 40GiB or 80.0 GiB")
            })
        })
        .transpose()?;
    let messages = match &args.log {
        Some(path) => {
            let file = std::fs::File::open(path)
                .with_context(|| format!("cannot read log {}", path.display()))?;
            let found = parse_oom_messages_from(std::io::BufReader::with_capacity(1 << 16, file))
                .with_context(|| format!("cannot read log {}", path.display()))?;
            if let Some(m) = found.iter().find(|m| m.oversized) {
                bail!(
                    "{}: line {}: the out-of-memory message gives a size above 16 EiB, more than any device holds, so the log is damaged or edited: {:?}",
                    path.display(),
                    m.line,
                    m.text.chars().take(160).collect::<String>()
                );
            }
            if found.is_empty() {
                bail!(
                    "{}: no CUDA out-of-memory message found; expected a log with \"CUDA out of memory\"",
                    path.display()
                );
            }
            found
        }
        None => Vec::new(),
    };
    let report = match &args.snapshot {
        Some(path) => {
            let (snap, info) = read_snapshot(path, ReadOptions { progress: true })?;
            analyze_oom(
                &snap,
                &info.path,
                args.device,
                messages,
                OomOptions { device_total_bytes },
            )
        }
        None => OomReport {
            schema_version: SCHEMA_VERSION,
            path: None,
            analyses: Vec::new(),
            messages,
            notes: Vec::new(),
        },
    };
    if args.json {
        write_json(out, &report)?;
    } else {
        write_oom_text(out, &report, Style::detect(std::io::stdout().is_terminal()))?;
    }
    Ok(())
}
