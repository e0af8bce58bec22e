//! `summary`: per-device totals of segments, blocks and the trace, the layout guess,
//! allocator settings and warnings. Plain data; rendering is elsewhere.

use crate::input::SourceInfo;
use crate::model::frames::FxMap;
use crate::model::{Action, BlockState, DeviceTrace, SegmentType, Snapshot};
use crate::timeline::replay::{Aggregator, DeviceReplay, Peaks, Running};
use crate::timeline::{Lifetime, Origin};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;

pub use crate::model::layout::{Layout, LayoutEvidence};

pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub schema_version: u32,
    pub source: SourceInfo,
    /// True for a profiler output read as a snapshot: its segments are made up from the
    /// trace's reserved totals, and `layout` says nothing about a release.
    pub converted: bool,
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
    /// Written as a list of `{message, count}` ordered by message (`render::words::warnings`).
    pub warnings: crate::model::Warnings,
    /// How the file's times read (for the text: dates, or offsets from the first event).
    #[serde(skip)]
    pub clock: crate::units::Clock,
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
    /// Maximum of requested bytes over the trace: the official viewer's Active Memory
    /// Timeline (spec 6.2). Null, as every peak, when the file has no trace.
    pub peak_requested_bytes: Option<u64>,
    /// Trace index after which that peak is first reached (null: before the first event).
    pub peak_requested_event: Option<u32>,
    pub peak_requested_time_us: Option<i64>,
    /// Maximum of allocated block bytes (requests rounded up to 512 bytes, held until
    /// the free completes): what `torch.cuda.max_memory_allocated()` reports.
    pub peak_allocated_bytes: Option<u64>,
    pub peak_allocated_event: Option<u32>,
    pub peak_allocated_time_us: Option<i64>,
    /// Whether the file records reserved memory: false for a profiler trace without
    /// `Total Reserved`, whose peak reserved is then null and whose `reserved_bytes`
    /// stand for the allocated memory only.
    pub reserved_recorded: bool,
    /// Maximum reserved bytes over the trace, replayed from the final segments.
    pub peak_reserved_bytes: Option<u64>,
    pub peak_reserved_event: Option<u32>,
    pub peak_reserved_time_us: Option<i64>,
    pub trace: TraceSummary,
    pub ooms: Vec<OomEvent>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct TraceSummary {
    pub events: usize,
    /// Whether the trace shows memory over time (see [`crate::timeline::coverage`]): false
    /// with no events, or too few to change memory, and then every peak is null.
    pub has_timeline: bool,
    pub actions: BTreeMap<String, u64>,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    /// Frees whose allocation is not in the trace.
    pub orphan_frees: u64,
    /// segment_free entries whose segment_alloc is not in the trace.
    pub orphan_segment_frees: u64,
    /// True when the trace cannot hold the whole history of the allocations it frees.
    pub looks_truncated: bool,
    /// Frees were paired with allocations by size (a profiler trace without addresses).
    pub frees_paired_by_size: bool,
    pub truncation_evidence: Vec<TruncationEvidence>,
    /// Allocations the trace leaves alive that the file's final state holds free: the
    /// trace lost their frees, or the recording stopped before them.
    pub freed_after_trace: u64,
    pub freed_after_trace_bytes: u64,
    /// The recording began mid-run: blocks alive before its first event (freed in it, or
    /// still alive at the end) and their requested bytes.
    pub alive_before_recording: u64,
    pub alive_before_recording_bytes: u64,
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

/// Counts actions, times, OOM events, and frees whose allocation the trace does not
/// contain, from the replay.
struct TraceStats<'a> {
    replay: &'a DeviceReplay<'a>,
    trace: &'a DeviceTrace,
    freed_after_trace: (u64, u64),
    survivors: u64,
    before_bytes: u64,
    counts: [u64; 16],
    other_events: Vec<usize>,
    orphan_frees: u64,
    /// addresses of segments allocated in the trace
    segments: FxMap<u64, ()>,
    orphan_segment_frees: u64,
    ooms: Vec<usize>,
}

