//! Replay of one device's trace into lifetimes and memory series.
//!
//! Takes a [`Snapshot`] and a device, gives a [`DeviceTimeline`]: every allocation
//! lifetime (paired alloc / free_completed, versioned by address like the official
//! viewer), memory that existed before the trace (orphan frees and surviving blocks, spec
//! sections 3.6 and 6.2), the allocated series exactly as the viewer's Active Memory
//! Timeline counts it (requested bytes, held until `free_completed`), and the reserved
//! series rebuilt from the final segments and the segment events (spec 6.3). Devices are
//! independent, so callers build them in parallel. Nothing here draws or formats.

pub mod state;

use crate::model::frames::FxMap;
use crate::model::{Action, BlockState, DeviceTrace, Snapshot, StackId};
use std::num::NonZeroU32;
use std::sync::LazyLock;

/// The trace of a device that has none.
static NO_TRACE: LazyLock<DeviceTrace> = LazyLock::new(DeviceTrace::default);

/// Index of an event in a device's trace (as in the file, before any merging). Stored
/// as index + 1 so that `Option<EventIdx>` takes 4 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventIdx(NonZeroU32);

impl EventIdx {
    pub fn new(index: usize) -> EventIdx {
        EventIdx(NonZeroU32::new(index as u32 + 1).expect("fewer than 2^32 - 1 events"))
    }

    pub fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

impl serde::Serialize for EventIdx {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.index() as u64)
    }
}

/// Where a lifetime comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Its `alloc` is in the trace.
    Traced,
    /// Freed in the trace, allocated before it (recording started late or the ring
    /// buffer dropped the allocation).
    BeforeTrace,
    /// Alive in the final snapshot with no `alloc` in the trace (a "ghost" block).
    Survivor,
}

/// One allocation from allocation to completed free.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Lifetime {
    pub addr: u64,
    /// Requested bytes (what the viewer stacks).
    pub size: u64,
    /// Per-address version, as the viewer labels blocks: `b'<hex addr>_<version>`.
    pub version: u32,
    pub origin: Origin,
    /// The `alloc` event; None when it happened before the trace.
    pub alloc: Option<EventIdx>,
    /// The `free_requested` event, when traced.
    pub free_requested: Option<EventIdx>,
    /// The `free_completed` event; None when still alive at the end.
    pub free_completed: Option<EventIdx>,
    /// Index into [`DeviceTimeline::streams`].
    #[serde(skip)]
    pub stream: u16,
    /// Index into [`DeviceTimeline::pools`].
    #[serde(skip)]
    pub pool: u16,
    /// Stack id, `u32::MAX` for none (see [`Lifetime::stack`]).
    #[serde(skip)]
    stack: u32,
}

impl Lifetime {
    /// The stack recorded with the allocation (or with its free, for orphan frees).
    pub fn stack(&self) -> Option<StackId> {
        (self.stack != u32::MAX).then_some(StackId(self.stack))
    }

    /// The viewer's label, e.g. `b'7f3a00000000_2`.
    pub fn label(&self) -> String {
        format!("b'{:x}_{}", self.addr, self.version)
    }

    /// Alive just after event `i` (events before the trace count as alive at the start).
    pub fn alive_after(&self, i: usize) -> bool {
        self.alloc.is_none_or(|a| a.index() <= i)
            && self.free_completed.is_none_or(|f| f.index() > i)
    }
}

/// A maximum and where it is first reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Peak {
    pub bytes: u64,
    /// The event after which the peak is first reached; None: before the first event.
    pub event: Option<EventIdx>,
    pub time_us: Option<i64>,
}

