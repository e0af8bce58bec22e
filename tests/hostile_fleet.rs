//! Hostile inputs against the fleet folder and what names reach: staging folders of
//! writers on other machines, partition keys taken by another input, files planted in the
//! output folder, input paths under `--redact`, and names with control characters. Each
//! test makes its own input (a copy of `testdata/sample.pickle`).

use assert_cmd::Command;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

fn vramlens() -> Command {
    let mut c = Command::cargo_bin("vramlens").unwrap();
    c.timeout(Duration::from_secs(120));
    c
}

/// Runs vramlens; (exit code, stdout, stderr).
fn run_in(cwd: Option<&Path>, args: &[&str]) -> (Option<i32>, String, String) {
    let mut c = vramlens();
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c.args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    run_in(None, args)
}

fn sample() -> PathBuf {
    common::root().join("testdata/sample.pickle")
}

fn copy_sample(dir: &Path, name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    std::fs::copy(sample(), &p).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The partition folders of a table, by name.
fn partitions(out: &Path, table: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out.join(table))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// This machine's kernel, as docs/export.md says a staging lock file records it.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// A staging folder as a writer leaves it, with a lock file naming `kernel`.
fn staging(out: &Path, pid: u64, kernel: Option<&str>) -> PathBuf {
    let dir = out.join(format!(".vramlens-export.{pid}.0123456789abcdef"));
    std::fs::create_dir_all(dir.join("lifetimes")).unwrap();
    if let Some(k) = kernel {
        std::fs::write(dir.join("lock"), format!("vramlens export staging\n{k}\n")).unwrap();
    }
    dir
}

#[test]
fn a_staging_folder_another_writer_may_own_is_left_and_a_dead_ones_removed() {
    let Some(kernel) = boot_id() else {
        eprintln!("skipped: no /proc/sys/kernel/random/boot_id on this system");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let snap = copy_sample(dir.path(), "a.pickle");
    let out = dir.path().join("tables");
    std::fs::create_dir(&out).unwrap();
    // A writer in another PID namespace: its PID means nothing here, its lock is held
    // (by this test process, as that writer would hold it).
    let live = staging(&out, 4_000_000_000, Some(&kernel));
    let held = std::fs::File::open(live.join("lock")).unwrap();
    {
        use std::os::fd::AsRawFd;
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    }
    // A writer on another machine (another kernel; its lock is not seen from here).
    let remote = staging(&out, 4_000_000_001, Some("another-machine-boot-id"));
    // A writer that has made its folder and not yet its lock file.
    let starting = staging(&out, 4_000_000_002, None);
    // What a run of a release without locks left, two days ago.
    let old = staging(&out, 4_000_000_003, None);
    let touched = std::process::Command::new("touch")
        .args(["-d", "2 days ago", s(&old)])
        .status()
        .unwrap();
    assert!(touched.success());

    let export = || run(&["export", "--format", "jsonl", "-o", s(&out), s(&snap)]);
    let (code, _, err) = export();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        live.exists(),
        "a folder whose lock is held is another writer's"
    );
    assert!(
        remote.exists(),
        "a folder locked on another machine is never judged"
    );
    assert!(
        starting.exists(),
        "a new folder without a lock file may be starting"
    );
    assert!(
        !old.exists(),
        "a day-old folder without a lock file is stale"
    );
    // The writer ends (its lock is released): its folder is stale now.
    drop(held);
    let (code, _, err) = export();
    assert_eq!(code, Some(0), "{err}");
    assert!(!live.exists(), "a folder whose writer ended is removed");
    assert!(remote.exists() && starting.exists());
    assert_eq!(partitions(&out, "snapshots").len(), 1);
}

#[test]
fn a_partition_key_taken_by_another_input_is_refused_and_its_rows_kept() {
    let dir = tempfile::tempdir().unwrap();
    let snap = copy_sample(dir.path(), "a.pickle");
    let out = dir.path().join("tables");
    let (code, _, err) = run(&["export", "--format", "jsonl", "-o", s(&out), s(&snap)]);
    assert_eq!(code, Some(0), "{err}");
    // The key by docs/export.md: the name, `~`, then 32 hex digits (128 bits) of the
    // SHA-256 of the file's SHA-256 (hex), a newline, and the path as given.
    let file_sha = hex(&Sha256::digest(std::fs::read(&snap).unwrap()));
    let digest = hex(&Sha256::digest(format!("{file_sha}\n{}", s(&snap))));
    let key = format!("a.pickle~{}", &digest[..32]);
    assert_eq!(partitions(&out, "snapshots"), [format!("file={key}")]);

    // Another input's manifest holds that key (the rows there are its rows).
    let part = out
        .join("lifetimes")
        .join(format!("file={key}"))
        .join("part-0.jsonl");
    std::fs::write(&part, "{\"other\": 1}\n").unwrap();
    let other = serde_json::json!({
        "schema_version": vramlens::export::SCHEMA_VERSION,
        "files": [{"path": "elsewhere/a.pickle", "file": key, "sha256": "0".repeat(64),
                   "status": "exported"}],
    });
    std::fs::write(
        out.join("manifest")
            .join("0000000000000000.shard-00000-of-00001.json"),
        other.to_string(),
    )
    .unwrap();
    let (code, stdout, err) = run(&["export", "--format", "jsonl", "-o", s(&out), s(&snap)]);
    assert_eq!(code, Some(2), "{stdout}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "vramlens: error: {}: its partition key {key} is taken by elsewhere/a.pickle",
            s(&snap)
        )),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&part).unwrap(), "{\"other\": 1}\n");
}

