//! Names shared by the text renderers: frames shortened for reading, devices, moments,
//! groups. Every name from a file comes out on one visible line ([`shown`]). And the
//! words of the analyses' data that JSON writes as strings too (the merged rest of the
//! groups, the layout evidence), through their `Serialize`, so both say them alike.

use crate::analysis::device::{DeviceChoice, DeviceReason};
use crate::analysis::kinds::attribution::GroupKind;
use crate::analysis::moments::moment::{MomentKind, ResolvedMoment};
use crate::analysis::reports::summary::LayoutEvidence;
use crate::analysis::reports::top::GroupName;
use crate::units::shown;
use serde::{Serialize, Serializer};
use std::borrow::Cow;

/// A path shortened to the part a reader needs: from the package root inside
/// site-packages, from `torch/`, else the last two components; a relative path (as
/// `redact` leaves every path, already cut to that part) as it is. Shown on one line.
pub fn short_path(path: &str) -> String {
    shown(&short_path_of(path)).into_owned()
}

fn short_path_of(path: &str) -> String {
    let p = path.replace('\\', "/");
    let absolute = p.starts_with('/') || p.as_bytes().get(1) == Some(&b':');
    if !absolute {
        return p;
    }
    for marker in ["site-packages/", "dist-packages/"] {
        if let Some(i) = p.rfind(marker) {
            return p[i + marker.len()..].to_string();
        }
    }
    if let Some(i) = p.rfind("/torch/") {
        return p[i + 1..].to_string();
    }
    let parts: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
    if parts.len() <= 2 {
        return p;
    }
    parts[parts.len() - 2..].join("/")
}

/// `filename:line:name` as `short/path.py:42 in name`; other names unchanged; shown on
/// one line.
pub fn short_frame(frame: &str) -> String {
    // Frames without a file (C++ frames, a profiler trace's operators) by their name.
    if let Some(name) = frame.strip_prefix("??:0:") {
        return shown(name).into_owned();
    }
    let mut parts = frame.rsplitn(3, ':');
    let (Some(name), Some(line), Some(file)) = (parts.next(), parts.next(), parts.next()) else {
        return shown(frame).into_owned();
    };
    if line.parse::<i64>().is_err() || file.is_empty() {
        return shown(frame).into_owned();
    }
    format!("{}:{line} in {}", short_path(file), shown(name))
}

/// A label of at most `max` characters: whole when it fits, else cut at the last word
/// boundary (space, `/`, `:`, `.`, `,`) in the second half of the room, else mid-word,
/// ending with `…` so a reader sees it was cut.
pub fn clip(label: &str, max: usize) -> String {
    let chars: Vec<char> = label.chars().collect();
    if chars.len() <= max {
        return label.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let room = max - 1;
    let cut = (room / 2..=room)
        .rev()
        .find(|&i| i < chars.len() && matches!(chars[i], ' ' | '/' | ':' | '.' | ','))
        .unwrap_or(room);
    let kept: String = chars[..cut].iter().collect();
    format!("{}…", kept.trim_end())
}

/// The shortest readable name of a frame: `model.py:42 in forward`.
pub fn tiny_frame(frame: &str) -> String {
    let short = short_frame(frame);
    match short.split_once(':') {
        Some((path, rest)) if path.contains('/') => {
            format!("{}:{rest}", path.rsplit('/').next().unwrap_or(path))
        }
        _ => short,
    }
}

/// The name of the groups past a limit, merged: "(3 more groups)".
pub fn rest_name(groups: usize) -> String {
    format!(
        "({})",
        crate::units::count(groups, "more group", "more groups")
    )
}

/// A group's name as JSON and export tables write it: the key, or [`rest_name`].
pub fn group_name_text(name: &GroupName) -> Cow<'_, str> {
    match name {
        GroupName::Key(k) => Cow::Borrowed(k),
        GroupName::Rest { groups } => Cow::Owned(rest_name(*groups)),
    }
}

/// Written as the string [`group_name_text`] gives.
impl Serialize for GroupName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&group_name_text(self))
    }
}

/// [`group_display`] of a group's key, or [`rest_name`].
pub fn group_name_display(name: &GroupName, kind: GroupKind) -> String {
    match name {
        GroupName::Key(k) => group_display(k, kind),
        GroupName::Rest { groups } => rest_name(*groups),
    }
}

/// A group name for people: frames shortened, tokens explained briefly.
pub fn group_display(name: &str, kind: GroupKind) -> String {
    match kind {
        GroupKind::Frame => short_frame(name),
        GroupKind::File => short_path(name),
        GroupKind::Stack => match name.rsplit_once(" (stack ") {
            Some((frame, id)) => format!("{} (stack {}", short_frame(frame), shown(id)),
            None => shown(name).into_owned(),
        },
        GroupKind::BeforeRecording => "allocated before recording began (stack unknown)".into(),
        GroupKind::NoStack => "no stack recorded".into(),
        _ => shown(name).into_owned(),
    }
}

