//! A profiler output as a [`Snapshot`], so that every command (summary, timeline, top,
//! report) reads it through the one replay engine.
//!
//! Takes a [`ProfileTrace`] and gives a snapshot with, per device, a trace of `alloc`
//! (`Bytes` > 0) and `free_completed` (`Bytes` < 0) events at the block's address and size,
//! times in Unix µs, and stacks made of the spans that enclose each allocation on its thread
//! (operators such as `aten::empty`, Python functions as `file.py:line:function`, and
//! `record_function` ranges), innermost first, in the model's frame table. Changes of
//! `Total Reserved` become `segment_alloc` / `segment_free` events of the difference, so the
//! reserved series follows the allocator's own count.
//!
//! Memory allocated before profiling started has no event. Snapshot replay rebuilds such
//! memory from frees of unknown blocks and from blocks alive in the final segments (spec
//! 6.2); the converter gives it the same footing: the first event's `Total Allocated` minus
//! its `Bytes` is what was allocated before the trace, and the part of it never freed in
//! the trace becomes one final block, so the replayed allocated series equals the trace's
//! `Total Allocated` at every event. The final segments are synthetic: one per block alive
//! at the end, one for memory from before profiling, one for the cached free memory.
//!
//! Memory-timeline rows (no device, no address) become one device whose stacks are the
//! PyTorch category of each allocation, so bytes group the way the profiler sorted them.
//! What the converter had to assume is said in the snapshot's warnings.

use super::profile::{
    Category, MemoryEvent, ProfileKind, ProfileTrace, Span, SpanKind, TraceClock,
};
use crate::model::frames::FxMap;
use crate::model::trace::NewEvent;
use crate::model::{
    Action, Annotation, Block, BlockState, ConvertedFrom, DeviceTrace, Features, Frame, FrameTable,
    Segment, SegmentType, Snapshot, StackId, Warning, Warnings,
};
use serde::Serialize;
use std::collections::BTreeMap;

/// Where a device of a converted snapshot came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "index")]
pub enum DeviceSource {
    /// A CUDA device of the trace, by its index.
    Cuda(i64),
    /// The CPU allocator (a trace without CUDA memory events).
    Cpu,
    /// A memory-timeline export, which names no device.
    Unnamed,
}

/// What the conversion found and assumed for one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConvertedDevice {
    /// The device slot in the snapshot.
    pub device: i64,
    pub source: DeviceSource,
    /// Memory events of this device.
    pub events: u64,
    /// Bytes allocated before profiling started: the first event's Total Allocated minus
    /// its Bytes (0 when the trace has no Total Allocated).
    pub before_profiling_bytes: u64,
    /// Frees of blocks never allocated in the trace, in bytes (memory from before it).
    pub freed_from_before_bytes: u64,
    /// Peak of the trace's own Total Allocated / Total Reserved, when it has them.
    pub peak_total_allocated_bytes: Option<u64>,
    pub peak_total_reserved_bytes: Option<u64>,
    /// Events whose Total Allocated did not move by their Bytes (events lost or reordered).
    pub total_allocated_mismatches: u64,
    /// The trace has no addresses: frees were paired with the latest open allocation of the
    /// same size (and category).
    pub paired_by_size: bool,
}

/// A converted snapshot with what the conversion found.
pub struct Converted {
    pub snapshot: Snapshot,
    pub kind: ProfileKind,
    pub clock: TraceClock,
    pub base_time_ns: Option<i64>,
    pub devices: Vec<ConvertedDevice>,
    /// CPU memory events left out because the trace has CUDA events.
    pub cpu_events_left_out: u64,
    /// Memory events of other device types (neither CPU nor CUDA), left out.
    pub other_events_left_out: u64,
}

/// Devices above this index are not believed (a corrupt `Device Id`).
const MAX_DEVICE: i64 = 4096;

