//! What the timeline chart shows, at a bounded level of detail: the x range cut into
//! buckets, each represented by its state of highest requested memory (so every peak
//! survives downsampling), the memory stacked in bands by group (call site, category,
//! stack, file) or by allocation, whatever is not in a band merged into one rest band,
//! the reserved and allocated lines, the peak, OOM and snapshot markers and external
//! annotations. Coordinates are left to the renderer.
//!
//! One replay pass and nothing per event: it picks each bucket's state as it leaves the
//! bucket and adds every allocation to the buckets whose state it is alive in.

use crate::analysis::HOW_TO_RECORD;
use crate::analysis::kinds::attribution::{Attributor, GroupBy, GroupKind};
use crate::analysis::kinds::frames::user_frames;
use crate::analysis::moments::group_series::{GroupSeries, GroupValues};
use crate::model::{Action, DeviceTrace, Snapshot};
use crate::timeline::coverage::NoTimeline;
use crate::timeline::replay::{Aggregator, DeviceReplay, End, Peak, Peaks, PoolId, Running, Start};
use crate::timeline::{Lifetime, Origin};
use serde::Serialize;
use std::collections::HashMap;

/// What the x axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum XAxis {
    /// Event index (as the official viewer).
    Events,
    /// Microseconds since the first event (`time_us`, PyTorch 2.2+).
    Time,
}

/// What a band is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BandBy {
    Group(GroupBy),
    /// One band per allocation (the official viewer's picture).
    Allocation,
}

#[derive(Debug, Clone, Copy)]
pub struct ViewOptions {
    pub x: XAxis,
    pub by: BandBy,
    /// Bands drawn (more are added, up to three times as many, while the rest band holds
    /// over a tenth of the peak).
    pub top: usize,
    /// Most buckets (x resolution).
    pub buckets: usize,
    /// Part of the x axis to show, in axis units (events, or µs since the first event).
    pub window: Option<(f64, f64)>,
}

impl ViewOptions {
    /// A view of `top` bands (1 to 500) over the whole axis; fewer columns when many bands
    /// are drawn keeps the chart small.
    pub fn new(x: XAxis, by: BandBy, top: usize) -> Self {
        let top = top.clamp(1, 500);
        ViewOptions {
            x,
            by,
            top,
            buckets: (60_000 / top).clamp(200, 1000),
            window: None,
        }
    }
}

impl Default for ViewOptions {
    fn default() -> Self {
        ViewOptions {
            x: XAxis::Events,
            by: BandBy::Group(GroupBy::Callsite),
            top: 20,
            buckets: 1000,
            window: None,
        }
    }
}

/// What a zoom panel is drawn around.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ZoomAround {
    Oom,
    Peak,
}

/// A part of the axis to draw again, wider: the moment that matters, when the whole
/// chart leaves it a few pixels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Zoom {
    pub around: ZoomAround,
    /// The range, in axis units (events, or µs since the first event).
    pub x0: f64,
    pub x1: f64,
}

/// Share of the axis a zoom panel shows.
const ZOOM_SHARE: f64 = 0.03;
/// A peak this close to either end of the axis (as a share of it) gets a zoom panel.
const ZOOM_EDGE: f64 = 0.05;

/// The zoom a chart of the whole trace needs: around the first OOM always (the moment
/// an OOM post-mortem is about), else around the peak when it sits at either end of the
/// axis, where the lead-up to it is squeezed. The range is 3% of the axis (at least
/// 40 events), the moment at four fifths of it so the lead-up shows, inside the axis.
/// None for a chart of a window (its range was chosen) or an axis too short to gain.
pub fn zoom_window(view: &TimelineView, window_given: bool) -> Option<Zoom> {
    if window_given {
        return None;
    }
    let oom = view.markers.iter().find(|m| m.kind == MarkerKind::Oom);
    zoom_of(
        view.x_axis,
        (view.x_min, view.x_max),
        oom.map(|m| m.x),
        view.peak.as_ref().map(|p| p.x),
    )
}

/// The zoom [`zoom_window`] will most likely give a view of the whole trace, known from
/// the axis before the view is built, so that the view and its zoom can share one replay
/// ([`build_view_and_zoom`]): around the first OOM (where it falls needs no replay), else
/// around the peak where the axis's estimate of it ([`ChartAxis::peak_estimate`]) sits at
/// either end. An estimate only: the caller compares it with the view's own
/// [`zoom_window`] and draws the zoom again where they differ. None for a window.
pub fn zoom_ahead(axis: &ChartAxis, options: ViewOptions) -> Option<Zoom> {
    if options.window.is_some() {
        return None;
    }
    let (x_min, x_max) = x_range(axis.full_max, options).ok()?;
    let oom = axis.markers.iter().find(|m| m.kind == MarkerKind::Oom);
    let grid = Grid::of(x_min, x_max, axis.events, options);
    let (x0, x1) = grid.range_of(grid.bucket_of(axis.peak_estimate));
    zoom_of(
        options.x,
        (x_min, x_max),
        oom.map(|m| m.x),
        Some((x0 + x1) / 2.0),
    )
}

