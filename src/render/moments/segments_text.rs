//! Text rendering of a [`SegmentMap`]: one line per segment.

use crate::analysis::device::DeviceChoice;
use crate::analysis::moments::segment_map::SegmentMap;
use crate::render::Style;
use crate::render::words::labels::{device_line, group_display, moment_note, moment_text};
use crate::units::bytes;
use crate::units::shown;
use std::io::{self, Write};

pub fn write_segments_text(
    out: &mut dyn Write,
    map: &SegmentMap,
    choice: &DeviceChoice,
    style: Style,
) -> io::Result<()> {
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "{}: {}, {}",
            shown(&map.path),
            device_line(choice),
            moment_text(&map.moment)
        ))
    )?;
    if let Some(note) = moment_note(&map.moment) {
        writeln!(out, "{note}")?;
    }
    if !map.segments.is_empty() {
        writeln!(
            out,
            "  (s'<address> is a segment, named by its start address as the official viewer names it; holes are runs of free bytes inside it)"
        )?;
    }
    for s in &map.segments {
        let used: u64 = s.blocks.iter().map(|b| b.size_bytes).sum();
        let largest = s.holes.iter().map(|h| h.1).max().unwrap_or(0);
        // The group holding most of the segment.
        let mut by_group: Vec<(usize, u64)> = Vec::new();
        for b in &s.blocks {
            if let Some(g) = b.group {
                match by_group.iter_mut().find(|(x, _)| *x == g) {
                    Some(e) => e.1 += b.size_bytes,
                    None => by_group.push((g, b.size_bytes)),
                }
            }
        }
        by_group.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let main = by_group
            .first()
            .map(|&(g, _)| {
                format!(
                    "; mostly {}",
                    group_display(&map.groups[g].name, map.groups[g].kind)
                )
            })
            .unwrap_or_default();
        writeln!(
            out,
            "  s'{:x}  {:>10}  {}, {} used, {} free in {} (largest {}), stream {}{}{main}",
            s.addr,
            bytes(s.size_bytes),
            crate::units::count(s.blocks.len(), "block", "blocks"),
            bytes(used),
            bytes(s.size_bytes.saturating_sub(used)),
            crate::units::count(s.holes.len(), "hole", "holes"),
            bytes(largest),
            if s.stream == 0 {
                "default".to_string()
            } else {
                format!("0x{:x}", s.stream)
            },
            match s.pool_id {
                Some(p) if p != (0, 0) => format!(", pool ({}, {})", p.0, p.1),
                _ => String::new(),
            }
        )?;
    }
    Ok(())
}
