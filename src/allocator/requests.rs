//! A device's trace as requests to the allocator, and what each allocator call recorded
//! (spec 4.4, "Replay driver").
//!
//! Takes a [`DeviceTrace`]; gives [`Requests`]: the *commands* (each `alloc` with its
//! requested size and stream, each completed free, each deferred free, the inferred
//! `empty_cache` calls, the requests that ran out of memory) and, beside each allocator
//! call, the *outputs* the recording shows for it (its `segment_*` entries and the
//! address it returned), which only the identity check reads.
//!
//! Allocations are named by a tag, not an address, so that a replay whose addresses
//! differ still frees the right block: each `alloc` gets a new tag, and its
//! `free_completed` is paired by address with the allocation alive there (the viewer's
//! versioned addresses). A free with no allocation before it in the trace names a block
//! from before recording: it gets a tag of its own, listed in [`Requests::before`].
//!
//! How the calls are cut out of the trace: one `malloc` is the `segment_*` entries since
//! the last command, then its `alloc` (or `oom`). A burst of `segment_free` or
//! `segment_unmap` entries that no `alloc` follows, or whose stack runs through
//! `empty_cache`, is an `empty_cache()` call (no entry marks them). A `free_completed`
//! that follows its `free_requested` at once is a plain free; one that comes later was
//! waiting for other streams, and one that comes after the segment frees of a `malloc`
//! was completed by that call's out-of-memory retry.

use super::model::ModelEvent;
use crate::model::frames::FxMap;
use crate::model::{Action, DeviceTrace, FrameTable, StackId};
use std::collections::BTreeMap;
use std::ops::Range;

/// One `segment_*` entry of the recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub event: u32,
}

impl Recorded {
    /// A `segment_free` or `segment_unmap`.
    pub fn releases(&self) -> bool {
        matches!(self.action, Action::SegmentFree | Action::SegmentUnmap)
    }

    /// Whether the model's event `e` is this entry (its kind, address and size).
    pub fn is_model(&self, e: &ModelEvent) -> bool {
        let (action, addr, size) = match *e {
            ModelEvent::SegmentAlloc { addr, size, .. } => (Action::SegmentAlloc, addr, size),
            ModelEvent::SegmentFree { addr, size, .. } => (Action::SegmentFree, addr, size),
            ModelEvent::SegmentMap { addr, size, .. } => (Action::SegmentMap, addr, size),
            ModelEvent::SegmentUnmap { addr, size, .. } => (Action::SegmentUnmap, addr, size),
            ModelEvent::FreeCompleted { .. } => return false,
        };
        self.action == action && self.addr == addr && self.size == size
    }
}

/// An allocation request ([`Requests::alloc_at`]): as [`Request::Alloc`] has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocAt {
    pub tag: u32,
    pub size: u64,
    pub stream: u64,
    pub pool: (i64, i64),
    pub event: u32,
}

/// One command to the allocator, in recorded order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Alloc {
        tag: u32,
        /// The requested (unrounded) size.
        size: u64,
        stream: u64,
        /// The private pool (`(0, 0)`: the default one).
        pool: (i64, i64),
        /// Its `alloc` entry (which holds the recorded address).
        event: u32,
        outputs: Range<u32>,
    },
    /// The user freed a block other streams still use: it waits.
    FreeRequested { tag: u32, event: u32 },
    /// `free_completed`: the block goes back to its pool.
    Free { tag: u32, event: u32 },
    /// An inferred `empty_cache()` call; `event` is its first entry.
    EmptyCache { event: u32, outputs: Range<u32> },
    /// A request that ran out of memory (`oom`); `size` is the rounded request.
    Oom {
        size: u64,
        stream: u64,
        pool: (i64, i64),
        /// Its `oom` entry (which holds `device_free`, what the device had left).
        event: u32,
        outputs: Range<u32>,
    },
}

/// A request as kept: 20 bytes. Streams and pools by index (at most [`MAX_DISTINCT`] of
/// each: a recording with more is not replayed, see [`Requests::too_many`]); outputs by
/// count, in order; a size of [`SIZE_ESCAPE`] or more in [`Requests::large_sizes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Packed {
    size: u32,
    tag: u32,
    event: u32,
    outputs_len: u32,
    stream: u16,
    pool: u16,
}

