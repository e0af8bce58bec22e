//! Reconciliation: PyTorch's allocator numbers against device-level readings (nvidia-smi or
//! NVML), at the moments that matter (peak, OOMs, end) and over time, with the gap split
//! into memory outside the caching allocator in this process and other processes when
//! per-process readings allow it; and against a profiler trace of the same run, aligned by
//! its clock and confirmed by matching allocations.
//!
//! Takes a [`Snapshot`], replayed once per device for the totals at the moments and at
//! the readings' events only ([`TotalsAtEvents`]; event times come from the model's trace),
//! a [`DeviceLog`] and optionally a converted profiler trace; gives a [`Reconciliation`] of
//! numbers and kinds. Every word is in `render::device::reconcile`. A log or trace whose times do
//! not overlap the snapshot's is a [`ReconcileError`] unless the caller allows it.

pub use crate::analysis::device::align::Alignment;
use crate::analysis::device::align::{LineUpError, Times, line_up, unusable};
use crate::devlog::clock::whole_hour_shifts;
use crate::devlog::convert::{Converted, DeviceSource};
use crate::devlog::{
    DeviceLog, GpuNumbering, GpuSample, ProcessSample, ProfileKind, TimeRange, TraceClock,
};
use crate::model::{Action, DeviceTrace, Snapshot, StackId};
use crate::timeline::{self, TotalsAtEvents};
use serde::Serialize;
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: u32 = 5;

/// Readings farther than this from a moment are not used for it.
pub const MAX_SKEW_US: i64 = 5_000_000;
/// Readings this close to a moment give the range of device use around it.
pub const RANGE_US: i64 = 500_000;
/// Device-log rows farther than this outside the snapshot's trace are not kept.
pub const LOG_MARGIN_US: i64 = 60_000_000;

/// What to reconcile.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReconcileOptions {
    /// Only this device of the snapshot.
    pub device: Option<i64>,
    /// The log's GPU to read (its index, or its order in a log without index).
    pub gpu: Option<i64>,
    /// Go on when a log's or trace's times do not overlap the snapshot's.
    pub allow_no_overlap: bool,
}

/// One of the moments a ledger is drawn up at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Moment {
    /// The peak of requested memory (the official viewer's count).
    Peak,
    /// An `oom` trace entry.
    Oom,
    /// The last event of the trace.
    End,
}

/// Whether the gap could be split into this process's memory outside the allocator and
/// other processes', and why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Per-process readings taken with the device reading split it.
    Measured,
    /// No device reading near the moment.
    NoReading,
    /// The log has no per-process rows at all (a `--query-gpu` CSV alone).
    NoProcessReadings,
    /// The log has per-process rows, but none of this GPU near this reading.
    NoProcessRowNearReading,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Ledger {
    pub moment: Moment,
    pub event: Option<u32>,
    pub time_us: i64,
    /// Distance from the moment to the device reading used.
    pub sample_skew_us: Option<i64>,
    pub device_total_bytes: Option<u64>,
    pub device_used_bytes: Option<u64>,
    /// Lowest and highest device use among readings within 0.5 s of the moment.
    pub device_used_range_bytes: Option<(u64, u64)>,
    /// This process's use, when per-process rows exist (the process whose use is closest
    /// to PyTorch's reserved memory).
    pub process_pid: Option<u64>,
    pub process_used_bytes: Option<u64>,
    /// Reserved bytes at the moment.
    pub reserved_bytes: u64,
    /// Reserved bytes when the reading used was taken (the allocator's state at the
    /// reading's own time, which the gap and its split are measured against); equal to
    /// `reserved_bytes` without a reading or when nothing changed in between.
    pub reading_reserved_bytes: u64,
    /// Requested bytes alive (the official viewer's count, not block bytes).
    pub requested_bytes: u64,
    /// device used − reserved at the reading: memory outside the allocator and other
    /// processes' together.
    pub gap_bytes: Option<i64>,
    /// Whether the gap is split into the two parts below, or why not.
    pub split: Split,
    /// process used − reserved: CUDA context, NCCL, libraries outside the allocator.
    pub outside_allocator_bytes: Option<i64>,
    /// device used − process used: other processes, and memory the driver reserves
    /// (NVML's "used" counts it on recent drivers; nvidia-smi's does not).
    pub other_processes_bytes: Option<i64>,
    /// Confidence ranges of the two parts: lowest and highest among the readings within
    /// 0.5 s of the moment whose process rows were taken at the same instant (NVML
    /// samples); readings lag the allocator, and nvidia-smi rounds to MiB.
    pub outside_allocator_range_bytes: Option<(i64, i64)>,
    pub other_processes_range_bytes: Option<(i64, i64)>,
    /// The profiler trace's allocated (block bytes, its Total Allocated) and reserved
    /// bytes at the same moment, when a trace of the same run was given.
    pub trace_allocated_bytes: Option<u64>,
    pub trace_reserved_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OverTime {
    pub time_us: i64,
    /// The event the allocator numbers are taken after (None: before the first).
    pub event: Option<u32>,
    pub device_used_bytes: u64,
    /// This process's use, when per-process rows exist.
    pub process_used_bytes: Option<u64>,
    pub reserved_bytes: i64,
    /// Requested bytes alive (the official viewer's count).
    pub requested_bytes: u64,
}

/// Why a GPU of the log was read for a device of the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuReason {
    /// Chosen with `--gpu`.
    Asked,
    /// The log numbers a GPU as the snapshot numbers the device.
    SameNumber,
    /// The log has readings of one GPU only.
    OnlyGpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuMatch {
    pub gpu: i64,
    pub reason: GpuReason,
}

/// The snapshot's and the log's time ranges for one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimeCheck {
    /// First and last `time_us` of the device's trace (None before PyTorch 2.2).
    pub trace_range: Option<TimeRange>,
    /// First and last reading of the chosen GPU in the whole log.
    pub log_range: Option<TimeRange>,
    /// The two overlap (within the 5 s a reading may be from a moment).
    pub overlap: bool,
    /// Whole hours that, added to the log's times, would make them overlap (a time-zone
    /// slip), smallest first.
    pub whole_hour_shifts: Vec<i64>,
    /// The `--utc-offset` the log was read with.
    pub utc_offset_minutes: i32,
    /// The log has timestamps without a zone, which `--utc-offset` moves.
    pub zoneless_times: bool,
}

