//! Golden files: the exact outputs of the binary on the committed fixtures.
//!
//! Each case is a folder `tests/data/<subcommand>/<case>/` holding `args` (the arguments,
//! one per line, run from the repository root; `{out}` stands for the chart file the case
//! writes, `{out.EXT}` for another file it writes, `{outdir}` for a folder) and what it must
//! print and write, byte for byte: `expected.txt` (text on stdout), `expected.json` (JSON on
//! stdout, for `--json`), `expected.svg` (the chart), `expected.EXT` (the file) and the
//! folder `expected/` (every file of the folder written). The temporary folder the outputs
//! go to is written `OUT` where stdout names it. A `status` file holds the exit status
//! expected (default 0). A missing expected file is a failure.
//!
//! After an intended change of output, rewrite them all and review the difference:
//!
//! ```sh
//! VRAMLENS_BLESS=1 cargo test --test golden && git diff tests/data
//! ```

mod common;

use common::root;
use std::path::{Path, PathBuf};

const BLESS: &str = "VRAMLENS_BLESS";
const OUT: &str = "{out}";

fn blessing() -> bool {
    std::env::var_os(BLESS).is_some_and(|v| v == "1")
}

/// The case folders, sorted: every `tests/data/<subcommand>/<case>/`.
fn cases() -> Vec<PathBuf> {
    let data = root().join("tests/data");
    let mut cases = Vec::new();
    for sub in std::fs::read_dir(&data).unwrap() {
        let sub = sub.unwrap().path();
        if !sub.is_dir() {
            continue;
        }
        for case in std::fs::read_dir(&sub).unwrap() {
            let case = case.unwrap().path();
            if case.is_dir() {
                cases.push(case);
            }
        }
    }
    cases.sort();
    cases
}

/// Where two outputs first differ, as a short message.
fn first_difference(expected: &[u8], actual: &[u8]) -> String {
    let e = String::from_utf8_lossy(expected);
    let a = String::from_utf8_lossy(actual);
    let clip = |s: &str| -> String {
        let s: String = s.chars().take(160).collect();
        format!("{s:?}")
    };
    for (n, (el, al)) in e.lines().zip(a.lines()).enumerate() {
        if el != al {
            return format!(
                "line {}:\n    expected {}\n    found    {}",
                n + 1,
                clip(el),
                clip(al)
            );
        }
    }
    format!(
        "{} lines expected, {} found ({} and {} bytes)",
        e.lines().count(),
        a.lines().count(),
        expected.len(),
        actual.len()
    )
}

