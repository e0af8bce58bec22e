//! Attribution and `top`: call sites and categories of hand-written stacks, and groups
//! that add up to the independently computed totals on fixtures and real snapshots.

mod common;

use assert_cmd::Command;
use common::root;
use vramlens::analysis::device::choose_device;
use vramlens::analysis::kinds::attribution::{
    AttributionOptions, Attributor, GroupBy, GroupKind, parse_rules,
};
use vramlens::analysis::kinds::categories::bound_attributor;
use vramlens::analysis::moments::moment::Moment;
use vramlens::analysis::reports::top::Versions;
use vramlens::analysis::reports::top::analyze_top;
use vramlens::input::read_snapshot;
use vramlens::model::{Frame, FrameTable, StackId};
use vramlens::timeline::replay::DeviceReplay;

fn vramlens() -> Command {
    let mut c = Command::cargo_bin("vramlens").unwrap();
    c.current_dir(root());
    c
}

/// Interns a stack of `filename:line:name` frames, innermost first.
fn stack(t: &mut FrameTable, frames: &[&str]) -> StackId {
    let ids: Vec<_> = frames
        .iter()
        .map(|f| {
            // file:line:name, the name possibly holding colons (C++).
            let m = regex::Regex::new(":([0-9]+):").unwrap().find(f).unwrap();
            let file = &f[..m.start()];
            let line: i64 = f[m.start() + 1..m.end() - 1].parse().unwrap();
            let name = &f[m.end()..];
            let frame = Frame {
                filename: t.intern_str(file),
                name: t.intern_str(name),
                line,
            };
            t.intern_frame(frame)
        })
        .collect();
    t.intern_stack(&ids)
}

const TORCH: &str = "/venv/lib/python3.11/site-packages/torch";

#[test]
fn call_sites_and_categories_of_hand_written_stacks() {
    let linear = format!("{TORCH}/nn/modules/linear.py:125:forward");
    let call_impl = format!("{TORCH}/nn/modules/module.py:1747:_call_impl");
    let wrapped = format!("{TORCH}/nn/modules/module.py:1736:_wrapped_call_impl");
    let adam = format!("{TORCH}/optim/adam.py:94:_init_group");
    let tensor_backward = format!("{TORCH}/_tensor.py:581:backward");
    let module_init = format!("{TORCH}/nn/modules/linear.py:105:__init__");
    let apply = format!("{TORCH}/nn/modules/module.py:942:_apply");
    let collectives = format!(
        "{TORCH}/distributed/fsdp/_fully_shard/_fsdp_collectives.py:374:foreach_all_gather_copy_out"
    );
    let threading = "/usr/lib/python3.11/threading.py:1045:_bootstrap_inner";
    // (frames innermost first, call site, category)
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        // A Linear inside the user's model: the model's line, an activation.
        (
            vec![
                "??:0:at::native::linear(at::Tensor const&)",
                "python_nn_functions.cpp:0:torch::autograd::THPVariable_linear(_object*)",
                &linear,
                &call_impl,
                &wrapped,
                "/home/a/proj/model.py:42:forward",
                &call_impl,
                "/home/a/proj/train.py:88:main",
            ],
            "/home/a/proj/model.py:42:forward",
            "activations",
        ),
        // Optimizer state created by step(): the user's loop line, optimizer state.
        (
            vec![&adam, "/home/a/proj/train.py:95:main"],
            "/home/a/proj/train.py:95:main",
            "optimizer_state",
        ),
        // loss.backward() from the main thread.
        (
            vec![&tensor_backward, "/home/a/proj/train.py:91:main"],
            "/home/a/proj/train.py:91:main",
            "backward_temporaries",
        ),
        // Building the model, then model.cuda().
        (
            vec![&module_init, "/home/a/proj/model.py:20:__init__"],
            "/home/a/proj/model.py:20:__init__",
            "parameters",
        ),
        (
            vec![&apply, "/home/a/proj/train.py:30:main"],
            "/home/a/proj/train.py:30:main",
            "parameters",
        ),
        // An FSDP all-gather inside a forward: communication, named by torch's frame
        // (no user frame below it).
        (
            vec![&collectives, threading],
            collectives.as_str(),
            "communication",
        ),
        // C++ only: the autograd engine's thread during backward, named by its node.
        (
            vec![
                "CUDACachingAllocator.cpp:0:c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)",
                "??:0:torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)",
                "??:0:torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)",
            ],
            "(backward of MmBackward0)",
            "backward_temporaries",
        ),
        // ... and without a node frame.
        (
            vec![
                "CUDACachingAllocator.cpp:0:c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)",
                "??:0:torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)",
            ],
            "(C++ autograd engine, backward)",
            "backward_temporaries",
        ),
        // A call through einops: the user's line below it, not einops.
        (
            vec![
                "/venv/lib/python3.11/site-packages/torch/functional.py:422:einsum",
                "/venv/lib/python3.11/site-packages/einops/_backends.py:288:einsum",
                "/venv/lib/python3.11/site-packages/einops/einops.py:907:einsum",
                "/home/a/proj/linear.py:36:forward",
            ],
            "/home/a/proj/linear.py:36:forward",
            "activations",
        ),
        // Inductor's generated module: the model's line the kernel came from.
        (
            vec![
                "/tmp/torchinductor_a/hw/chwq7ux2iggyu22lv3vwzoxwfp5jw7w3gandpny7kmdlqdksiuib.py:53:call",
                "/venv/lib/python3.11/site-packages/torch/_inductor/output_code.py:460:__call__",
                "/home/a/proj/model.py:501:forward",
            ],
            "/home/a/proj/model.py:501:forward",
            "activations",
        ),
        // C++ only: NCCL.
        (
            vec![
                "CUDACachingAllocator.cpp:0:c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)",
                "ProcessGroupNCCL.cpp:0:c10d::ProcessGroupNCCL::allgather(std::vector<at::Tensor>&)",
            ],
            "(C++ NCCL / c10d)",
            "communication",
        ),
        // C++ only: nothing but the allocator.
        (
            vec![
                "CUDACachingAllocator.cpp:0:c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)",
            ],
            "(C++ allocator frames only)",
            "other",
        ),
    ];
    let mut table = FrameTable::new();
    let ids: Vec<StackId> = cases
        .iter()
        .map(|(frames, _, _)| stack(&mut table, frames))
        .collect();
    let attr = Attributor::new(&table, &AttributionOptions::default());
    for ((frames, site, category), id) in cases.iter().zip(&ids) {
        let s = attr.stack_site(Some(*id));
        assert_eq!(&attr.site_name(&s), site, "call site of {frames:?}");
        let l = lifetime_with(*id);
        assert_eq!(
            attr.categories[attr.category(&l) as usize],
            *category,
            "category of {frames:?}"
        );
    }
    // --keep shows torch's own frame; --skip goes past the model to the loop.
    let keep = AttributionOptions {
        keep: Some(regex::Regex::new("torch/nn/modules/linear").unwrap()),
        ..Default::default()
    };
    let attr = Attributor::new(&table, &keep);
    assert_eq!(attr.site_name(&attr.stack_site(Some(ids[0]))), linear);
    let skip = AttributionOptions {
        skip: Some(regex::Regex::new("model\\.py").unwrap()),
        ..Default::default()
    };
    let attr = Attributor::new(&table, &skip);
    assert_eq!(
        attr.site_name(&attr.stack_site(Some(ids[0]))),
        "/home/a/proj/train.py:88:main"
    );
    // User rules come first and may name new categories.
    let rules = AttributionOptions {
        rules: parse_rules("# kv cache\nkv_cache = model\\.py:42\n").unwrap(),
        ..Default::default()
    };
    let attr = Attributor::new(&table, &rules);
    assert_eq!(
        attr.categories[attr.category(&lifetime_with(ids[0])) as usize],
        "kv_cache"
    );
    assert_eq!(
        attr.categories[attr.category(&lifetime_with(ids[1])) as usize],
        "optimizer_state"
    );
    assert!(
        parse_rules("no equals sign")
            .unwrap_err()
            .contains("line 1")
    );
    assert!(parse_rules("x = (").unwrap_err().contains("bad pattern"));
}