/// The zoom of an axis: around the first OOM (at `oom`), else around the peak mark
/// (at `peak`) when it sits at either end of the axis.
fn zoom_of(
    x_axis: XAxis,
    (x_min, x_max): (f64, f64),
    oom: Option<f64>,
    peak: Option<f64>,
) -> Option<Zoom> {
    let span = x_max - x_min;
    let least = match x_axis {
        XAxis::Events => 40.0,
        XAxis::Time => 0.0,
    };
    let width = (span * ZOOM_SHARE).max(least);
    if span <= 0.0 || width * 4.0 > span {
        return None;
    }
    let (around, x) = match (oom, peak) {
        (Some(x), _) => (ZoomAround::Oom, x),
        (None, Some(x)) => {
            let at = (x - x_min) / span;
            if at > ZOOM_EDGE && at < 1.0 - ZOOM_EDGE {
                return None;
            }
            (ZoomAround::Peak, x)
        }
        (None, None) => return None,
    };
    let x0 = (x - width * 0.8).clamp(x_min, x_max - width);
    Some(Zoom {
        around,
        x0,
        x1: x0 + width,
    })
}

/// Why no view can be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ViewError {
    #[error(
        "{0}: nothing to draw, only the final state is known (see `vramlens segments`); {how}",
        how = HOW_TO_RECORD
    )]
    NoTrace(NoTimeline),
    #[error("this trace has no time_us (PyTorch before 2.2); use --x events")]
    NoTimes,
    /// A window reaching past either end of the trace (numbers in the units of the
    /// command line: events, or milliseconds since the first event).
    #[error(
        "--window {}: the trace spans {}..{} on this axis{unit}; give a window inside it",
        window_text(*start, *end),
        axis_number(*min),
        axis_number(*max)
    )]
    WindowOutside {
        start: f64,
        end: f64,
        min: f64,
        max: f64,
        unit: &'static str,
    },
}

/// One column of the chart.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Bucket {
    /// Axis range covered.
    pub x0: f64,
    pub x1: f64,
    /// The state shown: after this event (None: before the first event).
    pub event: Option<u32>,
    /// Requested bytes at that state: the maximum within the bucket.
    pub requested_bytes: u64,
    /// Highest reserved bytes within the bucket.
    pub reserved_bytes: i64,
    /// Allocated block bytes at the shown state (pending frees included).
    pub allocated_bytes: u64,
    /// Free memory cached inside segments at the shown state: reserved minus allocated.
    pub cached_free_bytes: u64,
    /// Requested bytes not in a band.
    pub rest_bytes: u64,
}

/// Details of a band that is one allocation.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AllocationBand {
    pub label: String,
    pub origin: Origin,
    pub alloc_event: Option<u32>,
    pub free_event: Option<u32>,
    pub alloc_time_us: Option<i64>,
    pub free_time_us: Option<i64>,
    pub stream: u64,
    pub pool_id: Option<(i64, i64)>,
}

/// One band: a group of allocations, or one allocation.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Band {
    /// The group's name (see `top`), or the allocation's label.
    pub name: String,
    /// The group's kind, or [`GroupKind::Allocation`].
    pub kind: GroupKind,
    /// The most the band holds in one bucket.
    pub max_bytes: u64,
    /// Allocations that are alive in at least one shown state.
    pub count: usize,
    /// Category of its largest allocation.
    pub category: String,
    /// Python frames of its largest allocation, innermost first.
    pub frames: Vec<String>,
    /// The stack of its largest allocation, for a listing of every frame.
    #[serde(skip)]
    pub stack: Option<crate::model::StackId>,
    pub allocation: Option<AllocationBand>,
    /// Runs of consecutive buckets where it holds bytes: (first bucket, per bucket
    /// (bottom, height) in bytes).
    pub runs: Vec<(usize, Vec<(u64, u64)>)>,
}

impl Band {
    /// Stacks `height` bytes from `bottom` in bucket `b`, extending the last run when
    /// it ends just before `b`.
    fn stack_at(&mut self, b: usize, bottom: u64, height: u64) {
        match self.runs.last_mut() {
            Some((first, run)) if *first + run.len() == b => run.push((bottom, height)),
            _ => self.runs.push((b, vec![(bottom, height)])),
        }
    }
}

/// What kind of event a marker shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkerKind {
    Oom,
    Snapshot,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Marker {
    pub kind: MarkerKind,
    pub x: f64,
    pub event: u32,
    /// For an OOM: the request and what the device had free.
    pub requested_bytes: u64,
    pub device_free_bytes: u64,
}

/// The highest requested memory in the window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PeakMark {
    pub x: f64,
    pub bytes: u64,
    pub event: Option<u32>,
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
    /// PyTorch's reserved memory at the reading.
    pub reserved_bytes: i64,
    /// This process's use minus PyTorch's reserved memory.
    pub outside_allocator_bytes: Option<i64>,
    /// Device use minus this process's use (other processes, driver).
    pub other_bytes: Option<i64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimelineView {
    /// How the file's times read (for the tooltips).
    #[serde(skip)]
    pub clock: crate::units::Clock,
    pub x_axis: XAxis,
    pub by: BandBy,
    pub x_min: f64,
    pub x_max: f64,
    /// Time of the first event, the zero of a time axis.
    pub time_origin_us: Option<i64>,
    pub buckets: Vec<Bucket>,
    /// Bottom to top (the rest band lies under them).
    pub bands: Vec<Band>,
    /// Groups (or allocations) merged into the rest band.
    pub rest_groups: usize,
    pub peak: Option<PeakMark>,
    pub markers: Vec<Marker>,
    pub annotations: Vec<AnnotationSpan>,
    /// Annotation spans left out to keep the chart readable.
    pub annotations_dropped: usize,
    /// Device readings (nvidia-smi or NVML), when given; at most one per bucket, the
    /// highest use of each kept.
    pub device: Vec<DevicePoint>,
    pub max_bytes: u64,
    /// The exact peaks of the whole trace (the buckets keep each column's highest state).
    pub requested_peak: Peak,
    pub reserved_peak: Peak,
    /// False for a profiler trace without `Total Reserved`: the reserved figures stand
    /// for nothing recorded and are not drawn.
    pub reserved_recorded: bool,
}

