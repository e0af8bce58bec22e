//! What if: the recorded requests replayed under other settings and another capacity
//! (spec 4.2 and 4.3).
//!
//! Takes a [`Prepared`] recording and a [`Scenario`]; gives an [`Outcome`]: the peak of
//! reserved memory and when, what the allocator did (segments made and freed, cache
//! flushes of the out-of-memory retry), and the first request that would run out of
//! memory, if any, with whether capacity or fragmentation refused it. A scenario takes
//! nothing from the recording but its requests, its frees and its `empty_cache` calls:
//! the capacity decides where `cudaMalloc` fails. A new segment gets the address the
//! recording shows while every call the scenario made to the device was the recording's
//! (a device given the same calls answers the same), and an address of the model's own
//! after its first other call ([`Following`]): so the recorded settings with room enough
//! give the recording itself wherever the model reproduces it. It stops at the first
//! out-of-memory error: what the program did next is not in the file.
//!
//! Where the blocks from before recording go: with the recorded kind of segments
//! (expandable or not), the state at the first event is kept as the recording shows it;
//! with the other kind it cannot be, so those blocks are allocated first, in address
//! order (an inference, which the outcome says).

use super::device::{AddressSpace, CapacityDevice, Following};
use super::model::{Allocator, BlockId, ModelEvent, Stats};
use super::prepared::Prepared;
use super::requests::{Recorded, Request};
use super::settings::Settings;
use serde::Serialize;

/// Capacities are searched in steps of this: segments are whole multiples of it.
pub const CAPACITY_STEP: u64 = 2 << 20;

/// One what-if.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub settings: Settings,
    /// Bytes the allocator may hold (the device's memory minus what is used outside the
    /// allocator); None: unlimited.
    pub capacity: Option<u64>,
    /// The device's total memory, for a memory fraction and the size of expandable
    /// reservations (None: unknown).
    pub total_memory: Option<u64>,
}

/// Why a request ran out of memory: where the memory it lacked was. One rule for a
/// recorded OOM (`oom`, the report) and a replayed one (`simulate`, `budget`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// Even packed without gaps, the live blocks and the request exceed the capacity:
    /// the memory was not there.
    Capacity,
    /// The capacity holds the live blocks and the request, and the device had less free
    /// than the request: the rest sat in holes inside segments (split by live blocks),
    /// none large enough.
    Fragmentation,
    /// The capacity holds the live blocks and the request, and the device had room for
    /// the request itself, but the allocator asks the device for more: a whole segment
    /// (2 MiB, 20 MiB, or the request rounded up to 2 MiB) or whole expandable pages.
    Rounding,
    /// The capacity holds the live blocks and the request, but what the request lacked
    /// was cached free in CUDA-graph private pools: only allocations made for those
    /// graphs use it, and the out-of-memory retry does not release it while a graph
    /// that uses the pool is alive.
    PrivatePools,
}

impl OomCause {
    /// Where a refused request of `request` bytes (rounded) fell short, given the live
    /// block bytes, the reserved bytes after the allocator released what it could, the
    /// most it could hold, and the free bytes of that reserve cached in private pools.
    pub fn of(
        allocated: u64,
        request: u64,
        reserved: u64,
        limit: u64,
        private_free: u64,
    ) -> OomCause {
        let device_free = limit.saturating_sub(reserved);
        let default_free = reserved
            .saturating_sub(allocated)
            .saturating_sub(private_free);
        if allocated.saturating_add(request) > limit {
            OomCause::Capacity
        } else if device_free >= request {
            OomCause::Rounding
        } else if private_free > 0 && device_free.saturating_add(default_free) < request {
            OomCause::PrivatePools
        } else {
            OomCause::Fragmentation
        }
    }
}

/// The first request that runs out of memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FirstOom {
    /// Its trace entry (`alloc`, or the recorded `oom`).
    pub event: u32,
    /// The requested and the rounded size.
    pub request_bytes: u64,
    pub rounded_bytes: u64,
    pub stream: u64,
    /// What the allocator held when it failed, after releasing what it could.
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// What the live tensors asked for.
    pub requested_bytes: u64,
    /// The largest free block of the request's pool and stream.
    pub largest_free_bytes: u64,
    /// Free bytes cached in CUDA-graph private pools.
    pub private_free_bytes: u64,
    pub cause: OomCause,
    /// Whether the recording ran out of memory at this request too.
    pub recorded: bool,
}

/// What a scenario did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Outcome {
    pub peak_reserved_bytes: u64,
    /// The trace entry after which the peak is first reached (None: at the start).
    pub peak_event: Option<u32>,
    /// Block bytes allocated at that moment (reserved minus this is the cache and the
    /// fragmentation then).
    pub allocated_at_peak_bytes: u64,
    pub stats: Stats,
    pub first_oom: Option<FirstOom>,
    /// Recorded OOMs the scenario let through.
    pub recorded_ooms_passed: u64,
    /// The blocks from before recording were allocated first, in address order (the
    /// scenario's kind of segments differs from the recording's).
    pub start_replaced: bool,
    /// The model ran out of 64-bit addresses for the segments it made and placed some
    /// where others had been ([`AddressSpace`]): an estimate.
    pub addresses_reused: bool,
    /// Reserved bytes after each trace entry that changed them, ending at the first OOM
    /// (for charts): (event, bytes); the first point is the start.
    pub series: Vec<(Option<u32>, u64)>,
}

