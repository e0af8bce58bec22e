//! `vramlens oom`: verdicts and figures on real OOM snapshots, fixtures and logs.

mod common;

use assert_cmd::Command;
use common::{require_shared_data, root};
use std::collections::HashMap;
use vramlens::model::{Action, BlockState};

fn vramlens() -> Command {
    let mut c = Command::cargo_bin("vramlens").unwrap();
    c.current_dir(root());
    c
}

fn oom_json(args: &[&str]) -> serde_json::Value {
    let out = vramlens()
        .arg("oom")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `vramlens oom ARGS` as text; it must succeed.
fn oom_text(args: &[&str]) -> String {
    let out = vramlens().arg("oom").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The verdicts' shares of the deficit, in order; they add up to at most 1.
fn shares(a: &serde_json::Value) -> Vec<Option<f64>> {
    let s: Vec<Option<f64>> = a["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["share_of_deficit"].as_f64())
        .collect();
    let sum: f64 = s.iter().flatten().sum();
    assert!(sum <= 1.0 + 1e-9, "shares add up to {sum}: {s:?}");
    s
}

/// The causes of the verdicts, primary first (and only the first is primary).
fn kinds(a: &serde_json::Value) -> Vec<String> {
    let roles: Vec<&str> = a["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["role"].as_str().unwrap())
        .collect();
    if let Some((first, rest)) = roles.split_first() {
        assert_eq!(*first, "primary");
        assert!(rest.iter().all(|r| *r == "contributing"), "{roles:?}");
    }
    a["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["cause"].as_str().unwrap().to_string())
        .collect()
}

/// Figures at the first `oom` entry of a device, computed directly from the trace entries
/// and final blocks (not through vramlens' timeline): (index, request, device free,
/// reserved, allocated requested bytes as the official viewer counts them).
fn hand_figures(path: &std::path::Path, device: i64) -> (usize, u64, u64, u64, u64) {
    let (snap, _) = vramlens::input::read_snapshot(path, Default::default()).unwrap();
    let trace = snap.trace(device).unwrap();
    let events: Vec<_> = trace.iter().collect();
    let oom = events.iter().position(|e| e.action == Action::Oom).unwrap();
    let reserved = common::reserved_after(&snap, device, oom);
    // Allocated: pair allocs with free_completed; what was freed without its alloc in
    // the trace, and final blocks never allocated in it, existed from the start.
    let mut open: HashMap<u64, u64> = HashMap::new();
    let mut total: i64 = 0;
    let mut at_oom = 0;
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                open.insert(e.addr, e.size);
                total += e.size as i64;
            }
            Action::FreeCompleted => {
                total -= open.remove(&e.addr).unwrap_or(e.size) as i64;
            }
            _ => {}
        }
        if i == oom {
            at_oom = total;
        }
    }
    let orphans: i64 = {
        let mut open: HashMap<u64, ()> = HashMap::new();
        let mut sum = 0;
        for e in &events {
            match e.action {
                Action::Alloc => {
                    open.insert(e.addr, ());
                }
                Action::FreeCompleted if open.remove(&e.addr).is_none() => sum += e.size as i64,
                _ => {}
            }
        }
        sum
    };
    let survivors: i64 = snap
        .segments_of(device)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::ActiveAllocated && !open.contains_key(&b.address))
        .map(|b| b.requested_size as i64)
        .sum();
    let e = &events[oom];
    (
        oom,
        e.size,
        e.addr,
        reserved,
        (at_oom + orphans + survivors) as u64,
    )
}

#[test]
#[ignore = "needs ../shared/data"]
fn torchtitan_fsdp_ranks_run_out_by_fragmentation_that_a_setting_fixes() {
    let data = require_shared_data();
    for (rank, device) in [("rank0", 0), ("rank1", 1)] {
        let path = data.join(format!(
            "ccl-bench-torchtitan-fsdp-oom/{rank}_memory_snapshot.pickle"
        ));
        let v = oom_json(&[path.to_str().unwrap(), "--device-total", "39.39GiB"]);
        let a = &v["analyses"].as_array().unwrap()[..];
        assert_eq!(a.len(), 1, "{rank}: one oom event");
        let a = &a[0];
        let (index, request, free, reserved, allocated) = hand_figures(&path, device);
        assert_eq!(a["device"], device);
        assert_eq!(a["event"], index as u64);
        assert_eq!(a["requested_bytes"], request);
        assert_eq!(a["device_free_bytes"], free);
        assert_eq!(a["reserved_bytes"], reserved);
        assert_eq!(a["requested_live_bytes"], allocated);
        // By hand: live blocks + request fit in reserved + device free (the memory was
        // there), but the device had less free than the request: the rest was in holes
        // inside segments. Fragmentation, whatever the margin.
        let live = a["allocated_bytes"].as_u64().unwrap();
        assert!(live + request <= reserved + free, "{rank}");
        assert!(free < request, "{rank}");
        assert_eq!(a["shortfall_in"], "fragmentation", "{rank}");
        assert_eq!(kinds(a), ["fragmentation"], "{rank}");
        assert_eq!(shares(a), [None], "{rank}");
        assert_eq!(a["shortfall_bytes"], 0);
        // The fixes: the settings the replay lets the request through with, the most to
        // spare first, then what reduces live memory (sharding is not proposed to a job
        // whose stacks show FSDP's frames). Garbage collection, which the replay shows
        // running out at the same request, is not offered; nor is empty_cache(), which
        // the replay does not test.
        assert_eq!(
            a["verdicts"][0]["knobs"],
            serde_json::json!([
                "expandable_segments",
                "max_split_size",
                "smaller_batch",
                "activation_checkpointing",
                "precision_offload"
            ]),
            "{rank}"
        );
        let sharding = v["sharding_file"].as_str().unwrap();
        assert!(
            sharding.ends_with("torch/distributed/fsdp/_fully_shard/_fsdp_param.py"),
            "{sharding}"
        );
        let w = &a["what_if"];
        assert_eq!(w["model_exact"], true);
        assert_eq!(w["reproduced"], true);
        let through: Vec<(&str, bool)> = w["tries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["setting"].as_str().unwrap(),
                    t["lets_through"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            through,
            [
                ("expandable_segments", true),
                ("max_split_size", true),
                ("gc_threshold", false)
            ]
        );
        // Without the device total, the same verdicts and words, and the way to give it.
        let text = oom_text(&[path.to_str().unwrap()]);
        assert!(!text.contains("cannot help"), "{rank}: {text}");
        assert!(!text.contains("sharding (FSDP/ZeRO)"), "{rank}: {text}");
        assert!(
            text.contains("sharding is on already (the stacks have frames of torch/distributed/fsdp/_fully_shard/_fsdp_param.py): not proposed\n"),
            "{rank}: {text}"
        );
        assert!(
            text.contains(
                "total unknown (give --device-total SIZE, or --log with the OOM message)"
            ),
            "{rank}: {text}"
        );
        // The first screen leads with the fix the replay proves, and its thin margin.
        let verdict = text
            .find("  verdict: fragmentation: the memory was there")
            .unwrap();
        let fix = text
            .find("    try: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets it through with ")
            .unwrap();
        let smaller = text.find("    try: reduce what is live").unwrap();
        let live = text.find("  live by call site").unwrap();
        assert!(
            verdict < fix && fix < smaller && smaller < live,
            "{rank}: {text}"
        );
        assert!(
            text.contains("a thin margin), in a replay of the same requests through the allocator model; with so thin a margin, also reduce what is live (below)\n"),
            "{rank}: {text}"
        );
        assert!(
            text.contains(": enough in total (640.7 MiB to spare), but no free space held the request (it lacked 165.9 MiB)\n"),
            "{rank}: {text}"
        );
        // The request lacked what the largest free space (the device's) did not hold.
        assert_eq!(
            a["deficit_bytes"],
            request - free.max(a["largest_hole_same_stream_bytes"].as_u64().unwrap())
        );
        let holes = a["largest_hole_bytes"].as_u64().unwrap();
        assert!(holes < request);
        assert!(a["cached_free_bytes"].as_u64().unwrap() + free >= request);
        // 39.39 GiB total − free − reserved
        let total = (39.39f64 * (1u64 << 30) as f64).round() as u64;
        assert_eq!(a["outside_allocator_bytes"], total - free - reserved);
        // The knobs include expandable segments, which were off.
        let text = a["verdicts"].to_string();
        assert!(text.contains("\"expandable_segments\""));
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn expandable_segments_oom_is_capacity_and_suggests_nothing_already_on() {
    let data = require_shared_data();
    let path = data.join("code-location-expandable-oom/memory_snapshot.pickle");
    let v = oom_json(&[path.to_str().unwrap()]);
    let a = &v["analyses"].as_array().unwrap();
    assert_eq!(a.len(), 1);
    let a = &a[0];
    let (index, request, free, reserved, allocated) = hand_figures(&path, 1);
    assert_eq!(
        (a["device"].as_i64(), a["event"].as_u64()),
        (Some(1), Some(index as u64))
    );
    assert_eq!(a["requested_bytes"], request);
    assert_eq!(a["device_free_bytes"], free);
    assert_eq!(a["reserved_bytes"], reserved);
    assert_eq!(a["requested_live_bytes"], allocated);
    assert_eq!(kinds(a), ["capacity"]);
    // 78.3 GiB live + the 4.9 GiB request exceed reserved + free: a real shortfall.
    let short = allocated_blocks(a) + request - reserved - free;
    assert_eq!(a["shortfall_bytes"], short);
    assert_eq!(a["verdicts"][0]["bytes"], short);
    assert!(
        !a["verdicts"]
            .to_string()
            .contains("\"expandable_segments\""),
        "already on"
    );
    // No frame of FSDP or ZeRO: sharding is proposed.
    assert_eq!(v["sharding_file"], serde_json::Value::Null);
    assert!(
        a["verdicts"][0]["knobs"]
            .to_string()
            .contains("\"precision_sharding_offload\"")
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn snapshot_without_an_oom_event_is_analysed_from_its_final_state() {
    let data = require_shared_data();
    let path = data.join("flexgen-pt20/oom_snapshot.pickle");
    let v = oom_json(&[path.to_str().unwrap()]);
    let a = &v["analyses"][0];
    assert_eq!(a["source"], "final_state");
    assert_eq!(a["oom_recorded"], false);
    assert_eq!(a["requested_bytes"], serde_json::Value::Null);
    assert_eq!(a["device_free_bytes"], serde_json::Value::Null);
    // No verdict is built on unknowns.
    assert_eq!(kinds(a), Vec::<String>::new());
    let text = vramlens()
        .args(["oom", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("no OOM is recorded"), "{text}");
    assert!(!text.contains("0 B free"), "{text}");
    // The same for a snapshot of a run that never ran out of memory.
    let path = data.join("cs336-kkaitlyn111/memory_ctx128_fullstep.pickle");
    let v = oom_json(&[path.to_str().unwrap()]);
    assert_eq!(v["analyses"][0]["oom_recorded"], false);
    assert_eq!(kinds(&v["analyses"][0]), Vec::<String>::new());
}

#[test]
fn sample_oom_is_capacity() {
    let v = oom_json(&["testdata/sample.pickle"]);
    let a = &v["analyses"][0];
    let (index, request, free, reserved, allocated) =
        hand_figures(&root().join("testdata/sample.pickle"), 0);
    assert_eq!(a["event"], index as u64);
    assert_eq!(a["requested_bytes"], request);
    assert_eq!(a["device_free_bytes"], free);
    assert_eq!(a["reserved_bytes"], reserved);
    assert_eq!(a["requested_live_bytes"], allocated);
    assert_eq!(kinds(a), ["capacity"]);
    // The request's stack is reported with its Python frames.
    assert!(a["frames"].to_string().contains(".py:"));
}

#[test]
fn both_forms_of_the_oom_message_are_read_from_a_log() {
    let v = oom_json(&["--log", "testdata/logs/train_oom.log"]);
    let m = v["messages"].as_array().unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(m[0]["line"], 6);
    assert_eq!(m[0]["form"], "new");
    assert_eq!(m[0]["requested_bytes"], 2u64 << 30);
    assert_eq!(m[1]["form"], "old");
    assert_eq!(m[1]["gpu"], 1);
    assert_eq!(m[1]["requested_bytes"], 512u64 << 20);
    let text = vramlens()
        .args(["oom", "--log", "testdata/logs/train_oom.log"])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    // New form: 6.94 GiB reserved but unallocated + 1.06 GiB free cover 2 GiB.
    assert!(
        text.contains("verdict: fragmentation: 6.9 GiB reserved but unallocated"),
        "{text}"
    );
    // Old form: 14.90 GiB allocated + 512 MiB need more than 15.10 GiB + 0.29 GiB.
    assert!(
        text.contains("verdict: capacity: the live blocks (14.9 GiB) plus the request (512.0 MiB)"),
        "{text}"
    );
    // With a log alone, the knobs are given too (every one that applies: the settings
    // are unknown).
    assert!(
        text.contains("try: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{text}"
    );
    assert!(text.contains("try: reduce what is live"), "{text}");
    // ... and said to be unknown, once, under the verdict that offers them (the
    // capacity verdict offers none).
    assert_eq!(
        text.matches("the allocator's settings are unknown from a message alone")
            .count(),
        1,
        "{text}"
    );
    let a = &v["analyses"];
    assert_eq!(kinds(&a[0]), ["fragmentation"]);
    assert_eq!(kinds(&a[1]), ["capacity"]);
}

#[test]
fn oom_input_errors() {
    vramlens()
        .args(["oom"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("give a SNAPSHOT, a --log FILE"));
    vramlens()
        .args(["oom", "testdata/sample.pickle", "--device-total", "lots"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "--device-total: expected a size such as 85899345920, 80GiB (2^30 bytes each) or 80GB (10^9 bytes each), found \"lots\"",
        ));
    vramlens()
        .args(["oom", "--log", "README.md"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "no CUDA out-of-memory message found",
        ));
}

/// Our own recordings on an H200 with PyTorch 2.11 (scripts/gpu_capture_check.py): an
/// evaluation loop that keeps its autograd graphs alive until the device is full.
#[test]
fn leak_until_the_device_is_full_is_named() {
    for job in ["oom", "oom_exp"] {
        let snap = format!("testdata/gpu/{job}/oom_snapshot.pickle");
        let log = format!("testdata/gpu/{job}/oom.log");
        let v = oom_json(&[&snap, "--log", &log]);
        let a = &v["analyses"].as_array().unwrap();
        assert_eq!(a.len(), 1, "{job}");
        let a = &a[0];
        let (index, request, free, reserved, allocated) = hand_figures(&root().join(&snap), 0);
        assert_eq!(a["event"], index as u64);
        assert_eq!(a["requested_bytes"], request);
        assert_eq!(request, 128 << 20);
        assert_eq!(a["device_free_bytes"], free);
        assert_eq!(a["reserved_bytes"], reserved);
        assert_eq!(a["requested_live_bytes"], allocated);
        // A leak first: it alone frees far more than the request lacked. The request
        // would have fit in total (131.9 MiB free in all for 128 MiB), so the holes are
        // where it fell short: fragmentation contributes, with no share of the deficit,
        // and leads no longer than the replay shows no setting with a margin worth it.
        assert_eq!(kinds(a), ["leak", "fragmentation"], "{job}");
        assert_eq!(a["shortfall_in"], "fragmentation", "{job}");
        assert_eq!(shares(a), [Some(1.0), None], "{job}");
        let lacked = a["deficit_bytes"].as_u64().unwrap();
        assert!(a["verdicts"][0]["bytes"].as_u64().unwrap() > 1000 * lacked);
        assert_eq!(a["verdicts"][0]["knobs"], serde_json::json!(["fix_leak"]));
        assert_eq!(
            a["verdicts"][0]["sites"][0], "<string>:31:leaky_eval",
            "{job}"
        );
        // The device total comes from the message: 139.80 GiB.
        assert_eq!(
            a["device_total_bytes"],
            (139.80f64 * (1u64 << 30) as f64).round() as u64
        );
        // The leak is named by its call site, the user's line in leaky_eval.
        assert_eq!(a["top_sites"][0]["name"], "<string>:31:leaky_eval", "{job}");
        if job == "oom_exp" {
            assert!(
                !a["verdicts"]
                    .to_string()
                    .contains("\"expandable_segments\""),
                "already on"
            );
        }
        // The message of PyTorch 2.11 agrees with the snapshot on the device's free memory
        // (printed with two decimals).
        let m = &v["messages"][0];
        let printed = m["free_bytes"].as_u64().unwrap() as f64;
        assert!(
            (printed - free as f64).abs() < 0.01 * (1u64 << 20) as f64,
            "{job}"
        );
    }
}

#[test]
fn a_per_process_cap_is_named_with_its_limit() {
    let v = oom_json(&[
        "testdata/gpu/oom_cap/oom_snapshot.pickle",
        "--log",
        "testdata/gpu/oom_cap/oom.log",
    ]);
    let a = &v["analyses"][0];
    // set_per_process_memory_fraction(0.05) of 139.80 GiB: "6.99 GiB allowed".
    assert_eq!(
        a["allowed_bytes"],
        (6.99f64 * (1u64 << 30) as f64).round() as u64
    );
    // Under the cap, the request fell short in holes: the settings the replay proves
    // there contribute (max_split_size_mb:64 spares 32 MiB, expandable segments nothing).
    assert_eq!(kinds(a), ["memory_fraction_cap", "fragmentation"]);
    assert_eq!(
        a["verdicts"][1]["knobs"][0], "max_split_size",
        "{}",
        a["verdicts"]
    );
    assert_eq!(a["verdicts"][0]["bytes"], a["allowed_bytes"]);
    assert!(a["device_free_bytes"].as_u64().unwrap() > 100 << 30);
    // Without the log the cap is unknown, but the refusal with free memory still shows.
    let v = oom_json(&["testdata/gpu/oom_cap/oom_snapshot.pickle"]);
    assert_eq!(
        kinds(&v["analyses"][0]),
        ["memory_fraction_cap", "fragmentation"]
    );
}

/// Block bytes of the live allocations (the analysis's allocated figure).
fn allocated_blocks(a: &serde_json::Value) -> u64 {
    a["allocated_bytes"].as_u64().unwrap()
}

#[test]
fn several_files_devices_and_totals() {
    // Two files, one report each, in order.
    let out = vramlens()
        .args([
            "oom",
            "testdata/sample.pickle",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let paths: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["path"].to_string())
        .collect();
    assert_eq!(
        paths,
        [
            "\"testdata/sample.pickle\"",
            "\"testdata/gpu/oom/oom_snapshot.pickle\""
        ]
    );
    // A device the file does not have is an error naming the ones it has.
    vramlens()
        .args(["oom", "testdata/multi_device.pickle", "--device", "1"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "device 1 has no segment and no trace entry in this file; it has devices 0, 2",
        ));
    // The OOM of a file with several devices is found on its device.
    let v = oom_json(&["testdata/multi_device.pickle"]);
    assert_eq!(v["analyses"][0]["device"], 2);
    // A total below what the device held is refused.
    vramlens()
        .args(["oom", "testdata/sample.pickle", "--device-total", "1GiB"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("is less than what device 0 held"));
}

/// Sizes as `x.yyy GiB`, computed here rather than with vramlens' formatting.
fn gib(n: u64, decimals: usize) -> String {
    format!("{:.*} GiB", decimals, n as f64 / (1u64 << 30) as f64)
}

#[test]
fn a_log_alone_gives_no_size_it_cannot_know() {
    // Our H200 log: the message gives the device's free memory and PyTorch's totals,
    // but no hole sizes, no requested bytes of live tensors, no pending frees.
    let v = oom_json(&["--log", "testdata/gpu/oom/oom.log"]);
    let a = &v["analyses"][0];
    let m = &v["messages"][0];
    for key in [
        "largest_hole_bytes",
        "largest_hole_same_stream_bytes",
        "requested_live_bytes",
        "rounding_waste_bytes",
        "pending_free_bytes",
    ] {
        assert_eq!(a[key], serde_json::Value::Null, "{key}");
    }
    let request = m["requested_bytes"].as_u64().unwrap();
    let free = m["free_bytes"].as_u64().unwrap();
    let allocated = m["allocated_by_pytorch_bytes"].as_u64().unwrap();
    let reserved = m["reserved_by_pytorch_bytes"].as_u64().unwrap();
    // Without hole sizes, what the request lacked is what the device's free memory did
    // not hold.
    assert_eq!(a["deficit_bytes"], request - free);
    assert_eq!(a["needed_bytes"], allocated + request);
    assert_eq!(a["available_bytes"], reserved + free);
    // Live + request fit in reserved + free, the device had less free than the
    // request: the rest was in pieces (fragmentation), whatever the margin.
    assert!(allocated + request <= reserved + free && free < request);
    assert_eq!(a["shortfall_in"], "fragmentation");
    assert_eq!(kinds(a), ["fragmentation"]);
    assert_eq!(shares(a), [None]);
    let text = oom_text(&["--log", "testdata/gpu/oom/oom.log"]);
    assert!(
        text.contains("  verdict: fragmentation: 100.8 MiB reserved but unallocated plus 31.1 MiB free on the device would cover the request (128.0 MiB), yet it failed: that memory was in pieces smaller than the request (the message does not give their sizes)\n"),
        "{text}"
    );
    // The message does not name the request's stream.
    assert!(text.contains("  request            128.0 MiB\n"), "{text}");
    // No figure the log does not give is printed as 0, and no line says that settings
    // cannot help while another proposes them.
    for line in text.lines() {
        assert!(!line.contains(" 0 B"), "{line}");
        assert!(!line.contains("cannot help"), "{line}");
    }
    // 149.32 GB needed of 149.32 GB: both printed apart, with the room to spare, and the
    // share shown below 100%.
    let (needed, could) = (allocated + request, reserved + free);
    assert_eq!(gib(needed, 1), gib(could, 1));
    assert_eq!(gib(needed, 2), gib(could, 2));
    let line = format!(
        "  needed             {} (live blocks + request); PyTorch could have {} (reserved + free): enough in total (4.0 MiB to spare), but no free space held the request (it was 96.9 MiB more than the device had free)\n",
        gib(needed, 3),
        gib(could, 3)
    );
    assert!(text.contains(&line), "{line}\n{text}");
}

#[test]
fn needed_and_available_read_apart_when_they_round_alike() {
    let v = oom_json(&["testdata/gpu/oom/oom_snapshot.pickle"]);
    let a = &v["analyses"][0];
    let needed = a["needed_bytes"].as_u64().unwrap();
    let could = a["available_bytes"].as_u64().unwrap();
    assert_eq!(gib(needed, 1), "139.1 GiB");
    assert_eq!(gib(could, 1), "139.1 GiB");
    let spare = could - needed;
    let text = oom_text(&["testdata/gpu/oom/oom_snapshot.pickle"]);
    let line = format!(
        "  needed             {} (live blocks + request); PyTorch could have {} (reserved + free): enough in total ({:.1} MiB to spare), but no free space held the request (it lacked 96.0 MiB)\n",
        gib(needed, 2),
        gib(could, 2),
        spare as f64 / (1u64 << 20) as f64
    );
    assert_eq!(gib(needed, 2), "139.06 GiB");
    assert!(text.contains(&line), "{line}\n{text}");
}

#[test]
fn the_device_analysed_and_the_others_are_named() {
    // multi_device.pickle has devices 0 and 2; the OOM is on device 2.
    let text = oom_text(&["testdata/multi_device.pickle"]);
    assert_eq!(
        text.lines().next().unwrap(),
        // The same words as `top`'s (tests/moments.rs): the peaks of expected.json.
        "testdata/multi_device.pickle: device 2 (the device with the OOM, peak 22.3 MiB; the file also has device 0, peak 30.6 MiB: --device N for another)"
    );
    let v = oom_json(&["testdata/multi_device.pickle"]);
    assert_eq!(v["devices"], serde_json::json!([0, 2]));
    assert_eq!(v["device_reason"], "oom");
    // Device 0 has no OOM: its final state, with no request and so no request's stream.
    let text = oom_text(&["testdata/multi_device.pickle", "--device", "0"]);
    assert_eq!(
        text.lines().next().unwrap(),
        "testdata/multi_device.pickle: device 0 (the file also has device 2: --device N for another)"
    );
    assert!(text.contains("no OOM is recorded"), "{text}");
    assert!(!text.contains("request's stream"), "{text}");
    // A file with one device names none; an OOM entry gives the request's stream.
    let text = oom_text(&["testdata/sample.pickle"]);
    assert_eq!(text.lines().next().unwrap(), "testdata/sample.pickle");
    assert!(
        text.contains("largest hole 14.0 MiB (14.0 MiB on the request's stream)\n"),
        "{text}"
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn real_files_name_their_devices_and_no_stream_without_a_request() {
    let data = require_shared_data();
    let path = |rel: &str| data.join(rel).to_str().unwrap().to_string();
    // Three GPUs, the OOM on device 1.
    let f = path("code-location-expandable-oom/memory_snapshot.pickle");
    let text = oom_text(&[&f]);
    assert_eq!(
        text.lines().next().unwrap(),
        format!(
            "{f}: device 1 (the device with the OOM, peak 78.3 GiB; the file also has device 0, peak 7.9 GiB, device 2, peak 20.1 GiB: --device N for another)"
        )
    );
    // Two GPUs, no OOM: the device `timeline` and `segments` pick.
    let f = path("text2sql-expandable-tiny/dump_snapshot.pickle");
    let text = oom_text(&[&f]);
    assert_eq!(
        text.lines().next().unwrap(),
        format!(
            "{f}: device 0 (the device with the largest peak: 8.1 MiB; the file also has device 1, peak 8.1 MiB: --device N for another)"
        )
    );
    let v = oom_json(&[&f]);
    assert_eq!(v["devices"], serde_json::json!([0, 1]));
    assert_eq!(v["device_reason"], "largest_peak");
    assert!(
        text.contains("  free in segments   33.9 MiB; largest hole 16.5 MiB\n"),
        "{text}"
    );
    // No OOM, one device: holes without a request's stream.
    for rel in [
        "cs336-kkaitlyn111/memory_ctx128_fullstep.pickle",
        "attention-2dev-notrace/memory.pickle",
    ] {
        let f = path(rel);
        let text = oom_text(&[&f]);
        assert_eq!(text.lines().next().unwrap(), f, "one device");
        assert!(text.contains("no OOM is recorded"), "{rel}: {text}");
        assert!(!text.contains("request's stream"), "{rel}: {text}");
    }
    let text = oom_text(&[&path("cs336-kkaitlyn111/memory_ctx128_fullstep.pickle")]);
    assert!(
        text.contains("  free in segments   5.8 GiB; largest hole 100.0 MiB\n"),
        "{text}"
    );
}

/// A folder of snapshots is read as its files, in name order, one report each.
#[test]
fn a_folder_of_ranks_gives_one_report_per_file() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["rank1.pickle", "rank0.pickle"] {
        std::fs::copy("testdata/sample.pickle", dir.path().join(name)).unwrap();
    }
    let run = |args: Vec<std::path::PathBuf>| {
        let out = Command::cargo_bin("vramlens")
            .unwrap()
            .arg("oom")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let folder = run(vec![dir.path().to_path_buf()]);
    let files = run(vec![
        dir.path().join("rank0.pickle"),
        dir.path().join("rank1.pickle"),
    ]);
    assert_eq!(folder, files);
    assert_eq!(folder.matches("verdict").count(), 2, "{folder}");
}

/// A file without a trace is analysed as its final state, named so.
#[test]
fn a_file_without_a_trace_is_its_final_state_named_so() {
    let out = Command::cargo_bin("vramlens")
        .unwrap()
        .args(["oom", "testdata/v1_13_list.pickle"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(": final state (no trace recorded)\n"),
        "{text}"
    );
    assert!(!text.contains("after the start"), "{text}");
}

#[test]
fn outside_pytorch_is_split_by_the_message_into_this_process_and_the_others() {
    // Our H200 message: "total capacity of 139.80 GiB of which 31.12 MiB is free.
    // Including non-PyTorch memory, this process has 139.76 GiB memory in use. Of the
    // allocated memory 138.94 GiB is allocated by PyTorch, and 100.84 MiB is reserved by
    // PyTorch but unallocated."
    let gib = |x: f64| (x * (1u64 << 30) as f64).round() as u64;
    let mib = |x: f64| (x * (1u64 << 20) as f64).round() as u64;
    let (total, free, process) = (gib(139.80), mib(31.12), gib(139.76));
    let reserved = gib(138.94) + mib(100.84);
    let v = oom_json(&["--log", "testdata/gpu/oom/oom.log"]);
    let a = &v["analyses"][0];
    assert_eq!(a["reserved_bytes"], reserved);
    assert_eq!(a["outside_allocator_bytes"], total - free - reserved);
    assert_eq!(a["this_process_bytes"], process);
    assert_eq!(a["process_outside_allocator_bytes"], process - reserved);
    assert_eq!(a["other_processes_bytes"], total - free - process);
    let text = oom_text(&["--log", "testdata/gpu/oom/oom.log"]);
    let line = format!(
        "                     {:.1} MiB in this process outside the allocator (CUDA context, libraries), {:.1} MiB in other processes and the driver (the message: this process had 139.8 GiB in use)\n",
        (process - reserved) as f64 / (1u64 << 20) as f64,
        (total - free - process) as f64 / (1u64 << 20) as f64,
    );
    assert!(text.contains(&line), "{line}\n{text}");
    // With the snapshot, the same split against the snapshot's reserved bytes at the OOM.
    let v = oom_json(&[
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--log",
        "testdata/gpu/oom/oom.log",
    ]);
    let a = &v["analyses"][0];
    // The device's free bytes from the oom entry (scripts/expected.py's reading of it),
    // the reserved bytes of the final state (the OOM is the last event).
    let e: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            common::root().join("testdata/gpu/oom/oom_snapshot.pickle.expected.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let free = e["devices"][0]["ooms"][0]["device_free"].as_u64().unwrap();
    let reserved = e["devices"][0]["reserved_bytes"].as_u64().unwrap();
    assert_eq!(a["reserved_bytes"], reserved);
    assert_eq!(a["process_outside_allocator_bytes"], process - reserved);
    assert_eq!(a["other_processes_bytes"], total - free - process);
}

/// The call site of each "from" line and the frames under it: the site's path and line
/// are those of one of its frames, with or without --redact.
fn assert_site_is_one_of_its_frames(text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let mut checked = 0;
    for (i, l) in lines.iter().enumerate() {
        let Some(site) = l.strip_prefix("  from               ") else {
            continue;
        };
        let Some((place, name)) = site.split_once(" in ") else {
            continue;
        };
        let frame = format!("{place}:{name}");
        let frames: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|f| f.starts_with("                     "))
            .map(|f| f.trim())
            .collect();
        assert!(
            frames.contains(&frame.as_str()),
            "{frame} not in {frames:?}"
        );
        checked += 1;
    }
    assert!(checked > 0, "{text}");
}

#[test]
fn the_call_site_reads_as_its_frame_with_and_without_redaction() {
    for redact in [false, true] {
        let mut args = vec!["testdata/multi_device.pickle"];
        if redact {
            args.push("--redact");
        }
        let text = oom_text(&args);
        if redact {
            assert!(!text.contains("alice"), "{text}");
            assert!(
                text.contains("  from               model.py:190 in forward\n"),
                "{text}"
            );
        } else {
            assert!(
                text.contains("  from               nanogpt/model.py:190 in forward\n"),
                "{text}"
            );
        }
        // The redacted site is the redacted frame's path; unredacted, the frame is the
        // full path the short form comes from.
        if redact {
            assert_site_is_one_of_its_frames(&text);
        }
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn a_redacted_torchtitan_oom_names_its_site_as_its_frame() {
    let data = require_shared_data();
    let path = data.join("ccl-bench-torchtitan-fsdp-oom/rank0_memory_snapshot.pickle");
    let text = oom_text(&[path.to_str().unwrap(), "--redact"]);
    assert!(
        text.contains(
            "  from               torchtitan/components/loss.py:21 in cross_entropy_loss\n"
        ),
        "{text}"
    );
    assert_site_is_one_of_its_frames(&text);
    // The same short form as without --redact.
    let plain = oom_text(&[path.to_str().unwrap()]);
    assert!(
        plain.contains(
            "  from               torchtitan/components/loss.py:21 in cross_entropy_loss\n"
        ),
        "{plain}"
    );
}

#[test]
fn device_total_reads_gb_as_powers_of_ten_and_echoes_the_bytes() {
    for (arg, bytes) in [
        ("40GB", 40_000_000_000u64),
        ("40GiB", 40 << 30),
        ("40000000000", 40_000_000_000),
    ] {
        let v = oom_json(&["testdata/sample.pickle", "--device-total", arg]);
        assert_eq!(v["analyses"][0]["device_total_bytes"], bytes, "{arg}");
        assert_eq!(v["analyses"][0]["device_total_source"], "option");
        let text = oom_text(&["testdata/sample.pickle", "--device-total", arg]);
        assert!(
            text.contains(&format!("(from --device-total: {bytes} bytes)\n")),
            "{arg}: {text}"
        );
    }
}

/// One 8 MiB segment with a live 6 MiB block allocated from `file`, and a trace: that
/// allocation, then an OOM asking 1 GiB with 2 MiB free on the device (a capacity OOM).
fn capacity_oom_from(file: &str, dir: &std::path::Path) -> std::path::PathBuf {
    use vramlens::model::frames::Frame;
    use vramlens::model::trace::NewEvent;
    use vramlens::model::{Block, DeviceTrace, Features, Segment, SegmentType, Snapshot};
    const BASE: u64 = 0x7f00_0000_0000;
    const MIB: u64 = 1 << 20;
    let mut snap = Snapshot::default();
    let frame = Frame {
        filename: snap.frames.intern_str(file),
        name: snap.frames.intern_str("forward"),
        line: 7,
    };
    let f = snap.frames.intern_frame(frame);
    let user = Frame {
        filename: snap.frames.intern_str("/home/u/proj/train.py"),
        name: snap.frames.intern_str("step"),
        line: 3,
    };
    let u = snap.frames.intern_frame(user);
    let stack = snap.frames.intern_stack(&[f, u]);
    let mut trace = DeviceTrace::default();
    trace.keys.time_us = true;
    let keys = trace.keys;
    for (i, (action, addr, size)) in [
        (Action::Alloc, BASE, 6 * MIB),
        (Action::Oom, 2 * MIB, 1 << 30),
    ]
    .into_iter()
    .enumerate()
    {
        trace.push(NewEvent {
            action: Some(action),
            addr,
            size,
            time_us: Some(1_750_000_000_000_000 + 10 * i as i64),
            stack: Some(stack),
            ..Default::default()
        });
    }
    snap.segments = vec![Segment {
        device: 0,
        address: BASE,
        total_size: 8 * MIB,
        allocated_size: 6 * MIB,
        active_size: 6 * MIB,
        requested_size: Some(6 * MIB),
        stream: 0,
        segment_type: SegmentType::Large,
        pool_id: Some((0, 0)),
        is_expandable: false,
        stack: None,
        blocks: vec![
            Block {
                address: BASE,
                size: 6 * MIB,
                requested_size: 6 * MIB,
                state: BlockState::ActiveAllocated,
                stack: Some(stack),
            },
            Block {
                address: BASE + 6 * MIB,
                size: 2 * MIB,
                requested_size: 0,
                state: BlockState::Inactive,
                stack: None,
            },
        ],
    }];
    snap.device_traces = vec![trace];
    snap.features = Features {
        device_traces: true,
        block_frames: true,
        segment_pool_id: true,
        segment_requested_size: true,
        entries: keys,
        ..Features::default()
    };
    let path = dir.join("oom.pickle");
    let out = std::fs::File::create(&path).unwrap();
    vramlens::model::encode::write_snapshot(&snap, std::io::BufWriter::new(out)).unwrap();
    path
}

#[test]
fn sharding_is_not_proposed_to_a_job_that_shards_already() {
    let fsdp =
        "/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param.py";
    for (file, sharded) in [("/home/u/proj/model.py", false), (fsdp, true)] {
        let dir = tempfile::tempdir().unwrap();
        let path = capacity_oom_from(file, dir.path());
        let p = path.to_str().unwrap();
        let v = oom_json(&[p]);
        assert_eq!(kinds(&v["analyses"][0])[0], "capacity", "{v}");
        let knobs = v["analyses"][0]["verdicts"][0]["knobs"].to_string();
        let text = oom_text(&[p]);
        if sharded {
            assert_eq!(v["sharding_file"], fsdp);
            assert!(knobs.contains("\"precision_offload\""), "{knobs}");
            assert!(!knobs.contains("sharding"), "{knobs}");
            assert!(!text.contains("sharding (FSDP/ZeRO)"), "{text}");
        } else {
            assert_eq!(v["sharding_file"], serde_json::Value::Null);
            assert!(knobs.contains("\"precision_sharding_offload\""), "{knobs}");
            assert!(text.contains("sharding (FSDP/ZeRO)"), "{text}");
        }
    }
}

/// A command's JSON (it must succeed).
fn command_json(command: &str, path: &str) -> serde_json::Value {
    let out = vramlens().args([command, path, "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{command} {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The settings a what-if proves, the most to spare first: (settings, spare bytes).
fn proven(w: &serde_json::Value) -> Vec<(String, i64)> {
    if w.is_null() || w["model_exact"] != true || w["reproduced"] != true {
        return Vec::new();
    }
    let mut p: Vec<(String, i64)> = w["tries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["lets_through"] == true && t["later_oom_event"].is_null())
        .filter_map(|t| {
            Some((
                t["alloc_conf"].as_str()?.to_string(),
                t["spare_bytes"].as_i64()?,
            ))
        })
        .filter(|(_, sp)| *sp >= 0)
        .collect();
    p.sort_by_key(|(_, sp)| -sp);
    p
}

/// Every recorded OOM gets one answer: where the memory it lacked was, and which setting
/// the replay proves (with its margin), the same in `oom`, `simulate`, `budget` and the
/// report. The cause is also checked against the recording's own figures.
fn one_answer_per_oom(path: &str) {
    let o = command_json("oom", path);
    let a = o["analyses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["source"] == "oom_event")
        .unwrap_or_else(|| panic!("{path}: an oom event"));
    let device = a["device"].as_i64().unwrap();
    // By hand, from the figures at the OOM.
    let live = a["allocated_bytes"].as_u64().unwrap();
    let request = a["requested_bytes"].as_u64().unwrap();
    let reserved = a["reserved_bytes"].as_u64().unwrap();
    // What PyTorch could hold: reserved + device free, or under a memory fraction the
    // replay finds, the most the allocator held under it.
    let could = match a["what_if"]["limit"].as_str() {
        Some("memory_fraction") => a["what_if"]["capacity_bytes"].as_u64().unwrap(),
        _ => a["available_bytes"].as_u64().unwrap(),
    };
    assert_eq!(a["limit_bytes"], could, "{path}");
    let by_hand = if live + request > could {
        "capacity"
    } else if could - reserved >= request {
        "rounding"
    } else {
        "fragmentation"
    };
    assert_eq!(a["shortfall_in"], by_hand, "{path}");
    let fixes = proven(&a["what_if"]);
    // oom's first allocator setting is the replay's best.
    let first_setting = a["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| v["knobs"].as_array().unwrap())
        .find(|k| {
            ["expandable_segments", "max_split_size", "gc_threshold"].contains(&k.as_str().unwrap())
        });
    assert_eq!(
        first_setting.is_some(),
        !fixes.is_empty() || a["what_if"].is_null(),
        "{path}: {a}"
    );

    // simulate: the recorded settings at the recorded capacity, the same cause; the same
    // replays of the settings.
    let s = command_json("simulate", path);
    let d = &s["devices"][0];
    assert_eq!(d["device"], device, "{path}");
    let at_oom = d["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["capacity_source"] == "recorded_oom" && x["baseline"] == true)
        .unwrap_or_else(|| panic!("{path}: the recorded capacity"));
    assert_eq!(at_oom["first_oom"]["cause"], by_hand, "{path}");
    assert_eq!(at_oom["first_oom"]["recorded"], true, "{path}");
    assert_eq!(proven(&d["recorded_oom_what_if"]), fixes, "{path}");

    // budget: the run of that device.
    let b = command_json("budget", path);
    let run = b["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["device"] == device)
        .unwrap();
    assert_eq!(run["oom_shortfall_in"], by_hand, "{path}");
    assert_eq!(proven(&run["oom_what_if"]), fixes, "{path}");

    // The texts: the same sentence of the fix in simulate and budget, and oom's and the
    // report's first fix the same line.
    let text = |cmd: &str| {
        let out = vramlens().args([cmd, path]).output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let oom_text = text("oom");
    if let Some((conf, _)) = fixes.first() {
        let line = format!("try: PYTORCH_CUDA_ALLOC_CONF={conf} lets it through with ");
        assert!(oom_text.contains(&line), "{path}: {oom_text}");
        // The setting and its margin, word for word as oom says them, in simulate and
        // budget too: `PYTORCH_CUDA_ALLOC_CONF=... lets it through with X to spare (P of C)`.
        let at = oom_text.find(&line).unwrap() + "try: ".len();
        let end = at + oom_text[at..].find(')').unwrap() + 1;
        let margin = &oom_text[at..end];
        let said = format!("the fix the replay proves: {margin}");
        assert!(text("simulate").contains(&said), "{path}: {said}");
        assert!(text("budget").contains(&said), "{path}: {said}");
        let dir = tempfile::tempdir().unwrap();
        let html = dir.path().join("r.html");
        vramlens()
            .args(["report", path, "-o", html.to_str().unwrap()])
            .assert()
            .success();
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.contains(&format!("<li>{line}")), "{path}");
    }
}

#[test]
fn fixtures_give_one_answer_per_oom_in_every_command() {
    for f in [
        "testdata/gpu/oom/oom_snapshot.pickle",
        "testdata/gpu/oom_cap/oom_snapshot.pickle",
        "testdata/gpu/oom_exp/oom_snapshot.pickle",
    ] {
        one_answer_per_oom(f);
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn real_ooms_give_one_answer_in_every_command() {
    let data = require_shared_data();
    for f in [
        "ccl-bench-torchtitan-fsdp-oom/rank0_memory_snapshot.pickle",
        "ccl-bench-torchtitan-fsdp-oom/rank1_memory_snapshot.pickle",
        "code-location-expandable-oom/memory_snapshot.pickle",
    ] {
        one_answer_per_oom(data.join(f).to_str().unwrap());
    }
}
