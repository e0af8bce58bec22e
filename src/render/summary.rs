//! Text rendering of [`Summary`]: aligned label/value rows, binary units.

use crate::analysis::reports::summary::{DeviceSummary, Summary, TraceSummary, TruncationEvidence};
use crate::render::Style;
use crate::units::shown;
use crate::units::{Clock, bytes, duration_us, percent};
use std::io::{self, Write};

/// One `label   value` row of a summary (`summary` of a snapshot and of a device log).
pub(crate) fn row(out: &mut dyn Write, label: &str, value: impl AsRef<str>) -> io::Result<()> {
    writeln!(out, "  {label:<20} {}", value.as_ref())
}

fn pool_name(p: Option<(i64, i64)>) -> String {
    match p {
        None => "unknown".into(),
        Some((0, 0)) => "default".into(),
        Some((a, b)) => format!("private ({a}, {b})"),
    }
}

fn stream_name(s: u64) -> String {
    if s == 0 {
        "default".into()
    } else {
        format!("0x{s:x}")
    }
}

fn truncation_text(e: &TruncationEvidence) -> String {
    match e {
        TruncationEvidence::OrphanFrees(n) => format!(
            "{n} free(s) of allocations not in the trace (allocated before recording started, or dropped from the ring buffer)"
        ),
        TruncationEvidence::OrphanSegmentFrees(n) => {
            format!("{n} segment_free(s) of segments not in the trace")
        }
        TruncationEvidence::RoundLength(n) => format!(
            "the trace holds exactly {n} entries, a typical max_entries: the ring buffer is probably full"
        ),
    }
}

pub use crate::analysis::HOW_TO_RECORD;

/// What to do for a fuller history of a profiler trace: it records from the moment the
/// profiler starts, not from `_record_memory_history`.
const HOW_TO_PROFILE: &str = "start the profiler (torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)) before the work it should see, or record a snapshot with torch.cuda.memory._record_memory_history()";

fn write_trace(
    clock: Clock,
    out: &mut dyn Write,
    t: &TraceSummary,
    converted: bool,
    style: Style,
) -> io::Result<()> {
    let how = if converted {
        HOW_TO_PROFILE
    } else {
        HOW_TO_RECORD
    };
    if t.events == 0 {
        row(
            out,
            "trace",
            "none recorded: only the final state is known (no timeline, no peaks)",
        )?;
        return row(out, "", how);
    }
    if !t.has_timeline {
        // Counted honestly, but read as a file without a trace: nothing over time.
        let actions: Vec<String> = match t.actions.iter().next() {
            Some((a, _)) if t.events == 1 => vec![a.clone()],
            _ => t
                .actions
                .iter()
                .map(|(a, n)| format!("{} {n}", shown(a)))
                .collect(),
        };
        row(
            out,
            "trace",
            format!(
                "{} event{} ({}), too few to show memory over time: only the final state is known (no timeline, no peaks)",
                t.events,
                if t.events == 1 { "" } else { "s" },
                actions.join(", ")
            ),
        )?;
        return row(out, "", how);
    }
    let span = match (t.first_time_us, t.last_time_us) {
        (Some(a), Some(b)) if b >= a && matches!(clock, Clock::Relative { .. }) => format!(
            ", over {} (the file's times have no base time: they are shown as offsets from the first event, not as dates)",
            duration_us(b.saturating_sub(a))
        ),
        (Some(a), Some(b)) if b >= a => {
            format!(
                ", {} .. +{}",
                clock.time(a),
                duration_us(b.saturating_sub(a))
            )
        }
        (Some(a), Some(b)) => format!(
            ", {} .. {} (the times go backwards: the last event is stamped {} before the first)",
            clock.time(a),
            clock.time(b),
            duration_us(a.saturating_sub(b))
        ),
        _ => ", no timestamps (PyTorch before 2.2)".into(),
    };
    row(out, "trace", format!("{} events{span}", t.events))?;
    let actions: Vec<String> = t
        .actions
        .iter()
        .map(|(a, n)| format!("{} {n}", shown(a)))
        .collect();
    for chunk in actions.chunks(4) {
        row(out, "", chunk.join(", "))?;
    }
    if t.looks_truncated {
        row(
            out,
            "history",
            style.warn("incomplete: the trace does not start at the beginning"),
        )?;
        for e in &t.truncation_evidence {
            row(out, "", format!("- {}", truncation_text(e)))?;
        }
        if converted {
            row(out, "", how)?;
        }
    } else if t.frees_paired_by_size {
        row(
            out,
            "history",
            "complete in its totals; the trace has no addresses, so each free was paired with an allocation of its size (which block ended is a guess)",
        )?;
    } else if t.alive_before_recording > 0 {
        row(
            out,
            "history",
            format!(
                "began mid-run: {} in {} were alive before the first event (their allocations are not in the trace); every free pairs with an allocation in the trace or one of those",
                bytes(t.alive_before_recording_bytes),
                crate::units::count(t.alive_before_recording as usize, "block", "blocks")
            ),
        )?;
    } else if t.freed_after_trace == 0 {
        row(
            out,
            "history",
            "complete (every free pairs with an allocation in the trace)",
        )?;
    }
    if t.freed_after_trace > 0 {
        let first = !t.looks_truncated && !t.frees_paired_by_size && t.alive_before_recording == 0;
        row(
            out,
            if first { "history" } else { "" },
            style.warn(&crate::render::words::labels::freed_after_trace_text(
                t.freed_after_trace,
                t.freed_after_trace_bytes,
            )),
        )?;
    }
    Ok(())
}

