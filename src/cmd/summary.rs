//! `vramlens summary`: reads every file (in parallel), prints one report per good file in
//! argument order, then one error line per bad file.

use crate::cli::SummaryArgs;
use anyhow::Result;
use rayon::prelude::*;
use std::io::{IsTerminal, Write};
use vramlens::analysis::summary::{SummaryOptions, analyze_summary};
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::render::summary::write_summary_text;
use vramlens::render::{Style, write_json};

pub fn run(args: &SummaryArgs, out: &mut dyn Write) -> Result<()> {
    let options = SummaryOptions {
        device: args.device,
    };
    let read = ReadOptions { progress: true };
    // Every file is read (in parallel); the reports of the good ones are printed in
    // argument order, then each bad one gives an error line and the status is 2.
    let results: Vec<Result<_, anyhow::Error>> = args
        .files
        .par_iter()
        .map(|path| {
            let (snap, info) = read_snapshot(path, read)?;
            vramlens::analysis::device::check_device(&snap, args.device)
                .map_err(|e| anyhow::anyhow!("{}: {e}", info.path))?;
            Ok(analyze_summary(&snap, &info, options))
        })
        .collect();
    let style = Style::detect(std::io::stdout().is_terminal());
    let mut errors = Vec::new();
    let mut printed = 0;
    for result in results {
        let report = match result {
            Ok(report) => report,
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
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(super::Failures(errors).into()),
    }
}
