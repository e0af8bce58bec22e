//! `vramlens reconcile`: PyTorch's numbers against the device's.

use crate::cli::ReconcileArgs;
use anyhow::{Context, Result};
use std::io::{IsTerminal, Write};
use vramlens::analysis::reconcile::{analyze_reconcile, describe};
use vramlens::devlog::read_kineto;
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::render::{Style, write_json};
use vramlens::units::{bytes, bytes_signed, utc_time};

pub fn run(args: &ReconcileArgs, out: &mut dyn Write) -> Result<()> {
    let log = super::read_device_logs(&args.nvml, args.utc_offset)?;
    let (snap, info) = read_snapshot(&args.snapshot, ReadOptions { progress: true })?;
    let report = analyze_reconcile(&snap, &info.path, &log, args.device);
    let kineto = match &args.trace {
        Some(path) => {
            let data =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            Some(
                read_kineto(&data)
                    .with_context(|| format!("failed to read trace {}", path.display()))?,
            )
        }
        None => None,
    };
    if args.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            reconciliation: &'a vramlens::analysis::reconcile::Reconciliation,
            /// Peak Total Allocated / Total Reserved per CUDA device in the profiler trace.
            trace_peaks: Vec<(i64, Option<i64>, Option<i64>)>,
        }
        write_json(
            out,
            &Out {
                reconciliation: &report,
                trace_peaks: kineto.as_ref().map(trace_peaks).unwrap_or_default(),
            },
        )?;
        return Ok(());
    }
    let style = Style::detect(std::io::stdout().is_terminal());
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "{} against {} readings",
            report.path, report.device_log_source
        ))
    )?;
    for d in &report.devices {
        writeln!(out, "{}", style.heading(&format!("device {}", d.device)))?;
        for n in &d.notes {
            writeln!(out, "  note: {n}")?;
        }
        for l in &d.ledgers {
            let skew = l
                .sample_skew_us
                .map(|s| format!(", reading {:+.1} s away", s as f64 / 1e6))
                .unwrap_or_else(|| ", no reading near it".into());
            writeln!(
                out,
                "  {:<5} event {} at {}{skew}",
                l.moment,
                l.event.unwrap_or(0),
                utc_time(l.time_us)
            )?;
            writeln!(out, "        {}", describe(l))?;
            if let Some((lo, hi)) = l.device_used_range_bytes {
                writeln!(
                    out,
                    "        within 0.5 s: device used {} to {}",
                    bytes(lo),
                    bytes(hi)
                )?;
            }
            if let (Some((a, b)), Some((c, d))) = (
                l.outside_allocator_range_bytes,
                l.other_processes_range_bytes,
            ) {
                writeln!(
                    out,
                    "        within 0.5 s: outside the allocator {} to {}, other processes and driver {} to {}",
                    bytes_signed(a),
                    bytes_signed(b),
                    bytes_signed(c),
                    bytes_signed(d)
                )?;
            }
        }
        if let (Some(lo), Some(hi)) = (d.gap_min_bytes, d.gap_max_bytes) {
            writeln!(
                out,
                "  over {} readings, device used − PyTorch reserved ranged from {} to {}",
                d.over_time.len(),
                bytes_signed(lo),
                bytes_signed(hi)
            )?;
        }
        writeln!(
            out,
            "  the gap holds the CUDA context (typically 300 MB to 1 GB per process) and anything allocated outside the caching allocator; PyTorch's own cuBLAS and cuDNN workspaces are inside it, so they are not counted twice"
        )?;
        for c in &d.culprits {
            writeln!(out, "  likely: {c}")?;
        }
    }
    if let Some(k) = &kineto {
        for (dev, alloc, res) in trace_peaks(k) {
            writeln!(
                out,
                "profiler trace, CUDA device {dev}: peak Total Allocated {}, peak Total Reserved {}",
                alloc.map_or("?".into(), |v| bytes(v.max(0) as u64)),
                res.map_or("?".into(), |v| bytes(v.max(0) as u64))
            )?;
        }
    }
    Ok(())
}

/// (device, peak Total Allocated, peak Total Reserved) of CUDA [memory] events, by device.
fn trace_peaks(k: &vramlens::devlog::AllocatorTrace) -> Vec<(i64, Option<i64>, Option<i64>)> {
    let mut by: std::collections::BTreeMap<i64, (Option<i64>, Option<i64>)> = Default::default();
    for s in k.samples.iter().filter(|s| s.device_type == 1) {
        let e = by.entry(s.device_id).or_default();
        e.0 = e.0.max(s.total_allocated);
        e.1 = e.1.max(s.total_reserved);
    }
    by.into_iter().map(|(d, (a, r))| (d, a, r)).collect()
}
