//! Lining a profiler trace up with a snapshot of the same run: the trace's clock from its
//! metadata, confirmed by matching allocations (same address, a block that holds the
//! requested size, at nearly the same time). `reconcile` puts the lined-up trace's totals
//! in its ledger; `timeline --trace` draws its operator spans under the chart.
//!
//! Takes a [`Snapshot`] and a [`Converted`] trace; gives an [`Alignment`] of numbers, or a
//! [`LineUpError`] saying why the two cannot be lined up. Words are the renderers'.

use crate::devlog::TimeRange;
use crate::devlog::convert::{Converted, DeviceSource};
use crate::devlog::profile::TraceClock;
use crate::model::{Action, DeviceTrace, Snapshot};
use serde::Serialize;
use std::collections::BTreeMap;

/// Times this far outside the snapshot's still count as overlapping it.
pub const MAX_SKEW_US: i64 = 5_000_000;
/// A trace allocation matches a snapshot allocation at most this far from the typical
/// offset between the two clocks.
pub const MATCH_TOLERANCE_US: i64 = 2_000;
/// How far apart the two clocks may be before any match is looked for.
const MATCH_SEARCH_US: i64 = 5_000_000;

/// How a trace's clock lines up with a snapshot's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Alignment {
    pub snapshot_device: i64,
    /// Added to the trace's times from its own metadata (`baseTimeNanoseconds`, in µs);
    /// 0 for traces with absolute times.
    pub metadata_offset_us: i64,
    /// The typical (median) trace time minus snapshot time of matched allocations: how
    /// far the two clocks are apart after the metadata offset. None without matches.
    pub residual_us: Option<i64>,
    /// Trace allocations with an address inside the snapshot's time span.
    pub trace_allocations: u64,
    /// Of them, those matching a snapshot allocation: same address, a block size that
    /// holds the requested size, within 2 ms of the typical offset.
    pub matched: u64,
}

impl Alignment {
    /// A trace time in µs on the snapshot's clock.
    pub fn to_snapshot_us(&self, trace_us: i64) -> i64 {
        trace_us.saturating_sub(self.residual_us.unwrap_or(0))
    }
}

/// A trace device lined up with a snapshot device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinedUp {
    /// The converted trace's device slot.
    pub trace_device: i64,
    /// Its index in [`Converted::devices`].
    pub index: usize,
    pub alignment: Alignment,
    /// The trace device's memory events, on the trace's clock.
    pub trace_range: TimeRange,
}

/// Why a trace cannot be lined up with a snapshot device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LineUpError {
    /// The trace has no memory events.
    NoMemoryEvents,
    /// Only CPU memory events: nothing to set beside a GPU's.
    OnlyCpuEvents,
    /// Relative times without a base: the trace cannot be placed in time.
    ClockUnknown,
    /// The snapshot device has no times (before PyTorch 2.2).
    SnapshotWithoutTimes,
    /// The trace has no device of that number, nor a single one to take instead.
    NoSuchDevice { devices: usize },
    /// The trace device's events have no times.
    TraceWithoutTimes,
    /// Their times do not overlap: another run.
    NoOverlap {
        trace: TimeRange,
        snapshot: TimeRange,
    },
    /// Overlapping times, but no allocation matches: another process.
    NoMatches { alignment: Alignment, index: usize },
}

/// The events' times, to find the event at a time. A trace whose events all carry a
/// time, never stepping back (as recordings are), is searched in place; otherwise the
/// timed events are listed with their times made monotonic (a step back keeps the
/// latest), so the answers are the same either way.
pub struct Times<'a> {
    trace: Option<&'a DeviceTrace>,
    /// (time, event index) of every event with a time, in event order; None when the
    /// trace's own times serve.
    listed: Option<Vec<(i64, usize)>>,
}

