//! Everything a shared report shows about one snapshot, gathered from the other analyses:
//! the summary, the timeline grouped by call site and by category, the moments a reader
//! picks between (the peak, each OOM, the end) with what was live there (groups, the
//! flame tree, the allocator's segments), the OOM verdicts and, with device readings,
//! the reconciliation. Plain data; `render::html` writes it.
//!
//! Each moment is one state of the replay: moments that fall on the same event (an OOM
//! that is also the last event) are one, under every name it has.

use crate::allocator::checked::CheckedRun;
use crate::analysis::device::reconcile::{
    ReconcileError, ReconcileOptions, Reconciliation, analyze_reconcile,
};
use crate::analysis::device::{DeviceChoice, DeviceError, choose_device};
use crate::analysis::kinds::attribution::{AttributionOptions, Attributor, GroupBy};
use crate::analysis::kinds::flame::{FlameNode, FlameOptions, flame};
use crate::analysis::kinds::frames::user_frames;
use crate::analysis::moments::chart::{
    BandBy, TimelineView, ViewError, ViewOptions, XAxis, chart_axis, prepare_view,
};
use crate::analysis::moments::moment::{Moment, MomentKind, ResolvedMoment, resolve};
use crate::analysis::moments::segment_map::{SegmentMap, segment_map};
use crate::analysis::oom::{
    Collected, MomentPass, OomOptions, OomPrepared, OomReport, analyze_oom, oom_moments,
};
use crate::analysis::reports::summary::{
    DeviceSummary, Summary, SummaryOptions, SummaryPass, analyze_summary, summary_with,
};
use crate::analysis::reports::top::{
    Group, LiveState, LiveStatePass, Versions, add_times, count_versions, group_live, limit_groups,
};
use crate::devlog::DeviceLog;
use crate::devlog::convert::Converted;
use crate::devlog::oom_log::OomMessage;
use crate::input::SourceInfo;
use crate::model::Snapshot;
use crate::timeline::replay::{DeviceReplay, LifetimesAtPeak};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Groups listed per moment; the rest are merged into one row.
pub const MAX_GROUPS: usize = 200;
/// OOM events offered as moments; the rest are counted.
pub const MAX_OOM_MOMENTS: usize = 8;
/// Bands per timeline.
pub const TIMELINE_BANDS: usize = 20;

/// Device readings (and a profiler trace) of the run, for the timeline and the ledger.
#[derive(Clone, Copy)]
pub struct Readings<'a> {
    pub log: &'a DeviceLog,
    pub utc_offset_minutes: i32,
    /// The trace's path and what it converted to.
    pub profile: Option<(&'a str, &'a Converted)>,
    pub allow_no_overlap: bool,
}

/// What the report is asked to cover.
#[derive(Clone, Copy)]
pub struct ReportOptions<'a> {
    /// The device (default: the one with an OOM, else the largest peak).
    pub device: Option<i64>,
    pub attribution: &'a AttributionOptions,
    /// OOM messages of a log (`--log`).
    pub messages: &'a [OomMessage],
    pub oom: OomOptions,
    pub readings: Option<Readings<'a>>,
}

/// Why a file cannot be reported (worded by the command: the reconciliation's words
/// need the logs' names).
#[derive(Debug, Clone, PartialEq)]
pub enum ReportError {
    Device(DeviceError),
    Reconcile(ReconcileError),
}

/// One state a reader can pick, and what was live there.
#[derive(Debug, Clone)]
pub struct MomentReport {
    pub moment: ResolvedMoment,
    /// The other names of the same state (an OOM that is the end), after the first.
    pub also: Vec<MomentKind>,
    /// Requested bytes alive: the groups sum to this.
    pub total_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: i64,
    pub count: usize,
    /// By call site, largest first, at most [`MAX_GROUPS`] and a merged rest.
    pub groups: Vec<Group>,
    /// The live bytes as a tree of stacks.
    pub flame: FlameNode,
    pub segments: SegmentMap,
    /// At the peak: the budget of the run ([`crate::analysis::budget`]).
    pub budget: Option<crate::analysis::budget::RunBudget>,
}

