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
    assert!(text.contains("event 322: requested 6.1 GiB"), "{text}");
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
    assert_eq!(v["schema_version"], 2);
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
    bad_input_in("summary", path, message)
}

/// As [`bad_input`], for another command.
fn bad_input_in(command: &str, path: &str, message: &str) {
    let out = vramlens().args([command, path]).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{path}: {stderr}");
    assert!(out.stdout.is_empty(), "{path}: no partial output");
    assert_eq!(stderr.lines().count(), 1, "{path}: one line: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let want = format!("vramlens: error: {path}: {message}");
    assert_eq!(stderr.trim_end(), want);
}

/// Several files read side by side, two of them bad: the error names the first bad one
/// in the order given, however long each takes to fail. The first here fails only after
/// its whole list is read, the second at once (it is empty), so the one to fail first
/// in time is the second.
#[test]
fn of_several_bad_files_the_first_given_is_named() {
    let dir = std::env::temp_dir().join(format!("vramlens-first-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A pickled dict {'x': [1] * 4_000_000}: data, and no memory snapshot.
    let slow = dir.join("a_slow.pickle");
    let mut bytes = vec![0x80, 2, b'}', b'X', 1, 0, 0, 0, b'x', b']'];
    for _ in 0..4_000 {
        bytes.push(b'(');
        for _ in 0..1_000 {
            bytes.extend_from_slice(&[b'K', 1]);
        }
        bytes.push(b'e');
    }
    bytes.extend_from_slice(b"s.");
    std::fs::write(&slow, bytes).unwrap();
    let fast = dir.join("b_empty.pickle");
    std::fs::write(&fast, b"").unwrap();
    for command in ["budget", "top"] {
        for _ in 0..5 {
            let out = vramlens()
                .args([command])
                .arg(&slow)
                .arg(&fast)
                .output()
                .unwrap();
            let stderr = String::from_utf8(out.stderr).unwrap();
            assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
            let want = format!("vramlens: error: {}: ", slow.display());
            assert!(stderr.starts_with(&want), "{command}: {stderr}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn empty_file() {
    bad_input(
        "testdata/bad/empty.pickle",
        "empty file; expected a PyTorch memory snapshot",
    );
}

#[test]
fn device_logs_given_as_snapshots_name_the_commands_that_read_them() {
    let read = "expected a PyTorch memory snapshot (read the log beside one with `vramlens reconcile SNAPSHOT --nvml FILE`, or draw it on a chart with `vramlens timeline SNAPSHOT -o chart.svg --nvml FILE`)";
    // The capture helper's own NVML log (`summary` sums a log up; `top` needs a snapshot).
    bad_input_in(
        "top",
        "testdata/gpu/oom/nvml.jsonl",
        &format!(
            "this is an NVML device log (JSON lines of GPU memory readings, as vramlens_capture.py writes), not a memory snapshot; {read}"
        ),
    );
    // nvidia-smi --format=csv,noheader: no header to give it away.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("gpu.csv");
    std::fs::write(
        &csv,
        "2024/01/01 00:00:00.000, 0, 1234 MiB, 81559 MiB\n2024/01/01 00:00:01.000, 0, 1300 MiB, 81559 MiB\n",
    )
    .unwrap();
    bad_input_in(
        "top",
        csv.to_str().unwrap(),
        &format!("this is an nvidia-smi CSV log, not a memory snapshot; {read}"),
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
fn chrome_trace_is_read_as_a_profiler_trace() {
    let out = vramlens()
        .args(["summary", "--json", "testdata/bad/chrome_trace.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"]["format"], "kineto_trace");
    // Its three [memory] events: Total Allocated 1.5 MiB, 6 MiB, 1.5 MiB; reserved 20 MiB.
    assert_eq!(v["devices"][0]["peak_requested_bytes"], 6_291_456);
    assert_eq!(v["devices"][0]["peak_reserved_bytes"], 20_971_520);
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
    // A folder stands for the snapshot files in it; one without any is an error.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a snapshot").unwrap();
    let path = dir.path().to_str().unwrap().to_string();
    bad_input(
        &path,
        "a folder with no snapshot file (*.pickle, *.pkl, *.pickle.gz, *.json, *.json.gz, *.raw.gz, *.html, or a pickle with no extension)",
    );
    // Folders are read one level deep: snapshots further down are pointed at.
    let run = dir.path().join("run1");
    std::fs::create_dir(&run).unwrap();
    std::fs::create_dir(dir.path().join("logs")).unwrap();
    std::fs::copy(root().join("testdata/sample.pickle"), run.join("s.pickle")).unwrap();
    let out = vramlens().args(["summary", &path]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(
            "; 1 of its subfolders has some (folders are read one level deep): name them, e.g. "
        ),
        "{err}"
    );
    // Named as the hint says, the empty one is passed over and said so.
    let out = vramlens()
        .arg("summary")
        .arg(&run)
        .arg(dir.path().join("logs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("logs: a folder with no snapshot file"),
        "{err}"
    );
    assert!(err.starts_with("vramlens: skipped "), "{err}");
    assert!(String::from_utf8(out.stdout).unwrap().contains("s.pickle"));
}

#[test]
fn missing_file() {
    bad_input("testdata/no_such_file.pickle", "no such file");
}

/// Good files are reported in argument order, then each bad one gives its error line on
/// stderr and the status is 2.
#[test]
fn bad_files_among_good_ones_fail_after_the_good_reports() {
    let good = |args: &[&str]| vramlens().args(args).output().unwrap().stdout;
    let files = [
        "testdata/sample.pickle",
        "testdata/bad/truncated.pickle",
        "testdata/v2_2.pickle",
        "testdata/bad/empty.pickle",
    ];
    for json in [false, true] {
        let mut args = vec!["summary"];
        if json {
            args.push("--json");
        }
        let out = vramlens().args(&args).args(files).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        // The same bytes as the good files alone.
        let mut alone = args.clone();
        alone.extend(["testdata/sample.pickle", "testdata/v2_2.pickle"]);
        assert_eq!(
            String::from_utf8(out.stdout.clone()).unwrap(),
            String::from_utf8(good(&alone)).unwrap()
        );
        if json {
            assert_eq!(out.stdout.iter().filter(|&&b| b == b'\n').count(), 2);
        }
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            "vramlens: error: testdata/bad/truncated.pickle: byte 11991: truncated pickle: \
             expected 1 more byte(s) for an opcode, found end of file\n\
             vramlens: error: testdata/bad/empty.pickle: empty file; expected a PyTorch memory \
             snapshot\n"
        );
    }
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

/// `vramlens ARGS | head ...` with pipefail: the status of the whole pipe and stderr.
fn piped(args: &str, head: &str) -> (bool, String) {
    let bin = assert_cmd::cargo::cargo_bin("vramlens");
    let out = std::process::Command::new("bash")
        .current_dir(root())
        .arg("-c")
        .arg(format!(
            "set -o pipefail; {} {args} | {head} > /dev/null",
            bin.display()
        ))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_pipe_ends_quietly() {
    // Far more than a pipe holds (64 KiB), so the writes after `head` exits fail.
    let files = "testdata/sample.pickle ".repeat(60);
    for args in [
        format!("summary {files}"),
        format!("summary --json {files}"),
    ] {
        for head in ["head -c 10", "head -1"] {
            let (ok, stderr) = piped(&args, head);
            assert!(ok, "{args} | {head}: {stderr}");
            assert_eq!(stderr, "", "{args} | {head}");
        }
    }
    // A reader that is gone before the first write: every command and output kind.
    for args in [
        "summary --json testdata/sample.pickle",
        "timeline testdata/sample.pickle --at peak --json",
        "timeline testdata/sample.pickle --at peak",
        "segments testdata/sample.pickle --json",
        "oom testdata/sample.pickle --json",
        "reconcile testdata/gpu/oom/oom_snapshot.pickle --nvml testdata/gpu/oom/nvml.jsonl --json",
    ] {
        let (ok, stderr) = piped(args, "true");
        assert!(ok, "{args} | true: {stderr}");
        assert_eq!(stderr, "", "{args} | true");
    }
}

#[test]
fn thread_counts_are_bounded() {
    for n in [
        "1025",
        "100000",
        "18446744073709551615",
        "99999999999999999999999",
    ] {
        let out = vramlens()
            .args(["--threads", n, "summary", "testdata/sample.pickle"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--threads {n}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(
            err.contains(&format!("invalid value '{n}' for '--threads <N>'")),
            "{err}"
        );
        assert!(err.contains("1024"), "{err}");
        assert!(out.stdout.is_empty());
    }
    // 0 means the default: one thread per core.
    let default = vramlens()
        .args(["summary", "testdata/multi_device.pickle"])
        .output()
        .unwrap();
    let zero = vramlens()
        .args(["--threads", "0", "summary", "testdata/multi_device.pickle"])
        .output()
        .unwrap();
    assert!(zero.status.success());
    assert_eq!(zero.stdout, default.stdout);
    vramlens()
        .args(["summary", "--threads", "-1", "testdata/sample.pickle"])
        .assert()
        .code(2);
}

// ---------------------------------------------------------------------------------------
// Output files (-o)
// ---------------------------------------------------------------------------------------

/// Runs `args` and returns (status, stderr).
fn status_and_stderr(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    let out = vramlens().args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stderr).unwrap_or_default(),
    )
}

/// The entries of a folder, sorted.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[cfg(unix)]
#[test]
fn links_at_the_output_or_temporary_names_are_never_followed() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let victim = d.join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    // A link at the name the temporary file once had (".NAME.vramlens-tmp").
    symlink(&victim, d.join(".t.svg.vramlens-tmp")).unwrap();
    let t = d.join("t.svg");
    vramlens()
        .args(["timeline", "testdata/sample.pickle", "-o"])
        .arg(&t)
        .assert()
        .success();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(std::fs::symlink_metadata(&t).unwrap().is_file());
    assert!(std::fs::read_to_string(&t).unwrap().starts_with("<?xml"));
    // A link at the output itself, to a file or to nothing: refused, even with --force.
    symlink(&victim, d.join("l.svg")).unwrap();
    symlink(d.join("absent.txt"), d.join("dangling.svg")).unwrap();
    for name in ["l.svg", "dangling.svg"] {
        let o = d.join(name);
        for force in [false, true] {
            for cmd in ["timeline", "segments"] {
                let mut args: Vec<&std::ffi::OsStr> = vec![
                    cmd.as_ref(),
                    "testdata/sample.pickle".as_ref(),
                    "-o".as_ref(),
                ];
                args.push(o.as_os_str());
                if force {
                    args.push("--force".as_ref());
                }
                assert_eq!(
                    status_and_stderr(&args),
                    (
                        Some(2),
                        format!(
                            "vramlens: error: {}: is a symbolic link; vramlens writes only to a new or a regular file\n",
                            o.display()
                        )
                    )
                );
            }
        }
        assert!(std::fs::symlink_metadata(&o).unwrap().is_symlink());
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(!d.join("absent.txt").exists());
    // No temporary file is left behind.
    assert_eq!(
        names(d),
        [
            ".t.svg.vramlens-tmp",
            "dangling.svg",
            "l.svg",
            "t.svg",
            "victim.txt"
        ]
    );
}

#[cfg(unix)]
#[test]
fn devices_fifos_and_directories_are_refused_even_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("p.svg");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let folder = d.join("charts");
    std::fs::create_dir(&folder).unwrap();
    let cases = [
        (
            std::path::PathBuf::from("/dev/null"),
            "is a character device; vramlens writes only to a new or a regular file".to_string(),
        ),
        (
            fifo.clone(),
            "is a named pipe (FIFO); vramlens writes only to a new or a regular file".to_string(),
        ),
        (
            folder.clone(),
            format!(
                "is a directory; give a file name for the chart, such as {}",
                folder.join("chart.svg").display()
            ),
        ),
    ];
    for (target, message) in &cases {
        for force in [false, true] {
            let mut args: Vec<&std::ffi::OsStr> = vec![
                "segments".as_ref(),
                "testdata/sample.pickle".as_ref(),
                "-o".as_ref(),
                target.as_os_str(),
            ];
            if force {
                args.push("--force".as_ref());
            }
            let (code, err) = status_and_stderr(&args);
            assert_eq!(code, Some(2));
            assert_eq!(
                err,
                format!("vramlens: error: {}: {message}\n", target.display())
            );
            assert!(!err.contains("--force"), "{err}");
        }
    }
    assert_eq!(names(d), ["charts", "p.svg"]);
    assert_eq!(names(&folder), Vec::<String>::new());
}

#[test]
fn the_output_is_never_one_of_the_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let original = std::fs::read(root().join("testdata/sample.pickle")).unwrap();
    let snap = d.join("s.svg");
    std::fs::write(&snap, &original).unwrap();
    let (code, err) = status_and_stderr(&[
        "segments".as_ref(),
        snap.as_os_str(),
        "-o".as_ref(),
        snap.as_os_str(),
        "--force".as_ref(),
    ]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        format!(
            "vramlens: error: {0}: is the same file as the input {0}; write the chart to another file\n",
            snap.display()
        )
    );
    // A second name for the same file (a hard link), and a device log given with --nvml.
    let linked = d.join("h.svg");
    std::fs::hard_link(&snap, &linked).unwrap();
    let (code, err) = status_and_stderr(&[
        "timeline".as_ref(),
        snap.as_os_str(),
        "-o".as_ref(),
        linked.as_os_str(),
        "--force".as_ref(),
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("is the same file as the input"), "{err}");
    let log = d.join("nvml.svg");
    std::fs::copy(root().join("testdata/gpu/oom/nvml.jsonl"), &log).unwrap();
    let (code, err) = status_and_stderr(&[
        "timeline".as_ref(),
        "testdata/gpu/oom/oom_snapshot.pickle".as_ref(),
        "--nvml".as_ref(),
        log.as_os_str(),
        "-o".as_ref(),
        log.as_os_str(),
        "--force".as_ref(),
    ]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err,
        format!(
            "vramlens: error: {0}: is the same file as the input {0}; write the chart to another file\n",
            log.display()
        )
    );
    assert_eq!(std::fs::read(&snap).unwrap(), original);
    assert_eq!(
        std::fs::read(&log).unwrap(),
        std::fs::read(root().join("testdata/gpu/oom/nvml.jsonl")).unwrap()
    );
}

#[test]
fn charts_are_written_as_svg_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, message) in [
        (
            "t.png",
            "vramlens writes SVG, not .png; name the file .svg (convert it with a browser or rsvg-convert)",
        ),
        (
            "chart",
            "expected a file name ending in .svg (vramlens writes SVG)",
        ),
        ("missing/t.svg", ""),
    ] {
        let target = d.join(name);
        let message = if message.is_empty() {
            format!("folder {} does not exist", d.join("missing").display())
        } else {
            message.to_string()
        };
        for cmd in ["timeline", "segments"] {
            let (code, err) = status_and_stderr(&[
                cmd.as_ref(),
                "testdata/sample.pickle".as_ref(),
                "-o".as_ref(),
                target.as_os_str(),
                "--force".as_ref(),
            ]);
            assert_eq!(code, Some(2));
            assert_eq!(
                err,
                format!("vramlens: error: {}: {message}\n", target.display())
            );
        }
    }
    assert_eq!(names(d), Vec::<String>::new());
    // Upper case is an SVG name too.
    vramlens()
        .args(["segments", "testdata/sample.pickle", "-o"])
        .arg(d.join("S.SVG"))
        .assert()
        .success();
    assert_eq!(names(d), ["S.SVG"]);
}

// ---------------------------------------------------------------------------------------
// Strings from a file never reach the terminal raw
// ---------------------------------------------------------------------------------------

/// The strings of testdata/hostile_strings.pickle (scripts/gen_fixtures.py, HOSTILE_*).
const HOSTILE_CONF: &str = "expandable_segments:False\x1b[8m,\u{9b}31mhidden\r\x7f";
const HOSTILE_FRAME: &str = "/home/eve/\x1b]8;;https://example.invalid/\x1b\\model\x1b]8;;\x1b\\.py:13:forward\x1b[2J\x1b[H\x1b]0;pwned\x07";

/// The characters that may drive a terminal: C0 but newline and tab, DEL, C1, and the
/// private-use character of vramlens' style markers.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            let n = c as u32;
            (n < 0x20 && c != '\n' && c != '\t') || (0x7f..=0x9f).contains(&n) || c == '\u{e000}'
        })
        .collect()
}

/// What the text output shows for `s`: each control character as visible text.
fn visible(s: &str) -> String {
    s.chars()
        .map(|c| {
            let n = c as u32;
            if (n < 0x20 && c != '\n' && c != '\t') || n == 0x7f {
                format!("\\x{n:02x}")
            } else if (0x80..=0x9f).contains(&n) {
                format!("\\u{{{n:x}}}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn contains_string(v: &serde_json::Value, s: &str) -> bool {
    match v {
        serde_json::Value::String(x) => x.contains(s),
        serde_json::Value::Array(a) => a.iter().any(|x| contains_string(x, s)),
        serde_json::Value::Object(o) => o
            .iter()
            .any(|(k, x)| k.contains(s) || contains_string(x, s)),
        _ => false,
    }
}

#[test]
fn strings_from_a_file_cannot_drive_the_terminal() {
    let file = "testdata/hostile_strings.pickle";
    let text = |args: &[&str]| -> String {
        let out = vramlens().args(args).arg(file).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(raw_controls(&text), [], "{args:?}: {text}");
        text
    };
    let summary = text(&["summary"]);
    assert!(
        summary.contains(&format!(
            "  ALLOC_CONF           {}\n",
            visible(HOSTILE_CONF)
        )),
        "{summary}"
    );
    assert!(
        summary.contains("unknown trace action 'alloc\\x1b[1A\\x1b[2K'"),
        "{summary}"
    );
    let frame = visible(HOSTILE_FRAME);
    assert_eq!(
        frame,
        "/home/eve/\\x1b]8;;https://example.invalid/\\x1b\\model\\x1b]8;;\\x1b\\.py:13:forward\\x1b[2J\\x1b[H\\x1b]0;pwned\\x07"
    );
    for args in [
        &["timeline", "--at", "peak"][..],
        &["timeline", "--at", "oom"],
        &["oom"],
    ] {
        let t = text(args);
        assert!(t.contains(&frame), "{args:?}: {t}");
    }
    text(&["timeline"]);
    text(&["segments"]);
    // JSON keeps the strings exactly, written with \u escapes.
    for args in [
        &["summary", "--json"][..],
        &["timeline", "--json"],
        &["timeline", "--at", "peak", "--json"],
        &["segments", "--json"],
        &["oom", "--json"],
    ] {
        let t = text(args);
        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
        if args[0] == "summary" {
            assert!(contains_string(&v, HOSTILE_CONF), "{t}");
            assert!(t.contains(r"False\u001b[8m,\u009b31mhidden\r\u007f"), "{t}");
        }
        if args.len() > 2 || args[0] == "oom" {
            assert!(
                contains_string(&v, "forward\x1b[2J\x1b[H\x1b]0;pwned\x07"),
                "{t}"
            );
        }
    }
    // The chart is XML: no control character XML forbids.
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("t.svg");
    vramlens()
        .args(["timeline", file, "-o"])
        .arg(&svg)
        .assert()
        .success();
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(
        !svg.chars()
            .any(|c| (c as u32) < 0x20 && !matches!(c, '\n' | '\t' | '\r'))
    );
}

#[cfg(unix)]
#[test]
fn file_names_in_errors_are_shown_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("run\x1b]0;pwned\x07\u{9b}2J.pickle");
    std::fs::write(&bad, b"").unwrap();
    let out = vramlens().arg("summary").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!(
            "vramlens: error: {}/run\\x1b]0;pwned\\x07\\u{{9b}}2J.pickle: empty file; expected a PyTorch memory snapshot\n",
            dir.path().display()
        )
    );
}

/// Each command's `--device` help states the rule the command follows: the README's rule
/// (the first with an OOM, else the largest requested peak) where one device is chosen,
/// every device where all are taken.
#[test]
fn every_device_help_says_the_rule_the_command_follows() {
    let chosen = [
        "top",
        "timeline",
        "segments",
        "flamegraph",
        "report",
        "simulate",
        "check",
        "diff",
    ];
    let every = ["summary", "oom", "reconcile", "export", "budget"];
    let help = |cmd: &str| {
        let out = vramlens().args([cmd, "--help"]).assert().success();
        let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
        // The paragraph of --device, joined across clap's line wrapping.
        let mut lines = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--device <N>"));
        let first = lines.next().expect("a --device option");
        let more = lines.take_while(|l| !l.trim_start().starts_with('-'));
        std::iter::once(first)
            .chain(more)
            .flat_map(str::split_whitespace)
            .collect::<Vec<_>>()
            .join(" ")
    };
    for cmd in chosen {
        let h = help(cmd);
        assert!(
            h.contains("the first with an OOM, else the one whose requested memory peaked highest"),
            "{cmd}: {h}"
        );
    }
    for cmd in every {
        let h = help(cmd);
        assert!(h.contains("(default: every device"), "{cmd}: {h}");
    }
}

/// A size without a unit is bytes; one under a MiB is refused, naming the units meant.
#[test]
fn a_bare_small_size_is_refused_with_the_units_it_meant() {
    for args in [
        &["check", "testdata/sample.pickle", "--max-peak", "20"][..],
        &["oom", "testdata/sample.pickle", "--device-total", "20"][..],
        &["simulate", "testdata/sample.pickle", "--outside", "20"][..],
    ] {
        vramlens()
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("did you mean 20GB or 20GiB?"));
    }
}

/// A `torch.save` file (a zip whose first entry is `<name>/data.pkl`) is named for what
/// it is, with how to record a snapshot; another zip is still to be unpacked.
#[test]
fn a_torch_save_file_is_named_and_the_recording_explained() {
    let dir = tempfile::tempdir().unwrap();
    let zip = |name: &str| {
        // A zip's local file header: signature, 22 bytes of version, flags, method,
        // times, CRC and sizes, then the name's length, the extra field's, the name.
        let mut b = b"PK\x03\x04".to_vec();
        b.extend([0u8; 22]);
        b.extend((name.len() as u16).to_le_bytes());
        b.extend(0u16.to_le_bytes());
        b.extend(name.as_bytes());
        b.extend([0u8; 64]);
        b
    };
    let pt = dir.path().join("model.pt");
    std::fs::write(&pt, zip("model/data.pkl")).unwrap();
    vramlens()
        .args(["summary", pt.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("a file torch.save wrote"))
        .stderr(predicate::str::contains("not a memory snapshot"))
        .stderr(predicate::str::contains("_record_memory_history()"))
        .stderr(predicate::str::contains("unzip").not());
    // The legacy format: a pickle of torch.save's magic number opens the file.
    let legacy = dir.path().join("legacy.pt");
    let mut b = b"\x80\x02\x8a\x0a".to_vec();
    b.extend(&0x1950a86a20f9469cfc6c_u128.to_le_bytes()[..10]);
    b.push(b'.');
    std::fs::write(&legacy, b).unwrap();
    vramlens()
        .args(["summary", legacy.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "a file torch.save wrote (its legacy format",
        ));
    let other = dir.path().join("snapshots.zip");
    std::fs::write(&other, zip("run/snapshot.pickle")).unwrap();
    vramlens()
        .args(["summary", other.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unzip FILE"));
}

/// A folder scan takes what is read when named: gzipped profiler traces (`*.json.gz`)
/// and `export_memory_timeline` files (`*.raw.gz`), as well as snapshots.
#[test]
fn a_folder_scan_reads_gzipped_traces() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let trace = std::fs::read(root().join("testdata/profile/run.trace.json")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&trace).unwrap();
    let gz = gz.finish().unwrap();
    std::fs::write(dir.path().join("worker0.pt.trace.json.gz"), &gz).unwrap();
    let named = vramlens()
        .args(["summary", "--json"])
        .arg(dir.path().join("worker0.pt.trace.json.gz"))
        .output()
        .unwrap();
    assert_eq!(named.status.code(), Some(0));
    let folder = vramlens()
        .args(["summary", "--json"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(
        folder.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&folder.stderr)
    );
    // The folder's one file reads as it does when named.
    let a: serde_json::Value = serde_json::from_slice(&named.stdout).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&folder.stdout).unwrap();
    assert_eq!(a["source"]["format"], "kineto_trace");
    assert_eq!(a["devices"], b["devices"]);
}

/// A profiler trace whose `ts` is a number no clock reaches (1e308) is refused saying
/// which number and what was expected, not "expected a number, found a number".
#[test]
fn a_trace_time_out_of_range_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("far.trace.json");
    std::fs::write(
        &trace,
        r#"{"traceEvents": [{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1e308,
  "args": {"Device Type": 1, "Device Id": 0, "Addr": 139637976727552, "Bytes": 512,
           "Total Allocated": 512, "Total Reserved": 2097152}}]}"#,
    )
    .unwrap();
    let out = vramlens().arg("summary").arg(&trace).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("traceEvents[0].ts: expected a time in microseconds")
            && err.contains("found the number 1e308"),
        "{err}"
    );
    assert!(!err.contains("found a number"), "{err}");
}

/// A trace whose times go backwards (the last event stamped before the first) says so,
/// with both times, instead of a negative span ("+-4 h 10 min").
#[test]
fn a_trace_whose_times_go_backwards_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("backwards.pickle");
    // Two allocations of 512 bytes; the second stamped 4 h 10 min before the first.
    let script = r#"
import pickle, sys
seg = {"device": 0, "address": 1 << 30, "total_size": 2097152, "allocated_size": 0,
       "active_size": 0, "stream": 0, "segment_type": "small", "blocks": [
       {"size": 2097152, "state": "inactive", "address": 1 << 30}]}
t0 = 1750000000000000
ev = lambda a, addr, t: {"action": a, "addr": addr, "size": 512, "stream": 0,
                         "time_us": t, "frames": []}
trace = [ev("segment_alloc", 1 << 30, t0), ev("alloc", 1 << 30, t0),
         ev("free_requested", 1 << 30, t0 - 15000000000),
         ev("free_completed", 1 << 30, t0 - 15000000000)]
trace[0]["size"] = 2097152
pickle.dump({"segments": [seg], "device_traces": [trace]}, open(sys.argv[1], "wb"), protocol=4)
"#;
    let ok = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .status()
        .unwrap();
    assert!(ok.success());
    let out = vramlens().arg("summary").arg(&path).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(
            "2025-06-15 15:06:40.000 UTC .. 2025-06-15 10:56:40.000 UTC (the times go backwards: the last event is stamped 4 h 10 min before the first)"
        ),
        "{text}"
    );
    assert!(!text.contains("+-"), "{text}");
}

