//! The categories of the generated fixtures `testdata/categories/*.pickle`, one rule of
//! the README's evidence order each. The expected bytes are the scenario's own figures
//! (the constants of `make_cat_*` in `scripts/gen_fixtures.py`), summed here by hand.

use std::collections::BTreeMap;
use std::process::Command;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// CAT_PARAMS: four of 4 MiB, two of 2 MiB + 4 KiB, three of 8 KiB.
const PARAMS: u64 = 4 * 4 * MIB + 2 * (2 * MIB + 4 * KIB) + 3 * 8 * KIB;
const ACT: u64 = 3 * MIB;
const STEP_TMP: u64 = 64 * MIB;
const BATCH: u64 = 64 * KIB;

/// What `vramlens ARGS` prints, run from the repository's root; it must succeed.
fn vramlens_stdout(args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlens"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn vramlens(args: &[&str]) -> serde_json::Value {
    serde_json::from_slice(&vramlens_stdout(args)).unwrap()
}

/// (bytes, evidence of the largest) by category at a moment.
fn categories(file: &str, at: &str) -> BTreeMap<String, (u64, String)> {
    let path = format!("testdata/categories/{file}");
    let v = vramlens(&["top", "--by", "category", "--at", at, "--json", &path]);
    v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap().to_string(),
                (
                    g["bytes"].as_u64().unwrap(),
                    g["category_evidence"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

fn bytes_of(c: &BTreeMap<String, (u64, String)>) -> BTreeMap<&str, u64> {
    c.iter().map(|(k, (b, _))| (k.as_str(), *b)).collect()
}

fn expect(file: &str, at: &str, want: &[(&str, u64)]) -> BTreeMap<String, (u64, String)> {
    let got = categories(file, at);
    let want: BTreeMap<&str, u64> = want.iter().copied().collect();
    assert_eq!(bytes_of(&got), want, "{file} at {at}");
    got
}

#[test]
fn gradients_made_by_a_backward_node_kept_as_grad_and_adamw_state() {
    // The peak: inside the first optimizer step, its 64 MiB temporary and one temporary
    // per parameter alive, with both moments of every parameter made.
    let peak = expect(
        "steal.pickle",
        "peak",
        &[
            ("parameters", PARAMS),
            ("gradients", PARAMS),
            ("optimizer_state", 2 * PARAMS),
            ("step_temporaries", STEP_TMP + PARAMS),
            ("activations", 4),
            ("other", BATCH),
        ],
    );
    assert_eq!(peak["gradients"].1, "lifetime:made_in_backward_outlived_it");
    assert_eq!(
        peak["step_temporaries"].1,
        "lifetime:made_and_freed_in_step"
    );
    assert!(peak["parameters"].1.starts_with("stack:"), "{peak:?}");
    expect(
        "steal.pickle",
        "end",
        &[
            ("parameters", PARAMS),
            ("gradients", PARAMS),
            ("optimizer_state", 2 * PARAMS),
        ],
    );
    // The gradients are named by the node whose kernel made them.
    let top = vramlens(&[
        "top",
        "--at",
        "end",
        "--json",
        "testdata/categories/steal.pickle",
    ]);
    let names: Vec<&str> = top["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"(backward of MmBackward0)"), "{names:?}");
}

#[test]
fn compiled_forward_and_backward_are_named_by_the_users_code_never_the_generated_file() {
    expect(
        "compiled.pickle",
        "end",
        &[
            ("parameters", PARAMS),
            ("gradients", PARAMS),
            ("other", BATCH),
        ],
    );
    let top = vramlens(&[
        "top",
        "--at",
        "peak",
        "--json",
        "testdata/categories/compiled.pickle",
    ]);
    for g in top["groups"].as_array().unwrap() {
        let name = g["name"].as_str().unwrap();
        assert!(!name.contains("torchinductor"), "{name}");
        if g["category"] == "activations" && g["bytes"].as_u64().unwrap() >= ACT {
            assert_eq!(name, "/home/alice/proj/layers.py:66:forward");
        }
    }
}

#[test]
fn the_users_own_modules_and_optimizer() {
    // The peak: the first step's 64 MiB temporary and the first parameter's temporary,
    // the moments made by the optimizer's __init__ and the first new moment.
    let peak = expect(
        "own_optimizer.pickle",
        "peak",
        &[
            ("parameters", PARAMS),
            ("gradients", PARAMS),
            ("optimizer_state", 2 * PARAMS + 4 * MIB),
            ("step_temporaries", STEP_TMP + 4 * MIB),
            ("activations", 4),
            ("other", BATCH),
        ],
    );
    assert_eq!(peak["optimizer_state"].1, "lifetime:made_in_optimizer_init");
    assert_eq!(peak["parameters"].1, "lifetime:made_in_init_kept");
    expect(
        "own_optimizer.pickle",
        "end",
        &[
            ("parameters", PARAMS),
            ("gradients", PARAMS),
            ("optimizer_state", 2 * PARAMS),
            ("other", BATCH),
        ],
    );
}

#[test]
fn memory_from_before_recording_by_sizes_and_old_moments_replaced_in_a_step() {
    let peak = expect(
        "old_moments.pickle",
        "peak",
        &[
            ("parameters", PARAMS),
            ("gradients", PARAMS),
            ("optimizer_state", 2 * PARAMS + 4 * MIB),
            ("step_temporaries", STEP_TMP + 4 * MIB),
            ("activations", 4),
            ("other", BATCH),
        ],
    );
    assert_eq!(peak["parameters"].1, "sizes:copy_1_of_2_optimizer_state");
    assert_eq!(peak["gradients"].1, "sizes:copy_2_of_2_optimizer_state");
    // The old moments, freed by the step as the new ones are made.
    let live = vramlens(&[
        "timeline",
        "--at",
        "peak",
        "--json",
        "testdata/categories/old_moments.pickle",
    ]);
    let old: u64 = live["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["category_evidence"] == "lifetime:before_recording_freed_in_step")
        .map(|a| {
            assert_eq!(a["category"], "optimizer_state");
            assert_eq!(a["category_inferred"], true);
            a["size_bytes"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(old, 2 * PARAMS);
}

#[test]
fn a_forward_only_trace_keeps_its_weights_from_before_recording() {
    expect(
        "forward_only.pickle",
        "peak",
        &[
            ("parameters", PARAMS),
            ("activations", 4 * ACT + 4),
            ("other", BATCH),
        ],
    );
    let end = expect("forward_only.pickle", "end", &[("parameters", PARAMS)]);
    assert_eq!(end["parameters"].1, "sizes:copy_1_of_1_equal_sets");
}

#[test]
fn a_kv_cache_grown_by_concatenation_over_decode_steps() {
    // KV_LAYERS 2, KV_PROMPT 16 tokens, KV_STEPS 8, 64 KiB a token: keys and values of
    // every layer, 24 tokens long at the end.
    let token = 64 * KIB;
    let end = expect(
        "kv_cache.pickle",
        "end",
        &[("parameters", PARAMS), ("caches", 2 * 2 * 24 * token)],
    );
    assert_eq!(end["caches"].1, "lifetime:grows_while_alive");
}

/// An attention benchmark that calls its own functions, no module anywhere (see
/// testdata/README.md): a file named `benchmark_*.py` and a function named
/// `annotated_scaled_dot_product_attention` say nothing of compilation (only triton's
/// `do_bench` does, a library frame); the scores and weights the function makes and
/// frees are its intermediates, and Q, K, V made before recording are inputs, not a
/// model's weights, gradients and optimizer state.
#[test]
fn an_attention_benchmark_without_modules_has_activations_and_inputs() {
    const MIB: u64 = 1 << 20;
    let peak = expect(
        "attention_bench.pickle",
        "peak",
        &[
            ("activations", 2 * 32 * MIB),
            ("compile", 16 * MIB),
            ("inputs", 3 * 2 * MIB),
        ],
    );
    assert_eq!(
        peak["activations"].1,
        "lifetime:made_and_freed_without_modules"
    );
    assert_eq!(peak["inputs"].1, "sizes:without_modules");
    assert!(peak["compile"].1.contains("triton/testing.py:120:do_bench"));
    expect("attention_bench.pickle", "end", &[("inputs", 3 * 2 * MIB)]);
    // The module-less rule leaves traces with modules alone: a forward-only model's
    // weights from before recording stay parameters.
    let fwd = categories("forward_only.pickle", "end");
    assert_eq!(fwd["parameters"].1, "sizes:copy_1_of_1_equal_sets");
}

/// `--rules` takes any number of categories and names the rule that decided by its line
/// in the file, blank and comment lines counted: 300 categories (past what 8 bits index),
/// the last one matching, in a file with comments and blank lines.
#[test]
fn a_rule_past_255_categories_is_named_by_its_line_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("# categories of my own\n\n");
    for i in 0..299 {
        if i % 50 == 0 {
            text.push_str("\n# another block\n");
        }
        text.push_str(&format!("cat_{i} = never_a_frame_{i}\\.py\n"));
    }
    text.push_str("\n   # the one that matches\n");
    text.push_str("cat_299 = nanogpt/model\\.py:192:forward\n");
    // 2 header lines, 6 blocks of a blank and a comment, 299 rules, a blank and a comment:
    // the matching rule is line 2 + 12 + 299 + 2 + 1.
    let line = text.lines().count();
    assert_eq!(line, 2 + 12 + 299 + 2 + 1);
    let rules = dir.path().join("rules.txt");
    std::fs::write(&rules, &text).unwrap();
    let v = vramlens(&[
        "top",
        "--json",
        "--rules",
        rules.to_str().unwrap(),
        "testdata/sample.pickle",
    ]);
    let g = v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| {
            g["name"]
                .as_str()
                .unwrap()
                .ends_with("model.py:192:forward")
        })
        .unwrap();
    assert_eq!(g["category"], "cat_299", "{g}");
    assert_eq!(g["category_evidence"], format!("rule:{line}"), "{g}");
    // A rule that is not the first of its category, under a comment: its own line.
    let rules2 = dir.path().join("rules2.txt");
    std::fs::write(
        &rules2,
        "# kv\nmine = nothing_here\n\n# again\nmine = nanogpt/model\\.py:192:forward\n",
    )
    .unwrap();
    let v = vramlens(&[
        "top",
        "--json",
        "--rules",
        rules2.to_str().unwrap(),
        "testdata/sample.pickle",
    ]);
    let g = v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| {
            g["name"]
                .as_str()
                .unwrap()
                .ends_with("model.py:192:forward")
        })
        .unwrap();
    assert_eq!(g["category"], "mine");
    assert_eq!(g["category_evidence"], "rule:5");
}

/// The half-precision copies of the weights under autocast, in stacks that record no C++
/// frame (so no `cached_cast` to read; testdata/README.md): each linear weight's copy is
/// half its bytes, one per weight, made in the forward and freed when the autocast region
/// ends, after the forward's last allocation. The peak holds every copy and two 1.5 MiB
/// outputs: the four 4 MiB weights copied as 2 MiB, the two of 2 MiB + 4 KiB as 1 MiB +
/// 2 KiB (the 8 KiB norms are not cast).
#[test]
fn autocast_copies_without_autocast_frames_are_decided_by_sizes_and_lifetime() {
    let copies = 4 * 2 * MIB + 2 * (MIB + 2 * KIB);
    let output = 3 * MIB / 2;
    let peak = expect(
        "autocast_no_frames.pickle",
        "peak",
        &[
            ("parameters", PARAMS),
            ("autocast_copies", copies),
            ("activations", 2 * output),
            ("other", BATCH),
        ],
    );
    assert_eq!(
        peak["autocast_copies"].1,
        "sizes:half_a_parameter_kept_through_forward"
    );
    // Event 3: the batch (0), the first copy (1, 2 MiB), the first output (2) and an
    // activation of 2 MiB (3), half a 4 MiB weight too, that the forward frees again:
    // the same size, told apart by its lifetime.
    let early = expect(
        "autocast_no_frames.pickle",
        "event:3",
        &[
            ("parameters", PARAMS),
            ("autocast_copies", 2 * MIB),
            ("activations", output + 2 * MIB),
            ("other", BATCH),
        ],
    );
    assert_eq!(early["activations"].1, "lifetime:made_in_forward");
    // The words say what decided it.
    let text = String::from_utf8(vramlens_stdout(&[
        "top",
        "--by",
        "category",
        "testdata/categories/autocast_no_frames.pickle",
    ]))
    .unwrap();
    assert!(
        text.contains("half a parameter's bytes, at most one per parameter"),
        "{text}"
    );
}

/// The same forward in fp32: no copies, and an output of 2 MiB (half a 4 MiB weight)
/// alive to the forward's end is one tensor, not a set of copies of half the weights. At
/// event 20 (the batch, the first layer's output with the 2 MiB activation made and
/// freed, five more outputs each freeing the one before, then the forward's output) the
/// last 3 MiB output and the 2 MiB output are alive.
#[test]
fn an_fp32_output_half_a_weight_is_an_activation() {
    let at = expect(
        "fp32_half_weight_output.pickle",
        "event:20",
        &[
            ("parameters", PARAMS),
            ("activations", ACT + 2 * MIB),
            ("other", BATCH),
        ],
    );
    assert_eq!(at["activations"].1, "lifetime:made_in_forward");
}

/// An attention benchmark with a backward and no module (testdata/README.md): the weights
/// the script makes and backward frees on the engine's thread were saved for backward, a
/// forward's activations, though no frame says forward. The peak is the scores' gradient:
/// Q, K, V, the output and its sum (made by the script, kept past backward), the saved
/// weights, and backward's seed and gradients of the output, weights and scores.
#[test]
fn what_a_script_makes_before_backward_and_backward_frees_is_activations() {
    let token = 512 * 4 * KIB;
    let pair = 512 * 512 * 128;
    let peak = expect(
        "attention_backward.pickle",
        "peak",
        &[
            ("activations", pair),
            ("backward_temporaries", 2 * pair + token + 4),
            ("other", 3 * token + token + 4),
        ],
    );
    assert_eq!(
        peak["activations"].1,
        "lifetime:made_before_backward_freed_by_it"
    );
    assert_eq!(
        peak["backward_temporaries"].1,
        "lifetime:made_and_freed_in_backward"
    );
}