/// Bits of `Packed::outputs_len` that hold the kind.
const KIND_SHIFT: u32 = 29;

/// A packed size that stands for a size of 4 GiB or more, kept apart.
const SIZE_ESCAPE: u32 = u32::MAX;

const _: () = assert!(std::mem::size_of::<Packed>() == 20);

impl Packed {
    fn kind(&self) -> Kind {
        match self.outputs_len >> KIND_SHIFT {
            0 => Kind::Alloc,
            1 => Kind::FreeRequested,
            2 => Kind::Free,
            3 => Kind::EmptyCache,
            _ => Kind::Oom,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Alloc,
    FreeRequested,
    Free,
    EmptyCache,
    Oom,
}

impl Request {
    pub fn event(&self) -> u32 {
        match *self {
            Request::Alloc { event, .. }
            | Request::FreeRequested { event, .. }
            | Request::Free { event, .. }
            | Request::EmptyCache { event, .. }
            | Request::Oom { event, .. } => event,
        }
    }
}

/// A block allocated before the trace and freed in it: known by its address and the
/// requested size its free recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeforeBlock {
    pub tag: u32,
    pub addr: u64,
    pub requested: u64,
    pub stream: u64,
    /// Its `free_completed` (u32::MAX: its free was requested and never completed).
    pub freed_at: u32,
}

/// Distinct streams, and distinct pools, the requests tell apart.
pub const MAX_DISTINCT: usize = u16::MAX as usize;

/// What a recording has more of than [`MAX_DISTINCT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TooMany {
    Streams,
    Pools,
}

/// A device's trace as requests.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    items: Vec<Packed>,
    /// Sizes of [`SIZE_ESCAPE`] bytes or more, by the index of their request, ascending.
    large_sizes: Vec<(u32, u64)>,
    /// Streams and private pools of the requests, by first appearance.
    streams: Vec<u64>,
    stream_index: FxMap<u64, u16>,
    pools: Vec<(i64, i64)>,
    pool_index: FxMap<(i64, i64), u16>,
    /// Streams or pools past [`MAX_DISTINCT`] were met: their requests could not be told
    /// apart, and the recording is not replayed.
    pub too_many: Option<TooMany>,
    /// Outputs of the allocator calls, indexed by the calls' `outputs` ranges.
    pub outputs: Vec<Recorded>,
    pub before: Vec<BeforeBlock>,
    /// Tags in use: `0..tags`.
    pub tags: u32,
    /// Allocations traced (`alloc` entries), recorded OOMs and inferred `empty_cache`
    /// calls.
    pub allocs: u64,
    pub ooms: u64,
    pub empty_caches: u64,
    /// Tags of traced allocations still alive at the end, by address.
    pub alive_at_end: BTreeMap<u64, u32>,
}

/// Where the private pool of an allocation comes from: the entry's own pool id when it
/// has one, else the final segment holding its address.
pub struct PoolLookup {
    /// (start, end, pool) of the final segments in private pools, by start.
    private: Vec<(u64, u64, (i64, i64))>,
}

impl PoolLookup {
    pub fn new(segments: impl Iterator<Item = (u64, u64, Option<(i64, i64)>)>) -> PoolLookup {
        let mut private: Vec<(u64, u64, (i64, i64))> = segments
            .filter_map(|(a, s, p)| {
                p.filter(|p| *p != (0, 0))
                    .map(|p| (a, a.saturating_add(s), p))
            })
            .collect();
        private.sort_unstable();
        PoolLookup { private }
    }

    fn of(&self, addr: u64) -> (i64, i64) {
        let i = self.private.partition_point(|s| s.0 <= addr);
        i.checked_sub(1)
            .map(|i| self.private[i])
            .filter(|s| addr < s.1)
            .map_or((0, 0), |s| s.2)
    }
}

/// Whether a stack runs through `empty_cache` (Python's `torch.cuda.empty_cache` or the
/// C++ `emptyCache`).
fn through_empty_cache(frames: &FrameTable, stack: StackId, memo: &mut FxMap<u32, bool>) -> bool {
    *memo.entry(stack.0).or_insert_with(|| {
        frames.stack(stack).iter().any(|&f| {
            let name = frames.str(frames.frame(f).name);
            name == "empty_cache" || name.contains("emptyCache")
        })
    })
}

