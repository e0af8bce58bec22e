//! Text rendering of a [`LiveReport`].

use crate::analysis::device::DeviceChoice;
use crate::analysis::moments::live::LiveReport;
use crate::render::Style;
use crate::render::words::labels::{MomentTotals, write_moment_heading};
use crate::timeline::Origin;
use crate::units::bytes;
use crate::units::shown;
use std::io::{self, Write};

pub fn write_live_text(
    out: &mut dyn Write,
    live: &LiveReport,
    choice: &DeviceChoice,
    style: Style,
) -> io::Result<()> {
    write_moment_heading(
        out,
        &MomentTotals {
            path: &live.path,
            moment: &live.moment,
            requested_bytes: live.requested_bytes,
            count: live.count,
            allocated_bytes: live.allocated_bytes,
            reserved_bytes: live.reserved_bytes,
        },
        choice,
        style,
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
        writeln!(
            out,
            "              {}{}: {}",
            if a.category_inferred { "~" } else { "" },
            a.category,
            crate::render::words::evidence::words(&a.category_evidence)
        )?;
        if a.frames.is_empty() && a.origin != Origin::Traced {
            writeln!(
                out,
                "              (allocated before recording began: no stack)"
            )?;
        }
        for f in &a.frames {
            writeln!(out, "              {}", shown(f))?;
        }
    }
    Ok(())
}
