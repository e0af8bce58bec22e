//! Leak suspects: groups whose live bytes keep growing across repeated steps and are
//! still alive at the moment asked about.
//!
//! The replay is sampled at evenly spaced states up to the moment. A group is a suspect
//! when its bytes there are a real share of the total, it grew steadily (never fell back,
//! rose in many samples, at least doubled) over at least a quarter of the window, and the
//! trace shows repeated steps before the moment: step annotations (`ProfilerStep#N`,
//! `Optimizer.step`) or the total falling back by a tenth of its high at least twice. A
//! single forward pass also grows steadily; without repeated steps nothing is a suspect.
//! Where only the falls show the steps, a suspect also grows from one fall to the next
//! at least twice: growth within one step (a backward's gradients) rises once at most.

use crate::analysis::kinds::attribution::{Attributor, GroupBy, GroupKind};
use crate::analysis::kinds::frames::user_frames;
use crate::analysis::moments::group_series::GroupSeries;
use crate::model::Snapshot;
use crate::timeline::replay::{DeviceReplay, Start, TotalsAt};
use serde::Serialize;

/// Samples of the replay up to the moment.
const SAMPLES: usize = 64;
/// Least share of the moment's total, and least bytes, a suspect holds.
const MIN_SHARE: f64 = 0.01;
const MIN_BYTES: u64 = 1 << 20;
/// Least samples in which a suspect grew.
const MIN_RISES: usize = 8;
/// A fall of the total by this share of its high counts as the end of a step.
const DROP: f64 = 0.10;

/// Why the trace is taken to hold repeated steps.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepEvidence {
    /// START annotations of steps (`ProfilerStep#N`, `Optimizer.step`) before the moment.
    pub step_annotations: usize,
    /// Times the requested total fell back by a tenth of its high before the moment.
    pub total_drops: usize,
}