const MAX_ANNOTATIONS: usize = 300;

/// Axis positions of states as the replay runs: state 0 is before the first event,
/// state i + 1 after event i. Time never goes backwards on the axis (a time earlier than
/// one seen before keeps the later one), and events without a time keep the last.
struct Axis<'t> {
    x: XAxis,
    trace: &'t DeviceTrace,
    origin: i64,
    latest: i64,
}

impl Axis<'_> {
    fn after(&mut self, i: usize) -> f64 {
        match self.x {
            XAxis::Events => (i + 1) as f64,
            XAxis::Time => {
                if let Some(t) = self.trace.stamped_time(i) {
                    self.latest = self.latest.max(t);
                }
                self.latest.saturating_sub(self.origin) as f64
            }
        }
    }
}

/// What the charts of a device share, known from the trace alone before any replay: the
/// axis's origin and extent, its markers, and where the requested bytes first peak (an
/// estimate: the frees counted at their own recorded size). One walk over the trace for
/// every view drawn on the axis.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartAxis {
    pub x: XAxis,
    /// The time of the first event with one (the zero of a time axis).
    pub origin: Option<i64>,
    /// The position of the last state: the end of the whole axis.
    pub full_max: f64,
    /// Every OOM and snapshot marker, in event order.
    pub markers: Vec<Marker>,
    /// The position of the first state with the most requested bytes.
    pub peak_estimate: f64,
    /// Events in the trace.
    pub events: usize,
}

/// The axis of `r`'s charts along `x`, or why the device has no chart (no trace; a time
/// axis without times).
pub fn chart_axis(r: &DeviceReplay, x: XAxis) -> Result<ChartAxis, ViewError> {
    if let Some(none) = r.no_timeline() {
        return Err(ViewError::NoTrace(none));
    }
    let trace = r.trace;
    let origin = trace.first_stamped_time();
    if x == XAxis::Time && origin.is_none() {
        return Err(ViewError::NoTimes);
    }
    let origin_us = origin.unwrap_or(0);
    let mut axis = Axis {
        x,
        trace,
        origin: origin_us,
        latest: origin_us,
    };
    let mut markers = Vec::new();
    let (mut requested, mut most, mut peak_at) = (0i64, 0i64, 0.0);
    let mut full_max: f64 = 0.0;
    for i in 0..trace.len() {
        let p = axis.after(i);
        full_max = full_max.max(p);
        let kind = match trace.action(i) {
            Action::Alloc => {
                requested += trace.size(i) as i64;
                if requested > most {
                    (most, peak_at) = (requested, p);
                }
                continue;
            }
            Action::FreeCompleted => {
                requested -= trace.size(i) as i64;
                continue;
            }
            Action::Oom => MarkerKind::Oom,
            Action::Snapshot => MarkerKind::Snapshot,
            _ => continue,
        };
        let e = trace.get(i);
        markers.push(Marker {
            kind,
            x: p,
            event: i as u32,
            requested_bytes: e.size,
            device_free_bytes: e.addr,
        });
    }
    Ok(ChartAxis {
        x,
        origin,
        full_max,
        markers,
        peak_estimate: peak_at,
        events: trace.len(),
    })
}

impl ChartAxis {
    /// The markers between `x_min` and `x_max` (inclusive).
    fn markers_in(&self, x_min: f64, x_max: f64) -> Vec<Marker> {
        self.markers
            .iter()
            .filter(|m| m.x >= x_min && m.x <= x_max)
            .cloned()
            .collect()
    }
}

/// A state of the replay with its running totals.
#[derive(Clone, Copy, Debug, Default)]
struct State {
    /// `0` before the first event, `i + 1` after event `i`.
    k: usize,
    run: Running,
}

/// The bucket whose shown state can still change.
struct OpenBucket {
    index: usize,
    /// Its state of highest requested bytes so far (the first of equals).
    best: State,
    /// Its highest reserved bytes so far.
    reserved: i64,
    last: State,
}

/// What a bucket shows, once its range is over.
struct Shown {
    state: State,
    reserved: i64,
}

/// Where a chart's bands take allocations: each with the range of buckets whose shown
/// state it is alive in, and its order among the allocations of the pass.
trait Bands {
    fn add(&mut self, l: &Lifetime, order: u64, lo: usize, hi: usize);
    fn tables(&mut self, end: &End);
    fn wants_versions(&self) -> bool;
}

impl Bands for GroupSeries<'_> {
    fn add(&mut self, l: &Lifetime, order: u64, lo: usize, hi: usize) {
        self.add_in(l, order, lo, hi);
    }
    fn tables(&mut self, end: &End) {
        self.streams = end.streams.to_vec();
        self.pools = end.pools.to_vec();
    }
    fn wants_versions(&self) -> bool {
        false
    }
}

/// The chart in one pass. Each bucket shows its state of highest requested bytes, known
/// once the replay leaves the bucket; an allocation is alive in a shown state when it was
/// made at or before it and freed after it. So an allocation freed while it is alive in
/// the open bucket's best state so far waits: if a later state of the bucket becomes the
/// best, it is not alive there (it was freed before), and if the bucket ends first, it is.
/// Every other allocation is placed when it is freed. The waiting ones are at most the
/// allocations alive in one state.
struct ChartPass<'t, B> {
    axis: Axis<'t>,
    grid: Grid,
    x_max: f64,
    /// Buckets whose range is over, in order.
    shown: Vec<Shown>,
    /// The shown states, as indices (for the ranges of allocations).
    shown_k: Vec<usize>,
    open: Option<OpenBucket>,
    /// The last state before the window, then the last state of the last bucket closed:
    /// what a bucket without states of its own shows.
    carry: State,
    /// Freed allocations alive in the open bucket's best state, with their order.
    waiting: Vec<(Lifetime, u64)>,
    /// The allocation freed by the current event, placed once its state is.
    freed_now: Option<(Lifetime, u64)>,
    /// Events in the trace (the orders of allocations alive at the end follow them).
    events: u64,
    bands: B,
}

