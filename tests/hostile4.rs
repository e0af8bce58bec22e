//! Hostile inputs, round four (issue 23, the items left open): a device log far longer
//! than what a report reads, and a file name with a newline. Each test writes its own
//! input (the snapshot is the repository's fixture `testdata/gpu/oom/oom_snapshot.pickle`).

use assert_cmd::Command;
use std::path::PathBuf;

mod common;

fn vramlens() -> Command {
    Command::cargo_bin("vramlens").unwrap()
}

fn fixture() -> PathBuf {
    common::root().join("testdata/gpu/oom/oom_snapshot.pickle")
}

/// Trace of the fixture (python: first and last `time_us` of device_traces[0]), and its
/// peak of requested bytes (the official viewer's count, event 4408).
const FIRST_US: i64 = 1_795_979_727_148_623;
const LAST_US: i64 = 1_795_979_732_632_911;
const PEAK_US: i64 = 1_795_979_732_631_677;

/// ISO 8601 UTC with microseconds, for a time on 2026-11-29 (1_795_910_400 s is
/// 2026-11-29 00:00:00 UTC).
fn iso(t_us: i64) -> String {
    let day_us = t_us - 1_795_910_400_000_000;
    let (s, us) = (day_us / 1_000_000, day_us % 1_000_000);
    format!(
        "2026-11-29T{:02}:{:02}:{:02}.{us:06}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

#[test]
fn iso_matches_the_fixture_times() {
    // summary prints the trace's start as 2026-11-29 19:15:27.148 UTC.
    assert_eq!(iso(FIRST_US), "2026-11-29T19:15:27.148623Z");
}

#[test]
fn a_log_far_longer_than_its_limits_is_folded_and_keeps_the_spike_near_the_peak() {
    // One reading every 20 us from 1 s before the trace to 1 s after: 374,215 rows, more
    // than the 262,144 kept one by one. Used is 10 GiB, but 120 GiB once, 0.3 s before
    // the peak.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpu.csv");
    let t0 = FIRST_US - 1_000_000;
    let spike_us = t0 + (PEAK_US - 300_000 - t0) / 20 * 20;
    let mut text = String::from("timestamp, index, memory.used [MiB], memory.total [MiB]\n");
    let mut rows = 0u64;
    let mut t = t0;
    while t <= LAST_US + 1_000_000 {
        let used = if t == spike_us { 120 * 1024 } else { 10 * 1024 };
        text.push_str(&format!("{}, 0, {used} MiB, 143771 MiB\n", iso(t)));
        rows += 1;
        t += 20;
    }
    assert_eq!(rows, (LAST_US - FIRST_US + 2_000_000) as u64 / 20 + 1);
    assert!(text.contains(" 122880 MiB"), "the spike is in the log");
    std::fs::write(&path, &text).unwrap();
    let out = vramlens()
        .arg("reconcile")
        .arg(fixture())
        .arg("--nvml")
        .arg(&path)
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &v["devices"][0];
    // Bounded: at most 4 readings per bucket, 4096 over the window and 4096 over the
    // moments' neighbourhoods (start to end +-10 s: 25.5 s, buckets of 6.2 ms). The
    // 5.5 s trace spans about 880 of those, each keeping its first and last reading
    // (used is constant, so they are also its lowest and highest).
    let over_time = d["over_time"].as_array().unwrap().len();
    assert!(over_time <= 4 * (4096 + 4096), "{over_time}");
    assert!(over_time >= 2 * 850, "{over_time}");
    // Counted: every row is either kept or folded.
    let folded = d["notes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["kind"] == "readings_folded")
        .expect("a note on folding")["rows_folded"]
        .as_u64()
        .unwrap();
    assert!(folded > rows - 2 * 4 * (4096 + 4096), "{folded} of {rows}");
    // The peak's ledger still sees the spike among the readings within 0.5 s.
    let peak = &d["ledgers"][0];
    assert_eq!(peak["moment"], "peak");
    assert_eq!(peak["time_us"], PEAK_US);
    assert_eq!(
        peak["device_used_range_bytes"],
        serde_json::json!([10u64 << 30, 120u64 << 30])
    );
    assert_eq!(peak["device_used_bytes"], 10u64 << 30);
    // The reading nearest the peak is the one the whole log has: readings lie every
    // 20 us from t0, the nearer of the two around the peak (the earlier on a tie).
    let d = (PEAK_US - t0) % 20;
    let skew = if d <= 10 { -d } else { 20 - d };
    assert_eq!(peak["sample_skew_us"], skew);
    // The report reads the log the same way: streamed for the file's window, folded.
    let page = dir.path().join("r.html");
    let out = vramlens()
        .arg("report")
        .arg(fixture())
        .arg("--nvml")
        .arg(&path)
        .arg("-o")
        .arg(&page)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains(&format!(
            "{folded} of its rows were folded into a bounded series"
        )),
        "the report's readings are the bounded series"
    );
}

#[test]
fn a_newline_in_a_file_name_is_shown_as_text_in_the_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad\nname.pickle");
    std::fs::write(&bad, b"x").unwrap();
    let out = vramlens().arg("summary").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("bad\\nname.pickle: not a pickle"),
        "{stderr}"
    );
    // A side input that does not exist: the same.
    let missing = dir.path().join("no\nsuch.csv");
    let out = vramlens()
        .arg("reconcile")
        .arg(fixture())
        .arg("--nvml")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot read "), "{stderr}");
    assert!(stderr.contains("no\\nsuch.csv: "), "{stderr}");
}
