//! Moments and timelines as users name them: which traces have a timeline at all, the
//! final state of a file without one, times and windows inside and outside the trace.

mod common;

use assert_cmd::Command;
use common::require_shared_data;
use std::path::{Path, PathBuf};
use vramlens::model::trace::NewEvent;
use vramlens::model::{
    Action, Block, BlockState, DeviceTrace, Features, Segment, SegmentType, Snapshot,
};

fn vramlens() -> Command {
    Command::cargo_bin("vramlens").unwrap()
}

const BASE: u64 = 0x7f00_0000_0000;
const MIB: u64 = 1 << 20;

/// One 8 MiB segment holding a live 2 MiB block, and a trace of `events`
/// (action, address, size), 10 µs apart.
fn snapshot(events: &[(Action, u64, u64)]) -> Snapshot {
    let mut trace = DeviceTrace::default();
    trace.keys.time_us = true;
    let trace_keys = trace.keys;
    for (i, &(action, addr, size)) in events.iter().enumerate() {
        trace.push(NewEvent {
            action: Some(action),
            addr,
            size,
            time_us: Some(1_750_000_000_000_000 + 10 * i as i64),
            ..Default::default()
        });
    }
    Snapshot {
        segments: vec![Segment {
            device: 0,
            address: BASE,
            total_size: 8 * MIB,
            allocated_size: 2 * MIB,
            active_size: 2 * MIB,
            requested_size: Some(2 * MIB),
            stream: 0,
            segment_type: SegmentType::Large,
            pool_id: Some((0, 0)),
            is_expandable: false,
            stack: None,
            blocks: vec![
                Block {
                    address: BASE,
                    size: 2 * MIB,
                    requested_size: 2 * MIB,
                    state: BlockState::ActiveAllocated,
                    stack: None,
                },
                Block {
                    address: BASE + 2 * MIB,
                    size: 6 * MIB,
                    requested_size: 0,
                    state: BlockState::Inactive,
                    stack: None,
                },
            ],
        }],
        device_traces: vec![trace],
        features: Features {
            device_traces: true,
            block_frames: true,
            segment_pool_id: true,
            segment_requested_size: true,
            entries: trace_keys,
            ..Features::default()
        },
        ..Snapshot::default()
    }
}

/// Writes `snap` as a pickle into `dir`.
fn write(dir: &Path, name: &str, snap: &Snapshot) -> PathBuf {
    let path = dir.join(name);
    let file = std::fs::File::create(&path).unwrap();
    vramlens::model::encode::write_snapshot(snap, std::io::BufWriter::new(file)).unwrap();
    path
}

