//! Device logs (nvidia-smi CSV, NVML JSON lines) and profiler memory events (Kineto traces,
//! memory-timeline exports) read by `vramlens::devlog`.
//!
//! Real files come from `../shared/data` (figures checked with Python's csv/json, see the
//! comments); those tests are ignored when the folder is absent and say so when run
//! without it. Our own H200 recordings in `testdata/gpu` always run.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use vramlens::devlog::profile::{Category, SpanKind};
use vramlens::devlog::{
    ClockOptions, DeviceLog, DeviceLogOptions, DevlogError, GpuNumbering, GpuSample, LogLimits,
    ProcessSample, ProfileKind, ProfileTrace, TimeRange, TraceClock, merge, read_device_log,
    read_device_log_near, read_profile,
};

const MIB: u64 = 1 << 20;
const H200_UUID: &str = "GPU-a33ac4bd-89b7-0256-6ec8-52dc29b7a10a";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file under `../shared/data`; panics, saying why, when it is missing.
fn shared(rel: &str) -> PathBuf {
    let path = root().join("../shared/data").join(rel);
    assert!(
        path.exists(),
        "{} is missing: this test needs ../shared/data (run it where the real data is)",
        path.display()
    );
    path
}

fn utc() -> DeviceLogOptions {
    DeviceLogOptions::default()
}

fn offset(minutes: i32) -> DeviceLogOptions {
    DeviceLogOptions {
        clock: ClockOptions {
            utc_offset_minutes: minutes,
        },
        ..DeviceLogOptions::default()
    }
}

