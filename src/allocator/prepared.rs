//! A device's recording prepared for replays: its requests to the allocator, its state at
//! the first event, its settings and the release profile (spec 4.4, "Replay driver").
//!
//! Takes a snapshot and a device; gives [`Prepared`], which the identity check
//! ([`super::identity`]), the scenarios ([`super::scenario`]) and the state rebuilt
//! midway ([`super::midway`]) all replay; and, from the recording alone, its reserved
//! bytes over time and the capacity each recorded OOM implies.

use super::model::Allocator;
use super::requests::{PoolLookup, Request, Requests};
use super::settings::{Profile, Settings};
use super::start::{self, StartState};
use crate::model::{Action, Snapshot};
use serde::Serialize;

/// Why a device cannot be replayed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum NotReplayable {
    #[error("no trace of allocations to replay")]
    NoTrace { device: i64 },
    #[error("the recording used backend:cudaMallocAsync, a different allocator")]
    AsyncBackend,
    #[error("the recording uses more than 65,535 distinct {}, more than the allocator model tells apart", match .what { crate::allocator::requests::TooMany::Streams => "streams", crate::allocator::requests::TooMany::Pools => "memory pools" })]
    TooMany {
        what: crate::allocator::requests::TooMany,
    },
}

/// A device's recording prepared for replays: its requests and its start state.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub device: i64,
    /// `device_free` of each recorded OOM, in order.
    pub device_free: Vec<Option<u64>>,
    /// The device's total memory, when known (a memory fraction acts only with it).
    pub total_memory: Option<u64>,
    pub settings: Settings,
    pub profile: Profile,
    pub requests: Requests,
    pub start: StartState,
}

impl Prepared {
    /// The requests and start state of `device`, with the recorded settings (the
    /// defaults where the file records none) and the guessed or given profile.
    pub fn new(
        snap: &Snapshot,
        device: i64,
        profile: Option<Profile>,
    ) -> Result<Prepared, NotReplayable> {
        let trace = snap
            .trace(device)
            .filter(|t| {
                (0..t.len()).any(|i| t.action(i) == Action::Alloc || t.action(i) == Action::Oom)
            })
            .ok_or(NotReplayable::NoTrace { device })?;
        let profile = profile.unwrap_or_else(|| Profile::guess(snap));
        let settings = Settings::of_snapshot(snap, profile).unwrap_or_default();
        if settings.backend_async {
            return Err(NotReplayable::AsyncBackend);
        }
        let pools = PoolLookup::new(
            snap.segments_of(device)
                .map(|s| (s.address, s.total_size, s.pool_id)),
        );
        // The requests (a forward pass) and the segments at the start (a backward one)
        // are independent.
        let (mut requests, segments) = rayon::join(
            || Requests::build(trace, &snap.frames, &pools),
            || crate::timeline::state::allocator_state(snap, device, None),
        );
        if let Some(what) = requests.too_many {
            return Err(NotReplayable::TooMany { what });
        }
        let probe = Allocator::new(settings.clone(), profile, None);
        let start = start::rebuild(
            snap,
            device,
            segments,
            &mut requests,
            &|s| probe.round_size(s),
            settings.expandable_segments,
        );
        let device_free = trace
            .oom_events()
            .map(|i| trace.get(i).device_free())
            .collect();
        Ok(Prepared {
            device,
            device_free,
            total_memory: None,
            settings,
            profile,
            requests,
            start,
        })
    }
}

impl Prepared {
    /// The highest address the recording uses: at the start or in a `segment_*` entry.
    pub fn top_address(&self) -> u64 {
        let outputs = self
            .requests
            .outputs
            .iter()
            .map(|o| o.addr.saturating_add(o.size));
        outputs.fold(self.start.top_address(), u64::max)
    }

    /// The lowest address the recording shows a segment at (at the start or in its
    /// `segment_*` entries; u64::MAX: none).
    pub fn low_address(&self) -> u64 {
        let outputs = self.requests.outputs.iter().map(|o| o.addr);
        outputs.fold(self.start.low_address(), u64::min)
    }

    /// The recording's reserved bytes: at the start (no event), then after each
    /// `segment_*` entry (its event), as its sizes add and take away.
    pub fn recorded_reserved(&self) -> Vec<(Option<u32>, u64)> {
        let mut out = vec![(None, self.start.reserved)];
        let mut reserved = self.start.reserved as i128;
        for o in &self.requests.outputs {
            match o.action {
                crate::model::Action::SegmentAlloc | crate::model::Action::SegmentMap => {
                    reserved += o.size as i128
                }
                _ => reserved -= o.size as i128,
            }
            out.push((Some(o.event), reserved.max(0) as u64));
        }
        out
    }

    /// Each recorded OOM and the capacity it implies, from the recording alone (the
    /// reserved bytes the segment events give when it failed, plus `device_free`).
    pub fn oom_capacities(&self) -> Vec<OomCapacity> {
        if self.requests.ooms == 0 {
            return Vec::new();
        }
        let probe = Allocator::new(self.settings.clone(), self.profile, None);
        let mut out = Vec::new();
        let mut reserved = self.start.reserved as i128;
        let mut most = self.start.reserved;
        for r in self.requests.iter() {
            let (Request::Alloc { outputs, .. }
            | Request::EmptyCache { outputs, .. }
            | Request::Oom { outputs, .. }) = &r
            else {
                continue;
            };
            for o in self.requests.outputs_of(outputs) {
                match o.action {
                    Action::SegmentAlloc | Action::SegmentMap => reserved += o.size as i128,
                    Action::SegmentFree | Action::SegmentUnmap => reserved -= o.size as i128,
                    _ => {}
                }
                most = most.max(reserved.max(0) as u64);
            }
            if let Request::Oom { size, event, .. } = r {
                let held = reserved.max(0) as u64;
                let free = self.device_free[out.len()];
                // The segment the failed request needed (a page, for expandable ones).
                let needed = probe.allocation_size(probe.round_size(size));
                let (limit, capacity) = match free {
                    None => (OomLimit::Unknown, None),
                    Some(f) if f >= needed => (OomLimit::MemoryFraction, Some(most)),
                    Some(f) => (OomLimit::DeviceFull, Some(held.saturating_add(f))),
                };
                out.push(OomCapacity {
                    event,
                    request_bytes: size,
                    reserved_bytes: held,
                    device_free_bytes: free,
                    limit,
                    capacity_bytes: capacity,
                });
            }
        }
        out
    }
}

/// A recorded OOM and the capacity it implies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OomCapacity {
    pub event: u32,
    pub request_bytes: u64,
    pub reserved_bytes: u64,
    pub device_free_bytes: Option<u64>,
    /// What limited the allocator.
    pub limit: OomLimit,
    /// The memory this process's allocator could hold then: `reserved_bytes +
    /// device_free_bytes` when the device was full; under a memory fraction, the most it
    /// held before (the limit lies between that and what the failed request needed).
    pub capacity_bytes: Option<u64>,
}

/// What a recorded OOM ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomLimit {
    /// The device had less free than the segment the request needed.
    DeviceFull,
    /// The device had room for the segment: a memory fraction
    /// (`torch.cuda.set_per_process_memory_fraction`) refused it.
    MemoryFraction,
    /// `device_free` not recorded.
    Unknown,
}