/// Something that allocates GPU memory outside PyTorch's caching allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SuspectKind {
    /// NCCL communicators (their buffers are cudaMalloc'ed by NCCL itself).
    Nccl,
    /// Triton kernels (compiled modules loaded into device memory).
    Triton,
    /// TensorRT engines.
    #[serde(rename = "tensorrt")]
    TensorRt,
    /// CuPy's own memory pool.
    #[serde(rename = "cupy")]
    CuPy,
    /// JAX/XLA's preallocation.
    Jax,
}

/// Where the evidence for a suspect was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceSource {
    /// An `external_annotations` record (`record_function` ranges).
    Annotation,
    /// A stack frame of an allocation or segment.
    Frame,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evidence {
    pub source: EvidenceSource,
    /// The annotation's name, or the frame as `file:line:function`.
    pub text: String,
    /// How many annotation records, or distinct stacks, carry it.
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Suspect {
    pub kind: SuspectKind,
    /// The most frequent pieces of evidence (at most three), most frequent first.
    pub evidence: Vec<Evidence>,
}

/// Facts about a device worth a line that are not in its other fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Note {
    /// The snapshot's trace has no `time_us` (PyTorch before 2.2).
    NoTimes,
    /// The device has no trace entries.
    NoTrace,
    /// No reading within the skew of any moment although the ranges overlap.
    NoReadingNearMoments { max_skew_us: i64 },
    /// The log has no readings of the chosen GPU with a memory value.
    NoUsedValues { gpu: i64 },
    /// The trace ends in an OOM: readings after its last event (taken while the process
    /// failed or freed its memory) are not used for any moment.
    ReadingsAfterOomLeftOut { readings: usize },
    /// The log was longer than its limits: these rows were folded into a bounded series
    /// (first, last, lowest and highest reading per bucket), so the readings are thinned
    /// between the kept ones (see [`crate::devlog::LogLimits`]).
    ReadingsFolded { rows_folded: u64 },
}

/// The GPU's use before this job's process appeared in the log: what the driver (and any
/// other process) held with no process of the job on it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct IdleUse {
    /// The smallest reading of device used among them.
    pub used_bytes: u64,
    /// Readings before the GPU's first process row.
    pub readings: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceReconciliation {
    pub device: i64,
    /// The log's GPU read for this device, and why.
    pub gpu: Option<GpuMatch>,
    pub times: TimeCheck,
    pub ledgers: Vec<Ledger>,
    /// One row per device reading inside the trace's time span.
    pub over_time: Vec<OverTime>,
    pub gap_min_bytes: Option<i64>,
    pub gap_max_bytes: Option<i64>,
    /// What in the snapshot points at memory outside the allocator; only listed when the
    /// readings show memory outside it to explain.
    pub suspects: Vec<Suspect>,
    pub notes: Vec<Note>,
    /// The GPU's use before any process appeared on it, when the log lists processes and
    /// starts before them.
    pub idle_use: Option<IdleUse>,
}

/// What a profiler trace given beside the snapshot held, and what of it was used.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceFindings {
    pub path: String,
    pub kind: ProfileKind,
    pub clock: TraceClock,
    pub base_time_ns: Option<i64>,
    /// First and last memory event (Unix µs).
    pub range: Option<TimeRange>,
    pub cuda_events: u64,
    pub cpu_events: u64,
    pub devices: Vec<TraceDevice>,
    /// Whether its totals went into the ledgers, and why not.
    pub used: TraceUse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceUse {
    /// Aligned with the snapshot; its totals are in the ledgers.
    Used,
    /// The trace has no memory events.
    NoMemoryEvents,
    /// Only CPU memory events: nothing to set beside a GPU's.
    OnlyCpuEvents,
    /// Relative times without a base: the trace cannot be placed in time.
    ClockUnknown,
    /// Its times do not overlap the snapshot's (another run), allowed by the caller.
    NoOverlap,
    /// Overlapping times, but no allocation matches (another process), allowed by the
    /// caller.
    NoMatches,
    /// The snapshot has no times (before PyTorch 2.2).
    SnapshotWithoutTimes,
}