/// A scenario that cannot start: the blocks alive before recording do not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[error(
    "the blocks alive before recording ({live_bytes} bytes) do not fit in {capacity_bytes} bytes"
)]
pub struct StartDoesNotFit {
    pub live_bytes: u64,
    pub capacity_bytes: u64,
}

/// Replays `p`'s requests under `sc`.
pub fn run(p: &Prepared, sc: &Scenario) -> Result<Outcome, StartDoesNotFit> {
    let r = Replay::start(p, sc)?;
    Ok(replay_from(p, sc, r, Track::new_at_start(p, false, false), 0).0)
}

/// The replay of [`run`] from a started replay at request `from`, `track` holding what
/// the requests before it did.
fn replay_from(
    p: &Prepared,
    sc: &Scenario,
    mut r: Replay,
    mut track: Track,
    from: usize,
) -> (Outcome, Option<Search>) {
    if from == 0 {
        track.begin(&r.a);
        track.out.start_replaced = r.replaced;
    }
    for (i, item) in p.requests.iter_from(from).enumerate() {
        let i = from + i;
        track.before(i, || r.save());
        r.dev.max_need = 0;
        let before = r.a.reserved();
        let step = r.step(&item, p.requests.outputs_of_request(&item));
        track.after(i, item.event(), before, &r.a, r.dev.max_need);
        match step {
            Step::Done => {}
            Step::PassedOom => track.out.recorded_ooms_passed += 1,
            Step::Oom(e, recorded) => {
                let (size, stream) = match item {
                    Request::Alloc { size, stream, .. } | Request::Oom { size, stream, .. } => {
                        (size, stream)
                    }
                    _ => (0, 0),
                };
                track.out.first_oom =
                    Some(first_oom(&r.a, sc, item.event(), size, stream, e, recorded));
                break;
            }
        }
    }
    let (mut out, search) = track.finish(&r.a);
    out.addresses_reused |= r.dev.space.reused;
    (out, search)
}

/// A replay's outcome as it goes, and what searching capacities needs of it: saved
/// states every so many requests and what each request asked of the device. A replay
/// that starts as another one did (the identity check's, while the two are the same)
/// takes it over at one of its saved states ([`Track::resume`]).
pub struct Track {
    out: Outcome,
    /// What the allocator did in the replays before this one's start (a track appended
    /// to another), and its statistics at that start.
    stats_before: Stats,
    stats_at_start: Stats,
    every: usize,
    /// Saved states, oldest first, each with the outcome so far there.
    saved: Vec<(Mark, Saved)>,
    /// All saved states kept (for a search), or only the latest (to resume from).
    keep_all: bool,
    /// Whether states are saved at all.
    saving: bool,
    needs: Vec<(usize, u64)>,
    peak_requested: u64,
    /// The device of a state saved from the identity check's replay (made only for a
    /// track that saves states).
    device: Option<CapacityDevice>,
    /// The next request before which a state is saved.
    next_save: usize,
}

/// Bytes the saved states of one track may take: past it, every other state is let go
/// and states are saved half as often (a search then replays longer stretches from
/// fewer states; its answers are the same).
const SAVED_BYTES: usize = 64 << 20;

/// The outcome so far at a saved state.
#[derive(Clone, Copy, Debug)]
struct Mark {
    at: usize,
    series: usize,
    peak_reserved: u64,
    peak_event: Option<u32>,
    allocated_at_peak: u64,
    needs: usize,
    peak_requested: u64,
    stats_before: Stats,
    stats_at_start: Stats,
    /// What the state saved here takes ([`Allocator::approx_bytes`]).
    bytes: usize,
}

impl Track {
    /// A track for a replay of `p` from its start: saving states for a search
    /// (`keep_all`), or only the latest one (`keep_latest`), or none.
    pub fn new_at_start(p: &Prepared, keep_all: bool, keep_latest: bool) -> Track {
        Track {
            out: Outcome {
                peak_reserved_bytes: 0,
                peak_event: None,
                allocated_at_peak_bytes: 0,
                stats: Stats::default(),
                first_oom: None,
                recorded_ooms_passed: 0,
                start_replaced: false,
                addresses_reused: false,
                series: Vec::new(),
            },
            stats_before: Stats::default(),
            stats_at_start: Stats::default(),
            every: checkpoint_every(p.requests.len()),
            saved: Vec::new(),
            keep_all,
            saving: keep_all || keep_latest,
            needs: Vec::new(),
            peak_requested: 0,
            device: (keep_all || keep_latest).then(|| following_device(p, None)),
            next_save: 0,
        }
    }

    /// The state at the first request: `a` as it starts.
    pub fn begin(&mut self, a: &Allocator) {
        self.out.peak_reserved_bytes = a.reserved();
        self.out.allocated_at_peak_bytes = a.allocated();
        self.out.series = vec![(None, a.reserved())];
        self.stats_at_start = a.stats;
        self.peak_requested = a.requested_held();
    }

