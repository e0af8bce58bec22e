//! Bytes of each group of allocations at chosen states of the replay, from one pass: each
//! allocation adds its size to the states it is alive in (difference arrays over the
//! states), so nothing is kept per event.

use crate::analysis::kinds::attribution::{Attributor, GroupBy, GroupKey};
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
    /// The category that holds most of its allocations' bytes (ties: the built-in
    /// order).
    pub main_category: u32,
}

/// One group while it fills.
struct Group {
    key: GroupKey,
    /// Difference array over the states (one more slot than states).
    diffs: Vec<i64>,
    count: usize,
    largest: Lifetime,
    /// Order (see [`GroupSeries::add_in`]) of the largest, which keeps the first of
    /// equal sizes.
    largest_order: u64,
    /// Order of its first allocation: groups are given in this order.
    first: u64,
    /// Bytes of its allocations by category.
    categories: Vec<(u32, u64)>,
}

/// Replay aggregator: states are `0` (before the first event) or `i + 1` (after event
/// `i`), non-decreasing. Or, for a pass that learns its states as it goes (the timeline
/// chart), a sink of allocations with the range of states each is alive in
/// ([`GroupSeries::for_ranges`], [`GroupSeries::add_in`]).
pub struct GroupSeries<'a> {
    attr: &'a Attributor<'a>,
    by: GroupBy,
    states: Vec<usize>,
    /// How many states.
    n: usize,
    keys: HashMap<GroupKey, usize>,
    groups: Vec<Group>,
    /// Allocations added so far, the order of the next one as an aggregator.
    added: u64,
    /// Allocations alive in at least one state, grouped or not.
    pub alive: usize,
    pub streams: Vec<u64>,
    pub pools: Vec<PoolId>,
}

impl<'a> GroupSeries<'a> {
    pub fn new(attr: &'a Attributor<'a>, by: GroupBy, states: Vec<usize>) -> Self {
        let n = states.len();
        GroupSeries {
            states,
            ..Self::for_ranges(attr, by, n)
        }
    }

    /// A series over `n` states that are not known yet: allocations come with their
    /// range of states through [`GroupSeries::add_in`].
    pub fn for_ranges(attr: &'a Attributor<'a>, by: GroupBy, n: usize) -> Self {
        GroupSeries {
            attr,
            by,
            states: Vec::new(),
            n,
            keys: HashMap::new(),
            groups: Vec::new(),
            added: 0,
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
        let order = self.added;
        self.added += 1;
        self.add_in(l, order, lo, hi);
    }

    /// Adds an allocation alive in states `lo..hi`. `order` is its place among all the
    /// allocations of the pass (as an aggregator: the order they close in); groups and
    /// each group's largest allocation follow it, whatever order they are added in,
    /// until [`MAX_GROUPS`] groups exist.
    pub fn add_in(&mut self, l: &Lifetime, order: u64, lo: usize, hi: usize) {
        if lo >= hi {
            return;
        }
        self.alive += 1;
        let decision = self.attr.decide(l);
        let key = match self.by {
            GroupBy::Category => GroupKey::Category(decision.category),
            by => self.attr.key(l, by),
        };
        let g = match self.keys.get(&key) {
            Some(&g) => g,
            None if self.groups.len() < MAX_GROUPS => {
                self.keys.insert(key, self.groups.len());
                self.groups.push(Group {
                    key,
                    diffs: vec![0; self.n + 1],
                    count: 0,
                    largest: *l,
                    largest_order: order,
                    first: order,
                    categories: Vec::new(),
                });
                self.groups.len() - 1
            }
            None => return,
        };
        let group = &mut self.groups[g];
        group.diffs[lo] += l.size as i64;
        group.diffs[hi] -= l.size as i64;
        group.count += 1;
        group.first = group.first.min(order);
        match group
            .categories
            .iter_mut()
            .find(|(c, _)| *c == decision.category)
        {
            Some((_, b)) => *b += l.size,
            None => group.categories.push((decision.category, l.size)),
        }
        if (l.size, std::cmp::Reverse(order))
            > (group.largest.size, std::cmp::Reverse(group.largest_order))
        {
            group.largest = *l;
            group.largest_order = order;
        }
    }

    /// Every group with its bytes at each state, in order of first appearance.
    pub fn values(self) -> Vec<GroupValues> {
        let n = self.n;
        let mut groups = self.groups;
        groups.sort_by_key(|g| g.first);
        groups
            .into_iter()
            .map(|g| {
                let mut acc = 0i64;
                let values = g.diffs[..n]
                    .iter()
                    .map(|d| {
                        acc += d;
                        acc.max(0) as u64
                    })
                    .collect();
                let main_category = g
                    .categories
                    .iter()
                    .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
                    .map_or(crate::analysis::kinds::attribution::UNKNOWN, |&(c, _)| c);
                GroupValues {
                    key: g.key,
                    values,
                    count: g.count,
                    largest: g.largest,
                    main_category,
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
