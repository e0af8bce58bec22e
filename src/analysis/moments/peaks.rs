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
    /// At the end, the final state's count where the trace lost frees (see
    /// `freed_after_trace`).
    pub final_requested_bytes: u64,
    /// Allocations the trace leaves alive that the file's final state holds free: the
    /// trace lost their frees, or the recording stopped before them. Not live at the end.
    pub freed_after_trace: usize,
    pub freed_after_trace_bytes: u64,
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

struct Counts<'r, 'a> {
    replay: &'r DeviceReplay<'a>,
    traced: usize,
    before: usize,
    survivors: usize,
    last: Running,
    freed_after_trace: (usize, u64),
}

impl Aggregator for Counts<'_, '_> {
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
        for l in end.open {
            if self.replay.freed_after_trace(l) {
                self.freed_after_trace.0 += 1;
                self.freed_after_trace.1 += l.size;
            }
        }
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
    let mut counts = Counts {
        replay: r,
        traced: 0,
        before: 0,
        survivors: 0,
        last: Running::default(),
        freed_after_trace: (0, 0),
    };
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
        final_requested_bytes: start
            .requested_after(&counts.last)
            .saturating_sub(counts.freed_after_trace.1),
        freed_after_trace: counts.freed_after_trace.0,
        freed_after_trace_bytes: counts.freed_after_trace.1,
        initial_reserved_bytes: start.reserved,
        final_reserved_bytes: start.reserved_after(&counts.last),
        peak_requested: peaks.requested,
        peak_allocated: peaks.allocated,
        peak_reserved: peaks.reserved,
        clock: r.snap.clock(),
    })
}
