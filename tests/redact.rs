//! `vramlens redact` end to end: every fixture (and, when present, every real snapshot in
//! `../shared/data`) is redacted, then
//! (a) `scripts/check_redacted.py` opens the result with Python's own pickle and checks,
//!     independently of vramlens, that every number and every key is where it was, that
//!     frames map one to one, and that no home folder or user name it finds in the
//!     original is left;
//! (b) `summary --json` gives the same figures as for the original (only `source`, the
//!     file's own description, differs);
//! (c) `--strip-code` hashes function names and line numbers and keeps frames distinct;
//! (d) `--show` lists the changes and writes nothing;
//! and the output is never written over the input or over a file without `--force`.
//!
//! The many-file tests check their files on a few threads, read each original once for
//! all its checks, and start Python once per share of the files (`--pairs`), not per file.

mod common;

use assert_cmd::Command;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use vramlens::analysis::reports::summary::{SummaryOptions, analyze_summary};
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::model::FrameId;

fn vramlens() -> Command {
    Command::cargo_bin("vramlens").unwrap()
}

/// The fixtures that are snapshots (testdata/README.md), in every input form.
fn fixtures() -> Vec<PathBuf> {
    let root = common::root().join("testdata");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            p.is_file() && !name.ends_with(".expected.json") && name != "README.md"
        })
        .collect();
    for job in ["ok", "oom", "oom_cap", "oom_exp"] {
        for entry in std::fs::read_dir(root.join("gpu").join(job)).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "pickle") {
                files.push(p);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 20, "fixtures not found: {files:?}");
    files
}

fn real_snapshots() -> Vec<PathBuf> {
    let data = common::shared_data().expect("../shared/data is missing");
    let mut files = Vec::new();
    for dir in std::fs::read_dir(&data).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            let name = f.to_string_lossy().to_string();
            if name.ends_with(".pickle") || name.ends_with(".pkl") {
                files.push(f);
            }
        }
    }
    files.sort();
    assert!(!files.is_empty(), "no snapshot in ../shared/data");
    files
}

fn python3() -> bool {
    let found = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok();
    if !found {
        println!("SKIPPED: python3 not found; redacted files were not opened with Python");
    }
    found
}