/// Where a trace's peak comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeakSource {
    /// The maximum of the trace's own `Total Allocated`.
    TotalAllocated,
    /// The running sum of `Bytes` (traces without `Total Allocated`: 2021 Kineto, memory
    /// timelines), which misses memory allocated before profiling.
    RunningSum,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceDevice {
    /// The trace's device (a CUDA index; 0 for a memory timeline, which names none).
    pub device: i64,
    pub source: DeviceSource,
    pub events: u64,
    pub peak_allocated_bytes: u64,
    pub peak_time_us: Option<i64>,
    pub peak_source: PeakSource,
    /// None when the trace has no `Total Reserved`.
    pub peak_reserved_bytes: Option<u64>,
    pub before_profiling_bytes: u64,
    /// How it lines up with the snapshot's device of the same number.
    pub alignment: Option<Alignment>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Reconciliation {
    pub schema_version: u32,
    pub path: String,
    pub device_log_source: &'static str,
    pub gpu_numbering: GpuNumbering,
    pub devices: Vec<DeviceReconciliation>,
    pub trace: Option<TraceFindings>,
}

/// Why reconciliation stopped; `render::device::reconcile` words it.
#[derive(Debug, Clone, PartialEq)]
pub enum ReconcileError {
    /// `--gpu` names a GPU the log does not have.
    NoSuchGpu { asked: i64, available: Vec<i64> },
    /// The log has several GPUs and none numbered as the snapshot's device.
    WhichGpu {
        device: i64,
        available: Vec<i64>,
        numbering: GpuNumbering,
    },
    /// `--gpu` with a snapshot of several devices and no `--device`.
    GpuNeedsDevice { devices: Vec<i64> },
    /// The log's readings of the GPU do not overlap the snapshot's trace.
    LogNoOverlap { device: i64, times: TimeCheck },
    /// The profiler trace is from another run (its times do not overlap the snapshot's)
    /// or another process (no allocation matches).
    TraceNotLinedUp { device: i64, error: LineUpError },
}

/// Readings of one GPU with a memory value, in time order.
pub fn gpu_samples(log: &DeviceLog, gpu: i64) -> Vec<&GpuSample> {
    log.gpus
        .iter()
        .filter(|s| s.gpu == gpu && s.used_bytes.is_some())
        .collect()
}

fn nearest<'a>(samples: &[&'a GpuSample], t: i64) -> Option<&'a GpuSample> {
    let i = samples.partition_point(|s| s.time_us < t);
    [i.checked_sub(1), Some(i)]
        .into_iter()
        .flatten()
        .filter_map(|k| samples.get(k).copied())
        .filter(|s| (s.time_us - t).abs() <= MAX_SKEW_US)
        .min_by_key(|s| ((s.time_us - t).abs(), s.time_us))
}

/// Whether a process row is of the sample's GPU: by uuid when both have one, else by
/// number; a row naming neither could be of any.
fn on_gpu_of(p: &ProcessSample, sample: &GpuSample) -> bool {
    match (p.gpu_uuid, sample.uuid, p.gpu) {
        (Some(a), Some(b), _) => a == b,
        (_, _, Some(g)) => g == sample.gpu,
        _ => true,
    }
}

/// The process on the sample's GPU at about its time whose use is closest to `reserved`,
/// among the rows of the sampling instant nearest the sample (within `max_skew_us`).
/// `processes` is sorted by time: the nearest instant is found by binary search and a walk
/// to the nearest row of the same GPU, so dense logs stay linear.
fn our_process(
    processes: &[ProcessSample],
    sample: &GpuSample,
    reserved: u64,
    max_skew_us: i64,
) -> Option<(u64, u64)> {
    let t = sample.time_us;
    let same_gpu = |p: &&ProcessSample| on_gpu_of(p, sample);
    let i = processes.partition_point(|p| p.time_us < t);
    let after = processes[i..]
        .iter()
        .take_while(|p| p.time_us - t <= max_skew_us)
        .find(same_gpu)
        .map(|p| p.time_us - t);
    let before = processes[..i]
        .iter()
        .rev()
        .take_while(|p| t - p.time_us <= max_skew_us)
        .find(same_gpu)
        .map(|p| t - p.time_us);
    let closest = match (before, after) {
        (Some(b), Some(a)) => b.min(a),
        (b, a) => b.or(a)?,
    };
    // The rows of the one or two instants at that distance.
    let rows_at = |time: i64| {
        let lo = processes.partition_point(|p| p.time_us < time);
        let hi = processes.partition_point(|p| p.time_us <= time);
        &processes[lo..hi]
    };
    let earlier = rows_at(t - closest);
    let later = if closest == 0 {
        &[][..]
    } else {
        rows_at(t + closest)
    };
    earlier
        .iter()
        .chain(later)
        .filter(same_gpu)
        .filter_map(|p| Some((p.pid, p.used_bytes?)))
        .min_by_key(|(pid, used)| (used.abs_diff(reserved), *pid))
}