/// A traced allocation with a stack, through the public replay of a one-event trace.
fn lifetime_with(stack: StackId) -> vramlens::timeline::Lifetime {
    use vramlens::model::trace::NewEvent;
    use vramlens::model::{Action, DeviceTrace, Snapshot};
    let mut trace = DeviceTrace::default();
    trace.push(NewEvent {
        action: Some(Action::Alloc),
        addr: 0x1000,
        size: 512,
        stack: Some(stack),
        ..Default::default()
    });
    let snap = Snapshot {
        segments: Vec::new(),
        device_traces: vec![trace],
        ..Snapshot::default()
    };
    let tl = common::timeline::build(&snap, 0);
    tl.lifetimes[0]
}

/// Checks `top` at the peak of every device of a file against the peaks of its
/// expected figures (`scripts/expected.py`), for every grouping and a small limit.
fn check_file(path: &std::path::Path, expected: &serde_json::Value) -> usize {
    let (snap, info) = read_snapshot(path, Default::default()).unwrap();
    let mut checked = 0;
    for dev in expected["devices"].as_array().unwrap() {
        let device = dev["device"].as_i64().unwrap();
        let Some(peak) = dev["peak_requested_bytes"].as_u64() else {
            continue;
        };
        let choice = choose_device(&snap, Some(device)).unwrap();
        let replay = DeviceReplay::new(&snap, device);
        let attr = bound_attributor(&replay, &AttributionOptions::default());
        for by in [
            GroupBy::Callsite,
            GroupBy::Category,
            GroupBy::Stack,
            GroupBy::File,
        ] {
            for limit in [3, 100_000] {
                let r = analyze_top(
                    &replay,
                    &info.path,
                    &choice,
                    Moment::Peak,
                    by,
                    limit,
                    &attr,
                    (),
                )
                .unwrap();
                assert_eq!(r.total_bytes, peak, "{} device {device}", info.path);
                assert_eq!(
                    r.moment.event.map(u64::from),
                    dev["peak_requested_index"].as_u64(),
                    "{} device {device}",
                    info.path
                );
                let sum: u64 = r.groups.iter().map(|g| g.bytes).sum();
                assert_eq!(sum, peak, "{} device {device} by {by:?}", info.path);
                let count: usize = r.groups.iter().map(|g| g.count).sum();
                assert_eq!(count, r.count);
                assert!(r.groups.len() <= limit + 1);
                assert!(
                    r.groups
                        .windows(2)
                        .all(|w| w[0].bytes >= w[1].bytes || w[1].kind == GroupKind::Rest)
                );
            }
        }
        // Folded stacks of the same moment add up to it too, and so does the tree.
        let r = vramlens::timeline::replay::DeviceReplay::new(&snap, device);
        let at = dev["peak_requested_index"].as_u64().map(|i| i as usize);
        let live = vramlens::analysis::reports::top::live_state(&r, at, Versions::Counted);
        // The one-pass live set at the peak is the two-pass one, in the same order.
        let one_pass = vramlens::analysis::reports::top::live_state_at_peak(&r, Versions::Counted);
        assert_eq!(one_pass.at, at, "{} device {device}", info.path);
        assert_eq!(
            one_pass.lifetimes, live.lifetimes,
            "{} device {device}",
            info.path
        );
        assert_eq!(one_pass.block_bytes, live.block_bytes);
        assert_eq!(
            (one_pass.requested_bytes, one_pass.allocated_bytes),
            (live.requested_bytes, live.allocated_bytes)
        );
        assert_eq!(one_pass.reserved_bytes, live.reserved_bytes);
        assert_eq!(
            (&one_pass.streams, &one_pass.pools),
            (&live.streams, &live.pools)
        );
        let (root, folded) =
            vramlens::analysis::kinds::flame::flame(&attr, &live, &Default::default());
        assert_eq!(folded.iter().map(|(_, b)| b).sum::<u64>(), peak);
        assert_eq!(root.bytes, peak);
        assert!(
            folded
                .iter()
                .all(|(s, _)| !s.is_empty() && !s.contains('\n'))
        );
        checked += 1;
    }
    checked
}

