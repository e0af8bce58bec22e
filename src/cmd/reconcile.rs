//! `vramlens reconcile`: PyTorch's numbers against the device's (and a profiler trace's).

use crate::cli::ReconcileArgs;
use crate::cmd::read_snapshot;
use anyhow::{Result, anyhow};
use std::io::{IsTerminal, Write};
use vramlens::analysis::device::check_device;
use vramlens::analysis::device::reconcile::{
    LOG_MARGIN_US, ReconcileOptions, analyze_reconcile, focus_ranges, snapshot_range,
};
use vramlens::input::ReadOptions;
use vramlens::render::device::reconcile::{error_text, write_reconcile_text};
use vramlens::render::{Style, write_json};

pub fn run(args: &ReconcileArgs, out: &mut dyn Write) -> Result<()> {
    let (snap, info) = read_snapshot(&args.snapshot, ReadOptions { progress: true })?;
    check_device(&snap, args.device).map_err(|e| anyhow!("{}: {e}", info.path))?;
    // Only the readings near the snapshot's trace are kept; the log is streamed.
    let keep = snapshot_range(&snap, args.device).map(|r| r.widen(LOG_MARGIN_US));
    let focus = focus_ranges(&snap, args.device);
    let log = crate::cmd::read_device_logs_in(&args.nvml, args.clock.utc_offset, keep, &focus)?;
    let trace_path = args.trace.as_deref().map(crate::cmd::recorded_path);
    let converted = crate::cmd::read_profile_trace(args.trace.as_deref())?;
    let profile = trace_path.as_deref().zip(converted.as_ref());
    let options = ReconcileOptions {
        device: args.device,
        gpu: args.gpu,
        allow_no_overlap: args.allow_no_overlap,
    };
    let report = analyze_reconcile(
        &snap,
        &info.path,
        &log,
        args.clock.utc_offset,
        profile,
        options,
    )
    .map_err(|e| {
        let logs: Vec<String> = args.nvml.iter().map(|p| p.display().to_string()).collect();
        anyhow!(
            "{}",
            error_text(&e, &logs.join(", "), trace_path.as_deref())
        )
    })?;
    if args.json {
        write_json(out, &report)?;
    } else {
        write_reconcile_text(out, &report, Style::detect(std::io::stdout().is_terminal()))?;
    }
    Ok(())
}
