//! The allocator's state at a trace's first event (spec 4.4 "Start state", and section 5's
//! first inference).
//!
//! Takes a snapshot, a device and its [`Requests`]; gives [`StartState`]: the segments
//! before the first event (the final segments with every traced segment event undone,
//! [`crate::timeline::state::allocator_state`]), the blocks alive in them, and the
//! expandable segments' reservations. Blocks still alive at the end have their exact
//! size; a block freed in the trace is known only by its requested size, so its block
//! size is inferred: its rounded size, plus the free space after it when that is too
//! small to have been split off (1 MiB in the large pool, 512 bytes where every remainder
//! is split), else up to the first later allocation that lands right after it while it
//! is alive.

use super::model::{Allocator, BlockId, MIN_BLOCK, PoolKey, SMALL_BUFFER, SMALL_SIZE};
use super::requests::Requests;
use crate::model::{SegmentType, Snapshot};
use crate::timeline::state::StateSegment;
use std::collections::BTreeMap;

/// A `cudaMalloc` segment at the start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartSegment {
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: PoolKey,
    /// (address, block size, requested bytes, tag), by address.
    pub blocks: Vec<(u64, u64, u64, u32)>,
}

/// An expandable segment at the start: its reservation and the ranges mapped in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartReservation {
    /// The lowest address mapped in it at any time the file shows (its first page is
    /// mapped first).
    pub base: u64,
    pub stream: u64,
    pub pool: PoolKey,
    /// (address, size) of each mapped range, by address.
    pub mapped: Vec<(u64, u64)>,
    pub blocks: Vec<(u64, u64, u64, u32)>,
}

/// A block alive at the start, as a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveRequest {
    pub addr: u64,
    pub tag: u32,
    pub requested: u64,
    pub stream: u64,
    pub private: (i64, i64),
}

/// The state at the first event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    pub segments: Vec<StartSegment>,
    pub reservations: Vec<StartReservation>,
    /// Blocks alive at the start.
    pub blocks: u64,
    /// Of those, blocks whose size was inferred (freed in the trace).
    pub blocks_inferred: u64,
    /// Bytes reserved at the start.
    pub reserved: u64,
    /// Requested bytes alive at the start.
    pub requested: u64,
}

impl StartState {
    /// Nothing allocated and nothing reserved: recording began before the first
    /// allocation.
    pub fn is_empty(&self) -> bool {
        self.reserved == 0
    }

    /// The highest address in use at the start.
    pub fn top_address(&self) -> u64 {
        let a = self.segments.iter().map(|s| s.addr.saturating_add(s.size));
        let b = self
            .reservations
            .iter()
            .flat_map(|r| r.mapped.iter().map(|m| m.0.saturating_add(m.1)));
        a.chain(b).max().unwrap_or(0)
    }

    /// The lowest address a segment or a reservation starts at (u64::MAX: none).
    pub fn low_address(&self) -> u64 {
        let a = self.segments.iter().map(|s| s.addr);
        let b = self.reservations.iter().map(|r| r.base);
        a.chain(b).min().unwrap_or(u64::MAX)
    }

    /// The blocks alive at the start, by address: what a replay under other settings
    /// allocates first.
    pub fn live_requests(&self) -> Vec<LiveRequest> {
        let mut out = Vec::new();
        let mut add = |blocks: &[(u64, u64, u64, u32)], stream: u64, pool: PoolKey| {
            for b in blocks {
                out.push(LiveRequest {
                    addr: b.0,
                    tag: b.3,
                    requested: b.2,
                    stream,
                    private: pool.private,
                });
            }
        };
        for s in &self.segments {
            add(&s.blocks, s.stream, s.pool);
        }
        for r in &self.reservations {
            add(&r.blocks, r.stream, r.pool);
        }
        out.sort_unstable_by_key(|l| l.addr);
        out
    }

    /// Puts the state into a new allocator; gives each live block's id by tag.
    pub fn restore(&self, a: &mut Allocator) -> BTreeMap<u32, BlockId> {
        let mut by_tag = BTreeMap::new();
        for s in &self.segments {
            let ids = a.restore_segment(s.addr, s.size, s.stream, s.pool, &s.blocks);
            for (b, id) in s.blocks.iter().zip(ids) {
                by_tag.insert(b.3, id);
            }
        }
        for r in &self.reservations {
            let page = if r.pool.small {
                SMALL_BUFFER
            } else {
                a.settings().large_segment_size
            };
            let size = a.reservation_size(page);
            let ids = a.restore_expandable(r.base, size, r.stream, r.pool, &r.mapped, &r.blocks);
            for (b, id) in r.blocks.iter().zip(ids) {
                by_tag.insert(b.3, id);
            }
        }
        by_tag
    }
}

