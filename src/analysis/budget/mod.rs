//! The budget (this file) and the devices it fits ([`gpus`]).
//!
//! A VRAM budget from measured snapshots: what a run held at its peak in the terms a
//! person plans with, whether it fits a device with headroom, and, from runs of one
//! workload at several sizes, how each part grows and what a new size needs.
//!
//! Takes snapshots (each replayed once for its peak, its categories decided by
//! [`crate::analysis::kinds::categories`]), the devices asked about ([`crate::analysis::budget::gpus`]) and, when known, the
//! memory outside the allocator (from device readings or an OOM message); gives
//! [`BudgetReport`]. Lines, each the sum of categories:
//!
//! | line | categories |
//! |---|---|
//! | weights | parameters |
//! | gradients | gradients |
//! | optimizer state | optimizer_state |
//! | activations and other intermediates | activations, step and backward temporaries, inputs, compile, other, unknown, user rules' own |
//! | caches | caches |
//! | workspaces | workspaces |
//! | communication buffers | communication |
//! | allocator overhead | reserved minus requested at the peak (rounding, cached free blocks, fragmentation), and the reserved memory's later growth; in a series, fitted as `a + b · size` |
//! | outside the allocator | measured, or assumed at the top of the usual range |
//!
//! A series is fitted group by group: each call site's bytes of one category at the peak
//! of every run, as `k · size^e` with `e` 0, 1 or (for sequence length) 2, whichever fits
//! best; a line at a new size is the sum of its groups'. Nothing here formats.

pub mod gpus;
pub mod stream;

use crate::allocator::prepared::Prepared;
use crate::analysis::budget::gpus::Gpu;
use crate::analysis::device::DeviceChoice;
use crate::analysis::kinds::attribution::{Attributor, GroupBy};
use crate::analysis::kinds::categories::CategoryPart;
use crate::analysis::moments::moment::ResolvedMoment;
use crate::analysis::reports::top::{LiveState, group_live};
use crate::model::Snapshot;
use crate::timeline::replay::{DeviceReplay, LifetimesAtPeak, Peaks};
use serde::Serialize;
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: u32 = 3;

/// Memory outside the caching allocator when nothing measured it: a CUDA context with
/// cuBLAS and cuDNN loaded takes about 0.3 to 1 GiB on one GPU (more with NCCL's
/// buffers); a budget assumes the top of that range.
pub const OUTSIDE_TYPICAL: (u64, u64) = (300 << 20, 1 << 30);

/// NCCL's own buffers outside the allocator, per communicator, in published
/// measurements: 544 MB for a process group of 2 ranks, 688 MB for more (4 A100s over
/// NVLink, NVIDIA/nccl#964). Not in [`OUTSIDE_TYPICAL`]; a run whose memory shows
/// communication buffers is told so.
pub const NCCL_PER_COMMUNICATOR: (u64, u64) = (544_000_000, 688_000_000);

/// A line of a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    Weights,
    Gradients,
    OptimizerState,
    /// Made and freed within each optimizer step (a foreach step's copies of the
    /// parameters): sized by the model, not by the batch or sequence.
    StepTemporaries,
    /// Autocast's half-precision copies of the weights, made in each forward.
    AutocastCopies,
    Activations,
    Caches,
    Workspaces,
    Communication,
    AllocatorOverhead,
    OutsideAllocator,
    /// The request an OOM refused: the run needed at least this much more.
    FailedRequest,
}

impl Line {
    pub const ALL: [Line; 12] = [
        Line::Weights,
        Line::Gradients,
        Line::OptimizerState,
        Line::StepTemporaries,
        Line::AutocastCopies,
        Line::Activations,
        Line::Caches,
        Line::Workspaces,
        Line::Communication,
        Line::AllocatorOverhead,
        Line::OutsideAllocator,
        Line::FailedRequest,
    ];

    /// Kept for the whole run, whatever the batch or sequence length.
    pub fn persistent(self) -> bool {
        matches!(self, Line::Weights | Line::Gradients | Line::OptimizerState)
    }

    /// Sized by the model, whatever the batch or sequence length: the persistent lines,
    /// the optimizer step's temporaries and autocast's copies of the weights.
    pub fn with_model(self) -> bool {
        self.persistent() || matches!(self, Line::StepTemporaries | Line::AutocastCopies)
    }

    /// The category that falls in this line (the tensor lines; "other" for the rest).
    pub fn category(self) -> &'static str {
        match self {
            Line::Weights => "parameters",
            Line::Gradients => "gradients",
            Line::OptimizerState => "optimizer_state",
            Line::StepTemporaries => "step_temporaries",
            Line::AutocastCopies => "autocast_copies",
            Line::Activations => "activations",
            Line::Caches => "caches",
            Line::Workspaces => "workspaces",
            Line::Communication => "communication",
            _ => "other",
        }
    }

    /// The line a category falls in.
    pub fn of_category(name: &str) -> Line {
        match name {
            "parameters" => Line::Weights,
            "gradients" => Line::Gradients,
            "optimizer_state" => Line::OptimizerState,
            "step_temporaries" => Line::StepTemporaries,
            "autocast_copies" => Line::AutocastCopies,
            "caches" => Line::Caches,
            "workspaces" => Line::Workspaces,
            "communication" => Line::Communication,
            _ => Line::Activations,
        }
    }

    /// Lines that a series fits from the categories (the others follow from them).
    fn fitted(self) -> bool {
        !matches!(
            self,
            Line::AllocatorOverhead | Line::OutsideAllocator | Line::FailedRequest
        )
    }
}

/// One line of a run's budget.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BudgetLine {
    pub line: Line,
    pub bytes: u64,
    /// bytes / the run's total, rounded to 4 decimals.
    pub share: f64,
    pub persistent: bool,
    /// The categories that make it, with what decided them (empty for the overhead and
    /// outside lines).
    pub categories: Vec<CategoryPart>,
    /// Bytes of it decided by inference (sizes, partial lifetimes) or, for memory
    /// outside the allocator, assumed rather than measured.
    pub inferred_bytes: u64,
}

/// Where the figure for memory outside the allocator comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutsideSource {
    /// Device readings (`--nvml`): this process's use minus reserved at the peak.
    Nvml,
    /// Device readings without per-process rows: the device's use minus reserved, other
    /// processes included.
    NvmlDevice,
    /// An OOM message: "this process has X memory in use" minus what PyTorch reserved.
    OomMessage,
    /// Given on the command line (`--outside`).
    Given,
    /// Nothing measured it: assumed.
    NotMeasured,
}

/// Memory outside the caching allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Outside {
    pub source: OutsideSource,
    /// What was measured (None when not measured).
    pub measured_bytes: Option<u64>,
    /// What the budget counts: the measurement, else the top of the usual range.
    pub counted_bytes: u64,
    pub typical_low_bytes: u64,
    pub typical_high_bytes: u64,
}

impl Outside {
    pub fn measured(source: OutsideSource, bytes: u64) -> Outside {
        Outside {
            source,
            measured_bytes: Some(bytes),
            counted_bytes: bytes,
            typical_low_bytes: OUTSIDE_TYPICAL.0,
            typical_high_bytes: OUTSIDE_TYPICAL.1,
        }
    }

    pub fn not_measured() -> Outside {
        Outside {
            source: OutsideSource::NotMeasured,
            measured_bytes: None,
            counted_bytes: OUTSIDE_TYPICAL.1,
            typical_low_bytes: OUTSIDE_TYPICAL.0,
            typical_high_bytes: OUTSIDE_TYPICAL.1,
        }
    }
}

/// The budget of one run (one device of one snapshot) at its peak.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunBudget {
    pub path: String,
    pub device: i64,
    /// How many devices the file has (a number, not their list: a file of thousands of
    /// devices has as many runs).
    pub device_count: usize,
    pub moment: ResolvedMoment,
    /// Requested bytes alive at the peak (the categories add up to it).
    pub requested_bytes: u64,
    /// Block bytes alive at the peak.
    pub allocated_bytes: u64,
    /// Reserved at the peak, and the most reserved at any moment of the trace.
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub lines: Vec<BudgetLine>,
    pub persistent_bytes: u64,
    pub working_bytes: u64,
    pub outside: Outside,
    /// The first OOM of the trace: the request it refused, the event, and what was
    /// reserved when it failed (after the allocator released what it could). The
    /// failed request line is what the request needed beyond the most reserved before:
    /// `oom_reserved_bytes + oom_request_bytes - peak_reserved_bytes`, or 0.
    pub oom_request_bytes: Option<u64>,
    pub oom_event: Option<u32>,
    pub oom_reserved_bytes: Option<u64>,
    /// What a device must have: every line (for a run that ran out of memory, at least).
    pub total_bytes: u64,
    /// Call sites whose memory grew step after step to the end of the trace (the leak
    /// search of `top --leaks`, by call site, over the whole trace), largest first: an
    /// inference from the trace's samples. A run that leaks needs more the longer it
    /// runs, so it fits no device, whatever the figures of the run recorded.
    pub leak_suspects: Vec<crate::analysis::moments::leaks::LeakSuspect>,
    /// The most requested within each kind of phase the trace shows (forward, backward,
    /// optimizer step), in that order: where the peak is, and where another batch or
    /// sequence length may move it.
    pub phase_peaks: Vec<PhasePeak>,
    /// The most requested in each whole step after the first (a step ends with an
    /// optimizer step, or with a forward where the trace has none), in order: how much
    /// the peak moves from step to step.
    pub step_peaks: Vec<u64>,
    /// The peak of reserved bytes replayed with equal free blocks taken in the other
    /// order (null: no trace, or more than [`MAX_TIE_BREAK_ALLOCATIONS`] allocations).
    pub tie_break: Option<TieBreak>,
    /// (call site, category) -> requested bytes at the peak, for series fits.
    #[serde(skip)]
    pub groups: BTreeMap<(String, String), u64>,
    /// The allocator settings that change how memory is laid out, for series checks.
    #[serde(skip)]
    pub settings: String,
    /// The run replayed at each GPU's capacity (by GPU name), for the fits.
    #[serde(skip)]
    pub replays: Vec<(String, Replayed)>,
    /// Its allocations and frees, for a series predicted by its stream (None: no trace
    /// to replay).
    #[serde(skip)]
    pub stream: Option<std::sync::Arc<stream::Stream>>,
    /// Each allocation's line, for the stream (None: not asked for).
    #[serde(skip)]
    pub alloc_lines: Option<std::sync::Arc<AllocLines>>,
}

impl RunBudget {
    pub fn line(&self, line: Line) -> u64 {
        self.lines
            .iter()
            .find(|l| l.line == line)
            .map_or(0, |l| l.bytes)
    }
}

/// How a device takes a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// With the headroom asked for to spare.
    Fits,
    /// It fits, with less than the headroom to spare.
    Tight,
    DoesNotFit,
}

/// A run replayed through the allocator model at a device's capacity (less the memory
/// outside the allocator).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Replayed {
    /// The model replays the run's recording exactly; when not, the fit falls back to
    /// the peak and the headroom.
    pub model_exact: bool,
    /// The most the allocator reserved at that capacity (up to the first OOM).
    pub peak_reserved_bytes: u64,
    /// The first request that runs out of memory: its trace entry and cause.
    pub oom_event: Option<u32>,
    pub oom_cause: Option<crate::allocator::scenario::OomCause>,
    /// When the recorded settings run out of memory: `expandable_segments:True` (the
    /// setting tried) lets the run through.
    pub fits_with_expandable: Option<bool>,
    /// The blocks alive when recording began alone exceed the capacity (no event runs).
    pub start_does_not_fit: bool,
}