/// Needles for each suspect, matched in lower-case annotation names and frames.
const SUSPECTS: [(SuspectKind, &[&str]); 5] = [
    (SuspectKind::Nccl, &["nccl"]),
    (SuspectKind::Triton, &["triton"]),
    (SuspectKind::TensorRt, &["tensorrt"]),
    (SuspectKind::CuPy, &["cupy"]),
    (SuspectKind::Jax, &["jax/", "jaxlib"]),
];

/// The suspects the snapshot's annotations and frames give evidence for.
pub fn find_suspects(snap: &Snapshot) -> Vec<Suspect> {
    // Annotation names with their record counts.
    let mut names: BTreeMap<&str, u64> = BTreeMap::new();
    for a in &snap.external_annotations {
        if a.stage != "END" {
            *names.entry(a.name.as_str()).or_insert(0) += 1;
        }
    }
    // Distinct stacks holding each frame.
    let mut stacks_of_frame: BTreeMap<u32, u64> = BTreeMap::new();
    for s in 0..snap.frames.stack_count() {
        let mut seen: Vec<u32> = snap
            .frames
            .stack(StackId(s as u32))
            .iter()
            .map(|f| f.0)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        for f in seen {
            *stacks_of_frame.entry(f).or_insert(0) += 1;
        }
    }
    let mut out = Vec::new();
    for (kind, needles) in SUSPECTS {
        let hit = |text: &str| {
            let t = text.to_lowercase();
            needles.iter().any(|n| t.contains(n))
        };
        let mut evidence: Vec<Evidence> = names
            .iter()
            .filter(|(n, _)| hit(n))
            .map(|(n, &count)| Evidence {
                source: EvidenceSource::Annotation,
                text: n.to_string(),
                count,
            })
            .collect();
        for (&f, &count) in &stacks_of_frame {
            let frame = snap.frames.frame(crate::model::FrameId(f));
            let file = snap.frames.str(frame.filename);
            let name = snap.frames.str(frame.name);
            if hit(file) || hit(name) {
                evidence.push(Evidence {
                    source: EvidenceSource::Frame,
                    text: format!("{file}:{}:{name}", frame.line),
                    count,
                });
            }
        }
        if evidence.is_empty() {
            continue;
        }
        evidence.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.source.cmp(&b.source))
                .then(a.text.cmp(&b.text))
        });
        evidence.truncate(3);
        out.push(Suspect { kind, evidence });
    }
    out
}

/// The readings of a GPU before its first process row: none when the log has no process
/// rows for it (then nothing tells idle readings from busy ones).
fn idle_use(log: &DeviceLog, samples: &[&GpuSample]) -> Option<IdleUse> {
    let first = samples.first()?;
    let first_process_us = log.processes.iter().find(|p| on_gpu_of(p, first))?.time_us;
    let idle: Vec<u64> = samples
        .iter()
        .take_while(|s| s.time_us < first_process_us)
        .filter_map(|s| s.used_bytes)
        .collect();
    Some(IdleUse {
        used_bytes: *idle.iter().min()?,
        readings: idle.len(),
    })
}

/// Chooses the log's GPU for a snapshot device.
fn choose_gpu(
    log: &DeviceLog,
    device: i64,
    asked: Option<i64>,
) -> Result<GpuMatch, ReconcileError> {
    let available = log.gpu_numbers();
    if let Some(g) = asked {
        return if available.contains(&g) {
            Ok(GpuMatch {
                gpu: g,
                reason: GpuReason::Asked,
            })
        } else {
            Err(ReconcileError::NoSuchGpu {
                asked: g,
                available,
            })
        };
    }
    if log.numbering == GpuNumbering::DriverIndex && available.contains(&device) {
        return Ok(GpuMatch {
            gpu: device,
            reason: GpuReason::SameNumber,
        });
    }
    match available.as_slice() {
        [only] => Ok(GpuMatch {
            gpu: *only,
            reason: GpuReason::OnlyGpu,
        }),
        [] => Ok(GpuMatch {
            gpu: device,
            reason: GpuReason::SameNumber,
        }),
        _ => Err(ReconcileError::WhichGpu {
            device,
            available,
            numbering: log.numbering,
        }),
    }
}

struct DeviceCtx<'a, 'b> {
    totals: &'b TotalsAtEvents,
    trace: Option<&'a DeviceTrace>,
    times: Times<'a>,
    log: &'b DeviceLog,
    samples: Vec<&'b GpuSample>,
}