struct Builder<'a> {
    trace: &'a DeviceTrace,
    frames: &'a FrameTable,
    pools: &'a PoolLookup,
    out: Requests,
    /// Segment entries since the last command.
    open: Vec<u32>,
    /// Deferred frees completed inside the open call (after its segment frees).
    late_frees: Vec<Request>,
    /// Deferred frees completed between calls: completed at the start of the next
    /// `malloc` (`process_events`), unless segment releases follow them, which makes
    /// them the synchronisation of a cache flush (`release_cached_blocks`), inside it.
    held_frees: Vec<Request>,
    /// Addresses whose free was requested and waits for other streams (Some: a block
    /// from before recording, its place in [`Requests::before`]).
    deferred: FxMap<u64, Option<usize>>,
    live: FxMap<u64, u32>,
    memo: FxMap<u32, bool>,
}

impl Builder<'_> {
    fn recorded(&self, i: u32) -> Recorded {
        let e = self.trace.get(i as usize);
        Recorded {
            action: e.action,
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            event: i,
        }
    }

    fn push_outputs(&mut self, events: &[u32]) -> Range<u32> {
        let start = self.out.outputs.len() as u32;
        for &i in events {
            let r = self.recorded(i);
            self.out.outputs.push(r);
        }
        start..self.out.outputs.len() as u32
    }

    /// The open entries as an `empty_cache()` call, when there are any.
    fn flush_empty_cache(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let open = std::mem::take(&mut self.open);
        let outputs = self.push_outputs(&open);
        self.push(Request::EmptyCache {
            event: open[0],
            outputs,
        });
        self.out.empty_caches += 1;
        self.push_late();
    }

    /// Before a `malloc`: its leading segment releases whose stack runs through
    /// `empty_cache` were a call of their own.
    fn split_empty_cache(&mut self) {
        let k = self
            .open
            .iter()
            .take_while(|&&i| {
                matches!(
                    self.trace.action(i as usize),
                    Action::SegmentFree | Action::SegmentUnmap
                ) && self
                    .trace
                    .stack(i as usize)
                    .is_some_and(|s| through_empty_cache(self.frames, s, &mut self.memo))
            })
            .count();
        if k > 0 {
            let rest = self.open.split_off(k);
            self.flush_empty_cache();
            self.open = rest;
        }
    }

    fn push(&mut self, r: Request) {
        self.out.push(r);
    }

    /// The held frees, as completed before what comes next.
    fn push_held(&mut self) {
        for r in std::mem::take(&mut self.held_frees) {
            self.out.push(r);
        }
    }

    fn push_late(&mut self) {
        for r in std::mem::take(&mut self.late_frees) {
            self.out.push(r);
        }
    }

    fn tag(&mut self) -> u32 {
        let t = self.out.tags;
        self.out.tags += 1;
        t
    }

    fn event(&mut self, i: u32) {
        let t = self.trace;
        let idx = i as usize;
        let action = t.action(idx);
        match action {
            Action::SegmentFree | Action::SegmentUnmap => {
                let held = std::mem::take(&mut self.held_frees);
                self.late_frees.extend(held);
            }
            Action::FreeCompleted => {}
            _ => self.push_held(),
        }
        match action {
            Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap => self.open.push(i),
            Action::Alloc => {
                self.split_empty_cache();
                let e = t.get(idx);
                let tag = self.tag();
                let open = std::mem::take(&mut self.open);
                let outputs = self.push_outputs(&open);
                let pool = match t.pool_id(idx) {
                    (0, 0) => self.pools.of(e.addr),
                    p => p,
                };
                self.push(Request::Alloc {
                    tag,
                    size: e.size,
                    stream: e.stream,
                    pool,
                    event: i,
                    outputs,
                });
                self.out.allocs += 1;
                self.push_late();
                self.live.insert(e.addr, tag);
            }
            Action::Oom => {
                self.split_empty_cache();
                let e = t.get(idx);
                let open = std::mem::take(&mut self.open);
                let outputs = self.push_outputs(&open);
                self.push(Request::Oom {
                    size: e.size,
                    stream: e.stream,
                    pool: t.pool_id(idx),
                    event: i,
                    outputs,
                });
                self.out.ooms += 1;
                self.push_late();
            }
            Action::FreeRequested => {
                let addr = t.addr(idx);
                let completes_next = idx + 1 < t.len()
                    && t.action(idx + 1) == Action::FreeCompleted
                    && t.addr(idx + 1) == addr;
                if !completes_next {
                    let (tag, before) = match self.live.get(&addr) {
                        Some(&tag) => (tag, None),
                        None => {
                            // A block from before recording: it waits as any other
                            // (a cache flush completes it), so it is known from here.
                            let e = t.get(idx);
                            let tag = self.tag();
                            self.out.before.push(BeforeBlock {
                                tag,
                                addr,
                                requested: e.size,
                                stream: e.stream,
                                freed_at: u32::MAX,
                            });
                            self.live.insert(addr, tag);
                            (tag, Some(self.out.before.len() - 1))
                        }
                    };
                    self.deferred.insert(addr, before);
                    self.flush_empty_cache();
                    self.push(Request::FreeRequested { tag, event: i });
                }
            }
            Action::FreeCompleted => {
                let e = t.get(idx);
                let plain = idx > 0
                    && t.action(idx - 1) == Action::FreeRequested
                    && t.addr(idx - 1) == e.addr;
                let deferred = self.deferred.remove(&e.addr);
                if let Some(Some(k)) = deferred {
                    self.out.before[k].freed_at = i;
                }
                let tag = match self.live.remove(&e.addr) {
                    Some(tag) => tag,
                    None => {
                        let tag = self.tag();
                        self.out.before.push(BeforeBlock {
                            tag,
                            addr: e.addr,
                            requested: e.size,
                            stream: e.stream,
                            freed_at: i,
                        });
                        tag
                    }
                };
                let free = Request::Free { tag, event: i };
                if self.open.is_empty() && deferred.is_some() && !plain {
                    self.held_frees.push(free);
                } else if plain || self.open.is_empty() {
                    self.push_held();
                    self.flush_empty_cache();
                    self.push(free);
                } else {
                    self.late_frees.push(free);
                }
            }
            _ => {}
        }
    }
}

