//! Feeds arbitrary bytes to every input path of vramlens: the whole reader as the binary
//! runs it on a file held in memory (format sniffing, gzip, JSON, HTML pages, the
//! two-pass pickle reader, decoding), the streaming pickle path that gzip input takes,
//! and the JSON decoder. Any panic, overflow, hang or runaway allocation is a bug; errors
//! are the expected outcome for almost every input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramlens::input::read_snapshot_bytes;
use vramlens::model::{SnapshotBuilder, decode_json};
use vramlens::pickle::{parse_with, scan_references};

fuzz_target!(|data: &[u8]| {
    // Everything `vramlens summary FILE` does to read a file, from its bytes.
    let _ = read_snapshot_bytes(data);
    // The pickle path over a stream (as gzip content is read), with the decoder.
    if let Ok(refs) = scan_references(data) {
        let mut builder = SnapshotBuilder::new();
        if let Ok((root, info)) = parse_with(data, refs, &mut builder) {
            let _ = builder.finish_sized(&root, info.bytes);
        }
    }
    // The JSON path (cheap: most inputs fail at the first byte).
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = decode_json(&json);
    }
});
