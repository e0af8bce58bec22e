//! Recordings made by hand where the allocator model once departed from PyTorch's source
//! (`c10/cuda/CUDACachingAllocator.cpp`), each with its answer worked out from the source
//! function the comment names; and recordings shaped to make the model's work grow with
//! them. Each test writes its own snapshot with serde-pickle (a pickle writer that is not
//! vramlens's).

mod common;

use common::pickled::{dict, i, s, segment};
use serde_pickle::{SerOptions, Value as SV};
use vramlens::allocator::identity::check;
use vramlens::allocator::prepared::Prepared;
use vramlens::allocator::scenario::{OomCause, Scenario, min_capacity, run};
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::model::Snapshot;

const BASE: i64 = 0x7f00_0000_0000;
const MIB: i64 = 1 << 20;

fn entry(action: &str, addr: i64, size: i64, t: i64) -> SV {
    dict(vec![
        ("action", s(action)),
        ("addr", i(addr)),
        ("size", i(size)),
        ("stream", i(0)),
        ("time_us", i(1_700_000_000_000_000 + t)),
        ("frames", SV::List(vec![])),
    ])
}

/// A snapshot of device 0 with default settings, read back by vramlens.
fn snapshot(segments: Vec<SV>, trace: Vec<SV>) -> Snapshot {
    let (_dir, path) = written(segments, trace);
    read_snapshot(&path, ReadOptions::default()).unwrap().0
}

