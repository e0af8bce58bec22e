//! `vramlens segments`: the allocator's segments and blocks at one moment.

use crate::cli::SegmentsArgs;
use crate::cmd::session::Session;
use crate::cmd::{check_output, write_new_file};
use anyhow::Result;
use std::io::{IsTerminal, Write};
use vramlens::analysis::moments::segment_map::segment_map;
use vramlens::render::charts::segments_svg::write_segments_svg;
use vramlens::render::moments::segments_text::write_segments_text;
use vramlens::render::{Style, write_json};

pub fn run(args: &SegmentsArgs, out: &mut dyn Write) -> Result<()> {
    let options = Session::options(&args.attribution)?;
    check_output(args.output.as_deref(), args.force)?;
    let session = Session::open(&args.file, args.device, options)?;
    let at = session.live_at(args.at.clone())?;
    let map = segment_map(
        &session.snap,
        session.path(),
        &at.replay,
        &at.attr,
        args.by,
        at.moment,
        &at.live,
    );
    let choice = &session.choice;
    if let Some(o) = &args.output {
        write_new_file(o, args.force, |w| write_segments_svg(w, &map, choice, None))?;
    }
    if args.json {
        write_json(out, &map)?;
    } else if args.output.is_none() {
        let style = Style::detect(std::io::stdout().is_terminal());
        write_segments_text(out, &map, choice, style)?;
    }
    Ok(())
}
