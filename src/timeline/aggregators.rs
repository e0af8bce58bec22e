//! What learns from a replay: how aggregators combine (tuples, options, vectors,
//! [`aggregator_of_fields!`](crate::aggregator_of_fields)) and the aggregators that
//! commands share: peaks, every lifetime, the requested and reserved series, totals at
//! chosen events, and the live sets at the peak or at chosen moments.
//!
//! Each is fed by the engine ([`super::replay`]) through [`Aggregator`] with the running
//! totals, relative to the state before the first event, and keeps only what it needs,
//! so a command that needs only peaks stores nothing per event. None pairs events or
//! reads the trace on its own; none formats.

use super::replay::{Aggregator, End, PoolId, Running};
use super::{EventIdx, Lifetime};
use crate::model::frames::FxMap;
use crate::model::{Action, DeviceTrace};

impl Aggregator for () {}

macro_rules! tuple_aggregator {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: Aggregator),+> Aggregator for ($($name,)+) {
            fn alloc(&mut self, i: usize, l: &Lifetime, run: &Running) {
                $(self.$idx.alloc(i, l, run);)+
            }
            fn free_requested(&mut self, i: usize, l: &Lifetime, run: &Running) {
                $(self.$idx.free_requested(i, l, run);)+
            }
            fn free_completed(&mut self, i: usize, l: &Lifetime, run: &Running) {
                $(self.$idx.free_completed(i, l, run);)+
            }
            fn segment(&mut self, i: usize, action: Action, delta: i64, run: &Running) {
                $(self.$idx.segment(i, action, delta, run);)+
            }
            fn event(&mut self, i: usize, action: Action, run: &Running) {
                $(self.$idx.event(i, action, run);)+
            }
            fn finish(&mut self, end: &End) {
                $(self.$idx.finish(end);)+
            }
            fn wants_versions(&self) -> bool {
                false $(|| self.$idx.wants_versions())+
            }
        }
    };
}

/// Implements [`Aggregator`] for a struct by handing every call to a tuple of its fields
/// (an aggregator made of others, with its own `finish` giving the result).
#[macro_export]
macro_rules! aggregator_of_fields {
    ($ty:ty, $($field:ident),+) => {
        impl $crate::timeline::replay::Aggregator for $ty {
            fn alloc(
                &mut self,
                i: usize,
                l: &$crate::timeline::Lifetime,
                run: &$crate::timeline::replay::Running,
            ) {
                ($(&mut self.$field,)+).alloc(i, l, run)
            }
            fn free_requested(
                &mut self,
                i: usize,
                l: &$crate::timeline::Lifetime,
                run: &$crate::timeline::replay::Running,
            ) {
                ($(&mut self.$field,)+).free_requested(i, l, run)
            }
            fn free_completed(
                &mut self,
                i: usize,
                l: &$crate::timeline::Lifetime,
                run: &$crate::timeline::replay::Running,
            ) {
                ($(&mut self.$field,)+).free_completed(i, l, run)
            }
            fn segment(
                &mut self,
                i: usize,
                action: $crate::model::Action,
                delta: i64,
                run: &$crate::timeline::replay::Running,
            ) {
                ($(&mut self.$field,)+).segment(i, action, delta, run)
            }
            fn event(
                &mut self,
                i: usize,
                action: $crate::model::Action,
                run: &$crate::timeline::replay::Running,
            ) {
                ($(&mut self.$field,)+).event(i, action, run)
            }
            fn finish(&mut self, end: &$crate::timeline::replay::End) {
                ($(&mut self.$field,)+).finish(end)
            }
            fn wants_versions(&self) -> bool {
                false $(|| self.$field.wants_versions())+
            }
        }
    };
}

tuple_aggregator!(A 0);
tuple_aggregator!(A 0, B 1);
tuple_aggregator!(A 0, B 1, C 2);
tuple_aggregator!(A 0, B 1, C 2, D 3);
tuple_aggregator!(A 0, B 1, C 2, D 3, E 4);

/// An aggregator that may be absent (a search only some moments need).
impl<A: Aggregator> Aggregator for Option<A> {
    fn alloc(&mut self, i: usize, l: &Lifetime, run: &Running) {
        if let Some(a) = self {
            a.alloc(i, l, run)
        }
    }
    fn free_requested(&mut self, i: usize, l: &Lifetime, run: &Running) {
        if let Some(a) = self {
            a.free_requested(i, l, run)
        }
    }
    fn free_completed(&mut self, i: usize, l: &Lifetime, run: &Running) {
        if let Some(a) = self {
            a.free_completed(i, l, run)
        }
    }
    fn segment(&mut self, i: usize, action: Action, delta: i64, run: &Running) {
        if let Some(a) = self {
            a.segment(i, action, delta, run)
        }
    }
    fn event(&mut self, i: usize, action: Action, run: &Running) {
        if let Some(a) = self {
            a.event(i, action, run)
        }
    }
    fn finish(&mut self, end: &End) {
        if let Some(a) = self {
            a.finish(end)
        }
    }
    fn wants_versions(&self) -> bool {
        self.as_ref().is_some_and(|a| a.wants_versions())
    }
}

