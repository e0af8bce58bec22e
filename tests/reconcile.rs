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
    assert_eq!(
        l["outside_allocator_bytes"],
        process as i64 - reserved as i64
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