fn stdout_of(args: &[&str], file: &Path) -> String {
    let out = vramlens().args(args).arg(file).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn summary_json(file: &Path) -> serde_json::Value {
    serde_json::from_str(&stdout_of(&["summary", "--json"], file)).unwrap()
}

/// A trace of one event (recording switched on just before the dump) reads as a file
/// without a trace: no peaks, no timeline, no moment but the final state, and the advice
/// to record one; its event is still counted.
#[test]
fn a_trace_of_one_event_reads_as_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    // A 1 MiB block freed just before the dump: its alloc is not in the trace.
    let one = write(
        dir.path(),
        "one.pickle",
        &snapshot(&[(Action::FreeCompleted, BASE + 2 * MIB, MIB)]),
    );
    let v = summary_json(&one);
    let d = &v["devices"][0];
    assert_eq!(d["trace"]["events"], 1);
    assert_eq!(d["trace"]["actions"]["free_completed"], 1);
    assert_eq!(d["trace"]["has_timeline"], false);
    for peak in [
        "peak_requested_bytes",
        "peak_allocated_bytes",
        "peak_reserved_bytes",
    ] {
        assert!(d[peak].is_null(), "{peak}: {}", d[peak]);
    }
    let text = stdout_of(&["summary"], &one);
    assert!(
        text.contains(
            "trace                1 event (free_completed), too few to show memory over time: only the final state is known (no timeline, no peaks)"
        ),
        "{text}"
    );
    assert!(text.contains("_record_memory_history(max_entries=100000)"));
    assert!(!text.contains("peak requested"), "{text}");
    assert!(!text.contains("\n  history "), "{text}");

    let head = "device 0 has no timeline (its trace holds just 1 event: free_completed)";
    let out = dir.path().join("t.svg");
    for args in [
        vec!["timeline"],
        vec!["timeline", "--json"],
        vec!["top", "--at", "event:0"],
        vec!["segments", "--at", "oom"],
    ] {
        vramlens()
            .args(&args)
            .arg(&one)
            .assert()
            .code(2)
            .stderr(predicates::str::contains(head))
            .stderr(predicates::str::contains("max_entries="));
    }
    vramlens()
        .args(["timeline", "-o"])
        .arg(&out)
        .arg(&one)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(format!(
            "{head}: nothing to draw, only the final state is known"
        )));
    assert!(!out.exists());
    // The final state is there: the 2 MiB block.
    let top: serde_json::Value =
        serde_json::from_str(&stdout_of(&["top", "--json", "--at", "end"], &one)).unwrap();
    assert_eq!(top["total_bytes"], 2 * MIB);
    assert_eq!(top["reserved_bytes"], 8 * MIB);

    // A lone snapshot entry is the same; two changes of memory make a timeline.
    let snap = write(
        dir.path(),
        "snap.pickle",
        &snapshot(&[(Action::Snapshot, 0, 0)]),
    );
    assert_eq!(
        summary_json(&snap)["devices"][0]["trace"]["has_timeline"],
        false
    );
    assert!(
        !stdout_of(&["summary"], &snap).contains("\n  history "),
        "no history is claimed for a trace without allocations"
    );
    let two = write(
        dir.path(),
        "two.pickle",
        &snapshot(&[
            (Action::Alloc, BASE + 2 * MIB, MIB),
            (Action::FreeCompleted, BASE + 2 * MIB, MIB),
        ]),
    );
    let v = summary_json(&two);
    assert_eq!(v["devices"][0]["trace"]["has_timeline"], true);
    // 2 MiB before, 3 MiB after the alloc, 2 MiB at the end.
    assert_eq!(v["devices"][0]["peak_requested_bytes"], 3 * MIB);
    assert_eq!(v["devices"][0]["peak_requested_event"], 0);
    vramlens().arg("timeline").arg(&two).assert().success();
}

/// The eight device traces of one event among the real files read as no trace.
#[test]
#[ignore = "needs ../shared/data"]
fn real_traces_of_one_event_read_as_no_trace() {
    let data = require_shared_data();
    for (file, device, action) in [
        ("flexgen-pt20/1.3b_snapshot.pickle", 0, "free_completed"),
        (
            "flexgen-pt20/1.3b_snapshot__4bf3cd41.pickle",
            0,
            "free_completed",
        ),
        ("flexgen-pt20/oom_snapshot.pickle", 0, "snapshot"),
        ("sketchkv-pt23/my_snapshot.pickle", 0, "free_completed"),
        ("blockzero/cuda_snapshot.pickle", 0, "segment_free"),
        (
            "diffusion-course-pt22/my_snapshot.pickle",
            0,
            "free_completed",
        ),
        (
            "layoutediting-diffusers/dump_snapshot.pickle",
            0,
            "snapshot",
        ),
        (
            "layoutediting-diffusers/dump_snapshot.pickle",
            1,
            "free_completed",
        ),
    ] {
        let path = data.join(file);
        let v = summary_json(&path);
        let d = v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["device"] == device)
            .unwrap_or_else(|| panic!("{file}: no device {device}"));
        assert_eq!(d["trace"]["events"], 1, "{file}");
        assert_eq!(d["trace"]["actions"][action], 1, "{file}");
        assert_eq!(d["trace"]["has_timeline"], false, "{file}");
        assert!(d["peak_requested_bytes"].is_null(), "{file}");
        let device = device.to_string();
        let head =
            format!("device {device} has no timeline (its trace holds just 1 event: {action})");
        vramlens()
            .args(["timeline", "--device", &device])
            .arg(&path)
            .assert()
            .code(2)
            .stderr(predicates::str::contains(&head));
        vramlens()
            .args(["top", "--at", "oom", "--device", &device])
            .arg(&path)
            .assert()
            .code(2)
            .stderr(predicates::str::contains(&head));
    }
    // The words a user read before: a peak "before the first event" and a complete
    // history of no allocation at all.
    let sketch = stdout_of(&["summary"], &data.join("sketchkv-pt23/my_snapshot.pickle"));
    assert!(!sketch.contains("before the first event"), "{sketch}");
    assert!(sketch.contains("1 event (free_completed), too few to show memory over time"));
    let flexgen = stdout_of(&["summary"], &data.join("flexgen-pt20/oom_snapshot.pickle"));
    assert!(!flexgen.contains("history complete"), "{flexgen}");
    assert!(flexgen.contains("1 event (snapshot), too few to show memory over time"));
}

