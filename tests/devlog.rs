//! Device logs (nvidia-smi CSV, NVML JSON lines) and profiler allocator events (Kineto
//! traces, memory-timeline raw rows) read by `vramlens::devlog`.
//!
//! Real files come from `../shared/data` (figures from its MANIFEST.md, checked again with
//! Python's csv/json); those tests are ignored by default (`.ci/run` runs them where the
//! folder exists). Our own H200 recordings in `testdata/gpu` always run.

use std::path::{Path, PathBuf};
use vramlens::devlog::{
    AllocatorTrace, ClockOptions, DeviceLog, DevlogError, GpuSample, ProcessSample, merge,
    read_device_log, read_kineto,
};

const MIB: u64 = 1 << 20;
const H200_UUID: &str = "GPU-a33ac4bd-89b7-0256-6ec8-52dc29b7a10a";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn shared_data() -> Option<PathBuf> {
    let dir = root().join("../shared/data");
    dir.is_dir().then_some(dir)
}

/// The file under `../shared/data`, for tests marked `#[ignore = "needs ../shared/data"]`:
/// panics, saying why, when it is missing (never None).
fn shared_file(rel: &str) -> Option<PathBuf> {
    let dir = shared_data().unwrap_or_else(|| {
        panic!("../shared/data not found: this test needs the real files ({rel})")
    });
    let path = dir.join(rel);
    assert!(path.exists(), "{rel} is not in ../shared/data");
    Some(path)
}

fn utc() -> ClockOptions {
    ClockOptions::default()
}

