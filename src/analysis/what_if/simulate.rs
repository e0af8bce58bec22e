//! `simulate`: the recorded requests replayed through the allocator model under other
//! capacities and settings, after the check of how well the model reproduces the
//! recording.
//!
//! Takes a snapshot and [`SimulateOptions`] (devices to fit, memory outside the
//! allocator, settings to try); gives a [`SimulateReport`]: per device the identity
//! replay's counts and, for each scenario (each setting, the recording's own first, at
//! each capacity), the peak of reserved memory, what the allocator did, the first
//! out-of-memory error and the smallest device that runs the requests. Scenarios run in
//! parallel; the report is the same for any number of threads.

use crate::allocator::checked::{CheckedRun, check_beside};
use crate::allocator::identity::{Identity, check_sharing, reproduces, split_point};
use crate::allocator::prepared::{NotReplayable, Prepared};
use crate::allocator::scenario::{
    FirstOom, MinCapacity, OomCause, Outcome, Scenario, StartDoesNotFit, Unlimited,
    limit_changes_nothing, min_capacity, min_capacity_searched, run, searchable, unlimited,
};
use crate::allocator::{Profile, Settings};
use crate::analysis::budget::Outside;
use crate::analysis::budget::gpus::Gpu;
use crate::analysis::device::DeviceChoice;
use crate::analysis::kinds::frames::{display_frames, headline_frame};
use crate::model::Snapshot;
use serde::Serialize;

pub const SCHEMA_VERSION: u32 = 2;

/// What to simulate.
#[derive(Clone, Debug, Default)]
pub struct SimulateOptions {
    /// Devices to fit (each a capacity).
    pub gpus: Vec<Gpu>,
    /// Memory outside the allocator on those devices (None: assumed, as `budget` does).
    pub outside: Option<Outside>,
    /// Settings to try beside the recording's own: (the text as given, the settings).
    pub alloc_confs: Vec<(String, Settings)>,
    /// The PyTorch release to model (None: guessed from the file).
    pub profile: Option<Profile>,
    /// Search the smallest capacity of each setting (a bisection: a dozen replays).
    pub min_capacity: bool,
}

/// Where a scenario's capacity comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// A `--gpu`: the device's memory, less the memory outside the allocator.
    Gpu,
    /// The recorded OOM: what the allocator held then plus what the device said was free.
    RecordedOom,
    /// No limit: what the requests reach when nothing refuses them.
    Unlimited,
}

/// The first OOM of a scenario, with where it was asked for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OomAt {
    pub event: u32,
    pub time_us: Option<i64>,
    pub request_bytes: u64,
    pub rounded_bytes: u64,
    pub stream: u64,
    /// The frame that asked (innermost user frame), and the frames.
    pub callsite: Option<String>,
    pub frames: Vec<String>,
    /// Live memory (requested bytes, and block bytes) and reserved memory then.
    pub live_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub largest_free_bytes: u64,
    /// Free bytes cached in CUDA-graph private pools then (written only when some are).
    #[serde(skip_serializing_if = "crate::units::is_zero")]
    pub private_free_bytes: u64,
    pub cause: OomCause,
    /// The recording ran out of memory at this request too.
    pub recorded: bool,
    /// How the file's times read (for the text).
    #[serde(skip)]
    pub clock: crate::units::Clock,
}

