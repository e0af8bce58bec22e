//! `reconcile` for people: the ledgers, the trace findings and the errors, in words. The
//! JSON form is the analysis structs themselves (`render::write_json`).

use crate::analysis::device::reconcile::{
    Alignment, DeviceReconciliation, EvidenceSource, GpuReason, Ledger, Moment, Note, PeakSource,
    ReconcileError, Reconciliation, Split, Suspect, SuspectKind, TimeCheck, TraceFindings,
    TraceUse,
};
use crate::devlog::convert::DeviceSource;
use crate::devlog::{GpuNumbering, ProfileKind, TraceClock};
use crate::render::Style;
use crate::render::device::align::range_text;
use crate::units::shown;
use crate::units::{bytes, bytes_signed, duration_us, utc_time};
use std::io::{self, Write};

fn moment_name(m: Moment) -> &'static str {
    match m {
        Moment::Peak => "peak",
        Moment::Oom => "oom",
        Moment::End => "end",
    }
}

fn list(values: &[i64]) -> String {
    values
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why the gap was not split, and what would split it.
fn split_reason(s: Split) -> &'static str {
    match s {
        Split::Measured | Split::NoReading => "",
        Split::NoProcessReadings => {
            "not split: the log has no per-process readings; add an nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,used_memory log, or NVML samples"
        }
        Split::NoProcessRowNearReading => {
            "not split: no per-process reading of this GPU at the time of the device reading"
        }
    }
}

fn suspect_name(k: SuspectKind) -> &'static str {
    match k {
        SuspectKind::Nccl => "NCCL communicator buffers (allocated by NCCL itself)",
        SuspectKind::Triton => "Triton kernels loaded into device memory",
        SuspectKind::TensorRt => "TensorRT engines",
        SuspectKind::CuPy => "CuPy's own memory pool",
        SuspectKind::Jax => "JAX/XLA's preallocated memory",
    }
}

fn suspect_line(s: &Suspect) -> String {
    let evidence: Vec<String> = s
        .evidence
        .iter()
        .map(|e| match e.source {
            EvidenceSource::Annotation => format!(
                "annotation \"{}\" ({} record{})",
                e.text,
                e.count,
                if e.count == 1 { "" } else { "s" }
            ),
            EvidenceSource::Frame => format!(
                "frame {} (in {} stack{})",
                e.text,
                e.count,
                if e.count == 1 { "" } else { "s" }
            ),
        })
        .collect();
    format!("{}: {}", suspect_name(s.kind), evidence.join("; "))
}

fn ledger_lines(l: &Ledger) -> Vec<String> {
    let pytorch = if l.reading_reserved_bytes != l.reserved_bytes {
        let (then, now) = crate::render::words::labels::distinct_sizes(
            l.reading_reserved_bytes,
            l.reserved_bytes,
        );
        format!(
            "PyTorch reserved {then} when the reading was taken ({now} at the moment; the figures below compare the reading with the allocator at its own time) (requested {})",
            bytes(l.requested_bytes)
        )
    } else {
        format!(
            "PyTorch reserved {} (requested {})",
            bytes(l.reserved_bytes),
            bytes(l.requested_bytes)
        )
    };
    let mut lines = Vec::new();
    match (l.device_used_bytes, l.gap_bytes) {
        (Some(used), Some(gap)) => {
            let total = l
                .device_total_bytes
                .map(|t| format!(" of {}", bytes(t)))
                .unwrap_or_default();
            lines.push(format!("device used {}{total} | {pytorch}", bytes(used)));
            if l.split == Split::Measured {
                lines.push(format!(
                    "outside the allocator {} | other processes and driver {}",
                    l.outside_allocator_bytes
                        .map_or("unknown".to_string(), bytes_signed),
                    l.other_processes_bytes
                        .map_or("unknown".to_string(), bytes_signed),
                ));
            } else {
                lines.push(format!(
                    "outside the allocator or other processes {} ({})",
                    bytes_signed(gap),
                    split_reason(l.split)
                ));
            }
        }
        _ => lines.push(format!("{pytorch} | no device reading within 5 s")),
    }
    if let Some((lo, hi)) = l.device_used_range_bytes {
        lines.push(format!(
            "within 0.5 s: device used {} to {}",
            bytes(lo),
            bytes(hi)
        ));
    }
    if let (Some((a, b)), Some((c, d))) = (
        l.outside_allocator_range_bytes,
        l.other_processes_range_bytes,
    ) {
        lines.push(format!(
            "within 0.5 s: outside the allocator {} to {}, other processes and driver {} to {}",
            bytes_signed(a),
            bytes_signed(b),
            bytes_signed(c),
            bytes_signed(d)
        ));
    }
    if let Some(a) = l.trace_allocated_bytes {
        lines.push(format!(
            "profiler trace at the same moment: allocated {} (block bytes, where the line above counts requested bytes), reserved {}",
            bytes(a),
            l.trace_reserved_bytes.map_or("unknown".into(), bytes)
        ));
    }
    lines
}

