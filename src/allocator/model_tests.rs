//! Hand-worked cases: the pytorch/devlogs post "When does fragmentation occur in the CUDA
//! caching allocator?" (spec 4.4, check 1) and one case per mechanism, each worked out
//! from the spec's pseudo-code by hand.

use super::super::device::{AddressSpace, CapacityDevice};
use super::super::settings::{Profile, Settings};
use super::*;

const MIB: u64 = 1 << 20;

fn alloc(settings: Settings) -> (Allocator, CapacityDevice) {
    (
        Allocator::new(settings, Profile::V2_4, None),
        CapacityDevice::new(None, AddressSpace::around(0, 0)),
    )
}

fn conf(s: &str) -> Settings {
    Settings::parse(s, Profile::V2_10).unwrap()
}

fn events(a: &mut Allocator) -> Vec<ModelEvent> {
    a.take_events().collect()
}

#[test]
fn eight_16_mib_then_four_32_mib_reserve_256_mib() {
    let (mut a, mut d) = alloc(Settings::default());
    let xs: Vec<BlockId> = (0..8)
        .map(|t| a.malloc(&mut d, 16 * MIB, 0, (0, 0), t).unwrap())
        .collect();
    assert_eq!(a.reserved(), 128 * MIB);
    for x in xs {
        a.free(x);
    }
    for t in 0..4 {
        a.malloc(&mut d, 32 * MIB, 0, (0, 0), t).unwrap();
    }
    assert_eq!(a.reserved(), 256 * MIB);
}

#[test]
fn four_32_mib_then_eight_16_mib_reserve_128_mib() {
    let (mut a, mut d) = alloc(Settings::default());
    let xs: Vec<BlockId> = (0..4)
        .map(|t| a.malloc(&mut d, 32 * MIB, 0, (0, 0), t).unwrap())
        .collect();
    for x in xs {
        a.free(x);
    }
    for t in 0..8 {
        a.malloc(&mut d, 16 * MIB, 0, (0, 0), t).unwrap();
    }
    assert_eq!(a.reserved(), 128 * MIB);
    // Two 16 MiB blocks per 32 MiB segment, each at the low end of what was free.
    let segs = a.segments();
    assert_eq!(segs.len(), 4);
    for s in &segs {
        assert_eq!(
            s.blocks,
            vec![
                (s.addr, 16 * MIB, true),
                (s.addr + 16 * MIB, 16 * MIB, true)
            ]
        );
    }
}

