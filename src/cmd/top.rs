//! `vramlens top`: what was live at a moment, grouped.

use crate::cli::TopArgs;
use crate::cmd::read_snapshot;
use crate::cmd::session::Session;
use anyhow::{Result, anyhow};
use std::io::{IsTerminal, Write};
use vramlens::analysis::kinds::attribution::GroupBy;
use vramlens::analysis::reports::top::{Versions, resolve_live_bound, top_of};
use vramlens::input::ReadOptions;
use vramlens::render::top::write_top_text;
use vramlens::render::{Style, write_json};

pub fn run(args: &TopArgs, out: &mut dyn Write) -> Result<()> {
    let by = args.by;
    let options = Session::options(&args.attribution)?;
    let files = crate::cmd::expand_inputs(&args.files)?;
    if files.len() > 1 {
        return run_ranks(&files, by, &options, args, out);
    }
    let session = Session::open(&files[0], args.device, options)?;
    let (snap, path, choice) = (&session.snap, session.path(), &session.choice);
    let r = session.replay();
    let (found, attr) = resolve_live_bound(&r, args.at.clone(), Versions::Counted, (), || {
        session.bound_attributor(&r)
    });
    let found = found.map_err(|e| anyhow!("{path}: {e}"))?;
    let mut report = top_of(&r, path, choice, found, by, args.limit, &attr);
    if args.leaks {
        let at = report.moment.event.map(|e| e as usize);
        report.leaks = Some(vramlens::analysis::moments::leaks::find_leaks(
            snap, &r, &attr, by, at,
        ));
    }
    if args.json {
        write_json(out, &report)?;
    } else {
        let style = Style::detect(std::io::stdout().is_terminal());
        write_top_text(out, &report, choice, style)?;
    }
    Ok(())
}

/// Several files: one row per rank, outliers, and what differs at the peaks.
fn run_ranks(
    files: &[std::path::PathBuf],
    by: GroupBy,
    options: &vramlens::analysis::kinds::attribution::AttributionOptions,
    args: &TopArgs,
    out: &mut dyn Write,
) -> Result<()> {
    use rayon::prelude::*;
    let inputs: Vec<_> = files
        .par_iter()
        .map(|path| -> Result<_> {
            let (snap, info) = read_snapshot(path, ReadOptions { progress: true })?;
            vramlens::analysis::reports::ranks::rank_input(&snap, &info.path, options, by)
                .ok_or_else(|| anyhow!("{}: the file has no device", info.path))
        })
        // The first error in the order given, whichever thread met it first.
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    let report = vramlens::analysis::reports::ranks::analyze_ranks(inputs, by, args.limit);
    if args.json {
        write_json(out, &report)?;
    } else {
        let style = Style::detect(std::io::stdout().is_terminal());
        vramlens::render::ranks::write_ranks_text(out, &report, style)?;
    }
    Ok(())
}