impl Requests {
    /// The requests of `trace`; `pools` says which allocations went to private pools.
    pub fn build(trace: &DeviceTrace, frames: &FrameTable, pools: &PoolLookup) -> Requests {
        let mut b = Builder {
            trace,
            frames,
            pools,
            out: Requests::default(),
            open: Vec::new(),
            late_frees: Vec::new(),
            held_frees: Vec::new(),
            deferred: FxMap::default(),
            live: FxMap::default(),
            memo: FxMap::default(),
        };
        // At most one request per entry: reserved once, not grown by copies.
        b.out.items.reserve_exact(trace.len());
        for i in 0..trace.len() {
            b.event(i as u32);
        }
        b.push_held();
        b.flush_empty_cache();
        b.push_late();
        b.out.alive_at_end = b.live.into_iter().collect();
        b.out
    }

    /// Requests made up rather than recorded (a predicted stream): no outputs, each
    /// `Alloc` and `Oom` counted; `tags` is how many tags they use.
    pub fn from_commands(commands: impl IntoIterator<Item = Request>, tags: u32) -> Requests {
        let mut out = Requests {
            tags,
            ..Requests::default()
        };
        for r in commands {
            match r {
                Request::Alloc { .. } => out.allocs += 1,
                Request::Oom { .. } => out.ooms += 1,
                Request::EmptyCache { .. } => out.empty_caches += 1,
                _ => {}
            }
            out.push(r);
        }
        out
    }

    /// The outputs of a call.
    pub fn outputs_of(&self, r: &Range<u32>) -> &[Recorded] {
        &self.outputs[r.start as usize..r.end as usize]
    }

    /// The outputs of request `r` (none for a free).
    pub fn outputs_of_request(&self, r: &Request) -> &[Recorded] {
        match r {
            Request::Alloc { outputs, .. }
            | Request::EmptyCache { outputs, .. }
            | Request::Oom { outputs, .. } => self.outputs_of(outputs),
            Request::FreeRequested { .. } | Request::Free { .. } => &[],
        }
    }