impl Aggregator for TraceStats<'_> {
    fn free_completed(&mut self, _i: usize, l: &Lifetime, _run: &Running) {
        if l.origin == Origin::BeforeTrace {
            self.orphan_frees += 1;
        }
    }
    fn segment(&mut self, i: usize, action: Action, _delta: i64, _run: &Running) {
        match action {
            Action::SegmentAlloc => {
                self.segments.insert(self.trace.get(i).addr, ());
            }
            Action::SegmentFree if self.segments.remove(&self.trace.get(i).addr).is_none() => {
                self.orphan_segment_frees += 1;
            }
            _ => {}
        }
    }
    fn finish(&mut self, end: &crate::timeline::replay::End) {
        self.survivors = end.survivors.len() as u64;
        self.before_bytes = end.start.requested;
        for l in end.open {
            if self.replay.freed_after_trace(l) {
                self.freed_after_trace.0 += 1;
                self.freed_after_trace.1 += l.size;
            }
        }
    }
    fn event(&mut self, i: usize, action: Action, _run: &Running) {
        self.counts[action as usize] += 1;
        match action {
            Action::Other => self.other_events.push(i),
            Action::Oom => self.ooms.push(i),
            _ => {}
        }
    }
}

impl<'a> TraceStats<'a> {
    fn new(replay: &'a DeviceReplay<'a>, trace: &'a DeviceTrace) -> Self {
        TraceStats {
            replay,
            trace,
            freed_after_trace: (0, 0),
            survivors: 0,
            before_bytes: 0,
            counts: [0; 16],
            other_events: Vec::new(),
            orphan_frees: 0,
            segments: FxMap::default(),
            orphan_segment_frees: 0,
            ooms: Vec::new(),
        }
    }

    fn summary(&self, trace: &DeviceTrace, snap: &Snapshot) -> TraceSummary {
        let mut actions: BTreeMap<String, u64> = Action::KNOWN
            .iter()
            .filter(|a| self.counts[**a as usize] > 0)
            .map(|a| (a.name().to_string(), self.counts[*a as usize]))
            .collect();
        for &i in &self.other_events {
            let name = trace
                .other_action(i)
                .map_or("other", |s| snap.frames.str(s))
                .to_string();
            *actions.entry(name).or_insert(0) += 1;
        }
        let mut evidence = Vec::new();
        if self.orphan_frees > 0 {
            evidence.push(TruncationEvidence::OrphanFrees(self.orphan_frees));
        }
        if self.orphan_segment_frees > 0 {
            evidence.push(TruncationEvidence::OrphanSegmentFrees(
                self.orphan_segment_frees,
            ));
        }
        if is_round_capacity(trace.len()) {
            evidence.push(TruncationEvidence::RoundLength(trace.len()));
        }
        // Without a trace nothing was recorded: nothing began mid-run.
        let (alive_before_recording, alive_before_recording_bytes) = if trace.is_empty() {
            (0, 0)
        } else {
            (self.orphan_frees + self.survivors, self.before_bytes)
        };
        TraceSummary {
            events: trace.len(),
            has_timeline: crate::timeline::coverage::has_timeline(trace),
            actions,
            first_time_us: trace.first_stamped_time(),
            last_time_us: (0..trace.len()).rev().find_map(|i| trace.stamped_time(i)),
            orphan_frees: self.orphan_frees,
            orphan_segment_frees: self.orphan_segment_frees,
            looks_truncated: !evidence.is_empty(),
            truncation_evidence: evidence,
            frees_paired_by_size: false,
            freed_after_trace: self.freed_after_trace.0,
            freed_after_trace_bytes: self.freed_after_trace.1,
            alive_before_recording,
            alive_before_recording_bytes,
        }
    }
}

/// Why a trace looks truncated.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", tag = "kind", content = "count")]
pub enum TruncationEvidence {
    /// Frees of allocations not in the trace (allocated before recording started, or
    /// dropped from the ring buffer).
    OrphanFrees(u64),
    /// segment_free entries of segments not in the trace.
    OrphanSegmentFrees(u64),
    /// The trace holds exactly this many entries, a typical `max_entries`.
    RoundLength(usize),
}