/// The state at the first event of `device`, from its segments then
/// ([`crate::timeline::state::allocator_state`] at the start); blocks alive at the end with no `alloc` in
/// the trace get new tags from `requests`. `round` is the allocator's `round_size`;
/// `split_small` says whether large-pool blocks split like small ones (expandable
/// segments on).
pub fn rebuild(
    snap: &Snapshot,
    device: i64,
    segments: Vec<StateSegment>,
    requests: &mut Requests,
    round: &dyn Fn(u64) -> u64,
    split_small: bool,
) -> StartState {
    let finals = Finals::of(snap, device);
    let before: BTreeMap<u64, (u32, u64, u32)> = requests
        .before
        .iter()
        .map(|b| (b.addr, (b.tag, b.requested, b.freed_at)))
        .collect();
    let landings = landings(snap, device, &segments, &before, round);
    let mut out = StartState::default();
    let mut groups: BTreeMap<(u64, PoolKey), StartReservation> = BTreeMap::new();
    for seg in &segments {
        let small = if seg.expandable {
            finals.expandable_is_small(seg.addr, seg.size, seg.stream)
        } else {
            finals
                .plain
                .get(&seg.addr)
                .copied()
                .unwrap_or(seg.size == SMALL_BUFFER)
        };
        let pool = PoolKey {
            private: seg.pool_id.unwrap_or((0, 0)),
            small,
        };
        let seg_end = seg.addr + seg.size;
        let mut blocks: Vec<(u64, u64, u64, u32)> = Vec::new();
        for (k, b) in seg.blocks.iter().enumerate() {
            let next = seg
                .blocks
                .get(k + 1)
                .map_or(seg_end, |n| n.addr)
                .min(seg_end);
            out.blocks += 1;
            out.requested += b.requested;
            match before.get(&b.addr) {
                Some(&(tag, requested, freed_at)) => {
                    out.blocks_inferred += 1;
                    let size = inferred_size(
                        b.addr,
                        requested,
                        next,
                        freed_at,
                        round,
                        small || split_small,
                        &landings,
                    );
                    blocks.push((b.addr, size, requested, tag));
                }
                None => {
                    let tag = requests.tags;
                    requests.tags += 1;
                    blocks.push((b.addr, b.size.min(next - b.addr), b.requested, tag));
                }
            }
        }
        out.reserved += seg.size;
        if seg.expandable {
            let g = groups
                .entry((seg.stream, pool))
                .or_insert_with(|| StartReservation {
                    base: seg.addr,
                    stream: seg.stream,
                    pool,
                    mapped: Vec::new(),
                    blocks: Vec::new(),
                });
            g.base = g.base.min(seg.addr);
            g.mapped.push((seg.addr, seg.size));
            g.blocks.extend(blocks);
        } else {
            out.segments.push(StartSegment {
                addr: seg.addr,
                size: seg.size,
                stream: seg.stream,
                pool,
                blocks,
            });
        }
    }
    for (&(stream, pool), g) in groups.iter_mut() {
        // The reservation starts at the lowest address mapped in it that the file shows
        // (within the span of one reservation: no device reserves 2^40 bytes of address
        // space for one pool).
        let lo = g.mapped.iter().map(|m| m.0).min().unwrap_or(g.base);
        let shown = finals.expandable.get(&stream).into_iter().flatten();
        for f in shown.filter(|f| f.2 == pool.small) {
            if f.0.abs_diff(lo) < 1 << 40 {
                g.base = g.base.min(f.0);
            }
        }
        g.mapped.sort_unstable();
        g.blocks.sort_unstable();
    }
    out.reservations = groups.into_values().collect();
    out.segments.sort_by_key(|s| s.addr);
    out
}

/// The file's final segments, looked up by address: each `cudaMalloc` segment's pool
/// (small or not), and per stream its expandable ranges (address, size, small) by
/// address.
struct Finals {
    plain: BTreeMap<u64, bool>,
    expandable: BTreeMap<u64, Vec<(u64, u64, bool)>>,
}

impl Finals {
    fn of(snap: &Snapshot, device: i64) -> Finals {
        let mut f = Finals {
            plain: BTreeMap::new(),
            expandable: BTreeMap::new(),
        };
        for s in snap.segments_of(device) {
            let small = s.segment_type == SegmentType::Small;
            if s.is_expandable {
                f.expandable
                    .entry(s.stream)
                    .or_default()
                    .push((s.address, s.total_size, small));
            } else {
                f.plain.entry(s.address).or_insert(small);
            }
        }
        for ranges in f.expandable.values_mut() {
            ranges.sort_unstable();
        }
        f
    }

