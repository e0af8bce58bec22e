//! Text rendering of an [`OomReport`]: the figures, then the verdicts in plain words.

use crate::analysis::device::DeviceReason;
use crate::analysis::kinds::attribution::GroupKind;
use crate::analysis::oom::{Cause, Knob, OomAnalysis, OomReport, Role, Source, Verdict};
use crate::render::Style;
use crate::render::words::labels::{group_display, group_name_display};
use crate::units::shown;
use crate::units::{bytes, percent};
use std::io::{self, Write};

fn opt(v: Option<u64>) -> String {
    v.map_or("unknown".into(), bytes)
}

/// What a setting or change is, in words.
pub fn knob_text(k: Knob) -> &'static str {
    match k {
        Knob::FixLeak => {
            "keep fewer references: the growing call sites hold tensors across steps (lists of outputs, losses kept with their graph: use .detach() or .item(); torch.no_grad() for evaluation)"
        }
        Knob::SmallerBatch => "reduce what is live at this point: smaller batch or sequence length",
        Knob::ActivationCheckpointing => {
            "activation checkpointing for the layers whose activations dominate the live set"
        }
        Knob::PrecisionShardingOffload => {
            "lower precision (bf16/fp16 weights, activations or optimizer state), sharding (FSDP/ZeRO) or CPU offload"
        }
        Knob::PrecisionOffload => {
            "lower precision (bf16/fp16 weights, activations or optimizer state) or CPU offload (sharding is on already: see below)"
        }
        Knob::CachedMemoryCannotHelp => {
            "empty_cache() or allocator settings cannot help: the memory is in use"
        }
        Knob::ExpandableSegments => {
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place instead of leaving holes)"
        }
        Knob::MaxSplitSize => {
            "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<size> (keeps large blocks from being split for small ones)"
        }
        Knob::GcThreshold => {
            "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8 (returns cached blocks before the device fills)"
        }
        Knob::EmptyCacheBetweenPhases => {
            "torch.cuda.empty_cache() between phases with different allocation sizes"
        }
        Knob::CheckOtherProcesses => {
            "check other processes on the GPU (nvidia-smi --query-compute-apps=pid,used_memory --format=csv)"
        }
        Knob::NcclBuffers => {
            "the CUDA context takes a few hundred MB per process; NCCL buffers grow with communicators (NCCL_BUFFSIZE, fewer process groups)"
        }
        Knob::LibraryWorkspaces => {
            "libraries allocating outside PyTorch (cuBLASLt/cuDNN workspaces of extensions, TensorRT, Triton autotuning) show up here; vramlens reconcile with nvidia-smi readings splits it"
        }
        Knob::ReleaseGraphPools => {
            "release CUDA graphs that are no longer replayed, or capture them into a shared pool"
        }
        Knob::AvoidRecordStream => {
            "avoid Tensor.record_stream on large tensors; synchronize the side stream before freeing"
        }
        Knob::CheckFractionCap => {
            "check torch.cuda.set_per_process_memory_fraction and PYTORCH_CUDA_ALLOC_CONF limits"
        }
    }
}

/// What a verdict's share of the deficit says, in words.
fn share_text(a: &OomAnalysis, v: &Verdict) -> String {
    let Some(s) = v.share_of_deficit else {
        return String::new();
    };
    let deficit = a.deficit_bytes.unwrap_or(0);
    let lacked = match a.source {
        Source::Message => format!(
            "{} the request needed beyond the device's free memory",
            opt(a.deficit_bytes)
        ),
        _ => format!("{} the request lacked", opt(a.deficit_bytes)),
    };
    // What the cause alone covers; a smaller share means causes above took the rest.
    let alone = v.bytes.min(deficit) as f64 / deficit.max(1) as f64;
    if s >= 1.0 {
        return match (v.role, v.cause) {
            (Role::Primary, _) => format!("; it is more than the {lacked}"),
            (_, Cause::OutsideAllocator) => format!(
                "; without it the request would have fit (it is more than the {lacked}), but this much is usual for a process"
            ),
            (_, Cause::Fragmentation) => {
                format!("; in one piece, they would have covered the {lacked}")
            }
            _ => format!("; without it the request would have fit (it is more than the {lacked})"),
        };
    }
    let pct = format!("{:.0}%", s * 100.0);
    if s + 1e-4 < alone {
        format!("; with the causes above, it covers the rest of the {lacked} ({pct})")
    } else {
        format!("; it is {pct} of the {lacked}")
    }
}