/// Runs the independent Python check; gives its JSON line.
fn python_check(original: &Path, redacted: &Path, strip_code: bool) -> Value {
    let script = common::root().join("scripts/check_redacted.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(&script).arg(original).arg(redacted);
    if strip_code {
        cmd.arg("--strip-code");
    }
    let out = cmd.output().expect("python3 runs");
    assert!(
        out.status.success(),
        "{} -> {}: {}",
        original.display(),
        redacted.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The Python check of many `(original, redacted, strip_code)` pairs: a few Python
/// processes side by side, each started once for its share (`--pairs`); the reports in
/// the pairs' order. Any failure fails the test with the script's message.
fn python_check_all(pairs: &[(PathBuf, PathBuf, bool)]) -> Vec<Value> {
    use std::io::Write;
    let script = common::root().join("scripts/check_redacted.py");
    let shares = workers().min(pairs.len());
    let run_share = |share: usize| -> Vec<(usize, Value)> {
        // Every `shares`-th pair, so that the large files (next to each other in name
        // order) are spread over the processes.
        let mine: Vec<usize> = (share..pairs.len()).step_by(shares).collect();
        let mut child = std::process::Command::new("python3")
            .arg(&script)
            .arg("--pairs")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut lines = String::new();
        for &i in &mine {
            let (original, redacted, strip_code) = &pairs[i];
            lines.push_str(&format!("{}\t{}", original.display(), redacted.display()));
            if *strip_code {
                lines.push_str("\t--strip-code");
            }
            lines.push('\n');
        }
        child
            .stdin
            .take()
            .unwrap()
            .write_all(lines.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let reports: Vec<Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(reports.len(), mine.len());
        mine.into_iter().zip(reports).collect()
    };
    let mut reports: Vec<(usize, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..shares)
            .map(|share| scope.spawn(move || run_share(share)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    reports.sort_by_key(|(i, _)| *i);
    reports.into_iter().map(|(_, r)| r).collect()
}

/// Threads for checks of many files.
fn workers() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 8)
}

/// The summary without `source`, and `source` apart.
fn figures(path: &Path) -> (Value, Value) {
    let mut s = common::summary_json(path);
    let source = s.as_object_mut().unwrap().remove("source").unwrap();
    (s, source)
}

/// An original snapshot read once: its summary figures (without `source`) and its model,
/// for the checks of each of its redactions.
struct Original {
    path: PathBuf,
    figures: Value,
    snapshot: vramlens::model::Snapshot,
}

impl Original {
    fn read(path: &Path) -> Original {
        let (snapshot, figures, _) = read_with_figures(path);
        Original {
            path: path.to_path_buf(),
            figures,
            snapshot,
        }
    }
}

/// A snapshot read once, with [`figures`] of it (the summary without `source`, and
/// `source`), as `summary --json` gives them.
fn read_with_figures(path: &Path) -> (vramlens::model::Snapshot, Value, Value) {
    let (snapshot, info) = read_snapshot(path, ReadOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut figures =
        serde_json::to_value(analyze_summary(&snapshot, &info, SummaryOptions::default())).unwrap();
    let source = figures.as_object_mut().unwrap().remove("source").unwrap();
    (snapshot, figures, source)
}

/// Runs `check` on every file on a few threads, giving the results in the files' order.
/// The files are independent and each check is the one a loop would run: an assertion
/// that fails in a thread fails the test with its message.
fn each_file<T: Send>(files: &[PathBuf], check: impl Fn(usize, &Path) -> T + Sync) -> Vec<T> {
    let threads = workers();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<T>>> =
        files.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(f) = files.get(i) else { break };
                    let r = check(i, f);
                    *results[i].lock().unwrap() = Some(r);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.into_inner().unwrap().unwrap())
        .collect()
}

/// Redacts `input` into `dir` with `args`, runs checks (a) and (b), gives the output
/// path and the Python check's report (null without python3).
fn redact_and_check(input: &Path, dir: &Path, args: &[&str], python: bool) -> (PathBuf, Value) {
    let (before, _) = figures(input);
    let (out, checked, _) = redact_and_check_against(input, &before, dir, args, python);
    (out, checked)
}

/// [`redact_and_check`] with the original's figures already worked out; gives the
/// redacted snapshot as read for check (b) too.
fn redact_and_check_against(
    input: &Path,
    before: &Value,
    dir: &Path,
    args: &[&str],
    python: bool,
) -> (PathBuf, Value, vramlens::model::Snapshot) {
    // Fixtures in different folders share names: the parent folder goes in too.
    let parent = input
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy();
    let name = input.file_name().unwrap().to_string_lossy();
    let out = dir.join(format!("{parent}-{name}.redacted.pickle"));
    vramlens()
        .arg("redact")
        .arg(input)
        .arg("-o")
        .arg(&out)
        .args(args)
        .assert()
        .success();
    let checked = if python {
        python_check(input, &out, args.contains(&"--strip-code"))
    } else {
        Value::Null
    };
    let (redacted, after, source) = read_with_figures(&out);
    assert_eq!(
        *before,
        after,
        "{}: summary figures differ after redaction",
        input.display()
    );
    assert_eq!(source["format"], "pickle");
    assert_eq!(source["gzip"], false);
    assert_eq!(source["pickle_protocol"], 4);
    (out, checked, redacted)
}

#[test]
fn fixtures_redact_to_files_python_opens_with_the_same_figures() {
    let dir = tempfile::tempdir().unwrap();
    let python = python3();
    let files = fixtures();
    let redacted = each_file(&files, |_, f| redact_and_check(f, dir.path(), &[], false).0);
    if !python {
        return;
    }
    let pairs: Vec<_> = files
        .iter()
        .zip(redacted)
        .map(|(f, r)| (f.clone(), r, false))
        .collect();
    let mut with_users = 0;
    for ((f, _, _), checked) in pairs.iter().zip(python_check_all(&pairs)) {
        if !checked["users"].as_array().unwrap().is_empty() {
            with_users += 1;
            assert!(checked["strings_changed"].as_u64().unwrap() > 0);
            // The hostile-strings fixture's frames also live under /home/eve.
            let users = if f.to_string_lossy().contains("hostile_strings") {
                serde_json::json!(["alice", "eve"])
            } else {
                serde_json::json!(["alice"])
            };
            assert_eq!(checked["users"], users, "{}", f.display());
        }
    }
    assert!(
        with_users >= 15,
        "the fixtures' /home/alice paths were not seen"
    );
}

/// Whether a frame's original file is a library's, as this test reads paths: an installed
/// package, Python's standard library (`lib/pythonX.Y/`, frozen modules), code torch
/// generated (`torchinductor_NAME/`), or a C source in a tree built from source
/// (`python-3.10.14/`, `glibc-2.31/`, a conda build's `NAME_1234567890/work/`).
fn library_file(file: &str) -> bool {
    let f = file.replace('\\', "/");
    let stdlib = regex::Regex::new(r"(?i)/lib(64)?/python[0-9.]*/|/python[0-9]+/lib/").unwrap();
    let source_tree =
        regex::Regex::new(r"/[A-Za-z][A-Za-z0-9_+]*-[0-9]+(\.[0-9]+)+/|_[0-9]{10,}/work/").unwrap();
    f.starts_with("<frozen ")
        || (f.starts_with('/') || f.get(1..3) == Some(":/"))
            && (f.contains("/site-packages/")
                || f.contains("/dist-packages/")
                || f.contains("/torchinductor_")
                || stdlib.is_match(&f)
                || (!f.ends_with(".py") && source_tree.is_match(&f)))
}

/// Names of the user's own code that `--strip-code` may keep: the ones the category rules
/// read (docs/redaction.md lists them), by words written here by hand.
fn names_the_rules_read(name: &str) -> bool {
    let whole = [
        "forward",
        "step",
        "__init__",
        "reset_parameters",
        "_init_weights",
        "init_weights",
        "zero_grad",
        "backward",
        "call",
        "_call_impl",
        "_wrapped_call_impl",
        "_apply",
        "to_empty",
        "materialize",
    ];
    let words = regex::Regex::new(
        r"(?i)loss|cross_entropy|cache|workspace|gather|scatter|reduce|broadcast|autotune|bench|compile|collate|pin_memory|dataloader|accumulate|nccl|c10d|processgroup|autograd::engine|evaluate_function|backward|state_dict|unshard|pre_forward|collectives",
    )
    .unwrap();
    whole.contains(&name) || words.is_match(name)
}

/// Frame by frame (ids are kept), against the original and the copy without
/// --strip-code: file names as without it; a library's frames (by their original path)
/// keep name and line; the user's Python frames and native frames outside torch's,
/// CPython's and the C runtime's namespaces have their names hashed (unless a category
/// rule reads them) and their positive lines replaced; none merged.
///
/// The copies compared frame by frame are made here from the original as read (redaction
/// keeps frame ids; a file read back may number its frames otherwise); the copy
/// `vramlens redact` wrote must hold the same frames.
fn assert_code_stripped(original: &Original, written: &vramlens::model::Snapshot) {
    let redacted = |strip_code: bool| {
        let (mut snap, _) = read_snapshot(&original.path, ReadOptions::default()).unwrap();
        let options = vramlens::redact::RedactOptions {
            strip_code,
            ..Default::default()
        };
        vramlens::redact::apply(&mut snap, &options);
        snap
    };
    let (plain, stripped) = (redacted(false), redacted(true));
    let frame_set = |snap: &vramlens::model::Snapshot| {
        let mut all: Vec<(String, String, i64)> = (0..snap.frames.frame_count())
            .map(|i| {
                let f = snap.frames.frame(FrameId(i as u32));
                let text = |id| snap.frames.str(id).to_string();
                (text(f.filename), text(f.name), f.line)
            })
            .collect();
        all.sort();
        all
    };
    assert_eq!(
        frame_set(written),
        frame_set(&stripped),
        "{}: the written copy holds other frames",
        original.path.display()
    );
    let (o, p, s) = (&original.snapshot, &plain, &stripped);
    let original = original.path.as_path();
    let native_library =
        regex::Regex::new(r"^([\w:<>,*&]+ )?(\(anonymous namespace\)::)?(at|c10|c10d|torch|caffe2|pybind11|std|__gnu_cxx)::|^(\(anonymous namespace\)::)?(THP|Py|_Py|__libc_|_start|start_thread)")
            .unwrap();
    assert_eq!(o.frames.frame_count(), s.frames.frame_count());
    let (mut lines_changed, mut user_frames) = (0, 0);
    for i in 0..o.frames.frame_count() {
        let id = FrameId(i as u32);
        let (fo, fp, fs) = (o.frames.frame(id), p.frames.frame(id), s.frames.frame(id));
        assert_eq!(p.frames.str(fp.filename), s.frames.str(fs.filename));
        let name = s.frames.str(fs.name);
        let file = o.frames.str(fo.filename);
        let original_name = o.frames.str(fo.name);
        let plain_name = p.frames.str(fp.name);
        let hashed = name.len() == 18
            && name.starts_with("f_")
            && name[2..].chars().all(|c| c.is_ascii_hexdigit());
        let python = file.ends_with(".py") || file.starts_with('<');
        let context = format!(
            "{}: {file}: function {original_name:?} became {name:?}",
            original.display()
        );
        if library_file(file) {
            assert_eq!(name, plain_name, "{context}");
            assert_eq!(fs.line, fo.line, "{context}");
            continue;
        }
        if !original_name.chars().any(|c| c.is_alphanumeric()) {
            assert_eq!(name, original_name, "{context}");
        } else if python || !native_library.is_match(original_name) {
            // The user's own code (or native code of no known library).
            user_frames += 1;
            assert!(
                hashed || (name == plain_name && names_the_rules_read(original_name)),
                "{context}"
            );
        } else {
            assert!(hashed || name == plain_name, "{context}");
        }
        if fo.line <= 0 {
            assert_eq!(fs.line, fo.line, "{context}");
        } else if python {
            assert!(fs.line > 0 && fs.line <= i32::MAX as i64, "{context}");
            lines_changed += (fs.line != fo.line) as usize;
        }
    }
    let user_lines = (0..o.frames.frame_count()).any(|i| {
        let f = o.frames.frame(FrameId(i as u32));
        let file = o.frames.str(f.filename);
        f.line > 0 && file.ends_with(".py") && !library_file(file)
    });
    if user_lines {
        assert!(
            lines_changed > 0 && user_frames > 0,
            "{}: no line number of the user's code changed",
            original.display()
        );
    }
}

#[test]
fn strip_code_hashes_names_and_lines_and_keeps_frames_distinct() {
    let dir = tempfile::tempdir().unwrap();
    let python = python3();
    let files = fixtures();
    // (the file stripped of code, the original's distinct frames)
    let stripped = each_file(&files, |i, f| {
        let dir = dir.path().join(i.to_string());
        std::fs::create_dir(&dir).unwrap();
        let original = Original::read(f);
        let (plain_path, _, _) = redact_and_check_against(f, &original.figures, &dir, &[], false);
        // The stripped file goes where the plain one was.
        std::fs::remove_file(&plain_path).unwrap();
        let (stripped_path, _, stripped) =
            redact_and_check_against(f, &original.figures, &dir, &["--strip-code"], false);
        assert_code_stripped(&original, &stripped);
        (stripped_path, original.snapshot.frames.frame_count())
    });
    if python {
        let pairs: Vec<_> = files
            .iter()
            .zip(&stripped)
            .map(|(f, (s, _))| (f.clone(), s.clone(), true))
            .collect();
        let mut user_functions = 0;
        for ((f, (_, frames)), checked) in files.iter().zip(&stripped).zip(python_check_all(&pairs))
        {
            // The Python check maps original frames to redacted ones one to one.
            assert_eq!(
                checked["distinct_frames"].as_u64().unwrap() as usize,
                *frames,
                "{}",
                f.display()
            );
            user_functions += checked["user_functions_hashed"].as_u64().unwrap();
        }
        // The fixtures' own scripts (train.py's build_model, main, ...) were seen hashed.
        assert!(user_functions > 0, "the Python check saw no user function");
    }
}

#[test]
fn hashes_are_stable_and_follow_the_salt() {
    let dir = tempfile::tempdir().unwrap();
    let input = common::root().join("testdata/sample.pickle");
    let run = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        vramlens()
            .arg("redact")
            .arg(&input)
            .arg("--strip-code")
            .args(extra)
            .arg("-o")
            .arg(&out)
            .assert()
            .success();
        std::fs::read(out).unwrap()
    };
    let a = run("a.pickle", &[]);
    let b = run("b.pickle", &["--threads", "1"]);
    let c = run("c.pickle", &["--salt", "s3cret"]);
    let d = run("d.pickle", &["--salt", "s3cret"]);
    assert_eq!(a, b, "same options must give the same bytes");
    assert_eq!(c, d, "the same salt must give the same bytes");
    assert_ne!(a, c, "a salt must change the hashes");
}

#[test]
fn show_lists_each_change_with_counts_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = common::root().join("testdata/sample.pickle");
    let out = dir.path().join("never.pickle");
    let text = vramlens()
        .args(["redact", "--show", "-o"])
        .arg(&out)
        .arg(&input)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(text).unwrap();
    assert!(!out.exists(), "--show must not write");
    assert!(text.contains("nothing written"), "{text}");
    assert!(text.contains("user names removed     alice"), "{text}");
    assert!(
        text.contains("/home/alice/nanogpt/model.py -> model.py"),
        "{text}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let json = vramlens()
        .args(["redact", "--show", "--json"])
        .arg(&input)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["written"], false);
    assert_eq!(v["output"], Value::Null);
    assert_eq!(v["names"]["users"], serde_json::json!(["alice"]));
    let change = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["original"] == "/home/alice/nanogpt/model.py")
        .expect("the model file is listed");
    assert_eq!(change["field"], "filename");
    assert_eq!(change["redacted"], "model.py");
    // Independently: the distinct frames of that file, counted with Python's pickle.
    if python3() {
        let count = std::process::Command::new("python3")
            .arg("-c")
            .arg(
                "import pickle,sys\n\
                 d=pickle.load(open(sys.argv[1],'rb'))\n\
                 seen=set()\n\
                 def walk(o):\n\
                 \x20   if isinstance(o,dict):\n\
                 \x20       if 'line' in o and 'filename' in o: seen.add((o['filename'],o['name'],o['line']))\n\
                 \x20       [walk(v) for v in o.values()]\n\
                 \x20   elif isinstance(o,(list,tuple)): [walk(v) for v in o]\n\
                 walk(d)\n\
                 print(sum(1 for f in seen if f[0]=='/home/alice/nanogpt/model.py'))",
            )
            .arg(&input)
            .output()
            .unwrap();
        let n: u64 = String::from_utf8_lossy(&count.stdout)
            .trim()
            .parse()
            .unwrap();
        assert_eq!(change["count"], n);
    }
    let totals = &v["totals"];
    assert_eq!(
        totals["filename"].as_u64().unwrap() as usize,
        v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["field"] == "filename")
            .count()
    );
}