/// One scenario's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScenarioReport {
    /// The settings as given with `--alloc-conf`, or the recording's own in
    /// `PYTORCH_CUDA_ALLOC_CONF` syntax ("": all defaults).
    pub alloc_conf: String,
    /// The settings in effect, in that syntax, keys at their defaults left out.
    pub effective_alloc_conf: String,
    /// `garbage_collection_threshold` is set without a memory fraction, so garbage
    /// collection never runs (PyTorch acts on it only under a fraction).
    pub gc_inactive: bool,
    /// A memory fraction is set, but this capacity gives no device total for it to be a
    /// fraction of (the capacity the recorded OOM implies, or no limit): the fraction
    /// could not act, and the answer is that of the settings without it.
    pub fraction_inactive: bool,
    /// The recording's own settings.
    pub baseline: bool,
    /// The `--gpu` fitted, when the capacity is a device's.
    pub gpu: Option<String>,
    pub capacity_source: CapacitySource,
    /// The memory the scenario gives (the device's for a `--gpu`, the allocator's
    /// share at the recorded OOM); null: unlimited.
    pub capacity_bytes: Option<u64>,
    /// Of it, what the allocator may hold (less the memory outside it).
    pub allocator_capacity_bytes: Option<u64>,
    pub peak_reserved_bytes: u64,
    pub peak_event: Option<u32>,
    pub peak_time_us: Option<i64>,
    /// Reserved minus allocated at the peak: cache and fragmentation then.
    pub reserved_minus_allocated_at_peak_bytes: u64,
    /// `cudaMalloc` calls and mappings of expandable pages.
    pub segments_created: u64,
    /// `cudaFree` calls and unmappings.
    pub segments_freed: u64,
    /// Cache flushes of the out-of-memory retry (each synchronises the device).
    pub retry_flushes: u64,
    pub first_oom: Option<OomAt>,
    /// Recorded OOMs this scenario let through.
    pub recorded_ooms_passed: u64,
    /// The smallest device memory that runs the requests under these settings (the
    /// allocator's need plus the memory outside it); null when not searched.
    pub min_capacity_bytes: Option<u64>,
    /// A larger device memory that runs out where the search met one (success is not
    /// monotone in the capacity); null when none was met.
    pub min_capacity_fails_above_bytes: Option<u64>,
    /// Blocks from before recording were placed first, in address order (an inference).
    pub start_replaced: bool,
    /// The model ran out of 64-bit addresses for new segments and reused some: the
    /// answer is an estimate. Written only when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub addresses_reused: bool,
    /// The blocks alive before recording do not fit in the capacity.
    pub start_does_not_fit: Option<StartDoesNotFit>,
    /// Reserved bytes after each trace entry that changed them (for charts).
    #[serde(skip)]
    pub series: Vec<(Option<u32>, u64)>,
}

/// One device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceSimulation {
    pub device: i64,
    pub profile: Profile,
    pub profile_guessed: bool,
    /// The recording's settings in `PYTORCH_CUDA_ALLOC_CONF` syntax, and whether the
    /// file records them (before PyTorch 2.3 it does not: the defaults are assumed).
    pub recorded_alloc_conf: String,
    pub settings_recorded: bool,
    pub identity: Identity,
    /// The recording's last allocation request is one it ran out of memory on: a
    /// scenario that allocates it has run every request recorded, and what the run asks
    /// for after it is not recorded.
    pub stops_at_oom: bool,
    pub outside: Outside,
    pub scenarios: Vec<ScenarioReport>,
    /// The first recorded OOM replayed under the settings `oom` would suggest, at the
    /// capacity it implies (the same replays as `oom`'s `what_if`): which let the request
    /// through and with how much to spare. Null without a recorded OOM that says what
    /// the device had free.
    pub recorded_oom_what_if: Option<crate::analysis::what_if::oom_what_if::OomWhatIf>,
    /// Reserved bytes as recorded, after each segment event (for charts).
    #[serde(skip)]
    pub recorded_series: Vec<(Option<u32>, u64)>,
    /// Entries of the device's trace.
    #[serde(skip)]
    pub events: u32,
}

/// A device that cannot be simulated, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NotSimulated {
    pub device: i64,
    pub reason: NotReplayable,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimulateReport {
    pub schema_version: u32,
    pub path: String,
    /// The device simulated and why it was chosen (the one rule of every command).
    pub choice: DeviceChoice,
    /// The device simulated (one; a list so that a later version can give more).
    pub devices: Vec<DeviceSimulation>,
    /// The chosen device when it cannot be simulated, and why.
    pub not_simulated: Vec<NotSimulated>,
    /// The releases the file's fields allow (as `summary` gives them): a guessed profile
    /// is the earliest's.
    pub layout: crate::model::layout::Layout,
}

/// Simulates the chosen device of `snap`.
pub fn analyze_simulate(
    snap: &Snapshot,
    path: &str,
    choice: &DeviceChoice,
    options: &SimulateOptions,
) -> SimulateReport {
    analyze_simulate_checked(snap, path, choice, options).0
}

