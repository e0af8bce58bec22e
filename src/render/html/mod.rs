//! The shared report as one self-contained HTML page: the SVG charts of the other
//! renderers inline, the text renderers' words in `<pre>` blocks, tables of what was live,
//! a small script of our own (`report.js`) for the pickers, zoom and the stack panel, and
//! the stylesheet (`report.css`), both inlined.
//!
//! Nothing is loaded when the page is viewed: no URL is written (the SVG namespace
//! attribute is dropped, as HTML does not need it, and `://` in text from a file is
//! written as a character reference), and a Content-Security-Policy forbids every fetch.
//! Without JavaScript every chart, moment and file is shown one after the other.
//!
//! The page stays under [`MAX_REPORT_BYTES`] for any input: each file gets an equal share
//! of the room, and the parts of a file that do not fit (largest charts first: segment
//! maps, then the category timeline, flame graphs, tables) are replaced by a note with the
//! command that draws them.

use crate::analysis::kinds::attribution::GroupKind;
use crate::analysis::moments::chart::TimelineView;
use crate::analysis::moments::moment::MomentKind;
use crate::analysis::oom::Role;
use crate::analysis::reports::ranks::RanksReport;
use crate::analysis::reports::report::{DeviceReport, FileReport, MomentReport};
use crate::analysis::reports::summary::DeviceSummary;
use crate::render::Style;
use crate::render::charts::flame_svg::{FlameTitle, write_flame_svg};
use crate::render::charts::segments_svg::write_segments_svg;
use crate::render::charts::svg::Colors;
use crate::render::charts::timeline_svg::{ChartTitle, write_timeline_svg};
use crate::render::device::reconcile::write_reconcile_text;
use crate::render::oom::{verdict_text, write_analysis};
use crate::render::summary::write_summary_text;
use crate::render::words::labels::{group_name_display, moment_text};
use crate::units::{bytes, percent};
use std::fmt::Write as _;
use std::io::{self, Write};

const CSS: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");

/// What the page may load: nothing but its own inline style and script, and images
/// written into it.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'";

/// The page is never larger than this.
pub const MAX_REPORT_BYTES: usize = 10_000_000;
/// Room for the files' sections: the rest holds the frame, style, script and rank table.
const FILES_BUDGET: usize = 8_800_000;
/// Files in one report at most (each keeps its headline figures).
pub const MAX_FILES: usize = 1024;

/// Text for HTML content or an attribute value ([`crate::render::charts::markup::html`]): markup
/// characters as references, control characters shown as visible text, noncharacters
/// replaced, and `://` broken so that no address can be
/// read out of the page.
pub fn escape_html(s: &str) -> String {
    break_addresses(crate::render::charts::markup::html(s))
}

/// `scheme://` written as `scheme:&#47;/`: the same text to a reader, no address in the bytes.
fn break_addresses(s: String) -> String {
    if s.contains("://") {
        s.replace("://", ":&#47;/")
    } else {
        s
    }
}

/// An SVG of another renderer, ready to sit inside the page.
fn inline_svg(render: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<String> {
    let mut buf = Vec::new();
    render(&mut buf)?;
    let svg = String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let svg = match svg.find("<svg") {
        Some(i) => &svg[i..],
        None => &svg[..],
    };
    // HTML places <svg> in its namespace itself; the attribute would be the one URL left.
    let svg = svg.replacen(r#" xmlns="http://www.w3.org/2000/svg""#, "", 1);
    Ok(break_addresses(svg))
}

/// A text renderer's output, for a `<pre>`.
fn text_of(render: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<String> {
    let mut buf = Vec::new();
    render(&mut buf)?;
    Ok(escape_html(&String::from_utf8_lossy(&buf)))
}

/// A word for a shell: quoted when it holds anything but plain path characters.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./+=:@%,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r#"'\''"#))
    }
}

/// One part of a file's section that may be left out.
struct Optional {
    html: String,
    /// What is said instead when it is left out.
    note: String,
    /// Lower is kept first.
    priority: (u8, usize),
}

enum Piece {
    Fixed(String),
    Optional(usize),
}

/// A file's section as it is built: fixed text and optional parts, in page order.
#[derive(Default)]
struct Section {
    pieces: Vec<Piece>,
    optional: Vec<Optional>,
    /// Added to the priority of the optional parts given: the file's other devices come
    /// after everything of its first.
    offset: u8,
}

impl Section {
    fn text(&mut self) -> &mut String {
        if !matches!(self.pieces.last(), Some(Piece::Fixed(_))) {
            self.pieces.push(Piece::Fixed(String::new()));
        }
        match self.pieces.last_mut() {
            Some(Piece::Fixed(s)) => s,
            _ => unreachable!("a fixed piece was just pushed"),
        }
    }

    fn optional(&mut self, html: String, note: String, priority: (u8, usize)) {
        self.pieces.push(Piece::Optional(self.optional.len()));
        self.optional.push(Optional {
            html,
            note,
            priority: (priority.0.saturating_add(self.offset), priority.1),
        });
    }

    /// The section within `budget` bytes (optional parts in priority order while they
    /// fit), and how many parts were left out.
    fn finish(self, budget: usize) -> (String, usize) {
        let fixed: usize = self
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Fixed(s) => s.len(),
                Piece::Optional(i) => self.optional[*i].note.len(),
            })
            .sum();
        let mut room = budget.saturating_sub(fixed);
        let mut order: Vec<usize> = (0..self.optional.len()).collect();
        order.sort_by_key(|&i| (self.optional[i].priority, i));
        let mut keep = vec![false; self.optional.len()];
        for i in order {
            let o = &self.optional[i];
            let extra = o.html.len().saturating_sub(o.note.len());
            if extra <= room {
                room -= extra;
                keep[i] = true;
            }
        }
        let mut out = String::with_capacity(budget.min(1 << 24));
        let left_out = keep.iter().filter(|k| !**k).count();
        for p in self.pieces {
            match p {
                Piece::Fixed(s) => out.push_str(&s),
                Piece::Optional(i) if keep[i] => out.push_str(&self.optional[i].html),
                Piece::Optional(i) => out.push_str(&self.optional[i].note),
            }
        }
        (out, left_out)
    }
}

