//! Which PyTorch release wrote a snapshot, as far as its fields tell: the earliest release
//! that writes every field seen, and the latest consistent with the fields missing.

use super::Snapshot;
use serde::Serialize;

/// Which PyTorch release the file's layout looks like (spec section 1.3).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Layout {
    /// "dict" or "list" (a bare list of segments).
    pub root: &'static str,
    /// Earliest release that writes every feature seen, such as "2.10".
    pub min_release: &'static str,
    /// Latest release consistent with what is missing, when that can be told.
    pub max_release: Option<&'static str>,
    /// The features the guess rests on.
    pub evidence: Vec<LayoutEvidence>,
}

/// A feature of the file a release guess rests on (written as its words by
/// `render::words::labels`, JSON included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutEvidence {
    /// The root is a bare list of segments.
    RootIsList,
    /// Blocks carry `history`.
    BlockHistory,
    /// `segment_pool_id` or block `frames`.
    PoolIdOrBlockFrames,
    EntryTimeUs,
    AllocatorSettings,
    ExternalAnnotations,
    EntryCompileContext,
    GraphCaptureRecordStreamReuse,
    EntryUserMetadata,
    ForwardFrames,
    EntryPoolId,
    HostSegments,
    EntryInternalMetadata,
    /// `cpp_frames` strings.
    CppFrames,
}

/// A release's (major, minor), for ordering.
pub fn release_key(release: &str) -> (u32, u32) {
    let mut parts = release.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The release range a file's fields say (spec sections 1.3 and 4.3): the one guess of a
/// file's PyTorch release, which `summary` prints and the allocator model's profile follows.
pub fn layout(snap: &Snapshot) -> Layout {
    let f = &snap.features;
    let e = &f.entries;
    let has_entries = snap.device_traces.iter().any(|t| !t.is_empty());
    let mut evidence = Vec::new();
    let mut min = "2.0";
    let mut max = None;
    if f.root_is_list {
        evidence.push(LayoutEvidence::RootIsList);
        min = "1.13";
    } else if f.block_history && !f.block_frames {
        evidence.push(LayoutEvidence::BlockHistory);
        if !f.segment_requested_size {
            min = "1.13";
        }
        max = Some("2.0");
    } else {
        use LayoutEvidence as E;
        // (release, present?, what)
        let steps: [(&'static str, bool, LayoutEvidence); 11] = [
            (
                "2.1",
                f.segment_pool_id || f.block_frames,
                E::PoolIdOrBlockFrames,
            ),
            ("2.2", e.time_us, E::EntryTimeUs),
            ("2.3", f.allocator_settings, E::AllocatorSettings),
            ("2.5", f.external_annotations, E::ExternalAnnotations),
            ("2.8", e.compile_context, E::EntryCompileContext),
            (
                "2.9",
                f.graph_capture_record_stream_reuse,
                E::GraphCaptureRecordStreamReuse,
            ),
            ("2.10", e.user_metadata, E::EntryUserMetadata),
            (
                "2.11",
                e.forward_frames || f.forward_frames,
                E::ForwardFrames,
            ),
            ("2.12", e.pool_id, E::EntryPoolId),
            ("2.14", f.host_segments, E::HostSegments),
            ("2.15", e.internal_metadata, E::EntryInternalMetadata),
        ];
        for (release, present, what) in steps {
            if present {
                min = release;
                evidence.push(what);
            }
        }
        // Keys written by every release from some point on bound the release from above
        // when they are missing (unless a later feature contradicts it).
        let bounds: [(bool, &'static str); 4] = [
            (has_entries && !e.time_us, "2.1"),
            (!f.allocator_settings, "2.2"),
            (!f.external_annotations, "2.4"),
            (!f.host_segments, "2.13"),
        ];
        max = bounds
            .into_iter()
            .find(|(missing, bound)| *missing && release_key(min) <= release_key(bound))
            .map(|(_, bound)| bound);
        if e.cpp_frames {
            evidence.push(LayoutEvidence::CppFrames);
        }
    }
    Layout {
        root: if f.root_is_list { "list" } else { "dict" },
        min_release: min,
        max_release: max,
        evidence,
    }
}
