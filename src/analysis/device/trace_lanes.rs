//! A profiler trace's spans as lanes under the timeline chart: the outermost
//! `record_function` ranges (`ProfilerStep#3`, the user's own) in one lane, and the
//! outermost operators of the busiest threads (the main thread, autograd's) in one lane
//! each, placed on the chart's x axis through the trace's alignment with the snapshot.
//!
//! Takes a [`ProfileTrace`], the chart's axis and a clock offset; gives [`TraceLanes`] of
//! names and positions. Words are `render::charts::timeline_svg`'s.

use crate::analysis::device::align::{Alignment, Times};
use crate::analysis::moments::chart::{TimelineView, XAxis};
use crate::devlog::profile::{ProfileTrace, Span, SpanKind};
use crate::model::DeviceTrace;
use serde::Serialize;
use std::collections::BTreeMap;

/// Spans kept in one lane; the widest are kept when there are more.
pub const MAX_LANE_SPANS: usize = 400;
/// Threads given an operator lane.
pub const MAX_OPERATOR_LANES: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LaneKind {
    /// Outermost `record_function` ranges of every thread.
    Annotations,
    /// Outermost operators of one thread.
    Operators,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaneSpan {
    pub name: String,
    /// Positions on the chart's x axis, clipped to its range.
    pub x0: f64,
    pub x1: f64,
    /// Start on the snapshot's clock (Unix µs).
    pub start_us: i64,
    pub duration_ns: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lane {
    pub kind: LaneKind,
    /// The thread (`pid/tid` as the trace names it) of an operator lane.
    pub thread: Option<String>,
    /// Memory events the thread made (an operator lane), or 0.
    pub memory_events: u64,
    /// Sorted by x0.
    pub spans: Vec<LaneSpan>,
    /// Spans in the chart's range left out to keep the lane readable.
    pub dropped: usize,
}

/// The lanes and how the trace was placed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceLanes {
    /// The trace file as given.
    pub path: String,
    /// None when the trace is the chart's own input (one clock).
    pub alignment: Option<Alignment>,
    pub lanes: Vec<Lane>,
}

/// Where a time on the snapshot's clock falls on the chart's x axis.
struct XMap<'a> {
    x: XAxis,
    origin: i64,
    times: &'a Times<'a>,
}

impl XMap<'_> {
    fn at(&self, t_us: i64) -> f64 {
        match self.x {
            XAxis::Time => t_us.saturating_sub(self.origin) as f64,
            // The state after the last event at or before the time.
            XAxis::Events => self.times.event_at(t_us).map_or(0.0, |i| (i + 1) as f64),
        }
    }
}

/// The outermost spans of `kind` on each thread (spans are sorted by thread, start,
/// longest first, so a span starting before the open one ends lies inside it).
fn outermost(spans: &[Span], kind: SpanKind) -> Vec<&Span> {
    let mut out: Vec<&Span> = Vec::new();
    let mut open: Option<(u32, i64)> = None;
    for s in spans.iter().filter(|s| s.kind == kind) {
        match open {
            Some((thread, end)) if thread == s.thread && s.start_ns < end => continue,
            _ => {
                out.push(s);
                open = Some((s.thread, s.end_ns));
            }
        }
    }
    out
}

/// The spans of `kind` inside no other of any thread, in time order.
fn outermost_of_all(spans: &[Span], kind: SpanKind) -> Vec<&Span> {
    let mut all: Vec<&Span> = spans.iter().filter(|s| s.kind == kind).collect();
    all.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns), s.thread, s.name));
    let mut out: Vec<&Span> = Vec::new();
    let mut open_end = i64::MIN;
    for s in all {
        if s.start_ns >= open_end {
            out.push(s);
            open_end = s.end_ns;
        } else if s.end_ns > open_end {
            // Overlapping without nesting (other threads): drawn after the open one.
            out.push(s);
            open_end = s.end_ns;
        }
    }
    out
}