/// The snapshot of [`snapshot`] as a file in a folder of its own.
fn written(segments: Vec<SV>, trace: Vec<SV>) -> (tempfile::TempDir, std::path::PathBuf) {
    let snap = dict(vec![
        ("segments", SV::List(segments)),
        ("device_traces", SV::List(vec![SV::List(trace)])),
        (
            "allocator_settings",
            dict(vec![
                ("PYTORCH_CUDA_ALLOC_CONF", s("")),
                ("max_split_size", i(-1)),
                ("garbage_collection_threshold", SV::F64(0.0)),
                ("expandable_segments", SV::Bool(false)),
            ]),
        ),
    ]);
    let bytes = serde_pickle::value_to_vec(&snap, SerOptions::new()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.pickle");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

fn at(p: &Prepared, capacity: u64) -> vramlens::allocator::scenario::Outcome {
    run(
        p,
        &Scenario {
            settings: p.settings.clone(),
            capacity: Some(capacity),
            total_memory: None,
        },
    )
    .unwrap()
}

const M: u64 = 1 << 20;

/// A block alive before recording whose free waits for another stream, then a 60 MiB
/// request. On a 120 MiB device the source's `malloc` finds no free block, fails
/// `alloc_block` (100 + 60 > 120), and retries after `release_cached_blocks`, whose
/// `synchronize_and_free_events` completes every free that waits: the 100 MiB segment
/// goes and the 60 MiB one fits. The smallest device is the 100 MiB the block held
/// (at 98 MiB the start itself does not fit).
#[test]
fn a_waiting_free_of_a_block_from_before_recording_is_completed_by_the_retry() {
    let snap = snapshot(
        vec![
            segment(BASE, &[(BASE, 100 * MIB, "inactive")]),
            segment(
                BASE + 120 * MIB,
                &[(BASE + 120 * MIB, 60 * MIB, "active_allocated")],
            ),
        ],
        vec![
            entry("free_requested", BASE, 100 * MIB, 1),
            entry("segment_alloc", BASE + 120 * MIB, 60 * MIB, 2),
            entry("alloc", BASE + 120 * MIB, 60 * MIB, 3),
            entry("free_completed", BASE, 100 * MIB, 4),
        ],
    );
    let p = Prepared::new(&snap, 0, None).unwrap();
    let id = check(&snap, &p);
    assert!(id.exact(), "{:?}", id.first_divergence);
    assert_eq!(p.start.reserved, 100 * M);
    let o = at(&p, 120 * M);
    assert!(o.first_oom.is_none(), "{:?}", o.first_oom);
    assert_eq!(o.stats.retry_flushes, 1);
    assert_eq!(o.stats.segment_frees, 1);
    assert_eq!(o.peak_reserved_bytes, 100 * M);
    // Below 100 MiB the block from before recording does not fit.
    assert!(
        run(
            &p,
            &Scenario {
                settings: p.settings.clone(),
                capacity: Some(98 * M),
                total_memory: None,
            }
        )
        .is_err()
    );
    assert_eq!(
        min_capacity(&p, &p.settings, 0).map(|m| m.bytes),
        Some(100 * M)
    );
}

/// A free that waits for another stream, completed by the retry of the next `malloc`:
/// the recording shows `free_completed`, then the retry's `segment_free` and the new
/// segment (`release_cached_blocks` runs `synchronize_and_free_events` before
/// `release_blocks`). The block was not free when the request searched the cache
/// (`get_free_block` failed: had it been free, the 30 MiB request would have split
/// it), so the model must not take it as freed before the request.
#[test]
fn a_waiting_free_completed_inside_a_retry_is_not_free_before_the_request() {
    let small = BASE + 48 * MIB;
    let snap = snapshot(
        vec![
            small_segment(small),
            segment(
                BASE + 64 * MIB,
                &[(BASE + 64 * MIB, 30 * MIB, "active_allocated")],
            ),
        ],
        vec![
            entry("segment_alloc", BASE, 40 * MIB, 1),
            entry("alloc", BASE, 40 * MIB, 2),
            entry("free_requested", BASE, 40 * MIB, 3),
            // A small tensor meanwhile (its own 2 MiB segment of the small pool).
            entry("segment_alloc", small, 2 * MIB, 4),
            entry("alloc", small, 512, 5),
            // 30 MiB: 42 + 30 > 60 MiB, the retry.
            entry("free_completed", BASE, 40 * MIB, 6),
            entry("segment_free", BASE, 40 * MIB, 7),
            entry("segment_alloc", BASE + 64 * MIB, 30 * MIB, 8),
            entry("alloc", BASE + 64 * MIB, 30 * MIB, 9),
        ],
    );
    let p = Prepared::new(&snap, 0, None).unwrap();
    let id = check(&snap, &p);
    assert!(id.exact(), "{:?}", id.first_divergence);
    assert_eq!(id.retry_calls, 1);
    assert_eq!(id.segment_events, 4);
    // On the 60 MiB device it ran on: the same retry, 42 MiB at the peak.
    let o = at(&p, 60 * M);
    assert!(o.first_oom.is_none());
    assert_eq!(o.stats.retry_flushes, 1);
    assert_eq!(o.peak_reserved_bytes, 42 * M);
}

/// A 2 MiB segment of the small pool holding one 512-byte block.
fn small_segment(addr: i64) -> SV {
    let mut seg = segment(
        addr,
        &[
            (addr, 512, "active_allocated"),
            (addr + 512, 2 * MIB - 512, "inactive"),
        ],
    );
    if let SV::Dict(d) = &mut seg {
        d.insert(
            serde_pickle::HashableValue::String("segment_type".into()),
            s("small"),
        );
    }
    seg
}

/// A free completed between calls with no release after it is completed at the start of
/// the next `malloc` (`process_events`): the request may take the block.
#[test]
fn a_waiting_free_completed_before_a_request_frees_the_block_for_it() {
    let snap = snapshot(
        vec![segment(
            BASE,
            &[
                (BASE, 30 * MIB, "active_allocated"),
                (BASE + 30 * MIB, 10 * MIB, "inactive"),
            ],
        )],
        vec![
            entry("segment_alloc", BASE, 40 * MIB, 1),
            entry("alloc", BASE, 40 * MIB, 2),
            entry("free_requested", BASE, 40 * MIB, 3),
            entry("free_completed", BASE, 40 * MIB, 4),
            entry("alloc", BASE, 30 * MIB, 5),
        ],
    );
    let p = Prepared::new(&snap, 0, None).unwrap();
    let id = check(&snap, &p);
    assert!(id.exact(), "{:?}", id.first_divergence);
    assert_eq!(id.segment_events, 1);
}

/// Success is not monotone in the capacity (`malloc`'s retry through
/// `release_cached_blocks` frees only whole cached segments, so where it runs decides
/// what stays pinned). Recorded with no limit: A 40 MiB (segment S1) freed; C 60 MiB
/// (S3); E 20 MiB, which splits S1; C freed; F 70 MiB (S5). Worked out:
/// - from 110 MiB: at F, 100 + 70 > capacity, the retry frees S3, and S1 (pinned by E)
///   plus 70 fits;
/// - 100 to 108 MiB: C gets S3 beside the cached S1 (40 + 60 <= capacity), E pins S1,
///   and at F the retry leaves 40 + 70 = 110: out of memory;
/// - 90 to 98 MiB: C needs the retry, which frees S1; E gets a segment of its own; at F
///   the retry frees S3 and 20 + 70 fits;
/// - below 90 MiB, F does not fit beside E.
///
/// So the smallest device is 90 MiB, and 100 MiB, the least capacity at which C skips
/// the retry, runs out: the answer says so.
#[test]
fn a_larger_device_that_runs_out_is_named_beside_the_smallest() {
    let (s1, s3, s5) = (BASE, BASE + 64 * MIB, BASE + 128 * MIB);
    let (_dir, path) = written(
        vec![
            segment(
                s1,
                &[
                    (s1, 20 * MIB, "active_allocated"),
                    (s1 + 20 * MIB, 20 * MIB, "inactive"),
                ],
            ),
            segment(s3, &[(s3, 60 * MIB, "inactive")]),
            segment(s5, &[(s5, 70 * MIB, "active_allocated")]),
        ],
        vec![
            entry("segment_alloc", s1, 40 * MIB, 1),
            entry("alloc", s1, 40 * MIB, 2),
            entry("free_requested", s1, 40 * MIB, 3),
            entry("free_completed", s1, 40 * MIB, 4),
            entry("segment_alloc", s3, 60 * MIB, 5),
            entry("alloc", s3, 60 * MIB, 6),
            entry("alloc", s1, 20 * MIB, 7),
            entry("free_requested", s3, 60 * MIB, 8),
            entry("free_completed", s3, 60 * MIB, 9),
            entry("segment_alloc", s5, 70 * MIB, 10),
            entry("alloc", s5, 70 * MIB, 11),
        ],
    );
    let snap = read_snapshot(&path, ReadOptions::default()).unwrap().0;
    let p = Prepared::new(&snap, 0, None).unwrap();
    let id = check(&snap, &p);
    assert!(id.exact(), "{:?}", id.first_divergence);
    let runs = |mib: u64| at(&p, mib * M).first_oom.is_none();
    assert!(!runs(88));
    assert!(runs(90) && runs(98));
    assert!(!runs(100) && !runs(108));
    assert!(runs(110) && runs(170));
    let m = min_capacity(&p, &p.settings, 0).unwrap();
    assert_eq!(m.bytes, 90 * M);
    assert_eq!(m.fails_above, Some(100 * M));
    // The text says which smallest it found, and that a larger device ran out.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramlens"))
        .args(["simulate", path.to_str().unwrap(), "--outside", "0"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("smallest device found to run it")
            && text.contains(
                "90.0 MiB, but 100.0 MiB runs out of memory: a larger device is not always enough"
            ),
        "{text}"
    );
}

/// Memory cached free in a CUDA graph's private pool is not the default pool's: a
/// request there does not take it, and the out-of-memory retry
/// (`release_cached_blocks`) releases only the default pools and the private pools no
/// graph uses any more. A 60 MiB block of pool (0, 1) freed, then 30 MiB of the default
/// pool on an 80 MiB device: 60 + 30 > 80, nothing to release, out of memory; the live
/// blocks (none) and the request fit, and the 20 MiB the device had free fall short:
/// what it lacked sat in the graph's pool, not in holes.
#[test]
fn memory_cached_in_a_graph_pool_is_named_not_called_fragmentation() {
    let q = BASE + 64 * MIB;
    let mut private = segment(BASE, &[(BASE, 60 * MIB, "inactive")]);
    if let SV::Dict(d) = &mut private {
        d.insert(
            serde_pickle::HashableValue::String("segment_pool_id".into()),
            SV::Tuple(vec![i(0), i(1)]),
        );
    }
    let (_dir, path) = written(
        vec![private, segment(q, &[(q, 30 * MIB, "active_allocated")])],
        vec![
            entry("segment_alloc", BASE, 60 * MIB, 1),
            entry("alloc", BASE, 60 * MIB, 2),
            entry("free_requested", BASE, 60 * MIB, 3),
            entry("free_completed", BASE, 60 * MIB, 4),
            entry("segment_alloc", q, 30 * MIB, 5),
            entry("alloc", q, 30 * MIB, 6),
        ],
    );
    let snap = read_snapshot(&path, ReadOptions::default()).unwrap().0;
    let p = Prepared::new(&snap, 0, None).unwrap();
    assert!(check(&snap, &p).exact());
    let oom = at(&p, 80 * M).first_oom.expect("runs out of memory");
    assert_eq!(oom.cause, OomCause::PrivatePools);
    assert_eq!(oom.private_free_bytes, 60 * M);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramlens"))
        .args([
            "simulate",
            path.to_str().unwrap(),
            "--gpu",
            "80MiB",
            "--outside",
            "0",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("CUDA-graph pools: 60.0 MiB reserved"),
        "{text}"
    );
    assert!(!text.contains("fragmentation:"), "{text}");
}

/// Thousands of recorded OOMs of one request at one capacity: their what-ifs come from
/// one set of replays (the capacity and the settings decide a replay, not which OOM asked
/// for it), and a replay that stops at the first OOM says nothing of the later ones; a
/// caller that wants the first gets the first.
#[test]
fn identical_recorded_ooms_share_their_what_ifs() {
    use vramlens::analysis::what_if::oom_what_if::{what_ifs, what_ifs_of};
    let mut trace = vec![
        entry("segment_alloc", BASE, 40 * MIB, 1),
        entry("alloc", BASE, 40 * MIB, 2),
    ];
    for k in 0..3000 {
        let mut oom = entry("oom", 0, 64 * MIB, 3 + k);
        if let SV::Dict(d) = &mut oom {
            d.insert(
                serde_pickle::HashableValue::String("device_free".into()),
                i(10 * MIB),
            );
        }
        trace.push(oom);
    }
    let snap = snapshot(
        vec![segment(BASE, &[(BASE, 40 * MIB, "active_allocated")])],
        trace,
    );
    let p = Prepared::new(&snap, 0, None).unwrap();
    let id = check(&snap, &p);
    let all = what_ifs_of(&p, &id, usize::MAX);
    assert_eq!(all.len(), 3000);
    // 40 MiB held + 10 MiB free: a 50 MiB device, which 64 MiB does not fit.
    assert_eq!(all[0].1.capacity_bytes, 50 * M);
    assert!(all[0].1.reproduced);
    // Every replay stops at the first (the same request at the same capacity): the
    // later ones are neither reproduced nor let through.
    assert!(all[0].1.tries.iter().all(|t| !t.lets_through));
    for (_, w) in &all[1..] {
        assert!(!w.reproduced);
        assert!(
            w.tries
                .iter()
                .all(|t| !t.lets_through && t.later_oom_event.is_none())
        );
    }
    let first = what_ifs(&snap, 0, 1);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0], all[0]);
}