/// How much more the request was than its largest usable free space: for a message the
/// device's free memory only, since a message gives no hole sizes.
fn lacked_text(a: &OomAnalysis) -> String {
    if a.source == Source::Message {
        format!(
            "it was {} more than the device had free",
            opt(a.deficit_bytes)
        )
    } else {
        format!("it lacked {}", opt(a.deficit_bytes))
    }
}

/// One verdict in words, from the analysis figures.
pub fn verdict_text(a: &OomAnalysis, v: &Verdict) -> String {
    let request = opt(a.requested_bytes);
    let short = opt(a.shortfall_bytes);
    match v.cause {
        Cause::Capacity => {
            let (needed, could) = match (a.needed_bytes, a.available_bytes) {
                (Some(n), Some(h)) => crate::render::words::labels::distinct_sizes(n, h),
                (n, h) => (opt(n), opt(h)),
            };
            format!(
                "capacity: the live blocks ({}) plus the request ({request}) need {needed}, but PyTorch could have at most {could} (reserved {} + free on the device {}{}): short by {short}",
                bytes(a.allocated_bytes),
                bytes(a.reserved_bytes),
                opt(a.device_free_bytes),
                a.allowed_bytes
                    .map(|c| format!(", within the process limit of {}", bytes(c)))
                    .unwrap_or_default()
            )
        }
        Cause::Leak => {
            let sites: Vec<String> = v
                .sites
                .iter()
                .map(|s| group_display(s, GroupKind::Frame))
                .collect();
            format!(
                "a leak: {} kept growing across the steps and hold {} at this moment{}",
                sites.join(" and "),
                bytes(v.bytes),
                share_text(a, v)
            )
        }
        Cause::OutsideAllocator => format!(
            "memory outside the caching allocator or in other processes: {} ({} of the device: total {} − free {} − reserved by PyTorch {}){}",
            bytes(v.bytes),
            percent(v.bytes, a.device_total_bytes.unwrap_or(0)),
            opt(a.device_total_bytes),
            opt(a.device_free_bytes),
            bytes(a.reserved_bytes),
            share_text(a, v)
        ),
        Cause::PendingFrees => format!(
            "frees waiting for other streams hold {} (record_stream or cross-stream use){}",
            bytes(v.bytes),
            share_text(a, v)
        ),
        Cause::Rounding => format!(
            "rounding: the live blocks ({}) plus the request ({request}) fit in the {} PyTorch could have, and the device had {} free, room for the request itself, but the allocator asks the device for more at a time (up to {}: a whole segment, or whole pages with expandable segments)",
            bytes(a.allocated_bytes),
            opt(a.available_bytes),
            opt(a.device_free_bytes),
            opt(a.device_ask_bytes)
        ),
        Cause::Fragmentation if v.role == Role::Contributing && a.shortfall_bytes == Some(0) => {
            format!(
                "fragmentation: the memory was there ({} to spare in total{}), {} of it in holes inside segments of at most {}{}",
                opt(a
                    .limit_bytes
                    .zip(a.needed_bytes)
                    .map(|(h, n)| h.saturating_sub(n))),
                if a.limit_bytes != a.available_bytes {
                    " under the memory fraction"
                } else {
                    ""
                },
                bytes(a.cached_free_bytes),
                opt(a.largest_hole_bytes),
                match v.knobs.iter().any(|k| k.is_allocator_setting()) {
                    false if a.what_if.as_ref().is_some_and(|w| w.tested()) => {
                        "; no allocator setting tried lets the request through"
                    }
                    _ => "",
                }
            )
        }
        Cause::Fragmentation if v.role == Role::Contributing => match a.largest_hole_bytes {
            Some(hole) => format!(
                "fragmentation: {} sat free inside segments in holes of at most {}{}",
                bytes(a.cached_free_bytes),
                bytes(hole),
                share_text(a, v)
            ),
            None => format!(
                "fragmentation: {} sat free inside segments (reserved but unallocated), in pieces the message does not give the sizes of{}",
                bytes(a.cached_free_bytes),
                share_text(a, v)
            ),
        },
        Cause::Fragmentation if a.source == Source::Message => format!(
            "fragmentation: {} reserved but unallocated plus {} free on the device would cover the request ({request}), yet it failed: that memory was in pieces smaller than the request (the message does not give their sizes)",
            bytes(a.cached_free_bytes),
            opt(a.device_free_bytes)
        ),
        Cause::Fragmentation => format!(
            "fragmentation: the memory was there: the live blocks ({}) plus the request ({request}) fit in the {} PyTorch could have ({} to spare), but the device had {} free and {} sat in holes inside segments, the largest {} ({} on the request's stream): no free piece held the request ({})",
            bytes(a.allocated_bytes),
            opt(a.available_bytes),
            opt(a
                .available_bytes
                .zip(a.needed_bytes)
                .map(|(h, n)| h.saturating_sub(n))),
            opt(a.device_free_bytes),
            bytes(a.cached_free_bytes),
            opt(a.largest_hole_bytes),
            opt(a.largest_hole_same_stream_bytes),
            lacked_text(a)
        ),
        Cause::PrivatePools => format!(
            "private pools (CUDA graphs) hold {} free that other allocations cannot use",
            bytes(v.bytes)
        ),
        Cause::MemoryFractionCap => match a.allowed_bytes {
            Some(cap) => format!(
                "a per-process cap of {} refused the request ({request}) although the device had {} free",
                bytes(cap),
                opt(a.device_free_bytes)
            ),
            None => format!(
                "the device reported {} free, enough for the request ({request}): a per-process limit refused it (cudaMalloc is only refused with free memory when a limit applies)",
                opt(a.device_free_bytes)
            ),
        },
    }
}