#[test]
fn expandable_eight_16_mib_map_seven_pages_and_then_nothing_more() {
    let (mut a, mut d) = alloc(conf("expandable_segments:True"));
    let xs: Vec<BlockId> = (0..8)
        .map(|t| a.malloc(&mut d, 16 * MIB, 0, (0, 0), t).unwrap())
        .collect();
    assert_eq!(a.reserved(), 140 * MIB);
    let maps: Vec<u64> = events(&mut a)
        .into_iter()
        .map(|e| match e {
            ModelEvent::SegmentMap { size, .. } => size,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    // The fifth request fits in the 16 MiB left by the first four: seven maps of a page.
    assert_eq!(maps, vec![20 * MIB; 7]);
    // Each allocation takes the low end: 16 MiB apart from the reservation's start.
    let base = a.block_addr(xs[0]);
    for (k, x) in xs.iter().enumerate() {
        assert_eq!(a.block_addr(*x), base + 16 * MIB * k as u64);
    }
    for x in xs {
        a.free(x);
    }
    for t in 0..4 {
        a.malloc(&mut d, 32 * MIB, 0, (0, 0), t).unwrap();
    }
    assert_eq!(a.reserved(), 140 * MIB);
    assert!(events(&mut a).is_empty());
}

#[test]
fn two_mib_then_half_mib_reserve_22_mib_and_two_2_mib_reserve_20() {
    let (mut a, mut d) = alloc(Settings::default());
    a.malloc(&mut d, 2 * MIB, 0, (0, 0), 0).unwrap();
    a.malloc(&mut d, MIB / 2, 0, (0, 0), 1).unwrap();
    assert_eq!(a.reserved(), 22 * MIB);
    let (mut a, mut d) = alloc(Settings::default());
    a.malloc(&mut d, 2 * MIB, 0, (0, 0), 0).unwrap();
    a.malloc(&mut d, 2 * MIB, 0, (0, 0), 1).unwrap();
    assert_eq!(a.reserved(), 20 * MIB);
}

#[test]
fn rounding_with_divisions() {
    // The spec's example of the helper: 1200 with 4 divisions lands on 1280.
    assert_eq!(next_division(1200, 4), 1280);
    assert_eq!(next_division(1024, 4), 1024);
    let (a, _) = alloc(conf("roundup_power2_divisions:4"));
    // round_size only takes the power-of-two path above 512 x divisions bytes.
    assert_eq!(a.round_size(1200), 1536);
    assert_eq!(a.round_size(100), 512);
    // 5000 B: floor 4096, step 1024 -> 5120.
    assert_eq!(a.round_size(5000), 5120);
    // 514 MiB with [>:2]: floor 512 MiB, step 256 MiB -> 768 MiB (pytorch#161139).
    let (a, _) = alloc(conf("roundup_power2_divisions:[>:2]"));
    assert_eq!(a.round_size(514 * MIB), 768 * MIB);
    // One division: 512-byte rounding from 2.4 on, the size as it is before.
    let s = conf("roundup_power2_divisions:1");
    let new = Allocator::new(s.clone(), Profile::V2_4, None);
    let old = Allocator::new(s, Profile::V2_0, None);
    assert_eq!(new.round_size(3 * MIB + 1), 3 * MIB + 512);
    assert_eq!(old.round_size(3 * MIB + 1), 3 * MIB + 1);
}

#[test]
fn split_rules_small_pool_and_large_pool() {
    let (mut a, mut d) = alloc(Settings::default());
    // Large pool: a 12 MiB request gets a 12 MiB segment, nothing to split; 11 MiB of a
    // freed 12 MiB block leaves exactly 1 MiB, which is not split off (> 1 MiB needed).
    let x = a.malloc(&mut d, 12 * MIB, 0, (0, 0), 0).unwrap();
    a.free(x);
    let y = a.malloc(&mut d, 11 * MIB, 0, (0, 0), 1).unwrap();
    assert_eq!(a.block_size(y), 12 * MIB);
    a.free(y);
    // 10.5 MiB leaves 1.5 MiB: split.
    let z = a.malloc(&mut d, 21 * MIB / 2, 0, (0, 0), 2).unwrap();
    assert_eq!(a.block_size(z), 21 * MIB / 2);
    // Small pool: 512 bytes left is split off.
    let s1 = a.malloc(&mut d, 1000, 0, (0, 0), 3).unwrap();
    assert_eq!(a.block_size(s1), 1024);
    assert_eq!(a.reserved(), 14 * MIB);
}

#[test]
fn best_fit_takes_the_smallest_then_the_lowest_address() {
    let (mut a, mut d) = alloc(Settings::default());
    let big = a.malloc(&mut d, 40 * MIB, 0, (0, 0), 0).unwrap();
    let s1 = a.malloc(&mut d, 30 * MIB, 0, (0, 0), 1).unwrap();
    let s2 = a.malloc(&mut d, 30 * MIB, 0, (0, 0), 2).unwrap();
    a.free(s2);
    a.free(big);
    a.free(s1);
    // Free: 40 at the lowest address, two 30s. A 25 MiB request takes the lower 30.
    let x = a.malloc(&mut d, 25 * MIB, 0, (0, 0), 3).unwrap();
    assert_eq!(a.block_addr(x), a.segments()[1].addr);
}

#[test]
fn streams_do_not_share_free_blocks() {
    let (mut a, mut d) = alloc(Settings::default());
    let x = a.malloc(&mut d, 16 * MIB, 7, (0, 0), 0).unwrap();
    a.free(x);
    a.malloc(&mut d, 16 * MIB, 9, (0, 0), 1).unwrap();
    assert_eq!(a.reserved(), 32 * MIB);
}

#[test]
fn max_split_keeps_oversize_blocks_whole_and_releases_them_on_failure() {
    // max_split 40 MiB: a freed 64 MiB segment is not handed to a 16 MiB request, and a
    // 48 MiB request (oversize) may take it only within 20 MiB of slack.
    let s = conf("max_split_size_mb:40");
    let mut a = Allocator::new(s, Profile::V2_4, None);
    let mut d = CapacityDevice::new(Some(100 * MIB), AddressSpace::around(0, 0));
    let big = a.malloc(&mut d, 64 * MIB, 0, (0, 0), 0).unwrap();
    a.free(big);
    events(&mut a);
    // 16 MiB: the 64 MiB block is oversize; a new 16 MiB segment (80 of 100 MiB).
    let x = a.malloc(&mut d, 16 * MIB, 0, (0, 0), 1).unwrap();
    assert_eq!(a.reserved(), 80 * MIB);
    assert!(!a.is_allocated(big) || a.block_addr(x) != a.block_addr(big));
    // 30 MiB more does not fit in 100: release_available frees the 64 MiB segment, then
    // the new segment fits.
    a.malloc(&mut d, 30 * MIB, 0, (0, 0), 2).unwrap();
    let ev = events(&mut a);
    assert!(matches!(ev[0], ModelEvent::SegmentAlloc { size, .. } if size == 16 * MIB));
    assert!(matches!(ev[1], ModelEvent::SegmentFree { size, .. } if size == 64 * MIB));
    assert!(matches!(ev[2], ModelEvent::SegmentAlloc { size, .. } if size == 30 * MIB));
    assert_eq!(a.reserved(), 46 * MIB);
}

#[test]
fn oversize_request_takes_a_block_within_the_slack() {
    let s = conf("max_split_size_mb:40");
    let (mut a, mut d) = (
        Allocator::new(s, Profile::V2_4, None),
        CapacityDevice::new(None, AddressSpace::around(0, 0)),
    );
    let big = a.malloc(&mut d, 64 * MIB, 0, (0, 0), 0).unwrap();
    a.free(big);
    // 50 MiB: 64 < 50 + 20, taken whole (no split for oversize requests).
    let x = a.malloc(&mut d, 50 * MIB, 0, (0, 0), 1).unwrap();
    assert_eq!(a.block_size(x), 64 * MIB);
    a.free(x);
    // 44 MiB: 64 >= 44 + 20: refused, a new segment.
    a.malloc(&mut d, 44 * MIB, 0, (0, 0), 2).unwrap();
    assert_eq!(a.reserved(), 108 * MIB);
}

#[test]
fn oom_retry_releases_whole_cached_segments_then_fails() {
    let mut a = Allocator::new(Settings::default(), Profile::V2_4, None);
    let mut d = CapacityDevice::new(Some(100 * MIB), AddressSpace::around(0, 0));
    let x = a.malloc(&mut d, 40 * MIB, 0, (0, 0), 0).unwrap();
    let y = a.malloc(&mut d, 40 * MIB, 0, (0, 0), 1).unwrap();
    // Split one segment: 20 MiB of it stays allocated.
    a.free(y);
    let _z = a.malloc(&mut d, 20 * MIB, 0, (0, 0), 2).unwrap();
    a.free(x);
    events(&mut a);
    // 50 MiB: no free block fits (40 whole, 20 in a split segment); 80 + 50 > 100;
    // the retry frees the whole 40 MiB segment, then 40 + 50 <= 100.
    a.malloc(&mut d, 50 * MIB, 0, (0, 0), 3).unwrap();
    let ev = events(&mut a);
    assert!(matches!(ev[0], ModelEvent::SegmentFree { size, .. } if size == 40 * MIB));
    assert!(matches!(ev[1], ModelEvent::SegmentAlloc { size, .. } if size == 50 * MIB));
    // 40 MiB more: 90 + 40 > 100, nothing whole to free (the split segment has 20 MiB
    // free): out of memory, with 30 MiB free in the device and 20 MiB free cached.
    let e = a.malloc(&mut d, 40 * MIB, 0, (0, 0), 4).unwrap_err();
    assert_eq!(e.size, 40 * MIB);
    assert_eq!(e.reserved, 90 * MIB);
    assert_eq!(e.allocated, 70 * MIB);
    assert_eq!(e.largest_free, 20 * MIB);
}

#[test]
fn pending_frees_complete_on_the_retry_and_on_empty_cache() {
    let mut a = Allocator::new(Settings::default(), Profile::V2_4, None);
    let mut d = CapacityDevice::new(Some(60 * MIB), AddressSpace::around(0, 0));
    let x = a.malloc(&mut d, 40 * MIB, 0, (0, 0), 7).unwrap();
    a.free_requested(x);
    events(&mut a);
    // The pending block is not reused: a 30 MiB request needs a segment, which does
    // not fit (40 + 30 > 60); the retry completes the pending free, releases the 40 MiB
    // segment and allocates.
    a.malloc(&mut d, 30 * MIB, 0, (0, 0), 8).unwrap();
    let ev = events(&mut a);
    assert_eq!(ev[0], ModelEvent::FreeCompleted { tag: 7 });
    assert!(matches!(ev[1], ModelEvent::SegmentFree { size, .. } if size == 40 * MIB));
    assert!(matches!(ev[2], ModelEvent::SegmentAlloc { size, .. } if size == 30 * MIB));
    // The recorded free_completed, arriving later, changes nothing.
    a.free(x);
    assert_eq!(a.reserved(), 30 * MIB);
}

#[test]
fn expandable_unmaps_whole_free_pages_on_empty_cache() {
    let (mut a, mut d) = alloc(conf("expandable_segments:True"));
    // 30 MiB maps two pages (40 MiB); 5 MiB more comes from the 10 MiB tail.
    let x = a.malloc(&mut d, 30 * MIB, 0, (0, 0), 0).unwrap();
    let y = a.malloc(&mut d, 5 * MIB, 0, (0, 0), 1).unwrap();
    assert_eq!(a.reserved(), 40 * MIB);
    a.free(x);
    events(&mut a);
    // Free [0, 30): the first page [0, 20) is whole, [20, 30) shares a page with y.
    a.empty_cache();
    let base = a.block_addr(y) - 30 * MIB;
    assert_eq!(
        events(&mut a),
        vec![ModelEvent::SegmentUnmap {
            addr: base,
            size: 20 * MIB,
            stream: 0
        }]
    );
    assert_eq!(a.reserved(), 20 * MIB);
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].addr, base + 20 * MIB);
    assert_eq!(segs[0].size, 20 * MIB);
    a.free(y);
    a.empty_cache();
    assert_eq!(a.reserved(), 0);
    assert!(a.segments().is_empty());
}