fn write_device(
    out: &mut dyn Write,
    d: &DeviceSummary,
    converted: bool,
    clock: Clock,
    style: Style,
) -> io::Result<()> {
    writeln!(out, "{}", style.heading(&format!("device {}", d.device)))?;
    if converted {
        // A profiler trace has no segments or blocks: only its totals and peaks, and
        // reserved memory only when it records it.
        if d.reserved_recorded {
            row(out, "reserved at the end", bytes(d.reserved_bytes))?;
        } else {
            row(
                out,
                "reserved",
                "not recorded (the trace has no Total Reserved)",
            )?;
        }
        write_peaks(out, d, clock)?;
        return write_trace(clock, out, &d.trace, true, style);
    }
    row(
        out,
        "segments",
        format!(
            "{} ({} large, {} small, {} expandable)",
            d.segments, d.segments_large, d.segments_small, d.segments_expandable
        ),
    )?;
    if d.pools.len() > 1 || d.pools.iter().any(|p| p.pool_id != Some((0, 0))) {
        let pools: Vec<String> = d
            .pools
            .iter()
            .map(|p| {
                format!(
                    "{}: {} ({})",
                    pool_name(p.pool_id),
                    p.segments,
                    bytes(p.reserved_bytes)
                )
            })
            .collect();
        row(out, "pools", pools.join(", "))?;
    }
    if !d.streams.is_empty() {
        let streams: Vec<String> = d
            .streams
            .iter()
            .map(|s| {
                format!(
                    "{}: {} ({})",
                    stream_name(s.stream),
                    s.segments,
                    bytes(s.reserved_bytes)
                )
            })
            .collect();
        row(out, "streams", streams.join(", "))?;
    }
    let states: Vec<String> = d
        .blocks_by_state
        .iter()
        .map(|(s, n)| format!("{n} {s}"))
        .collect();
    row(
        out,
        "blocks",
        if states.is_empty() {
            "0".to_string()
        } else {
            format!("{} ({})", d.blocks, states.join(", "))
        },
    )?;
    row(out, "reserved", bytes(d.reserved_bytes))?;
    row(
        out,
        "allocated",
        format!(
            "{}  ({} of reserved; block bytes, as torch.cuda.memory_allocated())",
            bytes(d.allocated_bytes),
            percent(d.allocated_bytes, d.reserved_bytes)
        ),
    )?;
    row(
        out,
        "requested",
        format!(
            "{}  (what the tensors asked for, before rounding)",
            bytes(d.requested_bytes)
        ),
    )?;
    row(out, "active", bytes(d.active_bytes))?;
    if d.pending_free_bytes > 0 {
        row(
            out,
            "pending free",
            format!(
                "{} (freed, waiting on other streams)",
                bytes(d.pending_free_bytes)
            ),
        )?;
    }
    row(
        out,
        "free in segments",
        format!(
            "{} = {} free blocks + {} rounding waste",
            bytes(d.free_in_segments_bytes),
            bytes(d.free_block_bytes),
            bytes(d.rounding_waste_bytes)
        ),
    )?;
    row(out, "largest free block", bytes(d.largest_free_block_bytes))?;
    write_peaks(out, d, clock)?;
    write_trace(clock, out, &d.trace, false, style)?;
    for o in &d.ooms {
        let when = o
            .time_us
            .filter(|&t| t > 0)
            .map(|t| format!(" at {}", clock.time(t)))
            .unwrap_or_default();
        row(
            out,
            "OOM",
            style.warn(&format!(
                "event {}: requested {}, device had {} free{when}",
                o.index,
                bytes(o.size),
                o.device_free.map_or("an unknown amount".into(), bytes)
            )),
        )?;
    }
    Ok(())
}

