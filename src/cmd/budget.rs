//! `vramlens budget`: what a run needs on a device, which GPUs it fits, and for a series
//! of runs at several sizes, what a new size needs.

use crate::cli::BudgetArgs;
use crate::cmd::{attribution_options, read_snapshot};
use anyhow::{Result, anyhow, bail};
use rayon::prelude::*;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use vramlens::allocator::checked::CheckedRun;
use vramlens::analysis::budget::gpus::Gpu;
use vramlens::analysis::budget::stream::Stream;
use vramlens::analysis::budget::{
    Outside, RunBudget, RunDevice, SeriesOptions, TargetSize, Vary, Verdict, headroom_of,
    replay_on, report, run_budget, shape_from_name, size_from_name,
};
use vramlens::analysis::device::choose_device;
use vramlens::input::ReadOptions;
use vramlens::render::budget::{write_budget_svg, write_budget_text};
use vramlens::render::{Style, write_json};

pub fn run(args: &BudgetArgs, out: &mut dyn Write) -> Result<()> {
    let gpus: Vec<Gpu> = if args.gpus.is_empty() {
        vramlens::analysis::budget::gpus::default_gpus()
    } else {
        vramlens::analysis::budget::gpus::distinct(&args.gpus)
    };
    let vary: Option<Vary> = args.vary;
    let files = crate::cmd::expand_inputs(&args.files)?;
    if files.len() > 1 && (!args.device_logs.nvml.is_empty() || args.device_logs.log.is_some()) {
        bail!(
            "--nvml and --log measure one run: give them with one snapshot ({} given)",
            files.len()
        );
    }
    let options = attribution_options(&args.attribution)?;
    let messages = args
        .device_logs
        .log
        .as_deref()
        .map(crate::cmd::oom::read_oom_log)
        .transpose()?;
    // Every device of every file is a run: GPUs do not pool memory, so the one that needs
    // the most decides (`--device` keeps one).
    let per_file: Vec<Vec<RunBudget>> = files
        .par_iter()
        .map(|path| -> Result<Vec<RunBudget>> {
            let (snap, info) = read_snapshot(path, ReadOptions { progress: true })?;
            let choice =
                choose_device(&snap, args.device).map_err(|e| anyhow!("{}: {e}", info.path))?;
            // The file's devices, listed once: each run keeps only their number.
            let count = choice.others.len() + 1;
            let devices = match args.device {
                Some(d) => vec![d],
                None => snap.devices(),
            };
            devices
                .into_iter()
                .map(|device| {
                    let this = RunDevice { device, count };
                    let outside = outside_of(
                        &snap,
                        &info.path,
                        device,
                        &args.device_logs.nvml,
                        args.device_logs.clock.utc_offset,
                        messages.as_deref(),
                    )?;
                    // Each allocation's line, for a series predicted by its stream.
                    let with_lines = files.len() > 1 && (args.device.is_some() || count == 1);
                    let fits = |c: &CheckedRun| replay_on(c, &gpus, outside.counted_bytes);
                    let budget = |c: Option<&CheckedRun>| {
                        run_budget(&snap, &info.path, this, &options, outside, with_lines, c)
                    };
                    // The budget and the replays of the allocator model are independent,
                    // but for the what-ifs of a first OOM, which read the check: where
                    // there is one, the check comes first.
                    let has_oom = snap
                        .trace(device)
                        .is_some_and(|t| t.oom_events().next().is_some());
                    let (mut run, (prepared, replayed)) = if has_oom {
                        let checked = CheckedRun::new(&snap, device, None).ok();
                        let (run, r) =
                            rayon::join(|| budget(checked.as_ref()), || checked.as_ref().map(fits));
                        (run, (checked.map(|c| c.prepared), r.unwrap_or_default()))
                    } else {
                        rayon::join(
                            || budget(None),
                            || {
                                // The fits ask only whether the model reproduces the run.
                                let checked = CheckedRun::until_departure(&snap, device, None).ok();
                                let r = checked.as_ref().map(fits);
                                (checked.map(|c| c.prepared), r.unwrap_or_default())
                            },
                        )
                    };
                    run.replays = replayed.gpus;
                    run.tie_break = replayed.tie_break;
                    run.stream = prepared
                        .zip(run.alloc_lines.as_deref())
                        .map(|(p, lines)| std::sync::Arc::new(Stream::of(&p, lines)));
                    // Kept in the stream: no longer needed.
                    run.alloc_lines = None;
                    Ok(run)
                })
                .collect()
        })
        // Every file read, then the first error in the order given: which file a
        // failure names must not depend on which thread got there first.
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<_>>()?;
    let several_devices = per_file.iter().any(|runs| runs.len() > 1);
    if several_devices && (args.target.is_some() || !args.sizes.is_empty() || vary.is_some()) {
        bail!("a series is of one device per file: give --device N");
    }
    let runs: Vec<RunBudget> = per_file.into_iter().flatten().collect();
    let mut series = if several_devices {
        None
    } else {
        series_options(args, vary, &files, &gpus)?
    };
    let headroom = headroom_of(&runs, args.headroom.map(|p| p / 100.0), series.as_ref());
    if let Some(s) = &mut series {
        s.headroom = headroom.fraction;
    }
    let report = report(runs, &gpus, headroom, series.as_ref());
    if let Some(o) = &args.output {
        crate::cmd::output::write_new_file(o, args.force, |w| {
            write_budget_svg(w, &report, args.gpus.is_empty())
        })?;
    }
    if args.json {
        write_json(out, &report)?;
    } else {
        write_budget_text(out, &report, Style::detect(std::io::stdout().is_terminal()))?;
    }
    if args.check {
        let fits = match (&report.series, args.target) {
            // No prediction (the output says why first): a failed check.
            (Some(s), Some(_)) => match &s.prediction {
                Some(p) if s.trusted => &p.fits,
                _ => return Err(crate::cmd::diff::CheckFailed.into()),
            },
            _ => &report.fits,
        };
        // A run that ran out of memory fits a device only as far as its OOM: not a pass.
        if fits
            .iter()
            .any(|f| f.verdict != Verdict::Fits || f.until_oom)
        {
            return Err(crate::cmd::diff::CheckFailed.into());
        }
    }
    Ok(())
}