    /// Before request `i`: saves the state (`save` makes it) where one is due.
    fn before(&mut self, i: usize, save: impl FnOnce() -> Saved) {
        if !self.saving || i < self.next_save {
            return;
        }
        // At the first multiple of `every` from `i` on (a track that starts midway saves
        // where one from the start would).
        if !i.is_multiple_of(self.every) {
            self.next_save = i.next_multiple_of(self.every);
            return;
        }
        self.next_save = i + self.every;
        let saved = save();
        let mark = Mark {
            at: i,
            series: self.out.series.len(),
            peak_reserved: self.out.peak_reserved_bytes,
            peak_event: self.out.peak_event,
            allocated_at_peak: self.out.allocated_at_peak_bytes,
            needs: self.needs.len(),
            peak_requested: self.peak_requested,
            stats_before: self.stats_before,
            stats_at_start: self.stats_at_start,
            bytes: saved.a.approx_bytes() + saved.live.len() * 8,
        };
        if !self.keep_all {
            self.saved.clear();
        }
        self.saved.push((mark, saved));
        self.thin_saved();
    }

    /// Before request `i` of the identity check's replay, whose allocator is `a`.
    pub fn before_check(&mut self, i: usize, a: &Allocator) {
        if !self.saving || i < self.next_save {
            return;
        }
        let dev = self
            .device
            .clone()
            .expect("a track that saves has its device");
        self.before(i, || Saved {
            a: a.clone(),
            dev,
            live: a.live_tags(),
        });
    }

    /// After request `i` (trace entry `event`), which found `before` bytes reserved, left
    /// `a`, and asked the device for at most `need` (0: nothing).
    pub fn after(&mut self, i: usize, event: u32, before: u64, a: &Allocator, need: u64) {
        let now = a.reserved();
        if now != before {
            self.out.series.push((Some(event), now));
        }
        if now > self.out.peak_reserved_bytes {
            self.out.peak_reserved_bytes = now;
            self.out.peak_event = Some(event);
            self.out.allocated_at_peak_bytes = a.allocated();
        }
        if self.keep_all {
            if need > 0 {
                self.needs.push((i, need));
            }
            self.peak_requested = self.peak_requested.max(a.requested_held());
        }
    }

    /// The outcome, ending with `a`; and what a search needs, where it was kept.
    pub fn finish(mut self, a: &Allocator) -> (Outcome, Option<Search>) {
        self.out.stats = add_stats(self.stats_before, sub_stats(a.stats, self.stats_at_start));
        let search = self.keep_all.then(|| Search {
            checkpoints: self.saved.into_iter().map(|(m, s)| (m.at, s)).collect(),
            needs: self.needs,
            peak_reserved: self.out.peak_reserved_bytes,
            peak_requested: self.peak_requested,
        });
        (self.out, search)
    }

    /// The replay continued on its own from its latest saved state at or before request
    /// `i` (what it did from there on is done again): the scenario with the recorded
    /// settings and no limit, where the identity check's replay stops being it.
    pub fn resume(mut self, p: &Prepared, i: usize) -> (Outcome, Option<Search>) {
        let sc = Scenario {
            settings: p.settings.clone(),
            capacity: None,
            total_memory: None,
        };
        let k = self.saved.partition_point(|(m, _)| m.at <= i);
        if k == 0 {
            // Parted before any state was saved (at the first request): from the start.
            let fresh = Track::new_at_start(p, self.keep_all, self.saving);
            let r = Replay::start(p, &sc).expect("a replay with no limit has room to start");
            return replay_from(p, &sc, r, fresh, 0);
        }
        self.saved.truncate(k);
        let (m, saved) = self.saved.last().expect("kept");
        let (m, r) = (*m, Replay::restore(saved, p.requests.tags));
        self.out.series.truncate(m.series);
        self.out.peak_reserved_bytes = m.peak_reserved;
        self.out.peak_event = m.peak_event;
        self.out.allocated_at_peak_bytes = m.allocated_at_peak;
        self.needs.truncate(m.needs);
        self.peak_requested = m.peak_requested;
        self.stats_before = m.stats_before;
        self.stats_at_start = m.stats_at_start;
        // Saved again when the replay passes it.
        self.saved.pop();
        self.next_save = m.at;
        replay_from(p, &sc, r, self, m.at)
    }
}

