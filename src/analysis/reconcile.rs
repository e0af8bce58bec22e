//! Reconciliation: PyTorch's allocator numbers against device-level samples (nvidia-smi or
//! NVML), at the moments that matter (peak, OOMs, end) and over time, with the gap split
//! into memory outside the caching allocator in this process and other processes.

use crate::devlog::{DeviceLog, GpuSample, ProcessSample};
use crate::model::{Action, Snapshot};
use crate::timeline::{self, DeviceTimeline};
use crate::units::{bytes, bytes_signed};
use serde::Serialize;

pub const SCHEMA_VERSION: u32 = 1;

/// Samples farther than this from a moment are not used for it.
const MAX_SKEW_US: i64 = 5_000_000;
/// Readings this close to a moment give the range of device use around it.
const RANGE_US: i64 = 500_000;

/// Names in frames or annotations that point at memory allocated outside PyTorch's caching
/// allocator, with what they stand for.
const CULPRITS: [(&str, &str); 8] = [
    ("nccl", "NCCL communicator buffers"),
    ("cublasLt", "cuBLASLt workspaces of code outside PyTorch"),
    ("cudnn", "cuDNN workspaces of code outside PyTorch"),
    ("triton", "Triton (autotuning, kernels' scratch memory)"),
    ("transformer_engine", "TransformerEngine workspaces"),
    ("tensorrt", "TensorRT engines"),
    ("cupy", "CuPy's own memory pool"),
    ("jax", "JAX/XLA preallocation"),
];

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Ledger {
    /// "peak", "oom", "end".
    pub moment: &'static str,
    pub event: Option<u32>,
    pub time_us: i64,
    /// Distance from the moment to the device sample used.
    pub sample_skew_us: Option<i64>,
    pub device_total_bytes: Option<u64>,
    pub device_used_bytes: Option<u64>,
    /// Lowest and highest device use among readings within 0.5 s of the moment.
    pub device_used_range_bytes: Option<(u64, u64)>,
    /// This process's use, when per-process rows exist (the process whose use is closest
    /// above PyTorch's reserved memory).
    pub process_pid: Option<u64>,
    pub process_used_bytes: Option<u64>,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// device used − reserved.
    pub gap_bytes: Option<i64>,
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
    pub allocated_bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceReconciliation {
    pub device: i64,
    pub ledgers: Vec<Ledger>,
    /// One row per device sample inside the trace's time span.
    pub over_time: Vec<OverTime>,
    pub gap_min_bytes: Option<i64>,
    pub gap_max_bytes: Option<i64>,
    /// Things in the snapshot that allocate outside the caching allocator.
    pub culprits: Vec<String>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Reconciliation {
    pub schema_version: u32,
    pub path: String,
    pub device_log_source: &'static str,
    pub devices: Vec<DeviceReconciliation>,
}

fn samples_of(log: &DeviceLog, gpu: i64) -> Vec<&GpuSample> {
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

/// The process on `gpu` at about time `t` whose use is closest to `reserved` from above.
fn our_process(
    processes: &[ProcessSample],
    sample: &GpuSample,
    reserved: u64,
    max_skew_us: i64,
) -> Option<(u64, u64)> {
    let t = sample.time_us;
    let same_gpu = |p: &&ProcessSample| match (&p.gpu_uuid, &sample.uuid, p.gpu) {
        (Some(a), Some(b), _) => a == b,
        (_, _, Some(g)) => g == sample.gpu,
        _ => true,
    };
    let near: Vec<&ProcessSample> = processes
        .iter()
        .filter(|p| (p.time_us - t).abs() <= max_skew_us)
        .filter(same_gpu)
        .collect();
    // Rows of the sampling instant closest to t.
    let closest = near.iter().map(|p| (p.time_us - t).abs()).min()?;
    let rows: Vec<&&ProcessSample> = near
        .iter()
        .filter(|p| (p.time_us - t).abs() == closest)
        .collect();
    rows.iter()
        .filter_map(|p| Some((p.pid, p.used_bytes?)))
        .min_by_key(|(pid, used)| (used.abs_diff(reserved), *pid))
}

fn culprits(snap: &Snapshot) -> Vec<String> {
    let mut hay: Vec<String> = snap
        .external_annotations
        .iter()
        .map(|a| a.name.to_lowercase())
        .collect();
    for s in 0..snap.frames.stack_count() {
        for &f in snap.frames.stack(crate::model::StackId(s as u32)) {
            let fr = snap.frames.frame(f);
            hay.push(
                format!(
                    "{} {}",
                    snap.frames.str(fr.filename),
                    snap.frames.str(fr.name)
                )
                .to_lowercase(),
            );
        }
    }
    CULPRITS
        .iter()
        .filter(|(needle, _)| hay.iter().any(|h| h.contains(&needle.to_lowercase())))
        .map(|(needle, what)| {
            format!("{what} ('{needle}' appears in the recorded stacks or annotations)")
        })
        .collect()
}

fn ledger(
    tl: &DeviceTimeline,
    log: &DeviceLog,
    samples: &[&GpuSample],
    moment: &'static str,
    at: usize,
) -> Option<Ledger> {
    let time_us = tl.time_us(at).filter(|&t| t > 0)?;
    let reserved = tl.reserved_at(Some(at)).max(0) as u64;
    let allocated = tl.requested_at(Some(at));
    let sample = nearest(samples, time_us);
    let window: Vec<u64> = samples
        .iter()
        .filter(|s| (s.time_us - time_us).abs() <= RANGE_US)
        .filter_map(|s| s.used_bytes)
        .collect();
    let range = (!window.is_empty()).then(|| {
        (
            *window.iter().min().unwrap_or(&0),
            *window.iter().max().unwrap_or(&0),
        )
    });
    let used = sample.and_then(|s| s.used_bytes);
    let process = sample.and_then(|s| our_process(&log.processes, s, reserved, MAX_SKEW_US));
    // The split at each reading near the moment, against the allocator at that reading.
    let mut outside_all = Vec::new();
    let mut other_all = Vec::new();
    for s in samples
        .iter()
        .filter(|s| (s.time_us - time_us).abs() <= RANGE_US)
    {
        let at = tl.event_at_time(s.time_us);
        let r = tl.reserved_at(at).max(0) as u64;
        // Only process rows of the same instant: rows of another sampling instant would
        // mix two moments of a changing device.
        if let (Some(u), Some((_, p))) = (s.used_bytes, our_process(&log.processes, s, r, 0)) {
            outside_all.push(p as i64 - r as i64);
            other_all.push(u as i64 - p as i64);
        }
    }
    // The point estimate itself belongs to its range.
    if let (Some(u), Some((_, p))) = (used, process) {
        outside_all.push(p as i64 - reserved as i64);
        other_all.push(u as i64 - p as i64);
    }
    let span = |v: &[i64]| Some((*v.iter().min()?, *v.iter().max()?));
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
        allocated_bytes: allocated,
        gap_bytes: used.map(|u| u as i64 - reserved as i64),
        outside_allocator_bytes: process.map(|(_, p)| p as i64 - reserved as i64),
        other_processes_bytes: match (used, process) {
            (Some(u), Some((_, p))) => Some(u as i64 - p as i64),
            _ => None,
        },
        outside_allocator_range_bytes: span(&outside_all),
        other_processes_range_bytes: span(&other_all),
    })
}

/// Each device reading of the timeline's GPU inside the trace's time span, against the
/// allocator state at that time.
pub fn over_time(tl: &DeviceTimeline, log: &DeviceLog, samples: &[&GpuSample]) -> Vec<OverTime> {
    let n = tl.events();
    let first = (0..n).find_map(|i| tl.time_us(i).filter(|&t| t > 0));
    let last = (0..n).rev().find_map(|i| tl.time_us(i).filter(|&t| t > 0));
    let mut out = Vec::new();
    let (Some(first), Some(last)) = (first, last) else {
        return out;
    };
    let mut i = 0usize;
    let mut at: Option<usize> = None;
    for s in samples
        .iter()
        .filter(|s| s.time_us >= first && s.time_us <= last)
    {
        while i < n {
            match tl.time_us(i) {
                Some(t) if t > s.time_us => break,
                _ => at = Some(i),
            }
            i += 1;
        }
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
                allocated_bytes: tl.requested_at(at),
            });
        }
    }
    out
}