fn gpu_line(d: &DeviceReconciliation, numbering: GpuNumbering) -> Option<String> {
    let g = d.gpu?;
    Some(match (g.reason, numbering) {
        (GpuReason::Asked, _) => {
            format!("readings of GPU {} of the log (chosen with --gpu)", g.gpu)
        }
        (GpuReason::SameNumber, _) => format!("readings of GPU {} of the log", g.gpu),
        (GpuReason::OnlyGpu, GpuNumbering::DriverIndex) => format!(
            "readings of GPU {}, the log's only GPU (the snapshot numbers it {})",
            g.gpu, d.device
        ),
        (GpuReason::OnlyGpu, _) => {
            "readings of the log's only GPU (the log names no GPU index)".to_string()
        }
    })
}

fn times_line(t: &TimeCheck) -> Option<String> {
    let (Some(trace), Some(log)) = (t.trace_range, t.log_range) else {
        return None;
    };
    Some(format!(
        "times: snapshot {}, readings {}{}",
        range_text(trace),
        range_text(log),
        if t.overlap { "" } else { " (no overlap)" }
    ))
}

fn note_text(n: &Note) -> String {
    match n {
        Note::NoTimes => {
            "the trace has no time_us (PyTorch before 2.2): nothing can be matched in time".into()
        }
        Note::NoTrace => {
            "this device has no trace entries: only its final state is known, and it has no time"
                .into()
        }
        Note::NoReadingNearMoments { max_skew_us } => format!(
            "no device reading within {} of the trace's moments",
            duration_us(*max_skew_us)
        ),
        Note::NoUsedValues { gpu } => {
            format!("the log's readings of GPU {gpu} have no memory.used value")
        }
        Note::ReadingsAfterOomLeftOut { readings } => format!(
            "{} after the OOM (the trace's last event) not used: they show the process failing or freeing its memory, not a moment of the trace",
            crate::units::count(*readings, "reading", "readings")
        ),
        Note::ReadingsFolded { rows_folded } => format!(
            "the log is long: {rows_folded} of its rows were folded into a bounded series (per time bucket the first, last, lowest and highest reading are kept), so readings between those are not used"
        ),
    }
}

/// Where a moment's reading was taken, against the moment: "the reading 59.9 ms before".
pub fn reading_offset(skew_us: i64) -> String {
    match offset_words(skew_us) {
        None => "the reading at the same moment (within 1 ms)".into(),
        Some(when) => format!("the reading {when}"),
    }
}

/// A reading's offset from its moment as "7.5 ms before" / "2.10 s after"; None within
/// 1 ms (the same moment for a reader).
pub fn offset_words(skew_us: i64) -> Option<String> {
    (skew_us.unsigned_abs() >= 1000).then(|| {
        let when = if skew_us < 0 { "before" } else { "after" };
        format!("{} {when}", duration_us(skew_us.abs()))
    })
}