/// How much a run's peak of reserved bytes depends on which of equal free blocks the
/// allocator takes: its replay with no limit in PyTorch's order (the lowest address
/// first) and in the other (the highest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TieBreak {
    pub peak_reserved_bytes: u64,
    pub highest_first_bytes: u64,
}

/// The runs whose order of equal blocks is tried (one more replay each): past it, none.
pub const MAX_TIE_BREAK_ALLOCATIONS: u64 = 200_000;

/// The peak of reserved bytes of `p` replayed with no limit taking equal free blocks
/// highest address first; None past [`MAX_TIE_BREAK_ALLOCATIONS`] allocations or where
/// it runs out of memory.
fn highest_first_peak(p: &crate::allocator::prepared::Prepared) -> Option<u64> {
    (p.requests.allocs <= MAX_TIE_BREAK_ALLOCATIONS)
        .then(|| crate::allocator::scenario::unlimited_highest_first(p, &p.settings).ok())
        .flatten()
        .filter(|(o, _)| o.first_oom.is_none())
        .map(|(o, _)| o.peak_reserved_bytes)
}

/// A device's [`TieBreak`], for a budget made without [`replay_on`] (the report's): its
/// replay with no limit beside the same taking equal free blocks highest address first.
pub fn tie_break_of(snap: &Snapshot, device: i64) -> Option<TieBreak> {
    let p = Prepared::new(snap, device, None).ok()?;
    if p.requests.allocs > MAX_TIE_BREAK_ALLOCATIONS || p.settings.memory_fraction.is_some() {
        return None;
    }
    replays_with_tie_break(&p, &[]).1
}

/// [`run_each`](crate::allocator::scenario::run_each) at `devices` under the recorded
/// settings, beside the replay taking equal free blocks highest address first: each
/// device's outcome and the run's [`TieBreak`].
fn replays_with_tie_break(
    p: &Prepared,
    devices: &[(u64, u64)],
) -> (
    Vec<Result<crate::allocator::scenario::Outcome, crate::allocator::scenario::StartDoesNotFit>>,
    Option<TieBreak>,
) {
    let ((free, outcomes), highest) = rayon::join(
        || crate::allocator::scenario::run_each(p, &p.settings, devices),
        || highest_first_peak(p),
    );
    let tie_break = free.zip(highest).map(|(f, h)| TieBreak {
        peak_reserved_bytes: f.peak_reserved_bytes,
        highest_first_bytes: h,
    });
    (outcomes, tie_break)
}

/// What replaying a run gives: one [`Replayed`] per GPU and its [`TieBreak`].
#[derive(Debug, Default)]
pub struct RunReplays {
    pub gpus: Vec<(String, Replayed)>,
    pub tie_break: Option<TieBreak>,
}

/// Replays a prepared run at each GPU's capacity less `outside`.
pub fn replay_on(snap: &Snapshot, p: &Prepared, gpus: &[Gpu], outside: u64) -> RunReplays {
    use crate::allocator::identity::reproduces;
    use crate::allocator::scenario::run_each;
    let (exact, outcomes) = rayon::join(
        || reproduces(snap, p),
        || {
            let devices: Vec<(u64, u64)> = gpus
                .iter()
                .map(|g| (g.capacity_bytes.saturating_sub(outside), g.capacity_bytes))
                .collect();
            let (outcomes, tie_break) = replays_with_tie_break(p, &devices);
            // Where memory runs out, whether expandable segments let it through.
            let short: Vec<usize> = (0..gpus.len())
                .filter(|&i| outcomes[i].as_ref().is_ok_and(|o| o.first_oom.is_some()))
                .collect();
            let mut with_expandable: Vec<Option<bool>> = vec![None; gpus.len()];
            if !short.is_empty() && !p.settings.expandable_segments {
                let s = crate::allocator::Settings {
                    expandable_segments: true,
                    ..p.settings.clone()
                };
                let at: Vec<(u64, u64)> = short.iter().map(|&i| devices[i]).collect();
                for (&i, o) in short.iter().zip(run_each(p, &s, &at).1) {
                    with_expandable[i] = Some(o.is_ok_and(|e| e.first_oom.is_none()));
                }
            }
            (outcomes, with_expandable, tie_break)
        },
    );
    let (outcomes, with_expandable, tie_break) = outcomes;
    let replays = gpus
        .iter()
        .zip(outcomes)
        .zip(with_expandable)
        .map(|((g, o), fits_with_expandable)| {
            let replayed = match o {
                Ok(o) => Replayed {
                    model_exact: exact,
                    peak_reserved_bytes: o.peak_reserved_bytes,
                    oom_event: o.first_oom.as_ref().map(|f| f.event),
                    oom_cause: o.first_oom.as_ref().map(|f| f.cause),
                    fits_with_expandable,
                    start_does_not_fit: false,
                },
                // The blocks alive before recording alone do not fit.
                Err(_) => Replayed {
                    model_exact: exact,
                    peak_reserved_bytes: 0,
                    oom_event: None,
                    oom_cause: Some(crate::allocator::scenario::OomCause::Capacity),
                    fits_with_expandable: None,
                    start_does_not_fit: true,
                },
            };
            (g.name.clone(), replayed)
        })
        .collect();
    RunReplays {
        gpus: replays,
        tie_break,
    }
}

/// A budget against one device.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Fit {
    pub gpu: Gpu,
    /// The run replayed through the allocator model at this capacity, which decides the
    /// verdict when the model reproduces the run exactly (null: a prediction, or a run
    /// without a trace to replay).
    pub replayed: Option<Replayed>,
    /// The total with the headroom asked for.
    pub needed_bytes: u64,
    /// Capacity minus the total (negative: short by that much).
    pub left_bytes: i64,
    /// left / capacity, rounded to 4 decimals.
    pub left_share: f64,
    pub verdict: Verdict,
    /// The run leaks ([`RunBudget::leak_suspects`]): it fits no device, whatever the
    /// figures of the run recorded say (they decide the verdict otherwise).
    pub leaks: bool,
    /// The run ran out of memory: the verdict covers it as far as the request it was
    /// refused, and what it needs after that is not recorded.
    pub until_oom: bool,
}

impl Fit {
    /// It fits (or fits with less than the headroom left) only as far as the run's OOM.
    pub fn fits_until_oom(&self) -> bool {
        self.until_oom && self.verdict != Verdict::DoesNotFit
    }
}

/// The largest batch size or sequence length a series takes (2^32): past it no run is
/// real, and twice it still fits the arithmetic of sizes.
pub const MAX_SERIES_SIZE: u64 = 1 << 32;

/// A sum of byte counts that stops at `u64::MAX` rather than wrapping: a part never
/// exceeds the sum, so a share of it stays within 100%, and a total past any device never
/// reads as a small one that fits.
pub fn sum_bytes(parts: impl IntoIterator<Item = u64>) -> u64 {
    parts.into_iter().fold(0, u64::saturating_add)
}

/// Fits `total` bytes on `gpu` with `headroom` (a fraction) to spare.
pub fn fit(gpu: &Gpu, total: u64, headroom: f64) -> Fit {
    // A float past `u64::MAX` converts to `u64::MAX`: never a need that wrapped small.
    let needed = (total as f64 * (1.0 + headroom)).ceil() as u64;
    let capacity = gpu.capacity_bytes;
    let left =
        (i128::from(capacity) - i128::from(total)).clamp(i64::MIN.into(), i64::MAX.into()) as i64;
    Fit {
        gpu: gpu.clone(),
        replayed: None,
        needed_bytes: needed,
        left_bytes: left,
        left_share: round4(left as f64 / capacity.max(1) as f64),
        verdict: if needed <= capacity {
            Verdict::Fits
        } else if total <= capacity {
            Verdict::Tight
        } else {
            Verdict::DoesNotFit
        },
        leaks: false,
        until_oom: false,
    }
}

/// Fits a run on `gpu`: from its replay at that capacity when the model reproduces the
/// run exactly (runs out of memory: does not fit; else the replay's peak reserved plus
/// the memory outside the allocator, with the headroom), else as [`fit`].
pub fn fit_run(gpu: &Gpu, run: &RunBudget, headroom: f64) -> Fit {
    let mut f = fit_as_recorded(gpu, run, headroom);
    f.until_oom = run.oom_request_bytes.is_some();
    if !run.leak_suspects.is_empty() {
        // Memory that grows step after step outgrows any device in a longer run.
        f.verdict = Verdict::DoesNotFit;
        f.leaks = true;
    }
    f
}

/// [`fit_run`] of the run as recorded, leaks aside.
fn fit_as_recorded(gpu: &Gpu, run: &RunBudget, headroom: f64) -> Fit {
    let replayed = run
        .replays
        .iter()
        .find(|(name, _)| *name == gpu.name)
        .map(|(_, r)| r.clone());
    let Some(mut r) = replayed.filter(|r| r.model_exact) else {
        let mut f = fit(gpu, run.total_bytes, headroom);
        f.replayed = run
            .replays
            .iter()
            .find(|(name, _)| *name == gpu.name)
            .map(|(_, r)| r.clone());
        return f;
    };
    // Blocks live at the run's peak that alone exceed the capacity: that is capacity,
    // whatever the moment the replay failed looked like.
    if run.allocated_bytes > gpu.capacity_bytes.saturating_sub(run.outside.counted_bytes) {
        r.oom_cause = r
            .oom_cause
            .map(|_| crate::allocator::scenario::OomCause::Capacity);
    }
    fit_replayed(gpu, r, run.total_bytes, run.outside.counted_bytes, headroom)
}

/// A fit from a replay at `gpu`'s capacity less `outside`: one that runs out of memory
/// (or whose start does not fit) does not fit, short by at least what `total` counts
/// beyond the capacity; else its peak reserved plus `outside`, with the headroom.
fn fit_replayed(gpu: &Gpu, r: Replayed, total: u64, outside: u64, headroom: f64) -> Fit {
    let mut f = if r.oom_event.is_some() || r.start_does_not_fit {
        let mut f = fit(gpu, total, headroom);
        f.verdict = Verdict::DoesNotFit;
        f
    } else {
        fit(gpu, r.peak_reserved_bytes.saturating_add(outside), headroom)
    };
    f.replayed = Some(r);
    f
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

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
/// finds the peak, what was alive there and the most reserved.
pub fn run_budget(
    snap: &Snapshot,
    path: &str,
    choice: RunDevice,
    options: &crate::analysis::kinds::attribution::AttributionOptions,
    outside: Outside,
    with_lines: bool,
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

/// Collects [`PhasePeak`]s in a replay, and the most requested in each step.
pub struct PhasePeaks<'p> {
    phases: &'p crate::analysis::kinds::phases::Phases,
    best: BTreeMap<crate::analysis::kinds::phases::Phase, (i64, usize)>,
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
            phases,
            best: BTreeMap::new(),
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
        let phase_peaks = self
            .best
            .iter()
            .map(|(&phase, &(requested, event))| PhasePeak {
                phase,
                requested_bytes: (start as i64 + requested).max(0) as u64,
                event: event as u32,
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
        use crate::analysis::kinds::phases::Phase;
        let phase = self.phases.phase_at(i);
        let in_end = phase == self.ends_step;
        if self.in_end && !in_end {
            self.steps.push(i64::MIN);
        }
        self.in_end = in_end;
        if let Some(last) = self.steps.last_mut() {
            *last = (*last).max(run.requested);
        }
        if matches!(phase, Phase::Forward | Phase::Backward | Phase::Optimizer) {
            let best = self.best.entry(phase).or_insert((i64::MIN, i));
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

/// What varies across the runs of a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Vary {
    Batch,
    Seq,
    /// Both: each run is a batch size by a sequence length, its size their product (its
    /// tokens).
    BatchSeq,
}

impl std::str::FromStr for Vary {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "batch" => Ok(Vary::Batch),
            "seq" => Ok(Vary::Seq),
            "batch,seq" | "batch_seq" | "seq,batch" => Ok(Vary::BatchSeq),
            _ => Err(format!("expected batch, seq or batch,seq, found {s:?}")),
        }
    }
}

/// A size to predict: a batch size or sequence length, or a batch × sequence shape
/// (`8x1024`), its size then its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetSize {
    pub size: u64,
    pub shape: Option<stream::Shape>,
}

impl std::fmt::Display for TargetSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.shape {
            Some((b, s)) => write!(f, "{b}x{s}"),
            None => write!(f, "{}", self.size),
        }
    }
}