/// The note standing for a part left out, with the command that gives it.
fn left_out(what: &str, size: usize, command: &str) -> String {
    format!(
        "<p class=\"left-out\">The {what} ({}) is left out to keep this report under {}. Draw it with <code>{}</code></p>\n",
        bytes(size as u64),
        bytes(MAX_REPORT_BYTES as u64),
        escape_html(command)
    )
}

/// `--at` for a moment in a command line.
fn moment_arg(m: &MomentReport) -> String {
    match (m.moment.kind, m.moment.event) {
        (MomentKind::Peak, _) => "peak".into(),
        (MomentKind::End, _) | (_, None) => "end".into(),
        (_, Some(e)) => format!("event:{e}"),
    }
}

fn moment_label(m: &MomentReport) -> String {
    let name = |kind: MomentKind| match kind {
        MomentKind::Peak => "peak".to_string(),
        MomentKind::Oom => match m.moment.event {
            Some(e) => format!("OOM at event {e}"),
            None => "OOM".into(),
        },
        MomentKind::End => "end".into(),
        other => other.name().to_string(),
    };
    let mut names = vec![name(m.moment.kind)];
    names.extend(m.also.iter().map(|&k| name(k)));
    capitalized(&names.join(" = "))
}

fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn figure(out: &mut String, label: &str, value: &str, note: &str, data: &str, bad: bool) {
    let _ = writeln!(
        out,
        "<div class=\"figure{}\"{data}><span class=\"label\">{}</span><span class=\"value\">{}</span><span class=\"note\">{}</span></div>",
        if bad { " bad" } else { "" },
        escape_html(label),
        escape_html(value),
        escape_html(note)
    );
}

fn at_event(event: Option<u32>) -> String {
    match event {
        Some(e) => format!("after event {e}"),
        None => "before the first event".into(),
    }
}

/// The attributes that carry the headline figures exactly, for scripts and tests.
fn figure_attributes(d: Option<&DeviceSummary>) -> String {
    let mut s = String::new();
    let Some(d) = d else {
        return s;
    };
    let mut put = |name: &str, v: Option<u64>| {
        if let Some(v) = v {
            let _ = write!(s, " data-{name}=\"{v}\"");
        }
    };
    put("peak-requested-bytes", d.peak_requested_bytes);
    put("peak-allocated-bytes", d.peak_allocated_bytes);
    put("peak-reserved-bytes", d.peak_reserved_bytes);
    put("reserved-bytes", Some(d.reserved_bytes));
    put("allocated-bytes", Some(d.allocated_bytes));
    put("requested-bytes", Some(d.requested_bytes));
    put("events", Some(d.trace.events as u64));
    put("ooms", Some(d.ooms.len() as u64));
    s
}

fn headline(out: &mut String, d: Option<&DeviceSummary>) {
    out.push_str("<div class=\"figures\">\n");
    match d.and_then(|d| d.peak_requested_bytes.map(|b| (d, b))) {
        Some((d, b)) => {
            figure(
                out,
                "peak requested",
                &bytes(b),
                &at_event(d.peak_requested_event),
                &format!(" data-bytes=\"{b}\""),
                false,
            );
            if let Some(r) = d.peak_reserved_bytes {
                figure(
                    out,
                    "peak reserved",
                    &bytes(r),
                    &at_event(d.peak_reserved_event),
                    &format!(" data-bytes=\"{r}\""),
                    false,
                );
            }
        }
        None => figure(
            out,
            "peak",
            "no trace",
            "only the final state is known",
            "",
            false,
        ),
    }
    if let Some(d) = d {
        figure(
            out,
            "reserved at the end",
            &bytes(d.reserved_bytes),
            &format!("allocated {}", bytes(d.allocated_bytes)),
            &format!(" data-bytes=\"{}\"", d.reserved_bytes),
            false,
        );
        figure(
            out,
            "OOM events",
            &d.ooms.len().to_string(),
            &match d.ooms.first() {
                Some(o) => format!("first: {} requested", bytes(o.size)),
                None => "none recorded".into(),
            },
            "",
            !d.ooms.is_empty(),
        );
        figure(
            out,
            "trace",
            &format!("{} events", d.trace.events),
            if d.trace.events == 0 {
                "none recorded"
            } else if !d.trace.has_timeline {
                "too few to show memory over time"
            } else if d.trace.looks_truncated {
                "incomplete: it does not start at the beginning"
            } else if d.trace.freed_after_trace > 0 {
                "incomplete at the end: frees not in it"
            } else if d.trace.alive_before_recording > 0 {
                "began mid-run, complete since"
            } else {
                "complete"
            },
            "",
            d.trace.freed_after_trace > 0,
        );
    }
    out.push_str("</div>\n");
}

/// The device a chart of the page names: without the others (the page covers them, and
/// its reader may have no command line to pick one with).
fn alone(d: &DeviceReport) -> crate::analysis::device::DeviceChoice {
    crate::analysis::device::DeviceChoice {
        others: Vec::new(),
        ..d.choice.clone()
    }
}

/// The colours of every chart and table of a device's section: no two call sites (or
/// other groups) shown there share one. Largest first: the timelines' bands, then each
/// moment's table and segment map.
fn device_colors(d: &DeviceReport) -> Colors {
    use crate::analysis::kinds::attribution::GroupKind;
    let mut names: Vec<(&str, GroupKind)> = Vec::new();
    if let Ok(t) = &d.timelines {
        for b in t.by_callsite.bands.iter().chain(&t.by_category.bands) {
            names.push((b.name.as_str(), b.kind));
        }
    }
    for m in &d.moments {
        for g in &m.groups {
            if let Some(k) = g.name.key() {
                names.push((k, g.kind));
            }
        }
        for g in &m.segments.groups {
            names.push((g.name.as_str(), g.kind));
        }
    }
    Colors::new(names)
}