/// The GPU's use before the job's process appeared, and what it is.
fn idle_line(d: &DeviceReconciliation, source: &str) -> Option<String> {
    let idle = d.idle_use?;
    // Less than a MiB before the job: nothing held that the ledger's figures carry.
    if idle.used_bytes < 1 << 20 {
        return None;
    }
    let what = if source == "nvml" {
        ": memory the driver keeps for itself (NVML's used figure counts it; nvidia-smi's memory.used leaves it out), so \"other processes and driver\" holds it"
    } else {
        ": the driver's and other processes' memory, part of \"other processes and driver\""
    };
    Some(format!(
        "before this job's process appeared the GPU had {} in use (the lowest of {}){what}",
        bytes(idle.used_bytes),
        crate::units::count(idle.readings, "reading", "readings")
    ))
}

/// Writes the reconciliation for people.
pub fn write_reconcile_text(
    out: &mut dyn Write,
    r: &Reconciliation,
    style: Style,
) -> io::Result<()> {
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "{} against {} readings",
            shown(&r.path),
            shown(r.device_log_source)
        ))
    )?;
    for d in &r.devices {
        writeln!(out, "{}", style.heading(&format!("device {}", d.device)))?;
        if let Some(g) = gpu_line(d, r.gpu_numbering) {
            writeln!(out, "  {g}")?;
        }
        if let Some(t) = times_line(&d.times) {
            writeln!(out, "  {t}")?;
        }
        if !d.times.overlap && d.times.log_range.is_some() && d.times.trace_range.is_some() {
            writeln!(
                out,
                "  {}",
                style.warn(&format!("note: {}", no_overlap_advice(&d.times)))
            )?;
        }
        for n in &d.notes {
            writeln!(out, "  note: {}", note_text(n))?;
        }
        // Moments on the same event (an OOM that ends the trace) share one ledger.
        let mut k = 0;
        while k < d.ledgers.len() {
            let l = &d.ledgers[k];
            let same = d.ledgers[k..]
                .iter()
                .take_while(|o| o.event == l.event)
                .count();
            let names: Vec<&str> = d.ledgers[k..k + same]
                .iter()
                .map(|o| moment_name(o.moment))
                .collect();
            let skew = l
                .sample_skew_us
                .map(|s| format!(", {}", reading_offset(s)))
                .unwrap_or_else(|| ", no reading near it".into());
            writeln!(
                out,
                "  {:<5} event {} at {}{skew}",
                names.join(" = "),
                l.event.unwrap_or(0),
                utc_time(l.time_us)
            )?;
            for line in ledger_lines(l) {
                writeln!(out, "        {line}")?;
            }
            k += same;
        }
        if let Some(line) = idle_line(d, r.device_log_source) {
            writeln!(out, "  {line}")?;
        }
        if let (Some(lo), Some(hi)) = (d.gap_min_bytes, d.gap_max_bytes) {
            writeln!(
                out,
                "  over {} readings, device used − PyTorch reserved ranged from {} to {}",
                d.over_time.len(),
                bytes_signed(lo),
                bytes_signed(hi)
            )?;
        }
        if d.ledgers.iter().any(|l| l.gap_bytes.is_some()) {
            writeln!(
                out,
                "  the gap holds the CUDA context (typically 300 MB to 1 GB per process) and anything allocated outside the caching allocator; PyTorch's own cuBLAS and cuDNN workspaces are inside the allocator, so they are not part of it"
            )?;
        }
        if !d.suspects.is_empty() {
            writeln!(
                out,
                "  in this snapshot, evidence of other users of GPU memory outside the allocator:"
            )?;
            for s in &d.suspects {
                writeln!(out, "    {}", suspect_line(s))?;
            }
        }
    }
    if let Some(t) = &r.trace {
        write_trace(out, t, style)?;
    }
    Ok(())
}

fn kind_text(k: ProfileKind) -> &'static str {
    match k {
        ProfileKind::KinetoTrace => "Kineto trace",
        ProfileKind::MemoryTimelineRaw => "export_memory_timeline raw rows",
        ProfileKind::MemoryTimelineCategories => "export_memory_timeline bytes per category",
    }
}