/// Synthetic addresses: blocks of traces without addresses, and the final blocks standing
/// for memory from before profiling and for cached free memory.
const SYNTHETIC_BASE: u64 = 0x5e00_0000_0000_0000;

/// Turns a profiler output into a snapshot (see the module documentation).
pub fn to_snapshot(trace: &ProfileTrace) -> Converted {
    let mut frames = FrameTable::new();
    let mut warnings = Warnings::default();
    let stacks = stacks_of_events(trace, &mut frames);
    // Group events by device slot.
    let has_cuda = trace.memory.iter().any(|m| m.device_type == 1);
    let mut groups: BTreeMap<i64, (DeviceSource, Vec<usize>)> = BTreeMap::new();
    let mut cpu_left = 0u64;
    let mut other_left = 0u64;
    for (i, m) in trace.memory.iter().enumerate() {
        let (slot, source) = match m.device_type {
            -1 => (0, DeviceSource::Unnamed),
            1 if (0..=MAX_DEVICE).contains(&m.device_id) => {
                (m.device_id, DeviceSource::Cuda(m.device_id))
            }
            0 if !has_cuda => (0, DeviceSource::Cpu),
            0 => {
                cpu_left += 1;
                continue;
            }
            _ => {
                other_left += 1;
                continue;
            }
        };
        groups
            .entry(slot)
            .or_insert_with(|| (source, Vec::new()))
            .1
            .push(i);
    }
    let mut features = Features {
        device_traces: true,
        converted_from: Some(match trace.kind {
            ProfileKind::KinetoTrace => ConvertedFrom::KinetoTrace,
            _ => ConvertedFrom::MemoryTimeline,
        }),
        relative_clock: trace.clock == TraceClock::Unknown,
        ..Features::default()
    };
    let max_slot = groups.keys().copied().max().unwrap_or(-1);
    let mut device_traces: Vec<DeviceTrace> =
        (0..=max_slot).map(|_| DeviceTrace::default()).collect();
    let mut segments = Vec::new();
    let mut devices = Vec::new();
    let mut next_synthetic = SYNTHETIC_BASE;
    for (&slot, (source, indices)) in &groups {
        if *source == DeviceSource::Cpu {
            features.cpu_device = Some(slot);
        }
        let trace_out = &mut device_traces[slot as usize];
        let d = convert_device(
            trace,
            &stacks,
            slot,
            *source,
            indices,
            trace_out,
            &mut segments,
            &mut next_synthetic,
        );
        devices.push(d);
    }
    for t in &device_traces {
        features.entries.merge(t.keys);
    }
    for d in &devices {
        if trace.kind == ProfileKind::KinetoTrace && d.source != DeviceSource::Cpu {
            if d.peak_total_reserved_bytes.is_none() {
                features.reserved_unrecorded.push(d.device);
            }
            if d.paired_by_size {
                features.frees_paired_by_size.push(d.device);
            }
        }
    }
    // record_function ranges (ProfilerStep#N and the user's own) as annotations, on every
    // converted device, as snapshots record them per device.
    let mut annotations = Vec::new();
    for s in trace
        .spans
        .iter()
        .filter(|s| s.kind == SpanKind::Annotation)
    {
        for &slot in groups.keys() {
            let name = trace.names[s.name as usize].clone();
            annotations.push(Annotation {
                name: name.clone(),
                stage: "START".into(),
                device: slot,
                time_us: s.start_ns.div_euclid(1000),
            });
            annotations.push(Annotation {
                name,
                stage: "END".into(),
                device: slot,
                time_us: s.end_ns.div_euclid(1000),
            });
        }
    }
    annotations.sort_by_key(|a| (a.time_us, a.device));
    features.external_annotations = !annotations.is_empty();
    add_warnings(trace, &devices, cpu_left, other_left, &mut warnings);
    Converted {
        snapshot: Snapshot {
            segments,
            device_traces,
            external_annotations: annotations,
            frames,
            features,
            warnings,
            ..Snapshot::default()
        },
        kind: trace.kind,
        clock: trace.clock,
        base_time_ns: trace.base_time_ns,
        devices,
        cpu_events_left_out: cpu_left,
        other_events_left_out: other_left,
    }
}

