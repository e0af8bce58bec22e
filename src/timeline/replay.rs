//! The replay engine: the one forward pass over a device's trace that every analysis
//! asks.
//!
//! It pairs events by address in order as the official viewer does (spec 3.5, 6.2):
//! an `alloc` opens an allocation, its `free_completed` closes it (a lone `free_requested`
//! only marks it), a `free_completed` with no open allocation is memory allocated before
//! the trace, and blocks alive in the final segments with no open allocation at the end
//! are "survivors" from before the trace. Segment events move reserved memory (spec 6.3).
//!
//! The pass has two halves: pairing (which open allocation each event touches, found by
//! address: `pairing.rs`) and, here, the totals that feed the aggregators. On a long
//! trace pairing runs a chunk of events ahead on a second thread; results do not depend
//! on it.
//!
//! Aggregators ([`Aggregator`]; the shared ones and how they combine are in
//! [`super::aggregators`]) are fed each step with the running totals; they keep only
//! what they need (a peak, a series, a live set, groups), so a command that needs only
//! peaks stores nothing per event. Totals are relative to the state before the first
//! event, because what existed then is only known at the end of the pass (orphan frees
//! and survivors); [`Start`] gives it in [`Aggregator::finish`], and a second pass can be
//! given it up front.

use super::pairing::{BlockBytes, NO_SLOT, PairedRun, Pairing};
use super::{EventIdx, Lifetime, Origin};
use crate::model::frames::FxMap;
use crate::model::{Action, BlockState, DeviceTrace, Segment, Snapshot};
use std::sync::{LazyLock, OnceLock};

/// The shared aggregators, named here too: callers name the engine and what it feeds by
/// one path (`replay::Peaks` beside `replay::DeviceReplay`).
pub use super::aggregators::{
    Lifetimes, LifetimesAt, LifetimesAtPeak, Peak, Peaks, RequestedSeries, ReservedChanges,
    TotalsAt,
};

/// The trace of a device that has none.
static NO_TRACE: LazyLock<DeviceTrace> = LazyLock::new(DeviceTrace::default);

/// A pool id as segments and trace entries carry it (None: unknown).
pub type PoolId = Option<(i64, i64)>;

/// Bytes the caching allocator hands out for a request: at least 512, in multiples of
/// 512 (CUDACachingAllocator `round_size`; `roundup_power2_divisions` and unsplit
/// remainders are not modelled, so this is a lower bound of the real block). Allocations
/// alive in the final segments have their real block size instead
/// ([`DeviceReplay::block_bytes_of`]).
pub fn block_bytes(requested: u64) -> u64 {
    requested.max(1).div_ceil(512) * 512
}

/// Running totals just after an event, relative to the state before the first event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Running {
    /// Requested bytes of live allocations (the official viewer's count).
    pub requested: i64,
    /// Block bytes of live allocations, frees waiting on other streams included
    /// (what `torch.cuda.memory_allocated()` counts).
    pub allocated: i64,
    /// Bytes of the device's segments.
    pub reserved: i64,
}

/// What existed before the first event, known at the end of a pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Start {
    pub requested: u64,
    pub allocated: u64,
    pub reserved: i64,
}

impl Start {
    /// Absolute totals of a running state.
    pub fn requested_after(&self, r: &Running) -> u64 {
        (self.requested as i64 + r.requested).max(0) as u64
    }
    pub fn allocated_after(&self, r: &Running) -> u64 {
        (self.allocated as i64 + r.allocated).max(0) as u64
    }
    pub fn reserved_after(&self, r: &Running) -> i64 {
        self.reserved + r.reserved
    }
}

/// The end of a pass.
pub struct End<'p> {
    pub start: Start,
    /// Totals after the last event (relative).
    pub last: Running,
    /// Allocations alive at the end whose `alloc` is in the trace, by alloc event.
    pub open: &'p [Lifetime],
    /// Allocations from before the trace still alive at the end.
    pub survivors: &'p [Lifetime],
    pub streams: &'p [u64],
    pub pools: &'p [PoolId],
}

/// A block allocated at the end ([`DeviceReplay::final_allocations`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinalAllocation {
    pub addr: u64,
    /// Requested bytes.
    pub size: u64,
    /// The last `alloc` at the address in the trace; None for memory from before it.
    pub last_alloc: Option<usize>,
    /// The stack the block carries (its allocation's, when recorded).
    pub stack: Option<crate::model::StackId>,
}

