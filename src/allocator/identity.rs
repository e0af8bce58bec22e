//! The identity replay: the recorded requests, with the recorded settings, compared with
//! the recording event by event (spec 4.4, check 2, and section 5).
//!
//! Takes a snapshot and a device; gives [`Identity`]: how many allocations the model put
//! at their recorded address, how many `segment_*` entries it reproduced, whether it ran
//! out of memory where the recording did, and the first divergence. Every answer that
//! uses the model says this first.
//!
//! What the file does not record is taken from it as the spec's section 5 does: the
//! state at the first event ([`super::start`]); where `cudaMalloc` failed (a call whose
//! recording shows segment releases before its new segment, or an `oom`, took the
//! out-of-memory retry: the device here answers as the recording shows); the
//! `empty_cache` calls ([`super::requests`]); and the addresses of new segments, taken
//! from the recording. After a divergence the model is put back in step where it can be
//! (an allocation moved to its recorded address) and the counts go on.
//!
//! The same replay is the scenario with the recorded settings and no limit while the two
//! are one ([`check_sharing`]); a long recording is checked in two halves at once, the
//! second from the state rebuilt at the cut ([`super::midway`]), kept only where that is
//! the state the first half ends in ([`check_split_at`]).

use super::device::{AddressSpace, CapacityDevice};
use super::midway;
use super::model::{Allocator, BlockId, Device, ModelEvent, StateView};
use super::prepared::{OomCapacity, Prepared};
use super::requests::{Recorded, Request};
use super::scenario::{Outcome, Search, Track};
use super::settings::Profile;
use crate::model::{Action, Snapshot};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};

/// The device of an identity replay: `cudaMalloc` and page mappings succeed where the
/// recording shows them, at the recorded addresses, once the model has released what
/// the recording released before them.
struct Recording<'a> {
    outputs: &'a [Recorded],
    /// The next output not yet consumed by a growth.
    next: usize,
    /// Releases among the outputs before `next`.
    releases_before_next: usize,
    ends_in_oom: bool,
    /// Addresses for growth the recording does not show (a divergence).
    spare: AddressSpace,
    /// The most the allocator asked to hold (reserved + the new memory) in the call.
    need: u64,
}

impl Recording<'_> {
    /// The next recorded growth of `action` the model may take now, and its index.
    fn grow(&mut self, action: Action, released: usize) -> Option<Option<usize>> {
        // Releases before the next recorded growth of `action`, counted from those before
        // `next` (each output is walked once per call it is passed in, not once per
        // growth).
        let mut before = self.releases_before_next;
        let mut j = self.next;
        while j < self.outputs.len() && self.outputs[j].action != action {
            before += usize::from(self.outputs[j].releases());
            j += 1;
        }
        if j < self.outputs.len() {
            if released >= before {
                self.next = j + 1;
                self.releases_before_next = before;
                Some(Some(j))
            } else {
                None
            }
        } else if self.ends_in_oom || released < before {
            None
        } else {
            Some(None)
        }
    }

    fn spare(&mut self, size: u64) -> u64 {
        self.spare.take(size)
    }
}

impl Device for Recording<'_> {
    fn cuda_malloc(&mut self, size: u64, reserved: u64, released: usize) -> Option<u64> {
        self.need = self.need.max(reserved.saturating_add(size));
        match self.grow(Action::SegmentAlloc, released)? {
            Some(j) => Some(self.outputs[j].addr),
            None => Some(self.spare(size)),
        }
    }

    fn map(&mut self, _addr: u64, size: u64, reserved: u64, released: usize) -> bool {
        self.need = self.need.max(reserved.saturating_add(size));
        self.grow(Action::SegmentMap, released).is_some()
    }

    fn reserve(&mut self, size: u64) -> u64 {
        match (self.next..self.outputs.len())
            .find(|&j| self.outputs[j].action == Action::SegmentMap)
        {
            Some(j) => self.outputs[j].addr,
            None => self.spare(size),
        }
    }
}

/// A `segment_*` entry, as the model made it or as the recording shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentEntry {
    pub action: &'static str,
    pub addr: u64,
    pub size_bytes: u64,
}

