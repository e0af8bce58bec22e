//! `vramlens segments`: the allocator's segments and blocks at one moment.

use super::read_snapshot;
use super::{attribution_options, check_output, write_new_file};
use crate::cli::SegmentsArgs;
use anyhow::{Result, anyhow};
use std::io::{IsTerminal, Write};
use vramlens::analysis::attribution::Attributor;
use vramlens::analysis::device::choose_device;
use vramlens::analysis::segment_map::segment_map;
use vramlens::analysis::top::{Versions, resolve_live};
use vramlens::input::ReadOptions;
use vramlens::render::segments_svg::write_segments_svg;
use vramlens::render::segments_text::write_segments_text;
use vramlens::render::{Style, write_json};
use vramlens::timeline::replay::DeviceReplay;

pub fn run(args: &SegmentsArgs, out: &mut dyn Write) -> Result<()> {
    let by = args.by;
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
    let map = segment_map(&snap, path, &r, &attr, by, resolved, &live);
    if let Some(o) = &args.output {
        write_new_file(o, args.force, |w| write_segments_svg(w, &map, &choice))?;
    }
    if args.json {
        write_json(out, &map)?;
    } else if args.output.is_none() {
        let style = Style::detect(std::io::stdout().is_terminal());
        write_segments_text(out, &map, &choice, style)?;
    }
    Ok(())
}