/// Something that learns from the replay. Every method has an empty default.
pub trait Aggregator {
    /// An allocation opened at event `i`.
    fn alloc(&mut self, _i: usize, _l: &Lifetime, _run: &Running) {}
    /// The user freed an open allocation; its memory counts until `free_completed`.
    fn free_requested(&mut self, _i: usize, _l: &Lifetime, _run: &Running) {}
    /// An allocation's memory went back to the allocator. `l.origin` is
    /// [`Origin::BeforeTrace`] when its `alloc` is not in the trace.
    fn free_completed(&mut self, _i: usize, _l: &Lifetime, _run: &Running) {}
    /// A segment event changed reserved memory by `delta` bytes.
    fn segment(&mut self, _i: usize, _action: Action, _delta: i64, _run: &Running) {}
    /// Every event, after the calls above.
    fn event(&mut self, _i: usize, _action: Action, _run: &Running) {}
    /// The pass is over.
    fn finish(&mut self, _end: &End) {}
    /// Whether it reads [`Lifetime::version`] (labels, export, orderings of lifetimes
    /// kept). Counting versions costs a look-up per event in a map of every address the
    /// trace used, so a pass whose aggregators all say no leaves every version 0.
    fn wants_versions(&self) -> bool {
        false
    }
}

/// A small table of distinct values (streams, pools) and their indices. Past 65535
/// distinct values the last index, which no value holds, stands for "unknown".
struct SmallTable<T> {
    values: Vec<T>,
    index: FxMap<T, u16>,
    /// The value met last and its index: events come in runs of one stream and pool.
    last: Option<(T, u16)>,
}

impl<T: std::hash::Hash + Eq + Copy> SmallTable<T> {
    fn new() -> Self {
        SmallTable {
            values: Vec::new(),
            index: FxMap::default(),
            last: None,
        }
    }

    /// Index of `value`, added when new.
    fn index(&mut self, value: T) -> u16 {
        if let Some((v, i)) = self.last
            && v == value
        {
            return i;
        }
        let i = match self.index.get(&value) {
            Some(&i) => i,
            None if self.values.len() >= u16::MAX as usize => return u16::MAX,
            None => {
                self.values.push(value);
                let i = (self.values.len() - 1) as u16;
                self.index.insert(value, i);
                i
            }
        };
        self.last = Some((value, i));
        i
    }
}

/// Most places of a [`PoolLookup`]'s cache of ranges (a power of two; fewer for a device
/// of few segments).
const POOL_RANGES: usize = 4096;
/// A [`PoolLookup`] keeps a range in the place of the 8 MiB of addresses it was found
/// for.
const POOL_PLACE_SHIFT: u32 = 23;

/// Pools of events, with a cache of the ranges of addresses found (see
/// [`DeviceReplay::pools`]).
pub struct PoolLookup {
    /// Final segments, or gaps between them (no pool): start, end, pool; each in the
    /// place of the 8 MiB of addresses it was last found for. A range is used only for
    /// an address inside it, so a place holding another range costs a search, never a
    /// wrong pool. An empty range (start = end) is an unused place.
    recent: Vec<(u64, u64, PoolId)>,
}

impl PoolLookup {
    pub fn pool(&mut self, r: &DeviceReplay, i: usize) -> PoolId {
        if r.trace.keys.pool_id {
            return Some(r.trace.pool_id(i));
        }
        let addr = r.trace.addr(i);
        let places = self.recent.len();
        let place = &mut self.recent[((addr >> POOL_PLACE_SHIFT) as usize) & (places - 1)];
        if place.0 <= addr && addr < place.1 {
            return place.2;
        }
        *place = r.range_of(addr);
        place.2
    }
}

/// One device of a snapshot, ready to be replayed any number of times.
pub struct DeviceReplay<'a> {
    pub snap: &'a Snapshot,
    pub device: i64,
    pub trace: &'a DeviceTrace,
    /// The final segments of the device.
    final_segments: Vec<&'a Segment>,
    /// Final segments (start, size, pool), by address: the pool of an allocation whose
    /// entry carries none.
    segments: Vec<(u64, u64, PoolId)>,
    /// Their starts, searched apart (a smaller array than the segments').
    segment_starts: Vec<u64>,
    /// Blocks held in the final segments (allocated, or waiting for their free on other
    /// streams), by address: (block size, requested size).
    final_blocks: FxMap<u64, (u64, u64)>,
    /// For each address of `final_blocks`, the last `alloc` at it in the trace.
    last_alloc: OnceLock<FxMap<u64, usize>>,
}

impl<'a> DeviceReplay<'a> {
    pub fn new(snap: &'a Snapshot, device: i64) -> Self {
        let trace = snap.trace(device).unwrap_or(&NO_TRACE);
        Self::with(snap, device, trace, snap.segments_of(device).collect())
    }

    /// Pinned host memory (PyTorch 2.14+): `host_segments` and `host_traces`.
    pub fn host(snap: &'a Snapshot) -> Self {
        Self::with(
            snap,
            -1,
            &snap.host_trace,
            snap.host_segments.iter().collect(),
        )
    }

