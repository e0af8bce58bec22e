//! The allocator's segments and blocks at any moment, rebuilt backwards from the final
//! state by undoing trace events (the official viewer's Allocator State History, spec
//! section 6.5). Blocks rebuilt from trace entries have their requested size (the
//! rounding is not recorded); blocks still alive at the end keep their real size.

use crate::model::frames::FxMap;
use crate::model::{Action, BlockState, Snapshot, StackId};

/// A block that is allocated or waiting for its free to complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateBlock {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    /// Freed by the user, waiting for other streams (free_requested without free_completed).
    pub pending_free: bool,
    pub stack: Option<StackId>,
}

/// A segment at that moment, with its blocks in address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSegment {
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub pool_id: Option<(i64, i64)>,
    pub expandable: bool,
    pub blocks: Vec<StateBlock>,
}

impl StateSegment {
    /// Free ranges inside the segment (address, size), in address order.
    pub fn holes(&self) -> Vec<(u64, u64)> {
        let mut holes = Vec::new();
        let mut at = self.addr;
        for b in &self.blocks {
            if b.addr > at {
                holes.push((at, b.addr - at));
            }
            at = at.max(b.addr.saturating_add(b.size));
        }
        let end = self.addr.saturating_add(self.size);
        if end > at {
            holes.push((at, end - at));
        }
        holes
    }
}

/// Segments of a device just after event `at` (None: before the first event), sorted by
/// pool, stream and address. One backward pass; segments kept by address, so each undo
/// is a logarithmic lookup.
pub fn allocator_state(snap: &Snapshot, device: i64, at: Option<usize>) -> Vec<StateSegment> {
    use std::collections::BTreeMap;
    let mut segments: BTreeMap<u64, StateSegment> = snap
        .segments_of(device)
        .map(|s| {
            (
                s.address,
                StateSegment {
                    addr: s.address,
                    size: s.total_size,
                    stream: s.stream,
                    pool_id: s.pool_id,
                    expandable: s.is_expandable,
                    blocks: Vec::new(),
                },
            )
        })
        .collect();
    // Live blocks by address (hashed: a long trace keeps many open), placed into
    // segments at the end in address order.
    let mut blocks: FxMap<u64, StateBlock> = snap
        .segments_of(device)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| {
            matches!(
                b.state,
                BlockState::ActiveAllocated | BlockState::ActivePendingFree
            )
        })
        .map(|b| {
            (
                b.address,
                StateBlock {
                    addr: b.address,
                    size: b.size,
                    requested: b.requested_size,
                    pending_free: b.state == BlockState::ActivePendingFree,
                    stack: b.stack,
                },
            )
        })
        .collect();
    if let Some(trace) = snap.trace(device) {
        let first_kept = at.map_or(0, |i| i + 1);
        for i in (first_kept..trace.len()).rev() {
            let e = trace.get(i);
            match e.action {
                // Before its free completed, the block was waiting (or, when its
                // free_requested is undone next, plainly allocated).
                Action::FreeCompleted => {
                    blocks.insert(
                        e.addr,
                        StateBlock {
                            addr: e.addr,
                            size: e.size,
                            requested: e.size,
                            pending_free: true,
                            stack: e.stack,
                        },
                    );
                }
                Action::FreeRequested => {
                    if let Some(b) = blocks.get_mut(&e.addr) {
                        b.pending_free = false;
                    }
                }
                Action::Alloc => {
                    blocks.remove(&e.addr);
                }
                // A release undone brings its range back, unless a segment the walk
                // still holds (made later, or alive at the end) covers any of it: the
                // recording contradicts itself there, and the later state wins (two
                // segments over one range would hand out the same bytes twice).
                Action::SegmentFree if overlaps(&segments, e.addr, e.size) => {}
                Action::SegmentFree => {
                    segments.insert(
                        e.addr,
                        StateSegment {
                            addr: e.addr,
                            size: e.size,
                            stream: e.stream,
                            pool_id: None,
                            expandable: false,
                            blocks: Vec::new(),
                        },
                    );
                }
                Action::SegmentAlloc => {
                    segments.remove(&e.addr);
                }
                Action::SegmentUnmap => unmap_undo(&mut segments, e.addr, e.size, e.stream),
                Action::SegmentMap => map_undo(&mut segments, e.addr, e.size),
                _ => {}
            }
        }
    }
    // Pools of segments that came back from the trace: the final segment's pool at the
    // same address, if any.
    let mut finals: Vec<(u64, u64, crate::timeline::replay::PoolId)> = snap
        .segments_of(device)
        .map(|f| (f.address, f.total_size, f.pool_id))
        .collect();
    finals.sort_unstable();
    for s in segments.values_mut().filter(|s| s.pool_id.is_none()) {
        let i = finals.partition_point(|f| f.0 <= s.addr);
        s.pool_id = i
            .checked_sub(1)
            .map(|i| finals[i])
            .filter(|f| s.addr < f.0.saturating_add(f.1))
            .and_then(|f| f.2);
    }
    let mut blocks: Vec<StateBlock> = blocks.into_values().collect();
    blocks.sort_unstable_by_key(|b| b.addr);
    for b in blocks {
        if let Some((_, s)) = segments.range_mut(..=b.addr).next_back()
            && b.addr < s.addr.saturating_add(s.size)
        {
            s.blocks.push(b);
        }
    }
    let mut out: Vec<StateSegment> = segments.into_values().collect();
    out.sort_by_key(|s| (s.pool_id, s.stream, s.addr));
    out
}