/// [`analyze_simulate`], and the device's recording prepared and checked, for the other
/// analyses of a command to share (None where it was not simulated).
pub fn analyze_simulate_checked(
    snap: &Snapshot,
    path: &str,
    choice: &DeviceChoice,
    options: &SimulateOptions,
) -> (SimulateReport, Option<CheckedRun>) {
    let mut out = SimulateReport {
        schema_version: SCHEMA_VERSION,
        path: path.to_string(),
        choice: choice.clone(),
        devices: Vec::new(),
        not_simulated: Vec::new(),
        layout: crate::model::layout::layout(snap),
    };
    let checked = match simulate_one(snap, choice.device, options) {
        Ok((d, checked)) => {
            out.devices.push(d);
            Some(checked)
        }
        Err(n) => {
            out.not_simulated.push(n);
            None
        }
    };
    (out, checked)
}

/// The simulation of one device, or why there is none; with the recording prepared and
/// checked.
pub fn simulate_one(
    snap: &Snapshot,
    device: i64,
    options: &SimulateOptions,
) -> Result<(DeviceSimulation, CheckedRun), NotSimulated> {
    let p = Prepared::new(snap, device, options.profile)
        .map_err(|reason| NotSimulated { device, reason })?;
    let (d, unlimited) = simulate_device(snap, &p, options);
    let identity = d.identity.clone();
    // The first is the recorded settings'.
    let mut unlimited = unlimited.into_iter();
    let recorded = unlimited.next().and_then(|(_, o)| o);
    let others = unlimited.filter_map(|(s, o)| Some((s, o?))).collect();
    Ok((d, CheckedRun::from_parts(p, identity, recorded, others)))
}

/// A capacity to try.
struct Capacity {
    source: CapacitySource,
    gpu: Option<String>,
    device_bytes: Option<u64>,
    allocator_bytes: Option<u64>,
    total_memory: Option<u64>,
}

/// The outcomes of a device's replays with no limit, by settings (the recorded settings
/// first; None where the replay could not start).
type UnlimitedOutcomes = Vec<(Settings, Option<Outcome>)>;

/// A device's simulation, and the outcomes of its replays with no limit.
fn simulate_device(
    snap: &Snapshot,
    p: &Prepared,
    options: &SimulateOptions,
) -> (DeviceSimulation, UnlimitedOutcomes) {
    let (identity, scenarios, unlimited) = scenarios_of(snap, p, options);
    // The settings `oom` suggests, tried at the first recorded OOM, after the same check.
    let recorded_oom_what_if = crate::analysis::what_if::oom_what_if::what_ifs_of(p, &identity, 1)
        .into_iter()
        .next()
        .map(|(_, w)| w);
    let outside = outside_of(options);
    let trace = snap.trace(p.device);
    let d = DeviceSimulation {
        recorded_series: p.recorded_reserved(),
        events: trace.map_or(0, |t| t.len() as u32),
        device: p.device,
        profile: p.profile,
        profile_guessed: options.profile.is_none(),
        recorded_alloc_conf: p.settings.to_conf(),
        settings_recorded: snap.allocator_settings.is_some(),
        identity,
        stops_at_oom: p.requests.ends_with_oom(),
        outside,
        scenarios,
        recorded_oom_what_if,
    };
    (d, unlimited)
}

fn outside_of(options: &SimulateOptions) -> Outside {
    options.outside.unwrap_or_else(Outside::not_measured)
}