/// The replayed trace of one device.
#[derive(Debug, Clone)]
pub struct DeviceTimeline<'a> {
    pub device: i64,
    pub trace: &'a DeviceTrace,
    pub lifetimes: Vec<Lifetime>,
    /// Distinct streams of the lifetimes.
    pub streams: Vec<u64>,
    /// Distinct pool ids of the lifetimes (None: unknown, before 2.1 or outside every
    /// final segment).
    pub pools: Vec<Option<(i64, i64)>>,
    /// Allocated bytes (viewer semantics) before the first event.
    pub initial_allocated: u64,
    /// Allocated bytes just after each event.
    pub allocated: Vec<u64>,
    /// Reserved bytes before the first event (final reserved minus the traced segment
    /// events; negative values mean the segment events do not add up).
    pub initial_reserved: i64,
    /// (event, reserved bytes just after it) at each segment event.
    pub reserved_changes: Vec<(u32, i64)>,
    pub peak_allocated: Peak,
    pub peak_reserved: Peak,
}

/// Just the peaks, from one pass that stores nothing per event (for `summary`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peaks {
    pub allocated: Peak,
    pub reserved: Peak,
}

type PoolId = Option<(i64, i64)>;

/// A final `active_allocated` block of a device.
struct Survivor {
    addr: u64,
    requested: u64,
    stream: u64,
    pool: PoolId,
    stack: Option<StackId>,
}

fn survivors(snap: &Snapshot, device: i64) -> Vec<Survivor> {
    let mut out = Vec::new();
    for s in snap.segments_of(device) {
        for b in &s.blocks {
            if b.state == BlockState::ActiveAllocated {
                out.push(Survivor {
                    addr: b.address,
                    requested: b.requested_size,
                    stream: s.stream,
                    pool: s.pool_id,
                    stack: b.stack,
                });
            }
        }
    }
    out
}

fn final_reserved(snap: &Snapshot, device: i64) -> i64 {
    snap.segments_of(device).map(|s| s.total_size as i64).sum()
}

/// Segment events move reserved memory (spec 3.2): +size on alloc/map, −size on free/unmap.
fn reserved_delta(action: Action, size: u64) -> i64 {
    match action {
        Action::SegmentAlloc | Action::SegmentMap => size as i64,
        Action::SegmentFree | Action::SegmentUnmap => -(size as i64),
        _ => 0,
    }
}

/// One pass of the viewer's pairing (spec 6.2 phase 1): calls `on_step(i, delta)` for every
/// event that changes the allocated total, and returns the open allocations at the end
/// (address → alloc event) with the sum of orphan frees.
fn pair<F: FnMut(usize, i64)>(
    trace: &crate::model::DeviceTrace,
    mut on_step: F,
) -> (FxMap<u64, usize>, u64) {
    // address -> index of the open element's alloc event
    let mut open: FxMap<u64, usize> = FxMap::default();
    let mut orphan_bytes = 0u64;
    for i in 0..trace.len() {
        match trace.action(i) {
            Action::Alloc => {
                let e = trace.get(i);
                open.insert(e.addr, i);
                on_step(i, e.size as i64);
            }
            Action::FreeCompleted => {
                let e = trace.get(i);
                match open.remove(&e.addr) {
                    Some(alloc) => {
                        let size = trace.get(alloc).size;
                        on_step(i, -(size as i64));
                    }
                    None => {
                        orphan_bytes += e.size;
                        on_step(i, -(e.size as i64));
                    }
                }
            }
            _ => {}
        }
    }
    (open, orphan_bytes)
}