fn clock_text(t: &TraceFindings) -> String {
    match t.clock {
        TraceClock::Unix => "absolute Unix times".into(),
        TraceClock::RelativeToBase => format!(
            "times relative to baseTimeNanoseconds {}",
            t.base_time_ns.unwrap_or(0)
        ),
        TraceClock::Unknown => "relative times without a base time".into(),
    }
}

fn alignment_text(a: &Alignment) -> String {
    let offset = if a.metadata_offset_us != 0 {
        format!(
            "its times count from baseTimeNanoseconds ({})",
            utc_time(a.metadata_offset_us)
        )
    } else {
        "its times are absolute".to_string()
    };
    if a.trace_allocations == 0 {
        return format!(
            "lined up with snapshot device {} by its clock: {offset}; no addresses to confirm it by",
            a.snapshot_device
        );
    }
    let residual = a
        .residual_us
        .map(|r| {
            format!(
                ", the profiler's clock {} {} the allocator's",
                duration_us(r.abs()),
                if r >= 0 { "ahead of" } else { "behind" }
            )
        })
        .unwrap_or_default();
    format!(
        "lined up with snapshot device {}: {offset}{residual}; {} of its {} allocations in the snapshot's time span match one of the snapshot's (same address and size at nearly the same time)",
        a.snapshot_device, a.matched, a.trace_allocations
    )
}

fn write_trace(out: &mut dyn Write, t: &TraceFindings, style: Style) -> io::Result<()> {
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "profiler trace {} ({}, {})",
            shown(&t.path),
            kind_text(t.kind),
            clock_text(t)
        ))
    )?;
    if let Some(r) = t.range {
        writeln!(out, "  memory events from {}", range_text(r))?;
    }
    for d in &t.devices {
        let who = match d.source {
            DeviceSource::Cuda(i) => format!("CUDA device {i}"),
            DeviceSource::Cpu => "CPU".to_string(),
            DeviceSource::Unnamed => "the device (the file names none)".to_string(),
        };
        let peak_at = d
            .peak_time_us
            .map(|t| format!(" at {}", utc_time(t)))
            .unwrap_or_default();
        let source = match d.peak_source {
            PeakSource::TotalAllocated => "its Total Allocated".to_string(),
            PeakSource::RunningSum => {
                "the running sum of Bytes: the trace has no Total Allocated, so memory allocated before profiling is not counted".to_string()
            }
        };
        writeln!(
            out,
            "  {who}: {} memory events, peak allocated {}{peak_at} ({source}), peak reserved {}",
            d.events,
            bytes(d.peak_allocated_bytes),
            d.peak_reserved_bytes
                .map_or("unknown (no Total Reserved)".into(), bytes)
        )?;
        if d.before_profiling_bytes > 0 {
            writeln!(
                out,
                "    {} was allocated before profiling started (first event's Total Allocated minus its Bytes)",
                bytes(d.before_profiling_bytes)
            )?;
        }
        if let Some(a) = &d.alignment {
            writeln!(out, "    {}", alignment_text(a))?;
        }
    }
    let verdict = match t.used {
        TraceUse::Used if t.devices.iter().any(|d| d.alignment.is_some()) => {
            "used: its allocated and reserved bytes at each moment are in the ledgers above".to_string()
        }
        TraceUse::Used => "not used: no device of the trace matches a device of the snapshot".to_string(),
        TraceUse::NoMemoryEvents => {
            "not used: it has no [memory] events (record with torch.profiler.profile(profile_memory=True))".to_string()
        }
        TraceUse::OnlyCpuEvents => format!(
            "not used: its {} memory events are all the CPU allocator's, nothing to set beside GPU memory",
            t.cpu_events
        ),
        TraceUse::ClockUnknown => {
            "not used: its times are relative and it has no baseTimeNanoseconds, so it cannot be placed beside the snapshot".to_string()
        }
        TraceUse::NoOverlap => {
            "not used: its times do not overlap the snapshot's (another run)".to_string()
        }
        TraceUse::NoMatches => {
            "not used: none of its allocations matches the snapshot's (another process or run)".to_string()
        }
        TraceUse::SnapshotWithoutTimes => {
            "not used: the snapshot has no times (PyTorch before 2.2) to line it up with".to_string()
        }
    };
    writeln!(out, "  {verdict}")
}

