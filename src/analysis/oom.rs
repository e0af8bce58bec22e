//! OOM post-mortem: for each `oom` event (or the final state of a snapshot dumped at an
//! OOM without one, or an OOM message alone), the request, what the device and the
//! allocator had at that moment, what was live, and ranked verdicts: one primary cause
//! with its share of the shortfall, the others only when their numbers say they
//! contributed, each with the settings or changes that apply. Data only: the words are
//! the renderer's.
//!
//! The arithmetic (spec 3.2, 6.7): the allocator could use what it had reserved plus
//! what the device had free (less under a per-process cap); it needed the live blocks plus
//! the request. When it needed more than it could have, the difference is the shortfall,
//! and a cause that alone frees that much (a leak, memory outside the allocator, frees
//! waiting on other streams) is the primary one; else capacity is. When it could have had
//! enough, the memory was there but in pieces (fragmentation, private pools) or the
//! device refused with room to spare (a cap).

use crate::allocator::checked::CheckedRun;
use crate::allocator::scenario::OomCause;
use crate::analysis::device::{DeviceReason, choose_device};
use crate::analysis::kinds::attribution::{AttributionOptions, Attributor, GroupBy, GroupKind};
use crate::analysis::kinds::categories::bound_attributor;
use crate::analysis::moments::leaks::{LeakReport, LeakSampler};
use crate::analysis::reports::top::{LiveState, LiveStatePass, Versions, group_live};
use crate::analysis::what_if::oom_what_if::OomWhatIf;
use crate::devlog::oom_log::OomMessage;
use crate::model::Snapshot;
use crate::timeline::Start;
use crate::timeline::replay::DeviceReplay;
use crate::timeline::state::allocator_state;
use serde::Serialize;
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: u32 = 6;

/// Memory outside the allocator worth naming: this many bytes or this share of the device.
const OUTSIDE_BYTES: u64 = 1 << 30;
const OUTSIDE_SHARE: f64 = 0.05;
/// A cause contributes when it covers at least this share of the shortfall.
const CONTRIBUTES: f64 = 0.10;
/// OOM events analysed one by one per device; the rest are counted.
pub const MAX_ANALYSES: usize = 16;

#[derive(Debug, Clone, Copy, Default)]
pub struct OomOptions {
    /// Device memory in bytes (e.g. from `--device-total 40GiB`).
    pub device_total_bytes: Option<u64>,
}

/// A cause of an OOM.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Live memory plus the request exceed what the device could give.
    Capacity,
    /// Groups that grew across repeated steps hold memory the request needed.
    Leak,
    /// Memory outside the caching allocator (CUDA context, NCCL, libraries) or other
    /// processes filled the device.
    OutsideAllocator,
    /// Frees waiting on other streams held memory.
    PendingFrees,
    /// Enough memory was free in segments, but no hole was large enough.
    Fragmentation,
    /// The device had room for the request, not for the segment or the expandable pages
    /// the allocator asks for it (a 20 MiB segment for a 1.3 MB request).
    Rounding,
    /// Free memory sat in private pools (CUDA graphs) the request could not use.
    PrivatePools,
    /// The device had room; a per-process limit refused the request.
    MemoryFractionCap,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Primary,
    Contributing,
}

/// A setting or change that applies.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    FixLeak,
    SmallerBatch,
    ActivationCheckpointing,
    PrecisionShardingOffload,
    /// Lower precision or CPU offload, for a job whose stacks show sharding already.
    PrecisionOffload,
    CachedMemoryCannotHelp,
    ExpandableSegments,
    MaxSplitSize,
    GcThreshold,
    EmptyCacheBetweenPhases,
    CheckOtherProcesses,
    NcclBuffers,
    LibraryWorkspaces,
    ReleaseGraphPools,
    AvoidRecordStream,
    CheckFractionCap,
}

impl Knob {
    /// A `PYTORCH_CUDA_ALLOC_CONF` setting, offered only when the snapshot's settings do
    /// not have it on already (all of them when the settings are unknown).
    /// The knob of a setting the what-if tries.
    pub fn of_tried(t: crate::analysis::what_if::oom_what_if::Tried) -> Knob {
        use crate::analysis::what_if::oom_what_if::Tried;
        match t {
            Tried::ExpandableSegments => Knob::ExpandableSegments,
            Tried::MaxSplitSize => Knob::MaxSplitSize,
            Tried::GcThreshold => Knob::GcThreshold,
        }
    }

