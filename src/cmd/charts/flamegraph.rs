//! `vramlens flamegraph`: the live set at a moment as a flame graph or folded stacks.

use crate::cli::FlamegraphArgs;
use crate::cmd::session::Session;
use crate::cmd::{check_output, write_new_file};
use anyhow::{Result, bail};
use std::io::Write;
use vramlens::analysis::kinds::flame::{FlameOptions, flame};
use vramlens::render::charts::flame_svg::{FlameTitle, write_flame_svg};
use vramlens::render::words::labels::{device_line, moment_text};
use vramlens::units::bytes;

fn write_folded(w: &mut dyn Write, lines: &[(String, u64)]) -> std::io::Result<()> {
    for (stack, b) in lines {
        writeln!(w, "{stack} {b}")?;
    }
    Ok(())
}

pub fn run(args: &FlamegraphArgs, out: &mut dyn Write) -> Result<()> {
    if args.output.is_none() && !args.folded {
        bail!("give -o FILE.svg for the flame graph, or --folded for folded stacks");
    }
    let options = Session::options(&args.attribution)?;
    check_output(args.output.as_deref(), args.force)?;
    let session = Session::open(&args.file, args.device, options)?;
    let at = session.live_at(args.at.clone())?;
    let flame_options = FlameOptions {
        all_frames: args.all_frames,
    };
    let (root, folded) = flame(&at.attr, &at.live, &flame_options);
    match (&args.output, args.folded) {
        (None, _) => write_folded(out, &folded)?,
        (Some(o), true) => write_new_file(o, args.force, |w| write_folded(w, &folded))?,
        (Some(o), false) => {
            let heading = format!("{}: {}", session.path(), device_line(&session.choice));
            let subtitle = format!(
                "{}: {} requested by {} live allocations",
                moment_text(&at.moment),
                bytes(at.live.requested_bytes),
                at.live.lifetimes.len()
            );
            let title = FlameTitle {
                heading: &heading,
                subtitle: &subtitle,
            };
            write_new_file(o, args.force, |w| write_flame_svg(w, &root, &title, None))?;
        }
    }
    Ok(())
}