impl SegmentEntry {
    fn of_model(e: &ModelEvent) -> Option<SegmentEntry> {
        let (action, addr, size) = match *e {
            ModelEvent::SegmentAlloc { addr, size, .. } => ("segment_alloc", addr, size),
            ModelEvent::SegmentFree { addr, size, .. } => ("segment_free", addr, size),
            ModelEvent::SegmentMap { addr, size, .. } => ("segment_map", addr, size),
            ModelEvent::SegmentUnmap { addr, size, .. } => ("segment_unmap", addr, size),
            ModelEvent::FreeCompleted { .. } => return None,
        };
        Some(SegmentEntry {
            action,
            addr,
            size_bytes: size,
        })
    }

    fn of_recorded(r: &Recorded) -> SegmentEntry {
        SegmentEntry {
            action: r.action.name(),
            addr: r.addr,
            size_bytes: r.size,
        }
    }
}

/// Where the model first did something else than the recording.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// The trace entry of the call (its `alloc`, `oom`, or first entry of an
    /// `empty_cache`).
    pub event: u32,
    pub kind: DivergenceKind,
    /// The request's size, for allocations and OOMs.
    pub request_bytes: Option<u64>,
    pub stream: Option<u64>,
    /// The address the model chose and the recorded one (allocations).
    pub model_addr: Option<u64>,
    pub recorded_addr: Option<u64>,
    /// The segment entries of the call, as the model made them and as recorded.
    pub model_segments: Vec<SegmentEntry>,
    pub recorded_segments: Vec<SegmentEntry>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceKind {
    /// An allocation at another address.
    Address,
    /// Other segment entries than the recorded ones.
    Segments,
    /// The model ran out of memory where the recording allocated.
    ModelOom,
    /// The model allocated where the recording ran out of memory.
    MissedOom,
}

/// How well the model reproduced a recording.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Identity {
    pub profile: Profile,
    pub allocations: u64,
    pub allocations_at_recorded_address: u64,
    /// `segment_*` entries recorded, reproduced (same action, address and size in the
    /// same call), and made by the model without a recorded match.
    pub segment_events: u64,
    pub segment_events_reproduced: u64,
    pub segment_events_extra: u64,
    pub ooms: u64,
    pub ooms_reproduced: u64,
    /// Inferred `empty_cache` calls and calls that took the out-of-memory retry.
    pub empty_cache_calls: u64,
    pub retry_calls: u64,
    /// Calls that diverged.
    pub divergences: u64,
    pub first_divergence: Option<Divergence>,
    pub peak_reserved_bytes: u64,
    pub recorded_peak_reserved_bytes: u64,
    /// The most bytes the live tensors asked for at once over the replay (the recording
    /// put back in step after each departure, so the recording's own): what no setting
    /// can pack below.
    pub peak_requested_bytes: u64,
    pub final_reserved_bytes: u64,
    pub recorded_final_reserved_bytes: u64,
    /// Final segments of the snapshot, and how many the model ends with exactly (same
    /// address, size and blocks).
    pub final_segments: u64,
    pub final_segments_equal: u64,
    /// The snapshot's final state is later than the trace's end: allocations the trace
    /// leaves alive are not in it (freed after recording stopped), so the final
    /// segments cannot be compared.
    pub final_state_later: bool,
    pub start_blocks: u64,
    pub start_blocks_inferred: u64,
    pub start_reserved_bytes: u64,
    pub oom_capacities: Vec<OomCapacity>,
}

impl Identity {
    /// Every allocation at its address, every segment entry reproduced and no other,
    /// every OOM where it was.
    pub fn exact(&self) -> bool {
        self.divergences == 0
            && self.allocations == self.allocations_at_recorded_address
            && self.segment_events == self.segment_events_reproduced
            && self.segment_events_extra == 0
            && self.ooms == self.ooms_reproduced
    }
}

impl Identity {
    /// Nothing counted yet, for a check of `p` starting with `a`.
    fn at_start(p: &Prepared, a: &Allocator) -> Identity {
        Identity {
            profile: p.profile,
            allocations: 0,
            allocations_at_recorded_address: 0,
            segment_events: p.requests.outputs.len() as u64,
            segment_events_reproduced: 0,
            segment_events_extra: 0,
            ooms: 0,
            ooms_reproduced: 0,
            empty_cache_calls: 0,
            retry_calls: 0,
            divergences: 0,
            first_divergence: None,
            peak_reserved_bytes: a.reserved(),
            recorded_peak_reserved_bytes: p.start.reserved,
            peak_requested_bytes: a.requested(),
            final_reserved_bytes: 0,
            recorded_final_reserved_bytes: 0,
            final_segments: 0,
            final_segments_equal: 0,
            final_state_later: false,
            start_blocks: p.start.blocks,
            start_blocks_inferred: p.start.blocks_inferred,
            start_reserved_bytes: p.start.reserved,
            oom_capacities: Vec::new(),
        }
    }

