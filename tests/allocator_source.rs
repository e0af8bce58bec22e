//! Recordings made by hand where the allocator model once departed from PyTorch's source
//! (`c10/cuda/CUDACachingAllocator.cpp`), each with its answer worked out from the source
//! function the comment names. Each test writes its own snapshot with serde-pickle (a
//! pickle writer that is not vramlens's).

mod common;

use common::pickled::{dict, i, s};
use serde_pickle::{SerOptions, Value as SV};
use vramlens::allocator::identity::check;
use vramlens::allocator::prepared::Prepared;
use vramlens::allocator::scenario::{Scenario, min_capacity, run};
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

/// A segment at `addr` made of `blocks` (address, size, state) in address order.
fn segment(addr: i64, blocks: &[(i64, i64, &str)]) -> SV {
    let active: i64 = blocks
        .iter()
        .filter(|b| b.2 != "inactive")
        .map(|b| b.1)
        .sum();
    let block = |&(a, size, state): &(i64, i64, &str)| {
        dict(vec![
            ("address", i(a)),
            ("size", i(size)),
            (
                "requested_size",
                i(if state == "inactive" { 0 } else { size }),
            ),
            ("state", s(state)),
            ("frames", SV::List(vec![])),
        ])
    };
    dict(vec![
        ("device", i(0)),
        ("address", i(addr)),
        ("total_size", i(blocks.iter().map(|b| b.1).sum())),
        ("allocated_size", i(active)),
        ("active_size", i(active)),
        ("requested_size", i(active)),
        ("stream", i(0)),
        ("segment_type", s("large")),
        ("segment_pool_id", SV::Tuple(vec![i(0), i(0)])),
        ("is_expandable", SV::Bool(false)),
        ("blocks", SV::List(blocks.iter().map(block).collect())),
        ("frames", SV::List(vec![])),
    ])
}

/// A snapshot of device 0 with default settings, read back by vramlens.
fn snapshot(segments: Vec<SV>, trace: Vec<SV>) -> Snapshot {
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
    read_snapshot(&path, ReadOptions::default()).unwrap().0
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
    assert_eq!(min_capacity(&p, &p.settings, 0), Some(100 * M));
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
