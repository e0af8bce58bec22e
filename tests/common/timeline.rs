//! A device replayed fully, every lifetime and the per-event series materialised: test
//! support, so tests can read the requested and reserved bytes after any event and the
//! live set at any moment and compare them with what the analyses answer. The commands
//! run [`DeviceReplay`] with the aggregators they need.

use vramlens::model::{DeviceTrace, Snapshot};
use vramlens::timeline::Lifetime;
use vramlens::timeline::replay::{self, DeviceReplay, Peak, Start};

/// The replayed trace of one device, with every lifetime and the per-event series
/// materialised.
#[derive(Debug, Clone)]
pub struct DeviceTimeline<'a> {
    pub device: i64,
    pub trace: &'a DeviceTrace,
    pub lifetimes: Vec<Lifetime>,
    /// Distinct streams of the lifetimes.
    pub streams: Vec<u64>,
    /// Distinct pool ids of the lifetimes (None: unknown, before 2.1 or outside every
    /// final segment).
    pub pools: Vec<Option<(i64, i64)>>,
    /// What existed before the first event.
    pub start: Start,
    /// Requested bytes just after each event, relative to the start.
    requested: Vec<i64>,
    /// (event, reserved bytes just after it, relative to the start) at each segment event.
    reserved_changes: Vec<(u32, i64)>,
    /// Maximum of requested bytes (the official viewer's Active Memory Timeline).
    pub peak_requested: Peak,
    /// Maximum of allocated block bytes (what `torch.cuda.max_memory_allocated()` counts).
    pub peak_allocated: Peak,
    pub peak_reserved: Peak,
}

/// Replays one device fully: lifetimes and per-event series.
pub fn build(snap: &Snapshot, device: i64) -> DeviceTimeline<'_> {
    let r = DeviceReplay::new(snap, device);
    let mut lifetimes = replay::Lifetimes::default();
    let mut series = replay::RequestedSeries {
        relative: Vec::with_capacity(r.len()),
    };
    let mut reserved = replay::ReservedChanges::default();
    let mut peaks = replay::Peaks::default();
    let start = r.run((&mut lifetimes, &mut series, &mut reserved, &mut peaks));
    let peaks = peaks.with_times(r.trace);
    DeviceTimeline {
        device,
        trace: r.trace,
        lifetimes: lifetimes.all,
        streams: lifetimes.streams,
        pools: lifetimes.pools,
        start,
        requested: series.relative,
        reserved_changes: reserved.changes,
        peak_requested: peaks.requested,
        peak_allocated: peaks.allocated,
        peak_reserved: peaks.reserved,
    }
}

/// Allocated block bytes at the given states (None: before the first event; others
/// ascending), by one replay pass that keeps nothing per event.
pub fn allocated_at(tl: &DeviceTimeline, snap: &Snapshot, states: &[Option<usize>]) -> Vec<u64> {
    let r = DeviceReplay::new(snap, tl.device);
    let mut at = replay::TotalsAt::new(states.to_vec());
    let start = r.run(&mut at);
    at.values.iter().map(|v| start.allocated_after(v)).collect()
}

impl DeviceTimeline<'_> {
    /// `time_us` of event `i`, when the trace has one.
    pub fn time_us(&self, i: usize) -> Option<i64> {
        self.trace.time_us(i)
    }

    /// Whether events carry times (PyTorch 2.2 and later).
    pub fn has_times(&self) -> bool {
        self.trace.keys.time_us
    }

    /// Raw stream of a lifetime (0 when more streams than fit the table).
    pub fn stream(&self, l: &Lifetime) -> u64 {
        self.streams.get(l.stream as usize).copied().unwrap_or(0)
    }

    /// Pool id of a lifetime.
    pub fn pool_id(&self, l: &Lifetime) -> Option<(i64, i64)> {
        self.pools.get(l.pool as usize).copied().flatten()
    }

    /// Lifetimes alive just after event `i` (or before the first event when None),
    /// largest first, ties by address then version.
    pub fn live_at(&self, at: Option<usize>) -> Vec<&Lifetime> {
        let mut live: Vec<&Lifetime> = self
            .lifetimes
            .iter()
            .filter(|l| match at {
                Some(i) => l.alive_after(i),
                None => l.alloc.is_none(),
            })
            .collect();
        live.sort_by(|a, b| {
            b.size
                .cmp(&a.size)
                .then(a.addr.cmp(&b.addr))
                .then(a.version.cmp(&b.version))
        });
        live
    }

    /// Events in the trace.
    pub fn events(&self) -> usize {
        self.requested.len()
    }

    /// The last event, None for an empty trace.
    pub fn last_event(&self) -> Option<usize> {
        self.requested.len().checked_sub(1)
    }

    /// Requested bytes just after event `i` (None: before the first event): the
    /// official viewer's count.
    pub fn requested_at(&self, at: Option<usize>) -> u64 {
        let rel = at.map_or(0, |i| self.requested[i]);
        (self.start.requested as i64 + rel).max(0) as u64
    }

    /// Reserved bytes just after event `i` (None: before the first event).
    pub fn reserved_at(&self, at: Option<usize>) -> i64 {
        let Some(i) = at else {
            return self.start.reserved;
        };
        let rel = match self
            .reserved_changes
            .partition_point(|(e, _)| (*e as usize) <= i)
        {
            0 => 0,
            k => self.reserved_changes[k - 1].1,
        };
        self.start.reserved + rel
    }
}
