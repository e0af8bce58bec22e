//! The typed snapshot: segments, blocks, per-device traces, settings and annotations.
//!
//! Takes pickle [`Value`](crate::pickle::Value)s (or JSON with the same structure) and
//! gives a [`Snapshot`]. Decoding is tolerant where PyTorch versions differ (missing
//! optional keys, unknown keys and actions become counted warnings) and strict where the
//! data is wrong (a field of the wrong type is an error naming its key path, such as
//! `device_traces[0][17].size`). It computes no statistics: that is `analysis`.

mod decode;
pub mod encode;
pub mod frames;
pub mod layout;
pub mod round_trip;
pub mod trace;

pub use decode::{
    DecodeError, MAX_DEVICES, MODEL_BUDGET_FLOOR, SnapshotBuilder, decode_json, decode_value,
};
pub use frames::{Frame, FrameId, FrameTable, StackId, StrId};
pub use round_trip::{Extra, Extras, Place};
pub use trace::{Action, DeviceTrace, EntryKeys, TraceEvent, TraceString, UNKNOWN_FREE};

use std::collections::BTreeMap;

/// State of a block (spec section 2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
    /// A state this version does not know (its name is in the frame table's strings).
    Other(StrId),
}

impl BlockState {
    pub fn is_active(self) -> bool {
        matches!(
            self,
            BlockState::ActiveAllocated | BlockState::ActivePendingFree
        )
    }
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// Segment address plus the sizes of the blocks before it.
    pub address: u64,
    pub size: u64,
    /// Bytes requested by the allocation that holds (or last held) the block.
    pub requested_size: u64,
    pub state: BlockState,
    pub stack: Option<StackId>,
}

/// Which pool a segment's blocks are allocated from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegmentType {
    Large,
    Small,
    Other,
}

/// One segment (a cudaMalloc, or a mapped range of an expandable segment).
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: Option<u64>,
    /// Raw `cudaStream_t` value (0 = legacy default stream).
    pub stream: u64,
    pub segment_type: SegmentType,
    /// `segment_pool_id` (2.1 and later); `(0, 0)` is the default pool.
    pub pool_id: Option<(i64, i64)>,
    pub is_expandable: bool,
    pub stack: Option<StackId>,
    pub blocks: Vec<Block>,
}

/// One `external_annotations` record (2.5 and later).
#[derive(Clone, Debug, PartialEq)]
pub struct Annotation {
    pub name: String,
    pub stage: String,
    pub device: i64,
    pub time_us: i64,
}

/// Something met while reading a file that is not an error: what it was, with the names
/// and numbers that say it. The sentence for each is `render::words::warnings`'s.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Warning {
    /// A `time_us` beyond 2^53 us of 1970, taken as absent.
    TimeOutOfRange,
    /// A frame without one of filename, name and line.
    FrameIncomplete,
    /// A key of a trace entry that is not a string.
    NonStringEntryKey,
    /// The names here are the file's, at most 60 characters (then `...`).
    UnknownAction(String),
    /// An oom entry whose `device_free` is not a size, taken as unknown.
    OomFreeNotASize,
    UnknownEntryKey(String),
    UnknownBlockState(String),
    UnknownBlockKey(String),
    /// A block's address is not its segment's plus the sizes of the blocks before it.
    BlockAddressMismatch,
    UnknownSegmentType(String),
    UnknownSegmentKey(String),
    /// A segment without `device`, taken as device 0.
    SegmentWithoutDevice,
    /// The block sizes of a segment do not add up to its `total_size`.
    BlockSizesMismatch,
    UnknownAnnotationKey,
    NonStringTopLevelKey,
    UnknownTopLevelKey(String),
    /// Bytes after the pickle's STOP, ignored.
    TrailingBytes {
        bytes: u64,
    },
    /// Converted from a Kineto / Chrome trace (`devlog::convert`): what its stacks and
    /// segments are.
    ConvertedFromKineto,
    /// Converted from `export_memory_timeline` rows.
    ConvertedFromMemoryTimeline,
    /// Elements of a trace's event list that are not events, skipped.
    SkippedElements {
        elements: u64,
    },
    /// Memory allocated before profiling started on a converted device.
    BeforeProfiling {
        device: i64,
        bytes: u64,
    },
    /// The trace has memory events only for the CPU; `device` holds them.
    CpuOnly {
        device: i64,
    },
    /// A trace without addresses: frees paired with allocations by size.
    PairedBySize {
        device: i64,
    },
    /// A trace without `Total Reserved`.
    NoTotalReserved {
        device: i64,
    },
    /// Events whose `Total Allocated` did not move by their `Bytes`.
    TotalAllocatedMismatches {
        device: i64,
        events: u64,
    },
    /// CPU memory events left out (the trace has CUDA ones).
    CpuEventsLeftOut {
        events: u64,
    },
    /// Memory events of devices other than CPU and CUDA left out.
    OtherEventsLeftOut {
        events: u64,
    },
}

impl Warning {
    /// The name from the file it quotes, if any (for `redact` to clean).
    pub fn quoted_mut(&mut self) -> Option<&mut String> {
        match self {
            Warning::UnknownAction(s)
            | Warning::UnknownEntryKey(s)
            | Warning::UnknownBlockState(s)
            | Warning::UnknownBlockKey(s)
            | Warning::UnknownSegmentType(s)
            | Warning::UnknownSegmentKey(s)
            | Warning::UnknownTopLevelKey(s) => Some(s),
            _ => None,
        }
    }
}