    /// The requests in recorded order.
    pub fn iter(&self) -> impl Iterator<Item = Request> + '_ {
        self.iter_from(0)
    }

    /// The requests from the one at `from` on, in recorded order.
    pub fn iter_from(&self, from: usize) -> impl Iterator<Item = Request> + '_ {
        let from = from.min(self.items.len());
        let mut at = self.outputs_before(from) as u32;
        self.items[from..].iter().zip(from..).map(move |(p, i)| {
            let len = p.outputs_len & ((1 << KIND_SHIFT) - 1);
            let outputs = at..at + len;
            at += len;
            match p.kind() {
                Kind::Alloc => Request::Alloc {
                    tag: p.tag,
                    size: self.size_of(i, p),
                    stream: self.streams[p.stream as usize],
                    pool: self.pools[p.pool as usize],
                    event: p.event,
                    outputs,
                },
                Kind::FreeRequested => Request::FreeRequested {
                    tag: p.tag,
                    event: p.event,
                },
                Kind::Free => Request::Free {
                    tag: p.tag,
                    event: p.event,
                },
                Kind::EmptyCache => Request::EmptyCache {
                    event: p.event,
                    outputs,
                },
                Kind::Oom => Request::Oom {
                    size: self.size_of(i, p),
                    stream: self.streams[p.stream as usize],
                    pool: self.pools[p.pool as usize],
                    event: p.event,
                    outputs,
                },
            }
        })
    }

    /// The size of request `i`, packed as `p`.
    #[inline]
    fn size_of(&self, i: usize, p: &Packed) -> u64 {
        match p.size {
            SIZE_ESCAPE => self
                .large_sizes
                .binary_search_by_key(&(i as u32), |&(at, _)| at)
                .map_or(u64::MAX, |k| self.large_sizes[k].1),
            size => size as u64,
        }
    }

    /// How many outputs the requests before the one at `i` have.
    pub fn outputs_before(&self, i: usize) -> usize {
        self.items[..i.min(self.items.len())]
            .iter()
            .map(|p| (p.outputs_len & ((1 << KIND_SHIFT) - 1)) as usize)
            .sum()
    }

    /// The allocation at index `i` (None: a request of another kind).
    pub fn alloc_at(&self, i: usize) -> Option<AllocAt> {
        let p = self.items.get(i)?;
        (p.kind() == Kind::Alloc).then(|| AllocAt {
            tag: p.tag,
            size: self.size_of(i, p),
            stream: self.streams[p.stream as usize],
            pool: self.pools[p.pool as usize],
            event: p.event,
        })
    }

    /// How many requests there are.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether the last allocation request is one the recording ran out of memory on:
    /// the run stopped there, or recording did (frees and cache releases may follow).
    pub fn ends_with_oom(&self) -> bool {
        self.items
            .iter()
            .rev()
            .map(Packed::kind)
            .find(|&kind| kind == Kind::Alloc || kind == Kind::Oom)
            == Some(Kind::Oom)
    }

    /// The trace entry of the last request.
    pub fn last_event(&self) -> Option<u32> {
        self.items.last().map(|p| p.event)
    }

    fn stream_index(&mut self, stream: u64) -> u16 {
        if let Some(&last) = self.streams.last()
            && last == stream
        {
            return (self.streams.len() - 1) as u16;
        }
        match self.stream_index.get(&stream) {
            Some(&i) => i,
            None if self.streams.len() >= MAX_DISTINCT => {
                self.too_many.get_or_insert(TooMany::Streams);
                0
            }
            None => {
                let i = self.streams.len() as u16;
                self.streams.push(stream);
                self.stream_index.insert(stream, i);
                i
            }
        }
    }

    fn pool_index(&mut self, pool: (i64, i64)) -> u16 {
        match self.pool_index.get(&pool) {
            Some(&i) => i,
            None if self.pools.len() >= MAX_DISTINCT => {
                self.too_many.get_or_insert(TooMany::Pools);
                0
            }
            None => {
                let i = self.pools.len() as u16;
                self.pools.push(pool);
                self.pool_index.insert(pool, i);
                i
            }
        }
    }

    fn push(&mut self, r: Request) {
        let event = r.event();
        let len = |o: &Range<u32>| (o.end - o.start).min((1 << KIND_SHIFT) - 1);
        let (kind, size, tag, outputs, stream, pool) = match r {
            Request::Alloc {
                tag,
                size,
                stream,
                pool,
                outputs,
                ..
            } => (0, size, tag, len(&outputs), Some(stream), Some(pool)),
            Request::FreeRequested { tag, .. } => (1, 0, tag, 0, None, None),
            Request::Free { tag, .. } => (2, 0, tag, 0, None, None),
            Request::EmptyCache { outputs, .. } => (3, 0, 0, len(&outputs), None, None),
            Request::Oom {
                size,
                stream,
                pool,
                outputs,
                ..
            } => (4, size, 0, len(&outputs), Some(stream), Some(pool)),
        };
        let stream = stream.map_or(0, |s| self.stream_index(s));
        let pool = pool.map_or(0, |p| self.pool_index(p));
        let size = match u32::try_from(size) {
            Ok(s) if s != SIZE_ESCAPE => s,
            _ => {
                self.large_sizes.push((self.items.len() as u32, size));
                SIZE_ESCAPE
            }
        };
        self.items.push(Packed {
            size,
            tag,
            event,
            outputs_len: outputs | (kind << KIND_SHIFT),
            stream,
            pool,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(tag: u32, event: u32) -> Request {
        Request::Alloc {
            tag,
            size: 512,
            stream: 0,
            pool: (0, 0),
            event,
            outputs: 0..0,
        }
    }

    fn oom(event: u32) -> Request {
        Request::Oom {
            size: 1 << 30,
            stream: 0,
            pool: (0, 0),
            event,
            outputs: 0..0,
        }
    }

    /// Sizes of 4 GiB and more (and the one size that stands for them, 2^32 - 1) are
    /// kept apart from the packed requests and read back whole, in order and by index.
    #[test]
    fn sizes_from_four_gib_come_back_whole() {
        let sized = |tag: u32, size: u64| Request::Alloc {
            tag,
            size,
            stream: 7,
            pool: (0, 0),
            event: tag,
            outputs: 0..0,
        };
        let sizes = [512, 6 << 30, u32::MAX as u64, u32::MAX as u64 - 1, 1 << 40];
        let commands: Vec<Request> = sizes
            .iter()
            .enumerate()
            .map(|(k, &size)| sized(k as u32, size))
            .chain([oom(9)])
            .collect();
        let r = Requests::from_commands(commands.clone(), sizes.len() as u32);
        assert_eq!(r.iter().collect::<Vec<_>>(), commands);
        assert_eq!(r.iter_from(2).collect::<Vec<_>>(), commands[2..].to_vec());
        for (k, &size) in sizes.iter().enumerate() {
            assert_eq!(r.alloc_at(k).map(|a| a.size), Some(size));
        }
    }

    /// The last allocation request decides; frees and cache releases after it do not.
    #[test]
    fn a_trace_ends_with_an_oom_when_its_last_allocation_request_is_one() {
        let ends = |r: Vec<Request>| Requests::from_commands(r, 2).ends_with_oom();
        assert!(ends(vec![alloc(0, 0), oom(1)]));
        assert!(ends(vec![
            alloc(0, 0),
            oom(1),
            Request::Free { tag: 0, event: 2 },
            Request::EmptyCache {
                event: 3,
                outputs: 0..0
            },
        ]));
        assert!(!ends(vec![oom(0), alloc(1, 1)]));
        assert!(!ends(vec![alloc(0, 0), Request::Free { tag: 0, event: 1 }]));
        assert!(!ends(Vec::new()));
    }

    /// Streams and pools past 65,535 distinct ones are not folded into one: the
    /// requests say they could not tell them apart, and the recording is not replayed.
    #[test]
    fn more_distinct_streams_or_pools_than_the_requests_tell_apart_are_said() {
        let allocs = |n: u64, pools: bool| -> Requests {
            let requests = (0..n).map(|i| Request::Alloc {
                tag: i as u32,
                size: 512,
                stream: if pools { 0 } else { i + 1 },
                pool: if pools { (1, i as i64) } else { (0, 0) },
                event: i as u32,
                outputs: 0..0,
            });
            Requests::from_commands(requests, n as u32)
        };
        assert_eq!(allocs(65_535, false).too_many, None);
        assert_eq!(allocs(65_536, false).too_many, Some(TooMany::Streams));
        assert_eq!(allocs(65_535, true).too_many, None);
        assert_eq!(allocs(65_536, true).too_many, Some(TooMany::Pools));
    }
}
