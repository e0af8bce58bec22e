//! `vramlens summary`: reads every file (in parallel), prints one report per file in
//! argument order.

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
    // Parse every file first: a bad file fails the command before any output.
    let reports = args
        .files
        .par_iter()
        .map(|path| {
            let (snap, info) = read_snapshot(path, read)?;
            Ok(analyze_summary(&snap, &info, options))
        })
        .collect::<Result<Vec<_>, vramlens::input::ReadError>>()?;
    let style = Style::detect(std::io::stdout().is_terminal());
    for (i, report) in reports.iter().enumerate() {
        if args.json {
            write_json(out, report)?;
        } else {
            if i > 0 {
                writeln!(out)?;
            }
            write_summary_text(out, report, style)?;
        }
    }
    Ok(())
}
