//! What the timeline chart shows, at a bounded level of detail: the x range cut into
//! buckets, each represented by its event of highest allocated memory (so every peak
//! survives downsampling), the largest allocations as bands stacked in allocation order,
//! everything else merged into one band, the reserved line, OOM and snapshot markers and
//! external annotations. Coordinates are left to the renderer.

use super::frames::{headline_frame, user_frames};
use crate::model::{Action, Snapshot};
use crate::timeline::{DeviceTimeline, Lifetime, Origin};
use serde::Serialize;

/// What the x axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum XAxis {
    /// Event index (as the official viewer).
    Events,
    /// Microseconds since the first event (`time_us`, PyTorch 2.2+).
    Time,
}

#[derive(Debug, Clone, Copy)]
pub struct ViewOptions {
    pub x: XAxis,
    /// Allocations drawn individually.
    pub top: usize,
    /// Most buckets (x resolution).
    pub buckets: usize,
    /// Part of the x axis to show, in axis units (events, or µs since the first event).
    pub window: Option<(f64, f64)>,
}

impl Default for ViewOptions {
    fn default() -> Self {
        ViewOptions {
            x: XAxis::Events,
            top: 40,
            buckets: 1000,
            window: None,
        }
    }
}

/// One column of the chart.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Bucket {
    /// Axis range covered.
    pub x0: f64,
    pub x1: f64,
    /// The state shown: after this event (None: before the first event).
    pub event: Option<u32>,
    /// Allocated bytes at that state: the maximum within the bucket.
    pub allocated_bytes: u64,
    /// Highest reserved bytes within the bucket.
    pub reserved_bytes: i64,
    /// Active bytes at the shown state: allocations in block bytes (rounded to 512),
    /// pending frees included.
    pub active_bytes: u64,
    /// Free memory cached inside segments at the shown state: reserved minus active.
    pub cached_free_bytes: u64,
    /// Allocated bytes not in a band.
    pub rest_bytes: u64,
}