fn device_log(path: &Path, options: DeviceLogOptions) -> DeviceLog {
    let file = std::fs::File::open(path).unwrap();
    read_device_log(BufReader::new(file), options)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text_log(text: &str) -> Result<DeviceLog, DevlogError> {
    read_device_log(text.as_bytes(), utc())
}

fn profile(path: &Path) -> ProfileTrace {
    read_profile(std::fs::File::open(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
    let path = shared("nvsmi-miris-v100s/gpu_log.csv");
    let log = device_log(&path, utc());
    assert_eq!(log.source, "nvidia-smi");
    assert_eq!(log.numbering, GpuNumbering::DriverIndex);
    assert_eq!(log.gpus.len(), 107);
    assert!(log.processes.is_empty());
    assert!(log.warnings.is_empty(), "{:?}", log.warnings);
    assert!(log.zoneless_times);
    // 2025/06/13 00:27:52.195, 0, Tesla V100S-PCIE-32GB, 0 %, 0 %, 32768 MiB, 1 MiB, 27
    assert_eq!(log.gpus[0], gpu(1_749_774_472_195_000, 0, 1, Some(32768)));
    // 2025/06/13 00:29:38.248, 0, Tesla V100S-PCIE-32GB, 0 %, 0 %, 32768 MiB, 1 MiB, 28
    assert_eq!(log.gpus[106], gpu(1_749_774_578_248_000, 0, 1, Some(32768)));

    // The clock offset moves every zone-less stamp.
    let shifted = device_log(&path, offset(-420));
    assert_eq!(
        shifted.gpus[0].time_us,
        1_749_774_472_195_000 - 420 * 60_000_000
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn nvsmi_vlm_opt_4090_without_index_is_one_gpu() {
    let path = shared("nvsmi-vlm-opt-4090/gpu_log.csv");
    let log = device_log(&path, utc());
    assert_eq!(log.gpus.len(), 2619);
    assert!(log.warnings.is_empty(), "{:?}", log.warnings);
    // No index and no uuid column, and no two rows share a timestamp: one GPU, number 0.
    assert_eq!(log.numbering, GpuNumbering::RowOrder);
    assert_eq!(log.gpu_numbers(), vec![0]);
    // 2026/01/03 15:36:53.507, NVIDIA GeForce RTX 4090, 1 %, 2 %, 1129 MiB, 33.09 W
    assert_eq!(log.gpus[0], gpu(1_767_454_613_507_000, 0, 1129, None));
    // 2026/01/03 16:24:53.961, NVIDIA GeForce RTX 4090, 3 %, 4 %, 1141 MiB, 34.15 W
    assert_eq!(log.gpus[2618], gpu(1_767_457_493_961_000, 0, 1141, None));
    let span = log.span_of(0).unwrap();
    assert_eq!(span.rows, 2619);
    assert_eq!(
        span.range,
        TimeRange::new(1_767_454_613_507_000, 1_767_457_493_961_000)
    );
}

#[test]
#[ignore = "needs ../shared/data"]
fn nvsmi_gpu_glasses_hand_written_header_iso_times() {
    let path = shared("nvsmi-gpu-glasses/nvidia_smi.csv");
    // ISO stamps carry +08:00, so the clock offset must not move them.
    for minutes in [0, 300] {
        let log = device_log(&path, offset(minutes));
        assert_eq!(log.gpus.len(), 43);
        assert!(!log.zoneless_times);
        // 2025-09-08T17:26:50+08:00,0, 0, 4, 81559, 74.01, 33
        assert_eq!(log.gpus[0], gpu(1_757_323_610_000_000, 0, 4, Some(81559)));
        // 2025-09-08T17:26:58+08:00,2, 0, 4, 81559, 72.96, 35
        assert_eq!(log.gpus[42], gpu(1_757_323_618_000_000, 2, 4, Some(81559)));
        assert_eq!(log.gpu_numbers(), (0..8).collect::<Vec<_>>());
        assert_eq!(log.numbering, GpuNumbering::DriverIndex);
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
    assert_eq!(log.uuids, vec![H200_UUID.to_string()]);
    // 2026/11/29 19:15:09.741, 0, GPU-a33ac4bd-..., 0 MiB, 143771 MiB
    assert_eq!(
        log.gpus[0],
        GpuSample {
            time_us: 1_795_979_709_741_000,
            gpu: 0,
            uuid: Some(0),
            used_bytes: Some(0),
            total_bytes: Some(143_771 * MIB),
            free_bytes: None,
        }
    );
    assert_eq!(log.uuid(log.gpus[0].uuid), Some(H200_UUID));
    assert_eq!(log.gpus[214].time_us, 1_795_979_752_771_000);
    assert!(
        log.gpus
            .iter()
            .all(|s| s.total_bytes == Some(143_771 * MIB))
    );
    let peak = log.gpus.iter().filter_map(|s| s.used_bytes).max();
    assert_eq!(peak, Some(143_125 * MIB));
    assert!(log.gpus.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    // As JSON, a reading is its fields with the uuid as an index into `uuids`.
    assert_eq!(
        serde_json::to_value(log.gpus[0]).unwrap(),
        serde_json::json!({"time_us": 1_795_979_709_741_000i64, "gpu": 0, "uuid": 0,
            "used_bytes": 0, "total_bytes": 143_771u64 * MIB, "free_bytes": null})
    );
}

#[test]
fn keeping_a_window_counts_what_was_left_out() {
    // Only the readings between 19:15:20 and 19:15:30 (UTC) are kept.
    let keep = TimeRange::new(1_795_979_720_000_000, 1_795_979_730_000_000);
    let log = device_log(
        &root().join("testdata/gpu/nvsmi_gpu.csv"),
        DeviceLogOptions {
            keep: Some(keep),
            ..utc()
        },
    );
    // Counted in Python: 50 of the 215 rows are inside it (one every 0.2 s).
    assert_eq!(log.gpus.len(), 50);
    assert_eq!(log.rows_outside_window, 165);
    assert!(log.gpus.iter().all(|s| keep.contains(s.time_us)));
    // The span still covers the whole file.
    let span = log.span_of(0).unwrap();
    assert_eq!(span.rows, 215);
    assert_eq!(
        span.range,
        TimeRange::new(1_795_979_709_741_000, 1_795_979_752_771_000)
    );
}

/// A `--query-gpu` CSV of `rows` readings of 2 GPUs, one every millisecond from
/// 2025-01-01 00:00:00 UTC, used = 1000 + (k * 7919 % 5000) MiB for row k, except one
/// spike of 90000 MiB at row `spike` and one dip of 3 MiB at row `dip`.
fn many_rows_csv(rows: u64, spike: u64, dip: u64) -> String {
    let mut text = String::from("timestamp, index, memory.used [MiB], memory.total [MiB]\n");
    for k in 0..rows {
        let (s, ms) = (k / 1000, k % 1000);
        let used = match k {
            _ if k == spike => 90_000,
            _ if k == dip => 3,
            _ => 1000 + (k * 7919 % 5000),
        };
        text.push_str(&format!(
            "2025-01-01T00:{:02}:{:02}.{ms:03}Z, {}, {used} MiB, 100000 MiB\n",
            s / 60,
            s % 60,
            k % 2
        ));
    }
    text
}

/// 2025-01-01 00:00:00 UTC.
const JAN_2025_US: i64 = 1_735_689_600_000_000;

fn small_limits(keep: TimeRange) -> DeviceLogOptions {
    DeviceLogOptions {
        keep: Some(keep),
        limits: LogLimits {
            max_kept_rows: 1000,
            series_buckets: 64,
            // Odd: a focus range's midpoint (its moment) is no bucket edge.
            focus_buckets: 33,
        },
        ..utc()
    }
}

#[test]
fn a_log_longer_than_the_limit_folds_into_a_bounded_series() {
    // 100,000 readings (100 s), window all of it, 64 buckets, no focus.
    let rows = 100_000;
    let text = many_rows_csv(rows, 40_000, 70_001);
    let keep = TimeRange::new(JAN_2025_US, JAN_2025_US + 100_000_000);
    let log = read_device_log(text.as_bytes(), small_limits(keep)).unwrap();
    // At most 4 readings per GPU and bucket: 2 GPUs x 64 buckets x 4.
    assert!(log.gpus.len() <= 2 * 64 * 4, "{}", log.gpus.len());
    assert!(log.gpus.len() >= 2 * 64, "{}", log.gpus.len());
    // Every row is counted: in the spans, and as kept or folded.
    let spans: u64 = log.spans.iter().map(|s| s.rows).sum();
    assert_eq!(spans, rows);
    assert_eq!(log.rows_folded + log.gpus.len() as u64, rows);
    assert_eq!(log.rows_outside_window, 0);
    // The spike (row 40000: GPU 0 at 40.000 s) and the dip (row 70001: GPU 1 at
    // 70.001 s) survive exactly.
    let at = |k: i64| JAN_2025_US + k * 1000;
    assert!(
        log.gpus
            .contains(&gpu(at(40_000), 0, 90_000, Some(100_000)))
    );
    assert!(log.gpus.contains(&gpu(at(70_001), 1, 3, Some(100_000))));
    // The first and last readings of each GPU too, and the order is (time, gpu).
    assert_eq!(log.gpus[0].time_us, at(0));
    assert_eq!(log.gpus.last().unwrap().time_us, at(99_999));
    assert!(
        log.gpus
            .windows(2)
            .all(|w| (w[0].time_us, w[0].gpu) < (w[1].time_us, w[1].gpu))
    );
}

#[test]
fn a_log_at_the_limit_is_kept_row_by_row() {
    // 1000 rows, limit 1000: nothing folds, every reading is there as read.
    let text = many_rows_csv(1000, 10, 20);
    let keep = TimeRange::new(JAN_2025_US, JAN_2025_US + 100_000_000);
    let log = read_device_log(text.as_bytes(), small_limits(keep)).unwrap();
    let all = read_device_log(text.as_bytes(), utc()).unwrap();
    assert_eq!(log.gpus.len(), 1000);
    assert_eq!(log.rows_folded, 0);
    assert_eq!(log.gpus, all.gpus);
}

#[test]
fn a_folded_log_keeps_finer_detail_near_the_focus() {
    // Focus on 50.000 s .. 50.999 s: 32 more buckets of about 31 ms there.
    let rows = 100_000;
    let text = many_rows_csv(rows, 0, 1);
    let keep = TimeRange::new(JAN_2025_US, JAN_2025_US + 100_000_000);
    let focus = TimeRange::new(JAN_2025_US + 50_000_000, JAN_2025_US + 50_999_999);
    let log = read_device_log_near(text.as_bytes(), small_limits(keep), &[focus]).unwrap();
    let plain = read_device_log(text.as_bytes(), small_limits(keep)).unwrap();
    let inside = |l: &DeviceLog| l.gpus.iter().filter(|s| focus.contains(s.time_us)).count();
    // Without focus that second lies in one 1.5625 s bucket (at most 2 x 4 readings, some
    // of which may fall outside the second); with it, 33 (+1 the coarse edge) buckets.
    assert!(inside(&plain) <= 8, "{}", inside(&plain));
    assert!(inside(&log) >= 2 * 32, "{}", inside(&log));
    assert!(log.gpus.len() <= 2 * (64 + 34) * 4 + 2 * 2);
}

#[test]
fn a_folded_log_keeps_the_readings_on_either_side_of_each_moment() {
    // The moment 50.3005 s, focus +-10 s cut into 33 buckets of 606 ms (the moment inside
    // one): each GPU's last reading before it and first after it are kept, whatever the
    // buckets keep.
    let text = many_rows_csv(100_000, 0, 1);
    let keep = TimeRange::new(JAN_2025_US, JAN_2025_US + 100_000_000);
    let moment = JAN_2025_US + 50_300_500;
    let focus = TimeRange::new(moment, moment).widen(10_000_000);
    let log = read_device_log_near(text.as_bytes(), small_limits(keep), &[focus]).unwrap();
    assert!(log.rows_folded > 0);
    // Row k is at k ms, GPU k % 2: GPU 0 has rows 50300 and 50302 around the moment,
    // GPU 1 rows 50299 and 50301.
    let row = |k: u64| {
        gpu(
            JAN_2025_US + k as i64 * 1000,
            (k % 2) as i64,
            1000 + (k * 7919 % 5000),
            Some(100_000),
        )
    };
    for k in [50_299, 50_300, 50_301, 50_302] {
        assert!(log.gpus.contains(&row(k)), "row {k}");
    }
}

#[test]
fn a_folded_nvml_log_keeps_the_process_rows_of_each_kept_reading() {
    // 5000 NVML lines, 1 ms apart, each with two processes; limit 1000 rows, 64 buckets.
    let mut text = String::new();
    for k in 0..5000i64 {
        text.push_str(&format!(
            "{{\"time_us\": {}, \"gpu\": 0, \"used_bytes\": {}, \"processes\": [{{\"pid\": 7, \"used_bytes\": {k}}}, {{\"pid\": 8, \"used_bytes\": 1}}]}}\n",
            JAN_2025_US + k * 1000,
            1000 + k
        ));
    }
    let keep = TimeRange::new(JAN_2025_US, JAN_2025_US + 5_000_000);
    let log = read_device_log(text.as_bytes(), small_limits(keep)).unwrap();
    // Used grows: per bucket the first (the minimum) and the last (the maximum) survive.
    assert!(log.gpus.len() <= 64 * 2, "{}", log.gpus.len());
    // Processes: the two rows of each kept reading's instant (NVML takes them together).
    assert!(log.processes.len() <= 64 * 2 * 2, "{}", log.processes.len());
    for s in &log.gpus {
        let at: Vec<(u64, Option<u64>)> = log
            .processes
            .iter()
            .filter(|p| p.time_us == s.time_us)
            .map(|p| (p.pid, p.used_bytes))
            .collect();
        let k = (s.time_us - JAN_2025_US) as u64 / 1000;
        assert_eq!(at, [(7, Some(k)), (8, Some(1))], "at {}", s.time_us);
    }
    assert_eq!(log.processes.len(), 2 * log.gpus.len());
    let last = &log.processes[log.processes.len() - 2..];
    assert_eq!((last[0].pid, last[0].used_bytes), (7, Some(4999)));
    assert_eq!((last[1].pid, last[1].used_bytes), (8, Some(1)));
    assert_eq!(log.gpus.last().unwrap().used_bytes, Some(5999));
    assert_eq!(
        log.rows_folded + (log.gpus.len() + log.processes.len()) as u64,
        5000 * 3
    );
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
            gpu_uuid: Some(0),
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
    assert_eq!(merged.uuids.len(), 1);

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
                && log.uuid(p.gpu_uuid) == Some(H200_UUID))
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
            uuid: Some(0),
            used_bytes: Some(648_347_648),
            total_bytes: Some(150_754_820_096),
            free_bytes: Some(150_106_472_448),
        }
    );
    assert_eq!(ok.gpus[98].time_us, 1_795_979_720_884_293);
    assert_eq!(ok.gpus[98].used_bytes, Some(3_284_008_960));
}

// ---------------------------------------------------------------------------------------
// GPU numbering of logs without an index column
// ---------------------------------------------------------------------------------------

#[test]
fn gpus_without_index_are_numbered_by_uuid_then_by_row() {
    // Uuids, no index: numbered in order of first appearance.
    let log = text_log(
        "timestamp, uuid, memory.used [MiB]\n\
         2025/07/05 15:01:02.000, GPU-b, 5 MiB\n\
         2025/07/05 15:01:02.000, GPU-a, 6 MiB\n\
         2025/07/05 15:01:03.000, GPU-b, 7 MiB\n",
    )
    .unwrap();
    assert_eq!(log.numbering, GpuNumbering::UuidOrder);
    assert_eq!(log.uuids, vec!["GPU-b".to_string(), "GPU-a".to_string()]);
    let of = |g: i64| -> Vec<u64> {
        log.gpus
            .iter()
            .filter(|s| s.gpu == g)
            .filter_map(|s| s.used_bytes)
            .map(|b| b / MIB)
            .collect()
    };
    assert_eq!((of(0), of(1)), (vec![5, 7], vec![6]));

    // Neither: rows sharing a stamp, in groups of two, are two GPUs.
    let two = text_log(
        "timestamp, memory.used [MiB]\n\
         2025/07/05 15:01:02.000, 1 MiB\n2025/07/05 15:01:02.000, 2 MiB\n\
         2025/07/05 15:01:03.000, 3 MiB\n2025/07/05 15:01:03.000, 4 MiB\n",
    )
    .unwrap();
    assert_eq!(two.numbering, GpuNumbering::RowOrder);
    assert_eq!(two.gpu_numbers(), vec![0, 1]);
    let second: Vec<u64> = two
        .gpus
        .iter()
        .filter(|s| s.gpu == 1)
        .map(|s| s.used_bytes.unwrap() / MIB)
        .collect();
    assert_eq!(second, vec![2, 4]);
    // Groups of uneven size are a coarse clock: one GPU.
    let one = text_log(
        "timestamp, memory.used [MiB]\n\
         2025/07/05 15:01:02, 1 MiB\n2025/07/05 15:01:02, 2 MiB\n2025/07/05 15:01:03, 3 MiB\n",
    )
    .unwrap();
    assert_eq!(one.gpu_numbers(), vec![0]);
    assert!(one.gpus.iter().all(|s| s.gpu == 0));
    assert_eq!(one.span_of(0).unwrap().rows, 3);
}

// ---------------------------------------------------------------------------------------
// Profiler traces (../shared/data)
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
    clock: TraceClock,
    /// First and last memory event, Unix ns (Python: sorted by ts, base added, with
    /// decimal arithmetic).
    first_ns: i64,
    last_ns: i64,
    /// X events of the operator, Python-function and annotation categories.
    spans: usize,
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
            clock: TraceClock::Unix,
            first_ns: 1_623_143_093_496_534_000,
            last_ns: 1_623_143_094_414_010_000,
            spans: 23646,
        },
        TraceCase {
            rel: "kineto-tb-plugin-samples-2021/worker0.1623212756351.pt.trace.json.gz",
            events: 10980,
            cuda_events: 8280,
            cuda_peak: None,
            manifest: None,
            base_time_ns: None,
            clock: TraceClock::Unix,
            first_ns: 1_623_212_388_426_919_000,
            last_ns: 1_623_212_389_265_313_000,
            spans: 20562,
        },
        TraceCase {
            rel: "hta-test-data/df_index_resolver.json.gz",
            events: 28010,
            cuda_events: 26770,
            cuda_peak: Some((6_629_508_096, 12_782_141_440)),
            manifest: Some(((6.2, GIB), (11.9, GIB))),
            base_time_ns: None,
            clock: TraceClock::Unix,
            first_ns: 1_669_783_687_404_093_000,
            last_ns: 1_669_783_689_122_558_000,
            spans: 58715,
        },
        TraceCase {
            rel: "kernelforge-traces-2026/bfeed93fe629_2566.1773933981558265129.pt.trace.json",
            events: 18,
            cuda_events: 12,
            cuda_peak: Some((71_303_168, 71_303_168)),
            manifest: Some(((68.0, MIB_F), (68.0, MIB_F))),
            base_time_ns: Some(1_767_189_312_000_000_000),
            clock: TraceClock::RelativeToBase,
            first_ns: 1_773_933_981_508_209_101,
            last_ns: 1_773_933_981_542_755_167,
            spans: 415,
        },
        TraceCase {
            rel: "kernelforge-traces-2026/chrome_trace.json",
            events: 412,
            cuda_events: 0,
            cuda_peak: None,
            manifest: None,
            base_time_ns: Some(1_767_189_312_000_000_000),
            clock: TraceClock::RelativeToBase,
            first_ns: 1_773_999_186_014_223_698,
            last_ns: 1_773_999_186_139_361_945,
            spans: 527,
        },
        TraceCase {
            rel: "particle-transformer-traces-2024/single_epoch_forward_pass_batch_size_2.json",
            events: 996,
            cuda_events: 968,
            cuda_peak: Some((35_727_872, 90_177_536)),
            manifest: Some(((34.1, MIB_F), (86.0, MIB_F))),
            base_time_ns: Some(1_727_743_122_000_000_000),
            clock: TraceClock::RelativeToBase,
            first_ns: 1_733_397_261_052_199_133,
            last_ns: 1_733_397_261_085_016_228,
            spans: 2876,
        },
        TraceCase {
            rel: "unsloth-puzzles-trace/trace.json",
            events: 20,
            cuda_events: 0,
            cuda_peak: None,
            manifest: None,
            base_time_ns: Some(1_735_632_360_000_000_000),
            clock: TraceClock::RelativeToBase,
            first_ns: 1_739_913_255_488_380_032,
            last_ns: 1_739_913_255_501_941_575,
            spans: 88,
        },
    ];
    for case in cases {
        let trace = profile(&shared(case.rel));
        let rel = case.rel;
        assert_eq!(trace.kind, ProfileKind::KinetoTrace);
        assert_eq!(trace.memory.len(), case.events, "{rel}");
        assert_eq!(trace.base_time_ns, case.base_time_ns, "{rel}");
        assert_eq!(trace.clock, case.clock, "{rel}");
        assert_eq!(trace.memory[0].time_ns, case.first_ns, "{rel}");
        assert_eq!(trace.memory.last().unwrap().time_ns, case.last_ns, "{rel}");
        assert!(
            trace
                .memory
                .windows(2)
                .all(|w| w[0].time_ns <= w[1].time_ns),
            "{rel}"
        );
        assert_eq!(trace.spans.len(), case.spans, "{rel}");
        assert_eq!(trace.out_of_memory_events, 0, "{rel}");
        let cuda: Vec<_> = trace.memory.iter().filter(|s| s.device_type == 1).collect();
        assert_eq!(cuda.len(), case.cuda_events, "{rel}");
        assert!(
            trace
                .memory
                .iter()
                .all(|s| (s.device_type == 0) == (s.device_id == -1)),
            "{rel}"
        );
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
fn kineto_2021_shape_has_only_three_args_and_call_stacks() {
    let trace = profile(&shared(
        "kineto-tb-plugin-samples-2021/worker0.1623212756351.pt.trace.json.gz",
    ));
    assert!(
        trace
            .memory
            .iter()
            .all(|s| s.total_allocated.is_none() && s.total_reserved.is_none() && s.addr.is_none())
    );
    let s = &trace.memory[0];
    assert_eq!((s.device_type, s.device_id, s.bytes), (0, -1, 4));
    // 5490 allocations and 5490 frees (MANIFEST).
    let allocs = trace.memory.iter().filter(|s| s.bytes > 0).count();
    assert_eq!(allocs, 5490);
    // Operators carry their Python call stack as text, and the text tid of an operator is
    // the same thread as the numeric tid of a memory event.
    assert!(trace.spans.iter().all(|s| s.kind == SpanKind::Operator));
    let with_stack = trace
        .spans
        .iter()
        .filter(|s| s.call_stack.is_some())
        .count();
    assert!(with_stack > 0);
    let memory_threads: std::collections::BTreeSet<u32> =
        trace.memory.iter().filter_map(|m| m.thread).collect();
    assert!(
        memory_threads
            .iter()
            .all(|t| trace.spans.iter().any(|s| s.thread == *t))
    );
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
        let trace = profile(&shared(rel));
        let peak = trace.memory.iter().filter_map(|s| s.total_allocated).max();
        assert_eq!(peak, Some(exact), "{rel}");
        assert!(rounds_to(exact, unit, printed), "{rel}");
        assert!(trace.memory.iter().all(|s| s.total_reserved == Some(0)));
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn memory_timeline_raw_rows() {
    let trace = profile(&shared("hta-test-data/memory_timeline.raw.gz"));
    assert_eq!(trace.kind, ProfileKind::MemoryTimelineRaw);
    assert_eq!(trace.clock, TraceClock::Unix);
    assert_eq!(trace.memory.len(), 16845);
    assert_eq!(trace.base_time_ns, None);
    // Pre-existing rows (-1) take the smallest time, 1696966047096061874 ns, exactly.
    assert_eq!(trace.memory[0].time_ns, 1_696_966_047_096_061_874);
    assert_eq!(trace.memory[0].bytes, 37888);
    assert_eq!(trace.memory[0].category, Some(Category::Unknown));
    let first_free = trace.memory.iter().position(|s| s.bytes < 0).unwrap();
    assert_eq!(first_free, 645);
    assert_eq!(trace.memory[645].time_ns, 1_696_966_047_096_061_874);
    assert_eq!(trace.memory[16844].time_ns, 1_696_966_048_083_248_105);
    let sum: i64 = trace.memory.iter().map(|s| s.bytes).sum();
    assert_eq!(sum, 332_060_904);
    let mut running = 0i64;
    let mut peak = 0i64;
    for s in &trace.memory {
        running += s.bytes;
        peak = peak.max(running);
    }
    assert_eq!(peak, 3_082_832_104);
    // Rows per category (Python: collections.Counter of row[3]).
    let activation = trace
        .memory
        .iter()
        .filter(|m| m.category == Some(Category::Activation))
        .count();
    assert!(activation > 0);
}

// ---------------------------------------------------------------------------------------
// Forms written by hand, and bad input
// ---------------------------------------------------------------------------------------

#[test]
fn memory_timeline_category_totals_become_changes() {
    // [times in µs, rows of 9 numbers: an unused 0, then bytes per category]: parameters
    // 100 then 100, activations 0, 50, then 20.
    let json = br#"[[1700000000000000, 1700000000000010, 1700000000000020],
        [[0, 100, 0, 0, 0, 0, 0, 0, 0], [0, 100, 0, 0, 0, 50, 0, 0, 0], [0, 100, 0, 0, 0, 20, 0, 0, 0]]]"#;
    let trace = read_profile(&json[..]).unwrap();
    assert_eq!(trace.kind, ProfileKind::MemoryTimelineCategories);
    assert_eq!(trace.clock, TraceClock::Unix);
    let changes: Vec<(i64, i64, Option<Category>)> = trace
        .memory
        .iter()
        .map(|m| (m.time_ns, m.bytes, m.category))
        .collect();
    assert_eq!(
        changes,
        vec![
            (1_700_000_000_000_000_000, 100, Some(Category::Parameter)),
            (1_700_000_000_000_010_000, 50, Some(Category::Activation)),
            (1_700_000_000_000_020_000, -50, Some(Category::Activation)),
            (1_700_000_000_000_020_000, 20, Some(Category::Activation)),
        ]
    );
}

#[test]
fn csv_forms_without_header_units_and_unavailable_values() {
    // Headerless `timestamp,index,uuid,memory.used,memory.total` with nounits.
    let log = text_log(
        "2025/07/05 15:01:02.123, 1, GPU-x, 1234, 81920\n2025/07/05 15:01:02.000, 0, GPU-y, [N/A], 81920\n",
    )
    .unwrap();
    assert_eq!(log.gpus.len(), 2);
    // Sorted by time: the second row is earlier.
    assert_eq!(log.gpus[0].gpu, 0);
    assert_eq!(log.gpus[0].used_bytes, None);
    assert_eq!(log.gpus[1].used_bytes, Some(1234 * MIB));
    assert_eq!(log.uuid(log.gpus[1].uuid), Some("GPU-x"));

    // Headerless apps form, and the 4-column gpu form.
    let apps = text_log("2025/07/05 15:01:02.123, GPU-x, 77, [Not Supported]\n").unwrap();
    assert_eq!(apps.processes[0].pid, 77);
    assert_eq!(apps.processes[0].used_bytes, None);
    let g4 = text_log("2025-07-05T15:01:02Z, 3, 10 MiB, 20 MiB\n").unwrap();
    assert_eq!(g4.gpus[0], gpu(1_751_727_662_000_000, 3, 10, Some(20)));

    // Header with units, values without (nounits); header repeated; memory.free.
    let text = "timestamp, index, memory.used [MiB], memory.free [MiB]\n\
                2025/07/05 15:01:02.123, 0, 5, 7\n\
                timestamp, index, memory.used [MiB], memory.free [MiB]\n\
                2025/07/05 15:01:03.123, 0, 6, 6\n";
    let log = text_log(text).unwrap();
    assert_eq!(log.gpus.len(), 2);
    assert_eq!(log.gpus[1].free_bytes, Some(6 * MIB));

    // Compute apps with only a header, or the driver's message: no rows, no error.
    for text in [
        "pid, used_gpu_memory [MiB]\n",
        "No running processes found\n",
    ] {
        let log = text_log(text).unwrap();
        assert!(log.gpus.is_empty() && log.processes.is_empty(), "{text}");
    }
    // Without a timestamp column the samples are at 0, with a warning.
    let log = text_log("pid, used_gpu_memory [MiB]\n12, 3 MiB\n").unwrap();
    assert_eq!(log.processes[0].time_us, 0);
    assert_eq!(log.processes[0].used_bytes, Some(3 * MIB));
    assert_eq!(log.warnings.len(), 1);

    // A truncated last line is skipped with a warning; CRLF and a BOM are fine.
    let log = text_log(
        "\u{feff}timestamp, index, memory.used [MiB]\r\n2025/07/05 15:01:02.123, 0, 5 MiB\r\n2025/07/05 15:0",
    )
    .unwrap();
    assert_eq!(log.gpus.len(), 1);
    assert_eq!(log.gpus[0].used_bytes, Some(5 * MIB));
    assert!(log.warnings[0].contains("truncated"), "{:?}", log.warnings);
}

fn err(text: &str) -> String {
    match text_log(text) {
        Ok(log) => panic!("expected an error for {text:?}, got {log:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_device_logs_name_the_line() {
    assert!(matches!(text_log(""), Err(DevlogError::Empty { .. })));
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
    // A line of a megabyte is not a device log.
    let long = format!(
        "timestamp, index, memory.used [MiB]\n{}\n",
        "9".repeat(2 << 20)
    );
    assert_eq!(
        err(&long),
        "line 2: expected a line of a device log, found a line longer than 1 MiB"
    );
    // A truncated last JSON line is a warning, not an error.
    let log = text_log("{\"time_us\": 1, \"gpu\": 0}\n{\"time_us\": 2, \"gp").unwrap();
    assert_eq!((log.gpus.len(), log.warnings.len()), (1, 1));
}

#[test]
fn bad_traces() {
    let e = |bytes: &[u8]| match read_profile(bytes) {
        Ok(t) => panic!("expected an error, got {} events", t.memory.len()),
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
    assert!(
        e(b"<html><head><title>GPU Memory Timeline HTML</title></head>")
            .contains("a picture of the plot, with no data in it")
    );
    assert_eq!(
        e(b"{\"traceEvents\": [{\"name\": \"[memory]\", \"ts\": 1, \"args\": {\"Device Type\": 1, \"Device Id\": 0}}]}"),
        "traceEvents[0].args: expected a \"Bytes\" key, found none"
    );
    assert_eq!(
        e(b"{\"traceEvents\": [{\"name\": \"x\"}, {\"name\": \"[memory]\", \"ts\": 1, \"args\": {\"Device Type\": 1, \"Device Id\": 0, \"Bytes\": \"8\"}}]}"),
        "traceEvents[1].args.Bytes: expected an integer, found a string"
    );
    assert_eq!(
        e(b"{\"traceEvents\": 5}"),
        "traceEvents: expected a list, found a number"
    );
    assert_eq!(
        e(b"{\"other\": 1}"),
        "(top level): expected a \"traceEvents\" list, found an object with keys \"other\""
    );
    assert_eq!(
        e(b"[[1, 2, 3], [4, 5, 6, 7]]"),
        "[0]: expected a Kineto/Chrome trace JSON (torch.profiler with profile_memory=True) or memory-timeline raw rows [timestamp_ns, action, numbytes, category], found a list of 3 numbers"
    );
    assert_eq!(
        e(b"[[1, 2, 3, 9]]"),
        "[0][3]: category: expected 0 to 7, found 9"
    );
    // Chrome's bare array form and a gzip stream of a small trace both read; the base
    // time may come after the events.
    let chrome = br#"[{"name": "[memory]", "ph": "i", "ts": 5.5, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Allocated": 512, "Total Reserved": 2097152, "Addr": 139}}, {"name": "[OutOfMemory]", "ts": 6, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 1}}]"#;
    let trace = read_profile(&chrome[..]).unwrap();
    assert_eq!(trace.memory.len(), 1);
    assert_eq!(trace.out_of_memory_events, 1);
    assert_eq!(trace.memory[0].time_ns, 5500);
    assert_eq!(trace.clock, TraceClock::Unknown);
    assert_eq!(trace.memory[0].total_reserved, Some(2_097_152));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, chrome).unwrap();
    assert_eq!(read_profile(&gz.finish().unwrap()[..]).unwrap(), trace);
    let late_base = br#"{"traceEvents": [{"name": "[memory]", "ts": 2.5, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512}}], "baseTimeNanoseconds": 1700000000000000000}"#;
    let t = read_profile(&late_base[..]).unwrap();
    assert_eq!(t.clock, TraceClock::RelativeToBase);
    assert_eq!(t.memory[0].time_ns, 1_700_000_000_000_002_500);
}

/// Every prefix of valid files, and a few mutations, give a log or an error, never a panic.
#[test]
fn no_panic_on_truncated_or_mangled_input() {
    let csv = std::fs::read_to_string(root().join("testdata/gpu/nvsmi_apps.csv")).unwrap();
    let jsonl = std::fs::read_to_string(root().join("testdata/gpu/ok/nvml.jsonl")).unwrap();
    let trace = br#"{"baseTimeNanoseconds": 17, "traceEvents": [{"name": "[memory]", "ts": 1.5, "args": {"Device Type": 1, "Device Id": 0, "Bytes": -512, "Total Allocated": 0, "Total Reserved": 2097152, "Addr": 18446744073709551615}}]}"#;
    for text in [&csv[..2000], &jsonl[..2000]] {
        for end in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let _ = text_log(&text[..end]);
            let _ = read_profile(&text.as_bytes()[..end]);
        }
    }
    for end in 0..=trace.len() {
        let _ = read_profile(&trace[..end]);
    }
    let full = read_profile(&trace[..]).unwrap();
    assert_eq!(full.memory[0].addr, Some(u64::MAX));
    assert_eq!(full.base_time_ns, Some(17));
    assert_eq!(full.memory[0].time_ns, 17 + 1500);
    for mangled in [
        "timestamp, index, memory.used [MiB]\n9999/12/31 23:59:59.999999999+23:59, 0, 18446744073709551615 MiB\n",
        "timestamp, index, memory.used [MiB]\n0000/01/01 00:00:00, -5, 1 TiB\n",
        "timestamp,pid\n2025/07/05 15:01:02.123, [N/A]\n",
        "{\"time_us\": 1e300, \"processes\": [{\"pid\": -1}]}\n",
        "{\"time_us\": 9223372036854775807, \"gpu\": 0, \"used_bytes\": 18446744073709551615}\n",
        "ß,ü,€\n,,,\n",
    ] {
        let _ = text_log(mangled);
        let _ = read_device_log(
            mangled.as_bytes(),
            DeviceLogOptions {
                clock: ClockOptions {
                    utc_offset_minutes: i32::MIN,
                },
                ..DeviceLogOptions::default()
            },
        );
    }
}

// ---------------------------------------------------------------------------------------
// Sums over every row: what `summary LOG` reports
// ---------------------------------------------------------------------------------------

#[test]
fn a_folded_log_still_sums_every_row_exactly() {
    // 100,000 readings folded into 64 buckets: the sums count every row, worked out here
    // from the generator's own formula.
    let rows = 100_000;
    let text = many_rows_csv(rows, 40_000, 70_001);
    let keep = TimeRange::new(JAN_2025_US, JAN_2025_US + 100_000_000);
    let log = read_device_log(text.as_bytes(), small_limits(keep)).unwrap();
    assert!(log.rows_folded > 0, "the rows were folded");
    assert_eq!(log.gpu_stats.len(), 2);
    for (i, g) in log.gpu_stats.iter().enumerate() {
        let mut sum = 0u128;
        let mut n = 0u64;
        let mut peak = (0u64, 0i64);
        let mut low = (u64::MAX, 0i64);
        let mut last = 0u64;
        for k in (i as u64..rows).step_by(2) {
            let used = match k {
                40_000 => 90_000,
                70_001 => 3,
                _ => 1000 + (k * 7919 % 5000),
            } * MIB;
            let t = JAN_2025_US + k as i64 * 1000;
            sum += u128::from(used);
            n += 1;
            if used > peak.0 {
                peak = (used, t);
            }
            if used < low.0 {
                low = (used, t);
            }
            last = used;
        }
        assert_eq!(g.gpu, i as i64);
        assert_eq!(g.rows, n);
        assert_eq!(g.total_bytes, Some(100_000 * MIB));
        let u = g.used.unwrap();
        assert_eq!(u.readings, n);
        assert_eq!(u.sum_bytes, sum);
        assert_eq!((u.peak_bytes, u.peak_us), peak);
        assert_eq!((u.low_bytes, u.low_us), low);
        assert_eq!(u.last_bytes, last);
        assert_eq!(u.first_us, JAN_2025_US + i as i64 * 1000);
    }
    // The spike is GPU 0's (row 40,000), the dip GPU 1's (row 70,001).
    assert_eq!(log.gpu_stats[0].used.unwrap().peak_bytes, 90_000 * MIB);
    assert_eq!(log.gpu_stats[1].used.unwrap().low_bytes, 3 * MIB);
}

#[test]
fn process_sums_are_per_process_and_gpu_and_follow_uuids_through_a_merge() {
    // An apps CSV names GPUs by uuid only; the GPU CSV gives the uuid's number.
    let gpus = read_device_log(
        "timestamp, index, uuid, memory.used [MiB], memory.total [MiB]\n\
         2024-01-01T00:00:00Z, 0, GPU-a, 100 MiB, 1000 MiB\n\
         2024-01-01T00:00:00Z, 1, GPU-b, 200 MiB, 1000 MiB\n"
            .as_bytes(),
        utc(),
    )
    .unwrap();
    let apps = read_device_log(
        "timestamp, gpu_uuid, pid, used_gpu_memory [MiB]\n\
         2024-01-01T00:00:00Z, GPU-b, 7, 10 MiB\n\
         2024-01-01T00:00:01Z, GPU-b, 7, 30 MiB\n\
         2024-01-01T00:00:02Z, GPU-b, 7, 20 MiB\n\
         2024-01-01T00:00:01Z, GPU-a, 7, 5 MiB\n\
         2024-01-01T00:00:01Z, GPU-a, 9, [N/A]\n"
            .as_bytes(),
        utc(),
    )
    .unwrap();
    let merged = merge(vec![gpus, apps]);
    let t0 = 1_704_067_200_000_000;
    let stats: Vec<_> = merged
        .process_stats
        .iter()
        .map(|p| {
            (
                p.gpu,
                p.pid,
                p.rows,
                p.used
                    .map(|u| (u.peak_bytes, u.peak_us, u.mean_bytes(), u.last_bytes)),
            )
        })
        .collect();
    assert_eq!(
        stats,
        vec![
            (
                Some(0),
                7,
                1,
                Some((5 * MIB, t0 + 1_000_000, 5 * MIB, 5 * MIB))
            ),
            (Some(0), 9, 1, None),
            (
                Some(1),
                7,
                3,
                Some((30 * MIB, t0 + 1_000_000, 20 * MIB, 20 * MIB))
            ),
        ]
    );
}

/// A log in UTF-16 (Windows PowerShell's `>`), little- or big-endian with its byte-order
/// mark, reads as the same log in UTF-8: long enough to cross the decoder's reads, with a
/// character outside the BMP (a surrogate pair) in a name.
#[test]
fn a_utf16_log_reads_as_its_utf8_text() {
    let mut text =
        String::from("timestamp, index, name, memory.used [MiB], memory.total [MiB]\r\n");
    for k in 0..2000 {
        text.push_str(&format!(
            "2025/01/01 00:{:02}:{:02}.000, 0, GPU \u{1F680} {k}, {} MiB, 81559 MiB\r\n",
            k / 60 % 60,
            k % 60,
            1000 + k
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let utf8 = dir.path().join("utf8.csv");
    std::fs::write(&utf8, &text).unwrap();
    let read = |path: &Path| {
        read_device_log(vramlens::input::open_side_input(path).unwrap(), utc()).unwrap()
    };
    let want = read(&utf8);
    assert_eq!(want.gpus.len(), 2000);
    for (name, bom, le) in [
        ("le.csv", [0xff, 0xfe], true),
        ("be.csv", [0xfe, 0xff], false),
    ] {
        let mut bytes = bom.to_vec();
        for u in text.encode_utf16() {
            bytes.extend(if le { u.to_le_bytes() } else { u.to_be_bytes() });
        }
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read(&path), want, "{name}");
    }
}
