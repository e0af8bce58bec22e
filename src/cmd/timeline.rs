//! `vramlens timeline`: replay one device, then draw it, list a live set, or print peaks.

use super::{check_output, read_device_logs, resolve_device, write_new_file};
use crate::cli::{TimelineArgs, XArg};
use anyhow::{Result, anyhow, bail};
use std::io::{IsTerminal, Write};
use vramlens::analysis::live::{Moment, live_set, resolve};
use vramlens::analysis::timeline_view::{ViewOptions, XAxis, build_view};
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::render::live::write_live_text;
use vramlens::render::timeline_svg::{ChartTitle, write_timeline_svg};
use vramlens::render::{Style, write_json};
use vramlens::timeline;

fn parse_window(s: &str, x: XAxis) -> Result<(f64, f64)> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| anyhow!("--window {s:?}: expected A..B"))?;
    let parse = |v: &str| -> Result<f64> {
        v.trim()
            .parse::<f64>()
            .map_err(|_| anyhow!("--window {s:?}: expected numbers, found {v:?}"))
    };
    let scale = if x == XAxis::Time { 1e3 } else { 1.0 };
    let (a, b) = (parse(a)? * scale, parse(b)? * scale);
    if b <= a {
        bail!("--window {s:?}: the end must be after the start");
    }
    Ok((a, b))
}

pub fn run(args: &TimelineArgs, out: &mut dyn Write) -> Result<()> {
    let x = match args.x {
        XArg::Events => XAxis::Events,
        XArg::Time => XAxis::Time,
    };
    let window = args
        .window
        .as_deref()
        .map(|w| parse_window(w, x))
        .transpose()?;
    let moment: Option<Moment> = args
        .at
        .as_deref()
        .map(|s| s.parse().map_err(|e: String| anyhow!("--at: {e}")))
        .transpose()?;
    check_output(args.output.as_deref(), args.force)?;
    let (snap, info) = read_snapshot(&args.file, ReadOptions { progress: true })?;
    let path = info.path.as_str();
    let device = resolve_device(&snap, path, args.device)?;
    let tl = timeline::build(&snap, device);
    let style = Style::detect(std::io::stdout().is_terminal());
    if let Some(o) = &args.output {
        let top = args.top.min(500);
        let options = ViewOptions {
            x,
            top,
            // Fewer columns when many bands are drawn keeps the file small.
            buckets: (60_000 / top.max(1)).clamp(200, 1000),
            window,
        };
        let mut view = build_view(&snap, &tl, options).map_err(|e| anyhow!("{path}: {e}"))?;
        if !args.nvml.is_empty() {
            let log = read_device_logs(&args.nvml, args.utc_offset)?;
            let samples = vramlens::analysis::reconcile::gpu_samples(&log, device);
            let rows = vramlens::analysis::reconcile::over_time(&tl, &log, &samples);
            vramlens::analysis::timeline_view::add_device_readings(&mut view, &rows);
        }
        let title = ChartTitle {
            path,
            device,
            events: tl.events(),
            peak_requested: tl.peak_requested.bytes,
            peak_event: tl.peak_requested.event.map(|e| e.index() as u32),
            peak_reserved: tl.peak_reserved.bytes,
        };
        write_new_file(o, args.force, |w| write_timeline_svg(w, &view, &title))?;
    }
    if let Some(m) = moment {
        let at = resolve(&snap, &tl, m).map_err(|e| anyhow!("{path}: {e}"))?;
        let live = live_set(&snap, path, &tl, at, args.frames);
        if args.json {
            write_json(out, &live)?;
        } else {
            write_live_text(out, &live, style)?;
        }
    } else if args.output.is_none() || args.json {
        let report = vramlens::analysis::timeline_report::report(path, &tl);
        if args.json {
            write_json(out, &report)?;
        } else {
            vramlens::render::timeline_text::write_timeline_text(out, &report, style)?;
        }
    }
    Ok(())
}