/// Warnings met while decoding, each kind counted once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Warnings(pub BTreeMap<Warning, u64>);

impl Warnings {
    pub fn add(&mut self, warning: Warning) {
        *self.0.entry(warning).or_insert(0) += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many were met, all kinds together.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }
}

/// How a memory snapshot is recorded, for a file that is something else.
pub const RECORD_ADVICE: &str = "record a snapshot with torch.cuda.memory._record_memory_history() before the work and torch.cuda.memory._dump_snapshot(\"snapshot.pickle\") after it";

/// Top-level features present in the file, from which the PyTorch release is guessed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// The root was a bare list of segments.
    pub root_is_list: bool,
    pub device_traces: bool,
    pub allocator_settings: bool,
    pub external_annotations: bool,
    pub host_segments: bool,
    /// Blocks carry `history` (1.13, 2.0).
    pub block_history: bool,
    /// Blocks carry `frames` (2.1 and later).
    pub block_frames: bool,
    pub segment_requested_size: bool,
    pub segment_pool_id: bool,
    pub forward_frames: bool,
    pub graph_capture_record_stream_reuse: bool,
    pub max_cached_size: bool,
    pub entries: EntryKeys,
    /// Set when the snapshot was converted from a profiler output rather than read from a
    /// snapshot file: its segments are synthetic and its stacks are operator spans.
    pub converted_from: Option<ConvertedFrom>,
    /// The device slot that holds the CPU allocator's events, when a profiler trace had
    /// memory events only for the CPU.
    pub cpu_device: Option<i64>,
    /// Converted devices whose trace records no reserved memory (a profiler trace without
    /// `Total Reserved`): their segments stand for allocated memory only.
    pub reserved_unrecorded: Vec<i64>,
    /// Converted devices whose frees were paired with allocations by size (a profiler
    /// trace without addresses): totals exact, which block ended a guess.
    pub frees_paired_by_size: Vec<i64>,
    /// The times have no base (a profiler trace without `baseTimeNanoseconds` whose times
    /// are not Unix time): they are shown as offsets from the first event.
    pub relative_clock: bool,
}

/// The profiler output a snapshot was converted from (see `devlog::convert`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvertedFrom {
    /// A Kineto / Chrome trace's `[memory]` events.
    KinetoTrace,
    /// `export_memory_timeline` rows; stacks are PyTorch's memory categories.
    MemoryTimeline,
}

/// A decoded snapshot.
pub struct Snapshot {
    /// Grouped by device in ascending order, file order within a device (decoding sorts
    /// them so; [`Snapshot::segments_of`] relies on it).
    pub segments: Vec<Segment>,
    /// `device_traces[d]`, indexed by device ordinal.
    pub device_traces: Vec<DeviceTrace>,
    pub host_segments: Vec<Segment>,
    pub host_trace: DeviceTrace,
    /// `allocator_settings` as JSON values, keys sorted.
    pub allocator_settings: Option<BTreeMap<String, serde_json::Value>>,
    pub external_annotations: Vec<Annotation>,
    pub frames: FrameTable,
    pub features: Features,
    pub warnings: Warnings,
    /// What the file holds beyond the fields above, for writing it back.
    pub extras: Extras,
}

impl Default for Snapshot {
    /// A snapshot holding nothing.
    fn default() -> Self {
        Snapshot {
            segments: Vec::new(),
            device_traces: Vec::new(),
            host_segments: Vec::new(),
            host_trace: DeviceTrace::default(),
            allocator_settings: None,
            external_annotations: Vec::new(),
            frames: FrameTable::new(),
            features: Features::default(),
            warnings: Warnings::default(),
            extras: Extras::default(),
        }
    }
}

impl Snapshot {
    /// Devices that have a segment or a non-empty trace, ascending.
    pub fn devices(&self) -> Vec<i64> {
        let mut ds: Vec<i64> = self.segments.iter().map(|s| s.device).collect();
        for (d, t) in self.device_traces.iter().enumerate() {
            if !t.is_empty() {
                ds.push(d as i64);
            }
        }
        ds.sort_unstable();
        ds.dedup();
        ds
    }

    /// How the file's times read ([`crate::units::Clock`]): Unix time, or offsets from
    /// the first event of any device when the clock has no base.
    pub fn clock(&self) -> crate::units::Clock {
        if !self.features.relative_clock {
            return crate::units::Clock::Unix;
        }
        let first = self
            .device_traces
            .iter()
            .filter_map(|t| (0..t.len()).find_map(|i| t.time_us(i)))
            .min();
        crate::units::Clock::Relative {
            first_us: first.unwrap_or(0),
        }
    }

    /// The trace of a device (empty when the file has none for it).
    pub fn trace(&self, device: i64) -> Option<&DeviceTrace> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.device_traces.get(d))
    }

    /// Segments of one device, in file order (a binary search: `segments` is grouped by
    /// device).
    pub fn segments_of(&self, device: i64) -> impl Iterator<Item = &Segment> {
        let start = self.segments.partition_point(|s| s.device < device);
        let end = self.segments.partition_point(|s| s.device <= device);
        self.segments[start..end.max(start)].iter()
    }

    /// An allocator setting, when the file has `allocator_settings` and the key.
    pub fn setting(&self, key: &str) -> Option<&serde_json::Value> {
        self.allocator_settings.as_ref()?.get(key)
    }
}