#[test]
fn expandable_grows_from_the_free_tail_before_the_unmapped_range() {
    let (mut a, mut d) = alloc(conf("expandable_segments:True"));
    let x = a.malloc(&mut d, 10 * MIB + 512, 0, (0, 0), 0).unwrap();
    events(&mut a);
    // About 10 MiB is free at the end of the first page; 25 MiB takes it and maps 20
    // MiB more, starting where the free tail starts.
    let y = a.malloc(&mut d, 25 * MIB, 0, (0, 0), 1).unwrap();
    assert_eq!(a.block_addr(y), a.block_addr(x) + 10 * MIB + 512);
    let ev = events(&mut a);
    assert_eq!(ev.len(), 1);
    assert!(matches!(ev[0], ModelEvent::SegmentMap { addr, size, .. }
        if addr == a.block_addr(x) + 20 * MIB && size == 20 * MIB));
}

#[test]
fn garbage_collection_frees_old_cached_segments_above_the_threshold() {
    // Fraction 0.99 of 100 MiB, threshold 0.5: GC runs once reserved is above 49.5 MiB and
    // a search failed; it frees whole cached segments at least as old as the average.
    let s = conf("garbage_collection_threshold:0.5,per_process_memory_fraction:0.99");
    let mut a = Allocator::new(s, Profile::V2_4, Some(100 * MIB));
    let mut d = CapacityDevice::new(Some(100 * MIB), AddressSpace::around(0, 0));
    let x = a.malloc(&mut d, 30 * MIB, 0, (0, 0), 0).unwrap();
    let y = a.malloc(&mut d, 24 * MIB, 0, (0, 0), 1).unwrap();
    a.free(x); // age starts at clock 2
    a.free(y); // at clock 2 as well
    // Searches of 12 MiB fail on neither (24 and 30 fit)... take the 24 MiB one and free it.
    let z = a.malloc(&mut d, 24 * MIB, 0, (0, 0), 2).unwrap(); // clock 3
    a.free(z); // y's block again, age base 3
    events(&mut a);
    // 40 MiB: no fit (30 and 24 cached), reserved 54 > 49.5: GC. Ages: 30 MiB block
    // 4 - 2 = 2, 24 MiB block 4 - 3 = 1; average 1.5: the 30 MiB one goes (54 - 30 =
    // 24 <= 49.5, target 4.5 reached). Then a 40 MiB segment.
    a.malloc(&mut d, 40 * MIB, 0, (0, 0), 3).unwrap();
    let ev = events(&mut a);
    assert!(matches!(ev[0], ModelEvent::SegmentFree { size, .. } if size == 30 * MIB));
    assert!(matches!(ev[1], ModelEvent::SegmentAlloc { size, .. } if size == 40 * MIB));
    assert_eq!(ev.len(), 2);
    assert_eq!(a.reserved(), 64 * MIB);
}

