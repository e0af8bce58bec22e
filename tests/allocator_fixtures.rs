//! One hand-written trace per mechanism of the caching allocator (the entries worked
//! out by hand in scripts/gen_allocator_fixtures.py, from the spec's algorithm): the
//! model reproduces each entry, and the what-ifs worked out beside them.

mod common;

use common::root;
use vramlens::allocator::identity::{Identity, check, reproduces};
use vramlens::allocator::prepared::Prepared;
use vramlens::allocator::scenario::{OomCause, Scenario, min_capacity, run};
use vramlens::allocator::{Profile, Settings};
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::model::Snapshot;

const MIB: u64 = 1 << 20;

fn load(name: &str) -> Snapshot {
    read_snapshot(
        &root().join("testdata/allocator").join(name),
        ReadOptions::default(),
    )
    .unwrap()
    .0
}

/// The identity replay of a fixture, which must be exact; its counts.
fn exact(name: &str, total: Option<u64>) -> (Identity, Prepared) {
    let snap = load(name);
    let mut p = Prepared::new(&snap, 0, None).unwrap();
    p.total_memory = total;
    let id = check(&snap, &p);
    assert!(id.exact(), "{name}: {:?}\n{:#?}", id.first_divergence, id);
    assert!(
        reproduces(&snap, &p),
        "{name}: the check stopped early disagrees"
    );
    assert_eq!(
        id.final_segments, id.final_segments_equal,
        "{name}: final segments"
    );
    assert_eq!(id.peak_reserved_bytes, id.recorded_peak_reserved_bytes);
    (id, p)
}

#[test]
fn split_rules_rounding_and_best_fit() {
    let (id, _) = exact("split_rules.pickle", None);
    assert_eq!((id.allocations, id.segment_events), (8, 3));
    assert_eq!(id.peak_reserved_bytes, (12 + 2 + 20) * MIB);
}

#[test]
fn max_split_keeps_oversize_blocks_whole() {
    let (id, p) = exact("max_split.pickle", None);
    assert_eq!(p.settings.max_split_size, 40 * MIB);
    assert_eq!(
        (id.allocations, id.segment_events, id.retry_calls),
        (4, 4, 1)
    );
}

#[test]
fn garbage_collection_under_a_memory_fraction() {
    let (id, p) = exact("gc_threshold.pickle", Some(100 * MIB));
    assert_eq!(p.profile, Profile::V2_10);
    assert_eq!(p.settings.memory_fraction, Some(0.99));
    assert_eq!(id.segment_events, 4);
    // Without the device's total there is no fraction to act under: no collection,
    // and the model departs where the recording collected.
    let snap = load("gc_threshold.pickle");
    let p = Prepared::new(&snap, 0, None).unwrap();
    assert!(!check(&snap, &p).exact());
    assert!(!reproduces(&snap, &p));
}

#[test]
fn expandable_segments_map_and_unmap_pages() {
    let (id, _) = exact("expandable.pickle", None);
    assert_eq!(
        (id.allocations, id.segment_events, id.empty_cache_calls),
        (4, 4, 1)
    );
    assert_eq!(id.final_reserved_bytes, 22 * MIB);
}

#[test]
fn pending_frees_wait_for_other_streams() {
    let (id, _) = exact("pending_frees.pickle", None);
    assert_eq!((id.allocations, id.segment_events), (4, 3));
}

#[test]
fn oom_retry_releases_cached_segments_and_what_ifs() {
    let (id, p) = exact("oom_retry.pickle", None);
    assert_eq!((id.ooms, id.ooms_reproduced, id.retry_calls), (1, 1, 2));
    // The OOM implies 90 MiB reserved + 30 MiB free.
    assert_eq!(id.oom_capacities[0].capacity_bytes, Some(120 * MIB));
    let at = |settings: Settings, c: u64| {
        run(
            &p,
            &Scenario {
                settings,
                capacity: Some(c),
                total_memory: None,
            },
        )
        .unwrap()
    };
    // At 120 MiB with the recorded settings: the recorded OOM, by fragmentation (70 MiB
    // live + 40 MiB fit in 120, but the 50 MiB free are 20 in a segment and 30 uncommitted).
    let o = at(p.settings.clone(), 120 * MIB);
    let oom = o.first_oom.unwrap();
    assert_eq!(Some(oom.event), p.requests.last_event());
    assert!(oom.recorded);
    assert_eq!(oom.cause, OomCause::Fragmentation);
    assert_eq!(o.stats.retry_flushes, 2);
    // With expandable segments at the same capacity (worked out by hand): 40 + 40 MiB in
    // four pages, the second freed and 20 MiB of it reused, the first freed; 50 MiB grows
    // from the free 20 MiB tail by two pages (120 MiB mapped); the last 40 MiB takes the
    // freed first 40. It fits: peak 120 MiB.
    let exp = Settings::parse("expandable_segments:True", p.profile).unwrap();
    let o = at(exp, 120 * MIB);
    assert!(o.first_oom.is_none(), "{:?}", o.first_oom);
    assert_eq!(o.recorded_ooms_passed, 1);
    assert_eq!(o.peak_reserved_bytes, 120 * MIB);
    // Smallest capacity with the recorded settings: keeping A's 40 MiB segment through
    // the 50 MiB request takes 130 MiB; at any less the retry frees it, and the last
    // 40 MiB then needs 90 + 40 = 130.
    assert_eq!(
        min_capacity(&p, &p.settings, 0).map(|m| m.bytes),
        Some(130 * MIB)
    );
}