fn ledger(c: &DeviceCtx, moment: Moment, at: usize) -> Option<Ledger> {
    let time_us = c.trace?.time_us(at).filter(|&t| t > 0)?;
    let tl = c.totals;
    let reserved = tl.reserved_at(Some(at)).max(0) as u64;
    let requested = tl.requested_at(Some(at));
    let sample = nearest(&c.samples, time_us);
    let window: Vec<&GpuSample> = {
        let lo = c
            .samples
            .partition_point(|s| s.time_us < time_us - RANGE_US);
        let hi = c
            .samples
            .partition_point(|s| s.time_us <= time_us + RANGE_US);
        c.samples[lo..hi].to_vec()
    };
    let used_values: Vec<u64> = window.iter().filter_map(|s| s.used_bytes).collect();
    let range = used_values
        .iter()
        .min()
        .zip(used_values.iter().max())
        .map(|(&lo, &hi)| (lo, hi));
    let used = sample.and_then(|s| s.used_bytes);
    // A reading is compared with the allocator at the reading's own time: a segment
    // allocated between the reading and the moment is not in the reading.
    let at_reading = sample.map_or(reserved, |s| {
        tl.reserved_at(c.times.event_at(s.time_us)).max(0) as u64
    });
    let process = sample.and_then(|s| our_process(&c.log.processes, s, at_reading, MAX_SKEW_US));
    // The split at each reading near the moment, against the allocator at that reading.
    let mut outside_all = Vec::new();
    let mut other_all = Vec::new();
    for s in &window {
        let r = tl.reserved_at(c.times.event_at(s.time_us)).max(0) as u64;
        // Only process rows of the same instant: rows of another sampling instant would
        // mix two moments of a changing device.
        if let (Some(u), Some((_, p))) = (s.used_bytes, our_process(&c.log.processes, s, r, 0)) {
            outside_all.push(p as i64 - r as i64);
            other_all.push(u as i64 - p as i64);
        }
    }
    // The point estimate itself belongs to its range.
    if let (Some(u), Some((_, p))) = (used, process) {
        outside_all.push(p as i64 - at_reading as i64);
        other_all.push(u as i64 - p as i64);
    }
    let span = |v: &[i64]| Some((*v.iter().min()?, *v.iter().max()?));
    let split = match (used, process) {
        (None, _) => Split::NoReading,
        (Some(_), Some(_)) => Split::Measured,
        (Some(_), None) if c.log.processes.is_empty() => Split::NoProcessReadings,
        (Some(_), None) => Split::NoProcessRowNearReading,
    };
    Some(Ledger {
        moment,
        event: Some(at as u32),
        time_us,
        sample_skew_us: sample.map(|s| s.time_us - time_us),
        device_total_bytes: sample.and_then(|s| s.total_bytes),
        device_used_bytes: used,
        device_used_range_bytes: range,
        process_pid: process.map(|p| p.0),
        process_used_bytes: process.map(|p| p.1),
        reserved_bytes: reserved,
        reading_reserved_bytes: at_reading,
        requested_bytes: requested,
        gap_bytes: used.map(|u| u as i64 - at_reading as i64),
        split,
        outside_allocator_bytes: process.map(|(_, p)| p as i64 - at_reading as i64),
        other_processes_bytes: match (used, process) {
            (Some(u), Some((_, p))) => Some(u as i64 - p as i64),
            _ => None,
        },
        outside_allocator_range_bytes: if split == Split::Measured {
            span(&outside_all)
        } else {
            None
        },
        other_processes_range_bytes: if split == Split::Measured {
            span(&other_all)
        } else {
            None
        },
        trace_allocated_bytes: None,
        trace_reserved_bytes: None,
    })
}

/// The states (events) of the device readings: what [`over_time`] and the ledgers read
/// of a replay.
fn reading_states(times: &Times, samples: &[&GpuSample]) -> Vec<Option<usize>> {
    samples.iter().map(|s| times.event_at(s.time_us)).collect()
}

/// Each device reading of a device's GPU inside the trace's time span, against the
/// allocator state at that time (one replay pass).
pub fn readings_over_time(
    snap: &Snapshot,
    device: i64,
    log: &DeviceLog,
    samples: &[&GpuSample],
) -> Vec<OverTime> {
    let times = Times::new(snap.trace(device));
    let totals = timeline::totals_at_events(snap, device, reading_states(&times, samples));
    over_time(&totals, &times, log, samples)
}

/// Each device reading inside the trace's time span, against the allocator state at
/// that time; `tl` holds the totals at every reading's event.
fn over_time(
    tl: &TotalsAtEvents,
    times: &Times,
    log: &DeviceLog,
    samples: &[&GpuSample],
) -> Vec<OverTime> {
    let Some(range) = times.range() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in samples.iter().filter(|s| range.contains(s.time_us)) {
        let at = times.event_at(s.time_us);
        if let Some(used) = s.used_bytes {
            let reserved = tl.reserved_at(at);
            out.push(OverTime {
                time_us: s.time_us,
                event: at.map(|i| i as u32),
                device_used_bytes: used,
                process_used_bytes: our_process(
                    &log.processes,
                    s,
                    reserved.max(0) as u64,
                    MAX_SKEW_US,
                )
                .map(|p| p.1),
                reserved_bytes: reserved,
                requested_bytes: tl.requested_at(at),
            });
        }
    }
    out
}

