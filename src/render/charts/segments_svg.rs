//! The allocator's state at one moment as SVG: one row per segment, grouped by pool and
//! stream, blocks drawn to scale inside and coloured by the group of the allocation that
//! made them (with a legend), frees waiting on other streams, rounding waste and free
//! holes in colours no group uses, holes drawn at least a few pixels wide (a 16 MiB hole
//! in a 78 GiB segment shows) and labelled with their size. Every shape has a tooltip.

use crate::analysis::device::DeviceChoice;
use crate::analysis::kinds::attribution::GroupKind;
use crate::analysis::moments::segment_map::{MapBlock, MapSegment, SegmentMap};
use crate::render::charts::svg::{Colors, Svg};
use crate::render::words::labels::{device_line, group_display, moment_text, tiny_frame};
use crate::units::bytes;
use std::io::{self, Write};

const WIDTH: f64 = 1280.0;
const LABEL: f64 = 230.0;
const LEGEND: f64 = 300.0;
const RIGHT: f64 = 20.0;
const ROW: f64 = 16.0;
const GAP: f64 = 5.0;
const HEADING: f64 = 24.0;
/// Rows drawn at most; the rest are counted in a note.
pub const MAX_ROWS: usize = 3000;
/// Groups with a colour of their own; the rest share one.
const COLOURED: usize = 19;

const PENDING: &str = "#f0a030";
const WASTE: &str = "#555555";
/// A free hole: white, edged in red, at least [`HOLE_MIN`] wide.
const FREE: &str = "#ffffff";
const FREE_EDGE: &str = "#d62728";
/// The narrowest a hole is drawn (pixels): 16 MiB of a 78 GiB segment is a fifth of one.
const HOLE_MIN: f64 = 3.0;
const OTHER: &str = "#b8b8b8";

/// The heading of a run of rows: the segment's pool and stream.
fn group_name(s: &MapSegment) -> String {
    let pool = match s.pool_id {
        None => "pool unknown".to_string(),
        Some((0, 0)) => "default pool".to_string(),
        Some((a, b)) => format!("private pool ({a}, {b})"),
    };
    let stream = if s.stream == 0 {
        "default stream".to_string()
    } else {
        format!("stream 0x{:x}", s.stream)
    };
    format!("{pool}, {stream}")
}

/// The groups' colours: the first [`COLOURED`] groups each their own ([`Colors`], those of
/// the report the map is part of, else the map's own, as the timeline and the flame graph
/// draw them); the rest share one.
fn group_fills(map: &SegmentMap, colors: Option<&Colors>) -> Vec<String> {
    let shown = &map.groups[..map.groups.len().min(COLOURED)];
    let own;
    let colors = match colors {
        Some(c) => c,
        None => {
            own = Colors::new(shown.iter().map(|g| (g.name.as_str(), g.kind)));
            &own
        }
    };
    shown
        .iter()
        .map(|g| colors.group(&g.name, g.kind))
        .collect()
}

/// A group's colour (see [`group_fills`]).
fn group_fill(fills: &[String], g: usize) -> &str {
    fills.get(g).map_or(OTHER, String::as_str)
}

/// Where a segment's row is drawn: its top, and pixels per byte.
#[derive(Clone, Copy)]
struct RowAt {
    y: f64,
    scale: f64,
}