    /// The counts of a check of some requests, then those of `later`, a check of the
    /// requests after them.
    fn add_later(&mut self, later: Identity) {
        self.allocations += later.allocations;
        self.allocations_at_recorded_address += later.allocations_at_recorded_address;
        self.segment_events_reproduced += later.segment_events_reproduced;
        self.segment_events_extra += later.segment_events_extra;
        self.ooms += later.ooms;
        self.ooms_reproduced += later.ooms_reproduced;
        self.empty_cache_calls += later.empty_cache_calls;
        self.retry_calls += later.retry_calls;
        self.divergences += later.divergences;
        if self.first_divergence.is_none() {
            self.first_divergence = later.first_divergence;
        }
        self.peak_reserved_bytes = self.peak_reserved_bytes.max(later.peak_reserved_bytes);
        self.recorded_peak_reserved_bytes = self
            .recorded_peak_reserved_bytes
            .max(later.recorded_peak_reserved_bytes);
        self.peak_requested_bytes = self.peak_requested_bytes.max(later.peak_requested_bytes);
    }
}

/// Replays `p` against its recording; `snap` gives the final segments to compare.
pub fn check(snap: &Snapshot, p: &Prepared) -> Identity {
    check_until(snap, p, false, None, split_point(p)).identity
}

/// Whether the model reproduces `p`'s recording exactly ([`Identity::exact`]): the
/// check, stopped at its first divergence where only that is asked.
pub fn reproduces(snap: &Snapshot, p: &Prepared) -> bool {
    check_until(snap, p, true, None, None).identity.exact()
}

/// Where the identity check's replay stops being the scenario with the recorded settings
/// and no limit: the scenario's track so far, and the request from which it goes on
/// alone ([`Track::resume`]).
pub struct Parting {
    pub track: Track,
    pub at: usize,
}

/// [`check`], and from the same replay the scenario with the recorded settings and no
/// limit ([`super::scenario::unlimited`], with what a search needs where `keep_search`):
/// the two are one replay up to the first request where the check departs from the
/// recording, or where the recording's device refused memory (an OOM, or a call that took
/// the out-of-memory retry), which a device with no limit would have given. `part` is
/// told where that is, and the scenario goes on from there in its own replay; the
/// scenario's answer comes back here when they never part. `split`: where the check is
/// cut in two halves replayed at once ([`split_point`]; None: in one piece).
pub fn check_sharing(
    snap: &Snapshot,
    p: &Prepared,
    keep_search: bool,
    part: &(dyn Fn(Parting) + Sync),
    split: Option<usize>,
) -> Checked {
    check_sharing_with(snap, p, keep_search, part, split, false)
}

/// [`check_sharing`] stopped at the check's first departure from the recording (where
/// only [`Identity::exact`] is asked: the scenario goes on alone from there), in one
/// piece.
pub fn check_sharing_until_departure(
    snap: &Snapshot,
    p: &Prepared,
    part: &(dyn Fn(Parting) + Sync),
) -> Checked {
    check_sharing_with(snap, p, false, part, None, true)
}

fn check_sharing_with(
    snap: &Snapshot,
    p: &Prepared,
    keep_search: bool,
    part: &(dyn Fn(Parting) + Sync),
    split: Option<usize>,
    stop_at_divergence: bool,
) -> Checked {
    if p.total_memory.is_some() {
        // The scenario knows no total memory: another allocator.
        part(Parting {
            track: Track::new_at_start(p, keep_search, true),
            at: 0,
        });
        return check_until(snap, p, stop_at_divergence, None, split);
    }
    check_until(
        snap,
        p,
        stop_at_divergence,
        Some(Shared {
            track: Track::new_at_start(p, keep_search, true),
            part: Some(part),
        }),
        split,
    )
}

/// What a check gives.
pub struct Checked {
    pub identity: Identity,
    /// The scenario with the recorded settings and no limit, where it never parted from
    /// the check ([`check_sharing`]).
    pub scenario: Option<(Outcome, Option<Search>)>,
    /// The check was made in two halves at once: the state rebuilt where the second
    /// starts was the one the first ended in.
    pub halves: bool,
}

