//! Replay of one device's trace into lifetimes and memory series.
//!
//! Takes a [`Snapshot`] and a device, gives a [`DeviceReplay`] that feeds aggregators:
//! every allocation lifetime (paired alloc / free_completed, versioned by address like the official
//! viewer), memory that existed before the trace (orphan frees and surviving blocks, spec
//! sections 3.6 and 6.2), the allocated series exactly as the viewer's Active Memory
//! Timeline counts it (requested bytes, held until `free_completed`), and the reserved
//! series rebuilt from the final segments and the segment events (spec 6.3). Devices are
//! independent, so callers build them in parallel. Nothing here draws or formats.

pub mod aggregators;
pub mod coverage;
mod pairing;
pub mod replay;
pub mod state;

use crate::model::{Snapshot, StackId};
use std::num::NonZeroU32;

/// Index of an event in a device's trace (as in the file, before any merging). Stored
/// as index + 1 so that `Option<EventIdx>` takes 4 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventIdx(NonZeroU32);

impl EventIdx {
    pub fn new(index: usize) -> EventIdx {
        EventIdx(NonZeroU32::new(index as u32 + 1).expect("fewer than 2^32 - 1 events"))
    }

    pub fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

impl serde::Serialize for EventIdx {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.index() as u64)
    }
}

/// Where a lifetime comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Its `alloc` is in the trace.
    Traced,
    /// Freed in the trace, allocated before it (recording started late or the ring
    /// buffer dropped the allocation).
    BeforeTrace,
    /// Alive in the final snapshot with no `alloc` in the trace (a "ghost" block).
    Survivor,
}

/// One allocation from allocation to completed free.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Lifetime {
    pub addr: u64,
    /// Requested bytes (what the viewer stacks).
    pub size: u64,
    /// Per-address version, as the viewer labels blocks: `b'<hex addr>_<version>`; 0 in
    /// a replay whose aggregators do not ask for it ([`replay::Aggregator::wants_versions`]).
    pub version: u32,
    pub origin: Origin,
    /// The `alloc` event; None when it happened before the trace.
    pub alloc: Option<EventIdx>,
    /// The `free_requested` event, when traced.
    pub free_requested: Option<EventIdx>,
    /// The `free_completed` event; None when still alive at the end.
    pub free_completed: Option<EventIdx>,
    /// Index into the streams of the replay ([`aggregators::Lifetimes::streams`]).
    #[serde(skip)]
    pub stream: u16,
    /// Index into the pools of the replay ([`aggregators::Lifetimes::pools`]).
    #[serde(skip)]
    pub pool: u16,
    /// Stack id, `u32::MAX` for none (see [`Lifetime::stack`]).
    #[serde(skip)]
    stack: u32,
}

impl Lifetime {
    /// The stack recorded with the allocation (or with its free, for orphan frees).
    pub fn stack(&self) -> Option<StackId> {
        (self.stack != u32::MAX).then_some(StackId(self.stack))
    }

    /// The viewer's label, e.g. `b'7f3a00000000_2`.
    pub fn label(&self) -> String {
        format!("b'{:x}_{}", self.addr, self.version)
    }

    /// Alive just after event `i` (events before the trace count as alive at the start).
    pub fn alive_after(&self, i: usize) -> bool {
        self.alloc.is_none_or(|a| a.index() <= i)
            && self.free_completed.is_none_or(|f| f.index() > i)
    }
}

pub use replay::{DeviceReplay, Peak, Start, block_bytes};

/// Just the peaks, from one pass that stores nothing per event (for `summary`).
pub fn peaks(snap: &Snapshot, device: i64) -> replay::Peaks {
    let r = DeviceReplay::new(snap, device);
    let mut p = replay::Peaks::default();
    r.run(&mut p);
    p.with_times(r.trace)
}

/// Requested and reserved bytes just after chosen events, with the peaks, from one replay
/// pass that keeps nothing per event: for commands that read the totals at a few moments
/// and at device readings, not the whole series.
#[derive(Debug)]
pub struct TotalsAtEvents {
    start: replay::Start,
    /// The chosen states (None: before the first event), ascending, without repeats.
    states: Vec<Option<usize>>,
    /// Relative totals at each state.
    values: Vec<replay::Running>,
    pub peaks: replay::Peaks,
}

/// Totals at the given states (any order, repeats allowed) and at the peak of requested
/// bytes.
pub fn totals_at_events(
    snap: &Snapshot,
    device: i64,
    mut states: Vec<Option<usize>>,
) -> TotalsAtEvents {
    states.sort_unstable();
    states.dedup();
    let r = DeviceReplay::new(snap, device);
    let mut at = replay::TotalsAt::new(states.clone());
    let mut peaks = replay::Peaks::default();
    let start = r.run((&mut at, &mut peaks));
    TotalsAtEvents {
        start,
        states,
        values: at.values,
        peaks: peaks.with_times(r.trace),
    }
}

impl TotalsAtEvents {
    /// Relative totals just after event `at`: a chosen state or the peak of requested
    /// bytes. Asking for another is a caller's bug.
    fn relative(&self, at: Option<usize>) -> replay::Running {
        if at.is_some() && at == self.peaks.requested.event.map(EventIdx::index) {
            return self.peaks.at_requested_peak;
        }
        match self.states.binary_search(&at) {
            Ok(k) => self.values[k],
            Err(_) => panic!("totals asked at {at:?}, which was not chosen before the pass"),
        }
    }

    /// Requested bytes just after event `at` (None: before the first event).
    pub fn requested_at(&self, at: Option<usize>) -> u64 {
        self.start.requested_after(&self.relative(at))
    }

    /// Reserved bytes just after event `at` (None: before the first event).
    pub fn reserved_at(&self, at: Option<usize>) -> i64 {
        self.start.reserved_after(&self.relative(at))
    }
}
