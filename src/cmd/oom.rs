//! `vramlens oom`: post-mortem of the OOMs in snapshots and/or a log.

use crate::cli::OomArgs;
use crate::cmd::attribution_options;
use crate::cmd::read_snapshot;
use anyhow::{Context, Result, anyhow, bail};
use std::io::{IsTerminal, Write};
use vramlens::analysis::device::check_device;
use vramlens::analysis::oom::{OomOptions, OomReport, analyze_messages, analyze_oom};
use vramlens::devlog::oom_log::parse_oom_messages_from;
use vramlens::input::ReadOptions;
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

/// `UTF-16LE` or `UTF-16BE` when the start of a log says so: a byte-order mark, or a NUL
/// byte beside every other one (ASCII text in UTF-16).
fn utf16_encoding(path: &std::path::Path) -> Option<&'static str> {
    use std::io::Read;
    let mut head = Vec::new();
    vramlens::input::open_side_input(path)
        .ok()?
        .take(4096)
        .read_to_end(&mut head)
        .ok()?;
    if head.starts_with(&[0xff, 0xfe]) {
        return Some("UTF-16LE");
    }
    if head.starts_with(&[0xfe, 0xff]) {
        return Some("UTF-16BE");
    }
    let pairs = head.len() / 2;
    let zeros_at = |odd: usize| {
        head.iter()
            .skip(odd)
            .step_by(2)
            .filter(|&&b| b == 0)
            .count()
    };
    if pairs >= 8 && zeros_at(1) * 10 >= pairs * 9 {
        return Some("UTF-16LE");
    }
    if pairs >= 8 && zeros_at(0) * 10 >= pairs * 9 {
        return Some("UTF-16BE");
    }
    None
}

/// The OOM messages of a log (`--log`): at least one, none damaged.
pub(super) fn read_oom_log(
    path: &std::path::Path,
) -> Result<Vec<vramlens::devlog::oom_log::OomMessage>> {
    let file = vramlens::input::open_side_input(path)
        .with_context(|| format!("cannot read log {}", crate::cmd::shown_path(path)))?;
    let found = parse_oom_messages_from(file)
        .with_context(|| format!("cannot read log {}", crate::cmd::shown_path(path)))?;
    if let Some(m) = found.iter().find(|m| m.oversized) {
        bail!(
            "{}: line {}: the out-of-memory message gives a size above 1 PiB (2^50 bytes), more than any device holds, so the log is damaged or edited: {:?}",
            path.display(),
            m.line,
            m.text.chars().take(160).collect::<String>()
        );
    }
    if found.is_empty() {
        if let Some(encoding) = utf16_encoding(path) {
            bail!(
                "{}: the log is {encoding} text, and only UTF-8 (or ASCII) logs are read; convert it first (iconv -f {encoding} -t UTF-8 FILE)",
                path.display()
            );
        }
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
    let device_total_bytes =
        crate::cmd::size_option("--device-total", args.device_total.as_deref())?;
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
    for path in &crate::cmd::expand_inputs(&args.snapshots)? {
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
                None,
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
        _ => Err(crate::cmd::Failures(errors).into()),
    }
}
