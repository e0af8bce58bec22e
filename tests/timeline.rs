//! Replay: property tests on generated event scripts, and the `timeline` command.

mod common;

use assert_cmd::Command;
use common::{require_shared_data, root};
use proptest::prelude::*;
use vramlens::analysis::kinds::attribution::{Attributor, GroupBy};
use vramlens::analysis::moments::chart::{BandBy, TimelineView, ViewOptions, XAxis, build_view};
use vramlens::analysis::reports::top::Versions;
use vramlens::model::trace::NewEvent;
use vramlens::model::{Action, Block, BlockState, DeviceTrace, Segment, SegmentType, Snapshot};
use vramlens::timeline::replay::DeviceReplay;
use vramlens::timeline::state::allocator_state;
use vramlens::timeline::{self, Origin};

const BASE: u64 = 0x7f00_0000_0000;
const SLOT: u64 = 1 << 20;
const SLOTS: u64 = 8;

/// One step of a generated script.
#[derive(Debug, Clone)]
enum Op {
    /// Allocate `size` bytes in the first free slot at or after `slot`.
    Alloc { slot: u64, size: u64 },
    /// Free the live allocation at or after `slot`; completed now or later.
    Free { slot: u64, delayed: bool },
    /// Complete a delayed free.
    Complete { slot: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..SLOTS, 1..SLOT).prop_map(|(slot, size)| Op::Alloc { slot, size }),
        2 => (0..SLOTS, any::<bool>()).prop_map(|(slot, delayed)| Op::Free { slot, delayed }),
        1 => (0..SLOTS).prop_map(|slot| Op::Complete { slot }),
    ]
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum SlotState {
    Free,
    Live(u64),
    Pending(u64),
}

/// A valid trace (one segment allocated first, so the history is complete), the final
/// blocks it must end in, and the allocated total after each event computed directly.
struct Script {
    events: Vec<(Action, u64, u64)>,
    slots: Vec<SlotState>,
    /// Σ requested bytes held (live or pending) after each event.
    held_after: Vec<u64>,
}

fn run_script(ops: &[Op], complete_all: bool) -> Script {
    let mut slots = vec![SlotState::Free; SLOTS as usize];
    let mut events = vec![(Action::SegmentAlloc, BASE, SLOT * SLOTS)];
    let mut held_after = vec![0u64];
    let held = |slots: &[SlotState]| {
        slots
            .iter()
            .map(|s| match s {
                SlotState::Live(n) | SlotState::Pending(n) => *n,
                SlotState::Free => 0,
            })
            .sum::<u64>()
    };
    let find = |slots: &[SlotState], start: u64, want: &dyn Fn(SlotState) -> bool| {
        (0..SLOTS)
            .map(|k| (start + k) % SLOTS)
            .find(|&s| want(slots[s as usize]))
    };
    let mut push = |events: &mut Vec<(Action, u64, u64)>, slots: &[SlotState], e| {
        events.push(e);
        held_after.push(held(slots));
    };
    for op in ops {
        match *op {
            Op::Alloc { slot, size } => {
                if let Some(s) = find(&slots, slot, &|st| st == SlotState::Free) {
                    slots[s as usize] = SlotState::Live(size);
                    push(&mut events, &slots, (Action::Alloc, BASE + s * SLOT, size));
                }
            }
            Op::Free { slot, delayed } => {
                if let Some(s) = find(&slots, slot, &|st| matches!(st, SlotState::Live(_))) {
                    let SlotState::Live(size) = slots[s as usize] else {
                        unreachable!()
                    };
                    slots[s as usize] = SlotState::Pending(size);
                    push(
                        &mut events,
                        &slots,
                        (Action::FreeRequested, BASE + s * SLOT, size),
                    );
                    if !delayed {
                        slots[s as usize] = SlotState::Free;
                        push(
                            &mut events,
                            &slots,
                            (Action::FreeCompleted, BASE + s * SLOT, size),
                        );
                    }
                }
            }
            Op::Complete { slot } => {
                if let Some(s) = find(&slots, slot, &|st| matches!(st, SlotState::Pending(_))) {
                    let SlotState::Pending(size) = slots[s as usize] else {
                        unreachable!()
                    };
                    slots[s as usize] = SlotState::Free;
                    push(
                        &mut events,
                        &slots,
                        (Action::FreeCompleted, BASE + s * SLOT, size),
                    );
                }
            }
        }
    }
    if complete_all {
        for s in 0..SLOTS {
            if let SlotState::Pending(size) = slots[s as usize] {
                slots[s as usize] = SlotState::Free;
                push(
                    &mut events,
                    &slots,
                    (Action::FreeCompleted, BASE + s * SLOT, size),
                );
            }
        }
    }
    Script {
        events,
        slots,
        held_after,
    }
}

/// Block bytes of the allocations held after event `i`, from the script alone: an
/// allocation that still holds its slot's block at the end (the last alloc at that
/// address, the slot live or pending at the end) counts the block (`SLOT` bytes, the size
/// `snapshot` gives every final block); every other one its size rounded up to 512 bytes.
fn script_held_blocks(script: &Script, i: usize) -> u64 {
    let mut last_alloc: std::collections::BTreeMap<u64, usize> = Default::default();
    for (k, &(action, addr, _)) in script.events.iter().enumerate() {
        if action == Action::Alloc {
            last_alloc.insert(addr, k);
        }
    }
    let held_at_end = |addr: u64| {
        !matches!(
            script.slots[((addr - BASE) / SLOT) as usize],
            SlotState::Free
        )
    };
    let mut held: std::collections::BTreeMap<u64, u64> = Default::default();
    for (k, &(action, addr, size)) in script.events[..=i].iter().enumerate() {
        match action {
            Action::Alloc => {
                let block = if last_alloc[&addr] == k && held_at_end(addr) && SLOT >= size {
                    SLOT
                } else {
                    size.div_ceil(512).max(1) * 512
                };
                held.insert(addr, block);
            }
            Action::FreeCompleted => {
                held.remove(&addr);
            }
            _ => {}
        }
    }
    held.values().sum()
}

