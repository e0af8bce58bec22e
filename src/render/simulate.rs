//! `simulate` in words and as a chart: first how well the model reproduces the
//! recording, then each scenario's answer (does it run, where does it run out of memory
//! and why, the smallest device), then the table of scenarios; the chart draws reserved
//! memory over the trace per scenario against the recorded line and each capacity.

use crate::allocator::identity::{DivergenceKind, Identity};
use crate::allocator::prepared::OomLimit;
use crate::allocator::scenario::OomCause;
use crate::analysis::budget::OutsideSource;
use crate::analysis::what_if::simulate::{
    CapacitySource, DeviceSimulation, OomAt, ScenarioReport, SimulateReport,
};
use crate::render::Style;
use crate::render::charts::svg::{Svg, num};
use crate::render::words::labels::{device_line, layout_releases, short_frame};
use crate::units::{Clock, bytes, count, grouped, shown};
use std::io::{self, Write};

/// A scenario's settings in words: "the recorded settings (expandable_segments:True)".
fn settings_name(s: &ScenarioReport) -> String {
    let conf = if s.alloc_conf.is_empty() {
        "the defaults".to_string()
    } else {
        s.alloc_conf.clone()
    };
    if s.baseline {
        format!(
            "the recorded settings ({})",
            conf.trim_start_matches("the ")
        )
    } else {
        conf
    }
}

/// The identity check in one sentence.
pub fn identity_text(id: &Identity) -> String {
    let counts = format!(
        "{} of {} allocations at their recorded address, {} of {} segment events{}{}",
        grouped(id.allocations_at_recorded_address),
        grouped(id.allocations),
        grouped(id.segment_events_reproduced),
        grouped(id.segment_events),
        if id.segment_events_extra > 0 {
            format!(
                " (and {} it made that the recording does not show)",
                grouped(id.segment_events_extra)
            )
        } else {
            String::new()
        },
        if id.ooms > 0 {
            format!(
                ", {} of {} out-of-memory errors",
                grouped(id.ooms_reproduced),
                grouped(id.ooms)
            )
        } else {
            String::new()
        },
    );
    if id.exact() {
        let peak = if id.peak_reserved_bytes == id.recorded_peak_reserved_bytes {
            format!(
                "; peak reserved {} as recorded",
                bytes(id.peak_reserved_bytes)
            )
        } else {
            format!(
                "; peak reserved {} where the recording shows {}",
                bytes(id.peak_reserved_bytes),
                bytes(id.recorded_peak_reserved_bytes)
            )
        };
        return format!("the model replays the recording exactly: {counts}{peak}");
    }
    let first = id.first_divergence.as_ref().map_or(String::new(), |d| {
        let what = match d.kind {
            DivergenceKind::Address => format!(
                "put a {} request at {} where the recording shows {}",
                bytes(d.request_bytes.unwrap_or(0)),
                hex(d.model_addr),
                hex(d.recorded_addr)
            ),
            DivergenceKind::Segments => format!(
                "made {} where the recording shows {}",
                segments_text(&d.model_segments),
                segments_text(&d.recorded_segments)
            ),
            DivergenceKind::ModelOom => format!(
                "ran out of memory on a {} request the recording allocated",
                bytes(d.request_bytes.unwrap_or(0))
            ),
            DivergenceKind::MissedOom => format!(
                "allocated a {} request where the recording ran out of memory",
                bytes(d.request_bytes.unwrap_or(0))
            ),
        };
        format!(
            "first at event {}: the model {what}",
            grouped(d.event as u64)
        )
    });
    format!(
        "the model departs from the recording in {} of its allocator calls ({first}); put back in step after each: {counts}",
        grouped(id.divergences)
    )
}

fn hex(a: Option<u64>) -> String {
    a.map_or("nothing".into(), |a| format!("{a:#x}"))
}