impl<'t, B: Bands> ChartPass<'t, B> {
    /// A pass over the buckets of `grid`, which end at `x_max`, of a trace of `events`
    /// events, its state 0 placed.
    fn new(axis: Axis<'t>, grid: Grid, x_max: f64, events: usize, bands: B) -> Self {
        let mut pass = ChartPass {
            axis,
            grid,
            x_max,
            shown: Vec::with_capacity(grid.nb),
            shown_k: Vec::with_capacity(grid.nb),
            open: None,
            carry: State::default(),
            waiting: Vec::new(),
            freed_now: None,
            events: events as u64,
            bands,
        };
        pass.state(State::default(), 0.0);
        pass
    }

    /// Places an allocation in the closed buckets up to `hi` whose shown state it is
    /// alive in.
    fn place(&mut self, l: &Lifetime, order: u64, hi: usize) {
        let from = l.alloc.map_or(0, |a| a.index() + 1);
        let lo = self.first_shown_from(from, hi);
        self.bands.add(l, order, lo, hi);
    }

    /// The first of the closed buckets up to `hi` whose shown state is state `from` or a
    /// later one. On an axis of events, state `from` lies at position `from`: that
    /// position's bucket is the answer or the one after it (a bucket's shown state may
    /// come before the state), and the two neighbours of an answer prove it, since the
    /// shown states only go forward. Elsewhere, or when a guess is not proved, a search.
    fn first_shown_from(&self, from: usize, hi: usize) -> usize {
        let shown = &self.shown_k[..hi];
        if self.axis.x == XAxis::Events {
            let is_first = |c: usize| {
                c <= hi && (c == 0 || shown[c - 1] < from) && (c == hi || shown[c] >= from)
            };
            let guess = self.grid.bucket_of(from as f64).min(hi);
            if let Some(c) = [guess, guess + 1].into_iter().find(|&c| is_first(c)) {
                debug_assert_eq!(c, shown.partition_point(|&k| k < from));
                return c;
            }
        }
        shown.partition_point(|&k| k < from)
    }

    /// Places the waiting allocations in the buckets closed so far.
    fn place_waiting(&mut self) {
        let mut waiting = std::mem::take(&mut self.waiting);
        let hi = self.shown_k.len();
        for (l, order) in &waiting {
            self.place(l, *order, hi);
        }
        waiting.clear();
        self.waiting = waiting;
    }

    /// Closes buckets up to `until` (exclusive): the open one with its best state, the
    /// ones without states with the carried state.
    fn close_until(&mut self, until: usize) {
        if let Some(open) = self.open.take() {
            self.shown.push(Shown {
                state: open.best,
                reserved: open.reserved,
            });
            self.shown_k.push(open.best.k);
            self.carry = open.last;
            self.place_waiting();
        }
        while self.shown.len() < until {
            self.shown.push(Shown {
                state: self.carry,
                reserved: self.carry.run.reserved,
            });
            self.shown_k.push(self.carry.k);
        }
    }

    fn state(&mut self, state: State, p: f64) {
        if p < self.grid.x_min {
            self.carry = state;
            return;
        }
        if p > self.x_max {
            self.close_until(self.grid.nb);
            return;
        }
        let b = self.grid.bucket_of(p);
        match &mut self.open {
            Some(open) if open.index == b => {
                let new_best = state.run.requested > open.best.run.requested;
                if new_best {
                    open.best = state;
                }
                open.reserved = open.reserved.max(state.run.reserved);
                open.last = state;
                if new_best {
                    // Freed before this state: not alive in the bucket's shown state.
                    self.place_waiting();
                }
            }
            _ => {
                self.close_until(b);
                self.open = Some(OpenBucket {
                    index: b,
                    best: state,
                    reserved: state.run.reserved,
                    last: state,
                });
            }
        }
    }

    /// An allocation freed by event `i`, after the state that event made is placed:
    /// alive in states up to `i`.
    fn freed(&mut self, l: &Lifetime, order: u64, i: usize) {
        let from = l.alloc.map_or(0, |a| a.index() + 1);
        match &self.open {
            Some(open) if from <= open.best.k && open.best.k <= i => self.waiting.push((*l, order)),
            _ => {
                let hi = self.shown_k.len();
                self.place(l, order, hi);
            }
        }
    }
}

impl<B: Bands> Aggregator for ChartPass<'_, B> {
    fn wants_versions(&self) -> bool {
        self.bands.wants_versions()
    }

    fn free_completed(&mut self, i: usize, l: &Lifetime, _run: &Running) {
        self.freed_now = Some((*l, i as u64));
    }

    fn event(&mut self, i: usize, _action: Action, run: &Running) {
        let p = self.axis.after(i);
        self.state(
            State {
                k: i + 1,
                run: *run,
            },
            p,
        );
        if let Some((l, order)) = self.freed_now.take() {
            self.freed(&l, order, i);
        }
    }

    fn finish(&mut self, end: &End) {
        self.close_until(self.grid.nb);
        for (n, l) in end.open.iter().chain(end.survivors).enumerate() {
            self.place(l, self.events + n as u64, self.grid.nb);
        }
        self.bands.tables(end);
    }
}