/// Python frames listed for a band's whole stack at most.
pub const MAX_STACK_FRAMES: usize = 200;

/// The timeline of the device, as two views.
#[derive(Debug, Clone)]
pub struct Timelines {
    pub by_callsite: TimelineView,
    pub by_category: TimelineView,
    /// Each band's name (of either view) with the whole stack of its largest allocation:
    /// its Python frames, innermost first (the bands' tooltips hold the first few).
    pub stacks: BTreeMap<String, Vec<String>>,
}

/// Everything the report shows about one file.
#[derive(Debug, Clone)]
pub struct FileReport {
    pub path: String,
    pub summary: Summary,
    /// The device shown first (the one every command picks, or `--device`); None when the
    /// file has no device (no segment, no trace entry).
    pub device: Option<DeviceReport>,
    /// The file's other devices, ascending, at most [`MAX_DEVICES`] with the first (none
    /// when `--device` chose one).
    pub other_devices: Vec<DeviceReport>,
    /// Devices past [`MAX_DEVICES`], named without their sections.
    pub devices_left_out: Vec<i64>,
}

/// Devices of one file a report covers, each with its own sections.
pub const MAX_DEVICES: usize = 8;

/// Everything the report shows about the device of a file.
#[derive(Debug, Clone)]
pub struct DeviceReport {
    pub choice: DeviceChoice,
    /// Events in the device's trace.
    pub events: usize,
    /// The timeline, or why there is none.
    pub timelines: Result<Timelines, ViewError>,
    /// Peak first, then the OOMs, then the end; at least one (the end).
    pub moments: Vec<MomentReport>,
    /// OOM events past the ones offered as moments.
    pub more_ooms: usize,
    pub oom: OomReport,
    pub reconcile: Option<Reconciliation>,
    /// The device's memory at each analysed OOM from every source (the message, the
    /// nearest reading), in the order of `oom.analyses`.
    pub oom_ledgers: Vec<crate::analysis::device::device_memory::OomLedger>,
    /// What if: the recorded requests replayed with the recorded settings and with the
    /// other kind of segments, at the recorded OOM's capacity (else none), and the
    /// smallest device for each (null: no trace to replay).
    pub simulate: Option<crate::analysis::what_if::simulate::SimulateReport>,
}

impl FileReport {
    /// The summary of the device shown.
    pub fn device_summary(&self) -> Option<&crate::analysis::reports::summary::DeviceSummary> {
        let d = self.device.as_ref()?;
        self.summary
            .devices
            .iter()
            .find(|s| s.device == d.choice.device)
    }
}

/// What was live at one state (at the peak, with the run's budget).
#[allow(clippy::too_many_arguments)]
fn moment_report(
    snap: &Snapshot,
    path: &str,
    r: &DeviceReplay,
    attr: &Attributor,
    moment: ResolvedMoment,
    also: Vec<MomentKind>,
    live: LiveState,
    choice: &DeviceChoice,
    peak_reserved: Option<u64>,
    budget_outside: Option<crate::analysis::budget::Outside>,
    fits: Option<&crate::analysis::budget::RunReplays>,
) -> MomentReport {
    let budget = budget_outside.map(|outside| {
        let mut b = crate::analysis::budget::budget_of(
            snap,
            path,
            choice.into(),
            r,
            attr,
            &live,
            moment,
            (
                peak_reserved,
                crate::analysis::budget::reserved_at_first_oom(r),
            ),
            outside,
        );
        // Its fits replay the run at each GPU's capacity, and its headroom reads the
        // order of equal free blocks, as `budget`'s do.
        if let Some(f) = fits {
            b.replays = f.gpus.clone();
            b.tie_break = f.tie_break;
        }
        b
    });
    let mut groups = limit_groups(
        group_live(attr, &live, GroupBy::Callsite),
        MAX_GROUPS,
        live.requested_bytes,
    );
    add_times(&mut groups, r.trace);
    let (tree, _) = flame(attr, &live, &FlameOptions::default());
    MomentReport {
        moment,
        also,
        total_bytes: live.requested_bytes,
        allocated_bytes: live.allocated_bytes,
        reserved_bytes: live.reserved_bytes,
        count: live.lifetimes.len(),
        groups,
        flame: tree,
        segments: segment_map(snap, path, r, attr, GroupBy::Callsite, moment, &live),
        budget,
    }
}