    fn with(
        snap: &'a Snapshot,
        device: i64,
        trace: &'a DeviceTrace,
        final_segments: Vec<&'a Segment>,
    ) -> Self {
        let mut segments: Vec<(u64, u64, PoolId)> = final_segments
            .iter()
            .map(|s| (s.address, s.total_size, s.pool_id))
            .collect();
        segments.sort_unstable();
        let segment_starts = segments.iter().map(|s| s.0).collect();
        let final_blocks = final_segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state.is_active())
            .map(|b| (b.address, (b.size, b.requested_size)))
            .collect();
        DeviceReplay {
            snap,
            device,
            trace,
            final_segments,
            segments,
            segment_starts,
            final_blocks,
            last_alloc: OnceLock::new(),
        }
    }

    /// Whether an allocation the trace leaves alive at its end is free in the file's
    /// final state: the trace lost its free, or the recording stopped before it (the
    /// segments are taken when the file is written). The final state is the truth at the
    /// end. Never for a file made from a profiler trace, which has no final state.
    pub fn freed_after_trace(&self, l: &Lifetime) -> bool {
        l.origin == Origin::Traced
            && self.snap.features.converted_from.is_none()
            && !self.final_blocks.contains_key(&l.addr)
    }

    /// The last `alloc` at each address that holds a block at the end: the last million
    /// events are searched first, and the rest, when needed, in parallel pieces.
    fn last_alloc(&self) -> &FxMap<u64, usize> {
        use rayon::prelude::*;
        self.last_alloc.get_or_init(|| {
            let wanted = self.final_blocks.len();
            let scan = |range: std::ops::Range<usize>| {
                let mut last = FxMap::default();
                for i in range.rev() {
                    if self.trace.action(i) != Action::Alloc {
                        continue;
                    }
                    let addr = self.trace.addr(i);
                    if self.final_blocks.contains_key(&addr) {
                        last.entry(addr).or_insert(i);
                        if last.len() == wanted {
                            break;
                        }
                    }
                }
                last
            };
            if wanted == 0 {
                return FxMap::default();
            }
            let rest = self.trace.len().saturating_sub(PIECE);
            let mut last = scan(rest..self.trace.len());
            if last.len() < wanted && rest > 0 {
                let pieces: Vec<FxMap<u64, usize>> =
                    pieces(rest).into_par_iter().map(scan).collect();
                for piece in pieces.into_iter().rev() {
                    for (addr, i) in piece {
                        last.entry(addr).or_insert(i);
                    }
                }
            }
            last
        })
    }

    /// The blocks allocated at the end (`active_allocated`), by address, each with the
    /// last `alloc` at its address in the trace (None: allocated before the trace, a
    /// survivor) and the stack the block carries.
    pub fn final_allocations(&self) -> Vec<FinalAllocation> {
        let last = self.last_alloc();
        let mut out: Vec<FinalAllocation> = self
            .final_segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| FinalAllocation {
                addr: b.address,
                size: b.requested_size,
                last_alloc: last.get(&b.address).copied(),
                stack: b.stack,
            })
            .collect();
        out.sort_unstable_by_key(|f| f.addr);
        out
    }

    /// Block bytes of an allocation: what `torch.cuda.memory_allocated()` counts for it.
    /// Exact for allocations alive at the end (their blocks are in the final segments);
    /// the request rounded as the allocator rounds it ([`block_bytes`], a lower bound)
    /// for those freed during the trace.
    pub fn block_bytes_of(&self, l: &Lifetime) -> u64 {
        match l.origin {
            Origin::Survivor => self.block_bytes_at(None, l.addr, l.size),
            Origin::Traced => match l.alloc {
                Some(a) => self.block_bytes_at(Some(a.index()), l.addr, l.size),
                None => self.rounded(l.size),
            },
            Origin::BeforeTrace => self.rounded(l.size),
        }
    }

    /// Sets the version of each lifetime ([`Lifetime::version`]: the frees completed at
    /// its address before it was made; for a survivor, all of them), for sets collected
    /// by a pass that did not count versions. One scan of the trace, in parallel pieces,
    /// looking up only the frees at the lifetimes' addresses.
    pub fn fill_versions(&self, lifetimes: &mut [Lifetime]) {
        use rayon::prelude::*;
        if lifetimes.is_empty() {
            return;
        }
        // A dense number for each address, and a bit per hash of the addresses: most
        // frees are at other addresses, and a bit in a table a few times the set's size
        // (in cache) answers for them without a look-up in the map.
        let mut ids: FxMap<u64, u32> = FxMap::default();
        let id_of: Vec<u32> = lifetimes
            .iter()
            .map(|l| {
                let next = ids.len() as u32;
                *ids.entry(l.addr).or_insert(next)
            })
            .collect();
        let bits = (ids.len() * 8).next_power_of_two().max(64);
        let slot = |addr: u64| {
            (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits.trailing_zeros())) as usize
        };
        let word_and_bit = |addr: u64| {
            let s = slot(addr);
            (s / 64, 1u64 << (s % 64))
        };
        let mut filter = vec![0u64; bits / 64];
        for &addr in ids.keys() {
            let (word, bit) = word_and_bit(addr);
            filter[word] |= bit;
        }
        let maybe = |addr: u64| {
            let (word, bit) = word_and_bit(addr);
            filter[word] & bit != 0
        };
        // The frees completed at those addresses (address number, event), in event order.
        let frees: Vec<Vec<(u32, u32)>> = pieces(self.trace.len())
            .into_par_iter()
            .map(|piece| {
                piece
                    .filter(|&i| self.trace.action(i) == Action::FreeCompleted)
                    .filter_map(|i| {
                        let addr = self.trace.addr(i);
                        if !maybe(addr) {
                            return None;
                        }
                        ids.get(&addr).map(|&id| (id, i as u32))
                    })
                    .collect()
            })
            .collect();
        // Grouped by address, each group in event order (a counting sort).
        let mut starts = vec![0usize; ids.len() + 1];
        for &(id, _) in frees.iter().flatten() {
            starts[id as usize + 1] += 1;
        }
        for k in 1..starts.len() {
            starts[k] += starts[k - 1];
        }
        let mut next = starts.clone();
        let mut events = vec![0u32; starts[ids.len()]];
        for &(id, i) in frees.iter().flatten() {
            events[next[id as usize]] = i;
            next[id as usize] += 1;
        }
        for (l, &id) in lifetimes.iter_mut().zip(&id_of) {
            let id = id as usize;
            let list = &events[starts[id]..starts[id + 1]];
            let made = match l.origin {
                Origin::Traced => l.alloc,
                Origin::BeforeTrace => l.free_completed,
                Origin::Survivor => None,
            };
            l.version = match made {
                Some(e) => list.partition_point(|&f| (f as usize) < e.index()),
                None => list.len(),
            } as u32;
        }
    }

    /// Events in the trace.
    pub fn len(&self) -> usize {
        self.trace.len()
    }

    pub fn is_empty(&self) -> bool {
        self.trace.is_empty()
    }

    /// The final segment holding `addr` (start, end, pool), or else the gap between
    /// final segments that holds it, with no pool.
    fn range_of(&self, addr: u64) -> (u64, u64, PoolId) {
        let i = self.segment_starts.partition_point(|&s| s <= addr);
        let before = i.checked_sub(1).map(|j| {
            let (start, size, pool) = self.segments[j];
            (start, start.saturating_add(size), pool)
        });
        match before {
            Some(segment) if addr < segment.1 => segment,
            _ => (
                before.map_or(0, |s| s.1),
                self.segments.get(i).map_or(u64::MAX, |s| s.0),
                None,
            ),
        }
    }

    /// The pool of allocations and frees: the entry's `pool_id` (2.12 and later), else
    /// the final segment holding its address. A pool look-up that remembers the ranges
    /// found by the addresses they were found for: a pass's allocations come back to
    /// the same segments (or, for memory given back before the end, the same gaps
    /// between them), so it searches the segment list about once per range.
    pub fn pools(&self) -> PoolLookup {
        // A place for each segment and each gap, as far as the most allowed.
        let places = (2 * self.segments.len() + 1)
            .next_power_of_two()
            .min(POOL_RANGES);
        PoolLookup {
            recent: vec![(0, 0, None); places],
        }
    }

    /// Reserved bytes at the end: the final segments.
    pub fn final_reserved(&self) -> i64 {
        self.segments.iter().map(|s| s.1 as i64).sum()
    }

    /// Replays every event into `agg`. A long trace is paired on a second thread while
    /// this one runs the aggregators, a chunk of events behind (see the module's notes).
    pub fn run<A: Aggregator>(&self, agg: A) -> Start {
        let on_thread = self.trace.len() >= PARALLEL_MIN_EVENTS && rayon::current_num_threads() > 1;
        self.run_in_chunks(agg, PAIRING_CHUNK, on_thread)
    }

    fn run_in_chunks<A: Aggregator>(&self, mut agg: A, chunk: usize, on_thread: bool) -> Start {
        let track_versions = agg.wants_versions();
        let chunks = pieces_of(self.trace.len(), chunk);
        let mut pass = Pass::new(self);
        let pairing = if on_thread {
            // Found here, in parallel, not on the pairing thread: a thread outside the
            // pool that waits on the pool could wait on workers that wait on it.
            self.last_alloc();
            std::thread::scope(|scope| {
                let (sender, receiver) = std::sync::mpsc::sync_channel(4);
                let pairer = scope.spawn(move || {
                    let mut pairing = Pairing::new(track_versions);
                    for range in chunks {
                        if sender.send(pairing.pair(self.trace, self, range)).is_err() {
                            break;
                        }
                    }
                    pairing
                });
                for paired in receiver {
                    pass.step(&paired, &mut agg);
                }
                pairer
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e))
            })
        } else {
            let mut pairing = Pairing::new(track_versions);
            for range in chunks {
                pass.step(&pairing.pair(self.trace, self, range), &mut agg);
            }
            pairing
        };
        pass.finish(pairing, agg)
    }
}