/// The bands of a chart once its pass is over.
enum Filled<'a> {
    Groups(GroupSeries<'a>),
    Largest(LargestAllocations),
}

/// The largest allocations alive in the shown states (one band per allocation).
struct LargestAllocations {
    /// the candidates, largest first (bounded), with their bucket ranges
    allocations: Vec<(Lifetime, usize, usize)>,
    limit: usize,
    /// allocations alive in at least one shown state
    alive: usize,
    streams: Vec<u64>,
    pools: Vec<PoolId>,
}

impl Bands for LargestAllocations {
    fn add(&mut self, l: &Lifetime, _order: u64, lo: usize, hi: usize) {
        if lo >= hi {
            return;
        }
        self.alive += 1;
        let order = |l: &Lifetime| (std::cmp::Reverse(l.size), l.alloc, l.addr, l.version);
        let pos = self
            .allocations
            .partition_point(|(c, _, _)| order(c) < order(l));
        if pos < self.limit {
            self.allocations.insert(pos, (*l, lo, hi));
            self.allocations.truncate(self.limit);
        }
    }

    fn tables(&mut self, end: &End) {
        self.streams = end.streams.to_vec();
        self.pools = end.pools.to_vec();
    }

    fn wants_versions(&self) -> bool {
        true
    }
}

/// A window as the command line gave it, when its ends are whole numbers that a float
/// holds exactly, else at three decimals (an end past 2^53, such as u64::MAX, is shown as
/// `more than 9007199254740992`, not as a float's nearest integer).
fn window_text(start: f64, end: f64) -> String {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    let one = |v: f64| {
        if v.abs() > EXACT {
            format!("(more than {EXACT})")
        } else {
            axis_number(v)
        }
    };
    format!("{}..{}", one(start), one(end))
}

/// A position on the axis as the command line writes it: at most three decimals.
fn axis_number(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.to_string() }
}

/// A band with its bytes in each bucket, before its runs are stacked.
type BandValues = (Band, Vec<u64>);

/// The buckets' places on the axis: `nb` buckets from `x_min`, `span` wide in all.
#[derive(Clone, Copy)]
struct Grid {
    x_min: f64,
    span: f64,
    nb: usize,
}

impl Grid {
    /// The buckets of a view of `x_min..=x_max` on an axis of `events` events.
    fn of(x_min: f64, x_max: f64, events: usize, options: ViewOptions) -> Grid {
        Grid {
            x_min,
            span: (x_max - x_min).max(1.0),
            nb: options.buckets.clamp(1, events + 1),
        }
    }

    /// The bucket of position `p` (positions outside the range in the end buckets).
    fn bucket_of(&self, p: f64) -> usize {
        // The floor of a share not below 0 is its integer part, which `as` takes (and a
        // NaN, 0), without a call to the library's floor.
        let share = (((p - self.x_min) / self.span) * self.nb as f64).max(0.0);
        (share as usize).min(self.nb - 1)
    }

    /// The range of bucket `b` on the axis.
    fn range_of(&self, b: usize) -> (f64, f64) {
        let at = |b: usize| self.x_min + self.span * b as f64 / self.nb as f64;
        (at(b), at(b + 1))
    }
}

/// Builds the chart content for one device.
pub fn build_view(
    snap: &Snapshot,
    r: &DeviceReplay,
    attr: &Attributor,
    options: ViewOptions,
) -> Result<TimelineView, ViewError> {
    build_view_on(snap, r, attr, &chart_axis(r, options.x)?, options)
}

/// [`build_view`] on an axis already walked ([`chart_axis`], along `options.x`).
pub fn build_view_on(
    snap: &Snapshot,
    r: &DeviceReplay,
    attr: &Attributor,
    axis: &ChartAxis,
    options: ViewOptions,
) -> Result<TimelineView, ViewError> {
    let mut pass = prepare_view(r, attr, axis, options)?;
    let start = r.run(&mut pass);
    Ok(pass.finish(snap, r, attr, start))
}

/// A view and the view of its `zoom`'s window, from one replay.
pub fn build_view_and_zoom(
    snap: &Snapshot,
    r: &DeviceReplay,
    attr: &Attributor,
    axis: &ChartAxis,
    options: ViewOptions,
    zoom: Zoom,
) -> Result<(TimelineView, TimelineView), ViewError> {
    let mut main = prepare_view(r, attr, axis, options)?;
    let window = Some((zoom.x0, zoom.x1));
    let mut zoomed = prepare_view(r, attr, axis, ViewOptions { window, ..options })?;
    let start = r.run((&mut main, &mut zoomed));
    Ok((
        main.finish(snap, r, attr, start),
        zoomed.finish(snap, r, attr, start),
    ))
}

/// A view of `axis` (the whole trace, or the window `options` asks for) and, where it asks
/// for one ([`zoom_window`]), its zoom with the zoom's view. Where the zoom was known
/// ahead ([`zoom_ahead`]), as it most often is, both views come from one replay; else
/// the zoom's view takes a replay of its own. Either way the views are those that
/// [`build_view_on`] draws.
#[allow(clippy::type_complexity)]
pub fn build_view_zoomed(
    snap: &Snapshot,
    r: &DeviceReplay,
    attr: &Attributor,
    axis: &ChartAxis,
    options: ViewOptions,
) -> Result<(TimelineView, Option<(Zoom, TimelineView)>), ViewError> {
    let ahead = zoom_ahead(axis, options);
    let (view, zoomed) = match ahead {
        Some(z) => {
            let (view, zoomed) = build_view_and_zoom(snap, r, attr, axis, options, z)?;
            (view, Some(zoomed))
        }
        None => (build_view_on(snap, r, attr, axis, options)?, None),
    };
    let zoom = zoom_window(&view, options.window.is_some());
    let zoomed = match zoom {
        Some(z) if zoom == ahead => zoomed.map(|v| (z, v)),
        Some(z) => {
            let window = Some((z.x0, z.x1));
            Some((
                z,
                build_view_on(snap, r, attr, axis, ViewOptions { window, ..options })?,
            ))
        }
        None => None,
    };
    Ok((view, zoomed))
}