/// Aggregators of one kind, as many as a command asks for (one per moment, say), each
/// handed every call in order.
impl<A: Aggregator> Aggregator for Vec<A> {
    fn alloc(&mut self, i: usize, l: &Lifetime, run: &Running) {
        self.iter_mut().for_each(|a| a.alloc(i, l, run))
    }
    fn free_requested(&mut self, i: usize, l: &Lifetime, run: &Running) {
        self.iter_mut().for_each(|a| a.free_requested(i, l, run))
    }
    fn free_completed(&mut self, i: usize, l: &Lifetime, run: &Running) {
        self.iter_mut().for_each(|a| a.free_completed(i, l, run))
    }
    fn segment(&mut self, i: usize, action: Action, delta: i64, run: &Running) {
        self.iter_mut()
            .for_each(|a| a.segment(i, action, delta, run))
    }
    fn event(&mut self, i: usize, action: Action, run: &Running) {
        self.iter_mut().for_each(|a| a.event(i, action, run))
    }
    fn finish(&mut self, end: &End) {
        self.iter_mut().for_each(|a| a.finish(end))
    }
    fn wants_versions(&self) -> bool {
        self.iter().any(|a| a.wants_versions())
    }
}

impl<A: Aggregator + ?Sized> Aggregator for &mut A {
    fn alloc(&mut self, i: usize, l: &Lifetime, run: &Running) {
        (**self).alloc(i, l, run)
    }
    fn free_requested(&mut self, i: usize, l: &Lifetime, run: &Running) {
        (**self).free_requested(i, l, run)
    }
    fn free_completed(&mut self, i: usize, l: &Lifetime, run: &Running) {
        (**self).free_completed(i, l, run)
    }
    fn segment(&mut self, i: usize, action: Action, delta: i64, run: &Running) {
        (**self).segment(i, action, delta, run)
    }
    fn event(&mut self, i: usize, action: Action, run: &Running) {
        (**self).event(i, action, run)
    }
    fn finish(&mut self, end: &End) {
        (**self).finish(end)
    }
    fn wants_versions(&self) -> bool {
        (**self).wants_versions()
    }
}

/// A maximum over the replay and where it is first reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Peak {
    pub bytes: u64,
    /// The event after which the peak is first reached; None: before the first event.
    pub event: Option<EventIdx>,
    pub time_us: Option<i64>,
}

/// The peaks of requested, allocated and reserved memory.
#[derive(Debug, Default)]
pub struct Peaks {
    max: Running,
    at: [Option<usize>; 3],
    /// Every total just after the peak of requested bytes (relative, as [`Running`]).
    pub at_requested_peak: Running,
    pub requested: Peak,
    pub allocated: Peak,
    pub reserved: Peak,
}

impl Aggregator for Peaks {
    fn event(&mut self, i: usize, _action: Action, run: &Running) {
        if run.requested > self.max.requested {
            self.max.requested = run.requested;
            self.at[0] = Some(i);
            self.at_requested_peak = *run;
        }
        if run.allocated > self.max.allocated {
            self.max.allocated = run.allocated;
            self.at[1] = Some(i);
        }
        if run.reserved > self.max.reserved {
            self.max.reserved = run.reserved;
            self.at[2] = Some(i);
        }
    }

    fn finish(&mut self, end: &End) {
        let peak = |bytes: i64, at: Option<usize>| Peak {
            bytes: bytes.max(0) as u64,
            event: at.map(EventIdx::new),
            time_us: None,
        };
        self.requested = peak(end.start.requested as i64 + self.max.requested, self.at[0]);
        self.allocated = peak(end.start.allocated as i64 + self.max.allocated, self.at[1]);
        self.reserved = peak(end.start.reserved + self.max.reserved, self.at[2]);
    }
}

impl Peaks {
    /// Fills in the times of the peaks' events.
    pub fn with_times(mut self, trace: &DeviceTrace) -> Self {
        for p in [&mut self.requested, &mut self.allocated, &mut self.reserved] {
            p.time_us = p.event.and_then(|e| trace.time_us(e.index()));
        }
        self
    }
}