/// Events per piece of the searches over a whole trace that run in parallel.
const PIECE: usize = 1 << 20;

/// `0..len` in pieces of `size` events, in order.
fn pieces_of(len: usize, size: usize) -> Vec<std::ops::Range<usize>> {
    (0..len)
        .step_by(size)
        .map(|start| start..(start + size).min(len))
        .collect()
}

/// `0..len` in pieces of [`PIECE`] events, in order.
fn pieces(len: usize) -> Vec<std::ops::Range<usize>> {
    pieces_of(len, PIECE)
}

/// Events paired per chunk (and handed between the two threads of a replay at once).
const PAIRING_CHUNK: usize = 1 << 16;

/// Traces shorter than this are paired on the replay's own thread.
const PARALLEL_MIN_EVENTS: usize = 1 << 20;

/// The half of a replay that keeps the totals and feeds the aggregators, event by event.
struct Pass<'r, 'a> {
    replay: &'r DeviceReplay<'a>,
    streams: SmallTable<u64>,
    pools: SmallTable<PoolId>,
    pool_lookup: PoolLookup,
    /// The open allocations, by the slot pairing gave them, and their block bytes.
    slots: Vec<Lifetime>,
    blocks: Vec<u64>,
    run: Running,
    orphans: Start,
}

impl<'r, 'a> Pass<'r, 'a> {
    fn new(replay: &'r DeviceReplay<'a>) -> Self {
        Pass {
            replay,
            streams: SmallTable::new(),
            pools: SmallTable::new(),
            pool_lookup: replay.pools(),
            slots: Vec::new(),
            blocks: Vec::new(),
            run: Running::default(),
            orphans: Start::default(),
        }
    }

