//! Hostile inputs, round three: every test crafts its snapshot here (with serde-pickle, a
//! pickle writer that is not vramlens's), filling every string slot of the format with
//! text chosen by the test, and checks what each output makes of it: no forged line, no
//! character a markup parser refuses, no secret left by redaction.

use serde_pickle::{HashableValue as HV, SerOptions, Value as SV};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use common::pickled::{dict, i, s};

/// A dict whose keys are texts of the test (unknown keys).
fn dict_owned(items: Vec<(String, SV)>) -> SV {
    SV::Dict(
        items
            .into_iter()
            .map(|(k, v)| (HV::String(k), v))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// Where the text of a slot goes: `text(slot)` gives the string written there.
type Text<'a> = &'a dyn Fn(&str) -> String;

fn frames(text: Text, at: &str) -> SV {
    SV::List(vec![
        dict(vec![
            (
                "filename",
                s(&format!("{}/model.py", text(&format!("{at}.filename")))),
            ),
            ("line", i(10)),
            ("name", s(&text(&format!("{at}.name")))),
        ]),
        dict(vec![
            (
                "filename",
                s("/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py"),
            ),
            ("line", i(125)),
            ("name", s("forward")),
        ]),
    ])
}

const BASE: i64 = 0x7f00_0000_0000;
const MIB: i64 = 1 << 20;

/// A 2.x snapshot of one device: one 2 MiB segment with a live 1 MiB block, a trace of
/// segment_alloc, alloc, an unknown action and an OOM; settings, annotations, metadata.
/// Every string the format has is `text(slot)`; with `unknown`, keys the format does not
/// have (at the top level, in a segment, a block, a trace entry, an annotation, the
/// settings and a nested dict of them) hold text and bytes too.
fn snapshot(text: Text, unknown: bool) -> Vec<u8> {
    let extra = |at: &str| -> Vec<(String, SV)> {
        if !unknown {
            return Vec::new();
        }
        vec![
            (text(&format!("{at}.key")), s(&text(&format!("{at}.value")))),
            (
                format!("{at}_bytes"),
                SV::Bytes(text(&format!("{at}.bytes")).into_bytes()),
            ),
            (
                format!("{at}_nested"),
                dict_owned(vec![(
                    text(&format!("{at}.nested_key")),
                    SV::List(vec![s(&text(&format!("{at}.nested_value")))]),
                )]),
            ),
        ]
    };
    let with = |base: Vec<(&str, SV)>, at: &str| -> SV {
        let mut items: Vec<(String, SV)> =
            base.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        items.extend(extra(at));
        dict_owned(items)
    };
    let block = |addr: i64, size: i64, state: &str, at: &str, live: bool| {
        with(
            vec![
                ("address", i(addr)),
                ("size", i(size)),
                ("requested_size", i(if live { size - 512 } else { 0 })),
                ("state", s(state)),
                (
                    "frames",
                    if live {
                        frames(text, at)
                    } else {
                        SV::List(vec![])
                    },
                ),
                (
                    "forward_frames",
                    SV::List(vec![s(&text(&format!("{at}.forward")))]),
                ),
            ],
            at,
        )
    };
    let segment = with(
        vec![
            ("device", i(0)),
            ("address", i(BASE)),
            ("total_size", i(2 * MIB)),
            ("allocated_size", i(MIB)),
            ("active_size", i(MIB)),
            ("requested_size", i(MIB - 512)),
            ("stream", i(0)),
            ("segment_type", s("large")),
            ("segment_pool_id", SV::Tuple(vec![i(0), i(0)])),
            ("is_expandable", SV::Bool(false)),
            ("frames", frames(text, "segment")),
            (
                "blocks",
                SV::List(vec![
                    block(BASE, MIB, "active_allocated", "block", true),
                    block(BASE + MIB, MIB, "inactive", "free_block", false),
                ]),
            ),
        ],
        "segment",
    );
    let entry = |action: &str, addr: i64, size: i64, time: i64, at: &str| {
        let addr_key = if action == "oom" {
            "device_free"
        } else {
            "addr"
        };
        with(
            vec![
                ("action", s(action)),
                (addr_key, i(addr)),
                ("size", i(size)),
                ("stream", i(0)),
                ("time_us", i(time)),
                ("frames", frames(text, at)),
                (
                    "compile_context",
                    s(&text(&format!("{at}.compile_context"))),
                ),
                ("user_metadata", s(&text(&format!("{at}.user_metadata")))),
                (
                    "internal_metadata",
                    s(&text(&format!("{at}.internal_metadata"))),
                ),
                (
                    "forward_frames",
                    SV::List(vec![s(&text(&format!("{at}.forward")))]),
                ),
                ("pool_id", SV::Tuple(vec![i(0), i(0)])),
            ],
            at,
        )
    };
    let mut trace = vec![
        entry(
            "segment_alloc",
            BASE,
            2 * MIB,
            1_700_000_000_000_000,
            "segment_alloc",
        ),
        entry("alloc", BASE, MIB - 512, 1_700_000_000_000_010, "alloc"),
    ];
    if unknown {
        trace.push(entry(
            &text("action"),
            BASE,
            MIB,
            1_700_000_000_000_015,
            "unknown_action",
        ));
    }
    trace.push(entry("oom", 4096, 1 << 30, 1_700_000_000_000_020, "oom"));
    let settings = with(
        vec![
            ("PYTORCH_CUDA_ALLOC_CONF", s(&text("alloc_conf"))),
            ("max_split_size", i(-1)),
            ("garbage_collection_threshold", SV::F64(0.0)),
            ("expandable_segments", SV::Bool(false)),
            ("pinned_num_register_threads", i(1)),
            ("release_lock_on_cudamalloc", SV::Bool(false)),
            ("pinned_use_cuda_host_register", SV::Bool(false)),
            ("roundup_power2_divisions", dict(vec![("1", i(0))])),
        ],
        "settings",
    );
    let annotation = with(
        vec![
            ("device", i(0)),
            ("stage", s("START")),
            ("name", s(&text("annotation.name"))),
            ("time_us", i(1_700_000_000_000_005)),
        ],
        "annotation",
    );
    let root = with(
        vec![
            ("segments", SV::List(vec![segment])),
            ("device_traces", SV::List(vec![SV::List(trace)])),
            ("allocator_settings", settings),
            ("external_annotations", SV::List(vec![annotation])),
        ],
        "top",
    );
    serde_pickle::value_to_vec(&root, SerOptions::new()).unwrap()
}

fn vramlens() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramlens"))
}

/// stdout and stderr of `vramlens ARGS`, with the exit status.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = vramlens().args(args).output().unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// Text that tries to start lines, shift columns, reorder what is read and break XML.
fn forging(slot: &str) -> String {
    format!(
        "{slot}\nFAKE line {slot}\r\tFAKE tab\u{202e}rlo\u{2066}iso\u{fffe}\u{ffff}\u{1b}[2J;semi"
    )
}

/// The same slot with harmless characters in place of the hostile ones.
fn benign(slot: &str) -> String {
    format!("{slot}_FAKE_line_{slot}__FAKE_tab_rlo_iso___[2J_semi")
}

/// Every text output of every command that reads a snapshot, as `(label, args)`: `{}`
/// stands for the snapshot's path.
const TEXT_COMMANDS: &[&[&str]] = &[
    &["summary", "{}"],
    &["top", "{}"],
    &["top", "--by", "stack", "{}"],
    &["top", "--by", "file", "{}"],
    &["top", "--by", "category", "{}"],
    &["timeline", "{}"],
    &["timeline", "--at", "peak", "{}"],
    &["timeline", "--at", "oom", "{}"],
    &["segments", "{}"],
    &["oom", "{}"],
    &["flamegraph", "--folded", "{}"],
    &["budget", "{}"],
    &["check", "--max-peak", "1GB", "{}"],
    &["diff", "{}", "{}"],
    &["redact", "--show", "{}"],
];

fn with_path<'a>(args: &[&'a str], path: &'a str) -> Vec<&'a str> {
    args.iter()
        .map(|a| if *a == "{}" { path } else { a })
        .collect()
}

