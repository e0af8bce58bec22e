//! The caching allocator's state and its three calls: `malloc`, `free` and `empty_cache`
//! (spec `caching-allocator.md` sections 1.2-1.6).
//!
//! Takes requests (a size and a stream, or the block to free) and a [`Device`] that says
//! whether `cudaMalloc` or a page mapping succeeds and where; gives the block chosen for
//! each request and, in [`Allocator::take_events`], the segment events the real allocator
//! would have recorded (`segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`)
//! and the pending frees it completed. It knows nothing of traces, snapshots or what
//! happened: `allocator::requests` turns a recording into requests and
//! `allocator::identity` checks the model against it.
//!
//! Blocks live in one arena indexed by [`BlockId`]; each pool keeps its free blocks
//! ordered by (stream, size, address), PyTorch's `BlockComparatorSize`, in one `BTreeMap`
//! per stream keyed by size and address packed in a `u128` (a best fit is one `range`
//! lookup; the packed key compares in two instructions where a tuple takes three
//! comparisons: 1.5 times faster on a pool's few hundred blocks, 9% off `simulate` on the
//! 1 GB benchmark file), the newest few of them in a short sorted list in front of it
//! (most free blocks leave again within a few insertions: 21% off a replay of the tiled
//! benchmark file), and its unmapped expandable ranges keyed by (stream, address).

use super::settings::{Profile, Settings};
use std::collections::BTreeMap;

/// Every size is rounded up to a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK: u64 = 512;
/// A rounded size at most this goes to the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool; page size of its expandable segments (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Large requests below this get a whole `large_segment_size` segment (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Segments for requests of 10 MiB or more are rounded to this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 << 20;

/// The most a request of `rounded` bytes makes the allocator ask the device for, under
/// the default segment sizes: a whole segment (2 MiB for the small pool, 20 MiB below
/// 10 MiB, else the request rounded up to 2 MiB), or with expandable segments the
/// request rounded up to whole pages (less when a mapped free tail takes part of it).
pub fn device_ask_at_most(rounded: u64, expandable: bool) -> u64 {
    let page = if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else {
        super::settings::LARGE_BUFFER
    };
    if expandable {
        rounded.div_ceil(page).saturating_mul(page)
    } else if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        super::settings::LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// Up to this many free blocks of a stream, putting a block at a recorded address looks
/// at each; past it, every free block is indexed by address from then on.
const SCAN_BLOCKS: usize = 512;

/// A block of the arena. Held as its index plus one, so that an `Option<BlockId>` (a
/// replay keeps one per allocation) takes four bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(std::num::NonZeroU32);

const _: () = assert!(std::mem::size_of::<Option<BlockId>>() == 4);

impl BlockId {
    /// The block at index `i` of the arena (below `u32::MAX`, the arena's NIL).
    pub fn new(i: u32) -> BlockId {
        debug_assert_ne!(i, NIL, "NIL names no block");
        BlockId(std::num::NonZeroU32::MIN.saturating_add(i))
    }

    /// Its index in the arena.
    pub fn index(self) -> u32 {
        self.0.get() - 1
    }
}

const NIL: u32 = u32::MAX;

/// A pool: the default one or a private one (CUDA graphs, MemPools), small or large.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    /// `segment_pool_id`; `(0, 0)` is the default pool.
    pub private: (i64, i64),
    pub small: bool,
}

impl PoolKey {
    pub const DEFAULT_LARGE: PoolKey = PoolKey {
        private: (0, 0),
        small: false,
    };
    pub const DEFAULT_SMALL: PoolKey = PoolKey {
        private: (0, 0),
        small: true,
    };

    pub fn is_private(self) -> bool {
        self.private != (0, 0)
    }
}

/// What the allocator asks of the device.
///
/// Each call also gets `released`: how many segments (or ranges) the allocator call
/// under way has freed or unmapped so far, for a device that follows a recording.
pub trait Device {
    /// `cudaMalloc(size)` while the allocator holds `reserved` bytes: the address, or None
    /// when it fails.
    fn cuda_malloc(&mut self, size: u64, reserved: u64, released: usize) -> Option<u64>;
    /// Map `size` bytes (whole pages) at `addr` of an expandable segment while the
    /// allocator holds `reserved` bytes: whether every page could be created.
    fn map(&mut self, addr: u64, size: u64, reserved: u64, released: usize) -> bool;
    /// The base address of a new expandable segment's reservation of `size` bytes.
    fn reserve(&mut self, size: u64) -> u64;
}

/// What the model did that the recording shows as a trace entry, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelEvent {
    SegmentAlloc {
        addr: u64,
        size: u64,
        stream: u64,
    },
    SegmentFree {
        addr: u64,
        size: u64,
        stream: u64,
    },
    SegmentMap {
        addr: u64,
        size: u64,
        stream: u64,
    },
    SegmentUnmap {
        addr: u64,
        size: u64,
        stream: u64,
    },
    /// A pending free (freed while other streams used the block) completed by the
    /// synchronisation of `empty_cache` or of the out-of-memory retry; `tag` is the one
    /// given to `malloc`.
    FreeCompleted {
        tag: u32,
    },
}

/// Why a `malloc` failed, with what the allocator held at that moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oom {
    /// The rounded request.
    pub size: u64,
    pub reserved: u64,
    pub allocated: u64,
    /// The largest free block of the request's pool and stream.
    pub largest_free: u64,
    /// Free bytes cached in private (CUDA-graph) pools.
    pub private_free: u64,
}

/// A pool's place in the allocator's list of pools: one for each of the default
/// pools and two for each private pool, so a u16 would wrap at 32,768 CUDA-graph pools
/// (the next one taken for the default pool).
type PoolIndex = u32;

#[derive(Clone, Copy, Debug)]
struct Block {
    addr: u64,
    size: u64,
    requested: u64,
    stream: u64,
    pool: PoolIndex,
    /// Allocated, or freed and waiting for other streams (`event_count > 0`): either way
    /// it is neither reused nor merged.
    allocated: bool,
    pending: bool,
    mapped: bool,
    /// Index of its expandable segment, NIL for a `cudaMalloc` segment.
    expandable: u32,
    prev: u32,
    next: u32,
    /// The pool's GC clock when it became free.
    gc_base: u64,
    tag: u32,
}

/// A pool's free mapped blocks ordered by (stream, size, address), PyTorch's
/// `BlockComparatorSize`: one set per stream, streams ascending, each keyed by size and
/// address packed in one number (a best fit is one `range` lookup on it).
#[derive(Clone, Debug, Default)]
struct FreeSet {
    streams: Vec<StreamSet>,
}

/// How many of a stream's newest free blocks wait outside its map.
const RECENT: usize = 8;

/// The free blocks of one stream: the newest few in a short list, the rest in a map.
///
/// Most free blocks leave the set again within a few insertions: the remainder of a split
/// merges back when its neighbour is freed, and that merged block is split again by the
/// next request of the same size. A block that comes and goes while it is among the
/// newest [`RECENT`] never touches the map; older ones move into the map, oldest first.
#[derive(Clone, Debug, Default)]
struct StreamSet {
    stream: u64,
    map: BTreeMap<u128, u32>,
    /// The newest blocks in key order.
    recent: Vec<Recent>,
    /// Insertions so far (the age of the newest blocks).
    inserted: u64,
}