/// The heading line of a command's text output.
fn heading(args: &[&str], file: &Path) -> String {
    stdout_of(args, file).lines().next().unwrap().to_string()
}

/// A file without a trace is at its final state, said as such, everywhere a moment is
/// named; asking for another moment points to `--at end` and says how to record a trace.
#[test]
fn the_final_state_of_a_file_without_a_trace_is_named_so() {
    let file = Path::new("testdata/v1_13_list.pickle");
    for args in [
        &["segments"][..],
        &["segments", "--at", "end"],
        &["top", "--at", "end"],
        &["timeline", "--at", "end"],
    ] {
        let h = heading(args, file);
        assert_eq!(
            h, "testdata/v1_13_list.pickle: device 0, final state (no trace recorded)",
            "{args:?}"
        );
    }
    let top: serde_json::Value =
        serde_json::from_str(&stdout_of(&["top", "--json", "--at", "end"], file)).unwrap();
    assert_eq!(top["moment"]["kind"], "end");
    assert!(top["moment"]["event"].is_null());
    assert_eq!(top["moment"]["has_timeline"], false);
    let text = stdout_of(&["top", "--at", "end"], file);
    assert!(
        text.contains("(only the final state is known, as no trace was recorded: record one with torch.cuda.memory._record_memory_history(max_entries=100000)"),
        "{text}"
    );
    vramlens()
        .args(["top", "--at", "oom"])
        .arg(file)
        .assert()
        .code(2)
        .stderr(predicates::str::diff(
            "vramlens: error: testdata/v1_13_list.pickle: device 0 has no trace, so no moment but its final state, which --at end shows; record one with torch.cuda.memory._record_memory_history(max_entries=100000) before the work, then torch.cuda.memory._dump_snapshot(path)\n",
        ));
    // The default, the peak, is the final state, saying so.
    let top: serde_json::Value =
        serde_json::from_str(&stdout_of(&["top", "--json"], file)).unwrap();
    assert_eq!(top["moment"]["kind"], "end");
    assert_eq!(top["moment"]["has_timeline"], false);
    // A trace of one event: the final state, with its one event said.
    let dir = tempfile::tempdir().unwrap();
    let one = write(
        dir.path(),
        "one.pickle",
        &snapshot(&[(Action::FreeCompleted, BASE + 2 * MIB, MIB)]),
    );
    let h = heading(&["segments"], &one);
    assert!(
        h.ends_with("device 0, final state (no timeline: the trace holds just 1 event)"),
        "{h}"
    );
    // With a timeline the end is still "at the end".
    let h = heading(&["segments"], Path::new("testdata/sample.pickle"));
    assert!(
        h.ends_with("at the end (after event 329, 2025-06-15 15:06:40.031 UTC)"),
        "{h}"
    );
}

/// The same on a real file without a trace (two devices, no trace entry).
#[test]
#[ignore = "needs ../shared/data"]
fn a_real_file_without_a_trace_has_only_its_final_state() {
    let data = require_shared_data();
    let file = data.join("attention-2dev-notrace/memory.pickle");
    let summary = stdout_of(&["summary"], &file);
    assert!(
        summary.contains(
            "trace                none recorded: only the final state is known (no timeline, no peaks)"
        ),
        "{summary}"
    );
    assert!(summary.contains("_record_memory_history(max_entries=100000)"));
    assert!(!summary.contains("peak requested"));
    let v = summary_json(&file);
    for d in v["devices"].as_array().unwrap() {
        assert_eq!(d["trace"]["events"], 0);
        assert_eq!(d["trace"]["has_timeline"], false);
        assert!(d["peak_requested_bytes"].is_null());
    }
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("t.svg");
    for (args, message) in [
        (
            vec!["timeline"],
            "device 0 has no trace: only its final state is known",
        ),
        (
            vec!["timeline", "-o", svg.to_str().unwrap()],
            "device 0 has no trace: nothing to draw, only the final state is known",
        ),
        (
            vec!["top", "--at", "oom"],
            "device 0 has no trace, so no moment but its final state, which --at end shows",
        ),
        (
            vec!["flamegraph", "--folded", "--at", "event:0"],
            "device 0 has no trace, so no moment but its final state, which --at end shows",
        ),
    ] {
        vramlens()
            .args(&args)
            .arg(&file)
            .assert()
            .code(2)
            .stderr(predicates::str::contains(message))
            .stderr(predicates::str::contains(
                "_record_memory_history(max_entries=100000)",
            ));
    }
    assert!(!svg.exists());
    for args in [
        &["segments"][..],
        &["top", "--at", "end"],
        &["top"],
        &["timeline", "--at", "end"],
    ] {
        let h = heading(args, &file);
        assert!(
            h.ends_with(", final state (no trace recorded)"),
            "{args:?}: {h}"
        );
        assert!(!h.contains("before the first event"));
    }
    // What top lists at the end adds up to the summary's requested bytes of that device.
    let top: serde_json::Value =
        serde_json::from_str(&stdout_of(&["top", "--json", "--at", "end"], &file)).unwrap();
    let device = top["device"].clone();
    let d = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == device)
        .unwrap();
    assert_eq!(top["total_bytes"], d["requested_bytes"]);
}

