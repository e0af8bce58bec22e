//! What was live at one moment, grouped by call site, category, stack or file: the
//! answer to "what was using memory at the peak, and which line put it there".

use crate::analysis::kinds::attribution::{Attributor, GroupBy, GroupKey, GroupKind};
use crate::analysis::kinds::frames::user_frames;
use crate::analysis::moments::moment::ResolvedMoment;
use crate::timeline::Lifetime;
use crate::timeline::replay::{
    Aggregator, DeviceReplay, LifetimesAt, LifetimesAtPeak, PoolId, Start, TotalsAt,
};
use serde::Serialize;
use std::collections::HashMap;

pub const SCHEMA_VERSION: u32 = 2;

/// The allocations alive at one state, with the totals there.
pub struct LiveState {
    pub at: Option<usize>,
    /// In allocation order: traced ones by alloc event, then those from before the
    /// trace by free event, then survivors.
    pub lifetimes: Vec<Lifetime>,
    /// Block bytes of each of `lifetimes` ([`DeviceReplay::block_bytes_of`]).
    pub block_bytes: Vec<u64>,
    pub streams: Vec<u64>,
    pub pools: Vec<PoolId>,
    pub requested_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: i64,
    /// Whether `lifetimes` carry their versions.
    pub versions: Versions,
    /// At the end of the trace: allocations it leaves alive that the file's final state
    /// holds free ([`DeviceReplay::freed_after_trace`]), left out of `lifetimes` and the
    /// totals: (count, requested bytes).
    pub freed_after_trace: (usize, u64),
}

impl LiveState {
    /// The state at the peak a [`LifetimesAtPeak`] found in a replay that began at `start`.
    pub fn at_peak(
        r: &DeviceReplay,
        start: Start,
        peak: LifetimesAtPeak,
        versions: Versions,
    ) -> Self {
        let mut state = LiveState {
            at: peak.at,
            block_bytes: peak.set.iter().map(|l| r.block_bytes_of(l)).collect(),
            lifetimes: peak.set,
            streams: peak.streams,
            pools: peak.pools,
            requested_bytes: start.requested_after(&peak.totals),
            allocated_bytes: start.allocated_after(&peak.totals),
            reserved_bytes: start.reserved_after(&peak.totals),
            versions: Versions::NotNeeded,
            freed_after_trace: (0, 0),
        };
        if versions == Versions::Counted {
            count_versions(r, std::slice::from_mut(&mut state));
        }
        state
    }

    pub fn stream(&self, l: &Lifetime) -> u64 {
        self.streams.get(l.stream as usize).copied().unwrap_or(0)
    }
    pub fn pool_id(&self, l: &Lifetime) -> PoolId {
        self.pools.get(l.pool as usize).copied().flatten()
    }
}

/// Whether the lifetimes of a live set get their versions ([`Lifetime::version`], which
/// their labels show): counting them searches the trace again, so a command that shows
/// no label goes without.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Versions {
    Counted,
    /// Every version left 0.
    NotNeeded,
}

/// Replays a device once to collect what was alive just after event `at`.
pub fn live_state(r: &DeviceReplay, at: Option<usize>, versions: Versions) -> LiveState {
    live_state_with(r, at, versions, ())
}

/// [`live_state`], running `extra` in the same replay.
fn live_state_with<A: Aggregator>(
    r: &DeviceReplay,
    at: Option<usize>,
    versions: Versions,
    extra: A,
) -> LiveState {
    let mut live = LiveStatePass::new(at);
    let start = r.run((&mut live, extra));
    live.finish(r, start, versions)
}

/// What [`live_state`] collects (at one moment or several), as an aggregator to run
/// beside others in one replay; [`LiveStatePass::finish`] gives the state.
pub struct LiveStatePass {
    /// The moments asked for, in their order.
    ats: Vec<Option<usize>>,
    /// The same, ascending and once each, as the collectors take them.
    states: Vec<Option<usize>>,
    live: LifetimesAt,
    totals: TotalsAt,
}

