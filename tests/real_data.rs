//! Every snapshot in `../shared/data` (real dumps from public projects) is summarised
//! with the figures `scripts/expected.py --real` computed independently with Python's
//! pickle. Needs `../shared/data` (ignored by default; `.ci/run` runs it where it exists).

mod common;

use common::{compare, require_shared_data, root, summary_json};

#[test]
#[ignore = "needs ../shared/data"]
fn every_real_snapshot_matches_an_independent_computation() {
    let data = require_shared_data();
    let expected: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/data/real_expected.json")).unwrap(),
    )
    .unwrap();
    let mut diffs = Vec::new();
    let mut checked = 0;
    for (rel, exp) in &expected {
        let path = data.join(rel);
        if !path.exists() {
            diffs.push(format!("{rel}: not in ../shared/data"));
            continue;
        }
        diffs.extend(compare(rel, exp, &summary_json(&path)));
        checked += 1;
    }
    assert!(checked > 0, "no real snapshot found");
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    eprintln!("checked {checked} real snapshots");
}

/// The replay counts an allocation that holds a block of the final segments at that
/// block's real size, so the peak of allocated block bytes vramlens finds is never below
/// what the final segments hold (a peak lower than the end would read as a
/// contradiction). The final figure is the independent one of `scripts/expected.py`.
#[test]
#[ignore = "needs ../shared/data"]
fn no_peak_of_allocated_bytes_is_below_the_final_blocks() {
    let data = require_shared_data();
    let expected: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/data/real_expected.json")).unwrap(),
    )
    .unwrap();
    let mut peaks = 0;
    for (rel, exp) in &expected {
        let path = data.join(rel);
        if !path.exists() {
            continue;
        }
        let ours = summary_json(&path);
        for d in exp["devices"].as_array().unwrap() {
            let allocated = d["allocated_bytes"].as_u64().unwrap();
            let device = &d["device"];
            let Some(peak) = ours["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["device"] == *device)
                .and_then(|o| o["peak_allocated_bytes"].as_u64())
            else {
                continue;
            };
            assert!(
                peak >= allocated,
                "{rel} device {device}: peak allocated {peak} below the final {allocated}"
            );
            peaks += 1;
        }
    }
    assert!(peaks > 20, "only {peaks} devices with a trace");
}
