//! `summary`: per-device totals of segments, blocks and the trace, the layout guess,
//! allocator settings and warnings. Plain data; rendering is elsewhere.

use crate::input::SourceInfo;
use crate::model::frames::FxMap;
use crate::model::{Action, BlockState, DeviceTrace, SegmentType, Snapshot};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub schema_version: u32,
    pub source: SourceInfo,
    pub layout: Layout,
    pub devices: Vec<DeviceSummary>,
    /// Pinned host memory (PyTorch 2.14+), when the file has any.
    pub host: Option<HostSummary>,
    /// `allocator_settings` as written, keys sorted; null before PyTorch 2.3.
    pub allocator_settings: Option<BTreeMap<String, serde_json::Value>>,
    pub settings: Settings,
    pub external_annotations: usize,
    pub distinct_frames: usize,
    pub distinct_stacks: usize,
    pub warnings: Vec<Warning>,
}

/// Which PyTorch release the file's layout looks like (spec section 1.3).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Layout {
    /// "dict" or "list" (a bare list of segments).
    pub root: &'static str,
    /// Earliest release that writes every feature seen, such as "2.10".
    pub min_release: &'static str,
    /// Latest release consistent with what is missing, when that can be told.
    pub max_release: Option<&'static str>,
    /// The features the guess rests on.
    pub evidence: Vec<String>,
}