impl LiveStatePass {
    pub fn new(at: Option<usize>) -> Self {
        Self::at_each(&[at])
    }

    /// The live sets at each of `ats`, in one replay.
    pub fn at_each(ats: &[Option<usize>]) -> Self {
        let mut states = ats.to_vec();
        states.sort_unstable();
        states.dedup();
        LiveStatePass {
            ats: ats.to_vec(),
            live: LifetimesAt::new(&states),
            totals: TotalsAt::new(states.clone()),
            states,
        }
    }

    /// The state at the one moment of [`LiveStatePass::new`].
    pub fn finish(self, r: &DeviceReplay, start: Start, versions: Versions) -> LiveState {
        self.finish_each(r, start, versions)
            .pop()
            .expect("one moment asked for")
    }

    /// The state at each moment of [`LiveStatePass::at_each`], in its order (versions, if
    /// counted, counted for all of them at once).
    pub fn finish_each(self, r: &DeviceReplay, start: Start, versions: Versions) -> Vec<LiveState> {
        let mut states: Vec<LiveState> = self
            .ats
            .iter()
            .map(|&at| {
                let k = self.states.binary_search(&at).expect("a moment asked for");
                let run = self.totals.values.get(k).copied().unwrap_or_default();
                let mut lifetimes = self.live.set(at).to_vec();
                let mut requested = start.requested_after(&run);
                let mut allocated = start.allocated_after(&run);
                // At the end, the final state is the truth: what the trace leaves alive
                // but the file holds free is not live.
                let mut freed = (0, 0);
                if at.is_some() && at == r.len().checked_sub(1) {
                    lifetimes.retain(|l| {
                        let gone = r.freed_after_trace(l);
                        if gone {
                            freed.0 += 1;
                            freed.1 += l.size;
                            requested = requested.saturating_sub(l.size);
                            allocated = allocated.saturating_sub(r.block_bytes_of(l));
                        }
                        !gone
                    });
                }
                LiveState {
                    at,
                    block_bytes: lifetimes.iter().map(|l| r.block_bytes_of(l)).collect(),
                    lifetimes,
                    streams: self.live.streams.clone(),
                    pools: self.live.pools.clone(),
                    requested_bytes: requested,
                    allocated_bytes: allocated,
                    reserved_bytes: start.reserved_after(&run),
                    versions: Versions::NotNeeded,
                    freed_after_trace: freed,
                }
            })
            .collect();
        if versions == Versions::Counted {
            count_versions(r, &mut states);
        }
        states
    }
}

/// Counts the versions of the lifetimes of every state that lacks them, in one search of
/// the trace (the search costs the same for one state as for many).
pub fn count_versions(r: &DeviceReplay, states: &mut [LiveState]) {
    let lacking = |s: &&mut LiveState| s.versions == Versions::NotNeeded;
    let mut all: Vec<Lifetime> = states
        .iter_mut()
        .filter(lacking)
        .flat_map(|s| s.lifetimes.iter().copied())
        .collect();
    r.fill_versions(&mut all);
    let mut rest = all.as_slice();
    for s in states.iter_mut().filter(lacking) {
        let (these, after) = rest.split_at(s.lifetimes.len());
        s.lifetimes.copy_from_slice(these);
        s.versions = Versions::Counted;
        rest = after;
    }
}

crate::aggregator_of_fields!(LiveStatePass, live, totals);

/// What was alive at the peak of requested bytes, from the one replay that finds it.
pub fn live_state_at_peak(r: &DeviceReplay, versions: Versions) -> LiveState {
    live_state_at_peak_with(r, versions, ())
}

/// [`live_state_at_peak`], running `extra` in the same replay.
fn live_state_at_peak_with<A: Aggregator>(
    r: &DeviceReplay,
    versions: Versions,
    extra: A,
) -> LiveState {
    let mut peak = crate::timeline::replay::LifetimesAtPeak::default();
    let start = r.run((&mut peak, extra));
    LiveState::at_peak(r, start, peak, versions)
}

