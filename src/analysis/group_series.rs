//! Bytes of each group of allocations at chosen states of the replay, from one pass: each
//! allocation adds its size to the states it is alive in (difference arrays over the
//! states), so nothing is kept per event.

use super::attribution::{Attributor, GroupBy, GroupKey};
use crate::timeline::Lifetime;
use crate::timeline::replay::{Aggregator, End, PoolId, Running};
use std::collections::HashMap;

/// Past this many distinct groups, further groups are not tracked (their bytes stay in
/// the totals, outside every group).
pub const MAX_GROUPS: usize = 5000;

/// One group's bytes at each state.
pub struct GroupValues {
    pub key: GroupKey,
    pub values: Vec<u64>,
    /// Allocations alive in at least one of the states.
    pub count: usize,
    /// Its largest allocation alive in one of the states.
    pub largest: Lifetime,
}

/// Replay aggregator: states are `0` (before the first event) or `i + 1` (after event
/// `i`), non-decreasing.
pub struct GroupSeries<'a> {
    attr: &'a Attributor<'a>,
    by: GroupBy,
    states: Vec<usize>,
    keys: HashMap<GroupKey, usize>,
    groups: Vec<(GroupKey, Vec<i64>, usize, Lifetime)>,
    /// Allocations alive in at least one state, grouped or not.
    pub alive: usize,
    pub streams: Vec<u64>,
    pub pools: Vec<PoolId>,
}

impl<'a> GroupSeries<'a> {
    pub fn new(attr: &'a Attributor<'a>, by: GroupBy, states: Vec<usize>) -> Self {
        GroupSeries {
            attr,
            by,
            states,
            keys: HashMap::new(),
            groups: Vec::new(),
            alive: 0,
            streams: Vec::new(),
            pools: Vec::new(),
        }
    }

    /// The states a lifetime is alive in, as a range of indices into the states.
    pub fn range(states: &[usize], l: &Lifetime) -> (usize, usize) {
        let from = l.alloc.map_or(0, |a| a.index() + 1);
        let to = l.free_completed.map_or(usize::MAX, |f| f.index() + 1);
        (
            states.partition_point(|&k| k < from),
            states.partition_point(|&k| k < to),
        )
    }

    fn add(&mut self, l: &Lifetime) {
        let (lo, hi) = Self::range(&self.states, l);
        if lo >= hi {
            return;
        }
        self.alive += 1;
        let key = self.attr.key(l, self.by);
        let g = match self.keys.get(&key) {
            Some(&g) => g,
            None if self.groups.len() < MAX_GROUPS => {
                self.keys.insert(key, self.groups.len());
                self.groups
                    .push((key, vec![0; self.states.len() + 1], 0, *l));
                self.groups.len() - 1
            }
            None => return,
        };
        let group = &mut self.groups[g];
        group.1[lo] += l.size as i64;
        group.1[hi] -= l.size as i64;
        group.2 += 1;
        if l.size > group.3.size {
            group.3 = *l;
        }
    }

    /// Every group with its bytes at each state, in order of first appearance.
    pub fn values(self) -> Vec<GroupValues> {
        let n = self.states.len();
        self.groups
            .into_iter()
            .map(|(key, diffs, count, largest)| {
                let mut acc = 0i64;
                let values = diffs[..n]
                    .iter()
                    .map(|d| {
                        acc += d;
                        acc.max(0) as u64
                    })
                    .collect();
                GroupValues {
                    key,
                    values,
                    count,
                    largest,
                }
            })
            .collect()
    }
}

impl Aggregator for GroupSeries<'_> {
    fn free_completed(&mut self, _i: usize, l: &Lifetime, _run: &Running) {
        self.add(l);
    }
    fn finish(&mut self, end: &End) {
        for l in end.open.iter().chain(end.survivors) {
            self.add(l);
        }
        self.streams = end.streams.to_vec();
        self.pools = end.pools.to_vec();
    }
}