impl Track {
    /// This track, of the requests before `later`'s first ending with `a`, followed by
    /// `later`'s: the track of a replay of the requests after those, from a state equal to
    /// `a`'s. The same track as one replay of both would have made.
    pub fn append(mut self, a: &Allocator, later: Track) -> Track {
        self.stats_before = add_stats(self.stats_before, sub_stats(a.stats, self.stats_at_start));
        self.stats_at_start = later.stats_at_start;
        let (series, needs) = (self.out.series.len(), self.needs.len());
        let (peak, peak_event, allocated_at_peak) = (
            self.out.peak_reserved_bytes,
            self.out.peak_event,
            self.out.allocated_at_peak_bytes,
        );
        let peak_requested = self.peak_requested;
        // The later track starts with the state this one ends in: its first point is ours.
        self.out.series.extend(later.out.series.into_iter().skip(1));
        // A peak is where it is first reached.
        if later.out.peak_reserved_bytes > peak {
            self.out.peak_reserved_bytes = later.out.peak_reserved_bytes;
            self.out.peak_event = later.out.peak_event;
            self.out.allocated_at_peak_bytes = later.out.allocated_at_peak_bytes;
        }
        self.needs.extend(later.needs);
        self.peak_requested = self.peak_requested.max(later.peak_requested);
        self.next_save = later.next_save;
        for (mut m, saved) in later.saved {
            m.series += series - 1;
            m.needs += needs;
            if m.peak_reserved <= peak {
                (m.peak_reserved, m.peak_event, m.allocated_at_peak) =
                    (peak, peak_event, allocated_at_peak);
            }
            m.peak_requested = m.peak_requested.max(peak_requested);
            m.stats_before = self.stats_before;
            if !self.keep_all {
                self.saved.clear();
            }
            self.saved.push((m, saved));
        }
        self.thin_saved();
        self
    }

    /// Keeps the saved states within [`SAVED_BYTES`]: every other one let go (the first
    /// kept) and states saved half as often, as many times as it takes.
    fn thin_saved(&mut self) {
        let total = |saved: &[(Mark, Saved)]| saved.iter().map(|(m, _)| m.bytes).sum::<usize>();
        while self.saved.len() > 1 && total(&self.saved) > SAVED_BYTES {
            let mut k = 0;
            self.saved.retain(|_| {
                k += 1;
                k % 2 == 1
            });
            self.every = self.every.saturating_mul(2);
        }
    }

    /// Whether every saved state is kept (for a search).
    pub fn keeps_all(&self) -> bool {
        self.keep_all
    }
}

/// The device of a replay of `p` under `capacity`, in step with the recording: new
/// segments above every address the recording shows.
fn following_device(p: &Prepared, capacity: Option<u64>) -> CapacityDevice {
    let space = AddressSpace::around(p.low_address(), p.top_address());
    let mut dev = CapacityDevice::new(capacity, space);
    dev.in_step = true;
    dev
}

/// The replay with no limit under `settings`, of the free blocks of the best-fitting size
/// taking the one at the highest address rather than the lowest: how much the peak
/// depends on which of equal blocks the allocator takes (an order PyTorch fixes, but
/// one that another run's addresses would shift).
pub fn unlimited_highest_first(p: &Prepared, settings: &Settings) -> Unlimited {
    let sc = Scenario {
        settings: settings.clone(),
        capacity: None,
        total_memory: None,
    };
    let mut r = Replay::start(p, &sc)?;
    r.a.take_highest_first();
    Ok(replay_from(
        p,
        &sc,
        r,
        Track::new_at_start(p, false, false),
        0,
    ))
}

/// Whether a replay under `settings` at `capacity` is the replay with no limit, known to
/// peak at `unlimited_peak` with no OOM: without a memory fraction the device's total
/// changes nothing until memory runs out, and it never runs out below that peak.
pub fn limit_changes_nothing(settings: &Settings, unlimited_peak: u64, capacity: u64) -> bool {
    settings.memory_fraction.is_none() && unlimited_peak <= capacity
}

/// [`run`] at each of `devices` (capacity for the allocator, total memory) under
/// `settings`: one replay with no limit serves every device it does not exceed. Also
/// that replay, where it ran without an OOM (None: a memory fraction is set).
pub fn run_each(
    p: &Prepared,
    settings: &Settings,
    devices: &[(u64, u64)],
) -> (Option<Outcome>, Vec<Result<Outcome, StartDoesNotFit>>) {
    let free = settings
        .memory_fraction
        .is_none()
        .then(|| unlimited(p, settings, false))
        .and_then(|u| u.ok())
        .map(|(o, _)| o);
    run_each_after(p, settings, devices, free)
}

/// [`run_each`] with the replay with no limit under `settings` made already (`free`: its
/// outcome; None where a memory fraction is set).
pub fn run_each_after(
    p: &Prepared,
    settings: &Settings,
    devices: &[(u64, u64)],
    free: Option<Outcome>,
) -> (Option<Outcome>, Vec<Result<Outcome, StartDoesNotFit>>) {
    use rayon::prelude::*;
    let free = free.filter(|o| o.first_oom.is_none());
    let each = devices
        .par_iter()
        .map(|&(capacity, total)| match &free {
            Some(o) if limit_changes_nothing(settings, o.peak_reserved_bytes, capacity) => {
                Ok(o.clone())
            }
            _ => run(
                p,
                &Scenario {
                    settings: settings.clone(),
                    capacity: Some(capacity),
                    total_memory: Some(total),
                },
            ),
        })
        .collect();
    (free, each)
}

/// The replay with no limit: its outcome, and what searching capacities needs of it (None
/// where even that runs out of memory: a memory fraction of the total).
pub type Unlimited = Result<(Outcome, Option<Search>), StartDoesNotFit>;