fn moment_json(args: &[&str]) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&stdout_of(
        &[&["top", "--json"][..], args].concat(),
        Path::new("testdata/sample.pickle"),
    ))
    .unwrap();
    v["moment"].clone()
}

/// Times outside the trace are errors naming its range and echoing what was typed and
/// what it was read as; inside, a printed time finds the event it was printed for.
#[test]
fn times_outside_the_trace_are_refused_and_printed_times_find_their_event() {
    // The sample's events run from 15:06:40.000108 to 15:06:40.031140 (31032 us).
    let range = "its trace runs from 2025-06-15 15:06:40.000 UTC to 2025-06-15 15:06:40.031 UTC (+0us to +31032us)";
    for (at, message) in [
        (
            "time:+1.5s",
            format!(
                "testdata/sample.pickle: time:+1.5s (read as 2025-06-15 15:06:41.500108 UTC, 1.50 s after the first event) is after the last event of device 0: {range}; --at end is the state after its last event"
            ),
        ),
        (
            "time:2030-01-01 00:00:00 UTC",
            format!(
                "testdata/sample.pickle: time:2030-01-01 00:00:00 UTC (read as 2030-01-01 00:00:00 UTC, the whole second) is after the last event of device 0: {range}; --at end is the state after its last event"
            ),
        ),
        (
            "time:+31033us",
            format!(
                "time:+31033us (read as 2025-06-15 15:06:40.031141 UTC, 31.0 ms after the first event) is after the last event of device 0: {range}"
            ),
        ),
        (
            "time:2020-01-01 00:00:00",
            format!(
                "testdata/sample.pickle: time:2020-01-01 00:00:00 (read as 2020-01-01 00:00:00 UTC, the whole second) is before the first event of device 0: {range}\n"
            ),
        ),
        (
            "time:1750000000000107",
            format!(
                "time:1750000000000107 (read as 2025-06-15 15:06:40.000107 UTC) is before the first event of device 0: {range}\n"
            ),
        ),
    ] {
        for command in ["timeline", "top", "segments"] {
            vramlens()
                .args([command, "testdata/sample.pickle", "--at", at])
                .assert()
                .code(2)
                .stderr(predicates::str::contains(message.as_str()));
        }
    }
    // The first and the last event are inside.
    assert_eq!(moment_json(&["--at", "time:+31032us"])["event"], 329);
    assert_eq!(moment_json(&["--at", "time:1750000000000108"])["event"], 0);
    // The printed peak time: 12 events (65 to 76) are stamped within 15:06:40.006; the
    // most memory is requested after event 71, the peak.
    let m = moment_json(&["--at", "time:2025-06-15 15:06:40.006 UTC"]);
    assert_eq!(m["event"], 71);
    assert_eq!(m["kind"], "time");
    assert_eq!(
        m["same_time"],
        serde_json::json!({"events": 12, "first_event": 65, "last_event": 76})
    );
    assert_eq!(moment_json(&["--at", "peak"])["event"], 71);
    // The same written as ISO and as the peak's own microsecond.
    assert_eq!(
        moment_json(&["--at", "time:2025-06-15T15:06:40.006Z"])["event"],
        71
    );
    let m = moment_json(&["--at", "time:1750000000006586"]);
    assert_eq!(m["event"], 71);
    assert!(m["same_time"].is_null());
    // Between two events (71 at .006586, 72 at .006635): the last one before.
    let m = moment_json(&["--at", "time:1750000000006600"]);
    assert_eq!(m["event"], 71);
    assert!(m["same_time"].is_null());
    // Text says which events share the time and how to take another.
    for command in ["top", "timeline", "segments"] {
        let out = stdout_of(
            &[command, "--at", "time:2025-06-15 15:06:40.006 UTC"],
            Path::new("testdata/sample.pickle"),
        );
        let mut lines = out.lines();
        assert_eq!(
            lines.next().unwrap(),
            "testdata/sample.pickle: device 0, after event 71, 2025-06-15 15:06:40.006 UTC"
        );
        assert_eq!(
            lines.next().unwrap(),
            "  (12 events, 65 to 76, fall within the time given; this is event 71, the one after which the most memory is requested; --at event:N takes another)",
            "{command}"
        );
    }
}