/// Every lifetime of the replay, in the order the viewer lists elements: traced and
/// orphan-freed allocations by event, then survivors.
#[derive(Debug, Default)]
pub struct Lifetimes {
    /// index into `all` of the lifetime opened at each alloc event, while open
    open_at: FxMap<u32, usize>,
    pub all: Vec<Lifetime>,
    pub streams: Vec<u64>,
    pub pools: Vec<PoolId>,
}

impl Aggregator for Lifetimes {
    fn wants_versions(&self) -> bool {
        true
    }
    fn alloc(&mut self, i: usize, l: &Lifetime, _run: &Running) {
        self.open_at.insert(i as u32, self.all.len());
        self.all.push(*l);
    }
    fn free_requested(&mut self, _i: usize, l: &Lifetime, _run: &Running) {
        if let Some(&k) = l.alloc.and_then(|a| self.open_at.get(&(a.index() as u32))) {
            self.all[k].free_requested = l.free_requested;
        }
    }
    fn free_completed(&mut self, _i: usize, l: &Lifetime, _run: &Running) {
        match l
            .alloc
            .and_then(|a| self.open_at.remove(&(a.index() as u32)))
        {
            Some(k) => self.all[k] = *l,
            None => self.all.push(*l),
        }
    }
    fn finish(&mut self, end: &End) {
        self.all.extend_from_slice(end.survivors);
        self.streams = end.streams.to_vec();
        self.pools = end.pools.to_vec();
        self.open_at = FxMap::default();
    }
}

/// Requested bytes just after each event (relative), for the materialised series.
#[derive(Debug, Default)]
pub struct RequestedSeries {
    pub relative: Vec<i64>,
}

impl Aggregator for RequestedSeries {
    fn event(&mut self, _i: usize, _action: Action, run: &Running) {
        self.relative.push(run.requested);
    }
}

/// Reserved bytes after each segment event (relative).
#[derive(Debug, Default)]
pub struct ReservedChanges {
    pub changes: Vec<(u32, i64)>,
}

impl Aggregator for ReservedChanges {
    fn segment(&mut self, i: usize, _action: Action, _delta: i64, run: &Running) {
        self.changes.push((i as u32, run.reserved));
    }
}

/// Totals at chosen states (None: before the first event; the rest ascending), as
/// relative values; add [`Start`](super::replay::Start) for absolute ones.
#[derive(Debug)]
pub struct TotalsAt {
    states: Vec<Option<usize>>,
    next: usize,
    pub values: Vec<Running>,
}

impl TotalsAt {
    pub fn new(states: Vec<Option<usize>>) -> Self {
        let mut t = TotalsAt {
            values: Vec::with_capacity(states.len()),
            states,
            next: 0,
        };
        while t.next < t.states.len() && t.states[t.next].is_none() {
            t.values.push(Running::default());
            t.next += 1;
        }
        t
    }
}

impl Aggregator for TotalsAt {
    fn event(&mut self, i: usize, _action: Action, run: &Running) {
        while self.next < self.states.len() && self.states[self.next] == Some(i) {
            self.values.push(*run);
            self.next += 1;
        }
    }
}

/// The allocations alive at the peak of requested bytes (the event [`Peaks`] names), found
/// in the same pass that finds the peak: each free after the latest peak of an allocation
/// made by then is kept (at most the live set at that peak), and at the end those and
/// the allocations still open that were made by then are the set. Ordered as [`LifetimesAt`]
/// orders its sets.
#[derive(Debug, Default)]
pub struct LifetimesAtPeak {
    max: i64,
    /// The peak's event (None: before the first event).
    pub at: Option<usize>,
    /// Totals just after the peak (relative, as [`Running`]).
    pub totals: Running,
    freed: Vec<Lifetime>,
    pub set: Vec<Lifetime>,
    pub streams: Vec<u64>,
    pub pools: Vec<PoolId>,
}

impl LifetimesAtPeak {
    fn made_by_peak(&self, l: &Lifetime) -> bool {
        made_by(l.alloc, self.at)
    }
}

/// Versions are not counted:
/// [`DeviceReplay::fill_versions`](super::replay::DeviceReplay::fill_versions) sets
/// them on the set.
impl Aggregator for LifetimesAtPeak {
    fn free_completed(&mut self, _i: usize, l: &Lifetime, _run: &Running) {
        if self.made_by_peak(l) {
            self.freed.push(*l);
        }
    }
    fn event(&mut self, i: usize, _action: Action, run: &Running) {
        if run.requested > self.max {
            self.max = run.requested;
            self.at = Some(i);
            self.totals = *run;
            self.freed.clear();
        }
    }
    fn finish(&mut self, end: &End) {
        let freed = std::mem::take(&mut self.freed);
        self.set = live_set(end, &freed, self.at);
        self.streams = end.streams.to_vec();
        self.pools = end.pools.to_vec();
    }
}