#[derive(Clone, Copy, Debug)]
struct Recent {
    key: u128,
    block: u32,
    /// When it came ([`StreamSet::inserted`] then).
    seq: u64,
}

static NO_BLOCKS: BTreeMap<u128, u32> = BTreeMap::new();

fn pack(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

/// (size, address) of a packed key.
fn unpack(k: u128) -> (u64, u64) {
    ((k >> 64) as u64, k as u64)
}

impl StreamSet {
    fn insert(&mut self, key: u128, block: u32) {
        if self.recent.len() == RECENT {
            let oldest = (0..RECENT)
                .min_by_key(|&i| self.recent[i].seq)
                .expect("full");
            let r = self.recent.remove(oldest);
            self.map.insert(r.key, r.block);
        }
        self.inserted += 1;
        let at = self.recent.partition_point(|r| r.key < key);
        self.recent.insert(
            at,
            Recent {
                key,
                block,
                seq: self.inserted,
            },
        );
    }

    /// Takes `block` out, under `key`; a block of the same key that is another one stays.
    fn remove(&mut self, key: u128, block: u32) {
        match self
            .recent
            .iter()
            .position(|r| r.key == key && r.block == block)
        {
            Some(at) => {
                self.recent.remove(at);
            }
            None => {
                if self.map.get(&key) == Some(&block) {
                    self.map.remove(&key);
                }
            }
        }
    }

    /// The blocks with keys from `lo` (inclusive) to `hi` (exclusive), in key order.
    fn range(&self, lo: u128, hi: Option<u128>) -> Merged<'_> {
        let a = self.recent.partition_point(|r| r.key < lo);
        let b = match hi {
            Some(hi) => self.recent.partition_point(|r| r.key < hi),
            None => self.recent.len(),
        };
        let map = match hi {
            Some(hi) => self.map.range(lo..hi),
            None => self.map.range(lo..),
        };
        Merged::new(map, &self.recent[a..b.max(a)])
    }

    fn len(&self) -> usize {
        self.map.len() + self.recent.len()
    }
}

/// The map's range and the newest blocks in it merged in key order, from either end.
struct Merged<'a> {
    map: std::iter::Peekable<std::collections::btree_map::Range<'a, u128, u32>>,
    recent: &'a [Recent],
    /// Taken from the map's back end and not yet handed out.
    back: Option<(u128, u32)>,
}

impl<'a> Merged<'a> {
    fn new(map: std::collections::btree_map::Range<'a, u128, u32>, recent: &'a [Recent]) -> Self {
        Merged {
            map: map.peekable(),
            recent,
            back: None,
        }
    }

    fn none() -> Merged<'a> {
        Merged::new(NO_BLOCKS.range(..), &[])
    }
}

impl Iterator for Merged<'_> {
    type Item = (u128, u32);

    fn next(&mut self) -> Option<(u128, u32)> {
        let from_map = self.map.peek().map(|&(&k, &b)| (k, b)).or(self.back);
        match (from_map, self.recent.first()) {
            (Some(m), Some(r)) if r.key < m.0 => self.pop_front(),
            (Some(_), _) => self
                .map
                .next()
                .map(|(&k, &b)| (k, b))
                .or_else(|| self.back.take()),
            (None, _) => self.pop_front(),
        }
    }
}

impl DoubleEndedIterator for Merged<'_> {
    fn next_back(&mut self) -> Option<(u128, u32)> {
        if self.back.is_none() {
            self.back = self.map.next_back().map(|(&k, &b)| (k, b));
        }
        match (self.back, self.recent.last()) {
            (Some(m), Some(r)) if r.key > m.0 => self.pop_back(),
            (Some(_), _) => self.back.take(),
            (None, _) => self.pop_back(),
        }
    }
}

impl Merged<'_> {
    fn pop_front(&mut self) -> Option<(u128, u32)> {
        let (first, rest) = self.recent.split_first()?;
        self.recent = rest;
        Some((first.key, first.block))
    }

    fn pop_back(&mut self) -> Option<(u128, u32)> {
        let (last, rest) = self.recent.split_last()?;
        self.recent = rest;
        Some((last.key, last.block))
    }
}

impl FreeSet {
    /// The free blocks of `stream` (the sets are sorted by stream).
    fn of(&self, stream: u64) -> Option<&StreamSet> {
        self.streams
            .binary_search_by_key(&stream, |s| s.stream)
            .ok()
            .map(|at| &self.streams[at])
    }

    fn insert(&mut self, stream: u64, size: u64, addr: u64, block: u32) {
        let at = match self.streams.binary_search_by_key(&stream, |s| s.stream) {
            Ok(at) => at,
            Err(at) => {
                self.streams.insert(
                    at,
                    StreamSet {
                        stream,
                        ..StreamSet::default()
                    },
                );
                at
            }
        };
        self.streams[at].insert(pack(size, addr), block);
    }

    fn remove(&mut self, stream: u64, size: u64, addr: u64, block: u32) {
        if let Ok(at) = self.streams.binary_search_by_key(&stream, |s| s.stream) {
            self.streams[at].remove(pack(size, addr), block);
        }
    }

    /// The blocks of `stream` of `size` bytes or more: (size, address, block), smallest
    /// first, then lowest address.
    fn from(&self, stream: u64, size: u64) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        self.of(stream)
            .map_or_else(Merged::none, |s| s.range(pack(size, 0), None))
            .map(|(k, i)| {
                let (size, addr) = unpack(k);
                (size, addr, i)
            })
    }

    /// The blocks of `stream` below `size` bytes, largest first, then highest address.
    fn below(&self, stream: u64, size: u64) -> Vec<(u64, u32)> {
        self.of(stream)
            .into_iter()
            .flat_map(|s| s.range(0, Some(pack(size, 0))).rev())
            .map(|(k, i)| (unpack(k).0, i))
            .collect()
    }

    /// The block of `stream` of exactly `size` bytes at the highest address.
    fn highest_of_size(&self, stream: u64, size: u64) -> Option<u32> {
        self.of(stream)?
            .range(pack(size, 0), size.checked_add(1).map(|next| pack(next, 0)))
            .next_back()
            .map(|(_, i)| i)
    }

    /// The largest block of `stream`'s size (0: none).
    fn largest(&self, stream: u64) -> u64 {
        self.of(stream)
            .and_then(|s| s.range(0, None).next_back())
            .map_or(0, |(k, _)| unpack(k).0)
    }

    /// Every block, in (stream, size, address) order: (size, address, block).
    fn iter(&self) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        self.streams.iter().flat_map(|s| {
            s.range(0, None).map(|(k, i)| {
                let (size, addr) = unpack(k);
                (size, addr, i)
            })
        })
    }

    /// How many blocks `stream` has.
    fn count(&self, stream: u64) -> usize {
        self.of(stream).map_or(0, StreamSet::len)
    }

    /// Every block, in (stream, size, address) order.
    fn blocks(&self) -> Vec<u32> {
        self.iter().map(|(_, _, i)| i).collect()
    }
}