fn add_warnings(
    trace: &ProfileTrace,
    devices: &[ConvertedDevice],
    cpu_left: u64,
    other_left: u64,
    w: &mut Warnings,
) {
    match trace.kind {
        ProfileKind::KinetoTrace => w.add(Warning::ConvertedFromKineto),
        _ => w.add(Warning::ConvertedFromMemoryTimeline),
    }
    if trace.skipped_elements > 0 {
        w.add(Warning::SkippedElements {
            elements: trace.skipped_elements,
        });
    }
    for d in devices {
        if d.before_profiling_bytes > 0 {
            w.add(Warning::BeforeProfiling {
                device: d.device,
                bytes: d.before_profiling_bytes,
            });
        }
        if d.source == DeviceSource::Cpu {
            w.add(Warning::CpuOnly { device: d.device });
        }
        if d.paired_by_size && trace.kind == ProfileKind::KinetoTrace {
            w.add(Warning::PairedBySize { device: d.device });
        }
        if d.peak_total_reserved_bytes.is_none()
            && trace.kind == ProfileKind::KinetoTrace
            && d.source != DeviceSource::Cpu
        {
            w.add(Warning::NoTotalReserved { device: d.device });
        }
        if d.total_allocated_mismatches > 0 {
            w.add(Warning::TotalAllocatedMismatches {
                device: d.device,
                events: d.total_allocated_mismatches,
            });
        }
    }
    if cpu_left > 0 {
        w.add(Warning::CpuEventsLeftOut { events: cpu_left });
    }
    if other_left > 0 {
        w.add(Warning::OtherEventsLeftOut { events: other_left });
    }
}

/// The stack of each memory event: the spans enclosing it on its thread, innermost first.
fn stacks_of_events(trace: &ProfileTrace, frames: &mut FrameTable) -> Vec<Option<StackId>> {
    let mut out = vec![None; trace.memory.len()];
    if let Some(c) = categories_as_stacks(trace, frames) {
        return c;
    }
    if trace.spans.is_empty() {
        return out;
    }
    // Events of each thread, in time order (memory is sorted by time).
    let mut by_thread: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, m) in trace.memory.iter().enumerate() {
        if let Some(t) = m.thread {
            by_thread.entry(t).or_default().push(i);
        }
    }
    let mut frame_of: FxMap<u32, crate::model::FrameId> = FxMap::default();
    let mut ids: Vec<crate::model::FrameId> = Vec::new();
    for (thread, events) in by_thread {
        let lo = trace.spans.partition_point(|s| s.thread < thread);
        let hi = trace.spans.partition_point(|s| s.thread <= thread);
        let spans: &[Span] = &trace.spans[lo..hi];
        let mut open: Vec<usize> = Vec::new();
        let mut next = 0;
        for i in events {
            let t = trace.memory[i].time_ns;
            while next < spans.len() && spans[next].start_ns <= t {
                while open
                    .last()
                    .is_some_and(|&o| spans[o].end_ns < spans[next].start_ns)
                {
                    open.pop();
                }
                open.push(next);
                next += 1;
            }
            while open.last().is_some_and(|&o| spans[o].end_ns < t) {
                open.pop();
            }
            ids.clear();
            // The Python call stack recorded with the outermost enclosing operator.
            let mut python: Option<u32> = None;
            for &o in open.iter().rev() {
                let s = &spans[o];
                if s.end_ns < t {
                    continue;
                }
                if s.call_stack.is_some() {
                    python = s.call_stack;
                }
                let id = match frame_of.get(&s.name) {
                    Some(&id) => id,
                    None => {
                        let frame = span_frame(trace, s, frames);
                        let id = frames.intern_frame(frame);
                        frame_of.insert(s.name, id);
                        id
                    }
                };
                ids.push(id);
            }
            if let Some(cs) = python {
                let text = trace.names[cs as usize].as_str();
                for part in text.split(';').filter(|p| !p.is_empty()) {
                    let frame = match python_location(part) {
                        Some((file, line, func)) => Frame {
                            filename: frames.intern_str(file),
                            name: frames.intern_str(func),
                            line,
                        },
                        None => Frame {
                            filename: frames.intern_str("??"),
                            name: frames.intern_str(part),
                            line: 0,
                        },
                    };
                    ids.push(frames.intern_frame(frame));
                }
            }
            if !ids.is_empty() {
                out[i] = Some(frames.intern_stack(&ids));
            }
        }
    }
    out
}

