//! `vramlens timeline`: replay one device, then draw it, list a live set, or print peaks.

use crate::cli::{TimelineArgs, XArg};
use crate::cmd::read_snapshot;
use crate::cmd::{attribution_options, check_output, write_new_file};
use anyhow::{Context, Result, anyhow, bail};
use std::io::{IsTerminal, Write};
use vramlens::analysis::device::align::line_up;
use vramlens::analysis::device::choose_device;
use vramlens::analysis::device::trace_lanes::{LaneKind, TraceLanes, build_lanes};
use vramlens::analysis::moments::chart::{
    TimelineView, ViewOptions, XAxis, build_view_zoomed, chart_axis,
};
use vramlens::analysis::moments::live::live_set;
use vramlens::analysis::reports::top::{Versions, resolve_live};
use vramlens::devlog::{read_profile, to_snapshot};
use vramlens::input::ReadOptions;
use vramlens::input::SourceInfo;
use vramlens::model::{DeviceTrace, Snapshot};
use vramlens::render::charts::timeline_svg::{ChartTitle, ZoomPanel, write_timeline_svg};
use vramlens::render::device::align::line_up_error_text;
use vramlens::render::moments::live::write_live_text;
use vramlens::render::{Style, write_json};
use vramlens::timeline::replay::DeviceReplay;

fn parse_window(s: &str, x: XAxis) -> Result<(f64, f64)> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| anyhow!("--window {s:?}: expected A..B"))?;
    let parse = |v: &str| -> Result<f64> {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| anyhow!("--window {s:?}: expected numbers, found {v:?}"))
            .and_then(|n| {
                // Past 2^53 a float no longer holds every whole number: no trace has that
                // many events or milliseconds, and the number would be shown changed.
                if n.abs() > 9_007_199_254_740_992.0 {
                    bail!(
                        "--window {s:?}: {} is past any trace (at most 9007199254740992 events or milliseconds)",
                        v.trim()
                    )
                }
                Ok(n)
            })
    };
    let scale = if x == XAxis::Time { 1e3 } else { 1.0 };
    let (a, b) = (parse(a)? * scale, parse(b)? * scale);
    if b <= a {
        bail!("--window {s:?}: the end must be after the start");
    }
    // The finest step the axis has there: a microsecond on a time axis, and the spacing
    // of floats that far along (2 us past 2^53 us). A narrower window has no positions to
    // draw at.
    let spacing = {
        let v = a.abs().max(b.abs());
        f64::from_bits(v.to_bits() + 1) - v
    };
    let finest = if x == XAxis::Time {
        spacing.max(1.0)
    } else {
        spacing
    };
    if b - a < finest {
        let step = format!("{:.6}", finest / scale);
        bail!(
            "--window {s:?}: narrower than {} {}, the finest step the axis has there; give a wider window",
            step.trim_end_matches('0').trim_end_matches('.'),
            if x == XAxis::Time {
                "milliseconds"
            } else {
                "events"
            }
        );
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
    if window.is_some() && args.output.is_none() {
        bail!("--window selects what the chart draws: give -o FILE.svg with it");
    }
    if args.trace.is_some() && args.output.is_none() {
        bail!("--trace draws the trace's spans under the chart: give -o FILE.svg with it");
    }
    let by = args.by;
    let moment = args.at.clone();
    let options = attribution_options(&args.attribution)?;
    check_output(args.output.as_deref(), args.force)?;
    let (snap, info) = read_snapshot(&args.file, ReadOptions { progress: true })?;
    let path = info.path.as_str();
    let choice = choose_device(&snap, args.device).map_err(|e| anyhow!("{path}: {e}"))?;
    let device = choice.device;
    let r = DeviceReplay::new(&snap, device);
    // One attributor for the device, bound to its categories, for the chart and the
    // listing alike; the chart's axis is read beside it.
    let (attr, axis) = rayon::join(
        || {
            (args.output.is_some() || moment.is_some())
                .then(|| vramlens::analysis::kinds::categories::bound_attributor(&r, &options))
        },
        || args.output.is_some().then(|| chart_axis(&r, x)),
    );
    let style = Style::detect(std::io::stdout().is_terminal());
    if let Some(o) = &args.output {
        let view_options = ViewOptions {
            window,
            ..ViewOptions::new(x, by, args.top)
        };
        let attr = attr.as_ref().expect("bound for a chart");
        // The moment that matters, drawn again wider when the whole chart squeezes it.
        let axis = axis
            .expect("read for a chart")
            .map_err(|e| anyhow!("{path}: {e}"))?;
        let (mut view, mut zoomed) = build_view_zoomed(&snap, &r, attr, &axis, view_options)
            .map_err(|e| anyhow!("{path}: {e}"))?;
        if let Some((_, z)) = zoomed.as_mut() {
            vramlens::analysis::moments::chart::stack_like(z, &view);
        }
        if !args.nvml.is_empty() {
            // Only readings near the device's trace are drawn: the log is streamed, and
            // a long one folded into a bounded series.
            use vramlens::analysis::device::reconcile::{
                LOG_MARGIN_US, focus_ranges, snapshot_range,
            };
            let keep = snapshot_range(&snap, Some(device)).map(|r| r.widen(LOG_MARGIN_US));
            let focus = focus_ranges(&snap, Some(device));
            let log =
                crate::cmd::read_device_logs_in(&args.nvml, args.clock.utc_offset, keep, &focus)?;
            let samples = vramlens::analysis::device::reconcile::gpu_samples(&log, device);
            let rows = vramlens::analysis::device::reconcile::readings_over_time(
                &snap, device, &log, &samples,
            );
            vramlens::analysis::moments::chart::add_device_readings(&mut view, &rows);
            if let Some((_, z)) = zoomed.as_mut() {
                vramlens::analysis::moments::chart::add_device_readings(z, &rows);
            }
        }
        let zoom_panel = zoomed
            .as_ref()
            .map(|(zoom, view)| ZoomPanel { zoom: *zoom, view });
        let title = ChartTitle {
            path,
            device: &choice,
            events: r.len(),
            peak_requested: view.requested_peak.bytes,
            peak_event: view.requested_peak.event.map(|e| e.index() as u32),
            peak_reserved: view.reserved_recorded.then_some(view.reserved_peak.bytes),
        };
        let lanes = trace_lanes(args, &snap, &info, device, &view, r.trace)?;
        write_new_file(o, args.force, |w| {
            write_timeline_svg(w, &view, &title, lanes.as_ref(), zoom_panel.as_ref(), None)
        })?;
    }
    if let Some(m) = moment {
        let (resolved, live) =
            resolve_live(&r, m, Versions::Counted).map_err(|e| anyhow!("{path}: {e}"))?;
        let attr = attr.as_ref().expect("bound for a moment");
        let listing = live_set(
            &snap,
            attr,
            path,
            &choice,
            resolved,
            &live,
            r.trace,
            args.frames,
        );
        if args.json {
            write_json(out, &listing)?;
        } else {
            write_live_text(out, &listing, &choice, style)?;
        }
    } else if args.output.is_none() || args.json {
        let report = vramlens::analysis::moments::peaks::report(path, &r)
            .map_err(|e| anyhow!("{path}: {e}"))?;
        if args.json {
            write_json(out, &report)?;
        } else {
            vramlens::render::moments::timeline_text::write_timeline_text(
                out, &report, &choice, style,
            )?;
        }
    }
    Ok(())
}