/// Writes the map: heading, legend, then the segments (at most `MAX_ROWS`) under a
/// heading per pool and stream.
pub fn write_segments_svg(
    out: &mut dyn Write,
    map: &SegmentMap,
    choice: &DeviceChoice,
    colors: Option<&Colors>,
) -> io::Result<()> {
    let fills = group_fills(map, colors);
    let segments = &map.segments;
    let shown = &segments[..segments.len().min(MAX_ROWS)];
    let pools = shown
        .windows(2)
        .filter(|w| group_name(&w[0]) != group_name(&w[1]))
        .count()
        + usize::from(!shown.is_empty());
    let legend_rows = map.groups.len().min(COLOURED + 1) + 4;
    let height = (90.0 + pools as f64 * HEADING + shown.len() as f64 * (ROW + GAP) + 30.0)
        .max(110.0 + legend_rows as f64 * 16.0);
    let largest = segments
        .iter()
        .map(|s| s.size_bytes)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let scale = (WIDTH - LABEL - LEGEND - RIGHT) / largest;
    let mut svg = Svg { out };
    let heading = format!(
        "{}, allocator state {}",
        device_line(choice),
        moment_text(&map.moment)
    );
    svg.begin(
        WIDTH,
        height + 16.0,
        &format!("vramlens segments of {}: {heading}", map.path),
    )?;
    write_heading(&mut svg, map, &heading)?;
    legend(&mut svg, map, &fills)?;
    let mut y = 100.0;
    let mut last_group = String::new();
    for s in shown {
        let g = group_name(s);
        if g != last_group {
            y += HEADING - 6.0;
            svg.text(20.0, y, "start", r#" font-weight="bold""#, &g)?;
            y += 6.0;
            last_group = g;
        }
        draw_segment(&mut svg, map, &fills, s, RowAt { y, scale })?;
        y += ROW + GAP;
    }
    if segments.len() > shown.len() {
        svg.text(
            20.0,
            y + 16.0,
            "start",
            "",
            &format!("{} more segments not drawn", segments.len() - shown.len()),
        )?;
    }
    svg.end()
}

/// The file, the device and moment (`heading`), and a line of totals.
fn write_heading(svg: &mut Svg, map: &SegmentMap, heading: &str) -> io::Result<()> {
    let segments = &map.segments;
    svg.text(
        20.0,
        22.0,
        "start",
        r#" font-size="16" font-weight="bold""#,
        &map.path,
    )?;
    svg.text(20.0, 40.0, "start", "", heading)?;
    let holes: Vec<u64> = segments
        .iter()
        .flat_map(|s| &s.holes)
        .map(|h| h.1)
        .collect();
    svg.text(
        20.0,
        58.0,
        "start",
        "",
        &format!(
            "{}, reserved {}, allocated {}, pending free {}, free {} in {}, largest hole {}",
            crate::units::count(segments.len(), "segment", "segments"),
            bytes(map.reserved_bytes),
            bytes(map.allocated_bytes),
            bytes(map.pending_free_bytes),
            bytes(map.free_bytes),
            crate::units::count(holes.len(), "hole", "holes"),
            bytes(holes.iter().copied().max().unwrap_or(0))
        ),
    )
}

/// The legend: the states, then the groups with a colour of their own, then the rest.
fn legend(svg: &mut Svg, map: &SegmentMap, fills: &[String]) -> io::Result<()> {
    let lx = WIDTH - LEGEND + 10.0;
    let mut ly = 96.0;
    for (fill, edge, text) in [
        (PENDING, "#999", "freed, waiting for other streams"),
        (WASTE, "#999", "rounding waste"),
        (FREE, FREE_EDGE, "free hole (at least 3 px wide)"),
    ] {
        svg.rect(
            lx,
            ly - 8.0,
            14.0,
            10.0,
            &format!(r##" fill="{fill}" stroke="{edge}""##),
            None,
        )?;
        svg.text(lx + 20.0, ly, "start", r#" font-size="11""#, text)?;
        ly += 16.0;
    }
    ly += 6.0;
    // The groups' bytes are the blocks they hold (rounded sizes, as the segments show
    // them), not the requested bytes `top` counts.
    if !map.groups.is_empty() {
        svg.text(
            lx,
            ly,
            "start",
            r#" font-size="11" font-style="italic""#,
            "held in blocks (top counts requested bytes):",
        )?;
        ly += 16.0;
    }
    for (g, group) in map.groups.iter().enumerate().take(COLOURED) {
        svg.rect(
            lx,
            ly - 8.0,
            14.0,
            10.0,
            &format!(r#" fill="{}""#, group_fill(fills, g)),
            Some(&group.name),
        )?;
        let name = match group.kind {
            GroupKind::Frame | GroupKind::Stack => tiny_frame(&group.name),
            _ => group_display(&group.name, group.kind),
        };
        let name = crate::render::words::labels::clip(&name, 30);
        svg.text(
            lx + 20.0,
            ly,
            "start",
            r#" font-size="11""#,
            &format!("{name} ({})", bytes(group.bytes)),
        )?;
        ly += 16.0;
    }
    if map.groups.len() > COLOURED {
        let rest: u64 = map.groups[COLOURED..].iter().map(|g| g.bytes).sum();
        svg.rect(
            lx,
            ly - 8.0,
            14.0,
            10.0,
            &format!(r#" fill="{OTHER}""#),
            None,
        )?;
        svg.text(
            lx + 20.0,
            ly,
            "start",
            r#" font-size="11""#,
            &format!(
                "{} ({})",
                crate::units::count(map.groups.len() - COLOURED, "other group", "other groups"),
                bytes(rest)
            ),
        )?;
    }
    Ok(())
}

/// One segment's row: its label, its outline, its blocks, then its free holes over them
/// (each at least [`HOLE_MIN`] wide, centred where it is, so the smallest shows) with
/// their sizes where they fit.
fn draw_segment(
    svg: &mut Svg,
    map: &SegmentMap,
    fills: &[String],
    s: &MapSegment,
    at: RowAt,
) -> io::Result<()> {
    let RowAt { y, scale } = at;
    let x0 = LABEL;
    let used: u64 = s.blocks.iter().map(|b| b.size_bytes).sum();
    svg.text(
        LABEL - 8.0,
        y + 12.0,
        "end",
        r#" font-size="11""#,
        &format!(
            "s'{:x} {}{}",
            s.addr,
            bytes(s.size_bytes),
            if s.expandable { " (exp.)" } else { "" }
        ),
    )?;
    svg.rect(
        x0,
        y,
        (s.size_bytes as f64 * scale).max(1.0),
        ROW,
        r##" fill="#ffffff" stroke="#888" stroke-width="0.6""##,
        Some(&format!(
            "s'{:x}: segment {}, {} in blocks, {} free",
            s.addr,
            bytes(s.size_bytes),
            bytes(used),
            bytes(s.size_bytes.saturating_sub(used))
        )),
    )?;
    for b in &s.blocks {
        draw_block(svg, map, fills, s, b, at)?;
    }
    let row_w = (s.size_bytes as f64 * scale).max(1.0);
    for &(addr, size) in &s.holes {
        let x = x0 + (addr - s.addr) as f64 * scale;
        let w = size as f64 * scale;
        let drawn = w.max(HOLE_MIN);
        let hx = (x + w / 2.0 - drawn / 2.0).clamp(x0, (x0 + row_w - drawn).max(x0));
        svg.rect(
            hx,
            y + 1.0,
            drawn,
            ROW - 2.0,
            &format!(
                r#" class="hole" fill="{FREE}" stroke="{FREE_EDGE}" stroke-width="1" data-bytes="{size}""#
            ),
            Some(&format!(
                "free hole {} ({size} bytes) at s'{:x} + {}",
                bytes(size),
                s.addr,
                bytes(addr - s.addr)
            )),
        )?;
        if w > 60.0 {
            svg.text(
                x + w / 2.0,
                y + 12.0,
                "middle",
                r##" font-size="10" fill="#555""##,
                &bytes(size),
            )?;
        }
    }
    Ok(())
}

/// One block in its segment's row: the requested bytes in its group's colour (or as a
/// pending free), then the rounding waste up to the block's size.
fn draw_block(
    svg: &mut Svg,
    map: &SegmentMap,
    fills: &[String],
    s: &MapSegment,
    b: &MapBlock,
    at: RowAt,
) -> io::Result<()> {
    let RowAt { y, scale } = at;
    let bx = LABEL + (b.addr - s.addr) as f64 * scale;
    let req_w = (b.requested_bytes.min(b.size_bytes) as f64 * scale).max(0.5);
    let fill = if b.pending_free {
        PENDING
    } else {
        b.group.map_or(OTHER, |g| group_fill(fills, g))
    };
    svg.rect(
        bx,
        y + 1.0,
        req_w,
        ROW - 2.0,
        &format!(r#" fill="{fill}" data-bytes="{}""#, b.size_bytes),
        Some(block_tip(map, b).trim_end()),
    )?;
    if b.size_bytes > b.requested_bytes {
        let waste = (b.size_bytes - b.requested_bytes) as f64 * scale;
        svg.rect(
            bx + req_w,
            y + 1.0,
            waste,
            ROW - 2.0,
            &format!(r#" fill="{WASTE}""#),
            Some(&format!(
                "rounding waste {}",
                bytes(b.size_bytes - b.requested_bytes)
            )),
        )?;
    }
    Ok(())
}

/// A block's tooltip: its label and sizes, its group and category, whether it waits on
/// other streams, and its frames.
fn block_tip(map: &SegmentMap, b: &MapBlock) -> String {
    let mut tip = format!(
        "{}  {} requested, block {}\n",
        b.label.as_deref().unwrap_or(&format!("b'{:x}", b.addr)),
        bytes(b.requested_bytes),
        bytes(b.size_bytes),
    );
    if let Some(g) = b.group {
        tip.push_str(&format!(
            "{} [{}]\n",
            group_display(&map.groups[g].name, map.groups[g].kind),
            map.groups[g].category
        ));
    }
    if b.pending_free {
        tip.push_str("freed, waiting for other streams (record_stream)\n");
    }
    for f in &b.frames {
        tip.push_str(f);
        tip.push('\n');
    }
    tip
}