/// [`check`] cut at request `m`: the requests from `m` on are replayed at the same time as
/// those before it, from the state rebuilt at `m` ([`midway`]), and kept where that is
/// the state the first half ends in (else replayed again after it). The same answer as
/// [`check`] (which cuts long recordings by itself, [`split_point`]).
pub fn check_split_at(snap: &Snapshot, p: &Prepared, m: usize) -> Checked {
    check_until(snap, p, false, None, Some(m))
}

/// Recordings with at least this many requests are checked in two halves at once where
/// more than one thread can run them.
const HALVES_MIN: usize = 1 << 20;

/// Where a check of `p` is cut in two halves replayed at once, if it is.
pub fn split_point(p: &Prepared) -> Option<usize> {
    let n = p.requests.len();
    if n < HALVES_MIN || rayon::current_num_threads() < 2 || !midway::can_rebuild(p) {
        return None;
    }
    // The second half also rebuilds the state at the cut, at about a sixth of the cost of
    // checking as many requests: the cut sits past the middle to even them out.
    Some(n / 100 * 54)
}

/// The scenario a check's replay makes as it goes ([`check_sharing`]).
struct Shared<'f> {
    track: Track,
    /// Told where the scenario parts from the check (None: the parting is held in the
    /// check's state, for a check of later requests whose earlier ones run elsewhere).
    part: Option<&'f (dyn Fn(Parting) + Sync)>,
}

/// The check; with `stop_at_divergence`, it ends at the first divergence, its counts
/// then partial (only [`Identity::exact`] is meant to be read); with `shared`, it makes
/// that scenario too while the two are one.
fn check_until(
    snap: &Snapshot,
    p: &Prepared,
    stop_at_divergence: bool,
    mut shared: Option<Shared>,
    split: Option<usize>,
) -> Checked {
    let mut a = Allocator::new(p.settings.clone(), p.profile, p.total_memory);
    let mut by_tag: Vec<Option<BlockId>> = vec![None; p.requests.tags as usize];
    for (tag, id) in p.start.restore(&mut a) {
        by_tag[tag as usize] = Some(id);
    }
    if let Some(s) = &mut shared {
        s.track.begin(&a);
    }
    let spare_base =
        AddressSpace::starting_at(p.low_address(), p.top_address().saturating_add(1 << 40));
    let id = Identity::at_start(p, &a);
    let recorded_reserved = p.start.reserved as i128;
    let spare = spare_base;
    let trace = snap.trace(p.device).expect("a prepared device has a trace");
    let mut st = CheckState {
        a,
        by_tag,
        spare,
        recorded_reserved,
        id,
        held: None,
    };
    let n = p.requests.len();
    let split = split.filter(|&m| !stop_at_divergence && m > 0 && m < n);
    let mut halves = false;
    match split {
        Some(m) => {
            let track = shared.as_ref().map(|s| s.track.keeps_all());
            let departed = AtomicBool::new(false);
            let (_, later) = rayon::join(
                || {
                    check_requests(
                        p,
                        trace,
                        (0, m),
                        Stop::Tell(&departed),
                        &mut st,
                        &mut shared,
                    )
                },
                || check_later(p, trace, m, spare_base, track, &departed),
            );
            let verified = later.filter(|l| {
                st.spare == spare_base && !st.a.has_events() && st.a.state_view() == l.view_at_start
            });
            match verified {
                Some(l) => {
                    join_halves(&mut st, &mut shared, l);
                    halves = true;
                }
                None => {
                    check_requests(p, trace, (m, n), Stop::Never, &mut st, &mut shared);
                }
            }
        }
        None => {
            let stop = if stop_at_divergence {
                Stop::AtDivergence
            } else {
                Stop::Never
            };
            check_requests(p, trace, (0, n), stop, &mut st, &mut shared);
        }
    }
    let CheckState {
        a,
        recorded_reserved,
        mut id,
        ..
    } = st;
    if stop_at_divergence && id.divergences > 0 {
        return Checked {
            identity: id,
            scenario: None,
            halves,
        };
    }
    let scenario = shared.map(|s| {
        let (out, search) = s.track.finish(&a);
        super::scenario::searchable(out, search)
    });
    id.oom_capacities = p.oom_capacities();
    id.final_reserved_bytes = a.reserved();
    id.recorded_final_reserved_bytes = recorded_reserved.max(0) as u64;
    let active: std::collections::BTreeSet<u64> = snap
        .segments_of(p.device)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state.is_active())
        .map(|b| b.address)
        .collect();
    id.final_state_later = p
        .requests
        .alive_at_end
        .keys()
        .any(|addr| !active.contains(addr));
    let model_final = a.segments();
    for s in snap.segments_of(p.device) {
        id.final_segments += 1;
        let equal = model_final
            .binary_search_by_key(&s.address, |m| m.addr)
            .ok()
            .map(|k| &model_final[k])
            .is_some_and(|m| {
                m.size == s.total_size
                    && m.blocks.len() == s.blocks.len()
                    && m.blocks.iter().zip(&s.blocks).all(|(mb, sb)| {
                        mb.0 == sb.address && mb.1 == sb.size && mb.2 == sb.state.is_active()
                    })
            });
        if equal {
            id.final_segments_equal += 1;
        }
    }
    Checked {
        identity: id,
        scenario,
        halves,
    }
}

