//! Would an allocator setting have let a recorded OOM's request through? Each recorded
//! `oom` replayed through the allocator model at the capacity it implies (what the
//! allocator held then plus what the device had free), under the settings `oom` would
//! otherwise only suggest: `expandable_segments:True`, a `max_split_size_mb`, and
//! garbage collection under a memory fraction.
//!
//! Takes a snapshot and a device; gives, per recorded OOM, an [`OomWhatIf`]: how well the
//! model reproduced the recording and, per setting, whether the request goes through and
//! with how much to spare. `oom` offers a setting only where this shows it helps (or where
//! the model cannot say).

use crate::allocator::Settings;
use crate::allocator::identity::check;
use crate::allocator::prepared::Prepared;
use crate::allocator::scenario::{Scenario, run};
use crate::model::Snapshot;
use serde::Serialize;

/// The settings tried, each one change from the recording's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tried {
    ExpandableSegments,
    MaxSplitSize,
    GcThreshold,
}

/// `max_split_size_mb` values tried; the one with the most to spare is reported.
const MAX_SPLIT_MB: [u64; 4] = [64, 128, 256, 512];
/// The threshold tried, under a memory fraction covering the capacity.
const GC_THRESHOLD: f64 = 0.8;

/// One setting at the OOM's capacity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SettingTry {
    pub setting: Tried,
    /// The settings replayed, in `PYTORCH_CUDA_ALLOC_CONF` syntax.
    pub alloc_conf: String,
    /// The recorded request goes through.
    pub lets_through: bool,
    /// Capacity minus the most the allocator reserved up to the end of the trace
    /// (negative: short by that much); null when the setting does not let it through.
    pub spare_bytes: Option<i64>,
    /// A later request that runs out of memory instead (trace entry), when one does.
    pub later_oom_event: Option<u32>,
    /// What it spares is under [`THIN_MARGIN`] of the capacity: a slightly larger step
    /// would run out of memory again.
    pub thin_margin: bool,
}

/// A margin under this share of the capacity is thin.
pub const THIN_MARGIN: f64 = 0.05;

/// The what-ifs of one recorded OOM.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OomWhatIf {
    /// The model replays this device's recording exactly (every allocation at its
    /// address, every segment event and OOM); when not, the answers are estimates.
    pub model_exact: bool,
    pub allocations: u64,
    pub allocations_at_recorded_address: u64,
    pub segment_events: u64,
    pub segment_events_reproduced: u64,
    /// The capacity the OOM implies, and what limited it.
    pub capacity_bytes: u64,
    pub limit: crate::allocator::prepared::OomLimit,
    /// The recorded settings alone run out of memory at this request at that capacity
    /// (the check that the capacity is the right one).
    pub reproduced: bool,
    pub tries: Vec<SettingTry>,
}

/// The what-ifs of the first `first` recorded OOMs of `device` (trace entry → answers;
/// an OOM that does not say what the device had free has none); empty when the device
/// cannot be replayed.
pub fn what_ifs(snap: &Snapshot, device: i64, first: usize) -> Vec<(u32, OomWhatIf)> {
    match Prepared::new(snap, device, None) {
        Ok(p) => what_ifs_of(&p, &check(snap, &p), first),
        Err(_) => Vec::new(),
    }
}

/// What a replay at an OOM's capacity gave: its first OOM's trace entry and its peak.
type Replayed = Option<(Option<u32>, u64)>;

/// The replays made, by capacity, settings and device total.
type Replays = std::collections::BTreeMap<(u64, String, Option<u64>), Replayed>;