#[test]
fn files_planted_in_the_manifest_folder_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let snap = copy_sample(dir.path(), "a.pickle");
    let out = dir.path().join("tables");
    let (code, _, err) = run(&["export", "--format", "jsonl", "-o", s(&out), s(&snap)]);
    assert_eq!(code, Some(0), "{err}");
    let manifests = out.join("manifest");
    let fifo = manifests.join("fifo.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    std::os::unix::fs::symlink("/dev/zero", manifests.join("zero.json")).unwrap();
    let start = std::time::Instant::now();
    let (code, _, err) = run(&["export", "--format", "jsonl", "-o", s(&out), s(&snap)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(start.elapsed() < Duration::from_secs(60));
    assert!(
        err.contains(&format!(
            "vramlens: skipped {}: is a named pipe, not a file export wrote",
            s(&fifo)
        )),
        "{err}"
    );
    assert!(
        err.contains("zero.json: is a symbolic link, not a file export wrote"),
        "{err}"
    );
}

/// Every output of every command on `path` with `--redact` (text, JSON, the report, the
/// export's tables and manifest), run from `cwd`.
fn redacted_outputs(cwd: &Path, path: &str, work: &Path) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    let commands: &[&[&str]] = &[
        &["summary"],
        &["summary", "--json"],
        &["top"],
        &["top", "--json"],
        &["budget"],
        &["budget", "--json"],
        &["oom"],
        &["oom", "--json"],
        &["timeline", "--at", "peak"],
        &["timeline", "--json"],
        &["segments", "--json"],
        &["simulate", "--json"],
        &["check", "--json", "--max-peak", "1TB"],
    ];
    for c in commands {
        let mut args = vec!["--redact"];
        args.extend_from_slice(c);
        args.push(path);
        let (code, out, err) = run_in(Some(cwd), &args);
        assert_eq!(code, Some(0), "{c:?}: {err}");
        seen.push((format!("{c:?}"), out + &err));
    }
    let (code, out, err) = run_in(Some(cwd), &["--redact", "diff", "--json", path, path]);
    assert_eq!(code, Some(0), "{err}");
    seen.push(("diff".into(), out + &err));
    let html = work.join("r.html");
    let (code, out, err) = run_in(Some(cwd), &["--redact", "report", path, "-o", s(&html)]);
    assert_eq!(code, Some(0), "{err}");
    seen.push((
        "report".into(),
        std::fs::read_to_string(&html).unwrap() + &out + &err,
    ));
    let tables = work.join("tables");
    let (code, out, err) = run_in(
        Some(cwd),
        &[
            "--redact",
            "export",
            "--format",
            "jsonl",
            "-o",
            s(&tables),
            path,
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    seen.push(("export".into(), out + &err));
    for e in walk(&tables) {
        let name = e.strip_prefix(&tables).unwrap().display().to_string();
        seen.push((name.clone(), name + &std::fs::read_to_string(&e).unwrap()));
    }
    seen
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files.extend(walk(&p));
        } else {
            files.push(p);
        }
    }
    files
}

#[test]
fn redact_leaves_no_home_folder_or_user_name_of_the_input_paths() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home").join("alice.smith");
    let snap = copy_sample(&home.join("runs"), "run.pickle");
    // Given absolute, and relative from the home folder.
    for (cwd, path, work) in [
        (
            dir.path().to_path_buf(),
            s(&snap).to_string(),
            dir.path().join("w1"),
        ),
        (
            home.clone(),
            "runs/run.pickle".to_string(),
            dir.path().join("w2"),
        ),
    ] {
        std::fs::create_dir(&work).unwrap();
        let outputs = redacted_outputs(&cwd, &path, &work);
        for (what, text) in &outputs {
            assert!(!text.contains("alice"), "{what} ({path}): {text}");
            assert!(!text.contains("home/"), "{what} ({path}): {text}");
        }
        // The file is still named: by its name, below the folder the inputs share.
        let (_, out, _) = run_in(Some(&cwd), &["--redact", "summary", "--json", &path]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["source"]["path"], "run.pickle");
        // The export records that path in the tables and the manifest.
        let m = walk(&work.join("tables").join("manifest"));
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&m[0]).unwrap()).unwrap();
        assert_eq!(m["files"][0]["path"], "run.pickle");
    }
    // A file that fails: its error, in the manifest, names it as recorded too.
    let broken = home.join("runs").join("broken.pickle");
    std::fs::write(&broken, b"\x80\x04not a pickle").unwrap();
    let tables = dir.path().join("w3");
    let (code, _, err) = run(&[
        "--redact",
        "export",
        "--format",
        "jsonl",
        "--shard",
        "0/1",
        "-o",
        s(&tables),
        s(&broken),
    ]);
    assert_eq!(code, Some(2), "{err}");
    let m = walk(&tables.join("manifest"));
    let text = std::fs::read_to_string(&m[0]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["files"][0]["status"], "failed", "{text}");
    assert!(!text.contains("alice") && !text.contains("home/"), "{text}");
}

