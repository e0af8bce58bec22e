//! The real binary: outputs, exit codes and the exact error lines for bad input.

mod common;

use assert_cmd::Command;
use common::root;
use predicates::prelude::*;

fn vramlens() -> Command {
    let mut c = Command::cargo_bin("vramlens").unwrap();
    c.current_dir(root()).env_remove("NO_COLOR");
    c
}

#[test]
fn summary_of_the_sample_prints_the_figures() {
    let out = vramlens()
        .args(["summary", "testdata/sample.pickle"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    // Figures from testdata/sample.pickle.expected.json, in binary units.
    assert!(text.contains("device 0"), "{text}");
    assert!(text.contains("reserved             138.0 MiB"), "{text}");
    assert!(text.contains("allocated            115.0 MiB"), "{text}");
    assert!(text.contains("event 325: requested 6.1 GiB"), "{text}");
    assert!(!text.contains('\x1b'), "no colour when not on a terminal");
}

#[test]
fn json_has_the_documented_fields() {
    let out = vramlens()
        .args(["summary", "--json", "testdata/sample.pickle"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["source"]["path"], "testdata/sample.pickle");
    assert_eq!(v["source"]["pickle_protocol"], 4);
    assert_eq!(
        v["source"]["size_bytes"],
        std::fs::metadata(root().join("testdata/sample.pickle"))
            .unwrap()
            .len()
    );
    let d = &v["devices"][0];
    assert_eq!(d["device"], 0);
    assert_eq!(d["reserved_bytes"], 144703488);
    assert_eq!(d["trace"]["events"], 330);
    assert_eq!(d["trace"]["actions"]["oom"], 1);
    assert!(v["warnings"].is_array());
}

#[test]
fn several_files_give_json_lines_in_argument_order() {
    let files = [
        "testdata/v2_2.pickle",
        "testdata/multi_device.pickle",
        "testdata/v1_13_list.pickle",
    ];
    let out = vramlens()
        .arg("summary")
        .arg("--json")
        .args(files)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let paths: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["source"]["path"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(paths, files);
}

#[test]
fn device_option_filters_devices() {
    let out = vramlens()
        .args([
            "summary",
            "--json",
            "--device",
            "2",
            "testdata/multi_device.pickle",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let devices: Vec<i64> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_i64().unwrap())
        .collect();
    assert_eq!(devices, [2]);
}

#[test]
fn output_is_identical_with_one_and_many_threads() {
    let args = [
        "summary",
        "--json",
        "testdata/sample.pickle",
        "testdata/multi_device.pickle",
        "testdata/v2_14_host_p5.pickle",
        "testdata/v2_5.json",
    ];
    let one = vramlens()
        .args(["--threads", "1"])
        .args(args)
        .output()
        .unwrap();
    let many = vramlens()
        .args(["--threads", "4"])
        .args(args)
        .output()
        .unwrap();
    assert!(one.status.success());
    assert_eq!(one.stdout, many.stdout);
    let text_one = vramlens()
        .args(["--threads", "1", "summary", "testdata/multi_device.pickle"])
        .output()
        .unwrap();
    let text_many = vramlens()
        .args(["--threads", "3", "summary", "testdata/multi_device.pickle"])
        .output()
        .unwrap();
    assert_eq!(text_one.stdout, text_many.stdout);
}

/// Runs `summary` on a bad input: exit 2, nothing on stdout, exactly one line on stderr
/// that names the file and says what was expected, and no panic.
fn bad_input(path: &str, message: &str) {
    let out = vramlens().args(["summary", path]).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{path}: {stderr}");
    assert!(out.stdout.is_empty(), "{path}: no partial output");
    assert_eq!(stderr.lines().count(), 1, "{path}: one line: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let want = format!("vramlens: error: {path}: {message}");
    assert_eq!(stderr.trim_end(), want);
}

#[test]
fn empty_file() {
    bad_input(
        "testdata/bad/empty.pickle",
        "empty file; expected a PyTorch memory snapshot",
    );
}

#[test]
fn truncated_pickle() {
    bad_input(
        "testdata/bad/truncated.pickle",
        "byte 11991: truncated pickle: expected 1 more byte(s) for an opcode, found end of file",
    );
}

#[test]
fn random_bytes() {
    bad_input(
        "testdata/bad/random.bin",
        "not a pickle, gzip or JSON file (starts with bytes 38 b4 e6 52); expected a PyTorch memory snapshot",
    );
}

#[test]
fn list_of_ints() {
    bad_input(
        "testdata/bad/list_of_ints.pickle",
        "(root): not a memory snapshot: expected a dict with 'segments' or a list of segment dicts, found a list whose first item is int 0",
    );
}

#[test]
fn dict_of_tensor_metadata() {
    bad_input(
        "testdata/bad/tensor_meta.pickle",
        "(root): not a memory snapshot: expected a dict with 'segments', found a dict with keys 'layer.weight', 'layer.bias', 'embed.weight'",
    );
}

#[test]
fn code_in_a_pickle_is_refused_and_never_runs() {
    let marker = std::path::Path::new("/tmp/vramlens_pwned");
    let _ = std::fs::remove_file(marker);
    bad_input(
        "testdata/bad/os_system.pickle",
        "byte 2: not a data-only pickle: opcode GLOBAL; vramlens never runs code from a file",
    );
    assert!(!marker.exists(), "the payload must not run");
}

#[test]
fn wrong_type_names_the_key_path() {
    bad_input(
        "testdata/bad/wrong_type.pickle",
        "device_traces[0][17].size: expected a non-negative int, found str \"4096\"",
    );
}

#[test]
fn segments_of_the_wrong_type() {
    bad_input(
        "testdata/bad/segments_not_list.pickle",
        "segments: expected a list of segments, found int 42",
    );
}

#[test]
fn chrome_trace_is_named() {
    bad_input(
        "testdata/bad/chrome_trace.json",
        "this is a Chrome/Kineto profiler trace (JSON with traceEvents), not a memory snapshot; expected a PyTorch memory snapshot (read its [memory] events beside a snapshot with `vramlens reconcile SNAPSHOT --nvml LOG --trace FILE`)",
    );
}

#[test]
fn lists_nested_a_million_deep() {
    bad_input(
        "testdata/bad/deep_nesting.pickle.gz",
        "byte 1001001: more than 1000 levels of nesting",
    );
}

#[test]
fn memo_reference_never_stored() {
    bad_input(
        "testdata/bad/bad_memo.pickle",
        "byte 24: memo reference 7 to an index that was never stored",
    );
}

#[test]
fn directory() {
    bad_input("testdata", "is a directory; expected a snapshot file");
}

#[test]
fn missing_file() {
    bad_input("testdata/no_such_file.pickle", "no such file");
}

#[test]
fn a_bad_file_among_good_ones_fails_without_partial_output() {
    let out = vramlens()
        .args([
            "summary",
            "--json",
            "testdata/sample.pickle",
            "testdata/bad/truncated.pickle",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}

#[test]
fn usage_errors_exit_2() {
    vramlens()
        .args(["summary"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("SNAPSHOT"));
    vramlens().args(["nonsense"]).assert().code(2);
}

#[test]
fn a_memory_viz_page_is_read_like_the_snapshot_inside() {
    let json = |file: &str| -> serde_json::Value {
        let out = vramlens()
            .args(["summary", "--json", file])
            .output()
            .unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let page = json("testdata/sample_viz.html");
    let pickle = json("testdata/sample.pickle");
    assert_eq!(page["source"]["format"], "html");
    assert_eq!(page["source"]["pickle_protocol"], 4);
    assert_eq!(page["devices"], pickle["devices"]);
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("page.html");
    std::fs::write(&bare, "<!DOCTYPE html>\n<html><body>hello</body></html>\n").unwrap();
    let out = vramlens().arg("summary").arg(&bare).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("an HTML page without an embedded snapshot")
    );
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let bin = assert_cmd::cargo::cargo_bin("vramlens");
    let files = "testdata/sample.pickle ".repeat(40);
    let out = std::process::Command::new("bash")
        .current_dir(root())
        .arg("-c")
        .arg(format!(
            "set -o pipefail; {} summary {files} | head -c 10 > /dev/null",
            bin.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