/// The allocator settings that matter for memory behaviour, decoded.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Settings {
    pub expandable_segments: Option<bool>,
    /// Bytes; null when unlimited (-1 in the file) or not recorded.
    pub max_split_size_bytes: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
    pub alloc_conf: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Warning {
    pub message: String,
    pub count: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PoolCount {
    pub pool_id: Option<(i64, i64)>,
    pub segments: usize,
    pub reserved_bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StreamCount {
    pub stream: u64,
    pub segments: usize,
    pub reserved_bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct DeviceSummary {
    pub device: i64,
    pub segments: usize,
    pub segments_large: usize,
    pub segments_small: usize,
    pub segments_expandable: usize,
    pub pools: Vec<PoolCount>,
    pub streams: Vec<StreamCount>,
    pub blocks: usize,
    pub blocks_by_state: BTreeMap<String, usize>,
    /// Σ segment `total_size`.
    pub reserved_bytes: u64,
    /// Σ size of `active_allocated` blocks.
    pub allocated_bytes: u64,
    /// Σ size of blocks whose state starts with `active_`.
    pub active_bytes: u64,
    /// Σ requested size of `active_allocated` blocks.
    pub requested_bytes: u64,
    /// Σ size of `active_pending_free` blocks (freed, waiting on other streams).
    pub pending_free_bytes: u64,
    /// Σ size of `inactive` blocks: cached free memory.
    pub free_block_bytes: u64,
    /// Σ (size − requested) of `active_allocated` blocks.
    pub rounding_waste_bytes: u64,
    /// Free memory inside segments: free blocks plus rounding waste.
    pub free_in_segments_bytes: u64,
    pub largest_free_block_bytes: u64,
    /// Maximum of the official viewer's Active Memory Timeline (spec 6.2).
    pub peak_allocated_bytes: u64,
    /// Trace index after which that peak is first reached (null: before the first event).
    pub peak_allocated_event: Option<u32>,
    pub peak_allocated_time_us: Option<i64>,
    /// Maximum reserved bytes over the trace, replayed from the final segments.
    pub peak_reserved_bytes: u64,
    pub peak_reserved_event: Option<u32>,
    pub trace: TraceSummary,
    pub ooms: Vec<OomEvent>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct TraceSummary {
    pub events: usize,
    pub actions: BTreeMap<String, u64>,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    /// Frees whose allocation is not in the trace.
    pub orphan_frees: u64,
    /// segment_free entries whose segment_alloc is not in the trace.
    pub orphan_segment_frees: u64,
    /// True when the trace cannot hold the whole history of the allocations it frees.
    pub looks_truncated: bool,
    pub truncation_evidence: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OomEvent {
    /// Index in the device's trace.
    pub index: usize,
    /// Rounded request size.
    pub size: u64,
    pub device_free: Option<u64>,
    pub stream: u64,
    pub time_us: Option<i64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HostSummary {
    pub segments: usize,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub trace: TraceSummary,
}

/// Summary options.
#[derive(Debug, Clone, Copy, Default)]
pub struct SummaryOptions {
    /// Only this device (all devices when None).
    pub device: Option<i64>,
}

/// Typical `max_entries` values users pick; a trace of exactly that length is a full ring.
fn is_round_capacity(n: usize) -> bool {
    if n < 1000 {
        return false;
    }
    let power_of_ten = {
        let mut x = n;
        while x.is_multiple_of(10) {
            x /= 10;
        }
        x == 1
    };
    power_of_ten || n.is_power_of_two() || n.is_multiple_of(100_000)
}

/// Counts actions, times, and frees whose allocation the trace does not contain.
pub fn summarize_trace(
    trace: &DeviceTrace,
    names: impl Fn(usize) -> Option<String>,
) -> TraceSummary {
    let mut counts = [0u64; 16];
    let mut other: BTreeMap<String, u64> = BTreeMap::new();
    let mut first_time_us = None;
    let mut last_time_us = None;
    // Block lifetimes by address: Some(false) = allocated, Some(true) = free requested.
    let mut live: FxMap<u64, bool> = FxMap::default();
    let mut segments: FxMap<u64, ()> = FxMap::default();
    let (mut orphan_frees, mut orphan_segment_frees) = (0u64, 0u64);
    for i in 0..trace.len() {
        let action = trace.action(i);
        counts[action as usize] += 1;
        if action == Action::Other
            && let Some(name) = names(i)
        {
            *other.entry(name).or_insert(0) += 1;
        }
        if let Some(t) = trace.time_us(i).filter(|&t| t > 0) {
            first_time_us.get_or_insert(t);
            last_time_us = Some(t);
        }
        match action {
            Action::Alloc => {
                live.insert(trace.get(i).addr, false);
            }
            Action::FreeRequested => {
                let addr = trace.get(i).addr;
                if live.insert(addr, true).is_none() {
                    orphan_frees += 1;
                }
            }
            // A completion pairs with its request, or (if the request was dropped) its
            // allocation; with neither in the trace, the allocation predates it.
            Action::FreeCompleted if live.remove(&trace.get(i).addr).is_none() => {
                orphan_frees += 1;
            }
            Action::SegmentAlloc => {
                segments.insert(trace.get(i).addr, ());
            }
            Action::SegmentFree if segments.remove(&trace.get(i).addr).is_none() => {
                orphan_segment_frees += 1;
            }
            _ => {}
        }
    }
    let mut actions: BTreeMap<String, u64> = Action::KNOWN
        .iter()
        .filter(|a| counts[**a as usize] > 0)
        .map(|a| (a.name().to_string(), counts[*a as usize]))
        .collect();
    for (name, n) in other {
        *actions.entry(name).or_insert(0) += n;
    }
    let mut evidence = Vec::new();
    if orphan_frees > 0 {
        evidence.push(format!(
            "{orphan_frees} free(s) of allocations not in the trace (allocated before recording started, or dropped from the ring buffer)"
        ));
    }
    if orphan_segment_frees > 0 {
        evidence.push(format!(
            "{orphan_segment_frees} segment_free(s) of segments not in the trace"
        ));
    }
    if is_round_capacity(trace.len()) {
        evidence.push(format!(
            "the trace holds exactly {} entries, a typical max_entries: the ring buffer is probably full",
            trace.len()
        ));
    }
    TraceSummary {
        events: trace.len(),
        actions,
        first_time_us,
        last_time_us,
        orphan_frees,
        orphan_segment_frees,
        looks_truncated: !evidence.is_empty(),
        truncation_evidence: evidence,
    }
}

fn release_key(release: &str) -> (u32, u32) {
    let mut parts = release.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

fn layout(snap: &Snapshot) -> Layout {
    let f = &snap.features;
    let e = &f.entries;
    let has_entries = snap.device_traces.iter().any(|t| !t.is_empty());
    let mut evidence = Vec::new();
    let mut min = "2.0";
    let mut max = None;
    if f.root_is_list {
        evidence.push(
            "the root is a bare list of segments (1.13, or memory_snapshot() of any release)"
                .into(),
        );
        min = "1.13";
    } else if f.block_history && !f.block_frames {
        evidence.push("blocks carry history".into());
        if !f.segment_requested_size {
            min = "1.13";
        }
        max = Some("2.0");
    } else {
        // (release, present?, what)
        let steps: [(&'static str, bool, &str); 11] = [
            (
                "2.1",
                f.segment_pool_id || f.block_frames,
                "segment_pool_id / block frames",
            ),
            ("2.2", e.time_us, "time_us in trace entries"),
            ("2.3", f.allocator_settings, "allocator_settings"),
            ("2.5", f.external_annotations, "external_annotations"),
            ("2.8", e.compile_context, "compile_context in trace entries"),
            (
                "2.9",
                f.graph_capture_record_stream_reuse,
                "graph_capture_record_stream_reuse setting",
            ),
            ("2.10", e.user_metadata, "user_metadata in trace entries"),
            (
                "2.11",
                e.forward_frames || f.forward_frames,
                "forward_frames",
            ),
            ("2.12", e.pool_id, "pool_id in trace entries"),
            ("2.14", f.host_segments, "host_segments"),
            (
                "2.15",
                e.internal_metadata,
                "internal_metadata in trace entries",
            ),
        ];
        for (release, present, what) in steps {
            if present {
                min = release;
                evidence.push(what.to_string());
            }
        }
        // Keys written by every release from some point on bound the release from above
        // when they are missing (unless a later feature contradicts it).
        let bounds: [(bool, &'static str); 4] = [
            (has_entries && !e.time_us, "2.1"),
            (!f.allocator_settings, "2.2"),
            (!f.external_annotations, "2.4"),
            (!f.host_segments, "2.13"),
        ];
        max = bounds
            .into_iter()
            .find(|(missing, bound)| *missing && release_key(min) <= release_key(bound))
            .map(|(_, bound)| bound);
        if e.cpp_frames {
            evidence.push("cpp_frames strings".into());
        }
    }
    Layout {
        root: if f.root_is_list { "list" } else { "dict" },
        min_release: min,
        max_release: max,
        evidence,
    }
}

fn settings(snap: &Snapshot) -> Settings {
    let mut s = Settings {
        expandable_segments: snap
            .setting("expandable_segments")
            .and_then(|v| v.as_bool()),
        max_split_size_bytes: snap
            .setting("max_split_size")
            .and_then(|v| v.as_i64())
            .and_then(|v| u64::try_from(v).ok()),
        garbage_collection_threshold: snap
            .setting("garbage_collection_threshold")
            .and_then(|v| v.as_f64()),
        alloc_conf: snap
            .setting("PYTORCH_CUDA_ALLOC_CONF")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    };
    // The unsigned SIZE_MAX default also appears as a huge positive value.
    if s.max_split_size_bytes == Some(u64::MAX) || s.max_split_size_bytes == Some(i64::MAX as u64) {
        s.max_split_size_bytes = None;
    }
    s
}

fn device_summary(snap: &Snapshot, device: i64) -> DeviceSummary {
    let mut d = DeviceSummary {
        device,
        ..Default::default()
    };
    let mut pools: BTreeMap<Option<(i64, i64)>, (usize, u64)> = BTreeMap::new();
    let mut streams: BTreeMap<u64, (usize, u64)> = BTreeMap::new();
    for s in snap.segments_of(device) {
        d.segments += 1;
        match s.segment_type {
            SegmentType::Large => d.segments_large += 1,
            SegmentType::Small => d.segments_small += 1,
            SegmentType::Other => {}
        }
        d.segments_expandable += s.is_expandable as usize;
        d.reserved_bytes += s.total_size;
        let p = pools.entry(s.pool_id).or_default();
        p.0 += 1;
        p.1 += s.total_size;
        let st = streams.entry(s.stream).or_default();
        st.0 += 1;
        st.1 += s.total_size;
        for b in &s.blocks {
            d.blocks += 1;
            let state = match b.state {
                BlockState::ActiveAllocated => "active_allocated",
                BlockState::ActivePendingFree => "active_pending_free",
                BlockState::Inactive => "inactive",
                BlockState::Other(name) => snap.frames.str(name),
            };
            *d.blocks_by_state.entry(state.to_string()).or_insert(0) += 1;
            if b.state.is_active() {
                d.active_bytes += b.size;
            }
            match b.state {
                BlockState::ActiveAllocated => {
                    d.allocated_bytes += b.size;
                    d.requested_bytes += b.requested_size;
                    d.rounding_waste_bytes += b.size.saturating_sub(b.requested_size);
                }
                BlockState::ActivePendingFree => d.pending_free_bytes += b.size,
                BlockState::Inactive => {
                    d.free_block_bytes += b.size;
                    d.largest_free_block_bytes = d.largest_free_block_bytes.max(b.size);
                }
                BlockState::Other(_) => {}
            }
        }
    }
    d.free_in_segments_bytes = d.free_block_bytes + d.rounding_waste_bytes;
    d.pools = pools
        .into_iter()
        .map(|(pool_id, (segments, reserved_bytes))| PoolCount {
            pool_id,
            segments,
            reserved_bytes,
        })
        .collect();
    d.streams = streams
        .into_iter()
        .map(|(stream, (segments, reserved_bytes))| StreamCount {
            stream,
            segments,
            reserved_bytes,
        })
        .collect();
    let peaks = crate::timeline::peaks(snap, device);
    d.peak_allocated_bytes = peaks.allocated.bytes;
    d.peak_allocated_event = peaks.allocated.event.map(|e| e.index() as u32);
    d.peak_allocated_time_us = peaks.allocated.time_us;
    d.peak_reserved_bytes = peaks.reserved.bytes;
    d.peak_reserved_event = peaks.reserved.event.map(|e| e.index() as u32);
    if let Some(trace) = snap.trace(device) {
        d.trace = summarize_trace(trace, |i| {
            trace
                .other_action(i)
                .map(|s| snap.frames.str(s).to_string())
        });
        for i in 0..trace.len() {
            if trace.action(i) == Action::Oom {
                let e = trace.get(i);
                d.ooms.push(OomEvent {
                    index: i,
                    size: e.size,
                    device_free: e.device_free(),
                    stream: e.stream,
                    time_us: e.time_us,
                });
            }
        }
    }
    d
}

/// Builds the summary of one snapshot; devices are summarised in parallel.
pub fn analyze_summary(snap: &Snapshot, source: &SourceInfo, options: SummaryOptions) -> Summary {
    let devices: Vec<i64> = snap
        .devices()
        .into_iter()
        .filter(|d| options.device.is_none_or(|want| want == *d))
        .collect();
    let devices: Vec<DeviceSummary> = devices
        .par_iter()
        .map(|&d| device_summary(snap, d))
        .collect();
    let host = (!snap.host_segments.is_empty() || !snap.host_trace.is_empty()).then(|| {
        let mut reserved_bytes = 0;
        let mut allocated_bytes = 0;
        for s in &snap.host_segments {
            reserved_bytes += s.total_size;
            allocated_bytes += s
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::ActiveAllocated)
                .map(|b| b.size)
                .sum::<u64>();
        }
        HostSummary {
            segments: snap.host_segments.len(),
            reserved_bytes,
            allocated_bytes,
            trace: summarize_trace(&snap.host_trace, |i| {
                snap.host_trace
                    .other_action(i)
                    .map(|s| snap.frames.str(s).to_string())
            }),
        }
    });
    Summary {
        schema_version: SCHEMA_VERSION,
        source: source.clone(),
        layout: layout(snap),
        devices,
        host,
        allocator_settings: snap.allocator_settings.clone(),
        settings: settings(snap),
        external_annotations: snap.external_annotations.len(),
        distinct_frames: snap.frames.frame_count(),
        distinct_stacks: snap.frames.stack_count(),
        warnings: snap
            .warnings
            .0
            .iter()
            .map(|(message, &count)| Warning {
                message: message.clone(),
                count,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_capacities() {
        assert!(is_round_capacity(100_000));
        assert!(is_round_capacity(1_000_000));
        assert!(is_round_capacity(65_536));
        assert!(is_round_capacity(300_000));
        assert!(!is_round_capacity(19_052));
        assert!(!is_round_capacity(512));
    }
}
