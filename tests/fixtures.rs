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