/// The time range the snapshot's traces cover (for keeping only the log rows near it).
pub fn snapshot_range(snap: &Snapshot, device: Option<i64>) -> Option<TimeRange> {
    snap.devices()
        .into_iter()
        .filter(|d| device.is_none_or(|w| w == *d))
        .filter_map(|d| Times::new(snap.trace(d)).range())
        .reduce(TimeRange::union)
}

/// The neighbourhoods of the moments the ledgers are drawn up at (start, peak, OOMs, end
/// of each device's trace): a reading within [`MAX_SKEW_US`] of a moment, and the process
/// rows within as much of that reading. A long device log keeps finer detail there (see
/// [`crate::devlog::LogLimits`]). Costs one replay per device, for the peak.
pub fn focus_ranges(snap: &Snapshot, device: Option<i64>) -> Vec<TimeRange> {
    let mut out = Vec::new();
    for d in snap.devices() {
        if device.is_some_and(|w| w != d) {
            continue;
        }
        let Some(trace) = snap.trace(d).filter(|t| !t.is_empty()) else {
            continue;
        };
        let mut at: Vec<usize> = vec![0, trace.len() - 1];
        at.extend((0..trace.len()).filter(|&i| trace.action(i) == Action::Oom));
        if let Some(e) = timeline::peaks(snap, d).requested.event {
            at.push(e.index());
        }
        out.extend(
            at.into_iter()
                .filter_map(|i| trace.time_us(i).filter(|&t| t > 0))
                .map(|t| TimeRange::new(t, t).widen(2 * MAX_SKEW_US)),
        );
    }
    out.sort_by_key(|r| (r.first_us, r.last_us));
    out.dedup();
    out
}

/// What every device's reconciliation reads: the snapshot, the device log and the
/// `--utc-offset` it was read with, the converted profiler trace (with its path) when
/// one is given, and the options.
struct Inputs<'a> {
    snap: &'a Snapshot,
    log: &'a DeviceLog,
    utc_offset_minutes: i32,
    profile: Option<(&'a str, &'a Converted)>,
    options: ReconcileOptions,
}

/// Reconciles every device of the snapshot (or one) with the device log, and with a
/// converted profiler trace when one is given (with its path).
pub fn analyze_reconcile(
    snap: &Snapshot,
    path: &str,
    log: &DeviceLog,
    utc_offset_minutes: i32,
    profile: Option<(&str, &Converted)>,
    options: ReconcileOptions,
) -> Result<Reconciliation, ReconcileError> {
    let devices = devices_in_order(snap, options)?;
    let mut trace_findings = profile.map(|(p, conv)| trace_findings(p, conv));
    let inputs = Inputs {
        snap,
        log,
        utc_offset_minutes,
        profile,
        options,
    };
    let mut out = Vec::new();
    for d in devices {
        out.push(reconcile_device(&inputs, d, trace_findings.as_mut())?);
    }
    Ok(Reconciliation {
        schema_version: SCHEMA_VERSION,
        path: path.to_string(),
        device_log_source: log.source,
        gpu_numbering: log.numbering,
        devices: out,
        trace: trace_findings,
    })
}

/// The devices to reconcile: the snapshot's, or the one asked for, the one every command
/// looks at first leading; refused when a log GPU is named for several.
fn devices_in_order(
    snap: &Snapshot,
    options: ReconcileOptions,
) -> Result<Vec<i64>, ReconcileError> {
    let mut devices: Vec<i64> = snap
        .devices()
        .into_iter()
        .filter(|d| options.device.is_none_or(|w| w == *d))
        .collect();
    // The device every command looks at first (the OOM's, else the largest peak's).
    if devices.len() > 1
        && let Ok(c) = crate::analysis::device::choose_device(snap, None)
    {
        devices.sort_by_key(|&d| (d != c.device, d));
    }
    if options.gpu.is_some() && devices.len() > 1 {
        return Err(ReconcileError::GpuNeedsDevice { devices });
    }
    Ok(devices)
}

