//! The timeline chart as SVG: stacked bands for the largest allocations over a merged band
//! for the rest, the reserved line, OOM and snapshot markers, annotation spans, axes in
//! binary units, a legend and a title. Every band has a tooltip and its exact size in
//! `data-bytes`.

use crate::analysis::device::DeviceChoice;
use crate::analysis::device::trace_lanes::{Lane, LaneKind, TraceLanes};
use crate::analysis::kinds::attribution::GroupKind;
use crate::analysis::moments::chart::{
    Band, BandBy, MarkerKind, TimelineView, XAxis, Zoom, ZoomAround,
};
use crate::render::charts::svg::{Colors, Svg, color, escape, num};
use crate::render::words::labels::{device_line, group_display, tiny_frame};
use crate::units::{Clock, bytes, duration_us};
use std::io::{self, Write};

const WIDTH: f64 = 1280.0;
const HEIGHT: f64 = 640.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 330.0;
const TOP: f64 = 78.0;
const BOTTOM: f64 = 56.0;
/// Height of one lane of profiler spans under the chart, and of a span in it.
const LANE_H: f64 = 24.0;
const SPAN_H: f64 = 18.0;

/// What the title says.
pub struct ChartTitle<'a> {
    pub path: &'a str,
    pub device: &'a DeviceChoice,
    pub events: usize,
    pub peak_requested: u64,
    pub peak_event: Option<u32>,
    /// None where the file records no reserved memory.
    pub peak_reserved: Option<u64>,
}

struct Frame {
    x_min: f64,
    x_span: f64,
    y_max: f64,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x_min) / self.x_span * (WIDTH - LEFT - RIGHT)
    }
    fn py(&self, b: f64) -> f64 {
        let h = HEIGHT - TOP - BOTTOM;
        TOP + h - (b / self.y_max).clamp(0.0, 1.0) * h
    }
}

/// A step line through (x0, x1, y) segments, merging equal levels.
fn steps(segments: impl Iterator<Item = (f64, f64, f64)>) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = Vec::new();
    let mut level: Option<f64> = None;
    let mut end = 0.0;
    for (x0, x1, y) in segments {
        if level != Some(y) {
            if level.is_some() {
                pts.push((x0, level.unwrap_or(y)));
            }
            pts.push((x0, y));
            level = Some(y);
        }
        end = x1;
    }
    if let Some(y) = level {
        pts.push((end, y));
    }
    pts
}

/// Power-of-two tick step for about `ticks` ticks up to `max` bytes.
fn byte_step(max: f64, ticks: f64) -> f64 {
    let raw = if max.is_finite() {
        (max / ticks).max(1.0)
    } else {
        1.0
    };
    2f64.powi(raw.log2().ceil() as i32)
}

/// 1, 2 or 5 times a power of ten.
fn decimal_step(span: f64, ticks: f64) -> f64 {
    crate::render::charts::svg::round_step((span / ticks).max(1e-9), &[1.0, 2.0, 5.0, 10.0])
}

/// A band's colour: the one the chart's (or the report's) [`Colors`] give it, the same in
/// the zoom panel, the segments map and the flame graph.
fn band_color(band: &Band, colors: &Colors) -> String {
    colors.group(&band.name, band.kind)
}

fn band_title(b: &Band, clock: Clock) -> String {
    let time = |t: Option<i64>| {
        t.filter(|&t| t > 0)
            .map(|t| format!(", {}", clock.time(t)))
            .unwrap_or_default()
    };
    let mut s = match &b.allocation {
        None => format!(
            "{}\nup to {} ({} bytes) in {} allocation{}; category {}\n",
            group_display(&b.name, b.kind),
            bytes(b.max_bytes),
            b.max_bytes,
            b.count,
            if b.count == 1 { "" } else { "s" },
            b.category
        ),
        Some(a) => {
            let mut s = format!(
                "{}  {} ({} bytes requested); category {}\n",
                a.label,
                bytes(b.max_bytes),
                b.max_bytes,
                b.category
            );
            match a.alloc_event {
                Some(e) => s.push_str(&format!(
                    "allocated at event {e}{}\n",
                    time(a.alloc_time_us)
                )),
                None => s.push_str("allocated before the trace began\n"),
            }
            match (a.free_event, a.alloc_time_us, a.free_time_us) {
                (Some(e), Some(x), Some(f)) if x > 0 && f > 0 => s.push_str(&format!(
                    "freed at event {e}, lived {}\n",
                    duration_us(f - x)
                )),
                (Some(e), _, _) => s.push_str(&format!("freed at event {e}\n")),
                (None, _, _) => s.push_str("still allocated at the end of the trace\n"),
            }
            s.push_str(&format!(
                "stream {}",
                if a.stream == 0 {
                    "default".into()
                } else {
                    format!("0x{:x}", a.stream)
                }
            ));
            if let Some((x, p)) = a.pool_id.filter(|p| *p != (0, 0)) {
                s.push_str(&format!(", private pool ({x}, {p})"));
            }
            s.push('\n');
            s
        }
    };
    if b.frames.is_empty() {
        s.push_str("(no Python frames recorded)");
    } else {
        s.push_str("stack of the largest allocation, innermost first:\n");
    }
    for f in &b.frames {
        s.push_str(f);
        s.push('\n');
    }
    s.trim_end().to_string()
}