/// One allocation drawn individually.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Band {
    pub label: String,
    pub size_bytes: u64,
    pub origin: Origin,
    pub alloc_event: Option<u32>,
    pub free_event: Option<u32>,
    pub alloc_time_us: Option<i64>,
    pub free_time_us: Option<i64>,
    pub stream: u64,
    pub pool_id: Option<(i64, i64)>,
    pub frames: Vec<String>,
    /// The frame the colour and legend use.
    pub headline: Option<String>,
    /// Runs of consecutive buckets where it is alive: (first bucket, bottom bytes per
    /// bucket of the run).
    pub runs: Vec<(usize, Vec<u64>)>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Marker {
    /// "oom" or "snapshot".
    pub kind: &'static str,
    pub x: f64,
    pub event: u32,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AnnotationSpan {
    pub name: String,
    pub x0: f64,
    pub x1: f64,
}

/// A device reading placed on the x axis.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DevicePoint {
    pub x: f64,
    pub used_bytes: u64,
    /// This process's use minus PyTorch's reserved memory.
    pub outside_allocator_bytes: Option<i64>,
    /// Device use minus this process's use (other processes, driver).
    pub other_bytes: Option<i64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimelineView {
    pub x_axis: XAxis,
    pub x_min: f64,
    pub x_max: f64,
    /// Time of the first event, the zero of a time axis.
    pub time_origin_us: Option<i64>,
    pub buckets: Vec<Bucket>,
    pub bands: Vec<Band>,
    /// Allocations merged into the rest band.
    pub rest_count: usize,
    pub markers: Vec<Marker>,
    pub annotations: Vec<AnnotationSpan>,
    /// Annotation spans left out to keep the chart readable.
    pub annotations_dropped: usize,
    /// Device readings (nvidia-smi or NVML), when given; at most one per bucket, the
    /// highest use of each kept.
    pub device: Vec<DevicePoint>,
    pub max_bytes: u64,
}

const MAX_ANNOTATIONS: usize = 300;

/// Axis position of the state after event `i` (None: the initial state).
fn position(tl: &DeviceTimeline, x: XAxis, origin: i64, i: Option<usize>) -> f64 {
    match x {
        XAxis::Events => i.map_or(0.0, |i| (i + 1) as f64),
        XAxis::Time => {
            let t = match i {
                None => origin,
                // Events without a time keep the time of the event before them.
                Some(i) => (0..=i)
                    .rev()
                    .find_map(|j| tl.time_us(j).filter(|&t| t > 0))
                    .unwrap_or(origin),
            };
            (t - origin) as f64
        }
    }
}

fn stack_order(l: &Lifetime) -> (i64, u64, u32) {
    (l.alloc.map_or(-1, |e| e.index() as i64), l.addr, l.version)
}

/// Builds the chart content for one device.
pub fn build_view(
    snap: &Snapshot,
    tl: &DeviceTimeline,
    options: ViewOptions,
) -> Result<TimelineView, String> {
    let n = tl.events();
    let origin = (0..n).find_map(|i| tl.time_us(i).filter(|&t| t > 0));
    if options.x == XAxis::Time && origin.is_none() {
        return Err("this trace has no time_us (PyTorch before 2.2); use --x events".into());
    }
    let origin_us = origin.unwrap_or(0);
    // States: None (initial) then each event.
    let states: Vec<Option<usize>> = std::iter::once(None).chain((0..n).map(Some)).collect();
    let pos: Vec<f64> = states
        .iter()
        .map(|&s| position(tl, options.x, origin_us, s))
        .collect();
    let (full_min, full_max) = (pos[0], *pos.last().unwrap_or(&0.0));
    let (x_min, x_max) = match options.window {
        Some((a, b)) => (a.max(full_min), b.min(full_max.max(a))),
        None => (full_min, full_max),
    };
    if x_max < x_min {
        return Err(format!("window {x_min}..{x_max} is empty"));
    }
    let span = (x_max - x_min).max(1.0);
    let nb = options.buckets.max(1).min(states.len().max(1));
    // Representative state of each bucket: highest allocated (first on ties); empty
    // buckets hold the state before them.
    let mut rep: Vec<Option<usize>> = vec![None; nb];
    let mut res: Vec<Option<i64>> = vec![None; nb];
    let mut seen_before: Option<usize> = None;
    for (k, &p) in pos.iter().enumerate() {
        if p < x_min {
            seen_before = Some(k);
            continue;
        }
        if p > x_max {
            break;
        }
        let b = (((p - x_min) / span) * nb as f64)
            .floor()
            .min(nb as f64 - 1.0) as usize;
        let alloc = tl.requested_at(states[k]);
        if rep[b].is_none_or(|r| tl.requested_at(states[r]) < alloc) {
            rep[b] = Some(k);
        }
        let r = tl.reserved_at(states[k]);
        res[b] = Some(res[b].map_or(r, |m: i64| m.max(r)));
    }
    let mut last = seen_before.unwrap_or(0);
    for b in 0..nb {
        match rep[b] {
            Some(k) => last = k,
            None => {
                rep[b] = Some(last);
                res[b] = Some(tl.reserved_at(states[last]));
            }
        }
    }
    // The largest lifetimes that are alive somewhere in the window.
    let shown: Vec<usize> = rep.iter().map(|r| r.unwrap_or(0)).collect();
    // Shown states are in x order, so "alive in some shown state" is one binary search
    // over the state range the lifetime covers (state k = after event k - 1).
    let mut candidates: Vec<&Lifetime> = tl
        .lifetimes
        .iter()
        .filter(|l| {
            let start = l.alloc.map_or(0, |a| a.index() + 1);
            let end = l.free_completed.map_or(usize::MAX, |f| f.index() + 1);
            let first = shown.partition_point(|&k| k < start);
            shown.get(first).is_some_and(|&k| k < end)
        })
        .collect();
    let total_candidates = candidates.len();
    candidates.sort_by(|a, b| {
        b.size
            .cmp(&a.size)
            .then(stack_order(a).cmp(&stack_order(b)))
    });
    candidates.truncate(options.top);
    candidates.sort_by_key(|l| stack_order(l));
    let mut bands: Vec<Band> = candidates
        .iter()
        .map(|l| Band {
            label: l.label(),
            size_bytes: l.size,
            origin: l.origin,
            alloc_event: l.alloc.map(|e| e.index() as u32),
            free_event: l.free_completed.map(|e| e.index() as u32),
            alloc_time_us: l.alloc.and_then(|e| tl.time_us(e.index())),
            free_time_us: l.free_completed.and_then(|e| tl.time_us(e.index())),
            stream: tl.stream(l),
            pool_id: tl.pool_id(l),
            frames: user_frames(&snap.frames, l.stack(), 6),
            headline: headline_frame(&snap.frames, l.stack()),
            runs: Vec::new(),
        })
        .collect();
    let rep_states: Vec<Option<usize>> = shown.iter().map(|&k| states[k]).collect();
    let active = crate::timeline::allocated_at(tl, snap, &rep_states);
    let mut buckets = Vec::with_capacity(nb);
    for b in 0..nb {
        let k = shown[b];
        let state = states[k];
        let allocated = tl.requested_at(state);
        let mut stacked = 0u64;
        let mut bottoms: Vec<Option<u64>> = vec![None; bands.len()];
        for (j, l) in candidates.iter().enumerate() {
            if alive(l, state) {
                bottoms[j] = Some(stacked);
                stacked += l.size;
            }
        }
        let rest = allocated.saturating_sub(stacked);
        for (j, bottom) in bottoms.into_iter().enumerate() {
            if let Some(bottom) = bottom {
                let band = &mut bands[j];
                match band.runs.last_mut() {
                    Some((start, v)) if *start + v.len() == b => v.push(rest + bottom),
                    _ => band.runs.push((b, vec![rest + bottom])),
                }
            }
        }
        buckets.push(Bucket {
            x0: x_min + span * b as f64 / nb as f64,
            x1: x_min + span * (b + 1) as f64 / nb as f64,
            event: state.map(|i| i as u32),
            allocated_bytes: allocated,
            reserved_bytes: res[b].unwrap_or(0),
            active_bytes: active[b],
            cached_free_bytes: (tl.reserved_at(state) - active[b] as i64).max(0) as u64,
            rest_bytes: rest,
        });
    }
    let max_bytes = buckets
        .iter()
        .map(|b| b.allocated_bytes.max(b.reserved_bytes.max(0) as u64))
        .max()
        .unwrap_or(0);
    let markers = markers(snap, tl, options.x, origin_us, x_min, x_max);
    let (annotations, annotations_dropped) =
        annotations(snap, tl, options.x, origin_us, x_min, x_max);
    Ok(TimelineView {
        x_axis: options.x,
        x_min,
        x_max,
        time_origin_us: origin,
        buckets,
        rest_count: total_candidates - candidates.len(),
        bands,
        markers,
        annotations,
        annotations_dropped,
        device: Vec::new(),
        max_bytes,
    })
}

/// Places device readings on the view's x axis (keeping the highest reading of each
/// bucket) and widens the y range to hold them.
pub fn add_device_readings(view: &mut TimelineView, rows: &[crate::analysis::reconcile::OverTime]) {
    let origin = view.time_origin_us.unwrap_or(0);
    let span = (view.x_max - view.x_min).max(1.0);
    let nb = view.buckets.len().max(1);
    let mut best: Vec<Option<DevicePoint>> = vec![None; nb];
    for r in rows {
        let x = match view.x_axis {
            XAxis::Events => r.event.map_or(0.0, |e| e as f64 + 1.0),
            XAxis::Time => (r.time_us - origin) as f64,
        };
        if x < view.x_min || x > view.x_max {
            continue;
        }
        let b = (((x - view.x_min) / span) * nb as f64)
            .floor()
            .min(nb as f64 - 1.0) as usize;
        let point = DevicePoint {
            x,
            used_bytes: r.device_used_bytes,
            outside_allocator_bytes: r.process_used_bytes.map(|p| p as i64 - r.reserved_bytes),
            other_bytes: r
                .process_used_bytes
                .map(|p| r.device_used_bytes as i64 - p as i64),
        };
        if best[b]
            .as_ref()
            .is_none_or(|p| p.used_bytes < point.used_bytes)
        {
            best[b] = Some(point);
        }
    }
    view.device = best.into_iter().flatten().collect();
    let top = view.device.iter().map(|p| p.used_bytes).max().unwrap_or(0);
    view.max_bytes = view.max_bytes.max(top);
}

fn alive(l: &Lifetime, state: Option<usize>) -> bool {
    match state {
        Some(i) => l.alive_after(i),
        None => l.alloc.is_none(),
    }
}

fn markers(
    snap: &Snapshot,
    tl: &DeviceTimeline,
    x: XAxis,
    origin: i64,
    x_min: f64,
    x_max: f64,
) -> Vec<Marker> {
    let Some(trace) = snap.trace(tl.device) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for i in 0..trace.len() {
        let kind = match trace.action(i) {
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            _ => continue,
        };
        let p = position(tl, x, origin, Some(i));
        if p < x_min || p > x_max {
            continue;
        }
        let e = trace.get(i);
        let text = if kind == "oom" {
            format!(
                "OOM at event {i}: requested {}, device free {}",
                crate::units::bytes(e.size),
                crate::units::bytes(e.addr)
            )
        } else {
            format!("snapshot taken (event {i})")
        };
        out.push(Marker {
            kind,
            x: p,
            event: i as u32,
            text,
        });
    }
    out
}

/// START/END pairs of `external_annotations` of this device, as spans on the axis.
fn annotations(
    snap: &Snapshot,
    tl: &DeviceTimeline,
    x: XAxis,
    origin: i64,
    x_min: f64,
    x_max: f64,
) -> (Vec<AnnotationSpan>, usize) {
    // Event position of each annotation time, in one sweep over the events (times are
    // non-decreasing per device; events without a time are skipped).
    let mut times: Vec<i64> = snap
        .external_annotations
        .iter()
        .filter(|a| a.device == tl.device)
        .map(|a| a.time_us)
        .collect();
    times.sort_unstable();
    times.dedup();
    let mut event_pos: Vec<f64> = Vec::with_capacity(times.len());
    let mut last: Option<usize> = None;
    let mut i = 0;
    for &t in &times {
        while i < tl.events() {
            match tl.time_us(i) {
                Some(e) if e > 0 && e > t => break,
                Some(e) if e > 0 => last = Some(i),
                _ => {}
            }
            i += 1;
        }
        event_pos.push(last.map_or(0.0, |i| (i + 1) as f64));
    }
    let has_times = tl.has_times();
    let to_x = |t: i64| match x {
        XAxis::Time => Some((t - origin) as f64),
        XAxis::Events if has_times => times.binary_search(&t).ok().map(|k| event_pos[k]),
        XAxis::Events => None,
    };
    let mut open: Vec<(&str, i64)> = Vec::new();
    let mut spans = Vec::new();
    let mut list: Vec<_> = snap
        .external_annotations
        .iter()
        .filter(|a| a.device == tl.device)
        .collect();
    list.sort_by_key(|a| a.time_us);
    for a in list {
        match a.stage.as_str() {
            "START" => open.push((&a.name, a.time_us)),
            "END" => {
                if let Some(p) = open.iter().rposition(|(n, _)| *n == a.name) {
                    let (name, start) = open.remove(p);
                    if let (Some(x0), Some(x1)) = (to_x(start), to_x(a.time_us))
                        && x1 >= x_min
                        && x0 <= x_max
                    {
                        spans.push(AnnotationSpan {
                            name: name.to_string(),
                            x0: x0.max(x_min),
                            x1: x1.min(x_max),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    // Keep the widest spans when there are too many to read.
    let dropped = spans.len().saturating_sub(MAX_ANNOTATIONS);
    if dropped > 0 {
        spans.sort_by(|a, b| {
            (b.x1 - b.x0)
                .total_cmp(&(a.x1 - a.x0))
                .then(a.x0.total_cmp(&b.x0))
        });
        spans.truncate(MAX_ANNOTATIONS);
    }
    spans.sort_by(|a, b| a.x0.total_cmp(&b.x0).then(a.name.cmp(&b.name)));
    (spans, dropped)
}

/// Stable colour key of a band: its headline frame (bands without a stack share one).
pub fn color_key(band: &Band) -> &str {
    band.headline.as_deref().unwrap_or("(no stack recorded)")
}