/// Memory outside the allocator at the run's peak ([`Outside::of_run`]), the device
/// readings read for the snapshot's time only.
pub(super) fn outside_of(
    snap: &vramlens::model::Snapshot,
    path: &str,
    device: i64,
    nvml: &[PathBuf],
    utc_offset: i32,
    messages: Option<&[vramlens::devlog::oom_log::OomMessage]>,
) -> Result<Outside> {
    use vramlens::analysis::device::reconcile::{LOG_MARGIN_US, focus_ranges, snapshot_range};
    let log = if nvml.is_empty() {
        None
    } else {
        let keep = snapshot_range(snap, Some(device)).map(|r| r.widen(LOG_MARGIN_US));
        let focus = focus_ranges(snap, Some(device));
        Some(crate::cmd::read_device_logs_in(
            nvml, utc_offset, keep, &focus,
        )?)
    };
    Outside::of_run(snap, path, device, log.as_ref(), utc_offset, messages).map_err(|e| {
        let logs: Vec<String> = nvml.iter().map(|p| p.display().to_string()).collect();
        anyhow!(
            "{}",
            vramlens::render::device::reconcile::error_text(&e, &logs.join(", "), None)
        )
    })
}

/// The series the files form, when they do: sizes given with --size or stated by the
/// names, every file one.
fn series_options(
    args: &BudgetArgs,
    vary: Option<Vary>,
    files: &[PathBuf],
    gpus: &[Gpu],
) -> Result<Option<SeriesOptions>> {
    let asked = vary.is_some() || !args.sizes.is_empty() || args.target.is_some();
    let mut given: Vec<(String, TargetSize)> = Vec::new();
    for s in &args.sizes {
        let (file, value) = s
            .rsplit_once('=')
            .ok_or_else(|| anyhow!("--size: expected FILE=VALUE, found {s:?}"))?;
        let value: TargetSize = value.parse().map_err(|_| {
            anyhow!("--size {s}: expected a whole number from 1 to 2^32 after '=' (or BATCHxSEQ)")
        })?;
        given.push((file.to_string(), value));
    }
    // Each file's size: given, else from its name (both numbers where it states both).
    let mut points: Vec<(usize, TargetSize)> = Vec::new();
    let mut kinds: Vec<Vary> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let shown = f.display().to_string();
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some((_, v)) = given.iter().find(|(g, _)| *g == shown || *g == name) {
            if v.shape.is_some() {
                kinds.push(Vary::BatchSeq);
            }
            points.push((i, *v));
            continue;
        }
        let found = match vary {
            Some(Vary::BatchSeq) | None => shape_from_name(&name).map(|shape| TargetSize {
                size: shape.0.saturating_mul(shape.1),
                shape: Some(shape),
            }),
            _ => None,
        }
        .or_else(|| {
            size_from_name(&name, vary.filter(|v| *v != Vary::BatchSeq)).map(|(k, v)| {
                kinds.push(k);
                TargetSize {
                    size: v,
                    shape: None,
                }
            })
        });
        match found {
            Some(v) => points.push((i, v)),
            None if asked && files.len() > 1 => bail!(
                "{shown}: no {} in its name: give --size {shown}=VALUE",
                match vary {
                    Some(Vary::Batch) => "batch size",
                    Some(Vary::BatchSeq) => "batch size and sequence length (bs4_seq512)",
                    _ => "size (ctx512, seq256, bs8)",
                }
            ),
            None => {}
        }
    }
    for (g, _) in &given {
        if !files.iter().any(|f| {
            f.display().to_string() == *g || f.file_name().is_some_and(|n| n == g.as_str())
        }) {
            bail!("--size {g}=...: no such file among the inputs");
        }
    }
    if files.len() < 2 || points.len() < files.len() {
        if args.target.is_some() {
            bail!(
                "--target needs a series: two or more snapshots of one workload at different sizes"
            );
        }
        return Ok(None);
    }
    // Names that state both: what varies across them decides.
    let shapes: Vec<(u64, u64)> = points.iter().filter_map(|(_, p)| p.shape).collect();
    if !shapes.is_empty() && shapes.len() == points.len() && vary.is_none() {
        let distinct = |f: fn(&(u64, u64)) -> u64| {
            let mut v: Vec<u64> = shapes.iter().map(f).collect();
            v.sort_unstable();
            v.dedup();
            v.len()
        };
        kinds.push(match (distinct(|s| s.0) > 1, distinct(|s| s.1) > 1) {
            (true, true) => Vary::BatchSeq,
            (true, false) => Vary::Batch,
            _ => Vary::Seq,
        });
    }
    kinds.sort_by_key(|k| *k as u8);
    kinds.dedup();
    let vary = match (vary, &kinds[..]) {
        (Some(v), _) => v,
        (None, [k]) => *k,
        (None, []) => bail!("--vary: give batch or seq for the sizes given with --size"),
        (None, _) => {
            bail!("the file names state both batch sizes and sequence lengths: give --vary")
        }
    };
    // Each file's size as the series reads it.
    let mut sizes: Vec<(usize, u64)> = Vec::new();
    let mut shapes: Vec<(usize, (u64, u64))> = Vec::new();
    for &(i, p) in &points {
        match (vary, p.shape) {
            (Vary::BatchSeq, Some(shape)) => shapes.push((i, shape)),
            (Vary::BatchSeq, None) => bail!(
                "{}: batch and sequence both vary: give --size {}=BATCHxSEQ",
                files[i].display(),
                files[i].display()
            ),
            _ => {}
        }
        sizes.push((
            i,
            match (vary, p.shape) {
                (Vary::Batch, Some((b, _))) => b,
                (Vary::Seq, Some((_, q))) => q,
                _ => p.size,
            },
        ));
    }
    let target = match (vary, args.target) {
        (Vary::BatchSeq, Some(t)) if t.shape.is_none() => {
            bail!("--target: batch and sequence both vary: give BATCHxSEQ (8x1024)")
        }
        (Vary::Batch | Vary::Seq, Some(t)) if t.shape.is_some() => bail!(
            "--target {}x{}: the series varies its {} only: give one number",
            t.shape.map_or(0, |s| s.0),
            t.shape.map_or(0, |s| s.1),
            if vary == Vary::Seq {
                "sequence length"
            } else {
                "batch size"
            }
        ),
        (_, t) => t,
    };
    if vary == Vary::BatchSeq {
        let mut seen: Vec<(u64, u64)> = shapes.iter().map(|&(_, s)| s).collect();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            bail!(
                "two files have batch {} × sequence {}: a series needs one file per shape",
                w[0].0,
                w[0].1
            );
        }
        return Ok(Some(SeriesOptions {
            vary,
            sizes,
            shapes,
            target: target.map(|t| t.size),
            target_shape: target.and_then(|t| t.shape),
            gpus: gpus.to_vec(),
            headroom: 0.0,
        }));
    }
    let mut seen: Vec<u64> = sizes.iter().map(|&(_, s)| s).collect();
    seen.sort_unstable();
    let mut precisions: Vec<&str> = files
        .iter()
        .map(|f| {
            vramlens::analysis::budget::precision_from_name(&f.display().to_string())
                .unwrap_or("not stated")
        })
        .collect();
    precisions.sort_unstable();
    precisions.dedup();
    // Files of one size are repeats (their spread is headroom evidence), unless their
    // names state other precisions; a series still needs two sizes.
    let mut distinct = seen.clone();
    distinct.dedup();
    if let Some(w) = seen
        .windows(2)
        .find(|w| w[0] == w[1])
        .filter(|_| precisions.len() > 1 || distinct.len() < 2)
    {
        if distinct.len() < 2 && precisions.len() < 2 && args.target.is_none() {
            return Ok(None);
        }
        let kind = if vary == Vary::Seq {
            "sequence length"
        } else {
            "batch size"
        };
        if precisions.len() > 1 {
            bail!(
                "two files have the same {kind} {}: a series needs one file per size (their names state precisions {}: give the files of one precision)",
                w[0],
                precisions.join(", ")
            );
        }
        bail!(
            "the files all have the same {kind} {}: a series needs two sizes at least",
            w[0]
        );
    }
    Ok(Some(SeriesOptions {
        vary,
        sizes,
        shapes: Vec::new(),
        target: target.map(|t| t.size),
        target_shape: None,
        gpus: gpus.to_vec(),
        // Set once the runs' headroom is known.
        headroom: 0.0,
    }))
}