/// A second panel under the chart: the range of `zoom` drawn from its own view.
pub struct ZoomPanel<'a> {
    pub zoom: Zoom,
    pub view: &'a TimelineView,
}

/// Writes the chart, and under it the zoom panel when one is given. Output depends only
/// on the views and title.
///
/// `colors`: those of the report the chart is part of; without, the chart's own (no two
/// bands of the chart and its zoom panel share one).
pub fn write_timeline_svg(
    out: &mut dyn Write,
    view: &TimelineView,
    title: &ChartTitle,
    lanes: Option<&TraceLanes>,
    zoom: Option<&ZoomPanel>,
    colors: Option<&Colors>,
) -> io::Result<()> {
    let own;
    let colors = match colors {
        Some(c) => c,
        None => {
            own = Colors::new(
                view.bands
                    .iter()
                    .chain(zoom.iter().flat_map(|z| &z.view.bands))
                    .map(|b| (b.name.as_str(), b.kind)),
            );
            &own
        }
    };
    let mut svg = Svg { out };
    let heading = format!("{}: {}", title.path, device_line(title.device));
    let main_height = HEIGHT + lanes.map_or(0.0, lanes_height);
    let height = main_height + zoom.map_or(0.0, |_| HEIGHT);
    svg.begin(WIDTH, height, &format!("vramlens timeline of {heading}"))?;
    write_panel(
        &mut svg,
        view,
        title,
        lanes,
        zoom.map(|z| z.zoom),
        None,
        colors,
    )?;
    if let Some(z) = zoom {
        writeln!(
            svg.out,
            r#"<g transform="translate(0,{})">"#,
            num(main_height)
        )?;
        write_panel(
            &mut svg,
            z.view,
            title,
            None,
            Some(z.zoom),
            Some(view),
            colors,
        )?;
        writeln!(svg.out, "</g>")?;
    }
    svg.end()
}

/// The zoom's range as `--window` takes it: events, or milliseconds.
fn window_arg(view: &TimelineView, z: Zoom) -> String {
    match view.x_axis {
        XAxis::Events => format!("{}..{}", z.x0.floor(), z.x1.ceil()),
        XAxis::Time => format!("{:.3}..{:.3}", z.x0 / 1e3, z.x1 / 1e3),
    }
}

/// One chart: the whole view (`main` None, with the zoom's range outlined) or the zoom
/// panel (`main` the whole chart's view, headed by what it shows).
fn write_panel(
    svg: &mut Svg,
    view: &TimelineView,
    title: &ChartTitle,
    lanes: Option<&TraceLanes>,
    zoom: Option<Zoom>,
    main: Option<&TimelineView>,
    colors: &Colors,
) -> io::Result<()> {
    let zoomed = main.is_some();
    let y_max = (view.max_bytes as f64 * 1.08).max(1.0);
    let f = Frame {
        x_min: view.x_min,
        x_span: (view.x_max - view.x_min).max(1.0),
        y_max,
    };
    if let (true, Some(z)) = (zoomed, zoom) {
        let what = match z.around {
            ZoomAround::Oom => "the OOM",
            ZoomAround::Peak => "the peak",
        };
        svg.text(
            LEFT,
            22.0,
            "start",
            r#" font-size="14" font-weight="bold""#,
            &format!("around {what}, drawn wider"),
        )?;
        svg.text(
            LEFT,
            40.0,
            "start",
            "",
            &format!(
                "the outlined range above; draw any range alone with --window {}",
                window_arg(view, z)
            ),
        )?;
    } else {
        write_heading(svg, title)?;
    }
    write_body(svg, view, &f, lanes, zoom.filter(|_| !zoomed), main, colors)
}

/// The chart's two heading lines: the file and device, then the peaks.
fn write_heading(svg: &mut Svg, title: &ChartTitle) -> io::Result<()> {
    svg.text(
        LEFT,
        22.0,
        "start",
        r#" font-size="16" font-weight="bold""#,
        &format!("{}: device {}", title.path, title.device.device),
    )?;
    let peak_at = match title.peak_event {
        Some(e) => format!(" at event {e}"),
        None => " before the first event".into(),
    };
    svg.text(
        LEFT,
        40.0,
        "start",
        "",
        &format!(
            "peak requested {}{peak_at}; {}; {} events{}",
            bytes(title.peak_requested),
            title.peak_reserved.map_or_else(
                || "reserved not recorded".to_string(),
                |b| format!("peak reserved {}", bytes(b))
            ),
            title.events,
            match title.device.others.len() {
                0 => String::new(),
                _ => format!(
                    " ({})",
                    device_line(title.device)
                        .split_once(" (")
                        .map_or("", |(_, rest)| rest.trim_end_matches(')'))
                ),
            }
        ),
    )?;
    Ok(())
}