/// One analysis (the figures at one OOM, then its verdicts with what to try).
pub fn write_analysis(out: &mut dyn Write, a: &OomAnalysis, style: Style) -> io::Result<()> {
    write_heading(out, a, style)?;
    write_request(out, a)?;
    write_verdicts(out, a, style)?;
    write_device(out, a)?;
    write_allocator(out, a)?;
    write_needed(out, a)?;
    write_top_sites(out, a)?;
    write_what_if(out, a)?;
    Ok(())
}

/// The settings replayed through the allocator model at the OOM's capacity.
fn write_what_if(out: &mut dyn Write, a: &OomAnalysis) -> io::Result<()> {
    use crate::analysis::what_if::oom_what_if::Tried;
    let Some(w) = &a.what_if else {
        return Ok(());
    };
    let model = if w.model_exact {
        format!(
            "the allocator model replays this recording exactly ({} of {} allocations at their address, {} of {} segment events)",
            crate::units::grouped(w.allocations_at_recorded_address),
            crate::units::grouped(w.allocations),
            crate::units::grouped(w.segment_events_reproduced),
            crate::units::grouped(w.segment_events)
        )
    } else {
        format!(
            "estimates: the allocator model does not replay this recording exactly ({} of {} allocations at their address)",
            crate::units::grouped(w.allocations_at_recorded_address),
            crate::units::grouped(w.allocations)
        )
    };
    let check = if w.reproduced {
        "it runs out of memory here, as recorded"
    } else {
        "it does not run out of memory at this request: the capacity or the model is off, read what follows with care"
    };
    let basis = match w.limit {
        crate::allocator::prepared::OomLimit::MemoryFraction => {
            "the most the allocator held under its memory fraction"
        }
        _ => "reserved + free then",
    };
    writeln!(
        out,
        "  what if             {model}; at the capacity the OOM implies ({}: {basis}) {check}",
        bytes(w.capacity_bytes)
    )?;
    let rows: Vec<(String, String)> = w
        .tries
        .iter()
        .map(|t| {
            let name = match t.setting {
                Tried::GcThreshold => {
                    "garbage_collection_threshold:0.8 with a memory fraction".to_string()
                }
                _ => t.alloc_conf.clone(),
            };
            let what = match (t.lets_through, t.spare_bytes, t.later_oom_event) {
                (false, _, _) => "does not help: the same request runs out of memory".to_string(),
                (true, _, Some(e)) => format!(
                    "lets this request through, but a later one runs out of memory (event {})",
                    crate::units::grouped(e as u64)
                ),
                (true, Some(0), None) => "lets it through, with nothing to spare".to_string(),
                (true, Some(sp), None) if sp > 0 => {
                    format!("lets it through, {} to spare", bytes(sp as u64))
                }
                (true, _, None) => "lets it through".to_string(),
            };
            (name, what)
        })
        .collect();
    let width = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
    for (name, what) in rows {
        let pad = width - name.chars().count();
        writeln!(out, "    {name}{}  {what}", " ".repeat(pad))?;
    }
    Ok(())
}

