//! Several snapshots of one job (a folder of ranks): one row per file (its most active
//! device), the ranks whose peak stands out from the median, and the groups that differ
//! between the largest rank and the median one.

use crate::analysis::device::choose_device;
use crate::analysis::kinds::attribution::{AttributionOptions, GroupBy, GroupKind};
use crate::analysis::moments::moment::Moment;
use crate::analysis::reports::diff::{GroupChange, diff};
use crate::analysis::reports::top::TopReport;
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
    let traced = r.has_timeline();
    // The peaks in the replay that finds what was live at the peak; a file without a
    // timeline has neither.
    let mut peaks = Peaks::default();
    let top = traced
        .then(|| {
            use crate::analysis::reports::top::{Versions, resolve_live_bound, top_of};
            let bind = || crate::analysis::kinds::categories::bound_attributor(&r, options);
            let (found, attr) =
                resolve_live_bound(&r, Moment::Peak, Versions::Counted, &mut peaks, bind);
            let found = found.ok()?;
            Some(top_of(&r, path, &choice, found, by, usize::MAX, &attr))
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
    /// Every file's name states a model size (`small`, `xl`, `2.7B`, `7b`) and they
    /// differ: several models, not ranks of one job, so no file is an outlier. The sizes
    /// named, in the files' order, each once; null otherwise.
    pub model_sizes: Option<Vec<String>>,
}

/// The sizes a series of files states in their names.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct RanksSeries {
    /// The kind of size the names state (`seq512`, `bs8`); null when they name none but
    /// differ only in one number that is no rank's (`small_128`, `small_1024`).
    pub vary: Option<crate::analysis::budget::Vary>,
    pub smallest: u64,
    pub largest: u64,
}

/// The series the files' names state: every name states a size of one kind and the
/// sizes differ; or the names differ only in one number ([`varying_number`]) that is not
/// a rank's: neither after a word that names ranks (`rank3`, `gpu_1`) nor a run of
/// consecutive numbers from 0 or 1 (`rank0`..`rank7`, `part1`..`part4`).
fn series_of(inputs: &[RankInput]) -> Option<RanksSeries> {
    let named: Option<Vec<(crate::analysis::budget::Vary, u64)>> = inputs
        .iter()
        .map(|r| crate::analysis::budget::size_from_name(&r.path, None))
        .collect();
    let (vary, sizes) = match named {
        Some(sizes) => {
            let vary = sizes.first()?.0;
            if sizes.iter().any(|s| s.0 != vary) {
                return None;
            }
            (Some(vary), sizes.into_iter().map(|s| s.1).collect())
        }
        None => {
            let names: Vec<&str> = inputs.iter().map(|r| r.path.as_str()).collect();
            let (word, numbers) = varying_number(&names)?;
            let rank_word = RANK_WORDS.iter().any(|w| word.ends_with(w));
            let mut sorted = numbers.clone();
            sorted.sort_unstable();
            let consecutive = sorted.windows(2).all(|w| w[1] == w[0] + 1)
                && sorted.first().is_some_and(|&f| f <= 1);
            if rank_word || consecutive {
                return None;
            }
            (None, numbers)
        }
    };
    let smallest = sizes.iter().copied().min()?;
    let largest = sizes.iter().copied().max()?;
    (smallest != largest).then_some(RanksSeries {
        vary,
        smallest,
        largest,
    })
}

/// Words that name a model's size in a file name (GPT-2's and T5's sizes).
const MODEL_SIZE_WORDS: [&str; 11] = [
    "tiny", "mini", "small", "base", "medium", "large", "xl", "xxl", "2xl", "huge", "giant",
];

/// A model size a file name states: a word of [`MODEL_SIZE_WORDS`], or a parameter count
/// such as `125m`, `2.7B` or `7b`, as one of the name's parts between `_`, `-` and `/`.
fn model_size_in(name: &str) -> Option<String> {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let stem = base.split_once('.').map_or(base, |(s, rest)| {
        // Keep a decimal count (`2.7B`) whole: cut at the extension's dot only.
        if rest.starts_with(|c: char| c.is_ascii_digit()) {
            base.rsplit_once('.').map_or(base, |(s, _)| s)
        } else {
            s
        }
    });
    stem.split(['_', '-']).find_map(|part| {
        let lower = part.to_ascii_lowercase();
        let count = lower
            .strip_suffix(['m', 'b'])
            .is_some_and(|n| !n.is_empty() && n.parse::<f64>().is_ok_and(|x| x > 0.0));
        (MODEL_SIZE_WORDS.contains(&lower.as_str()) || count).then(|| part.to_string())
    })
}

