//! `vramlens simulate`: the real binary on the hand-written allocator fixtures (whose
//! answers are worked out in scripts/gen_allocator_fixtures.py) and on bad input.

mod common;

use assert_cmd::Command;
use common::root;
use predicates::prelude::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn vramlens() -> Command {
    let mut c = Command::cargo_bin("vramlens").unwrap();
    c.current_dir(root()).env_remove("NO_COLOR");
    c
}

fn json(args: &[&str]) -> Value {
    let out = vramlens()
        .arg("simulate")
        .args(args)
        .arg("--json")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn the_oom_fixture_at_its_own_capacity_and_with_expandable_segments() {
    let v = json(&[
        "testdata/allocator/oom_retry.pickle",
        "--alloc-conf",
        "expandable_segments:True",
        "--outside",
        "0",
    ]);
    assert_eq!(v["schema_version"], 2);
    let d = &v["devices"][0];
    let id = &d["identity"];
    assert_eq!(id["allocations"], 4);
    assert_eq!(id["allocations_at_recorded_address"], 4);
    assert_eq!(id["segment_events"], 4);
    assert_eq!(id["segment_events_reproduced"], 4);
    assert_eq!(id["first_divergence"], Value::Null);
    let sc = d["scenarios"].as_array().unwrap();
    assert_eq!(sc.len(), 2);
    // The recorded settings at the capacity the OOM implies (90 + 30 MiB).
    assert_eq!(sc[0]["baseline"], true);
    assert_eq!(sc[0]["alloc_conf"], "");
    assert_eq!(sc[0]["capacity_source"], "recorded_oom");
    assert_eq!(sc[0]["capacity_bytes"], 120 * MIB);
    assert_eq!(sc[0]["first_oom"]["event"], 12);
    assert_eq!(sc[0]["first_oom"]["request_bytes"], 40 * MIB);
    assert_eq!(sc[0]["first_oom"]["cause"], "fragmentation");
    assert_eq!(sc[0]["first_oom"]["recorded"], true);
    assert_eq!(sc[0]["min_capacity_bytes"], 130 * MIB);
    // Expandable segments fit at the same capacity.
    assert_eq!(sc[1]["alloc_conf"], "expandable_segments:True");
    assert_eq!(sc[1]["first_oom"], Value::Null);
    assert_eq!(sc[1]["peak_reserved_bytes"], 120 * MIB);
    // The fixture's last entry is the OOM (scripts/gen_allocator_fixtures.py): what the
    // run asks for after it is not recorded.
    assert_eq!(d["stops_at_oom"], true);
}

/// A recording that does not end at an OOM says nothing of one; one that does says a
/// scenario that gets past it ran only what was recorded.
#[test]
fn only_a_recording_that_ends_at_an_oom_is_said_to_stop_there() {
    let v = json(&["testdata/allocator/split_rules.pickle"]);
    assert_eq!(v["devices"][0]["stops_at_oom"], false);
    let text = |file: &str| {
        let out = vramlens()
            .args(["simulate", file, "--alloc-conf", "expandable_segments:True"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        String::from_utf8(out).unwrap()
    };
    let plain = text("testdata/allocator/split_rules.pickle");
    assert!(!plain.contains("stops there"), "{plain}");
    assert!(!plain.contains("ends at the request"), "{plain}");
    let oom = text("testdata/allocator/oom_retry.pickle");
    assert!(
        oom.contains("would have been allocated, but the recording stops there: what the run asks for after it is not known"),
        "{oom}"
    );
    assert!(
        oom.contains(
            "the recording ends at the request it ran out of memory on, so only that far):"
        ),
        "{oom}"
    );
}

#[test]
fn text_leads_with_the_check_and_the_answers() {
    let out = vramlens()
        .args([
            "simulate",
            "testdata/allocator/oom_retry.pickle",
            "--alloc-conf",
            "expandable_segments:True",
            "--outside",
            "0",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("check      the model replays the recording exactly: 4 of 4 allocations at their recorded address, 4 of 4 segment events, 1 of 1 out-of-memory errors; peak reserved 90.0 MiB as recorded"),
        "{text}"
    );
    assert!(text.contains("at the capacity the recorded OOM implies (120.0 MiB: 90.0 MiB reserved + 30.0 MiB the device had free then):"), "{text}");
    assert!(
        text.contains("with the recorded settings (defaults): runs out of memory at event 12"),
        "{text}"
    );
    assert!(text.contains("as recorded; fragmentation"), "{text}");
    assert!(text.contains("with expandable_segments:True: fits: peak reserved 120.0 MiB (50.0 MiB of it cache and fragmentation); the request the recording ran out of memory on would have been allocated"), "{text}");
    assert!(
        !text.contains("placed first"),
        "nothing was alive before recording: {text}"
    );
}

#[test]
fn gpus_capacity_less_outside_and_the_start_that_does_not_fit() {
    // A 100 MiB device with 60 MiB outside leaves 40: the first 40 MiB fits, the second not.
    let v = json(&[
        "testdata/allocator/oom_retry.pickle",
        "--gpu",
        "100MiB",
        "--outside",
        "60MiB",
        "--no-min-capacity",
    ]);
    let s = &v["devices"][0]["scenarios"][0];
    assert_eq!(s["capacity_source"], "gpu");
    assert_eq!(s["capacity_bytes"], 100 * MIB);
    assert_eq!(s["allocator_capacity_bytes"], 40 * MIB);
    assert_eq!(s["first_oom"]["event"], 3);
    assert_eq!(s["first_oom"]["cause"], "capacity");
    assert_eq!(s["min_capacity_bytes"], Value::Null);
    assert_eq!(v["devices"][0]["outside"]["source"], "given");
}

#[test]
fn the_chart_is_an_svg_and_is_not_overwritten_without_force() {
    let dir = tempdir();
    let svg = dir.join("sim.svg");
    vramlens()
        .args(["simulate", "testdata/allocator/expandable.pickle", "-o"])
        .arg(&svg)
        .args(["--alloc-conf", "expandable_segments:False"])
        .assert()
        .success();
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(text.contains("recorded"));
    vramlens()
        .args(["simulate", "testdata/allocator/expandable.pickle", "-o"])
        .arg(&svg)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("already exists; use --force"));
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("vramlens-simulate-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn bad_input_one_line_exit_2() {
    vramlens()
        .args([
            "simulate",
            "testdata/allocator/oom_retry.pickle",
            "--alloc-conf",
            "max_split_size_mb:20",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::diff(
            "vramlens: error: --alloc-conf \"max_split_size_mb:20\": PyTorch 2.4-2.9 refuses it: CachingAllocator option max_split_size_mb too small, must be > 20\n",
        ));
    vramlens()
        .args([
            "simulate",
            "testdata/allocator/oom_retry.pickle",
            "--alloc-conf",
            "backend:cudaMallocAsync",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("another allocator"));
    vramlens()
        .args(["simulate", "testdata/v1_13_list.pickle"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("nothing to simulate"));
    vramlens()
        .args([
            "simulate",
            "testdata/allocator/oom_retry.pickle",
            "--torch",
            "1.13",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "expected a PyTorch release from 2.0 on",
        ));
    vramlens()
        .args([
            "simulate",
            "testdata/allocator/oom_retry.pickle",
            "--gpu",
            "h900",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown GPU"));
    // The release named decides the parse: 2.10 takes 20.
    vramlens()
        .args([
            "simulate",
            "testdata/allocator/oom_retry.pickle",
            "--torch",
            "2.10",
            "--alloc-conf",
            "max_split_size_mb:20",
        ])
        .assert()
        .success();
}

#[test]
fn one_thread_and_many_give_the_same_bytes() {
    let run = |threads: &str| {
        vramlens()
            .args([
                "--threads",
                threads,
                "simulate",
                "testdata/sample.pickle",
                "--json",
                "--gpu",
                "200MiB",
                "--gpu",
                "1GiB",
                "--alloc-conf",
                "expandable_segments:True",
                "--alloc-conf",
                "max_split_size_mb:64",
            ])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone()
    };
    assert_eq!(run("1"), run("4"));
}

/// A fragmentation OOM on a device too small for the run's live tensors says that
/// removing the fragmentation would not save it, from the recording's own peak of live
/// tensor bytes (the official viewer's timeline maximum, which `summary` gives); one
/// whose live tensors fit the device does not say it.
#[test]
#[ignore = "needs ../shared/data"]
fn a_fragmentation_oom_on_a_device_the_live_tensors_outgrow_says_so() {
    let data = common::require_shared_data();
    let small = data.join("cs336-cliffkai/memory_snapshot_xl_bwd.pickle");
    let small = small.to_str().unwrap();
    let sim = json(&[small, "--gpu", "l4", "--no-min-capacity"]);
    let summary = common::summary_json(std::path::Path::new(small));
    let peak = summary["devices"][0]["peak_requested_bytes"]
        .as_u64()
        .unwrap();
    let d = &sim["devices"][0];
    assert_eq!(d["identity"]["peak_requested_bytes"].as_u64(), Some(peak));
    let s = &d["scenarios"][0];
    assert_eq!(s["first_oom"]["cause"], "fragmentation");
    assert!(peak > s["allocator_capacity_bytes"].as_u64().unwrap());
    vramlens()
        .args(["simulate", small, "--gpu", "l4", "--no-min-capacity"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "; even without fragmentation it would run out later: the live tensors alone reach 37.3 GiB in the recording, more than the 21.0 GiB the allocator may hold",
        ));
    // At the capacity its own OOM implies (38.3 GiB), the torchtitan rank's live tensors
    // fit: its fragmentation is the whole story.
    let rank = data.join("ccl-bench-torchtitan-fsdp-oom/rank0_memory_snapshot.pickle");
    vramlens()
        .args(["simulate", rank.to_str().unwrap(), "--no-min-capacity"])
        .assert()
        .success()
        .stdout(predicate::str::contains("fragmentation: 34.5 GiB reserved"))
        .stdout(predicate::str::contains("even without fragmentation").not());
}

/// The simulate chart of the cliffkai XL backward step on an L4 and on `gpu`, written to
/// `name` in a fresh folder.
fn cliffkai_xl_chart(name: &str, gpu: &str) -> String {
    let data = common::require_shared_data();
    let file = data.join("cs336-cliffkai/memory_snapshot_xl_bwd.pickle");
    let out = tempdir().join(name);
    vramlens()
        .args([
            "simulate",
            file.to_str().unwrap(),
            "--gpu",
            "l4",
            "--gpu",
            gpu,
        ])
        .args(["--no-min-capacity", "--force", "-o"])
        .arg(&out)
        .assert()
        .success();
    std::fs::read_to_string(&out).unwrap()
}

/// Each GPU has its own panel, its capacity in the heading: on an L4 and an A100 40GB the
/// XL backward step runs out of memory late in the trace (events 20,952 and 22,433 of
/// 24,263), each marked in its own panel where no label is.
#[test]
#[ignore = "needs ../shared/data"]
fn each_gpu_has_its_panel_and_its_oom_marked_in_it() {
    let svg = cliffkai_xl_chart("late_ooms.svg", "a100-40gb");
    // One panel per GPU, its capacity in its heading, left: no OOM marker can fall under
    // it; each marker is in its own GPU's panel, under the heading.
    let y_of = |tag: &str| -> f64 {
        let y = tag.split(r#" y=""#).nth(1).unwrap();
        y[..y.find('"').unwrap()].parse().unwrap()
    };
    // Each GPU's panel, then its zoom on the entries before its OOM.
    let mut tops = Vec::new();
    for label in [
        "on L4 24GB: 21.0 GiB for the allocator",
        "on L4 24GB: 21.0 GiB for the allocator: zoom on entries",
        "on A100 40GB: 38.4 GiB for the allocator",
        "on A100 40GB: 38.4 GiB for the allocator: zoom on entries",
    ] {
        let at = svg
            .find(&format!(">{label}"))
            .unwrap_or_else(|| panic!("{label} not in the chart"))
            + 1;
        let open = svg[..at].rfind("<text").unwrap();
        let tag = &svg[open..at];
        assert!(
            tag.contains(r#"x="80""#) && tag.contains(r#"text-anchor="start""#),
            "{tag}"
        );
        tops.push(y_of(tag));
    }
    let marks: Vec<f64> = svg
        .match_indices("✕ OOM")
        .map(|(at, _)| y_of(&svg[svg[..at].rfind("<text").unwrap()..at]))
        .collect();
    assert_eq!(marks.len(), 4, "{marks:?}");
    for k in 0..4 {
        assert!(tops[k] < marks[k], "{tops:?} {marks:?}");
        if k + 1 < 4 {
            assert!(marks[k] < tops[k + 1], "{tops:?} {marks:?}");
        }
    }
}

/// An OOM at the end of a long trace gets a zoom panel on the entries before it, where
/// it stands clear of the edge: 4,410 entries, the OOM at entry 4,409; the zoom shows the
/// twentieth before it (220 entries, 4,189 on) and an eighth of that after (27), so the
/// OOM's line is at 80 + 856 x 221 / 248 = 842.8 of the 936 the plot reaches.
#[test]
fn an_oom_at_the_end_of_a_long_trace_gets_a_zoom_clear_of_the_edge() {
    let out = tempdir().join("zoom.svg");
    vramlens()
        .args([
            "simulate",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--force",
            "-o",
        ])
        .arg(&out)
        .assert()
        .success();
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(
        svg.contains("zoom on entries 4,189 to 4,409, before the first OOM"),
        "{svg}"
    );
    let oom_lines: Vec<f64> = svg
        .match_indices(r#"stroke-dasharray="2,3""#)
        .map(|(at, _)| {
            let tag = &svg[svg[..at].rfind("<line").unwrap()..at];
            let x = tag.split(r#"x1=""#).nth(1).unwrap();
            x[..x.find('"').unwrap()].parse().unwrap()
        })
        .collect();
    assert_eq!(oom_lines, vec![936.0, 842.8]);
}

/// The allocator profile a release falls in, from the spec's table of releases whose
/// allocator differs (caching-allocator.md 1.1-1.6 and 4.3): 2.0-2.3, 2.4-2.9, 2.10, 2.11+.
fn profile_of_release(release: &str) -> &'static str {
    let mut parts = release.split('.').map(|p| p.parse::<u32>().unwrap());
    let (major, minor) = (parts.next().unwrap(), parts.next().unwrap());
    match (major, minor) {
        (1, _) | (2, 0..=3) => "2.0",
        (2, 4..=9) => "2.4",
        (2, 10) => "2.10",
        _ => "2.11",
    }
}

/// One guess of a file's release: `simulate` models the allocator of the earliest release
/// `summary` says the file's fields allow, and reports the same range.
fn one_guess(path: &str) {
    let out = vramlens()
        .args(["summary", "--json", path])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let summary: Value = serde_json::from_slice(&out).unwrap();
    let out = vramlens()
        .args(["simulate", "--json", path])
        .output()
        .unwrap();
    if !out.status.success() {
        return; // nothing to simulate (no trace of allocations)
    }
    let sim: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sim["layout"], summary["layout"], "{path}");
    let min = summary["layout"]["min_release"].as_str().unwrap();
    for d in sim["devices"].as_array().unwrap() {
        assert_eq!(d["profile"], profile_of_release(min), "{path}: {min}");
        assert_eq!(d["profile_guessed"], true);
    }
}

#[test]
fn the_model_follows_the_release_summary_guesses() {
    for f in [
        "testdata/sample.pickle",
        "testdata/v2_1.pickle",
        "testdata/v2_3_settings.pickle",
        "testdata/v2_8_compile.pickle",
        "testdata/v2_10_meta.pickle",
        "testdata/v2_12_pool.pickle",
        "testdata/v2_14_host_p5.pickle",
        "testdata/gpu/oom/oom_snapshot.pickle",
    ] {
        one_guess(f);
    }
    // A 2.12 file is modelled as 2.11 and later, not as 2.10.
    let v = json(&["testdata/v2_12_pool.pickle"]);
    assert_eq!(v["devices"][0]["profile"], "2.11");
}

#[test]
#[ignore = "needs ../shared/data"]
fn the_model_follows_the_release_summary_guesses_on_real_files() {
    let data = root().join("../shared/data");
    assert!(data.exists(), "needs ../shared/data");
    let mut n = 0;
    for dir in std::fs::read_dir(&data).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
            .collect();
        files.sort();
        for f in files.iter().take(2) {
            one_guess(f.to_str().unwrap());
            n += 1;
        }
    }
    assert!(n > 20, "{n} files");
}

/// What the chart draws is bounded by its pixels: a 4 MB recording of 24,264 entries
/// replayed on two GPUs (four panels with the zooms) draws a few points per pixel column,
/// not one per entry.
#[test]
#[ignore = "needs ../shared/data"]
fn the_chart_of_a_long_recording_stays_small() {
    let svg = cliffkai_xl_chart("long.svg", "h100");
    // Each polyline: at most 4 points per half-pixel column of the 856 px plot.
    for line in svg.lines().filter(|l| l.contains("<polyline")) {
        let points = line.split(r#"points=""#).nth(1).unwrap();
        let n = points[..points.find('"').unwrap()].split(' ').count();
        assert!(n <= 4 * 2 * 857, "{n} points");
    }
    assert!(svg.len() < 200_000, "{} bytes", svg.len());
}

/// A memory fraction is a share of the device's total: at the capacity a recorded OOM
/// implies (no total in the recording) it cannot act, and the answer says so rather than
/// print the recorded settings' answer under the fraction's name; with a GPU named it acts.
#[test]
fn a_memory_fraction_without_a_device_total_is_said_not_applied() {
    let v = json(&[
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--alloc-conf",
        "per_process_memory_fraction:0.5",
        "--no-min-capacity",
    ]);
    let sc = v["devices"][0]["scenarios"].as_array().unwrap();
    assert_eq!(sc[0]["fraction_inactive"], false);
    assert_eq!(sc[1]["alloc_conf"], "per_process_memory_fraction:0.5");
    assert_eq!(sc[1]["capacity_source"], "recorded_oom");
    assert_eq!(sc[1]["fraction_inactive"], true);
    let text = vramlens()
        .args([
            "simulate",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--alloc-conf",
            "per_process_memory_fraction:0.5",
            "--no-min-capacity",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("(not applied: a memory fraction is a share of the device's total memory"),
        "{text}"
    );
    // On an H100 80GB the fraction is half of its memory: it acts.
    let v = json(&[
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--alloc-conf",
        "per_process_memory_fraction:0.5",
        "--gpu",
        "h100",
        "--no-min-capacity",
    ]);
    let sc = v["devices"][0]["scenarios"].as_array().unwrap();
    assert!(sc.iter().all(|s| s["fraction_inactive"] == false), "{v}");
}
