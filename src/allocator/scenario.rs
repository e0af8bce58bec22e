//! What if: the recorded requests replayed under other settings and another capacity
//! (spec 4.2 and 4.3).
//!
//! Takes a [`Prepared`] recording and a [`Scenario`]; gives an [`Outcome`]: the peak of
//! reserved memory and when, what the allocator did (segments made and freed, cache
//! flushes of the out-of-memory retry), and the first request that would run out of
//! memory, if any, with whether capacity or fragmentation refused it. A scenario takes
//! nothing from the recording but its requests, its frees and its `empty_cache` calls:
//! the capacity decides where `cudaMalloc` fails, and new segments get addresses of the
//! model's own. It stops at the first out-of-memory error: what the program did next is
//! not in the file.
//!
//! Where the blocks from before recording go: with the recorded kind of segments
//! (expandable or not), the state at the first event is kept as the recording shows it;
//! with the other kind it cannot be, so those blocks are allocated first, in address
//! order (an inference, which the outcome says).

use super::device::CapacityDevice;
use super::identity::Prepared;
use super::model::{Allocator, BlockId, ModelEvent, Stats};
use super::requests::Request;
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

/// Why a request ran out of memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// Even packed without gaps, the live blocks and the request exceed the capacity.
    Capacity,
    /// The capacity holds the live blocks and the request, but the free memory is in
    /// pieces (inside segments split by live blocks) none of which fits the request.
    Fragmentation,
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
    let mut a = Allocator::new(sc.settings.clone(), p.profile, sc.total_memory);
    let mut by_tag: Vec<Option<BlockId>> = vec![None; p.requests.tags as usize];
    let above = p.start.top_address().max(
        p.requests
            .outputs
            .iter()
            .map(|o| o.addr + o.size)
            .max()
            .unwrap_or(0),
    );
    let mut dev = CapacityDevice::new(sc.capacity, above);
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
            a.empty_cache();
            if sc.capacity.is_some_and(|c| a.reserved() > c) {
                return Err(start_fails(&a));
            }
        }
    } else {
        for l in p.start.live_requests() {
            match a.malloc(&mut dev, l.requested, l.stream, l.private, l.tag) {
                Ok(b) => by_tag[l.tag as usize] = Some(b),
                Err(_) => return Err(start_fails(&a)),
            }
        }
    }
    a.take_events().for_each(drop);
    let mut out = Outcome {
        peak_reserved_bytes: a.reserved(),
        peak_event: None,
        allocated_at_peak_bytes: a.allocated(),
        stats: Stats::default(),
        first_oom: None,
        recorded_ooms_passed: 0,
        start_replaced: !keep_start && p.start.blocks > 0,
        series: vec![(None, a.reserved())],
    };
    let stats_at_start = a.stats;
    for item in p.requests.iter() {
        let before = a.reserved();
        match &item {
            Request::Alloc {
                tag,
                size,
                stream,
                pool,
                event,
                ..
            } => match a.malloc(&mut dev, *size, *stream, *pool, *tag) {
                Ok(b) => by_tag[*tag as usize] = Some(b),
                Err(e) => {
                    out.first_oom = Some(first_oom(&a, sc, *event, *size, *stream, e, false));
                }
            },
            Request::Oom {
                size,
                stream,
                pool,
                event,
                ..
            } => match a.malloc(&mut dev, *size, *stream, *pool, u32::MAX) {
                Ok(b) => {
                    // The program never got it: it is gone at once.
                    out.recorded_ooms_passed += 1;
                    a.free(b);
                }
                Err(e) => {
                    out.first_oom = Some(first_oom(&a, sc, *event, *size, *stream, e, true));
                }
            },
            Request::EmptyCache { .. } => a.empty_cache(),
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
        for e in a.take_events() {
            if let ModelEvent::FreeCompleted { tag } = e
                && let Some(slot) = by_tag.get_mut(tag as usize)
            {
                *slot = None;
            }
        }
        let r = a.reserved();
        if r != before {
            out.series.push((Some(item.event()), r));
        }
        if r > out.peak_reserved_bytes {
            out.peak_reserved_bytes = r;
            out.peak_event = Some(item.event());
            out.allocated_at_peak_bytes = a.allocated();
        }
        if out.first_oom.is_some() {
            break;
        }
    }
    out.stats = sub_stats(a.stats, stats_at_start);
    Ok(out)
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
    let fits_packed = e.allocated.saturating_add(e.size) <= limit;
    FirstOom {
        event,
        request_bytes: size,
        rounded_bytes: e.size,
        stream,
        reserved_bytes: e.reserved,
        allocated_bytes: e.allocated,
        requested_bytes: a.requested(),
        largest_free_bytes: e.largest_free,
        cause: if fits_packed {
            OomCause::Fragmentation
        } else {
            OomCause::Capacity
        },
        recorded,
    }
}

/// The smallest capacity (a multiple of [`CAPACITY_STEP`]) for the allocator under
/// `settings` that runs the requests without running out of memory, found by bisection
/// between the live blocks' peak and the peak reserved with no limit; `outside` is the
/// memory outside the allocator, which a device needs on top (for a memory fraction
/// and expandable reservations). None when even the start does not fit anywhere.
pub fn min_capacity(p: &Prepared, settings: &Settings, outside: u64) -> Option<u64> {
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
    let free = probe(None).ok()?;
    if free.first_oom.is_some() {
        // Refused even with no limit (a memory fraction of an unknown total cannot
        // refuse; a request beyond every address can).
        return None;
    }
    let fits = |c: u64| probe(Some(c)).is_ok_and(|o| o.first_oom.is_none());
    let mut hi = free.peak_reserved_bytes.div_ceil(CAPACITY_STEP) * CAPACITY_STEP;
    if !fits(hi) {
        // Not monotone here (a memory fraction of the larger total): search upwards.
        let mut c = hi;
        loop {
            c = c.saturating_mul(2);
            if fits(c) {
                hi = c;
                break;
            }
            if c == u64::MAX {
                return None;
            }
        }
    }
    let mut lo = (p.start.requested / CAPACITY_STEP) * CAPACITY_STEP;
    if lo >= hi {
        lo = 0;
    }
    // Invariant: hi fits, lo does not (or is the floor).
    while hi - lo > CAPACITY_STEP {
        let mid = lo + (hi - lo) / 2 / CAPACITY_STEP * CAPACITY_STEP;
        let mid = mid.max(lo + CAPACITY_STEP);
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}