    pub fn is_allocator_setting(self) -> bool {
        matches!(
            self,
            Knob::ExpandableSegments | Knob::MaxSplitSize | Knob::GcThreshold
        )
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Verdict {
    pub cause: Cause,
    pub role: Role,
    /// The bytes behind the cause: the shortfall for capacity, the leak's live bytes,
    /// memory outside the allocator, pending frees, free memory in segments
    /// (fragmentation), free memory in private pools, the cap.
    pub bytes: u64,
    /// The part of what the request lacked (`deficit_bytes`) this cause accounts for, 4
    /// decimals: counted in rank order, each cause from what the ones above it left, so
    /// the shares of an analysis add up to at most 1. Null for capacity (the deficit
    /// itself, not a part of it) and for verdicts given when the memory was there.
    pub share_of_deficit: Option<f64>,
    /// The call sites a leak verdict names, largest first.
    pub sites: Vec<String>,
    /// Settings and changes that apply; none that the snapshot shows already on.
    pub knobs: Vec<Knob>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PoolFree {
    pub pool_id: Option<(i64, i64)>,
    pub stream: u64,
    pub segments: usize,
    pub reserved_bytes: u64,
    pub free_bytes: u64,
    pub largest_hole_bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SiteUse {
    /// A call site (see `top`).
    pub name: crate::analysis::reports::top::GroupName,
    pub kind: GroupKind,
    pub bytes: u64,
    pub allocations: usize,
    /// The category of most of its bytes, and whether that is an inference.
    pub category: String,
    pub category_inferred: bool,
}

/// Where the figures of an analysis come from.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// An `oom` entry of the trace.
    OomEvent,
    /// The final state of a snapshot without an `oom` entry.
    FinalState,
    /// An OOM message of a log, without a snapshot.
    Message,
}

/// The figures at one OOM, and what they say.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OomAnalysis {
    pub device: i64,
    pub source: Source,
    /// The state analysed: just after this event.
    pub event: Option<u32>,
    pub time_us: Option<i64>,
    /// Whether an OOM is recorded at all (an `oom` entry or a message).
    pub oom_recorded: bool,
    /// Rounded request size (what the allocator looked for); null when unknown.
    pub requested_bytes: Option<u64>,
    pub stream: u64,
    /// The request's call site (see `top`), when its stack is known.
    pub site: Option<String>,
    pub frames: Vec<String>,
    /// What `cudaMemGetInfo` reported when the allocation failed.
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    /// "option" (--device-total) or "message" (an OOM message).
    pub device_total_source: Option<&'static str>,
    /// The log line of the message the figures came from.
    pub message_line: Option<usize>,
    /// A per-process limit from the OOM message ("X allowed"), when it names one.
    pub allowed_bytes: Option<u64>,
    pub reserved_bytes: u64,
    /// Requested bytes of live allocations (the official viewer's count); null for a
    /// message, which does not give them.
    pub requested_live_bytes: Option<u64>,
    /// Bytes of the blocks in segments (live allocations, pending frees included).
    pub allocated_bytes: u64,
    /// Free memory inside segments (reserved − allocated).
    pub cached_free_bytes: u64,
    /// Of the live block bytes, what rounding added to the requests (null for a message).
    pub rounding_waste_bytes: Option<u64>,
    /// Blocks freed but waiting on other streams (null for a message).
    pub pending_free_bytes: Option<u64>,
    /// Largest free range in any segment (null for a message, which gives no hole sizes).
    pub largest_hole_bytes: Option<u64>,
    /// Largest hole in segments of the request's stream (null for a message).
    pub largest_hole_same_stream_bytes: Option<u64>,
    pub free_by_pool: Vec<PoolFree>,
    /// Device total − device free − reserved, when both are known.
    pub outside_allocator_bytes: Option<u64>,
    /// What the OOM message says this process had in use on the device (its CUDA
    /// context, the allocator's segments, memory of libraries outside the allocator).
    pub this_process_bytes: Option<u64>,
    /// Of `outside_allocator_bytes`, this process's own: this process − reserved.
    pub process_outside_allocator_bytes: Option<u64>,
    /// Of `outside_allocator_bytes`, the rest: device total − free − this process (other
    /// processes and the driver).
    pub other_processes_bytes: Option<u64>,
    /// What PyTorch could have used: reserved + device free (capped), when known.
    pub available_bytes: Option<u64>,
    /// Allocated + request, when the request is known.
    pub needed_bytes: Option<u64>,
    /// needed − available when positive; 0 when the memory was there; null when unknown.
    pub shortfall_bytes: Option<u64>,
    /// What the request lacked: the shortfall when there is one, else the request minus
    /// the largest free space it could have used (device free, or a hole on its stream;
    /// for a message, whose hole sizes are unknown, device free only).
    /// Verdict shares are of this.
    pub deficit_bytes: Option<u64>,
    /// Where the memory the request lacked was, by the rule `simulate` and `budget`
    /// apply to a replayed OOM (their `cause`): "capacity" (live blocks and request
    /// exceed what PyTorch could have), "fragmentation" (the rest sat in holes inside
    /// segments), "rounding" (the device had room for the request, not for the segment
    /// or pages asked for it); null when the request or the device's free memory is
    /// unknown.
    pub shortfall_in: Option<crate::allocator::scenario::OomCause>,
    /// The most PyTorch could hold by the limit `shortfall_in` is judged against:
    /// `available_bytes`, or under a memory fraction the replay finds, the most the
    /// allocator held under it.
    pub limit_bytes: Option<u64>,
    /// The most the allocator would ask the device for to serve the request: a whole
    /// segment, or whole pages with expandable segments (null when the request is
    /// unknown).
    pub device_ask_bytes: Option<u64>,
    /// Live memory by call site, largest first (at most 10).
    pub top_sites: Vec<SiteUse>,
    pub leaks: Option<LeakReport>,
    /// Ranked: the primary cause first.
    pub verdicts: Vec<Verdict>,
    /// The recorded request replayed through the allocator model at the capacity it
    /// implies, under the settings the verdicts would suggest (null: no `oom` entry, or
    /// one that does not say what the device had free, or a device without a trace).
    pub what_if: Option<OomWhatIf>,
    /// How the file's times read (for the text).
    #[serde(skip)]
    pub clock: crate::units::Clock,
}

impl OomAnalysis {
    /// Free bytes cached in private (CUDA-graph) pools at the moment.
    pub fn private_free_bytes(&self) -> u64 {
        self.free_by_pool
            .iter()
            .filter(|p| p.pool_id.is_some_and(|id| id != (0, 0)))
            .map(|p| p.free_bytes)
            .sum()
    }

    /// An analysis with no figure known yet, to be filled from a snapshot or a message.
    fn blank(device: i64, source: Source) -> Self {
        OomAnalysis {
            clock: crate::units::Clock::Unix,
            device,
            source,
            event: None,
            time_us: None,
            oom_recorded: false,
            requested_bytes: None,
            stream: 0,
            site: None,
            frames: Vec::new(),
            device_free_bytes: None,
            device_total_bytes: None,
            device_total_source: None,
            message_line: None,
            allowed_bytes: None,
            reserved_bytes: 0,
            requested_live_bytes: None,
            allocated_bytes: 0,
            cached_free_bytes: 0,
            rounding_waste_bytes: None,
            pending_free_bytes: None,
            largest_hole_bytes: None,
            largest_hole_same_stream_bytes: None,
            free_by_pool: Vec::new(),
            outside_allocator_bytes: None,
            this_process_bytes: None,
            process_outside_allocator_bytes: None,
            other_processes_bytes: None,
            available_bytes: None,
            needed_bytes: None,
            shortfall_bytes: None,
            deficit_bytes: None,
            shortfall_in: None,
            limit_bytes: None,
            device_ask_bytes: None,
            top_sites: Vec::new(),
            leaks: None,
            verdicts: Vec::new(),
            what_if: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OomReport {
    pub schema_version: u32,
    pub path: Option<String>,
    /// Every device of the snapshot, ascending (empty for a log alone).
    pub devices: Vec<i64>,
    /// Each device's peak of requested memory (its final state's without a timeline),
    /// `[device, bytes]` ascending by device, when the file has several devices and none
    /// was asked for; empty otherwise.
    pub device_peaks: Vec<(i64, u64)>,
    /// Why the analysed devices were chosen; null for a log alone.
    pub device_reason: Option<DeviceReason>,
    pub analyses: Vec<OomAnalysis>,
    /// `oom` events past the ones analysed, per device.
    pub more_oom_events: BTreeMap<i64, usize>,
    /// OOM messages found in the log given with `--log`.
    pub messages: Vec<OomMessage>,
    /// A source file whose frames show the parameters sharded (FSDP, ZeRO): sharding is
    /// then not proposed. Null when no frame shows it (or for a log alone).
    pub sharding_file: Option<String>,
}

/// The snapshot's allocator settings, as far as knobs go.
#[derive(Debug, Clone, Copy, Default)]
pub struct Settings {
    pub expandable: bool,
    pub max_split_set: bool,
    pub gc_threshold_set: bool,
    /// The stacks show the parameters sharded already (FSDP or DeepSpeed ZeRO frames).
    pub sharded: bool,
}

/// Source files whose frames show a job sharding its parameters: FSDP (both the
/// wrapper and `fully_shard`) and DeepSpeed's ZeRO stages.
const SHARDING_FILES: [&str; 4] = [
    "torch/distributed/fsdp/",
    "torch/distributed/_composable/fsdp/",
    "deepspeed/runtime/zero/",
    "torch/distributed/_composable/fully_shard",
];

/// The first file (in frame order) of a frame that shows sharding on, if any.
pub fn sharding_file(snap: &Snapshot) -> Option<String> {
    let frames = &snap.frames;
    (0..frames.frame_count() as u32)
        .map(|i| frames.str(frames.frame(crate::model::FrameId(i)).filename))
        .find(|f| {
            let f = f.replace('\\', "/");
            SHARDING_FILES.iter().any(|s| f.contains(s))
        })
        .map(str::to_string)
}

pub fn settings(snap: &Snapshot) -> Settings {
    let conf = snap
        .setting("PYTORCH_CUDA_ALLOC_CONF")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    Settings {
        expandable: snap
            .setting("expandable_segments")
            .and_then(|v| v.as_bool())
            == Some(true)
            || conf.contains("expandable_segments:True")
            || snap.segments.iter().any(|s| s.is_expandable),
        max_split_set: snap
            .setting("max_split_size")
            .and_then(|v| v.as_i64())
            .is_some_and(|v| v > 0 && v < i64::MAX)
            || conf.contains("max_split_size_mb"),
        gc_threshold_set: snap
            .setting("garbage_collection_threshold")
            .and_then(|v| v.as_f64())
            .is_some_and(|v| v > 0.0)
            || conf.contains("garbage_collection_threshold"),
        sharded: sharding_file(snap).is_some(),
    }
}

fn fragmentation_knobs(s: Settings) -> Vec<Knob> {
    let mut k = Vec::new();
    if !s.expandable {
        k.push(Knob::ExpandableSegments);
    }
    if !s.max_split_set {
        k.push(Knob::MaxSplitSize);
    }
    if !s.gc_threshold_set {
        k.push(Knob::GcThreshold);
    }
    k.push(Knob::EmptyCacheBetweenPhases);
    k
}

/// part / whole rounded to 4 decimals, at most 1.
fn share(part: u64, whole: u64) -> f64 {
    crate::analysis::share(part.min(whole.max(1)), whole)
}

/// part / whole in units of 1/10000, rounded, at most 10000.
fn ten_thousandths(part: u64, whole: u64) -> u64 {
    crate::analysis::ten_thousandths(part.min(whole.max(1)), whole)
}

/// The share of bytes `from..from + part` of the whole: the difference of the rounded
/// running totals, so the shares of consecutive parts add up to the rounded sum.
fn share_between(from: u64, part: u64, whole: u64) -> f64 {
    (ten_thousandths(from + part, whole) - ten_thousandths(from, whole)) as f64 / 10_000.0
}

/// Free bytes cached in private (CUDA-graph) pools in the allocator's state `state`.
pub fn private_free_in(state: &[crate::timeline::state::StateSegment]) -> u64 {
    state
        .iter()
        .filter(|s| s.pool_id.is_some_and(|id| id != (0, 0)))
        .map(|s| s.holes().iter().map(|h| h.1).sum::<u64>())
        .sum()
}

/// A verdict of `cause` with no call sites named yet.
fn verdict(
    cause: Cause,
    role: Role,
    bytes: u64,
    share_of_deficit: Option<f64>,
    knobs: Vec<Knob>,
) -> Verdict {
    Verdict {
        cause,
        role,
        bytes,
        share_of_deficit,
        sites: Vec::new(),
        knobs,
    }
}

/// What the allocator would have asked the device for, then the verdicts.
fn judge(a: &mut OomAnalysis, s: Settings) {
    a.device_ask_bytes = a
        .requested_bytes
        .map(|r| crate::allocator::device_ask_at_most(r, s.expandable));
    // Under a memory fraction the replay finds (the device had room), the limit the
    // request met is the fraction's, not the device's.
    if let (Some(limit), Some(r)) = (
        a.what_if.as_ref().and_then(|w| w.fraction_limit()),
        a.requested_bytes,
    ) {
        a.limit_bytes = Some(limit);
        a.shortfall_in = Some(OomCause::of(
            a.allocated_bytes,
            r,
            a.reserved_bytes,
            limit,
            a.private_free_bytes(),
        ));
    }
    a.verdicts = verdicts(a, s);
}

/// The ranked verdicts of an analysis whose figures are filled in (and its what-if,
/// when it has one: a setting is then offered only where the replay shows it letting
/// the request through, the most to spare first).
pub fn verdicts(a: &OomAnalysis, s: Settings) -> Vec<Verdict> {
    let (Some(request), Some(free), Some(class)) =
        (a.requested_bytes, a.device_free_bytes, a.shortfall_in)
    else {
        return Vec::new();
    };
    // The device had room for what the allocator would have asked of it: a limit
    // refused the request.
    if free >= a.device_ask_bytes.unwrap_or(request) {
        let mut out = vec![verdict(
            Cause::MemoryFractionCap,
            Role::Primary,
            a.allowed_bytes.unwrap_or(a.reserved_bytes),
            None,
            vec![Knob::CheckFractionCap],
        )];
        // Under the limit, holes or rounding may have refused it: the settings the
        // replay proves there.
        if class != OomCause::Capacity && a.what_if.as_ref().is_some_and(|w| w.tested()) {
            out.extend(
                verdicts_layout(a, s, class, request)
                    .into_iter()
                    .filter(|v| v.cause != Cause::Leak)
                    .map(|v| Verdict {
                        role: Role::Contributing,
                        ..v
                    }),
            );
        }
        return out;
    }
    let mut out = match class {
        OomCause::Capacity => verdicts_tight(a, s),
        OomCause::Fragmentation | OomCause::Rounding | OomCause::PrivatePools => {
            verdicts_layout(a, s, class, request)
        }
    };
    // Name the leak's call sites.
    if let Some(l) = &a.leaks {
        for v in out.iter_mut().filter(|v| v.cause == Cause::Leak) {
            v.sites = l.suspects.iter().map(|s| s.name.clone()).collect();
        }
    }
    out
}

/// A cause the deficit may come from: (cause, bytes, may be primary, knobs).
type Candidate = (Cause, u64, bool, Vec<Knob>);

/// The bytes the leak's suspects hold (0 without a leak).
fn leak_bytes(a: &OomAnalysis) -> u64 {
    a.leaks
        .as_ref()
        .map_or(0, |l| l.suspects.iter().map(|s| s.bytes).sum())
}

/// What reduces live memory, for a job sharded already or not.
fn reduce_live_knobs(s: Settings) -> Vec<Knob> {
    vec![
        Knob::SmallerBatch,
        Knob::ActivationCheckpointing,
        if s.sharded {
            Knob::PrecisionOffload
        } else {
            Knob::PrecisionShardingOffload
        },
    ]
}

/// The causes a device short of memory may owe its shortfall to, in order of
/// precedence: a leak, memory outside the allocator, frees pending on other streams.
fn tight_candidates(a: &OomAnalysis) -> Vec<Candidate> {
    let outside = a
        .outside_allocator_bytes
        .zip(a.device_total_bytes)
        .filter(|&(o, t)| o >= OUTSIDE_BYTES || o as f64 >= OUTSIDE_SHARE * t as f64);
    let pending = a.pending_free_bytes.unwrap_or(0);
    let total = a.device_total_bytes.unwrap_or(0);
    let leak = leak_bytes(a);
    let mut candidates: Vec<Candidate> = Vec::new();
    if leak > 0 {
        candidates.push((Cause::Leak, leak, true, vec![Knob::FixLeak]));
    }
    if let Some((o, t)) = outside {
        // Outside memory is the primary cause only when it is unusual for a process
        // (another job, a large library pool), not the CUDA context and NCCL.
        candidates.push((
            Cause::OutsideAllocator,
            o,
            o as f64 >= 0.10 * t as f64,
            vec![
                Knob::CheckOtherProcesses,
                Knob::NcclBuffers,
                Knob::LibraryWorkspaces,
            ],
        ));
    }
    if pending > 0 {
        candidates.push((
            Cause::PendingFrees,
            pending,
            pending as f64 >= 0.05 * total as f64,
            vec![Knob::AvoidRecordStream],
        ));
    }
    candidates
}

/// The verdicts of a device short of memory (the live blocks and the request exceed
/// what PyTorch could have): the first candidate that may be primary and covers the
/// shortfall, else capacity; then the contributing causes. No allocator setting or
/// `empty_cache()` can make memory that is in use.
fn verdicts_tight(a: &OomAnalysis, s: Settings) -> Vec<Verdict> {
    let mut out = Vec::new();
    let shortfall = a.shortfall_bytes.unwrap_or(0);
    let deficit = a.deficit_bytes.unwrap_or(shortfall).max(1);
    let mut candidates = tight_candidates(a);
    let primary = candidates
        .iter()
        .position(|(_, bytes, may, _)| *may && *bytes >= deficit);
    // Shares split the deficit in rank order: a primary cause covers all of it (it
    // alone explains the OOM and leaves nothing for others to contribute); under
    // capacity, each contributing cause takes what the ones before it left, the ones
    // a user can act on first (memory outside the allocator is mostly the CUDA
    // context and NCCL), and counts when that is at least CONTRIBUTES of the deficit.
    let mut left = deficit;
    match primary {
        Some(p) => {
            let (cause, bytes, _, knobs) = candidates.remove(p);
            left = left.saturating_sub(bytes);
            out.push(verdict(
                cause,
                Role::Primary,
                bytes,
                Some(share(bytes, deficit)),
                knobs,
            ));
        }
        None => {
            let mut knobs = reduce_live_knobs(s);
            knobs.push(Knob::CachedMemoryCannotHelp);
            out.push(verdict(
                Cause::Capacity,
                Role::Primary,
                deficit,
                None,
                knobs,
            ));
        }
    }
    candidates.sort_by_key(|c| match c.0 {
        Cause::Leak => 0,
        Cause::PendingFrees => 1,
        _ => 2,
    });
    for (cause, bytes, _, knobs) in candidates {
        let part = bytes.min(left);
        if part > 0 && part as f64 >= CONTRIBUTES * deficit as f64 {
            out.push(verdict(
                cause,
                Role::Contributing,
                bytes,
                Some(share_between(deficit - left, part, deficit)),
                knobs,
            ));
            left -= part;
        }
    }
    out
}

/// The allocator settings to offer for a layout cause: with a what-if the model
/// reproduced, those it shows letting the request through, the most to spare first;
/// without one, every setting that is off (unverified: the text says so).
fn layout_settings(a: &OomAnalysis, s: Settings, class: OomCause) -> Vec<Knob> {
    match &a.what_if {
        Some(w) if w.tested() => w
            .proven()
            .into_iter()
            .map(|t| Knob::of_tried(t.setting))
            .collect(),
        _ if class == OomCause::Rounding => {
            // Pages instead of whole segments are the one setting that asks the device
            // for less.
            if s.expandable {
                Vec::new()
            } else {
                vec![Knob::ExpandableSegments]
            }
        }
        _ => fragmentation_knobs(s),
    }
}

/// The verdicts when the live blocks and the request fit in what PyTorch could have:
/// the memory was there, in holes inside segments too small (fragmentation), in pools
/// the request cannot use, or in a segment or pages larger than the request (rounding).
/// The settings the what-if proves come first, then what reduces live memory; a leak
/// that alone covers what the request lacked leads when no setting helps or the best
/// leaves a thin margin (the next step would run out again).
fn verdicts_layout(a: &OomAnalysis, s: Settings, class: OomCause, request: u64) -> Vec<Verdict> {
    let deficit = a.deficit_bytes.unwrap_or(0).max(1);
    let mut out = Vec::new();
    let private_free = a.private_free_bytes();
    let pending = a.pending_free_bytes.unwrap_or(0);
    let settings = layout_settings(a, s, class);
    let tested = a.what_if.as_ref().is_some_and(|w| w.tested());
    let thin = a
        .what_if
        .as_ref()
        .and_then(|w| w.proven().first().map(|t| t.thin_margin))
        .unwrap_or(true);
    let leak = leak_bytes(a);
    let leak_leads = leak >= deficit && (thin || (tested && settings.is_empty()));
    let leak_verdict = |role| {
        verdict(
            Cause::Leak,
            role,
            leak,
            Some(share(leak, deficit)),
            vec![Knob::FixLeak],
        )
    };
    if leak_leads {
        out.push(leak_verdict(Role::Primary));
    }
    let role = if leak_leads {
        Role::Contributing
    } else {
        Role::Primary
    };
    let mut knobs = settings;
    if !leak_leads {
        knobs.extend(reduce_live_knobs(s));
    }
    if class == OomCause::Rounding {
        out.push(verdict(Cause::Rounding, role, request, None, knobs));
    } else if class != OomCause::PrivatePools {
        out.push(verdict(
            Cause::Fragmentation,
            role,
            a.cached_free_bytes,
            None,
            knobs,
        ));
        if private_free as f64 >= CONTRIBUTES * a.cached_free_bytes as f64 {
            out.push(verdict(
                Cause::PrivatePools,
                Role::Contributing,
                private_free,
                None,
                vec![Knob::ReleaseGraphPools],
            ));
        }
    } else {
        out.push(verdict(
            Cause::PrivatePools,
            role,
            private_free,
            None,
            vec![Knob::ReleaseGraphPools],
        ));
    }
    if !leak_leads && leak as f64 >= CONTRIBUTES * deficit as f64 {
        out.push(leak_verdict(Role::Contributing));
    }
    if pending as f64 >= CONTRIBUTES * request as f64 {
        out.push(verdict(
            Cause::PendingFrees,
            Role::Contributing,
            pending,
            None,
            vec![Knob::AvoidRecordStream],
        ));
    }
    out
}

/// Fills in what follows from the figures: outside memory, availability, shortfall.
fn derive(a: &mut OomAnalysis) {
    a.outside_allocator_bytes = match (a.device_total_bytes, a.device_free_bytes) {
        (Some(t), Some(f)) => Some(t.saturating_sub(f).saturating_sub(a.reserved_bytes)),
        _ => None,
    };
    if let (Some(p), Some(o)) = (a.this_process_bytes, a.outside_allocator_bytes) {
        let inside = p.saturating_sub(a.reserved_bytes).min(o);
        a.process_outside_allocator_bytes = Some(inside);
        a.other_processes_bytes = Some(o - inside);
    }
    a.available_bytes = a.device_free_bytes.map(|free| {
        let all = a.reserved_bytes.saturating_add(free);
        match a.allowed_bytes {
            Some(cap) => all.min(cap.max(a.reserved_bytes)),
            None => all,
        }
    });
    a.needed_bytes = a
        .requested_bytes
        .map(|r| a.allocated_bytes.saturating_add(r));
    a.shortfall_bytes = match (a.needed_bytes, a.available_bytes) {
        (Some(n), Some(h)) => Some(n.saturating_sub(h)),
        _ => None,
    };
    a.limit_bytes = a.available_bytes;
    a.shortfall_in = match (a.requested_bytes, a.available_bytes) {
        (Some(r), Some(h)) => Some(OomCause::of(
            a.allocated_bytes,
            r,
            a.reserved_bytes,
            h,
            a.private_free_bytes(),
        )),
        _ => None,
    };
    a.deficit_bytes = match (a.shortfall_bytes, a.requested_bytes, a.device_free_bytes) {
        (Some(s), _, _) if s > 0 => Some(s),
        (_, Some(r), Some(f)) => {
            Some(r.saturating_sub(f.max(a.largest_hole_same_stream_bytes.unwrap_or(0))))
        }
        _ => None,
    };
}

/// The request and device figures known for a moment.
struct Known {
    source: Source,
    requested: Option<u64>,
    stream: u64,
    stack: Option<crate::model::StackId>,
    free: Option<u64>,
    total: Option<(u64, &'static str)>,
    allowed: Option<u64>,
    /// The message's "this process has X memory in use".
    this_process: Option<u64>,
    message_line: Option<usize>,
}

/// Analyses one moment of one device.
/// What the analysis of one moment collects in a replay: the live set there and the
/// leak search's samples up to it. Run alone by the analysis, or beside a command's own
/// aggregators ([`OomPrepared`]).
pub struct MomentPass<'a> {
    at: Option<usize>,
    live: LiveStatePass,
    sampler: Option<LeakSampler<'a>>,
}

crate::aggregator_of_fields!(MomentPass<'_>, live, sampler);

impl<'a> MomentPass<'a> {
    pub fn new(r: &DeviceReplay, attr: &'a Attributor<'a>, at: Option<usize>) -> Self {
        MomentPass {
            at,
            live: LiveStatePass::new(at),
            sampler: r
                .has_timeline()
                .then(|| LeakSampler::new(r, attr, GroupBy::Callsite, at)),
        }
    }

    /// What the pass collected (`start`: the replay's start).
    pub fn finish(self, snap: &Snapshot, r: &DeviceReplay, start: Start) -> Collected {
        Collected {
            at: self.at,
            live: self.live.finish(r, start, Versions::NotNeeded),
            leaks: self.sampler.map(|s| s.finish(snap, r, start)),
        }
    }
}

/// What a [`MomentPass`] collected.
pub struct Collected {
    at: Option<usize>,
    live: LiveState,
    leaks: Option<LeakReport>,
}

/// The moments [`analyze_oom`] analyses on `device` when asked about that device alone:
/// its first OOM events, else its final state.
pub fn oom_moments(r: &DeviceReplay) -> Vec<Option<usize>> {
    let ooms: Vec<Option<usize>> = r.trace.oom_events().take(MAX_ANALYSES).map(Some).collect();
    if ooms.is_empty() {
        vec![r.len().checked_sub(1)]
    } else {
        ooms
    }
}

/// For the analysis of one device asked for: its attributor (bound to the device) and
/// what the command's replay collected at [`oom_moments`].
pub struct OomPrepared<'p, 'a> {
    pub device: i64,
    pub attr: &'p Attributor<'a>,
    pub collected: Vec<Collected>,
    /// The device's recording prepared and checked by the command already.
    pub checked: Option<&'p CheckedRun>,
}

impl<'p, 'a> OomPrepared<'p, 'a> {
    /// The attributor given for device `d`, if it is the device prepared.
    fn attr_for(&self, d: i64) -> Option<&'p Attributor<'a>> {
        (d == self.device).then_some(self.attr)
    }

    /// The recording of device `d` checked already, if it is the device prepared.
    fn checked_for(&self, d: i64) -> Option<&'p CheckedRun> {
        self.checked.filter(|_| d == self.device)
    }

    /// What was collected at `at` on device `d`, taken once.
    fn take(&mut self, d: i64, at: Option<usize>) -> Option<Collected> {
        if d != self.device {
            return None;
        }
        let k = self.collected.iter().position(|c| c.at == at)?;
        Some(self.collected.swap_remove(k))
    }
}

#[allow(clippy::too_many_arguments)]
fn analyze_at(
    snap: &Snapshot,
    r: &DeviceReplay,
    attr: &Attributor,
    at: Option<usize>,
    known: Known,
    settings: Settings,
    collected: Option<Collected>,
) -> OomAnalysis {
    let state = allocator_state(snap, r.device, at);
    let reserved: u64 = state.iter().map(|s| s.size).sum();
    let block_bytes: u64 = state.iter().flat_map(|s| &s.blocks).map(|b| b.size).sum();
    let pending: u64 = state
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.pending_free)
        .map(|b| b.size)
        .sum();
    // What was alive at the moment and the leak search's samples, from one replay (or
    // from the command's replay, which collected them beside its own).
    let Collected { live, leaks, .. } = match collected {
        Some(c) if c.at == at => c,
        _ => {
            let mut pass = MomentPass::new(r, attr, at);
            let start = r.run(&mut pass);
            pass.finish(snap, r, start)
        }
    };
    let mut pools: BTreeMap<(Option<(i64, i64)>, u64), PoolFree> = BTreeMap::new();
    let (mut largest, mut largest_same) = (0u64, 0u64);
    for s in &state {
        let holes = s.holes();
        let free: u64 = holes.iter().map(|h| h.1).sum();
        let big = holes.iter().map(|h| h.1).max().unwrap_or(0);
        largest = largest.max(big);
        if s.stream == known.stream {
            largest_same = largest_same.max(big);
        }
        let p = pools.entry((s.pool_id, s.stream)).or_insert(PoolFree {
            pool_id: s.pool_id,
            stream: s.stream,
            segments: 0,
            reserved_bytes: 0,
            free_bytes: 0,
            largest_hole_bytes: 0,
        });
        p.segments += 1;
        p.reserved_bytes += s.size;
        p.free_bytes += free;
        p.largest_hole_bytes = p.largest_hole_bytes.max(big);
    }
    let top_sites = group_live(attr, &live, GroupBy::Callsite)
        .into_iter()
        .take(10)
        .map(|g| SiteUse {
            name: g.name,
            kind: g.kind,
            bytes: g.bytes,
            allocations: g.count,
            category: g.category,
            category_inferred: g.category_inferred,
        })
        .collect();
    let mut a = OomAnalysis {
        clock: r.snap.clock(),
        device: r.device,
        source: known.source,
        event: at.map(|i| i as u32),
        time_us: at.and_then(|i| r.trace.stamped_time(i)),
        oom_recorded: known.source == Source::OomEvent || known.message_line.is_some(),
        requested_bytes: known.requested,
        stream: known.stream,
        site: known
            .stack
            .map(|s| attr.site_name(&attr.stack_site(Some(s)))),
        frames: crate::analysis::kinds::frames::user_frames(&snap.frames, known.stack, 6),
        device_free_bytes: known.free,
        device_total_bytes: known.total.map(|t| t.0),
        device_total_source: known.total.map(|t| t.1),
        message_line: known.message_line,
        allowed_bytes: known.allowed,
        reserved_bytes: reserved,
        requested_live_bytes: Some(live.requested_bytes),
        allocated_bytes: block_bytes,
        cached_free_bytes: reserved.saturating_sub(block_bytes),
        rounding_waste_bytes: Some(block_bytes.saturating_sub(live.requested_bytes)),
        pending_free_bytes: Some(pending),
        largest_hole_bytes: Some(largest),
        largest_hole_same_stream_bytes: Some(largest_same),
        free_by_pool: pools.into_values().collect(),
        outside_allocator_bytes: None,
        this_process_bytes: known.this_process,
        process_outside_allocator_bytes: None,
        other_processes_bytes: None,
        available_bytes: None,
        needed_bytes: None,
        shortfall_bytes: None,
        deficit_bytes: None,
        shortfall_in: None,
        limit_bytes: None,
        device_ask_bytes: None,
        top_sites,
        leaks,
        verdicts: Vec::new(),
        what_if: None,
    };
    derive(&mut a);
    judge(&mut a, settings);
    a
}

/// The log message about a GPU: the first naming it, else the first one.
fn message_for(messages: &[OomMessage], device: i64) -> Option<&OomMessage> {
    messages
        .iter()
        .find(|m| m.gpu == Some(device))
        .or(messages.first())
}

/// The message whose figures are this GPU's own ("this process has X in use"): the one
/// [`message_for`] gives, unless it names another GPU.
pub(crate) fn message_about(messages: &[OomMessage], device: i64) -> Option<&OomMessage> {
    message_for(messages, device).filter(|m| m.gpu.is_none_or(|g| g == device))
}

/// The device total: the option, else the first log message about that GPU.
fn device_total(
    options: OomOptions,
    messages: &[OomMessage],
    device: i64,
) -> Option<(u64, &'static str)> {
    if let Some(t) = options.device_total_bytes {
        return Some((t, "option"));
    }
    messages
        .iter()
        .find(|m| m.gpu == Some(device) && m.total_capacity_bytes.is_some())
        .or_else(|| messages.iter().find(|m| m.total_capacity_bytes.is_some()))
        .and_then(|m| Some((m.total_capacity_bytes?, "message")))
}

/// Analyses every `oom` event of a snapshot (all devices, or one), or its final state
/// when it has none.
/// With `prepared`, what a command's replay already collected for the device it asks
/// about ([`OomPrepared`]): that device's analyses replay nothing more.
pub fn analyze_oom(
    snap: &Snapshot,
    path: &str,
    device: Option<i64>,
    messages: Vec<OomMessage>,
    options: OomOptions,
    attribution: &AttributionOptions,
    prepared: Option<OomPrepared>,
) -> OomReport {
    let mut prepared = prepared.filter(|p| device == Some(p.device));
    let settings = settings(snap);
    let mut analyses = Vec::new();
    let mut more = BTreeMap::new();
    let all = snap.devices();
    let devices: Vec<i64> = all
        .iter()
        .copied()
        .filter(|d| device.is_none_or(|w| w == *d))
        .collect();
    // The device every command picks and every device's peak, when the file has several
    // and none was asked for (one pass over the devices, for both uses below).
    let choice = (device.is_none() && all.len() > 1)
        .then(|| choose_device(snap, None).ok())
        .flatten();
    for &d in &devices {
        let r = DeviceReplay::new(snap, d);
        let ooms: Vec<usize> = r.trace.oom_events().collect();
        // A device without an OOM is not looked at here (nor is an attributor made for
        // it): a file of thousands of devices costs what its OOMs do.
        if ooms.is_empty() {
            continue;
        }
        if ooms.len() > MAX_ANALYSES {
            more.insert(d, ooms.len() - MAX_ANALYSES);
        }
        let first = analyses.len();
        let given = prepared.as_ref().and_then(|p| p.attr_for(d));
        let own = given.is_none().then(|| bound_attributor(&r, attribution));
        let attr = given
            .or(own.as_ref())
            .expect("an attributor, given or made");
        for &i in ooms.iter().take(MAX_ANALYSES) {
            let e = r.trace.get(i);
            let m = message_for(&messages, d);
            let known = Known {
                source: Source::OomEvent,
                requested: Some(e.size),
                stream: e.stream,
                stack: e.stack,
                free: e.device_free(),
                total: device_total(options, &messages, d),
                allowed: m.and_then(|m| m.allowed_bytes),
                // Only a message about this GPU tells this process's use of it.
                this_process: message_about(&messages, d).and_then(|m| m.this_process_bytes),
                message_line: None,
            };
            let collected = prepared.as_mut().and_then(|p| p.take(d, Some(i)));
            analyses.push(analyze_at(
                snap,
                &r,
                attr,
                Some(i),
                known,
                settings,
                collected,
            ));
        }
        // Only this device's analyses: the earlier devices' are not searched again.
        let checked = prepared.as_ref().and_then(|p| p.checked_for(d));
        attach_what_ifs(snap, d, settings, checked, &mut analyses[first..]);
    }
    let mut reason = match (device, all.len()) {
        (Some(_), _) => Some(DeviceReason::Asked),
        (None, 1) => Some(DeviceReason::Only),
        (None, 0) => None,
        (None, _) => Some(DeviceReason::Oom),
    };
    if analyses.is_empty() {
        // No oom entry: the final state of the device the question is about (the one a
        // message names, else the one every command picks: an OOM, else the largest peak).
        let named = devices
            .iter()
            .copied()
            .find(|d| messages.iter().any(|m| m.gpu == Some(*d)));
        let d = match named {
            Some(d) => Some(d),
            None if device.is_some() || devices.len() <= 1 => devices.first().copied(),
            None => choice.as_ref().map(|c| {
                reason = Some(c.reason);
                c.device
            }),
        };
        if let Some(d) = d {
            let r = DeviceReplay::new(snap, d);
            let given = prepared.as_ref().and_then(|p| p.attr_for(d));
            let own = given.is_none().then(|| bound_attributor(&r, attribution));
            let attr = given
                .or(own.as_ref())
                .expect("an attributor, given or made");
            let message = message_for(&messages, d);
            let known = Known {
                source: Source::FinalState,
                requested: message.and_then(|m| m.requested_bytes),
                stream: 0,
                stack: None,
                free: message.and_then(|m| m.free_bytes),
                total: device_total(options, &messages, d),
                allowed: message.and_then(|m| m.allowed_bytes),
                this_process: message_about(&messages, d).and_then(|m| m.this_process_bytes),
                message_line: message.map(|m| m.line),
            };
            let at = r.len().checked_sub(1);
            let collected = prepared.as_mut().and_then(|p| p.take(d, at));
            analyses.push(analyze_at(snap, &r, attr, at, known, settings, collected));
        }
    }
    OomReport {
        schema_version: SCHEMA_VERSION,
        path: Some(path.to_string()),
        device_peaks: choice.map(|c| c.peaks).unwrap_or_default(),
        devices: all,
        device_reason: reason,
        analyses,
        more_oom_events: more,
        messages,
        sharding_file: sharding_file(snap),
    }
}

/// Each recorded OOM of `device` with its what-ifs, and its verdicts again in their
/// light (a setting they show does not let the request through is not offered).
/// (`checked`: the device's recording checked already, else it is prepared and checked
/// here).
fn attach_what_ifs(
    snap: &Snapshot,
    device: i64,
    settings: Settings,
    checked: Option<&CheckedRun>,
    analyses: &mut [OomAnalysis],
) {
    use crate::analysis::what_if::oom_what_if::{what_ifs, what_ifs_of};
    // The OOMs analysed are the first MAX_ANALYSES of the device.
    let found = match checked {
        Some(c) => what_ifs_of(&c.prepared, &c.identity, MAX_ANALYSES),
        None => what_ifs(snap, device, MAX_ANALYSES),
    };
    for a in analyses
        .iter_mut()
        .filter(|a| a.device == device && a.source == Source::OomEvent)
    {
        let Some(w) = found
            .iter()
            .find(|(e, _)| Some(*e) == a.event)
            .map(|(_, w)| w.clone())
        else {
            continue;
        };
        a.what_if = Some(w);
        judge(a, settings);
    }
}

/// Analyses of OOM messages alone (no snapshot): the figures each prints, and verdicts
/// from them. The snapshot's settings are unknown, so every knob that applies is given.
///
/// The first [`MAX_ANALYSES`] distinct messages are analysed; the others are counted in
/// `more_oom_events` by GPU (with their repeats), as oom entries past that are.
pub fn analyze_messages(messages: Vec<OomMessage>, options: OomOptions) -> OomReport {
    let mut more: BTreeMap<i64, usize> = BTreeMap::new();
    for m in messages.iter().skip(MAX_ANALYSES) {
        *more.entry(m.gpu.unwrap_or(0)).or_insert(0) += m.count as usize;
    }
    let analyses = messages
        .iter()
        .take(MAX_ANALYSES)
        .map(|m| {
            let reserved = m.reserved_by_pytorch_bytes.unwrap_or(0);
            let allocated = m.allocated_by_pytorch_bytes.unwrap_or(0);
            let mut a = OomAnalysis {
                oom_recorded: true,
                requested_bytes: m.requested_bytes,
                device_free_bytes: m.free_bytes,
                device_total_bytes: options.device_total_bytes.or(m.total_capacity_bytes),
                device_total_source: if options.device_total_bytes.is_some() {
                    Some("option")
                } else {
                    m.total_capacity_bytes.map(|_| "message")
                },
                message_line: Some(m.line),
                allowed_bytes: m.allowed_bytes,
                this_process_bytes: m.this_process_bytes,
                reserved_bytes: reserved,
                allocated_bytes: allocated,
                cached_free_bytes: reserved.saturating_sub(allocated),
                ..OomAnalysis::blank(m.gpu.unwrap_or(0), Source::Message)
            };
            derive(&mut a);
            judge(&mut a, Settings::default());
            a
        })
        .collect();
    OomReport {
        schema_version: SCHEMA_VERSION,
        path: None,
        devices: Vec::new(),
        device_peaks: Vec::new(),
        device_reason: None,
        analyses,
        more_oom_events: more,
        messages,
        sharding_file: None,
    }
}

/// Group keys of the call sites a leak verdict names (for tests and reports).
pub fn leak_sites(a: &OomAnalysis) -> Vec<&str> {
    a.verdicts
        .iter()
        .filter(|v| v.cause == Cause::Leak)
        .flat_map(|v| v.sites.iter().map(String::as_str))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// The figures of a snapshot's OOM, derived as `analyze_at` does.
    fn figures(
        request: u64,
        free: u64,
        total: u64,
        reserved: u64,
        allocated: u64,
        pending: u64,
        hole: u64,
    ) -> OomAnalysis {
        let mut a = OomAnalysis {
            event: Some(9),
            oom_recorded: true,
            requested_bytes: Some(request),
            device_free_bytes: Some(free),
            device_total_bytes: Some(total),
            device_total_source: Some("option"),
            reserved_bytes: reserved,
            requested_live_bytes: Some(allocated),
            allocated_bytes: allocated,
            cached_free_bytes: reserved - allocated,
            rounding_waste_bytes: Some(0),
            pending_free_bytes: Some(pending),
            largest_hole_bytes: Some(hole),
            largest_hole_same_stream_bytes: Some(hole),
            ..OomAnalysis::blank(0, Source::OomEvent)
        };
        derive(&mut a);
        judge(&mut a, Settings::default());
        a
    }

    fn summary(a: &OomAnalysis) -> Vec<(Cause, Role, Option<f64>)> {
        a.verdicts
            .iter()
            .map(|v| (v.cause, v.role, v.share_of_deficit))
            .collect()
    }

    #[test]
    fn contributing_causes_split_the_deficit_in_order() {
        // 80 GiB device: 70 GiB reserved, all live; 6 GiB pending frees inside it; 1 GiB
        // free; 9 GiB outside. A 10 GiB request lacks 9 GiB (70 + 10 − 71).
        let a = figures(10 * GIB, GIB, 80 * GIB, 70 * GIB, 70 * GIB, 6 * GIB, 0);
        assert_eq!(a.outside_allocator_bytes, Some(9 * GIB));
        assert_eq!(a.deficit_bytes, Some(9 * GIB));
        // Outside memory is 11% of the device and covers the deficit alone: primary.
        assert_eq!(
            summary(&a),
            [(Cause::OutsideAllocator, Role::Primary, Some(1.0))]
        );
        // 4 GiB outside (5% of the device, as usual for a process): no cause alone covers
        // the 9 GiB; pending frees take 6/9, outside memory the remaining 3/9.
        let a = figures(10 * GIB, GIB, 75 * GIB, 70 * GIB, 70 * GIB, 6 * GIB, 0);
        assert_eq!(a.outside_allocator_bytes, Some(4 * GIB));
        assert_eq!(
            summary(&a),
            [
                (Cause::Capacity, Role::Primary, None),
                (Cause::PendingFrees, Role::Contributing, Some(0.6667)),
                (Cause::OutsideAllocator, Role::Contributing, Some(0.3333)),
            ]
        );
        // With no hole to speak of, the allocator's settings cannot help.
        assert!(a.verdicts[0].knobs.contains(&Knob::CachedMemoryCannotHelp));
        // Smaller parts: each its own share (3/9, then 4/9 as the rounded running total
        // 7/9 = 0.7778 less 0.3333), adding up to less than 1.
        let a = figures(10 * GIB, GIB, 75 * GIB, 70 * GIB, 70 * GIB, 3 * GIB, 0);
        assert_eq!(
            summary(&a),
            [
                (Cause::Capacity, Role::Primary, None),
                (Cause::PendingFrees, Role::Contributing, Some(0.3333)),
                (Cause::OutsideAllocator, Role::Contributing, Some(0.4445)),
            ]
        );
        // A cause under 10% of the deficit is left out: 512 MiB of 9 GiB.
        let a = figures(10 * GIB, GIB, 75 * GIB, 70 * GIB, 70 * GIB, 512 * MIB, 0);
        assert_eq!(
            summary(&a),
            [
                (Cause::Capacity, Role::Primary, None),
                (Cause::OutsideAllocator, Role::Contributing, Some(0.4444)),
            ]
        );
    }

    #[test]
    fn shares_never_add_up_to_more_than_one() {
        // Three parts of a third each round to 0.3333 + 0.3334 + 0.3333.
        let parts = [1u64, 1, 1];
        let mut from = 0;
        let mut sum = 0.0;
        for p in parts {
            sum += share_between(from, p, 3);
            from += p;
        }
        assert_eq!((sum * 10_000.0f64).round(), 10_000.0);
        assert_eq!(share_between(0, 2, 3), 0.6667);
        assert_eq!(share_between(2, 1, 3), 0.3333);
        assert_eq!(share(5, 3), 1.0);
    }

    #[test]
    fn holes_that_would_hold_the_request_are_the_cause_and_settings_can_help() {
        // 38 GiB reserved, 37.2 GiB live (800 MiB in holes of at most 112 MiB), 3.8 GiB
        // free: a 3.9 GiB request fits in total but lacks ~102 MiB of one free range.
        let reserved = 38 * GIB;
        let allocated = reserved - 800 * MIB;
        let free = 3 * GIB + 819 * MIB;
        let request = 3 * GIB + 921 * MIB;
        let a = figures(request, free, 48 * GIB, reserved, allocated, 0, 112 * MIB);
        assert_eq!(a.shortfall_bytes, Some(0));
        assert_eq!(a.shortfall_in, Some(OomCause::Fragmentation));
        // 6.2 GiB outside the allocator is no cause: the memory was there.
        assert_eq!(a.outside_allocator_bytes, Some(6 * GIB + 205 * MIB));
        assert_eq!(a.deficit_bytes, Some(102 * MIB));
        assert_eq!(summary(&a), [(Cause::Fragmentation, Role::Primary, None)]);
        // Without a replay, every setting that is off (unverified), then what reduces
        // live memory; never that settings cannot help.
        let k = &a.verdicts[0].knobs;
        assert_eq!(k[0], Knob::ExpandableSegments);
        assert!(k.contains(&Knob::SmallerBatch));
        assert!(!k.contains(&Knob::CachedMemoryCannotHelp));
        // With 20 MiB in holes the request does not fit even in total (short by 82 MiB):
        // holes are no cause, and no setting can help.
        let total = reserved + free + 512 * MIB;
        let a = figures(
            request,
            free,
            total,
            reserved,
            reserved - 20 * MIB,
            0,
            8 * MIB,
        );
        assert_eq!(a.shortfall_bytes, Some(82 * MIB));
        assert_eq!(a.shortfall_in, Some(OomCause::Capacity));
        assert_eq!(summary(&a), [(Cause::Capacity, Role::Primary, None)]);
        assert!(a.verdicts[0].knobs.contains(&Knob::CachedMemoryCannotHelp));
    }

    #[test]
    fn a_request_smaller_than_the_segment_asked_for_it_is_rounding() {
        // Nothing cached (reserved = live), 10 MiB free on the device: a 1.3 MB request
        // fits there, but the allocator asks for a 20 MiB segment for it (spec 1.3:
        // requests of 1-10 MiB get a whole large segment). Not fragmentation (no hole),
        // not capacity (the request itself fit), not a cap (the device had less free
        // than the segment).
        let request = 1_300_480;
        let reserved = 30 * GIB;
        let a = figures(request, 10 * MIB, 32 * GIB, reserved, reserved, 0, 0);
        assert_eq!(a.shortfall_bytes, Some(0));
        assert_eq!(a.shortfall_in, Some(OomCause::Rounding));
        assert_eq!(a.device_ask_bytes, Some(20 * MIB));
        assert_eq!(summary(&a), [(Cause::Rounding, Role::Primary, None)]);
        // Expandable pages ask the device for less: the one setting offered.
        assert_eq!(a.verdicts[0].knobs[0], Knob::ExpandableSegments);
        // With 20 MiB free the device had room for the segment: a limit refused it.
        let a = figures(request, 20 * MIB, 32 * GIB, reserved, reserved, 0, 0);
        assert_eq!(summary(&a)[0].0, Cause::MemoryFractionCap);
    }

    #[test]
    fn where_a_request_fell_short_is_one_rule() {
        use crate::allocator::scenario::OomCause as C;
        // (live, request, reserved, limit, free in private pools)
        assert_eq!(C::of(90, 20, 100, 105, 0), C::Capacity);
        assert_eq!(C::of(80, 20, 100, 105, 0), C::Fragmentation);
        assert_eq!(C::of(80, 5, 100, 105, 0), C::Rounding);
        assert_eq!(C::of(80, 25, 100, 105, 0), C::Fragmentation);
        assert_eq!(C::of(80, 26, 100, 105, 0), C::Capacity);
        // 20 free in segments, 5 on the device: a 20 request fits in the default
        // pools' 20 unless 16 of it are a graph's (4 + 5 < 20): the graph pools.
        assert_eq!(C::of(80, 20, 100, 105, 16), C::PrivatePools);
        assert_eq!(C::of(80, 20, 100, 105, 5), C::Fragmentation);
        // Private bytes do not make a capacity shortfall another cause.
        assert_eq!(C::of(90, 20, 100, 105, 10), C::Capacity);
    }
}