/// "device 1 (the device with the OOM, peak 78.3 GiB; the file also has device 0, peak
/// 7.9 GiB, and device 2, peak 20.4 GiB: --device N)".
pub fn device_line(choice: &DeviceChoice) -> String {
    let own = choice
        .peak_of(choice.device)
        .map(|b| format!(", peak {}", crate::units::bytes(b)))
        .unwrap_or_default();
    let why = match choice.reason {
        DeviceReason::Asked | DeviceReason::Only => None,
        DeviceReason::Oom => Some(format!("the device with the OOM{own}")),
        DeviceReason::LargestPeak => Some(format!("the largest peak{own}")),
    };
    let others = match choice.others.len() {
        0 => None,
        _ => Some(format!(
            "the file also has {}: --device N for another",
            choice
                .others
                .iter()
                .map(|&d| match choice.peak_of(d) {
                    Some(b) => format!("device {d}, peak {}", crate::units::bytes(b)),
                    None => format!("device {d}"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        )),
    };
    let notes: Vec<String> = why.into_iter().chain(others).collect();
    if notes.is_empty() {
        format!("device {}", choice.device)
    } else {
        format!("device {} ({})", choice.device, notes.join("; "))
    }
}

/// "at the peak (after event 71, 2025-06-15 15:06:40.006 UTC)"; "final state (no trace
/// recorded)" for a device without a timeline.
pub fn moment_text(m: &ResolvedMoment) -> String {
    if !m.has_timeline {
        // Only the final state is known: no "before the first event" or "after event 0".
        return match m.event {
            None => "final state (no trace recorded)".into(),
            Some(e) => format!(
                "final state (no timeline: the trace holds just {} event{})",
                e + 1,
                if e == 0 { "" } else { "s" }
            ),
        };
    }
    let what = match m.kind {
        MomentKind::Peak => "at the peak",
        MomentKind::Oom => "at the OOM",
        MomentKind::End => "at the end",
        _ => "at",
    };
    let when = match (m.event, m.time_us) {
        (None, _) => "before the first event".to_string(),
        (Some(e), Some(t)) => format!("after event {e}, {}", m.clock.time(t)),
        (Some(e), None) => format!("after event {e}"),
    };
    if what == "at" {
        when
    } else {
        format!("{what} ({when})")
    }
}

/// A note under a moment's heading when several events share the time asked for: which
/// one was taken and how to take another.
pub fn moment_note(m: &ResolvedMoment) -> Option<String> {
    let same = m.same_time?;
    Some(format!(
        "  ({} events, {} to {}, fall within the time given; this is event {}, the one after which the most memory is requested; --at event:N takes another)",
        same.events,
        same.first_event,
        same.last_event,
        m.event.unwrap_or(same.last_event)
    ))
}

/// Totals of a live set at a moment, as `top` and `timeline --at` head their lists.
pub struct MomentTotals<'a> {
    pub path: &'a str,
    pub moment: &'a ResolvedMoment,
    pub requested_bytes: u64,
    pub count: usize,
    pub allocated_bytes: u64,
    pub reserved_bytes: i64,
}

/// The heading (file, device, moment), the moment's note, and the totals line.
pub fn write_moment_heading(
    out: &mut dyn std::io::Write,
    t: &MomentTotals,
    choice: &DeviceChoice,
    style: crate::render::Style,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "{}: {}, {}",
            shown(t.path),
            device_line(choice),
            moment_text(t.moment)
        ))
    )?;
    if let Some(note) = moment_note(t.moment) {
        writeln!(out, "{note}")?;
    }
    writeln!(
        out,
        "  {} requested by {} live allocations ({} in allocator blocks); reserved {}",
        crate::units::bytes(t.requested_bytes),
        t.count,
        crate::units::bytes(t.allocated_bytes),
        crate::units::bytes(t.reserved_bytes.max(0) as u64)
    )
}

/// The words for a feature a release guess rests on.
pub fn layout_evidence_text(e: LayoutEvidence) -> &'static str {
    match e {
        LayoutEvidence::RootIsList => {
            "the root is a bare list of segments (1.13, or memory_snapshot() of any release)"
        }
        LayoutEvidence::BlockHistory => "blocks carry history",
        LayoutEvidence::PoolIdOrBlockFrames => "segment_pool_id / block frames",
        LayoutEvidence::EntryTimeUs => "time_us in trace entries",
        LayoutEvidence::AllocatorSettings => "allocator_settings",
        LayoutEvidence::ExternalAnnotations => "external_annotations",
        LayoutEvidence::EntryCompileContext => "compile_context in trace entries",
        LayoutEvidence::GraphCaptureRecordStreamReuse => {
            "graph_capture_record_stream_reuse setting"
        }
        LayoutEvidence::EntryUserMetadata => "user_metadata in trace entries",
        LayoutEvidence::ForwardFrames => "forward_frames",
        LayoutEvidence::EntryPoolId => "pool_id in trace entries",
        LayoutEvidence::HostSegments => "host_segments",
        LayoutEvidence::EntryInternalMetadata => "internal_metadata in trace entries",
        LayoutEvidence::CppFrames => "cpp_frames strings",
    }
}