/// The check, and the scenarios of a device: every setting at every capacity, and each
/// setting's smallest device; with the outcomes of the replays with no limit made, by
/// settings (the recorded settings first).
fn scenarios_of(
    snap: &Snapshot,
    p: &Prepared,
    options: &SimulateOptions,
) -> (Identity, Vec<ScenarioReport>, UnlimitedOutcomes) {
    use rayon::prelude::*;
    let outside = outside_of(options);
    let mut capacities = Vec::new();
    for g in &options.gpus {
        capacities.push(Capacity {
            source: CapacitySource::Gpu,
            gpu: Some(g.name.clone()),
            device_bytes: Some(g.capacity_bytes),
            allocator_bytes: Some(g.capacity_bytes.saturating_sub(outside.counted_bytes)),
            total_memory: Some(g.capacity_bytes),
        });
    }
    if capacities.is_empty() {
        match p.oom_capacities().iter().find_map(|o| o.capacity_bytes) {
            Some(c) => capacities.push(Capacity {
                source: CapacitySource::RecordedOom,
                gpu: None,
                device_bytes: Some(c),
                allocator_bytes: Some(c),
                // A fraction is of the device's total, when the recording gives it.
                total_memory: p.total_memory,
            }),
            None => capacities.push(Capacity {
                source: CapacitySource::Unlimited,
                gpu: None,
                device_bytes: None,
                allocator_bytes: None,
                total_memory: None,
            }),
        }
    }
    let mut settings: Vec<(String, Settings, bool)> =
        vec![(p.settings.to_conf(), p.settings.clone(), true)];
    for (given, s) in &options.alloc_confs {
        settings.push((given.clone(), s.clone(), false));
    }
    // Each setting's replay with no limit, made once: the answer of an unlimited
    // capacity, and the saved states the smallest capacity's search resumes from. The
    // recorded settings' replay is the check's own, as far as the two are one (and goes
    // on alone from where they part, beside the rest of the check); the other settings'
    // replays run beside the check. Each setting's search follows its own replay (no wait
    // for the other settings' replays), and its saved states, the largest thing held, are
    // let go after it.
    let wants_unlimited = capacities
        .iter()
        .any(|c| c.allocator_bytes.is_none() && c.total_memory.is_none());
    let search_of = |s: &Settings| options.min_capacity && s.memory_fraction.is_none();
    let min_of = |s: &Settings, u: &mut Option<Unlimited>| {
        options.min_capacity.then(|| {
            let saved = match s.memory_fraction {
                None => Some(u.as_mut()?.as_mut().ok()?.1.take()?),
                Some(_) => None,
            };
            min_capacity_searched(p, s, outside.counted_bytes, saved.as_ref()).map(|c| {
                MinCapacity {
                    bytes: c.bytes.saturating_add(outside.counted_bytes),
                    fails_above: c
                        .fails_above
                        .map(|f| f.saturating_add(outside.counted_bytes)),
                }
            })
        })
    };
    let keep_search = search_of(&settings[0].1);
    let (identity, baseline, others) = check_beside(
        p,
        |p, part| check_sharing(snap, p, keep_search, part, split_point(p)),
        || {
            settings[1..]
                .par_iter()
                .map(|(_, s, _)| {
                    let mut u =
                        (wants_unlimited || search_of(s)).then(|| unlimited(p, s, search_of(s)));
                    let min = min_of(s, &mut u);
                    (u, min.flatten())
                })
                .collect::<Vec<_>>()
        },
    );
    let (out, search) = baseline.expect("the check's scenario ends in it or goes on alone");
    let mut baseline = Some(Ok(searchable(out, search)));
    let baseline_min = min_of(&settings[0].1, &mut baseline).flatten();
    let (unlimited_runs, mins): (Vec<Option<Unlimited>>, Vec<Option<MinCapacity>>) =
        std::iter::once((baseline, baseline_min))
            .chain(others)
            .unzip();
    let pairs: Vec<(usize, &Capacity)> = (0..settings.len())
        .flat_map(|k| capacities.iter().map(move |c| (k, c)))
        .collect();
    let trace = snap.trace(p.device);
    let scenarios: Vec<ScenarioReport> = pairs
        .par_iter()
        .map(|&(k, cap)| {
            let (conf, s, baseline) = &settings[k];
            let sc = Scenario {
                settings: s.clone(),
                capacity: cap.allocator_bytes,
                total_memory: cap.total_memory,
            };
            let mut r = ScenarioReport {
                alloc_conf: conf.clone(),
                effective_alloc_conf: s.to_conf(),
                gc_inactive: s.gc_threshold > 0.0 && s.memory_fraction.is_none(),
                fraction_inactive: s.memory_fraction.is_some() && cap.total_memory.is_none(),
                baseline: *baseline,
                gpu: cap.gpu.clone(),
                capacity_source: cap.source,
                capacity_bytes: cap.device_bytes,
                allocator_capacity_bytes: cap.allocator_bytes,
                peak_reserved_bytes: 0,
                peak_event: None,
                peak_time_us: None,
                reserved_minus_allocated_at_peak_bytes: 0,
                segments_created: 0,
                segments_freed: 0,
                retry_flushes: 0,
                first_oom: None,
                recorded_ooms_passed: 0,
                min_capacity_bytes: mins[k].map(|m| m.bytes),
                min_capacity_fails_above_bytes: mins[k].and_then(|m| m.fails_above),
                start_replaced: false,
                addresses_reused: false,
                start_does_not_fit: None,
                series: Vec::new(),
            };
            let outcome = match &unlimited_runs[k] {
                Some(u) if sc.capacity.is_none() && sc.total_memory.is_none() => {
                    u.as_ref().map(|(o, _)| o.clone()).map_err(|e| *e)
                }
                // A capacity the replay with no limit never reaches changes nothing.
                Some(Ok((o, _)))
                    if o.first_oom.is_none()
                        && sc.capacity.is_some_and(|c| {
                            limit_changes_nothing(s, o.peak_reserved_bytes, c)
                        }) =>
                {
                    Ok(o.clone())
                }
                _ => run(p, &sc),
            };
            match outcome {
                Ok(o) => {
                    r.peak_reserved_bytes = o.peak_reserved_bytes;
                    r.peak_event = o.peak_event;
                    r.peak_time_us = o
                        .peak_event
                        .and_then(|e| trace.and_then(|t| t.time_us(e as usize)));
                    r.reserved_minus_allocated_at_peak_bytes = o
                        .peak_reserved_bytes
                        .saturating_sub(o.allocated_at_peak_bytes);
                    r.segments_created = o.stats.segment_allocs + o.stats.maps;
                    r.segments_freed = o.stats.segment_frees + o.stats.unmaps;
                    r.retry_flushes = o.stats.retry_flushes;
                    r.recorded_ooms_passed = o.recorded_ooms_passed;
                    r.start_replaced = o.start_replaced;
                    r.addresses_reused = o.addresses_reused;
                    r.first_oom = o.first_oom.map(|f| oom_at(snap, p.device, f));
                    r.series = o.series;
                }
                Err(e) => r.start_does_not_fit = Some(e),
            }
            r
        })
        .collect();
    let unlimited = settings
        .into_iter()
        .zip(unlimited_runs)
        .map(|((_, s, _), u)| (s, u.and_then(|u| u.ok()).map(|(o, _)| o)))
        .collect();
    (identity, scenarios, unlimited)
}

