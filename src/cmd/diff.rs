//! `vramlens diff` and `vramlens check`: two snapshots by group, and a budget gate.

use crate::cli::{CheckArgs, DiffArgs};
use crate::cmd::session::Session;
use anyhow::{Result, anyhow, bail};
use std::io::{IsTerminal, Write};
use std::path::Path;
use vramlens::analysis::kinds::attribution::{AttributionOptions, GroupBy};
use vramlens::analysis::moments::moment::Moment;
use vramlens::analysis::reports::diff::{CheckOptions, Measured, Metric, check, diff, measure};
use vramlens::render::diff::{write_check_text, write_diff_text};
use vramlens::render::{Style, write_json};

/// A check whose peak is over a limit: its report is printed, the exit status is 1.
#[derive(Debug)]
pub struct CheckFailed;

impl std::fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("over budget")
    }
}

impl std::error::Error for CheckFailed {}

/// Every group alive at a moment of one file, and the file's peaks (one replay).
fn measured(
    path: &Path,
    device: Option<i64>,
    moment: Moment,
    by: GroupBy,
    options: &AttributionOptions,
) -> Result<Measured> {
    let session = Session::open(path, device, options.clone())?;
    let r = session.replay();
    let bind = || session.bound_attributor(&r);
    measure(&r, session.path(), &session.choice, moment, by, bind)
        .map_err(|e| anyhow!("{}: {e}", session.path()))
}

/// Two files measured at once, each on its share of the threads.
fn measured_both(
    a: &Path,
    b: &Path,
    device: Option<i64>,
    moment: Moment,
    by: GroupBy,
    options: &AttributionOptions,
) -> (Result<Measured>, Result<Measured>) {
    rayon::join(
        || measured(a, device, moment.clone(), by, options),
        || measured(b, device, moment.clone(), by, options),
    )
}

pub fn run_diff(args: &DiffArgs, out: &mut dyn Write) -> Result<()> {
    let options = Session::options(&args.attribution)?;
    let (base, new) = measured_both(
        &args.base,
        &args.new,
        args.device,
        args.at.clone(),
        args.by,
        &options,
    );
    let (base, new) = (base?, new?);
    let report = diff(&base.top, &new.top);
    if args.json {
        write_json(out, &report)?;
    } else {
        let style = Style::detect(std::io::stdout().is_terminal());
        write_diff_text(out, &report, args.limit, style)?;
    }
    Ok(())
}

pub fn run_check(args: &CheckArgs, out: &mut dyn Write) -> Result<()> {
    let metric: Metric = args
        .metric
        .parse()
        .map_err(|e: String| anyhow!("--metric: {e}"))?;
    let max_peak = crate::cmd::size_option("--max-peak", args.max_peak.as_deref())?;
    if max_peak.is_none() && args.baseline.is_none() {
        bail!("give --max-peak SIZE, --baseline SNAPSHOT, or both");
    }
    if !(args.tolerance.is_finite() && args.tolerance >= 0.0) {
        bail!(
            "--tolerance {}: expected a percentage of 0 or more",
            args.tolerance
        );
    }
    let options = Session::options(&args.attribution)?;
    let moment = args.at.clone().unwrap_or(Moment::Peak);
    let (file, baseline) = match &args.baseline {
        Some(base_path) => {
            let (file, base) = measured_both(
                &args.file,
                base_path,
                args.device,
                moment,
                args.by,
                &options,
            );
            let file = file?;
            (
                file,
                Some((base_path.to_string_lossy().into_owned(), base?)),
            )
        }
        None => (
            measured(&args.file, args.device, moment, args.by, &options)?,
            None,
        ),
    };
    let check_options = CheckOptions {
        metric,
        at: args.at.clone(),
        max_peak,
        tolerance_percent: args.tolerance,
    };
    let report = check(
        &file,
        baseline.as_ref().map(|(p, m)| (p.as_str(), m)),
        &check_options,
    );
    if args.json {
        write_json(out, &report)?;
    } else {
        let style = Style::detect(std::io::stdout().is_terminal());
        write_check_text(out, &report, style)?;
    }
    if report.passed {
        Ok(())
    } else {
        Err(CheckFailed.into())
    }
}