/// The replay with no limit under `settings`; with `keep_search`, what searching
/// capacities needs of it too (its saved states hold the allocator several times over).
pub fn unlimited(p: &Prepared, settings: &Settings, keep_search: bool) -> Unlimited {
    let sc = Scenario {
        settings: settings.clone(),
        capacity: None,
        total_memory: None,
    };
    let r = Replay::start(p, &sc)?;
    let (out, search) = replay_from(p, &sc, r, Track::new_at_start(p, keep_search, false), 0);
    Ok(searchable(out, search))
}

/// A replay with no limit, and its search where it ran without an OOM.
pub fn searchable(out: Outcome, search: Option<Search>) -> (Outcome, Option<Search>) {
    let search = search.filter(|_| out.first_oom.is_none());
    (out, search)
}

/// What one request did.
enum Step {
    Done,
    /// A recorded OOM's request went through (and was freed at once).
    PassedOom,
    /// Out of memory; whether the recording ran out at this request too.
    Oom(super::model::Oom, bool),
}

/// A replay's state as saved: the live requests' blocks listed, not indexed by tag.
struct Saved {
    a: Allocator,
    dev: CapacityDevice,
    live: Vec<(u32, BlockId)>,
}

/// A replay under way: the allocator, the device, and each live request's block.
struct Replay {
    a: Allocator,
    dev: CapacityDevice,
    by_tag: Vec<Option<BlockId>>,
    replaced: bool,
}

impl Replay {
    /// The state at the first event under `sc`.
    fn start(p: &Prepared, sc: &Scenario) -> Result<Replay, StartDoesNotFit> {
        let mut a = Allocator::new(sc.settings.clone(), p.profile, sc.total_memory);
        let mut by_tag: Vec<Option<BlockId>> = vec![None; p.requests.tags as usize];
        // In step with the recording while its state at the first event is kept.
        let mut dev = following_device(p, sc.capacity);
        let keep_start = sc.settings.expandable_segments == p.settings.expandable_segments;
        let start_fails = |a: &Allocator| StartDoesNotFit {
            live_bytes: a.allocated().max(p.start.requested),
            capacity_bytes: sc.capacity.unwrap_or(u64::MAX),
        };
        if keep_start {
            for (tag, id) in p.start.restore(&mut a) {
                by_tag[tag as usize] = Some(id);
            }
            if sc.capacity.is_some_and(|c| a.reserved() > c) {
                // A smaller device would not have cached as much: what was cached goes.
                dev.in_step = false;
                a.empty_cache();
                if sc.capacity.is_some_and(|c| a.reserved() > c) {
                    return Err(start_fails(&a));
                }
            }
        } else {
            dev.in_step = false;
            for l in p.start.live_requests() {
                match a.malloc(&mut dev, l.requested, l.stream, l.private, l.tag) {
                    Ok(b) => by_tag[l.tag as usize] = Some(b),
                    Err(_) => return Err(start_fails(&a)),
                }
            }
        }
        a.take_events().for_each(drop);
        Ok(Replay {
            a,
            dev,
            by_tag,
            replaced: !keep_start && p.start.blocks > 0,
        })
    }

    fn save(&self) -> Saved {
        Saved {
            a: self.a.clone(),
            dev: self.dev.clone(),
            live: self.a.live_tags(),
        }
    }

    fn restore(saved: &Saved, tags: u32) -> Replay {
        let mut by_tag = vec![None; tags as usize];
        for &(tag, b) in &saved.live {
            if let Some(slot) = by_tag.get_mut(tag as usize) {
                *slot = Some(b);
            }
        }
        Replay {
            a: saved.a.clone(),
            dev: saved.dev.clone(),
            by_tag,
            replaced: false,
        }
    }

    /// Runs one request; `outs` are the `segment_*` entries the recording shows for it.
    fn step(&mut self, item: &Request, outs: &[Recorded]) -> Step {
        let a = &mut self.a;
        let by_tag = &mut self.by_tag;
        let mut dev = Following {
            dev: &mut self.dev,
            outs,
            made: 0,
        };
        let step = match item {
            Request::Alloc {
                tag,
                size,
                stream,
                pool,
                ..
            } => match a.malloc(&mut dev, *size, *stream, *pool, *tag) {
                Ok(b) => {
                    by_tag[*tag as usize] = Some(b);
                    Step::Done
                }
                Err(e) => Step::Oom(e, false),
            },
            Request::Oom {
                size, stream, pool, ..
            } => match a.malloc(&mut dev, *size, *stream, *pool, u32::MAX) {
                Ok(b) => {
                    // The program never got it: it is gone at once.
                    a.free(b);
                    Step::PassedOom
                }
                Err(e) => Step::Oom(e, true),
            },
            Request::EmptyCache { .. } => {
                a.empty_cache();
                Step::Done
            }
            Request::FreeRequested { tag, .. } => {
                if let Some(b) = by_tag[*tag as usize] {
                    a.free_requested(b);
                }
                Step::Done
            }
            Request::Free { tag, .. } => {
                if let Some(b) = by_tag[*tag as usize].take() {
                    a.free(b);
                }
                Step::Done
            }
        };
        let mut made = 0;
        if a.has_events() {
            for e in a.take_events() {
                match e {
                    ModelEvent::FreeCompleted { tag } => {
                        if let Some(slot) = by_tag.get_mut(tag as usize) {
                            *slot = None;
                        }
                    }
                    _ => {
                        let same = outs.get(made).is_some_and(|o| o.is_model(&e));
                        self.dev.in_step &= same;
                        made += 1;
                    }
                }
            }
        }
        // The recording's calls to the device here were others (or more).
        self.dev.in_step &= made == outs.len();
        step
    }
}