/// Replays one trace for its counts, peaks and OOM events.
fn replay_trace(snap: &Snapshot, r: &DeviceReplay) -> (TraceSummary, Peaks, Vec<usize>) {
    let mut stats = TraceStats::new(r, r.trace);
    let mut peaks = Peaks::default();
    r.run((&mut stats, &mut peaks));
    (
        stats.summary(r.trace, snap),
        peaks.with_times(r.trace),
        stats.ooms,
    )
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

/// What the file's segments say of a device (its trace not read).
fn segments_summary(snap: &Snapshot, device: i64) -> DeviceSummary {
    let mut d = DeviceSummary {
        device,
        reserved_recorded: !snap.features.reserved_unrecorded.contains(&device),
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
    d
}

/// What the summary of a device collects in a replay: run it beside a command's other
/// aggregators, and [`SummaryPass::finish`] gives the device's summary.
pub struct SummaryPass<'a> {
    stats: TraceStats<'a>,
    peaks: Peaks,
}

crate::aggregator_of_fields!(SummaryPass<'_>, stats, peaks);

impl<'a> SummaryPass<'a> {
    pub fn new(r: &'a DeviceReplay<'a>) -> Self {
        SummaryPass {
            stats: TraceStats::new(r, r.trace),
            peaks: Peaks::default(),
        }
    }

    /// The summary of the device `r` replayed.
    pub fn finish(self, snap: &Snapshot, r: &DeviceReplay) -> DeviceSummary {
        let mut d = segments_summary(snap, r.device);
        let trace = self.stats.summary(r.trace, snap);
        let peaks = self.peaks.with_times(r.trace);
        let ooms = self.stats.ooms;
        if trace.has_timeline {
            let set = |p: &crate::timeline::Peak| {
                (Some(p.bytes), p.event.map(|e| e.index() as u32), p.time_us)
            };
            (
                d.peak_requested_bytes,
                d.peak_requested_event,
                d.peak_requested_time_us,
            ) = set(&peaks.requested);
            (
                d.peak_allocated_bytes,
                d.peak_allocated_event,
                d.peak_allocated_time_us,
            ) = set(&peaks.allocated);
            if d.reserved_recorded {
                (
                    d.peak_reserved_bytes,
                    d.peak_reserved_event,
                    d.peak_reserved_time_us,
                ) = set(&peaks.reserved);
            }
        }
        d.trace = trace;
        d.trace.frees_paired_by_size = snap.features.frees_paired_by_size.contains(&r.device);
        d.ooms = ooms
            .into_iter()
            .map(|i| {
                let e = r.trace.get(i);
                OomEvent {
                    index: i,
                    size: e.size,
                    device_free: e.device_free(),
                    stream: e.stream,
                    time_us: e.time_us,
                }
            })
            .collect();
        d
    }
}

/// The summary of one device, from a replay of its own.
fn device_summary(snap: &Snapshot, device: i64) -> DeviceSummary {
    let r = DeviceReplay::new(snap, device);
    let mut pass = SummaryPass::new(&r);
    r.run(&mut pass);
    pass.finish(snap, &r)
}

/// Builds the summary of one snapshot; devices are summarised in parallel.
pub fn analyze_summary(snap: &Snapshot, source: &SourceInfo, options: SummaryOptions) -> Summary {
    let devices: Vec<i64> = snap
        .devices()
        .into_iter()
        .filter(|d| options.device.is_none_or(|want| want == *d))
        .collect();
    summary_with(snap, source, &devices, Vec::new())
}

/// The summary of the devices `wanted` (in the file's order, [`Snapshot::devices`]), with
/// the summaries in `known` (from a [`SummaryPass`] a command ran beside its own
/// aggregators) taken as they are, and the others summarised here, in parallel.
pub fn summary_with(
    snap: &Snapshot,
    source: &SourceInfo,
    wanted: &[i64],
    known: Vec<DeviceSummary>,
) -> Summary {
    let mut known: BTreeMap<i64, DeviceSummary> =
        known.into_iter().map(|d| (d.device, d)).collect();
    let devices: Vec<DeviceSummary> = wanted
        .iter()
        .map(|d| known.remove(d))
        .collect::<Vec<_>>()
        .into_par_iter()
        .zip(wanted.par_iter())
        .map(|(known, &d)| known.unwrap_or_else(|| device_summary(snap, d)))
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
            trace: replay_trace(snap, &DeviceReplay::host(snap)).0,
        }
    });
    Summary {
        schema_version: SCHEMA_VERSION,
        source: source.clone(),
        converted: snap.features.converted_from.is_some(),
        layout: crate::model::layout::layout(snap),
        devices,
        host,
        allocator_settings: snap.allocator_settings.clone(),
        settings: settings(snap),
        external_annotations: snap.external_annotations.len(),
        distinct_frames: snap.frames.frame_count(),
        distinct_stacks: snap.frames.stack_count(),
        warnings: snap.warnings.clone(),
        clock: snap.clock(),
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
