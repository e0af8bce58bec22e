//! What one run needs at its peak: one replay finds the peak, what was alive there (each
//! allocation's category and line) and the most reserved, with the memory outside the
//! allocator beside it.

use super::*;
use crate::analysis::device::DeviceChoice;
use crate::analysis::kinds::attribution::{Attributor, GroupBy};
use crate::analysis::kinds::categories::CategoryPart;
use crate::analysis::moments::moment::ResolvedMoment;
use crate::analysis::reports::top::{LiveState, group_live};
use crate::model::Snapshot;
use crate::timeline::replay::{DeviceReplay, LifetimesAtPeak, Peaks};
use serde::Serialize;
use std::collections::BTreeMap;

/// The allocator settings that change how memory is laid out.
fn layout_settings(snap: &Snapshot) -> String {
    [
        "expandable_segments",
        "max_split_size",
        "roundup_power2_divisions",
    ]
    .iter()
    .map(|k| {
        format!(
            "{k}={}",
            snap.setting(k).map_or("?".into(), |v| v.to_string())
        )
    })
    .collect::<Vec<_>>()
    .join(",")
}

/// The device a run is of, and how many devices its file has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunDevice {
    pub device: i64,
    pub count: usize,
}

impl From<&DeviceChoice> for RunDevice {
    fn from(choice: &DeviceChoice) -> RunDevice {
        RunDevice {
            device: choice.device,
            count: choice.others.len() + 1,
        }
    }
}

/// The budget of one device of a snapshot at its peak of requested bytes: one replay
/// finds the peak, what was alive there and the most reserved. `checked`: the device's
/// recording prepared and checked by the command already (the what-ifs of a first OOM
/// read it), else it is prepared and checked here where an OOM needs it.
pub fn run_budget(
    snap: &Snapshot,
    path: &str,
    choice: RunDevice,
    options: &crate::analysis::kinds::attribution::AttributionOptions,
    outside: Outside,
    with_lines: bool,
    checked: Option<&crate::allocator::checked::CheckedRun>,
) -> RunBudget {
    let r = DeviceReplay::new(snap, choice.device);
    // The device's categories, bound to the attributor; their phases serve the budget's
    // phase and step peaks too.
    let mut bound = Attributor::new(&snap.frames, options);
    let categories = crate::analysis::kinds::categories::DeviceCategories::build(&r, &bound);
    let phases = categories.phases.clone();
    bound.bind(categories);
    let attr = &bound;
    let mut leak_suspects = Vec::new();
    let mut phase_peaks = Vec::new();
    let mut step_peaks = Vec::new();
    let mut alloc_lines = None;
    let mut oom_cause = None;
    let mut oom_what_if = None;
    let (moment, live, reserved) = if r.has_timeline() {
        let mut peak = LifetimesAtPeak::default();
        let mut peaks = Peaks::default();
        let oom = first_oom(&r);
        // A run that ran out of memory is budgeted at its first OOM: what was live
        // there, the cache it could not release, and the request it was refused.
        let mut at_oom = crate::analysis::reports::top::LiveStatePass::new(oom);
        // The leak search over the whole trace, in the same replay.
        let mut leaks =
            crate::analysis::moments::leaks::LeakSampler::new(&r, attr, GroupBy::Callsite, None);
        let mut by_phase = PhasePeaks::new(&phases);
        let mut sink = with_lines.then(|| LineSink::new(attr, r.len(), phases.clone()));
        let start = r.run((
            &mut peak,
            &mut peaks,
            &mut at_oom,
            (&mut leaks, &mut by_phase, sink.as_mut()),
        ));
        alloc_lines = sink.map(|s| s.lines);
        leak_suspects = leaks.finish(snap, &r, start).suspects;
        (phase_peaks, step_peaks) = by_phase.finish(start.requested);
        let versions = crate::analysis::reports::top::Versions::NotNeeded;
        let live_at_oom = oom.map(|_| at_oom.finish(&r, start, versions));
        let oom_reserved = live_at_oom.as_ref().map(|l| l.reserved_bytes.max(0) as u64);
        let allocated_at_oom = live_at_oom.as_ref().map_or(0, |l| l.allocated_bytes);
        let (live, kind) = match (live_at_oom, oom) {
            (Some(l), Some(i))
                if budgets_at_oom(
                    oom_reserved.unwrap_or(0),
                    r.trace.size(i),
                    peaks.requested.bytes,
                ) =>
            {
                (l, crate::analysis::moments::moment::Moment::Oom)
            }
            _ => (
                LiveState::at_peak(&r, start, peak, versions),
                crate::analysis::moments::moment::Moment::Peak,
            ),
        };
        let moment = crate::analysis::moments::moment::resolve(&r, kind, || live.at)
            .expect("the peak and the first OOM of a trace resolve");
        if let (Some(i), Some(held)) = (oom, oom_reserved) {
            use crate::analysis::what_if::oom_what_if::{what_ifs, what_ifs_of};
            let e = r.trace.get(i);
            // The first recorded OOM is the one budgeted.
            let found = match checked {
                Some(c) => what_ifs_of(&c.prepared, &c.identity, 1),
                None => what_ifs(snap, choice.device, 1),
            };
            oom_what_if = found
                .into_iter()
                .find(|(event, _)| *event as usize == i)
                .map(|(_, w)| w);
            oom_cause = e.device_free().map(|free| {
                let state = crate::timeline::state::allocator_state(snap, choice.device, Some(i));
                crate::allocator::scenario::OomCause::of(
                    allocated_at_oom,
                    e.size,
                    held,
                    oom_what_if
                        .as_ref()
                        .and_then(|w| w.fraction_limit())
                        .unwrap_or(held.saturating_add(free)),
                    crate::analysis::oom::private_free_in(&state),
                )
            });
        }
        (moment, live, (Some(peaks.reserved.bytes), oom_reserved))
    } else {
        // No memory over time: the final state is all the file knows.
        let (moment, live) = crate::analysis::reports::top::resolve_live(
            &r,
            crate::analysis::moments::moment::Moment::End,
            crate::analysis::reports::top::Versions::NotNeeded,
        )
        .expect("the end of any device resolves");
        (moment, live, (None, None))
    };
    let mut run = budget_of(
        snap, path, choice, &r, attr, &live, moment, reserved, outside,
    );
    run.leak_suspects = leak_suspects;
    run.oom_shortfall_in = oom_cause;
    run.oom_what_if = oom_what_if;
    run.phase_peaks = phase_peaks;
    run.step_peaks = step_peaks;
    run.alloc_lines = alloc_lines.map(std::sync::Arc::new);
    run
}