/// Segment events in words: each one when there are a few, else a count and the bytes
/// of each kind (an `empty_cache` gives back hundreds at once).
fn segments_text(s: &[crate::allocator::identity::SegmentEntry]) -> String {
    const LISTED: usize = 4;
    if s.is_empty() {
        return "no segment event".into();
    }
    if s.len() <= LISTED {
        return s
            .iter()
            .map(|e| format!("{} {}", e.action, bytes(e.size_bytes)))
            .collect::<Vec<_>>()
            .join(", ");
    }
    // Kinds in the order they first come.
    let mut kinds: Vec<(&str, u64, u64)> = Vec::new();
    for e in s {
        match kinds.iter_mut().find(|(a, _, _)| *a == e.action) {
            Some(k) => {
                k.1 += 1;
                k.2 += e.size_bytes;
            }
            None => kinds.push((e.action, 1, e.size_bytes)),
        }
    }
    kinds
        .iter()
        .map(|(action, n, total)| match n {
            1 => format!("{action} {}", bytes(*total)),
            _ => format!(
                "{} {action} events of {} in all",
                grouped(*n),
                bytes(*total)
            ),
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

fn event_text(event: u32, time_us: Option<i64>, clock: Clock) -> String {
    match time_us {
        Some(t) => format!("event {}, {}", grouped(event as u64), clock.time(t)),
        None => format!("event {}", grouped(event as u64)),
    }
}

/// Where a scenario's capacity comes from, in words.
fn capacity_text(d: &DeviceSimulation, s: &ScenarioReport) -> String {
    match s.capacity_source {
        CapacitySource::Gpu => format!(
            "on {} ({} for the allocator after {} outside it, {})",
            s.gpu.as_deref().unwrap_or("the device"),
            bytes(s.allocator_capacity_bytes.unwrap_or(0)),
            bytes(d.outside.counted_bytes),
            outside_source(d.outside.source)
        ),
        CapacitySource::RecordedOom => {
            let oc = d
                .identity
                .oom_capacities
                .iter()
                .find(|o| o.capacity_bytes.is_some());
            match oc {
                Some(o) if o.limit == OomLimit::MemoryFraction => format!(
                    "at the capacity the recorded OOM implies ({}: the most the allocator held before it; the device still had {} free, so a memory fraction refused the request, somewhere below {})",
                    bytes(s.capacity_bytes.unwrap_or(0)),
                    bytes(o.device_free_bytes.unwrap_or(0)),
                    bytes(o.reserved_bytes.saturating_add(o.request_bytes))
                ),
                Some(o) => format!(
                    "at the capacity the recorded OOM implies ({}: {} reserved + {} the device had free then)",
                    bytes(s.capacity_bytes.unwrap_or(0)),
                    bytes(o.reserved_bytes),
                    bytes(o.device_free_bytes.unwrap_or(0))
                ),
                None => "at the recorded OOM's capacity".into(),
            }
        }
        CapacitySource::Unlimited => "with no limit on memory".into(),
    }
}

fn outside_source(s: OutsideSource) -> &'static str {
    match s {
        OutsideSource::Given => "as given",
        OutsideSource::NotMeasured => {
            "assumed: a CUDA context with its libraries; give --outside to change it"
        }
        OutsideSource::Nvml | OutsideSource::NvmlDevice => "measured by the device readings",
        OutsideSource::OomMessage => "measured by the OOM message",
    }
}

fn oom_text(o: &OomAt) -> String {
    let site = o
        .callsite
        .as_deref()
        .map(|c| format!(" ({})", shown(&short_frame(c))))
        .unwrap_or_default();
    let cause = match o.cause {
        OomCause::Capacity => format!(
            "capacity: {} live in blocks + the request exceed what the allocator may hold",
            bytes(o.allocated_bytes)
        ),
        OomCause::Fragmentation => format!(
            "fragmentation: {} reserved, {} of it in live blocks, but no free piece of {} (the largest is {})",
            bytes(o.reserved_bytes),
            bytes(o.allocated_bytes),
            bytes(o.rounded_bytes),
            bytes(o.largest_free_bytes)
        ),
        OomCause::Rounding => format!(
            "rounding: the device had room for the {} block, not for the segment or pages the allocator asks for it ({} reserved, {} of it in live blocks)",
            bytes(o.rounded_bytes),
            bytes(o.reserved_bytes),
            bytes(o.allocated_bytes)
        ),
        OomCause::PrivatePools => format!(
            "CUDA-graph pools: {} reserved, {} of it in live blocks, and {} of the free memory cached in CUDA-graph private pools, which only those graphs' allocations use and the retry does not release while a graph uses them",
            bytes(o.reserved_bytes),
            bytes(o.allocated_bytes),
            bytes(o.private_free_bytes)
        ),
    };
    format!(
        "runs out of memory at {}{site}, a {} request{}; {cause}",
        event_text(o.event, o.time_us, o.clock),
        bytes(o.request_bytes),
        if o.recorded { ", as recorded" } else { "" },
    )
}

/// One scenario's answer in a sentence, on device `d` (its check's peak of live tensors,
/// whether its recording ends at an OOM).
fn answer(s: &ScenarioReport, d: &DeviceSimulation) -> String {
    if let Some(e) = &s.start_does_not_fit {
        return format!(
            "cannot start: the {} alive before recording do not fit",
            bytes(e.live_bytes)
        );
    }
    match &s.first_oom {
        Some(o) => {
            let mut text = oom_text(o);
            // Fragmentation stopped it here, but the live tensors alone outgrow the
            // capacity later: no setting makes this device enough.
            let live = d.identity.peak_requested_bytes;
            if o.cause == OomCause::Fragmentation
                && let Some(capacity) = s.allocator_capacity_bytes
                && live > capacity
            {
                text.push_str(&format!(
                    "; even without fragmentation it would run out later: the live tensors alone reach {} in the recording, more than the {} the allocator may hold",
                    bytes(live),
                    bytes(capacity)
                ));
            }
            text
        }
        None => format!(
            "fits: peak reserved {} ({} of it cache and fragmentation){}",
            bytes(s.peak_reserved_bytes),
            bytes(s.reserved_minus_allocated_at_peak_bytes),
            match s.recorded_ooms_passed {
                0 => String::new(),
                n => format!(
                    "; {} the recording ran out of memory on would have been allocated{}",
                    if n == 1 {
                        "the request".to_string()
                    } else {
                        format!("the {n} requests")
                    },
                    if d.stops_at_oom {
                        ", but the recording stops there: what the run asks for after it is not known"
                    } else {
                        ""
                    }
                ),
            }
        ),
    }
}

/// The text of `simulate`; `hints`: name the command's options where they would change
/// an answer (off where no command line is at hand, as in the HTML report).
pub fn write_simulate_text(
    out: &mut dyn Write,
    r: &SimulateReport,
    style: Style,
    hints: bool,
) -> io::Result<()> {
    for (k, d) in r.devices.iter().enumerate() {
        if k > 0 {
            writeln!(out)?;
        }
        write_device(out, r, d, style, hints)?;
    }
    for n in &r.not_simulated {
        writeln!(
            out,
            "{}  device {}: not simulated: {}",
            shown(&r.path),
            n.device,
            n.reason
        )?;
    }
    Ok(())
}

fn write_device(
    out: &mut dyn Write,
    r: &SimulateReport,
    d: &DeviceSimulation,
    style: Style,
    hints: bool,
) -> io::Result<()> {
    let device = if hints {
        device_line(&r.choice)
    } else {
        format!("device {}", d.device)
    };
    writeln!(
        out,
        "{}",
        style.heading(&format!("{}  {device}", shown(&r.path)))
    )?;
    let guessed = if d.profile_guessed {
        let hint = if hints {
            "; --torch VERSION names another"
        } else {
            ""
        };
        let follows = match r.layout.max_release {
            Some(max) if max == r.layout.min_release => String::new(),
            _ => format!("; the model follows the earliest, {}", r.layout.min_release),
        };
        format!(
            " (the file's fields say {}{follows}{hint})",
            layout_releases(&r.layout)
        )
    } else {
        String::new()
    };
    writeln!(
        out,
        "  model      the caching allocator of PyTorch {}{guessed}",
        d.profile.releases(),
    )?;
    let id = &d.identity;
    writeln!(out, "  check      {}", identity_text(id))?;
    if id.start_blocks > 0 {
        writeln!(
            out,
            "             it starts from the state before the first event: {} reserved, {} alive{}",
            bytes(id.start_reserved_bytes),
            count(id.start_blocks as usize, "block", "blocks"),
            if id.start_blocks_inferred > 0 {
                format!(
                    " ({} of them freed in the trace, their block size inferred from where later allocations land)",
                    id.start_blocks_inferred
                )
            } else {
                String::new()
            }
        )?;
    }
    if id.final_state_later {
        writeln!(
            out,
            "             the snapshot's final state is later than its trace (blocks freed after recording stopped): not compared"
        )?;
    }
    if !d.settings_recorded {
        writeln!(
            out,
            "             the file records no allocator settings (PyTorch before 2.3): the defaults are assumed"
        )?;
    }
    if !id.exact() {
        writeln!(
            out,
            "  {}",
            style.warn(
                "the answers below come from a model that does not reproduce this recording exactly: read them as estimates"
            )
        )?;
    }
    // The answers, grouped by capacity.
    for group in by_capacity(d) {
        writeln!(out, "  {}:", capacity_text(d, group[0]))?;
        for s in &group {
            writeln!(out, "    with {}: {}", settings_name(s), answer(s, d))?;
            if s.gc_inactive {
                writeln!(
                    out,
                    "      (garbage_collection_threshold acts only under a memory fraction: add per_process_memory_fraction, or call torch.cuda.set_per_process_memory_fraction; alone it changes nothing)"
                )?;
            }
            if s.fraction_inactive {
                writeln!(
                    out,
                    "      (not applied: a memory fraction is a share of the device's total memory, which this capacity does not give; the answer is that of the settings without it; name a GPU with --gpu to try the fraction)"
                )?;
            }
            if s.addresses_reused {
                writeln!(
                    out,
                    "      (an estimate: the recording's addresses leave no room in the 64-bit address space for the segments this replay made, so some share addresses)"
                )?;
            }
            if s.start_replaced {
                writeln!(
                    out,
                    "      (the blocks alive before recording were placed first, in address order: the recording's segments are of the other kind)"
                )?;
            }
        }
        if group[0].capacity_source == CapacitySource::RecordedOom
            && let Some(text) = d
                .recorded_oom_what_if
                .as_ref()
                .and_then(crate::render::oom::what_if_fix_text)
        {
            writeln!(out, "    {text}")?;
        }
    }
    let mins: Vec<&ScenarioReport> = {
        let mut seen: Vec<&str> = Vec::new();
        d.scenarios
            .iter()
            .filter(|s| s.min_capacity_bytes.is_some())
            .filter(|s| {
                let new = !seen.contains(&s.alloc_conf.as_str());
                seen.push(&s.alloc_conf);
                new
            })
            .collect()
    };
    if !mins.is_empty() {
        writeln!(
            out,
            "  smallest device found to run it ({} outside the allocator, {}{}):",
            bytes(d.outside.counted_bytes),
            outside_source(d.outside.source),
            if d.stops_at_oom {
                "; the recording ends at the request it ran out of memory on, so only that far"
            } else {
                ""
            }
        )?;
        for s in mins {
            write!(
                out,
                "    with {}: {}",
                settings_name(s),
                bytes(s.min_capacity_bytes.unwrap_or(0))
            )?;
            match s.min_capacity_fails_above_bytes {
                Some(f) => writeln!(
                    out,
                    ", but {} runs out of memory: a larger device is not always enough (on a smaller one the out-of-memory retry frees the cache earlier, and later requests pack differently); the devices above were each replayed at their own size",
                    bytes(f)
                )?,
                None => writeln!(out)?,
            }
        }
    }
    writeln!(out)?;
    write_table(out, d)?;
    writeln!(
        out,
        "  not simulated: memory outside the allocator beyond what is counted, other processes, CUDA graph replays, what the program does after an out-of-memory error (each replay stops at the first)"
    )
}

fn write_table(out: &mut dyn Write, d: &DeviceSimulation) -> io::Result<()> {
    let rows: Vec<[String; 8]> = d
        .scenarios
        .iter()
        .map(|s| {
            [
                if s.baseline {
                    "recorded".to_string()
                } else if s.alloc_conf.is_empty() {
                    "defaults".into()
                } else {
                    s.alloc_conf.clone()
                },
                match (s.capacity_source, &s.gpu) {
                    (CapacitySource::Unlimited, _) => "unlimited".into(),
                    (_, Some(g)) => g.clone(),
                    _ => bytes(s.capacity_bytes.unwrap_or(0)),
                },
                bytes(s.peak_reserved_bytes),
                bytes(s.reserved_minus_allocated_at_peak_bytes),
                format!("+{} -{}", s.segments_created, s.segments_freed),
                s.retry_flushes.to_string(),
                match (&s.first_oom, &s.start_does_not_fit) {
                    (_, Some(_)) => "cannot start".into(),
                    (Some(o), _) => format!(
                        "event {} ({})",
                        grouped(o.event as u64),
                        crate::render::words::labels::shortfall_name(o.cause)
                    ),
                    (None, _) => "none".into(),
                },
                s.min_capacity_bytes.map_or("-".into(), bytes),
            ]
        })
        .collect();
    let head = [
        "settings",
        "capacity",
        "peak reserved",
        "cache+frag",
        "segments",
        "flushes",
        "first OOM",
        "smallest device",
    ];
    let mut w = head.map(|h| h.chars().count());
    for r in &rows {
        for (k, c) in r.iter().enumerate() {
            w[k] = w[k].max(c.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut s = String::from(" ");
        for (k, c) in cells.iter().enumerate() {
            let pad = w[k] - c.chars().count();
            if k == 0 {
                s.push_str(&format!(" {c}{}", " ".repeat(pad)));
            } else {
                s.push_str(&format!("  {}{c}", " ".repeat(pad)));
            }
        }
        s.trim_end().to_string()
    };
    writeln!(out, "{}", line(&head.map(String::from)))?;
    for r in &rows {
        writeln!(out, "{}", shown(&line(r)))?;
    }
    Ok(())
}

// ---- the chart ----

const WIDTH: f64 = 960.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 24.0;
/// The width of an OOM marker ("✕ OOM"), centred on its event.
const OOM_MARK_W: f64 = 40.0;
const TOP: f64 = 40.0;
/// The height of one capacity's panel.
const PANEL_H: f64 = 230.0;

/// Colours of the scenarios' lines, in order (the recorded line is grey).
const LINE_COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

/// A tick step of 1, 2 or 5 times a power of ten of GiB (or of MiB below 1 GiB).
fn tick_step(max: f64) -> (f64, f64, &'static str) {
    let gib = (1u64 << 30) as f64;
    let mib = (1u64 << 20) as f64;
    let (unit, name) = if max >= 2.0 * gib {
        (gib, "GiB")
    } else {
        (mib, "MiB")
    };
    let step = crate::render::charts::svg::round_step(
        (max / unit / 4.0).max(1e-9),
        &[1.0, 2.0, 5.0, 10.0],
    );
    (step * unit, unit, name)
}

/// Reserved memory over the trace (x: trace entries): one panel per capacity (each GPU,
/// the recorded OOM's, no limit), each with its own scale, its capacity dashed, a line
/// per setting (one colour per setting in every panel) with its OOM marked where it
/// happens, and the recorded line on top, so that it shows where the others cover it.
pub fn write_simulate_svg(
    out: &mut dyn Write,
    r: &SimulateReport,
    d: &DeviceSimulation,
    recorded: &[(Option<u32>, u64)],
    events: u32,
) -> io::Result<()> {
    // The capacities, in the scenarios' order; each a panel.
    let groups = by_capacity(d);
    let mut settings_seen: Vec<String> = Vec::new();
    for s in &d.scenarios {
        if !settings_seen.contains(&s.alloc_conf) {
            settings_seen.push(s.alloc_conf.clone());
        }
    }
    // Each capacity's panel over the whole trace, and where an OOM falls in a long trace,
    // a zoom on the entries before it, so that the end is not squeezed into a few pixels.
    let mut panels: Vec<(&[&ScenarioReport], View)> = Vec::new();
    for group in &groups {
        let first_oom = group
            .iter()
            .filter_map(|s| s.first_oom.as_ref().map(|o| o.event))
            .min();
        panels.push((group, View::whole(events)));
        if let Some(zoom) = first_oom.and_then(|e| View::before(e, events)) {
            panels.push((group, zoom));
        }
    }
    let legend_rows = settings_seen.len().min(6) + usize::from(!recorded.is_empty());
    let height = TOP + panels.len().max(1) as f64 * PANEL_H + 30.0 + legend_rows as f64 * 16.0;
    let mut svg = Svg { out };
    let title = format!(
        "{} device {}: reserved memory by scenario",
        r.path, d.device
    );
    svg.begin(WIDTH, height, &title)?;
    svg.text(LEFT, 22.0, "start", r#" font-size="14""#, &title)?;
    let color_of = |s: &ScenarioReport| {
        let k = settings_seen
            .iter()
            .position(|c| *c == s.alloc_conf)
            .unwrap_or(0);
        LINE_COLORS[k % LINE_COLORS.len()]
    };
    for (row, (group, view)) in panels.iter().enumerate() {
        let top = TOP + row as f64 * PANEL_H;
        draw_panel(&mut svg, d, group, recorded, *view, top, &color_of)?;
    }
    // The legend: each setting's colour, and the recorded line.
    let mut y = TOP + panels.len().max(1) as f64 * PANEL_H + 20.0;
    let mut rows: Vec<(String, String, &str)> = settings_seen
        .iter()
        .take(6)
        .filter_map(|conf| d.scenarios.iter().find(|s| s.alloc_conf == *conf))
        .map(|s| (color_of(s).to_string(), settings_name(s), ""))
        .collect();
    if !recorded.is_empty() {
        rows.push((
            RECORDED.to_string(),
            "recorded (dashed, drawn over the others)".into(),
            r#" stroke-dasharray="5,3""#,
        ));
    }
    for (color, label, dash) in rows {
        svg.line(
            LEFT,
            y - 4.0,
            LEFT + 24.0,
            y - 4.0,
            &format!(r#" stroke="{color}" stroke-width="2"{dash}"#),
        )?;
        svg.text(LEFT + 30.0, y, "start", "", &escape_label(&label))?;
        y += 16.0;
    }
    svg.end()
}

/// The scenarios grouped by capacity (source, GPU, bytes), groups and scenarios in the
/// scenarios' order: the text's paragraphs and the chart's panels.
fn by_capacity(d: &DeviceSimulation) -> Vec<Vec<&ScenarioReport>> {
    let key = |s: &ScenarioReport| (s.capacity_source, s.gpu.clone(), s.capacity_bytes);
    let mut groups: Vec<Vec<&ScenarioReport>> = Vec::new();
    for s in &d.scenarios {
        match groups.iter_mut().find(|g| key(g[0]) == key(s)) {
            Some(g) => g.push(s),
            None => groups.push(vec![s]),
        }
    }
    groups
}

/// The recorded line's colour.
const RECORDED: &str = "#222";

/// Traces shorter than this are drawn whole only: every entry has a pixel or more.
const ZOOM_FROM_EVENTS: u32 = 400;

/// The entries a panel draws, `first..=last`, and whether it zooms: a zoom scales its
/// values from the lowest in its window, not from 0.
#[derive(Clone, Copy, Debug, PartialEq)]
struct View {
    first: u32,
    last: u32,
    /// The trace's last entry, where lines end (a zoom may reach past it, for room).
    trace_last: u32,
    zoom: bool,
}

impl View {
    fn whole(events: u32) -> View {
        View {
            first: 0,
            last: events.saturating_sub(1),
            trace_last: events.saturating_sub(1),
            zoom: false,
        }
    }

    /// The last twentieth of the entries before `event` (at least 40), and room for an
    /// eighth of that after it (past the trace's end if need be, so that the OOM is never
    /// at the edge); None when the trace is short enough to show it whole.
    fn before(event: u32, events: u32) -> Option<View> {
        if events < ZOOM_FROM_EVENTS {
            return None;
        }
        let span = (events / 20).max(40);
        Some(View {
            first: event.saturating_sub(span),
            last: event.saturating_add(span / 8),
            trace_last: events.saturating_sub(1),
            zoom: true,
        })
    }

    fn contains(&self, e: u32) -> bool {
        (self.first..=self.last).contains(&e)
    }
}

/// One capacity's panel, its top at `top`.
fn draw_panel(
    svg: &mut Svg,
    d: &DeviceSimulation,
    group: &[&ScenarioReport],
    recorded: &[(Option<u32>, u64)],
    view: View,
    top: f64,
    color_of: &dyn Fn(&ScenarioReport) -> &'static str,
) -> io::Result<()> {
    let first = group[0];
    // Each series cut to the view: the value it holds at the view's first entry, then
    // its changes inside.
    let clip = |series: &[(Option<u32>, u64)], end: Option<u32>| -> Vec<(Option<u32>, u64)> {
        let end = end.unwrap_or(u32::MAX);
        let mut out = Vec::new();
        let mut held = None;
        for &(e, b) in series {
            match e {
                Some(e) if e > end || e > view.last => break,
                Some(e) if e >= view.first => out.push((Some(e), b)),
                _ => held = Some(b),
            }
        }
        if let Some(b) = held {
            out.insert(0, (view.first.checked_sub(1), b));
        }
        out
    };
    let drawn: Vec<Vec<(Option<u32>, u64)>> = group
        .iter()
        .map(|s| clip(&s.series, s.first_oom.as_ref().map(|o| o.event)))
        .collect();
    let recorded = clip(recorded, None);
    let values = || drawn.iter().flatten().chain(recorded.iter()).map(|p| p.1);
    let capacity_shown = first
        .allocator_capacity_bytes
        .filter(|&c| !view.zoom || values().any(|v| v.saturating_mul(10) >= c.saturating_mul(9)));
    let max_bytes = values().chain(capacity_shown).max().unwrap_or(1).max(1) as f64;
    let min_bytes = if view.zoom {
        values().min().unwrap_or(0) as f64
    } else {
        0.0
    };
    let (step, unit, unit_name) = tick_step((max_bytes - min_bytes).max(1.0));
    let top_value = (max_bytes / step).ceil() * step;
    let base_value = (min_bytes / step).floor() * step;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_top = top + 22.0;
    let plot_h = PANEL_H - 60.0;
    let width_events = (view.last - view.first + 1) as f64;
    let x_of = |e: Option<u32>| {
        let at = e.map_or(0.0, |e| (e + 1).saturating_sub(view.first) as f64);
        LEFT + plot_w * at.min(width_events) / width_events
    };
    let y_of = |b: u64| {
        plot_top + plot_h * (1.0 - (b as f64 - base_value) / (top_value - base_value).max(1.0))
    };
    let heading = match (
        &first.gpu,
        first.capacity_source,
        first.allocator_capacity_bytes,
    ) {
        (Some(g), _, Some(c)) => format!("on {g}: {} for the allocator", bytes(c)),
        (None, CapacitySource::RecordedOom, Some(c)) => {
            format!("at the capacity the recorded OOM implies: {}", bytes(c))
        }
        _ => "with no limit on memory".to_string(),
    };
    let heading = if view.zoom {
        format!(
            "{heading}: zoom on entries {} to {}, before the first OOM",
            grouped(u64::from(view.first)),
            grouped(u64::from(view.last.min(view.trace_last)))
        )
    } else {
        heading
    };
    svg.text(
        LEFT,
        top + 12.0,
        "start",
        r#" font-weight="bold""#,
        &heading,
    )?;
    for v in crate::render::charts::svg::axis_ticks(base_value, top_value + step / 2.0, step) {
        let y = y_of(v as u64);
        svg.line(LEFT, y, WIDTH - RIGHT, y, r##" stroke="#e0e0e0""##)?;
        let label = format!("{} {unit_name}", num(v / unit));
        svg.text(LEFT - 6.0, y + 4.0, "end", r##" fill="#444""##, &label)?;
    }
    let bottom = plot_top + plot_h;
    svg.line(LEFT, bottom, WIDTH - RIGHT, bottom, r##" stroke="#888""##)?;
    svg.text(
        LEFT + plot_w / 2.0,
        bottom + 16.0,
        "middle",
        r##" fill="#444""##,
        &format!(
            "trace entries ({} to {})",
            grouped(u64::from(view.first)),
            grouped(u64::from(view.last.min(view.trace_last)) + u64::from(!view.zoom))
        ),
    )?;
    if let Some(c) = capacity_shown {
        svg.line(
            LEFT,
            y_of(c),
            WIDTH - RIGHT,
            y_of(c),
            &format!(r##" stroke="#000" stroke-dasharray="6,4" data-bytes="{c}""##),
        )?;
    }
    let step_points = |series: &[(Option<u32>, u64)], end: Option<u32>| -> Vec<(f64, f64)> {
        let mut pts = Vec::new();
        let mut last: Option<u64> = None;
        for &(e, b) in series {
            let x = x_of(e);
            if let Some(l) = last {
                pts.push((x, y_of(l)));
            }
            pts.push((x, y_of(b)));
            last = Some(b);
        }
        if let Some(l) = last {
            let end = end
                .filter(|&e| e <= view.last)
                .unwrap_or(view.last.min(view.trace_last));
            pts.push((x_of(Some(end)), y_of(l)));
        }
        // What a chart draws is bounded by its pixels, not by the trace.
        crate::render::charts::svg::thin_points(&pts)
    };
    // (left edge, baseline) of each OOM marker drawn.
    let mut oom_marks: Vec<(f64, f64)> = Vec::new();
    for (s, series) in group.iter().zip(&drawn) {
        let color = color_of(s);
        let end = s.first_oom.as_ref().map(|o| o.event);
        let pts = step_points(series, end);
        let width = if s.baseline { 3.0 } else { 2.0 };
        svg.polyline(
            &pts,
            &format!(
                r#" stroke="{color}" stroke-width="{width}" data-bytes="{}""#,
                s.peak_reserved_bytes
            ),
            Some(&format!(
                "{}: {}",
                settings_name(s),
                match &s.first_oom {
                    Some(o) => format!("out of memory at event {}", grouped(o.event as u64)),
                    None => format!("peak reserved {}", bytes(s.peak_reserved_bytes)),
                }
            )),
        )?;
        if let Some(o) = s.first_oom.as_ref().filter(|o| view.contains(o.event)) {
            let x = x_of(Some(o.event));
            let y = y_of(o.reserved_bytes);
            svg.line(
                x,
                plot_top,
                x,
                bottom,
                &format!(r#" stroke="{color}" stroke-dasharray="2,3""#),
            )?;
            let (anchor, left) = if x > WIDTH - RIGHT - OOM_MARK_W {
                ("end", x - OOM_MARK_W)
            } else {
                ("middle", x - OOM_MARK_W / 2.0)
            };
            // Above the markers already drawn where it would print over one.
            // Stacked upwards from just above the line; where the panel's top stops them,
            // downwards from just below it.
            let free = |at: f64| {
                !oom_marks.iter().any(|&(l, t): &(f64, f64)| {
                    (l - left).abs() < OOM_MARK_W && (t - at).abs() < 13.0
                })
            };
            let up = (0..8)
                .map(|k| y - 6.0 - 14.0 * k as f64)
                .take_while(|&at| at >= plot_top + 12.0)
                .find(|&at| free(at));
            let at = up.unwrap_or_else(|| {
                (0..16)
                    .map(|k| y + 16.0 + 14.0 * k as f64)
                    .find(|&at| free(at))
                    .unwrap_or(y + 16.0)
            });
            oom_marks.push((left, at));
            svg.text(
                x - 3.0,
                at,
                if anchor == "middle" { "end" } else { anchor },
                &format!(r#" fill="{color}" font-weight="bold""#),
                &format!("✕ OOM at {}", grouped(o.event as u64)),
            )?;
        }
    }
    if !recorded.is_empty() {
        let pts = step_points(&recorded, None);
        svg.polyline(
            &pts,
            &format!(r#" stroke="{RECORDED}" stroke-width="1.5" stroke-dasharray="5,3""#),
            Some(&format!(
                "recorded reserved, peak {}",
                bytes(d.identity.recorded_peak_reserved_bytes)
            )),
        )?;
    }
    Ok(())
}

/// A legend label, cut when very long (`Svg::text` escapes it).
fn escape_label(s: &str) -> String {
    let s = shown(s).into_owned();
    if s.chars().count() > 130 {
        let cut: String = s.chars().take(127).collect();
        format!("{cut}...")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::segments_text;
    use crate::allocator::identity::SegmentEntry;

    fn entry(action: &'static str, mib: u64) -> SegmentEntry {
        SegmentEntry {
            action,
            addr: 0,
            size_bytes: mib << 20,
        }
    }

    #[test]
    fn a_few_segment_events_are_each_named() {
        let s = [entry("segment_free", 14), entry("segment_alloc", 20)];
        assert_eq!(
            segments_text(&s),
            "segment_free 14.0 MiB, segment_alloc 20.0 MiB"
        );
        assert_eq!(segments_text(&[]), "no segment event");
    }

    #[test]
    fn a_burst_of_segment_events_is_counted_by_kind() {
        // An empty_cache giving back five segments (2 x 14 + 2 x 20 + 62 = 130 MiB), then
        // the segment of the next allocation.
        let s = [
            entry("segment_free", 14),
            entry("segment_free", 14),
            entry("segment_free", 20),
            entry("segment_free", 20),
            entry("segment_free", 62),
            entry("segment_alloc", 20),
        ];
        assert_eq!(
            segments_text(&s),
            "5 segment_free events of 130.0 MiB in all and segment_alloc 20.0 MiB"
        );
    }
}