    fn step<A: Aggregator>(&mut self, paired: &PairedRun, agg: &mut A) {
        let r = self.replay;
        let trace = r.trace;
        for (i, p) in (paired.start..).zip(&paired.pairs) {
            let action = trace.action(i);
            match action {
                Action::Alloc => {
                    let e = trace.get(i);
                    let pool = self.pool_lookup.pool(r, i);
                    let l = Lifetime {
                        addr: e.addr,
                        size: e.size,
                        version: p.version,
                        origin: Origin::Traced,
                        alloc: Some(EventIdx::new(i)),
                        free_requested: None,
                        free_completed: None,
                        stream: self.streams.index(e.stream),
                        pool: self.pools.index(pool),
                        stack: e.stack.map_or(u32::MAX, |s| s.0),
                    };
                    let block = p.block;
                    self.run.requested += e.size as i64;
                    self.run.allocated += block as i64;
                    agg.alloc(i, &l, &self.run);
                    let slot = p.slot as usize;
                    if slot == self.slots.len() {
                        self.slots.push(l);
                        self.blocks.push(block);
                    } else {
                        self.slots[slot] = l;
                        self.blocks[slot] = block;
                    }
                }
                Action::FreeRequested if p.slot != NO_SLOT => {
                    let l = &mut self.slots[p.slot as usize];
                    l.free_requested = Some(EventIdx::new(i));
                    agg.free_requested(i, l, &self.run);
                }
                Action::FreeCompleted => {
                    let (l, block) = if p.slot != NO_SLOT {
                        let slot = p.slot as usize;
                        let (mut l, block) = (self.slots[slot], self.blocks[slot]);
                        l.free_completed = Some(EventIdx::new(i));
                        (l, block)
                    } else {
                        let e = trace.get(i);
                        let pool = self.pool_lookup.pool(r, i);
                        let block = p.block;
                        self.orphans.requested += e.size;
                        self.orphans.allocated += block;
                        let l = Lifetime {
                            addr: e.addr,
                            size: e.size,
                            version: p.version,
                            origin: Origin::BeforeTrace,
                            alloc: None,
                            free_requested: None,
                            free_completed: Some(EventIdx::new(i)),
                            stream: self.streams.index(e.stream),
                            pool: self.pools.index(pool),
                            // The stack of the free: the viewer shows it as "alloc not
                            // recorded, stack trace for free".
                            stack: e.stack.map_or(u32::MAX, |s| s.0),
                        };
                        (l, block)
                    };
                    self.run.requested -= l.size as i64;
                    self.run.allocated -= block as i64;
                    agg.free_completed(i, &l, &self.run);
                }
                Action::SegmentAlloc
                | Action::SegmentMap
                | Action::SegmentFree
                | Action::SegmentUnmap => {
                    let size = trace.size(i) as i64;
                    let delta = match action {
                        Action::SegmentAlloc | Action::SegmentMap => size,
                        _ => -size,
                    };
                    self.run.reserved += delta;
                    agg.segment(i, action, delta, &self.run);
                }
                _ => {}
            }
            agg.event(i, action, &self.run);
        }
    }