fn snapshot(events: &[(Action, u64, u64)], slots: &[SlotState]) -> Snapshot {
    let mut trace = DeviceTrace::default();
    for (i, &(action, addr, size)) in events.iter().enumerate() {
        trace.push(NewEvent {
            action: Some(action),
            addr,
            size,
            time_us: Some(1_700_000_000_000_000 + 10 * i as i64),
            ..Default::default()
        });
    }
    let blocks: Vec<Block> = slots
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let (state, requested) = match *s {
                SlotState::Free => (BlockState::Inactive, 0),
                SlotState::Live(n) => (BlockState::ActiveAllocated, n),
                SlotState::Pending(n) => (BlockState::ActivePendingFree, n),
            };
            Block {
                address: BASE + k as u64 * SLOT,
                size: SLOT,
                requested_size: requested,
                state,
                stack: None,
            }
        })
        .collect();
    Snapshot {
        segments: vec![Segment {
            device: 0,
            address: BASE,
            total_size: SLOT * SLOTS,
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream: 0,
            segment_type: SegmentType::Large,
            pool_id: Some((0, 0)),
            is_expandable: false,
            stack: None,
            blocks,
        }],
        device_traces: vec![trace],
        ..Snapshot::default()
    }
}

/// Each column's bands stack without gaps from the rest band up to its requested bytes.
fn check_columns(view: &TimelineView) -> Result<(), TestCaseError> {
    for (b, bucket) in view.buckets.iter().enumerate() {
        let mut cells: Vec<(u64, u64)> = view
            .bands
            .iter()
            .flat_map(|band| &band.runs)
            .filter(|(first, cells)| *first <= b && b < first + cells.len())
            .map(|(first, cells)| cells[b - first])
            .collect();
        cells.sort();
        let mut top = bucket.rest_bytes;
        for (bottom, height) in cells {
            prop_assert_eq!(bottom, top);
            top += height;
        }
        prop_assert_eq!(top, bucket.requested_bytes);
    }
    Ok(())
}