/// A span as a frame: Python functions as `file.py:line:function`, others by name.
fn span_frame(trace: &ProfileTrace, s: &Span, frames: &mut FrameTable) -> Frame {
    let name = trace.names[s.name as usize].as_str();
    if s.kind == SpanKind::PythonFunction
        && let Some((file, line, func)) = python_location(name)
    {
        return Frame {
            filename: frames.intern_str(file),
            name: frames.intern_str(func),
            line,
        };
    }
    Frame {
        filename: frames.intern_str("??"),
        name: frames.intern_str(name),
        line: 0,
    }
}

/// `path/file.py(123): function` as (file, line, function).
fn python_location(name: &str) -> Option<(&str, i64, &str)> {
    let (head, func) = name.split_once("): ")?;
    let open = head.rfind('(')?;
    let line = head[open + 1..].parse::<i64>().ok()?;
    Some((&head[..open], line, func))
}

/// For memory-timeline rows, the category as a one-frame stack.
fn categories_as_stacks(
    trace: &ProfileTrace,
    frames: &mut FrameTable,
) -> Option<Vec<Option<StackId>>> {
    if trace.kind == ProfileKind::KinetoTrace {
        return None;
    }
    let file = frames.intern_str("category");
    let mut stack_of: BTreeMap<Category, StackId> = BTreeMap::new();
    for c in Category::ALL {
        let name = frames.intern_str(c.name());
        let f = frames.intern_frame(Frame {
            filename: file,
            name,
            line: 0,
        });
        stack_of.insert(c, frames.intern_stack(&[f]));
    }
    Some(
        trace
            .memory
            .iter()
            .map(|m| m.category.and_then(|c| stack_of.get(&c).copied()))
            .collect(),
    )
}

/// One device's memory events paired into blocks: the open blocks, the running totals
/// and their peaks, and where the next synthetic address goes.
struct Pairing<'a> {
    out: &'a mut DeviceTrace,
    next_synthetic: &'a mut u64,
    /// Whether the device records Total Reserved (the CPU allocator leaves it 0).
    has_reserved: bool,
    /// Open blocks: address -> (size, stack).
    live: BTreeMap<u64, (u64, Option<StackId>)>,
    /// Without addresses, (category, size) -> the synthetic addresses of open blocks,
    /// latest last.
    by_size: FxMap<(Option<Category>, u64), Vec<u64>>,
    freed_from_before: u64,
    prev_reserved: Option<i64>,
    prev_allocated: Option<i64>,
    mismatches: u64,
    allocated: i64,
    peak_allocated: i64,
    peak_ta: Option<i64>,
    peak_tr: Option<i64>,
}

