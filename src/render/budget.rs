//! `budget` for people: each run's lines with what decided them, the fits, the series'
//! fit and prediction with its caveats (text); the budgets as stacked bars against each
//! device's capacity (SVG).

use crate::analysis::budget::stream::Mismatch;
use crate::analysis::budget::{
    BudgetLine, BudgetReport, Caveat, Fit, Line, MAX_HELD_OUT_ERROR, MIN_SHARED_SHARE,
    OutsideSource, ReservedCurve, RunBudget, Series, Vary, Verdict, sum_bytes,
};
use crate::analysis::budget::{Headroom, HeadroomSource, SpreadKind};
use crate::render::Style;
use crate::render::charts::svg::{Svg, category_color, escape, num};
use crate::units::bytes;
use crate::units::shown;
use std::io::{self, Write};

/// The words of a line.
pub fn line_name(line: Line) -> &'static str {
    match line {
        Line::Weights => "weights",
        Line::Gradients => "gradients",
        Line::OptimizerState => "optimizer state",
        Line::StepTemporaries => "optimizer step's temporaries",
        Line::AutocastCopies => "autocast's copies of the weights",
        Line::Activations => "activations and other intermediates",
        Line::Caches => "caches (KV)",
        Line::Workspaces => "workspaces",
        Line::Communication => "communication buffers",
        Line::AllocatorOverhead => "allocator overhead",
        Line::OutsideAllocator => "outside the allocator",
        Line::FailedRequest => "the request that ran out of memory",
    }
}

fn line_color(line: Line) -> &'static str {
    let category = match line {
        Line::AllocatorOverhead => "other",
        Line::OutsideAllocator => "unknown",
        Line::FailedRequest => "caches",
        tensors => tensors.category(),
    };
    category_color(category).unwrap_or("#bab0ac")
}

/// Measured size `k` of a series as said: its size, or its batch × sequence.
fn size_label(s: &Series, k: usize) -> String {
    size_text(
        s.sizes.get(k).copied().unwrap_or(0),
        s.shapes.get(k).copied(),
    )
}

/// The predicted size as said.
fn predicted_label(p: &crate::analysis::budget::Prediction) -> String {
    size_text(p.size, p.shape)
}

/// A size as said: its batch × sequence where both vary, else the number.
fn size_text(size: u64, shape: Option<(u64, u64)>) -> String {
    match shape {
        Some((b, q)) => format!("{b}×{q}"),
        None => size.to_string(),
    }
}

/// A series' kind, short, for a chart's labels.
fn vary_short(v: Vary) -> &'static str {
    match v {
        Vary::Seq => "seq",
        Vary::Batch => "batch",
        // A shape (4×512) says what it is.
        Vary::BatchSeq => "",
    }
}

/// What varies in a series, in a word.
pub fn vary_label(v: Vary) -> &'static str {
    vary_name(v)
}

fn vary_name(v: Vary) -> &'static str {
    match v {
        Vary::Batch => "batch size",
        Vary::Seq => "sequence length",
        Vary::BatchSeq => "batch size × sequence length",
    }
}

/// What decided a line: its categories, the evidence of most of each.
fn phase_name(p: crate::analysis::kinds::phases::Phase) -> &'static str {
    use crate::analysis::kinds::phases::Phase;
    match p {
        Phase::Forward => "the forward",
        Phase::Backward => "the backward",
        Phase::Optimizer => "the optimizer step",
        Phase::ZeroGrad => "zero_grad",
        Phase::Init => "building the model",
        Phase::Between => "outside forward, backward and the optimizer step",
    }
}

/// Where the peak is among the phases, and that another size may move it: a run budgeted
/// at its peak whose trace shows two kinds of phase or more.
fn write_phase_peaks(out: &mut dyn Write, r: &RunBudget, alone: bool) -> io::Result<()> {
    if at_oom(r) || r.phase_peaks.len() < 2 {
        return Ok(());
    }
    let peak = r
        .phase_peaks
        .iter()
        .find(|p| Some(p.event) == r.moment.event);
    let at = peak.map_or("outside forward, backward and the optimizer step", |p| {
        phase_name(p.phase)
    });
    let others: Vec<String> = r
        .phase_peaks
        .iter()
        .filter(|p| Some(p.event) != r.moment.event)
        .enumerate()
        .map(|(i, p)| {
            format!(
                "{}{} {} (event {})",
                phase_name(p.phase),
                if i == 0 { " reaches at most" } else { "" },
                bytes(p.requested_bytes),
                p.event
            )
        })
        .collect();
    write!(
        out,
        "  live tensors peak in {at} ({}); {}",
        bytes(r.requested_bytes),
        others.join(", ")
    )?;
    if alone {
        write!(
            out,
            ": a larger batch or sequence length grows the activations, not the weights' copies, and may move the peak into another phase, which one size cannot show (give several sizes for a series)"
        )?;
    }
    writeln!(out)
}

/// Whether the run is budgeted at its first OOM (not at its peak).
pub fn at_oom(r: &RunBudget) -> bool {
    r.oom_event.is_some() && r.moment.event == r.oom_event
}