/// A view being built: what its one pass collects, to run in a replay beside other
/// aggregators ([`prepare_view`]), then [`ViewPass::finish`].
pub struct ViewPass<'t, 'a> {
    options: ViewOptions,
    origin: Option<i64>,
    grid: Grid,
    /// The OOM and snapshot markers of the view's range.
    markers: Vec<Marker>,
    x_max: f64,
    top: usize,
    /// Each bucket's shown state, every allocation into the buckets whose shown state it
    /// is alive in (by group, or the largest allocations), and the exact peaks.
    groups: Option<ChartPass<'t, GroupSeries<'a>>>,
    largest: Option<ChartPass<'t, LargestAllocations>>,
    peaks: Peaks,
}

crate::aggregator_of_fields!(ViewPass<'_, '_>, groups, largest, peaks);

/// The pass of a view of one device, or why the device has none.
/// `axis` is the device's ([`chart_axis`]) along `options.x`.
pub fn prepare_view<'t, 'a>(
    r: &DeviceReplay<'t>,
    attr: &'a Attributor<'a>,
    axis: &ChartAxis,
    options: ViewOptions,
) -> Result<ViewPass<'t, 'a>, ViewError> {
    debug_assert_eq!(axis.x, options.x, "a view on an axis of another kind");
    let trace = r.trace;
    let n = trace.len();
    let origin = axis.origin;
    let origin_us = origin.unwrap_or(0);
    let walk = || Axis {
        x: options.x,
        trace,
        origin: origin_us,
        latest: origin_us,
    };
    let (x_min, x_max) = x_range(axis.full_max, options)?;
    let grid = Grid::of(x_min, x_max, n, options);
    let top = options.top.max(1);
    let (groups, largest) = match options.by {
        BandBy::Group(by) => {
            let bands = GroupSeries::for_ranges(attr, by, grid.nb);
            (Some(ChartPass::new(walk(), grid, x_max, n, bands)), None)
        }
        BandBy::Allocation => {
            let bands = LargestAllocations {
                allocations: Vec::new(),
                limit: top,
                alive: 0,
                streams: Vec::new(),
                pools: Vec::new(),
            };
            (None, Some(ChartPass::new(walk(), grid, x_max, n, bands)))
        }
    };
    Ok(ViewPass {
        options,
        origin,
        grid,
        markers: axis.markers_in(x_min, x_max),
        x_max,
        top,
        groups,
        largest,
        peaks: Peaks::default(),
    })
}

impl ViewPass<'_, '_> {
    /// The view, from what the pass collected (`start`: the replay's start).
    pub fn finish(
        self,
        snap: &Snapshot,
        r: &DeviceReplay,
        attr: &Attributor,
        start: Start,
    ) -> TimelineView {
        let trace = r.trace;
        let options = self.options;
        let origin = self.origin;
        let origin_us = origin.unwrap_or(0);
        let Grid { x_min, nb, .. } = self.grid;
        let (x_max, top) = (self.x_max, self.top);
        let (shown, filled) = match (self.groups, self.largest) {
            (Some(pass), _) => (pass.shown, Filled::Groups(pass.bands)),
            (None, Some(pass)) => (pass.shown, Filled::Largest(pass.bands)),
            (None, None) => unreachable!("a view pass has its bands"),
        };
        let peaks = self.peaks.with_times(trace);
        let rel: Vec<i64> = shown.iter().map(|s| s.state.run.requested).collect();
        let requested: Vec<u64> = rel
            .iter()
            .map(|&v| (start.requested as i64 + v).max(0) as u64)
            .collect();
        // Per-band values per bucket.
        let (mut series, rest_groups) = match filled {
            Filled::Groups(groups) => group_bands(groups, attr, &requested, nb, top),
            Filled::Largest(largest) => allocation_bands(&largest, attr, trace, nb),
        };
        // Stack bottom to top in order of first appearance (earlier-allocated memory lower).
        series.sort_by_key(|(band, values)| {
            (
                values.iter().position(|&v| v > 0).unwrap_or(usize::MAX),
                std::cmp::Reverse(band.max_bytes),
            )
        });
        let buckets = stack_buckets(&mut series, &requested, &shown, start, self.grid);
        let markers = self.markers;
        let (annotations, annotations_dropped) =
            annotations(snap, r.device, trace, options.x, origin_us, x_min, x_max);
        TimelineView {
            clock: snap.clock(),
            x_axis: options.x,
            by: options.by,
            x_min,
            x_max,
            time_origin_us: origin,
            max_bytes: highest_bytes(&buckets),
            peak: peak_mark(&buckets),
            buckets,
            bands: series.into_iter().map(|(b, _)| b).collect(),
            rest_groups,
            markers,
            annotations,
            annotations_dropped,
            device: Vec::new(),
            requested_peak: peaks.requested,
            reserved_peak: peaks.reserved,
            reserved_recorded: !snap.features.reserved_unrecorded.contains(&r.device),
        }
    }
}