/// [`what_ifs`] of a device's recording prepared already (under the profile the caller
/// models) and checked. OOMs that imply the same capacity share their replays: a
/// recording of thousands of identical OOMs costs one set.
pub fn what_ifs_of(
    p: &Prepared,
    id: &crate::allocator::identity::Identity,
    first: usize,
) -> Vec<(u32, OomWhatIf)> {
    let mut out = Vec::new();
    let replays: std::cell::RefCell<Replays> = Default::default();
    for oc in id.oom_capacities.iter().take(first) {
        let Some(capacity) = oc.capacity_bytes else {
            continue;
        };
        let at = |settings: Settings, total: Option<u64>| -> Replayed {
            let key = (capacity, format!("{settings:?}"), total);
            if let Some(r) = replays.borrow().get(&key) {
                return *r;
            }
            let r = run(
                p,
                &Scenario {
                    settings,
                    capacity: Some(capacity),
                    total_memory: total,
                },
            )
            .ok()
            .map(|o| (o.first_oom.map(|f| f.event), o.peak_reserved_bytes));
            replays.borrow_mut().insert(key, r);
            r
        };
        let base = at(p.settings.clone(), None);
        let reproduced = base.and_then(|o| o.0).is_some_and(|e| e == oc.event);
        let try_one = |setting: Tried, s: Settings, total: Option<u64>| -> Option<SettingTry> {
            let (first_oom, peak) = at(s.clone(), total)?;
            // A replay that stops at an earlier OOM does not reach this one.
            let later = first_oom.filter(|&e| e > oc.event);
            let lets_through = first_oom.is_none_or(|e| e > oc.event);
            let spare_bytes =
                (lets_through && later.is_none()).then(|| capacity as i64 - peak as i64);
            Some(SettingTry {
                setting,
                alloc_conf: s.to_conf(),
                lets_through,
                spare_bytes,
                later_oom_event: later,
                thin_margin: spare_bytes
                    .is_some_and(|sp| (sp as f64) < THIN_MARGIN * capacity as f64),
            })
        };
        let mut tries = Vec::new();
        if !p.settings.expandable_segments {
            let s = Settings {
                expandable_segments: true,
                ..p.settings.clone()
            };
            tries.extend(try_one(Tried::ExpandableSegments, s, None));
        }
        if p.settings.max_split_size == u64::MAX {
            // The value with the most to spare among those that let it through, else the
            // first.
            let all: Vec<SettingTry> = MAX_SPLIT_MB
                .iter()
                .filter_map(|&mb| {
                    let s = Settings {
                        max_split_size: mb << 20,
                        ..p.settings.clone()
                    };
                    try_one(Tried::MaxSplitSize, s, None)
                })
                .collect();
            let best = all
                .iter()
                .filter(|t| t.lets_through && t.later_oom_event.is_none())
                .max_by_key(|t| t.spare_bytes)
                .or(all.first())
                .cloned();
            tries.extend(best);
        }
        if p.settings.gc_threshold <= 0.0 {
            // Garbage collection acts only under a memory fraction: one of the whole
            // capacity (the device's total is not in the file).
            let s = Settings {
                gc_threshold: GC_THRESHOLD,
                memory_fraction: Some(1.0),
                ..p.settings.clone()
            };
            tries.extend(try_one(Tried::GcThreshold, s, Some(capacity)));
        }
        out.push((
            oc.event,
            OomWhatIf {
                model_exact: id.exact(),
                allocations: id.allocations,
                allocations_at_recorded_address: id.allocations_at_recorded_address,
                segment_events: id.segment_events,
                segment_events_reproduced: id.segment_events_reproduced,
                capacity_bytes: capacity,
                limit: oc.limit,
                reproduced,
                tries,
            },
        ));
    }
    out
}

impl OomWhatIf {
    /// Under a memory fraction this replay finds (the device had room), the most the
    /// allocator held under it: the limit `oom` and `budget` judge where the request
    /// fell short against, in place of what it held plus what the device had free.
    pub fn fraction_limit(&self) -> Option<u64> {
        (self.limit == crate::allocator::prepared::OomLimit::MemoryFraction)
            .then_some(self.capacity_bytes)
    }

    /// The answers can be relied on: the model replays the recording exactly and runs
    /// out of memory at this request at the capacity.
    pub fn tested(&self) -> bool {
        self.model_exact && self.reproduced
    }

    /// The settings shown to let the request through with nothing later running out of
    /// memory, the most to spare first (none unless [`OomWhatIf::tested`]).
    pub fn proven(&self) -> Vec<&SettingTry> {
        if !self.tested() {
            return Vec::new();
        }
        let mut p: Vec<&SettingTry> = self
            .tries
            .iter()
            .filter(|t| t.lets_through && t.later_oom_event.is_none())
            .filter(|t| t.spare_bytes.is_some_and(|sp| sp >= 0))
            .collect();
        p.sort_by_key(|t| std::cmp::Reverse(t.spare_bytes));
        p
    }
}
