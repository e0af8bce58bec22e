//! Profiler traces and memory timelines as the main input: converted into a snapshot, they
//! replay to the trace's own totals; allocations carry the spans that enclose them; and a
//! trace of the same run lines up with its snapshot (`reconcile --trace`).
//!
//! Expected values are computed here from the files with serde_json, independently of
//! vramlens' streaming reader and converter. Files in `testdata/profile` come from
//! `scripts/gen_profile_pair.py` (one script of allocator events written as a snapshot and
//! as a trace); real traces from `../shared/data` (ignored when absent).

mod common;

use assert_cmd::Command;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::model::{Action, Snapshot};
use vramlens::timeline;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn shared(rel: &str) -> PathBuf {
    let path = root().join("../shared/data").join(rel);
    assert!(
        path.exists(),
        "{} is missing: this test needs ../shared/data (run it where the real data is)",
        path.display()
    );
    path
}

fn vramlens() -> Command {
    let mut c = Command::cargo_bin("vramlens").unwrap();
    c.current_dir(root());
    c
}

fn json_file(path: &Path) -> Value {
    let raw = std::fs::read(path).unwrap();
    let text = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .unwrap();
        out
    } else {
        raw
    };
    serde_json::from_slice(&text).unwrap()
}

fn snapshot(path: &Path) -> Snapshot {
    read_snapshot(path, ReadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"))
        .0
}

/// A [memory] event as the test reads it: (ts in ns relative to the file, Bytes, Total
/// Allocated, Total Reserved, file index).
struct Mem {
    ts_ns: i128,
    bytes: i64,
    total_allocated: Option<i64>,
    total_reserved: Option<i64>,
}

/// `ts` (µs, maybe with 3 decimals) as whole ns, from its decimal text.
fn ts_ns(v: &Value) -> i128 {
    let text = v.to_string();
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let frac = format!("{frac:0<3}");
    int.parse::<i128>().unwrap() * 1000 + frac[..3].parse::<i128>().unwrap()
}

/// The [memory] events of one device type (and id), in time order (file order on ties).
fn memory_events(trace: &Value, device_type: i64, device_id: Option<i64>) -> Vec<Mem> {
    let events = trace["traceEvents"].as_array().unwrap();
    let mut out: Vec<(i128, usize, Mem)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e["name"] == "[memory]")
        .filter(|(_, e)| e["args"]["Device Type"] == device_type)
        .filter(|(_, e)| device_id.is_none_or(|d| e["args"]["Device Id"] == d))
        .map(|(i, e)| {
            let a = &e["args"];
            let m = Mem {
                ts_ns: ts_ns(&e["ts"]),
                bytes: a["Bytes"].as_i64().unwrap(),
                total_allocated: a["Total Allocated"].as_i64(),
                total_reserved: a["Total Reserved"].as_i64(),
            };
            (m.ts_ns, i, m)
        })
        .collect();
    out.sort_by_key(|(t, i, _)| (*t, *i));
    out.into_iter().map(|(_, _, m)| m).collect()
}

/// Peak allocated and reserved of a device as the trace itself says: the maximum Total
/// Allocated (or, without it, of the running sum of Bytes from 0), and the maximum Total
/// Reserved when it is ever above 0.
fn trace_peaks(mem: &[Mem]) -> (u64, Option<u64>) {
    let allocated = match mem.iter().filter_map(|m| m.total_allocated).max() {
        Some(max) => max,
        None => {
            let mut run = 0i64;
            let mut max = 0i64;
            for m in mem {
                run += m.bytes;
                assert!(
                    run >= 0,
                    "a trace without totals frees more than it allocated"
                );
                max = max.max(run);
            }
            max
        }
    };
    let reserved = mem
        .iter()
        .filter_map(|m| m.total_reserved)
        .max()
        .filter(|&r| r > 0);
    (allocated as u64, reserved.map(|r| r as u64))
}

// ---------------------------------------------------------------------------------------
// Every real trace: the replayed peak is the trace's own
// ---------------------------------------------------------------------------------------