/// The moments known before the replay: the first OOMs and the end (the replay finds the
/// peak).
/// Which of the moments carries the run's budget: the first OOM, where
/// [`crate::analysis::budget::budgets_at_oom`] says so, else the peak.
fn budget_moment(
    r: &DeviceReplay,
    ooms: &[usize],
    wanted: &[(ResolvedMoment, Vec<MomentKind>)],
    lives: &[LiveState],
) -> Option<usize> {
    let peak = wanted.iter().position(|(m, _)| m.kind == MomentKind::Peak);
    let first_oom = ooms.first().and_then(|&i| {
        let k = wanted.iter().position(|(m, _)| m.event == Some(i as u32))?;
        Some((k, i))
    });
    match (first_oom, peak) {
        (Some((k, i)), Some(p))
            if crate::analysis::budget::budgets_at_oom(
                lives[k].reserved_bytes.max(0) as u64,
                r.trace.size(i),
                lives[p].requested_bytes,
            ) =>
        {
            Some(k)
        }
        _ => peak,
    }
}

fn moments_before(r: &DeviceReplay, ooms: &[usize]) -> Vec<ResolvedMoment> {
    let mut list: Vec<ResolvedMoment> = Vec::new();
    for &i in ooms.iter().take(MAX_OOM_MOMENTS) {
        if let Ok(m) = resolve(r, Moment::Event(i), || None) {
            list.push(ResolvedMoment {
                kind: MomentKind::Oom,
                ..m
            });
        }
    }
    if let Ok(m) = resolve(r, Moment::End, || None) {
        list.push(m);
    }
    list
}

/// The moments to offer, with what was live at each: the peak, the first OOMs, the end;
/// one per state, under the first of its names.
fn one_per_state(
    moments: impl IntoIterator<Item = (ResolvedMoment, LiveState)>,
) -> Vec<(ResolvedMoment, Vec<MomentKind>, LiveState)> {
    let mut out: Vec<(ResolvedMoment, Vec<MomentKind>, LiveState)> = Vec::new();
    for (m, live) in moments {
        match out.iter_mut().find(|(o, _, _)| o.event == m.event) {
            Some((_, also, _)) => also.push(m.kind),
            None => out.push((m, Vec::new(), live)),
        }
    }
    out
}