/// Requested bytes after each event.
fn requested_series(tl: &common::timeline::DeviceTimeline) -> Vec<u64> {
    (0..tl.events()).map(|i| tl.requested_at(Some(i))).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn replay_of_a_complete_trace(ops in prop::collection::vec(op(), 0..120)) {
        let script = run_script(&ops, false);
        let snap = snapshot(&script.events, &script.slots);
        let tl = common::timeline::build(&snap, 0);
        // Bytes are conserved: after each event, allocated = what the script holds.
        prop_assert_eq!(tl.start.requested, 0);
        prop_assert_eq!(&requested_series(&tl), &script.held_after);
        // The peak is the true maximum, first reached where reported.
        let max = script.held_after.iter().copied().max().unwrap_or(0);
        prop_assert_eq!(tl.peak_requested.bytes, max);
        if let Some(e) = tl.peak_requested.event {
            prop_assert_eq!(script.held_after[e.index()], max);
            prop_assert!(script.held_after[..e.index()].iter().all(|&v| v < max));
        }
        // The streaming pass used by summary agrees.
        let peaks = timeline::peaks(&snap, 0);
        prop_assert_eq!(peaks.requested, tl.peak_requested);
        prop_assert_eq!(peaks.allocated, tl.peak_allocated);
        prop_assert_eq!(peaks.reserved, tl.peak_reserved);
        // Requested never exceeds reserved with a complete history.
        prop_assert_eq!(tl.start.reserved, 0);
        for i in 0..tl.events() {
            prop_assert!(tl.requested_at(Some(i)) as i64 <= tl.reserved_at(Some(i)));
        }
        // Every free pairs with its own allocation, in order, versioned per address.
        for l in &tl.lifetimes {
            prop_assert_eq!(l.origin, Origin::Traced);
            let a = l.alloc.unwrap().index();
            prop_assert_eq!(script.events[a], (Action::Alloc, l.addr, l.size));
            // The viewer's version: frees completed at the address before this alloc.
            let freed_before = script.events[..a]
                .iter()
                .filter(|e| e.0 == Action::FreeCompleted && e.1 == l.addr)
                .count();
            prop_assert_eq!(l.version as usize, freed_before);
            if let Some(f) = l.free_completed {
                let f = f.index();
                prop_assert!(f > a);
                prop_assert_eq!(script.events[f], (Action::FreeCompleted, l.addr, l.size));
                let r = l.free_requested.unwrap().index();
                prop_assert!(a < r && r < f);
            }
        }
        // The replay ends in exactly the final blocks (live and pending ones).
        let last = script.events.len() - 1;
        let mut live: Vec<(u64, u64)> = tl.live_at(Some(last)).iter().map(|l| (l.addr, l.size)).collect();
        live.sort();
        let mut blocks: Vec<(u64, u64)> = snap.segments[0]
            .blocks
            .iter()
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| (b.address, b.requested_size))
            .collect();
        blocks.sort();
        prop_assert_eq!(live, blocks);
        // Block bytes: the final block of each allocation that holds one at the end,
        // every other held allocation rounded up to whole 512-byte units.
        let states: Vec<Option<usize>> = (0..script.events.len()).map(Some).collect();
        let active = common::timeline::allocated_at(&tl, &snap, &states);
        for (i, a) in active.iter().enumerate() {
            let want: u64 = script_held_blocks(&script, i);
            prop_assert_eq!(*a, want);
            prop_assert!(*a >= tl.requested_at(Some(i)));
        }
        // The allocated (block bytes) peak is the maximum of those, first reached there.
        let block_max = active.iter().copied().max().unwrap_or(0);
        prop_assert_eq!(tl.peak_allocated.bytes, block_max);
        if let Some(e) = tl.peak_allocated.event {
            prop_assert_eq!(active[e.index()], block_max);
            prop_assert!(active[..e.index()].iter().all(|&v| v < block_max));
        }
        // The live set at any moment, as `top` and `oom` collect it in one pass, is the
        // full replay's: the same allocations (made by then, not freed by then).
        let r = DeviceReplay::new(&snap, 0);
        let n = script.events.len();
        for at in [None, Some(0), Some(n / 3), Some(n / 2), n.checked_sub(1)] {
            let key = |l: &timeline::Lifetime| (l.addr, l.version, l.size, l.alloc);
            let mut want: Vec<_> = tl.live_at(at).into_iter().map(key).collect();
            want.sort();
            let live = vramlens::analysis::reports::top::live_state(&r, at, Versions::Counted);
            // Traced allocations first, by alloc event.
            let traced = live.lifetimes.iter().take_while(|l| l.alloc.is_some()).count();
            prop_assert!(live.lifetimes[traced..].iter().all(|l| l.alloc.is_none()));
            prop_assert!(live.lifetimes[..traced].windows(2).all(|w| w[0].alloc < w[1].alloc));
            let mut got: Vec<_> = live.lifetimes.iter().map(key).collect();
            got.sort();
            prop_assert_eq!(&got, &want, "live set at {:?}", at);
            // Without versions: the same set, every version 0.
            let bare = vramlens::analysis::reports::top::live_state(&r, at, Versions::NotNeeded);
            let mut bare: Vec<_> = bare.lifetimes.iter().map(key).collect();
            bare.sort();
            let mut zeroed: Vec<_> = got.iter().map(|&(a, _, s, e)| (a, 0, s, e)).collect();
            zeroed.sort();
            prop_assert_eq!(bare, zeroed, "unversioned live set at {:?}", at);
        }
        // The set at the peak, from the pass that finds the peak.
        let at_peak = vramlens::analysis::reports::top::live_state_at_peak(&r, Versions::Counted);
        prop_assert_eq!(at_peak.at, tl.peak_requested.event.map(|e| e.index()));
        let key = |l: &timeline::Lifetime| (l.addr, l.version, l.size, l.alloc);
        let mut want: Vec<_> = tl.live_at(at_peak.at).into_iter().map(key).collect();
        want.sort();
        let mut got: Vec<_> = at_peak.lifetimes.iter().map(key).collect();
        got.sort();
        prop_assert_eq!(got, want, "live set at the peak");
        // Downsampling keeps the peak, whatever the number of buckets.
        // and every byte of each column is in a band or the rest band.
        let attr = Attributor::new(&snap.frames, &Default::default());
        if !r.has_timeline() {
            // Fewer than two changes of memory: nothing over time to draw.
            prop_assert!(build_view(&snap, &r, &attr, ViewOptions::default()).is_err());
            return Ok(());
        }
        for buckets in [1, 3, 7, 50] {
            for by in [BandBy::Group(GroupBy::Callsite), BandBy::Allocation] {
                let options = ViewOptions { x: XAxis::Events, by, top: 3, buckets, window: None };
                let view = build_view(&snap, &r, &attr, options).unwrap();
                prop_assert_eq!(view.buckets.iter().map(|b| b.requested_bytes).max().unwrap(), max);
                // The chart's exact peaks come from its own pass, as the full replay's.
                prop_assert_eq!(view.requested_peak, tl.peak_requested);
                prop_assert_eq!(view.reserved_peak, tl.peak_reserved);
                check_columns(&view)?;
            }
        }
        // With a band for every allocation, each column holds exactly the allocations
        // alive in its state, as the full replay has them (windows included).
        let n = r.len() as f64;
        for window in [None, Some((0.0, n)), Some((n / 3.0, 2.0 * n / 3.0))] {
            for buckets in [1, 4, 13] {
                let options = ViewOptions {
                    x: XAxis::Events,
                    by: BandBy::Allocation,
                    top: 10_000,
                    buckets,
                    window,
                };
                let view = build_view(&snap, &r, &attr, options).unwrap();
                for (b, bucket) in view.buckets.iter().enumerate() {
                    let mut want: Vec<String> =
                        tl.live_at(bucket.event.map(|e| e as usize)).iter().map(|l| l.label()).collect();
                    want.sort();
                    let mut got: Vec<String> = view
                        .bands
                        .iter()
                        .filter(|band| {
                            band.runs.iter().any(|(first, cells)| *first <= b && b < first + cells.len())
                        })
                        .map(|band| band.name.clone())
                        .collect();
                    got.sort();
                    prop_assert_eq!(got, want, "column {} of {} in {:?}", b, buckets, window);
                    prop_assert_eq!(bucket.rest_bytes, 0);
                }
            }
        }
    }

    #[test]
    fn allocator_state_rebuilt_backwards_matches_the_forward_replay(
        ops in prop::collection::vec(op(), 0..80),
        at in 0usize..200,
    ) {
        let script = run_script(&ops, false);
        let snap = snapshot(&script.events, &script.slots);
        let tl = common::timeline::build(&snap, 0);
        let at = at.min(script.events.len() - 1);
        let state = allocator_state(&snap, 0, Some(at));
        // One segment, allocated by event 0.
        prop_assert_eq!(state.len(), 1);
        prop_assert_eq!((state[0].addr, state[0].size), (BASE, SLOT * SLOTS));
        let mut blocks: Vec<(u64, u64)> = state[0].blocks.iter().map(|b| (b.addr, b.requested)).collect();
        blocks.sort();
        let mut live: Vec<(u64, u64)> = tl.live_at(Some(at)).iter().map(|l| (l.addr, l.size)).collect();
        live.sort();
        prop_assert_eq!(blocks, live);
        // Pending exactly between free_requested and free_completed.
        for b in &state[0].blocks {
            let l = tl.live_at(Some(at)).into_iter().find(|l| l.addr == b.addr).unwrap();
            let requested = l.free_requested.is_some_and(|r| r.index() <= at);
            prop_assert_eq!(b.pending_free, requested);
        }
        // Before the first event there was nothing.
        prop_assert!(allocator_state(&snap, 0, None).is_empty());
    }

    #[test]
    fn replay_of_a_truncated_trace_rebuilds_earlier_memory(
        ops in prop::collection::vec(op(), 1..120),
        cut in 0usize..200,
    ) {
        // Frees all complete, so every allocation alive at the end is a plain survivor.
        let script = run_script(&ops, true);
        let full_snap = snapshot(&script.events, &script.slots);
        let full = common::timeline::build(&full_snap, 0);
        let cut = cut.min(script.events.len() - 1);
        let truncated = snapshot(&script.events[cut..], &script.slots);
        let tl = common::timeline::build(&truncated, 0);
        // Orphan frees and survivors restore what existed before the window.
        prop_assert_eq!(tl.start.requested, full.requested_at(cut.checked_sub(1)));
        prop_assert_eq!(&requested_series(&tl)[..], &requested_series(&full)[cut..]);
        prop_assert_eq!(tl.start.reserved, full.reserved_at(cut.checked_sub(1)));
        for i in 0..tl.events() {
            prop_assert_eq!(tl.reserved_at(Some(i)), full.reserved_at(Some(cut + i)));
        }
        // One pass that keeps only chosen states gives the same totals there and at
        // the peak, memory from before the window included.
        let states: Vec<Option<usize>> = std::iter::once(None)
            .chain((0..tl.events()).step_by(3).map(Some))
            .rev()
            .collect();
        let totals = timeline::totals_at_events(&truncated, 0, states.clone());
        for at in states {
            prop_assert_eq!(totals.requested_at(at), tl.requested_at(at));
            prop_assert_eq!(totals.reserved_at(at), tl.reserved_at(at));
        }
        prop_assert_eq!(totals.peaks.requested, tl.peak_requested);
        if let Some(peak) = tl.peak_requested.event.map(|e| e.index()) {
            prop_assert_eq!(totals.requested_at(Some(peak)), tl.requested_at(Some(peak)));
            prop_assert_eq!(totals.reserved_at(Some(peak)), tl.reserved_at(Some(peak)));
        }
    }
}