/// A check's state between requests.
struct CheckState {
    a: Allocator,
    by_tag: Vec<Option<BlockId>>,
    /// Where the next segment the recording does not show goes.
    spare: AddressSpace,
    /// The recording's reserved bytes so far.
    recorded_reserved: i128,
    id: Identity,
    /// Where the scenario parted from the check, when no one was there to be told.
    held: Option<Parting>,
}

/// The check of the requests from `m` on, from the state rebuilt there ([`midway`]),
/// with the scenario's track of them; and that state's view, to compare with the state
/// the check of the requests before `m` ends in.
struct Later {
    st: CheckState,
    track: Option<Track>,
    view_at_start: StateView,
}

fn check_later(
    p: &Prepared,
    trace: &crate::model::DeviceTrace,
    m: usize,
    spare: AddressSpace,
    track: Option<bool>,
    departed: &AtomicBool,
) -> Option<Later> {
    let midway::Midway { a, by_tag } = midway::state_at(p, trace, m)?;
    let view_at_start = a.state_view();
    // The recording's reserved bytes at the cut, and their peak before it, as the check
    // of the requests before it counts them.
    let mut id = Identity::at_start(p, &a);
    let before = &p.requests.outputs[..p.requests.outputs_before(m)];
    let recorded_reserved = reserved_after(p.start.reserved as i128, before, &mut id);
    // The scenario's track of these requests, where the check makes one (keeping every
    // saved state, or the latest).
    let mut shared = track.map(|keep_all| {
        let mut track = Track::new_at_start(p, keep_all, true);
        track.begin(&a);
        Shared { track, part: None }
    });
    let mut st = CheckState {
        a,
        by_tag,
        spare,
        recorded_reserved,
        id,
        held: None,
    };
    let n = p.requests.len();
    if !check_requests(
        p,
        trace,
        (m, n),
        Stop::WhenTold(departed),
        &mut st,
        &mut shared,
    ) {
        return None;
    }
    let track = shared.map(|s| s.track);
    Some(Later {
        st,
        track,
        view_at_start,
    })
}

/// The check of the requests before `m` (`st`, `shared`) followed by `later`'s of the
/// rest, which started from the state the first ends in.
fn join_halves(st: &mut CheckState, shared: &mut Option<Shared>, later: Later) {
    let Later {
        st: l,
        track: later_track,
        ..
    } = later;
    let first_a = std::mem::replace(&mut st.a, l.a);
    st.by_tag = l.by_tag;
    st.spare = l.spare;
    st.recorded_reserved = l.recorded_reserved;
    st.id.add_later(l.id);
    // The scenario: parted in the first half (told then), or its track goes on with the
    // later one's, to the end or to where that one parted.
    if let Some(s) = shared.take() {
        match (later_track, l.held) {
            (Some(t), _) => {
                *shared = Some(Shared {
                    track: s.track.append(&first_a, t),
                    part: s.part,
                });
            }
            (None, Some(parting)) => {
                let whole = Parting {
                    track: s.track.append(&first_a, parting.track),
                    at: parting.at,
                };
                match s.part {
                    Some(part) => part(whole),
                    None => st.held = Some(whole),
                }
            }
            (None, None) => unreachable!("a track ends or parts"),
        }
    }
}