/// Peaks of allocated (the viewer's Active Memory Timeline maximum) and reserved memory.
pub fn peaks(snap: &Snapshot, device: i64) -> Peaks {
    let trace = snap.trace(device).unwrap_or(&NO_TRACE);
    // Allocated: a running total relative to the start; the start (orphans + survivors)
    // is only known at the end of the pass.
    let (mut rel, mut max_rel, mut max_at) = (0i64, 0i64, None);
    let (open, orphan_bytes) = pair(trace, |i, delta| {
        rel += delta;
        if rel > max_rel {
            max_rel = rel;
            max_at = Some(i);
        }
    });
    let survivors: u64 = survivors(snap, device)
        .iter()
        .filter(|s| !open.contains_key(&s.addr))
        .map(|s| s.requested)
        .sum();
    let initial = (orphan_bytes + survivors) as i64;
    let allocated = Peak {
        bytes: (initial + max_rel).max(0) as u64,
        event: max_at.map(EventIdx::new),
        time_us: max_at.and_then(|i| trace.time_us(i)),
    };
    // Reserved: final minus the net of the traced segment events, then forward.
    let net: i64 = (0..trace.len())
        .map(|i| reserved_delta(trace.action(i), trace.get(i).size))
        .sum();
    let start = final_reserved(snap, device) - net;
    let (mut cur, mut max, mut at) = (start, start, None);
    for i in 0..trace.len() {
        let d = reserved_delta(trace.action(i), trace.get(i).size);
        if d != 0 {
            cur += d;
            if cur > max {
                max = cur;
                at = Some(i);
            }
        }
    }
    Peaks {
        allocated,
        reserved: Peak {
            bytes: max.max(0) as u64,
            event: at.map(EventIdx::new),
            time_us: at.and_then(|i| trace.time_us(i)),
        },
    }
}

/// Bytes the caching allocator hands out for a request: at least 512, in multiples of
/// 512 (CUDACachingAllocator `round_size`; `roundup_power2_divisions` is not modelled).
pub fn block_bytes(requested: u64) -> u64 {
    requested.max(1).div_ceil(512) * 512
}

/// Active bytes (allocations in block bytes, pending frees included, as in the viewer's
/// count) at the given states (None: before the first event; others ascending), by one
/// forward pass that keeps nothing per event.
pub fn active_at(tl: &DeviceTimeline, states: &[Option<usize>]) -> Vec<u64> {
    let trace = tl.trace;
    let mut active: i64 = tl
        .lifetimes
        .iter()
        .filter(|l| l.alloc.is_none())
        .map(|l| block_bytes(l.size) as i64)
        .sum();
    let mut open: FxMap<u64, u64> = FxMap::default();
    let mut out = Vec::with_capacity(states.len());
    let mut next = 0;
    while next < states.len() && states[next].is_none() {
        out.push(active.max(0) as u64);
        next += 1;
    }
    for i in 0..trace.len() {
        if next >= states.len() {
            break;
        }
        match trace.action(i) {
            Action::Alloc => {
                let e = trace.get(i);
                let b = block_bytes(e.size);
                open.insert(e.addr, b);
                active += b as i64;
            }
            Action::FreeCompleted => {
                let e = trace.get(i);
                active -= open.remove(&e.addr).unwrap_or_else(|| block_bytes(e.size)) as i64;
            }
            _ => {}
        }
        while next < states.len() && states[next] == Some(i) {
            out.push(active.max(0) as u64);
            next += 1;
        }
    }
    out
}

/// Index of `value` in a small table of distinct values, added when new. Past 65535
/// distinct values the last index, which no value holds, stands for "unknown".
fn small_index<T: PartialEq + Copy>(table: &mut Vec<T>, value: T) -> u16 {
    match table.iter().position(|&q| q == value) {
        Some(i) => i as u16,
        None if table.len() < u16::MAX as usize => {
            table.push(value);
            (table.len() - 1) as u16
        }
        None => u16::MAX,
    }
}