/// Our recordings on an H200 with PyTorch 2.11 (testdata/gpu: a run, a leak that ran out
/// of memory, the same under a memory fraction and with expandable segments): replayed
/// exactly, and each OOM again at the capacity it implies.
#[test]
fn the_h200_recordings_replay_exactly_and_their_ooms_recur() {
    use vramlens::allocator::prepared::OomLimit;
    let mut checked = 0;
    for dir in ["ok", "oom", "oom_cap", "oom_exp"] {
        for name in ["snapshot.pickle", "oom_snapshot.pickle"] {
            let path = root().join("testdata/gpu").join(dir).join(name);
            if !path.exists() {
                continue;
            }
            let snap = read_snapshot(&path, ReadOptions::default()).unwrap().0;
            let p = Prepared::new(&snap, 0, None).unwrap();
            let id = check(&snap, &p);
            assert!(id.exact(), "{dir}/{name}: {:?}", id.first_divergence);
            assert_eq!(id.peak_reserved_bytes, id.recorded_peak_reserved_bytes);
            for oc in &id.oom_capacities {
                // The capped run's device had plenty free: a memory fraction refused it.
                let fraction = dir == "oom_cap";
                assert_eq!(
                    oc.limit,
                    if fraction {
                        OomLimit::MemoryFraction
                    } else {
                        OomLimit::DeviceFull
                    },
                    "{dir}"
                );
                let o = run(
                    &p,
                    &Scenario {
                        settings: p.settings.clone(),
                        capacity: oc.capacity_bytes,
                        total_memory: None,
                    },
                )
                .unwrap();
                assert_eq!(o.first_oom.map(|f| f.event), Some(oc.event), "{dir}/{name}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 7);
}

/// One replay with no limit serves every capacity at or above its peak: at each
/// capacity around each fixture's peak (2 MiB under it, at it, and well over it),
/// `run_each` gives what a replay at that capacity alone gives, for the file's settings
/// and for expandable segments.
#[test]
fn one_unlimited_replay_serves_every_capacity_above_its_peak() {
    use vramlens::allocator::scenario::{run_each, unlimited};
    for name in [
        "expandable.pickle",
        "gc_threshold.pickle",
        "max_split.pickle",
        "oom_retry.pickle",
        "pending_frees.pickle",
        "split_rules.pickle",
    ] {
        let snap = load(name);
        let p = Prepared::new(&snap, 0, None).unwrap();
        let expandable = Settings {
            expandable_segments: true,
            ..p.settings.clone()
        };
        for settings in [p.settings.clone(), expandable] {
            let Ok((free, _)) = unlimited(&p, &settings, false) else {
                continue;
            };
            let peak = free.peak_reserved_bytes;
            let devices: Vec<(u64, u64)> = [peak.saturating_sub(2 * MIB), peak, peak + 1024 * MIB]
                .iter()
                .map(|&c| (c, c + 512 * MIB))
                .collect();
            let (_, each) = run_each(&p, &settings, &devices);
            for (&(capacity, total), got) in devices.iter().zip(each) {
                let alone = run(
                    &p,
                    &Scenario {
                        settings: settings.clone(),
                        capacity: Some(capacity),
                        total_memory: Some(total),
                    },
                );
                assert_eq!(got, alone, "{name} at {capacity}");
            }
        }
    }
}

/// The order of equal free blocks, worked out by hand in the generator: the recording
/// (the lower address first) reserves 40 MiB at most; the upper first leaves no 20 MiB
/// block for the last request, which takes a third 20 MiB segment: 60 MiB.
#[test]
fn taking_the_upper_of_equal_blocks_needs_a_third_segment() {
    use vramlens::allocator::scenario::{unlimited, unlimited_highest_first};
    let (_, p) = exact("tie_break.pickle", None);
    let (lowest, _) = unlimited(&p, &p.settings, false).unwrap();
    assert_eq!(lowest.peak_reserved_bytes, 40 * MIB);
    let (highest, _) = unlimited_highest_first(&p, &p.settings).unwrap();
    assert_eq!(highest.peak_reserved_bytes, 60 * MIB);
    assert_eq!(
        highest.stats.segment_allocs - lowest.stats.segment_allocs,
        1
    );
}