/// A moment resolved, and what was alive there (for the peak, one replay finds both).
pub fn resolve_live(
    r: &DeviceReplay,
    moment: crate::analysis::moments::moment::Moment,
    versions: Versions,
) -> Result<
    (crate::analysis::moments::moment::ResolvedMoment, LiveState),
    crate::analysis::moments::moment::MomentError,
> {
    resolve_live_with(r, moment, versions, ())
}

/// [`resolve_live`], running `extra` in the replay that collects the live set (so a
/// command that needs the peaks as well replays once).
pub fn resolve_live_with<A: Aggregator>(
    r: &DeviceReplay,
    moment: crate::analysis::moments::moment::Moment,
    versions: Versions,
    extra: A,
) -> Result<
    (crate::analysis::moments::moment::ResolvedMoment, LiveState),
    crate::analysis::moments::moment::MomentError,
> {
    if moment == crate::analysis::moments::moment::Moment::Peak && !r.is_empty() {
        let live = live_state_at_peak_with(r, versions, extra);
        let resolved = crate::analysis::moments::moment::resolve(r, moment, || live.at)?;
        return Ok((resolved, live));
    }
    let resolved = crate::analysis::moments::moment::resolve(r, moment, || peak_event(r))?;
    let live = live_state_with(r, resolved.event.map(|e| e as usize), versions, extra);
    Ok((resolved, live))
}

/// What names a group: its key, or the count of groups merged past a limit (written as
/// a string by the renderers, `impl Serialize` in `render::words::labels`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupName {
    /// Stable name: `filename:line:name` for a frame, a category name, a file path, or a
    /// parenthesised token for allocations without a frame.
    Key(String),
    /// The groups past a limit, merged into one ([`GroupKind::Rest`]): how many.
    Rest { groups: usize },
}

impl GroupName {
    /// The key; None for the merged rest.
    pub fn key(&self) -> Option<&str> {
        match self {
            GroupName::Key(k) => Some(k),
            GroupName::Rest { .. } => None,
        }
    }
}

/// One group of live allocations.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Group {
    pub name: GroupName,
    /// The kind of its key, or [`GroupKind::Rest`] (the groups past the limit, merged).
    pub kind: GroupKind,
    /// Requested bytes.
    pub bytes: u64,
    /// Block bytes (the real blocks of allocations alive at the end; requests rounded up
    /// to 512 bytes for the others).
    pub allocated_bytes: u64,
    pub count: usize,
    /// bytes / the moment's total, rounded to 4 decimals.
    pub share: f64,
    /// Earliest and latest allocation among the group's live allocations (null for
    /// allocations from before the trace).
    pub first_alloc_event: Option<u32>,
    pub last_alloc_event: Option<u32>,
    pub first_alloc_time_us: Option<i64>,
    pub last_alloc_time_us: Option<i64>,
    /// The largest single allocation.
    pub largest_bytes: u64,
    pub largest_label: String,
    /// The category holding most of the group's bytes (grouping by category: the group
    /// itself); empty for the merged rest.
    pub category: String,
    /// Its share of the group's bytes, rounded to 4 decimals.
    pub category_share: f64,
    /// What decided it, for the part's largest allocation
    /// ([`crate::analysis::kinds::categories::Evidence::code`]).
    pub category_evidence: String,
    /// Whether that decision is an inference.
    pub category_inferred: bool,
    /// Every category among the group's allocations, the most bytes first.
    pub categories: Vec<crate::analysis::kinds::categories::CategoryPart>,
    /// Python frames of the largest allocation's stack, innermost first.
    pub frames: Vec<String>,
}