/// Whether a run that ran out of memory with `oom_reserved` held, refused `request`, is
/// budgeted at that OOM (what was live, what the allocator held beside it, the request)
/// rather than at its peak: it is, unless the OOM needed less than was live at the peak
/// (`peak_requested`; the device had less room then: another process), where the peak
/// is budgeted with the OOM on top as far as it adds.
pub fn budgets_at_oom(oom_reserved: u64, request: u64, peak_requested: u64) -> bool {
    sum_bytes([oom_reserved, request]) >= peak_requested
}

/// The most requested bytes within one kind of phase, and the event after which it is
/// first reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PhasePeak {
    pub phase: crate::analysis::kinds::phases::Phase,
    pub requested_bytes: u64,
    pub event: u32,
}

/// Each allocation's budget line, for a series predicted by its stream: by its `alloc`
/// entry, and for blocks alive before recording, by address. A line is its place in
/// [`Line::ALL`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllocLines {
    /// By trace entry (`u8::MAX`: not an `alloc`).
    pub by_event: Vec<u8>,
    pub before: BTreeMap<u64, u8>,
    /// The phases of the trace.
    pub phases: crate::analysis::kinds::phases::Phases,
    /// Each allocation's call site (an index into `site_names`), by trace entry and for
    /// the blocks from before recording by address.
    pub site_by_event: Vec<u32>,
    pub site_before: BTreeMap<u64, u32>,
    pub site_names: Vec<String>,
}

impl AllocLines {
    /// The line of the allocation made at `event`, or (None) of the block from before
    /// recording at `addr`; activations where nothing decided one.
    pub fn line(&self, event: Option<u32>, addr: u64) -> u8 {
        let found = match event {
            Some(e) => self.by_event.get(e as usize).copied(),
            None => self.before.get(&addr).copied(),
        };
        found
            .filter(|&l| l != u8::MAX)
            .unwrap_or(Line::Activations as u8)
    }

