//! Shared helpers for integration tests: comparing a summary with the figures that
//! `scripts/expected.py` computed independently (stdlib pickle, no vramlens code).

#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use vramlens::analysis::reports::summary::{SummaryOptions, analyze_summary};
use vramlens::input::{ReadOptions, read_snapshot};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared/data` beside the project, when present.
pub fn shared_data() -> Option<PathBuf> {
    let p = root().join("../shared/data");
    p.is_dir().then_some(p)
}

/// `../shared/data`, for a test marked `#[ignore = "needs ../shared/data"]`: a test that
/// is run without the data fails, saying why, rather than passing without checking.
pub fn require_shared_data() -> PathBuf {
    shared_data().unwrap_or_else(|| {
        panic!(
            "../shared/data not found beside {}: this test needs the real files \
             (run it where they are, or without --include-ignored)",
            root().display()
        )
    })
}

/// The summary of a file as JSON, as `vramlens summary --json` prints it.
pub fn summary_json(path: &Path) -> Value {
    let (snap, info) = read_snapshot(path, ReadOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::to_value(analyze_summary(&snap, &info, SummaryOptions::default())).unwrap()
}

const DEVICE_FIELDS: [&str; 13] = [
    "device",
    "segments",
    "segments_large",
    "segments_small",
    "segments_expandable",
    "blocks",
    "blocks_by_state",
    "reserved_bytes",
    "allocated_bytes",
    "active_bytes",
    "requested_bytes",
    "free_block_bytes",
    "rounding_waste_bytes",
];

/// Compares every figure of `expected` with `actual`; returns the differences.
pub fn compare(name: &str, expected: &Value, actual: &Value) -> Vec<String> {
    let mut diffs = Vec::new();
    let mut check = |what: String, e: &Value, a: &Value| {
        if e != a {
            diffs.push(format!("{name}: {what}: expected {e}, found {a}"));
        }
    };
    check(
        "pickle_protocol".into(),
        &expected["pickle_protocol"],
        &actual["source"]["pickle_protocol"],
    );
    check("root".into(), &expected["root"], &actual["layout"]["root"]);
    let ed = expected["devices"].as_array().unwrap();
    let ad = actual["devices"].as_array().unwrap();
    let ids = |v: &Vec<Value>| v.iter().map(|d| d["device"].clone()).collect::<Vec<_>>();
    check(
        "devices".into(),
        &Value::from(ids(ed)),
        &Value::from(ids(ad)),
    );
    for (e, a) in ed.iter().zip(ad) {
        let dev = &e["device"];
        for f in DEVICE_FIELDS.iter().chain(&[
            "largest_free_block_bytes",
            "peak_requested_bytes",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
        ]) {
            check(format!("device {dev} {f}"), &e[*f], &a[*f]);
        }
        for peak in ["peak_requested", "peak_allocated"] {
            check(
                format!("device {dev} {peak}_event"),
                &e[format!("{peak}_index")],
                &a[format!("{peak}_event")],
            );
        }
        for f in ["events", "actions", "first_time_us", "last_time_us"] {
            check(
                format!("device {dev} trace.{f}"),
                &e["trace"][f],
                &a["trace"][f],
            );
        }
        let ooms = |v: &Value| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|o| {
                    (
                        o["index"].clone(),
                        o["size"].clone(),
                        o["device_free"].clone(),
                    )
                })
                .collect::<Vec<_>>()
        };
        check(
            format!("device {dev} ooms (index, size, device_free)"),
            &Value::from(format!("{:?}", ooms(&e["ooms"]))),
            &Value::from(format!("{:?}", ooms(&a["ooms"]))),
        );
    }
    diffs
}

/// Reserved bytes of a device just after event `index`, computed by hand from the raw
/// trace entries: the final segments minus the segment events after it.
pub fn reserved_after(snap: &vramlens::model::Snapshot, device: i64, index: usize) -> u64 {
    use vramlens::model::Action;
    let mut reserved: i64 = snap.segments_of(device).map(|s| s.total_size as i64).sum();
    for e in snap.trace(device).unwrap().iter().skip(index + 1) {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => reserved -= e.size as i64,
            Action::SegmentFree | Action::SegmentUnmap => reserved += e.size as i64,
            _ => {}
        }
    }
    reserved as u64
}

/// A page or chart as headless Chromium draws it at `width` x `height`, with networking
/// off: the pixels and the number of samples per pixel. Panics when Chromium is missing
/// (for tests marked `#[ignore = "needs chromium"]`).
pub fn chromium_pixels(url: &str, width: u32, height: u32) -> (Vec<u8>, usize) {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chromium not found in /usr/bin: this test needs it (apt-get install chromium)");
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("shot.png");
    let status = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--window-size={width},{height}"))
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .arg(format!("--screenshot={}", png.display()))
        .arg(url)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "chromium failed on {url}");
    let decoder = png::Decoder::new(std::fs::File::open(&png).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (width, height));
    buf.truncate(info.buffer_size());
    (buf, info.color_type.samples())
}

pub mod pickled;
pub mod timeline;
