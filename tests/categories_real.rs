//! Categories at the peak of real snapshots, against bytes derived without vramlens: the
//! parameter tensors of the models' published configurations (the CS336 assignment's
//! table, the TinyStories model of its first assignment, GPT-2's vocabulary, Llama 3 8B
//! sharded eight ways), the categories an `export_memory_timeline` file states (summed
//! from its rows here), and, where noted, events read by hand from the trace. At most 5%
//! of each peak may fall in another category than these say. Needs `../shared/data`.

mod common;

use common::require_shared_data;
use std::collections::BTreeMap;
use std::process::Command;

/// Bytes of the fp32 parameters of a CS336-style decoder: token embedding and output
/// head (vocab x d), per layer two RMSNorm weights, q/k/v/o (d x d) and a SwiGLU
/// feed-forward (three d x ff), and a final norm.
fn cs336_parameter_bytes(vocab: u64, d: u64, ff: u64, layers: u64) -> u64 {
    let per_layer = 2 * d + 4 * d * d + 3 * d * ff;
    4 * (2 * vocab * d + layers * per_layer + d)
}

/// The CS336 assignment-2 model table (vocab 10,000).
fn cs336(size: &str) -> u64 {
    let (d, ff, layers) = match size {
        "small" => (768, 3072, 12),
        "medium" => (1024, 4096, 24),
        "xl" => (1600, 6400, 48),
        "2.7B" => (2560, 10240, 32),
        other => panic!("no CS336 size {other}"),
    };
    cs336_parameter_bytes(10_000, d, ff, layers)
}

