//! Loops and growth that a few KB of input drive: a chart window narrower than its axis
//! tells apart, a window far into a trace that spans 2^53 us, unmatched annotations,
//! thousands of devices, many `--rules`. Each test writes its own input (with
//! serde-pickle, a pickle writer that is not vramlens's). None is timed: each asserts
//! what bounds the work (a count, a size, what is left on disk).

use serde_pickle::{SerOptions, Value as SV};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::pickled::{dict, i, s, segment};

const BASE: i64 = 0x7f00_0000_0000;
const MIB: i64 = 1 << 20;

fn frames(file: &str) -> SV {
    SV::List(vec![dict(vec![
        ("filename", s(file)),
        ("line", i(10)),
        ("name", s("forward")),
    ])])
}

fn entry(action: &str, addr: i64, size: i64, t: i64) -> SV {
    dict(vec![
        ("action", s(action)),
        ("addr", i(addr)),
        ("size", i(size)),
        ("stream", i(0)),
        ("time_us", i(t)),
        ("frames", frames("/home/u/train.py")),
    ])
}

fn oom_entry(t: i64) -> SV {
    dict(vec![
        ("action", s("oom")),
        ("device_free", i(MIB)),
        ("size", i(64 * MIB)),
        ("stream", i(0)),
        ("time_us", i(t)),
        ("frames", frames("/home/u/train.py")),
    ])
}

/// A 2 MiB segment of `device` with a free block: what is left after the trace below.
fn free_segment(device: i64) -> SV {
    dict(vec![
        ("device", i(device)),
        ("address", i(BASE)),
        ("total_size", i(2 * MIB)),
        ("allocated_size", i(0)),
        ("active_size", i(0)),
        ("requested_size", i(0)),
        ("stream", i(0)),
        ("segment_type", s("large")),
        ("segment_pool_id", SV::Tuple(vec![i(0), i(0)])),
        ("is_expandable", SV::Bool(false)),
        (
            "blocks",
            SV::List(vec![dict(vec![
                ("address", i(BASE)),
                ("size", i(2 * MIB)),
                ("requested_size", i(0)),
                ("state", s("inactive")),
                ("frames", SV::List(vec![])),
            ])]),
        ),
        ("frames", SV::List(vec![])),
    ])
}

/// A segment made at `t0`, 1 MiB allocated in it then freed at `t1`.
fn trace(t0: i64, t1: i64) -> Vec<SV> {
    vec![
        entry("segment_alloc", BASE, 2 * MIB, t0),
        entry("alloc", BASE, MIB, t0),
        entry("free_requested", BASE, MIB, t1),
        entry("free_completed", BASE, MIB, t1),
    ]
}

