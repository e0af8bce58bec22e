//! Text rendering of a [`PeaksReport`].

use crate::analysis::device::DeviceChoice;
use crate::analysis::moments::peaks::PeaksReport;
use crate::render::Style;
use crate::render::words::labels::device_line;
use crate::timeline::Peak;
use crate::units::shown;
use crate::units::{Clock, bytes};
use std::io::{self, Write};

fn peak(p: &Peak, clock: Clock) -> String {
    let at = match (p.event, p.time_us.filter(|&t| t > 0)) {
        (None, _) => "before the first event".to_string(),
        (Some(e), Some(t)) => format!("at event {} ({})", e.index(), clock.time(t)),
        (Some(e), None) => format!("at event {}", e.index()),
    };
    format!("{} {at}", bytes(p.bytes))
}

pub fn write_timeline_text(
    out: &mut dyn Write,
    r: &PeaksReport,
    choice: &DeviceChoice,
    style: Style,
) -> io::Result<()> {
    writeln!(
        out,
        "{}",
        style.heading(&format!("{}: {}", shown(&r.path), device_line(choice)))
    )?;
    let rows = [
        ("events", r.events.to_string()),
        (
            "allocations",
            format!(
                "{} allocated in the trace; allocated before it: {} freed during it, {} still alive at the end",
                r.traced_allocations, r.allocated_before_trace, r.survivors
            ),
        ),
        (
            "requested",
            format!(
                "{} at the start, {} at the end{}",
                bytes(r.initial_requested_bytes),
                bytes(r.final_requested_bytes),
                if r.freed_after_trace > 0 {
                    format!(
                        " ({})",
                        crate::render::words::labels::freed_after_trace_text(
                            r.freed_after_trace as u64,
                            r.freed_after_trace_bytes
                        )
                    )
                } else {
                    String::new()
                }
            ),
        ),
        (
            "reserved",
            format!(
                "{} at the start, {} at the end",
                bytes(r.initial_reserved_bytes.max(0) as u64),
                bytes(r.final_reserved_bytes.max(0) as u64)
            ),
        ),
        ("peak requested", peak(&r.peak_requested, r.clock)),
        ("peak allocated", peak(&r.peak_allocated, r.clock)),
        ("peak reserved", peak(&r.peak_reserved, r.clock)),
    ];
    for (label, value) in rows {
        writeln!(out, "  {label:<16} {value}")?;
    }
    Ok(())
}