/// Gathers the report of one snapshot.
pub fn analyze_report_file(
    snap: &Snapshot,
    source: &SourceInfo,
    options: ReportOptions,
) -> Result<FileReport, ReportError> {
    let path = source.path.as_str();
    let choice = match choose_device(snap, options.device) {
        Ok(c) => c,
        // A file without a device still has its summary (and its warnings) to show.
        Err(DeviceError::NoDevice) if options.device.is_none() => {
            return Ok(FileReport {
                path: path.to_string(),
                summary: analyze_summary(snap, source, SummaryOptions::default()),
                device: None,
                other_devices: Vec::new(),
                devices_left_out: Vec::new(),
            });
        }
        Err(e) => return Err(ReportError::Device(e)),
    };
    // Without --device, every device of the file (the chosen one first), each a device
    // asked for; the device readings and the ledger go with the first.
    let others: Vec<i64> = match options.device {
        Some(_) => Vec::new(),
        None => choice.others.clone(),
    };
    let (shown, left_out) = others.split_at(others.len().min(MAX_DEVICES - 1));
    let (first, rest) = rayon::join(
        || device_report(snap, path, choice.clone(), options),
        || {
            shown
                .par_iter()
                .map(|&d| {
                    let asked = DeviceChoice {
                        device: d,
                        reason: crate::analysis::device::DeviceReason::Asked,
                        ..choice.clone()
                    };
                    device_report(
                        snap,
                        path,
                        asked,
                        ReportOptions {
                            readings: None,
                            ..options
                        },
                    )
                })
                .collect::<Result<Vec<_>, _>>()
        },
    );
    let (first, first_summary) = first?;
    let (rest, mut summaries): (Vec<DeviceReport>, Vec<DeviceSummary>) = rest?.into_iter().unzip();
    summaries.push(first_summary);
    // The summary covers every device; those the report replayed are summarised from
    // that replay.
    let summary = summary_with(snap, source, &snap.devices(), summaries);
    Ok(FileReport {
        path: path.to_string(),
        device: Some(first),
        other_devices: rest,
        devices_left_out: left_out.to_vec(),
        summary,
    })
}

/// What the one replay of a device gives the report.
struct Replayed {
    by_callsite: Result<TimelineView, ViewError>,
    by_category: Result<TimelineView, ViewError>,
    /// What was live at each moment of `ats`, in its order.
    lives: Vec<LiveState>,
    /// What was live at the peak of requested bytes (none without a timeline).
    peak: Option<LiveState>,
    /// What the OOM analysis needs at its moments ([`oom_moments`]).
    collected: Vec<Collected>,
    summary: DeviceSummary,
    /// The leak search of `top --leaks` (by call site, over the whole trace), for the
    /// budget.
    leak_suspects: Vec<crate::analysis::moments::leaks::LeakSuspect>,
    /// The peaks of each phase and of each whole step, for the budget.
    phase_peaks: Vec<crate::analysis::budget::PhasePeak>,
    step_peaks: Vec<u64>,
}

/// One replay of the device for both timeline views, what was live at the peak and at
/// every moment of `ats`, the OOM analysis's live sets and leak samples, and the device's
/// summary. The live sets' versions are not counted yet.
fn replay_once(
    snap: &Snapshot,
    r: &DeviceReplay,
    attr: &Attributor,
    phases: &crate::analysis::kinds::phases::Phases,
    ats: &[Option<usize>],
) -> Replayed {
    let axis = chart_axis(r, XAxis::Events);
    let view = |by: GroupBy| {
        let axis = axis.as_ref().map_err(Clone::clone)?;
        let options = ViewOptions::new(XAxis::Events, BandBy::Group(by), TIMELINE_BANDS);
        prepare_view(r, attr, axis, options)
    };
    let (mut callsite, mut category) = (view(GroupBy::Callsite), view(GroupBy::Category));
    let mut lives = LiveStatePass::at_each(ats);
    let mut oom_passes: Vec<MomentPass> = oom_moments(r)
        .into_iter()
        .map(|at| MomentPass::new(r, attr, at))
        .collect();
    let mut peak = r.has_timeline().then(LifetimesAtPeak::default);
    let mut summary = SummaryPass::new(r);
    let mut leaks =
        crate::analysis::moments::leaks::LeakSampler::new(r, attr, GroupBy::Callsite, None);
    let mut by_phase = crate::analysis::budget::PhasePeaks::new(phases);
    let start = r.run((
        callsite.as_mut().ok(),
        category.as_mut().ok(),
        (&mut lives, &mut peak),
        &mut oom_passes,
        (&mut summary, &mut leaks, &mut by_phase),
    ));
    let (phase_peaks, step_peaks) = by_phase.finish(start.requested);
    Replayed {
        phase_peaks,
        step_peaks,
        leak_suspects: leaks.finish(snap, r, start).suspects,
        peak: peak.map(|p| LiveState::at_peak(r, start, p, Versions::NotNeeded)),
        summary: summary.finish(snap, r),
        collected: oom_passes
            .into_iter()
            .map(|p| p.finish(snap, r, start))
            .collect(),
        by_callsite: callsite.map(|p| p.finish(snap, r, attr, start)),
        by_category: category.map(|p| p.finish(snap, r, attr, start)),
        lives: lives.finish_each(r, start, Versions::NotNeeded),
    }
}

