//! Every fixture in `testdata/` is summarised with the figures that the independent
//! Python computation wrote beside it (`<file>.expected.json`).

mod common;

use common::{compare, root, summary_json};

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