fn write_peaks(out: &mut dyn Write, d: &DeviceSummary, clock: Clock) -> io::Result<()> {
    let at = |event: Option<u32>, time: Option<i64>| match (event, time) {
        (None, _) => " (before the first event)".to_string(),
        (Some(e), Some(t)) if t > 0 => format!(" at event {e}, {}", clock.time(t)),
        (Some(e), _) => format!(" at event {e}"),
    };
    if let Some(b) = d.peak_requested_bytes {
        row(
            out,
            "peak requested",
            format!(
                "{}{}  (the official viewer's timeline maximum)",
                bytes(b),
                at(d.peak_requested_event, d.peak_requested_time_us)
            ),
        )?;
    }
    if let Some(b) = d.peak_allocated_bytes {
        row(
            out,
            "peak allocated",
            format!(
                "{}{}  (block bytes)",
                bytes(b),
                at(d.peak_allocated_event, d.peak_allocated_time_us)
            ),
        )?;
    }
    if let Some(b) = d.peak_reserved_bytes {
        row(
            out,
            "peak reserved",
            format!(
                "{}{}",
                bytes(b),
                at(d.peak_reserved_event, d.peak_reserved_time_us)
            ),
        )?;
    }
    Ok(())
}

/// Writes the summary of one file for people.
pub fn write_summary_text(out: &mut dyn Write, s: &Summary, style: Style) -> io::Result<()> {
    let src = &s.source;
    use crate::input::SourceFormat;
    let format = match (src.format, src.pickle_protocol) {
        (SourceFormat::Pickle, Some(p)) => format!("pickle protocol {p}"),
        (SourceFormat::Html, Some(p)) => format!("memory_viz HTML page, pickle protocol {p}"),
        (SourceFormat::KinetoTrace, _) => {
            "profiler trace: its [memory] events replayed".to_string()
        }
        (SourceFormat::MemoryTimeline, _) => {
            "export_memory_timeline file, by PyTorch's categories".to_string()
        }
        (f, _) => f.name().to_string(),
    };
    let release = if s.converted {
        "no snapshot layout".to_string()
    } else {
        format!(
            "{} layout",
            crate::render::words::labels::layout_releases(&s.layout)
        )
    };
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "{}  ({}, {}{}, {release})",
            shown(&src.path),
            bytes(src.size_bytes),
            if src.gzip { "gzip, " } else { "" },
            format
        ))
    )?;
    if s.devices.is_empty() {
        writeln!(out, "  no device has a segment or a trace entry")?;
    }
    for d in &s.devices {
        write_device(out, d, s.converted, s.clock, style)?;
    }
    if let Some(h) = &s.host {
        writeln!(out, "{}", style.heading("pinned host memory"))?;
        row(out, "segments", h.segments.to_string())?;
        row(out, "reserved", bytes(h.reserved_bytes))?;
        row(out, "allocated", bytes(h.allocated_bytes))?;
        write_trace(s.clock, out, &h.trace, false, style)?;
    }
    writeln!(out, "{}", style.heading("allocator"))?;
    if s.converted {
        row(out, "settings", "not in a profiler trace")?;
    } else if s.allocator_settings.is_none() {
        row(out, "settings", "not recorded (PyTorch before 2.3)")?;
    } else {
        let st = &s.settings;
        row(
            out,
            "expandable_segments",
            st.expandable_segments
                .map_or("?".into(), |b| if b { "True" } else { "False" }.to_string()),
        )?;
        row(
            out,
            "max_split_size",
            st.max_split_size_bytes.map_or("unlimited".into(), bytes),
        )?;
        row(
            out,
            "gc threshold",
            match st.garbage_collection_threshold {
                Some(t) if t > 0.0 => format!("{t:.2}"),
                _ => "off".into(),
            },
        )?;
        if let Some(conf) = st.alloc_conf.as_deref().filter(|c| !c.is_empty()) {
            row(out, "ALLOC_CONF", shown(conf))?;
        }
    }
    writeln!(out, "{}", style.heading("recording"))?;
    row(
        out,
        "stacks",
        format!(
            "{} of {}",
            crate::units::count(s.distinct_stacks, "distinct stack", "distinct stacks"),
            crate::units::count(s.distinct_frames, "distinct frame", "distinct frames")
        ),
    )?;
    row(
        out,
        "annotations",
        format!("{} external annotations", s.external_annotations),
    )?;
    if !s.layout.evidence.is_empty() {
        let words: Vec<&str> = s
            .layout
            .evidence
            .iter()
            .map(|&e| crate::render::words::labels::layout_evidence_text(e))
            .collect();
        row(out, "layout evidence", words.join(", "))?;
    }
    if !s.warnings.is_empty() {
        writeln!(out, "{}", style.heading("warnings"))?;
        for (message, count) in crate::render::words::warnings::warning_lines(&s.warnings) {
            let times = if count > 1 {
                format!(" ({count} times)")
            } else {
                String::new()
            };
            writeln!(out, "  {}{times}", style.warn(&shown(&message)))?;
        }
    }
    Ok(())
}
