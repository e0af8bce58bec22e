//! OOM post-mortem: for each `oom` event (or the final state of a snapshot dumped at an
//! OOM without one), the request, what the device and the allocator had at that moment,
//! what was live, and verdicts with their evidence and the knobs that apply.

use super::frames::{headline_frame, user_frames};
use crate::model::{Action, Snapshot};
use crate::oom_log::OomMessage;
use crate::timeline::state::allocator_state;
use crate::timeline::{self, DeviceTimeline};
use crate::units::bytes;
use serde::Serialize;
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: u32 = 1;

/// Live allocations need at least this share of what the device could give PyTorch for
/// the OOM to count as a capacity problem even when the request alone would have fit.
const NEAR_FULL: f64 = 0.85;
/// Memory outside the allocator worth a verdict: this many bytes or this share of the device.
const OUTSIDE_BYTES: u64 = 1 << 30;
const OUTSIDE_SHARE: f64 = 0.05;

#[derive(Debug, Clone, Copy, Default)]
pub struct OomOptions {
    /// Device memory in bytes (e.g. from `--device-total 40GiB`).
    pub device_total_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Capacity,
    Fragmentation,
    OutsideAllocator,
    PrivatePools,
    PendingFrees,
    MemoryFractionCap,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Verdict {
    pub kind: VerdictKind,
    pub summary: String,
    pub evidence: Vec<String>,
    /// Settings and changes that apply; none that the snapshot shows already on.
    pub knobs: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PoolFree {
    pub pool_id: Option<(i64, i64)>,
    pub stream: u64,
    pub segments: usize,
    pub reserved_bytes: u64,
    pub free_bytes: u64,
    pub largest_hole_bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StackUse {
    pub frame: String,
    pub bytes: u64,
    pub allocations: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OomAnalysis {
    pub device: i64,
    /// "oom_event", or "final_state" for a snapshot without an `oom` entry.
    pub source: &'static str,
    pub event: Option<u32>,
    pub time_us: Option<i64>,
    /// Rounded request size (what the allocator looked for); null when unknown (a
    /// snapshot without an `oom` entry and no log).
    pub requested_bytes: Option<u64>,
    pub stream: u64,
    pub frames: Vec<String>,
    /// What `cudaMemGetInfo` reported when the allocation failed.
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    pub device_total_source: Option<String>,
    /// A per-process limit from the OOM message ("X allowed"), when it names one.
    pub allowed_bytes: Option<u64>,
    pub reserved_bytes: u64,
    /// Requested bytes of live allocations (the official viewer's count).
    pub allocated_bytes: u64,
    /// Bytes of the blocks in segments (live allocations, pending frees included).
    pub active_bytes: u64,
    /// Free memory inside segments (reserved − active).
    pub cached_free_bytes: u64,
    /// Of the live block bytes, what rounding added to the requests.
    pub rounding_waste_bytes: u64,
    pub pending_free_bytes: u64,
    pub largest_hole_bytes: u64,
    /// Largest hole in segments of the request's stream.
    pub largest_hole_same_stream_bytes: u64,
    pub free_by_pool: Vec<PoolFree>,
    /// Device total − device free − reserved, when the total is known.
    pub outside_allocator_bytes: Option<u64>,
    pub top_stacks: Vec<StackUse>,
    pub verdicts: Vec<Verdict>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OomReport {
    pub schema_version: u32,
    pub path: Option<String>,
    pub analyses: Vec<OomAnalysis>,
    /// OOM messages found in the log given with `--log`.
    pub messages: Vec<OomMessage>,
    pub notes: Vec<String>,
}

/// The snapshot's allocator settings, as far as knobs go.
struct Settings {
    expandable: bool,
    max_split_set: bool,
    gc_threshold_set: bool,
}

fn settings(snap: &Snapshot) -> Settings {
    let conf = snap
        .setting("PYTORCH_CUDA_ALLOC_CONF")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    Settings {
        expandable: snap
            .setting("expandable_segments")
            .and_then(|v| v.as_bool())
            == Some(true)
            || conf.contains("expandable_segments:True")
            || snap.segments.iter().any(|s| s.is_expandable),
        max_split_set: snap
            .setting("max_split_size")
            .and_then(|v| v.as_i64())
            .is_some_and(|v| v > 0 && v < i64::MAX)
            || conf.contains("max_split_size_mb"),
        gc_threshold_set: snap
            .setting("garbage_collection_threshold")
            .and_then(|v| v.as_f64())
            .is_some_and(|v| v > 0.0)
            || conf.contains("garbage_collection_threshold"),
    }
}

fn pct(part: u64, whole: u64) -> String {
    crate::units::percent(part, whole)
}

/// Analyses one moment of one device.
#[allow(clippy::too_many_arguments)]
fn analyze_at(
    snap: &Snapshot,
    tl: &DeviceTimeline,
    at: Option<usize>,
    source: &'static str,
    requested: Option<u64>,
    stream: u64,
    stack: Option<crate::model::StackId>,
    device_free: Option<u64>,
    total: Option<(u64, String)>,
    allowed: Option<u64>,
) -> OomAnalysis {
    let state = allocator_state(snap, tl.device, at);
    let reserved: u64 = state.iter().map(|s| s.size).sum();
    let block_bytes: u64 = state.iter().flat_map(|s| &s.blocks).map(|b| b.size).sum();
    let pending: u64 = state
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.pending_free)
        .map(|b| b.size)
        .sum();
    let allocated = tl.allocated_at(at);
    let active = block_bytes;
    let mut pools: BTreeMap<(Option<(i64, i64)>, u64), PoolFree> = BTreeMap::new();
    let (mut largest, mut largest_same) = (0u64, 0u64);
    for s in &state {
        let holes = s.holes();
        let free: u64 = holes.iter().map(|h| h.1).sum();
        let big = holes.iter().map(|h| h.1).max().unwrap_or(0);
        largest = largest.max(big);
        if s.stream == stream {
            largest_same = largest_same.max(big);
        }
        let p = pools.entry((s.pool_id, s.stream)).or_insert(PoolFree {
            pool_id: s.pool_id,
            stream: s.stream,
            segments: 0,
            reserved_bytes: 0,
            free_bytes: 0,
            largest_hole_bytes: 0,
        });
        p.segments += 1;
        p.reserved_bytes += s.size;
        p.free_bytes += free;
        p.largest_hole_bytes = p.largest_hole_bytes.max(big);
    }
    // Who holds the memory: live allocations grouped by their headline frame.
    let mut by_frame: BTreeMap<String, (u64, usize)> = BTreeMap::new();
    for l in tl.live_at(at) {
        let key =
            headline_frame(&snap.frames, l.stack()).unwrap_or_else(|| "(no stack recorded)".into());
        let e = by_frame.entry(key).or_default();
        e.0 += l.size;
        e.1 += 1;
    }
    let mut top_stacks: Vec<StackUse> = by_frame
        .into_iter()
        .map(|(frame, (bytes, allocations))| StackUse {
            frame,
            bytes,
            allocations,
        })
        .collect();
    top_stacks.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.frame.cmp(&b.frame)));
    top_stacks.truncate(10);

    let cached_free = reserved.saturating_sub(block_bytes);
    let (total_bytes, total_source) = match total {
        Some((t, src)) => (Some(t), Some(src)),
        None => (None, None),
    };
    let outside = match (total_bytes, device_free) {
        (Some(t), Some(f)) => Some(t.saturating_sub(f).saturating_sub(reserved)),
        _ => None,
    };
    let mut a = OomAnalysis {
        device: tl.device,
        source,
        event: at.map(|i| i as u32),
        time_us: at.and_then(|i| tl.time_us(i)),
        requested_bytes: requested,
        stream,
        frames: user_frames(&snap.frames, stack, 6),
        device_free_bytes: device_free,
        device_total_bytes: total_bytes,
        device_total_source: total_source,
        allowed_bytes: allowed,
        reserved_bytes: reserved,
        allocated_bytes: allocated,
        active_bytes: active,
        cached_free_bytes: cached_free,
        rounding_waste_bytes: active.saturating_sub(allocated),
        pending_free_bytes: pending,
        largest_hole_bytes: largest,
        largest_hole_same_stream_bytes: largest_same,
        free_by_pool: pools.into_values().collect(),
        outside_allocator_bytes: outside,
        top_stacks,
        verdicts: Vec::new(),
    };
    a.verdicts = verdicts(&a, &settings(snap));
    a
}

fn verdicts(a: &OomAnalysis, s: &Settings) -> Vec<Verdict> {
    let mut out = Vec::new();
    let free = a.device_free_bytes.unwrap_or(0);
    let request = a.requested_bytes.unwrap_or(0);
    let free_known = if a.device_free_bytes.is_some() {
        String::new()
    } else {
        " (the device's free memory is unknown: give --log with the OOM message)".to_string()
    };
    // What PyTorch could have used: everything it reserved plus what the device had free,
    // or less under a per-process limit.
    let available = match a.allowed_bytes {
        Some(cap) => (a.reserved_bytes + free).min(cap.max(a.reserved_bytes)),
        None => a.reserved_bytes + free,
    };
    let live = a.reserved_bytes.saturating_sub(a.cached_free_bytes);
    let need = live + request;
    let near_full = live as f64 >= NEAR_FULL * available as f64;
    if need > available || near_full {
        let mut knobs = vec![
            "reduce what is live at this point: smaller batch or sequence length".to_string(),
            "activation checkpointing for the layers whose activations dominate the live set".to_string(),
            "lower precision (bf16/fp16 weights, activations or optimizer state) or sharding (FSDP/ZeRO) or CPU offload".to_string(),
        ];
        if need > available {
            knobs.push(
                "empty_cache() or allocator settings cannot help: the memory is in use".into(),
            );
        }
        out.push(Verdict {
            kind: VerdictKind::Capacity,
            summary: if need > available {
                format!(
                    "capacity: live allocations ({}) plus the request ({}) exceed what the device could give PyTorch ({})",
                    bytes(live),
                    bytes(request),
                    bytes(available)
                )
            } else {
                format!(
                    "capacity: live allocations ({}) fill {} of what the device could give PyTorch ({}){free_known}",
                    bytes(live),
                    pct(live, available),
                    bytes(available)
                )
            },
            evidence: vec![
                format!(
                    "reserved {} = live {} + cached free {}; the device had {} free{}",
                    bytes(a.reserved_bytes),
                    bytes(live),
                    bytes(a.cached_free_bytes),
                    bytes(free),
                    a.allowed_bytes
                        .map(|c| format!("; the process may use {}", bytes(c)))
                        .unwrap_or_default()
                ),
                match a.requested_bytes {
                    Some(r) => format!("requested {}", bytes(r)),
                    None => "the request is unknown (no oom event; give --log with the OOM message)".into(),
                },
            ],
            knobs,
        });
    }
    let could_fit_if_contiguous = a.cached_free_bytes + free >= request;
    if a.requested_bytes.is_some()
        && request > free
        && request > a.largest_hole_same_stream_bytes
        && could_fit_if_contiguous
        && a.cached_free_bytes > 0
    {
        let mut knobs = Vec::new();
        if !s.expandable {
            knobs.push("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of leaving holes)".to_string());
        }
        if !s.max_split_set {
            knobs.push("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<size> (keeps large blocks from being split for small ones)".to_string());
        }
        if !s.gc_threshold_set {
            knobs.push("PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8 (returns cached blocks before the device fills)".to_string());
        }
        knobs
            .push("torch.cuda.empty_cache() between phases with different allocation sizes".into());
        out.push(Verdict {
            kind: VerdictKind::Fragmentation,
            summary: format!(
                "fragmentation: {} free inside segments plus {} free on the device would cover the request ({}), but the largest hole is {}",
                bytes(a.cached_free_bytes),
                bytes(free),
                bytes(request),
                bytes(a.largest_hole_same_stream_bytes)
            ),
            evidence: vec![
                format!(
                    "free inside segments: {} in holes; rounding waste of live blocks: {}",
                    bytes(a.cached_free_bytes),
                    bytes(a.rounding_waste_bytes)
                ),
                format!(
                    "largest hole on the request's stream {}, on any stream {}",
                    bytes(a.largest_hole_same_stream_bytes),
                    bytes(a.largest_hole_bytes)
                ),
            ],
            knobs,
        });
    }
    if let (Some(outside), Some(total)) = (a.outside_allocator_bytes, a.device_total_bytes)
        && (outside >= OUTSIDE_BYTES || outside as f64 >= OUTSIDE_SHARE * total as f64)
    {
        out.push(Verdict {
            kind: VerdictKind::OutsideAllocator,
            summary: format!(
                "memory outside the caching allocator or in other processes: {} ({} of the device)",
                bytes(outside),
                pct(outside, total)
            ),
            evidence: vec![format!(
                "device total {} − free {} − reserved by PyTorch {} = {}",
                bytes(total),
                bytes(free),
                bytes(a.reserved_bytes),
                bytes(outside)
            )],
            knobs: vec![
                "check other processes on the GPU (nvidia-smi --query-compute-apps=pid,used_memory --format=csv)".into(),
                "the CUDA context takes a few hundred MB per process; NCCL buffers grow with communicators (NCCL_BUFFSIZE, fewer process groups)".into(),
                "libraries allocating outside PyTorch (cuBLASLt/cuDNN workspaces of extensions, TensorRT, Triton autotuning) show up here".into(),
            ],
        });
    }
    let private: Vec<&PoolFree> = a
        .free_by_pool
        .iter()
        .filter(|p| p.pool_id.is_some_and(|id| id != (0, 0)))
        .collect();
    let private_free: u64 = private.iter().map(|p| p.free_bytes).sum();
    if private_free > 0
        && (private_free >= request || private_free as f64 >= 0.1 * a.reserved_bytes as f64)
    {
        let private_reserved: u64 = private.iter().map(|p| p.reserved_bytes).sum();
        out.push(Verdict {
            kind: VerdictKind::PrivatePools,
            summary: format!(
                "private pools (CUDA graphs, MemPool) hold {} reserved, {} of it free and unusable by other allocations",
                bytes(private_reserved),
                bytes(private_free)
            ),
            evidence: private
                .iter()
                .map(|p| {
                    let (x, y) = p.pool_id.unwrap_or((0, 0));
                    format!(
                        "pool ({x}, {y}): {} segments, {} reserved, {} free",
                        p.segments,
                        bytes(p.reserved_bytes),
                        bytes(p.free_bytes)
                    )
                })
                .collect(),
            knobs: vec![
                "release CUDA graphs that are no longer replayed, or capture them into a shared pool".into(),
            ],
        });
    }
    if a.pending_free_bytes > 0
        && (a.pending_free_bytes >= request / 4 || a.pending_free_bytes >= 256 << 20)
    {
        out.push(Verdict {
            kind: VerdictKind::PendingFrees,
            summary: format!(
                "frees waiting for other streams hold {} (record_stream or cross-stream use)",
                bytes(a.pending_free_bytes)
            ),
            evidence: vec![format!("{} in blocks freed but not yet reusable", bytes(a.pending_free_bytes))],
            knobs: vec![
                "avoid Tensor.record_stream on large tensors; synchronize the side stream before freeing".into(),
            ],
        });
    }
    if let (Some(free), Some(request)) = (a.device_free_bytes, a.requested_bytes)
        && free >= request
    {
        out.push(Verdict {
            kind: VerdictKind::MemoryFractionCap,
            summary: match a.allowed_bytes {
                Some(cap) => format!(
                    "a per-process cap of {} refused the request ({}) although the device had {} free",
                    bytes(cap),
                    bytes(request),
                    bytes(free)
                ),
                None => format!(
                    "the device reported {} free, enough for the request ({}): a per-process cap refused it",
                    bytes(free),
                    bytes(request)
                ),
            },
            evidence: vec!["cudaMalloc is only refused with free memory when a limit applies".into()],
            knobs: vec![
                "check torch.cuda.set_per_process_memory_fraction and PYTORCH_CUDA_ALLOC_CONF limits".into(),
            ],
        });
    }
    out
}

/// The log message about a GPU: the first naming it, else the first one.
fn message_for(messages: &[OomMessage], device: i64) -> Option<&OomMessage> {
    messages
        .iter()
        .find(|m| m.gpu == Some(device))
        .or(messages.first())
}

/// The device total for a device: the option, else the first log message about that GPU.
fn device_total(
    options: OomOptions,
    messages: &[OomMessage],
    device: i64,
) -> Option<(u64, String)> {
    if let Some(t) = options.device_total_bytes {
        return Some((t, "--device-total".into()));
    }
    messages
        .iter()
        .find(|m| m.gpu == Some(device) && m.total_capacity_bytes.is_some())
        .or_else(|| messages.iter().find(|m| m.total_capacity_bytes.is_some()))
        .and_then(|m| {
            Some((
                m.total_capacity_bytes?,
                format!("OOM message on log line {}", m.line),
            ))
        })
}

/// Analyses every `oom` event of a snapshot (all devices, or one).
pub fn analyze_oom(
    snap: &Snapshot,
    path: &str,
    device: Option<i64>,
    messages: Vec<OomMessage>,
    options: OomOptions,
) -> OomReport {
    let mut analyses = Vec::new();
    let mut notes = Vec::new();
    let devices: Vec<i64> = snap
        .devices()
        .into_iter()
        .filter(|d| device.is_none_or(|w| w == *d))
        .collect();
    for &d in &devices {
        let Some(trace) = snap.trace(d) else { continue };
        let ooms: Vec<usize> = (0..trace.len())
            .filter(|&i| trace.action(i) == Action::Oom)
            .collect();
        if ooms.is_empty() {
            continue;
        }
        let tl = timeline::build(snap, d);
        for i in ooms {
            let e = trace.get(i);
            analyses.push(analyze_at(
                snap,
                &tl,
                Some(i),
                "oom_event",
                Some(e.size),
                e.stream,
                e.stack,
                e.device_free(),
                device_total(options, &messages, d),
                message_for(&messages, d).and_then(|m| m.allowed_bytes),
            ));
        }
    }
    if analyses.is_empty() {
        // A snapshot dumped at an OOM without an oom entry: analyse the final state,
        // with the request from the log when there is one.
        let d = devices
            .iter()
            .copied()
            .max_by_key(|&d| snap.segments_of(d).map(|s| s.total_size).sum::<u64>());
        if let Some(d) = d {
            let message = messages
                .iter()
                .find(|m| m.gpu == Some(d))
                .or(messages.first());
            let tl = timeline::build(snap, d);
            let last = tl.allocated.len().checked_sub(1);
            notes.push(format!(
                "no oom event in the trace of device {d}: analysed from the final state{}",
                if message.is_some() {
                    ", with the request from the log"
                } else {
                    ""
                }
            ));
            let requested = message.and_then(|m| m.requested_bytes);
            analyses.push(analyze_at(
                snap,
                &tl,
                last,
                "final_state",
                requested,
                0,
                None,
                message.and_then(|m| m.free_bytes),
                device_total(options, &messages, d),
                message.and_then(|m| m.allowed_bytes),
            ));
        }
    }
    OomReport {
        schema_version: SCHEMA_VERSION,
        path: Some(path.to_string()),
        analyses,
        messages,
        notes,
    }
}

/// Verdicts from an OOM message alone (no snapshot): what its figures show.
pub fn message_verdicts(m: &OomMessage) -> Vec<String> {
    let mut out = Vec::new();
    let (Some(request), Some(total)) = (m.requested_bytes, m.total_capacity_bytes) else {
        return out;
    };
    let free = m.free_bytes.unwrap_or(0);
    let reserved = m.reserved_by_pytorch_bytes.unwrap_or(0);
    let allocated = m.allocated_by_pytorch_bytes.unwrap_or(0);
    let unallocated = reserved.saturating_sub(allocated);
    if allocated as f64 >= NEAR_FULL * (reserved + free) as f64
        || allocated + request > reserved + free
    {
        out.push(format!(
            "capacity: PyTorch had {} allocated of the {} it could use (reserved {} + free {})",
            bytes(allocated),
            bytes(reserved + free),
            bytes(reserved),
            bytes(free)
        ));
    }
    if unallocated + free >= request && request > free && unallocated > 0 {
        out.push(format!(
            "fragmentation: {} reserved but unallocated plus {} free would cover the {} request, but no block fit",
            bytes(unallocated),
            bytes(free),
            bytes(request)
        ));
    }
    let outside = total.saturating_sub(free).saturating_sub(reserved);
    if outside >= OUTSIDE_BYTES || outside as f64 >= OUTSIDE_SHARE * total as f64 {
        out.push(format!(
            "memory outside PyTorch's allocator or in other processes: {} (total {} − free {} − reserved {})",
            bytes(outside),
            bytes(total),
            bytes(free),
            bytes(reserved)
        ));
    }
    out
}
