//! Two snapshots compared by group (call site, category, stack or file), not by address:
//! bytes and counts in each at a moment, the change, and which groups are new or gone.
//! The changes add up to the difference of the two totals. And the budget check built on
//! it: a peak against a limit or a baseline.

use crate::analysis::kinds::attribution::{GroupBy, GroupKind};
use crate::analysis::moments::moment::Moment;
use crate::analysis::reports::top::{Group, GroupName, TopReport};
use crate::timeline::replay::Peaks;
use serde::Serialize;
use std::collections::BTreeMap;

pub const SCHEMA_VERSION: u32 = 1;

/// One side of the comparison.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Side {
    pub path: String,
    pub device: i64,
    pub moment: crate::analysis::moments::moment::ResolvedMoment,
    /// Requested bytes alive at the moment.
    pub total_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: i64,
}

impl Side {
    fn of(r: &TopReport) -> Side {
        Side {
            path: r.path.clone(),
            device: r.device,
            moment: r.moment,
            total_bytes: r.total_bytes,
            allocated_bytes: r.allocated_bytes,
            reserved_bytes: r.reserved_bytes,
        }
    }
}

/// How a group changed.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    New,
    Gone,
    Grew,
    Shrank,
    Same,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GroupChange {
    pub name: GroupName,
    pub kind: GroupKind,
    pub change: Change,
    pub base_bytes: u64,
    pub new_bytes: u64,
    pub delta_bytes: i64,
    pub base_count: usize,
    pub new_count: usize,
    pub category: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DiffReport {
    pub schema_version: u32,
    pub by: GroupBy,
    pub base: Side,
    pub new: Side,
    /// new.total_bytes − base.total_bytes: the groups' deltas add up to it.
    pub delta_bytes: i64,
    /// Largest change first (by absolute value), ties by name.
    pub groups: Vec<GroupChange>,
}

/// Compares the full group lists of two `top` reports (no limit applied).
pub fn diff(base: &TopReport, new: &TopReport) -> DiffReport {
    let mut table: BTreeMap<GroupName, (Option<&Group>, Option<&Group>)> = BTreeMap::new();
    for g in &base.groups {
        table.entry(g.name.clone()).or_default().0 = Some(g);
    }
    for g in &new.groups {
        table.entry(g.name.clone()).or_default().1 = Some(g);
    }
    let mut groups: Vec<GroupChange> = table
        .into_iter()
        .map(|(name, (b, n))| {
            let base_bytes = b.map_or(0, |g| g.bytes);
            let new_bytes = n.map_or(0, |g| g.bytes);
            let delta = new_bytes as i64 - base_bytes as i64;
            let any = n.or(b).expect("one side has it");
            GroupChange {
                name,
                kind: any.kind,
                change: match (b, n) {
                    (None, _) => Change::New,
                    (_, None) => Change::Gone,
                    _ if delta > 0 => Change::Grew,
                    _ if delta < 0 => Change::Shrank,
                    _ => Change::Same,
                },
                base_bytes,
                new_bytes,
                delta_bytes: delta,
                base_count: b.map_or(0, |g| g.count),
                new_count: n.map_or(0, |g| g.count),
                category: any.category.clone(),
            }
        })
        .collect();
    groups.sort_by(|a, b| {
        b.delta_bytes
            .unsigned_abs()
            .cmp(&a.delta_bytes.unsigned_abs())
            .then_with(|| a.name.cmp(&b.name))
    });
    DiffReport {
        schema_version: SCHEMA_VERSION,
        by: new.by,
        base: Side::of(base),
        new: Side::of(new),
        delta_bytes: new.total_bytes as i64 - base.total_bytes as i64,
        groups,
    }
}

/// The changes past `limit`, merged as `top` merges its groups past a limit
/// ([`crate::analysis::reports::top::limit_groups`]): one change named [`GroupName::Rest`], its figures the
/// sums of theirs. None when all fit.
pub fn merge_rest(groups: &[GroupChange], limit: usize) -> Option<GroupChange> {
    let rest = groups.get(limit..).filter(|r| !r.is_empty())?;
    let base_bytes: u64 = rest.iter().map(|g| g.base_bytes).sum();
    let new_bytes: u64 = rest.iter().map(|g| g.new_bytes).sum();
    let delta_bytes: i64 = rest.iter().map(|g| g.delta_bytes).sum();
    Some(GroupChange {
        name: GroupName::Rest { groups: rest.len() },
        kind: GroupKind::Rest,
        change: match delta_bytes {
            d if d > 0 => Change::Grew,
            d if d < 0 => Change::Shrank,
            _ => Change::Same,
        },
        base_bytes,
        new_bytes,
        delta_bytes,
        base_count: rest.iter().map(|g| g.base_count).sum(),
        new_count: rest.iter().map(|g| g.new_count).sum(),
        category: String::new(),
    })
}

/// What `check` compares.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Peak of allocated block bytes (`torch.cuda.max_memory_allocated()`).
    Allocated,
    /// Peak of requested bytes (the official viewer's timeline).
    Requested,
    /// Peak of reserved bytes (`torch.cuda.max_memory_reserved()`).
    Reserved,
}