/// Stacks `zoom`'s bands in the order `main` stacks them (bands `main` lacks above them,
/// in their own order), so a panel drawn from a part of the axis shows the groups in the
/// layers of the whole chart: each bucket's bands restacked on its rest band.
pub fn stack_like(zoom: &mut TimelineView, main: &TimelineView) {
    let nb = zoom.buckets.len();
    let place = |b: &Band| {
        main.bands
            .iter()
            .position(|m| m.name == b.name && m.kind == b.kind)
            .unwrap_or(usize::MAX)
    };
    let mut bands: Vec<(Band, Vec<u64>)> = std::mem::take(&mut zoom.bands)
        .into_iter()
        .map(|mut band| {
            let mut heights = vec![0u64; nb];
            for (start, cells) in std::mem::take(&mut band.runs) {
                for (j, (_, h)) in cells.into_iter().enumerate() {
                    heights[start + j] = h;
                }
            }
            (band, heights)
        })
        .collect();
    // A stable sort: bands `main` lacks keep their order among themselves.
    bands.sort_by_key(|(band, _)| place(band));
    for (b, bucket) in zoom.buckets.iter().enumerate() {
        let mut bottom = bucket.rest_bytes;
        for (band, heights) in bands.iter_mut() {
            let v = heights[b];
            if v == 0 {
                continue;
            }
            band.stack_at(b, bottom, v);
            bottom += v;
        }
    }
    zoom.bands = bands.into_iter().map(|(band, _)| band).collect();
}

/// The x range drawn: the whole trace (state 0 at 0, the last state at the last event's
/// position, read with `axis`), or the window asked for. A window is inside the trace,
/// or refused: clipping it would draw another window than the one asked for.
fn x_range(full_max: f64, options: ViewOptions) -> Result<(f64, f64), ViewError> {
    // The command line gives time windows in milliseconds.
    let (unit, per_unit) = match options.x {
        XAxis::Events => (" (events)", 1.0),
        XAxis::Time => (" (milliseconds since the first event)", 1e3),
    };
    // The slack absorbs decimal milliseconds read as floats.
    let slack = 1e-9 * full_max.max(1.0);
    match options.window {
        Some((a, b))
            if a.is_finite() && b.is_finite() && a < b && a >= -slack && b <= full_max + slack =>
        {
            Ok((a.max(0.0), b.min(full_max)))
        }
        Some((start, end)) => Err(ViewError::WindowOutside {
            start: start / per_unit,
            end: end / per_unit,
            min: 0.0,
            max: full_max / per_unit,
            unit,
        }),
        None => Ok((0.0, full_max)),
    }
}

/// The bands of a chart by group: the `top` largest groups, more (up to three times as
/// many) while the rest holds over a tenth of the peak of `requested`; with how many
/// groups the rest band merges.
fn group_bands(
    groups: GroupSeries,
    attr: &Attributor,
    requested: &[u64],
    nb: usize,
    top: usize,
) -> (Vec<BandValues>, usize) {
    let mut all: Vec<(GroupValues, u64)> = groups
        .values()
        .into_iter()
        .map(|g| {
            let max = g.values.iter().copied().max().unwrap_or(0);
            (g, max)
        })
        .filter(|(_, max)| *max > 0)
        .collect();
    all.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| attr.name(&a.0.key).cmp(&attr.name(&b.0.key)))
    });
    // The largest groups; more while the rest holds over a tenth of the peak.
    let peak = requested.iter().copied().max().unwrap_or(0);
    let mut keep = top.min(all.len());
    let rest_max = |keep: usize| -> u64 {
        (0..nb)
            .map(|b| {
                let shown: u64 = all[..keep].iter().map(|(g, _)| g.values[b]).sum();
                requested[b].saturating_sub(shown)
            })
            .max()
            .unwrap_or(0)
    };
    while keep < all.len() && keep < 3 * top && rest_max(keep) * 10 > peak {
        keep += 1;
    }
    let rest_groups = all.len() - keep;
    all.truncate(keep);
    let shown = all
        .into_iter()
        .map(|(g, max)| {
            let key = g.key;
            let largest = &g.largest;
            (
                Band {
                    name: attr.name(&key),
                    kind: Attributor::kind(&key),
                    max_bytes: max,
                    count: g.count,
                    category: attr.categories[g.main_category as usize].clone(),
                    frames: user_frames(attr.frames(), Attributor::allocation_stack(largest), 8),
                    stack: Attributor::allocation_stack(largest),
                    allocation: None,
                    runs: Vec::new(),
                },
                g.values,
            )
        })
        .collect();
    (shown, rest_groups)
}

/// The bands of a chart by allocation: one per allocation kept, its size in the buckets
/// it is alive in; with how many other allocations were alive in a shown state.
fn allocation_bands(
    largest: &LargestAllocations,
    attr: &Attributor,
    trace: &DeviceTrace,
    nb: usize,
) -> (Vec<BandValues>, usize) {
    let shown: Vec<BandValues> = largest
        .allocations
        .iter()
        .map(|(l, lo, hi)| {
            let mut values = vec![0u64; nb];
            for v in &mut values[*lo..*hi] {
                *v = l.size;
            }
            let time = |e: Option<crate::timeline::EventIdx>| {
                e.and_then(|e| trace.stamped_time(e.index()))
            };
            (
                Band {
                    name: l.label(),
                    kind: GroupKind::Allocation,
                    max_bytes: l.size,
                    count: 1,
                    category: attr.categories[attr.category(l) as usize].clone(),
                    frames: user_frames(attr.frames(), Attributor::allocation_stack(l), 8),
                    stack: Attributor::allocation_stack(l),
                    allocation: Some(AllocationBand {
                        label: l.label(),
                        origin: l.origin,
                        alloc_event: l.alloc.map(|e| e.index() as u32),
                        free_event: l.free_completed.map(|e| e.index() as u32),
                        alloc_time_us: time(l.alloc),
                        free_time_us: time(l.free_completed),
                        stream: largest.streams.get(l.stream as usize).copied().unwrap_or(0),
                        pool_id: largest.pools.get(l.pool as usize).copied().flatten(),
                    }),
                    runs: Vec::new(),
                },
                values,
            )
        })
        .collect();
    let rest = largest.alive - shown.len();
    (shown, rest)
}