#[test]
fn never_writes_over_the_input_or_an_existing_file_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pickle");
    std::fs::copy(common::root().join("testdata/sample.pickle"), &input).unwrap();
    let original = std::fs::read(&input).unwrap();

    // Onto the input, however it is spelled, even with --force.
    let spelled = dir.path().join(".").join("in.pickle");
    for target in [&input, &spelled] {
        vramlens()
            .arg("redact")
            .arg(&input)
            .arg("-o")
            .arg(target)
            .arg("--force")
            .assert()
            .code(2)
            .stderr(predicates::str::contains("is the input snapshot"));
    }
    assert_eq!(std::fs::read(&input).unwrap(), original);

    // An existing file: refused, then replaced with --force.
    let out = dir.path().join("out.pickle");
    std::fs::write(&out, b"keep me").unwrap();
    vramlens()
        .arg("redact")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "already exists; use --force to overwrite it",
        ));
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    vramlens()
        .arg("redact")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .arg("--force")
        .assert()
        .success();
    assert!(std::fs::read(&out).unwrap().starts_with(&[0x80, 4, 0x95]));

    // A bad input leaves nothing behind, not even the temporary file.
    let bad = common::root().join("testdata/bad/truncated.pickle");
    let out2 = dir.path().join("out2.pickle");
    vramlens()
        .arg("redact")
        .arg(&bad)
        .arg("-o")
        .arg(&out2)
        .assert()
        .code(2);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["in.pickle", "out.pickle"]);

    // -o is required without --show; a bad --keep pattern is an error.
    vramlens().arg("redact").arg(&input).assert().code(2);
    vramlens()
        .arg("redact")
        .arg(&input)
        .args(["--show", "--keep", "("])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "--keep \"(\": not a valid regular expression",
        ));
}