/// When a check of some requests ends before the last.
#[derive(Clone, Copy)]
enum Stop<'f> {
    Never,
    /// At its first divergence.
    AtDivergence,
    /// Never; its first divergence raises the flag (the state it ends in is then unlikely
    /// to be the one rebuilt for the half after it, which gives up).
    Tell(&'f AtomicBool),
    /// When the flag is raised.
    WhenTold(&'f AtomicBool),
}

/// The requests `[from, to)` of a check (see [`check_until`]); false where it stopped at a
/// divergence.
#[allow(clippy::too_many_arguments)]
fn check_requests(
    p: &Prepared,
    trace: &crate::model::DeviceTrace,
    (from, to): (usize, usize),
    stop: Stop,
    st: &mut CheckState,
    shared: &mut Option<Shared>,
) -> bool {
    let CheckState {
        a,
        by_tag,
        spare,
        recorded_reserved,
        id,
        held,
    } = st;
    // Parts the scenario from the check at request `i`.
    let mut part = |shared: &mut Option<Shared>, i: usize| {
        if let Some(s) = shared.take() {
            let parting = Parting {
                track: s.track,
                at: i,
            };
            match s.part {
                Some(part) => part(parting),
                None => *held = Some(parting),
            }
        }
    };
    for (i, item) in p.requests.iter_from(from).enumerate().take(to - from) {
        let i = from + i;
        if let Some(s) = shared.as_mut() {
            let refused = match &item {
                Request::Oom { .. } => true,
                Request::Alloc { outputs, .. } => took_retry(p.requests.outputs_of(outputs)),
                _ => false,
            };
            if refused {
                part(shared, i);
            } else {
                s.track.before_check(i, a);
            }
        }
        let (reserved_before, divergences_before) = (a.reserved(), id.divergences);
        let mut need = 0;
        match &item {
            Request::Alloc {
                tag,
                size,
                stream,
                pool,
                event,
                outputs,
            } => {
                let addr = &trace.addr(*event as usize);
                let outs = p.requests.outputs_of(outputs);
                if took_retry(outs) {
                    id.retry_calls += 1;
                }
                // A cached block elsewhere: the model would take it and make no segment
                // entry; the request goes straight to its recorded address (the state is
                // the one taking the block and giving it back leaves). A cached block at
                // the recorded address is taken as `malloc` would take it.
                let (r, made) = match a.cached_block(*size, *stream, *pool) {
                    Some(c) if c.addr != *addr => (Placed::Elsewhere(c), Vec::new()),
                    Some(c) => (
                        Placed::Model(Ok(a.malloc_cached(c, *size, *tag))),
                        Vec::new(),
                    ),
                    None => {
                        let mut dev = Recording {
                            outputs: outs,
                            next: 0,
                            releases_before_next: 0,
                            ends_in_oom: false,
                            spare: *spare,
                            need: 0,
                        };
                        let r = a.malloc(&mut dev, *size, *stream, *pool, *tag);
                        *spare = dev.spare;
                        need = dev.need;
                        (Placed::Model(r), drain(a, by_tag))
                    }
                };
                let segs_ok = compare(&made, outs, id);
                id.allocations += 1;
                let mut div = (!segs_ok).then_some(DivergenceKind::Segments);
                let mut model_addr = None;
                match r {
                    Placed::Elsewhere(c) => {
                        model_addr = Some(c.addr);
                        div = div.or(Some(DivergenceKind::Address));
                        // At the recorded address where the model has it free; else where
                        // the model would put it, the cached block it found (nothing has
                        // changed since but the search's tick of the GC clock).
                        let b = a
                            .malloc_moved_to(*addr, c, *size, *stream, *pool, *tag)
                            .unwrap_or_else(|| a.malloc_cached(c, *size, *tag));
                        by_tag[*tag as usize] = Some(b);
                    }
                    Placed::Model(Ok(b)) => {
                        model_addr = Some(a.block_addr(b));
                        if a.block_addr(b) == *addr {
                            id.allocations_at_recorded_address += 1;
                            by_tag[*tag as usize] = Some(b);
                        } else {
                            div = div.or(Some(DivergenceKind::Address));
                            // Back in step: the allocation where the recording put it.
                            a.free(b);
                            let moved = a.allocate_at(*addr, *size, *stream, *pool, *tag);
                            put_back(a, by_tag, spare, moved, (*size, *stream, *pool, *tag));
                        }
                    }
                    Placed::Model(Err(_)) => {
                        div = Some(DivergenceKind::ModelOom);
                        by_tag[*tag as usize] = a.allocate_at(*addr, *size, *stream, *pool, *tag);
                    }
                }
                if let Some(kind) = div {
                    diverged(
                        id,
                        *event,
                        kind,
                        Some(*size),
                        Some(*stream),
                        model_addr,
                        Some(*addr),
                        &made,
                        outs,
                    );
                }
                *recorded_reserved = reserved_after(*recorded_reserved, outs, id);
            }
            Request::Oom {
                size,
                stream,
                pool,
                event,
                outputs,
            } => {
                let outs = p.requests.outputs_of(outputs);
                id.ooms += 1;
                id.retry_calls += 1;
                let mut dev = Recording {
                    outputs: outs,
                    next: 0,
                    releases_before_next: 0,
                    ends_in_oom: true,
                    spare: *spare,
                    need: 0,
                };
                let r = a.malloc(&mut dev, *size, *stream, *pool, u32::MAX);
                *spare = dev.spare;
                let made = drain(a, by_tag);
                let segs_ok = compare(&made, outs, id);
                match r {
                    Err(_) => {
                        id.ooms_reproduced += 1;
                        if !segs_ok {
                            diverged(
                                id,
                                *event,
                                DivergenceKind::Segments,
                                Some(*size),
                                Some(*stream),
                                None,
                                None,
                                &made,
                                outs,
                            );
                        }
                    }
                    Ok(b) => {
                        let at = a.block_addr(b);
                        a.free(b);
                        diverged(
                            id,
                            *event,
                            DivergenceKind::MissedOom,
                            Some(*size),
                            Some(*stream),
                            Some(at),
                            None,
                            &made,
                            outs,
                        );
                    }
                }
                *recorded_reserved = reserved_after(*recorded_reserved, outs, id);
            }
            Request::EmptyCache { event, outputs } => {
                let outs = p.requests.outputs_of(outputs);
                id.empty_cache_calls += 1;
                a.empty_cache();
                let made = drain(a, by_tag);
                if !compare(&made, outs, id) {
                    diverged(
                        id,
                        *event,
                        DivergenceKind::Segments,
                        None,
                        None,
                        None,
                        None,
                        &made,
                        outs,
                    );
                }
                *recorded_reserved = reserved_after(*recorded_reserved, outs, id);
            }
            Request::FreeRequested { tag, .. } => {
                if let Some(b) = by_tag[*tag as usize] {
                    a.free_requested(b);
                }
            }
            Request::Free { tag, .. } => {
                if let Some(b) = by_tag[*tag as usize].take() {
                    a.free(b);
                }
            }
        }
        id.peak_reserved_bytes = id.peak_reserved_bytes.max(a.reserved());
        id.peak_requested_bytes = id.peak_requested_bytes.max(a.requested());
        if id.divergences > divergences_before {
            part(shared, i);
        } else if let Some(s) = shared.as_mut() {
            s.track.after(i, item.event(), reserved_before, a, need);
        }
        match stop {
            Stop::Never => {}
            Stop::AtDivergence if id.divergences > 0 => return false,
            Stop::Tell(flag) if id.divergences > 0 => flag.store(true, Ordering::Relaxed),
            Stop::WhenTold(flag) if i % 4096 == 0 && flag.load(Ordering::Relaxed) => return false,
            _ => {}
        }
    }
    true
}

/// What the model did with an allocation request.
enum Placed {
    /// Its `malloc`'s answer.
    Model(Result<BlockId, super::model::Oom>),
    /// It would have taken this cached block, not one at the recorded address.
    Elsewhere(super::model::Cached),
}

/// An allocation put back in step: its block at the recorded address (`moved`) or, where
/// that address is not free in the model, anywhere on a device with no limit.
fn put_back(
    a: &mut Allocator,
    by_tag: &mut [Option<BlockId>],
    spare: &mut AddressSpace,
    moved: Option<BlockId>,
    (size, stream, pool, tag): (u64, u64, (i64, i64), u32),
) {
    let b = moved.unwrap_or_else(|| {
        let mut dev = CapacityDevice::new(None, *spare);
        let b = a
            .malloc(&mut dev, size, stream, pool, tag)
            .expect("an unlimited device");
        *spare = dev.space;
        b
    });
    by_tag[tag as usize] = Some(b);
    drain(a, by_tag);
}

/// Whether a recorded call took the out-of-memory retry: segment releases before its
/// first new segment.
fn took_retry(outs: &[Recorded]) -> bool {
    outs.iter()
        .take_while(|o| !matches!(o.action, Action::SegmentAlloc | Action::SegmentMap))
        .any(Recorded::releases)
}

/// The model's segment entries of the call; pending frees it completed are marked done.
fn drain(a: &mut Allocator, by_tag: &mut [Option<BlockId>]) -> Vec<SegmentEntry> {
    let mut out = Vec::new();
    if !a.has_events() {
        return out;
    }
    for e in a.take_events() {
        if let ModelEvent::FreeCompleted { tag } = e {
            if let Some(slot) = by_tag.get_mut(tag as usize) {
                *slot = None;
            }
        } else if let Some(s) = SegmentEntry::of_model(&e) {
            out.push(s);
        }
    }
    out
}

/// Counts the call's reproduced and extra segment entries; whether they are the same
/// sequence.
fn compare(made: &[SegmentEntry], outs: &[Recorded], id: &mut Identity) -> bool {
    if made.is_empty() && outs.is_empty() {
        return true;
    }
    let recorded: Vec<SegmentEntry> = outs.iter().map(SegmentEntry::of_recorded).collect();
    let same = made == recorded.as_slice();
    // The entries in both, each counted as often as it is in both: the two lists sorted
    // and walked together (a release of thousands of segments at once stays n log n).
    let reproduced = if same {
        made.len() as u64
    } else {
        let key = |e: &SegmentEntry| (e.action, e.addr, e.size_bytes);
        let mut a: Vec<_> = made.iter().map(key).collect();
        let mut b: Vec<_> = recorded.iter().map(key).collect();
        a.sort_unstable();
        b.sort_unstable();
        let (mut i, mut j, mut n) = (0, 0, 0u64);
        while i < a.len() && j < b.len() {
            match a[i].cmp(&b[j]) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    n += 1;
                    i += 1;
                    j += 1;
                }
            }
        }
        n
    };
    id.segment_events_reproduced += reproduced;
    id.segment_events_extra += made.len() as u64 - reproduced;
    same
}