/// Bytes by category at the peak, as `top --by category --json` gives them.
/// What `vramlens ARGS PATH` prints; it must succeed.
fn vramlens_stdout(args: &[&str], path: &std::path::Path) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlens"))
        .args(args)
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn categories_at_peak(path: &std::path::Path) -> (u64, BTreeMap<String, u64>) {
    let out = vramlens_stdout(
        &[
            "top", "--by", "category", "--at", "peak", "--json", "--limit", "100",
        ],
        path,
    );
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let total = v["total_bytes"].as_u64().unwrap();
    let groups = v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap().to_string(),
                g["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    (total, groups)
}

/// Bytes in a category other than `truth` says: the categories named there are compared
/// one by one, all others together against what is left of the peak.
fn misplaced(total: u64, actual: &BTreeMap<String, u64>, truth: &[(&str, u64)]) -> u64 {
    let mut err = 0i128;
    let mut named_actual = 0i128;
    let mut named_truth = 0i128;
    for &(c, bytes) in truth {
        let a = actual.get(c).copied().unwrap_or(0) as i128;
        err += (a - bytes as i128).abs();
        named_actual += a;
        named_truth += bytes as i128;
    }
    let rest_actual = total as i128 - named_actual;
    let rest_truth = total as i128 - named_truth;
    err += (rest_actual - rest_truth).abs();
    (err / 2) as u64
}

fn check(rel: &str, truth: &[(&str, u64)]) -> Option<String> {
    let path = require_shared_data().join(rel);
    let (total, actual) = categories_at_peak(&path);
    let wrong = misplaced(total, &actual, truth);
    let share = wrong as f64 / total as f64;
    eprintln!(
        "{rel}: {:.2}% of the peak misplaced ({actual:?})",
        share * 100.0
    );
    (share > 0.05).then(|| {
        format!(
            "{rel}: {:.1}% of the {total}-byte peak is misplaced; expected {truth:?}, found {actual:?}",
            share * 100.0
        )
    })
}

#[test]
#[ignore = "needs ../shared/data"]
fn categories_at_the_peak_match_the_models_sizes() {
    // GPT-2's vocabulary (50,257) with the CS336 small dimensions: the sizes of
    // cs336-bcrafton's tensors (154,389,504 = 50,257 x 768 x 4).
    let gpt2_small = cs336_parameter_bytes(50_257, 768, 3072, 12);
    let embedding = 50_257 * 768 * 4;
    // The TinyStories model of CS336 assignment 1: d 512, ff 1344, 4 layers.
    let tinystories = cs336_parameter_bytes(10_000, 512, 1344, 4);
    // Llama 3 8B (vocab 128,256, d 4096, 32 layers, ff 14,336, 8 KV heads of 128): its
    // 8,030,261,248 parameters in fp32, sharded over 8 ranks.
    let llama3_8b: u64 = 2 * 128_256 * 4096
        + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14_336 + 2 * 4096)
        + 4096;
    assert_eq!(llama3_8b, 8_030_261_248);
    let cases: Vec<(&str, Vec<(&str, u64)>)> = vec![
        (
            "cs336-kkaitlyn111/memory_ctx128_fullstep.pickle",
            vec![
                ("parameters", cs336("2.7B")),
                ("gradients", cs336("2.7B")),
                ("optimizer_state", 2 * cs336("2.7B")),
            ],
        ),
        (
            "cs336-kkaitlyn111/memory_2.7b_forward.pickle",
            vec![
                ("parameters", cs336("2.7B") + cs336("xl")),
                ("gradients", cs336("xl")),
            ],
        ),
        (
            "cs336-kkaitlyn111/memory_ctx128_forward.pickle",
            vec![("parameters", cs336("2.7B"))],
        ),
        (
            "cs336-wedsonlin/medium_128_inference_memory_snapshot.pickle",
            vec![("parameters", cs336("medium"))],
        ),
        (
            "cs336-silmont2000/memory_forward_fp32_128.pickle",
            vec![("parameters", cs336("small"))],
        ),
        (
            "cs336-silmont2000/memory_forward_bf16_128.pickle",
            vec![("parameters", cs336("small"))],
        ),
        // The peak is event 1843, inside the optimizer step: the old moments (two per
        // parameter, from before recording) are all alive; the new moments of the
        // embedding are made (optimizer.py:74 at event 1826, :75 at 1836) and kept; three
        // embedding-sized temporaries of optimizer.py:78 (events 1841-1843) are freed
        // at events 1847-1849 within the step.
        (
            "cs336-bcrafton/memory_snapshot.pickle",
            vec![
                ("parameters", gpt2_small),
                ("gradients", gpt2_small),
                ("optimizer_state", 2 * gpt2_small + 2 * embedding),
                ("step_temporaries", 3 * embedding),
            ],
        ),
        (
            "cs336-magma27-windows/memory_snapshot.pickle",
            vec![
                ("parameters", cs336("small")),
                ("gradients", cs336("small")),
            ],
        ),
        (
            "cs336-niuhuangxiaozi/forward_and_backward_memory_snapshot_200_mixed_precision.pickle",
            vec![
                ("parameters", tinystories),
                ("optimizer_state", 2 * tinystories),
            ],
        ),
        // An attention benchmark with no module (trace_peak_memory.py), its peak after
        // event 52 in backward. Activations: the three tensors its own `custom_softmax`
        // made (lines 6, 7, 8: events 13, 16, 19) that autograd's nodes released in
        // backward (events 81, 72, 79: `MaxBackward0::release_variables`,
        // `ExpBackward0::release_variables`, the engine). Backward temporaries: events
        // 34 (2 MiB) and 40, 46, 48, 50, 52 (512 MiB each), made by backward nodes.
        (
            "cs336-silmont2000/mem_snapshot.pickle",
            vec![
                ("activations", 536_870_912 + 262_144 + 131_072),
                ("backward_temporaries", 2_097_152 + 5 * 536_870_912),
            ],
        ),
        (
            "ccl-bench-torchtitan-fsdp-oom/rank0_memory_snapshot.pickle",
            vec![("parameters", llama3_8b * 4 / 8)],
        ),
    ];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(rel, truth)| check(rel, truth))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An `export_memory_timeline` file states each tensor's category: summed here from its