impl Pairing<'_> {
    /// One memory event: a segment event for a change of Total Reserved, a check of Total
    /// Allocated against the running sum, then the block's alloc or free.
    fn event(&mut self, m: &MemoryEvent, stack: Option<StackId>) {
        let time_us = Some(m.time_ns.div_euclid(1000));
        if let Some(tr) = m.total_reserved.filter(|_| self.has_reserved) {
            self.reserved(tr, time_us, stack);
        }
        if let Some(ta) = m.total_allocated {
            if let Some(prev) = self.prev_allocated
                && ta - prev != m.bytes
            {
                self.mismatches += 1;
            }
            self.prev_allocated = Some(ta);
            self.peak_ta = self.peak_ta.max(Some(ta));
        }
        let size = m.bytes.unsigned_abs();
        if m.bytes > 0 {
            self.alloc(m, size, time_us, stack);
        } else if m.bytes < 0 {
            self.free(m, size, time_us, stack);
        }
        self.allocated += m.bytes;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
    }

    /// A change of Total Reserved to `tr`, as a segment event of the difference.
    fn reserved(&mut self, tr: i64, time_us: Option<i64>, stack: Option<StackId>) {
        if let Some(prev) = self.prev_reserved
            && tr != prev
        {
            let (action, size) = if tr > prev {
                (Action::SegmentAlloc, (tr - prev) as u64)
            } else {
                (Action::SegmentFree, (prev - tr) as u64)
            };
            self.out.push(NewEvent {
                action: Some(action),
                addr: 0,
                size,
                time_us,
                stack,
                ..Default::default()
            });
        }
        self.prev_reserved = Some(tr);
        self.peak_tr = self.peak_tr.max(Some(tr));
    }

    /// The next synthetic address, with room for `size` bytes in 512-byte units.
    fn synthetic(&mut self, size: u64) -> u64 {
        let a = *self.next_synthetic;
        *self.next_synthetic += size.div_ceil(512).max(1) * 512;
        a
    }

    /// An allocation of `size` bytes, at its address or a synthetic one.
    fn alloc(&mut self, m: &MemoryEvent, size: u64, time_us: Option<i64>, stack: Option<StackId>) {
        let addr = match m.addr {
            Some(a) => a,
            None => {
                let a = self.synthetic(size);
                self.by_size.entry((m.category, size)).or_default().push(a);
                a
            }
        };
        self.live.insert(addr, (size, stack));
        self.out.push(NewEvent {
            action: Some(Action::Alloc),
            addr,
            size,
            time_us,
            stack,
            ..Default::default()
        });
    }

    /// A free of `size` bytes: of an open block, else of memory from before profiling
    /// (at its address, or a synthetic one when none is known).
    fn free(&mut self, m: &MemoryEvent, size: u64, time_us: Option<i64>, stack: Option<StackId>) {
        let addr = match m.addr {
            Some(a) => Some(a),
            None => self.by_size.get_mut(&(m.category, size)).and_then(Vec::pop),
        };
        let addr = match addr {
            Some(a) if self.live.remove(&a).is_some() => a,
            other => {
                self.freed_from_before += size;
                other.unwrap_or_else(|| self.synthetic(size))
            }
        };
        self.out.push(NewEvent {
            action: Some(Action::FreeCompleted),
            addr,
            size,
            time_us,
            stack,
            ..Default::default()
        });
    }

    /// Final segments: the blocks alive at the end, what is left of the `before` bytes
    /// from before profiling, and the cached free memory (up to the reserved memory at
    /// the end, or where none is recorded the peak of allocated).
    fn final_segments(&mut self, before: u64, slot: i64, segments: &mut Vec<Segment>) {
        let mut end_allocated = 0u64;
        for (&addr, &(size, stack)) in &self.live {
            segments.push(block_segment(
                slot,
                addr,
                size,
                BlockState::ActiveAllocated,
                stack,
            ));
            end_allocated += size;
        }
        let remaining_before = before.saturating_sub(self.freed_from_before);
        if remaining_before > 0 {
            segments.push(block_segment(
                slot,
                *self.next_synthetic,
                remaining_before,
                BlockState::ActiveAllocated,
                None,
            ));
            *self.next_synthetic += remaining_before.div_ceil(512) * 512;
            end_allocated += remaining_before;
        }
        let end_reserved = if self.has_reserved {
            self.prev_reserved.unwrap_or(0).max(0) as u64
        } else {
            // Unknown: the smallest reserved memory that ever held the allocations.
            self.peak_allocated.max(0) as u64
        };
        if end_reserved > end_allocated {
            let free = end_reserved - end_allocated;
            segments.push(block_segment(
                slot,
                *self.next_synthetic,
                free,
                BlockState::Inactive,
                None,
            ));
            *self.next_synthetic += free.div_ceil(512) * 512;
        }
    }
}