/// `top`'s answer for one device.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopReport {
    pub schema_version: u32,
    pub path: String,
    pub device: i64,
    /// Every device of the file.
    pub devices: Vec<i64>,
    pub moment: ResolvedMoment,
    pub by: GroupBy,
    /// Requested bytes alive: the groups' bytes sum to this exactly.
    pub total_bytes: u64,
    /// Block bytes alive.
    pub allocated_bytes: u64,
    pub reserved_bytes: i64,
    pub count: usize,
    /// Largest first; past the limit the rest are merged into one group of kind
    /// [`GroupKind::Rest`].
    pub groups: Vec<Group>,
    /// Groups growing across repeated steps (`--leaks`), else null.
    pub leaks: Option<crate::analysis::moments::leaks::LeakReport>,
    /// At the end: allocations the trace leaves alive that the file's final state holds
    /// free (the trace lost their frees, or the recording stopped before them); they are
    /// not counted as live.
    pub freed_after_trace_count: usize,
    pub freed_after_trace_bytes: u64,
}

/// Groups the live allocations; the whole list, largest first, ties by name.
pub fn group_live(attr: &Attributor, live: &LiveState, by: GroupBy) -> Vec<Group> {
    attr.prepare_moment(live.at);
    let mut index: HashMap<GroupKey, usize> = HashMap::new();
    let mut acc: Vec<(GroupKey, Vec<&Lifetime>, u64)> = Vec::new();
    for (l, &block) in live.lifetimes.iter().zip(&live.block_bytes) {
        let key = attr.key(l, by);
        let i = *index.entry(key).or_insert_with(|| {
            acc.push((key, Vec::new(), 0));
            acc.len() - 1
        });
        acc[i].1.push(l);
        acc[i].2 += block;
    }
    let total = live.requested_bytes.max(1);
    let mut groups: Vec<Group> = acc
        .into_iter()
        .map(|(key, members, allocated_bytes)| {
            let bytes: u64 = members.iter().map(|l| l.size).sum();
            let largest = members
                .iter()
                .max_by(|a, b| {
                    a.size
                        .cmp(&b.size)
                        .then(b.alloc.cmp(&a.alloc))
                        .then(b.addr.cmp(&a.addr))
                })
                .copied()
                .expect("a group has a member");
            let allocs: Vec<u32> = members
                .iter()
                .filter_map(|l| l.alloc.map(|e| e.index() as u32))
                .collect();
            let first = allocs.iter().min().copied();
            let last = allocs.iter().max().copied();
            let categories =
                crate::analysis::kinds::categories::split(attr, members.iter().copied());
            let main = categories.first();
            Group {
                name: GroupName::Key(attr.name(&key)),
                kind: Attributor::kind(&key),
                bytes,
                allocated_bytes,
                count: members.len(),
                share: share(bytes, total),
                first_alloc_event: first,
                last_alloc_event: last,
                first_alloc_time_us: None,
                last_alloc_time_us: None,
                largest_bytes: largest.size,
                largest_label: largest.label(),
                category: main.map(|p| p.category.clone()).unwrap_or_default(),
                category_share: main.map_or(0.0, |p| share(p.bytes, bytes)),
                category_evidence: main.map(|p| p.evidence.clone()).unwrap_or_default(),
                category_inferred: main.is_some_and(|p| p.inferred),
                frames: user_frames(attr.frames(), Attributor::allocation_stack(largest), 8),
                categories,
            }
        })
        .collect();
    groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    groups
}

use crate::analysis::share;

/// Keeps the `limit` largest groups and merges the rest into one, so the list still
/// sums to the total.
pub fn limit_groups(mut groups: Vec<Group>, limit: usize, total: u64) -> Vec<Group> {
    if groups.len() <= limit {
        return groups;
    }
    let rest: Vec<Group> = groups.split_off(limit);
    let bytes: u64 = rest.iter().map(|g| g.bytes).sum();
    let largest = rest.iter().max_by_key(|g| g.largest_bytes).cloned();
    groups.push(Group {
        name: GroupName::Rest { groups: rest.len() },
        kind: GroupKind::Rest,
        bytes,
        allocated_bytes: rest.iter().map(|g| g.allocated_bytes).sum(),
        count: rest.iter().map(|g| g.count).sum(),
        share: share(bytes, total),
        first_alloc_event: rest.iter().filter_map(|g| g.first_alloc_event).min(),
        last_alloc_event: rest.iter().filter_map(|g| g.last_alloc_event).max(),
        first_alloc_time_us: None,
        last_alloc_time_us: None,
        largest_bytes: largest.as_ref().map_or(0, |g| g.largest_bytes),
        largest_label: largest.map(|g| g.largest_label).unwrap_or_default(),
        category: String::new(),
        category_share: 0.0,
        category_evidence: String::new(),
        category_inferred: false,
        categories: Vec::new(),
        frames: Vec::new(),
    });
    groups
}