/// Written as its words ([`layout_evidence_text`]).
impl Serialize for LayoutEvidence {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(layout_evidence_text(*self))
    }
}

/// Where a refused request fell short, in one word (the same in every command).
pub fn shortfall_name(c: crate::allocator::scenario::OomCause) -> &'static str {
    use crate::allocator::scenario::OomCause;
    match c {
        OomCause::Capacity => "capacity",
        OomCause::Fragmentation => "fragmentation",
        OomCause::Rounding => "rounding",
        OomCause::PrivatePools => "CUDA-graph pools",
    }
}

/// Where a refused request fell short, in a sentence (the same in every command).
pub fn shortfall_sentence(c: crate::allocator::scenario::OomCause) -> &'static str {
    use crate::allocator::scenario::OomCause;
    match c {
        OomCause::Capacity => {
            "capacity: the live memory and the request exceeded what PyTorch could have"
        }
        OomCause::Fragmentation => {
            "fragmentation: the memory was there, but in holes inside segments, none large enough for the request"
        }
        OomCause::Rounding => {
            "rounding: the device had room for the request, not for the segment or pages the allocator asks for it"
        }
        OomCause::PrivatePools => {
            "CUDA-graph pools: the memory the request lacked was cached free in CUDA-graph private pools, which only those graphs' allocations use"
        }
    }
}

/// Allocations a trace leaves alive that the file's final state holds free, in words (the
/// same in every command).
pub fn freed_after_trace_text(count: u64, bytes: u64) -> String {
    format!(
        "the trace leaves {} ({}) alive that the file's final state holds free: their frees are not in the trace (it lost them, or the recording stopped before them); the final state is the truth at the end, so they are not counted as live",
        crate::units::count(count as usize, "allocation", "allocations"),
        crate::units::bytes(bytes)
    )
}

/// Two sizes that read differently: one decimal, else more, else exact bytes.
pub fn distinct_sizes(a: u64, b: u64) -> (String, String) {
    let (ta, tb) = (crate::units::bytes(a), crate::units::bytes(b));
    if ta != tb || a == b {
        return (ta, tb);
    }
    // Same unit for both (they printed the same), so only the decimals change.
    let (unit, scale) = crate::units::binary_unit(a);
    let scale = scale as f64;
    for decimals in 2..=3 {
        let (x, y) = (
            format!("{:.*} {unit}", decimals, a as f64 / scale),
            format!("{:.*} {unit}", decimals, b as f64 / scale),
        );
        if x != y {
            return (x, y);
        }
    }
    (format!("{a} B"), format!("{b} B"))
}

/// The releases a file's layout allows, as `summary` and `simulate` say them: `PyTorch
/// 2.5-2.13`, `PyTorch 2.0`, `PyTorch 1.13+`.
pub fn layout_releases(l: &crate::model::layout::Layout) -> String {
    match l.max_release {
        Some(max) if max == l.min_release => format!("PyTorch {max}"),
        Some(max) => format!("PyTorch {}-{max}", l.min_release),
        None => format!("PyTorch {}+", l.min_release),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_shorten_to_what_a_reader_needs() {
        assert_eq!(
            short_path(
                "/home/a/.venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py"
            ),
            "transformers/models/llama/modeling_llama.py"
        );
        assert_eq!(
            short_path("/opt/conda/lib/python3.10/torch/nn/modules/linear.py"),
            "torch/nn/modules/linear.py"
        );
        assert_eq!(
            short_path("/home/a/proj/nanogpt/model.py"),
            "nanogpt/model.py"
        );
        assert_eq!(short_path("train.py"), "train.py");
        // A relative path, as `redact` cuts every path (from the package root), is the
        // short form already: the same as the absolute path it came from gives.
        assert_eq!(
            short_path("torchtitan/components/loss.py"),
            short_path("/p/venv/lib/python3.10/site-packages/torchtitan/components/loss.py")
        );
        assert_eq!(
            short_path("torch/nn/functional.py"),
            short_path("/p/venv/lib/python3.10/site-packages/torch/nn/functional.py")
        );
        assert_eq!(short_path("C:/Users/a/proj/model.py"), "proj/model.py");
        assert_eq!(
            short_frame("/home/a/proj/nanogpt/model.py:42:forward"),
            "nanogpt/model.py:42 in forward"
        );
        assert_eq!(short_frame("(before recording)"), "(before recording)");
    }

    #[test]
    fn labels_are_cut_at_a_word_and_say_so() {
        assert_eq!(
            clip("model.py:340 in forward", 30),
            "model.py:340 in forward"
        );
        assert_eq!(clip("model.py:340 in forward", 22), "model.py:340 in…");
        assert_eq!(
            clip("(C++ autograd engine, backward)", 30),
            "(C++ autograd engine,…"
        );
        assert_eq!(clip("abcdefghij", 5), "abcd…");
        assert_eq!(clip("abc", 0), "");
        assert!(clip("abcdefghijklmnopqrstuvwxyz", 10).chars().count() <= 10);
    }
}
