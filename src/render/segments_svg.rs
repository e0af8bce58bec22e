//! The allocator's state at one moment as SVG: one row per segment, grouped by pool and
//! stream, blocks drawn to scale inside, pending frees and rounding waste marked, free
//! holes labelled with their size. Every shape has a tooltip.

use super::svg::{Svg, color};
use crate::analysis::frames::{headline_frame, user_frames};
use crate::model::FrameTable;
use crate::timeline::state::StateSegment;
use crate::units::bytes;
use std::io::{self, Write};

const WIDTH: f64 = 1280.0;
const LABEL: f64 = 230.0;
const RIGHT: f64 = 20.0;
const ROW: f64 = 16.0;
const GAP: f64 = 5.0;
const HEADING: f64 = 24.0;
/// Rows drawn at most; the rest are counted in a note.
pub const MAX_ROWS: usize = 3000;

pub struct SegmentsTitle<'a> {
    pub path: &'a str,
    pub device: i64,
    /// "after event N" or "at the end" ...
    pub moment: String,
}

fn group_name(s: &StateSegment) -> String {
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

pub fn write_segments_svg(
    out: &mut dyn Write,
    segments: &[StateSegment],
    frames: &FrameTable,
    title: &SegmentsTitle,
) -> io::Result<()> {
    let shown = &segments[..segments.len().min(MAX_ROWS)];
    let groups = shown
        .windows(2)
        .filter(|w| group_name(&w[0]) != group_name(&w[1]))
        .count()
        + usize::from(!shown.is_empty());
    let height = 90.0 + groups as f64 * HEADING + shown.len() as f64 * (ROW + GAP) + 30.0;
    let largest = segments.iter().map(|s| s.size).max().unwrap_or(1).max(1) as f64;
    let scale = (WIDTH - LABEL - RIGHT) / largest;
    let mut svg = Svg { out };
    let heading = format!(
        "{}: device {}, allocator state {}",
        title.path, title.device, title.moment
    );
    svg.begin(WIDTH, height, &format!("vramlens segments of {heading}"))?;
    svg.text(
        20.0,
        24.0,
        "start",
        r#" font-size="16" font-weight="bold""#,
        &heading,
    )?;
    let reserved: u64 = segments.iter().map(|s| s.size).sum();
    let allocated: u64 = segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| !b.pending_free)
        .map(|b| b.size)
        .sum();
    let pending: u64 = segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.pending_free)
        .map(|b| b.size)
        .sum();
    let holes: Vec<u64> = segments
        .iter()
        .flat_map(|s| s.holes())
        .map(|h| h.1)
        .collect();
    svg.text(
        20.0,
        44.0,
        "start",
        "",
        &format!(
            "{} segments, reserved {}, allocated {}, pending free {}, free {} in {} holes, largest hole {}",
            segments.len(),
            bytes(reserved),
            bytes(allocated),
            bytes(pending),
            bytes(holes.iter().sum()),
            holes.len(),
            bytes(holes.iter().copied().max().unwrap_or(0))
        ),
    )?;
    // Key.
    let key = [
        ("#d62728", "freed, waiting for other streams"),
        ("#7a0000", "rounding waste"),
        ("#eeeeee", "free"),
    ];
    let mut kx = 20.0;
    for (fill, text) in key {
        svg.rect(
            kx,
            56.0,
            14.0,
            10.0,
            &format!(r##" fill="{fill}" stroke="#999""##),
            None,
        )?;
        svg.text(kx + 18.0, 65.0, "start", r#" font-size="11""#, text)?;
        kx += 30.0 + 6.5 * text.len() as f64;
    }
    let mut y = 84.0;
    let mut last_group = String::new();
    for s in shown {
        let g = group_name(s);
        if g != last_group {
            y += HEADING - 6.0;
            svg.text(20.0, y, "start", r#" font-weight="bold""#, &g)?;
            y += 6.0;
            last_group = g;
        }
        let x0 = LABEL;
        let used: u64 = s.blocks.iter().map(|b| b.size).sum();
        svg.text(
            LABEL - 8.0,
            y + 12.0,
            "end",
            r#" font-size="11""#,
            &format!(
                "s'{:x} {}{}",
                s.addr,
                bytes(s.size),
                if s.expandable { " (exp.)" } else { "" }
            ),
        )?;
        svg.rect(
            x0,
            y,
            (s.size as f64 * scale).max(1.0),
            ROW,
            r##" fill="#eeeeee" stroke="#888" stroke-width="0.6""##,
            Some(&format!(
                "s'{:x}: segment {}, {} in blocks, {} free",
                s.addr,
                bytes(s.size),
                bytes(used),
                bytes(s.size.saturating_sub(used))
            )),
        )?;
        for (addr, size) in s.holes() {
            let w = size as f64 * scale;
            if w > 60.0 {
                svg.text(
                    x0 + (addr - s.addr) as f64 * scale + w / 2.0,
                    y + 12.0,
                    "middle",
                    r##" font-size="10" fill="#555""##,
                    &bytes(size),
                )?;
            }
        }
        for b in &s.blocks {
            let bx = x0 + (b.addr - s.addr) as f64 * scale;
            let req_w = (b.requested.min(b.size) as f64 * scale).max(0.5);
            let key = headline_frame(frames, b.stack).unwrap_or_else(|| "no stack".into());
            let fill = if b.pending_free {
                "#d62728".to_string()
            } else {
                color(&key)
            };
            let mut tip = format!(
                "b'{:x}  {} requested, block {}{}\n",
                b.addr,
                bytes(b.requested),
                bytes(b.size),
                if b.pending_free {
                    "\nfreed, waiting for other streams (record_stream)"
                } else {
                    ""
                }
            );
            for f in user_frames(frames, b.stack, 6) {
                tip.push_str(&f);
                tip.push('\n');
            }
            svg.rect(
                bx,
                y + 1.0,
                req_w,
                ROW - 2.0,
                &format!(r#" fill="{fill}" data-bytes="{}""#, b.size),
                Some(tip.trim_end()),
            )?;
            if b.size > b.requested {
                let waste = (b.size - b.requested) as f64 * scale;
                svg.rect(
                    bx + req_w,
                    y + 1.0,
                    waste,
                    ROW - 2.0,
                    r##" fill="#7a0000""##,
                    Some(&format!("rounding waste {}", bytes(b.size - b.requested))),
                )?;
            }
        }
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
