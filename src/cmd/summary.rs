//! `vramlens summary`: reads every file (in parallel; folders stand for their snapshot
//! files), prints one report per good file in argument order, a table of ranks when there
//! are several, then one error line per bad file.

use crate::cli::SummaryArgs;
use crate::cmd::read_snapshot;
use anyhow::Result;
use rayon::prelude::*;
use std::io::{IsTerminal, Write};
use vramlens::analysis::kinds::attribution::GroupBy;
use vramlens::analysis::reports::ranks::{analyze_ranks, rank_input};
use vramlens::analysis::reports::summary::{SummaryOptions, analyze_summary};
use vramlens::input::ReadOptions;
use vramlens::render::ranks::write_ranks_text;
use vramlens::render::summary::write_summary_text;
use vramlens::render::{Style, write_json};

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
            let (snap, info) = read_snapshot(path, read)?;
            vramlens::analysis::device::check_device(&snap, args.device)
                .map_err(|e| anyhow::anyhow!("{}: {e}", info.path))?;
            let rank = ranks
                .then(|| rank_input(&snap, &info.path, &Default::default(), GroupBy::Callsite))
                .flatten();
            Ok((analyze_summary(&snap, &info, options), rank))
        })
        .collect();
    let style = Style::detect(std::io::stdout().is_terminal());
    let mut errors = Vec::new();
    let mut printed = 0;
    let mut inputs = Vec::new();
    for result in results {
        let report = match result {
            Ok((report, rank)) => {
                inputs.extend(rank);
                report
            }
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        if args.json {
            write_json(out, &report)?;
        } else {
            if printed > 0 {
                writeln!(out)?;
            }
            write_summary_text(out, &report, style)?;
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
