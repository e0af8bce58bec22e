//! `vramlens report`: one self-contained HTML file with the analyses of one snapshot, or
//! of several (the ranks of a job) with a table of them.

use crate::cli::ReportArgs;
use crate::cmd::attribution_options;
use crate::cmd::output::{same_file, write_new_file};
use crate::cmd::read_snapshot;
use anyhow::{Result, anyhow, bail};
use rayon::prelude::*;
use std::io::Write;
use vramlens::analysis::device::reconcile::{LOG_MARGIN_US, focus_ranges, snapshot_range};
use vramlens::analysis::kinds::attribution::GroupBy;
use vramlens::analysis::oom::OomOptions;
use vramlens::analysis::reports::ranks::{analyze_ranks, rank_input};
use vramlens::analysis::reports::report::{
    Readings, ReportError, ReportOptions, analyze_report_file,
};
use vramlens::input::ReadOptions;
use vramlens::render::device::reconcile::error_text;
use vramlens::render::html::{Assets, MAX_FILES, MAX_REPORT_BYTES, PageStats, write_report_html};
use vramlens::units::bytes;

pub fn run(args: &ReportArgs, out: &mut dyn Write) -> Result<()> {
    let device_total_bytes =
        crate::cmd::size_option("--device-total", args.device_total.as_deref())?;
    let attribution = attribution_options(&args.attribution)?;
    let mut files = crate::cmd::expand_inputs(&args.files)?;
    // A report written into the folder of snapshots is not one of them.
    files.retain(|f| !same_file(f, &args.output));
    if files.is_empty() {
        bail!("no snapshot to report on");
    }
    if files.len() > MAX_FILES {
        bail!(
            "{} snapshots: a report holds at most {MAX_FILES}; give fewer files",
            files.len()
        );
    }
    let messages = match &args.device_logs.log {
        Some(path) => crate::cmd::oom::read_oom_log(path)?,
        None => Vec::new(),
    };
    let trace_path = args.trace.as_deref().map(crate::cmd::recorded_path);
    let converted = crate::cmd::read_profile_trace(args.trace.as_deref())?;
    let options = ReportOptions {
        device: args.device,
        attribution: &attribution,
        messages: &messages,
        oom: OomOptions { device_total_bytes },
        readings: None,
    };
    let logs: Vec<String> = crate::cmd::recorded_paths(
        &args
            .device_logs
            .nvml
            .iter()
            .map(|p| p.as_path())
            .collect::<Vec<_>>(),
    );
    let several = files.len() > 1;
    let results: Vec<Result<_>> = files
        .par_iter()
        .map(|path| {
            let (snap, info) = read_snapshot(path, ReadOptions { progress: true })?;
            // The device logs, streamed for this file's window only (a bounded series
            // when long), as reconcile reads them.
            let log = if args.device_logs.nvml.is_empty() {
                None
            } else {
                let keep = snapshot_range(&snap, args.device).map(|r| r.widen(LOG_MARGIN_US));
                let focus = focus_ranges(&snap, args.device);
                Some(crate::cmd::read_device_logs_in(
                    &args.device_logs.nvml,
                    args.device_logs.clock.utc_offset,
                    keep,
                    &focus,
                )?)
            };
            let options = ReportOptions {
                readings: log.as_ref().map(|log| Readings {
                    log,
                    utc_offset_minutes: args.device_logs.clock.utc_offset,
                    profile: trace_path.as_deref().zip(converted.as_ref()),
                    allow_no_overlap: args.allow_no_overlap,
                }),
                ..options
            };
            let report = analyze_report_file(&snap, &info, options).map_err(|e| match e {
                ReportError::Device(e) => anyhow!("{}: {e}", info.path),
                ReportError::Reconcile(e) => anyhow!(
                    "{}",
                    error_text(&e, &logs.join(", "), trace_path.as_deref())
                ),
            })?;
            let rank = several
                .then(|| rank_input(&snap, &info.path, &attribution, GroupBy::Callsite))
                .flatten();
            Ok((report, rank))
        })
        .collect();
    let mut reports = Vec::new();
    let mut inputs = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok((report, rank)) => {
                reports.push(report);
                inputs.extend(rank);
            }
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => {}
        1 => return Err(errors.remove(0)),
        _ => return Err(crate::cmd::Failures(errors).into()),
    }
    let ranks = several.then(|| analyze_ranks(inputs, GroupBy::Callsite, 10));
    let mut stats = PageStats::default();
    write_new_file(&args.output, args.force, |w| {
        let assets = match args.without_assets {
            true => Assets::LeftOut,
            false => Assets::Embedded,
        };
        stats = write_report_html(w, &reports, ranks.as_ref(), assets)?;
        Ok(())
    })?;
    write!(
        out,
        "{}: {} ({} snapshot{})",
        crate::cmd::shown_path(&args.output),
        bytes(stats.bytes),
        reports.len(),
        if reports.len() == 1 { "" } else { "s" }
    )?;
    match stats.left_out {
        0 => writeln!(out)?,
        n => writeln!(
            out,
            "; {n} part{} left out to stay under {}, each with the command that draws it",
            if n == 1 { "" } else { "s" },
            bytes(MAX_REPORT_BYTES as u64)
        )?,
    }
    Ok(())
}
