//! The live set: what was allocated at one moment of a device's timeline.

use super::frames::user_frames;
use crate::model::{Action, Snapshot};
use crate::timeline::{DeviceTimeline, Origin};
use serde::Serialize;

/// A moment of the timeline, as the user names it with `--at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// Where allocated memory peaks.
    Peak,
    /// The first `oom` event.
    Oom,
    /// Just after event N.
    Event(usize),
    /// The last event at or before this Unix time in microseconds.
    Time(i64),
}

impl std::str::FromStr for Moment {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("expected peak, oom, event:N or time:T (Unix microseconds), found {s:?}");
        match s {
            "peak" => Ok(Moment::Peak),
            "oom" => Ok(Moment::Oom),
            _ => {
                if let Some(n) = s.strip_prefix("event:") {
                    n.parse().map(Moment::Event).map_err(|_| bad())
                } else if let Some(t) = s.strip_prefix("time:") {
                    t.parse().map(Moment::Time).map_err(|_| bad())
                } else {
                    Err(bad())
                }
            }
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LiveAllocation {
    pub label: String,
    pub addr: u64,
    pub size_bytes: u64,
    pub origin: Origin,
    pub alloc_event: Option<u32>,
    pub free_completed_event: Option<u32>,
    pub alloc_time_us: Option<i64>,
    pub stream: u64,
    pub pool_id: Option<(i64, i64)>,
    /// Top frames, innermost first, noise filtered.
    pub frames: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LiveSet {
    pub schema_version: u32,
    pub path: String,
    pub device: i64,
    /// The event just after which the set is taken; null: before the first event.
    pub event: Option<u32>,
    pub time_us: Option<i64>,
    pub allocated_bytes: u64,
    pub reserved_bytes: i64,
    pub count: usize,
    pub allocations: Vec<LiveAllocation>,
}

/// Resolves a moment to an event index (None: before the first event).
pub fn resolve(
    snap: &Snapshot,
    tl: &DeviceTimeline,
    moment: Moment,
) -> Result<Option<usize>, String> {
    let n = tl.events();
    match moment {
        Moment::Peak => Ok(tl.peak_requested.event.map(|e| e.index())),
        Moment::Oom => {
            let trace = snap
                .trace(tl.device)
                .ok_or("this device has no trace, so no oom event")?;
            (0..trace.len())
                .find(|&i| trace.action(i) == Action::Oom)
                .map(Some)
                .ok_or_else(|| format!("device {} has no oom event in its trace", tl.device))
        }
        Moment::Event(i) if i < n => Ok(Some(i)),
        Moment::Event(i) => Err(format!(
            "event {i} is out of range; device {} has {n} events",
            tl.device
        )),
        Moment::Time(t) => {
            if !tl.has_times() {
                return Err("this trace has no time_us (PyTorch before 2.2); use event:N".into());
            }
            Ok(tl.event_at_time(t))
        }
    }
}

/// The live set at event `at`, largest first, with up to `frames` frames each.
pub fn live_set(
    snap: &Snapshot,
    path: &str,
    tl: &DeviceTimeline,
    at: Option<usize>,
    frames: usize,
) -> LiveSet {
    let live = tl.live_at(at);
    let allocations = live
        .iter()
        .map(|l| LiveAllocation {
            label: l.label(),
            addr: l.addr,
            size_bytes: l.size,
            origin: l.origin,
            alloc_event: l.alloc.map(|e| e.index() as u32),
            free_completed_event: l.free_completed.map(|e| e.index() as u32),
            alloc_time_us: l.alloc.and_then(|e| tl.time_us(e.index())),
            stream: tl.stream(l),
            pool_id: tl.pool_id(l),
            frames: user_frames(&snap.frames, l.stack(), frames),
        })
        .collect::<Vec<_>>();
    LiveSet {
        schema_version: 1,
        path: path.to_string(),
        device: tl.device,
        event: at.map(|i| i as u32),
        time_us: at.and_then(|i| tl.time_us(i)),
        allocated_bytes: tl.requested_at(at),
        reserved_bytes: tl.reserved_at(at),
        count: allocations.len(),
        allocations,
    }
}