/// Replays one device fully: lifetimes and per-event series.
pub fn build(snap: &Snapshot, device: i64) -> DeviceTimeline<'_> {
    let trace = snap.trace(device).unwrap_or(&NO_TRACE);
    let n = trace.len();
    // Pool of an address from the final segments (used when entries carry no pool_id).
    let mut segs: Vec<(u64, u64, PoolId)> = snap
        .segments_of(device)
        .map(|s| (s.address, s.total_size, s.pool_id))
        .collect();
    segs.sort_unstable();
    let pool_of = |addr: u64| -> Option<(i64, i64)> {
        let i = segs.partition_point(|s| s.0 <= addr);
        let (start, size, pool) = *segs.get(i.checked_sub(1)?)?;
        (addr < start.saturating_add(size))
            .then_some(pool)
            .flatten()
    };
    let has_pool_ids = trace.keys.pool_id;
    let mut streams: Vec<u64> = Vec::new();
    let mut stream_index = |st: u64| small_index(&mut streams, st);
    let mut pools: Vec<Option<(i64, i64)>> = Vec::new();
    let mut pool_index = |p: Option<(i64, i64)>| small_index(&mut pools, p);

    let mut lifetimes: Vec<Lifetime> = Vec::new();
    let mut versions: FxMap<u64, u32> = FxMap::default();
    // address -> index into lifetimes of the open allocation
    let mut open: FxMap<u64, usize> = FxMap::default();
    // address -> lifetime waiting for free_completed after free_requested
    let mut requested: FxMap<u64, usize> = FxMap::default();
    let mut allocated = Vec::with_capacity(n);
    let mut rel = 0i64;
    let mut orphans = 0u64;
    for i in 0..n {
        let action = trace.action(i);
        match action {
            Action::Alloc => {
                let e = trace.get(i);
                let version = *versions.get(&e.addr).unwrap_or(&0);
                lifetimes.push(Lifetime {
                    addr: e.addr,
                    size: e.size,
                    version,
                    origin: Origin::Traced,
                    alloc: Some(EventIdx::new(i)),
                    free_requested: None,
                    free_completed: None,
                    stream: stream_index(e.stream),
                    pool: pool_index(if has_pool_ids {
                        Some(trace.pool_id(i))
                    } else {
                        pool_of(e.addr)
                    }),
                    stack: e.stack.map_or(u32::MAX, |s| s.0),
                });
                open.insert(e.addr, lifetimes.len() - 1);
                rel += e.size as i64;
            }
            Action::FreeRequested => {
                let e = trace.get(i);
                if let Some(&l) = open.get(&e.addr) {
                    lifetimes[l].free_requested = Some(EventIdx::new(i));
                    requested.insert(e.addr, l);
                }
            }
            Action::FreeCompleted => {
                let e = trace.get(i);
                let version = versions.entry(e.addr).or_insert(0);
                match open.remove(&e.addr) {
                    Some(l) => {
                        lifetimes[l].free_completed = Some(EventIdx::new(i));
                        rel -= lifetimes[l].size as i64;
                    }
                    None => {
                        orphans += e.size;
                        rel -= e.size as i64;
                        lifetimes.push(Lifetime {
                            addr: e.addr,
                            size: e.size,
                            version: *version,
                            origin: Origin::BeforeTrace,
                            alloc: None,
                            free_requested: None,
                            free_completed: Some(EventIdx::new(i)),
                            stream: stream_index(e.stream),
                            pool: pool_index(if has_pool_ids {
                                Some(trace.pool_id(i))
                            } else {
                                pool_of(e.addr)
                            }),
                            stack: e.stack.map_or(u32::MAX, |s| s.0),
                        });
                    }
                }
                requested.remove(&e.addr);
                *version += 1;
            }
            _ => {}
        }
        allocated.push(rel);
    }
    let mut survivor_bytes = 0u64;
    for s in survivors(snap, device) {
        if open.contains_key(&s.addr) {
            continue;
        }
        survivor_bytes += s.requested;
        lifetimes.push(Lifetime {
            addr: s.addr,
            size: s.requested,
            version: *versions.get(&s.addr).unwrap_or(&0),
            origin: Origin::Survivor,
            alloc: None,
            free_requested: None,
            free_completed: None,
            stream: stream_index(s.stream),
            pool: pool_index(s.pool),
            stack: s.stack.map_or(u32::MAX, |s| s.0),
        });
    }
    let initial = (orphans + survivor_bytes) as i64;
    let allocated: Vec<u64> = allocated
        .iter()
        .map(|r| (initial + r).max(0) as u64)
        .collect();

    let net: i64 = (0..n)
        .map(|i| reserved_delta(trace.action(i), trace.get(i).size))
        .sum();
    let initial_reserved = final_reserved(snap, device) - net;
    let mut cur = initial_reserved;
    let mut reserved_changes = Vec::new();
    let mut peak_reserved = (initial_reserved, None);
    for i in 0..n {
        let d = reserved_delta(trace.action(i), trace.get(i).size);
        if d != 0 {
            cur += d;
            reserved_changes.push((i as u32, cur));
            if cur > peak_reserved.0 {
                peak_reserved = (cur, Some(i));
            }
        }
    }
    let mut peak_allocated = (initial, None);
    for (i, &a) in allocated.iter().enumerate() {
        if a as i64 > peak_allocated.0 {
            peak_allocated = (a as i64, Some(i));
        }
    }
    let peak = |(bytes, at): (i64, Option<usize>)| Peak {
        bytes: bytes.max(0) as u64,
        event: at.map(EventIdx::new),
        time_us: at.and_then(|i| trace.time_us(i)),
    };
    DeviceTimeline {
        device,
        trace,
        peak_allocated: peak(peak_allocated),
        peak_reserved: peak(peak_reserved),
        lifetimes,
        streams,
        pools,
        initial_allocated: initial as u64,
        allocated,
        initial_reserved,
        reserved_changes,
    }
}