/// The model sizes the files' names state, when every name states one and they differ.
fn model_sizes_of(inputs: &[RankInput]) -> Option<Vec<String>> {
    let sizes: Vec<String> = inputs
        .iter()
        .map(|r| model_size_in(&r.path))
        .collect::<Option<_>>()?;
    let mut distinct: Vec<String> = Vec::new();
    for s in sizes {
        if !distinct.iter().any(|d| d.eq_ignore_ascii_case(&s)) {
            distinct.push(s);
        }
    }
    (distinct.len() > 1).then_some(distinct)
}

/// Words a rank's number follows in a file name (`rank3`, `local_rank_1`, `gpu0`,
/// `device-2`, `node1`, `worker_4`, `proc7`, `pid`), lower case, separators dropped.
const RANK_WORDS: [&str; 9] = [
    "rank", "gpu", "device", "dev", "cuda", "node", "worker", "proc", "pid",
];

/// When the files' names (their last path component) are one template with one number
/// that differs from name to name, every other part equal: the letters just before that
/// number (lower case, separators dropped) and each name's number. None for fewer than
/// two names, names of other shapes, or numbers of more than 18 digits.
fn varying_number(names: &[&str]) -> Option<(String, Vec<u64>)> {
    fn parts(name: &str) -> Vec<(bool, &str)> {
        let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
        let mut out: Vec<(bool, &str)> = Vec::new();
        let mut start = 0;
        let bytes = base.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &base[start..i]));
                start = i;
            }
        }
        out
    }
    if names.len() < 2 {
        return None;
    }
    let all: Vec<Vec<(bool, &str)>> = names.iter().map(|n| parts(n)).collect();
    let shape = &all[0];
    if all.iter().any(|p| p.len() != shape.len()) {
        return None;
    }
    let mut varying = None;
    for k in 0..shape.len() {
        if all.iter().all(|p| p[k] == shape[k]) {
            continue;
        }
        if varying.is_some() || !all.iter().all(|p| p[k].0) {
            return None;
        }
        varying = Some(k);
    }
    let k = varying?;
    let numbers: Vec<u64> = all
        .iter()
        .map(|p| (p[k].1.len() <= 18).then(|| p[k].1.parse().ok()).flatten())
        .collect::<Option<_>>()?;
    let word: String = k
        .checked_sub(1)
        .map(|j| shape[j].1)
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphabetic())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    Some((word, numbers))
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
    let model_sizes = if series.is_none() {
        model_sizes_of(&inputs)
    } else {
        None
    };
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
                outlier: series.is_none()
                    && model_sizes.is_none()
                    && ratio.is_some_and(|x| x > 1.0 + OUTLIER_MARGIN),
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
        model_sizes,
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn model_sizes_and_varying_numbers_in_names() {
        assert_eq!(
            model_size_in("a/memory_snapshot_2.7B_bwd.pickle").as_deref(),
            Some("2.7B")
        );
        assert_eq!(
            model_size_in("memory_snapshot_xl_bwd.pickle").as_deref(),
            Some("xl")
        );
        assert_eq!(model_size_in("llama-7b.pickle.gz").as_deref(), Some("7b"));
        assert_eq!(model_size_in("rank0_memory_snapshot.pickle"), None);
        assert_eq!(model_size_in("snapshot_b.pickle"), None);
        assert_eq!(
            varying_number(&["x/small_128_fwd.pickle", "x/small_1024_fwd.pickle"]),
            Some(("small".to_string(), vec![128, 1024]))
        );
        assert_eq!(
            varying_number(&["rank0_snap.pickle", "rank1_snap.pickle"]),
            Some(("rank".to_string(), vec![0, 1]))
        );
        // Two parts differ: no one template.
        assert_eq!(varying_number(&["a_1_x.pickle", "a_2_y.pickle"]), None);
        assert_eq!(varying_number(&["only.pickle"]), None);
    }
}
