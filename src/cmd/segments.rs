//! `vramlens segments`: the allocator's segments and blocks at one moment.

use super::{check_output, write_new_file};
use crate::cli::SegmentsArgs;
use anyhow::{Result, anyhow};
use serde::Serialize;
use std::io::{IsTerminal, Write};
use vramlens::analysis::device::choose_device;
use vramlens::analysis::moment::{Moment, resolve};
use vramlens::analysis::top::peak_event;
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::render::segments_svg::{SegmentsTitle, write_segments_svg};
use vramlens::render::{Style, write_json};
use vramlens::timeline::replay::DeviceReplay;
use vramlens::timeline::state::allocator_state;
use vramlens::units::bytes;

#[derive(Serialize)]
struct BlockJson {
    addr: u64,
    size_bytes: u64,
    requested_bytes: u64,
    pending_free: bool,
}

#[derive(Serialize)]
struct SegmentJson {
    addr: u64,
    size_bytes: u64,
    stream: u64,
    pool_id: Option<(i64, i64)>,
    expandable: bool,
    blocks: Vec<BlockJson>,
    /// Free ranges: [address, size].
    holes: Vec<(u64, u64)>,
}

#[derive(Serialize)]
struct StateJson {
    schema_version: u32,
    path: String,
    device: i64,
    /// The state just after this event; null: before the first event.
    event: Option<u32>,
    segments: Vec<SegmentJson>,
}

pub fn run(args: &SegmentsArgs, out: &mut dyn Write) -> Result<()> {
    check_output(args.output.as_deref(), args.force)?;
    let (snap, info) = read_snapshot(&args.file, ReadOptions { progress: true })?;
    let path = info.path.as_str();
    let moment: Moment = args
        .at
        .as_deref()
        .unwrap_or("end")
        .parse()
        .map_err(|e: String| anyhow!("--at: {e}"))?;
    let choice = choose_device(&snap, args.device, moment == Moment::Oom)
        .map_err(|e| anyhow!("{path}: {e}"))?;
    let device = choice.device;
    let r = DeviceReplay::new(&snap, device);
    let n = r.len();
    let at = resolve(&r, moment, || peak_event(&r))
        .map_err(|e| anyhow!("{path}: {e}"))?
        .event
        .map(|e| e as usize);
    let state = allocator_state(&snap, device, at);
    let moment = match at {
        None => "before the first event".to_string(),
        Some(i) if i + 1 == n => format!("at the end (after event {i})"),
        Some(i) => format!("after event {i}"),
    };
    if let Some(o) = &args.output {
        let title = SegmentsTitle {
            path,
            device,
            moment: moment.clone(),
        };
        write_new_file(o, args.force, |w| {
            write_segments_svg(w, &state, &snap.frames, &title)
        })?;
    }
    if args.json {
        let report = StateJson {
            schema_version: 1,
            path: path.to_string(),
            device,
            event: at.map(|i| i as u32),
            segments: state
                .iter()
                .map(|s| SegmentJson {
                    addr: s.addr,
                    size_bytes: s.size,
                    stream: s.stream,
                    pool_id: s.pool_id,
                    expandable: s.expandable,
                    blocks: s
                        .blocks
                        .iter()
                        .map(|b| BlockJson {
                            addr: b.addr,
                            size_bytes: b.size,
                            requested_bytes: b.requested,
                            pending_free: b.pending_free,
                        })
                        .collect(),
                    holes: s.holes(),
                })
                .collect(),
        };
        write_json(out, &report)?;
    } else if args.output.is_none() {
        let style = Style::detect(std::io::stdout().is_terminal());
        writeln!(
            out,
            "{}",
            style.heading(&format!("{path}: device {device}, {moment}"))
        )?;
        for s in &state {
            let used: u64 = s.blocks.iter().map(|b| b.size).sum();
            let holes = s.holes();
            let largest = holes.iter().map(|h| h.1).max().unwrap_or(0);
            writeln!(
                out,
                "  s'{:x}  {:>10}  {} blocks, {} used, {} free in {} holes (largest {}), stream {}{}",
                s.addr,
                bytes(s.size),
                s.blocks.len(),
                bytes(used),
                bytes(s.size.saturating_sub(used)),
                holes.len(),
                bytes(largest),
                if s.stream == 0 {
                    "default".to_string()
                } else {
                    format!("0x{:x}", s.stream)
                },
                match s.pool_id {
                    Some(p) if p != (0, 0) => format!(", pool ({}, {})", p.0, p.1),
                    _ => String::new(),
                }
            )?;
        }
    }
    Ok(())
}