    /// The call site of the allocation made at `event`, or (None) of the block from
    /// before recording at `addr` (an index into `site_names`; None: not known).
    pub fn site(&self, event: Option<u32>, addr: u64) -> Option<u32> {
        match event {
            Some(e) => self.site_by_event.get(e as usize).copied(),
            None => self.site_before.get(&addr).copied(),
        }
        .filter(|&s| s != u32::MAX)
    }
}

/// Decides each allocation's line and call site as its lifetime completes in a replay.
struct LineSink<'a, 'f> {
    attr: &'a Attributor<'f>,
    lines: AllocLines,
    sites: crate::model::frames::FxMap<crate::analysis::kinds::attribution::Site, u32>,
}

impl<'a, 'f> LineSink<'a, 'f> {
    fn new(
        attr: &'a Attributor<'f>,
        len: usize,
        phases: crate::analysis::kinds::phases::Phases,
    ) -> LineSink<'a, 'f> {
        LineSink {
            attr,
            lines: AllocLines {
                by_event: vec![u8::MAX; len],
                before: BTreeMap::new(),
                phases,
                site_by_event: vec![u32::MAX; len],
                site_before: BTreeMap::new(),
                site_names: Vec::new(),
            },
            sites: Default::default(),
        }
    }

    fn record(&mut self, l: &crate::timeline::Lifetime) {
        let category = self.attr.category(l) as usize;
        let name = self
            .attr
            .categories
            .get(category)
            .map_or("other", String::as_str);
        let line = Line::of_category(name) as u8;
        let site = self.attr.site(l);
        let names = &mut self.lines.site_names;
        let site = *self.sites.entry(site).or_insert_with(|| {
            names.push(self.attr.site_name(&site));
            (names.len() - 1) as u32
        });
        match l.alloc {
            Some(a) => {
                if let Some(slot) = self.lines.by_event.get_mut(a.index()) {
                    *slot = line;
                }
                if let Some(slot) = self.lines.site_by_event.get_mut(a.index()) {
                    *slot = site;
                }
            }
            None => {
                self.lines.before.insert(l.addr, line);
                self.lines.site_before.insert(l.addr, site);
            }
        }
    }
}

impl crate::timeline::replay::Aggregator for LineSink<'_, '_> {
    fn free_completed(
        &mut self,
        _i: usize,
        l: &crate::timeline::Lifetime,
        _run: &crate::timeline::replay::Running,
    ) {
        self.record(l);
    }
    fn finish(&mut self, end: &crate::timeline::replay::End) {
        for l in end.open.iter().chain(end.survivors) {
            self.record(l);
        }
    }
}

/// The phases whose peaks a budget gives, in the order it lists them.
const PEAK_PHASES: [crate::analysis::kinds::phases::Phase; 3] = [
    crate::analysis::kinds::phases::Phase::Forward,
    crate::analysis::kinds::phases::Phase::Backward,
    crate::analysis::kinds::phases::Phase::Optimizer,
];

/// Collects [`PhasePeak`]s in a replay, and the most requested in each step.
pub struct PhasePeaks<'p> {
    phases: crate::analysis::kinds::phases::PhaseCursor<'p>,
    /// The most requested in the forward, the backward and the optimizer step, with its
    /// event (in [`PEAK_PHASES`]' order).
    best: [Option<(i64, usize)>; 3],
    /// The phase whose end ends a step.
    ends_step: crate::analysis::kinds::phases::Phase,
    /// The last event was in that phase.
    in_end: bool,
    /// The most requested in each step so far (relative to the start); the last is open.
    steps: Vec<i64>,
}