#[test]
fn names_with_control_characters_cannot_forge_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = "x\u{1b}]0;owned\u{7}\nvramlens: error: forged";
    let folder = dir.path().join(bad);
    copy_sample(&folder, "a.pickle");
    std::fs::write(folder.join(format!("{bad}.txt")), "not a snapshot").unwrap();
    let empty = dir.path().join(format!("{bad} empty"));
    std::fs::create_dir(&empty).unwrap();
    let out = dir.path().join(format!("{bad} tables"));
    let runs: Vec<(Option<i32>, String, String)> = vec![
        run(&[
            "export",
            "--format",
            "jsonl",
            "-o",
            s(&out),
            s(&folder),
            s(&empty),
        ]),
        run(&["summary", s(&folder), s(&empty)]),
        run(&["summary", s(&empty)]),
        run(&["summary", s(&folder.join("missing.pickle"))]),
    ];
    for (code, stdout, stderr) in &runs {
        assert!(code.is_some());
        for text in [stdout, stderr] {
            assert!(
                !text.contains(['\u{1b}', '\u{7}']),
                "a control character reached the terminal: {text:?}"
            );
            for line in text.lines() {
                assert!(!line.starts_with("vramlens: error: forged"), "{text}");
            }
        }
    }
    // The export ran, said what it left out, and named the folders as they are.
    let (code, stdout, stderr) = &runs[0];
    assert_eq!(*code, Some(0), "{stderr}");
    assert!(stdout.starts_with("exported 1 of 1 files to "), "{stdout}");
    assert!(
        stdout.contains("\\x1b]0;owned\\x07\\nvramlens: error: forged"),
        "{stdout}"
    );
    assert!(stderr.contains("vramlens: skipped "), "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