#[derive(Clone, Debug, Default)]
struct Pool {
    key: Option<PoolKey>,
    /// Free mapped blocks by (stream, size, address).
    free: FreeSet,
    /// Unmapped ranges of expandable segments by (stream, address).
    unmapped: BTreeMap<(u64, u64), u32>,
    /// `get_free_blocks_call_count`: ticks once per search while GC is active.
    gc_clock: u64,
}

/// An expandable segment: one reservation of address space per (pool, stream).
#[derive(Clone, Copy, Debug)]
struct Expandable {
    base: u64,
    page: u64,
    alive: bool,
}

/// A segment of the state, for checks and reports: a `cudaMalloc` segment, or one
/// contiguous mapped range of an expandable segment (as a snapshot lists them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentView {
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: PoolKey,
    pub expandable: bool,
    /// (address, size, allocated) of each block in address order.
    pub blocks: Vec<(u64, u64, bool)>,
}

/// An allocator's state as [`Allocator::state_view`] gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateView {
    pools: Vec<Option<PoolKey>>,
    /// (address, size, stream, pool, expandable, blocks) by address.
    segments: Vec<(u64, u64, u64, PoolKey, bool, Vec<BlockView>)>,
    /// Tags of the blocks waiting for other streams, in the order they were freed.
    pending: Vec<u32>,
    reserved: u64,
    allocated: u64,
    requested: u64,
    total_memory: Option<u64>,
    highest_first: bool,
}

/// One block of a [`StateView`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlockView {
    addr: u64,
    size: u64,
    requested: u64,
    allocated: bool,
    pending: bool,
    mapped: bool,
    tag: u32,
    stream: u64,
}

/// A cached block that `malloc` would take ([`Allocator::cached_block`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cached {
    /// Its address.
    pub addr: u64,
    block: u32,
    pool: PoolIndex,
    /// The rounded request.
    size: u64,
}

/// The allocator of one device.
#[derive(Clone, Debug)]
pub struct Allocator {
    settings: Settings,
    profile: Profile,
    /// The device's total memory, for a memory fraction and the size of expandable
    /// reservations (None: unknown).
    total_memory: Option<u64>,
    blocks: Vec<Block>,
    spare: Vec<u32>,
    pools: Vec<Pool>,
    pool_index: BTreeMap<PoolKey, PoolIndex>,
    expandables: Vec<Expandable>,
    /// Blocks freed while other streams used them, by the order they were freed (a
    /// number from `pending_next`), and each one's number.
    pending: BTreeMap<u64, u32>,
    pending_order: BTreeMap<u32, u64>,
    pending_next: u64,
    /// Bytes the pending blocks' requests asked for.
    pending_requested: u64,
    events: Vec<ModelEvent>,
    /// `total_allocated_memory`: what the statistics call reserved.
    reserved: u64,
    /// Bytes of allocated (and pending) blocks.
    allocated: u64,
    /// Bytes the allocated blocks' requests asked for.
    requested: u64,
    /// Segments freed or ranges unmapped since the events were last taken.
    released: usize,
    /// Free blocks by address, made by the first [`Allocator::allocate_at`] among more
    /// than [`SCAN_BLOCKS`] free blocks (a replay that follows a recording and departed
    /// from it) and kept from then on.
    free_by_addr: Option<BTreeMap<u64, u32>>,
    /// Among free blocks of the best-fitting size, take the highest address rather than
    /// the lowest (PyTorch's order): a what-if of how much the peak depends on which of
    /// equal blocks is taken.
    highest_first: bool,
    pub stats: Stats,
}

/// What the allocator asked of the device, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// `cudaMalloc` calls that succeeded (new segments).
    pub segment_allocs: u64,
    /// `cudaFree` calls.
    pub segment_frees: u64,
    /// Successful page mappings of expandable segments (calls, not pages).
    pub maps: u64,
    pub unmaps: u64,
    /// Times the out-of-memory retry flushed the cache (`release_cached_blocks` from
    /// `malloc`): each synchronises the device.
    pub retry_flushes: u64,
    /// Garbage collections that freed something.
    pub gc_runs: u64,
}

impl Allocator {
    /// From now on, of the free blocks of the best-fitting size, take the one at the
    /// highest address (a what-if: PyTorch takes the lowest).
    pub fn take_highest_first(&mut self) {
        self.highest_first = true;
    }

    pub fn new(settings: Settings, profile: Profile, total_memory: Option<u64>) -> Allocator {
        let mut a = Allocator {
            settings,
            profile,
            total_memory,
            blocks: Vec::new(),
            spare: Vec::new(),
            pools: Vec::new(),
            pool_index: BTreeMap::new(),
            expandables: Vec::new(),
            pending: BTreeMap::new(),
            pending_order: BTreeMap::new(),
            pending_next: 0,
            pending_requested: 0,
            events: Vec::new(),
            reserved: 0,
            allocated: 0,
            requested: 0,
            released: 0,
            free_by_addr: None,
            highest_first: false,
            stats: Stats::default(),
        };
        // The default pools first: garbage collection and `empty_cache` walk them by name.
        a.pool(PoolKey::DEFAULT_LARGE);
        a.pool(PoolKey::DEFAULT_SMALL);
        a
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Bytes held from the device (`torch.cuda.memory_reserved()`).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Bytes of allocated blocks (`torch.cuda.memory_allocated()`).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Bytes the live requests asked for.
    pub fn requested(&self) -> u64 {
        self.requested
    }

    /// Bytes the live requests asked for, less those of blocks whose free waits for
    /// other streams (a cache flush completes them): what any device must hold now.
    pub fn requested_held(&self) -> u64 {
        self.requested.saturating_sub(self.pending_requested)
    }

    /// The events since the last call, oldest first.
    pub fn take_events(&mut self) -> std::vec::Drain<'_, ModelEvent> {
        self.released = 0;
        self.events.drain(..)
    }

    /// The allocated blocks and their tags (for saving a replay's state).
    pub fn live_tags(&self) -> Vec<(u32, BlockId)> {
        let spare: std::collections::BTreeSet<u32> = self.spare.iter().copied().collect();
        self.blocks
            .iter()
            .enumerate()
            .filter(|(i, b)| b.allocated && b.tag != NIL && !spare.contains(&(*i as u32)))
            .map(|(i, b)| (b.tag, BlockId::new(i as u32)))
            .collect()
    }