/// Every file under `dir`, by its path relative to `dir` (`/`-separated), sorted.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path.strip_prefix(dir).unwrap();
                let name: Vec<String> = name
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                files.push((name.join("/"), std::fs::read(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// The files a case writes: `{out}` is `out.svg` (compared with `expected.svg`), `{out.EXT}`
/// is `out.EXT` (with `expected.EXT`), `{outdir}` a folder (with the folder `expected/`).
fn output_files(args: &[String]) -> Vec<String> {
    let mut names = Vec::new();
    for a in args {
        let mut rest = a.as_str();
        while let Some(at) = rest.find("{out") {
            let tail = &rest[at + 1..];
            let Some(close) = tail.find('}') else { break };
            let name = match &tail[..close] {
                "out" => "out.svg".to_string(),
                "outdir" => "outdir".to_string(),
                other => other.to_string(),
            };
            if !names.contains(&name) {
                names.push(name);
            }
            rest = &tail[close..];
        }
    }
    names
}

/// Runs one case; returns its failures (none when blessing).
fn run_case(case: &Path) -> Vec<String> {
    let name = case.strip_prefix(root()).unwrap().display().to_string();
    let args_path = case.join("args");
    let Ok(args) = std::fs::read_to_string(&args_path) else {
        return vec![format!("{name}: no args file")];
    };
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().display().to_string();
    let args: Vec<String> = args.lines().map(str::to_string).collect();
    let outputs = output_files(&args);
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            let mut a = a.replace(OUT, &format!("{tmp}/out.svg"));
            for file in &outputs {
                a = a.replace(&format!("{{{file}}}"), &format!("{tmp}/{file}"));
            }
            a
        })
        .collect();
    let status: i32 = std::fs::read_to_string(case.join("status"))
        .map(|s| {
            s.trim()
                .parse()
                .expect("a status file holds an exit status")
        })
        .unwrap_or(0);
    let out = assert_cmd::Command::cargo_bin("vramlens")
        .unwrap()
        .current_dir(root())
        .env_remove("NO_COLOR")
        .args(&args)
        .output()
        .unwrap();
    if out.status.code() != Some(status) {
        return vec![format!(
            "{name}: vramlens {} exited with {} (expected {status}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )];
    }
    let stdout_name = if args.iter().any(|a| a == "--json") {
        "expected.json"
    } else {
        "expected.txt"
    };
    // (expected file, what was produced); the temporary folder named in the output is
    // written as OUT.
    let stdout = String::from_utf8_lossy(&out.stdout).replace(&tmp, "OUT");
    let mut produced: Vec<(String, Vec<u8>)> = Vec::new();
    if !stdout.is_empty() || outputs.is_empty() {
        produced.push((stdout_name.to_string(), stdout.into_bytes()));
    }
    for file in &outputs {
        let path = dir.path().join(file);
        if file == "outdir" {
            if !path.is_dir() {
                return vec![format!("{name}: no folder written")];
            }
            for (f, bytes) in tree(&path) {
                produced.push((format!("expected/{f}"), bytes));
            }
            continue;
        }
        let expected = file.replacen("out.", "expected.", 1);
        match std::fs::read(&path) {
            Ok(bytes) => produced.push((expected, bytes)),
            Err(e) => return vec![format!("{name}: no {file} written: {e}")],
        }
    }
    // What the case holds now: expected.* and the files of expected/.
    let mut existing: Vec<String> = std::fs::read_dir(case)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("expected.") && f != "expected")
        .collect();
    if case.join("expected").is_dir() {
        existing.extend(
            tree(&case.join("expected"))
                .into_iter()
                .map(|(f, _)| format!("expected/{f}")),
        );
    }
    let mut failures = Vec::new();
    if blessing() {
        if case.join("expected").is_dir() {
            std::fs::remove_dir_all(case.join("expected")).unwrap();
        }
        for file in &existing {
            let _ = std::fs::remove_file(case.join(file));
        }
        for (file, bytes) in &produced {
            let path = case.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, bytes).unwrap();
        }
        return failures;
    }
    let hint = format!("(if the change is intended: {BLESS}=1 cargo test --test golden)");
    for (file, bytes) in &produced {
        match std::fs::read(case.join(file)) {
            Ok(expected) if expected == *bytes => {}
            Ok(expected) => failures.push(format!(
                "{name}/{file} differs at {} {hint}",
                first_difference(&expected, bytes)
            )),
            Err(_) => failures.push(format!("{name}/{file} is missing {hint}")),
        }
    }
    for file in &existing {
        if !produced.iter().any(|(f, _)| f == file) {
            failures.push(format!(
                "{name}/{file} exists but the command no longer writes it {hint}"
            ));
        }
    }
    failures
}

#[test]
fn outputs_match_the_golden_files() {
    let cases = cases();
    let mut failures = Vec::new();
    for case in &cases {
        failures.extend(run_case(case));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every subcommand and every kind of output is covered.
    let covered = |needle: &str| cases.iter().any(|c| c.join(needle).exists());
    for sub in [
        "summary",
        "timeline",
        "segments",
        "oom",
        "reconcile",
        "top",
        "flamegraph",
        "diff",
        "check",
        "budget",
        "redact",
        "report",
        "export",
    ] {
        assert!(
            cases.iter().any(|c| c.parent().unwrap().ends_with(sub)),
            "no golden case for {sub}"
        );
    }
    for kind in ["expected.txt", "expected.json", "expected.svg"] {
        assert!(covered(kind), "no golden case writes {kind}");
    }
}