impl<'p> PhasePeaks<'p> {
    /// A collector over `phases`: a step ends with an optimizer step, or with a forward
    /// where the trace has none.
    pub fn new(phases: &'p crate::analysis::kinds::phases::Phases) -> PhasePeaks<'p> {
        use crate::analysis::kinds::phases::Phase;
        PhasePeaks {
            phases: phases.cursor(),
            best: [None; 3],
            ends_step: if phases.has(Phase::Optimizer) {
                Phase::Optimizer
            } else {
                Phase::Forward
            },
            in_end: false,
            steps: vec![i64::MIN],
        }
    }

    /// The peaks of each phase ([`RunBudget::phase_peaks`]) and of each whole step after
    /// the first ([`RunBudget::step_peaks`]), with `start` the requested bytes at the
    /// first event.
    pub fn finish(&self, start: u64) -> (Vec<PhasePeak>, Vec<u64>) {
        let phase_peaks = PEAK_PHASES
            .iter()
            .zip(self.best)
            .filter_map(|(&phase, best)| {
                let (requested, event) = best?;
                Some(PhasePeak {
                    phase,
                    requested_bytes: (start as i64 + requested).max(0) as u64,
                    event: event as u32,
                })
            })
            .collect();
        (phase_peaks, self.whole_steps(start))
    }

    /// The peaks of the whole steps after the first: the first makes what later steps
    /// reuse (optimizer state, caches), and the last is cut by the end of the trace unless
    /// it ended with its step.
    fn whole_steps(&self, start: u64) -> Vec<u64> {
        let whole = if self.in_end {
            self.steps.len()
        } else {
            self.steps.len() - 1
        };
        self.steps[..whole]
            .iter()
            .skip(1)
            .map(|&r| (start as i64 + r).max(0) as u64)
            .collect()
    }
}

impl crate::timeline::replay::Aggregator for PhasePeaks<'_> {
    fn event(
        &mut self,
        i: usize,
        _action: crate::model::Action,
        run: &crate::timeline::replay::Running,
    ) {
        let phase = self.phases.phase_at(i);
        let in_end = phase == self.ends_step;
        if self.in_end && !in_end {
            self.steps.push(i64::MIN);
        }
        self.in_end = in_end;
        if let Some(last) = self.steps.last_mut() {
            *last = (*last).max(run.requested);
        }
        if let Some(k) = PEAK_PHASES.iter().position(|&p| p == phase) {
            let best = self.best[k].get_or_insert((i64::MIN, i));
            if run.requested > best.0 {
                *best = (run.requested, i);
            }
        }
    }
}

/// The first `oom` entry of the device's trace.
fn first_oom(r: &DeviceReplay) -> Option<usize> {
    (0..r.len()).find(|&i| r.trace.action(i) == crate::model::Action::Oom)
}

/// Reserved bytes when the first OOM of the trace failed (None: no OOM), from a pass of
/// its own (for a caller whose pass did not keep it).
pub fn reserved_at_first_oom(r: &DeviceReplay) -> Option<u64> {
    let oom = first_oom(r)?;
    let mut at = crate::timeline::aggregators::TotalsAt::new(vec![Some(oom)]);
    let start = r.run(&mut at);
    at.values
        .first()
        .map(|v| start.reserved_after(v).max(0) as u64)
}