/// The device log's readings of one GPU, in time order.
pub fn gpu_samples(log: &DeviceLog, gpu: i64) -> Vec<&GpuSample> {
    samples_of(log, gpu)
}

/// Reconciles every device of the snapshot (or one) with the device log.
pub fn analyze_reconcile(
    snap: &Snapshot,
    path: &str,
    log: &DeviceLog,
    device: Option<i64>,
) -> Reconciliation {
    let mut devices = Vec::new();
    for d in snap
        .devices()
        .into_iter()
        .filter(|d| device.is_none_or(|w| w == *d))
    {
        let tl = timeline::build(snap, d);
        let samples = samples_of(log, d);
        let mut notes = Vec::new();
        if samples.is_empty() {
            notes.push(format!("the device log has no readings of GPU {d}"));
        }
        if !tl.has_times() {
            notes.push(
                "the trace has no time_us (PyTorch before 2.2): nothing can be matched in time"
                    .into(),
            );
        }
        let n = tl.events();
        let mut moments: Vec<(&'static str, usize)> = Vec::new();
        if let Some(e) = tl.peak_requested.event {
            moments.push(("peak", e.index()));
        }
        for i in 0..n {
            if tl.trace.action(i) == Action::Oom {
                moments.push(("oom", i));
            }
        }
        if let Some(last) = n.checked_sub(1) {
            moments.push(("end", last));
        }
        let ledgers: Vec<Ledger> = moments
            .into_iter()
            .filter_map(|(m, i)| ledger(&tl, log, &samples, m, i))
            .collect();
        if !samples.is_empty()
            && tl.has_times()
            && ledgers.iter().all(|l| l.device_used_bytes.is_none())
        {
            notes.push(format!(
                "no device reading within {} s of the trace's moments: are the clocks aligned? (nvidia-smi prints local time: see --utc-offset)",
                MAX_SKEW_US / 1_000_000
            ));
        }
        let over_time = over_time(&tl, log, &samples);
        let gaps: Vec<i64> = over_time
            .iter()
            .map(|o| o.device_used_bytes as i64 - o.reserved_bytes)
            .collect();
        devices.push(DeviceReconciliation {
            device: d,
            ledgers,
            gap_min_bytes: gaps.iter().copied().min(),
            gap_max_bytes: gaps.iter().copied().max(),
            over_time,
            culprits: culprits(snap),
            notes,
        });
    }
    Reconciliation {
        schema_version: SCHEMA_VERSION,
        path: path.to_string(),
        device_log_source: log.source,
        devices,
    }
}

/// One line per ledger, for people.
pub fn describe(l: &Ledger) -> String {
    let opt = |v: Option<u64>| v.map_or("?".to_string(), bytes);
    let signed = |v: Option<i64>| v.map_or("?".into(), bytes_signed);
    format!(
        "device used {} of {} | PyTorch reserved {} (allocated {}) | outside the allocator {} | other processes and driver {}",
        opt(l.device_used_bytes),
        opt(l.device_total_bytes),
        bytes(l.reserved_bytes),
        bytes(l.allocated_bytes),
        signed(l.outside_allocator_bytes.or(l.gap_bytes)),
        signed(l.other_processes_bytes),
    )
}
