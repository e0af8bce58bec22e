//! Profiler traces and memory timelines as the main input: converted into a snapshot, they
//! replay to the trace's own totals; allocations carry the spans that enclose them; and a
//! trace of the same run lines up with its snapshot (`reconcile --trace`).
//!
//! Expected values are computed here from the files with serde_json, independently of
//! vramlens' streaming reader and converter. Files in `testdata/profile` come from
//! `scripts/gen_profile_pair.py` (one script of allocator events written as a snapshot and
//! as a trace); real traces from `../shared/data` (ignored when absent).

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
        // Memory from before profiling: the first event's Total Allocated minus its Bytes,
        // rebuilt as snapshot replay rebuilds memory from before a trace.
        let tl = timeline::build(&snap, slot);
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
    let tl = timeline::build(&snap, 0);
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