/// rows (`[time_ns, action, bytes, category]`, bytes negative when memory goes), at the
/// first moment of the highest total.
#[test]
#[ignore = "needs ../shared/data"]
fn a_memory_timeline_keeps_its_own_categories() {
    let path = require_shared_data().join("hta-test-data/memory_timeline.raw.gz");
    let mut raw = Vec::new();
    use std::io::Read;
    flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let rows: Vec<(i64, i64, i64, i64)> = serde_json::from_slice(&raw).unwrap();
    // PyTorch's category order (torch.profiler._memory_profiler.Category).
    const NAMES: [&str; 8] = [
        "parameters",
        "optimizer_state",
        "inputs",
        "activations", // temporary
        "activations",
        "gradients",
        "backward_temporaries", // autograd_detail
        "unknown",
    ];
    let mut sorted = rows.clone();
    sorted.sort_by_key(|r| r.0.max(i64::MIN + 1));
    let mut now = [0i64; 8];
    let mut best = (i64::MIN, now);
    for (_, _, bytes, category) in &sorted {
        now[*category as usize] += bytes;
        let total: i64 = now.iter().sum();
        if total > best.0 {
            best = (total, now);
        }
    }
    let mut truth: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, b) in best.1.iter().enumerate() {
        *truth.entry(NAMES[i]).or_default() += *b as u64;
    }
    let (total, actual) = categories_at_peak(&path);
    let truth: Vec<(&str, u64)> = truth.into_iter().collect();
    let wrong = misplaced(total, &actual, &truth);
    assert!(
        (wrong as f64) < 0.05 * total as f64,
        "{wrong} of {total} misplaced: expected {truth:?}, found {actual:?}"
    );
}

/// The allocations of a file that `export` calls autocast's copies: (device, alloc event).
fn autocast_copies(path: &std::path::Path, out: &std::path::Path) -> Vec<(u64, u64)> {
    let out_dir = out.to_str().unwrap();
    vramlens_stdout(&["export", "--format", "jsonl", "-o", out_dir], path);
    let mut copies = Vec::new();
    for dir in std::fs::read_dir(out.join("lifetimes")).unwrap() {
        let text = std::fs::read_to_string(dir.unwrap().path().join("part-0.jsonl")).unwrap();
        for row in text.lines() {
            let v: serde_json::Value = serde_json::from_str(row).unwrap();
            if v["category"] == "autocast_copies" {
                copies.push((
                    v["device"].as_u64().unwrap(),
                    v["alloc_event"].as_u64().unwrap(),
                ));
            }
        }
    }
    copies.sort_unstable();
    copies
}

/// Autocast's copies decided by sizes and lifetime where the stacks record no C++ frame
/// are the ones its `cached_cast` frame marks: each real bf16 recording (whose stacks
/// hold C++ frames) against the same file with only its Python frames kept
/// (`scripts/strip_cpp_frames.py`, as `stacks="python"` records them), allocation by
/// allocation; and fp32 recordings stripped the same way have none.
#[test]
#[ignore = "needs ../shared/data"]
fn autocast_copies_without_cpp_frames_are_the_ones_cached_cast_marks() {
    let data = require_shared_data();
    let tmp = tempfile::tempdir().unwrap();
    let strip = |rel: &str, name: &str| {
        let out = tmp.path().join(name);
        let status = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/strip_cpp_frames.py"
            ))
            .arg(data.join(rel))
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success(), "{rel}");
        out
    };
    for (i, (rel, expected)) in [
        ("cs336-silmont2000/memory_forward_bf16_128.pickle", 85),
        (
            "cs336-aimetrics/memory_2.7b_forward_seq128_bf16.pickle",
            225,
        ),
        ("cs336-aimetrics/memory_2.7b_train_seq128_bf16.pickle", 225),
        ("cs336-rohanbansal12/xl_ctx512_forward_bf16.pickle", 225),
        (
            "cs336-bolongcheng/memory_snapshot_xl_fwd_cl512_dtypetorch.bfloat16.pickle",
            225,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let by_frames = autocast_copies(&data.join(rel), &tmp.path().join(format!("f{i}")));
        let stripped = strip(rel, &format!("s{i}.pickle"));
        let by_sizes = autocast_copies(&stripped, &tmp.path().join(format!("s{i}")));
        assert_eq!(by_frames.len(), expected, "{rel}");
        assert_eq!(by_sizes, by_frames, "{rel}");
    }
    for (i, rel) in [
        "cs336-wedsonlin/medium_128_inference_memory_snapshot.pickle",
        "cs336-rohanbansal12/xl_ctx512_forward.pickle",
        "cs336-aimetrics/memory_2.7b_train_seq128.pickle",
        "cs336-magma27-windows/memory_snapshot.pickle",
    ]
    .into_iter()
    .enumerate()
    {
        let stripped = strip(rel, &format!("p{i}.pickle"));
        let by_sizes = autocast_copies(&stripped, &tmp.path().join(format!("p{i}")));
        assert!(by_sizes.is_empty(), "{rel}: {by_sizes:?}");
    }
}