/// The heading (the device, and which OOM or state), and a line when no OOM event is
/// recorded.
fn write_heading(out: &mut dyn Write, a: &OomAnalysis, style: Style) -> io::Result<()> {
    let when = match (a.event, a.time_us) {
        (Some(e), Some(t)) => format!("event {e}, {}", a.clock.time(t)),
        (Some(e), None) => format!("event {e}"),
        (None, _) => "the start".into(),
    };
    let heading = match a.source {
        Source::OomEvent => format!("device {}: OOM at {when}", a.device),
        Source::FinalState if a.event.is_none() => {
            format!("device {}: final state (no trace recorded)", a.device)
        }
        Source::FinalState => format!("device {}: final state (after {when})", a.device),
        Source::Message => format!(
            "GPU {}: OOM message on log line {}",
            a.device,
            a.message_line.unwrap_or(0)
        ),
    };
    writeln!(out, "{}", style.heading(&heading))?;
    if !a.oom_recorded {
        writeln!(
            out,
            "  no OOM is recorded: the snapshot has no oom event and no OOM message was given (--log); below is its final state"
        )?;
    } else if a.source == Source::FinalState {
        writeln!(
            out,
            "  the snapshot has no oom event: its final state, with the request and the device's free memory from the message on log line {}",
            a.message_line.unwrap_or(0)
        )?;
    }
    Ok(())
}

/// The request, where it came from and its frames.
fn write_request(out: &mut dyn Write, a: &OomAnalysis) -> io::Result<()> {
    let stream = if a.stream == 0 {
        "default stream".to_string()
    } else {
        format!("stream 0x{:x}", a.stream)
    };
    match a.requested_bytes {
        // Only an oom entry gives the request's stream; a message does not.
        Some(r) if a.source == Source::OomEvent => {
            writeln!(out, "  request            {} on the {stream}", bytes(r))?
        }
        Some(r) => writeln!(out, "  request            {}", bytes(r))?,
        None if a.oom_recorded => writeln!(out, "  request            unknown")?,
        None => {}
    }
    if let Some(site) = &a.site {
        writeln!(
            out,
            "  from               {}",
            group_display(
                site,
                if site.starts_with('(') {
                    GroupKind::Cpp
                } else {
                    GroupKind::Frame
                }
            )
        )?;
    }
    for f in &a.frames {
        writeln!(out, "                     {}", shown(f))?;
    }
    Ok(())
}

/// The device's free and total memory, and what lay outside PyTorch.
fn write_device(out: &mut dyn Write, a: &OomAnalysis) -> io::Result<()> {
    if a.device_free_bytes.is_some() || a.device_total_bytes.is_some() {
        writeln!(
            out,
            "  device             free {}, total {}{}",
            opt(a.device_free_bytes),
            match a.device_total_bytes {
                Some(t) => bytes(t),
                None => "unknown (give --device-total SIZE, or --log with the OOM message)".into(),
            },
            match a.device_total_source {
                // The size as understood, in bytes: 40GB is 40 * 10^9, 40GiB 40 * 2^30.
                Some("option") => format!(
                    " (from --device-total: {} bytes)",
                    a.device_total_bytes.unwrap_or(0)
                ),
                Some(_) => " (from the OOM message)".to_string(),
                None => String::new(),
            }
        )?;
    }
    if let Some(o) = a.outside_allocator_bytes {
        match (
            a.process_outside_allocator_bytes,
            a.other_processes_bytes,
            a.this_process_bytes,
        ) {
            (Some(inside), Some(others), Some(process)) => {
                writeln!(
                    out,
                    "  outside PyTorch    {} (total − free − reserved)",
                    bytes(o)
                )?;
                writeln!(
                    out,
                    "                     {} in this process outside the allocator (CUDA context, libraries), {} in other processes and the driver (the message: this process had {} in use)",
                    bytes(inside),
                    bytes(others),
                    bytes(process)
                )?;
            }
            _ => writeln!(
                out,
                "  outside PyTorch    {} (total − free − reserved: CUDA context, libraries, other processes)",
                bytes(o)
            )?,
        }
    }
    Ok(())
}

