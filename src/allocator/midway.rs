//! The allocator's state at a request in the middle of a recording, rebuilt from the
//! recording, so that the identity check can replay the two halves of a long recording
//! at once ([`super::identity`]).
//!
//! Takes a [`Prepared`] recording, its trace and a request index; gives an allocator in
//! the state a replay that followed the recording would be in before that request: the
//! segments held then (the start's, with the `segment_*` entries of the requests before
//! it), the blocks alive then at their recorded addresses, each of its rounded size plus
//! the free space after it where that is too small to have been split off, and the
//! blocks freed while other streams used them waiting, in the order they were freed.
//!
//! It is a guess: a block that took a free block whole (its remainder too small to split)
//! looks split here once the block after it is freed. So the caller compares it with the
//! state the replay of the first half ends in ([`super::model::Allocator::state_view`])
//! and uses it only where the two are equal. Only states the view decides are rebuilt:
//! no expandable segments, no garbage collection, no `max_split_size`.

use super::model::{Allocator, BlockId, MIN_BLOCK, PoolKey, SMALL_SIZE};
use super::prepared::Prepared;
use super::requests::Request;
use crate::model::frames::FxMap;
use crate::model::{Action, DeviceTrace};
use std::collections::BTreeMap;

/// A rebuilt state: the allocator and each live request's block.
pub struct Midway {
    pub a: Allocator,
    pub by_tag: Vec<Option<BlockId>>,
}

/// Whether a state of `p` can be rebuilt at all (see the module's notes).
pub fn can_rebuild(p: &Prepared) -> bool {
    p.settings.max_split_size == u64::MAX
        && !p.settings.expandable_segments
        && p.settings.gc_threshold == 0.0
        && p.start.reservations.is_empty()
        && p.requests
            .outputs
            .iter()
            .all(|o| matches!(o.action, Action::SegmentAlloc | Action::SegmentFree))
}

/// A block alive at the request: (address, tag, requested bytes, stream, pool, block size
/// where known).
type Live = (u64, u32, u64, u64, (i64, i64), Option<u64>);

/// The state before request `m` of `p`, or None where the recording does not give one
/// (a block outside every segment, or one larger than the room it has).
pub fn state_at(p: &Prepared, trace: &DeviceTrace, m: usize) -> Option<Midway> {
    const NONE: u32 = 0;
    const AT_START: u32 = u32::MAX;
    let probe = Allocator::new(p.settings.clone(), p.profile, p.total_memory);
    // Rounding keeps a request on its side of the small pool's limit (a power of two).
    let key_of = |size: u64, pool: (i64, i64)| PoolKey {
        private: pool,
        small: size <= SMALL_SIZE,
    };
    // Pools in the order a replay makes them: the start's segments, then first use.
    let mut pools: Vec<PoolKey> = Vec::new();
    let mut use_pool = |k: PoolKey| {
        if pools.last() != Some(&k) && !pools.contains(&k) {
            pools.push(k);
        }
    };
    // By address; sorted once at the end (most segments come and go before the cut).
    let mut segments: FxMap<u64, (u64, u64, PoolKey)> = FxMap::default();
    let mut at_start: BTreeMap<u32, Live> = BTreeMap::new();
    // Per tag: 1 + the request that allocated it (NONE: not alive; AT_START: from the
    // start); and the request that freed it while other streams used it, for those alive.
    let tags = p.requests.tags as usize;
    let mut alive = vec![NONE; tags];
    let mut waiting: FxMap<u32, u32> = FxMap::default();
    for s in &p.start.segments {
        use_pool(s.pool);
        segments.insert(s.addr, (s.size, s.stream, s.pool));
        for &(addr, size, requested, tag) in &s.blocks {
            *alive.get_mut(tag as usize)? = AT_START;
            at_start.insert(
                tag,
                (addr, tag, requested, s.stream, s.pool.private, Some(size)),
            );
        }
    }
    let mut grow = |outs: &[super::requests::Recorded], key: Option<PoolKey>| -> Option<()> {
        for o in outs {
            match o.action {
                Action::SegmentAlloc => {
                    segments.insert(o.addr, (o.size, o.stream, key?));
                }
                _ => {
                    segments.remove(&o.addr);
                }
            }
        }
        Some(())
    };
    for (i, r) in p.requests.iter().take(m).enumerate() {
        match r {
            Request::Alloc {
                size,
                pool,
                ref outputs,
                ..
            }
            | Request::Oom {
                size,
                pool,
                ref outputs,
                ..
            } => {
                let key = key_of(size, pool);
                use_pool(key);
                grow(p.requests.outputs_of(outputs), Some(key))?;
                if let Request::Alloc { tag, .. } = r {
                    *alive.get_mut(tag as usize)? = i as u32 + 1;
                }
            }
            Request::EmptyCache { outputs, .. } => grow(p.requests.outputs_of(&outputs), None)?,
            Request::FreeRequested { tag, .. } => {
                if alive.get(tag as usize).is_some_and(|&a| a != NONE) {
                    // A block freed so twice waits from the first time.
                    waiting.entry(tag).or_insert(i as u32);
                }
            }
            Request::Free { tag, .. } => {
                *alive.get_mut(tag as usize)? = NONE;
                if !waiting.is_empty() {
                    waiting.remove(&tag);
                }
            }
        }
    }
    let mut live: Vec<Live> = Vec::new();
    for (tag, &from) in alive.iter().enumerate() {
        match from {
            NONE => {}
            AT_START => live.push(at_start[&(tag as u32)]),
            _ => {
                let r = p.requests.alloc_at(from as usize - 1)?;
                let addr = trace.addr(r.event as usize);
                live.push((addr, r.tag, r.size, r.stream, r.pool, None));
            }
        }
    }
    live.sort_unstable_by_key(|l| l.0);
    let mut a = Allocator::new(p.settings.clone(), p.profile, p.total_memory);
    for k in pools {
        a.ensure_pool(k);
    }
    let mut by_tag: Vec<Option<BlockId>> = vec![None; tags];
    let mut segments: Vec<(u64, (u64, u64, PoolKey))> = segments.into_iter().collect();
    segments.sort_unstable_by_key(|s| s.0);
    let mut k = 0;
    for &(addr, (size, stream, pool)) in &segments {
        let end = addr + size;
        let lo = k;
        while k < live.len() && live[k].0 < end {
            if live[k].0 < addr {
                return None;
            }
            k += 1;
        }
        let here = &live[lo..k];
        let limit = if pool.small {
            MIN_BLOCK - 1
        } else {
            SMALL_SIZE
        };
        let mut blocks = Vec::with_capacity(here.len());
        for (j, l) in here.iter().enumerate() {
            let next = here.get(j + 1).map_or(end, |n| n.0);
            let room = next - l.0;
            let size = match l.5 {
                Some(size) => size.min(room),
                None => {
                    let rounded = probe.round_size(l.2);
                    if rounded > room {
                        return None;
                    }
                    if room - rounded <= limit {
                        room
                    } else {
                        rounded
                    }
                }
            };
            blocks.push((l.0, size, l.2, l.1));
        }
        let ids = a.restore_segment(addr, size, stream, pool, &blocks);
        for (b, id) in blocks.iter().zip(ids) {
            by_tag[b.3 as usize] = Some(id);
        }
    }
    if k < live.len() {
        return None;
    }
    let mut pending: Vec<(u32, u32)> = waiting.into_iter().map(|(tag, w)| (w, tag)).collect();
    pending.sort_unstable();
    for (_, tag) in pending {
        a.free_requested(by_tag[tag as usize]?);
    }
    Some(Midway { a, by_tag })
}