fn decided(l: &BudgetLine, r: &RunBudget) -> String {
    match l.line {
        Line::AllocatorOverhead if at_oom(r) => format!(
            "reserved {} at the OOM, after releasing its cached segments, minus {} requested: free space inside segments still in use (fragmentation) and rounding; it reserved up to {} before",
            bytes(r.reserved_bytes),
            bytes(r.requested_bytes),
            bytes(r.peak_reserved_bytes)
        ),
        Line::AllocatorOverhead => {
            let later = r.peak_reserved_bytes.saturating_sub(r.reserved_bytes);
            let mut s = format!(
                "reserved {} then, minus {} requested: cached free blocks, rounding, fragmentation",
                bytes(r.reserved_bytes),
                bytes(r.requested_bytes)
            );
            if later > 0 {
                s.push_str(&format!(
                    "; reserved grows by {} more elsewhere in the trace",
                    bytes(later)
                ));
            }
            s
        }
        Line::FailedRequest if at_oom(r) => format!(
            "the OOM at event {} refused it: the run stopped there, so it needs at least this total",
            r.oom_event.unwrap_or(0)
        ),
        Line::FailedRequest => match (r.oom_request_bytes, r.oom_reserved_bytes) {
            (Some(q), Some(held)) if l.bytes > 0 => format!(
                "the OOM at event {} refused a {} request with {} reserved: it needed {} there, this much more than the most reserved before; the run stopped there, so it needs at least this total",
                r.oom_event.unwrap_or(0),
                bytes(q),
                bytes(held),
                bytes(held.saturating_add(q))
            ),
            (Some(q), Some(held)) => format!(
                "the OOM at event {} refused a {} request with {} reserved: {} is within the most reserved before, so it adds nothing to this total (the device had less room then than at the peak)",
                r.oom_event.unwrap_or(0),
                bytes(q),
                bytes(held),
                bytes(held.saturating_add(q))
            ),
            _ => format!(
                "the OOM at event {} refused it: the run stopped there, so it needs at least this total",
                r.oom_event.unwrap_or(0)
            ),
        },
        Line::OutsideAllocator => match r.outside.source {
            OutsideSource::Nvml => "measured: this process's use in the device readings minus reserved, at the peak".into(),
            OutsideSource::NvmlDevice => "measured: the device's use minus reserved at the peak (no per-process readings: other processes included)".into(),
            OutsideSource::OomMessage => "measured: \"this process has ... in use\" of the OOM message minus what PyTorch reserved".into(),
            OutsideSource::Given => "given with --outside".into(),
            OutsideSource::NotMeasured => format!(
                "~not measured: the CUDA context and libraries take {} to {} on one GPU{}; measure it with --nvml (python -m vramlens.capture records it) or --log with an OOM message",
                bytes(r.outside.typical_low_bytes),
                bytes(r.outside.typical_high_bytes),
                // Communication buffers in the run's memory: NCCL's own sit outside it.
                if r.line(Line::Communication) > 0 {
                    format!(
                        ", counted at the top; this run also communicates (it has communication buffers), and NCCL's own buffers, {} to {} per communicator in published measurements, are not counted",
                        bytes(crate::analysis::budget::NCCL_PER_COMMUNICATOR.0),
                        bytes(crate::analysis::budget::NCCL_PER_COMMUNICATOR.1)
                    )
                } else {
                    " (more with NCCL); counted at the top".to_string()
                }
            ),
        },
        _ => l
            .categories
            .iter()
            .take(3)
            .map(|c| {
                let e = &c.by_evidence[0];
                format!(
                    "{} {}: {}{}",
                    c.category,
                    bytes(c.bytes),
                    if e.inferred { "~" } else { "" },
                    crate::render::words::evidence::words(&e.evidence)
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// One run's budget; `alone`: no series beside it.
fn write_run(out: &mut dyn Write, r: &RunBudget, alone: bool) -> io::Result<()> {
    writeln!(
        out,
        "{}: device {}, {}",
        shown(&r.path),
        r.device,
        crate::render::words::labels::moment_text(&r.moment)
    )?;
    if let Some(first) = r.leak_suspects.first() {
        writeln!(
            out,
            "  leaks (an inference from the trace's samples): {} ({}) grew by {} in {} of {} samples{} and is alive at the end{}; memory that keeps growing step after step outgrows any device in a longer run, so no device fits it until the leak is fixed (vramlens top --leaks lists the call sites)",
            crate::render::words::labels::group_display(&first.name, first.kind),
            first.category,
            bytes(first.growth_bytes),
            first.rises,
            first.samples,
            first
                .since_event
                .map(|e| format!(" since event {e}"))
                .unwrap_or_default(),
            match r.leak_suspects.len() - 1 {
                0 => String::new(),
                1 => ", with 1 more call site".to_string(),
                n => format!(", with {n} more call sites"),
            }
        )?;
    }
    if !r.moment.has_timeline {
        writeln!(
            out,
            "  (no trace recorded: only the final state is known, and what kind of memory it is cannot be told; record one with torch.cuda.memory._record_memory_history(max_entries=100000) before the work)"
        )?;
    }
    let most = r.peak_reserved_bytes.max(r.requested_bytes);
    let allocator = match (r.oom_request_bytes, r.oom_reserved_bytes) {
        (Some(q), Some(held)) if at_oom(r) => format!(
            "{} for PyTorch at its first OOM ({} live, {} held beside it in segments in use, and the {} request it was refused)",
            bytes(held.saturating_add(q)),
            bytes(r.requested_bytes),
            bytes(held.saturating_sub(r.requested_bytes)),
            bytes(q)
        ),
        (Some(q), Some(held)) if held.saturating_add(q) > most => format!(
            "{} for PyTorch (it ran out of memory on a {} request with {} reserved: {} more than the {} it reserved at its most before)",
            bytes(held.saturating_add(q)),
            bytes(q),
            bytes(held),
            bytes(held.saturating_add(q) - most),
            bytes(most)
        ),
        (Some(q), Some(held)) => format!(
            "{} reserved by PyTorch at its most (it ran out of memory later, on a {} request with {} reserved)",
            bytes(most),
            bytes(q),
            bytes(held)
        ),
        (Some(q), None) => format!(
            "{} reserved by PyTorch at its most and the {} request it ran out of memory on",
            bytes(most),
            bytes(q)
        ),
        _ => format!("{} reserved by PyTorch at its most", bytes(most)),
    };
    writeln!(
        out,
        "  needs {}{} on one device: {allocator}, {} outside the allocator{}",
        if r.oom_request_bytes.is_some() {
            "at least "
        } else {
            ""
        },
        bytes(r.total_bytes),
        bytes(r.outside.counted_bytes),
        if r.outside.measured_bytes.is_none() {
            " (assumed)"
        } else {
            ""
        },
    )?;
    if let Some(c) = r.oom_shortfall_in {
        let fix = r
            .oom_what_if
            .as_ref()
            .and_then(crate::render::oom::what_if_fix_text)
            .map(|t| format!("; {t}"))
            .unwrap_or_default();
        writeln!(
            out,
            "  the OOM: {}{fix} (vramlens oom explains it)",
            crate::render::words::labels::shortfall_sentence(c)
        )?;
    }
    write_phase_peaks(out, r, alone)?;
    let width = Line::ALL
        .iter()
        .map(|&l| line_name(l).len())
        .max()
        .unwrap_or(10);
    let mut section = "";
    for l in &r.lines {
        let here = if l.persistent {
            "persistent (the whole run)"
        } else if l.line.with_model() {
            "with the model (copies of the weights made in each step)"
        } else if matches!(
            l.line,
            Line::AllocatorOverhead | Line::OutsideAllocator | Line::FailedRequest
        ) {
            "around the tensors"
        } else {
            "working (grows with batch and sequence)"
        };
        if l.line == Line::FailedRequest {
            if r.oom_request_bytes.is_none() {
                continue;
            }
        } else if l.bytes == 0
            && !matches!(l.line, Line::AllocatorOverhead | Line::OutsideAllocator)
        {
            continue;
        }
        if here != section {
            writeln!(out, "  {here}")?;
            section = here;
        }
        writeln!(
            out,
            "    {:<width$}  {:>10}  {:>5.1}%  {}",
            line_name(l.line),
            bytes(l.bytes),
            l.share * 100.0,
            decided(l, r)
        )?;
    }
    writeln!(
        out,
        "    {:<width$}  {:>10}{}",
        "total",
        bytes(r.total_bytes),
        if r.oom_request_bytes.is_some() {
            "  (at least: the run ran out of memory before its peak)"
        } else {
            ""
        }
    )?;
    Ok(())
}

/// A fit's verdict; `events_of` names the file whose trace entries a predicted stream's
/// events are (None: the run's own).
fn fit_text(f: &Fit, headroom: f64, events_of: Option<&str>) -> String {
    if f.leaks {
        // What the figures alone say, after why they do not decide: the verdict `fit`
        // gives the total they were made from.
        let total = (i128::from(f.gpu.capacity_bytes) - i128::from(f.left_bytes))
            .clamp(0, i128::from(u64::MAX)) as u64;
        let as_recorded = Fit {
            leaks: false,
            verdict: crate::analysis::budget::fit(&f.gpu, total, headroom).verdict,
            ..f.clone()
        };
        return format!(
            "does not fit: the run leaks, and a longer run outgrows any device (the run as recorded: {})",
            fit_text(&as_recorded, headroom, events_of)
        );
    }
    if f.fits_until_oom() {
        // The replay ran every request recorded; the run asked for no more because it
        // stopped at its OOM.
        let recorded = Fit {
            until_oom: false,
            ..f.clone()
        };
        return format!(
            "{}; up to its OOM only",
            fit_text(&recorded, headroom, events_of)
        );
    }
    let verdict = verdict_text(f, headroom);
    // The shortfall is the run's as configured: where another setting lets it through,
    // it is not a floor for every setting.
    let short = if f.left_bytes < 0 {
        let expandable_fits = f
            .replayed
            .as_ref()
            .is_some_and(|r| r.fits_with_expandable == Some(true));
        format!(
            ", short by at least {}{}",
            bytes(f.left_bytes.unsigned_abs()),
            if expandable_fits {
                " with its settings"
            } else {
                ""
            }
        )
    } else {
        String::new()
    };
    match &f.replayed {
        Some(r) if r.model_exact && r.start_does_not_fit => format!(
            "does not fit{short}: what was alive when recording began alone exceeds this capacity"
        ),
        Some(r) if r.model_exact => match r.oom_event {
            Some(e) => format!(
                "does not fit{short}: replayed at this capacity, it runs out of memory {}{}{}",
                match events_of {
                    Some(path) => format!(
                        "where {} is at event {}",
                        shown(path),
                        crate::units::grouped(e as u64)
                    ),
                    None => format!("at event {}", crate::units::grouped(e as u64)),
                },
                match r.oom_cause {
                    Some(crate::allocator::scenario::OomCause::Fragmentation) => {
                        " (fragmentation: the bytes are there, not in one piece)"
                    }
                    Some(crate::allocator::scenario::OomCause::PrivatePools) => {
                        " (CUDA-graph pools: the bytes are cached in CUDA-graph private pools, which only those graphs use)"
                    }
                    _ => "",
                },
                match r.fits_with_expandable {
                    Some(true) => "; with expandable_segments:True it fits",
                    Some(false) => "; expandable_segments:True does not help",
                    None => "",
                }
            ),
            None => format!(
                "{verdict} (replayed at this capacity: peak reserved {})",
                bytes(r.peak_reserved_bytes)
            ),
        },
        Some(_) => format!(
            "{verdict} (from the peak: the allocator model does not replay this run exactly)"
        ),
        None => verdict,
    }
}

/// The headroom in bytes: what the fit asks beyond the total (both of the need, one base).
fn headroom_bytes(f: &Fit) -> u64 {
    let total = f.gpu.capacity_bytes as i128 - f.left_bytes as i128;
    (f.needed_bytes as i128 - total).max(0) as u64
}

fn verdict_text(f: &Fit, headroom: f64) -> String {
    match f.verdict {
        Verdict::Fits => format!(
            "fits: {} left, more than its {} headroom of {}",
            bytes(f.left_bytes as u64),
            percent(headroom),
            bytes(headroom_bytes(f))
        ),
        Verdict::Tight => format!(
            "tight: fits with {} left, less than its {} headroom of {}",
            bytes(f.left_bytes.max(0) as u64),
            percent(headroom),
            bytes(headroom_bytes(f))
        ),
        Verdict::DoesNotFit => format!(
            "does not fit: short by {}",
            bytes(f.left_bytes.unsigned_abs())
        ),
    }
}

fn write_fits(
    out: &mut dyn Write,
    fits: &[Fit],
    headroom: f64,
    events_of: Option<&str>,
) -> io::Result<()> {
    let width = fits.iter().map(|f| f.gpu.name.len()).max().unwrap_or(8);
    for f in fits {
        writeln!(
            out,
            "  {:<width$}  {:>10}  {}",
            f.gpu.name,
            bytes(f.gpu.capacity_bytes),
            fit_text(f, headroom, events_of)
        )?;
    }
    if fits.iter().any(Fit::fits_until_oom) {
        writeln!(
            out,
            "  (up to its OOM only: the run stopped at the request it was refused, so what it needs after that is not recorded)"
        )?;
    }
    for f in fits {
        if let Some(which) = f.gpu.ambiguous {
            writeln!(out, "  ({which})")?;
        }
    }
    Ok(())
}

fn caveat_text(c: &Caveat, vary: Vary, runs: &[RunBudget]) -> String {
    match c {
        Caveat::ProductUnmatched => "batch and sequence both vary and the runs' allocations do not match one to one: only a prediction allocation by allocation follows both (give files that vary one of them)".to_string(),
        Caveat::WeightsDiffer {
            smallest_bytes,
            largest_bytes,
        } => format!(
            "the files' weights differ ({} to {}): another model or precision",
            bytes(*smallest_bytes),
            bytes(*largest_bytes)
        ),
        Caveat::PrecisionsDiffer { precisions } => format!(
            "the file names state different precisions ({})",
            precisions.join(", ")
        ),
        Caveat::SettingsDiffer { settings } => format!(
            "the allocator settings differ between the files ({}): the overhead may not compare",
            settings.join(" | ")
        ),
        Caveat::DevicesDiffer { counts } => format!(
            "the files have {} devices: another parallelism may split the work differently",
            counts
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        ),
        Caveat::NotMonotonic { line } => format!(
            "{} goes down as the {} goes up: the runs are not one workload (another mode, a trace that missed the peak)",
            line_name(*line),
            vary_name(vary)
        ),
        Caveat::TwoSizes => {
            "two sizes only: each group's growth is read from two points, and no error can be estimated (a third size gives one)".into()
        }
        Caveat::BeyondRange { target, largest } => format!(
            "{target} is past twice the largest size measured ({largest}): measure a larger size"
        ),
        Caveat::FewSharedGroups { run, shared_share } => format!(
            "only {:.1}% of the bytes at the peak of {} are at call sites (and categories) every file has, and a series needs {:.0}%: the files are not runs of one workload",
            shared_share * 100.0,
            runs.get(*run).map_or_else(String::new, |r| shown(&r.path).into_owned()),
            MIN_SHARED_SHARE * 100.0
        ),
        Caveat::LargeHeldOutError { size, error } => format!(
            "predicting {} {size} from the other sizes misses its peak by {:+.1}%, more than {:.0}%: the sizes do not follow one law",
            vary_name(vary),
            error * 100.0,
            MAX_HELD_OUT_ERROR * 100.0
        ),
        Caveat::ContradictsLine {
            line,
            measured_bytes,
            predicted_bytes,
        } => format!(
            "{} is the same at every size measured ({}), but the prediction gives {}: the prediction contradicts the fits it came from",
            line_name(*line),
            bytes(*measured_bytes),
            bytes(*predicted_bytes)
        ),
        Caveat::DisagreesWithGroupFits {
            replayed_bytes,
            group_bytes,
        } => format!(
            "from two sizes, the allocations replayed give {} of live tensors at the peak and the call sites' fits {}, more than {:.0}% apart: two sizes cannot tell which holds (a third size checks it)",
            bytes(*replayed_bytes),
            bytes(*group_bytes),
            MAX_HELD_OUT_ERROR * 100.0
        ),
    }
}

fn grows(e: u32) -> &'static str {
    match e {
        0 => "constant",
        1 => "linear",
        _ => "quadratic",
    }
}

fn write_series(out: &mut dyn Write, s: &Series, r: &BudgetReport) -> io::Result<()> {
    writeln!(
        out,
        "series: {} {}",
        vary_name(s.vary),
        s.runs
            .iter()
            .enumerate()
            .map(|(k, run)| format!("{} ({})", size_label(s, k), shown(&r.runs[*run].path)))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    for &i in &s.repeats {
        writeln!(
            out,
            "  {} repeats a size: the run of that size that reserved the most stands for it (their spread is in the headroom)",
            shown(&r.runs[i].path)
        )?;
    }
    // A refused series says so first, with its reasons; its table is then measurements only.
    let refusals: Vec<&Caveat> = s.caveats.iter().filter(|c| c.refuses()).collect();
    for c in &refusals {
        writeln!(out, "  no prediction: {}", caveat_text(c, s.vary, &r.runs))?;
    }
    // Past the range refuses the target only; the other refusals leave no law to show.
    let refused = refusals
        .iter()
        .any(|c| !matches!(c, Caveat::BeyondRange { .. }));
    let width = 36;
    let mut head = format!("  {:<width$}", "line");
    for k in 0..s.sizes.len() {
        head.push_str(&format!("  {:>10}", size_label(s, k)));
    }
    // Where batch and sequence both vary, only the allocations have laws.
    let measured_only = refused || s.vary == Vary::BatchSeq;
    if measured_only {
        writeln!(out, "{head}")?;
    } else {
        writeln!(out, "{head}  grows as")?;
    }
    for l in &s.lines {
        if l.measured_bytes.iter().all(|&b| b == 0) {
            continue;
        }
        let mut row = format!("  {:<width$}", line_name(l.line));
        for b in &l.measured_bytes {
            row.push_str(&format!("  {:>10}", bytes(*b)));
        }
        if measured_only {
            writeln!(out, "{row}")?;
            continue;
        }
        let worst = l
            .measured_bytes
            .iter()
            .zip(&l.fitted_bytes)
            .map(|(m, f)| (*f as f64 - *m as f64).abs() / (*m).max(1) as f64)
            .fold(0.0, f64::max);
        writeln!(
            out,
            "{row}  {} (fit within {:.1}%)",
            grows(l.grows_as),
            worst * 100.0
        )?;
    }
    // Where the streams match, their replays judge the prediction: the groups' held-out
    // errors would only repeat a fit the answer does not use.
    let by_stream = s.stream.mismatch.is_none();
    for (size, err) in s.held_out.iter().filter(|_| !refused && !by_stream) {
        writeln!(
            out,
            "  held out: {size} predicted from the others: total {:+.1}%",
            err * 100.0
        )?;
    }
    // A refused series still says whether its allocations matched.
    if !refused || !by_stream {
        write_stream_series(out, s, r)?;
    }
    match &s.prediction {
        Some(p) => {
            writeln!(
                out,
                "at {} {}: needs {}{}",
                vary_name(s.vary),
                predicted_label(p),
                bytes(p.total_bytes),
                match p.error_band {
                    Some(b) => format!(
                        " (within {:.1}%, the largest error predicting a measured size from the others)",
                        b * 100.0
                    ),
                    None => " (no error band from two sizes)".into(),
                }
            )?;
            for (line, b) in &p.lines {
                if *b > 0 {
                    writeln!(out, "    {:<width$}  {:>10}", line_name(*line), bytes(*b))?;
                }
            }
            if let Some(at) = &p.stream {
                writeln!(
                    out,
                    "  replayed: live tensors peak at {}{} ({}), the allocator reserves {} at most (its overhead as the allocator model computes it); the lines are what is live there, each allocation in the category it has in the largest size measured",
                    bytes(at.requested_peak_bytes),
                    match at.peak_phase {
                        Some(p) if p != crate::analysis::kinds::phases::Phase::Between =>
                            format!(" in {}", phase_name(p)),
                        _ => String::new(),
                    },
                    match at.peak_event {
                        Some(e) => format!(
                            "where {} is at event {}",
                            shown(&r.runs[at.peak_run].path),
                            crate::units::grouped(e as u64)
                        ),
                        None => "among the blocks from before recording".into(),
                    },
                    bytes(at.reserved_peak_bytes),
                )?;
                if !at.callsites.is_empty() {
                    let parts: Vec<String> = at
                        .callsites
                        .iter()
                        .map(|c| {
                            format!(
                                "{} {} ({}, {} allocation{})",
                                if c.callsite.is_empty() {
                                    "a call site not known".into()
                                } else {
                                    crate::render::words::labels::short_frame(&c.callsite)
                                },
                                bytes(c.bytes),
                                line_name(c.line),
                                crate::units::grouped(c.allocations),
                                if c.allocations == 1 { "" } else { "s" }
                            )
                        })
                        .collect();
                    writeln!(out, "  held at that peak mostly by: {}", parts.join("; "))?;
                }
                if at.unmatched_bytes > 0 {
                    writeln!(
                        out,
                        "  of it, {} is allocations that only some runs make, taken at their size in the largest size measured",
                        bytes(at.unmatched_bytes)
                    )?;
                }
            }
            if !p.deciding.is_empty() {
                let parts: Vec<String> = p
                    .deciding
                    .iter()
                    .map(|d| {
                        format!(
                            "{} {} ({}{}, {})",
                            crate::render::words::labels::short_frame(&d.callsite),
                            d.category,
                            if d.change_bytes < 0 { "-" } else { "+" },
                            bytes(d.change_bytes.unsigned_abs()),
                            // Sizes that do not grow change only where the peak moved.
                            if d.exponent == 0 {
                                "the same sizes, live at one peak and not at the other"
                            } else {
                                grows(d.exponent)
                            }
                        )
                    })
                    .collect();
                writeln!(
                    out,
                    "  the change from the largest size measured is mostly: {}",
                    parts.join("; ")
                )?;
            }
            let events_of = p.stream.as_ref().map(|a| r.runs[a.peak_run].path.as_str());
            write_fits(out, &p.fits, r.headroom, events_of)?;
        }
        None if !refusals.is_empty() => {}
        None if s.vary == Vary::BatchSeq => {
            writeln!(out, "  no prediction (give --target BATCHxSEQ, say 8x1024)")?
        }
        None => writeln!(out, "  no prediction (give --target VALUE)")?,
    }
    if s.vary == Vary::BatchSeq && !refused {
        writeln!(
            out,
            "  (batch and sequence both vary: no single largest size is searched; try a --target on each GPU with --check)"
        )?;
    }
    if !s.largest.is_empty() {
        writeln!(
            out,
            "largest {} that fits with {} headroom{}",
            vary_name(s.vary),
            percent(r.headroom),
            if s.largest.iter().any(|l| l.by_replay) {
                " (each size's predicted stream replayed at the device's capacity)"
            } else {
                ""
            }
        )?;
        for l in &s.largest {
            let what = match (l.size, l.at_limit) {
                (None, _) => "none: even a size of 1 does not fit".to_string(),
                (Some(n), true) => format!(
                    "{n} or more (the fit is not trusted past twice the largest size measured)"
                ),
                (Some(n), false) => n.to_string(),
            };
            writeln!(out, "  {:<16}  {what}", l.gpu.name)?;
        }
    }
    let others: Vec<&Caveat> = s.caveats.iter().filter(|c| !c.refuses()).collect();
    if !others.is_empty() {
        writeln!(out, "caveats")?;
        for c in others {
            writeln!(out, "  - {}", caveat_text(c, s.vary, &r.runs))?;
        }
    }
    Ok(())
}

/// Where two runs' streams part, in words.
fn parted_text(m: &Mismatch, r: &BudgetReport) -> String {
    match m {
        Mismatch::NoTrace { run } => format!("{} has no trace", shown(&r.runs[*run].path)),
        Mismatch::Length {
            run,
            commands,
            other_run,
            other_commands,
        } => format!(
            "{} makes {} allocations and frees, {} makes {}",
            shown(&r.runs[*run].path),
            crate::units::grouped(*commands),
            shown(&r.runs[*other_run].path),
            crate::units::grouped(*other_commands)
        ),
        Mismatch::Order {
            run,
            event,
            other_run,
            other_event,
        } => {
            let at = |e: &Option<u32>| match e {
                Some(e) => format!("event {}", crate::units::grouped(*e as u64)),
                None => "the blocks from before recording".into(),
            };
            format!(
                "they part at {} of {} and {} of {}",
                at(event),
                shown(&r.runs[*run].path),
                at(other_event),
                shown(&r.runs[*other_run].path)
            )
        }
    }
}

/// How the series' streams matched, how their sizes grow, and how well replays
/// reproduce the sizes measured.
fn write_stream_series(out: &mut dyn Write, s: &Series, r: &BudgetReport) -> io::Result<()> {
    let st = &s.stream;
    if let Some(m) = &st.mismatch {
        return writeln!(
            out,
            "  by allocation: not predicted, the runs' allocations do not match one to one ({}), nor in part (what every run makes, made and freed in the same order, with at most a quarter of a run's allocations left out){}",
            parted_text(m, r),
            if s.vary == Vary::BatchSeq {
                ""
            } else {
                "; the prediction sums the groups' fits at their peaks"
            }
        );
    }
    let l = st.laws;
    use crate::units::grouped;
    let mut laws = vec![format!("{} stay the same", grouped(l.constant))];
    match (l.linear, l.quadratic) {
        (0, 0) => {}
        (n, 0) => laws.push(format!("{} grow linearly", grouped(n))),
        (0, q) => laws.push(format!("{} grow quadratically", grouped(q))),
        (n, q) => laws.push(format!(
            "{} grow linearly, {} quadratically",
            grouped(n),
            grouped(q)
        )),
    }
    if l.inexact > 0 {
        laws.push(format!(
            "{} follow no law of degree 2 or less (fitted through the three largest sizes)",
            grouped(l.inexact)
        ));
    }
    match &st.unmatched {
        None => writeln!(
            out,
            "  by allocation: the runs' {} allocations match one to one (the same order, the same frees); with the {}, {}",
            grouped(st.allocations),
            vary_name(s.vary),
            laws.join(", ")
        )?,
        Some(u) => {
            writeln!(
                out,
                "  by allocation: the runs differ ({}), but matched in order {} allocations of the largest size have a counterpart in every run; with the {}, {}",
                parted_text(&u.parted, r),
                grouped(st.allocations),
                vary_name(s.vary),
                laws.join(", ")
            )?;
            writeln!(
                out,
                "  {} allocation{} that only some runs make {} taken at {} size in the largest size measured, and {} that the largest does not make {} left out (an inference: what only some sizes make has no law)",
                grouped(u.largest_only),
                if u.largest_only == 1 { "" } else { "s" },
                if u.largest_only == 1 { "is" } else { "are" },
                if u.largest_only == 1 { "its" } else { "their" },
                grouped(u.others_only),
                if u.others_only == 1 { "is" } else { "are" },
            )?;
        }
    }
    // A recording that began with a cache left by earlier work is checked on its
    // requested peak only: its reserved peak is not a fresh process's.
    let worst = st
        .own
        .iter()
        .map(|c| {
            if c.began_with_cache() {
                c.requested_error.abs()
            } else {
                c.worst()
            }
        })
        .fold(0.0, f64::max);
    writeln!(
        out,
        "  each size's own stream replayed through the allocator model gives its recorded peaks within {:.1}% (an inference: the blocks from before recording are allocated first, into an empty allocator)",
        worst * 100.0
    )?;
    let cached: Vec<String> = st
        .own
        .iter()
        .enumerate()
        .filter(|(_, c)| c.began_with_cache())
        .map(|(k, c)| {
            format!(
                "{} ({} cached at its first event; reserved at most {} recorded, {} from a fresh process)",
                size_label(s, k),
                bytes(c.cache_at_start_bytes),
                bytes(c.recorded_reserved_bytes),
                bytes(c.fresh_process_reserved_bytes.unwrap_or(0))
            )
        })
        .collect();
    if !cached.is_empty() {
        writeln!(
            out,
            "  the recording{} of {} began with a cache left by earlier work (the process's work before recording: other sizes measured first, or earlier steps): {} recorded reserved memory includes it, so {} held-out check{} and the prediction are of a fresh process (a replay from an empty allocator)",
            if cached.len() == 1 { "" } else { "s" },
            cached.join(", "),
            if cached.len() == 1 { "its" } else { "their" },
            if cached.len() == 1 { "its" } else { "their" },
            if cached.len() == 1 { "" } else { "s" },
        )?;
    }
    for (k, c) in st.held_out.iter().enumerate() {
        writeln!(
            out,
            "  held out, replayed: {} predicted from the others: requested {:+.1}%, reserved {:+.1}%{}",
            size_label(s, k),
            c.requested_error * 100.0,
            c.reserved_error * 100.0,
            if c.fresh_process_reserved_bytes.is_some() {
                " (against a fresh process)"
            } else {
                ""
            }
        )?;
    }
    Ok(())
}

/// One run's budget and its fits on the common GPUs with 10% headroom (the report's
/// section; `vramlens budget` chooses the GPUs and the headroom).
pub fn write_run_budget_text(out: &mut dyn Write, r: &RunBudget) -> io::Result<()> {
    write_run(out, r, true)?;
    let runs = std::slice::from_ref(r);
    let headroom = crate::analysis::budget::headroom_of(runs, None, None);
    let fits: Vec<Fit> = crate::analysis::budget::gpus::default_gpus()
        .iter()
        .map(|g| crate::analysis::budget::fit_run(g, r, headroom.fraction))
        .collect();
    writeln!(out, "on one device, {}", headroom_text(&headroom, runs))?;
    write_fits(out, &fits, headroom.fraction, None)
}

/// A fraction as a percentage: whole, or to one decimal.
fn percent(f: f64) -> String {
    let p = f * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// The headroom and what decided it.
fn headroom_text(h: &Headroom, runs: &[RunBudget]) -> String {
    let spreads: Vec<String> = h
        .spreads
        .iter()
        .take(3)
        .map(|s| {
            let run = &runs[s.run];
            let what = match s.kind {
                SpreadKind::Steps => format!(
                    "live tensors at the peak of each of {} steps of {}",
                    s.count,
                    shown(&run.path)
                ),
                SpreadKind::Devices => format!(
                    "the most reserved on each of the {} devices of {}",
                    s.count,
                    shown(&run.path)
                ),
                SpreadKind::Ranks => format!(
                    "the most reserved in each of {} files named like {} (ranks of one job)",
                    s.count,
                    shown(&run.path)
                ),
                SpreadKind::Repeats => format!(
                    "the most reserved in each of {} files of one size, like {}",
                    s.count,
                    shown(&run.path)
                ),
                SpreadKind::TieBreak => format!(
                    "the most reserved replaying {} with equal free blocks taken highest address first or lowest (PyTorch's order)",
                    shown(&run.path)
                ),
            };
            format!(
                "{what}, {} to {}: {}",
                bytes(s.smallest_bytes),
                bytes(s.largest_bytes),
                percent(s.spread)
            )
        })
        .collect();
    match h.source {
        HeadroomSource::Given => format!("with {} headroom (given)", percent(h.fraction)),
        HeadroomSource::Observed => format!(
            "with {} headroom, the most the peak varies in the files ({})",
            percent(h.fraction),
            spreads.join("; ")
        ),
        HeadroomSource::Assumed if !h.spreads.is_empty() => {
            // Only the order of equal free blocks was tried: it moved the peak less.
            let s = &h.spreads[0];
            format!(
                "with {} headroom (assumed: no step or device repeats in the files to show how much the peak varies; replayed with no limit, taking equal free blocks in the other order moves the reserved peak of {} by {} ({} to {}{}); --headroom PCT sets it)",
                percent(h.fraction),
                shown(&runs[s.run].path),
                percent(s.spread),
                bytes(s.smallest_bytes),
                bytes(s.largest_bytes),
                {
                    let r = &runs[s.run];
                    if r.oom_event.is_some() && r.peak_reserved_bytes < s.smallest_bytes {
                        format!(
                            "; the recording reserved at most {} before its OOM stopped it",
                            bytes(r.peak_reserved_bytes)
                        )
                    } else {
                        String::new()
                    }
                }
            )
        }
        HeadroomSource::Assumed => format!(
            "with {} headroom (assumed: no step or device repeats in the files to show how much the peak varies; --headroom PCT sets it)",
            percent(h.fraction)
        ),
    }
}

pub fn write_budget_text(out: &mut dyn Write, r: &BudgetReport, _style: Style) -> io::Result<()> {
    // A size asked for and not predicted: the answer, first.
    if let Some(s) = r.series.as_ref().filter(|s| !s.trusted)
        && let Some(target) = s.target
    {
        for c in s.caveats.iter().filter(|c| c.refuses()) {
            writeln!(
                out,
                "no prediction at {} {target}: {}",
                vary_name(s.vary),
                caveat_text(c, s.vary, &r.runs)
            )?;
        }
        writeln!(out)?;
    }
    for (i, run) in r.runs.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        write_run(out, run, r.series.is_none())?;
    }
    if let Some(d) = r.runs.get(r.deciding_run) {
        writeln!(out)?;
        if let Some((lo, hi)) = r.unrelated_weights {
            writeln!(
                out,
                "the files are separate runs, not the ranks of one job (their weights differ: {} to {}); the largest, {} device {}, on one device, {}",
                bytes(lo),
                bytes(hi),
                shown(&d.path),
                d.device,
                headroom_text(&r.headroom_evidence, &r.runs)
            )?;
        } else if r.runs.len() > 1 {
            writeln!(
                out,
                "on one device each (GPUs do not pool memory: the largest, {} device {}, decides), {}",
                shown(&d.path),
                d.device,
                headroom_text(&r.headroom_evidence, &r.runs)
            )?;
        } else {
            writeln!(
                out,
                "on one device, {}",
                headroom_text(&r.headroom_evidence, &r.runs)
            )?;
        }
        write_fits(out, &r.fits, r.headroom, None)?;
        writeln!(
            out,
            "  (capacity: what the driver lets a process use, as PyTorch's OOM message prints it; a kernel chosen for another GPU, a different library version or a memory-fraction limit moves the figures)"
        )?;
    }
    if let Some(s) = &r.series {
        writeln!(out)?;
        write_series(out, s, r)?;
    }
    Ok(())
}

/// A bar of the chart.
struct Bar {
    label: String,
    lines: Vec<(Line, u64)>,
    predicted: bool,
    /// A run that ran out of memory: its total is a lower bound.
    at_least: bool,
}

/// The chart's geometry: the plot's left edge, top, height and width, the bars' width
/// and the gap between them, and the bytes at the top of the axis (a round tick).
struct Chart {
    left: f64,
    top_px: f64,
    plot_h: f64,
    plot_w: f64,
    bar_w: f64,
    gap: f64,
    top: f64,
    /// The highest bar or capacity, which the axis' round top is over.
    data_top: u64,
}

impl Chart {
    /// The y of `b` bytes.
    fn y(&self, b: f64) -> f64 {
        self.top_px + self.plot_h - b / self.top * self.plot_h
    }
}

/// Stacked bars: each run's lines (and the prediction, hatched), with each GPU's
/// capacity as a line.
///
/// With `only_near` (the GPUs were not named), only the capacities below the highest bar
/// and the first at or above it are drawn: larger ones would flatten the bars.
pub fn write_budget_svg(out: &mut dyn Write, r: &BudgetReport, only_near: bool) -> io::Result<()> {
    let bars = bars(r);
    let at_least = bars.iter().any(|bar| bar.at_least);
    let all_gpus: Vec<&Fit> = match r.series.as_ref().and_then(|s| s.prediction.as_ref()) {
        Some(p) => p.fits.iter().collect(),
        None => r.fits.iter().collect(),
    };
    let highest_bar = bars
        .iter()
        .map(|bar| sum_bytes(bar.lines.iter().map(|&(_, b)| b)))
        .max()
        .unwrap_or(0);
    let first_above = all_gpus
        .iter()
        .map(|f| f.gpu.capacity_bytes)
        .filter(|&c| c >= highest_bar)
        .min()
        .filter(|_| only_near);
    let given = all_gpus.len();
    let gpus: Vec<&Fit> = all_gpus
        .into_iter()
        .filter(|f| first_above.is_none_or(|c| f.gpu.capacity_bytes <= c))
        .collect();
    let left_out = if gpus.len() < given {
        " (larger GPUs left out)"
    } else {
        ""
    };
    let data_top = gpus
        .iter()
        .map(|f| f.gpu.capacity_bytes)
        .chain([highest_bar])
        .max()
        .unwrap_or(1)
        .max(1);
    // The axis ends at the first round tick at or above the highest bar or capacity.
    let (step, _, unit) = tick_step(data_top);
    let step_bytes = step * unit as f64;
    let top = ((data_top as f64 / step_bytes) * (1.0 - 1e-12))
        .ceil()
        .max(1.0)
        * step_bytes;
    let (left, right, top_px, plot_h) = (90.0, 480.0, 50.0, 360.0);
    let bar_w = 70.0;
    let gap = 40.0;
    let plot_w = (bars.len() as f64 * (bar_w + gap) + gap).max(300.0);
    let width = left + plot_w + right;
    let bars_height = top_px + plot_h + 70.0;
    let curves = reserved_curves(r);
    let height = bars_height
        + if curves.is_empty() {
            0.0
        } else {
            CURVES_HEIGHT
        };
    let c = Chart {
        left,
        top_px,
        plot_h,
        plot_w,
        bar_w,
        gap,
        top,
        data_top,
    };
    let mut svg = Svg { out };
    svg.begin(width, height, "VRAM budget")?;
    writeln!(
        svg.out,
        r##"<text x="{}" y="24" font-size="15" font-weight="bold">VRAM budget at each run's peak{}{}</text>"##,
        num(left),
        if at_least { " (or its OOM)" } else { "" },
        if r.series.is_some() {
            ", the series and its prediction"
        } else {
            ""
        }
    )?;
    draw_ticks(&mut svg, &c)?;
    draw_bars(&mut svg, &c, &bars)?;
    draw_capacities(&mut svg, &c, &gpus)?;
    legend(&mut svg, &c, &bars)?;
    writeln!(
        svg.out,
        r##"<text x="{}" y="{}" font-size="11" fill="#555555">dashed: each GPU's capacity{left_out}; pale bar: predicted{}</text>"##,
        num(left),
        num(bars_height - 12.0),
        if at_least {
            "; ≥: the run ran out of memory there, so it needs at least this"
        } else {
            ""
        }
    )?;
    if !curves.is_empty() {
        draw_reserved_over_time(&mut svg, bars_height, width, &curves, r)?;
    }
    svg.end()
}

/// The height of the reserved-over-time panel under the bars.
const CURVES_HEIGHT: f64 = 400.0;

/// Each measured size's recorded reserved bytes over its stream, and the predicted
/// size's replayed (the last, marked predicted); none unless the series' allocations
/// match.
fn reserved_curves(r: &BudgetReport) -> Vec<(&ReservedCurve, bool, String)> {
    let Some(s) = &r.series else {
        return Vec::new();
    };
    let vary = vary_short(s.vary);
    let mut out: Vec<(&ReservedCurve, bool, String)> = s
        .stream
        .reserved_over_time
        .iter()
        .enumerate()
        .map(|(k, c)| {
            (
                c,
                false,
                format!("{vary} {}", size_label(s, k)).trim().to_string(),
            )
        })
        .collect();
    if let Some(p) = &s.prediction
        && let Some(at) = &p.stream
    {
        let name = format!("{vary} {} (predicted)", predicted_label(p))
            .trim()
            .to_string();
        out.push((&at.reserved_over_time, true, name));
    }
    out
}

/// The panel of reserved bytes over the stream: one line per size (measured solid,
/// predicted dashed), x the share of the stream done, y bytes.
fn draw_reserved_over_time(
    svg: &mut Svg,
    y0: f64,
    width: f64,
    curves: &[(&ReservedCurve, bool, String)],
    r: &BudgetReport,
) -> io::Result<()> {
    let (left, top_px, plot_h) = (90.0, y0 + 40.0, 280.0);
    let plot_w = width - left - 260.0;
    let highest = curves
        .iter()
        .flat_map(|(c, _, _)| c.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(1)
        .max(1);
    // What each GPU leaves the allocator (its capacity less the memory outside it),
    // drawn where it is near the curves.
    let outside = r.series.as_ref().map_or(0, |s| {
        s.runs
            .iter()
            .map(|&i| r.runs[i].outside.counted_bytes)
            .max()
            .unwrap_or(0)
    });
    let mut limits: Vec<(u64, Vec<&str>)> = Vec::new();
    for f in r
        .series
        .as_ref()
        .and_then(|s| s.prediction.as_ref())
        .map_or(&r.fits[..], |p| &p.fits[..])
    {
        let limit = f.gpu.capacity_bytes.saturating_sub(outside);
        if limit as f64 > 1.5 * highest as f64 {
            continue;
        }
        match limits.iter_mut().find(|(b, _)| *b == limit) {
            Some((_, names)) => names.push(&f.gpu.name),
            None => limits.push((limit, vec![&f.gpu.name])),
        }
    }
    let data_top = limits
        .iter()
        .map(|l| l.0)
        .chain([highest])
        .max()
        .unwrap_or(1);
    let (step, _, unit) = tick_step(data_top);
    let step_bytes = step * unit as f64;
    let top = ((data_top as f64 / step_bytes) * (1.0 - 1e-12))
        .ceil()
        .max(1.0)
        * step_bytes;
    let c = Chart {
        left,
        top_px,
        plot_h,
        plot_w,
        bar_w: 0.0,
        gap: 0.0,
        top,
        data_top,
    };
    writeln!(
        svg.out,
        r##"<text x="{}" y="{}" font-size="15" font-weight="bold">Reserved memory over each run, measured and predicted</text>"##,
        num(left),
        num(y0 + 20.0)
    )?;
    draw_ticks(svg, &c)?;
    let bottom = top_px + plot_h;
    svg.line(
        left,
        bottom,
        left + plot_w,
        bottom,
        r##" stroke="#888888""##,
    )?;
    for k in 0..=4 {
        let x = left + plot_w * k as f64 / 4.0;
        svg.text(
            x,
            bottom + 16.0,
            "middle",
            r##" font-size="11" fill="#444444""##,
            &format!("{}%", k * 25),
        )?;
    }
    svg.text(
        left + plot_w / 2.0,
        bottom + 34.0,
        "middle",
        r##" font-size="11" fill="#444444""##,
        if r
            .series
            .as_ref()
            .is_some_and(|s| s.stream.unmatched.is_some())
        {
            "share of the recorded allocations and frees done (about the same place in each size: some runs make allocations others do not)"
        } else {
            "share of the recorded allocations and frees done (the same place in each size)"
        },
    )?;
    svg.text(
        left,
        bottom + 54.0,
        "start",
        r##" font-size="11" fill="#555555""##,
        "measured: what each recording reserved, from what it held when recording began; predicted: the predicted allocations replayed from an empty cache",
    )?;
    for (limit, names) in &limits {
        let y = c.y(*limit as f64);
        svg.line(
            left,
            y,
            left + plot_w,
            y,
            r##" stroke="#333333" stroke-dasharray="5 3""##,
        )?;
        svg.text(
            left + 4.0,
            y - 4.0,
            "start",
            r##" font-size="11" fill="#333333" class="allocator-limit""##,
            &format!(
                "{}: {} for the allocator ({} less {} outside it)",
                names.join(", "),
                bytes(*limit),
                bytes(limit + outside),
                bytes(outside)
            ),
        )?;
    }
    let n = curves.len();
    for (k, (curve, predicted, name)) in curves.iter().enumerate() {
        // Darker for larger sizes; the prediction in its own colour.
        let stroke = if *predicted {
            "#c0392b".to_string()
        } else {
            let shade = 170 - (120 * k / n.max(2).saturating_sub(1).max(1)).min(120);
            format!("#{shade:02x}{shade:02x}{:02x}", 200 + shade / 5)
        };
        let x_of = |cmd: u64| left + plot_w * cmd as f64 / curve.commands.max(1) as f64;
        let mut pts: Vec<(f64, f64)> = Vec::with_capacity(curve.points.len() * 2 + 1);
        for (i, &(cmd, b)) in curve.points.iter().enumerate() {
            if i > 0 {
                pts.push((x_of(cmd), pts[pts.len() - 1].1));
            }
            pts.push((x_of(cmd), c.y(b as f64)));
        }
        if let Some(&(_, y)) = pts.last() {
            pts.push((left + plot_w, y));
        }
        let peak = curve.points.iter().map(|p| p.1).max().unwrap_or(0);
        let tip = format!("{name}: peak reserved {}", bytes(peak));
        svg.polyline(
            &pts,
            &format!(
                r##" stroke="{stroke}" stroke-width="1.6"{} class="reserved-curve" data-size="{}" data-peak-bytes="{peak}""##,
                if *predicted {
                    r##" stroke-dasharray="6 3""##
                } else {
                    ""
                },
                curve.size
            ),
            Some(&tip),
        )?;
        let ly = top_px + 10.0 + k as f64 * 18.0;
        let lx = left + plot_w + 20.0;
        writeln!(
            svg.out,
            r##"<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="{stroke}" stroke-width="2"{}/><text x="{}" y="{}" font-size="11">{}</text>"##,
            num(lx),
            num(lx + 22.0),
            if *predicted {
                r##" stroke-dasharray="6 3""##
            } else {
                ""
            },
            num(lx + 28.0),
            num(ly + 4.0),
            escape(&format!("{name}: peak {}", bytes(peak))),
            y = num(ly),
        )?;
    }
    Ok(())
}

/// The bars: each run's (in the series' order when there is one), then the prediction.
fn bars(r: &BudgetReport) -> Vec<Bar> {
    let mut bars: Vec<Bar> = Vec::new();
    let order: Vec<usize> = match &r.series {
        Some(s) => s.runs.clone(),
        None => (0..r.runs.len()).collect(),
    };
    for (k, &i) in order.iter().enumerate() {
        let run = &r.runs[i];
        let label = match &r.series {
            Some(s) => format!("{} {}", vary_short(s.vary), size_label(s, k))
                .trim()
                .to_string(),
            None => shown(run.path.rsplit(['/', '\\']).next().unwrap_or(&run.path)).into_owned(),
        };
        bars.push(Bar {
            label,
            lines: run.lines.iter().map(|l| (l.line, l.bytes)).collect(),
            predicted: false,
            at_least: run.oom_request_bytes.is_some(),
        });
    }
    if let Some(p) = r.series.as_ref().and_then(|s| s.prediction.as_ref()) {
        let vary = r.series.as_ref().map_or("", |s| vary_short(s.vary));
        bars.push(Bar {
            label: format!("{vary} {} (predicted)", predicted_label(p))
                .trim()
                .to_string(),
            lines: p.lines.clone(),
            predicted: true,
            at_least: false,
        });
    }
    bars
}

/// About how many steps the y axis is cut into.
const TICKS: f64 = 4.0;

/// A round step for the y axis up to `max` bytes, in the binary unit `max` prints in:
/// 1, 2, 4 or 5 times a power of ten of that unit (40 GiB for a 139.8 GiB axis, so it
/// reads 40 / 80 / 120 GiB), and the unit's name and bytes.
fn tick_step(max: u64) -> (f64, &'static str, u64) {
    let (name, unit) = crate::units::binary_unit(max.max(1));
    let raw = (max.max(1) as f64 / unit as f64 / TICKS).max(1e-6);
    let step =
        crate::render::charts::svg::round_step(raw * (1.0 - 1e-9), &[1.0, 2.0, 4.0, 5.0, 10.0]);
    (step, name, unit)
}

/// A tick's label: its value in the axis' unit, without trailing zeros (`40 GiB`,
/// `0.5 GiB`).
fn tick_label(value: f64, name: &str) -> String {
    let v = format!("{value:.3}");
    let v = v.trim_end_matches('0').trim_end_matches('.');
    format!("{v} {name}")
}

/// The y axis's round ticks up to the top of the chart, and their grid lines.
fn draw_ticks(svg: &mut Svg, c: &Chart) -> io::Result<()> {
    let (step, name, unit) = tick_step(c.data_top);
    // Counted, and at most MAX_TICKS of them, whatever the top.
    for k in 0..crate::render::charts::svg::MAX_TICKS {
        let value = step * k as f64;
        let b = value * unit as f64;
        if b.is_nan() || b > c.top * (1.0 + 1e-9) {
            break;
        }
        writeln!(
            svg.out,
            r##"<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="#e4e4e4"/><text x="{}" y="{}" font-size="11" text-anchor="end" class="tick" data-bytes="{}">{}</text>"##,
            num(c.left),
            num(c.left + c.plot_w),
            num(c.left - 6.0),
            num(c.y(b) + 4.0),
            b.round() as u64,
            escape(&tick_label(value, name)),
            y = num(c.y(b)),
        )?;
    }
    Ok(())
}

/// Each bar: its lines stacked from the bottom, then its label under it and its total
/// above it.
fn draw_bars(svg: &mut Svg, c: &Chart, bars: &[Bar]) -> io::Result<()> {
    for (i, bar) in bars.iter().enumerate() {
        let Bar {
            label,
            lines,
            predicted,
            at_least,
        } = bar;
        let x = c.left + c.gap + i as f64 * (c.bar_w + c.gap);
        let mut acc = 0u64;
        for (line, b) in lines {
            if *b == 0 {
                continue;
            }
            let (y0, y1) = (c.y(acc.saturating_add(*b) as f64), c.y(acc as f64));
            acc = acc.saturating_add(*b);
            writeln!(
                svg.out,
                r##"<g><title>{}: {} ({} bytes){}</title><rect x="{}" y="{}" width="{}" height="{}" fill="{}" fill-opacity="{}" stroke="#ffffff" stroke-width="0.5" data-bytes="{b}"/></g>"##,
                escape(label),
                escape(&format!("{} {}", line_name(*line), bytes(*b))),
                b,
                if *predicted { ", predicted" } else { "" },
                num(x),
                num(y0),
                num(c.bar_w),
                num((y1 - y0).max(0.0)),
                line_color(*line),
                if *predicted { "0.55" } else { "1" },
            )?;
        }
        writeln!(
            svg.out,
            r##"<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text><text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>"##,
            num(x + c.bar_w / 2.0),
            num(c.top_px + c.plot_h + 16.0),
            escape(label),
            num(x + c.bar_w / 2.0),
            num(c.y(acc as f64) - 5.0),
            escape(&format!(
                "{}{}",
                if *at_least { "≥ " } else { "" },
                bytes(acc)
            )),
        )?;
    }
    Ok(())
}

/// The height of a capacity's label (font size 11, and a little air).
const LABEL_H: f64 = 13.0;

/// Label baselines for lines at `ys` (top first): each at its line, moved down just
/// enough to clear the one above by [`LABEL_H`], then up as a block where that pushes
/// the last past `bottom`.
fn spread_labels(ys: &[f64], bottom: f64) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::with_capacity(ys.len());
    for &y in ys {
        let y = match out.last() {
            Some(&prev) => y.max(prev + LABEL_H),
            None => y,
        };
        out.push(y);
    }
    let mut limit = bottom;
    for y in out.iter_mut().rev() {
        *y = y.min(limit);
        limit = *y - LABEL_H;
    }
    out
}

/// Each GPU's capacity as a dashed line across the plot, named at its right end. GPUs of
/// one capacity share the line and one label (`A100 80GB, H100 80GB 79.2 GiB`); labels
/// of close capacities are moved apart, a short stroke tying a moved one to its line.
fn draw_capacities(svg: &mut Svg, c: &Chart, gpus: &[&Fit]) -> io::Result<()> {
    // Highest capacity first (top of the chart first); GPUs of one capacity in the
    // order given.
    let mut lines: Vec<(u64, Vec<&Fit>)> = Vec::new();
    let mut sorted: Vec<&Fit> = gpus.to_vec();
    sorted.sort_by_key(|f| std::cmp::Reverse(f.gpu.capacity_bytes));
    for f in sorted {
        match lines.last_mut() {
            Some((cap, fits)) if *cap == f.gpu.capacity_bytes => fits.push(f),
            _ => lines.push((f.gpu.capacity_bytes, vec![f])),
        }
    }
    let ys: Vec<f64> = lines.iter().map(|(cap, _)| c.y(*cap as f64)).collect();
    let label_ys = spread_labels(
        &ys.iter().map(|y| y + 4.0).collect::<Vec<_>>(),
        c.top_px + c.plot_h + 4.0,
    );
    let end = c.left + c.plot_w;
    for (((cap, fits), yy), ly) in lines.iter().zip(&ys).zip(&label_ys) {
        let names: Vec<&str> = fits.iter().map(|f| f.gpu.name.as_str()).collect();
        let label = if fits.iter().all(|f| f.gpu.source == "given as a size") {
            names.join(", ")
        } else {
            format!("{} {}", names.join(", "), bytes(*cap))
        };
        let tip: Vec<String> = fits
            .iter()
            .map(|f| format!("{}: {} ({} bytes)", f.gpu.name, bytes(*cap), cap))
            .collect();
        let moved = (ly - 4.0 - yy).abs() > 1.0;
        writeln!(
            svg.out,
            r##"<g><title>{}</title><line x1="{}" x2="{}" y1="{yy}" y2="{yy}" stroke="#333333" stroke-dasharray="5 3"/>{}<text x="{}" y="{}" font-size="11" class="capacity" data-bytes="{cap}">{}</text></g>"##,
            escape(&tip.join("\n")),
            num(c.left),
            num(end),
            if moved {
                format!(
                    r##"<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="#999999"/>"##,
                    num(end),
                    num(end + 5.0),
                    num(*yy),
                    num(ly - 4.0)
                )
            } else {
                String::new()
            },
            num(end + 8.0),
            num(*ly),
            escape(&label),
            yy = num(*yy),
        )?;
    }
    Ok(())
}

/// The legend: the lines that appear in some bar.
fn legend(svg: &mut Svg, c: &Chart, bars: &[Bar]) -> io::Result<()> {
    let lx = c.left + c.plot_w + 240.0;
    let shown: Vec<Line> = Line::ALL
        .iter()
        .copied()
        .filter(|l| {
            bars.iter()
                .any(|bar| bar.lines.iter().any(|(x, b)| x == l && *b > 0))
        })
        .collect();
    for (k, line) in shown.iter().enumerate() {
        let ly = c.top_px + 10.0 + k as f64 * 18.0;
        writeln!(
            svg.out,
            r##"<rect x="{}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}" font-size="11">{}</text>"##,
            num(lx),
            num(ly),
            line_color(*line),
            num(lx + 18.0),
            num(ly + 10.0),
            escape(line_name(*line)),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod chart_tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// One base in one sentence: what is left, against the headroom in bytes (10% of
    /// the need), not a share of the capacity beside a share of the need.
    #[test]
    fn a_fit_states_the_headroom_in_bytes() {
        let gpu = crate::analysis::budget::gpus::Gpu {
            name: "40 GiB".into(),
            capacity_bytes: 40 << 30,
            source: "given as a size",
            ambiguous: None,
        };
        // 36.4 GiB needs 40.04 GiB with 10%: tight; 3.6 GiB left, 3.64 GiB of headroom.
        let total = (364u64 << 30) / 10;
        let f = crate::analysis::budget::fit(&gpu, total, 0.1);
        assert_eq!(
            verdict_text(&f, 0.1),
            "tight: fits with 3.6 GiB left, less than its 10% headroom of 3.6 GiB"
        );
        // 30 GiB: 10 GiB left, more than its 3.0 GiB of headroom.
        let f = crate::analysis::budget::fit(&gpu, 30 << 30, 0.1);
        assert_eq!(
            verdict_text(&f, 0.1),
            "fits: 10.0 GiB left, more than its 10% headroom of 3.0 GiB"
        );
    }

    #[test]
    fn ticks_are_round_in_the_unit_shown() {
        // 139.8 GiB / 4 = 34.95 GiB: 40 GiB. 2 GiB / 4 = 0.5 GiB. 900 MiB / 4 = 225 MiB:
        // 400 MiB (200 is less). 10 GiB / 4 = 2.5 GiB: 4 GiB.
        assert_eq!(tick_step(139_800 * GIB / 1000), (40.0, "GiB", GIB));
        assert_eq!(tick_step(2 * GIB), (0.5, "GiB", GIB));
        assert_eq!(tick_step(900 * MIB), (400.0, "MiB", MIB));
        assert_eq!(tick_step(10 * GIB), (4.0, "GiB", GIB));
        assert_eq!(tick_label(40.0, "GiB"), "40 GiB");
        assert_eq!(tick_label(0.5 * 3.0, "GiB"), "1.5 GiB");
        assert_eq!(tick_label(0.0, "GiB"), "0 GiB");
    }

    #[test]
    fn close_labels_move_apart() {
        assert_eq!(
            spread_labels(&[100.0, 100.2, 200.0], 400.0),
            [100.0, 113.0, 200.0]
        );
        // Pushed past the bottom: the block moves up.
        assert_eq!(spread_labels(&[390.0, 395.0], 400.0), [387.0, 400.0]);
    }
}