/// What the allocator held: reserved, live blocks (or, from a message, allocated) and
/// the free memory in segments with the largest hole.
fn write_allocator(out: &mut dyn Write, a: &OomAnalysis) -> io::Result<()> {
    writeln!(out, "  reserved           {}", bytes(a.reserved_bytes))?;
    if a.source != Source::Message {
        writeln!(
            out,
            "  live               {} in blocks ({} requested, {} rounding), {} pending free",
            bytes(a.allocated_bytes),
            opt(a.requested_live_bytes),
            opt(a.rounding_waste_bytes),
            opt(a.pending_free_bytes)
        )?;
        // The request's stream is known only with a request from an oom entry.
        let same_stream = match a.source {
            Source::OomEvent => format!(
                " ({} on the request's stream)",
                opt(a.largest_hole_same_stream_bytes)
            ),
            _ => String::new(),
        };
        writeln!(
            out,
            "  free in segments   {}; largest hole {}{same_stream}",
            bytes(a.cached_free_bytes),
            opt(a.largest_hole_bytes),
        )?;
    } else {
        writeln!(
            out,
            "  allocated          {} ({} reserved but unallocated)",
            bytes(a.allocated_bytes),
            bytes(a.cached_free_bytes)
        )?;
    }
    Ok(())
}

/// What was needed against what PyTorch could have had, then the free memory pool by
/// pool.
fn write_needed(out: &mut dyn Write, a: &OomAnalysis) -> io::Result<()> {
    if let (Some(n), Some(h)) = (a.needed_bytes, a.available_bytes) {
        let (needed, could) = crate::render::words::labels::distinct_sizes(n, h);
        writeln!(
            out,
            "  needed             {needed} (live blocks + request); PyTorch could have {could} (reserved + free{}){}",
            if a.allowed_bytes.is_some() {
                ", within the process limit"
            } else {
                ""
            },
            match (a.shortfall_bytes, a.deficit_bytes) {
                (Some(0), Some(d)) if d > 0 => format!(
                    ": enough in total ({} to spare), but no free space held the request ({})",
                    bytes(h - n),
                    lacked_text(a)
                ),
                (Some(0) | None, _) => ": the memory was there".to_string(),
                (Some(s), _) => format!(": short by {}", bytes(s)),
            }
        )?;
    }
    for p in &a.free_by_pool {
        let pool = match p.pool_id {
            None => "pool unknown".to_string(),
            Some((0, 0)) => "default pool".to_string(),
            Some((x, y)) => format!("private pool ({x}, {y})"),
        };
        let stream = if p.stream == 0 {
            "default stream".to_string()
        } else {
            format!("stream 0x{:x}", p.stream)
        };
        writeln!(
            out,
            "    {pool}, {stream}: {}, {} reserved, {} free, largest hole {}",
            crate::units::count(p.segments, "segment", "segments"),
            bytes(p.reserved_bytes),
            bytes(p.free_bytes),
            bytes(p.largest_hole_bytes)
        )?;
    }
    Ok(())
}

/// The live memory by call site.
fn write_top_sites(out: &mut dyn Write, a: &OomAnalysis) -> io::Result<()> {
    if !a.top_sites.is_empty() {
        writeln!(out, "  live by call site")?;
        for s in &a.top_sites {
            writeln!(
                out,
                "    {:>10}  {:>5}x  {}  [{}{}]",
                bytes(s.bytes),
                s.allocations,
                group_name_display(&s.name, s.kind),
                if s.category_inferred { "~" } else { "" },
                s.category
            )?;
        }
    }
    Ok(())
}

/// The replayed try of an allocator setting that let the request through, if any.
fn proven_try(
    a: &OomAnalysis,
    k: Knob,
) -> Option<&crate::analysis::what_if::oom_what_if::SettingTry> {
    a.what_if
        .as_ref()?
        .proven()
        .into_iter()
        .find(|t| Knob::of_tried(t.setting) == k)
}

