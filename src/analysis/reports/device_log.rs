//! `summary LOG`: what a device log alone says, per GPU and per process: how much memory
//! was used at the peak and when, on average and at the end, over which readings. Plain
//! data; rendering is elsewhere. The figures come from [`DeviceLog::gpu_stats`] and
//! [`DeviceLog::process_stats`], which count every row of the file.

use crate::devlog::{DeviceLog, GpuNumbering, UsedStats};
use serde::Serialize;

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LogSummary {
    pub schema_version: u32,
    /// Always `"device_log"`: tells this object from a snapshot's summary.
    pub kind: &'static str,
    pub path: String,
    /// `"nvidia-smi"` or `"nvml"`.
    pub source: &'static str,
    pub numbering: GpuNumbering,
    /// Some timestamps named no zone and no clock offset was given: the times are the
    /// log's local time as written (read as if UTC).
    pub local_times: bool,
    pub gpus: Vec<GpuUse>,
    pub processes: Vec<ProcessUse>,
    /// Process rows past the processes summed up one by one (a log of many thousands).
    pub process_rows_unsummarized: u64,
    /// One line per kind of tolerated problem in the log, with its count and first line.
    pub warnings: Vec<String>,
}

/// Used memory over a set of readings.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct UseFigures {
    /// Readings with a used figure.
    pub readings: u64,
    pub first_time_us: i64,
    pub last_time_us: i64,
    pub peak_bytes: u64,
    /// The first reading at the peak.
    pub peak_time_us: i64,
    /// The readings' mean, rounded down.
    pub mean_bytes: u64,
    pub lowest_bytes: u64,
    pub lowest_time_us: i64,
    /// The latest reading's.
    pub last_bytes: u64,
}

impl UseFigures {
    fn of(u: &UsedStats) -> UseFigures {
        UseFigures {
            readings: u.readings,
            first_time_us: u.first_us,
            last_time_us: u.last_us,
            peak_bytes: u.peak_bytes,
            peak_time_us: u.peak_us,
            mean_bytes: u.mean_bytes(),
            lowest_bytes: u.low_bytes,
            lowest_time_us: u.low_us,
            last_bytes: u.last_bytes,
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuUse {
    pub gpu: i64,
    pub uuid: Option<String>,
    /// Rows of this GPU, with or without a used figure.
    pub rows: u64,
    /// The GPU's memory, when the log gives it (the largest figure it gives).
    pub total_bytes: Option<u64>,
    /// Null when no row gives the used memory.
    pub used: Option<UseFigures>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessUse {
    pub pid: u64,
    /// The GPU's number, when the log says it or names the GPU by a uuid its readings
    /// carry.
    pub gpu: Option<i64>,
    pub gpu_uuid: Option<String>,
    pub rows: u64,
    /// Null when the log gives no figure for the process (Windows' WDDM driver).
    pub used: Option<UseFigures>,
}

/// Sums up a device log read whole; `offset_given`: its zone-less times were moved by a
/// clock offset.
pub fn analyze_device_log(log: &DeviceLog, path: &str, offset_given: bool) -> LogSummary {
    let uuid = |i: Option<u32>| log.uuid(i).map(str::to_string);
    let gpus = log
        .gpu_stats
        .iter()
        .map(|g| GpuUse {
            gpu: g.gpu,
            uuid: uuid(g.uuid),
            rows: g.rows,
            total_bytes: g.total_bytes,
            used: g.used.as_ref().map(UseFigures::of),
        })
        .collect();
    let mut processes: Vec<ProcessUse> = log
        .process_stats
        .iter()
        .map(|p| ProcessUse {
            pid: p.pid,
            gpu: p.gpu,
            gpu_uuid: uuid(p.gpu_uuid),
            rows: p.rows,
            used: p.used.as_ref().map(UseFigures::of),
        })
        .collect();
    // Largest peak first; then by GPU and pid.
    processes.sort_by(|a, b| {
        let peak = |p: &ProcessUse| p.used.map_or(0, |u| u.peak_bytes);
        peak(b)
            .cmp(&peak(a))
            .then(a.gpu.cmp(&b.gpu))
            .then(a.gpu_uuid.cmp(&b.gpu_uuid))
            .then(a.pid.cmp(&b.pid))
    });
    LogSummary {
        schema_version: SCHEMA_VERSION,
        kind: "device_log",
        path: path.to_string(),
        source: log.source,
        numbering: log.numbering,
        local_times: log.zoneless_times && !offset_given,
        gpus,
        processes,
        process_rows_unsummarized: log.process_rows_unsummarized,
        warnings: log.warnings.clone(),
    }
}