impl std::str::FromStr for TargetSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let whole = |v: &str| -> Result<u64, String> {
            v.trim()
                .parse()
                .ok()
                .filter(|n| (1..=MAX_SERIES_SIZE).contains(n))
                .ok_or_else(|| format!("expected a whole number from 1 to 2^32, found {v:?}"))
        };
        match s.split_once(['x', 'X', '×']) {
            Some((b, q)) => {
                let shape = (whole(b)?, whole(q)?);
                Ok(TargetSize {
                    size: shape.0.saturating_mul(shape.1),
                    shape: Some(shape),
                })
            }
            None => Ok(TargetSize {
                size: whole(s)?,
                shape: None,
            }),
        }
    }
}

/// The batch size and sequence length a file name states (`bs4_seq512`), both or none.
pub fn shape_from_name(name: &str) -> Option<stream::Shape> {
    let b = size_from_name(name, Some(Vary::Batch))?.1;
    let s = size_from_name(name, Some(Vary::Seq))?.1;
    Some((b, s))
}

/// The size a file name states (`ctx512`, `seq_len-2048`, `cl128`; `bs8`, `batch_4`),
/// for the kind asked, else for whichever kind the name states.
pub fn size_from_name(name: &str, vary: Option<Vary>) -> Option<(Vary, u64)> {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let lower = base.to_ascii_lowercase();
    let find = |keys: &[&str]| -> Option<u64> {
        keys.iter().find_map(|key| {
            let mut from = 0;
            while let Some(i) = lower[from..].find(key) {
                let at = from + i;
                let before_ok = at == 0 || !lower.as_bytes()[at - 1].is_ascii_alphabetic();
                let rest = lower[at + key.len()..].trim_start_matches(['_', '-', '=']);
                let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                if before_ok && !digits.is_empty() {
                    return digits
                        .parse()
                        .ok()
                        .filter(|n: &u64| (1..=MAX_SERIES_SIZE).contains(n));
                }
                from = at + key.len();
            }
            None
        })
    };
    const SEQ: [&str; 7] = ["seq_len", "seqlen", "seq", "ctx", "context", "cl", "len"];
    const BATCH: [&str; 4] = ["batch_size", "batch", "bsz", "bs"];
    match vary {
        Some(Vary::Seq) => find(&SEQ).map(|n| (Vary::Seq, n)),
        Some(Vary::Batch) => find(&BATCH).map(|n| (Vary::Batch, n)),
        Some(Vary::BatchSeq) => find(&BATCH)
            .zip(find(&SEQ))
            .map(|(b, s)| (Vary::BatchSeq, b.saturating_mul(s))),
        None => match (find(&SEQ), find(&BATCH)) {
            (Some(n), None) => Some((Vary::Seq, n)),
            (None, Some(n)) => Some((Vary::Batch, n)),
            _ => None,
        },
    }
}

/// The precision a file name states, if any.
pub fn precision_from_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if lower.contains("bf16") || lower.contains("bfloat16") {
        Some("bf16")
    } else if lower.contains("fp16") || lower.contains("float16") || lower.contains("half") {
        Some("fp16")
    } else if lower.contains("fp32") || lower.contains("float32") {
        Some("fp32")
    } else {
        None
    }
}

/// One group of a series: a call site's bytes of one category at each size.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GroupTerm {
    pub callsite: String,
    pub category: String,
    pub line: Line,
    /// 0 (constant), 1 (linear) or 2 (quadratic) in the size.
    pub exponent: u32,
    /// `k` of `k · size^exponent`.
    pub coefficient: f64,
    /// Bytes at each measured size, in the order of [`Series::sizes`].
    pub measured_bytes: Vec<u64>,
}

/// A fitted line at each measured size.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LineFit {
    pub line: Line,
    pub measured_bytes: Vec<u64>,
    pub fitted_bytes: Vec<u64>,
    /// The largest exponent among its groups holding at least 1% of it at the largest
    /// size: how it grows.
    pub grows_as: u32,
    /// Its measured bytes go down as the size goes up somewhere.
    pub not_monotonic: bool,
}

/// What a series cannot be trusted for.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Caveat {
    /// Batch and sequence both vary and the runs' allocations do not match one to one:
    /// nothing else predicts such a series.
    ProductUnmatched,
    /// The runs' weights differ: another model or precision.
    WeightsDiffer {
        smallest_bytes: u64,
        largest_bytes: u64,
    },
    /// The file names state different precisions.
    PrecisionsDiffer { precisions: Vec<String> },
    /// The allocator settings differ.
    SettingsDiffer { settings: Vec<String> },
    /// The runs have different numbers of devices (another parallelism).
    DevicesDiffer { counts: Vec<usize> },
    /// A line holding a twentieth of a run's total or more goes down as the size goes
    /// up: not one workload.
    NotMonotonic { line: Line },
    /// Only two sizes: no error band (a fit through two points has no residual).
    TwoSizes,
    /// The target is past twice the largest size measured.
    BeyondRange { target: u64, largest: u64 },
    /// The runs share too little to be one workload: in the run that shares least
    /// (`run`, an index into [`BudgetReport::runs`]), only `shared_share` of its bytes at
    /// the peak are in groups (call site and category) that every run of the series has,
    /// below [`MIN_SHARED_SHARE`].
    FewSharedGroups { run: usize, shared_share: f64 },
    /// Predicting a measured size from the others misses by more than
    /// [`MAX_HELD_OUT_ERROR`] (`error`, the largest relative error): the sizes do not
    /// follow one law, and nothing is predicted.
    LargeHeldOutError { size: u64, error: f64 },
    /// A line sized by the model that the series table calls constant (`measured_bytes`
    /// at the largest size) comes out otherwise in the prediction (`predicted_bytes`).
    ContradictsLine {
        line: Line,
        measured_bytes: u64,
        predicted_bytes: u64,
    },
    /// Two sizes (no held-out check): live tensors at the replayed peak
    /// (`replayed_bytes`) and the sum of the group fits (`group_bytes`) differ by more
    /// than [`MAX_HELD_OUT_ERROR`].
    DisagreesWithGroupFits {
        replayed_bytes: u64,
        group_bytes: u64,
    },
}

/// The least share of each run's bytes at its peak that must lie in groups (call site
/// and category) present in every run of a series: half. Runs of one workload at several
/// sizes allocate at the same call sites (a larger size grows them; a few sites may come
/// and go); programs with no call site in common share nothing.
pub const MIN_SHARED_SHARE: f64 = 0.5;

/// The largest held-out error (relative, of the total) a prediction may have and still
/// pass `--check`: 10%.
pub const MAX_HELD_OUT_ERROR: f64 = 0.10;

impl Caveat {
    /// Whether it stops the prediction (the rest are warnings).
    pub fn refuses(&self) -> bool {
        matches!(
            self,
            Caveat::WeightsDiffer { .. }
                | Caveat::ProductUnmatched
                | Caveat::PrecisionsDiffer { .. }
                | Caveat::BeyondRange { .. }
                | Caveat::NotMonotonic { .. }
                | Caveat::FewSharedGroups { .. }
                | Caveat::LargeHeldOutError { .. }
                | Caveat::ContradictsLine { .. }
                | Caveat::DisagreesWithGroupFits { .. }
        )
    }
}

/// A budget predicted at a size.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Prediction {
    pub size: u64,
    /// Its batch size and sequence length, where both vary (`size` is their product).
    pub shape: Option<stream::Shape>,
    /// Every line, as in a run's budget.
    pub lines: Vec<(Line, u64)>,
    pub total_bytes: u64,
    /// The largest relative error of predicting a measured size from the others (three
    /// sizes or more); None with two.
    pub error_band: Option<f64>,
    pub fits: Vec<Fit>,
    /// The groups whose growth decides most of the change from the largest size
    /// measured, the largest change first (at most three).
    pub deciding: Vec<Deciding>,
    /// The target's stream replayed through the allocator model, which decides the
    /// total and the fits when the runs' allocations match (null: the group fits alone).
    pub stream: Option<StreamAt>,
}

/// A target's predicted stream, replayed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StreamAt {
    /// The peaks of requested and reserved bytes with no limit.
    pub requested_peak_bytes: u64,
    pub reserved_peak_bytes: u64,
    /// Where the requested peak falls: the trace entry at the same place in the largest
    /// size measured (null: among the blocks from before recording).
    pub peak_event: Option<u32>,
    /// That run (index into [`BudgetReport::runs`]).
    pub peak_run: usize,
    /// The phase of that trace entry (null: before recording).
    pub peak_phase: Option<crate::analysis::kinds::phases::Phase>,
    /// Its reserved bytes over the stream, replayed with no limit.
    pub reserved_over_time: ReservedCurve,
    /// The call sites holding the most at the predicted peak (at most
    /// [`SITES_AT_PEAK`]), each allocation at the call site and in the line it has in the
    /// largest size measured.
    pub callsites: Vec<stream::SiteLive>,
    /// Of the requested bytes at the predicted peak, those of allocations that some run
    /// does not make, taken at their size in the largest size measured (0 where the
    /// runs' allocations match one to one).
    pub unmatched_bytes: u64,
}

/// How many call sites a predicted peak names.
pub const SITES_AT_PEAK: usize = 5;

/// Reserved bytes over a stream, for a chart: the most reserved in each of at most
/// [`CURVE_POINTS`] equal spans of its recorded commands (the blocks from before
/// recording are the start).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReservedCurve {
    pub size: u64,
    /// The stream's recorded commands (allocations, frees, cache flushes): the x axis.
    pub commands: u64,
    /// (first command of the span, the most reserved bytes in it), where it changes;
    /// the first point is the start.
    pub points: Vec<(u64, u64)>,
}

/// The most points a [`ReservedCurve`] keeps.
pub const CURVE_POINTS: u64 = 500;

