//! Whether a device's trace shows memory over time: the one rule every command asks
//! before it draws a timeline, names a peak or takes a moment other than the final state.
//!
//! A trace shows memory over time when at least two of its events change memory (an
//! `alloc`, a `free_completed`, a segment event). With none (no trace, or only `snapshot`
//! or `oom` entries) the final state is all there is; with one, the only other state is
//! the one just before that event, rebuilt from the final state, so a "peak" or a chart
//! would be the final state give or take one block. Real dumps hold such traces when
//! recording was switched on just before the dump, or when a PyTorch 2.0 dump holds only
//! its own `snapshot` entry. Such a device reads as one without a trace everywhere; its
//! events are still counted where they are listed (`summary`, `export`).

use super::replay::DeviceReplay;
use crate::model::{Action, DeviceTrace};
use serde::Serialize;

/// Events that change memory a trace needs to show it over time.
const MIN_CHANGES: usize = 2;

/// Whether an event changes the memory the timeline counts (requested or reserved).
fn changes_memory(action: Action) -> bool {
    matches!(
        action,
        Action::Alloc
            | Action::FreeCompleted
            | Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap
    )
}

/// Whether `trace` shows memory over time (stops at the second change it finds).
pub fn has_timeline(trace: &DeviceTrace) -> bool {
    (0..trace.len())
        .filter(|&i| changes_memory(trace.action(i)))
        .take(MIN_CHANGES)
        .count()
        == MIN_CHANGES
}

/// A device whose trace shows nothing over time: only its final state is known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}", self.describe())]
pub struct NoTimeline {
    pub device: i64,
    /// Events the trace holds (0: none recorded).
    pub events: usize,
    /// How many of each action, in the order of [`Action::KNOWN`] (others last).
    pub actions: Vec<(&'static str, usize)>,
}

impl NoTimeline {
    /// Why `device` has no timeline, or None when its trace shows memory over time.
    pub fn of(device: i64, trace: &DeviceTrace) -> Option<NoTimeline> {
        if has_timeline(trace) {
            return None;
        }
        let mut counts = [0usize; 16];
        for i in 0..trace.len() {
            counts[trace.action(i) as usize & 15] += 1;
        }
        let actions = Action::KNOWN
            .iter()
            .chain(&[Action::Other])
            .filter(|&&a| counts[a as usize & 15] > 0)
            .map(|&a| (a.name(), counts[a as usize & 15]))
            .collect();
        Some(NoTimeline {
            device,
            events: trace.len(),
            actions,
        })
    }

    /// "device 0 has no trace", or "device 0 has no timeline" and what its few events were.
    fn describe(&self) -> String {
        if self.events == 0 {
            return format!("device {} has no trace", self.device);
        }
        let actions: Vec<String> = match self.actions.as_slice() {
            [(name, _)] if self.events == 1 => vec![name.to_string()],
            list => list.iter().map(|(a, n)| format!("{a} {n}")).collect(),
        };
        format!(
            "device {} has no timeline (its trace holds just {} event{}: {})",
            self.device,
            self.events,
            if self.events == 1 { "" } else { "s" },
            actions.join(", ")
        )
    }
}

impl DeviceReplay<'_> {
    /// Whether the device's trace shows memory over time (see [`has_timeline`]).
    pub fn has_timeline(&self) -> bool {
        has_timeline(self.trace)
    }

    /// Why the device has no timeline, or None when it has one.
    pub fn no_timeline(&self) -> Option<NoTimeline> {
        NoTimeline::of(self.device, self.trace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::trace::NewEvent;

    fn trace(actions: &[Action]) -> DeviceTrace {
        let mut t = DeviceTrace::default();
        for (i, &a) in actions.iter().enumerate() {
            t.push(NewEvent {
                action: Some(a),
                addr: 0x1000 * (i as u64 + 1),
                size: 512,
                ..Default::default()
            });
        }
        t
    }

    #[test]
    fn two_changes_of_memory_make_a_timeline() {
        use Action::*;
        assert!(!has_timeline(&trace(&[])));
        assert!(!has_timeline(&trace(&[FreeCompleted])));
        assert!(!has_timeline(&trace(&[Snapshot])));
        assert!(!has_timeline(&trace(&[SegmentFree])));
        assert!(!has_timeline(&trace(&[
            Alloc,
            FreeRequested,
            Oom,
            Snapshot
        ])));
        assert!(has_timeline(&trace(&[Alloc, FreeCompleted])));
        assert!(has_timeline(&trace(&[Snapshot, SegmentAlloc, Alloc])));
        assert!(has_timeline(&trace(&[FreeCompleted, FreeCompleted])));
    }

    #[test]
    fn the_few_events_are_named() {
        use Action::*;
        assert_eq!(
            NoTimeline::of(0, &trace(&[])).unwrap().to_string(),
            "device 0 has no trace"
        );
        assert_eq!(
            NoTimeline::of(1, &trace(&[FreeCompleted]))
                .unwrap()
                .to_string(),
            "device 1 has no timeline (its trace holds just 1 event: free_completed)"
        );
        assert_eq!(
            NoTimeline::of(0, &trace(&[Snapshot, Alloc, Snapshot]))
                .unwrap()
                .to_string(),
            "device 0 has no timeline (its trace holds just 3 events: alloc 1, snapshot 2)"
        );
        assert_eq!(NoTimeline::of(0, &trace(&[Alloc, FreeCompleted])), None);
    }
}