/// Builds the lanes for a chart of `trace` (the snapshot device drawn). The alignment's
/// residual is taken from the trace's times to put them on the snapshot's clock; without
/// an alignment the trace is the chart's own input.
pub fn build_lanes(
    profile: &ProfileTrace,
    path: &str,
    alignment: Option<Alignment>,
    view: &TimelineView,
    trace: &DeviceTrace,
) -> TraceLanes {
    let times = Times::new(Some(trace));
    let map = XMap {
        x: view.x_axis,
        origin: view.time_origin_us.unwrap_or(0),
        times: &times,
    };
    let shift_us = alignment.and_then(|a| a.residual_us).unwrap_or(0);
    let place = |s: &Span| -> Option<LaneSpan> {
        let start_us = s.start_ns.div_euclid(1000) - shift_us;
        let end_us = s.end_ns.div_euclid(1000) - shift_us;
        let (x0, x1) = (map.at(start_us), map.at(end_us));
        (x1 >= view.x_min && x0 <= view.x_max).then(|| LaneSpan {
            name: profile
                .names
                .get(s.name as usize)
                .cloned()
                .unwrap_or_default(),
            x0: x0.max(view.x_min),
            x1: x1.min(view.x_max),
            start_us,
            duration_ns: s.end_ns - s.start_ns,
        })
    };
    let mut lanes = Vec::new();
    // A trace drawn as the chart's own input has its ranges in the chart's annotation
    // strip already.
    let annotations: Vec<LaneSpan> = match alignment {
        Some(_) => outermost_of_all(&profile.spans, SpanKind::Annotation)
            .into_iter()
            .filter_map(place)
            .collect(),
        None => Vec::new(),
    };
    if !annotations.is_empty() {
        lanes.push(lane(LaneKind::Annotations, None, 0, annotations));
    }
    // Threads by the memory events they made, then by their operators in range.
    let mut memory_by_thread: BTreeMap<u32, u64> = BTreeMap::new();
    for m in &profile.memory {
        if let Some(t) = m.thread {
            *memory_by_thread.entry(t).or_insert(0) += 1;
        }
    }
    let mut by_thread: BTreeMap<u32, Vec<LaneSpan>> = BTreeMap::new();
    for s in outermost(&profile.spans, SpanKind::Operator) {
        if let Some(p) = place(s) {
            by_thread.entry(s.thread).or_default().push(p);
        }
    }
    let mut threads: Vec<(u32, Vec<LaneSpan>)> = by_thread.into_iter().collect();
    threads.sort_by_key(|(t, spans)| {
        (
            std::cmp::Reverse(memory_by_thread.get(t).copied().unwrap_or(0)),
            std::cmp::Reverse(spans.len()),
            *t,
        )
    });
    for (t, spans) in threads.into_iter().take(MAX_OPERATOR_LANES) {
        let name = profile.threads.get(t as usize).cloned();
        let memory = memory_by_thread.get(&t).copied().unwrap_or(0);
        lanes.push(lane(LaneKind::Operators, name, memory, spans));
    }
    TraceLanes {
        path: path.to_string(),
        alignment,
        lanes,
    }
}

/// A lane of at most [`MAX_LANE_SPANS`] spans, the widest kept, sorted by position.
fn lane(
    kind: LaneKind,
    thread: Option<String>,
    memory_events: u64,
    mut spans: Vec<LaneSpan>,
) -> Lane {
    let dropped = spans.len().saturating_sub(MAX_LANE_SPANS);
    if dropped > 0 {
        // The widest on the chart (on an event axis, those spanning most events).
        spans.sort_by(|a, b| {
            (b.x1 - b.x0)
                .total_cmp(&(a.x1 - a.x0))
                .then(b.duration_ns.cmp(&a.duration_ns))
                .then(a.start_us.cmp(&b.start_us))
                .then(a.name.cmp(&b.name))
        });
        spans.truncate(MAX_LANE_SPANS);
    }
    spans.sort_by(|a, b| {
        a.x0.total_cmp(&b.x0)
            .then(a.start_us.cmp(&b.start_us))
            .then(a.name.cmp(&b.name))
    });
    Lane {
        kind,
        thread,
        memory_events,
        spans,
        dropped,
    }
}