/// A setting the allocator model's replay let the request through with, and its margin.
/// A setting the replay proved, with its margin: `PYTORCH_CUDA_ALLOC_CONF=... lets it
/// through with 538.1 MiB to spare (1.4% of 38.3 GiB: a thin margin)`. The one wording of
/// a proven setting, in `oom`, `simulate`, `budget` and the report.
fn margin_text(t: &crate::analysis::what_if::oom_what_if::SettingTry, capacity: u64) -> String {
    let spare = t.spare_bytes.unwrap_or(0).max(0) as u64;
    format!(
        "PYTORCH_CUDA_ALLOC_CONF={} lets it through with {} to spare ({} of {}{})",
        t.alloc_conf,
        bytes(spare),
        percent(spare, capacity),
        bytes(capacity),
        if t.thin_margin { ": a thin margin" } else { "" }
    )
}

fn proven_text(
    a: &OomAnalysis,
    t: &crate::analysis::what_if::oom_what_if::SettingTry,
    live_follows: bool,
) -> String {
    let capacity = a.what_if.as_ref().map_or(0, |w| w.capacity_bytes);
    format!(
        "{}, in a replay of the same requests through the allocator model{}",
        margin_text(t, capacity),
        if t.thin_margin && live_follows {
            "; with so thin a margin, also reduce what is live (below)"
        } else {
            ""
        }
    )
}

/// What to try for a verdict, one line each ("try: ..." or "note: ..."): a setting the
/// replay proved with its margin, the others as they apply. The `oom` text and the
/// report's first screen both print these.
pub fn fix_lines(a: &OomAnalysis, v: &Verdict) -> Vec<String> {
    let live_follows = v.knobs.contains(&Knob::SmallerBatch);
    v.knobs
        .iter()
        .map(|&k| match (k, proven_try(a, k)) {
            (Knob::CachedMemoryCannotHelp, _) => format!("note: {}", knob_text(k)),
            (_, Some(t)) => format!("try: {}", proven_text(a, t, live_follows)),
            _ => format!("try: {}", knob_text(k)),
        })
        .collect()
}

/// Which settings the replay shows letting a recorded OOM's request through, in one
/// sentence (`simulate` and `budget` say it as `oom` does); None when the model does not
/// reproduce the OOM.
pub fn what_if_fix_text(w: &crate::analysis::what_if::oom_what_if::OomWhatIf) -> Option<String> {
    if !w.tested() {
        return None;
    }
    let proven = w.proven();
    if proven.is_empty() {
        let tried: Vec<&str> = w.tries.iter().map(|t| t.alloc_conf.as_str()).collect();
        return Some(format!(
            "no allocator setting tried lets the request through ({}): reduce what is live",
            tried.join("; ")
        ));
    }
    let each: Vec<String> = proven
        .iter()
        .map(|t| margin_text(t, w.capacity_bytes))
        .collect();
    Some(format!("the fix the replay proves: {}", each.join("; ")))
}

/// The verdicts, each with what to try; or why there is none.
fn write_verdicts(out: &mut dyn Write, a: &OomAnalysis, style: Style) -> io::Result<()> {
    if a.verdicts.is_empty() {
        let why = match (a.requested_bytes, a.device_free_bytes) {
            (None, _) if !a.oom_recorded => {
                "none: without an OOM there is nothing to explain (give --log with the OOM message if one happened)"
            }
            (None, _) => "none: the request is unknown (give --log with the OOM message)",
            (_, None) => {
                "none: the device's free memory is unknown (give --log with the OOM message)"
            }
            _ => "none of the known causes stands out",
        };
        writeln!(out, "  verdict            {why}")?;
    }
    for v in &a.verdicts {
        let role = match v.role {
            Role::Primary => "verdict",
            Role::Contributing => "contributing",
        };
        writeln!(
            out,
            "  {}",
            style.warn(&format!("{role}: {}", verdict_text(a, v)))
        )?;
        for line in fix_lines(a, v) {
            writeln!(out, "    {line}")?;
        }
        if a.source == Source::Message && v.knobs.iter().any(|k| k.is_allocator_setting()) {
            writeln!(
                out,
                "    (the allocator's settings are unknown from a message alone: skip those already in PYTORCH_CUDA_ALLOC_CONF, or give the snapshot to have them checked)"
            )?;
        }
    }
    Ok(())
}

