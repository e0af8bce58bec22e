//! The replay of one device in numbers: peaks, lifetimes by origin, start and end.

use crate::timeline::{DeviceTimeline, Origin, Peak};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimelineReport {
    pub schema_version: u32,
    pub path: String,
    pub device: i64,
    pub events: usize,
    /// Lifetimes whose alloc is in the trace.
    pub traced_allocations: usize,
    /// Freed in the trace but allocated before it began.
    pub allocated_before_trace: usize,
    /// Alive at the end with no alloc in the trace.
    pub survivors: usize,
    /// Requested bytes before the first and after the last event.
    pub initial_requested_bytes: u64,
    pub final_requested_bytes: u64,
    pub initial_reserved_bytes: i64,
    pub final_reserved_bytes: i64,
    /// The official viewer's timeline maximum (requested bytes).
    pub peak_requested: Peak,
    /// The maximum in allocated block bytes.
    pub peak_allocated: Peak,
    pub peak_reserved: Peak,
}

pub fn report(path: &str, tl: &DeviceTimeline) -> TimelineReport {
    let count = |o: Origin| tl.lifetimes.iter().filter(|l| l.origin == o).count();
    let last = tl.last_event();
    TimelineReport {
        schema_version: 2,
        path: path.to_string(),
        device: tl.device,
        events: tl.events(),
        traced_allocations: count(Origin::Traced),
        allocated_before_trace: count(Origin::BeforeTrace),
        survivors: count(Origin::Survivor),
        initial_requested_bytes: tl.start.requested,
        final_requested_bytes: tl.requested_at(last),
        initial_reserved_bytes: tl.start.reserved,
        final_reserved_bytes: tl.reserved_at(last),
        peak_requested: tl.peak_requested,
        peak_allocated: tl.peak_allocated,
        peak_reserved: tl.peak_reserved,
    }
}