/// The spans of `--trace` lined up with the snapshot, or those of the input itself when it
/// is a profiler trace; None otherwise.
fn trace_lanes(
    args: &TimelineArgs,
    snap: &Snapshot,
    info: &SourceInfo,
    device: i64,
    view: &TimelineView,
    trace: &DeviceTrace,
) -> Result<Option<TraceLanes>> {
    let (path, alignment) = match &args.trace {
        Some(p) => (p.as_path(), true),
        None if info.format == vramlens::input::SourceFormat::KinetoTrace
            && args.file.as_os_str() != "-" =>
        {
            (args.file.as_path(), false)
        }
        None => return Ok(None),
    };
    let shown = path.display().to_string();
    let file =
        vramlens::input::open_side_input(path).with_context(|| format!("cannot read {shown}"))?;
    let profile = read_profile(file).with_context(|| format!("failed to read trace {shown}"))?;
    let alignment = if alignment {
        let converted = to_snapshot(&profile);
        let lined = line_up(snap, device, &converted)
            .map_err(|e| anyhow!(line_up_error_text(&e, &shown, &info.path, device)))?;
        Some(lined.alignment)
    } else {
        None
    };
    let mut lanes = build_lanes(&profile, &shown, alignment, view, trace);
    if let Some(options) = crate::cmd::REDACT.get() {
        for lane in lanes.lanes.iter_mut() {
            if lane.kind == LaneKind::Annotations {
                let mut names: Vec<String> = lane.spans.iter().map(|s| s.name.clone()).collect();
                vramlens::redact::annotation_names(&mut names, options);
                for (s, n) in lane.spans.iter_mut().zip(names) {
                    s.name = n;
                }
            }
        }
    }
    Ok(Some(lanes))
}