    /// Whether an expandable range at the start belongs to the small pool: as the final
    /// range of its stream nearest to it (the lower of two as near), else as its size
    /// says.
    fn expandable_is_small(&self, addr: u64, size: u64, stream: u64) -> bool {
        let Some(ranges) = self.expandable.get(&stream) else {
            return size == SMALL_BUFFER;
        };
        let end = addr.saturating_add(size);
        let distance = |f: &(u64, u64, bool)| {
            let f_end = f.0.saturating_add(f.1);
            if addr < f_end && f.0 < end {
                0
            } else {
                addr.abs_diff(f_end).min(f.0.abs_diff(end))
            }
        };
        // The ranges are disjoint, so ordered by start they are ordered by end: the
        // nearest is the first that ends past `addr` or the one before it.
        let k = ranges.partition_point(|f| f.0.saturating_add(f.1) <= addr);
        [k.checked_sub(1), Some(k)]
            .into_iter()
            .flatten()
            .filter_map(|k| ranges.get(k))
            .min_by_key(|f| distance(f))
            .map_or(size == SMALL_BUFFER, |f| f.2)
    }
}

/// Where allocations landed in the windows just after the blocks from before the trace
/// that the trace frees (each block's rounded end to 1 MiB past it): (address, event),
/// by address. One pass over the trace, only when there are such blocks.
fn landings(
    snap: &Snapshot,
    device: i64,
    segments: &[StateSegment],
    before: &BTreeMap<u64, (u32, u64, u32)>,
    round: &dyn Fn(u64) -> u64,
) -> Vec<(u64, u32)> {
    let mut windows: Vec<(u64, u64)> = segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter_map(|b| before.get(&b.addr).map(|&(_, req, _)| b.addr + round(req)))
        .map(|end| (end, end + SMALL_SIZE))
        .collect();
    if windows.is_empty() {
        return Vec::new();
    }
    windows.sort_unstable();
    let Some(trace) = snap.trace(device) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for i in 0..trace.len() {
        if trace.action(i) != crate::model::Action::Alloc {
            continue;
        }
        let a = trace.addr(i);
        let k = windows.partition_point(|w| w.0 <= a);
        if k > 0 && a <= windows[k - 1].1 || windows.get(k).is_some_and(|w| w.0 == a) {
            out.push((a, i as u32));
        }
    }
    out.sort_unstable();
    out
}

/// The block size of a block from before the trace, known by its requested size (spec
/// section 5, first inference).
fn inferred_size(
    addr: u64,
    requested: u64,
    next: u64,
    freed_at: u32,
    round: &dyn Fn(u64) -> u64,
    splits_small: bool,
    alloc_sites: &[(u64, u32)],
) -> u64 {
    let room = next.saturating_sub(addr);
    let size = round(requested).min(room);
    let gap = room - size;
    let limit = if splits_small {
        MIN_BLOCK - 1
    } else {
        SMALL_SIZE
    };
    if gap <= limit {
        // Too small to have been split off: it belongs to the block.
        return room;
    }
    // The first allocation that lands within what could belong to it, while it is
    // alive, starts where it ends.
    let end0 = addr + size;
    let lo = alloc_sites.partition_point(|s| s.0 < end0);
    alloc_sites[lo..]
        .iter()
        .take_while(|s| s.0 <= end0 + limit)
        .filter(|s| s.1 < freed_at)
        .min_by_key(|s| s.1)
        .map_or(size, |s| s.0 - addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// The nearest expandable range of a stream, found by binary search, is the one the
    /// whole list gives (the lower of two as near): checked at every 1 MiB step across
    /// and around ranges of both pools on two streams.
    #[test]
    fn the_nearest_final_range_is_the_one_a_scan_finds() {
        let ranges: Vec<(u64, u64, u64, bool)> = vec![
            (100 * MIB, 20 * MIB, 0, false),
            (130 * MIB, 2 * MIB, 0, true),
            (140 * MIB, 40 * MIB, 0, false),
            (300 * MIB, 4 * MIB, 0, true),
            (110 * MIB, 20 * MIB, 1, true),
        ];
        let finals = Finals {
            plain: BTreeMap::new(),
            expandable: {
                let mut m: BTreeMap<u64, Vec<(u64, u64, bool)>> = BTreeMap::new();
                for &(a, s, stream, small) in &ranges {
                    m.entry(stream).or_default().push((a, s, small));
                }
                m
            },
        };
        let scan = |addr: u64, size: u64, stream: u64| {
            ranges
                .iter()
                .filter(|f| f.2 == stream)
                .min_by_key(|f| {
                    let (a0, a1) = (addr, addr + size);
                    let (b0, b1) = (f.0, f.0 + f.1);
                    if a0 < b1 && b0 < a1 {
                        0
                    } else {
                        a0.abs_diff(b1).min(b0.abs_diff(a1))
                    }
                })
                .map_or(size == SMALL_BUFFER, |f| f.3)
        };
        for stream in 0..3 {
            for at in 0..400 {
                for size in [2 * MIB, 20 * MIB] {
                    assert_eq!(
                        finals.expandable_is_small(at * MIB, size, stream),
                        scan(at * MIB, size, stream),
                        "{at} MiB, {size}, stream {stream}"
                    );
                }
            }
        }
    }
}