impl ReservedCurve {
    /// `series` (reserved bytes at the start, then after each command that changed them)
    /// kept as its most in each span: a peak is never lost.
    /// The first `before` commands (the blocks from before recording) count as the start.
    pub fn of(
        size: u64,
        commands: usize,
        before: usize,
        series: &[(Option<u32>, u64)],
    ) -> ReservedCurve {
        let before = before as u64;
        let commands = (commands as u64).saturating_sub(before);
        let span = commands.div_ceil(CURVE_POINTS).max(1);
        let mut points: Vec<(u64, u64)> = Vec::new();
        let emit = |points: &mut Vec<(u64, u64)>, x: u64, b: u64| {
            if points.last().is_none_or(|l| l.1 != b) {
                points.push((x, b));
            }
        };
        let (mut span_at, mut most, mut now) = (0u64, 0u64, 0u64);
        for &(at, bytes) in series {
            let this = at.map_or(0, |c| u64::from(c).saturating_sub(before) / span);
            if this != span_at {
                emit(&mut points, span_at * span, most);
                // The spans between hold what the last change left.
                if this > span_at + 1 {
                    emit(&mut points, (span_at + 1) * span, now);
                }
                (span_at, most) = (this, now);
            }
            now = bytes;
            most = most.max(bytes);
        }
        emit(&mut points, span_at * span, most);
        ReservedCurve {
            size,
            commands,
            points,
        }
    }
}

/// A series predicted by its allocation stream: whether the runs' allocations match one
/// to one, how each size follows the series' size, and how well replays reproduce the
/// measured sizes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StreamSeries {
    /// Why the runs' allocations cannot be matched, where they cannot (the group fits
    /// then answer alone).
    pub mismatch: Option<stream::Mismatch>,
    /// Where the runs' streams differ but their allocations match in order: what is left
    /// without a counterpart (null: they match one to one, or not at all).
    pub unmatched: Option<stream::Unmatched>,
    /// Allocations of the largest size measured with a counterpart in every run (the
    /// blocks from before recording included).
    pub allocations: u64,
    pub laws: stream::LawCounts,
    /// Each measured size's own stream replayed, against its recording.
    pub own: Vec<stream::StreamCheck>,
    /// Each measured size predicted from the others and replayed (three sizes or more).
    pub held_out: Vec<stream::StreamCheck>,
    /// Each measured size's recorded reserved bytes over its stream.
    pub reserved_over_time: Vec<ReservedCurve>,
}

/// A group that decides a prediction.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Deciding {
    pub callsite: String,
    pub category: String,
    pub exponent: u32,
    /// Its bytes at the target minus at the largest size measured.
    pub change_bytes: i64,
}

/// The largest size a device takes with the headroom.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Largest {
    pub gpu: Gpu,
    /// None: not even the smallest size.
    pub size: Option<u64>,
    /// The search stopped at twice the largest size measured: the device may take more.
    pub at_limit: bool,
    /// Found by replaying each size's predicted stream at the device's capacity (else
    /// from the group fits' totals).
    pub by_replay: bool,
}

/// A series of runs of one workload at several sizes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Series {
    pub vary: Vary,
    /// Sizes, ascending, and the run (index into [`BudgetReport::runs`]) of each.
    pub sizes: Vec<u64>,
    /// Runs of a size another run stands for (it reserved more): repeats, read only for
    /// the headroom.
    pub repeats: Vec<usize>,
    /// With batch and sequence varying, each size's shape (batch, sequence), in the same
    /// order; empty otherwise.
    pub shapes: Vec<stream::Shape>,
    pub runs: Vec<usize>,
    pub lines: Vec<LineFit>,
    pub groups: Vec<GroupTerm>,
    /// Predicting each measured size from the others (three sizes or more): (size,
    /// relative error of the total).
    pub held_out: Vec<(u64, f64)>,
    /// The prediction by allocation stream, or why the runs' allocations do not match.
    pub stream: StreamSeries,
    pub prediction: Option<Prediction>,
    /// The size asked for (`--target`; where batch and sequence both vary, their
    /// product, with `prediction.shape`).
    pub target: Option<u64>,
    /// Whether a prediction was asked for and given: false where a caveat refuses it
    /// (the first refusing caveat says why).
    pub trusted: bool,
    pub largest: Vec<Largest>,
    pub caveats: Vec<Caveat>,
}

/// `budget`'s answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BudgetReport {
    pub schema_version: u32,
    /// The headroom the fits use, a fraction.
    pub headroom: f64,
    /// Where it comes from.
    pub headroom_evidence: Headroom,
    pub runs: Vec<RunBudget>,
    /// The run whose total decides the fits (the largest: devices do not pool memory).
    pub deciding_run: usize,
    /// Several runs whose weights differ by more than 2% (smallest, largest): separate
    /// runs (other models), not the ranks of one job; the fits are still the largest's.
    pub unrelated_weights: Option<(u64, u64)>,
    pub fits: Vec<Fit>,
    pub series: Option<Series>,
}

/// Fits `k · s^e` for each exponent allowed and keeps the best (least squares in bytes;
/// ties to the smaller exponent).
fn fit_group(sizes: &[f64], bytes: &[f64], max_exponent: u32) -> (u32, f64) {
    let mut best = (0, 0.0, f64::INFINITY);
    for e in 0..=max_exponent {
        let x: Vec<f64> = sizes.iter().map(|s| s.powi(e as i32)).collect();
        let xx: f64 = x.iter().map(|v| v * v).sum();
        let k = if xx > 0.0 {
            x.iter().zip(bytes).map(|(a, b)| a * b).sum::<f64>() / xx
        } else {
            0.0
        };
        let k = k.max(0.0);
        let err: f64 = x.iter().zip(bytes).map(|(a, b)| (k * a - b).powi(2)).sum();
        if err < best.2 * (1.0 - 1e-9) {
            best = (e, k, err);
        }
    }
    (best.0, best.1)
}

/// What the fitted lines and groups give at a size: (line bytes, requested total).
fn predict_lines(groups: &[GroupTerm], size: f64) -> BTreeMap<Line, u64> {
    let mut lines = BTreeMap::new();
    for g in groups {
        let line = lines.entry(g.line).or_insert(0u64);
        *line = line.saturating_add(
            (g.coefficient * size.powi(g.exponent as i32))
                .round()
                .max(0.0) as u64,
        );
    }
    lines
}

/// Terms of the groups of `runs` at `sizes`.
fn group_terms(runs: &[&RunBudget], sizes: &[u64], vary: Vary) -> Vec<GroupTerm> {
    let mut keys: Vec<&(String, String)> = runs.iter().flat_map(|r| r.groups.keys()).collect();
    keys.sort();
    keys.dedup();
    // Attention's scores grow with the square of the sequence; nothing in a batch does.
    let max_exponent = if vary == Vary::Seq { 2 } else { 1 };
    let xs: Vec<f64> = sizes.iter().map(|&s| s as f64).collect();
    keys.into_iter()
        .map(|key| {
            let measured: Vec<u64> = runs
                .iter()
                .map(|r| r.groups.get(key).copied().unwrap_or(0))
                .collect();
            let ys: Vec<f64> = measured.iter().map(|&b| b as f64).collect();
            let (exponent, coefficient) = fit_group(&xs, &ys, max_exponent);
            GroupTerm {
                callsite: key.0.clone(),
                category: key.1.clone(),
                line: Line::of_category(&key.1),
                exponent,
                coefficient,
                measured_bytes: measured,
            }
        })
        .collect()
}

/// The allocator's overhead as a function of the size: `a + b · size` by least squares
/// (the cache and rounding grow with what the run allocates, not faster), never below
/// the least measured.
fn overhead_fit(runs: &[&RunBudget], sizes: &[u64]) -> (f64, f64, f64) {
    let xs: Vec<f64> = sizes.iter().map(|&s| s as f64).collect();
    let ys: Vec<f64> = runs
        .iter()
        .map(|r| r.line(Line::AllocatorOverhead) as f64)
        .collect();
    let n = xs.len().max(1) as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
    let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let b = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
    let floor = ys.iter().copied().fold(f64::INFINITY, f64::min).max(0.0);
    (my - b * mx, b, if floor.is_finite() { floor } else { 0.0 })
}

/// The full prediction of every line at a size from fitted groups.
fn prediction_at(
    groups: &[GroupTerm],
    overhead: (f64, f64, f64),
    outside: u64,
    size: u64,
) -> (Vec<(Line, u64)>, u64) {
    let fitted = predict_lines(groups, size as f64);
    let lines: Vec<(Line, u64)> = Line::ALL
        .iter()
        .map(|&l| {
            let b = match l {
                Line::AllocatorOverhead => (overhead.0 + overhead.1 * size as f64)
                    .max(overhead.2)
                    .round() as u64,
                Line::OutsideAllocator => outside,
                Line::FailedRequest => 0,
                _ => fitted.get(&l).copied().unwrap_or(0),
            };
            (l, b)
        })
        .collect();
    let total = sum_bytes(lines.iter().map(|&(_, b)| b));
    (lines, total)
}

/// Options of a series fit.
#[derive(Debug, Clone)]
pub struct SeriesOptions {
    pub vary: Vary,
    /// The size of each run (index into the runs), as given or read from its name (with
    /// batch and sequence varying, its tokens).
    pub sizes: Vec<(usize, u64)>,
    /// With batch and sequence varying, each run's shape (index into the runs).
    pub shapes: Vec<(usize, stream::Shape)>,
    pub target: Option<u64>,
    /// With batch and sequence varying, the target's shape (`target` is its tokens).
    pub target_shape: Option<stream::Shape>,
    pub gpus: Vec<Gpu>,
    pub headroom: f64,
}

impl SeriesOptions {
    /// Run `r`'s batch × sequence shape ((0, 0) where only one of them varies).
    fn shape_of(&self, r: usize) -> stream::Shape {
        self.shapes
            .iter()
            .find(|&&(i, _)| i == r)
            .map_or((0, 0), |&(_, s)| s)
    }

    /// The runs of each size (and shape), ascending, each size's runs in their order:
    /// more than one are repeated runs.
    fn runs_by_size(&self) -> BTreeMap<(u64, stream::Shape), Vec<usize>> {
        let mut by_size: BTreeMap<(u64, stream::Shape), Vec<usize>> = BTreeMap::new();
        for &(r, size) in &self.sizes {
            by_size.entry((size, self.shape_of(r))).or_default().push(r);
        }
        for runs in by_size.values_mut() {
            runs.sort_unstable();
        }
        by_size
    }
}

/// A series' fitted model: its groups, the allocator's overhead (`a + b · size` and its
/// floor, as [`overhead_fit`] gives) and the memory outside the allocator.
struct Model<'a> {
    groups: &'a [GroupTerm],
    overhead: (f64, f64, f64),
    outside: u64,
}

impl Model<'_> {
    /// Every line at `size`, and their total.
    fn at(&self, size: u64) -> (Vec<(Line, u64)>, u64) {
        prediction_at(self.groups, self.overhead, self.outside, size)
    }
}

