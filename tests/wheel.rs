//! The wheel PyTorch users install (`pip install vramlens`): scripts/test_wheel.py builds it
//! with maturin (dev profile, reusing this build), installs it into a fresh virtual
//! environment and runs the `vramlens` command, `python -m vramlens.capture` and the Python
//! API there, comparing with this build's binary and testdata/sample.pickle.expected.json.
//! Ignored unless asked for: it needs maturin (`pip install maturin==1.16.0`), which .ci/run
//! installs before running it.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs maturin (pip install maturin==1.16.0)"]
fn wheel_installs_and_runs_in_a_fresh_venv() {
    let found = Command::new("maturin").arg("--version").output();
    assert!(
        found.as_ref().is_ok_and(|o| o.status.success()),
        "maturin not found: install it with `pip install maturin==1.16.0` to build the wheel"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new("python3")
        .arg(Path::new("scripts").join("test_wheel.py"))
        .args([
            "--profile",
            "dev",
            "--reference",
            env!("CARGO_BIN_EXE_vramlens"),
        ])
        .current_dir(root)
        .output()
        .expect("could not run python3 scripts/test_wheel.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "scripts/test_wheel.py failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    assert!(stdout.contains("test_wheel: all checks passed"), "{stdout}");
}