#[test]
fn a_memory_fraction_refuses_segments_above_it() {
    let s = conf("per_process_memory_fraction:0.5");
    let mut a = Allocator::new(s, Profile::V2_4, Some(100 * MIB));
    let mut d = CapacityDevice::new(None, AddressSpace::around(0, 0));
    a.malloc(&mut d, 40 * MIB, 0, (0, 0), 0).unwrap();
    let e = a.malloc(&mut d, 12 * MIB, 0, (0, 0), 1).unwrap_err();
    assert_eq!(e.reserved, 40 * MIB);
}

#[test]
fn restored_segment_keeps_its_blocks_and_merges_frees() {
    let mut a = Allocator::new(Settings::default(), Profile::V2_4, None);
    let base = 0x7f00_0000_0000;
    let ids = a.restore_segment(
        base,
        20 * MIB,
        0,
        PoolKey::DEFAULT_LARGE,
        &[(base + 4 * MIB, 4 * MIB, 4 * MIB, 1)],
    );
    assert_eq!(a.reserved(), 20 * MIB);
    let mut d = CapacityDevice::new(None, AddressSpace::around(base + 20 * MIB, base + 20 * MIB));
    // Free: [0, 4) and [8, 20). 3 MiB takes the 4 MiB hole (best fit), whole (1 MiB left).
    let x = a.malloc(&mut d, 3 * MIB, 0, (0, 0), 2).unwrap();
    assert_eq!(a.block_addr(x), base);
    assert_eq!(a.block_size(x), 4 * MIB);
    a.free(ids[0]);
    a.free(x);
    assert_eq!(a.segments()[0].blocks, vec![(base, 20 * MIB, false)]);
}

