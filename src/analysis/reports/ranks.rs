//! Several snapshots of one job (a folder of ranks): one row per file (its most active
//! device), the ranks whose peak stands out from the median, and the groups that differ
//! between the largest rank and the median one.

use crate::analysis::device::choose_device;
use crate::analysis::kinds::attribution::{AttributionOptions, GroupBy, GroupKind};
use crate::analysis::moments::moment::Moment;
use crate::analysis::reports::diff::{GroupChange, diff};
use crate::analysis::reports::top::{TopReport, analyze_top};
use crate::model::Snapshot;
use crate::timeline::replay::{DeviceReplay, Peaks};
use serde::Serialize;

pub const SCHEMA_VERSION: u32 = 1;
/// A rank is an outlier when its peak exceeds the median's by this share.
pub const OUTLIER_MARGIN: f64 = 0.10;

/// What one file contributes.
pub struct RankInput {
    pub path: String,
    pub device: i64,
    pub peak_requested_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    pub reserved_bytes: u64,
    pub ooms: usize,
    /// Every group at the requested peak (None without a trace).
    pub top: Option<TopReport>,
}

/// Reads what a rank row needs from one snapshot.
pub fn rank_input(
    snap: &Snapshot,
    path: &str,
    options: &AttributionOptions,
    by: GroupBy,
) -> Option<RankInput> {
    let choice = choose_device(snap, None).ok()?;
    let r = DeviceReplay::new(snap, choice.device);
    let attr = crate::analysis::kinds::categories::bound_attributor(&r, options);
    let traced = r.has_timeline();
    // The peaks in the replay that finds what was live at the peak; a file without a
    // timeline has neither.
    let mut peaks = Peaks::default();
    let top = traced
        .then(|| {
            analyze_top(
                &r,
                path,
                &choice,
                Moment::Peak,
                by,
                usize::MAX,
                &attr,
                &mut peaks,
            )
            .ok()
        })
        .flatten();
    if traced && top.is_none() {
        r.run(&mut peaks);
    }
    Some(RankInput {
        path: path.to_string(),
        device: choice.device,
        peak_requested_bytes: traced.then_some(peaks.requested.bytes),
        peak_reserved_bytes: traced.then_some(peaks.reserved.bytes),
        reserved_bytes: snap.segments_of(choice.device).map(|s| s.total_size).sum(),
        ooms: r.trace.oom_events().count(),
        top,
    })
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RankRow {
    pub path: String,
    pub device: i64,
    /// Null without a trace.
    pub peak_requested_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    /// Reserved at the end (the final segments).
    pub reserved_bytes: u64,
    pub ooms: usize,
    /// The largest group at the peak, and its bytes.
    pub top_group: Option<crate::analysis::reports::top::GroupName>,
    pub top_group_kind: Option<GroupKind>,
    pub top_group_bytes: Option<u64>,
    /// Peak over the median peak, rounded to 4 decimals.
    pub peak_over_median: Option<f64>,
    pub outlier: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RanksReport {
    pub schema_version: u32,
    /// Always "ranks" (it sits beside per-file objects in `summary --json`).
    pub kind: &'static str,
    pub by: GroupBy,
    pub rows: Vec<RankRow>,
    pub median_peak_bytes: Option<u64>,
    /// The file with the largest peak, and the one at the median.
    pub largest: Option<String>,
    pub median: Option<String>,
    /// Groups at the peak, largest rank against the median rank, largest change first.
    pub differences: Vec<GroupChange>,
    /// Every file's name states a size of one kind (`seq512`, `bs8`), and they differ:
    /// one model at several sizes, not ranks of one job, so no file is an outlier; null
    /// otherwise.
    pub series: Option<RanksSeries>,
}

/// The sizes a series of files states in their names.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct RanksSeries {
    pub vary: crate::analysis::budget::Vary,
    pub smallest: u64,
    pub largest: u64,
}

/// The series the files' names state, when every name states a size of one kind and
/// the sizes differ.
fn series_of(inputs: &[RankInput]) -> Option<RanksSeries> {
    let sizes: Vec<(crate::analysis::budget::Vary, u64)> = inputs
        .iter()
        .map(|r| crate::analysis::budget::size_from_name(&r.path, None))
        .collect::<Option<_>>()?;
    let vary = sizes.first()?.0;
    if sizes.iter().any(|s| s.0 != vary) {
        return None;
    }
    let smallest = sizes.iter().map(|s| s.1).min()?;
    let largest = sizes.iter().map(|s| s.1).max()?;
    (smallest != largest).then_some(RanksSeries {
        vary,
        smallest,
        largest,
    })
}

pub fn analyze_ranks(inputs: Vec<RankInput>, by: GroupBy, differences: usize) -> RanksReport {
    let mut peaks: Vec<(u64, usize)> = inputs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.peak_requested_bytes.map(|p| (p, i)))
        .collect();
    peaks.sort_unstable();
    // The lower median of an even count, so it is a real rank.
    let median = peaks.get(peaks.len().saturating_sub(1) / 2).copied();
    let largest = peaks.last().copied();
    let series = series_of(&inputs);
    let rows = inputs
        .iter()
        .map(|r| {
            let ratio = match (r.peak_requested_bytes, median) {
                (Some(p), Some((m, _))) if m > 0 => Some(crate::analysis::share(p, m)),
                _ => None,
            };
            let top = r.top.as_ref().and_then(|t| t.groups.first());
            RankRow {
                path: r.path.clone(),
                device: r.device,
                peak_requested_bytes: r.peak_requested_bytes,
                peak_reserved_bytes: r.peak_reserved_bytes,
                reserved_bytes: r.reserved_bytes,
                ooms: r.ooms,
                top_group: top.map(|g| g.name.clone()),
                top_group_kind: top.map(|g| g.kind),
                top_group_bytes: top.map(|g| g.bytes),
                peak_over_median: ratio,
                outlier: series.is_none() && ratio.is_some_and(|x| x > 1.0 + OUTLIER_MARGIN),
            }
        })
        .collect();
    let differences = match (largest, median) {
        (Some((_, l)), Some((_, m))) if l != m => match (&inputs[m].top, &inputs[l].top) {
            (Some(base), Some(new)) => diff(base, new)
                .groups
                .into_iter()
                .filter(|g| g.delta_bytes != 0)
                .take(differences)
                .collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    RanksReport {
        schema_version: SCHEMA_VERSION,
        kind: "ranks",
        by,
        rows,
        median_peak_bytes: median.map(|m| m.0),
        largest: largest.map(|(_, i)| inputs[i].path.clone()),
        median: median.map(|(_, i)| inputs[i].path.clone()),
        differences,
        series,
    }
}