fn add_stats(a: Stats, b: Stats) -> Stats {
    Stats {
        segment_allocs: a.segment_allocs + b.segment_allocs,
        segment_frees: a.segment_frees + b.segment_frees,
        maps: a.maps + b.maps,
        unmaps: a.unmaps + b.unmaps,
        retry_flushes: a.retry_flushes + b.retry_flushes,
        gc_runs: a.gc_runs + b.gc_runs,
    }
}

fn sub_stats(a: Stats, b: Stats) -> Stats {
    Stats {
        segment_allocs: a.segment_allocs - b.segment_allocs,
        segment_frees: a.segment_frees - b.segment_frees,
        maps: a.maps - b.maps,
        unmaps: a.unmaps - b.unmaps,
        retry_flushes: a.retry_flushes - b.retry_flushes,
        gc_runs: a.gc_runs - b.gc_runs,
    }
}

fn first_oom(
    a: &Allocator,
    sc: &Scenario,
    event: u32,
    size: u64,
    stream: u64,
    e: super::model::Oom,
    recorded: bool,
) -> FirstOom {
    let fraction_limit = sc
        .total_memory
        .zip(sc.settings.memory_fraction)
        .map(|(t, f)| (f * t as f64) as u64);
    let limit = [sc.capacity, fraction_limit]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(u64::MAX);
    FirstOom {
        event,
        request_bytes: size,
        rounded_bytes: e.size,
        stream,
        reserved_bytes: e.reserved,
        allocated_bytes: e.allocated,
        requested_bytes: a.requested(),
        largest_free_bytes: e.largest_free,
        private_free_bytes: e.private_free,
        cause: OomCause::of(e.allocated, e.size, e.reserved, limit, e.private_free),
        recorded,
    }
}

/// How many requests apart a replay of `n` requests saves its state.
pub fn checkpoint_every(n: usize) -> usize {
    CHECKPOINT_EVERY.max(n.div_ceil(CHECKPOINTS))
}

/// Requests between two saved states of the unlimited replay, when the smallest
/// capacity is searched: at least this many, and no more than [`CHECKPOINTS`] states.
const CHECKPOINT_EVERY: usize = 1 << 16;
const CHECKPOINTS: usize = 16;

/// The unlimited replay, kept for searching capacities: its state every so many
/// requests and, for each request that asked the device for memory,
/// the most the allocator would then hold. A replay under a capacity C is this one up to
/// the first request that needed more than C, so it resumes from the state saved before
/// that request.
#[derive(Default)]
pub struct Search {
    checkpoints: Vec<(usize, Saved)>,
    /// (request index, reserved + what it asked of the device).
    needs: Vec<(usize, u64)>,
    peak_reserved: u64,
    /// The most the live requests whose free no flush can complete asked for at once:
    /// no capacity below it can serve them.
    peak_requested: u64,
}

impl Search {
    /// Whether the requests run within `capacity`.
    fn fits(&self, p: &Prepared, capacity: u64) -> bool {
        let Some(&(d, _)) = self.needs.iter().find(|n| n.1 > capacity) else {
            return true;
        };
        let Some((from, saved)) = self.checkpoints.iter().rev().find(|c| c.0 <= d) else {
            return false;
        };
        let mut r = Replay::restore(saved, p.requests.tags);
        r.dev.capacity = Some(capacity);
        for item in p.requests.iter().skip(*from) {
            if let Step::Oom(..) = r.step(&item, p.requests.outputs_of_request(&item)) {
                return false;
            }
        }
        true
    }
}

/// How close the smallest capacity is searched: to within this share of it (1/256, 0.4%,
/// finer than the tenth of a GiB it is shown in from 25 GiB up), and never finer than
/// [`CAPACITY_STEP`].
pub const CAPACITY_TOLERANCE: u64 = 256;

/// The smallest capacity (a multiple of [`CAPACITY_STEP`], to within
/// [`CAPACITY_TOLERANCE`]) for the allocator under `settings` that runs the requests
/// without running out of memory, found by bisection between the most the live requests
/// asked for at once and the peak reserved with no limit; `outside` is the memory
/// outside the allocator, which a device needs on top (for a memory fraction). None when
/// the requests cannot run at all.
pub fn min_capacity(p: &Prepared, settings: &Settings, outside: u64) -> Option<MinCapacity> {
    let search = if settings.memory_fraction.is_none() {
        Some(unlimited(p, settings, true).ok()?.1?)
    } else {
        None
    };
    min_capacity_searched(p, settings, outside, search.as_ref())
}