fn vramlens() -> Command {
    let mut c = Command::cargo_bin("vramlens").unwrap();
    c.current_dir(root());
    c
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn timeline_svg_of_the_sample() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.svg");
    vramlens()
        .args(["timeline", "testdata/sample.pickle", "-o"])
        .arg(&out)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.starts_with("<?xml"));
    assert!(svg.trim_end().ends_with("</svg>"));
    // The picture, and inside it the plot's viewport (what a zoom of the report moves) of
    // the whole chart and of the panel around the OOM.
    assert_eq!(count(&svg, "<svg "), 3);
    assert!(svg.contains("around the OOM, drawn wider"));
    assert_eq!(
        count(
            &svg,
            r#"<svg class="plot" x="80" y="0" width="870" height="640" viewBox="80 0 870 640" preserveAspectRatio="none">"#
        ),
        2
    );
    // Title with the peak (figures from the independent computation in expected.json).
    assert!(
        svg.contains("peak requested 446.6 MiB at event 71"),
        "title"
    );
    // Bands are call sites: the peak's largest one (model.py:192, two allocations of
    // 196.5 MiB at most together) is named, with its frames in the tooltip.
    assert!(svg.contains(r#"data-label="/home/alice/nanogpt/model.py:192:forward""#));
    assert!(svg.contains("nanogpt/model.py:192 in forward"));
    // One band per allocation on request: the largest has its exact size.
    let out2 = dir.path().join("a.svg");
    vramlens()
        .args([
            "timeline",
            "testdata/sample.pickle",
            "--by",
            "allocation",
            "-o",
        ])
        .arg(&out2)
        .assert()
        .success();
    let by_allocation = std::fs::read_to_string(&out2).unwrap();
    assert!(
        by_allocation.contains(r#"data-bytes="206045184""#),
        "largest allocation band"
    );
    assert!(by_allocation.contains("cross_entropy"));
    assert!(svg.contains("OOM at event 322"));
    assert!(svg.contains("ProfilerStep#0"));
    // The annotation spans wide enough carry their label (the part before '#'), drawn,
    // not only in the tooltip.
    assert_eq!(
        count(
            &svg,
            r#"text-anchor="middle" font-size="10">ProfilerStep</text>"#
        ),
        2,
        "annotation labels"
    );
    // Each band has one colour, its name's (tests/charts.rs: the same in every chart). A
    // colour follows the name, not the band's place in the stack, so two bands may share
    // one: here model.py:88 and model.py:89, next to each other (docs/design.md).
    let fills: Vec<(String, String)> = svg
        .lines()
        .filter(|l| l.starts_with("<polygon") && l.contains("data-label=\""))
        .map(|l| {
            let attr = |name: &str| {
                let start = l.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                l[start..start + l[start..].find('"').unwrap()].to_string()
            };
            (attr("data-label"), attr("fill"))
        })
        .collect();
    let mut bands = fills.clone();
    bands.dedup_by(|a, b| a.0 == b.0);
    assert!(bands.len() >= 5, "{bands:?}");
    for (label, fill) in &fills {
        let first = &bands.iter().find(|b| &b.0 == label).unwrap().1;
        assert_eq!(fill, first, "{label}: two colours");
    }
    // The legend gives each band's bytes at the peak: the two allocations of 196.5 MiB
    // at most together.
    assert!(
        svg.contains("model.py:192 in forward (196.5 MiB)"),
        "legend"
    );
    // The OOM sits in the last events: a second panel draws it wider, 40 events (3% of
    // 330 is less) ending at the last of the 330, and names the --window that draws it.
    assert_eq!(count(&svg, "around the OOM, drawn wider"), 1);
    assert!(
        svg.contains("draw any range alone with --window 290..330"),
        "zoom range"
    );
    assert_eq!(count(&svg, "<g transform=\"translate(0,640)\">"), 1);
    // Every opened tooltip is closed, and the level of detail holds.
    assert_eq!(count(&svg, "<title>"), count(&svg, "</title>"));
    let shapes = count(&svg, "<polygon")
        + count(&svg, "<rect")
        + count(&svg, "<line")
        + count(&svg, "<polyline");
    assert!(shapes < 20_000, "{shapes} shapes");
    assert!(svg.len() < 2 << 20);
}

#[test]
fn timeline_refuses_to_overwrite_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.svg");
    std::fs::write(&out, "keep me").unwrap();
    let o = vramlens()
        .args(["timeline", "testdata/sample.pickle", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(
        err.contains("already exists; use --force to overwrite it"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");
    vramlens()
        .args(["timeline", "testdata/sample.pickle", "--force", "-o"])
        .arg(&out)
        .assert()
        .success();
    assert!(std::fs::read_to_string(&out).unwrap().starts_with("<?xml"));
}

#[test]
fn a_failed_timeline_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.svg");
    vramlens()
        .args(["timeline", "testdata/v2_1.pickle", "--x", "time", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "no time_us (PyTorch before 2.2); use --x events",
        ));
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn live_set_at_the_peak_adds_up() {
    let out = vramlens()
        .args([
            "timeline",
            "testdata/sample.pickle",
            "--at",
            "peak",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("testdata/sample.pickle.expected.json")).unwrap(),
    )
    .unwrap();
    let peak = &expected["devices"][0]["peak_requested_bytes"];
    assert_eq!(&v["requested_bytes"], peak);
    assert_eq!(
        v["moment"]["event"],
        expected["devices"][0]["peak_requested_index"]
    );
    let sum: u64 = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["size_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(serde_json::Value::from(sum), *peak);
    // Largest first.
    let sizes: Vec<u64> = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["size_bytes"].as_u64().unwrap())
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]));
}

#[test]
fn live_set_at_the_oom() {
    let out = vramlens()
        .args(["timeline", "testdata/sample.pickle", "--at", "oom"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("testdata/sample.pickle: device 0, at the OOM (after event 322"),
        "{text}"
    );
    vramlens()
        .args(["timeline", "testdata/v2_2.pickle", "--at", "oom"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("has no oom event"));
    vramlens()
        .args(["timeline", "testdata/sample.pickle", "--at", "sometime"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "expected peak, oom, end, event:N or time:T",
        ));
}

/// `--x time --window 5..20` on the sample: the columns cover 5 ms to 20 ms after the first
/// event and nothing else, and each shows the highest allocated total of the events in it,
/// replayed here by hand from the trace entries (alloc adds the requested size,
/// free_completed takes it back; the sample's history is complete).
#[test]
fn time_axis_and_window() {
    let (snap, _) =
        vramlens::input::read_snapshot(&root().join("testdata/sample.pickle"), Default::default())
            .unwrap();
    let trace = snap.trace(0).unwrap();
    let t0 = trace
        .iter()
        .find_map(|e| e.time_us.filter(|&t| t > 0))
        .unwrap();
    let mut open = std::collections::BTreeMap::new();
    let mut total = 0u64;
    // (µs since the first event, allocated after the event), per event.
    let mut after = Vec::new();
    for e in trace.iter() {
        match e.action {
            Action::Alloc => {
                open.insert(e.addr, e.size);
                total += e.size;
            }
            Action::FreeCompleted => total -= open.remove(&e.addr).unwrap(),
            _ => {}
        }
        after.push((e.time_us.unwrap() - t0, total));
    }
    let r = DeviceReplay::new(&snap, 0);
    let attr = Attributor::new(&snap.frames, &Default::default());
    let view = build_view(
        &snap,
        &r,
        &attr,
        ViewOptions {
            x: XAxis::Time,
            by: BandBy::Group(GroupBy::Callsite),
            top: 5,
            buckets: 15,
            window: Some((5_000.0, 20_000.0)),
        },
    )
    .unwrap();
    assert_eq!((view.x_min, view.x_max), (5_000.0, 20_000.0));
    assert_eq!(view.buckets.len(), 15);
    let mut checked = 0;
    for (b, bucket) in view.buckets.iter().enumerate() {
        let (x0, x1) = (5_000 + 1_000 * b as i64, 6_000 + 1_000 * b as i64);
        assert_eq!((bucket.x0, bucket.x1), (x0 as f64, x1 as f64), "column {b}");
        let inside: Vec<(usize, u64)> = after
            .iter()
            .enumerate()
            .filter(|(_, (t, _))| *t >= x0 && (*t < x1 || (b == 14 && *t == x1)))
            .map(|(i, &(_, bytes))| (i, bytes))
            .collect();
        // The highest total in the column (the first event that reaches it), else the
        // state the column inherits from the last event before it.
        let want = match inside.iter().map(|&(_, bytes)| bytes).max() {
            Some(max) => inside.iter().find(|&&(_, bytes)| bytes == max).copied(),
            None => after
                .iter()
                .enumerate()
                .rev()
                .find(|(_, (t, _))| *t < x0)
                .map(|(i, &(_, bytes))| (i, bytes)),
        }
        .unwrap();
        assert_eq!(
            (bucket.event, bucket.requested_bytes),
            (Some(want.0 as u32), want.1),
            "column {b}"
        );
        checked += inside.len();
    }
    // The window holds part of the trace, not all of it.
    assert!(checked > 10 && checked < after.len(), "{checked} events");
    // The binary draws the same window: the axis is labelled in ms from 6 to 20 (none
    // outside the window).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.svg");
    vramlens()
        .args([
            "timeline",
            "testdata/sample.pickle",
            "--x",
            "time",
            "--window",
            "5..20",
            "--top",
            "5",
            "-o",
        ])
        .arg(&out)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&out).unwrap();
    let ticks: Vec<&str> = svg
        .split("text-anchor=\"middle\">")
        .skip(1)
        .filter_map(|s| s.split_once("</text>").map(|(t, _)| t))
        .filter(|t| t.ends_with(" ms"))
        .collect();
    assert_eq!(
        ticks,
        [
            "6 ms", "8 ms", "10 ms", "12 ms", "14 ms", "16 ms", "18 ms", "20 ms"
        ]
    );
    // A chart of a window chosen draws no zoom panel (the OOM is outside it anyway).
    assert!(!svg.contains("drawn wider"));
    // The --window the zoom panel names draws what the panel shows.
    let zoom = dir.path().join("z.svg");
    vramlens()
        .args([
            "timeline",
            "testdata/sample.pickle",
            "--window",
            "290..330",
            "-o",
        ])
        .arg(&zoom)
        .assert()
        .success();
    let zoomed = std::fs::read_to_string(&zoom).unwrap();
    assert!(!zoomed.contains("drawn wider"));
    assert!(zoomed.contains("OOM at event 322"));
}

/// The zoom is known from the axis before the chart: on every real snapshot with a
/// trace, on both axes, the zoom the axis expects (around an OOM, else around the peak it
/// estimates) is the one the chart asks for, and the chart and its zoom drawn from one
/// replay are the two drawn from a replay each.
#[test]
#[ignore = "needs ../shared/data"]
fn the_zoom_is_known_before_the_chart() {
    use vramlens::analysis::moments::chart::{
        ZoomAround, build_view_and_zoom, build_view_on, build_view_zoomed, chart_axis, zoom_ahead,
        zoom_window,
    };
    let data = require_shared_data();
    let mut files: Vec<_> = walk(&data);
    files.sort();
    let (mut around_oom, mut around_peak) = (0, 0);
    for f in files {
        let (snap, info) = vramlens::input::read_snapshot(&f, Default::default()).unwrap();
        let attr = Attributor::new(&snap.frames, &Default::default());
        for device in snap.devices() {
            let r = DeviceReplay::new(&snap, device);
            for x in [XAxis::Events, XAxis::Time] {
                let options = ViewOptions {
                    x,
                    ..Default::default()
                };
                let at = format!("{} device {device} {x:?}", info.path);
                let axis = match chart_axis(&r, x) {
                    Ok(axis) => axis,
                    Err(e) => {
                        assert_eq!(build_view(&snap, &r, &attr, options), Err(e), "{at}");
                        continue;
                    }
                };
                let view = build_view_on(&snap, &r, &attr, &axis, options).unwrap();
                assert_eq!(build_view(&snap, &r, &attr, options).unwrap(), view, "{at}");
                let wanted = zoom_window(&view, false);
                let ahead = zoom_ahead(&axis, options);
                assert_eq!(ahead, wanted, "{at}");
                let zoomed = build_view_zoomed(&snap, &r, &attr, &axis, options).unwrap();
                let Some(z) = ahead else {
                    assert_eq!(zoomed, (view, None), "{at}");
                    continue;
                };
                match z.around {
                    ZoomAround::Oom => around_oom += 1,
                    ZoomAround::Peak => around_peak += 1,
                }
                let window = Some((z.x0, z.x1));
                let apart =
                    build_view_on(&snap, &r, &attr, &axis, ViewOptions { window, ..options })
                        .unwrap();
                let (main, together) =
                    build_view_and_zoom(&snap, &r, &attr, &axis, options, z).unwrap();
                assert_eq!(main, view, "{at}");
                assert_eq!(together, apart, "{at}");
                assert_eq!(zoomed, (view, Some((z, apart))), "{at}");
            }
        }
    }
    // The two torchtitan ranks and the device of the expandable-segments recording
    // that ran out, each on both axes; and charts whose peak sits at an end.
    assert!(around_oom >= 6, "{around_oom} charts zoomed around an OOM");
    assert!(
        around_peak >= 10,
        "{around_peak} charts zoomed around the peak"
    );
}

/// Where the axis's estimate of the peak is wrong (a free recorded at another size than
/// its allocation's, which the replay goes by), the chart still gets the zoom it asks
/// for, drawn as on its own: the estimate only decides whether the zoom shares the
/// chart's replay.
#[test]
fn a_wrong_estimate_of_the_peak_leaves_the_zoom_as_the_chart_asks() {
    use vramlens::analysis::moments::chart::{
        ZoomAround, build_view_on, build_view_zoomed, chart_axis, zoom_ahead, zoom_window,
    };
    let (a, b) = (BASE, BASE + SLOT);
    let pairs = |n: usize, size: u64| -> Vec<(Action, u64, u64)> {
        (0..n)
            .flat_map(|_| [(Action::Alloc, b, size), (Action::FreeCompleted, b, size)])
            .collect()
    };
    // 1. The peak is the first allocation (1000 bytes, at event 0); its free is recorded
    //    as 1 byte, so counting frees at their recorded size puts the peak at the
    //    500-byte allocation halfway.
    let mut first_peak = vec![(Action::Alloc, a, 1000), (Action::FreeCompleted, a, 1)];
    first_peak.extend(pairs(50, 1));
    first_peak.extend(pairs(1, 500));
    first_peak.extend(pairs(50, 1));
    // 2. The peak is the 500-byte allocation halfway; the first allocation's free is
    //    recorded as 1000 bytes, so the estimate puts the peak at the start.
    let mut middle_peak = vec![(Action::Alloc, a, 100), (Action::FreeCompleted, a, 1000)];
    middle_peak.extend(pairs(50, 1));
    middle_peak.extend(pairs(1, 500));
    middle_peak.extend(pairs(50, 1));
    let free = [SlotState::Free; SLOTS as usize];
    for (events, zoom_expected) in [(first_peak, true), (middle_peak, false)] {
        let snap = snapshot(&events, &free);
        let attr = Attributor::new(&snap.frames, &Default::default());
        let r = DeviceReplay::new(&snap, 0);
        let options = ViewOptions::default();
        let axis = chart_axis(&r, XAxis::Events).unwrap();
        let view = build_view_on(&snap, &r, &attr, &axis, options).unwrap();
        let wanted = zoom_window(&view, false);
        // Worked by hand: the chart's peak is at event 0 (x = 1 of 204) in the first
        // trace, at event 102 in the second; the estimate at the other.
        assert_eq!(
            view.peak.as_ref().map(|p| p.event),
            Some(Some(if zoom_expected { 0 } else { 102 }))
        );
        assert_eq!(wanted.is_some(), zoom_expected);
        assert_ne!(zoom_ahead(&axis, options), wanted);
        let expected = wanted.map(|z| {
            assert_eq!(z.around, ZoomAround::Peak);
            let window = Some((z.x0, z.x1));
            let apart = build_view_on(&snap, &r, &attr, &axis, ViewOptions { window, ..options });
            (z, apart.unwrap())
        });
        let zoomed = build_view_zoomed(&snap, &r, &attr, &axis, options).unwrap();
        assert_eq!(zoomed, (view, expected));
    }
}

/// Every real snapshot with a trace draws within the level-of-detail limits, with the
/// peak kept and every byte of every column in a band.
#[test]
#[ignore = "needs ../shared/data"]
fn real_snapshots_draw_within_limits() {
    let data = require_shared_data();
    let mut files: Vec<_> = walk(&data);
    files.sort();
    let mut drawn = 0;
    for f in files {
        let (snap, info) = vramlens::input::read_snapshot(&f, Default::default()).unwrap();
        let attr = Attributor::new(&snap.frames, &Default::default());
        for device in snap.devices() {
            let r = DeviceReplay::new(&snap, device);
            if !r.has_timeline() {
                continue;
            }
            let peaks = timeline::peaks(&snap, device);
            for by in [
                BandBy::Group(GroupBy::Callsite),
                BandBy::Group(GroupBy::Category),
                BandBy::Allocation,
            ] {
                let options = ViewOptions {
                    by,
                    ..Default::default()
                };
                let view = build_view(&snap, &r, &attr, options).unwrap();
                let max = view
                    .buckets
                    .iter()
                    .map(|b| b.requested_bytes)
                    .max()
                    .unwrap();
                assert_eq!(
                    max, peaks.requested.bytes,
                    "{} device {device}: the peak survives downsampling",
                    info.path
                );
                check_columns(&view).unwrap();
                if let BandBy::Group(_) = by {
                    // The rest band holds at most a tenth of the peak, or many bands
                    // are drawn.
                    let rest = view.buckets.iter().map(|b| b.rest_bytes).max().unwrap();
                    assert!(
                        rest * 10 <= max || view.bands.len() == 60,
                        "{} device {device}: rest {rest} of {max} with {} bands",
                        info.path,
                        view.bands.len()
                    );
                }
                let choice =
                    vramlens::analysis::device::choose_device(&snap, Some(device)).unwrap();
                let mut svg = Vec::new();
                let title = vramlens::render::charts::timeline_svg::ChartTitle {
                    path: &info.path,
                    device: &choice,
                    events: r.len(),
                    peak_requested: peaks.requested.bytes,
                    peak_event: None,
                    peak_reserved: Some(peaks.reserved.bytes),
                };
                vramlens::render::charts::timeline_svg::write_timeline_svg(
                    &mut svg, &view, &title, None, None, None,
                )
                .unwrap();
                let svg = String::from_utf8(svg).unwrap();
                assert!(svg.len() < 2 << 20, "{}: {} bytes", info.path, svg.len());
                assert_eq!(count(&svg, "<title>"), count(&svg, "</title>"));
            }
            drawn += 1;
        }
    }
    assert!(drawn > 20, "drew {drawn} device timelines");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "pickle" || x == "pkl") {
            out.push(p);
        }
    }
    out
}

/// The sample chart renders in headless Chromium: a non-blank picture of the right size.
#[test]
#[ignore = "needs chromium"]
fn sample_chart_renders_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("t.svg");
    vramlens()
        .args(["timeline", "testdata/sample.pickle", "-o"])
        .arg(&svg)
        .assert()
        .success();
    let (pixels, channels) =
        common::chromium_pixels(&format!("file://{}", svg.display()), 1280, 640);
    let colored = pixels
        .chunks(channels)
        .filter(|p| {
            let (r, g, b) = (p[0] as i32, p[1] as i32, p[2] as i32);
            (r - g).abs() > 40 || (g - b).abs() > 40 || (r - b).abs() > 40
        })
        .count();
    // Bands cover a good part of the plot: far from a blank or error page.
    assert!(colored > 20_000, "only {colored} coloured pixels");
}

