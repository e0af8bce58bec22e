//! The budget: what one run needs (`run.rs`: [`budget_of`]), whether it fits a device
//! (`fit.rs`: [`fit_run`], with the headroom), and what a series of runs predicts
//! (`series.rs`: [`fit_series`], allocation by allocation in [`stream`]); the devices in
//! [`gpus`]. This file holds the lines a budget is made of and the report.
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

mod fit;
pub mod gpus;
mod run;
mod series;
pub mod stream;

pub use fit::*;
pub use run::*;
pub use series::*;

use crate::analysis::budget::gpus::Gpu;
use crate::analysis::kinds::categories::CategoryPart;
use crate::analysis::moments::moment::ResolvedMoment;
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

impl Outside {
    /// Memory outside the allocator on `device`, the one rule of `budget` and the report:
    /// from device readings (this process's use at the run's peak minus reserved, else
    /// the device's), else from an OOM message about the device ("this process has X in
    /// use" minus PyTorch's reserved), else not measured.
    pub fn of_run(
        snap: &crate::model::Snapshot,
        path: &str,
        device: i64,
        log: Option<&crate::devlog::DeviceLog>,
        utc_offset_minutes: i32,
        messages: Option<&[crate::devlog::oom_log::OomMessage]>,
    ) -> Result<Outside, crate::analysis::device::reconcile::ReconcileError> {
        use crate::analysis::device::reconcile::{Moment, ReconcileOptions, analyze_reconcile};
        if let Some(log) = log {
            let options = ReconcileOptions {
                device: Some(device),
                gpu: None,
                allow_no_overlap: false,
            };
            let rec = analyze_reconcile(snap, path, log, utc_offset_minutes, None, options)?;
            let ledger = rec
                .devices
                .iter()
                .flat_map(|d| &d.ledgers)
                .find(|l| l.moment == Moment::Peak);
            if let Some(l) = ledger {
                if let Some(b) = l.outside_allocator_bytes {
                    return Ok(Outside::measured(OutsideSource::Nvml, b.max(0) as u64));
                }
                if let Some(b) = l.gap_bytes {
                    return Ok(Outside::measured(
                        OutsideSource::NvmlDevice,
                        b.max(0) as u64,
                    ));
                }
            }
            return Ok(Outside::not_measured());
        }
        if let Some(messages) = messages {
            let m = messages
                .iter()
                .find(|m| m.gpu == Some(device))
                .or_else(|| messages.iter().find(|m| m.gpu.is_none()))
                .or(if messages.len() == 1 {
                    messages.first()
                } else {
                    None
                });
            if let Some((process, reserved)) =
                m.and_then(|m| m.this_process_bytes.zip(m.reserved_by_pytorch_bytes))
            {
                return Ok(Outside::measured(
                    OutsideSource::OomMessage,
                    process.saturating_sub(reserved),
                ));
            }
        }
        Ok(Outside::not_measured())
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
    /// Where the memory the first OOM's request lacked was: the rule of `oom`'s
    /// `shortfall_in` and `simulate`'s `cause` ("capacity", "fragmentation", "rounding");
    /// null without an OOM that says what the device had free.
    pub oom_shortfall_in: Option<crate::allocator::scenario::OomCause>,
    /// The first OOM replayed under the settings `oom` would suggest (the replays of
    /// `oom`'s `what_if`); null without one.
    pub oom_what_if: Option<crate::analysis::what_if::oom_what_if::OomWhatIf>,
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

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
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