#[test]
fn names_and_file_names_from_a_file_never_forge_a_line() {
    let dir = tempfile::tempdir().unwrap();
    // The file name itself tries it too.
    let hostile = dir.path().join("evil\nFAKE file\t\u{202e}.pickle");
    let plain = dir.path().join("evil_FAKE_file__.pickle");
    std::fs::write(&hostile, snapshot(&forging, true)).unwrap();
    std::fs::write(&plain, snapshot(&benign, true)).unwrap();
    for args in TEXT_COMMANDS {
        let (code_h, out_h) = run(&with_path(args, hostile.to_str().unwrap()));
        let (code_p, out_p) = run(&with_path(args, plain.to_str().unwrap()));
        assert_eq!(code_h, code_p, "{args:?}:\n{out_h}\n---\n{out_p}");
        assert!(code_h == Some(0) || code_h == Some(1), "{args:?}: {out_h}");
        // As many lines as with harmless names: none was split, none added.
        assert_eq!(
            out_h.lines().count(),
            out_p.lines().count(),
            "{args:?}:\n{out_h}\n---\n{out_p}"
        );
        for line in out_h.lines() {
            assert!(!line.trim_start().starts_with("FAKE"), "{args:?}: {line:?}");
            for c in line.chars() {
                assert!(
                    !(c.is_control()
                        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')),
                    "{args:?}: {c:?} raw in {line:?}"
                );
            }
        }
        assert!(out_h.contains("FAKE"), "{args:?} shows no name: {out_h}");
    }
    // The folded format: one stack a line, frames apart at `;` only, the count last.
    let (_, folded) = run(&["flamegraph", "--folded", hostile.to_str().unwrap()]);
    let lines: Vec<&str> = folded.lines().collect();
    assert_eq!(lines.len(), 1, "{folded}");
    let (stack, count) = lines[0].rsplit_once(' ').unwrap();
    assert_eq!(count, (MIB - 512).to_string());
    let frames: Vec<&str> = stack.split(';').collect();
    assert_eq!(frames.len(), 2, "{stack}");
    assert!(frames[1].ends_with(",semi"), "{}", frames[1]);
    assert!(frames[1].contains("\\nFAKE line") && frames[1].contains("\\u{202e}"));
}

/// Every element and attribute of an SVG, parsed as XML 1.0.
fn assert_xml(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    if let Err(e) = roxmltree::Document::parse(&text) {
        panic!("{}: not XML: {e}", path.display());
    }
}

/// Each chart of `snapshot` (timeline, flame graph, segments, budget) written into `dir`;
/// the charts a file has no data for are left out.
fn charts(snapshot: &Path, dir: &Path, tag: &str) -> Vec<PathBuf> {
    let mut made = Vec::new();
    for cmd in ["timeline", "flamegraph", "segments", "budget"] {
        let out = dir.join(format!("{tag}.{cmd}.svg"));
        let status = vramlens()
            .args([cmd, "-o", out.to_str().unwrap(), snapshot.to_str().unwrap()])
            .output()
            .unwrap();
        if status.status.success() {
            made.push(out);
        }
    }
    made
}

#[test]
fn charts_of_hostile_names_and_of_every_fixture_parse_as_xml() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = dir.path().join("hostile.pickle");
    std::fs::write(&hostile, snapshot(&forging, true)).unwrap();
    let made = charts(&hostile, dir.path(), "hostile");
    assert_eq!(made.len(), 4, "{made:?}");
    for chart in &made {
        assert_xml(chart);
        let text = std::fs::read_to_string(chart).unwrap();
        assert!(!text.contains('\u{fffe}') && !text.contains('\u{ffff}'));
        assert!(!text.contains('\u{1b}') && !text.contains('\u{202e}'));
    }
    // Every chart of every fixture.
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(common::root().join("testdata"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            !n.ends_with(".json") && p.is_file()
        })
        .collect();
    fixtures.sort();
    let mut count = 0;
    for (k, f) in fixtures.iter().enumerate() {
        for chart in charts(f, dir.path(), &k.to_string()) {
            assert_xml(&chart);
            count += 1;
        }
    }
    assert!(count >= 20, "only {count} charts drawn from {fixtures:?}");
    // The report's markup lets none of them through either.
    let report = dir.path().join("report.html");
    let (code, out) = run(&[
        "report",
        "-o",
        report.to_str().unwrap(),
        hostile.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}");
    let html = std::fs::read_to_string(&report).unwrap();
    for c in ['\u{fffe}', '\u{ffff}', '\u{1b}', '\u{202e}', '\u{2066}'] {
        assert!(!html.contains(c), "{c:?} raw in the report");
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn every_chart_of_every_real_file_parses_as_xml() {
    let data = common::require_shared_data();
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut stack = vec![data];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains(".pickle"))
            {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut count = 0;
    for (k, f) in files.iter().enumerate() {
        for chart in charts(f, dir.path(), &k.to_string()) {
            assert_xml(&chart);
            count += 1;
            std::fs::remove_file(chart).unwrap();
        }
    }
    assert!(
        count >= files.len(),
        "{count} charts of {} files",
        files.len()
    );
}

/// User and host names, home folders and code a redacted output must not show.
const SECRETS: &[&str] = &[
    "aliceq",
    "bobq",
    "carolq",
    "daveq",
    "erinq",
    "hostxq",
    "frankq",
    "ginaq",
    "fileserverq",
    "/home/",
];
/// Code that must go with `--strip-code`.
const CODE: &[&str] = &["secret_fn", "secret_code"];

/// Secrets in the shapes the issue names, in every slot: user names of home, scratch,
/// data and shared folders, `user@host:/path`, `file://`, paths in function names.
fn secret(slot: &str) -> String {
    let (field, _) = slot.split_once('.').unwrap_or((slot, ""));
    if slot.ends_with(".filename") {
        let root = match field {
            "segment" => "/home/aliceq/secret_proj",
            "block" => "/scratch/bobq/run",
            "alloc" => "/mnt/data/carolq/exp",
            "oom" => "//fileserverq/share/daveq/exp",
            _ => "/home/aliceq/secret_proj/sub",
        };
        return format!("{root}/{field}");
    }
    if slot.ends_with(".name") && slot != "annotation.name" {
        // A function name, one made from a profiler range with a path.
        return format!("secret_fn_{field} /home/ginaq/secret_proj/range_{field}");
    }
    if slot.ends_with(".compile_context") || slot.ends_with(".forward") {
        return format!("Torch-Compiled Region: torchinductor/ab/cxyz.py secret_code_{field}");
    }
    format!(
        "{slot} by erinq@hostxq:/home/erinq/x.py, file:///home/frankq/notes.txt, \
         aliceq bobq carolq daveq (Aliceq's run)"
    )
}

fn assert_no_secret(what: &str, text: &[u8], code_too: bool) {
    let lower = String::from_utf8_lossy(text).to_lowercase();
    for s in SECRETS.iter().chain(if code_too { CODE } else { &[] }) {
        if let Some(at) = lower.find(s) {
            let from = lower[..at]
                .char_indices()
                .rev()
                .nth(80)
                .map_or(0, |(i, _)| i);
            let context: String = lower[from..].chars().take(200).collect();
            panic!("{what}: {s:?} left: ...{context}...");
        }
    }
}

/// Every file under `dir`, read.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

#[test]
fn redaction_leaves_no_secret_in_any_slot_of_the_pickle_or_any_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("in.pickle"), snapshot(&secret, true)).unwrap();
    // The input holds every secret (the test is not vacuous).
    let input = std::fs::read(d.join("in.pickle")).unwrap();
    let lower = String::from_utf8_lossy(&input).to_lowercase();
    for s in SECRETS.iter().chain(CODE) {
        assert!(lower.contains(s), "{s} not in the input");
    }
    let at = |args: &[&str]| {
        let out = vramlens().current_dir(d).args(args).output().unwrap();
        assert!(
            out.status.code() == Some(0) || out.status.code() == Some(1),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut all = out.stdout;
        all.extend(out.stderr);
        all
    };
    for (strip, name) in [(false, "plain.pickle"), (true, "stripped.pickle")] {
        let mut args = vec!["redact", "-o", name, "in.pickle"];
        if strip {
            args.insert(1, "--strip-code");
        }
        at(&args);
        let redacted = std::fs::read(d.join(name)).unwrap();
        assert_no_secret(name, &redacted, strip);
        // Still a snapshot with the same figures.
        let before = at(&["summary", "--json", "in.pickle"]);
        let after = at(&["summary", "--json", name]);
        // (The unknown action keeps its count under its redacted name.)
        let figures = |b: &[u8]| {
            let mut v: serde_json::Value = serde_json::from_slice(b).unwrap();
            let actions = v["devices"][0]["trace"]["actions"].take();
            let counts: Vec<&serde_json::Value> = actions.as_object().unwrap().values().collect();
            format!("{} {counts:?}", v["devices"])
        };
        assert_eq!(figures(&before), figures(&after), "{name}");
    }
    // Every output of `--redact`.
    let commands: &[&[&str]] = &[
        &["summary"],
        &["summary", "--json"],
        &["top"],
        &["top", "--json"],
        &["top", "--by", "stack"],
        &["top", "--by", "file", "--json"],
        &["timeline", "--at", "peak"],
        &["timeline", "--at", "oom", "--json"],
        &["segments"],
        &["segments", "--json"],
        &["oom"],
        &["oom", "--json"],
        &["flamegraph", "--folded"],
        &["budget"],
        &["budget", "--json"],
        &["timeline", "-o", "t.svg"],
        &["flamegraph", "-o", "f.svg"],
        &["segments", "-o", "s.svg"],
        &["report", "-o", "r.html"],
        &["export", "--format", "jsonl", "-o", "tables"],
    ];
    for c in commands {
        let mut args = vec!["--redact"];
        args.extend_from_slice(c);
        args.push("in.pickle");
        let out = at(&args);
        assert_no_secret(&format!("{args:?}"), &out, false);
    }
    for (path, data) in files_under(d) {
        let name = path.file_name().unwrap().to_string_lossy();
        if name != "in.pickle" {
            assert_no_secret(&path.display().to_string(), &data, false);
        }
    }
}

/// A small valid snapshot written by this test.
fn plain_snapshot(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, snapshot(&|slot: &str| slot.replace('.', "_"), false)).unwrap();
    p
}

#[test]
fn a_window_past_what_a_float_holds_is_refused_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let snap = plain_snapshot(dir.path(), "s.pickle");
    let chart = dir.path().join("t.svg");
    let (code, out) = run(&[
        "timeline",
        snap.to_str().unwrap(),
        "-o",
        chart.to_str().unwrap(),
        "--window",
        "0..18446744073709551615",
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("18446744073709551615 is past any trace"),
        "{out}"
    );
    assert!(!out.contains("551616"), "{out}");
}

#[test]
fn elements_of_trace_events_that_are_not_events_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.json");
    std::fs::write(
        &trace,
        r#"{"traceEvents": [[1, 2], [3], 5, "x", {"ph": "i", "name": "[memory]", "ts": 1, "pid": 1, "tid": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Allocated": 512, "Total Reserved": 2097152, "Addr": 1}}]}"#,
    )
    .unwrap();
    let (code, out) = run(&["summary", trace.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("4 elements of the list of events are not events"),
        "{out}"
    );
}

/// A log in UTF-16 with its byte-order mark (Windows PowerShell's `>`) is read as the
/// text it holds; one without the mark is named as UTF-16, not read as garbage.
#[test]
fn a_utf16_log_is_read_with_its_mark_and_named_without() {
    let dir = tempfile::tempdir().unwrap();
    let text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n";
    let log = dir.path().join("UTF-16LE.log");
    let bytes = [
        vec![0xff, 0xfe],
        text.encode_utf16().flat_map(u16::to_le_bytes).collect(),
    ]
    .concat();
    std::fs::write(&log, bytes).unwrap();
    let (code, out) = run(&["oom", "--log", log.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("request            2.0 GiB"), "{out}");
    let log = dir.path().join("UTF-16BE.log");
    let bytes: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
    std::fs::write(&log, bytes).unwrap();
    let (code, out) = run(&["oom", "--log", log.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("the log is UTF-16BE text"), "{out}");
    assert_eq!(out.lines().count(), 1, "{out}");
}

#[test]
fn export_cuts_long_names_and_cleans_up_after_a_killed_run() {
    let dir = tempfile::tempdir().unwrap();
    // Names of 253 bytes, told apart past the 250th: `file=NAME` would be 258.
    let long = "n".repeat(245);
    let a = plain_snapshot(dir.path(), &format!("{long}a.pickle"));
    let b = plain_snapshot(dir.path(), &format!("{long}b.pickle"));
    let out = dir.path().join("tables");
    std::fs::create_dir(&out).unwrap();
    // What a run killed with -9 leaves (its lock file, naming this machine's kernel, no
    // longer locked): removed, and the folder is then empty (no --force needed).
    let stale = out.join(".vramlens-export.4000000000.0123456789abcdef");
    std::fs::create_dir_all(stale.join("lifetimes")).unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/random/boot_id");
    if let Ok(kernel) = &kernel {
        std::fs::write(
            stale.join("lock"),
            format!("vramlens export staging\n{}\n", kernel.trim()),
        )
        .unwrap();
    }
    let (code, text) = run(&[
        "export",
        "--format",
        "jsonl",
        "-o",
        out.to_str().unwrap(),
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{text}");
    let mut parts: Vec<String> = std::fs::read_dir(out.join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    parts.sort();
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert_ne!(parts[0], parts[1]);
    for p in &parts {
        assert!(p.len() <= 210, "{p}");
    }
    assert_eq!(!stale.exists(), kernel.is_ok());
}