#[test]
#[ignore = "needs ../shared/data"]
fn every_real_trace_replays_to_its_own_peak() {
    // (file, device slot in the converted snapshot, device type read, device id)
    let cases = [
        (
            "kineto-tb-plugin-samples-2021/worker0.1623143566756.pt.trace.json.gz",
            0,
            1,
            Some(0),
        ),
        (
            "kineto-tb-plugin-samples-2021/worker0.1623212756351.pt.trace.json.gz",
            0,
            1,
            Some(0),
        ),
        ("hta-test-data/df_index_resolver.json.gz", 1, 1, Some(1)),
        (
            "kernelforge-traces-2026/bfeed93fe629_2566.1773933981558265129.pt.trace.json",
            0,
            1,
            Some(0),
        ),
        (
            "particle-transformer-traces-2024/single_epoch_forward_pass_batch_size_2.json",
            0,
            1,
            Some(0),
        ),
        // CPU only: the CPU allocator's series.
        ("kernelforge-traces-2026/chrome_trace.json", 0, 0, None),
        ("unsloth-puzzles-trace/trace.json", 0, 0, None),
    ];
    for (rel, slot, device_type, device_id) in cases {
        let path = shared(rel);
        let mem = memory_events(&json_file(&path), device_type, device_id);
        let (peak_allocated, peak_reserved) = trace_peaks(&mem);
        let snap = snapshot(&path);
        assert_eq!(snap.devices(), vec![slot], "{rel}");
        let peaks = timeline::peaks(&snap, slot);
        assert_eq!(
            peaks.requested.bytes, peak_allocated,
            "{rel}: peak allocated"
        );
        // A trace's sizes are what the allocator handed out: no rounding on top, so the
        // block-bytes peak is the same (the CPU allocator's sizes are not 512-byte
        // multiples).
        assert_eq!(peaks.allocated.bytes, peak_allocated, "{rel}: block bytes");
        if let Some(r) = peak_reserved {
            assert_eq!(peaks.reserved.bytes, r, "{rel}: peak reserved");
        }
        // Only what the file holds: without Total Reserved (and for the CPU allocator,
        // which has no cache) no reserved figure is given, and a trace without
        // addresses says its frees were paired by size.
        let out = vramlens()
            .args(["summary", "--json"])
            .arg(&path)
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let d = &v["devices"][0];
        let gpu = device_type == 1;
        let recorded = !gpu || peak_reserved.is_some();
        assert_eq!(d["reserved_recorded"], recorded, "{rel}");
        if !recorded {
            assert_eq!(d["peak_reserved_bytes"], Value::Null, "{rel}");
        }
        let addressed = json_file(&path)["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "[memory]" && !e["args"]["Addr"].is_null());
        assert_eq!(
            d["trace"]["frees_paired_by_size"],
            gpu && !addressed,
            "{rel}"
        );
        // Memory from before profiling: the first event's Total Allocated minus its Bytes,
        // rebuilt as snapshot replay rebuilds memory from before a trace.
        let tl = common::timeline::build(&snap, slot);
        let before = mem[0]
            .total_allocated
            .map_or(0, |t| (t - mem[0].bytes) as u64);
        assert_eq!(tl.requested_at(None), before, "{rel}: before profiling");
        // After every event the replay holds what the trace says it holds.
        if mem[0].total_allocated.is_some() {
            let trace = snap.trace(slot).unwrap();
            let mut k = 0;
            for i in 0..trace.len() {
                if matches!(trace.action(i), Action::Alloc | Action::FreeCompleted) {
                    assert_eq!(
                        tl.requested_at(Some(i)) as i64,
                        mem[k].total_allocated.unwrap(),
                        "{rel}: event {i}"
                    );
                    k += 1;
                }
            }
            assert_eq!(k, mem.len(), "{rel}");
        }
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn the_hta_trace_starts_with_memory_from_before_profiling() {
    let path = shared("hta-test-data/df_index_resolver.json.gz");
    let out = vramlens()
        .args(["summary", "--json", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"]["format"], "kineto_trace");
    let warnings: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["message"].as_str().unwrap())
        .collect();
    // Python (sorted by ts): the first event's Total Allocated 4 121 780 224 minus its
    // Bytes 25 165 824 is 4 096 614 400 (3.8 GiB).
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("device 1: 3.8 GiB was allocated before profiling started")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("1240 CPU memory events left out")),
        "{warnings:?}"
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn memory_timeline_rows_group_by_pytorch_category() {
    let path = shared("hta-test-data/memory_timeline.raw.gz");
    let rows = json_file(&path);
    let rows = rows.as_array().unwrap();
    // Rows in time order (pre-existing rows, -1, first), file order on ties.
    let min_ts = rows
        .iter()
        .map(|r| r[0].as_i64().unwrap())
        .filter(|&t| t >= 0)
        .min()
        .unwrap();
    let mut order: Vec<(i64, usize)> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r[0].as_i64().unwrap().max(min_ts), i))
        .collect();
    order.sort();
    let names = [
        "parameter",
        "optimizer_state",
        "input",
        "temporary",
        "activation",
        "gradient",
        "autograd_detail",
        "unknown",
    ];
    let mut per = [0i64; 8];
    let mut best = (0i64, 0usize, per);
    for (k, &(_, i)) in order.iter().enumerate() {
        let r = &rows[i];
        per[r[3].as_u64().unwrap() as usize] += r[2].as_i64().unwrap();
        let total: i64 = per.iter().sum();
        if total > best.0 {
            best = (total, k, per);
        }
    }
    let snap = snapshot(&path);
    let tl = common::timeline::build(&snap, 0);
    assert_eq!(tl.peak_requested.bytes, best.0 as u64);
    let at = best.1;
    assert_eq!(tl.peak_requested.event.map(|e| e.index()), Some(at));
    // Live at the peak, grouped by the one frame of each stack: the category totals.
    let mut live = std::collections::BTreeMap::<String, i64>::new();
    for l in tl.lifetimes.iter().filter(|l| l.alive_after(at)) {
        let stack = l.stack().unwrap();
        let frame = snap.frames.frame(snap.frames.stack(stack)[0]);
        *live
            .entry(snap.frames.str(frame.name).to_string())
            .or_default() += l.size as i64;
    }
    for (c, name) in names.iter().enumerate() {
        assert_eq!(
            live.get(*name).copied().unwrap_or(0),
            best.2[c],
            "{name} at the peak"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Our generated pair (testdata/profile)
// ---------------------------------------------------------------------------------------

fn profile(name: &str) -> PathBuf {
    root().join("testdata/profile").join(name)
}

#[test]
fn a_generated_trace_replays_to_its_totals_with_its_spans_as_stacks() {
    let path = profile("run.trace.json");
    let trace = json_file(&path);
    let mem = memory_events(&trace, 1, Some(0));
    let (peak_allocated, peak_reserved) = trace_peaks(&mem);
    let snap = snapshot(&path);
    let peaks = timeline::peaks(&snap, 0);
    assert_eq!(peaks.requested.bytes, peak_allocated);
    assert_eq!(Some(peaks.reserved.bytes), peak_reserved);
    // Each allocation's stack: the X spans around it on its thread, innermost first, as
    // `file:line:function` for Python functions and `??:0:name` for operators.
    let spans: Vec<(i128, i128, String, String)> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let start = ts_ns(&e["ts"]);
            (
                start,
                start + ts_ns(&e["dur"]),
                e["cat"].as_str().unwrap().to_string(),
                e["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let device = snap.trace(0).unwrap();
    let allocs: Vec<usize> = (0..device.len())
        .filter(|&i| device.action(i) == Action::Alloc)
        .collect();
    let alloc_mem: Vec<&Mem> = mem.iter().filter(|m| m.bytes > 0).collect();
    assert_eq!(allocs.len(), alloc_mem.len());
    for (&i, m) in allocs.iter().zip(&alloc_mem) {
        let mut around: Vec<&(i128, i128, String, String)> = spans
            .iter()
            .filter(|s| s.0 <= m.ts_ns && m.ts_ns <= s.1)
            .collect();
        // Innermost (latest start, shortest) first.
        around.sort_by_key(|s| (std::cmp::Reverse(s.0), s.1));
        let expected: Vec<String> = around
            .iter()
            .map(|(_, _, cat, name)| {
                if cat == "python_function" {
                    let (head, func) = name.split_once("): ").unwrap();
                    let (file, line) = head.rsplit_once('(').unwrap();
                    format!("{file}:{line}:{func}")
                } else {
                    format!("??:0:{name}")
                }
            })
            .collect();
        let stack = device.get(i).stack.expect("every allocation has spans");
        let got: Vec<String> = snap
            .frames
            .stack(stack)
            .iter()
            .map(|&f| {
                let f = snap.frames.frame(f);
                format!(
                    "{}:{}:{}",
                    snap.frames.str(f.filename),
                    f.line,
                    snap.frames.str(f.name)
                )
            })
            .collect();
        assert_eq!(got, expected, "allocation at event {i}");
    }
}

fn reconcile_json(trace: &str, extra: &[&str]) -> (i32, Value, String) {
    let out = vramlens()
        .args([
            "reconcile",
            "testdata/profile/run.pickle",
            "--nvml",
            "testdata/profile/run.nvml.jsonl",
            "--trace",
            trace,
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap(), v, stderr)
}

#[test]
fn a_trace_of_the_same_run_lines_up_and_joins_the_ledger() {
    let (code, v, stderr) = reconcile_json("testdata/profile/run.trace.json", &[]);
    assert_eq!(code, 0, "{stderr}");
    let t = &v["trace"];
    assert_eq!(t["used"], "used");
    assert_eq!(t["clock"], "relative_to_base");
    let a = &t["devices"][0]["alignment"];
    // The generator's baseTimeNanoseconds, in µs, and its 730 µs clock difference.
    assert_eq!(a["metadata_offset_us"], 1_749_945_600_000_000i64);
    assert_eq!(a["residual_us"], 730);
    // Every allocation of the snapshot's trace is in the profiler trace and matches.
    let snap = snapshot(&root().join("testdata/profile/run.pickle"));
    let allocs = snap
        .trace(0)
        .unwrap()
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .count();
    assert_eq!(a["trace_allocations"], allocs);
    assert_eq!(a["matched"], allocs);
    // The trace's own totals at each ledger's moment (730 µs later on its clock): the last
    // [memory] event at or before it; none after the trace's last event (the end here is
    // an empty_cache, which the profiler does not see).
    let trace = json_file(&profile("run.trace.json"));
    let mem = memory_events(&trace, 1, Some(0));
    let base_ns: i128 = 1_749_945_600_000_000_000;
    let ledgers = v["devices"][0]["ledgers"].as_array().unwrap();
    assert_eq!(ledgers.len(), 2);
    for l in ledgers {
        let t_ns = (l["time_us"].as_i64().unwrap() as i128 + 730) * 1000 - base_ns;
        if t_ns > mem.last().unwrap().ts_ns {
            assert_eq!(l["moment"], "end");
            assert!(l["trace_allocated_bytes"].is_null());
            continue;
        }
        let last = mem.iter().rfind(|m| m.ts_ns <= t_ns).unwrap();
        assert_eq!(
            l["trace_allocated_bytes"],
            last.total_allocated.unwrap(),
            "{}",
            l["moment"]
        );
        assert_eq!(l["trace_reserved_bytes"], last.total_reserved.unwrap());
    }
}

#[test]
fn traces_of_another_run_or_process_are_refused_with_the_reason() {
    let (code, _, stderr) = reconcile_json("testdata/profile/other_run.trace.json", &[]);
    assert_eq!(code, 2);
    assert_eq!(
        stderr.trim_end(),
        "vramlens: error: testdata/profile/other_run.trace.json: its memory events span 2025-06-18 15:06:40.000 UTC .. 2025-06-18 15:06:40.022 UTC, the snapshot's trace (device 0) spans 2025-06-15 15:06:40.000 UTC .. 2025-06-15 15:06:40.022 UTC: they do not overlap, so the trace is from another run; --allow-no-overlap shows it without using it"
    );
    let (code, _, stderr) = reconcile_json("testdata/profile/other_process.trace.json", &[]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("none of its 93 allocations in the snapshot's time span matches one of the snapshot's on device 0"),
        "{stderr}"
    );
    let (code, v, _) = reconcile_json(
        "testdata/profile/other_process.trace.json",
        &["--allow-no-overlap"],
    );
    assert_eq!(code, 0);
    assert_eq!(v["trace"]["used"], "no_matches");
    assert_eq!(v["trace"]["devices"][0]["alignment"]["matched"], 0);
    assert!(v["devices"][0]["ledgers"][0]["trace_allocated_bytes"].is_null());
}

#[test]
fn memory_timeline_categories_and_html() {
    let out = vramlens()
        .args(["summary", "--json", "testdata/profile/categories.json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"]["format"], "memory_timeline");
    // The largest row total: 400 + 800 + 16 + 120 + 400 MiB at the fourth time (decreases
    // of a row are applied before its increases).
    assert_eq!(v["devices"][0]["peak_requested_bytes"], 1736u64 << 20);
    let out = vramlens()
        .args(["summary", "testdata/profile/timeline.html"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap().trim_end(),
        "vramlens: error: testdata/profile/timeline.html: this is the HTML form of export_memory_timeline: a picture of the plot, with no data in it; export to a name ending in .raw.json.gz (the raw events) or .json (bytes per category) for vramlens to read"
    );
}

#[test]
fn a_trace_draws_a_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("t.svg");
    vramlens()
        .args(["timeline", "testdata/profile/run.trace.json", "-o"])
        .arg(&svg)
        .assert()
        .success();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") || text.starts_with("<?xml"));
    // A stack of the trace names the Python function of the model that asked.
    assert!(text.contains("model.py"), "no Python frame in the chart");
}

// ---------------------------------------------------------------------------------------
// Spans under the timeline (`timeline --trace`)
// ---------------------------------------------------------------------------------------

/// `(name, start ns, end ns, tid)` of the X events of `cat` (in file time, ns).
fn x_events(trace: &Value, cat: &str) -> Vec<(String, i128, i128, String)> {
    trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == cat)
        .map(|e| {
            let start = ts_ns(&e["ts"]);
            (
                e["name"].as_str().unwrap().to_string(),
                start,
                start + ts_ns(&e["dur"]),
                tid_of(e),
            )
        })
        .collect()
}

/// A thread id as text: 2021 traces write it as a number on memory events and as a
/// string on operators.
fn tid_of(e: &Value) -> String {
    match &e["tid"] {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// The spans of one thread inside no other of them, in time order.
fn outermost_on(
    spans: &[(String, i128, i128, String)],
    tid: &str,
) -> Vec<(String, i128, i128, String)> {
    let mut mine: Vec<_> = spans.iter().filter(|s| s.3 == tid).cloned().collect();
    mine.sort_by_key(|s| (s.1, std::cmp::Reverse(s.2)));
    let mut out: Vec<(String, i128, i128, String)> = Vec::new();
    for s in mine {
        if out.last().is_none_or(|o| s.1 >= o.2) {
            out.push(s);
        }
    }
    out
}

/// `(title's first line, lane)` of every span rectangle of a chart, in file order.
fn drawn_spans(svg: &str) -> Vec<(String, String)> {
    svg.split(r#"class="span"><title>"#)
        .skip(1)
        .map(|rest| {
            let title = &rest[..rest.find("</title>").unwrap()];
            let (name, lane) = title.split_once('\n').unwrap();
            let lane = lane.split(": from ").next().unwrap().to_string();
            (name.replace("&amp;", "&").replace("&apos;", "'"), lane)
        })
        .collect()
}

#[test]
fn a_trace_of_the_same_run_draws_its_operators_under_the_chart() {
    use vramlens::analysis::device::align::line_up;
    use vramlens::analysis::device::trace_lanes::{LaneKind, build_lanes};
    use vramlens::analysis::kinds::attribution::{AttributionOptions, Attributor};
    use vramlens::analysis::moments::chart::{ViewOptions, XAxis, build_view};
    use vramlens::timeline::replay::DeviceReplay;

    let snap = snapshot(&profile("run.pickle"));
    let trace_path = profile("run.trace.json");
    let file = std::fs::File::open(&trace_path).unwrap();
    let trace = vramlens::devlog::read_profile(std::io::BufReader::new(file)).unwrap();
    let converted = vramlens::devlog::to_snapshot(&trace);
    let lined = line_up(&snap, 0, &converted).unwrap();
    // The generator's profiler clock runs 730 µs ahead of the allocator's.
    assert_eq!(lined.alignment.residual_us, Some(730));
    let options = AttributionOptions::default();
    let attr = Attributor::new(&snap.frames, &options);
    let r = DeviceReplay::new(&snap, 0);
    let view = build_view(
        &snap,
        &r,
        &attr,
        ViewOptions {
            x: XAxis::Time,
            ..ViewOptions::default()
        },
    )
    .unwrap();
    let lanes = build_lanes(
        &trace,
        "run.trace.json",
        Some(lined.alignment),
        &view,
        r.trace,
    );

    // Expected from the JSON: the outermost cpu_op spans of its one thread, their times
    // put on the snapshot's clock (base + ts, less 730 µs), as µs since the first event.
    let json = json_file(&trace_path);
    let base = json["baseTimeNanoseconds"].as_i64().unwrap() as i128;
    let ops = outermost_on(&x_events(&json, "cpu_op"), "4242");
    assert_eq!(ops.len(), 93, "one aten::linear around each aten::empty");
    let origin = (0..r.trace.len())
        .find_map(|i| r.trace.time_us(i).filter(|&t| t > 0))
        .unwrap();
    assert_eq!(
        lanes.lanes.len(),
        1,
        "no record_function range in this trace"
    );
    let lane = &lanes.lanes[0];
    assert_eq!(lane.kind, LaneKind::Operators);
    assert_eq!(lane.thread.as_deref(), Some("4242/4242"));
    assert_eq!(lane.dropped, 0);
    assert_eq!(lane.spans.len(), ops.len());
    for (got, (name, start, end, _)) in lane.spans.iter().zip(&ops) {
        let start_us = ((base + start).div_euclid(1000) - 730) as i64;
        assert_eq!(&got.name, name);
        assert_eq!(got.start_us, start_us, "{name}");
        assert_eq!(got.duration_ns as i128, end - start, "{name}");
        assert_eq!(got.x0, (start_us - origin) as f64, "{name}");
    }

    // The command draws the same spans, and says how it lined the trace up.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lanes.svg");
    vramlens()
        .args([
            "timeline",
            "testdata/profile/run.pickle",
            "--trace",
            "testdata/profile/run.trace.json",
            "--x",
            "time",
            "-o",
        ])
        .arg(&out)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&out).unwrap();
    let drawn = drawn_spans(&svg);
    let names: Vec<&str> = drawn.iter().map(|d| d.0.as_str()).collect();
    let expected: Vec<&str> = ops.iter().map(|o| o.0.as_str()).collect();
    assert_eq!(names, expected);
    assert!(drawn.iter().all(|d| d.1 == "operators, thread 4242/4242"));
    assert!(
        svg.contains("the profiler&apos;s clock 730 us ahead of the allocator&apos;s; 93 of its 93 allocations here match the snapshot&apos;s"),
        "the chart says how the trace was placed"
    );
}

#[test]
fn spans_of_another_run_or_process_are_refused_and_need_a_chart() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.svg");
    let run = |trace: &str, with_output: bool| {
        let mut c = vramlens();
        c.args(["timeline", "testdata/profile/run.pickle", "--trace", trace]);
        if with_output {
            c.arg("-o").arg(&out);
        }
        let o = c.output().unwrap();
        (o.status.code(), String::from_utf8(o.stderr).unwrap())
    };
    let (code, err) = run("testdata/profile/other_run.trace.json", true);
    assert_eq!(code, Some(2));
    assert_eq!(
        err.trim(),
        "vramlens: error: testdata/profile/other_run.trace.json: its memory events span 2025-06-18 15:06:40.000 UTC .. 2025-06-18 15:06:40.022 UTC, the snapshot's trace (device 0) spans 2025-06-15 15:06:40.000 UTC .. 2025-06-15 15:06:40.022 UTC: they do not overlap, so the trace is from another run"
    );
    let (code, err) = run("testdata/profile/other_process.trace.json", true);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("other_process.trace.json: none of its 93 allocations in the snapshot's time span matches one of the snapshot's on device 0"),
        "{err}"
    );
    assert!(!out.exists(), "nothing is written for a refused trace");
    let (code, err) = run("testdata/profile/run.trace.json", false);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--trace draws the trace's spans under the chart: give -o FILE.svg"),
        "{err}"
    );
}

#[test]
fn record_function_ranges_get_a_lane_and_are_redacted_with_the_rest() {
    // The generated trace with one range around the whole run, named with a home path.
    let mut json = json_file(&profile("run.trace.json"));
    let events = json["traceEvents"].as_array_mut().unwrap();
    let (first, last) =
        events
            .iter()
            .filter(|e| e["ph"] == "X")
            .fold((f64::MAX, f64::MIN), |(a, b), e| {
                let t = e["ts"].as_f64().unwrap();
                (a.min(t), b.max(t + e["dur"].as_f64().unwrap()))
            });
    events.push(serde_json::json!({
        "ph": "X", "cat": "user_annotation", "name": "step /home/alice/secret/train.py",
        "pid": 4242, "tid": 4242, "ts": first - 1.0, "dur": last - first + 2.0,
    }));
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("annotated.trace.json");
    std::fs::write(&trace, serde_json::to_vec(&json).unwrap()).unwrap();
    let draw = |redact: bool| {
        let out = dir.path().join(format!("r{redact}.svg"));
        let mut c = vramlens();
        if redact {
            c.arg("--redact");
        }
        c.args(["timeline", "testdata/profile/run.pickle", "--trace"])
            .arg(&trace)
            .arg("-o")
            .arg(&out)
            .assert()
            .success();
        drawn_spans(&std::fs::read_to_string(&out).unwrap())
    };
    let plain = draw(false);
    let ranges: Vec<&(String, String)> = plain
        .iter()
        .filter(|d| d.1 == "record_function ranges")
        .collect();
    assert_eq!(ranges.len(), 1);
    assert_eq!(ranges[0].0, "step /home/alice/secret/train.py");
    let redacted = draw(true);
    let range = redacted
        .iter()
        .find(|d| d.1 == "record_function ranges")
        .unwrap();
    assert!(!range.0.contains("alice"), "{}", range.0);
    // Operators are PyTorch's names, kept.
    assert!(redacted.iter().any(|d| d.0 == "aten::linear"));
}

#[test]
#[ignore = "needs ../shared/data"]
fn a_real_trace_draws_its_profiler_steps_under_its_own_chart() {
    let rel = "kineto-tb-plugin-samples-2021/worker0.1623143566756.pt.trace.json.gz";
    let path = shared(rel);
    let json = json_file(&path);
    // The thread with most [memory] events, and its outermost operators (the 2021 shape
    // names the category "Operator") that overlap the GPU memory events' time span.
    let mut per_thread: std::collections::BTreeMap<String, usize> = Default::default();
    let (mut lo, mut hi) = (i128::MAX, i128::MIN);
    for e in json["traceEvents"].as_array().unwrap() {
        if e["name"] == "[memory]" {
            *per_thread.entry(tid_of(e)).or_default() += 1;
            // The chart is of the GPU (Device Type 1), whose events set its time span.
            if e["args"]["Device Type"] == 1 {
                let t = ts_ns(&e["ts"]);
                lo = lo.min(t);
                hi = hi.max(t);
            }
        }
    }
    let (tid, _) = per_thread
        .iter()
        .max_by_key(|(t, n)| (**n, std::cmp::Reverse(*t)))
        .unwrap();
    let expected: Vec<String> = outermost_on(&x_events(&json, "Operator"), tid)
        .into_iter()
        .filter(|s| s.2 >= lo && s.1 <= hi)
        .map(|s| s.0)
        .collect();
    assert!(
        expected
            .iter()
            .filter(|n| n.starts_with("ProfilerStep#"))
            .count()
            >= 6
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tb.svg");
    vramlens()
        .arg("timeline")
        .arg(&path)
        .args(["--x", "time", "-o"])
        .arg(&out)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&out).unwrap();
    let drawn = drawn_spans(&svg);
    let first_lane = &drawn[0].1;
    let got: Vec<String> = drawn
        .iter()
        .filter(|d| &d.1 == first_lane)
        .map(|d| d.0.clone())
        .collect();
    assert_eq!(got, expected, "lane {first_lane}");
    assert!(svg.contains("the chart&apos;s own trace"));
}

/// A 2021-style trace: [memory] events with neither `Total Reserved` nor `Addr`.
fn trace_without_reserved_or_addresses(dir: &Path) -> PathBuf {
    const MIB: i64 = 1 << 20;
    let mut total = 0;
    let events: Vec<Value> = [MIB, 2 * MIB, -MIB, -2 * MIB]
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            total += b;
            serde_json::json!({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                "pid": 7, "tid": 7, "ts": 1000.0 + i as f64 * 10.0,
                "args": {"Total Allocated": total, "Bytes": b, "Device Id": 0, "Device Type": 1}})
        })
        .collect();
    let path = dir.join("old.trace.json");
    std::fs::write(
        &path,
        serde_json::to_string(&serde_json::json!({"schemaVersion": 1, "traceEvents": events}))
            .unwrap(),
    )
    .unwrap();
    path
}

#[test]
fn a_trace_without_reserved_figures_shows_only_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let trace = trace_without_reserved_or_addresses(dir.path());
    let out = vramlens().arg("summary").arg(&trace).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    // No reserved figure: the trace recorded none.
    assert!(
        text.contains("  reserved             not recorded (the trace has no Total Reserved)\n"),
        "{text}"
    );
    assert!(!text.contains("peak reserved"), "{text}");
    assert!(!text.contains("reserved at the end"), "{text}");
    // The frees were paired by size, a guess said as one, not "complete".
    assert!(
        text.contains(
            "each free was paired with an allocation of its size (which block ended is a guess)"
        ),
        "{text}"
    );
    assert!(!text.contains("complete (every free"), "{text}");
    // The peak: 1 MiB + 2 MiB, by hand.
    assert!(
        text.contains("  peak requested       3.0 MiB at event 1"),
        "{text}"
    );
    assert!(
        !text.contains("_record_memory_history(max_entries"),
        "{text}"
    );
    assert!(
        text.contains("1 distinct stack of 0 distinct frames"),
        "{text}"
    );
    let json: Value = serde_json::from_slice(
        &vramlens()
            .args(["summary", "--json"])
            .arg(&trace)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let d = &json["devices"][0];
    assert_eq!(d["reserved_recorded"], false);
    assert_eq!(d["peak_reserved_bytes"], Value::Null);
    assert_eq!(d["peak_requested_bytes"], 3 << 20);
    // The chart draws no reserved line and says why in its legend.
    let svg = dir.path().join("t.svg");
    vramlens()
        .arg("timeline")
        .arg(&trace)
        .arg("-o")
        .arg(&svg)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(!svg.contains("reserved: bytes in segments"));
    assert!(svg.contains(">reserved: not recorded</text>"));
    assert!(!svg.contains("the gap up to reserved"));
}

/// A trace whose times have no base (Kineto of April-May 2024 writes `ts` relative to a
/// `baseTimeNanoseconds` it leaves out) prints offsets from the first event, never a 1970
/// date; the same trace with its base prints dates. The figures are the file's own: its
/// largest `Total Allocated` is stamped 5,376 µs after its first `[memory]` event, and
/// its last 21,518 µs after.
#[test]
fn a_trace_without_a_base_time_prints_offsets_from_its_first_event() {
    let no_base = root().join("testdata/profile/no_base.trace.json");
    let doc: Value = serde_json::from_slice(&std::fs::read(&no_base).unwrap()).unwrap();
    assert!(doc.get("baseTimeNanoseconds").is_none());
    assert!(snapshot(&no_base).features.relative_clock);
    let out = vramlens().arg("summary").arg(&no_base).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    assert!(!text.contains("1970"), "{text}");
    assert!(
        text.contains("peak requested       252.4 MiB at event 59, 5.4 ms after the first event"),
        "{text}"
    );
    assert!(text.contains("171 events, over 21.5 ms"), "{text}");
    for command in ["top", "timeline", "oom"] {
        let out = vramlens().arg(command).arg(&no_base).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(!text.contains("1970"), "{command}: {text}");
        assert!(text.contains("after the first event"), "{command}: {text}");
    }
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("chart.svg");
    let out = vramlens()
        .args(["timeline", "-o"])
        .arg(&chart)
        .arg(&no_base)
        .output()
        .unwrap();
    assert!(out.status.success());
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(!svg.contains("1970"));
    assert!(svg.contains("after the first event"));
    let with_base = root().join("testdata/profile/run.trace.json");
    assert!(!snapshot(&with_base).features.relative_clock);
    let out = vramlens().arg("summary").arg(&with_base).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("at event 59, 2025-06-15 15:06:40.006 UTC"),
        "{text}"
    );
}