/// A synthetic segment of device `device` holding one block of `size` bytes at `addr`.
fn block_segment(
    device: i64,
    addr: u64,
    size: u64,
    state: BlockState,
    stack: Option<StackId>,
) -> Segment {
    let active = if state == BlockState::ActiveAllocated {
        size
    } else {
        0
    };
    Segment {
        device,
        address: addr,
        total_size: size,
        allocated_size: active,
        active_size: active,
        requested_size: Some(active),
        stream: 0,
        segment_type: if size <= 1 << 20 {
            SegmentType::Small
        } else {
            SegmentType::Large
        },
        pool_id: Some((0, 0)),
        is_expandable: false,
        stack,
        blocks: vec![Block {
            address: addr,
            size,
            requested_size: active,
            state,
            stack,
        }],
    }
}

/// One device's events (`indices` into the trace's memory events) into `out`, its final
/// segments into `segments`; gives what the conversion found.
#[allow(clippy::too_many_arguments)]
fn convert_device(
    trace: &ProfileTrace,
    stacks: &[Option<StackId>],
    slot: i64,
    source: DeviceSource,
    indices: &[usize],
    out: &mut DeviceTrace,
    segments: &mut Vec<Segment>,
    next_synthetic: &mut u64,
) -> ConvertedDevice {
    let events: Vec<&MemoryEvent> = indices.iter().map(|&i| &trace.memory[i]).collect();
    let first = events.first();
    let before = first
        .and_then(|m| m.total_allocated.map(|ta| (ta - m.bytes).max(0) as u64))
        .unwrap_or(0);
    let paired_by_size = events.iter().any(|m| m.addr.is_none());
    // The CPU allocator reports no reserved memory (Total Reserved stays 0).
    let has_reserved = events.iter().any(|m| {
        m.total_reserved.is_some_and(|r| r > 0)
            || (m.total_reserved.is_some() && m.device_type != 0)
    });
    let mut p = Pairing {
        out,
        next_synthetic,
        has_reserved,
        live: BTreeMap::new(),
        by_size: FxMap::default(),
        freed_from_before: 0,
        prev_reserved: None,
        prev_allocated: None,
        mismatches: 0,
        allocated: before as i64,
        peak_allocated: before as i64,
        peak_ta: None,
        peak_tr: None,
    };
    for (&i, m) in indices.iter().zip(&events) {
        p.event(m, stacks[i]);
    }
    p.out.keys.time_us = true;
    p.out.keys.frames = stacks.iter().any(Option::is_some);
    p.final_segments(before, slot, segments);
    ConvertedDevice {
        device: slot,
        source,
        events: events.len() as u64,
        before_profiling_bytes: before,
        freed_from_before_bytes: p.freed_from_before,
        peak_total_allocated_bytes: p.peak_ta.map(|v| v.max(0) as u64),
        peak_total_reserved_bytes: p.peak_tr.filter(|_| has_reserved).map(|v| v.max(0) as u64),
        total_allocated_mismatches: p.mismatches,
        paired_by_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_locations() {
        assert_eq!(
            python_location("torch/nn/modules/module.py(1501): _call_impl"),
            Some(("torch/nn/modules/module.py", 1501, "_call_impl"))
        );
        assert_eq!(python_location("nn.Module: Linear_0"), None);
        assert_eq!(python_location("<built-in method add of Tensor>"), None);
    }
}
