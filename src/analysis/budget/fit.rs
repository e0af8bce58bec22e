//! Whether a budget fits a device: each GPU's verdict, from the run replayed at its capacity
//! where the allocator model replays it exactly, else from the peak and the headroom; and
//! the headroom, from how much the peak varies where the files repeat it.

use super::*;
use crate::allocator::checked::CheckedRun;
use crate::analysis::budget::gpus::Gpu;
use serde::Serialize;
use std::collections::BTreeMap;

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

/// [`run_each`](crate::allocator::scenario::run_each) at `devices` under the recorded
/// settings (the replay with no limit being `run`'s), beside the replay taking equal free
/// blocks highest address first: each device's outcome and the run's [`TieBreak`].
fn replays_with_tie_break(
    run: &CheckedRun,
    devices: &[(u64, u64)],
) -> (
    Vec<Result<crate::allocator::scenario::Outcome, crate::allocator::scenario::StartDoesNotFit>>,
    Option<TieBreak>,
) {
    let p = &run.prepared;
    let ((free, outcomes), highest) = rayon::join(
        || {
            crate::allocator::scenario::run_each_after(
                p,
                &p.settings,
                devices,
                run.unlimited.clone(),
            )
        },
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

/// Replays a checked run at each GPU's capacity less `outside`.
pub fn replay_on(run: &CheckedRun, gpus: &[Gpu], outside: u64) -> RunReplays {
    use crate::allocator::scenario::{run_each, run_each_after};
    let p = &run.prepared;
    let exact = run.identity.exact();
    let devices: Vec<(u64, u64)> = gpus
        .iter()
        .map(|g| (g.capacity_bytes.saturating_sub(outside), g.capacity_bytes))
        .collect();
    let (outcomes, tie_break) = replays_with_tie_break(run, &devices);
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
        let each = match run.unlimited_under(&s) {
            Some(free) => run_each_after(p, &s, &at, Some(free.clone())),
            None => run_each(p, &s, &at),
        };
        for (&i, o) in short.iter().zip(each.1) {
            with_expandable[i] = Some(o.is_ok_and(|e| e.first_oom.is_none()));
        }
    }
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
pub(super) fn fit_replayed(gpu: &Gpu, r: Replayed, total: u64, outside: u64, headroom: f64) -> Fit {
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