/// The free set of one stream against a plain ordered map as the reference: after each
/// of a few thousand insertions and removals (a fixed pseudo-random sequence, keys
/// often reused as a split block merges back), every range from the front, from the
/// back and from both ends at once hands out the same blocks in the same order.
#[test]
fn a_stream_set_orders_its_blocks_as_one_ordered_map() {
    let mut set = StreamSet::default();
    let mut reference: BTreeMap<u128, u32> = BTreeMap::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for step in 0..4000u32 {
        let r = next();
        let key = pack(1 + r % 24, (r >> 8) % 16);
        if let Some(block) = reference.remove(&key) {
            // Another block's id under the key takes nothing out.
            set.remove(key, block + 1);
            assert_eq!(set.len(), reference.len() + 1);
            set.remove(key, block);
        } else {
            set.insert(key, step);
            reference.insert(key, step);
        }
        assert_eq!(set.len(), reference.len());
        let lo = pack(1 + next() % 24, 0);
        let hi = lo + pack(next() % 8, 0);
        let want: Vec<(u128, u32)> = reference.range(lo..hi).map(|(&k, &b)| (k, b)).collect();
        assert_eq!(set.range(lo, Some(hi)).collect::<Vec<_>>(), want);
        let mut back: Vec<_> = set.range(lo, Some(hi)).rev().collect();
        back.reverse();
        assert_eq!(back, want);
        let all: Vec<(u128, u32)> = reference.range(lo..).map(|(&k, &b)| (k, b)).collect();
        // From both ends at once, the front first on even steps and the back on odd.
        let mut it = set.range(lo, None);
        let (mut front, mut tail) = (Vec::new(), Vec::new());
        let mut from_front = step % 2 == 0;
        loop {
            let got = if from_front {
                it.next()
            } else {
                it.next_back()
            };
            let Some(got) = got else { break };
            if from_front {
                front.push(got);
            } else {
                tail.push(got);
            }
            from_front = !from_front;
        }
        tail.reverse();
        front.extend(tail);
        assert_eq!(front, all, "step {step}");
    }
}