#[test]
fn groups_add_up_to_the_peak_on_every_fixture() {
    let mut checked = 0;
    let mut files: Vec<_> = std::fs::read_dir(root().join("testdata"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".expected.json"))
        .collect();
    for job in ["ok", "oom", "oom_exp", "oom_cap"] {
        for e in std::fs::read_dir(root().join("testdata/gpu").join(job)).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().ends_with(".expected.json") {
                files.push(p);
            }
        }
    }
    files.sort();
    for exp in files {
        let path = exp.to_string_lossy().replace(".expected.json", "");
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&exp).unwrap()).unwrap();
        checked += check_file(std::path::Path::new(&path), &expected);
    }
    assert!(checked >= 20, "checked {checked} devices");
}

#[test]
#[ignore = "needs ../shared/data"]
fn groups_add_up_to_the_peak_on_every_real_snapshot() {
    let data = common::require_shared_data();
    let expected: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/data/real_expected.json")).unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    for (rel, exp) in &expected {
        let path = data.join(rel);
        if path.exists() {
            checked += check_file(&path, exp);
        }
    }
    assert!(checked >= 20, "checked {checked} devices");
}

#[test]
fn the_leak_in_our_h200_recording_is_named_first() {
    let out = vramlens()
        .args([
            "top",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--json",
            "--limit",
            "3",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 2);
    assert_eq!(v["moment"]["kind"], "peak");
    let first = &v["groups"][0];
    assert_eq!(first["name"], "<string>:31:leaky_eval");
    assert_eq!(first["kind"], "frame");
    assert_eq!(first["category"], "activations");
    // 1107 allocations of the leak's line are live at the peak; hand count from the
    // trace: every alloc with that frame innermost-user, never freed before the peak.
    assert!(first["count"].as_u64().unwrap() > 900);
    let text = vramlens()
        .args(["top", "testdata/gpu/oom/oom_snapshot.pickle"])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.lines()
            .nth(3)
            .unwrap()
            .contains("<string>:31 in leaky_eval"),
        "{text}"
    );
}

#[test]
fn bad_arguments_and_files_without_a_trace_are_refused() {
    for (args, message) in [
        (
            vec!["top", "testdata/sample.pickle", "--by", "colour"],
            "invalid value 'colour' for '--by <KEY>': expected callsite, category, stack or file",
        ),
        (
            vec!["top", "testdata/sample.pickle", "--at", "lunch"],
            "invalid value 'lunch' for '--at <MOMENT>': expected peak, oom, end",
        ),
        (
            vec!["top", "testdata/sample.pickle", "--at", "event:100000"],
            "event 100000 is out of range; device 0 has 330 events",
        ),
        (
            vec!["top", "testdata/sample.pickle", "--device", "3"],
            "device 3 has no segment and no trace entry in this file; it has device 0",
        ),
        (
            vec!["top", "testdata/v1_13_list.pickle", "--at", "event:0"],
            "has no trace, so no moment but its final state",
        ),
    ] {
        vramlens()
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicates::str::contains(message));
    }
    // The final state of a file without a trace can still be listed, and is what the
    // default (the peak) gives.
    vramlens()
        .args(["top", "testdata/v1_13_list.pickle", "--at", "end"])
        .assert()
        .success();
    vramlens()
        .args(["top", "testdata/v1_13_list.pickle"])
        .assert()
        .success()
        .stdout(predicates::str::contains("final state (no trace recorded)"));
}

