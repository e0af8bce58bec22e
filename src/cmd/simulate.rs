//! `vramlens simulate`: what if the recorded run met another GPU or other allocator
//! settings.

use crate::cli::SimulateArgs;
use crate::cmd::read_snapshot;
use anyhow::{Result, anyhow, bail};
use std::io::{IsTerminal, Write};
use vramlens::allocator::{Profile, Settings};
use vramlens::analysis::budget::{Outside, OutsideSource};
use vramlens::analysis::device::choose_device;
use vramlens::analysis::what_if::simulate::{SimulateOptions, analyze_simulate};
use vramlens::input::ReadOptions;
use vramlens::render::simulate::{write_simulate_svg, write_simulate_text};
use vramlens::render::{Style, write_json};

pub fn run(args: &SimulateArgs, out: &mut dyn Write) -> Result<()> {
    let (snap, info) = read_snapshot(&args.snapshot, ReadOptions { progress: true })?;
    let choice = choose_device(&snap, args.device).map_err(|e| anyhow!("{}: {e}", info.path))?;
    let profile = args.torch;
    let parse_as = profile.unwrap_or_else(|| Profile::guess(&snap));
    let mut alloc_confs = Vec::new();
    for c in &args.alloc_confs {
        let s = Settings::parse(c, parse_as).map_err(|e| {
            anyhow!(
                "--alloc-conf {c:?}: PyTorch {} refuses it: {e}",
                parse_as.releases()
            )
        })?;
        if s.backend_async {
            bail!(
                "--alloc-conf {c:?}: backend:cudaMallocAsync is another allocator (CUDA's own pool), which this model does not simulate"
            );
        }
        alloc_confs.push((c.clone(), s));
    }
    let messages = args
        .device_logs
        .log
        .as_deref()
        .map(crate::cmd::oom::read_oom_log)
        .transpose()?;
    let outside = match args.outside {
        Some(b) => Some(Outside::measured(OutsideSource::Given, b)),
        None if !args.device_logs.nvml.is_empty() || messages.is_some() => {
            Some(crate::cmd::budget::outside_of(
                &snap,
                &info.path,
                choice.device,
                &args.device_logs.nvml,
                args.device_logs.clock.utc_offset,
                messages.as_deref(),
            )?)
        }
        None => None,
    };
    let options = SimulateOptions {
        gpus: vramlens::analysis::budget::gpus::distinct(&args.gpus),
        outside,
        alloc_confs,
        profile,
        min_capacity: !args.no_min_capacity,
    };
    let report = analyze_simulate(&snap, &info.path, &choice, &options);
    if report.devices.is_empty() {
        let why: Vec<String> = report
            .not_simulated
            .iter()
            .map(|n| format!("device {}: {}", n.device, n.reason))
            .collect();
        bail!(
            "{}: nothing to simulate ({}); record a trace with torch.cuda.memory._record_memory_history() before the work, then torch.cuda.memory._dump_snapshot(path)",
            info.path,
            why.join("; ")
        );
    }
    if let Some(path) = &args.output {
        let d = &report.devices[0];
        crate::cmd::write_new_file(path, args.force, |w| {
            write_simulate_svg(w, &report, d, &d.recorded_series, d.events)
        })?;
    }
    if args.json {
        write_json(out, &report)?;
    } else {
        write_simulate_text(
            out,
            &report,
            Style::detect(std::io::stdout().is_terminal()),
            true,
        )?;
        if let Some(path) = &args.output {
            writeln!(out, "chart: {}", crate::cmd::shown_path(path))?;
        }
    }
    Ok(())
}