    fn finish<A: Aggregator>(mut self, pairing: Pairing, mut agg: A) -> Start {
        let r = self.replay;
        let version_at = |addr: u64| {
            pairing
                .versions
                .as_ref()
                .and_then(|v| v.get(&addr).copied())
                .unwrap_or(0)
        };
        // Survivors: final active_allocated blocks with no open allocation (spec 6.2
        // phase 2).
        let mut survivors = Vec::new();
        for s in &r.final_segments {
            for b in &s.blocks {
                if b.state != BlockState::ActiveAllocated || pairing.open.contains_key(&b.address) {
                    continue;
                }
                survivors.push(Lifetime {
                    addr: b.address,
                    size: b.requested_size,
                    version: version_at(b.address),
                    origin: Origin::Survivor,
                    alloc: None,
                    free_requested: None,
                    free_completed: None,
                    stream: self.streams.index(s.stream),
                    pool: self.pools.index(s.pool_id),
                    stack: b.stack.map_or(u32::MAX, |s| s.0),
                });
            }
        }
        // Open at the end: every slot not given back (allocations replaced at their
        // address by another keep theirs), by alloc event.
        drop(self.blocks);
        let mut given_back = vec![false; self.slots.len()];
        for &slot in &pairing.free_slots {
            given_back[slot as usize] = true;
        }
        drop(pairing);
        let mut open = self.slots;
        let mut slot = 0;
        open.retain(|_| {
            slot += 1;
            !given_back[slot - 1]
        });
        drop(given_back);
        open.sort_unstable_by_key(|l| l.alloc);
        let survivor_requested: u64 = survivors.iter().map(|l| l.size).sum();
        let survivor_allocated: u64 = survivors.iter().map(|l| r.block_bytes_of(l)).sum();
        let start = Start {
            requested: self.orphans.requested + survivor_requested,
            allocated: self.orphans.allocated + survivor_allocated,
            reserved: r.final_reserved() - self.run.reserved,
        };
        agg.finish(&End {
            start,
            last: self.run,
            open: &open,
            survivors: &survivors,
            streams: &self.streams.values,
            pools: &self.pools.values,
        });
        start
    }
}