#[test]
fn moments_by_time_accept_what_the_outputs_print() {
    // The sample's peak is after event 71 at 2025-06-15 15:06:40.006 UTC.
    let by_time = |at: &str| {
        let out = vramlens()
            .args(["top", "testdata/sample.pickle", "--json", "--at", at])
            .output()
            .unwrap();
        assert!(out.status.success(), "{at}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["moment"]["event"].as_u64()
    };
    let peak = by_time("peak").unwrap();
    assert_eq!(peak, 71);
    let t = by_time("event:71");
    assert_eq!(t, Some(71));
    // The printed peak time resolves to the peak: of the events stamped within that
    // millisecond, the one after which the most memory is requested.
    let at_time = by_time("time:2025-06-15 15:06:40.006 UTC").unwrap();
    assert_eq!(at_time, 71);
    assert!(by_time("time:+0us").is_some());
    assert_eq!(by_time("end"), Some(329));
}

#[test]
fn flamegraph_writes_svg_and_folded_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("flame.svg");
    vramlens()
        .args(["flamegraph", "testdata/sample.pickle", "-o"])
        .arg(&svg)
        .assert()
        .success();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"));
    // The root box carries the peak's bytes (expected.json: 468296708).
    assert!(text.contains(r#"data-bytes="468296708""#));
    assert_eq!(
        text.matches("<title>").count(),
        text.matches("</title>").count()
    );
    // Never overwritten without --force.
    vramlens()
        .args(["flamegraph", "testdata/sample.pickle", "-o"])
        .arg(&svg)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("already exists"));
    let out = vramlens()
        .args(["flamegraph", "testdata/sample.pickle", "--folded"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let folded = String::from_utf8(out.stdout).unwrap();
    let sum: u64 = folded
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, 468296708);
    // Root first: every line starts at the script's module frame.
    assert!(
        folded
            .lines()
            .all(|l| l.starts_with("/home/alice/nanogpt/train.py:251:<module>"))
    );
    vramlens()
        .args(["flamegraph", "testdata/sample.pickle"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("give -o FILE.svg"));
}

#[test]
fn leak_suspects_need_repeated_steps() {
    let leaks = |file: &str| {
        let out = vramlens()
            .args(["top", file, "--leaks", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{file}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["leaks"].clone()
    };
    // Our H200 recording: five training steps, then an evaluation loop that keeps every
    // output. Both of its lines grow in (nearly) every sample since the loop began.
    let l = leaks("testdata/gpu/oom/oom_snapshot.pickle");
    assert!(l["steps"]["step_annotations"].as_u64().unwrap() >= 2);
    let names: Vec<&str> = l["suspects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["<string>:31:leaky_eval", "<string>:30:leaky_eval"]);
    assert!(l["suspects"][0]["bytes"].as_u64().unwrap() > 100 << 30);
    // The same job without the leak names nothing.
    let l = leaks("testdata/gpu/ok/snapshot.pickle");
    assert_eq!(l["suspects"], serde_json::json!([]));
    // One training step: growth cannot be told from activations.
    let l = leaks("testdata/sample.pickle");
    assert_eq!(l["steps"]["total_drops"], 0);
    assert_eq!(l["suspects"], serde_json::json!([]));
    // One step and a second forward (testdata/README.md, budget/): the total falls back
    // twice, after the backward and after the step, but the moments AdamW makes in that
    // step grow once and are kept: growth within one step is no leak.
    let l = leaks("testdata/budget/batch_bs2.pickle");
    assert_eq!(l["steps"]["total_drops"], 2);
    assert_eq!(l["suspects"], serde_json::json!([]));
}

/// Steps known only by the total falling back: a suspect must grow from one step's end
/// to the next, twice. A real 2.7B training step (CS336) whose total falls twice before
/// its end grows its gradients over its one backward: no leak.
#[test]
#[ignore = "needs ../shared/data"]
fn growth_within_one_real_step_is_no_leak() {
    let data = common::require_shared_data();
    let file = data.join("cs336-aimetrics/memory_2.7b_train_seq128.pickle");
    let out = vramlens()
        .args(["top", "--leaks", "--at", "end", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["leaks"]["steps"]["total_drops"], 2);
    assert_eq!(v["leaks"]["suspects"], serde_json::json!([]));
}

/// `diff` of every pair of fixtures: a file against itself changes nothing, and the
/// groups' changes add up to the difference of the totals.
#[test]
fn diff_changes_add_up() {
    let files = [
        "testdata/sample.pickle",
        "testdata/gpu/ok/snapshot.pickle",
        "testdata/gpu/oom/oom_snapshot.pickle",
        "testdata/v2_5.json",
        "testdata/multi_device.pickle",
    ];
    for by in ["callsite", "category", "stack", "file"] {
        for a in files {
            for b in files {
                let out = vramlens()
                    .args(["diff", a, b, "--json", "--by", by])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{a} {b}");
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let groups = v["groups"].as_array().unwrap();
                let sum: i64 = groups
                    .iter()
                    .map(|g| g["delta_bytes"].as_i64().unwrap())
                    .sum();
                assert_eq!(sum, v["delta_bytes"].as_i64().unwrap(), "{a} {b} by {by}");
                let base_total = v["base"]["total_bytes"].as_i64().unwrap();
                let new_total = v["new"]["total_bytes"].as_i64().unwrap();
                assert_eq!(new_total - base_total, sum);
                let base_sum: u64 = groups
                    .iter()
                    .map(|g| g["base_bytes"].as_u64().unwrap())
                    .sum();
                assert_eq!(base_sum as i64, base_total);
                if a == b {
                    assert!(
                        groups
                            .iter()
                            .all(|g| g["delta_bytes"] == 0 && g["change"] == "same")
                    );
                }
            }
        }
    }
}

#[test]
fn check_exits_1_over_budget_and_names_what_grew() {
    // The leak run against the run without it: 1, with the leak's lines listed.
    let out = vramlens()
        .args([
            "check",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--baseline",
            "testdata/gpu/ok/snapshot.pickle",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["passed"], false);
    assert_eq!(v["grew"][0]["name"], "<string>:31:leaky_eval");
    // At the sample's peak of allocated bytes (its expected.json): a budget at that
    // passes, one byte less fails.
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("testdata/sample.pickle.expected.json")).unwrap(),
    )
    .unwrap();
    let peak = expected["devices"][0]["peak_allocated_bytes"]
        .as_u64()
        .unwrap();
    vramlens()
        .args([
            "check",
            "testdata/sample.pickle",
            "--max-peak",
            &peak.to_string(),
        ])
        .assert()
        .code(0);
    vramlens()
        .args([
            "check",
            "testdata/sample.pickle",
            "--max-peak",
            &(peak - 1).to_string(),
        ])
        .assert()
        .code(1)
        .stdout(predicates::str::contains("FAIL"));
    // Units as SI tools read them: n KB is n * 1000 bytes, n KiB n * 1024, and the check
    // echoes the limit it understood in bytes.
    let n = peak.div_ceil(1000) - 1;
    assert!(
        n * 1000 < peak && n * 1024 >= peak,
        "sample peak {peak} too small"
    );
    vramlens()
        .args([
            "check",
            "testdata/sample.pickle",
            "--max-peak",
            &format!("{n}KB"),
        ])
        .assert()
        .code(1)
        .stdout(predicates::str::contains(format!("({} bytes)", n * 1000)));
    vramlens()
        .args([
            "check",
            "testdata/sample.pickle",
            "--max-peak",
            &format!("{n}KiB"),
        ])
        .assert()
        .code(0)
        .stdout(predicates::str::contains(format!("({} bytes)", n * 1024)));
    // Against itself: within any tolerance.
    vramlens()
        .args([
            "check",
            "testdata/sample.pickle",
            "--baseline",
            "testdata/sample.pickle",
            "--tolerance",
            "0",
        ])
        .assert()
        .code(0);
    // Bad input stays 2.
    vramlens()
        .args(["check", "testdata/sample.pickle"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "give --max-peak SIZE, --baseline SNAPSHOT",
        ));
    vramlens()
        .args(["check", "testdata/bad/truncated.pickle", "--max-peak", "1G"])
        .assert()
        .code(2);
}

#[test]
fn ranks_of_several_files() {
    let out = vramlens()
        .args([
            "top",
            "testdata/sample.pickle",
            "testdata/gpu/ok/snapshot.pickle",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "ranks");
    let expected = |f: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(root().join(f)).unwrap()).unwrap()
    };
    // Each row's peak is the independent computation's.
    for (row, exp) in v["rows"].as_array().unwrap().iter().zip([
        "testdata/sample.pickle.expected.json",
        "testdata/gpu/ok/snapshot.pickle.expected.json",
        "testdata/gpu/oom/oom_snapshot.pickle.expected.json",
    ]) {
        assert_eq!(
            row["peak_requested_bytes"],
            expected(exp)["devices"][0]["peak_requested_bytes"]
        );
    }
    // The median of the three is the run without the leak; the leak run is the outlier,
    // and what differs is the leak's lines.
    assert_eq!(v["median"], "testdata/gpu/ok/snapshot.pickle");
    assert_eq!(v["largest"], "testdata/gpu/oom/oom_snapshot.pickle");
    let outliers: Vec<bool> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outlier"].as_bool().unwrap())
        .collect();
    assert_eq!(outliers, [false, false, true]);
    assert_eq!(v["differences"][0]["name"], "<string>:31:leaky_eval");
    // summary --ranks of the same files ends with the same table (one more JSON line).
    let out = vramlens()
        .args([
            "summary",
            "--ranks",
            "testdata/sample.pickle",
            "testdata/gpu/ok/snapshot.pickle",
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--json",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    let last: serde_json::Value = serde_json::from_str(lines[3]).unwrap();
    assert_eq!(last, v);
}

#[test]
#[ignore = "needs ../shared/data"]
fn a_folder_of_ranks() {
    let data = common::require_shared_data();
    let dir = data.join("ccl-bench-torchtitan-fsdp-oom");
    let out = vramlens()
        .arg("top")
        .arg(&dir)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    // Rank 1 ran on device 1; each row on its own device.
    assert_eq!(rows[0]["device"], 0);
    assert_eq!(rows[1]["device"], 1);
    assert!(rows.iter().all(|r| r["ooms"] == 1 && r["outlier"] == false));
}

/// Ranks without a trace have no peak to compare, and the table says so.
#[test]
fn ranks_without_peaks_say_there_is_nothing_to_compare() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["rank0.pickle", "rank1.pickle"] {
        std::fs::copy("testdata/v1_13_list.pickle", dir.path().join(name)).unwrap();
    }
    let out = vramlens().arg("summary").arg(dir.path()).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("no peaks to compare"), "{text}");
    assert!(!text.contains("above the median"), "{text}");
}

#[test]
fn check_gates_the_value_at_a_moment_and_a_file_without_a_trace() {
    let exp = |f: &str| -> serde_json::Value {
        serde_json::from_str(
            &std::fs::read_to_string(root().join(format!("testdata/{f}.expected.json"))).unwrap(),
        )
        .unwrap()
    };
    let run = |args: &[&str]| vramlens().arg("check").args(args).output().unwrap();
    // A file without a trace: its final state (scripts/expected.py) is what is checked.
    let allocated = exp("v1_13_list.pickle")["devices"][0]["allocated_bytes"]
        .as_u64()
        .unwrap();
    for at in [None, Some("end")] {
        let mut args = vec!["testdata/v1_13_list.pickle".to_string()];
        if let Some(at) = at {
            args.extend(["--at".to_string(), at.to_string()]);
        }
        let with = |max: u64| {
            let mut a = args.clone();
            a.extend(["--max-peak".to_string(), max.to_string()]);
            run(&a.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let ok = with(allocated);
        assert_eq!(ok.status.code(), Some(0), "{at:?}");
        let text = String::from_utf8(ok.stdout).unwrap();
        assert!(
            text.contains(
                "the final state is the only figure the file has, and it is what is checked"
            ),
            "{text}"
        );
        assert_eq!(with(allocated - 1).status.code(), Some(1), "{at:?}");
    }
    // With a trace, --at end checks the final state's block bytes, not the peak's: the
    // active blocks (the one freed but pending on another stream is still held).
    let e = &exp("sample.pickle")["devices"][0];
    let (end, peak) = (
        e["active_bytes"].as_u64().unwrap(),
        e["peak_allocated_bytes"].as_u64().unwrap(),
    );
    assert!(end < peak);
    let out = run(&[
        "testdata/sample.pickle",
        "--at",
        "end",
        "--max-peak",
        &end.to_string(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["peak_bytes"], end);
    assert_eq!(v["moment"]["kind"], "end");
    let out = run(&["testdata/sample.pickle", "--max-peak", &end.to_string()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the peak is over the end's value"
    );
}

#[test]
fn the_rank_table_shows_peak_reserved_and_whole_words() {
    let out = vramlens()
        .args([
            "top",
            "testdata/sample.pickle",
            "testdata/v2_2.pickle",
            "testdata/v1_13_list.pickle",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let exp = |f: &str| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(root().join(format!("testdata/{f}.expected.json"))).unwrap(),
        )
        .unwrap();
        v["devices"][0].clone()
    };
    let b = |v: &serde_json::Value| vramlens::units::bytes(v.as_u64().unwrap());
    assert!(
        text.lines().nth(1).unwrap().contains("peak reserved"),
        "{text}"
    );
    let row = |file: &str| {
        text.lines()
            .find(|l| l.contains(&format!("testdata/{file}")))
            .unwrap_or_else(|| panic!("{file}: {text}"))
            .to_string()
    };
    // The peaks of reserved memory (scripts/expected.py), not the end's values.
    let sample = exp("sample.pickle");
    assert_ne!(sample["peak_reserved_bytes"], sample["reserved_bytes"]);
    assert!(row("sample.pickle").contains(&format!("  {}  ", b(&sample["peak_reserved_bytes"]))));
    // Without a trace there is no peak: the end's reserved bytes, said so.
    let old = exp("v1_13_list.pickle");
    assert!(row("v1_13_list.pickle").contains(&format!("{} (end)", b(&old["reserved_bytes"]))));
    // Group names whole: "model.py:192 in forward", never cut inside a word.
    assert!(
        row("sample.pickle").contains(" model.py:192 in forward "),
        "{text}"
    );
    assert!(
        text.contains("1 rank's peak is more than 10% above the median's"),
        "{text}"
    );
}

/// A frame as `(filename, line, name)`.
type CraftedFrame<'a> = (&'a str, i64, &'a str);

/// A final-state snapshot (no trace) of one device, each block `(bytes, frames)` with its
/// frames innermost first; written with serde-pickle.
fn crafted_snapshot(path: &std::path::Path, blocks: &[(i64, Vec<CraftedFrame>)]) {
    use serde_pickle::{HashableValue as HV, SerOptions, Value as SV};
    let dict = |items: Vec<(&str, SV)>| {
        SV::Dict(
            items
                .into_iter()
                .map(|(k, v)| (HV::String(k.into()), v))
                .collect(),
        )
    };
    let base: i64 = 0x7f00_0000_0000;
    let total: i64 = blocks.iter().map(|(b, _)| b).sum();
    let mut address = base;
    let mut list = Vec::new();
    for (size, frames) in blocks {
        let frames = frames
            .iter()
            .map(|(file, line, name)| {
                dict(vec![
                    ("filename", SV::String(file.to_string())),
                    ("line", SV::I64(*line)),
                    ("name", SV::String(name.to_string())),
                ])
            })
            .collect();
        list.push(dict(vec![
            ("address", SV::I64(address)),
            ("size", SV::I64(*size)),
            ("requested_size", SV::I64(*size)),
            ("state", SV::String("active_allocated".into())),
            ("frames", SV::List(frames)),
        ]));
        address += size;
    }
    let segment = dict(vec![
        ("device", SV::I64(0)),
        ("address", SV::I64(base)),
        ("total_size", SV::I64(total)),
        ("allocated_size", SV::I64(total)),
        ("active_size", SV::I64(total)),
        ("requested_size", SV::I64(total)),
        ("stream", SV::I64(0)),
        ("segment_type", SV::String("large".into())),
        ("blocks", SV::List(list)),
    ]);
    let root = dict(vec![
        ("segments", SV::List(vec![segment])),
        ("device_traces", SV::List(vec![SV::List(vec![])])),
    ]);
    std::fs::write(
        path,
        serde_pickle::value_to_vec(&root, SerOptions::new()).unwrap(),
    )
    .unwrap();
}

const MIB: i64 = 1 << 20;

/// Python's `train.py` calls `forward`, which calls five C++ frames down to the allocator
/// (two blocks, 3 MiB and 1 MiB); `build` allocates with no C++ frame recorded (2 MiB);
/// the autograd engine allocates with three C++ frames and no Python one (512 KiB).
fn python_calls_cpp(dir: &std::path::Path) -> std::path::PathBuf {
    let cpp: [CraftedFrame; 5] = [
        (
            "CUDACachingAllocator.cpp",
            0,
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long)",
        ),
        (
            "EmptyTensor.cpp",
            0,
            "at::detail::empty_cuda(c10::ArrayRef<long>)",
        ),
        (
            "??",
            0,
            "at::_ops::empty_memory_format::call(c10::ArrayRef<long>)",
        ),
        (
            "TensorFactories.cpp",
            0,
            "at::native::zeros(c10::ArrayRef<long>)",
        ),
        (
            "python_torch_functions.cpp",
            0,
            "torch::autograd::THPVariable_zeros(_object*, _object*)",
        ),
    ];
    let forward = ("/home/u/proj/model.py", 42, "forward");
    let module = ("/home/u/proj/train.py", 10, "<module>");
    let with_cpp: Vec<_> = cpp.iter().copied().chain([forward, module]).collect();
    let path = dir.join("python_calls_cpp.pickle");
    crafted_snapshot(
        &path,
        &[
            (3 * MIB, with_cpp.clone()),
            (
                2 * MIB,
                vec![("/home/u/proj/model.py", 50, "build"), module],
            ),
            (MIB, with_cpp),
            (
                MIB / 2,
                vec![
                    (
                        "CUDACachingAllocator.cpp",
                        0,
                        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long)",
                    ),
                    (
                        "??",
                        0,
                        "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)",
                    ),
                    (
                        "??",
                        0,
                        "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)",
                    ),
                ],
            ),
        ],
    );
    path
}

fn folded(args: &[&str]) -> String {
    let out = vramlens().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn cpp_frames_under_a_python_frame_fold_into_one_element_unless_all_frames_are_asked() {
    let dir = tempfile::tempdir().unwrap();
    let snap = python_calls_cpp(dir.path());
    let snap = snap.to_str().unwrap();
    // The five C++ frames under forward are one element holding both blocks (3 + 1 MiB);
    // the C++-only stack is its call site over its three frames.
    assert_eq!(
        folded(&["flamegraph", "--folded", snap]),
        "(backward of MmBackward0);(3 C++ frames) 524288\n\
         /home/u/proj/train.py:10:<module>;/home/u/proj/model.py:42:forward;(5 C++ frames) 4194304\n\
         /home/u/proj/train.py:10:<module>;/home/u/proj/model.py:50:build 2097152\n"
    );
    // Every frame, root first, with --all-frames.
    assert_eq!(
        folded(&["flamegraph", "--folded", "--all-frames", snap]),
        "/home/u/proj/train.py:10:<module>;/home/u/proj/model.py:42:forward;\
         python_torch_functions.cpp:0:torch::autograd::THPVariable_zeros(_object*, _object*);\
         TensorFactories.cpp:0:at::native::zeros(c10::ArrayRef<long>);\
         ??:0:at::_ops::empty_memory_format::call(c10::ArrayRef<long>);\
         EmptyTensor.cpp:0:at::detail::empty_cuda(c10::ArrayRef<long>);\
         CUDACachingAllocator.cpp:0:c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long) 4194304\n\
         /home/u/proj/train.py:10:<module>;/home/u/proj/model.py:50:build 2097152\n\
         ??:0:torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&);\
         ??:0:torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&);\
         CUDACachingAllocator.cpp:0:c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long) 524288\n"
    );
    // The graph's boxes are the folded elements: one `(5 C++ frames)` box of 4 MiB.
    let svg = dir.path().join("flame.svg");
    vramlens()
        .args(["flamegraph", snap, "-o"])
        .arg(&svg)
        .assert()
        .success();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<title>(5 C++ frames)\n4.0 MiB (61.5% of the live bytes), 2 allocations")
    );
    assert!(!text.contains("empty_cuda"));
}

/// Each box of a flame graph: (width in pixels, data-bytes, label if drawn).
fn flame_boxes(svg: &str) -> Vec<(f64, u64, Option<String>)> {
    let attr = |line: &str, name: &str| -> Option<String> {
        let at = line.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(line[at..at + line[at..].find('"')?].to_string())
    };
    let lines: Vec<&str> = svg.lines().collect();
    let mut boxes = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.contains("<rect") || !line.contains("data-bytes") {
            continue;
        }
        let width: f64 = attr(line, "width").unwrap().parse().unwrap();
        let bytes: u64 = attr(line, "data-bytes").unwrap().parse().unwrap();
        let label = lines.get(i + 1).and_then(|next| {
            let t = next.strip_prefix("<text ")?;
            let start = t.find('>')? + 1;
            Some(t[start..t.find("</text>")?].to_string())
        });
        boxes.push((width, bytes, label));
    }
    boxes
}

#[test]
fn flame_boxes_wide_enough_carry_their_bytes_in_the_label() {
    let dir = tempfile::tempdir().unwrap();
    let snap = python_calls_cpp(dir.path());
    let svg = dir.path().join("flame.svg");
    vramlens()
        .args(["flamegraph", snap.to_str().unwrap(), "-o"])
        .arg(&svg)
        .assert()
        .success();
    let boxes = flame_boxes(&std::fs::read_to_string(&svg).unwrap());
    let labels: Vec<&str> = boxes.iter().filter_map(|b| b.2.as_deref()).collect();
    // 6.5 MiB over 1180 pixels: the root, forward, its C++ box and build have room for the
    // name, the bytes and (for frames) where; the 512 KiB box (90 pixels) for a name cut.
    assert_eq!(
        labels,
        [
            "all (6.5 MiB)",
            "&lt;module&gt; (6.0 MiB)  proj/train.py:10",
            "forward (4.0 MiB)  proj/model.py:42",
            "(5 C++ frames) (4.0 MiB)",
            "build (2.0 MiB)  proj/model.py:50",
            "(backward of…",
            "(3 C++…",
        ]
    );
    // A box 6.2 pixels a character wide enough for a name and its bytes shows both.
    for (width, bytes, label) in &boxes {
        let size = format!("({})", vramlens::units::bytes(*bytes));
        if *width >= 6.0 + 6.2 * 40.0 {
            assert!(label.as_deref().unwrap().contains(&size), "{label:?}");
        }
    }
}

/// Files whose names state sizes of one kind are one model at several sizes: no file
/// is an outlier, whatever its peak against the median, and the answer says why.
#[test]
fn a_series_of_sizes_has_no_outlier() {
    let files = [
        "testdata/budget/attn_seq128.pickle",
        "testdata/budget/attn_seq256.pickle",
        "testdata/budget/attn_seq512.pickle",
    ];
    let out = vramlens()
        .arg("top")
        .args(files)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["series"]["vary"], "seq");
    assert_eq!(v["series"]["smallest"], 128);
    assert_eq!(v["series"]["largest"], 512);
    let rows = v["rows"].as_array().unwrap();
    // The largest peak is well above the median's, yet no file is an outlier.
    assert!(
        rows.iter()
            .any(|r| r["peak_over_median"].as_f64().unwrap() > 1.1),
        "{v}"
    );
    assert!(rows.iter().all(|r| r["outlier"] == false));
    let text = vramlens().arg("top").args(files).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("the files' names state sizes (sequence length 128 to 512): one model at several sizes, not ranks of one job, so no file is an outlier"),
        "{text}"
    );
    // Files of one job (no size in their names) are ranks, as before.
    let v: serde_json::Value = serde_json::from_slice(
        &vramlens()
            .args([
                "top",
                "testdata/sample.pickle",
                "testdata/gpu/ok/snapshot.pickle",
                "--json",
            ])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(v["series"].is_null());
}

/// Names that state no size keyword but differ only in one number that is no rank's
/// (`small_128` .. `small_1024`), and names that state model sizes (`small`, `xl`,
/// `2.7B`), are not ranks of one job: no outlier, and the answer says why. Names that
/// differ in a rank's number stay ranks.
#[test]
fn names_of_several_sizes_or_models_are_not_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let copy = |from: &str, to: &str| {
        let path = dir.path().join(to);
        std::fs::copy(root().join(from), &path).unwrap();
        path.to_str().unwrap().to_string()
    };
    let sources = [
        "testdata/budget/attn_seq128.pickle",
        "testdata/budget/attn_seq256.pickle",
        "testdata/budget/attn_seq512.pickle",
    ];
    let top = |files: &[String]| -> serde_json::Value {
        let out = vramlens()
            .arg("top")
            .args(files)
            .arg("--json")
            .output()
            .unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let outliers = |v: &serde_json::Value| -> usize {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["outlier"] == true)
            .count()
    };
    // The same three files under three kinds of names.
    let numbered: Vec<String> = ["128", "256", "1024"]
        .iter()
        .zip(sources)
        .map(|(n, f)| copy(f, &format!("memory_small_{n}_forward.pickle")))
        .collect();
    let v = top(&numbered);
    assert_eq!(v["series"]["vary"], serde_json::Value::Null);
    assert_eq!(v["series"]["smallest"], 128);
    assert_eq!(v["series"]["largest"], 1024);
    assert_eq!(outliers(&v), 0, "{v}");

    let models: Vec<String> = ["small", "xl", "2.7B"]
        .iter()
        .zip(sources)
        .map(|(m, f)| copy(f, &format!("memory_snapshot_{m}_bwd.pickle")))
        .collect();
    let v = top(&models);
    assert_eq!(v["model_sizes"], serde_json::json!(["small", "xl", "2.7B"]));
    assert_eq!(outliers(&v), 0, "{v}");
    let text = vramlens().arg("top").args(&models).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("the files' names state model sizes (small, xl, 2.7B): several models, not ranks of one job, so no file is an outlier"),
        "{text}"
    );

    // Ranks: the same files named rank0..rank2 keep their outlier (the 512 one).
    let ranks: Vec<String> = sources
        .iter()
        .enumerate()
        .map(|(i, f)| copy(f, &format!("rank{i}_snapshot.pickle")))
        .collect();
    let v = top(&ranks);
    assert_eq!(v["series"], serde_json::Value::Null);
    assert_eq!(v["model_sizes"], serde_json::Value::Null);
    assert_eq!(outliers(&v), 1, "{v}");
}
