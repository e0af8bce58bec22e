//! A series: runs of one workload at several sizes, fitted group by group and, where their
//! allocations match, allocation by allocation ([`super::stream`]); each measured size
//! predicted from the others, the target predicted or refused, and the largest size each
//! GPU takes.

use super::*;
use crate::analysis::budget::gpus::Gpu;
use serde::Serialize;
use std::collections::BTreeMap;

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
    pub(super) fn runs_by_size(&self) -> BTreeMap<(u64, stream::Shape), Vec<usize>> {
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
    let paired = stream::paired_before_recording(&recorded, &sizes);
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
pub(super) fn weights_of<'r>(runs: impl IntoIterator<Item = &'r RunBudget>) -> ((u64, u64), bool) {
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
            ambiguous: None,
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
            ambiguous: None,
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