#[test]
fn segments_at_the_end_are_the_final_segments() {
    let out = vramlens()
        .args(["segments", "testdata/sample.pickle", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (snap, _) =
        vramlens::input::read_snapshot(&root().join("testdata/sample.pickle"), Default::default())
            .unwrap();
    let mut got: Vec<(u64, u64, usize)> = v["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["addr"].as_u64().unwrap(),
                s["size_bytes"].as_u64().unwrap(),
                s["blocks"].as_array().unwrap().len(),
            )
        })
        .collect();
    got.sort();
    let mut want: Vec<(u64, u64, usize)> = snap
        .segments
        .iter()
        .map(|s| {
            (
                s.address,
                s.total_size,
                s.blocks
                    .iter()
                    .filter(|b| b.state != BlockState::Inactive)
                    .count(),
            )
        })
        .collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn segments_at_the_peak_add_up_to_reserved() {
    let seg = vramlens()
        .args([
            "segments",
            "testdata/sample.pickle",
            "--at",
            "peak",
            "--json",
        ])
        .output()
        .unwrap();
    let live = vramlens()
        .args([
            "timeline",
            "testdata/sample.pickle",
            "--at",
            "peak",
            "--json",
        ])
        .output()
        .unwrap();
    let seg: serde_json::Value = serde_json::from_slice(&seg.stdout).unwrap();
    let live: serde_json::Value = serde_json::from_slice(&live.stdout).unwrap();
    assert_eq!(seg["moment"]["event"], live["moment"]["event"]);
    // Every live block belongs to a group; the groups' bytes add up to the blocks'.
    let blocks: Vec<&serde_json::Value> = seg["segments"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["blocks"].as_array().unwrap().iter())
        .collect();
    assert!(blocks.iter().all(|b| b["group"].is_u64()));
    let in_groups: u64 = seg["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["bytes"].as_u64().unwrap())
        .sum();
    let in_blocks: u64 = blocks
        .iter()
        .map(|b| b["size_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(in_groups, in_blocks);
    let reserved: u64 = seg["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["size_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(serde_json::Value::from(reserved), live["reserved_bytes"]);
    let requested: u64 = seg["segments"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["blocks"].as_array().unwrap().iter())
        .map(|b| b["requested_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(serde_json::Value::from(requested), live["requested_bytes"]);
}

#[test]
fn segments_svg_of_the_sample() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s.svg");
    vramlens()
        .args(["segments", "testdata/sample.pickle", "--at", "peak", "-o"])
        .arg(&out)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.contains("allocator state at the peak (after event 71"));
    // Blocks are coloured by call site, with a legend: the peak's largest call site.
    assert!(svg.contains("model.py:192 in forward"));
    assert!(svg.contains("reserved 476.0 MiB"));
    assert!(svg.contains(r#"data-bytes="206045184""#) || svg.contains("196.5 MiB requested"));
    assert_eq!(count(&svg, "<title>"), count(&svg, "</title>"));
    vramlens()
        .args(["segments", "testdata/sample.pickle", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("already exists"));
}

#[test]
fn device_readings_are_drawn_beside_pytorch_lines() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.svg");
    vramlens()
        .args([
            "timeline",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--x",
            "time",
            "--nvml",
            "testdata/gpu/oom/nvml.jsonl",
            "-o",
        ])
        .arg(&out)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.contains("device used (nvidia-smi / NVML), up to"));
    assert!(svg.contains("this process outside the caching allocator"));
    assert!(svg.contains("other processes and driver"));
    assert_eq!(count(&svg, "<title>"), count(&svg, "</title>"));
}

#[test]
fn timelines_and_windows_that_cannot_be_drawn_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.svg");
    for (args, message) in [
        (
            vec!["timeline", "testdata/v1_13_list.pickle", "-o"],
            "device 0 has no trace: nothing to draw, only the final state is known",
        ),
        (
            vec![
                "timeline",
                "testdata/sample.pickle",
                "--window",
                "5..3",
                "-o",
            ],
            "--window \"5..3\": the end must be after the start",
        ),
        (
            vec![
                "timeline",
                "testdata/sample.pickle",
                "--window",
                "500..900",
                "-o",
            ],
            "--window 500..900: the trace spans 0..330 on this axis (events); give a window inside it",
        ),
        (
            vec![
                "timeline",
                "testdata/sample.pickle",
                "--window",
                "NaN..5",
                "-o",
            ],
            "--window \"NaN..5\": expected numbers, found \"NaN\"",
        ),
    ] {
        vramlens()
            .args(&args)
            .arg(&out)
            .assert()
            .code(2)
            .stderr(predicates::str::contains(message));
        assert!(!out.exists());
    }
    // A window without a chart is not silently ignored.
    vramlens()
        .args(["timeline", "testdata/sample.pickle", "--window", "5..30"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("give -o FILE.svg with it"));
    // The replay in numbers of a file without a trace says how to record one.
    vramlens()
        .args(["timeline", "testdata/v1_13_list.pickle"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("_record_memory_history"));
}

#[test]
fn one_merged_group_is_one_group() {
    // Drawing 17 of the sample's call sites leaves one merged: in the singular.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.svg");
    vramlens()
        .args(["timeline", "testdata/sample.pickle", "--top", "17", "-o"])
        .arg(&out)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.contains(">1 other group (up to "), "{svg}");
    assert!(!svg.contains("1 other groups"));
}
