//! Words for why a profiler trace cannot be lined up with a snapshot.

use crate::analysis::device::align::LineUpError;
use crate::devlog::TimeRange;
use crate::units::utc_time;

/// A time range as two UTC times.
pub(super) fn range_text(r: TimeRange) -> String {
    format!("{} .. {}", utc_time(r.first_us), utc_time(r.last_us))
}

/// One line naming the trace (and the snapshot's device) and what was expected.
pub fn line_up_error_text(e: &LineUpError, trace: &str, snapshot: &str, device: i64) -> String {
    match e {
        LineUpError::NoMemoryEvents => format!(
            "{trace}: no [memory] events to line up with the snapshot (record it with torch.profiler.profile(profile_memory=True))"
        ),
        LineUpError::OnlyCpuEvents => format!(
            "{trace}: only CPU memory events, nothing to line up with the snapshot's device {device}"
        ),
        LineUpError::ClockUnknown => format!(
            "{trace}: its times are relative and it has no baseTimeNanoseconds, so it cannot be placed beside the snapshot"
        ),
        LineUpError::SnapshotWithoutTimes => format!(
            "{snapshot}: device {device}'s trace entries have no times (PyTorch before 2.2), so a profiler trace cannot be lined up with them"
        ),
        LineUpError::NoSuchDevice { devices } => format!(
            "{trace}: no memory events of device {device}, and {devices} devices to choose from: choose the snapshot's device with --device N"
        ),
        LineUpError::TraceWithoutTimes => {
            format!("{trace}: its memory events have no times to line up by")
        }
        LineUpError::NoOverlap {
            trace: t,
            snapshot: s,
        } => format!(
            "{trace}: its memory events span {}, the snapshot's trace (device {device}) spans {}: they do not overlap, so the trace is from another run",
            range_text(*t),
            range_text(*s)
        ),
        LineUpError::NoMatches { alignment, .. } => format!(
            "{trace}: none of its {} allocations in the snapshot's time span matches one of the snapshot's on device {device} (same address and size at nearly the same time), so it is from another process or run",
            alignment.trace_allocations
        ),
    }
}
