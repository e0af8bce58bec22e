//! The replay of one device in numbers: peaks, allocations by origin, start and end.

use crate::analysis::HOW_TO_RECORD;
use crate::model::Action;
use crate::timeline::coverage::NoTimeline;
use crate::timeline::replay::{Aggregator, DeviceReplay, End, Peak, Peaks, Running};
use crate::timeline::{Lifetime, Origin};
use serde::Serialize;

pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PeaksReport {
    pub schema_version: u32,
    pub path: String,
    pub device: i64,
    pub events: usize,
    /// Allocations whose alloc is in the trace.
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
    /// How the file's times read (for the text).
    #[serde(skip)]
    pub clock: crate::units::Clock,
}

#[derive(Default)]
struct Counts {
    traced: usize,
    before: usize,
    survivors: usize,
    last: Running,
}

impl Aggregator for Counts {
    fn alloc(&mut self, _i: usize, _l: &Lifetime, _run: &Running) {
        self.traced += 1;
    }
    fn free_completed(&mut self, _i: usize, l: &Lifetime, _run: &Running) {
        if l.origin == Origin::BeforeTrace {
            self.before += 1;
        }
    }
    fn event(&mut self, _i: usize, _action: Action, run: &Running) {
        self.last = *run;
    }
    fn finish(&mut self, end: &End) {
        self.survivors = end.survivors.len();
    }
}

/// Why there is no replay to report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0}: only its final state is known (see `vramlens summary` and `vramlens segments`); {how}",
    how = HOW_TO_RECORD
)]
pub struct NoTrace(pub NoTimeline);

pub fn report(path: &str, r: &DeviceReplay) -> Result<PeaksReport, NoTrace> {
    if let Some(none) = r.no_timeline() {
        return Err(NoTrace(none));
    }
    let mut counts = Counts::default();
    let mut peaks = Peaks::default();
    let start = r.run((&mut counts, &mut peaks));
    let peaks = peaks.with_times(r.trace);
    Ok(PeaksReport {
        schema_version: SCHEMA_VERSION,
        path: path.to_string(),
        device: r.device,
        events: r.len(),
        traced_allocations: counts.traced,
        allocated_before_trace: counts.before,
        survivors: counts.survivors,
        initial_requested_bytes: start.requested,
        final_requested_bytes: start.requested_after(&counts.last),
        initial_reserved_bytes: start.reserved,
        final_reserved_bytes: start.reserved_after(&counts.last),
        peak_requested: peaks.requested,
        peak_allocated: peaks.allocated,
        peak_reserved: peaks.reserved,
        clock: r.snap.clock(),
    })
}
