//! Feeds arbitrary bytes to both input paths of vramlens: the two-pass pickle reader
//! with the snapshot builder, and the JSON decoder. Any panic, overflow, hang or
//! runaway allocation is a bug; errors are the expected outcome for almost every input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramlens::model::{SnapshotBuilder, decode_json};
use vramlens::pickle::{parse_with, scan_references};

fuzz_target!(|data: &[u8]| {
    // The pickle path, exactly as `vramlens::input::read_snapshot` runs it.
    if let Ok(refs) = scan_references(data) {
        let mut builder = SnapshotBuilder::new();
        if let Ok((root, _info)) = parse_with(data, refs, &mut builder) {
            let _ = builder.finish(&root);
        }
    }
    // The JSON path (cheap: most inputs fail at the first byte).
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = decode_json(&json);
    }
});
