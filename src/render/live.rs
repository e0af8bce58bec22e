//! Text rendering of a [`LiveSet`].

use super::Style;
use super::names::{device_line, moment_note, moment_text};
use crate::analysis::device::DeviceChoice;
use crate::analysis::live::LiveSet;
use crate::timeline::Origin;
use crate::units::bytes;
use std::io::{self, Write};

pub fn write_live_text(
    out: &mut dyn Write,
    live: &LiveSet,
    choice: &DeviceChoice,
    style: Style,
) -> io::Result<()> {
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "{}: {}, {}",
            live.path,
            device_line(choice),
            moment_text(&live.moment)
        ))
    )?;
    if let Some(note) = moment_note(&live.moment) {
        writeln!(out, "{note}")?;
    }
    writeln!(
        out,
        "  {} requested in {} live allocations ({} in allocator blocks); reserved {}",
        bytes(live.requested_bytes),
        live.count,
        bytes(live.allocated_bytes),
        bytes(live.reserved_bytes.max(0) as u64),
    )?;
    if live.count > 0 {
        writeln!(
            out,
            "  (labels are the official viewer's: b'<address>_<n> is the n-th allocation at that address in the trace)"
        )?;
    }
    for a in &live.allocations {
        let since = match (a.origin, a.alloc_event) {
            (Origin::Traced, Some(e)) => format!("since event {e}"),
            (Origin::Survivor, _) => "since before the trace, still live at the end".into(),
            _ => "since before the trace".into(),
        };
        let until = a
            .free_completed_event
            .map(|e| format!(", freed at event {e}"))
            .unwrap_or_default();
        let stream = if a.stream == 0 {
            "default".to_string()
        } else {
            format!("0x{:x}", a.stream)
        };
        let pool = match a.pool_id {
            Some(p) if p != (0, 0) => format!(", pool ({}, {})", p.0, p.1),
            _ => String::new(),
        };
        writeln!(
            out,
            "  {:>10}  {}  {since}{until}, stream {stream}{pool}",
            bytes(a.size_bytes),
            a.label
        )?;
        if a.frames.is_empty() && a.origin != Origin::Traced {
            writeln!(
                out,
                "              (allocated before recording began: no stack)"
            )?;
        }
        for f in &a.frames {
            writeln!(out, "              {f}")?;
        }
    }
    Ok(())
}
