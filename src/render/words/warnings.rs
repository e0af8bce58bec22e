//! The words of the warnings met while reading a file ([`Warning`]): one sentence for
//! each, and the order every output lists them in (by that sentence, the counts of equal
//! sentences added), for text, HTML and JSON alike.

use crate::model::{Warning, Warnings};
use crate::units::bytes;
use serde::ser::{Serialize, SerializeSeq, SerializeStruct, Serializer};
use std::collections::BTreeMap;

/// The sentence for one warning.
pub fn warning_text(w: &Warning) -> String {
    match w {
        Warning::TimeOutOfRange => {
            "time_us more than 285 years from 1970 (2^53 us): taken as absent".into()
        }
        Warning::FrameIncomplete => "frame without filename, name or line".into(),
        Warning::NonStringEntryKey => "non-string key in a trace entry".into(),
        Warning::UnknownAction(name) => format!("unknown trace action '{name}'"),
        Warning::OomFreeNotASize => "oom entry with a device_free that is not a size (negative or 2^63 and above): taken as unknown".into(),
        Warning::UnknownEntryKey(name) => format!("unknown trace entry key '{name}'"),
        Warning::UnknownBlockState(name) => format!("unknown block state '{name}'"),
        Warning::UnknownBlockKey(name) => format!("unknown block key '{name}'"),
        Warning::BlockAddressMismatch => {
            "block address differs from segment address plus preceding block sizes".into()
        }
        Warning::UnknownSegmentType(name) => format!("unknown segment_type '{name}'"),
        Warning::UnknownSegmentKey(name) => format!("unknown segment key '{name}'"),
        Warning::SegmentWithoutDevice => "segment without 'device' (taken as device 0)".into(),
        Warning::BlockSizesMismatch => {
            "block sizes of a segment do not add up to its total_size".into()
        }
        Warning::UnknownAnnotationKey => "unknown external_annotations key".into(),
        Warning::NonStringTopLevelKey => "non-string top-level key".into(),
        Warning::UnknownTopLevelKey(name) => format!("unknown top-level key '{name}'"),
        Warning::TrailingBytes { bytes } => {
            format!("{bytes} bytes after the end of the pickle (STOP) were ignored")
        }
        Warning::ConvertedFromKineto => "converted from a profiler trace: stacks are the operators and Python functions enclosing each allocation; segments are synthetic (one per block alive at the end, one for memory from before profiling, one for cached free memory)".into(),
        Warning::ConvertedFromMemoryTimeline => "converted from an export_memory_timeline file: it names no device (shown as device 0) and no address; stacks are PyTorch's memory categories".into(),
        Warning::SkippedElements { elements } => format!(
            "{elements} elements of the list of events are not events (nested lists, numbers, strings) and were skipped"
        ),
        Warning::BeforeProfiling { device, bytes: b } => format!(
            "device {device}: {} was allocated before profiling started (the first event's Total Allocated minus its Bytes); it is one block from before the trace",
            bytes(*b)
        ),
        Warning::CpuOnly { device } => format!(
            "the trace has memory events only for the CPU: device {device} holds the CPU allocator's events"
        ),
        Warning::PairedBySize { device } => format!(
            "device {device}: the trace has no addresses (2021 format): each free is paired with the latest open allocation of the same size, so totals are exact but which block was live at a moment is a best guess"
        ),
        Warning::NoTotalReserved { device } => format!(
            "device {device}: the trace has no Total Reserved: reserved memory is unknown and shown as the peak allocated"
        ),
        Warning::TotalAllocatedMismatches { device, events } => format!(
            "device {device}: {events} events whose Total Allocated did not move by their Bytes (events missing from the trace)"
        ),
        Warning::CpuEventsLeftOut { events } => {
            format!("{events} CPU memory events left out (the trace has CUDA memory events)")
        }
        Warning::OtherEventsLeftOut { events } => {
            format!("{events} memory events of devices other than CPU and CUDA left out")
        }
    }
}

/// Each warning's sentence and how many times it was met, ordered by the sentence (two
/// warnings said the same way are one line).
pub fn warning_lines(ws: &Warnings) -> Vec<(String, u64)> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for (w, &count) in &ws.0 {
        *lines.entry(warning_text(w)).or_insert(0) += count;
    }
    lines.into_iter().collect()
}

/// A list of `{"message": ..., "count": ...}` in the order of [`warning_lines`].
impl Serialize for Warnings {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let lines = warning_lines(self);
        let mut seq = s.serialize_seq(Some(lines.len()))?;
        for (message, count) in &lines {
            seq.serialize_element(&Line { message, count })?;
        }
        seq.end()
    }
}

struct Line<'a> {
    message: &'a str,
    count: &'a u64,
}

impl Serialize for Line<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Warning", 2)?;
        st.serialize_field("message", self.message)?;
        st.serialize_field("count", self.count)?;
        st.end()
    }
}