impl std::str::FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "allocated" => Ok(Metric::Allocated),
            "requested" => Ok(Metric::Requested),
            "reserved" => Ok(Metric::Reserved),
            _ => Err(format!(
                "expected allocated, requested or reserved, found {s:?}"
            )),
        }
    }
}

/// Which limit `check` holds a file to.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// An absolute budget (`--max-peak`).
    MaxPeak,
    /// The baseline's figure plus the tolerance.
    Baseline,
}

/// One limit and whether the peak kept it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Limit {
    pub kind: LimitKind,
    pub limit_bytes: u64,
    pub passed: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckReport {
    pub schema_version: u32,
    pub path: String,
    pub device: i64,
    pub metric: Metric,
    /// The figure checked: the peak, or the value at `moment`.
    pub peak_bytes: u64,
    /// The moment checked with `--at` (null: the peak).
    pub moment: Option<crate::analysis::moments::moment::ResolvedMoment>,
    /// The file has no timeline: the "peak" is its final state, all it knows.
    pub final_state_only: bool,
    pub baseline_path: Option<String>,
    pub baseline_peak_bytes: Option<u64>,
    /// Tolerance over the baseline, in percent.
    pub tolerance_percent: Option<f64>,
    pub limits: Vec<Limit>,
    pub passed: bool,
    /// Against the baseline (at each one's peak), the groups that grew, largest first.
    pub grew: Vec<GroupChange>,
}

/// What `check` measures of one file: every group alive at the moment checked, and the
/// file's peaks, from one replay ([`measure`]).
#[derive(Debug)]
pub struct Measured {
    pub top: TopReport,
    pub peaks: Peaks,
}

/// Every group alive at `moment` on the chosen device, and the device's peaks; `bind`
/// makes the attributor bound to its categories, beside the replay.
pub fn measure<'a>(
    r: &crate::timeline::replay::DeviceReplay,
    path: &str,
    choice: &crate::analysis::device::DeviceChoice,
    moment: Moment,
    by: GroupBy,
    bind: impl FnOnce() -> crate::analysis::kinds::attribution::Attributor<'a> + Send,
) -> Result<Measured, crate::analysis::moments::moment::MomentError> {
    use crate::analysis::reports::top::{Versions, resolve_live_bound, top_of};
    let mut peaks = Peaks::default();
    let (found, attr) = resolve_live_bound(r, moment, Versions::Counted, &mut peaks, bind);
    let top = top_of(r, path, choice, found?, by, usize::MAX, &attr);
    Ok(Measured { top, peaks })
}

/// The limits `check` holds a file to.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOptions {
    pub metric: Metric,
    /// The moment asked for (None: the peak).
    pub at: Option<Moment>,
    /// `--max-peak`.
    pub max_peak: Option<u64>,
    /// Percent the figure may exceed the baseline's.
    pub tolerance_percent: f64,
}

impl Measured {
    /// The figure checked: the peak of the metric, or its value at the moment asked for.
    fn value(&self, options: &CheckOptions) -> u64 {
        match options.at {
            None | Some(Moment::Peak) => match options.metric {
                Metric::Allocated => self.peaks.allocated.bytes,
                Metric::Requested => self.peaks.requested.bytes,
                Metric::Reserved => self.peaks.reserved.bytes,
            },
            Some(_) => match options.metric {
                Metric::Allocated => self.top.allocated_bytes,
                Metric::Requested => self.top.total_bytes,
                Metric::Reserved => self.top.reserved_bytes.max(0) as u64,
            },
        }
    }
}

/// The budget gate: the file's figure against `--max-peak` and/or the baseline's figure
/// plus the tolerance, with the groups that grew against the baseline.
pub fn check(
    file: &Measured,
    baseline: Option<(&str, &Measured)>,
    options: &CheckOptions,
) -> CheckReport {
    let report = &file.top;
    let peak = file.value(options);
    let mut limits = Vec::new();
    if let Some(max) = options.max_peak {
        limits.push(Limit {
            kind: LimitKind::MaxPeak,
            limit_bytes: max,
            passed: peak <= max,
        });
    }
    let mut baseline_peak = None;
    let mut grew = Vec::new();
    if let Some((_, base)) = baseline {
        let base_value = base.value(options);
        baseline_peak = Some(base_value);
        let limit = (base_value as f64 * (1.0 + options.tolerance_percent / 100.0)).floor() as u64;
        limits.push(Limit {
            kind: LimitKind::Baseline,
            limit_bytes: limit,
            passed: peak <= limit,
        });
        grew = diff(&base.top, report)
            .groups
            .into_iter()
            .filter(|g| g.delta_bytes > 0)
            .collect();
    }
    let passed = limits.iter().all(|l| l.passed);
    CheckReport {
        schema_version: SCHEMA_VERSION,
        path: report.path.clone(),
        device: report.device,
        metric: options.metric,
        peak_bytes: peak,
        moment: options
            .at
            .as_ref()
            .filter(|m| **m != Moment::Peak)
            .map(|_| report.moment),
        final_state_only: !report.moment.has_timeline,
        baseline_path: baseline.map(|(path, _)| path.to_string()),
        baseline_peak_bytes: baseline_peak,
        tolerance_percent: baseline.map(|_| options.tolerance_percent),
        limits,
        passed,
        grew,
    }
}
