//! Every fixture in `testdata/` is summarised with the figures that the independent
//! Python computation wrote beside it (`<file>.expected.json`).

mod common;

use common::{compare, root, summary_json};
use std::path::{Path, PathBuf};

#[test]
fn every_fixture_matches_its_independent_figures() {
    let dir = root().join("testdata");
    let mut checked = 0;
    let mut diffs = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for expected_path in entries {
        let name = expected_path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let Some(fixture) = name.strip_suffix(".expected.json") else {
            continue;
        };
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&expected_path).unwrap()).unwrap();
        let actual = summary_json(&dir.join(fixture));
        diffs.extend(compare(fixture, &expected, &actual));
        checked += 1;
    }
    assert!(checked >= 19, "only {checked} fixtures found");
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

/// Real PyTorch 2.11 snapshots we recorded on an H200 (scripts/gpu_capture_check.py)
/// match the independent figures too.
#[test]
fn our_gpu_recordings_match_their_independent_figures() {
    let dir = root().join("testdata/gpu");
    let mut checked = 0;
    let mut diffs = Vec::new();
    for job in ["ok", "oom", "oom_exp", "oom_cap"] {
        for name in ["snapshot.pickle", "oom_snapshot.pickle"] {
            let file = dir.join(job).join(name);
            if !file.exists() {
                continue;
            }
            let expected_path = dir.join(job).join(format!("{name}.expected.json"));
            let expected: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&expected_path).unwrap()).unwrap();
            diffs.extend(compare(
                &format!("{job}/{name}"),
                &expected,
                &summary_json(&file),
            ));
            checked += 1;
        }
    }
    assert_eq!(checked, 7);
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

/// Runs `python3 ARGS` from `cwd`; panics, saying why, when python3 is missing.
fn python3(args: &[&std::ffi::OsStr], cwd: &Path) -> std::process::Output {
    std::process::Command::new("python3")
        .args(args)
        .current_dir(cwd)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 (the fixture scripts need it): {e}"))
}

/// Files under `dir` as sorted paths relative to it, leaving out the top-level folders
/// named in `skip`.
fn files_under(dir: &Path, skip: &[&str]) -> Vec<PathBuf> {
    fn walk(base: &Path, dir: &Path, skip: &[&str], out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(base).unwrap().to_path_buf();
            if skip.iter().any(|s| rel == Path::new(s)) {
                continue;
            }
            if p.is_dir() {
                walk(base, &p, skip, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, skip, &mut out);
    out.sort();
    out
}

/// `testdata/allocator/` is exactly what `scripts/gen_allocator_fixtures.py` writes.
#[test]
fn committed_allocator_fixtures_are_what_their_generator_writes() {
    let dir = tempfile::tempdir().unwrap();
    let script = root().join("scripts/gen_allocator_fixtures.py");
    let out = python3(
        &[script.as_os_str(), "--out".as_ref(), dir.path().as_os_str()],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "gen_allocator_fixtures.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = root().join("testdata/allocator");
    let generated = files_under(dir.path(), &[]);
    assert_eq!(generated, files_under(&committed, &[]));
    for rel in &generated {
        assert_eq!(
            std::fs::read(dir.path().join(rel)).unwrap(),
            std::fs::read(committed.join(rel)).unwrap(),
            "{}",
            rel.display()
        );
    }
}

/// The committed fixtures are exactly what `scripts/gen_fixtures.py` writes: it is run
/// into a temporary folder and every file is compared byte for byte, and no file in
/// `testdata/` is left over from an older generator (`gpu/` and `logs/` are recordings,
/// `profile/` is written by `scripts/gen_profile_pair.py`).
#[test]
fn committed_fixtures_are_what_the_generator_writes() {
    let dir = tempfile::tempdir().unwrap();
    let script = root().join("scripts/gen_fixtures.py");
    let out = python3(
        &[script.as_os_str(), "--out".as_ref(), dir.path().as_os_str()],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "gen_fixtures.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = files_under(dir.path(), &[]);
    let committed = files_under(
        &root().join("testdata"),
        &["gpu", "logs", "profile", "allocator"],
    );
    assert_eq!(generated, committed, "generated vs committed file lists");
    let differ: Vec<_> = generated
        .iter()
        .filter(|rel| {
            std::fs::read(dir.path().join(rel)).unwrap()
                != std::fs::read(root().join("testdata").join(rel)).unwrap()
        })
        .collect();
    assert!(
        differ.is_empty(),
        "differ from the generator's output (run python3 scripts/gen_fixtures.py): {differ:?}"
    );
}

/// `scripts/expected.py --real` looks for `../shared/data` beside the repository it is
/// in, whatever the working directory: a copy of the script in a layout of its own finds
/// the data beside it.
#[test]
fn expected_py_finds_shared_data_beside_the_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    std::fs::create_dir_all(t.join("repo/scripts")).unwrap();
    std::fs::create_dir_all(t.join("shared/data/sub")).unwrap();
    std::fs::create_dir_all(t.join("elsewhere")).unwrap();
    std::fs::copy(
        root().join("scripts/expected.py"),
        t.join("repo/scripts/expected.py"),
    )
    .unwrap();
    std::fs::copy(
        root().join("testdata/v2_2.pickle"),
        t.join("shared/data/sub/one.pickle"),
    )
    .unwrap();
    let script = t.join("repo/scripts/expected.py");
    let json = t.join("out.json");
    let run = || {
        python3(
            &[script.as_os_str(), "--real".as_ref(), json.as_os_str()],
            &t.join("elsewhere"),
        )
    };
    let out = run();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("testdata/v2_2.pickle.expected.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(got, serde_json::json!({ "sub/one.pickle": want }));
    // Without the folder: an error naming it, not an empty result.
    std::fs::remove_dir_all(t.join("shared")).unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "expected.py: error: {} is not a folder\n",
            t.join("shared/data").display()
        )
    );
}
