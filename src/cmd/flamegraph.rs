//! `vramlens flamegraph`: the live set at a moment as a flame graph or folded stacks.

use super::read_snapshot;
use super::{attribution_options, check_output, write_new_file};
use crate::cli::FlamegraphArgs;
use anyhow::{Result, anyhow, bail};
use std::io::Write;
use vramlens::analysis::attribution::Attributor;
use vramlens::analysis::device::choose_device;
use vramlens::analysis::flame::{FlameOptions, flame};
use vramlens::analysis::top::{Versions, resolve_live};
use vramlens::input::ReadOptions;
use vramlens::render::flame_svg::{FlameTitle, write_flame_svg};
use vramlens::render::names::{device_line, moment_text};
use vramlens::timeline::replay::DeviceReplay;
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
    let moment = args.at.clone();
    let options = attribution_options(&args.attribution)?;
    check_output(args.output.as_deref(), args.force)?;
    let (snap, info) = read_snapshot(&args.file, ReadOptions { progress: true })?;
    let path = info.path.as_str();
    let choice = choose_device(&snap, args.device).map_err(|e| anyhow!("{path}: {e}"))?;
    let r = DeviceReplay::new(&snap, choice.device);
    let (resolved, live) =
        resolve_live(&r, moment, Versions::NotNeeded).map_err(|e| anyhow!("{path}: {e}"))?;
    let mut attr = Attributor::new(&snap.frames, &options);
    attr.bind_to(&r);
    let flame_options = FlameOptions {
        all_frames: args.all_frames,
    };
    let (root, folded) = flame(&attr, &live, &flame_options);
    match (&args.output, args.folded) {
        (None, _) => write_folded(out, &folded)?,
        (Some(o), true) => write_new_file(o, args.force, |w| write_folded(w, &folded))?,
        (Some(o), false) => {
            let heading = format!("{path}: {}", device_line(&choice));
            let subtitle = format!(
                "{}: {} requested by {} live allocations",
                moment_text(&resolved),
                bytes(live.requested_bytes),
                live.lifetimes.len()
            );
            let title = FlameTitle {
                heading: &heading,
                subtitle: &subtitle,
            };
            write_new_file(o, args.force, |w| write_flame_svg(w, &root, &title))?;
        }
    }
    Ok(())
}
