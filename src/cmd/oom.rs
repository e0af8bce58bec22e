//! `vramlens oom`: post-mortem of the OOMs in snapshots and/or a log.

use super::attribution_options;
use super::read_snapshot;
use crate::cli::OomArgs;
use anyhow::{Context, Result, anyhow, bail};
use std::io::{IsTerminal, Write};
use vramlens::analysis::device::check_device;
use vramlens::analysis::oom::{OomOptions, OomReport, analyze_messages, analyze_oom};
use vramlens::input::ReadOptions;
use vramlens::oom_log::parse_oom_messages_from;
use vramlens::render::oom::write_oom_text;
use vramlens::render::{Style, write_json};
use vramlens::units::bytes;

/// A total given with --device-total must hold what PyTorch reserved plus what was free.
fn check_total(report: &OomReport, path: &str) -> Result<()> {
    for a in &report.analyses {
        if let (Some("option"), Some(total), Some(free)) = (
            a.device_total_source,
            a.device_total_bytes,
            a.device_free_bytes,
        ) && total < a.reserved_bytes.saturating_add(free)
        {
            bail!(
                "{path}: --device-total {} is less than what device {} held: reserved {} + free {}",
                bytes(total),
                a.device,
                bytes(a.reserved_bytes),
                bytes(free)
            );
        }
    }
    Ok(())
}

/// The OOM messages of a log (`--log`): at least one, none damaged.
pub(super) fn read_oom_log(path: &std::path::Path) -> Result<Vec<vramlens::oom_log::OomMessage>> {
    let file = vramlens::input::open_side_input(path)
        .with_context(|| format!("cannot read log {}", path.display()))?;
    let found = parse_oom_messages_from(file)
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
    Ok(found)
}

pub fn run(args: &OomArgs, out: &mut dyn Write) -> Result<()> {
    if args.snapshots.is_empty() && args.log.is_none() {
        bail!("give a SNAPSHOT, a --log FILE with OOM messages, or both");
    }
    let device_total_bytes = super::size_option("--device-total", args.device_total.as_deref())?;
    let attribution = attribution_options(&args.attribution)?;
    let messages = match &args.log {
        Some(path) => read_oom_log(path)?,
        None => Vec::new(),
    };
    let options = OomOptions { device_total_bytes };
    let style = Style::detect(std::io::stdout().is_terminal());
    let emit = |out: &mut dyn Write, report: &OomReport, first: bool| -> Result<()> {
        if args.json {
            write_json(out, report)?;
        } else {
            if !first {
                writeln!(out)?;
            }
            write_oom_text(out, report, style)?;
        }
        Ok(())
    };
    if args.snapshots.is_empty() {
        return emit(out, &analyze_messages(messages, options), true);
    }
    let mut errors = Vec::new();
    let mut printed = 0;
    for path in &super::expand_inputs(&args.snapshots)? {
        let result = (|| -> Result<OomReport> {
            let (snap, info) = read_snapshot(path, ReadOptions { progress: true })?;
            check_device(&snap, args.device).map_err(|e| anyhow!("{}: {e}", info.path))?;
            let report = analyze_oom(
                &snap,
                &info.path,
                args.device,
                messages.clone(),
                options,
                &attribution,
            );
            check_total(&report, &info.path)?;
            Ok(report)
        })();
        match result {
            Ok(report) => {
                emit(out, &report, printed == 0)?;
                printed += 1;
            }
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(super::Failures(errors).into()),
    }
}
