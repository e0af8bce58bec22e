//! The Python capture helper (python/vramlens/capture.py): runs its unittest suite
//! (scripts/test_vramlens_capture.py, standard library only, fakes for torch, nvidia-ml-py
//! and nvidia-smi) so `cargo test` covers it. Needs `python3` on PATH.

use std::io::ErrorKind;
use std::path::Path;
use std::process::Command;

#[test]
fn capture_helper_python_tests_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = Path::new("scripts").join("test_vramlens_capture.py");
    let output = match Command::new("python3")
        .arg(&script)
        .current_dir(root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            panic!("python3 not found: the capture helper's tests need Python 3 on PATH")
        }
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
}