/// What to do about a log whose readings do not overlap the snapshot's trace.
fn no_overlap_advice(t: &TimeCheck) -> String {
    let shifts = &t.whole_hour_shifts;
    if !t.zoneless_times {
        return "the log's timestamps carry their time zone, so this is not a time-zone slip: the log may be from another run".into();
    }
    match shifts.as_slice() {
        [] => "no time-zone shift makes them overlap: the log may be from another run".into(),
        [h] => {
            let minutes = t.utc_offset_minutes as i64 + h * 60;
            let zone = -minutes;
            format!(
                "nvidia-smi prints local time without a zone; the readings would overlap {} hour{} {}: if nvidia-smi ran at UTC{}{}, read the log with --utc-offset {minutes}",
                h.abs(),
                if h.abs() == 1 { "" } else { "s" },
                if *h < 0 { "earlier" } else { "later" },
                if zone >= 0 { "+" } else { "-" },
                zone_text(zone.abs()),
            )
        }
        many => format!(
            "nvidia-smi prints local time without a zone; shifting the readings by {} hours would make them overlap: read the log with --utc-offset MINUTES for the zone nvidia-smi ran in",
            list(many)
        ),
    }
}

fn zone_text(minutes: i64) -> String {
    if minutes % 60 == 0 {
        format!("{}", minutes / 60)
    } else {
        format!("{}:{:02}", minutes / 60, minutes % 60)
    }
}

fn numbering_help(n: GpuNumbering) -> &'static str {
    match n {
        GpuNumbering::DriverIndex => "N is nvidia-smi's index",
        GpuNumbering::UuidOrder => {
            "the log names no GPU index, so N is the GPU's place in the log by first appearance of its uuid, from 0"
        }
        GpuNumbering::RowOrder => {
            "the log names no GPU index or uuid, so N is the GPU's place among the rows of each reading, from 0"
        }
    }
}

/// The one-line error for a reconciliation that cannot go on.
pub fn error_text(e: &ReconcileError, log_paths: &str, trace_path: Option<&str>) -> String {
    let trace = trace_path.unwrap_or("the profiler trace");
    match e {
        ReconcileError::NoSuchGpu { asked, available } => format!(
            "--gpu {asked}: {log_paths} has no readings of GPU {asked}; its GPUs: {}",
            list(available)
        ),
        ReconcileError::WhichGpu {
            device,
            available,
            numbering,
        } => format!(
            "{log_paths} has readings of GPUs {} and none numbered {device} as the snapshot's device: choose one with --gpu N ({})",
            list(available),
            numbering_help(*numbering)
        ),
        ReconcileError::GpuNeedsDevice { devices } => format!(
            "--gpu picks one GPU of the log: choose the snapshot's device too with --device N (devices: {})",
            list(devices)
        ),
        ReconcileError::LogNoOverlap { device, times } => {
            let (Some(trace_range), Some(log_range)) = (times.trace_range, times.log_range) else {
                return format!("{log_paths}: its readings do not overlap the snapshot's trace");
            };
            format!(
                "{log_paths}: its readings span {}, the snapshot's trace (device {device}) spans {}: they do not overlap; {}; --allow-no-overlap goes on without readings",
                range_text(log_range),
                range_text(trace_range),
                no_overlap_advice(times)
            )
        }
        ReconcileError::TraceNotLinedUp { device, error } => format!(
            "{}; --allow-no-overlap shows it without using it",
            crate::render::device::align::line_up_error_text(error, trace, "the snapshot", *device)
        ),
    }
}