/// Fits the runs of a series and predicts the target, with what cannot be trusted.
pub fn fit_series(runs: &[RunBudget], options: &SeriesOptions) -> Series {
    let product = options.vary == Vary::BatchSeq;
    // Files of one size are repeats: the first that reserved the most stands for the
    // size (their spread is in the headroom).
    let mut order: Vec<(u64, stream::Shape, usize)> = Vec::new();
    let mut repeats: Vec<usize> = Vec::new();
    for ((size, shape), members) in options.runs_by_size() {
        let kept = members
            .iter()
            .copied()
            .reduce(|kept, r| {
                if runs[r].peak_reserved_bytes > runs[kept].peak_reserved_bytes {
                    r
                } else {
                    kept
                }
            })
            .expect("a size has a run");
        repeats.extend(members.into_iter().filter(|&r| r != kept));
        order.push((size, shape, kept));
    }
    repeats.sort_unstable();
    let sizes: Vec<u64> = order.iter().map(|&(s, _, _)| s).collect();
    let shapes: Vec<stream::Shape> = if product {
        order.iter().map(|&(_, s, _)| s).collect()
    } else {
        Vec::new()
    };
    let indices: Vec<usize> = order.iter().map(|&(_, _, r)| r).collect();
    let recorded: Vec<Option<&stream::Stream>> =
        indices.iter().map(|&i| runs[i].stream.as_deref()).collect();
    let paired = stream::paired_before_recording(&recorded);
    let streams: Vec<Option<&stream::Stream>> =
        paired.streams.iter().map(|s| s.as_deref()).collect();
    let matched = stream::StreamFit::new(&streams, &sizes, &indices).map(|f| {
        if product {
            f.with_shapes(shapes.clone())
        } else {
            f
        }
    });
    // Where the allocations match, blocks from before recording that grow with the size
    // are inputs: the series counts them with the activations, in every line it shows.
    let relined: Vec<std::borrow::Cow<RunBudget>> = indices
        .iter()
        .zip(&paired.inputs)
        .map(|(&i, inputs)| match &matched {
            Ok(_) if !inputs.is_empty() => std::borrow::Cow::Owned(with_inputs(&runs[i], inputs)),
            _ => std::borrow::Cow::Borrowed(&runs[i]),
        })
        .collect();
    let series_runs: Vec<&RunBudget> = relined.iter().map(|r| r.as_ref()).collect();
    let mut caveats = workload_caveats(&series_runs, &sizes);
    // A call site's bytes at the peak follow no one size where batch and sequence both
    // vary: only the allocations, matched one to one, predict such a series.
    let groups = if product {
        Vec::new()
    } else {
        group_terms(&series_runs, &sizes, options.vary)
    };
    let overhead = overhead_fit(&series_runs, &sizes);
    let outside = series_runs
        .iter()
        .map(|r| r.outside.counted_bytes)
        .max()
        .unwrap_or(0);
    let lines = line_fits(&series_runs, &sizes, &groups);
    let held_out = if product {
        Vec::new()
    } else {
        held_out(&series_runs, &sizes, options.vary, outside)
    };
    // A line that shrinks at the peak of a larger size, or call sites that differ at the
    // peaks, say the runs differ, unless their allocations match: then the peak moved (to
    // another phase, other call sites), and the replay follows it.
    match &matched {
        Err(_) if product => caveats.push(Caveat::ProductUnmatched),
        Err(_) => {
            caveats.extend(few_shared_groups(&series_runs, &indices));
            caveats.extend(not_monotonic(&lines, &series_runs));
        }
        Ok(_) => {}
    }
    // Past twice the largest measured (in each of batch and sequence where both vary):
    // no prediction.
    let largest_measured = sizes.last().copied().unwrap_or(0);
    let beyond = options
        .target
        .and_then(|target| match options.target_shape {
            Some((b, s)) => [
                (b, shapes.iter().map(|x| x.0).max()),
                (s, shapes.iter().map(|x| x.1).max()),
            ]
            .into_iter()
            .find(|&(t, m)| t > 2 * m.unwrap_or(0))
            .map(|(t, m)| (t, m.unwrap_or(0))),
            None => (target > 2 * largest_measured).then_some((target, largest_measured)),
        });
    // The target's stream is replayed beside the checks of the measured sizes, which
    // decide whether it is shown.
    let (stream_series, target_replay) = rayon::join(
        || stream_series(&matched, &series_runs),
        || match (&matched, options.target) {
            (Ok(f), Some(target)) if beyond.is_none() && !caveats.iter().any(Caveat::refuses) => {
                Some(replay_target(f, target, outside, options))
            }
            _ => None,
        },
    );
    // The held-out errors that judge the prediction: the replayed streams' when the
    // runs' allocations match (the larger of requested and reserved), else the groups'.
    let judged: Vec<(u64, f64)> = if matched.is_ok() && sizes.len() >= 3 {
        stream_series
            .held_out
            .iter()
            .map(|c| {
                let e = if c.reserved_error.abs() >= c.requested_error.abs() {
                    c.reserved_error
                } else {
                    c.requested_error
                };
                (c.size, e)
            })
            .collect()
    } else {
        held_out.clone()
    };
    if let Some(&(size, error)) = judged
        .iter()
        .filter(|(_, e)| e.abs() > MAX_HELD_OUT_ERROR)
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()).then(b.0.cmp(&a.0)))
    {
        caveats.push(Caveat::LargeHeldOutError { size, error });
    }
    let model = Model {
        groups: &groups,
        overhead,
        outside,
    };
    let refused = caveats.iter().any(Caveat::refuses);
    let prediction = options.target.and_then(|target| {
        if let Some((target, largest)) = beyond {
            caveats.push(Caveat::BeyondRange { target, largest });
            return None;
        }
        if refused {
            return None;
        }
        let mut p = predict(&model, target, largest_measured, &judged, options);
        let by_groups = sum_bytes(p.lines.iter().filter(|(l, _)| l.fitted()).map(|&(_, b)| b));
        if let (Ok(f), Some(t)) = (&matched, target_replay) {
            predict_by_stream(&mut p, f, t, &indices);
        }
        // One story: what the table calls constant stays so, and two sizes (no held-out
        // check) must agree with the group fits they came from.
        if let Some(c) = contradiction(&p, &lines, by_groups, sizes.len()) {
            caveats.push(c);
            return None;
        }
        Some(p)
    });
    let refused = caveats.iter().any(Caveat::refuses);
    // Where batch and sequence both vary, no one size is searched.
    let largest = if refused || product {
        Vec::new()
    } else {
        use rayon::prelude::*;
        options
            .gpus
            .par_iter()
            .map(|gpu| match &matched {
                Ok(f) if f.largest().allocations() <= MAX_SEARCHED_ALLOCATIONS => {
                    largest_by_replay(f, gpu, 2 * largest_measured, outside, options.headroom)
                }
                _ => largest_size(&model, gpu, 2 * largest_measured, options.headroom),
            })
            .collect()
    };
    Series {
        vary: options.vary,
        sizes,
        shapes,
        runs: indices,
        repeats,
        lines,
        groups,
        held_out,
        stream: stream_series,
        target: options.target,
        trusted: prediction.is_some() && !refused,
        prediction,
        largest,
        caveats,
    }
}

/// The largest stream whose largest size is searched by replaying it (each probe replays
/// it once per device): past it, the group fits' totals decide.
const MAX_SEARCHED_ALLOCATIONS: usize = 200_000;

/// The series' streams matched, fitted and checked.
fn stream_series(
    matched: &Result<stream::StreamFit, stream::Mismatch>,
    series_runs: &[&RunBudget],
) -> StreamSeries {
    match matched {
        Ok(f) => {
            let recorded: Vec<(u64, u64)> = series_runs
                .iter()
                .map(|r| (r.requested_bytes, r.peak_reserved_bytes))
                .collect();
            let (_, laws) = f.sizes_at(f.point(f.sizes().len() - 1), &f.all());
            let own = f.own(&recorded);
            let held_out = f.held_out(&recorded, &own);
            let reserved_over_time = f
                .streams()
                .iter()
                .zip(f.sizes())
                .map(|(s, &size)| {
                    ReservedCurve::of(size, s.commands(), s.before(), s.recorded_reserved())
                })
                .collect();
            StreamSeries {
                mismatch: None,
                unmatched: f.unmatched().cloned(),
                allocations: f.matched(),
                laws,
                own,
                held_out,
                reserved_over_time,
            }
        }
        Err(m) => StreamSeries {
            mismatch: Some(m.clone()),
            unmatched: None,
            allocations: 0,
            laws: stream::LawCounts::default(),
            own: Vec::new(),
            held_out: Vec::new(),
            reserved_over_time: Vec::new(),
        },
    }
}

/// The target's stream replayed with no limit, and at each device's capacity.
struct TargetReplay {
    sizes: Vec<u64>,
    laws: Vec<Option<stream::Law>>,
    free: stream::StreamReplay,
    total_bytes: u64,
    fits: Vec<Fit>,
}

/// The target's stream built from the fit and replayed: with no limit, then on each
/// device (a replay at its capacity where the one with no limit does not serve).
fn replay_target(
    f: &stream::StreamFit,
    target: u64,
    outside: u64,
    options: &SeriesOptions,
) -> TargetReplay {
    use rayon::prelude::*;
    let at = match options.target_shape {
        Some(shape) => stream::At::Shape(shape),
        None => stream::At::Size(target),
    };
    let (sizes, laws) = f.sizes_and_laws(at, &f.all());
    let largest = f.largest();
    let settings = largest.settings().clone();
    let free = largest.replay(&sizes, &settings, None, None);
    let total_bytes = sum_bytes([free.reserved_peak_bytes, outside]);
    let fits = options
        .gpus
        .par_iter()
        .map(|g| {
            fit_stream(
                g,
                (largest, &sizes, &free),
                outside,
                total_bytes,
                options.headroom,
            )
        })
        .collect();
    TargetReplay {
        sizes,
        laws,
        free,
        total_bytes,
        fits,
    }
}

/// The prediction's total, lines and fits from the target's stream replayed: the lines
/// are what is live at its peak of requested bytes (each allocation in the line it has
/// in the largest size measured), the allocator's overhead as the model computes it, and
/// each device's verdict from a replay at its capacity.
fn predict_by_stream(
    p: &mut Prediction,
    f: &stream::StreamFit,
    t: TargetReplay,
    indices: &[usize],
) {
    let largest = f.largest();
    let TargetReplay {
        sizes,
        laws,
        free,
        total_bytes,
        fits,
    } = t;
    // What is live at the predicted peak, by the lines of the largest size measured.
    let live = largest.live_by_line(&sizes, free.requested_peak_at);
    for (l, b) in p.lines.iter_mut() {
        if l.fitted() {
            *b = live[*l as usize];
        } else if *l == Line::AllocatorOverhead {
            *b = free
                .reserved_peak_bytes
                .saturating_sub(free.requested_peak_bytes);
        }
    }
    p.total_bytes = total_bytes;
    p.stream = Some(StreamAt {
        requested_peak_bytes: free.requested_peak_bytes,
        reserved_peak_bytes: free.reserved_peak_bytes,
        peak_event: largest.event(free.requested_peak_at),
        peak_run: indices[indices.len() - 1],
        peak_phase: largest.phase(free.requested_peak_at),
        reserved_over_time: ReservedCurve::of(
            p.size,
            largest.commands(),
            largest.before(),
            &free.reserved_series,
        ),
        callsites: largest.live_by_site(&sizes, free.requested_peak_at, SITES_AT_PEAK),
        unmatched_bytes: largest
            .live_bytes_where(&sizes, free.requested_peak_at, |j| !f.is_matched(j)),
    });
    p.fits = fits;
    // What changes from the largest size measured, as the replayed streams show it
    // (where batch and sequence both vary, no one exponent says how).
    if p.shape.is_none() {
        p.deciding = largest
            .site_changes(&sizes, free.requested_peak_at, &laws)
            .into_iter()
            .take(3)
            .map(|c| Deciding {
                callsite: c.live.callsite,
                category: c.live.line.category().to_string(),
                exponent: match c.law {
                    Some(stream::Law::Linear) => 1,
                    Some(stream::Law::Quadratic | stream::Law::Inexact) => 2,
                    Some(stream::Law::Constant) | None => 0,
                },
                change_bytes: c.change_bytes,
            })
            .collect();
    }
}