/// A chart window reaching past either end of the trace is refused, naming the trace's
/// range in the units it was given in; a window inside it is drawn.
#[test]
fn windows_beyond_the_trace_are_refused_in_the_units_given() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w.svg");
    let events = "the trace spans 0..330 on this axis (events); give a window inside it";
    let time = "the trace spans 0..31.032 on this axis (milliseconds since the first event); give a window inside it";
    for (args, message) in [
        (
            vec!["--window", "0..999999999"],
            format!("--window 0..999999999: {events}"),
        ),
        (
            vec!["--window", "300..331"],
            format!("--window 300..331: {events}"),
        ),
        (vec!["--window=-1..5"], format!("--window -1..5: {events}")),
        (
            vec!["--x", "time", "--window", "40..999"],
            format!("--window 40..999: {time}"),
        ),
        (
            vec!["--x", "time", "--window", "0..31.1"],
            format!("--window 0..31.1: {time}"),
        ),
    ] {
        vramlens()
            .args(["timeline", "testdata/sample.pickle", "-o"])
            .arg(&out)
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicates::str::diff(format!(
                "vramlens: error: testdata/sample.pickle: {message}\n"
            )));
        assert!(!out.exists(), "{args:?}");
    }
    for args in [
        vec!["--window", "0..330"],
        vec!["--window", "300..330"],
        vec!["--x", "time", "--window", "0..31.032"],
    ] {
        vramlens()
            .args(["timeline", "testdata/sample.pickle", "--force", "-o"])
            .arg(&out)
            .args(&args)
            .assert()
            .success();
        assert!(std::fs::read_to_string(&out).unwrap().ends_with("</svg>\n"));
    }
}

/// Counts of allocations from before the trace read as what they are.
#[test]
#[ignore = "needs ../shared/data"]
fn allocations_from_before_the_trace_are_counted_in_words_that_agree() {
    let data = require_shared_data();
    let text = stdout_of(
        &["timeline"],
        &data.join("cs336-kkaitlyn111/memory_ctx128_fullstep.pickle"),
    );
    assert!(
        text.contains(
            "  allocations      6770 allocated in the trace; allocated before it: 0 freed during it, 325 still alive at the end"
        ),
        "{text}"
    );
}