fn device_log(path: &Path, clock: ClockOptions) -> DeviceLog {
    let text = std::fs::read_to_string(path).unwrap();
    read_device_log(&text, clock).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn kineto(path: &Path) -> AllocatorTrace {
    read_kineto(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn gpu(time_us: i64, gpu: i64, used_mib: u64, total_mib: Option<u64>) -> GpuSample {
    GpuSample {
        time_us,
        gpu,
        uuid: None,
        used_bytes: Some(used_mib * MIB),
        total_bytes: total_mib.map(|t| t * MIB),
        free_bytes: None,
    }
}

// ---------------------------------------------------------------------------------------
// Real nvidia-smi logs (../shared/data/nvsmi-*)
// ---------------------------------------------------------------------------------------

#[test]
#[ignore = "needs ../shared/data"]
fn nvsmi_miris_v100s_with_units() {
    let Some(path) = shared_file("nvsmi-miris-v100s/gpu_log.csv") else {
        return;
    };
    let log = device_log(&path, utc());
    assert_eq!(log.source, "nvidia-smi");
    assert_eq!(log.gpus.len(), 107);
    assert!(log.processes.is_empty());
    assert!(log.warnings.is_empty(), "{:?}", log.warnings);
    // 2025/06/13 00:27:52.195, 0, Tesla V100S-PCIE-32GB, 0 %, 0 %, 32768 MiB, 1 MiB, 27
    assert_eq!(log.gpus[0], gpu(1_749_774_472_195_000, 0, 1, Some(32768)));
    // 2025/06/13 00:29:38.248, 0, Tesla V100S-PCIE-32GB, 0 %, 0 %, 32768 MiB, 1 MiB, 28
    assert_eq!(log.gpus[106], gpu(1_749_774_578_248_000, 0, 1, Some(32768)));

    // The clock offset moves every zone-less stamp.
    let shifted = device_log(
        &path,
        ClockOptions {
            utc_offset_minutes: -420,
        },
    );
    assert_eq!(
        shifted.gpus[0].time_us,
        1_749_774_472_195_000 - 420 * 60_000_000
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn nvsmi_vlm_opt_4090_without_index() {
    let Some(path) = shared_file("nvsmi-vlm-opt-4090/gpu_log.csv") else {
        return;
    };
    let log = device_log(&path, utc());
    assert_eq!(log.gpus.len(), 2619);
    assert!(log.warnings.is_empty(), "{:?}", log.warnings);
    // 2026/01/03 15:36:53.507, NVIDIA GeForce RTX 4090, 1 %, 2 %, 1129 MiB, 33.09 W
    assert_eq!(log.gpus[0], gpu(1_767_454_613_507_000, -1, 1129, None));
    // 2026/01/03 16:24:53.961, NVIDIA GeForce RTX 4090, 3 %, 4 %, 1141 MiB, 34.15 W
    assert_eq!(log.gpus[2618], gpu(1_767_457_493_961_000, -1, 1141, None));
}

#[test]
#[ignore = "needs ../shared/data"]
fn nvsmi_gpu_glasses_hand_written_header_iso_times() {
    let Some(path) = shared_file("nvsmi-gpu-glasses/nvidia_smi.csv") else {
        return;
    };
    // ISO stamps carry +08:00, so the clock offset must not move them.
    for offset in [0, 300] {
        let log = device_log(
            &path,
            ClockOptions {
                utc_offset_minutes: offset,
            },
        );
        assert_eq!(log.gpus.len(), 43);
        // 2025-09-08T17:26:50+08:00,0, 0, 4, 81559, 74.01, 33
        assert_eq!(log.gpus[0], gpu(1_757_323_610_000_000, 0, 4, Some(81559)));
        // 2025-09-08T17:26:58+08:00,2, 0, 4, 81559, 72.96, 35
        assert_eq!(log.gpus[42], gpu(1_757_323_618_000_000, 2, 4, Some(81559)));
        let mut indices: Vec<i64> = log.gpus.iter().map(|s| s.gpu).collect();
        indices.dedup();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices, (0..8).collect::<Vec<_>>());
        assert_eq!(log.warnings.len(), 1, "{:?}", log.warnings);
        assert!(log.warnings[0].contains("\"gpu\" and \"index\""));
    }
}

// ---------------------------------------------------------------------------------------
// Our H200 recordings (testdata/gpu)
// ---------------------------------------------------------------------------------------

fn ours(rel: &str) -> DeviceLog {
    device_log(&root().join("testdata/gpu").join(rel), utc())
}

#[test]
fn our_query_gpu_csv() {
    let log = ours("nvsmi_gpu.csv");
    assert_eq!(log.gpus.len(), 215);
    assert!(log.warnings.is_empty(), "{:?}", log.warnings);
    // 2026/11/29 19:15:09.741, 0, GPU-a33ac4bd-..., 0 MiB, 143771 MiB
    assert_eq!(
        log.gpus[0],
        GpuSample {
            time_us: 1_795_979_709_741_000,
            gpu: 0,
            uuid: Some(H200_UUID.to_string()),
            used_bytes: Some(0),
            total_bytes: Some(143_771 * MIB),
            free_bytes: None,
        }
    );
    assert_eq!(log.gpus[214].time_us, 1_795_979_752_771_000);
    assert!(
        log.gpus
            .iter()
            .all(|s| s.total_bytes == Some(143_771 * MIB))
    );
    let peak = log.gpus.iter().filter_map(|s| s.used_bytes).max();
    assert_eq!(peak, Some(143_125 * MIB));
    assert!(log.gpus.windows(2).all(|w| w[0].time_us <= w[1].time_us));
}

#[test]
fn our_query_compute_apps_csv_and_merge() {
    let apps = ours("nvsmi_apps.csv");
    assert_eq!(apps.processes.len(), 116);
    assert!(apps.gpus.is_empty());
    // 2026/11/29 19:15:15.782, GPU-a33ac4bd-..., 421, 648 MiB
    assert_eq!(
        apps.processes[0],
        ProcessSample {
            time_us: 1_795_979_715_782_000,
            gpu: None,
            gpu_uuid: Some(H200_UUID.to_string()),
            pid: 421,
            used_bytes: Some(648 * MIB),
        }
    );
    let last = &apps.processes[115];
    assert_eq!((last.time_us, last.pid), (1_795_979_752_174_000, 547));
    assert_eq!(last.used_bytes, Some(7820 * MIB));
    let mut pids: Vec<u64> = apps.processes.iter().map(|p| p.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids, [421, 463, 505, 547]);

    let merged = merge(vec![ours("nvsmi_gpu.csv"), apps]);
    assert_eq!(merged.source, "nvidia-smi");
    assert_eq!((merged.gpus.len(), merged.processes.len()), (215, 116));
    // The uuid names GPU 0 in the query-gpu log.
    assert!(merged.processes.iter().all(|p| p.gpu == Some(0)));

    let mixed = merge(vec![ours("nvsmi_gpu.csv"), ours("ok/nvml.jsonl")]);
    assert_eq!(mixed.source, "mixed");
    assert_eq!(merge(Vec::new()).source, "none");
}

#[test]
fn our_nvml_json_lines() {
    // (case, rows, process rows, pid, peak device used bytes, peak process bytes)
    let cases = [
        ("ok", 99, 87, 421, 3_284_008_960u64, 2_629_828_608u64),
        ("oom", 97, 87, 463, 150_722_183_168, 150_068_002_816),
        ("oom_cap", 70, 63, 547, 8_854_044_672, 8_199_864_320),
        ("oom_exp", 77, 70, 505, 150_646_685_696, 149_992_505_344),
    ];
    for (case, rows, procs, pid, peak, peak_proc) in cases {
        let log = ours(&format!("{case}/nvml.jsonl"));
        assert_eq!(log.source, "nvml");
        assert_eq!(log.gpus.len(), rows, "{case}");
        assert_eq!(log.processes.len(), procs, "{case}");
        assert!(log.warnings.is_empty(), "{case}: {:?}", log.warnings);
        assert!(
            log.processes.iter().all(|p| p.pid == pid
                && p.gpu == Some(0)
                && p.gpu_uuid.as_deref() == Some(H200_UUID))
        );
        // NVML's total is the same 143771 MiB nvidia-smi printed.
        assert!(
            log.gpus
                .iter()
                .all(|s| s.total_bytes == Some(143_771 * MIB) && s.gpu == 0)
        );
        assert_eq!(
            log.gpus.iter().filter_map(|s| s.used_bytes).max(),
            Some(peak)
        );
        assert_eq!(
            log.processes.iter().filter_map(|p| p.used_bytes).max(),
            Some(peak_proc)
        );
    }
    let ok = ours("ok/nvml.jsonl");
    assert_eq!(
        ok.gpus[0],
        GpuSample {
            time_us: 1_795_979_714_989_032,
            gpu: 0,
            uuid: Some(H200_UUID.to_string()),
            used_bytes: Some(648_347_648),
            total_bytes: Some(150_754_820_096),
            free_bytes: Some(150_106_472_448),
        }
    );
    assert_eq!(ok.gpus[98].time_us, 1_795_979_720_884_293);
    assert_eq!(ok.gpus[98].used_bytes, Some(3_284_008_960));
}

// ---------------------------------------------------------------------------------------
// Kineto traces (../shared/data)
// ---------------------------------------------------------------------------------------

const GIB: f64 = (1u64 << 30) as f64;
const MIB_F: f64 = MIB as f64;
const KIB_F: f64 = 1024.0;

/// `exact` printed with one decimal in `unit` is `printed` (MANIFEST.md rounding).
fn rounds_to(exact: i64, unit: f64, printed: f64) -> bool {
    (exact as f64 / unit - printed).abs() <= 0.05 + 1e-9
}

struct TraceCase {
    rel: &'static str,
    events: usize,
    cuda_events: usize,
    /// Exact peak Total Allocated / Total Reserved over CUDA events (checked with Python).
    cuda_peak: Option<(i64, i64)>,
    /// MANIFEST's printed peaks (value, unit) for allocated and reserved.
    manifest: Option<((f64, f64), (f64, f64))>,
    base_time_ns: Option<i64>,
    first_ts_us: f64,
}

#[test]
#[ignore = "needs ../shared/data"]
fn every_real_kineto_trace() {
    let cases = [
        TraceCase {
            rel: "kineto-tb-plugin-samples-2021/worker0.1623143566756.pt.trace.json.gz",
            events: 12838,
            cuda_events: 8220,
            cuda_peak: None,
            manifest: None,
            base_time_ns: None,
            first_ts_us: 1_623_143_093_496_534.0,
        },
        TraceCase {
            rel: "kineto-tb-plugin-samples-2021/worker0.1623212756351.pt.trace.json.gz",
            events: 10980,
            cuda_events: 8280,
            cuda_peak: None,
            manifest: None,
            base_time_ns: None,
            first_ts_us: 1_623_212_388_426_919.0,
        },
        TraceCase {
            rel: "hta-test-data/df_index_resolver.json.gz",
            events: 28010,
            cuda_events: 26770,
            cuda_peak: Some((6_629_508_096, 12_782_141_440)),
            manifest: Some(((6.2, GIB), (11.9, GIB))),
            base_time_ns: None,
            first_ts_us: 1_669_783_687_464_300.0,
        },
        TraceCase {
            rel: "kernelforge-traces-2026/bfeed93fe629_2566.1773933981558265129.pt.trace.json",
            events: 18,
            cuda_events: 12,
            cuda_peak: Some((71_303_168, 71_303_168)),
            manifest: Some(((68.0, MIB_F), (68.0, MIB_F))),
            base_time_ns: Some(1_767_189_312_000_000_000),
            first_ts_us: 6_744_669_508_209.101,
        },
        TraceCase {
            rel: "kernelforge-traces-2026/chrome_trace.json",
            events: 412,
            cuda_events: 0,
            cuda_peak: None,
            manifest: None,
            base_time_ns: Some(1_767_189_312_000_000_000),
            first_ts_us: 6_809_874_014_223.698,
        },
        TraceCase {
            rel: "particle-transformer-traces-2024/single_epoch_forward_pass_batch_size_2.json",
            events: 996,
            cuda_events: 968,
            cuda_peak: Some((35_727_872, 90_177_536)),
            manifest: Some(((34.1, MIB_F), (86.0, MIB_F))),
            base_time_ns: Some(1_727_743_122_000_000_000),
            first_ts_us: 5_654_139_052_199.133,
        },
        TraceCase {
            rel: "unsloth-puzzles-trace/trace.json",
            events: 20,
            cuda_events: 0,
            cuda_peak: None,
            manifest: None,
            base_time_ns: Some(1_735_632_360_000_000_000),
            first_ts_us: 4_280_895_488_380.032,
        },
    ];
    for case in cases {
        let Some(path) = shared_file(case.rel) else {
            continue;
        };
        let trace = kineto(&path);
        let rel = case.rel;
        assert_eq!(trace.kind, "kineto");
        assert_eq!(trace.samples.len(), case.events, "{rel}");
        assert_eq!(trace.base_time_ns, case.base_time_ns, "{rel}");
        assert_eq!(trace.samples[0].ts_us, case.first_ts_us, "{rel}");
        let cuda: Vec<_> = trace
            .samples
            .iter()
            .filter(|s| s.device_type == 1)
            .collect();
        assert_eq!(cuda.len(), case.cuda_events, "{rel}");
        assert!(
            trace
                .samples
                .iter()
                .all(|s| (s.device_type == 0) == (s.device_id == -1)),
            "{rel}"
        );
        // Allocations and frees balance to within the trace window's leftovers.
        let allocs = trace.samples.iter().filter(|s| s.bytes > 0).count();
        assert!(allocs > 0, "{rel}");
        let peak_alloc = cuda.iter().filter_map(|s| s.total_allocated).max();
        let peak_res = cuda.iter().filter_map(|s| s.total_reserved).max();
        assert_eq!(
            peak_alloc.zip(peak_res),
            case.cuda_peak,
            "{rel}: peak allocated, reserved"
        );
        if let (Some((a, r)), Some(((pa, ua), (pr, ur)))) = (case.cuda_peak, case.manifest) {
            assert!(rounds_to(a, ua, pa), "{rel}: {a} is not {pa}");
            assert!(rounds_to(r, ur, pr), "{rel}: {r} is not {pr}");
        }
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn kineto_2021_shape_has_only_three_args() {
    let Some(path) =
        shared_file("kineto-tb-plugin-samples-2021/worker0.1623212756351.pt.trace.json.gz")
    else {
        return;
    };
    let trace = kineto(&path);
    assert!(
        trace
            .samples
            .iter()
            .all(|s| s.total_allocated.is_none() && s.total_reserved.is_none() && s.addr.is_none())
    );
    let s = &trace.samples[0];
    assert_eq!((s.device_type, s.device_id, s.bytes), (0, -1, 4));
    // 5490 allocations and 5490 frees (MANIFEST).
    let allocs = trace.samples.iter().filter(|s| s.bytes > 0).count();
    assert_eq!(allocs, 5490);
}

#[test]
#[ignore = "needs ../shared/data"]
fn kineto_cpu_only_traces_peak_as_manifest_prints() {
    // MANIFEST's peaks for CPU-only traces are over all [memory] events.
    for (rel, exact, printed, unit) in [
        (
            "kernelforge-traces-2026/chrome_trace.json",
            111_926_784,
            106.7,
            MIB_F,
        ),
        ("unsloth-puzzles-trace/trace.json", 434_184, 424.0, KIB_F),
    ] {
        let Some(path) = shared_file(rel) else {
            continue;
        };
        let trace = kineto(&path);
        let peak = trace.samples.iter().filter_map(|s| s.total_allocated).max();
        assert_eq!(peak, Some(exact), "{rel}");
        assert!(rounds_to(exact, unit, printed), "{rel}");
        assert!(trace.samples.iter().all(|s| s.total_reserved == Some(0)));
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn memory_timeline_raw_rows() {
    let Some(path) = shared_file("hta-test-data/memory_timeline.raw.gz") else {
        return;
    };
    let trace = kineto(&path);
    assert_eq!(trace.kind, "memory_timeline_raw");
    assert_eq!(trace.samples.len(), 16845);
    assert_eq!(trace.base_time_ns, None);
    // Pre-existing rows (-1) take the smallest time, 1696966047096061874 ns; an f64 keeps
    // these µs to about 0.25 µs.
    let near = |ts_us: f64, ns: i64| (ts_us - ns as f64 / 1000.0).abs() < 0.5;
    assert!(near(trace.samples[0].ts_us, 1_696_966_047_096_061_874));
    assert_eq!(trace.samples[0].bytes, 37888);
    let first_timed = trace.samples.iter().position(|s| s.bytes < 0).unwrap();
    assert_eq!(first_timed, 645);
    assert!(near(trace.samples[645].ts_us, 1_696_966_047_096_061_874));
    assert!(near(trace.samples[16844].ts_us, 1_696_966_048_083_248_105));
    assert!(trace.samples.windows(2).all(|w| w[0].ts_us <= w[1].ts_us));
    let sum: i64 = trace.samples.iter().map(|s| s.bytes).sum();
    assert_eq!(sum, 332_060_904);
    let mut running = 0i64;
    let mut peak = 0i64;
    for s in &trace.samples {
        running += s.bytes;
        peak = peak.max(running);
    }
    assert_eq!(peak, 3_082_832_104);
}

// ---------------------------------------------------------------------------------------
// Forms written by hand, and bad input
// ---------------------------------------------------------------------------------------

#[test]
fn csv_forms_without_header_units_and_unavailable_values() {
    // Headerless `timestamp,index,uuid,memory.used,memory.total` with nounits.
    let log = read_device_log(
        "2025/07/05 15:01:02.123, 1, GPU-x, 1234, 81920\n2025/07/05 15:01:02.000, 0, GPU-y, [N/A], 81920\n",
        utc(),
    )
    .unwrap();
    assert_eq!(log.gpus.len(), 2);
    // Sorted by time: the second row is earlier.
    assert_eq!(log.gpus[0].gpu, 0);
    assert_eq!(log.gpus[0].used_bytes, None);
    assert_eq!(log.gpus[1].used_bytes, Some(1234 * MIB));
    assert_eq!(log.gpus[1].uuid.as_deref(), Some("GPU-x"));

    // Headerless apps form, and the 4-column gpu form.
    let apps = read_device_log(
        "2025/07/05 15:01:02.123, GPU-x, 77, [Not Supported]\n",
        utc(),
    )
    .unwrap();
    assert_eq!(apps.processes[0].pid, 77);
    assert_eq!(apps.processes[0].used_bytes, None);
    let g4 = read_device_log("2025-07-05T15:01:02Z, 3, 10 MiB, 20 MiB\n", utc()).unwrap();
    assert_eq!(g4.gpus[0], gpu(1_751_727_662_000_000, 3, 10, Some(20)));

    // Header with units, values without (nounits); header repeated; memory.free.
    let text = "timestamp, index, memory.used [MiB], memory.free [MiB]\n\
                2025/07/05 15:01:02.123, 0, 5, 7\n\
                timestamp, index, memory.used [MiB], memory.free [MiB]\n\
                2025/07/05 15:01:03.123, 0, 6, 6\n";
    let log = read_device_log(text, utc()).unwrap();
    assert_eq!(log.gpus.len(), 2);
    assert_eq!(log.gpus[1].free_bytes, Some(6 * MIB));

    // Compute apps with only a header, or the driver's message: no rows, no error.
    for text in [
        "pid, used_gpu_memory [MiB]\n",
        "No running processes found\n",
    ] {
        let log = read_device_log(text, utc()).unwrap();
        assert!(log.gpus.is_empty() && log.processes.is_empty(), "{text}");
    }
    // Without a timestamp column the samples are at 0, with a warning.
    let log = read_device_log("pid, used_gpu_memory [MiB]\n12, 3 MiB\n", utc()).unwrap();
    assert_eq!(log.processes[0].time_us, 0);
    assert_eq!(log.warnings.len(), 1);

    // A truncated last line is skipped with a warning; CRLF and a BOM are fine.
    let log = read_device_log(
        "\u{feff}timestamp, index, memory.used [MiB]\r\n2025/07/05 15:01:02.123, 0, 5 MiB\r\n2025/07/05 15:0",
        utc(),
    )
    .unwrap();
    assert_eq!(log.gpus.len(), 1);
    assert!(log.warnings[0].contains("truncated"), "{:?}", log.warnings);
}

fn err(text: &str) -> String {
    match read_device_log(text, utc()) {
        Ok(log) => panic!("expected an error for {text:?}, got {log:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_device_logs_name_the_line() {
    assert!(matches!(
        read_device_log("", utc()),
        Err(DevlogError::Empty { .. })
    ));
    assert_eq!(
        err(" \n\n"),
        "empty input: expected an nvidia-smi CSV or NVML JSON lines"
    );
    assert_eq!(
        err(
            "timestamp, index, memory.used [MiB]\n2025/07/05 15:01:02.123, 0, 5 MiB\n2025/07/05 25:01:02.123, 0, 5 MiB\n"
        ),
        "line 3: timestamp: expected YYYY/MM/DD HH:MM:SS.mmm or ISO 8601, found \"2025/07/05 25:01:02.123\""
    );
    assert_eq!(
        err("timestamp, index, memory.used [MiB]\nyesterday, 0, 5 MiB\n"),
        "line 2: timestamp: expected YYYY/MM/DD HH:MM:SS.mmm or ISO 8601, found \"yesterday\""
    );
    assert!(
        err("the quick brown fox\njumps over\n").starts_with(
            "line 1: expected an nvidia-smi CSV header (such as \"timestamp, index, memory.used [MiB]\") or a row starting with a timestamp, found \"the quick brown fox\""
        )
    );
    assert_eq!(
        err(
            "timestamp, index, memory.used [MiB]\n2025/07/05 15:01:02.123, 0, lots\n2025/07/05 15:01:02.123, 0, 1\n"
        ),
        "line 2: used memory: expected a size such as 1234 or 1234 MiB, found \"lots\""
    );
    assert_eq!(
        err(
            "timestamp, index, memory.used [MiB]\n2025/07/05 15:01:02.123, 0\n2025/07/05 15:01:02.123, 0, 1\n"
        ),
        "line 2: expected 3 fields as in the header on line 1, found 2"
    );
    assert_eq!(
        err("{\"time_us\": 1, \"gpu\": 0}\n{\"time_us\": \n{\"time_us\": 3}\n"),
        "line 2: expected a JSON object, found invalid JSON (EOF while parsing a value)"
    );
    assert_eq!(
        err("{\"time_us\": \"soon\"}\n"),
        "line 1: time_us: expected an integer, found a string"
    );
    assert!(err("{\"traceEvents\": []}").contains("Kineto"));
    // A truncated last JSON line is a warning, not an error.
    let log =
        read_device_log("{\"time_us\": 1, \"gpu\": 0}\n{\"time_us\": 2, \"gp", utc()).unwrap();
    assert_eq!((log.gpus.len(), log.warnings.len()), (1, 1));
}

#[test]
fn bad_traces() {
    let e = |bytes: &[u8]| match read_kineto(bytes) {
        Ok(t) => panic!("expected an error, got {} samples", t.samples.len()),
        Err(e) => e.to_string(),
    };
    assert!(e(b"").starts_with("empty input"));
    assert!(e(b"  \n").starts_with("empty input"));
    assert!(
        e(b"hello, world").starts_with("line 1: column 1: expected a Kineto/Chrome trace JSON"),
        "{}",
        e(b"hello, world")
    );
    assert!(e(b"\x1f\x8b\x08\x00garbage").starts_with("gzip: "));
    assert!(e(b"\x80\x04\x95").contains("pickle"));
    assert!(e(b"{\"segments\": []}").contains("memory snapshot"));
    assert!(e(b"[[1, 2], [[0, 1, 2, 3, 4, 5, 6, 7, 8]]]").contains("category totals"));
    assert_eq!(
        e(b"{\"traceEvents\": [{\"name\": \"[memory]\", \"ts\": 1, \"args\": {\"Device Type\": 1, \"Device Id\": 0}}]}"),
        "traceEvents[0].args: expected a \"Bytes\" key, found none"
    );
    assert_eq!(
        e(b"{\"traceEvents\": [{\"name\": \"x\"}, {\"name\": \"[memory]\", \"ts\": 1, \"args\": {\"Device Type\": 1, \"Device Id\": 0, \"Bytes\": \"8\"}}]}"),
        "traceEvents[1].args.Bytes: expected an integer, found the string \"8\""
    );
    // Chrome's bare array form and a gzip stream of a small trace both read.
    let chrome = br#"[{"name": "[memory]", "ph": "i", "ts": 5.5, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Allocated": 512, "Total Reserved": 2097152, "Addr": 139}}, {"name": "[OutOfMemory]", "ts": 6, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 1}}]"#;
    let trace = read_kineto(chrome).unwrap();
    assert_eq!(trace.samples.len(), 1);
    assert_eq!(trace.samples[0].ts_us, 5.5);
    assert_eq!(trace.samples[0].total_reserved, Some(2_097_152));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, chrome).unwrap();
    assert_eq!(read_kineto(&gz.finish().unwrap()).unwrap(), trace);
}

/// Every prefix of valid files, and a few mutations, give a log or an error, never a panic.
#[test]
fn no_panic_on_truncated_or_mangled_input() {
    let csv = std::fs::read_to_string(root().join("testdata/gpu/nvsmi_apps.csv")).unwrap();
    let jsonl = std::fs::read_to_string(root().join("testdata/gpu/ok/nvml.jsonl")).unwrap();
    let trace = br#"{"baseTimeNanoseconds": 17, "traceEvents": [{"name": "[memory]", "ts": 1.5, "args": {"Device Type": 1, "Device Id": 0, "Bytes": -512, "Total Allocated": 0, "Total Reserved": 2097152, "Addr": 18446744073709551615}}]}"#;
    for text in [&csv[..2000], &jsonl[..2000]] {
        for end in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let _ = read_device_log(&text[..end], utc());
            let _ = read_kineto(&text.as_bytes()[..end]);
        }
    }
    for end in 0..=trace.len() {
        let _ = read_kineto(&trace[..end]);
    }
    let full = read_kineto(trace).unwrap();
    assert_eq!(full.samples[0].addr, Some(-1));
    assert_eq!(full.base_time_ns, Some(17));
    for mangled in [
        "timestamp, index, memory.used [MiB]\n9999/12/31 23:59:59.999999999+23:59, 0, 18446744073709551615 MiB\n",
        "timestamp, index, memory.used [MiB]\n0000/01/01 00:00:00, -5, 1 TiB\n",
        "timestamp,pid\n2025/07/05 15:01:02.123, [N/A]\n",
        "{\"time_us\": 1e300, \"processes\": [{\"pid\": -1}]}\n",
        "{\"time_us\": 9223372036854775807, \"gpu\": 0, \"used_bytes\": 18446744073709551615}\n",
        "ß,ü,€\n,,,\n",
    ] {
        let _ = read_device_log(mangled, utc());
        let _ = read_device_log(
            mangled,
            ClockOptions {
                utc_offset_minutes: i32::MIN,
            },
        );
    }
}

#[test]
fn reading_is_deterministic() {
    let text = std::fs::read_to_string(root().join("testdata/gpu/nvsmi_gpu.csv")).unwrap();
    let a = serde_json::to_string(&read_device_log(&text, utc()).unwrap()).unwrap();
    let b = serde_json::to_string(&read_device_log(&text, utc()).unwrap()).unwrap();
    assert_eq!(a, b);
}