/// A predicted stream on `gpu`: replayed at its capacity less `outside` (runs out of
/// memory: does not fit, and whether expandable segments let it through; else its peak
/// reserved plus `outside`, with the headroom).
///
/// `stream` is the stream, its sizes and its replay with no limit, which serves every
/// capacity it does not exceed.
fn fit_stream(
    gpu: &Gpu,
    stream: (&stream::Stream, &[u64], &stream::StreamReplay),
    outside: u64,
    total: u64,
    headroom: f64,
) -> Fit {
    let (s, sizes, free) = stream;
    let capacity = gpu.capacity_bytes.saturating_sub(outside);
    let settings = s.settings().clone();
    let unlimited_serves = free.first_oom.is_none()
        && crate::allocator::scenario::limit_changes_nothing(
            &settings,
            free.reserved_peak_bytes,
            capacity,
        );
    let r = if unlimited_serves {
        free.clone()
    } else {
        s.replay(sizes, &settings, Some(capacity), Some(gpu.capacity_bytes))
    };
    let fits_with_expandable =
        (r.first_oom.is_some() && !settings.expandable_segments).then(|| {
            let e = crate::allocator::Settings {
                expandable_segments: true,
                ..settings.clone()
            };
            s.replay(sizes, &e, Some(capacity), Some(gpu.capacity_bytes))
                .first_oom
                .is_none()
        });
    fit_replayed(
        gpu,
        stream_replayed(s, &r, fits_with_expandable),
        total,
        outside,
        headroom,
    )
}

/// A predicted stream's replay as a fit reads it: its first OOM at the trace entry of
/// the same place in `s`'s run.
fn stream_replayed(
    s: &stream::Stream,
    r: &stream::StreamReplay,
    fits_with_expandable: Option<bool>,
) -> Replayed {
    Replayed {
        model_exact: true,
        peak_reserved_bytes: r.reserved_peak_bytes,
        oom_event: r.first_oom.map(|(i, _, _)| s.event(i).unwrap_or(0)),
        oom_cause: r.first_oom.map(|(_, c, _)| c),
        fits_with_expandable,
        start_does_not_fit: false,
    }
}

/// The largest size `gpu` takes with the headroom, each size's predicted stream replayed
/// at its capacity less `outside`, searched up to `limit`.
fn largest_by_replay(
    f: &stream::StreamFit,
    gpu: &Gpu,
    limit: u64,
    outside: u64,
    headroom: f64,
) -> Largest {
    let all = f.all();
    let s = f.largest();
    let settings = s.settings().clone();
    let capacity = gpu.capacity_bytes.saturating_sub(outside);
    let takes = |size: u64| {
        let (sizes, _) = f.sizes_at(stream::At::Size(size), &all);
        let r = s.replay(&sizes, &settings, Some(capacity), Some(gpu.capacity_bytes));
        // A stream that runs out of memory does not fit whatever the total.
        fit_replayed(gpu, stream_replayed(s, &r, None), 0, outside, headroom).verdict
            == Verdict::Fits
    };
    let (size, at_limit) = largest_taken(takes, limit);
    Largest {
        gpu: gpu.clone(),
        size,
        at_limit,
        by_replay: true,
    }
}

/// `run` with the blocks from before recording that grow with the size (`inputs`, by
/// call site and the line its categories gave them) moved to the activations: in its
/// lines and in its groups.
fn with_inputs(run: &RunBudget, inputs: &BTreeMap<(String, Line), u64>) -> RunBudget {
    let mut r = run.clone();
    for ((site, from), &bytes) in inputs {
        let mut moved = 0u64;
        for (key, b) in r.groups.iter_mut() {
            if key.0 == *site && Line::of_category(&key.1) == *from {
                let m = (*b).min(bytes - moved);
                *b -= m;
                moved += m;
            }
        }
        r.groups.retain(|_, b| *b > 0);
        if moved > 0 {
            let to = r
                .groups
                .entry((site.clone(), Line::Activations.category().to_string()))
                .or_default();
            *to = to.saturating_add(moved);
        }
        let moved = r.lines.iter_mut().find(|l| l.line == *from).map_or(0, |l| {
            let m = l.bytes.min(bytes);
            l.bytes -= m;
            m
        });
        match r.lines.iter_mut().find(|l| l.line == Line::Activations) {
            Some(l) => l.bytes = l.bytes.saturating_add(moved),
            None => r.lines.push(BudgetLine {
                line: Line::Activations,
                bytes: moved,
                share: 0.0,
                persistent: false,
                categories: Vec::new(),
                inferred_bytes: 0,
            }),
        }
        if from.persistent() {
            r.persistent_bytes = r.persistent_bytes.saturating_sub(moved);
            r.working_bytes = r.working_bytes.saturating_add(moved);
        }
    }
    r.lines
        .retain(|l| l.bytes > 0 || l.line == Line::Activations);
    r.lines.sort_by_key(|l| l.line);
    for l in &mut r.lines {
        l.share = round4(l.bytes as f64 / r.total_bytes.max(1) as f64);
    }
    r
}

/// Whether the runs are one workload: the same weights (within 2%), precision stated in
/// their names, allocator settings and number of devices; and whether two sizes leave
/// the fit without an error band.
/// The smallest and largest weights among `runs`, and whether they differ by more than
/// 2% of the largest (not one model).
fn weights_of<'r>(runs: impl IntoIterator<Item = &'r RunBudget>) -> ((u64, u64), bool) {
    let (mut lo, mut hi) = (u64::MAX, 0);
    for r in runs {
        let w = r.line(Line::Weights);
        (lo, hi) = (lo.min(w), hi.max(w));
    }
    let lo = lo.min(hi);
    ((lo, hi), (hi - lo) as f64 > 0.02 * hi as f64)
}

fn workload_caveats(series_runs: &[&RunBudget], sizes: &[u64]) -> Vec<Caveat> {
    let mut caveats = Vec::new();
    // The same model and precision: weights within 2% of each other.
    let ((lo, hi), differ) = weights_of(series_runs.iter().copied());
    if differ {
        caveats.push(Caveat::WeightsDiffer {
            smallest_bytes: lo,
            largest_bytes: hi,
        });
    }
    // A name that states no precision is the default's (fp32); a mix with one that
    // states another is not one workload.
    let mut precisions: Vec<String> = series_runs
        .iter()
        .map(|r| {
            precision_from_name(&r.path)
                .unwrap_or("not stated")
                .to_string()
        })
        .collect();
    precisions.sort();
    precisions.dedup();
    if precisions.len() > 1 {
        caveats.push(Caveat::PrecisionsDiffer { precisions });
    }
    let mut settings: Vec<String> = series_runs.iter().map(|r| r.settings.clone()).collect();
    settings.sort();
    settings.dedup();
    if settings.len() > 1 {
        caveats.push(Caveat::SettingsDiffer { settings });
    }
    let mut counts: Vec<usize> = series_runs.iter().map(|r| r.device_count).collect();
    counts.sort_unstable();
    counts.dedup();
    if counts.len() > 1 {
        caveats.push(Caveat::DevicesDiffer { counts });
    }
    if sizes.len() == 2 {
        caveats.push(Caveat::TwoSizes);
    }
    caveats
}

/// Whether the runs share their groups: the share of each run's bytes at its peak in
/// groups (call site and category) every run has, the least of them against
/// [`MIN_SHARED_SHARE`]. `indices` are the runs' places in the report.
fn few_shared_groups(series_runs: &[&RunBudget], indices: &[usize]) -> Option<Caveat> {
    let (first, rest) = series_runs.split_first()?;
    let shared = |key: &(String, String)| rest.iter().all(|r| r.groups.contains_key(key));
    let (share, run) = series_runs
        .iter()
        .zip(indices)
        .map(|(r, &i)| {
            let all = sum_bytes(r.groups.values().copied());
            let common = sum_bytes(
                r.groups
                    .iter()
                    .filter(|(k, _)| first.groups.contains_key(*k) && shared(k))
                    .map(|(_, &b)| b),
            );
            // A run with nothing alive at its peak has nothing to differ by.
            let share = if all == 0 {
                1.0
            } else {
                common as f64 / all as f64
            };
            (share, i)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))?;
    (share < MIN_SHARED_SHARE).then(|| Caveat::FewSharedGroups {
        run,
        shared_share: round4(share),
    })
}

/// Each fitted line: measured and fitted at every size, how it grows (the largest
/// exponent among its groups holding 1% of it at the largest size), and whether it ever
/// goes down by more than 2% as the size goes up.
fn line_fits(series_runs: &[&RunBudget], sizes: &[u64], groups: &[GroupTerm]) -> Vec<LineFit> {
    Line::ALL
        .iter()
        .filter(|l| l.fitted())
        .map(|&line| {
            let measured: Vec<u64> = series_runs.iter().map(|r| r.line(line)).collect();
            let fitted: Vec<u64> = sizes
                .iter()
                .map(|&s| {
                    predict_lines(groups, s as f64)
                        .get(&line)
                        .copied()
                        .unwrap_or(0)
                })
                .collect();
            let at_largest: f64 = measured.last().copied().unwrap_or(0) as f64;
            let grows_as = groups
                .iter()
                .filter(|g| g.line == line)
                .filter(|g| {
                    g.measured_bytes.last().copied().unwrap_or(0) as f64 >= 0.01 * at_largest
                })
                .map(|g| g.exponent)
                .max()
                .unwrap_or(0);
            let not_monotonic = measured
                .windows(2)
                .any(|w| (w[1] as f64) < w[0] as f64 * 0.98);
            LineFit {
                line,
                measured_bytes: measured,
                fitted_bytes: fitted,
                grows_as,
                not_monotonic,
            }
        })
        .collect()
}

/// A caveat for each line that goes down as the size goes up while holding a twentieth
/// of some run's total.
fn not_monotonic(lines: &[LineFit], series_runs: &[&RunBudget]) -> Vec<Caveat> {
    let mut caveats = Vec::new();
    for l in lines {
        let matters = l
            .measured_bytes
            .iter()
            .zip(series_runs)
            .any(|(&b, r)| b as f64 >= 0.05 * r.total_bytes as f64);
        if l.not_monotonic && matters {
            caveats.push(Caveat::NotMonotonic { line: l.line });
        }
    }
    caveats
}