/// The columns: each bucket's range, shown state and totals, the rest band at the bottom
/// and the bands' runs stacked on it in the order of `series`.
fn stack_buckets(
    series: &mut [BandValues],
    requested: &[u64],
    shown: &[Shown],
    start: Start,
    grid: Grid,
) -> Vec<Bucket> {
    let nb = grid.nb;
    let mut buckets = Vec::with_capacity(nb);
    for b in 0..nb {
        let in_bands: u64 = series.iter().map(|(_, v)| v[b]).sum();
        let rest = requested[b].saturating_sub(in_bands);
        let mut bottom = rest;
        for (band, values) in series.iter_mut() {
            let v = values[b];
            if v == 0 {
                continue;
            }
            band.stack_at(b, bottom, v);
            bottom += v;
        }
        let allocated = start.allocated_after(&shown[b].state.run);
        let reserved = start.reserved + shown[b].reserved;
        let (x0, x1) = grid.range_of(b);
        buckets.push(Bucket {
            x0,
            x1,
            event: states_event(shown[b].state.k),
            requested_bytes: requested[b],
            reserved_bytes: reserved,
            allocated_bytes: allocated,
            cached_free_bytes: (reserved - allocated as i64).max(0) as u64,
            rest_bytes: rest,
        });
    }
    buckets
}

/// The y range's top: the most any bucket shows of requested, allocated or reserved.
fn highest_bytes(buckets: &[Bucket]) -> u64 {
    buckets
        .iter()
        .map(|b| {
            b.requested_bytes
                .max(b.allocated_bytes)
                .max(b.reserved_bytes.max(0) as u64)
        })
        .max()
        .unwrap_or(0)
}

/// The peak marker: the bucket of highest requested bytes (the first of equals).
fn peak_mark(buckets: &[Bucket]) -> Option<PeakMark> {
    buckets
        .iter()
        .enumerate()
        .max_by(|(ia, a), (ib, b)| a.requested_bytes.cmp(&b.requested_bytes).then(ib.cmp(ia)))
        .map(|(_, b)| PeakMark {
            x: (b.x0 + b.x1) / 2.0,
            bytes: b.requested_bytes,
            event: b.event,
        })
}

fn states_event(k: usize) -> Option<u32> {
    k.checked_sub(1).map(|i| i as u32)
}

/// Places device readings on the view's x axis (keeping the highest reading of each
/// bucket) and widens the y range to hold them.
pub fn add_device_readings(
    view: &mut TimelineView,
    rows: &[crate::analysis::device::reconcile::OverTime],
) {
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
            reserved_bytes: r.reserved_bytes,
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

/// START/END pairs of `external_annotations` of this device, as spans on the axis.
fn annotations(
    snap: &Snapshot,
    device: i64,
    trace: &DeviceTrace,
    x: XAxis,
    origin: i64,
    x_min: f64,
    x_max: f64,
) -> (Vec<AnnotationSpan>, usize) {
    let mut list: Vec<_> = snap
        .external_annotations
        .iter()
        .filter(|a| a.device == device)
        .collect();
    if list.is_empty() {
        return (Vec::new(), 0);
    }
    list.sort_by_key(|a| a.time_us);
    let has_times = trace.keys.time_us;
    // Event position of each annotation time, in one sweep over the events.
    let mut event_pos: Vec<f64> = Vec::with_capacity(list.len());
    if x == XAxis::Events && has_times {
        let mut last: Option<usize> = None;
        let mut i = 0;
        for a in &list {
            while i < trace.len() {
                match trace.time_us(i) {
                    Some(e) if e > 0 && e > a.time_us => break,
                    Some(e) if e > 0 => last = Some(i),
                    _ => {}
                }
                i += 1;
            }
            event_pos.push(last.map_or(0.0, |i| (i + 1) as f64));
        }
    }
    let to_x = |k: usize, t: i64| match x {
        XAxis::Time => Some(t.saturating_sub(origin) as f64),
        XAxis::Events if has_times => Some(event_pos[k]),
        XAxis::Events => None,
    };
    // Open STARTs by name (innermost last).
    let mut open: HashMap<&str, Vec<(usize, i64)>> = HashMap::new();
    let mut spans = Vec::new();
    for (k, a) in list.iter().enumerate() {
        match a.stage.as_str() {
            "START" => open.entry(&a.name).or_default().push((k, a.time_us)),
            "END" => {
                if let Some((ks, start)) = open.get_mut(a.name.as_str()).and_then(|v| v.pop())
                    && let (Some(x0), Some(x1)) = (to_x(ks, start), to_x(k, a.time_us))
                    && x1 >= x_min
                    && x0 <= x_max
                {
                    spans.push(AnnotationSpan {
                        name: a.name.clone(),
                        x0: x0.max(x_min),
                        x1: x1.min(x_max),
                    });
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
