//! `vramlens diff` and `vramlens check`: two snapshots by group, and a budget gate.

use super::attribution_options;
use super::read_snapshot;
use crate::cli::{AttributionArgs, CheckArgs, DiffArgs};
use anyhow::{Result, anyhow, bail};
use std::io::{IsTerminal, Write};
use std::path::Path;
use vramlens::analysis::attribution::{Attributor, GroupBy};
use vramlens::analysis::device::choose_device;
use vramlens::analysis::diff::{CheckReport, Limit, Metric, diff};
use vramlens::analysis::moment::Moment;
use vramlens::analysis::top::{TopReport, analyze_top};
use vramlens::input::ReadOptions;
use vramlens::render::diff::{write_check_text, write_diff_text};
use vramlens::render::{Style, write_json};
use vramlens::timeline::replay::DeviceReplay;

/// A check whose peak is over a limit: its report is printed, the exit status is 1.
#[derive(Debug)]
pub struct CheckFailed;

impl std::fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("over budget")
    }
}

impl std::error::Error for CheckFailed {}

/// Every group alive at a moment of one file, and the file's peaks.
fn groups_of(
    path: &Path,
    device: Option<i64>,
    moment: Moment,
    by: GroupBy,
    attribution: &AttributionArgs,
) -> Result<(TopReport, vramlens::timeline::replay::Peaks)> {
    let options = attribution_options(attribution)?;
    let (snap, info) = read_snapshot(path, ReadOptions { progress: true })?;
    let p = info.path.as_str();
    let choice = choose_device(&snap, device).map_err(|e| anyhow!("{p}: {e}"))?;
    let mut attr = Attributor::new(&snap.frames, &options);
    let report = analyze_top(&snap, p, &choice, moment, by, usize::MAX, &mut attr)
        .map_err(|e| anyhow!("{p}: {e}"))?;
    let r = DeviceReplay::new(&snap, choice.device);
    let mut peaks = vramlens::timeline::replay::Peaks::default();
    r.run(&mut peaks);
    Ok((report, peaks))
}

pub fn run_diff(args: &DiffArgs, out: &mut dyn Write) -> Result<()> {
    let by = args.by;
    let moment = args.at.clone();
    let (base, _) = groups_of(
        &args.base,
        args.device,
        moment.clone(),
        by,
        &args.attribution,
    )?;
    let (new, _) = groups_of(&args.new, args.device, moment, by, &args.attribution)?;
    let report = diff(&base, &new);
    if args.json {
        write_json(out, &report)?;
    } else {
        let style = Style::detect(std::io::stdout().is_terminal());
        write_diff_text(out, &report, args.limit, style)?;
    }
    Ok(())
}

pub fn run_check(args: &CheckArgs, out: &mut dyn Write) -> Result<()> {
    let by = args.by;
    let metric: Metric = args
        .metric
        .parse()
        .map_err(|e: String| anyhow!("--metric: {e}"))?;
    let max_peak = super::size_option("--max-peak", args.max_peak.as_deref())?;
    if max_peak.is_none() && args.baseline.is_none() {
        bail!("give --max-peak SIZE, --baseline SNAPSHOT, or both");
    }
    if !(args.tolerance.is_finite() && args.tolerance >= 0.0) {
        bail!(
            "--tolerance {}: expected a percentage of 0 or more",
            args.tolerance
        );
    }
    let peak_of = |p: &vramlens::timeline::replay::Peaks| match metric {
        Metric::Allocated => p.allocated.bytes,
        Metric::Requested => p.requested.bytes,
        Metric::Reserved => p.reserved.bytes,
    };
    let moment = args.at.clone().unwrap_or(Moment::Peak);
    // The figure checked: the peak's, or the value at the moment asked for.
    let value_of = |report: &TopReport, peaks: &vramlens::timeline::replay::Peaks| match args.at {
        None | Some(Moment::Peak) => peak_of(peaks),
        Some(_) => match metric {
            Metric::Allocated => report.allocated_bytes,
            Metric::Requested => report.total_bytes,
            Metric::Reserved => report.reserved_bytes.max(0) as u64,
        },
    };
    let (report, peaks) = groups_of(
        &args.file,
        args.device,
        moment.clone(),
        by,
        &args.attribution,
    )?;
    let peak = value_of(&report, &peaks);
    let mut limits = Vec::new();
    if let Some(max) = max_peak {
        limits.push(Limit {
            kind: "max_peak",
            limit_bytes: max,
            passed: peak <= max,
        });
    }
    let mut baseline_peak = None;
    let mut grew = Vec::new();
    if let Some(base_path) = &args.baseline {
        let (base, base_peaks) = groups_of(
            base_path,
            args.device,
            moment.clone(),
            by,
            &args.attribution,
        )?;
        let base_value = value_of(&base, &base_peaks);
        baseline_peak = Some(base_value);
        let limit = (base_value as f64 * (1.0 + args.tolerance / 100.0)).floor() as u64;
        limits.push(Limit {
            kind: "baseline",
            limit_bytes: limit,
            passed: peak <= limit,
        });
        grew = diff(&base, &report)
            .groups
            .into_iter()
            .filter(|g| g.delta_bytes > 0)
            .collect();
    }
    let passed = limits.iter().all(|l| l.passed);
    let check = CheckReport {
        schema_version: vramlens::analysis::diff::SCHEMA_VERSION,
        path: report.path.clone(),
        device: report.device,
        metric,
        peak_bytes: peak,
        moment: args
            .at
            .as_ref()
            .filter(|m| **m != Moment::Peak)
            .map(|_| report.moment),
        final_state_only: !report.moment.has_timeline,
        baseline_path: args
            .baseline
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned()),
        baseline_peak_bytes: baseline_peak,
        tolerance_percent: args.baseline.as_ref().map(|_| args.tolerance),
        limits,
        passed,
        grew,
    };
    if args.json {
        write_json(out, &check)?;
    } else {
        let style = Style::detect(std::io::stdout().is_terminal());
        write_check_text(out, &check, style)?;
    }
    if passed {
        Ok(())
    } else {
        Err(CheckFailed.into())
    }
}