fn timeline_chart(
    f: &FileReport,
    d: &DeviceReport,
    view: &TimelineView,
    colors: &Colors,
) -> io::Result<String> {
    let summary = f
        .summary
        .devices
        .iter()
        .find(|s| s.device == d.choice.device);
    let choice = alone(d);
    let title = ChartTitle {
        path: &f.path,
        device: &choice,
        events: d.events,
        peak_requested: summary.and_then(|s| s.peak_requested_bytes).unwrap_or(0),
        peak_event: summary.and_then(|s| s.peak_requested_event),
        peak_reserved: summary.and_then(|s| s.peak_reserved_bytes),
    };
    inline_svg(|w| write_timeline_svg(w, view, &title, None, None, Some(colors)))
}

fn timeline_section(
    s: &mut Section,
    f: &FileReport,
    d: &DeviceReport,
    id: &str,
    colors: &Colors,
) -> io::Result<()> {
    let out = s.text();
    let _ = writeln!(out, "<section id=\"{id}-timeline\">\n<h3>Timeline</h3>");
    let timelines = match &d.timelines {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(
                out,
                "<p class=\"left-out\">{}</p>\n</section>",
                escape_html(&e.to_string())
            );
            return Ok(());
        }
    };
    let _ = writeln!(
        out,
        "<div class=\"picker\" data-picker=\"{id}-view\"><button type=\"button\" data-value=\"callsite\">By call site</button><button type=\"button\" data-value=\"category\">By category</button><span class=\"sep\"></span><button type=\"button\" data-zoom=\"in\" data-scope=\"{id}-timeline\">Zoom in</button><button type=\"button\" data-zoom=\"out\" data-scope=\"{id}-timeline\">Zoom out</button><button type=\"button\" data-zoom=\"reset\" data-scope=\"{id}-timeline\">Reset</button></div>\n<p class=\"hint\">Memory over the events of the trace, stacked by where it was allocated; the peak and any OOM are marked. Hover a band for its size and call site.<span class=\"js-only\"> Click it for its stack. Zoom the time axis with the buttons or Ctrl or Shift and the wheel (the y axis stays), drag to pan, double-click to reset.</span></p>"
    );
    let device = d.choice.device;
    let path = shell_word(&f.path);
    for (k, (value, heading, view)) in [
        ("callsite", "By call site", &timelines.by_callsite),
        ("category", "By category", &timelines.by_category),
    ]
    .into_iter()
    .enumerate()
    {
        let chart = timeline_chart(f, d, view, colors)?;
        let out = s.text();
        let _ = writeln!(
            out,
            "<div data-pane=\"{id}-view\" data-value=\"{value}\">\n<h4 class=\"nojs-only\">{heading}</h4>"
        );
        let note = left_out(
            "timeline",
            chart.len(),
            &format!("vramlens timeline {path} --device {device} --by {value} -o timeline.svg"),
        );
        let mut html =
            format!("<div class=\"chart zoomable\" data-chart=\"timeline\">\n{chart}</div>\n");
        if k == 0 {
            html.push_str(&band_stacks(&timelines.stacks));
        }
        s.optional(html, note, (if k == 0 { 1 } else { 4 }, 0));
        s.text().push_str("</div>\n");
    }
    s.text().push_str("</section>\n");
    Ok(())
}

/// The whole stack of each band, hidden: the panel shows it when a band is clicked.
fn band_stacks(stacks: &std::collections::BTreeMap<String, Vec<String>>) -> String {
    let mut out = String::from("<div class=\"stacks\" hidden>\n");
    for (name, frames) in stacks.iter().filter(|(_, f)| !f.is_empty()) {
        let _ = write!(
            out,
            "<ol data-label=\"{}\" data-caption=\"the whole stack of its largest allocation, innermost first\">",
            escape_html(name)
        );
        for f in frames {
            let _ = write!(out, "<li>{}</li>", escape_html(f));
        }
        out.push_str("</ol>\n");
    }
    out.push_str("</div>\n");
    out
}

/// Rows of a table of what was live shown open; the rest are one click away.
const OPEN_ROWS: usize = 12;

fn live_table(m: &MomentReport, colors: &Colors) -> String {
    let head = "<table class=\"live\">\n<thead><tr><th class=\"num\">requested</th><th class=\"num\">share</th><th class=\"num\">allocations</th><th>call site</th><th>category</th><th class=\"num\">first allocated</th></tr></thead>\n<tbody>\n";
    let mut out = String::from(head);
    for (i, g) in m.groups.iter().enumerate() {
        if i == OPEN_ROWS {
            let rest = &m.groups[OPEN_ROWS..];
            let bytes_rest: u64 = rest.iter().map(|g| g.bytes).sum();
            let _ = write!(
                out,
                "</tbody>\n</table>\n<details class=\"more-rows\"><summary>{} more ({}, {})</summary>\n{head}",
                rest.len(),
                escape_html(&bytes(bytes_rest)),
                percent(bytes_rest, m.total_bytes)
            );
        }
        let name = group_name_display(&g.name, g.kind);
        let figures = format!(
            "{} requested ({} bytes) in {} allocation{}{}",
            bytes(g.bytes),
            g.bytes,
            g.count,
            if g.count == 1 { "" } else { "s" },
            if g.category.is_empty() {
                String::new()
            } else {
                format!("; category {}", g.category)
            }
        );
        // The colour the charts give the group (the merged rest: the rest band's grey).
        let swatch = format!(
            "<span class=\"swatch\" style=\"background:{}\"></span>",
            g.name
                .key()
                .map_or("#c8c8c8".to_string(), |k| colors.group(k, g.kind))
        );
        let site = if g.frames.is_empty() {
            format!("{swatch}{}", escape_html(&name))
        } else {
            let mut s = format!(
                "<details><summary>{swatch}{}</summary><ol class=\"frames\" data-caption=\"stack of the largest allocation ({}), innermost first\">",
                escape_html(&name),
                escape_html(&bytes(g.largest_bytes))
            );
            for f in &g.frames {
                let _ = write!(s, "<li>{}</li>", escape_html(f));
            }
            s.push_str("</ol></details>");
            s
        };
        let _ = writeln!(
            out,
            "<tr data-name=\"{}\" data-figures=\"{}\" data-bytes=\"{}\"><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{site}</td><td>{}</td><td class=\"num\">{}</td></tr>",
            escape_html(&name),
            escape_html(&figures),
            g.bytes,
            escape_html(&bytes(g.bytes)),
            percent(g.bytes, m.total_bytes),
            g.count,
            escape_html(&g.category),
            g.first_alloc_event
                .map_or("before the trace".to_string(), |e| e.to_string())
        );
    }
    out.push_str("</tbody>\n</table>\n");
    if m.groups.len() > OPEN_ROWS {
        out.push_str("</details>\n");
    }
    out
}