/// Without `--device`, a file with several GPUs is looked at on one device by one rule
/// for every command: the one with the OOM, else the one whose requested memory peaked
/// highest; the heading says which and names the others with their peaks (device 0
/// peaks at 30.6 MiB, device 2 at 22.3 MiB before its OOM: `expected.py`'s figures).
#[test]
fn the_default_device_is_the_one_the_question_is_about() {
    let file = Path::new("testdata/multi_device.pickle");
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("testdata/multi_device.pickle.expected.json").unwrap(),
    )
    .unwrap();
    let peak = |d: usize| {
        expected["devices"][d]["peak_requested_bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!((peak(0), peak(1)), (32_087_742, 23_354_734));
    let chosen = "testdata/multi_device.pickle: device 2 (the device with the OOM, peak 22.3 MiB; the file also has device 0, peak 30.6 MiB: --device N for another)";
    assert_eq!(heading(&["timeline"], file), chosen);
    assert!(heading(&["segments"], file).starts_with(&format!("{chosen}, at the end")));
    assert!(heading(&["top"], file).starts_with(&format!("{chosen}, at the peak")));
    for args in [
        &["timeline", "--at", "oom"][..],
        &["segments", "--at", "oom"],
        &["top", "--at", "oom"],
    ] {
        assert!(
            heading(args, file).starts_with(&format!("{chosen}, at the OOM")),
            "{args:?}"
        );
    }
    for (args, device) in [
        (&["timeline", "--json"][..], 2),
        (&["segments", "--json"], 2),
        (&["timeline", "--json", "--at", "oom"], 2),
        (&["segments", "--json", "--at", "oom"], 2),
    ] {
        let v: serde_json::Value = serde_json::from_str(&stdout_of(args, file)).unwrap();
        assert_eq!(v["device"], device, "{args:?}");
    }
}

/// The same on a real three-GPU file whose OOM is on device 1.
#[test]
#[ignore = "needs ../shared/data"]
fn a_real_oom_on_device_1_is_looked_at_there() {
    let data = require_shared_data();
    let file = data.join("code-location-expandable-oom/memory_snapshot.pickle");
    let path = file.display().to_string();
    let chosen = format!(
        "{path}: device 1 (the device with the OOM, peak 78.3 GiB; the file also has device 0, peak 7.9 GiB, device 2, peak 20.1 GiB: --device N for another)"
    );
    let with_oom = format!("{chosen}, at the OOM (after event 421, 2025-09-07 13:54:17.949 UTC)");
    assert_eq!(heading(&["timeline"], &file), chosen);
    assert!(heading(&["segments"], &file).starts_with(&format!("{chosen}, at the end")));
    assert!(heading(&["top"], &file).starts_with(&format!("{chosen}, at the peak")));
    for args in [
        &["timeline", "--at", "oom"][..],
        &["segments", "--at", "oom"],
        &["top", "--at", "oom"],
    ] {
        assert_eq!(heading(args, &file), with_oom, "{args:?}");
    }
    // The OOM event is device 1's: the summary lists it there.
    let v = summary_json(&file);
    let ooms: Vec<(i64, usize)> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["device"].as_i64().unwrap(),
                d["ooms"].as_array().unwrap().len(),
            )
        })
        .collect();
    assert_eq!(ooms, [(0, 0), (1, 1), (2, 0)]);
    assert_eq!(v["devices"][1]["ooms"][0]["index"], 421);
}

/// `summary --device N` for a device the file lacks names the devices it has.
#[test]
#[ignore = "needs ../shared/data"]
fn summary_of_a_device_the_file_lacks_names_the_ones_it_has() {
    let data = require_shared_data();
    let file = data.join("ccl-bench-torchtitan-fsdp-oom/rank1_memory_snapshot.pickle");
    vramlens()
        .args(["summary", "--device", "0"])
        .arg(&file)
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicates::str::diff(format!(
            "vramlens: error: {}: device 0 has no segment and no trace entry in this file; it has device 1\n",
            file.display()
        )));
    vramlens()
        .args(["summary", "--device", "1"])
        .arg(&file)
        .assert()
        .success();
}

/// `timeline --at end` lists the final state, as `segments` does by default.
#[test]
fn timeline_at_the_end_is_the_final_state() {
    let file = Path::new("testdata/sample.pickle");
    assert_eq!(
        heading(&["timeline", "--at", "end"], file),
        "testdata/sample.pickle: device 0, at the end (after event 329, 2025-06-15 15:06:40.031 UTC)"
    );
    let v: serde_json::Value =
        serde_json::from_str(&stdout_of(&["timeline", "--json", "--at", "end"], file)).unwrap();
    assert_eq!(v["moment"]["kind"], "end");
    assert_eq!(v["moment"]["event"], 329);
    // testdata/sample.pickle.expected.json (Python's pickle): reserved 144703488 and
    // requested 119768064 at the end, plus the 8192-byte block whose free is still
    // pending (the timeline counts an allocation until its free completes).
    assert_eq!(v["reserved_bytes"], 144_703_488u64);
    assert_eq!(v["requested_bytes"], 119_768_064u64 + 8192);
    let sizes: u64 = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["size_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(sizes, 119_768_064 + 8192);
    let segments: serde_json::Value =
        serde_json::from_str(&stdout_of(&["segments", "--json"], file)).unwrap();
    assert_eq!(segments["moment"], v["moment"]);
}
