//! `vramlens summary`: reads every file (in parallel; folders stand for their snapshot
//! files), prints one report per good file in argument order (a device log given alone is
//! summed up per GPU and process), a table of ranks when there are several snapshots,
//! then one error line per bad file.

use crate::cli::SummaryArgs;
use crate::cmd::read_snapshot;
use anyhow::Result;
use rayon::prelude::*;
use std::io::{IsTerminal, Write};
use vramlens::analysis::kinds::attribution::GroupBy;
use vramlens::analysis::reports::device_log::{LogSummary, analyze_device_log};
use vramlens::analysis::reports::ranks::{analyze_ranks, rank_input};
use vramlens::analysis::reports::summary::{SummaryOptions, analyze_summary};
use vramlens::input::ReadOptions;
use vramlens::render::device_log::write_device_log_text;
use vramlens::render::ranks::write_ranks_text;
use vramlens::render::summary::write_summary_text;
use vramlens::render::{Style, write_json};

/// What one file gave.
enum Read {
    Snapshot(
        Box<vramlens::analysis::reports::summary::Summary>,
        Option<vramlens::analysis::reports::ranks::RankInput>,
    ),
    Log(LogSummary),
}

/// A device log read whole and summed up. Every row counts in the sums; the rows
/// themselves fold into a few per GPU past the log's limit (the window is the whole
/// clock), so memory stays bounded on a log of any length.
fn read_log(path: &std::path::Path, utc_offset_minutes: i32) -> Result<LogSummary> {
    let whole_clock = vramlens::devlog::TimeRange::new(i64::MIN, i64::MAX);
    let log = crate::cmd::read_device_logs_in(
        std::slice::from_ref(&path.to_path_buf()),
        utc_offset_minutes,
        Some(whole_clock),
        &[],
    )?;
    Ok(analyze_device_log(
        &log,
        &crate::cmd::shown_path(path),
        utc_offset_minutes != 0,
    ))
}

pub fn run(args: &SummaryArgs, out: &mut dyn Write) -> Result<()> {
    let options = SummaryOptions {
        device: args.device,
    };
    let read = ReadOptions { progress: true };
    let files = crate::cmd::expand_inputs(&args.files)?;
    let ranks = (args.ranks || args.files.iter().any(|f| f.is_dir())) && files.len() > 1;
    // Every file is read (in parallel); the reports of the good ones are printed in
    // argument order, then each bad one gives an error line and the status is 2.
    let results: Vec<Result<_, anyhow::Error>> = files
        .par_iter()
        .map(|path| {
            if let Ok(Some(_)) = vramlens::input::device_log_kind_of(path) {
                return Ok(Read::Log(read_log(path, args.utc_offset)?));
            }
            let (snap, info) = read_snapshot(path, read)?;
            vramlens::analysis::device::check_device(&snap, args.device)
                .map_err(|e| anyhow::anyhow!("{}: {e}", info.path))?;
            let rank = ranks
                .then(|| rank_input(&snap, &info.path, &Default::default(), GroupBy::Callsite))
                .flatten();
            Ok(Read::Snapshot(
                Box::new(analyze_summary(&snap, &info, options)),
                rank,
            ))
        })
        .collect();
    let style = Style::detect(std::io::stdout().is_terminal());
    let mut errors = Vec::new();
    let mut printed = 0;
    let mut inputs = Vec::new();
    for result in results {
        let read = match result {
            Ok(read) => read,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        if !args.json && printed > 0 {
            writeln!(out)?;
        }
        match read {
            Read::Snapshot(report, rank) => {
                inputs.extend(rank);
                if args.json {
                    write_json(out, &report)?;
                } else {
                    write_summary_text(out, &report, style)?;
                }
            }
            Read::Log(report) => {
                if args.json {
                    write_json(out, &report)?;
                } else {
                    write_device_log_text(out, &report, style)?;
                }
            }
        }
        printed += 1;
    }
    if inputs.len() > 1 {
        let report = analyze_ranks(inputs, GroupBy::Callsite, 10);
        if args.json {
            write_json(out, &report)?;
        } else {
            writeln!(out)?;
            write_ranks_text(out, &report, style)?;
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(crate::cmd::Failures(errors).into()),
    }
}