fn moments_section(
    s: &mut Section,
    f: &FileReport,
    d: &DeviceReport,
    id: &str,
    colors: &Colors,
) -> io::Result<()> {
    let out = s.text();
    let _ = writeln!(
        out,
        "<section id=\"{id}-live\">\n<h3>What was live</h3>\n<div class=\"picker\" data-picker=\"{id}-moment\">"
    );
    for (k, m) in d.moments.iter().enumerate() {
        let _ = write!(
            out,
            "<button type=\"button\" data-value=\"{k}\">{}</button>",
            escape_html(&moment_label(m))
        );
    }
    out.push_str("</div>\n");
    if d.more_ooms > 0 {
        let _ = writeln!(
            out,
            "<p class=\"hint\">{} more OOM events are not offered here; see them with <code>vramlens oom {}</code>.</p>",
            d.more_ooms,
            escape_html(&shell_word(&f.path))
        );
    }
    let path = shell_word(&f.path);
    let device = d.choice.device;
    for (k, m) in d.moments.iter().enumerate() {
        let at = moment_arg(m);
        let heading = {
            let t = capitalized(&moment_text(&m.moment));
            let also: Vec<&str> = m
                .also
                .iter()
                .map(|a| match *a {
                    MomentKind::Oom => "the OOM",
                    MomentKind::End => "the end of the trace",
                    MomentKind::Peak => "the peak",
                    other => other.name(),
                })
                .collect();
            if also.is_empty() {
                t
            } else {
                format!("{t}, also {}", also.join(" and "))
            }
        };
        let out = s.text();
        let _ = writeln!(
            out,
            "<div class=\"moment\" data-pane=\"{id}-moment\" data-value=\"{k}\" data-kind=\"{}\"{} data-total-bytes=\"{}\" data-reserved-bytes=\"{}\">\n<h4>{}</h4>\n<p>{} requested by {} live allocations ({} in blocks); {} reserved.</p>",
            m.moment.kind.name(),
            m.moment
                .event
                .map(|e| format!(" data-event=\"{e}\""))
                .unwrap_or_default(),
            m.total_bytes,
            m.reserved_bytes.max(0),
            escape_html(&heading),
            escape_html(&bytes(m.total_bytes)),
            m.count,
            escape_html(&bytes(m.allocated_bytes)),
            escape_html(&bytes(m.reserved_bytes.max(0) as u64)),
        );
        out.push_str("<h5>By call site</h5>\n");
        let table = live_table(m, colors);
        let note = left_out(
            "table",
            table.len(),
            &format!("vramlens top {path} --device {device} --at {at} --limit 200"),
        );
        s.optional(table, note, (2, k));
        s.text().push_str("<h5>Flame graph</h5>\n");
        // The section names the device and the others; the chart only which one.
        let heading = format!("{}: device {}", f.path, d.choice.device);
        let subtitle = format!(
            "{}: {} requested by {} live allocations",
            moment_text(&m.moment),
            bytes(m.total_bytes),
            m.count
        );
        let flame = inline_svg(|w| {
            write_flame_svg(
                w,
                &m.flame,
                &FlameTitle {
                    heading: &heading,
                    subtitle: &subtitle,
                },
                Some(colors),
            )
        })?;
        let note = left_out(
            "flame graph",
            flame.len(),
            &format!("vramlens flamegraph {path} --device {device} --at {at} -o flame.svg"),
        );
        let html = format!(
            "<div class=\"chart\" data-chart=\"flame\" data-caption=\"the frames below it, outermost first\">\n{flame}</div>\n<p class=\"hint\">Hover a box for its bytes.<span class=\"js-only\"> Click it for its frame and the frames that called it.</span></p>\n"
        );
        s.optional(html, note, (3, k));
        s.text().push_str("<h5>Segments</h5>\n");
        let map = inline_svg(|w| write_segments_svg(w, &m.segments, &alone(d), Some(colors)))?;
        let note = left_out(
            "segment map",
            map.len(),
            &format!("vramlens segments {path} --device {device} --at {at} -o segments.svg"),
        );
        // Long (a row per segment): closed, its totals in the line that opens it.
        let html = format!(
            "<details class=\"segments\"><summary>{}: reserved {}, allocated {}, free {} (open to draw the map)</summary>\n<div class=\"chart\" data-chart=\"segments\">\n{map}</div>\n</details>\n",
            escape_html(&crate::units::count(
                m.segments.segments.len(),
                "segment",
                "segments"
            )),
            escape_html(&bytes(m.segments.reserved_bytes)),
            escape_html(&bytes(m.segments.allocated_bytes)),
            escape_html(&bytes(m.segments.free_bytes)),
        );
        s.optional(html, note, (5, k));
        s.text().push_str("</div>\n");
    }
    s.text().push_str("</section>\n");
    Ok(())
}