fn reserved_after(reserved: i128, outs: &[Recorded], id: &mut Identity) -> i128 {
    let mut r = reserved;
    for o in outs {
        match o.action {
            Action::SegmentAlloc | Action::SegmentMap => r += o.size as i128,
            Action::SegmentFree | Action::SegmentUnmap => r -= o.size as i128,
            _ => {}
        }
        id.recorded_peak_reserved_bytes = id.recorded_peak_reserved_bytes.max(r.max(0) as u64);
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn diverged(
    id: &mut Identity,
    event: u32,
    kind: DivergenceKind,
    request_bytes: Option<u64>,
    stream: Option<u64>,
    model_addr: Option<u64>,
    recorded_addr: Option<u64>,
    made: &[SegmentEntry],
    outs: &[Recorded],
) {
    id.divergences += 1;
    if id.first_divergence.is_none() {
        id.first_divergence = Some(Divergence {
            event,
            kind,
            request_bytes,
            stream,
            model_addr,
            recorded_addr,
            model_segments: made.to_vec(),
            recorded_segments: outs.iter().map(SegmentEntry::of_recorded).collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(addr: u64) -> Recorded {
        Recorded {
            action: Action::SegmentFree,
            addr,
            size: 2 << 20,
            stream: 0,
            event: 0,
        }
    }

    fn blank() -> Identity {
        let p = Prepared {
            device: 0,
            device_free: Vec::new(),
            total_memory: None,
            settings: super::super::Settings::default(),
            profile: Profile::V2_4,
            requests: super::super::requests::Requests::default(),
            start: super::super::start::StartState::default(),
        };
        Identity::at_start(&p, &Allocator::new(p.settings.clone(), p.profile, None))
    }

    /// The entries of a call counted as reproduced are those in both lists, each as
    /// often as it is in both, in any order: a release of 100,000 segments in the
    /// opposite order to the recording's (sorted and walked together, not searched one
    /// by one), and a list with one entry the recording lacks and one it has twice.
    #[test]
    fn segment_entries_in_both_lists_are_counted_in_any_order() {
        let n = 100_000u64;
        let outs: Vec<Recorded> = (0..n).map(|k| free(k << 22)).collect();
        let made: Vec<SegmentEntry> = outs.iter().rev().map(SegmentEntry::of_recorded).collect();
        let mut id = blank();
        assert!(!compare(&made, &outs, &mut id));
        assert_eq!(id.segment_events_reproduced, n);
        assert_eq!(id.segment_events_extra, 0);
        let outs = [free(1 << 22), free(1 << 22), free(2 << 22)];
        let made: Vec<SegmentEntry> = [free(1 << 22), free(3 << 22)]
            .iter()
            .map(SegmentEntry::of_recorded)
            .collect();
        let mut id = blank();
        assert!(!compare(&made, &outs, &mut id));
        assert_eq!(
            (id.segment_events_reproduced, id.segment_events_extra),
            (1, 1)
        );
    }
}