#[test]
fn summary_of_a_device_log_alone_gives_peak_mean_and_when_per_gpu_and_process() {
    // Three NVML readings of one 1000 MiB GPU, worked by hand: used 100, 400, 250 MiB
    // (peak 400 MiB at the second reading, mean 250 MiB, lowest 100, last 250); process 42
    // holds 50, 300, 150 MiB (mean 166.67 MiB, rounded down in bytes).
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("nvml.jsonl");
    let mib = 1u64 << 20;
    let mut text = String::new();
    for (k, (used, proc_used)) in [(100, 50), (400, 300), (250, 150)].iter().enumerate() {
        text.push_str(&format!(
            "{{\"time_us\": {}, \"gpu\": 0, \"uuid\": \"GPU-x\", \"total_bytes\": {}, \"used_bytes\": {}, \"free_bytes\": {}, \"processes\": [{{\"pid\": 42, \"used_bytes\": {}}}]}}\n",
            1_700_000_000_000_000i64 + k as i64 * 500_000,
            1000 * mib,
            used * mib,
            (1000 - used) * mib,
            proc_used * mib
        ));
    }
    std::fs::write(&log, text).unwrap();
    let path = log.to_str().unwrap();
    let out = vramlens()
        .args(["summary", "--json", path])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["kind"], "device_log");
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["source"], "nvml");
    let g = &v["gpus"][0];
    assert_eq!(g["gpu"], 0);
    assert_eq!(g["total_bytes"], 1000 * mib);
    assert_eq!(g["used"]["peak_bytes"], 400 * mib);
    assert_eq!(g["used"]["peak_time_us"], 1_700_000_000_500_000i64);
    assert_eq!(g["used"]["mean_bytes"], 250 * mib);
    assert_eq!(g["used"]["lowest_bytes"], 100 * mib);
    assert_eq!(g["used"]["last_bytes"], 250 * mib);
    assert_eq!(g["used"]["readings"], 3);
    let p = &v["processes"][0];
    assert_eq!(p["pid"], 42);
    assert_eq!(p["gpu"], 0);
    assert_eq!(p["used"]["peak_bytes"], 300 * mib);
    assert_eq!(p["used"]["mean_bytes"], 500 * mib / 3);

    let text = String::from_utf8(
        vramlens()
            .args(["summary", path])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone(),
    )
    .unwrap();
    // 1_700_000_000.5 s is 2023-11-14 22:13:20.5 UTC.
    assert!(text.contains("an NVML log of 1 GPU"), "{text}");
    assert!(
        text.contains("400.0 MiB (40.0%)  22:13:20.500  250.0 MiB"),
        "{text}"
    );
    assert!(
        text.contains("42   0    300.0 MiB  22:13:20.500  166.7 MiB"),
        "{text}"
    );
    assert!(
        text.contains("vramlens reconcile SNAPSHOT --nvml"),
        "{text}"
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn summary_of_a_real_nvidia_smi_log_matches_its_rows() {
    // The V100S log, summed here from its own rows: `memory.used [MiB]` is the 7th column.
    let path = root().join("../shared/data/nvsmi-miris-v100s/gpu_log.csv");
    assert!(path.exists(), "needs ../shared/data");
    let csv = std::fs::read_to_string(&path).unwrap();
    let used: Vec<u64> = csv
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            f[6].trim_end_matches(" MiB").parse::<u64>().unwrap() << 20
        })
        .collect();
    let peak = *used.iter().max().unwrap();
    let mean = used.iter().sum::<u64>() / used.len() as u64;
    let out = vramlens()
        .args(["summary", "--json", path.to_str().unwrap()])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let g = &v["gpus"][0]["used"];
    assert_eq!(g["readings"], used.len());
    assert_eq!(g["peak_bytes"], peak);
    assert_eq!(g["mean_bytes"], mean);
    assert_eq!(v["local_times"], true);
}

#[test]
fn utf16_text_given_as_a_snapshot_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.csv");
    let mut bytes = vec![0xff, 0xfe];
    for u in "timestamp, memory.used [MiB]\r\n".encode_utf16() {
        bytes.extend(u.to_le_bytes());
    }
    std::fs::write(&path, bytes).unwrap();
    bad_input_in(
        "top",
        path.to_str().unwrap(),
        "UTF-16 text (as Windows PowerShell writes), not a memory snapshot; expected a PyTorch memory snapshot (a device log or a log of messages in UTF-16 is read where logs are: summary LOG, --nvml, --log)",
    );
}

#[test]
fn a_json_integer_past_64_bits_is_named_as_a_number_not_a_float() {
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root().join("testdata/v2_5.json")).unwrap()).unwrap();
    v["segments"][0]["total_size"] = serde_json::Value::String("BIG".into());
    let text = v.to_string().replace("\"BIG\"", "18446744073709551616");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.json");
    std::fs::write(&path, text).unwrap();
    bad_input(
        path.to_str().unwrap(),
        "segments[0].total_size: expected a non-negative int, found 18446744073709552000, a number past the 64-bit integers",
    );
}
