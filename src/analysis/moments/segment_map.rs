//! The allocator's segments and blocks at one moment, each live block tied to the
//! allocation that made it (its stack, call site or category), from the backward rebuild
//! of the allocator state (spec 6.5) and the replay's live set at that moment.

use crate::analysis::kinds::attribution::{Attributor, GroupBy, GroupKind};
use crate::analysis::moments::moment::ResolvedMoment;
use crate::analysis::reports::top::LiveState;
use crate::model::Snapshot;
use crate::model::frames::FxMap;
use crate::timeline::Lifetime;
use crate::timeline::replay::DeviceReplay;
use crate::timeline::state::allocator_state;
use serde::Serialize;
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MapBlock {
    pub addr: u64,
    pub size_bytes: u64,
    pub requested_bytes: u64,
    /// Freed by the user, waiting for other streams before it can be reused.
    pub pending_free: bool,
    /// The official viewer's label of the allocation (`b'<address>_<n>`), when the replay
    /// knows it.
    pub label: Option<String>,
    /// Index into [`SegmentMap::groups`] of the allocation's group.
    pub group: Option<usize>,
    /// Python frames of the allocation (not of its free), innermost first.
    pub frames: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MapSegment {
    pub addr: u64,
    pub size_bytes: u64,
    pub stream: u64,
    pub pool_id: Option<(i64, i64)>,
    pub expandable: bool,
    pub blocks: Vec<MapBlock>,
    /// Free ranges: [address, size].
    pub holes: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MapGroup {
    pub name: String,
    pub kind: GroupKind,
    /// Block bytes of its blocks in the map.
    pub bytes: u64,
    pub blocks: usize,
    pub category: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SegmentMap {
    pub schema_version: u32,
    pub path: String,
    pub device: i64,
    pub moment: ResolvedMoment,
    pub by: GroupBy,
    pub reserved_bytes: u64,
    /// Block bytes of live blocks, pending frees excluded.
    pub allocated_bytes: u64,
    pub pending_free_bytes: u64,
    pub free_bytes: u64,
    /// Sorted by pool, stream and address.
    pub segments: Vec<MapSegment>,
    /// Largest first.
    pub groups: Vec<MapGroup>,
}

pub fn segment_map(
    snap: &Snapshot,
    path: &str,
    r: &DeviceReplay,
    attr: &Attributor,
    by: GroupBy,
    moment: ResolvedMoment,
    live: &LiveState,
) -> SegmentMap {
    let at = moment.event.map(|e| e as usize);
    attr.prepare_moment(live.at);
    let state = allocator_state(snap, r.device, at);
    // The allocation alive at each address (the latest, if the trace allocated an
    // address twice without freeing it).
    let mut by_addr: FxMap<u64, &Lifetime> = FxMap::default();
    by_addr.reserve(live.lifetimes.len());
    for l in &live.lifetimes {
        by_addr
            .entry(l.addr)
            .and_modify(|old| {
                if l.alloc > old.alloc {
                    *old = l;
                }
            })
            .or_insert(l);
    }
    // Labels of the allocations the map shows, their versions counted here unless the
    // live set carries them: it may hold far more than the map shows.
    let mut shown: Vec<Lifetime> = state
        .iter()
        .flat_map(|s| &s.blocks)
        .filter_map(|b| by_addr.get(&b.addr).map(|&l| *l))
        .collect();
    if live.versions == crate::analysis::reports::top::Versions::NotNeeded {
        r.fill_versions(&mut shown);
    }
    let labels: FxMap<u64, String> = shown.iter().map(|l| (l.addr, l.label())).collect();
    let mut group_index: BTreeMap<String, usize> = BTreeMap::new();
    let mut groups: Vec<MapGroup> = Vec::new();
    // Block bytes of each group by category: a group shows the one holding the most.
    let mut by_category: Vec<BTreeMap<u32, u64>> = Vec::new();
    let mut segments = Vec::with_capacity(state.len());
    for s in &state {
        let holes = s.holes();
        let blocks = s
            .blocks
            .iter()
            .map(|b| {
                let l = by_addr.get(&b.addr).copied();
                let group = l.map(|l| {
                    let key = attr.key(l, by);
                    let name = attr.name(&key);
                    let i = *group_index.entry(name.clone()).or_insert_with(|| {
                        groups.push(MapGroup {
                            name,
                            kind: Attributor::kind(&key),
                            bytes: 0,
                            blocks: 0,
                            category: String::new(),
                        });
                        by_category.push(BTreeMap::new());
                        groups.len() - 1
                    });
                    groups[i].bytes += b.size;
                    groups[i].blocks += 1;
                    *by_category[i].entry(attr.category(l)).or_default() += b.size;
                    i
                });
                // The allocation's own stack; the block's, when the replay has none.
                let stack = match l {
                    Some(l) => Attributor::allocation_stack(l),
                    None => b.stack,
                };
                MapBlock {
                    addr: b.addr,
                    size_bytes: b.size,
                    requested_bytes: b.requested,
                    pending_free: b.pending_free,
                    label: l.map(|l| labels[&l.addr].clone()),
                    group,
                    frames: crate::analysis::kinds::frames::user_frames(&snap.frames, stack, 6),
                }
            })
            .collect();
        segments.push(MapSegment {
            addr: s.addr,
            size_bytes: s.size,
            stream: s.stream,
            pool_id: s.pool_id,
            expandable: s.expandable,
            blocks,
            holes,
        });
    }
    for (g, parts) in groups.iter_mut().zip(&by_category) {
        if let Some((&c, _)) = parts.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) {
            g.category = attr.categories[c as usize].clone();
        }
    }
    // Largest group first; blocks point at the new order.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|&a, &b| {
        groups[b]
            .bytes
            .cmp(&groups[a].bytes)
            .then_with(|| groups[a].name.cmp(&groups[b].name))
    });
    let mut new_index = vec![0; groups.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    for b in segments.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
        b.group = b.group.map(|g| new_index[g]);
    }
    let groups: Vec<MapGroup> = order.into_iter().map(|i| groups[i].clone()).collect();
    let blocks = || segments.iter().flat_map(|s| &s.blocks);
    SegmentMap {
        schema_version: SCHEMA_VERSION,
        path: path.to_string(),
        device: r.device,
        moment,
        by,
        reserved_bytes: segments.iter().map(|s| s.size_bytes).sum(),
        allocated_bytes: blocks()
            .filter(|b| !b.pending_free)
            .map(|b| b.size_bytes)
            .sum(),
        pending_free_bytes: blocks()
            .filter(|b| b.pending_free)
            .map(|b| b.size_bytes)
            .sum(),
        free_bytes: segments.iter().flat_map(|s| &s.holes).map(|h| h.1).sum(),
        groups,
        segments,
    }
}