/// The budget of the live set at a device's peak (`live`, from a replay already run),
/// with the most reserved over the trace and what was reserved when the first OOM
/// failed, when they are known.
#[allow(clippy::too_many_arguments)]
pub fn budget_of(
    snap: &Snapshot,
    path: &str,
    choice: RunDevice,
    r: &DeviceReplay,
    attr: &Attributor,
    live: &LiveState,
    moment: ResolvedMoment,
    (peak_reserved, oom_reserved): (Option<u64>, Option<u64>),
    outside: Outside,
) -> RunBudget {
    let reserved_then = live.reserved_bytes.max(0) as u64;
    let peak_reserved = peak_reserved.unwrap_or(reserved_then).max(reserved_then);
    // Groups by call site, each split by category: the lines, and the series' terms.
    let mut by_line: BTreeMap<Line, Vec<CategoryPart>> = BTreeMap::new();
    let mut groups = BTreeMap::new();
    for g in group_live(attr, live, GroupBy::Callsite) {
        for part in g.categories {
            let entry = groups
                // `group_live` names every group by its key (only a limit merges a rest).
                .entry((
                    g.name.key().unwrap_or_default().to_string(),
                    part.category.clone(),
                ))
                .or_insert(0u64);
            *entry = entry.saturating_add(part.bytes);
            let parts = by_line
                .entry(Line::of_category(&part.category))
                .or_default();
            match parts.iter_mut().find(|p| p.category == part.category) {
                Some(p) => merge_part(p, part),
                None => parts.push(part),
            }
        }
    }
    let requested = live.requested_bytes;
    let oom = first_oom(r);
    let oom_request = oom.map(|i| r.trace.size(i));
    // Budgeted at the OOM: what was live, what the allocator still held beside it after
    // releasing its cache (free space in segments in use: fragmentation, rounding), and
    // the request refused in full.
    let at_oom = oom.is_some() && live.at == oom;
    let overhead = if at_oom {
        reserved_then.saturating_sub(requested)
    } else {
        peak_reserved.saturating_sub(requested)
    };
    // At the peak, the request failed later with `oom_reserved` held: it needed that
    // plus itself, which is more than the most reserved before only by the difference.
    // Not known (no timeline): all of it, on top.
    let failed_request = oom_request.map_or(0, |q| match oom_reserved {
        Some(_) if at_oom => q,
        Some(held) => sum_bytes([held, q]).saturating_sub(peak_reserved),
        None => q,
    });
    let mut lines: Vec<BudgetLine> = Line::ALL
        .iter()
        .map(|&line| {
            let mut categories = by_line.remove(&line).unwrap_or_default();
            categories.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.category.cmp(&b.category)));
            let (bytes, inferred) = match line {
                Line::AllocatorOverhead => (overhead, 0),
                Line::FailedRequest => (failed_request, 0),
                Line::OutsideAllocator => (
                    outside.counted_bytes,
                    if outside.measured_bytes.is_some() {
                        0
                    } else {
                        outside.counted_bytes
                    },
                ),
                _ => (
                    sum_bytes(categories.iter().map(|c| c.bytes)),
                    sum_bytes(
                        categories
                            .iter()
                            .flat_map(|c| &c.by_evidence)
                            .filter(|e| e.inferred)
                            .map(|e| e.bytes),
                    ),
                ),
            };
            BudgetLine {
                line,
                bytes,
                share: 0.0,
                persistent: line.persistent(),
                categories,
                inferred_bytes: inferred,
            }
        })
        .collect();
    let total = sum_bytes(lines.iter().map(|l| l.bytes));
    for l in &mut lines {
        l.share = round4(l.bytes as f64 / total.max(1) as f64);
    }
    let persistent = sum_bytes(lines.iter().filter(|l| l.persistent).map(|l| l.bytes));
    let working = sum_bytes(
        lines
            .iter()
            .filter(|l| !l.persistent && l.line.fitted())
            .map(|l| l.bytes),
    );
    RunBudget {
        path: path.to_string(),
        device: choice.device,
        device_count: choice.count,
        moment,
        requested_bytes: requested,
        allocated_bytes: live.allocated_bytes,
        reserved_bytes: live.reserved_bytes.max(0) as u64,
        peak_reserved_bytes: peak_reserved,
        lines,
        persistent_bytes: persistent,
        working_bytes: working,
        outside,
        oom_request_bytes: oom_request,
        oom_reserved_bytes: oom_request.and(oom_reserved),
        oom_event: oom.map(|i| i as u32),
        oom_shortfall_in: None,
        oom_what_if: None,
        total_bytes: total,
        leak_suspects: Vec::new(),
        phase_peaks: Vec::new(),
        step_peaks: Vec::new(),
        groups,
        settings: layout_settings(snap),
        replays: Vec::new(),
        stream: None,
        tie_break: None,
        alloc_lines: None,
    }
}

/// Adds one group's part of a category to the part of a line.
fn merge_part(into: &mut CategoryPart, part: CategoryPart) {
    into.bytes = into.bytes.saturating_add(part.bytes);
    into.count = into.count.saturating_add(part.count);
    for e in part.by_evidence {
        match into
            .by_evidence
            .iter_mut()
            .find(|x| x.evidence == e.evidence)
        {
            Some(x) => {
                x.bytes = x.bytes.saturating_add(e.bytes);
                x.count = x.count.saturating_add(e.count);
            }
            None => into.by_evidence.push(e),
        }
    }
    into.by_evidence
        .sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.evidence.cmp(&b.evidence)));
    if let Some(main) = into.by_evidence.first() {
        into.evidence = main.evidence.clone();
        into.inferred = main.inferred;
    }
}