fn oom_at(snap: &Snapshot, device: i64, f: FirstOom) -> OomAt {
    let trace = snap.trace(device);
    let stack = trace.and_then(|t| t.stack(f.event as usize));
    OomAt {
        event: f.event,
        time_us: trace.and_then(|t| t.time_us(f.event as usize)),
        request_bytes: f.request_bytes,
        rounded_bytes: f.rounded_bytes,
        stream: f.stream,
        callsite: headline_frame(&snap.frames, stack),
        frames: display_frames(&snap.frames, stack, 12),
        live_bytes: f.requested_bytes,
        allocated_bytes: f.allocated_bytes,
        reserved_bytes: f.reserved_bytes,
        largest_free_bytes: f.largest_free_bytes,
        private_free_bytes: f.private_free_bytes,
        cause: f.cause,
        recorded: f.recorded,
        clock: snap.clock(),
    }
}

/// The figures a fleet query asks of a device (`export --simulate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FleetFigures {
    /// The model replays the device's recording exactly.
    pub model_exact: bool,
    /// The smallest memory the allocator needs to run the requests without an OOM,
    /// with the recorded settings and with `expandable_segments:True` (memory outside
    /// the allocator not included).
    pub min_capacity_bytes: Option<u64>,
    pub min_capacity_expandable_bytes: Option<u64>,
}

/// The fleet figures of `device`, or None when it has no trace to replay.
pub fn fleet_figures(snap: &Snapshot, device: i64) -> Option<FleetFigures> {
    let p = Prepared::new(snap, device, None).ok()?;
    let expandable = Settings {
        expandable_segments: true,
        ..p.settings.clone()
    };
    let (exact, (plain, exp)) = rayon::join(
        || reproduces(snap, &p),
        || {
            rayon::join(
                || min_capacity(&p, &p.settings, 0).map(|m| m.bytes),
                || {
                    if p.settings.expandable_segments {
                        None
                    } else {
                        min_capacity(&p, &expandable, 0).map(|m| m.bytes)
                    }
                },
            )
        },
    );
    Some(FleetFigures {
        model_exact: exact,
        min_capacity_bytes: plain,
        min_capacity_expandable_bytes: if p.settings.expandable_segments {
            plain
        } else {
            exp
        },
    })
}