/// One device against its GPU's readings: the time check, a ledger at each moment (the
/// trace's lined up when given), the readings over time, notes, and suspects when there
/// is memory outside the allocator to explain.
fn reconcile_device(
    inp: &Inputs,
    d: i64,
    findings: Option<&mut TraceFindings>,
) -> Result<DeviceReconciliation, ReconcileError> {
    let (snap, log) = (inp.snap, inp.log);
    let trace = snap.trace(d).filter(|t| !t.is_empty());
    let times = Times::new(trace);
    let gpu = choose_gpu(log, d, inp.options.gpu)?;
    let mut samples = gpu_samples(log, gpu.gpu);
    let idle_use = idle_use(log, &samples);
    let after_oom = leave_out_after_oom(trace, &times, &mut samples);
    let check = time_check(&times, log, gpu.gpu, inp.utc_offset_minutes);
    let overlap = check.overlap;
    if check.trace_range.is_some()
        && check.log_range.is_some()
        && !overlap
        && !inp.options.allow_no_overlap
    {
        return Err(ReconcileError::LogNoOverlap {
            device: d,
            times: check,
        });
    }
    let mut notes = reading_notes(trace, &check, log, gpu.gpu, &samples, after_oom);
    // One pass gives the totals at every moment and reading, and the peak.
    let mut states = reading_states(&times, &samples);
    let mut moments = ledger_moments(trace);
    states.extend(moments.iter().map(|&(_, i)| Some(i)));
    let totals = timeline::totals_at_events(snap, d, states);
    if let Some(e) = totals.peaks.requested.event {
        moments.insert(0, (Moment::Peak, e.index()));
    }
    let ctx = DeviceCtx {
        totals: &totals,
        trace,
        times,
        log,
        samples,
    };
    let mut ledgers: Vec<Ledger> = moments
        .into_iter()
        .filter_map(|(m, i)| ledger(&ctx, m, i))
        .collect();
    if overlap && !ctx.samples.is_empty() && ledgers.iter().all(|l| l.device_used_bytes.is_none()) {
        notes.push(Note::NoReadingNearMoments {
            max_skew_us: MAX_SKEW_US,
        });
    }
    if let (Some(findings), Some((_, conv))) = (findings, inp.profile) {
        align_trace(snap, d, conv, findings, &mut ledgers, inp.options)?;
    }
    let over_time = over_time(&totals, &ctx.times, log, &ctx.samples);
    let gaps: Vec<i64> = over_time
        .iter()
        .map(|o| o.device_used_bytes as i64 - o.reserved_bytes)
        .collect();
    // Suspects only when there is memory outside the allocator to explain.
    let outside = ledgers.iter().any(|l| {
        l.outside_allocator_bytes
            .or(l.gap_bytes)
            .is_some_and(|b| b > 0)
    });
    Ok(DeviceReconciliation {
        device: d,
        gpu: Some(gpu),
        times: check,
        ledgers,
        gap_min_bytes: gaps.iter().copied().min(),
        gap_max_bytes: gaps.iter().copied().max(),
        over_time,
        suspects: if outside {
            find_suspects(snap)
        } else {
            Vec::new()
        },
        notes,
        idle_use,
    })
}

/// When the trace ends in an OOM, leaves out the readings after its last event; gives
/// how many.
fn leave_out_after_oom(
    trace: Option<&DeviceTrace>,
    times: &Times,
    samples: &mut Vec<&GpuSample>,
) -> usize {
    let mut after_oom = 0;
    if let (Some(t), Some(range)) = (trace, times.range())
        && (0..t.len()).any(|i| t.action(i) == Action::Oom)
    {
        let before = samples.len();
        samples.retain(|s| s.time_us <= range.last_us);
        after_oom = before - samples.len();
    }
    after_oom
}

/// The trace's and the log's time ranges for `gpu`, whether they overlap (within
/// [`MAX_SKEW_US`]), and the whole-hour shifts that would make them.
fn time_check(times: &Times, log: &DeviceLog, gpu: i64, utc_offset_minutes: i32) -> TimeCheck {
    let trace_range = times.range();
    let log_range = log.span_of(gpu).map(|s| s.range);
    let overlap = match (trace_range, log_range) {
        (Some(t), Some(l)) => t.widen(MAX_SKEW_US).overlaps(l),
        _ => false,
    };
    TimeCheck {
        trace_range,
        log_range,
        overlap,
        whole_hour_shifts: match (trace_range, log_range) {
            (Some(t), Some(l)) => whole_hour_shifts(l, t.widen(MAX_SKEW_US)),
            _ => Vec::new(),
        },
        utc_offset_minutes,
        zoneless_times: log.zoneless_times,
    }
}

/// What limits the readings of `gpu`: no trace or no times, no used values, readings
/// left out after an OOM (`after_oom`), rows folded.
fn reading_notes(
    trace: Option<&DeviceTrace>,
    check: &TimeCheck,
    log: &DeviceLog,
    gpu: i64,
    samples: &[&GpuSample],
    after_oom: usize,
) -> Vec<Note> {
    let mut notes = Vec::new();
    if trace.is_none() {
        notes.push(Note::NoTrace);
    } else if check.trace_range.is_none() {
        notes.push(Note::NoTimes);
    }
    if check.log_range.is_some() && samples.is_empty() && check.overlap && after_oom == 0 {
        notes.push(Note::NoUsedValues { gpu });
    }
    if after_oom > 0 {
        notes.push(Note::ReadingsAfterOomLeftOut {
            readings: after_oom,
        });
    }
    if log.rows_folded > 0 {
        notes.push(Note::ReadingsFolded {
            rows_folded: log.rows_folded,
        });
    }
    notes
}