impl<'a> Times<'a> {
    pub fn new(trace: Option<&'a DeviceTrace>) -> Times<'a> {
        let in_place = trace.is_none_or(|t| {
            let mut last = i64::MIN;
            (0..t.len()).all(|i| match t.time_us(i) {
                Some(time) if time > 0 && time >= last => {
                    last = time;
                    true
                }
                _ => false,
            })
        });
        let listed = (!in_place).then(|| {
            let mut at = Vec::new();
            let mut last = i64::MIN;
            if let Some(t) = trace {
                for i in 0..t.len() {
                    if let Some(time) = t.stamped_time(i) {
                        last = last.max(time);
                        at.push((last, i));
                    }
                }
            }
            at
        });
        Times { trace, listed }
    }

    pub fn range(&self) -> Option<TimeRange> {
        match &self.listed {
            Some(at) => Some(TimeRange::new(at.first()?.0, at.last()?.0)),
            None => {
                let t = self.trace?;
                let last = t.len().checked_sub(1)?;
                Some(TimeRange::new(t.time_us(0)?, t.time_us(last)?))
            }
        }
    }

    /// The last event at or before time `t` (None: before the first).
    pub fn event_at(&self, t: i64) -> Option<usize> {
        match &self.listed {
            Some(at) => {
                let i = at.partition_point(|&(time, _)| time <= t);
                i.checked_sub(1).map(|k| at[k].1)
            }
            None => {
                let trace = self.trace?;
                // Events stamped at or before t come first: count them.
                let (mut lo, mut hi) = (0, trace.len());
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if trace.time_us(mid).is_some_and(|time| time <= t) {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                lo.checked_sub(1)
            }
        }
    }
}

/// Why a converted trace cannot be used at all, whatever the snapshot.
pub fn unusable(conv: &Converted) -> Option<LineUpError> {
    if conv.devices.is_empty() {
        Some(LineUpError::NoMemoryEvents)
    } else if conv.devices.iter().all(|d| d.source == DeviceSource::Cpu) {
        Some(LineUpError::OnlyCpuEvents)
    } else if conv.clock == TraceClock::Unknown {
        Some(LineUpError::ClockUnknown)
    } else {
        None
    }
}

/// Lines the trace's device of the same number (else its only one) up with snapshot
/// device `d`, and checks it is the same run.
pub fn line_up(snap: &Snapshot, d: i64, conv: &Converted) -> Result<LinedUp, LineUpError> {
    if let Some(e) = unusable(conv) {
        return Err(e);
    }
    let Some(snapshot_range) = Times::new(snap.trace(d)).range() else {
        return Err(LineUpError::SnapshotWithoutTimes);
    };
    let index = conv
        .devices
        .iter()
        .position(|t| t.device == d)
        .or_else(|| (conv.devices.len() == 1).then_some(0))
        .ok_or(LineUpError::NoSuchDevice {
            devices: conv.devices.len(),
        })?;
    let device = &conv.devices[index];
    let trace = conv.snapshot.trace(device.device);
    let Some(trace_range) = Times::new(trace).range() else {
        return Err(LineUpError::TraceWithoutTimes);
    };
    if !trace_range.widen(MAX_SKEW_US).overlaps(snapshot_range) {
        return Err(LineUpError::NoOverlap {
            trace: trace_range,
            snapshot: snapshot_range,
        });
    }
    let metadata_offset_us = match conv.clock {
        TraceClock::RelativeToBase => conv.base_time_ns.unwrap_or(0).div_euclid(1000),
        _ => 0,
    };
    let alignment = if device.paired_by_size {
        Alignment {
            snapshot_device: d,
            metadata_offset_us,
            residual_us: None,
            trace_allocations: 0,
            matched: 0,
        }
    } else {
        match_allocations(snap, d, trace, snapshot_range, metadata_offset_us)
    };
    if alignment.trace_allocations > 0 && alignment.matched == 0 {
        return Err(LineUpError::NoMatches { alignment, index });
    }
    Ok(LinedUp {
        trace_device: device.device,
        index,
        alignment,
        trace_range,
    })
}

/// Allocations of the trace matched with the snapshot's: same address, a block size that
/// holds the requested size (the trace records blocks, the snapshot requests), at nearly
/// the same time once the typical offset between the clocks is taken out.
fn match_allocations(
    snap: &Snapshot,
    d: i64,
    trace: Option<&DeviceTrace>,
    snapshot_range: TimeRange,
    metadata_offset_us: i64,
) -> Alignment {
    let mut by_addr: BTreeMap<u64, Vec<(i64, u64)>> = BTreeMap::new();
    if let Some(t) = snap.trace(d) {
        for e in t.iter().filter(|e| e.action == Action::Alloc) {
            if let Some(time) = e.time_us.filter(|&t| t > 0) {
                by_addr.entry(e.addr).or_default().push((time, e.size));
            }
        }
    }
    let fits = |requested: u64, block: u64| {
        // The caching allocator rounds requests up to 512 bytes and may hand out a block
        // up to 1 MiB larger than that when the rest is too small to split.
        block >= requested && block <= requested.div_ceil(512) * 512 + (1 << 20)
    };
    let window = snapshot_range.widen(MAX_SKEW_US);
    let mut diffs: Vec<i64> = Vec::new();
    let mut candidates = 0u64;
    if let Some(t) = trace {
        for e in t.iter().filter(|e| e.action == Action::Alloc) {
            let Some(time) = e.time_us else { continue };
            if !window.contains(time) {
                continue;
            }
            candidates += 1;
            let Some(list) = by_addr.get(&e.addr) else {
                continue;
            };
            let best = list
                .iter()
                .filter(|(_, size)| fits(*size, e.size))
                .map(|(st, _)| time - st)
                .filter(|diff| diff.abs() <= MATCH_SEARCH_US)
                .min_by_key(|diff| (diff.abs(), *diff));
            if let Some(diff) = best {
                diffs.push(diff);
            }
        }
    }
    let mut sorted = diffs;
    sorted.sort_unstable();
    let residual = (!sorted.is_empty()).then(|| sorted[sorted.len() / 2]);
    let matched = residual.map_or(0, |r| {
        sorted
            .iter()
            .filter(|&&d| (d - r).abs() <= MATCH_TOLERANCE_US)
            .count() as u64
    });
    Alignment {
        snapshot_device: d,
        metadata_offset_us,
        residual_us: residual.filter(|_| matched > 0),
        trace_allocations: candidates,
        matched,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Action;
    use crate::model::trace::NewEvent;

    fn trace(times: &[Option<i64>]) -> DeviceTrace {
        let mut t = DeviceTrace::default();
        for &time_us in times {
            t.push(NewEvent {
                action: Some(Action::Alloc),
                time_us,
                ..Default::default()
            });
        }
        t
    }

    /// The last timed event such that it and every timed event before it are at or
    /// before `t`, by scanning.
    fn scanned(times: &[Option<i64>], t: i64) -> Option<usize> {
        let mut found = None;
        for (i, time) in times.iter().enumerate() {
            match time.filter(|&x| x > 0) {
                Some(x) if x > t => break,
                Some(_) => found = Some(i),
                None => {}
            }
        }
        found
    }

    #[test]
    fn the_event_at_a_time_is_the_same_searched_in_place_or_listed() {
        let base = 1_700_000_000_000_000;
        let steady: Vec<Option<i64>> = [0, 0, 5, 9, 9, 9, 20]
            .iter()
            .map(|d| Some(base + d))
            .collect();
        let mut untimed = steady.clone();
        untimed[3] = None;
        let mut back = steady.clone();
        back[4] = Some(base + 2);
        for times in [&steady, &untimed, &back, &Vec::new()] {
            let t = trace(times);
            let found = Times::new(Some(&t));
            // Only the steady trace is searched in place.
            assert_eq!(found.listed.is_none(), times == &steady || times.is_empty());
            for at in base - 1..=base + 21 {
                assert_eq!(found.event_at(at), scanned(times, at), "{times:?} at {at}");
            }
        }
        let t = trace(&steady);
        assert_eq!(
            Times::new(Some(&t)).range(),
            Some(TimeRange::new(base, base + 20))
        );
        assert_eq!(Times::new(None).range(), None);
        assert_eq!(Times::new(None).event_at(base), None);
    }
}