impl BlockBytes for DeviceReplay<'_> {
    /// Block bytes of the allocation of `size` bytes made at `alloc` (None: before the
    /// trace) at `addr`: its block's real size when it is the block the final segments
    /// hold, else [`block_bytes`].
    fn block_bytes_at(&self, alloc: Option<usize>, addr: u64, size: u64) -> u64 {
        match self.final_blocks.get(&addr) {
            Some(&(block, requested))
                if requested == size
                    && block >= size
                    && (alloc.is_none() || self.last_alloc().get(&addr).copied() == alloc) =>
            {
                block
            }
            _ => self.rounded(size),
        }
    }

    /// Block bytes of a request that holds no final block: the allocator's rounding, but
    /// for a profiler trace, whose sizes are already what the allocator handed out (and,
    /// for the CPU allocator, not rounded to 512 bytes).
    fn rounded(&self, size: u64) -> u64 {
        if self.snap.features.converted_from.is_some() {
            size
        } else {
            block_bytes(size)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::trace::NewEvent;
    use crate::model::{Block, Segment, SegmentType};

    fn segment(address: u64, total_size: u64, pool: (i64, i64)) -> Segment {
        Segment {
            device: 0,
            address,
            total_size,
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream: 0,
            segment_type: SegmentType::Large,
            pool_id: Some(pool),
            is_expandable: false,
            stack: None,
            blocks: Vec::new(),
        }
    }

    /// A snapshot of `trace` whose one segment, at `base`, holds blocks of 0x1000 bytes
    /// with these requested sizes and states.
    fn with_blocks(trace: DeviceTrace, base: u64, blocks: &[(u64, BlockState)]) -> Snapshot {
        let mut seg = segment(base, blocks.len() as u64 * 0x1000, (0, 0));
        seg.blocks = (0..)
            .zip(blocks)
            .map(|(k, &(requested_size, state))| Block {
                address: base + k * 0x1000,
                size: 0x1000,
                requested_size,
                state,
                stack: None,
            })
            .collect();
        Snapshot {
            segments: vec![seg],
            device_traces: vec![trace],
            ..Snapshot::default()
        }
    }

    /// The pool one look-up finds for an allocation at each of `addrs`, in turn, on a
    /// device of `segments`.
    fn pools_of(addrs: &[u64], segments: Vec<Segment>) -> Vec<PoolId> {
        let mut trace = DeviceTrace::default();
        for &addr in addrs {
            trace.push(NewEvent {
                action: Some(Action::Alloc),
                addr,
                size: 512,
                ..NewEvent::default()
            });
        }
        let snap = Snapshot {
            segments,
            device_traces: vec![trace],
            ..Snapshot::default()
        };
        let replay = DeviceReplay::new(&snap, 0);
        let mut lookup = replay.pools();
        (0..addrs.len()).map(|i| lookup.pool(&replay, i)).collect()
    }

    #[test]
    fn pools_of_addresses_that_share_a_place_of_the_look_up_are_each_their_own() {
        // 32 GiB apart, these addresses share a place of the look-up's cache; a segment
        // of 64 MiB spans eight places, and the gap after it spans the rest.
        const GIB: u64 = 1 << 30;
        let addrs = [
            0x1000,
            32 * GIB + 0x1000,
            0x1000,
            63 << 20,
            32 * GIB + (63 << 20),
            64 << 20,
            32 * GIB + (64 << 20),
            63 << 20,
            32 * GIB,
            0,
        ];
        let found = pools_of(
            &addrs,
            vec![
                segment(0, 64 << 20, (1, 0)),
                segment(32 * GIB, 64 << 20, (2, 0)),
            ],
        );
        let (one, two) = (Some((1, 0)), Some((2, 0)));
        assert_eq!(found, [one, two, one, one, two, None, None, one, two, one]);
    }

    #[test]
    fn pools_come_from_the_final_segment_holding_the_address_whatever_came_before() {
        let addrs = [
            0x1000,
            0x1fff,
            0x2000,
            0x4fff,
            0x5000,
            0x5800,
            0x6000,
            0x10,
            0x1800,
            0x9000,
            0x5fff,
            0x3000,
            0x1000,
            u64::MAX,
        ];
        let found = pools_of(
            &addrs,
            vec![
                segment(0x5000, 0x1000, (2, 0)),
                segment(0x1000, 0x1000, (1, 0)),
            ],
        );
        let one = Some((1, 0));
        let two = Some((2, 0));
        assert_eq!(
            found,
            [
                one, one, None, None, two, two, None, None, one, None, two, None, one, None
            ]
        );
    }

    /// One call an aggregator got: its kind, event, lifetime, delta or action, totals.
    type Call = (char, usize, Option<Lifetime>, i64, Running);
    /// What [`End`] gave: the start, the last totals, open lifetimes, survivors,
    /// streams, pools.
    type Ending = (
        Start,
        Running,
        Vec<Lifetime>,
        Vec<Lifetime>,
        Vec<u64>,
        Vec<PoolId>,
    );

    /// Every call an aggregator gets, with its arguments.
    #[derive(Default, Debug, PartialEq)]
    struct Recorder {
        calls: Vec<Call>,
        end: Option<Ending>,
        versions: bool,
    }

    impl Aggregator for Recorder {
        fn alloc(&mut self, i: usize, l: &Lifetime, run: &Running) {
            self.calls.push(('a', i, Some(*l), 0, *run));
        }
        fn free_requested(&mut self, i: usize, l: &Lifetime, run: &Running) {
            self.calls.push(('r', i, Some(*l), 0, *run));
        }
        fn free_completed(&mut self, i: usize, l: &Lifetime, run: &Running) {
            self.calls.push(('f', i, Some(*l), 0, *run));
        }
        fn segment(&mut self, i: usize, _action: Action, delta: i64, run: &Running) {
            self.calls.push(('s', i, None, delta, *run));
        }
        fn event(&mut self, i: usize, action: Action, run: &Running) {
            self.calls.push(('e', i, None, action as i64, *run));
        }
        fn finish(&mut self, end: &End) {
            self.end = Some((
                end.start,
                end.last,
                end.open.to_vec(),
                end.survivors.to_vec(),
                end.streams.to_vec(),
                end.pools.to_vec(),
            ));
        }
        fn wants_versions(&self) -> bool {
            self.versions
        }
    }

    /// A trace of 40,000 events over 48 addresses (allocations replaced while open,
    /// frees of memory from before the trace, frees requested and completed, segment
    /// events, two streams), ending in a segment whose blocks hold some of the last
    /// allocations and some blocks with none.
    fn busy_snapshot() -> Snapshot {
        const BASE: u64 = 0x7000_0000;
        let mut trace = DeviceTrace::default();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..40_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = seed >> 33;
            let action = match r % 11 {
                0..=3 => Action::Alloc,
                4..=5 => Action::FreeRequested,
                6..=8 => Action::FreeCompleted,
                9 => Action::SegmentAlloc,
                _ => Action::SegmentFree,
            };
            trace.push(NewEvent {
                action: Some(action),
                addr: BASE + (r / 11 % 48) * 0x1000,
                size: 512 * (1 + (r >> 12) % 4),
                stream: (r >> 20) % 2,
                ..NewEvent::default()
            });
        }
        let blocks: Vec<(u64, BlockState)> = (0..48)
            .map(|k| {
                let state = if k % 3 == 0 {
                    BlockState::Inactive
                } else {
                    BlockState::ActiveAllocated
                };
                (512 * (1 + k % 4), state)
            })
            .collect();
        with_blocks(trace, BASE, &blocks)
    }

    #[test]
    fn pairing_on_a_second_thread_gives_every_aggregator_the_same_calls() {
        let snap = busy_snapshot();
        let replay = DeviceReplay::new(&snap, 0);
        for versions in [false, true] {
            let record = |chunk: usize, on_thread: bool| {
                let mut rec = Recorder {
                    versions,
                    ..Recorder::default()
                };
                let start = replay.run_in_chunks(&mut rec, chunk, on_thread);
                (start, rec)
            };
            let (start, one) = record(usize::MAX, false);
            // The replay went through every kind of case.
            let count = |kind: char| one.calls.iter().filter(|c| c.0 == kind).count();
            assert!(count('a') > 10_000 && count('r') > 3_000 && count('f') > 5_000);
            let orphan = |c: &&Call| c.0 == 'f' && c.2.unwrap().origin == Origin::BeforeTrace;
            assert!(one.calls.iter().filter(orphan).count() > 1_000);
            let (_, _, open, survivors, streams, _) = one.end.as_ref().unwrap();
            assert!(open.len() > 48, "allocations replaced while open stay open");
            assert!(!survivors.is_empty() && streams.len() == 2);
            assert!(start.allocated > 0);
            for (chunk, on_thread) in [(7, true), (4096, true), (1, false), (4096, false)] {
                let (other_start, other) = record(chunk, on_thread);
                assert_eq!(other_start, start);
                assert!(
                    other == one,
                    "chunk {chunk}, thread {on_thread}, versions {versions}"
                );
            }
        }
    }

    #[test]
    fn a_long_trace_searched_in_pieces_gives_each_final_block_its_last_alloc_and_versions() {
        // 2.5M events: allocations at the final blocks' addresses in every piece the
        // search splits the trace into; one final block is never allocated.
        const BASE: u64 = 0x7000_0000;
        let mut trace = DeviceTrace::default();
        let n = 2_500_000;
        for i in 0..n {
            // Pieces: [0, 1M), [1M, 1.5M), and the last million [1.5M, 2.5M).
            let block = match i {
                10 | 1_100_000 => Some(0),
                1_200_000 | 1_400_000 => Some(1),
                500_000 | 2_400_000 => Some(2),
                _ => None,
            };
            let (action, addr) = match block {
                Some(k) => (Action::Alloc, BASE + k * 0x1000),
                None if i % 2 == 0 => (Action::Alloc, 0x1_0000_0000 + (i as u64 % 64) * 512),
                None => (Action::FreeCompleted, BASE + (i as u64 / 2 % 4) * 0x1000),
            };
            trace.push(NewEvent {
                action: Some(action),
                addr,
                size: 512,
                ..NewEvent::default()
            });
        }
        let snap = with_blocks(trace, BASE, &[(512, BlockState::ActiveAllocated); 4]);
        let replay = DeviceReplay::new(&snap, 0);
        let mut found: Vec<(u64, usize)> =
            replay.last_alloc().iter().map(|(&a, &i)| (a, i)).collect();
        found.sort_unstable();
        assert_eq!(
            found,
            [
                (BASE, 1_100_000),
                (BASE + 0x1000, 1_400_000),
                (BASE + 0x2000, 2_400_000)
            ]
        );
        // Versions, counted in the same pieces: the frees completed at the address
        // before the allocation (all of them for a block with no alloc in the trace).
        let made = [10, 1_100_000, 1_400_000, 500_000, 2_400_000];
        let mut lifetimes: Vec<Lifetime> = made
            .iter()
            .map(|&i| Lifetime {
                addr: snap.device_traces[0].addr(i),
                size: 512,
                version: 0,
                origin: Origin::Traced,
                alloc: Some(EventIdx::new(i)),
                free_requested: None,
                free_completed: None,
                stream: 0,
                pool: 0,
                stack: u32::MAX,
            })
            .collect();
        lifetimes.push(Lifetime {
            addr: BASE + 0x3000,
            origin: Origin::Survivor,
            alloc: None,
            ..lifetimes[0]
        });
        replay.fill_versions(&mut lifetimes);
        let trace = &snap.device_traces[0];
        let frees_before = |addr: u64, end: usize| {
            (0..end)
                .filter(|&i| trace.action(i) == Action::FreeCompleted && trace.addr(i) == addr)
                .count() as u32
        };
        let want: Vec<u32> = lifetimes
            .iter()
            .map(|l| frees_before(l.addr, l.alloc.map_or(n, |a| a.index())))
            .collect();
        let got: Vec<u32> = lifetimes.iter().map(|l| l.version).collect();
        assert_eq!(got, want);
        assert!(want.iter().all(|&v| v > 0) && want[1] > want[0]);
    }
}