/// Each measured size predicted from the others (three sizes or more): (size, relative
/// error of the total, at four decimals).
///
/// The fit of each group without run `k` is [`fit_group`]'s from sums over the other runs,
/// each taken as the sum of the runs before `k` and of those after it (no subtraction, so
/// no cancellation); a group's sums run over the runs that have it alone, the others
/// adding nothing to them. With `n` sizes, `G` groups and `N` (run, group) measures, all
/// the held-out fits take O(n·G + N log G) and the allocator's overhead O(n²) additions,
/// rather than refitting every group for every size (O(n²·G)).
fn held_out(
    series_runs: &[&RunBudget],
    sizes: &[u64],
    vary: Vary,
    outside: u64,
) -> Vec<(u64, f64)> {
    let n = sizes.len();
    if n < 3 {
        return Vec::new();
    }
    let measures: Vec<&BTreeMap<(String, String), u64>> =
        series_runs.iter().map(|r| &r.groups).collect();
    let totals = held_out_group_totals(&measures, sizes, vary);
    (0..n)
        .map(|k| {
            let others: Vec<&RunBudget> = series_runs
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != k)
                .map(|(_, r)| *r)
                .collect();
            let other_sizes: Vec<u64> = sizes
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != k)
                .map(|(_, &s)| s)
                .collect();
            let (_, rest) =
                prediction_at(&[], overhead_fit(&others, &other_sizes), outside, sizes[k]);
            let total = totals[k].saturating_add(rest);
            let measured = series_runs[k].total_bytes as f64;
            (
                sizes[k],
                round4((total as f64 - measured) / measured.max(1.0)),
            )
        })
        .collect()
}

/// The groups' part of each held-out total: for each run `k`, the sum over the groups of
/// their fit without run `k` ([`fit_group`]'s least squares, from sums) at `sizes[k]`.
/// `measures[i]` holds run `i`'s bytes by group.
fn held_out_group_totals<K: Ord>(
    measures: &[&BTreeMap<K, u64>],
    sizes: &[u64],
    vary: Vary,
) -> Vec<u64> {
    let n = sizes.len();
    let max_exponent: u32 = if vary == Vary::Seq { 2 } else { 1 };
    let exponents = 0..=max_exponent;
    let xs: Vec<f64> = sizes.iter().map(|&s| s as f64).collect();
    // x^e for each exponent and run, and Σ x^2e over every run but k.
    let x_pow: Vec<Vec<f64>> = exponents
        .clone()
        .map(|e| xs.iter().map(|x| x.powi(e as i32)).collect())
        .collect();
    let xx_without: Vec<Vec<f64>> = x_pow
        .iter()
        .map(|x| {
            let sq: Vec<f64> = x.iter().map(|v| v * v).collect();
            without_each(&sq)
        })
        .collect();
    // Each group's measures: (run, bytes), in run order, for the runs that have bytes.
    let mut points: BTreeMap<&K, Vec<(usize, f64)>> = BTreeMap::new();
    for (i, groups) in measures.iter().enumerate() {
        for (key, &b) in *groups {
            if b > 0 {
                points.entry(key).or_default().push((i, b as f64));
            }
        }
    }
    // Each held-out total: the groups' terms, then the overhead and the outside.
    let mut totals = vec![0u64; n];
    for pts in points.values() {
        let ys: Vec<f64> = pts.iter().map(|&(_, y)| y).collect();
        let yy: Vec<f64> = ys.iter().map(|y| y * y).collect();
        let yy_without = without_each(&yy);
        let yy_all = yy.iter().sum::<f64>();
        let xy_without: Vec<(Vec<f64>, f64)> = x_pow
            .iter()
            .map(|x| {
                let xy: Vec<f64> = pts.iter().map(|&(i, y)| x[i] * y).collect();
                let all = xy.iter().sum::<f64>();
                (without_each(&xy), all)
            })
            .collect();
        let mut at = 0;
        for (k, total) in totals.iter_mut().enumerate() {
            // The sums without run k: the group's own sums lose k's term when it has one.
            let here = pts.get(at).is_some_and(|&(i, _)| i == k);
            let (syy, sxy): (f64, Vec<f64>) = if here {
                (
                    yy_without[at],
                    xy_without.iter().map(|(w, _)| w[at]).collect(),
                )
            } else {
                (yy_all, xy_without.iter().map(|&(_, all)| all).collect())
            };
            if here {
                at += 1;
            }
            // As fit_group: the least squares k·x^e for each exponent, the least error
            // kept (ties to the smaller exponent).
            let mut best = (0usize, 0.0, f64::INFINITY);
            for e in exponents.clone() {
                let e = e as usize;
                let sxx = xx_without[e][k];
                let c = if sxx > 0.0 { sxy[e] / sxx } else { 0.0 };
                let c = c.max(0.0);
                let err = (c * c * sxx - 2.0 * c * sxy[e] + syy).max(0.0);
                if err < best.2 * (1.0 - 1e-9) {
                    best = (e, c, err);
                }
            }
            let term = (best.1 * x_pow[best.0][k]).round().max(0.0) as u64;
            *total = total.saturating_add(term);
        }
    }
    totals
}

/// For each index, the sum of every other value: the sum of those before it plus the sum
/// of those after it (no subtraction, so a large value left out leaves no trace).
fn without_each(values: &[f64]) -> Vec<f64> {
    let mut after = vec![0.0; values.len() + 1];
    for i in (0..values.len()).rev() {
        after[i] = after[i + 1] + values[i];
    }
    let mut before = 0.0;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let s = before + after[i + 1];
            before += v;
            s
        })
        .collect()
}

/// The budget at `target`: every line, the error band the held-out predictions give,
/// the fits on the devices asked about, and the groups deciding the growth.
fn predict(
    model: &Model,
    target: u64,
    largest_measured: u64,
    held_out: &[(u64, f64)],
    options: &SeriesOptions,
) -> Prediction {
    let (lines, total) = model.at(target);
    let band = held_out.iter().map(|&(_, e)| e.abs()).reduce(f64::max);
    Prediction {
        size: target,
        shape: options.target_shape,
        fits: options
            .gpus
            .iter()
            .map(|g| fit(g, total, options.headroom))
            .collect(),
        lines,
        total_bytes: total,
        error_band: band,
        deciding: deciding(model.groups, target, largest_measured),
        stream: None,
    }
}

/// Why a prediction contradicts the fits it came from, if it does: a line sized by the
/// model that the series table calls constant and the prediction moves (by more than
/// the held-out band, at least 2%), or with two sizes, live tensors at the replayed
/// peak more than [`MAX_HELD_OUT_ERROR`] from what the group fits sum to (`by_groups`).
fn contradiction(
    p: &Prediction,
    lines: &[LineFit],
    by_groups: u64,
    sizes: usize,
) -> Option<Caveat> {
    let band = p.error_band.unwrap_or(0.0).max(0.02);
    for l in lines
        .iter()
        .filter(|l| l.line.persistent() && l.grows_as == 0)
    {
        let measured = l.measured_bytes.last().copied().unwrap_or(0);
        let predicted = p
            .lines
            .iter()
            .find(|(line, _)| *line == l.line)
            .map_or(0, |&(_, b)| b);
        if measured > 0 && (predicted as f64 - measured as f64).abs() > band * measured as f64 {
            return Some(Caveat::ContradictsLine {
                line: l.line,
                measured_bytes: measured,
                predicted_bytes: predicted,
            });
        }
    }
    let replayed = p.stream.as_ref()?.requested_peak_bytes;
    let apart = (replayed as f64 - by_groups as f64).abs();
    (sizes == 2 && apart > MAX_HELD_OUT_ERROR * replayed.max(by_groups) as f64).then_some(
        Caveat::DisagreesWithGroupFits {
            replayed_bytes: replayed,
            group_bytes: by_groups,
        },
    )
}

/// The groups that grow the most from the largest size measured to the target, the
/// largest change first (at most three).
fn deciding(groups: &[GroupTerm], target: u64, largest_measured: u64) -> Vec<Deciding> {
    let mut growth: Vec<Deciding> = groups
        .iter()
        .map(|g| {
            let at = |s: u64| g.coefficient * (s as f64).powi(g.exponent as i32);
            Deciding {
                callsite: g.callsite.clone(),
                category: g.category.clone(),
                exponent: g.exponent,
                change_bytes: (at(target) - at(largest_measured)).round() as i64,
            }
        })
        .filter(|d| d.change_bytes != 0)
        .collect();
    growth.sort_by(|a, b| {
        b.change_bytes
            .abs()
            .cmp(&a.change_bytes.abs())
            .then(a.callsite.cmp(&b.callsite))
            .then(a.category.cmp(&b.category))
    });
    growth.into_iter().take(3).collect()
}

/// The largest size `gpu` takes with the headroom, searched up to `limit` (twice the
/// largest size measured): none when not even size 1 fits.
fn largest_size(model: &Model, gpu: &Gpu, limit: u64, headroom: f64) -> Largest {
    let takes = |s: u64| {
        let (_, total) = model.at(s);
        fit(gpu, total, headroom).verdict == Verdict::Fits
    };
    let (size, at_limit) = largest_taken(takes, limit);
    Largest {
        gpu: gpu.clone(),
        size,
        at_limit,
        by_replay: false,
    }
}

/// The largest size from 1 to `limit` that `takes` (which holds up to some size and not
/// past it: a prediction grows with the size), by bisection: None when not even 1;
/// whether the search stopped at `limit`.
fn largest_taken(takes: impl Fn(u64) -> bool, limit: u64) -> (Option<u64>, bool) {
    if !takes(1) {
        return (None, false);
    }
    if takes(limit) {
        return (Some(limit), true);
    }
    let (mut lo, mut hi) = (1, limit);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if takes(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (Some(lo), false)
}

/// The headroom when neither the files nor the user give one.
pub const ASSUMED_HEADROOM: f64 = 0.10;

/// Where a headroom comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadroomSource {
    /// `--headroom PCT`.
    Given,
    /// The most the peak varied in the files ([`Spread`]).
    Observed,
    /// Nothing in the files shows how much the peak varies: [`ASSUMED_HEADROOM`].
    Assumed,
}

/// What varied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpreadKind {
    /// The most requested in each whole step of one run after the first
    /// ([`RunBudget::step_peaks`]).
    Steps,
    /// The most reserved on each device of one file holding the same weights (the ranks
    /// of one job).
    Devices,
    /// The most reserved in each of files whose names differ only in their digits
    /// (`rank0`, `rank1`) and that hold the same weights: the ranks of one job.
    Ranks,
    /// The most reserved in each file of one size of a series: repeated runs.
    Repeats,
    /// The most reserved in a run's replay with equal free blocks taken lowest address
    /// first (PyTorch's order) and highest first ([`RunBudget::tie_break`]): how much the
    /// peak hangs on an order other addresses would shift. Not a run-to-run spread: alone
    /// it raises the assumed headroom, never lowers it.
    TieBreak,
}

/// How much a peak varied where the files repeat it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    pub kind: SpreadKind,
    /// The run (steps) or the file's first run (devices): an index into the runs.
    pub run: usize,
    /// How many peaks were compared.
    pub count: usize,
    pub smallest_bytes: u64,
    pub largest_bytes: u64,
    /// (largest - smallest) / largest, rounded to 4 decimals.
    pub spread: f64,
}

/// The headroom the fits use, and the spreads that decided it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Headroom {
    /// A fraction of the total.
    pub fraction: f64,
    pub source: HeadroomSource,
    /// Every spread the files show, largest first.
    pub spreads: Vec<Spread>,
}

