//! Text rendering of an [`OomReport`].

use super::Style;
use crate::analysis::oom::{OomAnalysis, OomReport};
use crate::units::{bytes, utc_time};
use std::io::{self, Write};

fn opt(v: Option<u64>) -> String {
    v.map_or("unknown".into(), bytes)
}

fn write_analysis(out: &mut dyn Write, a: &OomAnalysis, style: Style) -> io::Result<()> {
    let when = match (a.event, a.time_us.filter(|&t| t > 0)) {
        (Some(e), Some(t)) => format!("event {e}, {}", utc_time(t)),
        (Some(e), None) => format!("event {e}"),
        (None, _) => "the start".into(),
    };
    let what = if a.source == "oom_event" {
        "OOM"
    } else {
        "final state"
    };
    writeln!(
        out,
        "{}",
        style.heading(&format!("device {}: {what} at {when}", a.device))
    )?;
    let stream = if a.stream == 0 {
        "default stream".to_string()
    } else {
        format!("stream 0x{:x}", a.stream)
    };
    match a.requested_bytes {
        Some(r) => writeln!(out, "  request            {} on the {stream}", bytes(r))?,
        None => writeln!(
            out,
            "  request            unknown (no oom event; give --log with the OOM message)"
        )?,
    }
    for f in &a.frames {
        writeln!(out, "                     {f}")?;
    }
    writeln!(
        out,
        "  device             free {}, total {}{}",
        opt(a.device_free_bytes),
        opt(a.device_total_bytes),
        a.device_total_source
            .as_deref()
            .map(|s| format!(" (from {s})"))
            .unwrap_or_default()
    )?;
    if let Some(o) = a.outside_allocator_bytes {
        writeln!(
            out,
            "  outside PyTorch    {} (total − free − reserved)",
            bytes(o)
        )?;
    }
    writeln!(out, "  reserved           {}", bytes(a.reserved_bytes))?;
    writeln!(
        out,
        "  live               {} in blocks ({} requested, {} rounding), {} pending free",
        bytes(a.active_bytes),
        bytes(a.allocated_bytes),
        bytes(a.rounding_waste_bytes),
        bytes(a.pending_free_bytes)
    )?;
    writeln!(
        out,
        "  free in segments   {}; largest hole {} ({} on the request's stream)",
        bytes(a.cached_free_bytes),
        bytes(a.largest_hole_bytes),
        bytes(a.largest_hole_same_stream_bytes)
    )?;
    for p in &a.free_by_pool {
        let pool = match p.pool_id {
            None => "pool unknown".to_string(),
            Some((0, 0)) => "default pool".to_string(),
            Some((x, y)) => format!("private pool ({x}, {y})"),
        };
        let stream = if p.stream == 0 {
            "default stream".to_string()
        } else {
            format!("stream 0x{:x}", p.stream)
        };
        writeln!(
            out,
            "    {pool}, {stream}: {} segments, {} reserved, {} free, largest hole {}",
            p.segments,
            bytes(p.reserved_bytes),
            bytes(p.free_bytes),
            bytes(p.largest_hole_bytes)
        )?;
    }
    if !a.top_stacks.is_empty() {
        writeln!(out, "  live by call site")?;
        for s in &a.top_stacks {
            writeln!(
                out,
                "    {:>10}  {:>5}x  {}",
                bytes(s.bytes),
                s.allocations,
                s.frame
            )?;
        }
    }
    if a.verdicts.is_empty() {
        writeln!(
            out,
            "  verdict            none of the known causes stands out"
        )?;
    }
    for v in &a.verdicts {
        writeln!(out, "  {}", style.warn(&format!("verdict: {}", v.summary)))?;
        for e in &v.evidence {
            writeln!(out, "    - {e}")?;
        }
        for k in &v.knobs {
            writeln!(out, "    try: {k}")?;
        }
    }
    Ok(())
}

pub fn write_oom_text(out: &mut dyn Write, r: &OomReport, style: Style) -> io::Result<()> {
    if let Some(p) = &r.path {
        writeln!(out, "{}", style.heading(p))?;
    }
    for n in &r.notes {
        writeln!(out, "  note: {n}")?;
    }
    for a in &r.analyses {
        write_analysis(out, a, style)?;
    }
    for m in &r.messages {
        writeln!(
            out,
            "{}",
            style.heading(
                &format!("OOM message on log line {} ({:?} form)", m.line, m.form).to_lowercase()
            )
        )?;
        writeln!(
            out,
            "  request {} on GPU {}: total {}, free {}, allocated by PyTorch {}, reserved by PyTorch {}",
            opt(m.requested_bytes),
            m.gpu.map_or("?".into(), |g| g.to_string()),
            opt(m.total_capacity_bytes),
            opt(m.free_bytes),
            opt(m.allocated_by_pytorch_bytes),
            opt(m.reserved_by_pytorch_bytes)
        )?;
        if let (Some(p), Some(r)) = (m.this_process_bytes, m.reserved_by_pytorch_bytes) {
            writeln!(
                out,
                "  this process uses {} of which {} outside PyTorch's allocator",
                bytes(p),
                bytes(p.saturating_sub(r))
            )?;
        }
        for (pid, b) in &m.processes {
            writeln!(
                out,
                "  process {}: {}",
                pid.map_or("?".into(), |p| p.to_string()),
                bytes(*b)
            )?;
        }
        for v in &crate::analysis::oom::message_verdicts(m) {
            writeln!(out, "  {}", style.warn(&format!("verdict: {v}")))?;
        }
    }
    Ok(())
}