    /// Whether events wait to be taken.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    pub fn block_addr(&self, b: BlockId) -> u64 {
        self.blocks[b.index() as usize].addr
    }

    pub fn block_size(&self, b: BlockId) -> u64 {
        self.blocks[b.index() as usize].size
    }

    pub fn is_allocated(&self, b: BlockId) -> bool {
        self.blocks[b.index() as usize].allocated
    }

    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    fn pool(&mut self, key: PoolKey) -> PoolIndex {
        if let Some(&i) = self.pool_index.get(&key) {
            return i;
        }
        let i = self.pools.len() as PoolIndex;
        self.pools.push(Pool {
            key: Some(key),
            ..Pool::default()
        });
        self.pool_index.insert(key, i);
        i
    }

    /// Makes the pool of `key` now if there is none: pools are walked in the order they
    /// were made (a state rebuilt elsewhere makes them in the same order).
    pub fn ensure_pool(&mut self, key: PoolKey) {
        self.pool(key);
    }

    fn pool_key(&self, pool: PoolIndex) -> PoolKey {
        self.pools[pool as usize].key.expect("pools have keys")
    }

    // ---- sizes (spec 1.3) ----

    /// `round_size`: the block size a request of `size` bytes asks for.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let d = self.settings.divisions_for(size);
        if self.profile.unaligned_division_one() {
            // 2.0-2.3: any divisions above 0 take the power-of-two path, where one
            // division leaves the size as it is (unaligned; pytorch#126830).
            if d > 0 && size > MIN_BLOCK.saturating_mul(d) {
                if d <= 1 {
                    return size;
                }
                return next_division(size, d);
            }
        } else if d > 1 && size > MIN_BLOCK.saturating_mul(d) {
            return next_division(size, d);
        }
        size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }

    /// `get_allocation_size`: the size of a new segment for a rounded request.
    pub fn allocation_size(&self, size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            self.settings.large_segment_size
        } else {
            size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
        }
    }

    fn gc_active(&self) -> bool {
        self.settings.memory_fraction.is_some() && self.settings.gc_threshold > 0.0
    }

    /// `allowed_memory_maximum`, when a memory fraction is set and the total is known.
    fn allowed_max(&self) -> Option<u64> {
        let f = self.settings.memory_fraction?;
        let total = self.total_memory?;
        Some((f * total as f64) as u64)
    }

    fn expandable_active(&self, pool: PoolIndex) -> bool {
        self.settings.expandable_segments
            && (self.profile.expandable_in_private_pools() || !self.pool_key(pool).is_private())
    }

    fn page_size(&self, pool: PoolIndex) -> u64 {
        if self.pool_key(pool).small {
            SMALL_BUFFER
        } else {
            self.settings.large_segment_size
        }
    }

    // ---- the arena ----

    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.spare.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    fn b(&self, i: u32) -> &Block {
        &self.blocks[i as usize]
    }

    fn bm(&mut self, i: u32) -> &mut Block {
        &mut self.blocks[i as usize]
    }

    fn insert_free(&mut self, i: u32) {
        let clock = self.pools[self.b(i).pool as usize].gc_clock;
        let b = self.bm(i);
        b.gc_base = clock;
        let (stream, size, addr) = (b.stream, b.size, b.addr);
        let pool = b.pool as usize;
        self.pools[pool].free.insert(stream, size, addr, i);
        if let Some(index) = &mut self.free_by_addr {
            index.insert(addr, i);
        }
    }

    fn remove_free(&mut self, i: u32) {
        let b = *self.b(i);
        self.pools[b.pool as usize]
            .free
            .remove(b.stream, b.size, b.addr, i);
        if let Some(index) = &mut self.free_by_addr
            && index.get(&b.addr) == Some(&i)
        {
            index.remove(&b.addr);
        }
    }

    fn insert_unmapped(&mut self, i: u32) {
        let b = *self.b(i);
        self.pools[b.pool as usize]
            .unmapped
            .insert((b.stream, b.addr), i);
    }

    fn remove_unmapped(&mut self, i: u32) {
        let b = *self.b(i);
        self.pools[b.pool as usize]
            .unmapped
            .remove(&(b.stream, b.addr));
    }

    fn is_split(&self, i: u32) -> bool {
        let b = self.b(i);
        b.prev != NIL || b.next != NIL
    }

    // ---- restoring a state (the start of a recording) ----

    /// Adds a `cudaMalloc` segment as it was, with its allocated blocks (address, size,
    /// requested bytes, tag) in address order; the rest is free. Counts it as reserved.
    pub fn restore_segment(
        &mut self,
        addr: u64,
        size: u64,
        stream: u64,
        pool: PoolKey,
        allocated: &[(u64, u64, u64, u32)],
    ) -> Vec<BlockId> {
        let pool = self.pool(pool);
        self.reserved += size;
        let pieces = carve(addr, size, allocated);
        self.link_pieces(&pieces, stream, pool, NIL, true)
    }

    /// Adds an expandable segment: its reservation `[base, base + size)`, the mapped
    /// ranges in it (address, size) and the allocated blocks in those ranges, as
    /// [`Allocator::restore_segment`] takes them. Counts the mapped bytes as reserved.
    pub fn restore_expandable(
        &mut self,
        base: u64,
        size: u64,
        stream: u64,
        pool: PoolKey,
        mapped: &[(u64, u64)],
        allocated: &[(u64, u64, u64, u32)],
    ) -> Vec<BlockId> {
        let pool = self.pool(pool);
        let page = self.page_size(pool);
        let seg = self.expandables.len() as u32;
        self.expandables.push(Expandable {
            base,
            page,
            alive: true,
        });
        // Pieces over the whole reservation: unmapped gaps, then each mapped range's
        // blocks and free space.
        let mut pieces: Vec<Piece> = Vec::new();
        let mut at = base;
        let mut ids = Vec::new();
        let mut k = 0;
        for &(m_addr, m_size) in mapped {
            if m_addr > at {
                pieces.push(Piece::Unmapped(at, m_addr - at));
            }
            let end = m_addr + m_size;
            let first = k;
            while k < allocated.len() && allocated[k].0 < end {
                k += 1;
            }
            pieces.extend(carve(m_addr, m_size, &allocated[first..k]));
            self.reserved += m_size;
            at = end;
        }
        let end = base.saturating_add(size);
        if end > at {
            pieces.push(Piece::Unmapped(at, end - at));
        }
        ids.extend(self.link_pieces(&pieces, stream, pool, seg, false));
        ids
    }

    /// Links pieces into one segment's list; returns the allocated blocks' ids.
    fn link_pieces(
        &mut self,
        pieces: &[Piece],
        stream: u64,
        pool: PoolIndex,
        expandable: u32,
        _plain: bool,
    ) -> Vec<BlockId> {
        let mut prev = NIL;
        let mut ids = Vec::new();
        for p in pieces {
            let (addr, size, requested, allocated, mapped, tag) = match *p {
                Piece::Free(a, s) => (a, s, 0, false, true, NIL),
                Piece::Unmapped(a, s) => (a, s, 0, false, false, NIL),
                Piece::Allocated(a, s, r, t) => (a, s, r, true, true, t),
            };
            let i = self.new_block(Block {
                addr,
                size,
                requested,
                stream,
                pool,
                allocated,
                pending: false,
                mapped,
                expandable,
                prev,
                next: NIL,
                gc_base: 0,
                tag,
            });
            if prev != NIL {
                self.bm(prev).next = i;
            }
            prev = i;
            if allocated {
                self.allocated += size;
                self.requested += requested;
                ids.push(BlockId::new(i));
            } else if mapped {
                self.insert_free(i);
            } else {
                self.insert_unmapped(i);
            }
        }
        ids
    }

    // ---- malloc (spec 1.3) ----

    /// `malloc(orig_size, stream)` in `pool` (the default pool or a private one): the
    /// block, or the failure. `tag` names the request in [`ModelEvent::FreeCompleted`].
    pub fn malloc(
        &mut self,
        dev: &mut impl Device,
        orig: u64,
        stream: u64,
        private: (i64, i64),
        tag: u32,
    ) -> Result<BlockId, Oom> {
        let size = self.round_size(orig);
        let pool = self.pool(PoolKey {
            private,
            small: size <= SMALL_SIZE,
        });
        let asize = self.allocation_size(size);
        let mut found = self.get_free_block(size, stream, pool);
        if found.is_none() {
            if self.gc_active() {
                self.garbage_collect();
            }
            found = self.alloc_block(dev, size, asize, stream, pool);
            if found.is_none() && self.release_available(size, stream, pool) {
                found = self.alloc_block(dev, size, asize, stream, pool);
            }
            if found.is_none() {
                self.stats.retry_flushes += 1;
                self.release_cached();
                found = self.alloc_block(dev, size, asize, stream, pool);
            }
        }
        let Some(i) = found else {
            return Err(Oom {
                size,
                reserved: self.reserved,
                allocated: self.allocated,
                largest_free: self.largest_free(stream, pool),
                private_free: self.private_free(),
            });
        };
        Ok(self.take(i, size, orig, tag))
    }

    /// Hands out free block `i` (out of the free set) for a request of `orig` bytes
    /// rounded to `size`, split where `should_split` says.
    fn take(&mut self, i: u32, size: u64, orig: u64, tag: u32) -> BlockId {
        let split = self.should_split(i, size);
        BlockId::new(self.alloc_found_block(i, size, orig, split, tag))
    }

    /// A search of `pool`'s free blocks: it ticks the garbage collection clock while
    /// collection is active (`get_free_blocks_call_count`).
    fn count_search(&mut self, pool: PoolIndex) {
        if self.gc_active() {
            self.pools[pool as usize].gc_clock += 1;
        }
    }

    /// The cached block `malloc` would take for a request of `orig` bytes, without
    /// taking it; None when it would need new memory (a segment, pages, a release).
    pub fn cached_block(&self, orig: u64, stream: u64, private: (i64, i64)) -> Option<Cached> {
        let size = self.round_size(orig);
        let key = PoolKey {
            private,
            small: size <= SMALL_SIZE,
        };
        let &pool = self.pool_index.get(&key)?;
        self.choose_free_block(size, stream, pool)
            .map(|block| Cached {
                addr: self.b(block).addr,
                block,
                pool,
                size,
            })
    }

    /// `malloc` of the request [`Allocator::cached_block`] found `c` for, with nothing
    /// changed since: what `malloc` does with the block its search finds.
    pub fn malloc_cached(&mut self, c: Cached, orig: u64, tag: u32) -> BlockId {
        self.count_search(c.pool);
        self.remove_free(c.block);
        self.take(c.block, c.size, orig, tag)
    }

    /// `malloc` when the model would take cached block `c` but the request must go to
    /// `addr`: the one effect of the model's choice (its call counts on the garbage
    /// collection clock of `c`'s pool) and the block placed at `addr` as
    /// [`Allocator::allocate_at`] does.
    pub fn malloc_moved_to(
        &mut self,
        addr: u64,
        c: Cached,
        orig: u64,
        stream: u64,
        private: (i64, i64),
        tag: u32,
    ) -> Option<BlockId> {
        self.count_search(c.pool);
        self.allocate_at(addr, orig, stream, private, tag)
    }

    /// The largest free mapped block of `pool` on `stream`.
    fn largest_free(&self, stream: u64, pool: PoolIndex) -> u64 {
        self.pools[pool as usize].free.largest(stream)
    }

    /// About how many bytes this state takes (its blocks, pools, free sets and lists):
    /// what a saved copy costs.
    pub fn approx_bytes(&self) -> usize {
        use std::mem::size_of;
        let pools: usize = self
            .pools
            .iter()
            .map(|p| {
                size_of::<Pool>()
                    + p.free.streams.len() * size_of::<StreamSet>()
                    + p.free.streams.iter().map(|s| s.len()).sum::<usize>() * 48
                    + p.unmapped.len() * 48
            })
            .sum();
        self.blocks.len() * size_of::<Block>()
            + self.spare.len() * 4
            + pools
            + self.pool_index.len() * 48
            + self.expandables.len() * size_of::<Expandable>()
            + self.pending.len() * 64
            + self.free_by_addr.as_ref().map_or(0, |m| m.len() * 48)
            + size_of::<Allocator>()
    }

    /// Free bytes cached in private pools.
    fn private_free(&self) -> u64 {
        self.pools
            .iter()
            .filter(|p| p.key.is_some_and(PoolKey::is_private))
            .flat_map(|p| p.free.iter())
            .map(|(size, _, _)| size)
            .sum()
    }

    /// The largest free block of the device, any pool and stream.
    pub fn largest_free_block(&self) -> u64 {
        self.pools
            .iter()
            .flat_map(|p| p.free.iter())
            .map(|(size, _, _)| size)
            .max()
            .unwrap_or(0)
    }

    fn get_free_block(&mut self, size: u64, stream: u64, pool: PoolIndex) -> Option<u32> {
        self.count_search(pool);
        let chosen = self.choose_free_block(size, stream, pool)?;
        self.remove_free(chosen);
        Some(chosen)
    }

    /// The cached block `get_free_block` takes for a block of `size`, without taking it.
    fn choose_free_block(&self, size: u64, stream: u64, pool: PoolIndex) -> Option<u32> {
        let expandable_active = self.expandable_active(pool);
        let p = &self.pools[pool as usize];
        let mut it = p.free.from(stream, size);
        let (_, _, first) = it.next()?;
        let mut chosen = first;
        if self.highest_first && self.b(first).expandable == NIL {
            let size = self.b(first).size;
            if let Some(last) = p.free.highest_of_size(stream, size)
                && self.b(last).expandable == NIL
            {
                chosen = last;
            }
        }
        if self.b(chosen).expandable != NIL {
            if expandable_active {
                // Best fit by the size a block can grow to: prefer one that needs no new
                // pages.
                for (_, _, next) in it {
                    if self.b(chosen).expandable == NIL
                        || self.expandable_size(next) >= self.expandable_size(chosen)
                    {
                        break;
                    }
                    chosen = next;
                }
            } else {
                // Expandable segments switched off since: only other blocks.
                let mut other = None;
                for (_, _, next) in it {
                    if self.b(next).expandable == NIL {
                        other = Some(next);
                        break;
                    }
                }
                chosen = other?;
            }
        }
        let bsize = self.b(chosen).size;
        let max_split = self.settings.max_split_size;
        // Never hand out an oversize block for a normal request, nor a much larger one
        // for an oversize request.
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split && bsize >= size.saturating_add(self.settings.max_non_split_rounding) {
            return None;
        }
        Some(chosen)
    }

    fn expandable_size(&self, i: u32) -> u64 {
        let b = self.b(i);
        let extra = if b.next != NIL && !self.b(b.next).mapped {
            self.b(b.next).size
        } else {
            0
        };
        b.size + extra
    }

    fn should_split(&self, i: u32, size: u64) -> bool {
        let b = self.b(i);
        // The block found holds the request; were it ever smaller, nothing is left.
        let remaining = b.size.saturating_sub(size);
        if self.pool_key(b.pool).small || self.split_as_expandable(b.pool) {
            remaining >= MIN_BLOCK
        } else {
            size < self.settings.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Whether `should_split` takes the expandable rule: every release tests the
    /// setting; the newest test it for the block's pool.
    fn split_as_expandable(&self, pool: PoolIndex) -> bool {
        if self.profile.split_tests_pool() {
            self.expandable_active(pool)
        } else {
            self.settings.expandable_segments
        }
    }

    fn alloc_found_block(&mut self, i: u32, size: u64, orig: u64, split: bool, tag: u32) -> u32 {
        let mut i = i;
        if split {
            let rem = *self.b(i);
            let nb = self.new_block(Block {
                addr: rem.addr,
                size,
                requested: 0,
                stream: rem.stream,
                pool: rem.pool,
                allocated: false,
                pending: false,
                mapped: true,
                expandable: rem.expandable,
                prev: rem.prev,
                next: i,
                gc_base: 0,
                tag: NIL,
            });
            if rem.prev != NIL {
                self.bm(rem.prev).next = nb;
            }
            let r = self.bm(i);
            r.prev = nb;
            r.addr += size;
            r.size -= size;
            self.insert_free(i);
            i = nb;
        }
        let b = self.bm(i);
        b.allocated = true;
        b.requested = orig;
        b.tag = tag;
        let bsize = b.size;
        self.allocated += bsize;
        self.requested += orig;
        i
    }

    fn alloc_block(
        &mut self,
        dev: &mut impl Device,
        size: u64,
        asize: u64,
        stream: u64,
        pool: PoolIndex,
    ) -> Option<u32> {
        if let Some(allowed) = self.allowed_max()
            && self.reserved.saturating_add(asize) > allowed
        {
            return None;
        }
        if self.expandable_active(pool) {
            return self.try_allocate_expandable(dev, size, stream, pool);
        }
        let addr = dev.cuda_malloc(asize, self.reserved, self.released)?;
        self.stats.segment_allocs += 1;
        self.events.push(ModelEvent::SegmentAlloc {
            addr,
            size: asize,
            stream,
        });
        self.reserved += asize;
        Some(self.new_block(Block {
            addr,
            size: asize,
            requested: 0,
            stream,
            pool,
            allocated: false,
            pending: false,
            mapped: true,
            expandable: NIL,
            prev: NIL,
            next: NIL,
            gc_base: 0,
            tag: NIL,
        }))
    }

    // ---- expandable segments (spec 1.6) ----

    fn allocatable(&self, i: u32) -> bool {
        i != NIL && !self.b(i).allocated
    }

    fn try_allocate_expandable(
        &mut self,
        dev: &mut impl Device,
        size: u64,
        stream: u64,
        pool: PoolIndex,
    ) -> Option<u32> {
        let mut cand = self.find_expandable_block(dev, size, stream, pool);
        if !self.b(cand).mapped {
            let n = self.b(cand).size.min(size);
            if !self.map_block(dev, cand, n) {
                return None;
            }
        }
        while self.b(cand).size < size {
            let remaining = size - self.b(cand).size;
            let next = self.b(cand).next;
            if next == NIL || self.b(next).mapped {
                return None;
            }
            let n = remaining.min(self.b(next).size);
            if !self.map_block(dev, next, n) {
                return None;
            }
            cand = next;
        }
        self.remove_free(cand);
        Some(cand)
    }

    fn find_expandable_block(
        &mut self,
        dev: &mut impl Device,
        size: u64,
        stream: u64,
        pool: PoolIndex,
    ) -> u32 {
        let candidates: Vec<u32> = self.pools[pool as usize]
            .unmapped
            .range((stream, 0)..=(stream, u64::MAX))
            .map(|(_, &i)| i)
            .collect();
        for c in candidates {
            let mut c = c;
            let prev = self.b(c).prev;
            if self.allocatable(prev) {
                c = prev;
            }
            let mut bytes = 0u64;
            let mut b = c;
            while bytes < size && self.allocatable(b) {
                bytes += self.b(b).size;
                b = self.b(b).next;
            }
            if bytes >= size {
                return c;
            }
        }
        let page = self.page_size(pool);
        // With the device unknown (no limit), a reservation holds any request: a
        // request past a terabyte is no reason to run out of memory there.
        let va = match self.total_memory {
            Some(_) => self.reservation_size(page),
            None => self
                .reservation_size(page)
                .max(size.div_ceil(page).saturating_mul(page)),
        };
        let base = dev.reserve(va);
        let seg = self.expandables.len() as u32;
        self.expandables.push(Expandable {
            base,
            page,
            alive: true,
        });
        let i = self.new_block(Block {
            addr: base,
            size: va,
            requested: 0,
            stream,
            pool,
            allocated: false,
            pending: false,
            mapped: false,
            expandable: seg,
            prev: NIL,
            next: NIL,
            gc_base: 0,
            tag: NIL,
        });
        self.insert_unmapped(i);
        i
    }

    /// Address space of one expandable segment: 1 1/8 of the device's memory in whole
    /// pages, `max_handles_ = numSegments(total + total / 8)` in `ExpandableSegment`'s
    /// constructor (a terabyte when the device is unknown: only its start matters then).
    pub fn reservation_size(&self, page: u64) -> u64 {
        let bytes = match self.total_memory {
            Some(total) => total.saturating_add(total / 8),
            None => 1u64 << 40,
        };
        bytes.div_ceil(page).saturating_mul(page)
    }

    fn map_block(&mut self, dev: &mut impl Device, i: u32, n: u64) -> bool {
        let b = *self.b(i);
        let page = self.expandables[b.expandable as usize].page;
        let bytes = n.div_ceil(page).saturating_mul(page).min(b.size);
        if bytes == 0 || !dev.map(b.addr, bytes, self.reserved, self.released) {
            return false;
        }
        self.remove_unmapped(i);
        self.bm(i).mapped = true;
        if bytes < b.size {
            let rest = self.new_block(Block {
                addr: b.addr + bytes,
                size: b.size - bytes,
                requested: 0,
                stream: b.stream,
                pool: b.pool,
                allocated: false,
                pending: false,
                mapped: false,
                expandable: b.expandable,
                prev: i,
                next: b.next,
                gc_base: 0,
                tag: NIL,
            });
            if b.next != NIL {
                self.bm(b.next).prev = rest;
            }
            self.bm(i).next = rest;
            self.bm(i).size = bytes;
            self.insert_unmapped(rest);
        }
        let (prev, next) = (self.b(i).prev, self.b(i).next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.insert_free(i);
        self.reserved += bytes;
        self.stats.maps += 1;
        self.events.push(ModelEvent::SegmentMap {
            addr: b.addr,
            size: bytes,
            stream: b.stream,
        });
        true
    }

    fn unmap_block(&mut self, i: u32) {
        let b = *self.b(i);
        let seg = self.expandables[b.expandable as usize];
        let page = seg.page;
        let begin = seg.base + (b.addr - seg.base).div_ceil(page) * page;
        let end = seg.base + (b.addr + b.size - seg.base) / page * page;
        if begin >= end {
            return;
        }
        self.remove_free(i);
        if begin > b.addr {
            let before = self.new_block(Block {
                addr: b.addr,
                size: begin - b.addr,
                next: i,
                ..b
            });
            if b.prev != NIL {
                self.bm(b.prev).next = before;
            }
            self.bm(i).prev = before;
            self.insert_free(before);
        }
        let b_end = b.addr + b.size;
        if b_end > end {
            let after = self.new_block(Block {
                addr: end,
                size: b_end - end,
                prev: i,
                ..b
            });
            if b.next != NIL {
                self.bm(b.next).prev = after;
            }
            self.bm(i).next = after;
            self.insert_free(after);
        }
        {
            let m = self.bm(i);
            m.addr = begin;
            m.size = end - begin;
            m.mapped = false;
        }
        let (prev, next) = (self.b(i).prev, self.b(i).next);
        self.try_merge(i, prev);
        self.try_merge(i, next);
        self.insert_unmapped(i);
        self.reserved -= end - begin;
        self.stats.unmaps += 1;
        self.released += 1;
        self.events.push(ModelEvent::SegmentUnmap {
            addr: begin,
            size: end - begin,
            stream: b.stream,
        });
    }

    /// Merges free neighbour `src` into `dst` (which is in no set), when both are free
    /// and equally mapped.
    fn try_merge(&mut self, dst: u32, src: u32) {
        if src == NIL {
            return;
        }
        let s = *self.b(src);
        if s.allocated || s.mapped != self.b(dst).mapped {
            return;
        }
        if s.mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        if self.b(dst).prev == src {
            let d = self.bm(dst);
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.bm(s.prev).next = dst;
            }
        } else {
            self.bm(dst).next = s.next;
            if s.next != NIL {
                self.bm(s.next).prev = dst;
            }
        }
        self.bm(dst).size += s.size;
        self.spare.push(src);
    }

    // ---- free (spec 1.4) ----

    /// The user frees a block that other streams still use: it waits (neither reused
    /// nor merged) until [`Allocator::free`] or a synchronisation completes it.
    pub fn free_requested(&mut self, b: BlockId) {
        let blk = self.bm(b.index());
        if blk.allocated && !blk.pending {
            blk.pending = true;
            let requested = blk.requested;
            self.pending_requested += requested;
            self.pending.insert(self.pending_next, b.index());
            self.pending_order.insert(b.index(), self.pending_next);
            self.pending_next += 1;
        }
    }

    /// `free_block`: the block goes back to its pool, merged with free neighbours.
    /// A block already completed by a synchronisation is left alone.
    pub fn free(&mut self, b: BlockId) {
        let i = b.index();
        if !self.b(i).allocated {
            return;
        }
        if self.b(i).pending {
            if let Some(n) = self.pending_order.remove(&i) {
                self.pending.remove(&n);
            }
            self.pending_requested = self.pending_requested.saturating_sub(self.b(i).requested);
        }
        let blk = *self.b(i);
        self.allocated -= blk.size;
        self.requested -= blk.requested;
        {
            let m = self.bm(i);
            m.allocated = false;
            m.pending = false;
            m.tag = NIL;
        }
        self.try_merge(i, blk.prev);
        let next = self.b(i).next;
        self.try_merge(i, next);
        self.insert_free(i);
    }

    fn synchronize_and_free_events(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        self.pending_order.clear();
        for i in pending.into_values() {
            let tag = self.b(i).tag;
            self.bm(i).pending = false;
            self.pending_requested = self.pending_requested.saturating_sub(self.b(i).requested);
            self.free(BlockId::new(i));
            self.events.push(ModelEvent::FreeCompleted { tag });
        }
    }

    // ---- releasing cached memory (spec 1.5) ----

    /// `empty_cache()`: `release_cached_blocks`.
    pub fn empty_cache(&mut self) {
        self.release_cached();
    }

    fn release_cached(&mut self) {
        self.synchronize_and_free_events();
        let large = self.pool(PoolKey::DEFAULT_LARGE);
        let small = self.pool(PoolKey::DEFAULT_SMALL);
        self.release_blocks(large);
        self.release_blocks(small);
    }

    fn release_blocks(&mut self, pool: PoolIndex) {
        let order: Vec<u32> = self.pools[pool as usize].free.blocks();
        let mut to_unmap = Vec::new();
        for i in order {
            if self.b(i).expandable != NIL {
                to_unmap.push(i);
            } else if !self.is_split(i) {
                self.release_block(i);
            }
        }
        for i in to_unmap {
            self.unmap_block(i);
            if !self.b(i).mapped && !self.is_split(i) {
                // The whole reservation is unmapped: the segment goes.
                let seg = self.b(i).expandable as usize;
                self.remove_unmapped(i);
                self.expandables[seg].alive = false;
                self.spare.push(i);
            }
        }
    }

    /// `release_block`: `cudaFree` of a whole free segment.
    fn release_block(&mut self, i: u32) {
        let b = *self.b(i);
        self.remove_free(i);
        self.reserved -= b.size;
        self.stats.segment_frees += 1;
        self.released += 1;
        self.events.push(ModelEvent::SegmentFree {
            addr: b.addr,
            size: b.size,
            stream: b.stream,
        });
        self.spare.push(i);
    }

    /// `release_available_cached_blocks`: with a `max_split_size`, free oversize cached
    /// segments of the stream until `size` bytes are released: the smallest one large
    /// enough, else from the largest down. Expandable blocks are never released here.
    fn release_available(&mut self, size: u64, stream: u64, pool: PoolIndex) -> bool {
        let max_split = self.settings.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key = size.max(max_split);
        let p = &self.pools[pool as usize];
        let first = p.free.from(stream, key).next();
        if let Some((_, _, i)) = first
            && self.b(i).expandable == NIL
        {
            self.release_block(i);
            return true;
        }
        let below = p.free.below(stream, key);
        let mut released = 0u64;
        for (size, i) in below {
            if released >= key || size < max_split {
                break;
            }
            // Oversize blocks are never split, so each is a whole segment.
            if self.b(i).expandable == NIL && !self.is_split(i) {
                released += size;
                self.release_block(i);
            }
        }
        released >= key
    }

    /// `garbage_collect_cached_blocks` (active with a memory fraction and a threshold):
    /// frees whole cached segments of the large pool whose age is at least the average,
    /// until reserved memory is back under the threshold.
    fn garbage_collect(&mut self) {
        let Some(allowed) = self.allowed_max() else {
            return;
        };
        let threshold = (self.settings.gc_threshold * allowed as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved - threshold;
        let large = self.pool(PoolKey::DEFAULT_LARGE) as usize;
        let clock = self.pools[large].gc_clock;
        // The average age is over every whole free block, expandable ones included,
        // though only `cudaMalloc` segments are released (`garbage_collect_cached_blocks`).
        let candidates: Vec<u32> = self.pools[large]
            .free
            .iter()
            .map(|(_, _, i)| i)
            .filter(|&i| !self.is_split(i))
            .collect();
        let mut total_age: u64 = candidates.iter().map(|&i| clock - self.b(i).gc_base).sum();
        let mut count = candidates.len() as u64;
        let mut reclaimed = 0u64;
        let mut freed = true;
        let before = self.stats.segment_frees;
        while reclaimed < target && freed && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed = false;
            let order: Vec<u32> = self.pools[large].free.blocks();
            for i in order {
                let b = *self.b(i);
                let age = clock - b.gc_base;
                if !self.is_split(i) && b.expandable == NIL && age as f64 >= threshold_age {
                    freed = true;
                    reclaimed += b.size;
                    total_age -= age;
                    count -= 1;
                    self.release_block(i);
                }
            }
        }
        if self.stats.segment_frees > before {
            self.stats.gc_runs += 1;
        }
    }

    // ---- re-synchronising with a recording ----

    /// Puts the allocation of `orig` bytes at `addr`, as a recording shows it, when `addr`
    /// starts inside a free block of `private`'s pool on `stream` with room for it: the
    /// free space before it stays free, the rest is split as `malloc` would. None (and
    /// nothing changed) when no free block holds it.
    pub fn allocate_at(
        &mut self,
        addr: u64,
        orig: u64,
        stream: u64,
        private: (i64, i64),
        tag: u32,
    ) -> Option<BlockId> {
        let size = self.round_size(orig);
        let pool = self.pool(PoolKey {
            private,
            small: size <= SMALL_SIZE,
        });
        // Free blocks never overlap: the one that holds the address is the only one that
        // starts at or below it and reaches past it. Among a few hundred blocks a look at
        // each of those large enough costs less than keeping every free block indexed by
        // address as well (the check of a 1 GB file: 0.48 s against 0.72).
        let few = self.pools[pool as usize].free.count(stream) <= SCAN_BLOCKS;
        if self.free_by_addr.is_none() && !few {
            let index = self
                .pools
                .iter()
                .flat_map(|p| p.free.iter().map(|(_, addr, i)| (addr, i)))
                .collect();
            self.free_by_addr = Some(index);
        }
        let holds = |i: u32| {
            let b = self.b(i);
            b.pool == pool
                && b.stream == stream
                && b.addr <= addr
                && addr.saturating_add(size) <= b.addr + b.size
        };
        let found = if self.free_by_addr.is_none() {
            self.pools[pool as usize]
                .free
                .from(stream, size)
                .map(|(_, _, i)| i)
                .find(|&i| holds(i))?
        } else {
            self.free_by_addr
                .as_ref()
                .and_then(|index| index.range(..=addr).next_back())
                .map(|(_, &i)| i)
                .filter(|&i| holds(i))?
        };
        self.remove_free(found);
        let f = *self.b(found);
        let mut i = found;
        if addr > f.addr {
            let front = self.new_block(Block {
                size: addr - f.addr,
                next: found,
                ..f
            });
            if f.prev != NIL {
                self.bm(f.prev).next = front;
            }
            let m = self.bm(found);
            m.prev = front;
            m.addr = addr;
            m.size -= addr - f.addr;
            self.insert_free(front);
            i = found;
        }
        Some(self.take(i, size, orig, tag))
    }

    // ---- views ----

    /// Everything that decides what the allocator does next, in a form two allocators
    /// that got there differently compare by (not block ids, not the order free blocks
    /// were kept in): with garbage collection and expandable segments off, two allocators
    /// with equal views answer every request the same.
    pub fn state_view(&self) -> StateView {
        let spare: std::collections::BTreeSet<u32> = self.spare.iter().copied().collect();
        let mut segments = Vec::new();
        for (h, head) in self.blocks.iter().enumerate() {
            let h = h as u32;
            if head.prev != NIL || spare.contains(&h) {
                continue;
            }
            if head.expandable != NIL && !self.expandables[head.expandable as usize].alive {
                continue;
            }
            let mut blocks = Vec::new();
            let mut size = 0;
            let mut i = h;
            while i != NIL {
                let b = self.b(i);
                size += b.size;
                // A free block keeps what its last request asked for; nothing reads it.
                let (requested, tag) = if b.allocated {
                    (b.requested, b.tag)
                } else {
                    (0, NIL)
                };
                blocks.push(BlockView {
                    addr: b.addr,
                    size: b.size,
                    requested,
                    allocated: b.allocated,
                    pending: b.pending,
                    mapped: b.mapped,
                    tag,
                    stream: b.stream,
                });
                i = b.next;
            }
            let pool = self.pool_key(head.pool);
            let expandable = head.expandable != NIL;
            segments.push((head.addr, size, head.stream, pool, expandable, blocks));
        }
        segments.sort_by_key(|s| s.0);
        StateView {
            pools: self.pools.iter().map(|p| p.key).collect(),
            segments,
            pending: self.pending.values().map(|&i| self.b(i).tag).collect(),
            reserved: self.reserved,
            allocated: self.allocated,
            requested: self.requested,
            total_memory: self.total_memory,
            highest_first: self.highest_first,
        }
    }

    /// The segments as a snapshot lists them, by address.
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        let mut heads: Vec<u32> = Vec::new();
        let live: std::collections::BTreeSet<u32> = self.spare.iter().copied().collect();
        for (i, b) in self.blocks.iter().enumerate() {
            let i = i as u32;
            if live.contains(&i) || b.prev != NIL {
                continue;
            }
            if b.expandable != NIL && !self.expandables[b.expandable as usize].alive {
                continue;
            }
            heads.push(i);
        }
        for h in heads {
            let mut cur: Option<SegmentView> = None;
            let mut i = h;
            while i != NIL {
                let b = self.b(i);
                if b.mapped {
                    let s = cur.get_or_insert_with(|| SegmentView {
                        addr: b.addr,
                        size: 0,
                        stream: b.stream,
                        pool: self.pool_key(b.pool),
                        expandable: b.expandable != NIL,
                        blocks: Vec::new(),
                    });
                    s.size += b.size;
                    s.blocks.push((b.addr, b.size, b.allocated));
                } else if let Some(s) = cur.take() {
                    out.push(s);
                }
                i = b.next;
            }
            if let Some(s) = cur.take() {
                out.push(s);
            }
        }
        out.sort_by_key(|s| s.addr);
        out
    }
}

/// A piece of a segment being restored.
#[derive(Clone, Copy, Debug)]
enum Piece {
    Free(u64, u64),
    Unmapped(u64, u64),
    /// Address, size, requested bytes, tag.
    Allocated(u64, u64, u64, u32),
}

/// Pieces of `[addr, addr + size)` with the allocated blocks in it and free space
/// around them (free neighbours are one block: they always merge).
fn carve(addr: u64, size: u64, allocated: &[(u64, u64, u64, u32)]) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut at = addr;
    let end = addr + size;
    for &(a, s, r, t) in allocated {
        if a > at {
            pieces.push(Piece::Free(at, a - at));
        }
        let s = s.min(end.saturating_sub(a));
        pieces.push(Piece::Allocated(a, s, r, t));
        at = a + s;
    }
    if end > at {
        pieces.push(Piece::Free(at, end - at));
    }
    pieces
}

/// `roundup_power2_next_division`: `size` rounded up to the next of `divisions` equal
/// steps between two powers of two.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    size.div_ceil(step).saturating_mul(step)
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
