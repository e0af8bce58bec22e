//! `vramlens reconcile` on our own H200 recording: the ledger at the OOM against the
//! device readings, computed by hand from the files.

mod common;

use assert_cmd::Command;
use common::root;
use vramlens::model::Action;

fn vramlens() -> Command {
    let mut c = Command::cargo_bin("vramlens").unwrap();
    c.current_dir(root());
    c
}

fn reconcile(nvml: &[&str]) -> serde_json::Value {
    let mut c = vramlens();
    c.args([
        "reconcile",
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--json",
    ]);
    for f in nvml {
        c.args(["--nvml", f]);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The ledger of the first device at its OOM.
fn oom_ledger(v: &serde_json::Value) -> serde_json::Value {
    v["devices"][0]["ledgers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["moment"] == "oom")
        .unwrap()
        .clone()
}

/// Time of the OOM event and the reserved bytes then (final segments minus the segment
/// events after it), from the snapshot's raw entries.
fn oom_moment() -> (i64, u64) {
    let (snap, _) = vramlens::input::read_snapshot(
        &root().join("testdata/gpu/oom/oom_snapshot.pickle"),
        Default::default(),
    )
    .unwrap();
    let trace = snap.trace(0).unwrap();
    let events: Vec<_> = trace.iter().collect();
    let i = events.iter().position(|e| e.action == Action::Oom).unwrap();
    (
        events[i].time_us.unwrap(),
        common::reserved_after(&snap, 0, i),
    )
}

#[test]
fn ledger_at_the_oom_against_nvml_samples() {
    let v = reconcile(&["testdata/gpu/oom/nvml.jsonl"]);
    let (t, reserved) = oom_moment();
    // The NVML reading nearest the OOM, read straight from the JSON lines.
    let text = std::fs::read_to_string(root().join("testdata/gpu/oom/nvml.jsonl")).unwrap();
    let nearest = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .min_by_key(|r| {
            (
                (r["time_us"].as_i64().unwrap() - t).abs(),
                r["time_us"].as_i64().unwrap(),
            )
        })
        .unwrap();
    let used = nearest["used_bytes"].as_u64().unwrap();
    let process = nearest["processes"][0]["used_bytes"].as_u64().unwrap();
    let l = oom_ledger(&v);
    assert_eq!(l["time_us"], t);
    assert_eq!(l["reserved_bytes"], reserved);
    assert_eq!(l["device_used_bytes"], used);
    assert_eq!(l["process_used_bytes"], process);
    assert_eq!(l["process_pid"], nearest["processes"][0]["pid"]);
    // The reading is compared with the allocator at the reading's own time: the last
    // event at or before it, from the raw entries. On this recording the reading is
    // 7.5 ms before the OOM, and a 128 MiB segment came in between.
    let at_reading = reserved_at_time(nearest["time_us"].as_i64().unwrap());
    assert_eq!(reserved - at_reading, 128 << 20);
    assert_eq!(l["reading_reserved_bytes"], at_reading);
    assert_eq!(
        l["outside_allocator_bytes"],
        process as i64 - at_reading as i64
    );
    assert_eq!(l["gap_bytes"], used as i64 - at_reading as i64);
    // The figure every command gives for this reading: 806.0 MiB.
    assert_eq!(
        vramlens::units::bytes((process - at_reading) as u64),
        "806.0 MiB"
    );
    assert_eq!(l["other_processes_bytes"], used as i64 - process as i64);
    // The CUDA context and friends: a few hundred MB, not GBs.
    let outside = l["outside_allocator_bytes"].as_i64().unwrap();
    assert!((200 << 20..2 << 30).contains(&outside), "{outside}");
}

#[test]
fn nvidia_smi_gpu_and_apps_logs_give_the_same_split() {
    let v = reconcile(&["testdata/gpu/nvsmi_gpu.csv", "testdata/gpu/nvsmi_apps.csv"]);
    assert_eq!(v["device_log_source"], "nvidia-smi");
    let (_, reserved) = oom_moment();
    let l = oom_ledger(&v);
    assert_eq!(l["reserved_bytes"], reserved);
    assert_eq!(l["device_total_bytes"], 143771u64 << 20);
    // nvidia-smi reports MiB: the process's use is a whole number of MiB.
    let process = l["process_used_bytes"].as_u64().unwrap();
    assert_eq!(process % (1 << 20), 0);
    assert!(l["sample_skew_us"].as_i64().unwrap().abs() <= 500_000);
    // Both sources see the same memory outside the allocator, within nvidia-smi's MiB
    // rounding and the time between readings.
    let nvml = reconcile(&["testdata/gpu/oom/nvml.jsonl"]);
    let a = l["outside_allocator_bytes"].as_i64().unwrap();
    let b = oom_ledger(&nvml)["outside_allocator_bytes"]
        .as_i64()
        .unwrap();
    assert!((a - b).abs() <= 64 << 20, "{a} vs {b}");
    // As the README writes it: one --nvml followed by both files reads the same.
    let out = vramlens()
        .args([
            "reconcile",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--json",
            "--nvml",
            "testdata/gpu/nvsmi_gpu.csv",
            "testdata/gpu/nvsmi_apps.csv",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let once: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(once, v);
}

#[test]
fn bad_device_logs_are_named() {
    vramlens()
        .args([
            "reconcile",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--nvml",
            "README.md",
        ])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "failed to read device log README.md",
        ));
    vramlens()
        .args(["reconcile", "testdata/gpu/oom/oom_snapshot.pickle"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--nvml"));
}

#[test]
fn the_split_comes_with_a_range_that_holds_it() {
    let v = reconcile(&["testdata/gpu/oom/nvml.jsonl"]);
    for l in v["devices"][0]["ledgers"].as_array().unwrap() {
        let point = l["outside_allocator_bytes"].as_i64().unwrap();
        let (lo, hi) = (
            l["outside_allocator_range_bytes"][0].as_i64().unwrap(),
            l["outside_allocator_range_bytes"][1].as_i64().unwrap(),
        );
        assert!(lo <= point && point <= hi, "{lo} <= {point} <= {hi}");
        let point = l["other_processes_bytes"].as_i64().unwrap();
        let (lo, hi) = (
            l["other_processes_range_bytes"][0].as_i64().unwrap(),
            l["other_processes_range_bytes"][1].as_i64().unwrap(),
        );
        assert!(lo <= point && point <= hi);
    }
}

// ---------------------------------------------------------------------------------------
// Which GPU, which times, what is known: logs made from our nvidia-smi recording
// ---------------------------------------------------------------------------------------

/// Runs `vramlens` in the project root; (status, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = vramlens().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn json_of(args: &[&str]) -> serde_json::Value {
    let (code, stdout, stderr) = run(args);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// Our `--query-gpu` CSV as rows of (timestamp text, used MiB), read with a plain split.
fn our_gpu_rows() -> Vec<(String, u64)> {
    let text = std::fs::read_to_string(root().join("testdata/gpu/nvsmi_gpu.csv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(", ").collect();
            (
                f[0].to_string(),
                f[3].trim_end_matches(" MiB").parse().unwrap(),
            )
        })
        .collect()
}

/// Writes a file in a fresh temporary folder; the folder lives as long as the handle.
fn temp_file(name: &str, text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

/// Unix µs of a `YYYY/MM/DD HH:MM:SS.mmm` stamp read as UTC, by hand.
fn stamp_us(s: &str) -> i64 {
    let n = |a: usize, b: usize| s[a..b].parse::<i64>().unwrap();
    let (y, m, d) = (n(0, 4), n(5, 7), n(8, 10));
    // Days from 1970-01-01 (Howard Hinnant's days_from_civil).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    (days * 86_400 + n(11, 13) * 3600 + n(14, 16) * 60 + n(17, 19)) * 1_000_000 + n(20, 23) * 1000
}

/// A stamp `hours` later, in the same format.
fn shift_stamp(s: &str, hours: i64) -> String {
    let t = stamp_us(s) + hours * 3_600_000_000;
    let secs = t.div_euclid(1_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // civil_from_days
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}/{m:02}/{d:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        t.rem_euclid(1_000_000) / 1000
    )
}

/// Reserved bytes when the reading nearest the OOM in our CSV was taken: after the last
/// event at or before it, from the snapshot's raw entries.
fn reserved_at_nearest_reading() -> u64 {
    let (t, _) = oom_moment();
    let at = our_gpu_rows()
        .into_iter()
        .map(|(s, _)| stamp_us(&s))
        .min_by_key(|&s| ((s - t).abs(), s))
        .unwrap();
    reserved_at_time(at)
}

/// Reserved bytes of our OOM recording at time `t`: after the last event at or before
/// it, from the snapshot's raw entries.
fn reserved_at_time(t: i64) -> u64 {
    let (snap, _) = vramlens::input::read_snapshot(
        &root().join("testdata/gpu/oom/oom_snapshot.pickle"),
        Default::default(),
    )
    .unwrap();
    let before = snap
        .trace(0)
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, e)| e.time_us.is_some_and(|x| x <= t))
        .map(|(i, _)| i)
        .last()
        .unwrap();
    common::reserved_after(&snap, 0, before)
}

/// The reading nearest the OOM in our CSV: (used bytes).
fn nearest_used_at_oom() -> u64 {
    let (t, _) = oom_moment();
    our_gpu_rows()
        .into_iter()
        .min_by_key(|(s, _)| ((stamp_us(s) - t).abs(), stamp_us(s)))
        .map(|(_, used)| used << 20)
        .unwrap()
}

#[test]
fn a_log_without_index_or_uuid_is_its_only_gpu() {
    // Our CSV as the vlm-opt-4090 log is written: no index, no uuid.
    let mut text = String::from("timestamp, memory.used [MiB]\n");
    for (s, used) in our_gpu_rows() {
        text.push_str(&format!("{s}, {used} MiB\n"));
    }
    let (_dir, path) = temp_file("gpu_log.csv", &text);
    let v = json_of(&[
        "reconcile",
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--nvml",
        &path,
        "--json",
    ]);
    assert_eq!(v["gpu_numbering"], "row_order");
    assert_eq!(v["devices"][0]["gpu"]["reason"], "only_gpu");
    let l = oom_ledger(&v);
    assert_eq!(l["device_used_bytes"], nearest_used_at_oom());
    // The reading against the allocator at the reading's own time.
    let reserved = reserved_at_nearest_reading();
    assert_eq!(l["reading_reserved_bytes"], reserved);
    assert_eq!(
        l["gap_bytes"],
        nearest_used_at_oom() as i64 - reserved as i64
    );
}

#[test]
fn several_gpus_without_index_ask_which_one() {
    // Two GPUs a reading, sharing each stamp: ours, then an idle one.
    let mut text = String::from("timestamp, memory.used [MiB]\n");
    for (s, used) in our_gpu_rows() {
        text.push_str(&format!("{s}, {used} MiB\n{s}, 3 MiB\n"));
    }
    let (_dir, path) = temp_file("two.csv", &text);
    let snapshot = "testdata/gpu/oom/oom_snapshot.pickle";
    let (code, stdout, stderr) = run(&["reconcile", snapshot, "--nvml", &path]);
    assert_eq!(code, 2);
    assert!(stdout.is_empty());
    assert!(
        stderr.contains(
            "has readings of GPUs 0, 1 and none numbered 0 as the snapshot's device: choose one with --gpu N"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("place among the rows of each reading"),
        "{stderr}"
    );
    // The first of each pair is ours; the second is the idle one.
    let v = json_of(&[
        "reconcile",
        snapshot,
        "--nvml",
        &path,
        "--gpu",
        "0",
        "--json",
    ]);
    assert_eq!(v["devices"][0]["gpu"]["reason"], "asked");
    assert_eq!(oom_ledger(&v)["device_used_bytes"], nearest_used_at_oom());
    let v = json_of(&[
        "reconcile",
        snapshot,
        "--nvml",
        &path,
        "--gpu",
        "1",
        "--json",
    ]);
    assert_eq!(oom_ledger(&v)["device_used_bytes"], 3u64 << 20);
    let (code, _, stderr) = run(&["reconcile", snapshot, "--nvml", &path, "--gpu", "5"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("has no readings of GPU 5; its GPUs: 0, 1"),
        "{stderr}"
    );
}

#[test]
fn a_time_zone_slip_is_named_with_the_offset_that_fixes_it() {
    // The same readings written in local time at UTC+8, without a zone.
    let text = std::fs::read_to_string(root().join("testdata/gpu/nvsmi_gpu.csv")).unwrap();
    let mut shifted = String::new();
    for (i, l) in text.lines().enumerate() {
        if i == 0 {
            shifted.push_str(l);
        } else {
            let (s, rest) = l.split_once(", ").unwrap();
            shifted.push_str(&format!("{}, {rest}", shift_stamp(s, 8)));
        }
        shifted.push('\n');
    }
    let (_dir, path) = temp_file("local.csv", &shifted);
    let snapshot = "testdata/gpu/oom/oom_snapshot.pickle";
    let (code, _, stderr) = run(&["reconcile", snapshot, "--nvml", &path]);
    assert_eq!(code, 2, "{stderr}");
    // Both ranges, the shift, and the option that fixes it.
    assert!(
        stderr.contains(
            "its readings span 2026-11-30 03:15:09.741 UTC .. 2026-11-30 03:15:52.771 UTC"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("the snapshot's trace (device 0) spans 2026-11-29 19:15:27.148 UTC .. 2026-11-29 19:15:32.632 UTC"),
        "{stderr}"
    );
    assert!(
        stderr.contains("if nvidia-smi ran at UTC+8, read the log with --utc-offset -480"),
        "{stderr}"
    );
    let fixed = json_of(&[
        "reconcile",
        snapshot,
        "--nvml",
        &path,
        "--utc-offset",
        "-480",
        "--json",
    ]);
    let original = json_of(&[
        "reconcile",
        snapshot,
        "--nvml",
        "testdata/gpu/nvsmi_gpu.csv",
        "--json",
    ]);
    assert_eq!(
        fixed["devices"][0]["ledgers"],
        original["devices"][0]["ledgers"]
    );
    // Going on anyway gives ledgers without readings, and says why.
    let v = json_of(&[
        "reconcile",
        snapshot,
        "--nvml",
        &path,
        "--allow-no-overlap",
        "--json",
    ]);
    assert_eq!(v["devices"][0]["times"]["overlap"], false);
    assert_eq!(
        v["devices"][0]["times"]["whole_hour_shifts"],
        serde_json::json!([-8])
    );
    assert_eq!(oom_ledger(&v)["split"], "no_reading");
    assert!(oom_ledger(&v)["device_used_bytes"].is_null());
}

#[test]
fn without_process_readings_text_and_json_give_the_same_gap() {
    let args = [
        "reconcile",
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--nvml",
        "testdata/gpu/nvsmi_gpu.csv",
    ];
    let v = json_of(&[&args[..], &["--json"]].concat());
    let l = oom_ledger(&v);
    let reserved = reserved_at_nearest_reading();
    let gap = nearest_used_at_oom() as i64 - reserved as i64;
    assert_eq!(l["gap_bytes"], gap);
    assert_eq!(l["split"], "no_process_readings");
    assert!(l["outside_allocator_bytes"].is_null());
    assert!(l["other_processes_bytes"].is_null());
    let (code, text, _) = run(&args);
    assert_eq!(code, 0);
    let line = format!(
        "outside the allocator or other processes {} (not split: the log has no per-process readings",
        vramlens::units::bytes_signed(gap)
    );
    assert!(text.contains(&line), "{text}");
    assert!(!text.contains("outside the allocator ?"), "{text}");
}

#[test]
fn fifty_thousand_nvml_samples_with_processes_take_seconds() {
    // 50 000 readings 100 µs apart across the OOM run's trace, three processes each.
    let (t, _) = oom_moment();
    let mut text = String::new();
    for i in 0..50_000i64 {
        let time = t - 5_000_000 + i * 100;
        text.push_str(&format!(
            "{{\"time_us\": {time}, \"gpu\": 0, \"uuid\": \"GPU-x\", \"total_bytes\": 150754820096, \"used_bytes\": {}, \"free_bytes\": 0, \"processes\": [{{\"pid\": 463, \"used_bytes\": {}}}, {{\"pid\": 1, \"used_bytes\": 1048576}}, {{\"pid\": 2, \"used_bytes\": 2097152}}]}}\n",
            150_000_000_000i64 + i,
            149_000_000_000i64 + i
        ));
    }
    let (_dir, path) = temp_file("nvml.jsonl", &text);
    let start = std::time::Instant::now();
    let v = json_of(&[
        "reconcile",
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--nvml",
        &path,
        "--json",
    ]);
    let seconds = start.elapsed().as_secs_f64();
    // The quadratic match of process rows took 13 minutes here in a debug build; the
    // binary search takes a few seconds (the bound leaves room for a loaded machine).
    assert!(seconds < 120.0, "{seconds} s");
    let l = oom_ledger(&v);
    assert_eq!(l["process_pid"], 463);
    // Reading i is at t - 5 s + i × 100 µs, so reading 50 000 would be at the OOM; the
    // last one (i = 49 999, 100 µs before it) is the nearest.
    assert_eq!(l["device_used_bytes"], 150_000_049_999u64);
    assert_eq!(l["process_used_bytes"], 149_000_049_999u64);
}

// ---------------------------------------------------------------------------------------
// Real files (../shared/data)
// ---------------------------------------------------------------------------------------

/// A file under `../shared/data`; panics, saying why, when it is missing.
fn shared(rel: &str) -> String {
    let path = root().join("../shared/data").join(rel);
    assert!(
        path.exists(),
        "{} is missing: this test needs ../shared/data (run it where the real data is)",
        path.display()
    );
    path.to_str().unwrap().to_string()
}

#[test]
#[ignore = "needs ../shared/data"]
fn the_vlm_opt_log_without_index_is_read_and_its_times_are_compared() {
    let log = shared("nvsmi-vlm-opt-4090/gpu_log.csv");
    let snapshot = "testdata/gpu/oom/oom_snapshot.pickle";
    let (code, _, stderr) = run(&["reconcile", snapshot, "--nvml", &log]);
    assert_eq!(code, 2);
    assert!(!stderr.contains("no readings of GPU"), "{stderr}");
    assert!(
        stderr.contains(
            "its readings span 2026-01-03 15:36:53.507 UTC .. 2026-01-03 16:24:53.961 UTC, the snapshot's trace (device 0) spans 2026-11-29 19:15:27.148 UTC .. 2026-11-29 19:15:32.632 UTC: they do not overlap"
        ),
        "{stderr}"
    );
    // Months apart: no time zone explains it.
    assert!(
        stderr.contains("no time-zone shift makes them overlap"),
        "{stderr}"
    );
    let v = json_of(&[
        "reconcile",
        snapshot,
        "--nvml",
        &log,
        "--allow-no-overlap",
        "--json",
    ]);
    let d = &v["devices"][0];
    assert_eq!(d["gpu"]["reason"], "only_gpu");
    assert_eq!(
        d["times"]["log_range"]["first_us"],
        1_767_454_613_507_000i64
    );
    assert_eq!(d["times"]["overlap"], false);
    assert!(
        d["ledgers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["device_used_bytes"].is_null())
    );
    // Nothing to explain, so no suspects.
    assert_eq!(d["suspects"], serde_json::json!([]));
}

/// An NVML log for a snapshot's trace span: one reading every 10 ms, `used` bytes.
fn nvml_over(first_us: i64, last_us: i64, used: u64) -> String {
    let mut text = String::new();
    let mut t = first_us - 1_000_000;
    while t <= last_us + 1_000_000 {
        text.push_str(&format!(
            "{{\"time_us\": {t}, \"gpu\": 0, \"total_bytes\": 85899345920, \"used_bytes\": {used}, \"free_bytes\": 0, \"processes\": null}}\n"
        ));
        t += 10_000;
    }
    text
}

#[test]
#[ignore = "needs ../shared/data"]
fn nccl_is_named_only_with_its_evidence_and_only_when_memory_is_outside() {
    let snapshot = shared("ccl-bench-torchtitan-fsdp-oom/rank0_memory_snapshot.pickle");
    // MANIFEST: time_us 1766124544221968 .. 1766124546225256; 40 GiB used, more than the
    // 34.5 GiB reserved.
    let (_dir, log) = temp_file(
        "nvml.jsonl",
        &nvml_over(1_766_124_544_221_968, 1_766_124_546_225_256, 40 << 30),
    );
    let v = json_of(&["reconcile", &snapshot, "--nvml", &log, "--json"]);
    let suspects = &v["devices"][0]["suspects"];
    assert_eq!(suspects[0]["kind"], "nccl");
    // Python: 34 START records of "nccl:_all_gather_base" in external_annotations.
    assert_eq!(
        suspects[0]["evidence"][0],
        serde_json::json!({"source": "annotation", "text": "nccl:_all_gather_base", "count": 34})
    );
    let (code, text, _) = run(&["reconcile", &snapshot, "--nvml", &log]);
    assert_eq!(code, 0);
    assert!(
        text.contains("NCCL communicator buffers (allocated by NCCL itself): annotation \"nccl:_all_gather_base\" (34 records)"),
        "{text}"
    );
    assert!(
        !text.to_lowercase().contains("cudnn workspaces of code"),
        "{text}"
    );
    // The device used less than PyTorch reserved: nothing outside to explain, no suspect.
    let (_dir2, low) = temp_file(
        "low.jsonl",
        &nvml_over(1_766_124_544_221_968, 1_766_124_546_225_256, 1 << 30),
    );
    let v = json_of(&["reconcile", &snapshot, "--nvml", &low, "--json"]);
    assert_eq!(v["devices"][0]["suspects"], serde_json::json!([]));
}

#[test]
#[ignore = "needs ../shared/data"]
fn traces_say_what_they_held_and_whether_they_were_used() {
    let snapshot = "testdata/gpu/ok/snapshot.pickle";
    let nvml = "testdata/gpu/ok/nvml.jsonl";
    // CPU events only: read, said, not used; no error.
    let v = json_of(&[
        "reconcile",
        snapshot,
        "--nvml",
        nvml,
        "--trace",
        &shared("unsloth-puzzles-trace/trace.json"),
        "--json",
    ]);
    assert_eq!(v["trace"]["used"], "only_cpu_events");
    assert_eq!(v["trace"]["cpu_events"], 20);
    assert_eq!(v["trace"]["cuda_events"], 0);
    // A memory timeline and a 2021 trace of other runs: refused with both ranges.
    for (rel, range) in [
        (
            "hta-test-data/memory_timeline.raw.gz",
            "2023-10-10 19:27:27.096 UTC .. 2023-10-10 19:27:28.083 UTC",
        ),
        (
            "kineto-tb-plugin-samples-2021/worker0.1623143566756.pt.trace.json.gz",
            "2021-06-08 09:04:53.542 UTC .. 2021-06-08 09:04:54.393 UTC",
        ),
    ] {
        let trace = shared(rel);
        let (code, stdout, stderr) =
            run(&["reconcile", snapshot, "--nvml", nvml, "--trace", &trace]);
        assert_eq!(code, 2, "{rel}");
        assert!(stdout.is_empty());
        assert!(
            stderr.contains(&format!("its memory events span {range}, the snapshot's trace (device 0) spans 2026-11-29 19:15:15.678 UTC")),
            "{stderr}"
        );
        assert!(stderr.contains("from another run"), "{stderr}");
        let v = json_of(&[
            "reconcile",
            snapshot,
            "--nvml",
            nvml,
            "--trace",
            &trace,
            "--allow-no-overlap",
            "--json",
        ]);
        assert_eq!(v["trace"]["used"], "no_overlap", "{rel}");
        assert_eq!(
            v["trace"]["devices"][0]["peak_source"], "running_sum",
            "{rel}"
        );
        assert!(
            v["trace"]["devices"][0]["peak_reserved_bytes"].is_null(),
            "{rel}"
        );
        assert!(oom_or_peak(&v)["trace_allocated_bytes"].is_null());
    }
}

/// The peak ledger of the first device.
fn oom_or_peak(v: &serde_json::Value) -> serde_json::Value {
    v["devices"][0]["ledgers"][0].clone()
}

#[test]
fn a_device_the_snapshot_lacks_is_refused_naming_the_ones_it_has() {
    // sample.pickle has device 0 only; multi_device.pickle has devices 0 and 2.
    let (code, stdout, stderr) = run(&[
        "reconcile",
        "testdata/sample.pickle",
        "--nvml",
        "testdata/gpu/ok/nvml.jsonl",
        "--device",
        "99",
    ]);
    assert_eq!(code, 2, "{stdout}");
    assert_eq!(stdout, "");
    assert_eq!(
        stderr.trim_end(),
        "vramlens: error: testdata/sample.pickle: device 99 has no segment and no trace entry in this file; it has device 0"
    );
    let (code, stdout, stderr) = run(&[
        "reconcile",
        "testdata/multi_device.pickle",
        "--nvml",
        "testdata/gpu/ok/nvml.jsonl",
        "--device",
        "5",
        "--json",
    ]);
    assert_eq!(code, 2, "{stdout}");
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(
            "device 5 has no segment and no trace entry in this file; it has devices 0, 2"
        ),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn the_rank_1_file_has_no_device_0_to_reconcile() {
    let rank1 = shared("ccl-bench-torchtitan-fsdp-oom/rank1_memory_snapshot.pickle");
    let (code, stdout, stderr) = run(&[
        "reconcile",
        &rank1,
        "--nvml",
        "testdata/gpu/oom/nvml.jsonl",
        "--device",
        "0",
    ]);
    assert_eq!(code, 2, "{stdout}");
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(
            "rank1_memory_snapshot.pickle: device 0 has no segment and no trace entry in this file; it has device 1"
        ),
        "{stderr}"
    );
}

#[test]
fn the_ledger_counts_requested_bytes_and_calls_them_so() {
    // scripts/expected.py (stdlib pickle) on the final state, which is the state after
    // the OOM entry: the last event of the trace.
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("testdata/gpu/oom/oom_snapshot.pickle.expected.json"))
            .unwrap(),
    )
    .unwrap();
    let requested = expected["devices"][0]["requested_bytes"].as_u64().unwrap();
    let blocks = expected["devices"][0]["allocated_bytes"].as_u64().unwrap();
    assert_eq!((requested, blocks), (149_184_151_828, 149_184_222_208));
    let v = reconcile(&["testdata/gpu/oom/nvml.jsonl"]);
    assert_eq!(v["schema_version"], 5);
    let d = &v["devices"][0];
    for l in d["ledgers"].as_array().unwrap() {
        assert!(l.get("allocated_bytes").is_none(), "{l}");
        if l["moment"] != "peak" {
            assert_eq!(l["requested_bytes"], requested, "{}", l["moment"]);
        }
    }
    // Each reading over time is against a state of the trace: requested bytes, at most
    // the requested peak (which is the final state here).
    let peak = expected["devices"][0]["peak_requested_bytes"]
        .as_u64()
        .unwrap();
    assert_eq!(peak, requested);
    let rows = d["over_time"].as_array().unwrap();
    assert!(rows.len() > 10, "{}", rows.len());
    for r in rows {
        assert!(r.get("allocated_bytes").is_none(), "{r}");
        assert!(r["requested_bytes"].as_u64().unwrap() <= peak, "{r}");
    }
    let text = run(&[
        "reconcile",
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--nvml",
        "testdata/gpu/oom/nvml.jsonl",
    ])
    .1;
    // The reading 7.5 ms before the OOM, before a 128 MiB segment: both figures, and
    // which one the split is against.
    assert!(
        text.contains("| PyTorch reserved 138.9 GiB when the reading was taken (139.0 GiB at the moment; the figures below compare the reading with the allocator at its own time) (requested 138.9 GiB)\n"),
        "{text}"
    );
    assert!(!text.contains("(allocated "), "{text}");
}

/// The snapshot's last event time (the OOM ends the trace), from its raw entries.
fn last_event_us() -> i64 {
    let (snap, _) = vramlens::input::read_snapshot(
        &root().join("testdata/gpu/oom/oom_snapshot.pickle"),
        Default::default(),
    )
    .unwrap();
    snap.trace(0)
        .unwrap()
        .iter()
        .filter_map(|e| e.time_us)
        .max()
        .unwrap()
}

#[test]
fn readings_after_the_oom_are_not_used_and_offsets_are_worded() {
    // Our NVML log with a reading 1 ms after the OOM that would be the nearest (the
    // process freed its memory: 1 GiB used).
    let text = std::fs::read_to_string(root().join("testdata/gpu/oom/nvml.jsonl")).unwrap();
    let end = last_event_us();
    let (oom_t, _) = oom_moment();
    let extra = format!(
        "{{\"free_bytes\": 0, \"gpu\": 0, \"processes\": [{{\"pid\": 463, \"used_bytes\": 1073741824}}], \"time_us\": {}, \"total_bytes\": 150754820096, \"used_bytes\": 1073741824, \"uuid\": \"GPU-a33ac4bd-89b7-0256-6ec8-52dc29b7a10a\"}}\n",
        oom_t + 1000
    );
    let mut rows: Vec<&str> = text.lines().collect();
    rows.push(extra.trim_end());
    let after = rows
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["time_us"].as_i64().unwrap() > end)
        .count();
    assert!(after >= 3, "{after}");
    // The nearest reading at or before the OOM, read straight from the lines.
    let before = rows
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["time_us"].as_i64().unwrap() <= end)
        .max_by_key(|r| r["time_us"].as_i64().unwrap())
        .unwrap();
    let (_dir, path) = temp_file("nvml.jsonl", &(rows.join("\n") + "\n"));
    let v = reconcile(&[&path]);
    let l = oom_ledger(&v);
    assert_eq!(l["device_used_bytes"], before["used_bytes"]);
    let skew = before["time_us"].as_i64().unwrap() - oom_t;
    assert!(skew < 0);
    assert_eq!(l["sample_skew_us"], skew);
    assert_eq!(
        v["devices"][0]["notes"],
        serde_json::json!([{"kind": "readings_after_oom_left_out", "readings": after}])
    );
    let (code, text, _) = run(&[
        "reconcile",
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--nvml",
        &path,
    ]);
    assert_eq!(code, 0);
    assert!(!text.contains("-0.0"), "{text}");
    assert!(
        text.contains(&format!(
            "oom = end event 4409 at 2026-11-29 19:15:32.632 UTC, the reading {:.1} ms before\n",
            -skew as f64 / 1000.0
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "note: {after} readings after the OOM (the trace's last event) not used"
        )),
        "{text}"
    );
    // The moments on one event are one ledger.
    assert_eq!(text.matches("event 4409").count(), 1, "{text}");
}

#[test]
fn the_driver_reserve_in_nvml_readings_is_measured_before_the_job() {
    // The lowest used of the readings before the first one listing a process, by hand.
    let text = std::fs::read_to_string(root().join("testdata/gpu/oom/nvml.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let first_busy = rows
        .iter()
        .position(|r| !r["processes"].as_array().unwrap().is_empty())
        .unwrap();
    let idle: Vec<u64> = rows[..first_busy]
        .iter()
        .map(|r| r["used_bytes"].as_u64().unwrap())
        .collect();
    let lowest = *idle.iter().min().unwrap();
    // 618.3 MiB: the driver's reserve that NVML's used figure counts.
    assert_eq!(lowest, 648_347_648);
    let v = reconcile(&["testdata/gpu/oom/nvml.jsonl"]);
    assert_eq!(
        v["devices"][0]["idle_use"],
        serde_json::json!({"used_bytes": lowest, "readings": idle.len()})
    );
    let (_, out, _) = run(&[
        "reconcile",
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--nvml",
        "testdata/gpu/oom/nvml.jsonl",
    ]);
    assert!(
        out.contains(&format!(
            "before this job's process appeared the GPU had 618.3 MiB in use (the lowest of {} readings): memory the driver keeps for itself (NVML's used figure counts it; nvidia-smi's memory.used leaves it out)",
            idle.len()
        )),
        "{out}"
    );
    // nvidia-smi's memory.used was 0 MiB before the job: nothing to say.
    let v = reconcile(&["testdata/gpu/nvsmi_gpu.csv", "testdata/gpu/nvsmi_apps.csv"]);
    assert_eq!(v["devices"][0]["idle_use"]["used_bytes"], 0);
}

#[test]
fn the_device_with_the_oom_comes_first_as_in_every_command() {
    // multi_device.pickle: devices 0 and 2, the OOM on device 2 (its expected.json).
    let v = json_of(&[
        "reconcile",
        "testdata/multi_device.pickle",
        "--nvml",
        "testdata/gpu/ok/nvml.jsonl",
        "--allow-no-overlap",
        "--json",
    ]);
    let order: Vec<i64> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_i64().unwrap())
        .collect();
    assert_eq!(order, [2, 0]);
    let (code, text, _) = run(&[
        "reconcile",
        "testdata/multi_device.pickle",
        "--nvml",
        "testdata/gpu/ok/nvml.jsonl",
        "--allow-no-overlap",
    ]);
    assert_eq!(code, 0);
    assert_eq!(text.lines().nth(1), Some("device 2"), "{text}");
}

/// One reading gives one figure of the memory outside the allocator: `reconcile`,
/// `budget` and the report's budget say the same 806.0 MiB for the reading nearest the
/// OOM (its process's use minus what the allocator held at the reading's time).
#[test]
fn one_reading_gives_one_outside_figure_in_every_command() {
    let snap = "testdata/gpu/oom/oom_snapshot.pickle";
    let nvml = "testdata/gpu/oom/nvml.jsonl";
    let text = |args: &[&str]| {
        let out = vramlens().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let r = text(&["reconcile", snap, "--nvml", nvml]);
    assert!(r.contains("outside the allocator 806.0 MiB | "), "{r}");
    let b = text(&[
        "budget",
        snap,
        "--nvml",
        nvml,
        "--log",
        "testdata/gpu/oom/oom.log",
    ]);
    assert!(
        b.contains("    outside the allocator                 806.0 MiB "),
        "{b}"
    );
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("r.html");
    vramlens()
        .args([
            "report",
            snap,
            "--nvml",
            nvml,
            "--log",
            "testdata/gpu/oom/oom.log",
            "-o",
        ])
        .arg(&page)
        .assert()
        .success();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("outside the allocator                 806.0 MiB "));
    assert!(!html.contains("678.0 MiB"));
}
