//! Traces shaped to hurt the replay and the analyses on it: times that go backwards, tens
//! of thousands of OOM events, hundreds of thousands of segment events and annotations.
//! Each must finish (linear or n log n work) with sane answers and no panic.

use vramlens::analysis::kinds::attribution::{AttributionOptions, Attributor};
use vramlens::analysis::moments::chart::{ViewError, ViewOptions, XAxis, build_view};
use vramlens::analysis::oom::{OomOptions, analyze_oom};
use vramlens::model::trace::NewEvent;
use vramlens::model::{Action, Annotation, DeviceTrace, Snapshot};
use vramlens::timeline::replay::DeviceReplay;
use vramlens::timeline::state::allocator_state;

fn snapshot(trace: DeviceTrace, annotations: Vec<Annotation>) -> Snapshot {
    Snapshot {
        device_traces: vec![trace],
        external_annotations: annotations,
        ..Snapshot::default()
    }
}

fn event(action: Action, addr: u64, size: u64, time_us: Option<i64>) -> NewEvent {
    NewEvent {
        action: Some(action),
        addr,
        size,
        time_us,
        ..Default::default()
    }
}

const T0: i64 = 1_700_000_000_000_000;

#[test]
fn time_that_goes_backwards_draws_on_a_time_axis() {
    // Allocations whose stamps go back and forth (clock adjustments, merged traces).
    let mut trace = DeviceTrace::default();
    let times = [T0 + 1000, T0 + 10, T0 + 5000, T0 + 20, T0 + 7000, T0 + 30];
    for (i, &t) in times.iter().enumerate() {
        trace.push(event(
            Action::Alloc,
            0x1000 * (i as u64 + 1),
            1 << 20,
            Some(t),
        ));
    }
    let snap = snapshot(trace, Vec::new());
    let r = DeviceReplay::new(&snap, 0);
    let attr = Attributor::new(&snap.frames, &AttributionOptions::default());
    let view = build_view(
        &snap,
        &r,
        &attr,
        ViewOptions {
            x: XAxis::Time,
            buckets: 50,
            ..Default::default()
        },
    )
    .unwrap();
    // The axis never goes back: columns in order, the last at the latest time.
    assert!(view.buckets.windows(2).all(|w| w[0].x1 <= w[1].x0 + 1e-9));
    assert_eq!(view.x_max, 6000.0);
    // Every allocation is still there at the end: 6 MiB.
    assert_eq!(view.buckets.last().unwrap().requested_bytes, 6 << 20);
    // A trace without times cannot be drawn on a time axis: said, not a panic.
    let mut untimed = DeviceTrace::default();
    untimed.push(event(Action::Alloc, 0x1000, 512, None));
    untimed.push(event(Action::Alloc, 0x2000, 512, None));
    let snap = snapshot(untimed, Vec::new());
    let r = DeviceReplay::new(&snap, 0);
    let err = build_view(
        &snap,
        &r,
        &attr,
        ViewOptions {
            x: XAxis::Time,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(err, ViewError::NoTimes);
}

#[test]
fn many_segment_events_rebuild_in_one_pass() {
    // 200k segment events: 100k segments allocated, the last 50k freed again.
    let mut trace = DeviceTrace::default();
    let n = 100_000u64;
    for i in 0..n {
        trace.push(event(
            Action::SegmentAlloc,
            0x1_0000_0000 + i * (2 << 20),
            2 << 20,
            None,
        ));
    }
    for i in n / 2..n {
        trace.push(event(
            Action::SegmentFree,
            0x1_0000_0000 + i * (2 << 20),
            2 << 20,
            None,
        ));
    }
    let mut snap = snapshot(trace, Vec::new());
    // The final state holds the first 50k segments.
    snap.segments = (0..n / 2)
        .map(|i| vramlens::model::Segment {
            device: 0,
            address: 0x1_0000_0000 + i * (2 << 20),
            total_size: 2 << 20,
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream: 0,
            segment_type: vramlens::model::SegmentType::Small,
            pool_id: None,
            is_expandable: false,
            stack: None,
            blocks: Vec::new(),
        })
        .collect();
    // After every allocation and before any free: all 100k segments.
    let state = allocator_state(&snap, 0, Some(n as usize - 1));
    assert_eq!(state.len(), n as usize);
    let reserved: u64 = state.iter().map(|s| s.size).sum();
    assert_eq!(reserved, n * (2 << 20));
    // Before the first event: nothing.
    assert!(allocator_state(&snap, 0, None).is_empty());
}

#[test]
fn many_oom_events_are_counted_past_the_first_ones() {
    let mut trace = DeviceTrace::default();
    for i in 0..50_000u64 {
        trace.push(event(Action::Oom, 1 << 20, 2 << 30, Some(T0 + i as i64)));
    }
    let snap = snapshot(trace, Vec::new());
    let report = analyze_oom(
        &snap,
        "generated",
        None,
        Vec::new(),
        OomOptions::default(),
        &AttributionOptions::default(),
        None,
    );
    assert_eq!(report.analyses.len(), vramlens::analysis::oom::MAX_ANALYSES);
    assert_eq!(
        report.more_oom_events.get(&0),
        Some(&(50_000 - vramlens::analysis::oom::MAX_ANALYSES))
    );
    // Each analysis: 2 GiB asked with 1 MiB free and nothing reserved: short by 2 GiB −
    // 1 MiB, capacity.
    let a = &report.analyses[0];
    assert_eq!(a.shortfall_bytes, Some((2 << 30) - (1 << 20)));
    assert_eq!(
        a.verdicts[0].cause,
        vramlens::analysis::oom::Cause::Capacity
    );
}

#[test]
fn many_annotations_keep_the_widest_spans() {
    let mut trace = DeviceTrace::default();
    for i in 0..1000u64 {
        trace.push(event(
            Action::Alloc,
            0x1000 * (i + 1),
            512,
            Some(T0 + i as i64 * 100),
        ));
    }
    trace.keys.time_us = true;
    // 100k START/END pairs of one name, nested and repeated, plus STARTs never closed.
    let mut annotations = Vec::new();
    for k in 0..100_000i64 {
        let t = T0 + (k % 1000) * 100;
        annotations.push(Annotation {
            name: "ProfilerStep#1".into(),
            stage: "START".into(),
            device: 0,
            time_us: t,
        });
        annotations.push(Annotation {
            name: "ProfilerStep#1".into(),
            stage: "END".into(),
            device: 0,
            time_us: t + 50,
        });
        annotations.push(Annotation {
            name: format!("open#{k}"),
            stage: "START".into(),
            device: 0,
            time_us: t,
        });
    }
    let snap = snapshot(trace, annotations);
    let r = DeviceReplay::new(&snap, 0);
    let attr = Attributor::new(&snap.frames, &AttributionOptions::default());
    let view = build_view(&snap, &r, &attr, ViewOptions::default()).unwrap();
    assert_eq!(view.annotations.len(), 300);
    assert_eq!(view.annotations_dropped, 100_000 - 300);
    assert_eq!(view.buckets.last().unwrap().requested_bytes, 1000 * 512);
}