fn snapshot(segments: Vec<SV>, traces: Vec<Vec<SV>>, annotations: Vec<SV>) -> Vec<u8> {
    let snap = dict(vec![
        ("segments", SV::List(segments)),
        (
            "device_traces",
            SV::List(traces.into_iter().map(SV::List).collect()),
        ),
        (
            "allocator_settings",
            dict(vec![
                ("PYTORCH_CUDA_ALLOC_CONF", s("")),
                ("max_split_size", i(-1)),
                ("garbage_collection_threshold", SV::F64(0.0)),
                ("expandable_segments", SV::Bool(false)),
            ]),
        ),
        ("external_annotations", SV::List(annotations)),
    ]);
    serde_pickle::value_to_vec(&snap, SerOptions::new()).unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlens"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The names in a folder, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// 2^53 microseconds: past it a float no longer holds every microsecond.
const EXACT_US: i64 = 1 << 53;

#[test]
fn a_microsecond_window_at_the_end_of_a_2_53_us_trace_draws_a_bounded_axis() {
    // The trace runs from 1 us to 2^53 - 1 us (285 years): its x axis ends at 2^53 - 2 us
    // since the first event, where floats are 1 us apart. The window is the last
    // microsecond; a tenth of it (the axis' step) added to a float there changes nothing.
    let dir = tempfile::tempdir().unwrap();
    let snap = write(
        dir.path(),
        "long.pickle",
        &snapshot(vec![free_segment(0)], vec![trace(1, EXACT_US - 1)], vec![]),
    );
    let chart = dir.path().join("t.svg");
    let (code, _, err) = run(&[
        "timeline",
        snap.to_str().unwrap(),
        "--x",
        "time",
        "--window",
        "9007199254740.989..9007199254740.990",
        "-o",
        chart.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let svg = std::fs::read_to_string(&chart).unwrap();
    // The x axis: its ticks, each a line and a label, at most 64 of them.
    let axis = svg.split(r#"<g class="x-axis""#).nth(1).unwrap();
    let axis = &axis[..axis.find("</g>").unwrap()];
    let ticks = axis.matches("<line").count();
    assert!((1..=64).contains(&ticks), "{ticks} ticks");
    assert_eq!(axis.matches("<text").count(), ticks);
    assert!(svg.len() < 1 << 20, "{} bytes", svg.len());
    // Nothing else was written beside it.
    assert_eq!(names_in(dir.path()), ["long.pickle", "t.svg"]);
}

#[test]
fn a_window_narrower_than_a_microsecond_is_refused_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let snap = write(
        dir.path(),
        "s.pickle",
        &snapshot(vec![free_segment(0)], vec![trace(1_000, 2_000_000)], vec![]),
    );
    let chart = dir.path().join("t.svg");
    let (code, _, err) = run(&[
        "timeline",
        snap.to_str().unwrap(),
        "--x",
        "time",
        "--window",
        "100..100.0004",
        "-o",
        chart.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        "vramlens: error: --window \"100..100.0004\": narrower than 0.001 milliseconds, the finest step the axis has there; give a wider window"
    );
    assert_eq!(names_in(dir.path()), ["s.pickle"]);
    // One microsecond is drawn.
    let (code, _, err) = run(&[
        "timeline",
        snap.to_str().unwrap(),
        "--x",
        "time",
        "--window",
        "100..100.001",
        "-o",
        chart.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(names_in(dir.path()), ["s.pickle", "t.svg"]);
}

#[test]
fn unmatched_optimizer_annotations_are_paired_in_one_pass() {
    // 20,000 `Optimizer.step#` STARTs that no END closes, then 20,000 ENDs that close
    // none: searching the open ones for each END compares 4·10^8 names.
    let n = 20_000i64;
    let t0 = 1_000_000_000_000i64;
    let annotation = |stage: &str, name: String, t: i64| {
        dict(vec![
            ("stage", s(stage)),
            ("name", SV::String(name)),
            ("device", i(0)),
            ("time_us", i(t)),
        ])
    };
    let mut annotations: Vec<SV> = (0..n)
        .map(|k| annotation("START", format!("Optimizer.step#A{k}.step"), t0 + k))
        .collect();
    annotations
        .extend((0..n).map(|k| annotation("END", format!("Optimizer.step#B{k}.step"), t0 + n + k)));
    let dir = tempfile::tempdir().unwrap();
    let snap = write(
        dir.path(),
        "a.pickle",
        &snapshot(
            vec![free_segment(0)],
            vec![trace(t0, t0 + 3 * n)],
            annotations,
        ),
    );
    let path = snap.to_str().unwrap();
    for args in [
        vec!["top", path, "--json"],
        vec!["oom", path, "--json"],
        vec!["budget", path, "--json"],
    ] {
        let (code, out, err) = run(&args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap();
    }
}

#[test]
fn thousands_of_devices_cost_each_run_its_own_device() {
    // 600 devices, each with a segment and a trace; devices 5, 300 and 599 ran out of
    // memory. Each budget run says how many devices the file has (not their list, which
    // made the output grow as the square of the devices), and oom analyses the three.
    let d = 600i64;
    let t0 = 1_000_000_000_000i64;
    let traces: Vec<Vec<SV>> = (0..d)
        .map(|k| {
            let mut t = trace(t0, t0 + 100);
            if [5, 300, 599].contains(&k) {
                t.push(oom_entry(t0 + 200));
            }
            t
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let snap = write(
        dir.path(),
        "d.pickle",
        &snapshot((0..d).map(free_segment).collect(), traces, vec![]),
    );
    let path = snap.to_str().unwrap();
    let (code, out, err) = run(&["budget", path, "--json", "--gpu", "A100 40GB"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), d as usize);
    for (k, r) in runs.iter().enumerate() {
        assert_eq!(r["device"], k as i64);
        assert_eq!(r["device_count"], d);
        assert!(r.get("devices").is_none());
    }
    // Linear: a run's JSON does not grow with the number of devices.
    assert!(out.len() < d as usize * 8192, "{} bytes", out.len());
    let (code, out, err) = run(&["oom", path, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let devices: Vec<i64> = v["analyses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["device"].as_i64().unwrap())
        .collect();
    assert_eq!(devices, [5, 300, 599]);
    assert_eq!(v["devices"].as_array().unwrap().len(), d as usize);
}

#[test]
fn many_rules_that_match_nothing_leave_the_first_match_deciding() {
    // 5,000 rules that match no frame, then one that matches the trace's frame.
    let dir = tempfile::tempdir().unwrap();
    let t0 = 1_000_000_000_000i64;
    let snap = write(
        dir.path(),
        "r.pickle",
        &snapshot(vec![free_segment(0)], vec![trace(t0, t0 + 100)], vec![]),
    );
    let mut rules = String::new();
    for k in 0..5_000 {
        rules.push_str(&format!("c{} = nomatch_{k}_zz\n", k % 40));
    }
    rules.push_str("mine = train\\.py:10:forward\n");
    rules.push_str("later = train\\.py\n");
    let rules_path = write(dir.path(), "rules.txt", rules.as_bytes());
    let (code, out, err) = run(&[
        "top",
        snap.to_str().unwrap(),
        "--by",
        "category",
        "--at",
        "peak",
        "--rules",
        rules_path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = v.to_string();
    // The 5,001st line decides, not the 5,002nd.
    assert!(text.contains("\"mine\""), "{text}");
    assert!(text.contains("rule:5001"), "{text}");
    assert!(!text.contains("\"later\""), "{text}");
}

/// A `segment_unmap` (or a `segment_free`) whose range a segment still held later covers:
/// the recording contradicts itself. Undoing it must not put a second segment over the
/// same bytes at the start, where the allocator model would hand them out twice (a
/// block list that closed on itself, and `simulate` and `report` allocating until the
/// process aborted, on a file of 1 KB). The later state wins: the start holds the one
/// 20 MiB segment the end shows.
#[test]
fn a_release_of_a_range_a_later_segment_holds_is_not_undone_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(
        BASE,
        &[
            (BASE, MIB, "active_allocated"),
            (BASE + MIB, MIB, "active_allocated"),
            (BASE + 2 * MIB, 18 * MIB, "inactive"),
        ],
    );
    for release in ["segment_unmap", "segment_free"] {
        let trace = vec![
            entry(release, BASE + 2 * MIB, 18 * MIB, 1),
            entry("alloc", BASE + 2 * MIB, 8 * MIB, 2),
            entry("alloc", BASE + 10 * MIB, 8 * MIB, 3),
            entry("free_completed", BASE + 10 * MIB, 8 * MIB, 4),
            entry("alloc", BASE + 18 * MIB, 12 * MIB, 5),
        ];
        let bytes = snapshot(vec![seg.clone()], vec![trace], vec![]);
        assert!(bytes.len() < 2048, "{}", bytes.len());
        let path = write(dir.path(), &format!("{release}.pickle"), &bytes);
        let (snap, _) =
            vramlens::input::read_snapshot(&path, vramlens::input::ReadOptions::default()).unwrap();
        let start = vramlens::timeline::state::allocator_state(&snap, 0, None);
        let ranges: Vec<(u64, u64)> = start.iter().map(|s| (s.addr, s.size)).collect();
        assert_eq!(ranges, vec![(BASE as u64, 20 * MIB as u64)], "{release}");
        let (code, out, err) = run(&["simulate", path.to_str().unwrap()]);
        assert_eq!(code, Some(0), "{release}: {err}");
        assert!(out.contains("recorded"), "{out}");
        let html = dir.path().join(format!("{release}.html"));
        let (code, _, err) = run(&[
            "report",
            "-o",
            html.to_str().unwrap(),
            path.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(0), "{release}: {err}");
    }
}