impl StepEvidence {
    pub fn repeated(&self) -> bool {
        self.step_annotations >= 2 || self.total_drops >= 2
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LeakSuspect {
    /// The group's name (see `top`).
    pub name: String,
    pub kind: GroupKind,
    /// Live bytes at the moment (requested).
    pub bytes: u64,
    /// Live bytes when the group first appears in the samples.
    pub first_bytes: u64,
    /// bytes − first_bytes.
    pub growth_bytes: u64,
    /// Samples in which it grew (of the ones since it appeared).
    pub rises: usize,
    pub samples: usize,
    /// The event of the first sample it appears in (null: before the first event).
    pub since_event: Option<u32>,
    /// Category and frames of its largest allocation.
    pub category: String,
    pub frames: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LeakReport {
    /// The moment: just after this event.
    pub event: Option<u32>,
    pub total_bytes: u64,
    pub steps: StepEvidence,
    /// Largest first; empty without repeated steps.
    pub suspects: Vec<LeakSuspect>,
}

fn step_annotations(snap: &Snapshot, r: &DeviceReplay, at: Option<usize>) -> usize {
    let until = at
        .and_then(|i| (0..=i).rev().find_map(|j| r.trace.stamped_time(j)))
        .unwrap_or(i64::MAX);
    snap.external_annotations
        .iter()
        .filter(|a| {
            a.device == r.device
                && a.stage == "START"
                && a.time_us <= until
                && (a.name.starts_with("ProfilerStep#") || a.name.starts_with("Optimizer.step"))
        })
        .count()
}

/// The samples at which the total has fallen back by a tenth of its high: the ends of
/// steps, as the totals show them.
fn drop_samples(totals: &[u64]) -> Vec<usize> {
    let high_water = totals.iter().copied().max().unwrap_or(0) as f64;
    let mut high = 0u64;
    let mut out = Vec::new();
    for (k, &t) in totals.iter().enumerate() {
        if t > high {
            high = t;
        } else if (high - t) as f64 >= DROP * high_water && high_water > 0.0 {
            out.push(k);
            high = t;
        }
    }
    out
}

/// Whether a group's bytes rose from one step's end to the next at least twice (the
/// ends: the samples in `ends` from `first` on, and the moment): growth within one
/// step (gradients made in a backward, then kept) rises once at most.
fn grew_across_steps(v: &[u64], first: usize, ends: &[usize]) -> bool {
    let mut at: Vec<u64> = ends
        .iter()
        .filter(|&&k| k >= first)
        .map(|&k| v[k])
        .collect();
    at.push(v[v.len() - 1]);
    let tolerance = v[v.len() - 1] / 100;
    at.windows(2).filter(|w| w[1] > w[0] + tolerance).count() >= 2
}

/// Leak suspects up to the state just after event `at` (None: the last event).
pub fn find_leaks(
    snap: &Snapshot,
    r: &DeviceReplay,
    attr: &Attributor,
    by: GroupBy,
    at: Option<usize>,
) -> LeakReport {
    let mut sampler = LeakSampler::new(r, attr, by, at);
    let start = r.run(&mut sampler);
    sampler.finish(snap, r, start)
}

/// The samples the leak search takes, as an aggregator to run beside others in one
/// replay; [`LeakSampler::finish`] gives the report.
pub struct LeakSampler<'a> {
    attr: &'a Attributor<'a>,
    last: Option<usize>,
    states: Vec<usize>,
    groups: GroupSeries<'a>,
    totals: TotalsAt,
}

impl<'a> LeakSampler<'a> {
    pub fn new(r: &DeviceReplay, attr: &'a Attributor<'a>, by: GroupBy, at: Option<usize>) -> Self {
        let last = at.or(r.len().checked_sub(1));
        let end_state = last.map_or(0, |i| i + 1);
        // Evenly spaced states from the first event to the moment, the moment last.
        let mut states: Vec<usize> = (1..=SAMPLES)
            .map(|j| (end_state * j).div_ceil(SAMPLES).max(1).min(end_state))
            .collect();
        states.dedup();
        let groups = GroupSeries::new(attr, by, states.clone());
        let totals = TotalsAt::new(states.iter().map(|&k| k.checked_sub(1)).collect());
        LeakSampler {
            attr,
            last,
            states,
            groups,
            totals,
        }
    }

    /// The report, from the replay's start.
    pub fn finish(self, snap: &Snapshot, r: &DeviceReplay, start: Start) -> LeakReport {
        let LeakSampler {
            attr,
            last,
            states,
            groups,
            totals,
        } = self;
        let total: Vec<u64> = totals
            .values
            .iter()
            .map(|v| start.requested_after(v))
            .collect();
        let ends = drop_samples(&total);
        let steps = StepEvidence {
            step_annotations: step_annotations(snap, r, last),
            total_drops: ends.len(),
        };
        // Steps known by the total's falls alone: a suspect grows from one end to the next.
        let by_drops = steps.step_annotations < 2;
        let n = states.len();
        let moment_total = total.last().copied().unwrap_or(0);
        let mut suspects = Vec::new();
        if steps.repeated() && n >= 4 {
            for g in groups.values() {
                let v = &g.values;
                let bytes = v[n - 1];
                if bytes < MIN_BYTES || (bytes as f64) < MIN_SHARE * moment_total as f64 {
                    continue;
                }
                let Some(first) = v.iter().position(|&b| b > 0) else {
                    continue;
                };
                let tolerance = bytes / 100;
                let steady = v[first..].windows(2).all(|w| w[1] + tolerance >= w[0]);
                let rises = v[first..].windows(2).filter(|w| w[1] > w[0]).count();
                if !steady || rises < MIN_RISES || (n - 1 - first) * 4 < n || bytes < 2 * v[first] {
                    continue;
                }
                if by_drops && !grew_across_steps(v, first, &ends) {
                    continue;
                }
                suspects.push(LeakSuspect {
                    name: attr.name(&g.key),
                    kind: Attributor::kind(&g.key),
                    bytes,
                    first_bytes: v[first],
                    growth_bytes: bytes - v[first],
                    rises,
                    samples: n - first,
                    since_event: states[first].checked_sub(1).map(|i| i as u32),
                    category: attr.categories[g.main_category as usize].clone(),
                    frames: user_frames(attr.frames(), Attributor::allocation_stack(&g.largest), 8),
                });
            }
        }
        suspects.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
        LeakReport {
            event: last.map(|i| i as u32),
            total_bytes: moment_total,
            steps,
            suspects,
        }
    }
}

crate::aggregator_of_fields!(LeakSampler<'_>, groups, totals);
