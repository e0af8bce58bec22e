//! The Python package in python/vramlens: its API (`vramlens.summary`, `vramlens.top`, the
//! errors) run from the checkout against this build's binary, through
//! scripts/test_vramlens_api.py (standard library unittest; figures from
//! testdata/*.expected.json). Skipped, with a note, without `python3`.

use std::io::ErrorKind;
use std::path::Path;
use std::process::Command;

/// Runs scripts/test_vramlens_api.py with the given unittest names; None without python3.
fn run_api_tests(names: &[&str]) -> Option<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = Path::new("scripts").join("test_vramlens_api.py");
    let output = match Command::new("python3")
        .arg(&script)
        .arg("-v")
        .args(names)
        .current_dir(root)
        .env("PYTHONPATH", root.join("python"))
        .env("VRAMLENS_BINARY", env!("CARGO_BIN_EXE_vramlens"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => panic!("could not run python3 {}: {e}", script.display()),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "python3 {} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        script.display(),
        output.status
    );
    assert!(
        !stderr.contains("skipped"),
        "python3 {} skipped tests:\n{stderr}",
        script.display()
    );
    Some(())
}

#[test]
fn python_api_summary_and_errors() {
    if run_api_tests(&["SummaryTest", "ErrorTest", "ModuleTest"]).is_none() {
        println!("SKIPPED: python3 not found; the Python API tests did not run");
    }
}

#[test]
fn python_api_top() {
    run_api_tests(&["TopTest"]).expect("python3 not found: the Python API tests need it");
}

#[test]
fn python_api_every_command_with_json() {
    run_api_tests(&["CommandsTest"]).expect("python3 not found: the Python API tests need it");
}