/// The allocations alive just after each of a few chosen events (None: before the
/// first), each list in allocation order: traced ones by alloc event, then those from
/// before the trace by free event, then survivors. Nothing is kept per open allocation:
/// as [`LifetimesAtPeak`] does, each free of an allocation alive at a moment is kept, and the
/// allocations still open at the end complete the sets.
#[derive(Debug)]
pub struct LifetimesAt {
    /// Moments, ascending (None first).
    moments: Vec<Option<usize>>,
    /// Per moment: allocations alive at it and freed after it.
    freed: Vec<Vec<Lifetime>>,
    pub sets: Vec<Vec<Lifetime>>,
    pub streams: Vec<u64>,
    pub pools: Vec<PoolId>,
}

impl LifetimesAt {
    /// `moments` in any order; [`LifetimesAt::set`] finds each one's set.
    pub fn new(moments: &[Option<usize>]) -> Self {
        let mut m = moments.to_vec();
        m.sort_unstable();
        m.dedup();
        LifetimesAt {
            freed: vec![Vec::new(); m.len()],
            sets: vec![Vec::new(); m.len()],
            moments: m,
            streams: Vec::new(),
            pools: Vec::new(),
        }
    }

    /// The set at a moment given to [`LifetimesAt::new`].
    pub fn set(&self, at: Option<usize>) -> &[Lifetime] {
        match self.moments.binary_search(&at) {
            Ok(k) => &self.sets[k],
            Err(_) => &[],
        }
    }
}

/// The set alive just after `moment`, from the allocations open at the end and those
/// kept as they were freed after it: traced ones by alloc event (as they were made), then
/// those from before the trace by free event, then survivors.
fn live_set(end: &End, freed: &[Lifetime], moment: Option<usize>) -> Vec<Lifetime> {
    let alive = |l: &&Lifetime| made_by(l.alloc, moment);
    let as_alive = |l: &Lifetime| Lifetime {
        free_requested: None,
        free_completed: None,
        ..*l
    };
    // The open ones come in alloc order; the freed ones, sorted, are merged in.
    let mut set: Vec<Lifetime> = end.open.iter().filter(alive).map(as_alive).collect();
    let mut traced_freed: Vec<Lifetime> = freed
        .iter()
        .filter(|l| l.alloc.is_some())
        .filter(alive)
        .map(as_alive)
        .collect();
    traced_freed.sort_unstable_by_key(|l| l.alloc);
    merge_by_alloc(&mut set, &traced_freed);
    set.extend(freed.iter().filter(|l| l.alloc.is_none()));
    set.extend_from_slice(end.survivors);
    set
}

/// Merges `more` into `set`, both in alloc order, in place from the back.
fn merge_by_alloc(set: &mut Vec<Lifetime>, more: &[Lifetime]) {
    let (mut i, mut j) = (set.len(), more.len());
    set.extend_from_slice(more);
    let mut k = set.len();
    while j > 0 {
        k -= 1;
        if i > 0 && set[i - 1].alloc > more[j - 1].alloc {
            set[k] = set[i - 1];
            i -= 1;
        } else {
            set[k] = more[j - 1];
            j -= 1;
        }
    }
}

/// Whether an allocation made at `alloc` (None: before the trace) exists just after
/// `moment` (None: before the first event).
fn made_by(alloc: Option<EventIdx>, moment: Option<usize>) -> bool {
    match (alloc, moment) {
        (None, _) => true,
        (Some(a), Some(m)) => a.index() <= m,
        (Some(_), None) => false,
    }
}

/// Versions are not counted:
/// [`DeviceReplay::fill_versions`](super::replay::DeviceReplay::fill_versions) sets
/// them on the sets.
impl Aggregator for LifetimesAt {
    fn free_completed(&mut self, i: usize, l: &Lifetime, _run: &Running) {
        for (k, &m) in self.moments.iter().enumerate() {
            if made_by(l.alloc, m) && m.is_none_or(|m| m < i) {
                self.freed[k].push(*l);
            }
        }
    }
    fn finish(&mut self, end: &End) {
        for (k, &m) in self.moments.iter().enumerate() {
            let freed = std::mem::take(&mut self.freed[k]);
            self.sets[k] = live_set(end, &freed, m);
        }
        self.streams = end.streams.to_vec();
        self.pools = end.pools.to_vec();
    }
}
