//! Feeds arbitrary bytes to every input path of vramlens: the whole reader as the binary
//! runs it on a file held in memory (format sniffing, gzip, JSON, HTML pages, the
//! two-pass pickle reader, decoding), the streaming pickle path that gzip input takes,
//! the reader with workers decoding ahead, and the JSON decoder. Any panic, overflow, hang or runaway allocation is a bug; errors
//! are the expected outcome for almost every input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use vramlens::input::read_snapshot_bytes;
use vramlens::model::{SnapshotBuilder, decode_json};
use vramlens::pickle::{parse_slice, parse_with, scan_references, scan_slice_chunks};

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
    // The pickle path with workers decoding stretches ahead (from the first entry, over
    // small stretches, so that small inputs use them).
    if let Ok((refs, Some(stretches))) = scan_slice_chunks(data, 16, None) {
        let shared: Arc<Vec<u8>> = Arc::new(data.to_vec());
        let mut builder = SnapshotBuilder::new();
        builder.set_workers_after(0);
        builder.set_parallel(shared.clone(), stretches, refs.clone(), 2);
        if let Ok((root, info)) = parse_slice(&shared, refs, &mut builder) {
            let _ = builder.finish_sized(&root, info.bytes);
        }
    }
    // The JSON path (cheap: most inputs fail at the first byte).
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = decode_json(&json);
    }
});