/// Pools are numbered as they are made: one for each default pool and one or two for
/// each private (CUDA-graph) pool. Past 65,536 a 16-bit number wrapped, and the next
/// private pool's block landed in the first pool made, here the default small pool.
#[test]
fn a_pool_made_after_65536_others_is_its_own() {
    let (mut a, mut d) = alloc(Settings::default());
    let first = a.malloc(&mut d, MIB, 0, (0, 0), 0).unwrap();
    a.free(first);
    let mut last = first;
    for p in 1..=65_536i64 {
        last = a.malloc(&mut d, 2 * MIB, 0, (1, p), p as u32).unwrap();
    }
    let pool = a.blocks[last.index() as usize].pool;
    assert_eq!(
        a.pool_key(pool),
        PoolKey {
            private: (1, 65_536),
            small: false
        }
    );
    // The two default pools, then one large pool for each private pool.
    assert_eq!(a.pools.len(), 65_538);
}

/// An expandable segment reserves `numSegments(total + total / 8)` pages
/// (`ExpandableSegment`'s constructor, `max_handles_`): on a 160 MiB device, 180 MiB of
/// 20 MiB pages is 9 pages. A 180 MiB request maps all nine; a 190 MiB one cannot be
/// mapped in one reservation, and a new reservation is no larger, so it fails even on a
/// device with room.
#[test]
fn an_expandable_reservation_is_nine_eighths_of_the_device_in_whole_pages() {
    let s = conf("expandable_segments:True");
    let a = Allocator::new(s.clone(), Profile::V2_4, Some(160 * MIB));
    assert_eq!(a.reservation_size(20 * MIB), 180 * MIB);
    // 80 GiB: 92,160 MiB of address space, 4,608 pages.
    let h100 = Allocator::new(s.clone(), Profile::V2_4, Some(80 << 30));
    assert_eq!(h100.reservation_size(20 * MIB), 4608 * 20 * MIB);
    // Not a whole number of pages: 100 MiB + 12.5 MiB rounds up to 6 pages.
    let odd = Allocator::new(s.clone(), Profile::V2_4, Some(100 * MIB));
    assert_eq!(odd.reservation_size(20 * MIB), 120 * MIB);

    let mut a = Allocator::new(s.clone(), Profile::V2_4, Some(160 * MIB));
    let mut d = CapacityDevice::new(None, AddressSpace::around(0, 0));
    let x = a.malloc(&mut d, 180 * MIB, 0, (0, 0), 0).unwrap();
    assert_eq!(a.reserved(), 180 * MIB);
    a.free(x);
    a.empty_cache();
    assert!(a.malloc(&mut d, 190 * MIB, 0, (0, 0), 1).is_err());
}

/// With no device total (a replay with no limit), one expandable reservation holds a
/// request past the terabyte a reservation otherwise spans; with a total, a request
/// past 9/8 of it cannot be mapped.
#[test]
fn a_request_past_a_terabyte_runs_with_no_limit() {
    let s = conf("expandable_segments:True");
    let mut a = Allocator::new(s.clone(), Profile::V2_4, None);
    let mut d = CapacityDevice::new(None, AddressSpace::around(0, 0));
    let big = (3u64 << 40) + 7;
    let x = a.malloc(&mut d, big, 0, (0, 0), 0).unwrap();
    assert!(a.block_size(x) >= big);
    assert_eq!(a.reserved(), big.div_ceil(20 * MIB) * 20 * MIB);
    let mut a = Allocator::new(s, Profile::V2_4, Some(80 << 30));
    assert!(a.malloc(&mut d, 91 << 30, 0, (0, 0), 0).is_err());
}