/// The headroom for `runs`: `given` (a fraction) when the user gave one; else the most
/// the peak varied where the files repeat it (whole steps of one run; the ranks of one
/// job, unless the runs are a `series` of sizes); else [`ASSUMED_HEADROOM`].
pub fn headroom_of(
    runs: &[RunBudget],
    given: Option<f64>,
    series: Option<&SeriesOptions>,
) -> Headroom {
    let spread = |kind, run, peaks: &[u64]| {
        let (lo, hi) = (
            peaks.iter().copied().min().unwrap_or(0),
            peaks.iter().copied().max().unwrap_or(0),
        );
        Spread {
            kind,
            run,
            count: peaks.len(),
            smallest_bytes: lo,
            largest_bytes: hi,
            spread: round4((hi - lo) as f64 / hi.max(1) as f64),
        }
    };
    let mut spreads: Vec<Spread> = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.step_peaks.len() >= 2)
        .map(|(i, r)| spread(SpreadKind::Steps, i, &r.step_peaks))
        .collect();
    // Ranks of one job: the devices of one file, or files named alike but for digits,
    // holding the same weights (within 2%).
    let mut jobs: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate().filter(|_| series.is_none()) {
        let key: String = r.path.chars().filter(|c| !c.is_ascii_digit()).collect();
        jobs.entry(key).or_default().push(i);
    }
    for members in jobs.values().filter(|m| m.len() >= 2) {
        let ((lo, _), differ) = weights_of(members.iter().map(|&i| &runs[i]));
        if lo == 0 || differ {
            continue;
        }
        let one_file = members
            .iter()
            .all(|&i| runs[i].path == runs[members[0]].path);
        let peaks: Vec<u64> = members
            .iter()
            .map(|&i| runs[i].peak_reserved_bytes)
            .collect();
        let kind = if one_file {
            SpreadKind::Devices
        } else {
            SpreadKind::Ranks
        };
        spreads.push(spread(kind, members[0], &peaks));
    }
    // Files of one size in a series: repeated runs.
    if let Some(o) = series {
        for members in o.runs_by_size().values().filter(|m| m.len() >= 2) {
            let peaks: Vec<u64> = members
                .iter()
                .map(|&i| runs[i].peak_reserved_bytes)
                .collect();
            spreads.push(spread(SpreadKind::Repeats, members[0], &peaks));
        }
    }
    let repeats = !spreads.is_empty();
    spreads.extend(runs.iter().enumerate().filter_map(|(i, r)| {
        r.tie_break.map(|t| {
            spread(
                SpreadKind::TieBreak,
                i,
                &[t.peak_reserved_bytes, t.highest_first_bytes],
            )
        })
    }));
    spreads.sort_by(|a, b| b.spread.total_cmp(&a.spread).then(a.run.cmp(&b.run)));
    let (fraction, source) = match (given, spreads.first()) {
        (Some(g), _) => (g, HeadroomSource::Given),
        (None, Some(s)) if repeats || s.spread > ASSUMED_HEADROOM => {
            (s.spread, HeadroomSource::Observed)
        }
        (None, _) => (ASSUMED_HEADROOM, HeadroomSource::Assumed),
    };
    Headroom {
        fraction,
        source,
        spreads,
    }
}

/// The report: every run, the fits of the largest, and the series when asked.
pub fn report(
    runs: Vec<RunBudget>,
    gpus: &[Gpu],
    headroom: Headroom,
    series: Option<&SeriesOptions>,
) -> BudgetReport {
    let deciding_run = runs
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_bytes.cmp(&b.1.total_bytes).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i);
    let fits = runs.get(deciding_run).map_or(Vec::new(), |r| {
        gpus.iter()
            .map(|g| fit_run(g, r, headroom.fraction))
            .collect()
    });
    let series = series.map(|o| fit_series(&runs, o));
    let (range, differ) = weights_of(&runs);
    // The devices of one file are one process's, whatever each holds.
    let files = runs
        .iter()
        .map(|r| &r.path)
        .collect::<std::collections::BTreeSet<_>>();
    let unrelated_weights = (series.is_none() && files.len() > 1 && differ).then_some(range);
    BudgetReport {
        schema_version: SCHEMA_VERSION,
        unrelated_weights,
        headroom: headroom.fraction,
        headroom_evidence: headroom,
        runs,
        deciding_run,
        fits,
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1,500 commands in spans of 3: each span keeps its most, and a span with no change
    /// after one keeps what the last change left.
    #[test]
    fn a_curve_keeps_the_most_of_each_span() {
        let series = [
            (None, 10),
            (Some(0), 20),
            (Some(1), 15),
            (Some(7), 30),
            (Some(8), 5),
            (Some(20), 40),
        ];
        let c = ReservedCurve::of(1, 1500, 0, &series);
        assert_eq!(c.commands, 1500);
        assert_eq!(c.points, [(0, 20), (3, 15), (6, 30), (9, 5), (18, 40)]);
        // The first 5 commands (blocks from before recording) are the start.
        let c = ReservedCurve::of(1, 10, 5, &[(None, 100), (Some(3), 200), (Some(5), 150)]);
        assert_eq!((c.commands, c.points), (5, vec![(0, 200)]));
    }

    #[test]
    fn exponents_are_found_from_the_points() {
        let s = [1.0, 2.0, 4.0, 8.0];
        assert_eq!(fit_group(&s, &[5.0, 5.0, 5.0, 5.0], 2), (0, 5.0));
        assert_eq!(fit_group(&s, &[3.0, 6.0, 12.0, 24.0], 2), (1, 3.0));
        assert_eq!(fit_group(&s, &[2.0, 8.0, 32.0, 128.0], 2), (2, 2.0));
    }

    #[test]
    fn sizes_and_precisions_from_names() {
        assert_eq!(
            size_from_name("xl_ctx512_forward_bf16.pickle", None),
            Some((Vary::Seq, 512))
        );
        assert_eq!(
            size_from_name(
                "memory_snapshot_xl_fwd_cl2048_dtypetorch.float32.pickle",
                None
            ),
            Some((Vary::Seq, 2048))
        );
        assert_eq!(
            size_from_name("memory_2.7b_forward_seq256_bf16.pickle", None),
            Some((Vary::Seq, 256))
        );
        assert_eq!(
            size_from_name("run_bs8.pickle", None),
            Some((Vary::Batch, 8))
        );
        assert_eq!(size_from_name("snapshot.pickle", None), None);
        assert_eq!(
            precision_from_name("a_dtypetorch.bfloat16.pickle"),
            Some("bf16")
        );
        assert_eq!(precision_from_name("a_float32.pickle"), Some("fp32"));
    }

    #[test]
    fn a_fit_with_and_without_headroom() {
        let gpu = Gpu {
            name: "x".into(),
            capacity_bytes: 100,
            source: "",
        };
        assert_eq!(fit(&gpu, 90, 0.1).verdict, Verdict::Fits);
        assert_eq!(fit(&gpu, 95, 0.1).verdict, Verdict::Tight);
        assert_eq!(fit(&gpu, 101, 0.1).verdict, Verdict::DoesNotFit);
        assert_eq!(fit(&gpu, 101, 0.1).left_bytes, -1);
    }

    #[test]
    fn sums_past_u64_stop_at_its_largest_and_never_fit() {
        // 2^63 + 2^63 + 139 GiB would wrap to 139 GiB, which fits 40 GB.
        let parts = [1u64 << 63, 1 << 63, 139 << 30];
        assert_eq!(sum_bytes(parts), u64::MAX);
        assert_eq!(sum_bytes([1, 2, 3]), 6);
        let gpu = Gpu {
            name: "40GB".into(),
            capacity_bytes: 40_000_000_000,
            source: "",
        };
        let f = fit(&gpu, sum_bytes(parts), 0.1);
        assert_eq!(f.verdict, Verdict::DoesNotFit);
        assert_eq!(f.needed_bytes, u64::MAX);
        // Short by more than i64 holds: the most negative it can say.
        assert_eq!(f.left_bytes, i64::MIN);
        assert!(f.left_share <= 0.0);
    }

    /// The groups' part of the total at `sizes[k]` predicted by refitting every group on
    /// the other runs, as the definition says (dense, one fit per group).
    fn refit_without(
        measures: &[BTreeMap<u32, u64>],
        sizes: &[u64],
        max_exponent: u32,
        k: usize,
    ) -> u64 {
        let keys: std::collections::BTreeSet<u32> = measures
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != k)
            .flat_map(|(_, m)| m.keys().copied())
            .collect();
        let xs: Vec<f64> = (0..sizes.len())
            .filter(|&i| i != k)
            .map(|i| sizes[i] as f64)
            .collect();
        keys.iter()
            .map(|key| {
                let ys: Vec<f64> = (0..sizes.len())
                    .filter(|&i| i != k)
                    .map(|i| measures[i].get(key).copied().unwrap_or(0) as f64)
                    .collect();
                let (e, c) = fit_group(&xs, &ys, max_exponent);
                (c * (sizes[k] as f64).powi(e as i32)).round().max(0.0) as u64
            })
            .sum()
    }

    #[test]
    fn held_out_fits_by_hand() {
        // Sizes 1, 2, 4. Group 0: 5 bytes at every size; group 1: 3 bytes per unit of
        // size; group 2: 10 bytes at size 2 alone.
        let m: Vec<BTreeMap<u32, u64>> = vec![
            [(0, 5), (1, 3)].into_iter().collect(),
            [(0, 5), (1, 6), (2, 10)].into_iter().collect(),
            [(0, 5), (1, 12)].into_iter().collect(),
        ];
        let refs: Vec<&BTreeMap<u32, u64>> = m.iter().collect();
        // Without size 1: group 0 is 5, group 1 is 3·s = 3, group 2 from (2: 10), (4: 0)
        // is constant 5 (error 50) rather than 1·s (error 80): 13.
        // Without size 2: 5 + 3·2 + nothing of group 2: 11.
        // Without size 4: 5 + 3·4, and group 2 from (1: 0), (2: 10) is 4·s (error 20)
        // rather than 5 (error 50): 16; 33 in all.
        assert_eq!(
            held_out_group_totals(&refs, &[1, 2, 4], Vary::Batch),
            [13, 11, 33]
        );
    }

    #[test]
    fn held_out_fits_match_refitting_every_group() {
        // 300 sizes, each run with 20 groups of its own and 3 shared ones: 6,003 groups.
        // Refitting each group for each size would take 300 · 6,003 fits of 299 points;
        // the sums take one pass. Checked against refitting at a few sizes.
        let n = 300u64;
        let sizes: Vec<u64> = (1..=n).map(|s| s * 8).collect();
        let measures: Vec<BTreeMap<u32, u64>> = (0..n as u32)
            .map(|i| {
                let s = sizes[i as usize];
                let mut m: BTreeMap<u32, u64> = (0..20)
                    .map(|g| (1000 + i * 20 + g, (s * (g as u64 + 1)) << 10))
                    .collect();
                m.insert(0, 7 << 20);
                m.insert(1, s * s * 3 + (i as u64 % 7));
                m.insert(2, s << 12);
                m
            })
            .collect();
        let refs: Vec<&BTreeMap<u32, u64>> = measures.iter().collect();
        for vary in [Vary::Batch, Vary::Seq] {
            let totals = held_out_group_totals(&refs, &sizes, vary);
            assert_eq!(totals.len(), n as usize);
            let max_exponent = if vary == Vary::Seq { 2 } else { 1 };
            for k in [0, 1, 150, 298, 299] {
                let expected = refit_without(&measures, &sizes, max_exponent, k);
                // The same fits; sums in another order may round one group's term the
                // other way.
                assert!(
                    totals[k].abs_diff(expected) <= 2,
                    "{vary:?} k={k}: {} vs {expected}",
                    totals[k]
                );
            }
        }
    }
}
