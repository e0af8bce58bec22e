//! Text rendering of a [`LiveSet`].

use super::Style;
use crate::analysis::live::LiveSet;
use crate::timeline::Origin;
use crate::units::{bytes, utc_time};
use std::io::{self, Write};

pub fn write_live_text(out: &mut dyn Write, live: &LiveSet, style: Style) -> io::Result<()> {
    let when = match (live.event, live.time_us.filter(|&t| t > 0)) {
        (None, _) => "before the first event".to_string(),
        (Some(e), Some(t)) => format!("after event {e} ({})", utc_time(t)),
        (Some(e), None) => format!("after event {e}"),
    };
    writeln!(
        out,
        "{}",
        style.heading(&format!("{}: device {}, {when}", live.path, live.device))
    )?;
    writeln!(
        out,
        "  allocated {}  reserved {}  {} live allocations",
        bytes(live.allocated_bytes),
        bytes(live.reserved_bytes.max(0) as u64),
        live.count
    )?;
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
        for f in &a.frames {
            writeln!(out, "              {f}")?;
        }
    }
    Ok(())
}