/// Fills in the times of the groups' first and last allocation events.
pub fn add_times(groups: &mut [Group], trace: &crate::model::DeviceTrace) {
    let time = |e: Option<u32>| e.and_then(|e| trace.stamped_time(e as usize));
    for g in groups {
        g.first_alloc_time_us = time(g.first_alloc_event);
        g.last_alloc_time_us = time(g.last_alloc_event);
    }
}

/// The event of the requested-bytes peak (None: the start), from one replay pass.
pub fn peak_event(r: &DeviceReplay) -> Option<usize> {
    let mut peaks = crate::timeline::replay::Peaks::default();
    r.run(&mut peaks);
    peaks.requested.event.map(|e| e.index())
}

/// What was live at a moment ([`resolve_live_with`]), found beside `bind`, which makes
/// the attributor bound to the device's categories
/// ([`crate::analysis::kinds::categories::bound_attributor`]): the two read the trace in
/// passes of their own and run at once.
pub type BoundLive<'a> = (
    Result<
        (crate::analysis::moments::moment::ResolvedMoment, LiveState),
        crate::analysis::moments::moment::MomentError,
    >,
    Attributor<'a>,
);

/// See [`BoundLive`].
pub fn resolve_live_bound<'a, A: Aggregator + Send>(
    r: &DeviceReplay,
    moment: crate::analysis::moments::moment::Moment,
    versions: Versions,
    extra: A,
    bind: impl FnOnce() -> Attributor<'a> + Send,
) -> BoundLive<'a> {
    rayon::join(|| resolve_live_with(r, moment, versions, extra), bind)
}

/// `top` for the chosen device (`r`, its replay), running `extra` in the same replay (the
/// peaks `check` compares, say; `()` for none). `attr` is bound to the device's categories
/// ([`crate::analysis::kinds::categories::bound_attributor`]).
#[allow(clippy::too_many_arguments)]
pub fn analyze_top<A: Aggregator>(
    r: &DeviceReplay,
    path: &str,
    choice: &crate::analysis::device::DeviceChoice,
    moment: crate::analysis::moments::moment::Moment,
    by: GroupBy,
    limit: usize,
    attr: &Attributor,
    extra: A,
) -> Result<TopReport, crate::analysis::moments::moment::MomentError> {
    let (resolved, live) = resolve_live_with(r, moment, Versions::Counted, extra)?;
    Ok(top_of(r, path, choice, (resolved, live), by, limit, attr))
}

/// `top` of what was live at a moment found already (with [`Versions::Counted`]).
pub fn top_of(
    r: &DeviceReplay,
    path: &str,
    choice: &crate::analysis::device::DeviceChoice,
    (resolved, live): (crate::analysis::moments::moment::ResolvedMoment, LiveState),
    by: GroupBy,
    limit: usize,
    attr: &Attributor,
) -> TopReport {
    let mut groups = limit_groups(
        group_live(attr, &live, by),
        limit.max(1),
        live.requested_bytes,
    );
    add_times(&mut groups, r.trace);
    let mut devices = choice.others.clone();
    devices.push(choice.device);
    devices.sort_unstable();
    TopReport {
        schema_version: SCHEMA_VERSION,
        path: path.to_string(),
        device: choice.device,
        devices,
        moment: resolved,
        by,
        total_bytes: live.requested_bytes,
        allocated_bytes: live.allocated_bytes,
        reserved_bytes: live.reserved_bytes,
        count: live.lifetimes.len(),
        groups,
        leaks: None,
        freed_after_trace_count: live.freed_after_trace.0,
        freed_after_trace_bytes: live.freed_after_trace.1,
    }
}
