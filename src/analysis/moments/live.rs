//! The live set: every allocation alive at one moment of a device's timeline, largest
//! first, with lifetimes, streams, pools and the top frames of each stack.

use crate::analysis::device::DeviceChoice;
use crate::analysis::kinds::attribution::Attributor;
use crate::analysis::kinds::frames::user_frames;
use crate::analysis::moments::moment::ResolvedMoment;
use crate::analysis::reports::top::LiveState;
use crate::model::{DeviceTrace, Snapshot};
use crate::timeline::Origin;
use serde::Serialize;

pub const SCHEMA_VERSION: u32 = 3;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LiveAllocation {
    /// The official viewer's label: `b'<hex address>_<n>`, the n-th allocation at that
    /// address in the trace.
    pub label: String,
    pub addr: u64,
    /// Requested bytes.
    pub size_bytes: u64,
    pub origin: Origin,
    pub alloc_event: Option<u32>,
    pub free_completed_event: Option<u32>,
    pub alloc_time_us: Option<i64>,
    pub stream: u64,
    pub pool_id: Option<(i64, i64)>,
    /// What kind of memory it is ([`crate::analysis::kinds::categories`]).
    pub category: String,
    /// What decided it ([`crate::analysis::kinds::categories::Evidence::code`]).
    pub category_evidence: String,
    /// Whether that is an inference.
    pub category_inferred: bool,
    /// Top frames of the allocation's stack, innermost first, noise filtered (empty for
    /// allocations from before the trace: the stack recorded with their free is not
    /// where they were allocated).
    pub frames: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LiveReport {
    pub schema_version: u32,
    pub path: String,
    pub device: i64,
    pub moment: ResolvedMoment,
    /// Requested bytes alive (the official viewer's count).
    pub requested_bytes: u64,
    /// Block bytes alive.
    pub allocated_bytes: u64,
    pub reserved_bytes: i64,
    pub count: usize,
    pub allocations: Vec<LiveAllocation>,
}

/// The live set at a resolved moment, largest first (ties by address then version).
#[allow(clippy::too_many_arguments)]
pub fn live_set(
    snap: &Snapshot,
    attr: &Attributor,
    path: &str,
    choice: &DeviceChoice,
    moment: ResolvedMoment,
    live: &LiveState,
    trace: &DeviceTrace,
    frames: usize,
) -> LiveReport {
    let mut list: Vec<&crate::timeline::Lifetime> = live.lifetimes.iter().collect();
    list.sort_by(|a, b| {
        b.size
            .cmp(&a.size)
            .then(a.addr.cmp(&b.addr))
            .then(a.version.cmp(&b.version))
    });
    attr.prepare_moment(live.at);
    let allocations: Vec<LiveAllocation> = list
        .iter()
        .map(|l| (l, attr.decide(l)))
        .map(|(l, d)| LiveAllocation {
            label: l.label(),
            addr: l.addr,
            size_bytes: l.size,
            origin: l.origin,
            alloc_event: l.alloc.map(|e| e.index() as u32),
            free_completed_event: l.free_completed.map(|e| e.index() as u32),
            alloc_time_us: l.alloc.and_then(|e| trace.stamped_time(e.index())),
            stream: live.stream(l),
            pool_id: live.pool_id(l),
            category: attr
                .categories
                .get(d.category as usize)
                .cloned()
                .unwrap_or_default(),
            category_evidence: d.evidence.code(&snap.frames),
            category_inferred: d.inferred(),
            frames: user_frames(&snap.frames, Attributor::allocation_stack(l), frames),
        })
        .collect();
    LiveReport {
        schema_version: SCHEMA_VERSION,
        path: path.to_string(),
        device: choice.device,
        moment,
        requested_bytes: live.requested_bytes,
        allocated_bytes: live.allocated_bytes,
        reserved_bytes: live.reserved_bytes,
        count: allocations.len(),
        allocations,
    }
}