/// What every piece of the body reads: the view drawn, its frame, and the whole chart's
/// view when this is the zoom panel.
struct Panel<'a> {
    view: &'a TimelineView,
    f: &'a Frame,
    main: Option<&'a TimelineView>,
    colors: &'a Colors,
}

/// The bottom edge of the plot area.
const PLOT_BOTTOM: f64 = HEIGHT - BOTTOM;
/// The right edge of the plot area; the legend is right of it.
const PLOT_RIGHT: f64 = WIDTH - RIGHT;

/// Everything under the heading: spans, axes, bands, lines, markers, legend, lanes; the
/// zoom's range outlined when given.
fn write_body(
    svg: &mut Svg,
    view: &TimelineView,
    f: &Frame,
    lanes: Option<&TraceLanes>,
    outline: Option<Zoom>,
    main: Option<&TimelineView>,
    colors: &Colors,
) -> io::Result<()> {
    let p = Panel {
        view,
        f,
        main,
        colors,
    };
    draw_y_axis(svg, f)?;
    draw_x_axis(svg, &p)?;
    // Everything drawn against the x axis, in a viewport of the plot's width: a zoom of
    // the report shows a part of it there, the axes and legend staying where they are.
    let plot_height = HEIGHT + lanes.map_or(0.0, lanes_height);
    writeln!(
        svg.out,
        r#"<svg class="plot" x="{l}" y="0" width="{w}" height="{h}" viewBox="{l} 0 {w} {h}" preserveAspectRatio="none">"#,
        l = num(LEFT),
        w = num(PLOT_RIGHT - LEFT),
        h = num(plot_height)
    )?;
    draw_annotations(svg, &p)?;
    draw_rest_band(svg, &p)?;
    draw_bands(svg, &p)?;
    draw_peak(svg, &p)?;
    // Under the reserved line, which it starts from.
    draw_device_gap(svg, &p)?;
    draw_memory_lines(svg, &p)?;
    draw_device_lines(svg, &p)?;
    draw_markers(svg, &p)?;
    if let Some(z) = outline {
        draw_outline(svg, f, z)?;
    }
    if let Some(l) = lanes {
        write_lane_spans(svg, f, l, view.clock)?;
    }
    writeln!(svg.out, "</svg>")?;
    // Frame of the plot area.
    svg.line(
        LEFT,
        PLOT_BOTTOM,
        PLOT_RIGHT,
        PLOT_BOTTOM,
        r##" stroke="#333""##,
    )?;
    svg.line(LEFT, TOP, LEFT, PLOT_BOTTOM, r##" stroke="#333""##)?;
    let ly = legend_lines(svg, view)?;
    legend_bands(svg, &p, ly)?;
    if view.annotations_dropped > 0 {
        svg.text(
            LEGEND_X,
            HEIGHT - 14.0,
            "start",
            r#" font-size="10""#,
            &format!(
                "{} short annotation spans not drawn",
                view.annotations_dropped
            ),
        )?;
    }
    if let Some(l) = lanes {
        write_lane_labels(svg, l)?;
    }
    Ok(())
}

/// The grid and the y axis, in binary units.
fn draw_y_axis(svg: &mut Svg, f: &Frame) -> io::Result<()> {
    let step = byte_step(f.y_max, 6.0);
    for v in crate::render::charts::svg::axis_ticks(0.0, f.y_max, step) {
        let y = f.py(v);
        svg.line(LEFT, y, PLOT_RIGHT, y, r##" stroke="#e4e4e4""##)?;
        svg.text(LEFT - 6.0, y + 4.0, "end", "", &bytes(v as u64))?;
    }
    Ok(())
}

/// The x axis, in a group that says its range: the report's script draws its ticks anew
/// for the part of the range a zoom shows. Then the axis label.
fn draw_x_axis(svg: &mut Svg, p: &Panel) -> io::Result<()> {
    let (view, f) = (p.view, p.f);
    let (unit, scale, label) = match view.x_axis {
        XAxis::Events => ("", 1.0, "event".to_string()),
        XAxis::Time if f.x_span < 2e6 => (" ms", 1e3, "time since the first event (ms)".into()),
        XAxis::Time => (" s", 1e6, "time since the first event (s)".into()),
    };
    writeln!(
        svg.out,
        r#"<g class="x-axis" data-x-min="{}" data-x-max="{}" data-scale="{}" data-unit="{}" data-left="{}" data-right="{}" data-y="{}">"#,
        view.x_min,
        f.x_min + f.x_span,
        scale,
        unit.trim(),
        num(LEFT),
        num(PLOT_RIGHT),
        num(PLOT_BOTTOM)
    )?;
    let xs = decimal_step(f.x_span / scale, 8.0) * scale;
    for x in crate::render::charts::svg::axis_ticks(view.x_min, view.x_max + 1e-9, xs) {
        let px = f.px(x);
        svg.line(
            px,
            PLOT_BOTTOM,
            px,
            PLOT_BOTTOM + 5.0,
            r##" stroke="#333""##,
        )?;
        let text = format!("{}{unit}", num(x / scale));
        svg.text(px, PLOT_BOTTOM + 18.0, "middle", "", &text)?;
    }
    writeln!(svg.out, "</g>")?;
    svg.text(
        (LEFT + PLOT_RIGHT) / 2.0,
        HEIGHT - 14.0,
        "middle",
        "",
        &label,
    )
}

/// Annotation spans in a strip above the plot, each labelled as far as the label fits.
fn draw_annotations(svg: &mut Svg, p: &Panel) -> io::Result<()> {
    for (i, a) in p.view.annotations.iter().enumerate() {
        let (x0, x1) = (p.f.px(a.x0), p.f.px(a.x1));
        let fill = if i % 2 == 0 { "#dfe7f2" } else { "#c9d6ea" };
        svg.rect(
            x0,
            50.0,
            (x1 - x0).max(1.0),
            20.0,
            &format!(r#" fill="{fill}""#),
            Some(&a.name),
        )?;
        // The label as far as it fits: `Optimizer.step#AdamW.step` reads as its first
        // part, cut with an ellipsis when the span is narrower still.
        let short = a.name.split('#').next().unwrap_or(&a.name);
        if let Some(label) = fit_label(short, x1 - x0) {
            svg.text(
                (x0 + x1) / 2.0,
                64.0,
                "middle",
                r#" font-size="10""#,
                &label,
            )?;
        }
    }
    Ok(())
}

/// What the merged band holds: so many other allocations, or other groups.
fn rest_name(view: &TimelineView) -> String {
    let n = view.rest_groups;
    match view.by {
        BandBy::Allocation => crate::units::count(n, "other allocation", "other allocations"),
        BandBy::Group(_) => crate::units::count(n, "other group", "other groups"),
    }
}

/// The most the merged band holds in any bucket.
fn max_rest(view: &TimelineView) -> u64 {
    view.buckets.iter().map(|b| b.rest_bytes).max().unwrap_or(0)
}

/// Everything not in a band, as one band at the bottom; nothing when it never holds a
/// byte.
fn draw_rest_band(svg: &mut Svg, p: &Panel) -> io::Result<()> {
    let (view, f) = (p.view, p.f);
    let rest_top = steps(
        view.buckets
            .iter()
            .map(|b| (f.px(b.x0), f.px(b.x1), f.py(b.rest_bytes as f64))),
    );
    let max_rest = max_rest(view);
    if !rest_top.is_empty() && max_rest > 0 {
        let mut pts = rest_top.clone();
        pts.push((pts.last().map_or(LEFT, |q| q.0), PLOT_BOTTOM));
        pts.push((pts[0].0, PLOT_BOTTOM));
        svg.polygon(
            &pts,
            &format!(
                r##" fill="#c8c8c8" stroke="#9a9a9a" stroke-width="0.5" data-bytes="{max_rest}""##
            ),
            Some(&format!(
                "{}, merged (at most {} at once)",
                rest_name(view),
                bytes(max_rest)
            )),
        )?;
    }
    Ok(())
}

/// The bands, bottom to top. A band in several runs has one tooltip for all of them, so
/// its stack is written once.
fn draw_bands(svg: &mut Svg, p: &Panel) -> io::Result<()> {
    let (view, f) = (p.view, p.f);
    for band in &view.bands {
        let fill = band_color(band, p.colors);
        let tip = band_title(band, view.clock);
        let grouped = band.runs.len() > 1;
        if grouped {
            writeln!(svg.out, "<g><title>{}</title>", escape(&tip))?;
        }
        for (start, cells) in &band.runs {
            let segs: Vec<(f64, f64, u64, u64)> = cells
                .iter()
                .enumerate()
                .map(|(j, &(bottom, height))| {
                    let b = &view.buckets[start + j];
                    (f.px(b.x0), f.px(b.x1), bottom, height)
                })
                .collect();
            let top = steps(
                segs.iter()
                    .map(|&(a, b, y, h)| (a, b, f.py((y + h) as f64))),
            );
            let mut bottom = steps(segs.iter().map(|&(a, b, y, _)| (a, b, f.py(y as f64))));
            bottom.reverse();
            let mut pts = top;
            pts.extend(bottom);
            svg.polygon(
                &pts,
                &format!(
                    r##" fill="{fill}" stroke="#ffffff" stroke-width="0.4" data-bytes="{}" data-label="{}""##,
                    band.max_bytes,
                    escape(&band.name)
                ),
                (!grouped).then_some(tip.as_str()),
            )?;
        }
        if grouped {
            writeln!(svg.out, "</g>")?;
        }
    }
    Ok(())
}

/// The peak of requested memory: a glyph and its label, kept inside the plot.
fn draw_peak(svg: &mut Svg, p: &Panel) -> io::Result<()> {
    let Some(peak) = &p.view.peak else {
        return Ok(());
    };
    let (px, py) = (p.f.px(peak.x), p.f.py(peak.bytes as f64));
    svg.polygon(
        &[(px - 5.0, py - 9.0), (px + 5.0, py - 9.0), (px, py - 1.0)],
        &format!(r##" fill="#111111" class="glyph" data-x="{}""##, num(px)),
        Some(&format!(
            "peak: {} requested{}",
            bytes(peak.bytes),
            peak.event
                .map(|e| format!(" after event {e}"))
                .unwrap_or_default()
        )),
    )?;
    let (x, anchor) = if px > PLOT_RIGHT - 120.0 {
        (px - 8.0, "end")
    } else {
        (px + 8.0, "start")
    };
    svg.text(
        x,
        (py - 4.0).max(TOP + 10.0),
        anchor,
        r#" font-size="11" font-weight="bold""#,
        &format!("peak {}", bytes(peak.bytes)),
    )
}

/// Allocated memory in block bytes (the gap up to reserved is cached free memory), then
/// reserved memory where the file records it.
fn draw_memory_lines(svg: &mut Svg, p: &Panel) -> io::Result<()> {
    let (view, f) = (p.view, p.f);
    let active = steps(
        view.buckets
            .iter()
            .map(|b| (f.px(b.x0), f.px(b.x1), f.py(b.allocated_bytes as f64))),
    );
    let max_cached = view
        .buckets
        .iter()
        .map(|b| b.cached_free_bytes)
        .max()
        .unwrap_or(0);
    svg.polyline(
        &active,
        r##" stroke="#555555" stroke-width="1" stroke-dasharray="3 2""##,
        Some(&if view.reserved_recorded {
            format!(
                "allocated: live allocations in block bytes, pending frees included; the gap up to reserved is free memory cached in segments (up to {})",
                bytes(max_cached)
            )
        } else {
            "allocated: live allocations in block bytes, pending frees included (the file records no reserved memory)".to_string()
        }),
    )?;
    if view.reserved_recorded {
        let reserved = steps(
            view.buckets
                .iter()
                .map(|b| (f.px(b.x0), f.px(b.x1), f.py(b.reserved_bytes.max(0) as f64))),
        );
        svg.polyline(
            &reserved,
            r##" stroke="#1f3b73" stroke-width="1.6""##,
            Some("reserved: bytes in segments"),
        )?;
    }
    Ok(())
}

/// The fill of the gap between reserved memory and the device's use.
const GAP_FILL: &str = r##" fill="#f4a259" fill-opacity="0.55""##;
/// The least height of that gap (pixels): 0.7 GiB is 2.5 px on a 140 GiB axis.
const GAP_MIN: f64 = 3.0;

/// The gap from reserved memory up to the device's use, shaded where readings are given
/// and the device holds more than PyTorch reserved: from the reserved line up, at least
/// [`GAP_MIN`] tall, one shape per run of such readings.
fn draw_device_gap(svg: &mut Svg, p: &Panel) -> io::Result<()> {
    let (view, f) = (p.view, p.f);
    if !view.reserved_recorded {
        return Ok(());
    }
    let mut runs: Vec<Vec<&crate::analysis::moments::chart::DevicePoint>> = Vec::new();
    let mut open = false;
    for d in &view.device {
        if d.used_bytes as i64 > d.reserved_bytes {
            if !open {
                runs.push(Vec::new());
            }
            if let Some(run) = runs.last_mut() {
                run.push(d);
            }
            open = true;
        } else {
            open = false;
        }
    }
    for run in runs {
        let edge = |d: &crate::analysis::moments::chart::DevicePoint| {
            let bottom = f.py(d.reserved_bytes.max(0) as f64);
            (bottom, f.py(d.used_bytes as f64).min(bottom - GAP_MIN))
        };
        let mut top: Vec<(f64, f64)> = Vec::new();
        let mut bottom: Vec<(f64, f64)> = Vec::new();
        if let [d] = run[..] {
            // One reading: a bar of the least width.
            let (b, t) = edge(d);
            let x = f.px(d.x);
            top.extend([(x - GAP_MIN / 2.0, t), (x + GAP_MIN / 2.0, t)]);
            bottom.extend([(x - GAP_MIN / 2.0, b), (x + GAP_MIN / 2.0, b)]);
        } else {
            for d in &run {
                let (b, t) = edge(d);
                top.push((f.px(d.x), t));
                bottom.push((f.px(d.x), b));
            }
        }
        let most = run
            .iter()
            .map(|d| (d.used_bytes as i64 - d.reserved_bytes) as u64)
            .max()
            .unwrap_or(0);
        bottom.reverse();
        top.extend(bottom);
        svg.polygon(
            &top,
            &format!(r#"{GAP_FILL} class="device-gap" data-bytes="{most}""#),
            Some(&format!(
                "device used above reserved: memory PyTorch did not reserve (CUDA context, libraries, other processes), up to {}",
                bytes(most)
            )),
        )?;
    }
    Ok(())
}

/// Device readings, when given: device used, memory outside the allocator, others.
fn draw_device_lines(svg: &mut Svg, p: &Panel) -> io::Result<()> {
    let (view, f) = (p.view, p.f);
    if view.device.is_empty() {
        return Ok(());
    }
    let pts =
        |f2: &dyn Fn(&crate::analysis::moments::chart::DevicePoint) -> Option<i64>| -> Vec<(f64, f64)> {
            view.device
                .iter()
                .filter_map(|p| f2(p).map(|v| (f.px(p.x), f.py(v.max(0) as f64))))
                .collect()
        };
    let used = pts(&|p| Some(p.used_bytes as i64));
    let max_used = view.device.iter().map(|p| p.used_bytes).max().unwrap_or(0);
    svg.polyline(
        &used,
        r##" stroke="#111111" stroke-width="2""##,
        Some(&format!(
            "device used (nvidia-smi / NVML), up to {}",
            bytes(max_used)
        )),
    )?;
    let outside = pts(&|p| p.outside_allocator_bytes);
    if !outside.is_empty() {
        svg.polyline(
            &outside,
            r##" stroke="#e07000" stroke-width="1.2" stroke-dasharray="5 2""##,
            Some("this process outside the caching allocator (process used − reserved)"),
        )?;
    }
    let other = pts(&|p| p.other_bytes);
    if !other.is_empty() {
        svg.polyline(
            &other,
            r##" stroke="#7a3fb0" stroke-width="1.2" stroke-dasharray="1 2""##,
            Some("other processes and driver (device used − this process)"),
        )?;
    }
    Ok(())
}

/// The OOM and snapshot markers: a line, a hover strip saying what happened, and for an
/// OOM a label kept inside the plot.
fn draw_markers(svg: &mut Svg, p: &Panel) -> io::Result<()> {
    for m in &p.view.markers {
        let px = p.f.px(m.x);
        let style = if m.kind == MarkerKind::Oom {
            r##" stroke="#d62728" stroke-width="1.5""##
        } else {
            r##" stroke="#777777" stroke-dasharray="4 3""##
        };
        writeln!(svg.out, "<g>")?;
        svg.line(px, TOP, px, PLOT_BOTTOM, style)?;
        svg.rect(
            px - 3.0,
            TOP,
            6.0,
            PLOT_BOTTOM - TOP,
            r#" fill="transparent""#,
            Some(&match m.kind {
                MarkerKind::Oom => format!(
                    "OOM at event {}: requested {}, the device had {} free",
                    m.event,
                    bytes(m.requested_bytes),
                    bytes(m.device_free_bytes)
                ),
                MarkerKind::Snapshot => format!("snapshot taken (event {})", m.event),
            }),
        )?;
        if m.kind == MarkerKind::Oom {
            // Keep the label inside the plot near its right edge.
            let (x, anchor) = if px > PLOT_RIGHT - 40.0 {
                (px - 3.0, "end")
            } else {
                (px + 3.0, "start")
            };
            svg.text(
                x,
                TOP + 12.0,
                anchor,
                r##" fill="#d62728" font-weight="bold""##,
                "OOM",
            )?;
        }
        writeln!(svg.out, "</g>")?;
    }
    Ok(())
}

/// The zoom's range outlined on the whole chart.
fn draw_outline(svg: &mut Svg, f: &Frame, z: Zoom) -> io::Result<()> {
    let (x0, x1) = (f.px(z.x0), f.px(z.x1));
    svg.rect(
        x0,
        TOP,
        (x1 - x0).max(2.0),
        PLOT_BOTTOM - TOP,
        r##" fill="none" stroke="#d62728" stroke-width="1" stroke-dasharray="4 2""##,
        Some("drawn wider below"),
    )
}

/// The legend's x: right of the plot.
const LEGEND_X: f64 = PLOT_RIGHT + 16.0;

/// The legend's lines: reserved, allocated, and the device's readings when given. Gives
/// the y where the bands' entries start.
fn legend_lines(svg: &mut Svg, view: &TimelineView) -> io::Result<f64> {
    let lx = LEGEND_X;
    let mut ly = TOP + 4.0;
    if view.reserved_recorded {
        svg.line(
            lx,
            ly,
            lx + 18.0,
            ly,
            r##" stroke="#1f3b73" stroke-width="1.6""##,
        )?;
        svg.text(lx + 24.0, ly + 4.0, "start", "", "reserved")?;
    } else {
        svg.text(lx, ly + 4.0, "start", "", "reserved: not recorded")?;
    }
    ly += 18.0;
    svg.line(
        lx,
        ly,
        lx + 18.0,
        ly,
        r##" stroke="#555555" stroke-width="1" stroke-dasharray="3 2""##,
    )?;
    svg.text(lx + 24.0, ly + 4.0, "start", "", "allocated (block bytes)")?;
    ly += 18.0;
    if !view.device.is_empty() {
        let entries = [
            (r##" stroke="#111111" stroke-width="2""##, "device used"),
            (
                r##" stroke="#e07000" stroke-width="1.2" stroke-dasharray="5 2""##,
                "outside the allocator",
            ),
            (
                r##" stroke="#7a3fb0" stroke-width="1.2" stroke-dasharray="1 2""##,
                "other processes, driver",
            ),
        ];
        for (style, label) in entries {
            svg.line(lx, ly, lx + 18.0, ly, style)?;
            svg.text(lx + 24.0, ly + 4.0, "start", "", label)?;
            ly += 18.0;
        }
        if view.reserved_recorded {
            svg.rect(lx, ly - 5.0, 18.0, 10.0, GAP_FILL, None)?;
            svg.text(
                lx + 24.0,
                ly + 4.0,
                "start",
                "",
                "device used above reserved",
            )?;
            ly += 18.0;
        }
    }
    Ok(ly)
}

/// The legend's bands from `ly` down, top of the stack first, as the eye meets them, each
/// with its bytes at the chart's highest state (what `top` counts at the peak) and, where
/// that is less, the most it held at once; as many as fit, then how many did not, then
/// the merged band.
fn legend_bands(svg: &mut Svg, p: &Panel, mut ly: f64) -> io::Result<()> {
    let view = p.view;
    let lx = LEGEND_X;
    let peak_bucket = (0..view.buckets.len())
        .max_by_key(|&i| (view.buckets[i].requested_bytes, std::cmp::Reverse(i)));
    if !view.bands.is_empty() {
        svg.text(
            lx,
            ly + 4.0,
            "start",
            r#" font-size="11" font-style="italic""#,
            if p.main.is_some() {
                "bytes at this range's highest point (and most at once):"
            } else {
                "bytes at the peak (and the most at once):"
            },
        )?;
        ly += 16.0;
    }
    let room = ((HEIGHT - 40.0 - ly) / 16.0).floor().max(0.0) as usize;
    let shown = view.bands.len().min(room.saturating_sub(1));
    for band in view.bands.iter().rev().take(shown) {
        svg.rect(
            lx,
            ly - 6.0,
            18.0,
            10.0,
            &format!(r#" fill="{}""#, band_color(band, p.colors)),
            Some(&band.name),
        )?;
        let at_peak = peak_bucket.map_or(0, |b| band_height_at(band, b));
        svg.text(
            lx + 24.0,
            ly + 4.0,
            "start",
            r#" font-size="11""#,
            &legend_band_label(band, at_peak),
        )?;
        ly += 16.0;
    }
    if view.bands.len() > shown {
        svg.text(
            lx,
            ly + 4.0,
            "start",
            r#" font-size="11""#,
            &format!("... {} more bands (hover them)", view.bands.len() - shown),
        )?;
        ly += 16.0;
    }
    let max_rest = max_rest(view);
    if max_rest > 0 {
        svg.rect(lx, ly - 6.0, 18.0, 10.0, r##" fill="#c8c8c8""##, None)?;
        svg.text(
            lx + 24.0,
            ly + 4.0,
            "start",
            r#" font-size="11""#,
            &format!("{} (up to {})", rest_name(view), bytes(max_rest)),
        )?;
    }
    Ok(())
}

/// A band's legend text: its short name cut to leave room for its bytes at the peak
/// (`at_peak`) and, where that is less, the most it held.
fn legend_band_label(band: &Band, at_peak: u64) -> String {
    let name = match band.kind {
        GroupKind::Frame | GroupKind::Stack => tiny_frame(&band.name),
        GroupKind::File => band
            .name
            .rsplit('/')
            .next()
            .unwrap_or(&band.name)
            .to_string(),
        _ => group_display(&band.name, band.kind),
    };
    let value = if at_peak == band.max_bytes {
        bytes(at_peak)
    } else {
        format!("{}, max {}", bytes(at_peak), bytes(band.max_bytes))
    };
    let chars = 50usize.saturating_sub(value.chars().count() + 3).max(12);
    let name = fit_label(&name, chars as f64 * 6.0 + 4.0).unwrap_or_default();
    format!("{name} ({value})")
}

/// The height the profiler's lanes add under the chart.
fn lanes_height(l: &TraceLanes) -> f64 {
    8.0 + l.lanes.len() as f64 * LANE_H + 24.0
}

/// The lanes' spans under the x axis label, in the plot's viewport.
fn write_lane_spans(svg: &mut Svg, f: &Frame, l: &TraceLanes, clock: Clock) -> io::Result<()> {
    let plot_right = WIDTH - RIGHT;
    let mut y = HEIGHT + 4.0;
    for lane in &l.lanes {
        svg.line(
            LEFT,
            y + LANE_H - 2.0,
            plot_right,
            y + LANE_H - 2.0,
            r##" stroke="#eeeeee""##,
        )?;
        for (i, s) in lane.spans.iter().enumerate() {
            let (x0, x1) = (f.px(s.x0), f.px(s.x1));
            let fill = match lane.kind {
                LaneKind::Annotations if i % 2 == 0 => "#dfe7f2",
                LaneKind::Annotations => "#c9d6ea",
                LaneKind::Operators => &color(&s.name),
            };
            let tip = format!(
                "{}\n{}: from {}, {}",
                s.name,
                lane_name(lane),
                clock.time(s.start_us),
                duration_ns(s.duration_ns)
            );
            svg.rect(
                x0,
                y,
                (x1 - x0).max(1.0),
                SPAN_H,
                &format!(r#" fill="{fill}" fill-opacity="0.75" class="span""#),
                Some(&tip),
            )?;
            if let Some(label) = fit_label(short_op(&s.name), x1 - x0) {
                svg.text(
                    (x0 + x1) / 2.0,
                    y + 13.0,
                    "middle",
                    r#" font-size="10""#,
                    &label,
                )?;
            }
        }
        y += LANE_H;
    }
    Ok(())
}

/// The lanes' names (right of the plot) and how the trace was placed (under it).
fn write_lane_labels(svg: &mut Svg, l: &TraceLanes) -> io::Result<()> {
    let plot_right = WIDTH - RIGHT;
    let mut y = HEIGHT + 4.0;
    for lane in &l.lanes {
        let mut label = lane_name(lane);
        if lane.dropped > 0 {
            label.push_str(&format!(" ({} short not drawn)", lane.dropped));
        }
        svg.text(
            plot_right + 10.0,
            y + 13.0,
            "start",
            r#" font-size="11""#,
            &label,
        )?;
        y += LANE_H;
    }
    let placed = match &l.alignment {
        None => format!("spans of {}, the chart's own trace", l.path),
        Some(a) => {
            let clock = match a.residual_us {
                Some(r) => format!(
                    "the profiler's clock {} {} the allocator's",
                    duration_us(r.abs()),
                    if r >= 0 { "ahead of" } else { "behind" }
                ),
                None => "by its clock".to_string(),
            };
            if a.trace_allocations == 0 {
                format!(
                    "spans of {} lined up {clock}; no addresses to confirm it by",
                    l.path
                )
            } else {
                format!(
                    "spans of {} lined up: {clock}; {} of its {} allocations here match the snapshot's",
                    l.path, a.matched, a.trace_allocations
                )
            }
        }
    };
    let placed = if l.lanes.is_empty() {
        format!("{placed}: no operator or record_function span in this range")
    } else {
        placed
    };
    svg.text(
        LEFT,
        y + 16.0,
        "start",
        r##" font-size="11" fill="#555555""##,
        &placed,
    )
}

fn lane_name(lane: &Lane) -> String {
    match (lane.kind, &lane.thread) {
        (LaneKind::Annotations, _) => "record_function ranges".to_string(),
        (LaneKind::Operators, Some(t)) => format!("operators, thread {t}"),
        (LaneKind::Operators, None) => "operators".to_string(),
    }
}

/// An operator's name without its namespace (`aten::linear` reads `linear`).
fn short_op(name: &str) -> &str {
    match name.rsplit_once("::") {
        Some((ns, op)) if !ns.contains(' ') && !op.is_empty() => op,
        _ => name,
    }
}

/// The bytes a band holds in one bucket (0 where it holds none).
fn band_height_at(band: &Band, bucket: usize) -> u64 {
    band.runs
        .iter()
        .find(|(first, cols)| bucket >= *first && bucket < first + cols.len())
        .map_or(0, |(first, cols)| cols[bucket - first].1)
}

/// The label cut to fit `width` pixels (about 6 per character at size 10), or None when
/// not even a few characters fit.
fn fit_label(label: &str, width: f64) -> Option<String> {
    let room = ((width - 4.0) / 6.0).floor() as usize;
    let n = label.chars().count();
    if n <= room {
        Some(label.to_string())
    } else if room >= 4 {
        Some(crate::render::words::labels::clip(label, room))
    } else {
        None
    }
}

fn duration_ns(ns: i64) -> String {
    if ns.unsigned_abs() < 1000 {
        format!("lasted {ns} ns")
    } else {
        format!("lasted {}", duration_us(ns / 1000))
    }
}