/// The strings of one kind in a redacted file, read with our reader.
fn annotation_names(path: &Path) -> Vec<String> {
    let snap = read_snapshot(path, ReadOptions::default()).unwrap().0;
    snap.external_annotations
        .iter()
        .map(|a| a.name.clone())
        .collect()
}

#[test]
fn annotations_metadata_keep_and_scrub_options() {
    let dir = tempfile::tempdir().unwrap();
    let python = python3();
    let sample = common::root().join("testdata/sample.pickle");
    let before = annotation_names(&sample);
    assert!(before.iter().any(|n| n == "ProfilerStep#0"));

    let (out, _) = redact_and_check(&sample, dir.path(), &["--annotations", "drop"], python);
    assert!(annotation_names(&out).iter().all(|n| n.is_empty()));
    std::fs::remove_file(&out).unwrap();
    let (out, _) = redact_and_check(&sample, dir.path(), &["--annotations", "hash"], python);
    let hashed = annotation_names(&out);
    assert_eq!(hashed.len(), before.len());
    assert!(hashed.iter().all(|n| n.len() == 18 && n.starts_with("a_")));
    std::fs::remove_file(&out).unwrap();

    // user_metadata (PyTorch 2.10): hashed, or dropped to the empty default.
    let meta = common::root().join("testdata/v2_10_meta.pickle");
    let values = |p: &Path| {
        let snap = read_snapshot(p, ReadOptions::default()).unwrap().0;
        let t = &snap.device_traces[0];
        (0..t.len())
            .filter_map(|i| t.user_metadata(i).map(|s| snap.frames.str(s).to_string()))
            .collect::<Vec<_>>()
    };
    let original = values(&meta);
    assert!(!original.is_empty());
    let (out, _) = redact_and_check(&meta, dir.path(), &["--metadata", "hash"], python);
    let hashed = values(&out);
    assert_eq!(hashed.len(), original.len());
    assert!(hashed.iter().all(|m| m.starts_with("m_")));
    std::fs::remove_file(&out).unwrap();
    let (out, _) = redact_and_check(&meta, dir.path(), &["--metadata", "drop"], python);
    assert!(values(&out).is_empty());
    std::fs::remove_file(&out).unwrap();

    // --keep leaves matching strings as they are; --scrub removes a word everywhere.
    let out = dir.path().join("kept.pickle");
    let json = vramlens()
        .arg("redact")
        .arg(&sample)
        .args([
            "--keep",
            "functional[.]py$",
            "--scrub",
            "AdamW",
            "--json",
            "-o",
        ])
        .arg(&out)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["kept_by_pattern"], 1);
    assert_eq!(v["names"]["words"], serde_json::json!(["AdamW"]));
    let snap = read_snapshot(&out, ReadOptions::default()).unwrap().0;
    let files: Vec<&str> = (0..snap.frames.frame_count())
        .map(|i| {
            snap.frames
                .str(snap.frames.frame(FrameId(i as u32)).filename)
        })
        .collect();
    assert!(files.contains(&"/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py"));
    assert!(files.contains(&"torch/optim/<redacted>.py"));
    assert!(files.contains(&"model.py"));
    assert!(
        !files
            .iter()
            .any(|f| f.contains("alice") || f.contains("/home/"))
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn every_real_snapshot_redacts_with_the_same_figures_and_no_names_left() {
    let dir = tempfile::tempdir().unwrap();
    let python = python3();
    let files = real_snapshots();
    let plain = each_file(&files, |i, f| {
        let dir = dir.path().join(i.to_string());
        std::fs::create_dir(&dir).unwrap();
        let original = Original::read(f);
        let (plain_path, _, _) = redact_and_check_against(f, &original.figures, &dir, &[], false);
        let plain_copy = dir.join("plain.pickle");
        std::fs::rename(&plain_path, &plain_copy).unwrap();
        // Frames stay distinct: checked through our reader (equal frames are interned
        // once, so a merge would lower the count) and by the summary's distinct_frames.
        let (stripped_path, _, stripped) =
            redact_and_check_against(f, &original.figures, &dir, &["--strip-code"], false);
        assert_code_stripped(&original, &stripped);
        (plain_copy, stripped_path)
    });
    if python {
        // Each plain copy, then each stripped one (the user's functions hashed).
        let pairs: Vec<_> = files
            .iter()
            .zip(&plain)
            .map(|(f, (p, _))| (f.clone(), p.clone(), false))
            .chain(
                files
                    .iter()
                    .zip(&plain)
                    .map(|(f, (_, s))| (f.clone(), s.clone(), true)),
            )
            .collect();
        let checked = python_check_all(&pairs);
        let users: usize = checked[..files.len()]
            .iter()
            .map(|c| c["users"].as_array().map_or(0, |u| u.len()))
            .sum();
        assert!(
            users >= 15,
            "the Python check found too few user names: {users}"
        );
        let user_functions: u64 = checked[files.len()..]
            .iter()
            .map(|c| c["user_functions_hashed"].as_u64().unwrap())
            .sum();
        assert!(
            user_functions >= 50,
            "the Python check saw too few user functions: {user_functions}"
        );
    }
}

/// `--redact` on any command: what it shows of the snapshot's strings is redacted (the
/// sample's frames live under /home/alice), every figure is the same as without it, and
/// the output equals the same command on the file `vramlens redact` writes.
#[test]
fn the_redact_option_redacts_what_every_command_shows() {
    let dir = tempfile::tempdir().unwrap();
    let redacted = dir.path().join("redacted.pickle");
    vramlens()
        .args(["redact", "testdata/sample.pickle", "-o"])
        .arg(&redacted)
        .assert()
        .success();
    let run = |args: &[&str], file: &Path| -> String {
        let out = vramlens().args(args).arg(file).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let sample = Path::new("testdata/sample.pickle");
    for args in [
        &["top", "--json"][..],
        &["top", "--at", "oom", "--by", "stack", "--json"],
        &["flamegraph", "--folded"],
        &["timeline", "--at", "peak", "--json"],
        &["oom", "--json"],
        &["segments", "--json"],
    ] {
        let plain = run(args, sample);
        assert!(plain.contains("alice"), "{args:?} shows no path to redact");
        let with_option: Vec<&str> = args.iter().copied().chain(["--redact"]).collect();
        let shown = run(&with_option, sample);
        assert!(!shown.contains("alice"), "{args:?} --redact: {shown}");
        // The same as the command on the redacted file, but for the file's own path,
        // which `--redact` shows cut to its name.
        let on_file = run(args, &redacted).replace(redacted.to_str().unwrap(), "sample.pickle");
        assert_eq!(shown, on_file, "{args:?}");
    }
    // A report: no name in the page, the same figures.
    let page = dir.path().join("r.html");
    vramlens()
        .args(["report", "--redact", "testdata/sample.pickle", "-o"])
        .arg(&page)
        .assert()
        .success();
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains("alice"));
    assert!(html.contains("model.py"));
}

/// `vramlens ARGS --json FILE`, parsed.
fn json_of(args: &[&str], file: &Path) -> Value {
    let out = vramlens()
        .args(args)
        .arg("--json")
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?} {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Bytes and counts by category, as `top --by category` and `budget` give them for each
/// device: (command, device or run/line, category) -> (bytes, count).
fn category_bytes(file: &Path) -> BTreeMap<(String, String, String), (u64, u64)> {
    let mut out = BTreeMap::new();
    let summary = json_of(&["summary"], file);
    for d in summary["devices"].as_array().unwrap() {
        let device = d["device"].to_string();
        for at in ["peak", "end"] {
            let top = json_of(
                &[
                    "top", "--by", "category", "--limit", "100", "--at", at, "--device", &device,
                ],
                file,
            );
            for g in top["groups"].as_array().unwrap() {
                out.insert(
                    (
                        format!("top --at {at}"),
                        device.clone(),
                        g["name"].as_str().unwrap().to_string(),
                    ),
                    (g["bytes"].as_u64().unwrap(), g["count"].as_u64().unwrap()),
                );
            }
        }
    }
    let budget = json_of(&["budget"], file);
    for (r, run) in budget["runs"].as_array().unwrap().iter().enumerate() {
        for (l, line) in run["lines"].as_array().unwrap().iter().enumerate() {
            for c in line["categories"].as_array().unwrap() {
                out.insert(
                    (
                        "budget".to_string(),
                        format!("{r}/{l}"),
                        c["category"].as_str().unwrap().to_string(),
                    ),
                    (c["bytes"].as_u64().unwrap(), c["count"].as_u64().unwrap()),
                );
            }
        }
    }
    out
}

/// `--strip-code` on real snapshots: the categories of `top --by category` (at the peak
/// and at the end of every device) and of `budget` are those of the original file, byte
/// for byte; and no function name of the user's own code is left, but those the
/// category rules read (a name that is also a library's in the same file aside).
#[test]
#[ignore = "needs ../shared/data"]
fn strip_code_keeps_the_categories_of_real_snapshots() {
    let data = common::require_shared_data();
    let dir = tempfile::tempdir().unwrap();
    let files = [
        "code-location-expandable-oom/memory_snapshot.pickle",
        "cs336-kkaitlyn111/memory_ctx128_fullstep.pickle",
        "ccl-bench-torchtitan-fsdp-oom/rank0_memory_snapshot.pickle",
    ];
    let results = each_file(
        &files.iter().map(|f| data.join(f)).collect::<Vec<_>>(),
        |i, f| {
            let out = dir.path().join(format!("{i}.pickle"));
            vramlens()
                .arg("redact")
                .arg(f)
                .arg("--strip-code")
                .arg("-o")
                .arg(&out)
                .assert()
                .success();
            if python3() {
                // Independently: the user's function names are hashed, no home folder or
                // user name is left.
                let checked = python_check(f, &out, true);
                assert_eq!(checked["ok"], true);
            }
            let before = category_bytes(f);
            let after = category_bytes(&out);
            assert_eq!(before, after, "{}: categories differ", f.display());

            let original = Original::read(f);
            let (stripped, _) = read_snapshot(&out, ReadOptions::default()).unwrap();
            assert_code_stripped(&original, &stripped);
            let o = &original.snapshot.frames;
            let library_names: std::collections::BTreeSet<&str> = (0..o.frame_count())
                .map(|i| o.frame(FrameId(i as u32)))
                .filter(|fr| library_file(o.str(fr.filename)))
                .map(|fr| o.str(fr.name))
                .collect();
            let left: std::collections::BTreeSet<&str> = (0..stripped.frames.frame_count())
                .map(|i| {
                    stripped
                        .frames
                        .str(stripped.frames.frame(FrameId(i as u32)).name)
                })
                .collect();
            let mut user_names = 0;
            for i in 0..o.frame_count() {
                let fr = o.frame(FrameId(i as u32));
                let (file, name) = (o.str(fr.filename), o.str(fr.name));
                if !file.ends_with(".py") || library_file(file) || library_names.contains(name) {
                    continue;
                }
                if !names_the_rules_read(name) && name.chars().any(|c| c.is_alphanumeric()) {
                    user_names += 1;
                    assert!(!left.contains(name), "{}: {name} is left", f.display());
                }
            }
            (before, user_names)
        },
    );
    // The first two run the user's own scripts; torchtitan's job runs an installed
    // package only.
    assert!(
        results[0].1 > 0 && results[1].1 > 0,
        "no user function seen"
    );
    // What the original files say (the issue's example): the expandable-segments OOM is
    // activations and communication, not `other`.
    let oom = &results[0].0;
    let at_peak = |name: &str| oom.get(&("top --at peak".into(), "1".into(), name.into()));
    assert_eq!(at_peak("activations").map(|v| v.1), Some(98));
    assert_eq!(at_peak("communication").map(|v| v.1), Some(13));
    assert_eq!(at_peak("other"), None);
}
