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
    pub initial_allocated_bytes: u64,
    pub final_allocated_bytes: u64,
    pub initial_reserved_bytes: i64,
    pub final_reserved_bytes: i64,
    pub peak_allocated: Peak,
    pub peak_reserved: Peak,
}

pub fn report(path: &str, tl: &DeviceTimeline) -> TimelineReport {
    let count = |o: Origin| tl.lifetimes.iter().filter(|l| l.origin == o).count();
    let last = tl.allocated.len().checked_sub(1);
    TimelineReport {
        schema_version: 1,
        path: path.to_string(),
        device: tl.device,
        events: tl.allocated.len(),
        traced_allocations: count(Origin::Traced),
        allocated_before_trace: count(Origin::BeforeTrace),
        survivors: count(Origin::Survivor),
        initial_allocated_bytes: tl.initial_allocated,
        final_allocated_bytes: tl.allocated_at(last),
        initial_reserved_bytes: tl.initial_reserved,
        final_reserved_bytes: tl.reserved_at(last),
        peak_allocated: tl.peak_allocated,
        peak_reserved: tl.peak_reserved,
    }
}