fn oom_section(d: &DeviceReport, id: &str) -> io::Result<String> {
    let mut out = format!("<section id=\"{id}-oom\">\n<h3>OOM verdicts</h3>\n");
    for a in &d.oom.analyses {
        if let Some(v) = a.verdicts.iter().find(|v| v.role == Role::Primary) {
            let _ = writeln!(
                out,
                "<p class=\"verdict\">{}</p>",
                escape_html(&verdict_text(a, v))
            );
        }
        let text = text_of(|w| write_analysis(w, a, Style::default()))?;
        let _ = writeln!(out, "<pre>{text}</pre>");
        if let Some(l) = d
            .oom_ledgers
            .iter()
            .find(|l| l.device == a.device && l.event == a.event)
        {
            out.push_str(&ledger_html(l));
        }
    }
    if d.oom.analyses.is_empty() {
        out.push_str("<p class=\"verdict none\">No OOM to analyse.</p>\n");
    }
    for (device, n) in &d.oom.more_oom_events {
        let _ = writeln!(
            out,
            "<p class=\"hint\">Device {device}: {n} more OOM events, not analysed one by one.</p>"
        );
    }
    out.push_str("</section>\n");
    Ok(out)
}

/// The device's memory at an OOM: a column per source, and why they differ.
fn ledger_html(l: &crate::analysis::device::device_memory::OomLedger) -> String {
    let t = crate::render::device::device_memory::ledger_table(l);
    let mut out = String::from(
        "<h4>Device memory at the OOM</h4>\n<table class=\"ledger\">\n<thead><tr><th></th>",
    );
    for h in &t.heads {
        let _ = write!(out, "<th class=\"num\">{}</th>", escape_html(h));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for (label, cells) in &t.rows {
        let _ = write!(out, "<tr><th>{}</th>", escape_html(label));
        for c in cells {
            let _ = write!(out, "<td class=\"num\">{}</td>", escape_html(c));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    if !t.reasons.is_empty() {
        out.push_str("<p>Why the columns differ:</p>\n<ul class=\"reasons\">\n");
        for r in &t.reasons {
            let _ = writeln!(out, "<li>{}</li>", escape_html(r));
        }
        out.push_str("</ul>\n");
    }
    out
}

fn warnings_section(f: &FileReport, id: &str) -> String {
    let mut out = format!("<section id=\"{id}-warnings\">\n<h3>Warnings while reading</h3>\n");
    if f.summary.warnings.is_empty() {
        out.push_str("<p>None: every part of the file was read as expected.</p>\n");
    } else {
        out.push_str("<ul class=\"warnings\">\n");
        for (message, count) in crate::render::words::warnings::warning_lines(&f.summary.warnings) {
            let times = if count > 1 {
                format!(" ({count} times)")
            } else {
                String::new()
            };
            let _ = writeln!(out, "<li>{}{times}</li>", escape_html(&message));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</section>\n");
    out
}

/// "device 2 (peak 20.1 GiB)".
fn device_with_peak(d: &DeviceReport, device: i64) -> String {
    match d.choice.peak_of(device) {
        Some(b) => format!("device {device} (peak {})", bytes(b)),
        None => format!("device {device}"),
    }
}

/// The device line of a file: the first device, why, and the others the page covers
/// (a reader of the page may have no vramlens: no option is named).
fn report_device_line(f: &FileReport, d: &DeviceReport) -> String {
    let c = &d.choice;
    let own = c
        .peak_of(c.device)
        .map(|b| format!(", peak {}", bytes(b)))
        .unwrap_or_default();
    let why = match c.reason {
        crate::analysis::device::DeviceReason::Oom => format!(" (the device with the OOM{own})"),
        crate::analysis::device::DeviceReason::LargestPeak => {
            format!(" (the largest peak{own})")
        }
        _ => String::new(),
    };
    let others: Vec<String> = f
        .other_devices
        .iter()
        .map(|o| device_with_peak(d, o.choice.device))
        .chain(f.devices_left_out.iter().map(|&x| device_with_peak(d, x)))
        .collect();
    match others.len() {
        0 => format!("device {}{why}", c.device),
        _ => format!(
            "device {}{why}; the file also has {}: pick one above its sections",
            c.device,
            others.join(", ")
        ),
    }
}

/// A device's button: "device 1: the OOM, peak 78.3 GiB".
fn device_button(f: &FileReport, d: &DeviceReport, first: bool) -> String {
    let dev = d.choice.device;
    let peak = d
        .choice
        .peak_of(dev)
        .map(|b| format!("peak {}", bytes(b)))
        .unwrap_or_else(|| "no peak".into());
    let ooms = f
        .summary
        .devices
        .iter()
        .find(|x| x.device == dev)
        .map_or(0, |x| x.ooms.len());
    let oom = match (first, ooms) {
        (_, 0) => String::new(),
        (_, 1) => "an OOM, ".to_string(),
        (_, n) => format!("{n} OOMs, "),
    };
    format!("device {dev}: {oom}{peak}")
}

/// One file's section within `budget` bytes, and how many parts were left out.
fn file_section(
    f: &FileReport,
    index: usize,
    budget: usize,
    several: bool,
) -> io::Result<(String, usize)> {
    let id = format!("f{index}");
    let mut s = Section::default();
    {
        let out = s.text();
        let _ = writeln!(
            out,
            "<section class=\"file\" id=\"{id}\" data-pane=\"file\" data-value=\"{index}\" data-path=\"{}\"{}{}>",
            escape_html(&f.path),
            f.device
                .as_ref()
                .map(|d| format!(" data-device=\"{}\"", d.choice.device))
                .unwrap_or_default(),
            figure_attributes(f.device_summary())
        );
        let _ = writeln!(
            out,
            "<h2>{}</h2>\n<p class=\"device-line\">{}</p>",
            escape_html(&f.path),
            escape_html(&match &f.device {
                Some(d) => report_device_line(f, d),
                None => "no device: the file has no segment and no trace entry".to_string(),
            })
        );
        headline(out, f.device_summary());
        let _ = writeln!(
            out,
            "<nav class=\"toc\">{}<a href=\"#{id}-summary\">Summary</a><a href=\"#{id}-warnings\">Warnings</a>{}</nav>",
            match &f.device {
                Some(d) => format!(
                    "<a href=\"#{id}-answer\">The answer</a><a href=\"#{id}-timeline\">Timeline</a><a href=\"#{id}-oom\">OOM verdicts</a><a href=\"#{id}-live\">What was live</a><a href=\"#{id}-whatif\">What if</a><a href=\"#{id}-budget\">Budget</a>{}",
                    if d.reconcile.is_some() {
                        format!("<a href=\"#{id}-reconcile\">Device readings</a>")
                    } else {
                        String::new()
                    }
                ),
                None => String::new(),
            },
            if several {
                "<a href=\"#ranks\">All files</a>"
            } else {
                ""
            }
        );
    }
    if let Some(d) = &f.device {
        if f.other_devices.is_empty() {
            device_sections(&mut s, f, d, &id)?;
        } else {
            // A picker over the devices, the first (the OOM's, else the largest peak)
            // shown first; without JavaScript each follows the other under its heading.
            let devices: Vec<&DeviceReport> = std::iter::once(d).chain(&f.other_devices).collect();
            let out = s.text();
            let _ = write!(out, "<div class=\"picker\" data-picker=\"{id}-device\">");
            for (k, dr) in devices.iter().enumerate() {
                let _ = write!(
                    out,
                    "<button type=\"button\" data-value=\"{k}\">{}</button>",
                    escape_html(&device_button(f, dr, k == 0))
                );
            }
            out.push_str("</div>\n");
            for (k, dr) in devices.iter().enumerate() {
                let device_id = if k == 0 {
                    id.clone()
                } else {
                    format!("{id}-d{}", dr.choice.device)
                };
                let out = s.text();
                let _ = writeln!(
                    out,
                    "<div class=\"device\" data-pane=\"{id}-device\" data-value=\"{k}\" data-device=\"{}\">\n<h3 class=\"device-heading\">{}</h3>",
                    dr.choice.device,
                    escape_html(&capitalized(&device_button(f, dr, k == 0)))
                );
                if k > 0 {
                    headline(
                        out,
                        f.summary
                            .devices
                            .iter()
                            .find(|x| x.device == dr.choice.device),
                    );
                }
                s.offset = (6 * k).min(200) as u8;
                device_sections(&mut s, f, dr, &device_id)?;
                s.offset = 0;
                s.text().push_str("</div>\n");
            }
        }
        if !f.devices_left_out.is_empty() {
            let _ = writeln!(
                s.text(),
                "<p class=\"hint\">{} more devices are not drawn here: {}.</p>",
                f.devices_left_out.len(),
                escape_html(
                    &f.devices_left_out
                        .iter()
                        .map(|&x| device_with_peak(d, x))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            );
        }
    }
    let summary = text_of(|w| write_summary_text(w, &f.summary, Style::default()))?;
    let html = format!(
        "<section id=\"{id}-summary\">\n<h3>Summary</h3>\n<pre>{summary}</pre>\n</section>\n"
    );
    let note = format!(
        "<section id=\"{id}-summary\"><h3>Summary</h3>{}</section>\n",
        left_out(
            "summary",
            html.len(),
            &format!("vramlens summary {}", shell_word(&f.path))
        )
    );
    s.optional(html, note, (0, 0));
    let warnings = warnings_section(f, &id);
    let note = format!(
        "<section id=\"{id}-warnings\"><h3>Warnings while reading</h3>{}</section>\n",
        left_out(
            "list of warnings",
            warnings.len(),
            &format!("vramlens summary {}", shell_word(&f.path))
        )
    );
    s.optional(warnings, note, (0, 2));
    s.text().push_str("</section>\n");
    Ok(s.finish(budget))
}

/// The answer first: the OOM's verdicts (each in a line, the evidence a link away), or
/// without an OOM the peak and the call sites that held most of it.
fn answer_section(out: &mut String, d: &DeviceReport, id: &str) {
    let _ = writeln!(
        out,
        "<section id=\"{id}-answer\" class=\"answer\">\n<h3>The answer</h3>"
    );
    let recorded: Vec<_> = d.oom.analyses.iter().filter(|a| a.oom_recorded).collect();
    if let Some(a) = recorded.first() {
        for v in &a.verdicts {
            let role = match v.role {
                Role::Primary => "verdict",
                Role::Contributing => "contributing",
            };
            let _ = writeln!(
                out,
                "<p class=\"verdict{}\"><b>{role}</b>: {}</p>",
                if v.role == Role::Primary {
                    ""
                } else {
                    " contributing"
                },
                escape_html(&verdict_text(a, v))
            );
            let fixes = crate::render::oom::fix_lines(a, v);
            if !fixes.is_empty() {
                out.push_str("<ul class=\"fixes\">\n");
                for f in fixes {
                    let _ = writeln!(out, "<li>{}</li>", escape_html(&f));
                }
                out.push_str("</ul>\n");
            }
        }
        if a.verdicts.is_empty() {
            out.push_str("<p class=\"verdict none\">An OOM is recorded, but its figures do not give a verdict: see the OOM section.</p>\n");
        }
        let more = match recorded.len() {
            1 => String::new(),
            n => format!(" (the first of {n} OOMs analysed)"),
        };
        let _ = writeln!(
            out,
            "<p class=\"hint\">The evidence{more}: <a href=\"#{id}-oom\">the OOM's figures and what was live</a>; over time: <a href=\"#{id}-timeline\">the timeline</a>.</p>"
        );
    } else if let Some(m) = d
        .moments
        .iter()
        .find(|m| m.moment.kind == MomentKind::Peak)
        .or(d.moments.first())
    {
        // The peak, else (no trace) the final state: the moments always end with it.
        let _ = writeln!(
            out,
            "<p class=\"verdict none\">No OOM is recorded. {}: {} requested by {} live allocations ({} reserved), most of it held by:</p>\n<ul class=\"holders\">",
            escape_html(&capitalized(&moment_text(&m.moment))),
            escape_html(&bytes(m.total_bytes)),
            m.count,
            escape_html(&bytes(m.reserved_bytes.max(0) as u64))
        );
        for g in m
            .groups
            .iter()
            .filter(|g| g.kind != GroupKind::Rest)
            .take(3)
        {
            let _ = writeln!(
                out,
                "<li>{} ({}) {}{}</li>",
                escape_html(&bytes(g.bytes)),
                percent(g.bytes, m.total_bytes),
                escape_html(&group_name_display(&g.name, g.kind)),
                if g.category.is_empty() {
                    String::new()
                } else {
                    format!(
                        " <span class=\"category\">{}</span>",
                        escape_html(&g.category)
                    )
                }
            );
        }
        let _ = writeln!(
            out,
            "</ul>\n<p class=\"hint\">Every call site: <a href=\"#{id}-live\">what was live</a>.</p>"
        );
    } else {
        out.push_str("<p class=\"verdict none\">No OOM is recorded, and the trace is too short to show a peak: the final state is below.</p>\n");
    }
    out.push_str("</section>\n");
}

/// The sections about the file's device: the answer, timeline, OOM verdicts, moments,
/// budget, readings.
fn device_sections(s: &mut Section, f: &FileReport, d: &DeviceReport, id: &str) -> io::Result<()> {
    answer_section(s.text(), d, id);
    // One colour book for every chart and table of the device.
    let colors = device_colors(d);
    timeline_section(s, f, d, id, &colors)?;
    let oom = oom_section(d, id)?;
    let note = format!(
        "<section id=\"{id}-oom\"><h3>OOM verdicts</h3>{}</section>\n",
        left_out(
            "OOM analysis",
            oom.len(),
            &format!("vramlens oom {}", shell_word(&f.path))
        )
    );
    s.optional(oom, note, (0, 1));
    moments_section(s, f, d, id, &colors)?;
    if let Some(sim) = &d.simulate {
        let text = text_of(|w| {
            crate::render::simulate::write_simulate_text(w, sim, Style::default(), false)
        })?;
        let chart = match sim.devices.first() {
            Some(dev) => inline_svg(|w| {
                crate::render::simulate::write_simulate_svg(
                    w,
                    sim,
                    dev,
                    &dev.recorded_series,
                    dev.events,
                )
            })?,
            None => String::new(),
        };
        let html = format!(
            "<section id=\"{id}-whatif\">\n<h3>What if</h3>\n<figure class=\"chart\">{chart}</figure>\n<pre>{text}</pre>\n</section>\n"
        );
        let note = format!(
            "<section id=\"{id}-whatif\"><h3>What if</h3>{}</section>\n",
            left_out(
                "what-if",
                html.len(),
                &format!("vramlens simulate {}", shell_word(&f.path))
            )
        );
        s.optional(html, note, (0, 1));
    }
    if let Some(b) = d.moments.iter().find_map(|m| m.budget.as_ref()) {
        let text = text_of(|w| crate::render::budget::write_run_budget_text(w, b))?;
        let heading = if crate::render::budget::at_oom(b) {
            "Budget at the first OOM"
        } else {
            "Budget at the peak"
        };
        let html = format!(
            "<section id=\"{id}-budget\">\n<h3>{heading}</h3>\n<pre>{text}</pre>\n</section>\n"
        );
        let note = format!(
            "<section id=\"{id}-budget\"><h3>{heading}</h3>{}</section>\n",
            left_out(
                "budget",
                html.len(),
                &format!("vramlens budget {}", shell_word(&f.path))
            )
        );
        s.optional(html, note, (0, 1));
    }
    if let Some(r) = &d.reconcile {
        // Each OOM's readings are in its ledger (the OOM section): not a second time here.
        let mut r = r.clone();
        let mut moved = false;
        for dev in &mut r.devices {
            let before = dev.ledgers.len();
            dev.ledgers.retain(|l| {
                !d.oom_ledgers
                    .iter()
                    .any(|o| o.device == dev.device && o.event == l.event && o.reading.is_some())
            });
            moved |= dev.ledgers.len() < before;
        }
        let text = text_of(|w| write_reconcile_text(w, &r, Style::default()))?;
        let pointer = if moved {
            format!(
                "<p>The readings at the OOM are in <a href=\"#{id}-oom\">the OOM section's ledger</a>, beside the OOM message's figures.</p>\n"
            )
        } else {
            String::new()
        };
        let html = format!(
            "<section id=\"{id}-reconcile\">\n<h3>Device readings against PyTorch</h3>\n{pointer}<pre>{text}</pre>\n</section>\n"
        );
        let note = format!(
            "<section id=\"{id}-reconcile\"><h3>Device readings against PyTorch</h3>{}</section>\n",
            left_out(
                "reconciliation",
                html.len(),
                &format!("vramlens reconcile {} --nvml LOG", shell_word(&f.path))
            )
        );
        s.optional(html, note, (0, 3));
    }
    Ok(())
}

/// The table of ranks; `files` are the paths of the files' sections, in order (a file
/// without a device has no row).
fn ranks_section(out: &mut String, r: &RanksReport, files: &[&str]) {
    out.push_str("<section id=\"ranks\">\n<h2>All files</h2>\n<table class=\"ranks\">\n<thead><tr><th>file</th><th class=\"num\">device</th><th class=\"num\">peak</th><th class=\"num\">vs median</th><th class=\"num\">reserved at the end</th><th class=\"num\">OOMs</th><th>largest group at the peak</th></tr></thead>\n<tbody>\n");
    let mut next = 0;
    for row in &r.rows {
        // Rows follow the files' order.
        let i = (next..files.len())
            .find(|&i| files[i] == row.path)
            .unwrap_or(next);
        next = i + 1;
        let group = match (&row.top_group, row.top_group_kind, row.top_group_bytes) {
            (Some(g), Some(kind), Some(b)) => {
                format!("{} {}", bytes(b), group_name_display(g, kind))
            }
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "<tr data-show-file=\"{i}\"{}{}><td><a href=\"#f{i}\">{}</a></td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            if row.outlier {
                " class=\"outlier\""
            } else {
                ""
            },
            row.peak_requested_bytes
                .map(|b| format!(" data-peak-requested-bytes=\"{b}\""))
                .unwrap_or_default(),
            escape_html(&row.path),
            row.device,
            row.peak_requested_bytes.map_or("no trace".into(), bytes),
            row.peak_over_median
                .map_or("-".into(), |x| format!("{:+.1}%", (x - 1.0) * 100.0)),
            bytes(row.reserved_bytes),
            row.ooms,
            escape_html(&group)
        );
    }
    out.push_str("</tbody>\n</table>\n");
    let mut text = Vec::new();
    if crate::render::ranks::write_ranks_text(&mut text, r, Style::default()).is_ok() {
        let _ = writeln!(
            out,
            "<details><summary>Outliers and what differs between the largest and the median file</summary><pre>{}</pre></details>",
            escape_html(&String::from_utf8_lossy(&text))
        );
    }
    out.push_str("</section>\n");
}

/// What was written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageStats {
    pub bytes: u64,
    /// Charts, tables and texts replaced by a note to stay under [`MAX_REPORT_BYTES`].
    pub left_out: usize,
}

/// Whether the page carries its style sheet and script (always, for people), or a
/// one-line note in place of each (for golden files, which then hold what the report
/// says rather than copies of the two assets). The page's size and what is left out to
/// stay under [`MAX_REPORT_BYTES`] are counted as if embedded either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Assets {
    #[default]
    Embedded,
    LeftOut,
}

impl Assets {
    fn css(self) -> &'static str {
        match self {
            Assets::Embedded => CSS,
            Assets::LeftOut => "/* report.css left out */\n",
        }
    }
    fn script(self) -> &'static str {
        match self {
            Assets::Embedded => SCRIPT,
            Assets::LeftOut => "/* report.js left out */\n",
        }
    }
    /// Bytes the page counts beyond what it wrote.
    fn not_written(self) -> u64 {
        match self {
            Assets::Embedded => 0,
            Assets::LeftOut => {
                (CSS.len() + SCRIPT.len() - self.css().len() - self.script().len()) as u64
            }
        }
    }
}

/// Writes the page for the files (in order) and, for several, their table of ranks.
pub fn write_report_html(
    out: &mut dyn Write,
    files: &[FileReport],
    ranks: Option<&RanksReport>,
    assets: Assets,
) -> io::Result<PageStats> {
    let several = files.len() > 1;
    let title = match files {
        [one] => format!("vramlens report: {}", one.path),
        _ => format!("vramlens report: {} files", files.len()),
    };
    let mut head = String::new();
    let _ = write!(
        head,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta http-equiv=\"Content-Security-Policy\" content=\"{CONTENT_SECURITY_POLICY}\">\n<meta name=\"referrer\" content=\"no-referrer\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<meta name=\"generator\" content=\"vramlens {}\">\n<title>{}</title>\n<style>\n{}</style>\n</head>\n<body>\n<header class=\"top\">\n<h1>{}</h1>\n<p>Memory of PyTorch's CUDA caching allocator, from its snapshots. This page loads nothing from anywhere: every chart and table is inside it.</p>\n",
        env!("CARGO_PKG_VERSION"),
        escape_html(&title),
        assets.css(),
        escape_html(&title)
    );
    if several {
        head.push_str("<div class=\"picker\"><label>File <select data-picker=\"file\">");
        for (i, f) in files.iter().enumerate() {
            let _ = write!(
                head,
                "<option value=\"{i}\">{}</option>",
                escape_html(&f.path)
            );
        }
        head.push_str("</select></label></div>\n");
    }
    head.push_str("</header>\n<main>\n");
    if let Some(r) = ranks {
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        ranks_section(&mut head, r, &paths);
    }
    out.write_all(head.as_bytes())?;
    let mut stats = PageStats {
        bytes: head.len() as u64,
        left_out: 0,
    };
    let budget = FILES_BUDGET / files.len().max(1);
    for (i, f) in files.iter().enumerate() {
        let (section, left_out) = file_section(f, i, budget, several)?;
        out.write_all(section.as_bytes())?;
        stats.bytes += section.len() as u64;
        stats.left_out += left_out;
    }
    let tail = format!(
        "</main>\n<aside id=\"panel\" aria-live=\"polite\"><button type=\"button\" id=\"panel-close\" aria-label=\"Close\">&#215;</button><h3 id=\"panel-title\"></h3><pre id=\"panel-body\"></pre></aside>\n<footer>Written by vramlens {}. Hover any shape for its figures; with JavaScript off, every view is shown in turn.</footer>\n<script>\n{}</script>\n</body>\n</html>\n",
        env!("CARGO_PKG_VERSION"),
        assets.script()
    );
    out.write_all(tail.as_bytes())?;
    stats.bytes += tail.len() as u64 + assets.not_written();
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_addresses_broken() {
        assert_eq!(
            escape_html("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(
            escape_html("see https://example.com/x"),
            "see https:&#47;/example.com/x"
        );
        assert_eq!(escape_html("a\u{1b}[31mb\nc"), "a\\x1b[31mb\nc");
    }

    #[test]
    fn svg_loses_its_prolog_and_namespace() {
        let svg = inline_svg(|w| {
            w.write_all(
                b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\"><title>file://x</title></svg>\n",
            )
        })
        .unwrap();
        assert_eq!(svg, "<svg width=\"1\"><title>file:&#47;/x</title></svg>\n");
    }

    #[test]
    fn sections_keep_what_fits_in_priority_order() {
        let mut s = Section::default();
        s.text().push_str("[head]");
        s.optional("A".repeat(100), "(a)".into(), (2, 0));
        s.text().push_str("[mid]");
        s.optional("B".repeat(50), "(b)".into(), (1, 0));
        s.optional("C".repeat(30), "(c)".into(), (3, 0));
        // 6 + 5 + 9 fixed and notes; room for B (47 more) and C (27 more), not A.
        let (out, left_out) = s.finish(6 + 5 + 9 + 47 + 27);
        assert_eq!(left_out, 1);
        assert_eq!(
            out,
            format!("[head](a)[mid]{}{}", "B".repeat(50), "C".repeat(30))
        );
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_word("runs/rank0.pickle"), "runs/rank0.pickle");
        assert_eq!(shell_word("my run/it's.pickle"), "'my run/it'\\''s.pickle'");
    }
}