/// Whether `[addr, addr + size)` is empty or meets a segment of `segments` (disjoint,
/// keyed by address).
fn overlaps(
    segments: &std::collections::BTreeMap<u64, StateSegment>,
    addr: u64,
    size: u64,
) -> bool {
    let end = addr.saturating_add(size);
    size == 0
        || segments
            .range(..end)
            .next_back()
            .is_some_and(|(_, s)| s.addr.saturating_add(s.size) > addr)
}

/// Undoing an unmap maps the range again, joined to address-adjacent segments of the
/// same stream (expandable segments grow and shrink in place).
fn unmap_undo(
    segments: &mut std::collections::BTreeMap<u64, StateSegment>,
    addr: u64,
    size: u64,
    stream: u64,
) {
    if overlaps(segments, addr, size) {
        return;
    }
    let end = addr.saturating_add(size);
    let mut start = addr;
    let mut stop = end;
    let mut pool = None;
    // The expandable segment ending where the range starts (a `cudaMalloc` segment is
    // never mapped or unmapped in pieces).
    if let Some((&k, s)) = segments.range(..addr).next_back()
        && s.stream == stream
        && s.expandable
        && s.addr.saturating_add(s.size) == addr
    {
        let s = segments.remove(&k).expect("present");
        start = s.addr;
        pool = pool.or(s.pool_id);
    }
    // The expandable segment starting where the range ends.
    if let Some(s) = segments.get(&end)
        && s.stream == stream
        && s.expandable
    {
        let s = segments.remove(&end).expect("present");
        stop = s.addr.saturating_add(s.size);
        pool = pool.or(s.pool_id);
    }
    segments.insert(
        start,
        StateSegment {
            addr: start,
            size: stop - start,
            stream,
            pool_id: pool,
            expandable: true,
            blocks: Vec::new(),
        },
    );
}

/// Undoing a map cuts the range out of the segment that holds it.
fn map_undo(segments: &mut std::collections::BTreeMap<u64, StateSegment>, addr: u64, size: u64) {
    let end = addr.saturating_add(size);
    let Some((&k, s)) = segments.range(..=addr).next_back() else {
        return;
    };
    if end > s.addr.saturating_add(s.size) {
        return;
    }
    let s = segments.remove(&k).expect("present");
    let s_end = s.addr + s.size;
    if s.addr < addr {
        segments.insert(
            s.addr,
            StateSegment {
                size: addr - s.addr,
                blocks: Vec::new(),
                ..s.clone()
            },
        );
    }
    if end < s_end {
        segments.insert(
            end,
            StateSegment {
                addr: end,
                size: s_end - end,
                blocks: Vec::new(),
                ..s
            },
        );
    }
}