/// The moments a ledger is drawn up at, before the peak is known: each OOM, then the end.
fn ledger_moments(trace: Option<&DeviceTrace>) -> Vec<(Moment, usize)> {
    let mut moments: Vec<(Moment, usize)> = Vec::new();
    if let Some(t) = trace {
        for i in 0..t.len() {
            if t.action(i) == Action::Oom {
                moments.push((Moment::Oom, i));
            }
        }
        if let Some(last) = t.len().checked_sub(1) {
            moments.push((Moment::End, last));
        }
    }
    moments
}

/// What a converted trace holds, before any alignment.
fn trace_findings(path: &str, conv: &Converted) -> TraceFindings {
    let snap = &conv.snapshot;
    let mut range: Option<TimeRange> = None;
    let mut cuda_events = 0;
    let mut cpu_events = conv.cpu_events_left_out;
    let mut devices = Vec::new();
    for d in &conv.devices {
        match d.source {
            DeviceSource::Cuda(_) => cuda_events += d.events,
            DeviceSource::Cpu => cpu_events += d.events,
            DeviceSource::Unnamed => {}
        }
        let times = Times::new(snap.trace(d.device));
        if let Some(r) = times.range() {
            range = Some(range.map_or(r, |x| x.union(r)));
        }
        let peaks = timeline::peaks(snap, d.device);
        devices.push(TraceDevice {
            device: d.device,
            source: d.source,
            events: d.events,
            peak_allocated_bytes: peaks.requested.bytes,
            peak_time_us: peaks.requested.time_us,
            peak_source: if d.peak_total_allocated_bytes.is_some() {
                PeakSource::TotalAllocated
            } else {
                PeakSource::RunningSum
            },
            peak_reserved_bytes: d.peak_total_reserved_bytes,
            before_profiling_bytes: d.before_profiling_bytes,
            alignment: None,
        });
    }
    let clock = conv.clock;
    let used = match unusable(conv) {
        None => TraceUse::Used,
        Some(LineUpError::NoMemoryEvents) => TraceUse::NoMemoryEvents,
        Some(LineUpError::OnlyCpuEvents) => TraceUse::OnlyCpuEvents,
        Some(_) => TraceUse::ClockUnknown,
    };
    TraceFindings {
        path: path.to_string(),
        kind: conv.kind,
        clock,
        base_time_ns: conv.base_time_ns,
        range,
        cuda_events,
        cpu_events,
        devices,
        used,
    }
}

/// Lines the trace's device up with snapshot device `d`, checks it is the same run, and
/// puts the trace's totals in the ledgers.
fn align_trace(
    snap: &Snapshot,
    d: i64,
    conv: &Converted,
    findings: &mut TraceFindings,
    ledgers: &mut [Ledger],
    options: ReconcileOptions,
) -> Result<(), ReconcileError> {
    if findings.used != TraceUse::Used {
        return Ok(());
    }
    let lined = match line_up(snap, d, conv) {
        Ok(l) => l,
        Err(LineUpError::SnapshotWithoutTimes) => {
            findings.used = TraceUse::SnapshotWithoutTimes;
            return Ok(());
        }
        Err(error @ LineUpError::NoOverlap { .. }) => {
            if options.allow_no_overlap {
                findings.used = TraceUse::NoOverlap;
                return Ok(());
            }
            return Err(ReconcileError::TraceNotLinedUp { device: d, error });
        }
        Err(error @ LineUpError::NoMatches { alignment, index }) => {
            if options.allow_no_overlap {
                findings.used = TraceUse::NoMatches;
                findings.devices[index].alignment = Some(alignment);
                return Ok(());
            }
            return Err(ReconcileError::TraceNotLinedUp { device: d, error });
        }
        // No device to line up (or one without times): nothing to add.
        Err(_) => return Ok(()),
    };
    let k = lined.index;
    findings.devices[k].alignment = Some(lined.alignment);
    // The trace's totals at each ledger's moment, on the trace's clock.
    let trace_times = Times::new(conv.snapshot.trace(lined.trace_device));
    let has_reserved = findings.devices[k].peak_reserved_bytes.is_some();
    let residual = lined.alignment.residual_us.unwrap_or(0);
    let state = |l: &Ledger| {
        let t = l.time_us + residual;
        lined
            .trace_range
            .contains(t)
            .then(|| trace_times.event_at(t))
    };
    let states = ledgers.iter().filter_map(state).collect();
    let tl = timeline::totals_at_events(&conv.snapshot, lined.trace_device, states);
    for l in ledgers.iter_mut() {
        let Some(at) = state(l) else {
            continue;
        };
        l.trace_allocated_bytes = Some(tl.requested_at(at));
        if has_reserved {
            l.trace_reserved_bytes = Some(tl.reserved_at(at).max(0) as u64);
        }
    }
    Ok(())
}