impl DeviceTimeline<'_> {
    /// `time_us` of event `i`, when the trace has one.
    pub fn time_us(&self, i: usize) -> Option<i64> {
        self.trace.time_us(i)
    }

    /// Whether events carry times (PyTorch 2.2 and later).
    pub fn has_times(&self) -> bool {
        self.trace.keys.time_us
    }

    /// Raw stream of a lifetime (0 when more streams than fit the table).
    pub fn stream(&self, l: &Lifetime) -> u64 {
        self.streams.get(l.stream as usize).copied().unwrap_or(0)
    }

    /// Pool id of a lifetime.
    pub fn pool_id(&self, l: &Lifetime) -> Option<(i64, i64)> {
        self.pools.get(l.pool as usize).copied().flatten()
    }

    /// Lifetimes alive just after event `i` (or before the first event when None),
    /// largest first, ties by address then version.
    pub fn live_at(&self, at: Option<usize>) -> Vec<&Lifetime> {
        let mut live: Vec<&Lifetime> = self
            .lifetimes
            .iter()
            .filter(|l| match at {
                Some(i) => l.alive_after(i),
                None => l.alloc.is_none(),
            })
            .collect();
        live.sort_by(|a, b| {
            b.size
                .cmp(&a.size)
                .then(a.addr.cmp(&b.addr))
                .then(a.version.cmp(&b.version))
        });
        live
    }

    /// Allocated bytes just after event `i` (None: before the first event).
    pub fn allocated_at(&self, at: Option<usize>) -> u64 {
        match at {
            Some(i) => self.allocated[i],
            None => self.initial_allocated,
        }
    }

    /// Reserved bytes just after event `i` (None: before the first event).
    pub fn reserved_at(&self, at: Option<usize>) -> i64 {
        let Some(i) = at else {
            return self.initial_reserved;
        };
        match self
            .reserved_changes
            .partition_point(|(e, _)| (*e as usize) <= i)
        {
            0 => self.initial_reserved,
            k => self.reserved_changes[k - 1].1,
        }
    }

    /// The last event at or before `time_us` (None when every event is later or the trace
    /// has no times).
    pub fn event_at_time(&self, time_us: i64) -> Option<usize> {
        let mut best = None;
        for i in 0..self.allocated.len() {
            match self.time_us(i) {
                Some(t) if t > 0 && t <= time_us => best = Some(i),
                Some(t) if t > time_us => break,
                _ => {}
            }
        }
        best
    }
}