/// The smallest capacity the search found, and a larger one that runs out of memory
/// where the search met one: success is not monotone in the capacity (a smaller device
/// takes the out-of-memory retry earlier, and later requests pack differently), so the
/// answer is the smallest capacity found to run the requests, not a bound above which
/// every capacity does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinCapacity {
    pub bytes: u64,
    /// The largest capacity above `bytes` found to run out of memory: among the tries
    /// of the search and up to [`CHECKS_ABOVE`] capacities between `bytes` and the peak
    /// with no limit (the least capacities that spare a request the retry).
    pub fails_above: Option<u64>,
}

/// Capacities between the answer and the peak with no limit tried after the search.
pub const CHECKS_ABOVE: usize = 4;

/// The capacities above `answer` (and below `top`) worth trying after the search: where
/// the replay with no limit first asks for more than it ever held (each such need is
/// the least capacity that spares that request the out-of-memory retry, and the
/// capacities from one to the next take their first retry at the same request), up to
/// [`CHECKS_ABOVE`] of them spread over the trace; evenly spaced ones where that replay
/// is not at hand.
fn checks_above(search: Option<&Search>, answer: u64, top: u64) -> Vec<u64> {
    let up = |c: u64| c.div_ceil(CAPACITY_STEP).saturating_mul(CAPACITY_STEP);
    let mut records: Vec<u64> = match search {
        Some(s) => {
            let mut most = 0;
            let mut records = Vec::new();
            for &(_, need) in &s.needs {
                if need > most {
                    most = need;
                    records.push(up(need));
                }
            }
            records
        }
        None => {
            let gap = top.saturating_sub(answer) / (CHECKS_ABOVE as u64 + 1);
            (1..=CHECKS_ABOVE as u64)
                .map(|k| up(answer + gap * k))
                .collect()
        }
    };
    records.retain(|&c| c > answer && c < top);
    records.dedup();
    if records.len() > CHECKS_ABOVE {
        let n = records.len();
        records = (0..CHECKS_ABOVE)
            .map(|k| records[(k * (n - 1)) / (CHECKS_ABOVE - 1)])
            .collect();
        records.dedup();
    }
    records
}

