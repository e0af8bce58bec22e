//! Every snapshot in `../shared/data` (real dumps from public projects) is summarised
//! with the figures `scripts/expected.py --real` computed independently with Python's
//! pickle. Skipped, saying so, when `../shared/data` is absent.

mod common;

use common::{compare, root, shared_data, summary_json};

#[test]
fn every_real_snapshot_matches_an_independent_computation() {
    let Some(data) = shared_data() else {
        eprintln!("SKIPPED: ../shared/data not found; real-snapshot checks did not run");
        return;
    };
    let expected: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/data/real_expected.json")).unwrap(),
    )
    .unwrap();
    let mut diffs = Vec::new();
    let mut checked = 0;
    for (rel, exp) in &expected {
        let path = data.join(rel);
        if !path.exists() {
            eprintln!("SKIPPED: {rel} is not in ../shared/data");
            continue;
        }
        diffs.extend(compare(rel, exp, &summary_json(&path)));
        checked += 1;
    }
    assert!(checked > 0, "no real snapshot found");
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    eprintln!("checked {checked} real snapshots");
}