/// The sections of one device of a file.
fn device_report(
    snap: &Snapshot,
    path: &str,
    choice: DeviceChoice,
    options: ReportOptions,
) -> Result<(DeviceReport, DeviceSummary), ReportError> {
    let device = choice.device;
    let r = DeviceReplay::new(snap, device);
    let ooms: Vec<usize> = r.trace.oom_events().collect();
    let before = moments_before(&r, &ooms);
    let more_ooms = ooms.len().saturating_sub(MAX_OOM_MOMENTS);
    let ats: Vec<Option<usize>> = before.iter().map(|m| m.event.map(|e| e as usize)).collect();
    // Memory outside the allocator by `budget`'s rule, from the same readings and log.
    let outside = crate::analysis::budget::Outside::of_run(
        snap,
        path,
        device,
        options.readings.map(|x| x.log),
        options.readings.map_or(0, |x| x.utc_offset_minutes),
        Some(options.messages),
    )
    .unwrap_or_else(|_| crate::analysis::budget::Outside::not_measured());
    // The allocator model's replays (the what-if, then the budget's fits from its check)
    // and the reading of the device's timeline are independent and run at once. An
    // attributor caches per frame and is not shared between threads: one per task, each
    // bound to the device's categories, found once.
    let ((categories, view_attr, replayed), (simulate, checked, fits)) = rayon::join(
        || {
            let plain = Attributor::new(&snap.frames, options.attribution);
            let categories =
                crate::analysis::kinds::categories::DeviceCategories::build(&r, &plain);
            let mut view_attr = Attributor::new(&snap.frames, options.attribution);
            view_attr.bind(categories.clone());
            let replayed = replay_once(snap, &r, &view_attr, &categories.phases, &ats);
            (categories, view_attr, replayed)
        },
        || {
            let (simulate, checked) = what_if(snap, path, &choice);
            let gpus = crate::analysis::budget::gpus::default_gpus();
            let fits = checked
                .as_ref()
                .map(|run| crate::analysis::budget::replay_on(run, &gpus, outside.counted_bytes));
            (simulate, checked, fits)
        },
    );
    let attr = || {
        let mut a = Attributor::new(&snap.frames, options.attribution);
        a.bind(categories.clone());
        a
    };
    let Replayed {
        by_callsite,
        by_category,
        lives,
        peak,
        collected,
        summary: d,
        leak_suspects,
        phase_peaks,
        step_peaks,
    } = replayed;
    let peak = peak.and_then(|live| {
        let m = resolve(&r, Moment::Peak, || live.at).ok()?;
        Some((m, live))
    });
    let wanted = one_per_state(peak.into_iter().chain(before.into_iter().zip(lives)));
    let (wanted, mut lives): (Vec<_>, Vec<LiveState>) = wanted
        .into_iter()
        .map(|(m, also, live)| ((m, also), live))
        .unzip();
    count_versions(&r, &mut lives);
    let peak_reserved = d.peak_reserved_bytes;
    let budget_at = budget_moment(&r, &ooms, &wanted, &lives);
    // The what-if's check serves the OOMs' what-ifs too.
    let mut moments: Vec<MomentReport> = wanted
        .into_par_iter()
        .zip(lives)
        .enumerate()
        .map(|(k, ((m, also), live))| {
            moment_report(
                snap,
                path,
                &r,
                &attr(),
                m,
                also,
                live,
                &choice,
                peak_reserved,
                (budget_at == Some(k)).then_some(outside),
                fits.as_ref(),
            )
        })
        .collect();
    if let Some(b) = moments.iter_mut().find_map(|m| m.budget.as_mut()) {
        b.leak_suspects = leak_suspects;
        b.phase_peaks = phase_peaks;
        b.step_peaks = step_peaks;
    }
    let mut timelines = by_callsite.and_then(|c| {
        by_category.map(|k| {
            let stacks = c
                .bands
                .iter()
                .chain(&k.bands)
                .map(|b| {
                    let frames = user_frames(&snap.frames, b.stack, MAX_STACK_FRAMES);
                    (b.name.clone(), frames)
                })
                .collect();
            Timelines {
                by_callsite: c,
                by_category: k,
                stacks,
            }
        })
    });
    let oom = analyze_oom(
        snap,
        path,
        Some(device),
        options.messages.to_vec(),
        options.oom,
        options.attribution,
        Some(OomPrepared {
            device,
            attr: &view_attr,
            collected,
            checked: checked.as_ref(),
        }),
    );
    let reconcile = match options.readings {
        Some(readings) => {
            if let Ok(t) = &mut timelines {
                let samples = crate::analysis::device::reconcile::gpu_samples(readings.log, device);
                let rows = crate::analysis::device::reconcile::readings_over_time(
                    snap,
                    device,
                    readings.log,
                    &samples,
                );
                crate::analysis::moments::chart::add_device_readings(&mut t.by_callsite, &rows);
                crate::analysis::moments::chart::add_device_readings(&mut t.by_category, &rows);
            }
            Some(
                analyze_reconcile(
                    snap,
                    path,
                    readings.log,
                    readings.utc_offset_minutes,
                    readings.profile,
                    ReconcileOptions {
                        device: Some(device),
                        gpu: None,
                        allow_no_overlap: readings.allow_no_overlap,
                    },
                )
                .map_err(ReportError::Reconcile)?,
            )
        }
        None => None,
    };
    let readings = reconcile.as_ref().and_then(|rec| {
        let d = rec.devices.iter().find(|x| x.device == device)?;
        Some((rec.device_log_source, d))
    });
    let oom_ledgers = oom
        .analyses
        .iter()
        .filter(|a| a.oom_recorded)
        .filter_map(|a| {
            crate::analysis::device::device_memory::oom_ledger(a, &oom.messages, readings)
        })
        .collect();
    Ok((
        DeviceReport {
            choice,
            events: r.len(),
            timelines,
            moments,
            more_ooms,
            oom,
            reconcile,
            oom_ledgers,
            simulate,
        },
        d,
    ))
}

/// The report's what-if: the recording's settings and the other kind of segments; with
/// the recording prepared and checked.
fn what_if(
    snap: &Snapshot,
    path: &str,
    choice: &DeviceChoice,
) -> (
    Option<crate::analysis::what_if::simulate::SimulateReport>,
    Option<CheckedRun>,
) {
    use crate::analysis::what_if::simulate::{SimulateOptions, analyze_simulate_checked};
    let profile = crate::allocator::Profile::guess(snap);
    let recorded = crate::allocator::Settings::of_snapshot(snap, profile).unwrap_or_default();
    let other = crate::allocator::Settings {
        expandable_segments: !recorded.expandable_segments,
        ..recorded
    };
    let given = if other.expandable_segments {
        "expandable_segments:True"
    } else {
        "expandable_segments:False"
    };
    let options = SimulateOptions {
        alloc_confs: vec![(given.to_string(), other)],
        min_capacity: true,
        ..SimulateOptions::default()
    };
    let (r, checked) = analyze_simulate_checked(snap, path, choice, &options);
    ((!r.devices.is_empty()).then_some(r), checked)
}