/// The devices analysed, why, and the file's others, when it has several:
/// "device 1 (the device with the OOM, peak 78.3 GiB; the file also has device 0, peak
/// 7.9 GiB, device 2, peak 20.1 GiB: --device N for another)".
fn devices_text(r: &OomReport) -> Option<String> {
    if r.devices.len() < 2 {
        return None;
    }
    let mut analysed: Vec<i64> = r.analyses.iter().map(|a| a.device).collect();
    analysed.dedup();
    let list = |ds: &[i64]| {
        ds.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let peak_of = |d: i64| {
        r.device_peaks
            .iter()
            .find(|(x, _)| *x == d)
            .map(|&(_, b)| bytes(b))
    };
    let peak = |d: i64| {
        peak_of(d)
            .map(|b| format!(", peak {b}"))
            .unwrap_or_default()
    };
    let many = analysed.len() > 1;
    let why = match r.device_reason {
        Some(DeviceReason::Oom) if r.analyses.iter().all(|a| a.source == Source::FinalState) => {
            Some("the GPU the OOM message names")
        }
        Some(DeviceReason::Oom) if many => Some("the devices with an OOM"),
        Some(DeviceReason::Oom) => Some("the device with the OOM"),
        Some(DeviceReason::LargestPeak) => Some("the device with the largest peak"),
        _ => None,
    }
    .map(|w| match analysed.as_slice() {
        // "the device with the largest peak: 8.1 MiB", not "..., peak 8.1 MiB".
        [one] if r.device_reason == Some(DeviceReason::LargestPeak) => match peak_of(*one) {
            Some(b) => format!("{w}: {b}"),
            None => w.to_string(),
        },
        [one] => format!("{w}{}", peak(*one)),
        _ => w.to_string(),
    });
    let others: Vec<i64> = r
        .devices
        .iter()
        .copied()
        .filter(|d| !analysed.contains(d))
        .collect();
    let others = (!others.is_empty()).then(|| {
        format!(
            "the file also has {}: --device N for another",
            others
                .iter()
                .map(|&d| format!("device {d}{}", peak(d)))
                .collect::<Vec<_>>()
                .join(", ")
        )
    });
    let notes: Vec<String> = why.into_iter().chain(others).collect();
    let head = format!(
        "{} {}",
        if many { "devices" } else { "device" },
        list(&analysed)
    );
    Some(match notes.is_empty() {
        true => head,
        false => format!("{head} ({})", notes.join("; ")),
    })
}

pub fn write_oom_text(out: &mut dyn Write, r: &OomReport, style: Style) -> io::Result<()> {
    if let Some(p) = &r.path {
        match devices_text(r) {
            Some(d) => writeln!(out, "{}", style.heading(&format!("{}: {d}", shown(p))))?,
            None => writeln!(out, "{}", style.heading(&shown(p)))?,
        }
    }
    for a in &r.analyses {
        write_analysis(out, a, style)?;
    }
    if let Some(file) = &r.sharding_file {
        writeln!(
            out,
            "  sharding is on already (the stacks have frames of {}): not proposed",
            crate::render::words::labels::short_path(file)
        )?;
    }
    for (device, n) in &r.more_oom_events {
        let what = if r.path.is_none() {
            "OOM messages"
        } else {
            "oom events"
        };
        writeln!(
            out,
            "  device {device}: {n} more {what}, not analysed one by one (the first {} are)",
            crate::analysis::oom::MAX_ANALYSES
        )?;
    }
    for m in r.messages.iter().filter(|m| m.count > 1) {
        writeln!(
            out,
            "  log line {}: the same message {} times in all, the last on line {}",
            m.line, m.count, m.last_line
        )?;
    }
    if r.path.is_some() {
        for m in &r.messages {
            writeln!(
                out,
                "  OOM message on log line {}: request {} on GPU {}, total {}, free {}",
                m.line,
                opt(m.requested_bytes),
                m.gpu.map_or("?".into(), |g| g.to_string()),
                opt(m.total_capacity_bytes),
                opt(m.free_bytes),
            )?;
        }
    } else {
        for m in &r.messages {
            if let (Some(p), Some(r)) = (m.this_process_bytes, m.reserved_by_pytorch_bytes) {
                writeln!(
                    out,
                    "  log line {}: this process used {} of which {} outside PyTorch's allocator",
                    m.line,
                    bytes(p),
                    bytes(p.saturating_sub(r))
                )?;
            }
            for (pid, b) in &m.processes {
                writeln!(
                    out,
                    "  log line {}: process {}: {}",
                    m.line,
                    pid.map_or("?".into(), |p| p.to_string()),
                    bytes(*b)
                )?;
            }
        }
    }
    Ok(())
}
