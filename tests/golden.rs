//! Golden files: the exact outputs of the binary on the committed fixtures.
//!
//! Each case is a folder `tests/data/<subcommand>/<case>/` holding `args` (the arguments,
//! one per line, run from the repository root; `{out}` stands for the chart file the case
//! writes) and what it must print, byte for byte: `expected.txt` (text on stdout),
//! `expected.json` (JSON on stdout, for `--json`) and `expected.svg` (the chart). A missing
//! expected file is a failure.
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

/// Runs one case; returns its failures (none when blessing).
fn run_case(case: &Path) -> Vec<String> {
    let name = case.strip_prefix(root()).unwrap().display().to_string();
    let args_path = case.join("args");
    let Ok(args) = std::fs::read_to_string(&args_path) else {
        return vec![format!("{name}: no args file")];
    };
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("chart.svg");
    let args: Vec<String> = args
        .lines()
        .map(|a| a.replace(OUT, &chart.display().to_string()))
        .collect();
    let writes_chart = args
        .iter()
        .any(|a| a.contains(&chart.display().to_string()));
    let out = assert_cmd::Command::cargo_bin("vramlens")
        .unwrap()
        .current_dir(root())
        .env_remove("NO_COLOR")
        .args(&args)
        .output()
        .unwrap();
    if !out.status.success() {
        return vec![format!(
            "{name}: vramlens {} failed ({}): {}",
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
    // (expected file, what was produced)
    let mut produced: Vec<(&str, Vec<u8>)> = Vec::new();
    if !out.stdout.is_empty() || !writes_chart {
        produced.push((stdout_name, out.stdout));
    }
    if writes_chart {
        match std::fs::read(&chart) {
            Ok(svg) => produced.push(("expected.svg", svg)),
            Err(e) => return vec![format!("{name}: no chart written: {e}")],
        }
    }
    let all = ["expected.txt", "expected.json", "expected.svg"];
    let mut failures = Vec::new();
    if blessing() {
        for file in all {
            let path = case.join(file);
            match produced.iter().find(|(f, _)| *f == file) {
                Some((_, bytes)) => std::fs::write(&path, bytes).unwrap(),
                None if path.exists() => std::fs::remove_file(&path).unwrap(),
                None => {}
            }
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
    for file in all {
        if case.join(file).exists() && !produced.iter().any(|(f, _)| *f == file) {
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
    for sub in ["summary", "timeline", "segments", "oom", "reconcile"] {
        assert!(
            cases.iter().any(|c| c.parent().unwrap().ends_with(sub)),
            "no golden case for {sub}"
        );
    }
    for kind in ["expected.txt", "expected.json", "expected.svg"] {
        assert!(covered(kind), "no golden case writes {kind}");
    }
}