/// [`min_capacity`] with the unlimited replay under `settings` already made ([`unlimited`];
/// it serves only where no memory fraction is set).
pub fn min_capacity_searched(
    p: &Prepared,
    settings: &Settings,
    outside: u64,
    search: Option<&Search>,
) -> Option<MinCapacity> {
    let probe = |c: Option<u64>| {
        run(
            p,
            &Scenario {
                settings: settings.clone(),
                capacity: c,
                total_memory: c.map(|c| c.saturating_add(outside)),
            },
        )
    };
    // Without a memory fraction the device's total changes nothing until memory runs
    // out, so the saved states of the unlimited replay serve every capacity.
    let search = search.filter(|_| settings.memory_fraction.is_none());
    let fits = |c: u64| match search {
        // Below the reserved start, the start itself differs: a replay of its own.
        Some(s) if c >= p.start.reserved => s.fits(p, c),
        _ => probe(Some(c)).is_ok_and(|o| o.first_oom.is_none()),
    };
    let peak = match search {
        Some(s) => s.peak_reserved,
        None => {
            let free = probe(None).ok()?;
            if free.first_oom.is_some() {
                return None;
            }
            free.peak_reserved_bytes
        }
    };
    let top = peak.div_ceil(CAPACITY_STEP) * CAPACITY_STEP;
    let mut hi = top;
    // Capacities tried that ran out of memory, above the one below which all failed.
    let mut failed: Vec<u64> = Vec::new();
    if !fits(hi) {
        // Not monotone here (a memory fraction of the larger total): search upwards.
        failed.push(hi);
        let mut c = hi;
        loop {
            c = c.saturating_mul(2);
            if fits(c) {
                hi = c;
                break;
            }
            failed.push(c);
            if c == u64::MAX {
                return None;
            }
        }
    }
    let floor = search.map_or(p.start.requested, |s| s.peak_requested);
    // The largest step below the floor: no capacity there runs them (the floor itself
    // may).
    let mut lo = (floor.saturating_sub(1) / CAPACITY_STEP) * CAPACITY_STEP;
    if lo >= hi {
        lo = 0;
    }
    let close_enough = |lo: u64, hi: u64| hi - lo <= CAPACITY_STEP.max(hi / CAPACITY_TOLERANCE);
    let on_step = |c: u64| c / CAPACITY_STEP * CAPACITY_STEP;
    // Invariant: hi fits, lo does not (or is the floor).
    // A capacity too small usually runs out where it first falls short, soon after the
    // state its replay resumes from; one that fits replays every request after it. So
    // the search first climbs from the floor in doubling steps, where most tries are
    // the cheap ones, and then halves what is left.
    //
    // A capacity that fits replays the rest of the requests; one below it usually fails
    // soon. So each try runs beside the one the search makes next if it fits (the middle
    // of what is then left): the same tries, in the same order of decisions, with the
    // long ones two at a time.
    let middle = |lo: u64, hi: u64| on_step(lo + (hi - lo) / 2).max(lo + CAPACITY_STEP);
    let next_if_fits = |lo: u64, c: u64| (!close_enough(lo, c)).then(|| middle(lo, c));
    let try_both = |c: u64, next: Option<u64>| rayon::join(|| fits(c), || next.map(&fits));
    // The try made beside one that fit, taken as the search's next.
    let settle = |lo: &mut u64, hi: &mut u64, next: Option<u64>, then: Option<bool>| {
        if let (Some(n), Some(f)) = (next, then) {
            if f {
                *hi = n;
            } else {
                *lo = n;
            }
        }
    };
    let mut step = CAPACITY_STEP.max(hi / CAPACITY_TOLERANCE);
    while !close_enough(lo, hi) {
        let c = on_step(lo.saturating_add(step)).max(lo + CAPACITY_STEP);
        if c >= hi {
            break;
        }
        let next = next_if_fits(lo, c);
        match try_both(c, next) {
            (true, then) => {
                hi = c;
                settle(&mut lo, &mut hi, next, then);
                break;
            }
            (false, _) => {
                lo = c;
                step = step.saturating_mul(2);
            }
        }
    }
    while !close_enough(lo, hi) {
        let mid = middle(lo, hi);
        let next = next_if_fits(lo, mid);
        match try_both(mid, next) {
            (true, then) => {
                hi = mid;
                settle(&mut lo, &mut hi, next, then);
            }
            (false, _) => lo = mid,
        }
    }
    // A few capacities between the answer and the peak, which the halving never tries.
    let above = checks_above(search, hi, top);
    let results: Vec<bool> = {
        use rayon::prelude::*;
        above.par_iter().map(|&c| fits(c)).collect()
    };
    failed.extend(above.iter().zip(results).filter(|r| !r.1).map(|r| *r.0));
    Some(MinCapacity {
        bytes: hi,
        fails_above: failed.into_iter().filter(|&c| c > hi).max(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::requests::Requests;
    use crate::allocator::start::StartState;

    const MIB: u64 = 1 << 20;

    /// Two 30 MiB tensors, then a 50 MiB one after the first is freed: worked by hand, a
    /// segment of 30 MiB for each (a multiple of 2 MiB already), then one of 50 MiB (the
    /// freed 30 MiB block is too small): 110 MiB reserved at the peak, 80 MiB of it in
    /// blocks.
    fn prepared() -> Prepared {
        let alloc = |tag, size, event| Request::Alloc {
            tag,
            size,
            stream: 0,
            pool: (0, 0),
            event,
            outputs: 0..0,
        };
        let requests = Requests::from_commands(
            [
                alloc(0, 30 * MIB, 0),
                alloc(1, 30 * MIB, 1),
                Request::Free { tag: 0, event: 2 },
                alloc(2, 50 * MIB, 3),
            ],
            3,
        );
        Prepared {
            device: 0,
            device_free: Vec::new(),
            total_memory: None,
            settings: Settings::default(),
            profile: crate::allocator::Profile::V2_4,
            requests,
            start: StartState::default(),
        }
    }

    /// A search's saved states stay within [`SAVED_BYTES`] however many blocks are live:
    /// 600,000 live 512-byte tensors (147 small segments of 4,096 each) make states of
    /// tens of MB; fewer are kept, and the smallest capacity is still the 294 MiB the
    /// segments take.
    #[test]
    fn saved_states_stay_within_their_budget() {
        let n = 600_000u32;
        let requests = Requests::from_commands(
            (0..n).map(|tag| Request::Alloc {
                tag,
                size: 512,
                stream: 0,
                pool: (0, 0),
                event: tag,
                outputs: 0..0,
            }),
            n,
        );
        let p = Prepared {
            requests,
            ..prepared()
        };
        let (out, search) = unlimited(&p, &p.settings, true).unwrap();
        assert_eq!(out.peak_reserved_bytes, 147 * 2 * MIB);
        let search = search.unwrap();
        let kept: usize = search
            .checkpoints
            .iter()
            .map(|c| c.1.a.approx_bytes())
            .sum();
        assert!(kept <= SAVED_BYTES, "{kept}");
        assert!(search.checkpoints.len() >= 2);
        assert_eq!(
            min_capacity_searched(&p, &p.settings, 0, Some(&search)).map(|m| m.bytes),
            Some(147 * 2 * MIB)
        );
    }

    /// A track parted at the first request, before it saved any state, goes on from the
    /// start: the answer of a replay of its own.
    #[test]
    fn a_track_parted_before_its_first_saved_state_replays_from_the_start() {
        let p = prepared();
        let (alone, _) = unlimited(&p, &p.settings, false).unwrap();
        assert_eq!(alone.peak_reserved_bytes, 110 * MIB);
        assert_eq!(alone.allocated_at_peak_bytes, 80 * MIB);
        let (resumed, _) = Track::new_at_start(&p, false, true).resume(&p, 0);
        assert_eq!(resumed, alone);
    }
}
