//! Side inputs: device-level memory logs, profiler memory events and the CUDA
//! out-of-memory messages of a log ([`oom_log`]), the evidence a user may bring beside a
//! snapshot, one file per format.
//!
//! A side entrance beside the snapshot flow: each reader takes a
//! byte stream and gives plain, sorted samples, reading it line by line (text formats) or
//! event by event (JSON traces), so memory follows what is kept, not the file's size; and
//! what a device log keeps inside its window is bounded too ([`LogLimits`]: past 2^18
//! rows, a series of first/last/lowest/highest readings per time bucket).
//! Beyond [`crate::units`] (sizes read by one rule, [`crate::units::scaled_bytes`]), only
//! [`convert`] imports other modules of the crate (the model), to turn a profiler trace
//! into a [`Snapshot`](crate::model::Snapshot). Nothing here analyses or resamples; the converter
//! pairs frees with allocations only where a trace has no addresses.
//!
//! - [`oom_log`]: the CUDA out-of-memory messages of a training log, both forms.
//! - [`nvsmi`]: `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` and
//!   `--query-compute-apps=...` logs (spec 8.3).
//! - [`nvml`]: the NVML JSON-lines file `scripts/vramlens_capture.py` writes (`nvml.jsonl`).
//! - [`clock`]: local and zoned timestamps, and the whole-hour shifts that reveal a
//!   time-zone slip.
//! - [`kineto`]: `[memory]` instant events of a Kineto / Chrome trace (spec 8.2) from
//!   `torch.profiler` with `profile_memory=True`, with the operator and Python-function
//!   spans that enclose them.
//! - [`memory_timeline`]: `export_memory_timeline` output (spec 8.1): raw rows, category
//!   totals, and the HTML form (a picture, named as such).
//! - [`convert`]: a profiler trace as a snapshot, for every command.
//!
//! Nothing here panics on any input: every problem is a [`DevlogError`] naming the line (text
//! formats) or the JSON path (traces), or a counted warning for the tolerated ones (a
//! truncated last line, a process row without a pid).

pub mod clock;
pub mod convert;
mod json;
pub mod kineto;
pub mod memory_timeline;
pub mod nvml;
pub mod nvsmi;
pub mod oom_log;
pub mod profile;

pub use clock::{ClockOptions, TimeRange};
pub use kineto::read_profile;
pub use profile::{MemoryEvent, ProfileKind, ProfileTrace, TraceClock};

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{BufRead, Read};

pub use convert::{Converted, to_snapshot};

pub(crate) const MIB: u64 = 1 << 20;

/// One reading of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuSample {
    /// Unix time in microseconds (UTC).
    pub time_us: i64,
    /// The GPU's number in the log: nvidia-smi's `index` (or a hand-written `gpu` column,
    /// or NVML's index); for logs that name no index, its order in the log (see
    /// [`DeviceLog::numbering`]).
    pub gpu: i64,
    /// Index into [`DeviceLog::uuids`].
    pub uuid: Option<u32>,
    pub used_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
}

/// One process's memory on one GPU at one time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProcessSample {
    /// Unix time in microseconds (UTC).
    pub time_us: i64,
    /// GPU number when the log says it (or [`merge`] could tell it from the uuid).
    pub gpu: Option<i64>,
    /// Index into [`DeviceLog::uuids`].
    pub gpu_uuid: Option<u32>,
    pub pid: u64,
    pub used_bytes: Option<u64>,
}

/// How a log numbers its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuNumbering {
    /// The driver's index (nvidia-smi's `index`, a hand-written `gpu` column, NVML's index).
    DriverIndex,
    /// No index column: GPUs told apart by uuid, numbered in order of first appearance.
    UuidOrder,
    /// No index and no uuid: rows sharing a timestamp are the GPUs of one reading,
    /// numbered by their place in it; a log without such groups is one GPU, number 0.
    RowOrder,
}

/// What one GPU of a log covers, over every row read (kept or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuSpan {
    pub gpu: i64,
    pub rows: u64,
    pub range: TimeRange,
}

/// A device-level log: readings sorted by (time_us, gpu), processes sorted by (time_us, pid),
/// ties in file order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceLog {
    /// `"nvidia-smi"` or `"nvml"`; after [`merge`] also `"mixed"` (sources differ) or
    /// `"none"` (nothing merged).
    pub source: &'static str,
    pub numbering: GpuNumbering,
    /// Distinct GPU uuids, in order of first appearance.
    pub uuids: Vec<String>,
    pub gpus: Vec<GpuSample>,
    pub processes: Vec<ProcessSample>,
    /// Every GPU's rows and time range in the whole file, including rows outside
    /// [`DeviceLogOptions::keep`]; sorted by GPU.
    pub spans: Vec<GpuSpan>,
    /// Rows (GPU and process) left out because they fall outside [`DeviceLogOptions::keep`].
    pub rows_outside_window: u64,
    /// Rows inside the window that were folded into the bounded series and not kept one
    /// by one (0 unless the log had more than [`LogLimits::max_kept_rows`] of them; see
    /// [`LogLimits`]).
    pub rows_folded: u64,
    /// Some timestamps had no zone (nvidia-smi prints local time): the clock offset was
    /// applied to them.
    pub zoneless_times: bool,
    /// One line per kind of tolerated problem, with its count and first line.
    pub warnings: Vec<String>,
    /// Per GPU, what every reading inside the window adds up to (kept or folded): exact
    /// whatever the log's size. Sorted by GPU.
    #[serde(skip)]
    pub gpu_stats: Vec<GpuStats>,
    /// Per process and GPU, the same; sorted by (GPU, uuid, pid). At most
    /// [`MAX_PROCESS_STATS`] of them, the first met; the rows of later ones are counted in
    /// [`DeviceLog::process_rows_unsummarized`].
    #[serde(skip)]
    pub process_stats: Vec<ProcessStats>,
    #[serde(skip)]
    pub process_rows_unsummarized: u64,
}

/// Processes a log sums up one by one ([`DeviceLog::process_stats`]).
pub const MAX_PROCESS_STATS: usize = 4096;

/// Used memory over many readings: how many, their sum, the highest and lowest (the
/// earliest reading on a tie), the first and last time and the latest value (the later row
/// on a tie).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsedStats {
    pub readings: u64,
    pub sum_bytes: u128,
    pub peak_bytes: u64,
    pub peak_us: i64,
    pub low_bytes: u64,
    pub low_us: i64,
    pub first_us: i64,
    pub last_us: i64,
    pub last_bytes: u64,
}

impl UsedStats {
    fn of(time_us: i64, used: u64) -> UsedStats {
        UsedStats {
            readings: 1,
            sum_bytes: u128::from(used),
            peak_bytes: used,
            peak_us: time_us,
            low_bytes: used,
            low_us: time_us,
            first_us: time_us,
            last_us: time_us,
            last_bytes: used,
        }
    }

    fn add(&mut self, o: UsedStats) {
        self.readings += o.readings;
        self.sum_bytes += o.sum_bytes;
        if (o.peak_bytes, std::cmp::Reverse(o.peak_us))
            > (self.peak_bytes, std::cmp::Reverse(self.peak_us))
        {
            (self.peak_bytes, self.peak_us) = (o.peak_bytes, o.peak_us);
        }
        if (o.low_bytes, o.low_us) < (self.low_bytes, self.low_us) {
            (self.low_bytes, self.low_us) = (o.low_bytes, o.low_us);
        }
        self.first_us = self.first_us.min(o.first_us);
        if o.last_us >= self.last_us {
            (self.last_us, self.last_bytes) = (o.last_us, o.last_bytes);
        }
    }

    fn merge(into: &mut Option<UsedStats>, o: Option<UsedStats>) {
        match (into.as_mut(), o) {
            (Some(a), Some(b)) => a.add(b),
            (None, b) => *into = b,
            (Some(_), None) => {}
        }
    }

    /// The mean of the readings, rounded down.
    pub fn mean_bytes(&self) -> u64 {
        (self.sum_bytes / u128::from(self.readings.max(1))) as u64
    }
}

/// One GPU's readings inside the window, summed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuStats {
    pub gpu: i64,
    /// The first uuid its readings name (index into [`DeviceLog::uuids`]).
    pub uuid: Option<u32>,
    pub rows: u64,
    /// Over the readings with a used figure.
    pub used: Option<UsedStats>,
    /// The largest total its readings give.
    pub total_bytes: Option<u64>,
}

impl GpuStats {
    fn add(&mut self, o: &GpuStats) {
        self.uuid = self.uuid.or(o.uuid);
        self.rows += o.rows;
        UsedStats::merge(&mut self.used, o.used);
        self.total_bytes = self.total_bytes.max(o.total_bytes);
    }
}

/// One process's rows on one GPU inside the window, summed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStats {
    /// The GPU's number, when the rows say it (or [`merge`] could tell it from the uuid).
    pub gpu: Option<i64>,
    pub gpu_uuid: Option<u32>,
    pub pid: u64,
    pub rows: u64,
    pub used: Option<UsedStats>,
}

/// Sums readings into per-GPU and per-process statistics.
#[derive(Default)]
struct StatsBuilder {
    gpus: BTreeMap<i64, GpuStats>,
    processes: BTreeMap<(Option<i64>, Option<u32>, u64), ProcessStats>,
    process_rows_unsummarized: u64,
}

impl StatsBuilder {
    fn push_gpu(&mut self, s: &GpuSample) {
        self.add_gpu(GpuStats {
            gpu: s.gpu,
            uuid: s.uuid,
            rows: 1,
            used: s.used_bytes.map(|u| UsedStats::of(s.time_us, u)),
            total_bytes: s.total_bytes,
        });
    }

    fn add_gpu(&mut self, g: GpuStats) {
        match self.gpus.get_mut(&g.gpu) {
            Some(e) => e.add(&g),
            None => {
                self.gpus.insert(g.gpu, g);
            }
        }
    }

    fn push_process(&mut self, p: &ProcessSample) {
        self.add_process(ProcessStats {
            gpu: p.gpu,
            gpu_uuid: p.gpu_uuid,
            pid: p.pid,
            rows: 1,
            used: p.used_bytes.map(|u| UsedStats::of(p.time_us, u)),
        });
    }

    /// A read log's statistics added in, its uuid indices mapped by `remap`.
    fn add_log(
        &mut self,
        gpus: &[GpuStats],
        processes: &[ProcessStats],
        remap: &dyn Fn(Option<u32>) -> Option<u32>,
    ) {
        for g in gpus {
            self.add_gpu(GpuStats {
                uuid: remap(g.uuid),
                ..*g
            });
        }
        for p in processes {
            let p = ProcessStats {
                gpu_uuid: remap(p.gpu_uuid),
                ..*p
            };
            self.add_process(p);
        }
    }

    fn add_process(&mut self, p: ProcessStats) {
        let key = (p.gpu, p.gpu_uuid, p.pid);
        let room = self.processes.len() < MAX_PROCESS_STATS;
        match self.processes.get_mut(&key) {
            Some(e) => {
                e.rows += p.rows;
                UsedStats::merge(&mut e.used, p.used);
            }
            None if room => {
                self.processes.insert(key, p);
            }
            None => self.process_rows_unsummarized += p.rows,
        }
    }

    /// Processes without a GPU number get the number of the GPU whose uuid they name.
    fn number_processes(&mut self, number_of: &BTreeMap<u32, i64>) {
        let unnumbered: Vec<_> = self
            .processes
            .iter()
            .filter(|(_, p)| {
                p.gpu.is_none() && p.gpu_uuid.is_some_and(|u| number_of.contains_key(&u))
            })
            .map(|(k, _)| *k)
            .collect();
        for key in unnumbered {
            if let Some(mut p) = self.processes.remove(&key) {
                p.gpu = p.gpu_uuid.and_then(|u| number_of.get(&u)).copied();
                self.add_process(p);
            }
        }
    }

    /// Every GPU's statistics as one GPU's, number 0.
    fn collapse_to_one_gpu(&mut self) {
        let mut all: Option<GpuStats> = None;
        for g in self.gpus.values() {
            match all.as_mut() {
                Some(a) => a.add(g),
                None => all = Some(GpuStats { gpu: 0, ..*g }),
            }
        }
        self.gpus = all.map(|a| (0, a)).into_iter().collect();
    }

    fn finish(self) -> (Vec<GpuStats>, Vec<ProcessStats>, u64) {
        (
            self.gpus.into_values().collect(),
            self.processes.into_values().collect(),
            self.process_rows_unsummarized,
        )
    }
}

impl DeviceLog {
    /// The uuid of a sample, by its index.
    pub fn uuid(&self, index: Option<u32>) -> Option<&str> {
        index
            .and_then(|i| self.uuids.get(i as usize))
            .map(String::as_str)
    }

    /// The GPU numbers the log has readings of, ascending.
    pub fn gpu_numbers(&self) -> Vec<i64> {
        self.spans.iter().map(|s| s.gpu).collect()
    }

    /// The whole file's time range for one GPU.
    pub fn span_of(&self, gpu: i64) -> Option<GpuSpan> {
        self.spans.iter().find(|s| s.gpu == gpu).copied()
    }
}

/// How to read a device log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceLogOptions {
    pub clock: ClockOptions,
    /// Keep only rows inside this range (after the clock offset); rows outside are counted
    /// in [`DeviceLog::rows_outside_window`] and their times in [`DeviceLog::spans`].
    /// Default: keep every row.
    pub keep: Option<TimeRange>,
    /// How many rows inside `keep` are kept one by one before they are folded into a
    /// bounded series. Default: [`LogLimits::default`].
    pub limits: LogLimits,
}

/// Bounds on what a log keeps of the rows inside [`DeviceLogOptions::keep`], so memory
/// follows these numbers and not the file's size (a 2 GiB CSV sampled every millisecond).
///
/// Up to `max_kept_rows` rows (GPU and process rows together) every row is kept, exactly
/// as read. Past that, every row read so far and every later one folds into buckets: the
/// window is cut into `series_buckets` equal buckets, and each focus range (the
/// neighbourhoods of the moments a report reads, see [`read_device_log_near`]) into
/// `focus_buckets` more (all focus ranges together at most [`MAX_FOCUS_BUCKETS`], each at
/// least 16). Per GPU and bucket the log keeps four readings: the first, the last, the
/// lowest and the highest `used` (ties: the earlier row); per GPU (number or uuid) and
/// bucket, the process rows of the latest sampling instant and of the instants of those
/// kept readings (so an NVML reading keeps the process rows taken with it), at most
/// [`MAX_PROCESSES_PER_INSTANT`] an instant. Peaks and troughs of device use survive exactly;
/// readings between them are thinned. Without `keep` nothing is folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// Default: 262,144 (2^18) rows, about 19 MB of samples.
    pub max_kept_rows: usize,
    /// Default: 4096 buckets over the whole window.
    pub series_buckets: usize,
    /// Default: 4096 buckets over each focus range.
    pub focus_buckets: usize,
}

impl Default for LogLimits {
    fn default() -> LogLimits {
        LogLimits {
            max_kept_rows: 1 << 18,
            series_buckets: 4096,
            focus_buckets: 4096,
        }
    }
}

/// All focus ranges of a log together are cut into at most this many buckets.
pub const MAX_FOCUS_BUCKETS: usize = 1 << 16;
/// Process rows a folded bucket keeps of one sampling instant of one GPU.
pub const MAX_PROCESSES_PER_INSTANT: usize = 256;

/// Why a log or trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DevlogError {
    /// Nothing but white space.
    #[error("empty input: expected {expected}")]
    Empty { expected: &'static str },
    /// A text line (1-based) that does not read; the message says what was expected and found.
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    /// A place in a JSON trace, such as `traceEvents[12].args.Bytes`.
    #[error("{path}: {message}")]
    Json { path: String, message: String },
    /// The gzip stream is damaged.
    #[error("gzip: {message}")]
    Gzip { message: String },
    /// The file could not be read.
    #[error("{message}")]
    Io { message: String },
    /// A file vramlens knows, but of another kind.
    #[error("{message}")]
    WrongKind { message: String },
}

/// Counted warnings, one line per kind, in order of first appearance.
#[derive(Default)]
pub(crate) struct Warnings {
    kinds: Vec<(String, usize, usize)>,
}

impl Warnings {
    pub(crate) fn add(&mut self, kind: &str, line: usize) {
        match self.kinds.iter_mut().find(|(k, _, _)| k == kind) {
            Some(entry) => entry.1 += 1,
            None => self.kinds.push((kind.to_string(), 1, line)),
        }
    }

    pub(crate) fn finish(self) -> Vec<String> {
        self.kinds
            .into_iter()
            .map(|(kind, count, line)| {
                if count == 1 {
                    format!("{kind} (line {line})")
                } else {
                    format!("{kind}: {count} times, first at line {line}")
                }
            })
            .collect()
    }
}

pub(crate) fn line_error(line: usize, message: impl Into<String>) -> DevlogError {
    DevlogError::Line {
        line,
        message: message.into(),
    }
}

/// `bytes` read from a device log's `key` on `line` (as `found`), refused when it is more
/// than any device holds ([`crate::units::MAX_DEVICE_BYTES`]): the log is damaged or edited,
/// and sums of such values would leave `u64`.
pub(crate) fn device_bytes(
    bytes: u64,
    key: &str,
    line: usize,
    found: &str,
) -> Result<u64, DevlogError> {
    if bytes > crate::units::MAX_DEVICE_BYTES {
        return Err(line_error(
            line,
            format!(
                "{key}: {} is more than any device holds (at most 1 PiB, 2^50 bytes)",
                quote(found)
            ),
        ));
    }
    Ok(bytes)
}

/// Text for a found value in messages: quoted, and cut when long.
pub(crate) fn quote(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() > MAX {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut:?}...")
    } else {
        format!("{s:?}")
    }
}

fn io_message(e: &std::io::Error) -> String {
    let s = e.to_string();
    if e.kind() == std::io::ErrorKind::InvalidInput || s.contains("invalid gzip header") {
        format!("gzip: {s}")
    } else {
        s
    }
}

/// Longest line a device log may have; rows are well under 1 KiB.
const MAX_LINE_BYTES: u64 = 1 << 20;

/// Lines of a stream, one at a time, numbered from 1; invalid UTF-8 is replaced.
pub(crate) struct Lines<R> {
    inner: R,
    buf: Vec<u8>,
    text: String,
    line: usize,
}

impl<R: BufRead> Lines<R> {
    pub(crate) fn new(inner: R) -> Lines<R> {
        Lines {
            inner,
            buf: Vec::new(),
            text: String::new(),
            line: 0,
        }
    }

    /// The next line without its end (`\n` or `\r\n`), or None at the end.
    pub(crate) fn next_line(&mut self) -> Result<Option<(usize, &str)>, DevlogError> {
        self.buf.clear();
        let n = (&mut self.inner)
            .take(MAX_LINE_BYTES + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| DevlogError::Io {
                message: io_message(&e),
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        if self.buf.len() as u64 > MAX_LINE_BYTES {
            return Err(line_error(
                self.line,
                format!(
                    "expected a line of a device log, found a line longer than {} MiB",
                    MAX_LINE_BYTES >> 20
                ),
            ));
        }
        if self.line == 1 && self.buf.starts_with(b"\xef\xbb\xbf") {
            self.buf.drain(..3);
        }
        while matches!(self.buf.last(), Some(b'\n' | b'\r')) {
            self.buf.pop();
        }
        self.text.clear();
        self.text.push_str(&String::from_utf8_lossy(&self.buf));
        Ok(Some((self.line, &self.text)))
    }

    /// Whether nothing but blank lines is left (reads to the end).
    pub(crate) fn rest_is_blank(&mut self) -> Result<bool, DevlogError> {
        while let Some((_, l)) = self.next_line()? {
            if !l.trim().is_empty() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

// ---------------------------------------------------------------------------------------
// Device logs
// ---------------------------------------------------------------------------------------

pub(crate) const DEVICE_LOG_KIND: &str = "an nvidia-smi CSV or NVML JSON lines";

/// Interns uuids and tracks per-GPU spans while a log is read.
#[derive(Default)]
pub(crate) struct LogBuilder {
    pub(crate) uuids: Vec<String>,
    uuid_ids: BTreeMap<String, u32>,
    spans: BTreeMap<i64, (u64, TimeRange)>,
    pub(crate) gpus: Vec<GpuSample>,
    pub(crate) processes: Vec<ProcessSample>,
    pub(crate) rows_outside_window: u64,
    pub(crate) zoneless_times: bool,
    keep: Option<TimeRange>,
    limits: LogLimits,
    focus: Vec<TimeRange>,
    /// The bounded series, once more than `limits.max_kept_rows` rows were kept.
    fold: Option<Fold>,
    /// Rows that went into `fold`.
    rows_into_fold: u64,
    rows_folded: u64,
    stats: StatsBuilder,
}

/// A row in a folded bucket, with its place in the file (for ties and file order).
#[derive(Clone, Copy)]
struct Kept<T> {
    seq: u64,
    row: T,
}

/// The four readings one GPU's bucket keeps.
struct GpuBucket {
    first: Kept<GpuSample>,
    last: Kept<GpuSample>,
    min: Option<Kept<GpuSample>>,
    max: Option<Kept<GpuSample>>,
}

/// The process rows of one GPU's bucket: of its latest sampling instant, and of the
/// instants of the GPU readings the bucket keeps.
struct ProcessBucket {
    time_us: i64,
    rows: Vec<Kept<ProcessSample>>,
}

/// The bounded series: buckets by start time, rows kept per (GPU, bucket).
struct Fold {
    /// Sorted, distinct bucket starts; the first is the window's start.
    edges: Vec<i64>,
    gpus: BTreeMap<(i64, usize), GpuBucket>,
    /// Keyed by the row's GPU number and uuid index, and bucket.
    processes: BTreeMap<(Option<i64>, Option<u32>, usize), ProcessBucket>,
    /// The focus ranges' midpoints (the moments), sorted, distinct.
    moments: Vec<i64>,
    /// Per GPU and moment k: the latest reading in `[moments[k-1], moments[k])`
    /// (`false`) and the earliest in `[moments[k], moments[k+1])` (`true`). Together
    /// they hold, for every moment, the last reading before it and the first at or after
    /// it: the reading nearest it is kept exactly.
    near: BTreeMap<(i64, usize, bool), Kept<GpuSample>>,
    /// The process rows of those readings' instants, by GPU number, moment and side.
    near_processes: BTreeMap<(i64, usize, bool), Vec<Kept<ProcessSample>>>,
    seq: u64,
}

/// `n` bucket starts cutting `r` into equal parts (integer arithmetic, no overflow).
fn cut(r: TimeRange, n: usize) -> impl Iterator<Item = i64> {
    let width = r.last_us as i128 - r.first_us as i128 + 1;
    let n = n.max(1) as i128;
    (0..n).map(move |k| (r.first_us as i128 + width * k / n) as i64)
}

impl Fold {
    fn new(keep: TimeRange, focus: &[TimeRange], limits: LogLimits) -> Fold {
        let mut edges: Vec<i64> = cut(keep, limits.series_buckets).collect();
        // Focus ranges inside the window, overlapping ones merged.
        let mut ranges: Vec<TimeRange> = focus
            .iter()
            .filter(|r| r.overlaps(keep))
            .map(|r| TimeRange::new(r.first_us.max(keep.first_us), r.last_us.min(keep.last_us)))
            .collect();
        ranges.sort_by_key(|r| (r.first_us, r.last_us));
        let mut merged: Vec<TimeRange> = Vec::new();
        for r in ranges {
            match merged.last_mut() {
                Some(m) if m.last_us >= r.first_us => *m = m.union(r),
                _ => merged.push(r),
            }
        }
        let per_range =
            (MAX_FOCUS_BUCKETS / merged.len().max(1)).clamp(16, limits.focus_buckets.max(16));
        for r in &merged {
            edges.extend(cut(*r, per_range));
        }
        edges.sort_unstable();
        edges.dedup();
        let mut moments: Vec<i64> = focus
            .iter()
            .map(|r| ((r.first_us as i128 + r.last_us as i128) / 2) as i64)
            .collect();
        moments.sort_unstable();
        moments.dedup();
        Fold {
            edges,
            gpus: BTreeMap::new(),
            processes: BTreeMap::new(),
            moments,
            near: BTreeMap::new(),
            near_processes: BTreeMap::new(),
            seq: 0,
        }
    }

    /// The moment slots a time falls in: (k, false) for the first moment after it,
    /// (k, true) for the last moment at or before it.
    fn slots(&self, time_us: i64) -> impl Iterator<Item = (usize, bool)> {
        let j = self.moments.partition_point(|&m| m <= time_us);
        let before = (j < self.moments.len()).then_some((j, false));
        let after = j.checked_sub(1).map(|k| (k, true));
        before.into_iter().chain(after)
    }

    fn bucket(&self, time_us: i64) -> usize {
        self.edges
            .partition_point(|&e| e <= time_us)
            .saturating_sub(1)
    }

    fn push_gpu(&mut self, s: GpuSample) {
        let k = Kept {
            seq: self.seq,
            row: s,
        };
        self.seq += 1;
        for (m, after) in self.slots(s.time_us).collect::<Vec<_>>() {
            let slot = self.near.entry((s.gpu, m, after)).or_insert(k);
            // Before a moment the latest reading (ties: the later row), after it the
            // earliest (ties: the earlier row), as the report's nearest reading is found.
            let closer = if after {
                s.time_us < slot.row.time_us
            } else {
                s.time_us >= slot.row.time_us
            };
            if closer {
                *slot = k;
            }
        }
        let b = self.bucket(s.time_us);
        let used = |k: &Kept<GpuSample>| k.row.used_bytes;
        match self.gpus.get_mut(&(s.gpu, b)) {
            None => {
                let with_used = s.used_bytes.map(|_| k);
                self.gpus.insert(
                    (s.gpu, b),
                    GpuBucket {
                        first: k,
                        last: k,
                        min: with_used,
                        max: with_used,
                    },
                );
            }
            Some(g) => {
                if s.time_us < g.first.row.time_us {
                    g.first = k;
                }
                if s.time_us >= g.last.row.time_us {
                    g.last = k;
                }
                if let Some(u) = s.used_bytes {
                    if g.min.as_ref().and_then(used).is_none_or(|m| u < m) {
                        g.min = Some(k);
                    }
                    if g.max.as_ref().and_then(used).is_none_or(|m| u > m) {
                        g.max = Some(k);
                    }
                }
            }
        }
    }

    fn push_process(&mut self, p: ProcessSample) {
        let k = Kept {
            seq: self.seq,
            row: p,
        };
        self.seq += 1;
        if let Some(gpu) = p.gpu {
            for (m, after) in self.slots(p.time_us).collect::<Vec<_>>() {
                if self
                    .near
                    .get(&(gpu, m, after))
                    .is_some_and(|g| g.row.time_us == p.time_us)
                {
                    let rows = self.near_processes.entry((gpu, m, after)).or_default();
                    rows.retain(|r| r.row.time_us == p.time_us);
                    if rows.len() < MAX_PROCESSES_PER_INSTANT {
                        rows.push(k);
                    }
                }
            }
        }
        let b = self.bucket(p.time_us);
        // The instants of the GPU readings the bucket keeps: their process rows split
        // those readings (NVML samples take both at one instant; a row of another instant
        // would mix two moments).
        let wanted: [Option<i64>; 4] = match p.gpu.and_then(|g| self.gpus.get(&(g, b))) {
            Some(g) => [
                Some(g.first.row.time_us),
                Some(g.last.row.time_us),
                g.min.map(|k| k.row.time_us),
                g.max.map(|k| k.row.time_us),
            ],
            None => [None; 4],
        };
        let entry = self
            .processes
            .entry((p.gpu, p.gpu_uuid, b))
            .or_insert(ProcessBucket {
                time_us: p.time_us,
                rows: Vec::new(),
            });
        entry.time_us = entry.time_us.max(p.time_us);
        let latest = entry.time_us;
        let keep_at = |t: i64| t == latest || wanted.contains(&Some(t));
        if keep_at(p.time_us)
            && entry
                .rows
                .iter()
                .filter(|r| r.row.time_us == p.time_us)
                .count()
                < MAX_PROCESSES_PER_INSTANT
        {
            entry.rows.push(k);
        }
        entry.rows.retain(|r| keep_at(r.row.time_us));
    }

    /// The kept rows, in file order.
    fn rows(self) -> (Vec<GpuSample>, Vec<ProcessSample>) {
        let mut gpus: Vec<Kept<GpuSample>> = self
            .gpus
            .into_values()
            .flat_map(|g| [Some(g.first), Some(g.last), g.min, g.max])
            .flatten()
            .chain(self.near.values().copied())
            .collect();
        gpus.sort_by_key(|k| k.seq);
        gpus.dedup_by_key(|k| k.seq);
        let near = &self.near;
        let mut processes: Vec<Kept<ProcessSample>> = self
            .processes
            .into_values()
            .flat_map(|p| p.rows)
            .chain(self.near_processes.into_iter().flat_map(|(key, rows)| {
                // Only the rows of the reading the slot kept in the end.
                let at = near.get(&key).map(|g| g.row.time_us);
                rows.into_iter().filter(move |r| Some(r.row.time_us) == at)
            }))
            .collect();
        processes.sort_by_key(|k| k.seq);
        processes.dedup_by_key(|k| k.seq);
        (
            gpus.into_iter().map(|k| k.row).collect(),
            processes.into_iter().map(|k| k.row).collect(),
        )
    }
}

impl LogBuilder {
    pub(crate) fn new(options: DeviceLogOptions, focus: &[TimeRange]) -> LogBuilder {
        LogBuilder {
            keep: options.keep,
            limits: options.limits,
            focus: focus.to_vec(),
            ..Default::default()
        }
    }

    pub(crate) fn uuid(&mut self, uuid: &str) -> u32 {
        if let Some(&id) = self.uuid_ids.get(uuid) {
            return id;
        }
        let id = self.uuids.len() as u32;
        self.uuids.push(uuid.to_string());
        self.uuid_ids.insert(uuid.to_string(), id);
        id
    }

    fn kept(&mut self, time_us: i64) -> bool {
        let keep = self.keep.is_none_or(|k| k.contains(time_us));
        if !keep {
            self.rows_outside_window += 1;
        }
        keep
    }

    /// The bounded series, started (with every row kept so far) once the rows kept one
    /// by one reach the limit; None while they are under it, or without a window.
    fn fold(&mut self) -> Option<&mut Fold> {
        if self.fold.is_none() {
            let keep = self.keep?;
            if self.gpus.len() + self.processes.len() < self.limits.max_kept_rows {
                return None;
            }
            // The rows kept so far go in first, in file order, so ties resolve as when kept.
            let mut fold = Fold::new(keep, &self.focus, self.limits);
            let (gpus, processes) = (
                std::mem::take(&mut self.gpus),
                std::mem::take(&mut self.processes),
            );
            self.rows_into_fold += (gpus.len() + processes.len()) as u64;
            for s in gpus {
                fold.push_gpu(s);
            }
            for p in processes {
                fold.push_process(p);
            }
            self.fold = Some(fold);
        }
        self.fold.as_mut()
    }

    /// Moves the kept rows of the bounded series into `gpus` and `processes`.
    fn unfold(&mut self) {
        if let Some(fold) = self.fold.take() {
            let (gpus, processes) = fold.rows();
            self.rows_folded += self.rows_into_fold - (gpus.len() + processes.len()) as u64;
            self.rows_into_fold = 0;
            self.gpus = gpus;
            self.processes = processes;
        }
    }

    pub(crate) fn push_gpu(&mut self, s: GpuSample) {
        let entry = self
            .spans
            .entry(s.gpu)
            .or_insert((0, TimeRange::new(s.time_us, s.time_us)));
        entry.0 += 1;
        entry.1 = entry.1.union(TimeRange::new(s.time_us, s.time_us));
        if self.kept(s.time_us) {
            self.stats.push_gpu(&s);
            match self.fold() {
                Some(fold) => {
                    fold.push_gpu(s);
                    self.rows_into_fold += 1;
                }
                None => self.gpus.push(s),
            }
        }
    }

    /// Makes every reading one GPU's, number 0 (a log whose repeated stamps were a coarse
    /// clock, not several GPUs).
    pub(crate) fn collapse_to_one_gpu(&mut self) {
        self.unfold();
        for s in &mut self.gpus {
            s.gpu = 0;
        }
        let merged = self
            .spans
            .values()
            .fold(None, |acc: Option<(u64, TimeRange)>, &(n, r)| {
                Some(match acc {
                    None => (n, r),
                    Some((m, q)) => (m + n, q.union(r)),
                })
            });
        self.spans = merged.map(|m| (0, m)).into_iter().collect();
        self.stats.collapse_to_one_gpu();
    }

    pub(crate) fn push_process(&mut self, p: ProcessSample) {
        if self.kept(p.time_us) {
            self.stats.push_process(&p);
            match self.fold() {
                Some(fold) => {
                    fold.push_process(p);
                    self.rows_into_fold += 1;
                }
                None => self.processes.push(p),
            }
        }
    }

    pub(crate) fn finish(
        mut self,
        source: &'static str,
        numbering: GpuNumbering,
        warnings: Warnings,
    ) -> DeviceLog {
        self.unfold();
        self.gpus.sort_by_key(|s| (s.time_us, s.gpu));
        self.processes.sort_by_key(|p| (p.time_us, p.pid));
        let (gpu_stats, process_stats, process_rows_unsummarized) = self.stats.finish();
        DeviceLog {
            source,
            numbering,
            uuids: self.uuids,
            gpus: self.gpus,
            processes: self.processes,
            spans: self
                .spans
                .into_iter()
                .map(|(gpu, (rows, range))| GpuSpan { gpu, rows, range })
                .collect(),
            rows_outside_window: self.rows_outside_window,
            rows_folded: self.rows_folded,
            zoneless_times: self.zoneless_times,
            warnings: warnings.finish(),
            gpu_stats,
            process_stats,
            process_rows_unsummarized,
        }
    }
}

/// Reads an nvidia-smi CSV or an NVML JSON-lines file, told apart by content, line by line.
///
/// CSV: the `--query-gpu` form gives [`GpuSample`]s, the `--query-compute-apps` form (it has
/// a `pid` column) gives [`ProcessSample`]s. With or without header, with or without units in
/// values and header. Timestamps are `YYYY/MM/DD HH:MM:SS.mmm` in local time (the clock
/// option turns it into UTC) or ISO 8601, with or without a zone. A header line may repeat
/// (appended logs); a line `No running processes found` is skipped; a truncated last line is
/// skipped with a warning. See [`nvsmi`] for the header-less layouts and GPU numbering.
///
/// JSON lines: one object a line with `time_us` (Unix µs), `gpu`, `uuid`, `total_bytes`,
/// `used_bytes`, `free_bytes` and `processes` (`[{pid, used_bytes}]` or null).
pub fn read_device_log<R: BufRead>(
    reader: R,
    options: DeviceLogOptions,
) -> Result<DeviceLog, DevlogError> {
    read_device_log_near(reader, options, &[])
}

/// [`read_device_log`], with `focus`: the time ranges a report reads closely (the
/// neighbourhoods of its moments, each range centred on its moment), given finer buckets
/// when the log is folded (see [`LogLimits`]); and per GPU, the last reading before each
/// moment and the first at or after it are kept exactly, with their instants' process
/// rows, so the reading nearest a moment is the one a whole log gives. For a log under
/// the limits `focus` changes nothing.
pub fn read_device_log_near<R: BufRead>(
    reader: R,
    options: DeviceLogOptions,
    focus: &[TimeRange],
) -> Result<DeviceLog, DevlogError> {
    let mut lines = Lines::new(reader);
    // The first line with content decides the format.
    let first = loop {
        match lines.next_line()? {
            None => {
                return Err(DevlogError::Empty {
                    expected: DEVICE_LOG_KIND,
                });
            }
            Some((n, l)) if !l.trim().is_empty() => break (n, l.to_string()),
            Some(_) => {}
        }
    };
    let trimmed = first.1.trim_start();
    if trimmed.starts_with('[')
        || (trimmed.starts_with('{')
            && (trimmed.contains("\"traceEvents\"")
                || trimmed.contains("\"schemaVersion\"")
                || trimmed.trim_end() == "{"))
    {
        return Err(DevlogError::WrongKind {
            message: format!(
                "this is a JSON document (a Kineto/Chrome trace or memory timeline?), not {DEVICE_LOG_KIND}; read it as a profiler trace (reconcile --trace)"
            ),
        });
    }
    if trimmed.starts_with('{') {
        nvml::read(first, lines, LogBuilder::new(options, focus))
    } else {
        nvsmi::read(first, lines, options, LogBuilder::new(options, focus))
    }
}

/// Several logs (for example the gpu and apps CSVs of one run) merged into one.
///
/// Samples are concatenated and sorted again (ties keep the order of `logs`); a process
/// sample without a GPU number gets the number of the GPU whose uuid it names, when a GPU
/// sample gives one. Warnings are kept once each. The numbering is that of the first log
/// with GPU readings.
pub fn merge(logs: Vec<DeviceLog>) -> DeviceLog {
    let mut source: Option<&'static str> = None;
    let mut numbering: Option<GpuNumbering> = None;
    let mut uuids: Vec<String> = Vec::new();
    let mut gpus = Vec::new();
    let mut processes = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    let mut spans: BTreeMap<i64, (u64, TimeRange)> = BTreeMap::new();
    let mut rows_outside_window = 0;
    let mut rows_folded = 0;
    let mut zoneless_times = false;
    let mut stats = StatsBuilder::default();
    for log in logs {
        source = match source {
            None => Some(log.source),
            Some(s) if s == log.source => Some(s),
            Some(_) => Some("mixed"),
        };
        if numbering.is_none() && !log.spans.is_empty() {
            numbering = Some(log.numbering);
        }
        // Uuid indices of this log in the merged table.
        let map: Vec<u32> = log
            .uuids
            .iter()
            .map(|u| match uuids.iter().position(|x| x == u) {
                Some(p) => p as u32,
                None => {
                    uuids.push(u.clone());
                    (uuids.len() - 1) as u32
                }
            })
            .collect();
        let remap = |i: Option<u32>| i.and_then(|i| map.get(i as usize).copied());
        gpus.extend(log.gpus.into_iter().map(|mut s| {
            s.uuid = remap(s.uuid);
            s
        }));
        processes.extend(log.processes.into_iter().map(|mut p| {
            p.gpu_uuid = remap(p.gpu_uuid);
            p
        }));
        for s in log.spans {
            let e = spans.entry(s.gpu).or_insert((0, s.range));
            e.0 += s.rows;
            e.1 = e.1.union(s.range);
        }
        rows_outside_window += log.rows_outside_window;
        rows_folded += log.rows_folded;
        zoneless_times |= log.zoneless_times;
        stats.add_log(&log.gpu_stats, &log.process_stats, &remap);
        stats.process_rows_unsummarized += log.process_rows_unsummarized;
        for w in log.warnings {
            if !warnings.contains(&w) {
                warnings.push(w);
            }
        }
    }
    gpus.sort_by_key(|s| (s.time_us, s.gpu));
    processes.sort_by_key(|p| (p.time_us, p.pid));
    // uuid -> GPU number; the first sample (in sorted order) naming a uuid decides.
    let mut number_of: BTreeMap<u32, i64> = BTreeMap::new();
    for s in &gpus {
        if let Some(uuid) = s.uuid
            && s.gpu >= 0
        {
            number_of.entry(uuid).or_insert(s.gpu);
        }
    }
    for p in &mut processes {
        if p.gpu.is_none() {
            p.gpu = p.gpu_uuid.and_then(|u| number_of.get(&u)).copied();
        }
    }
    // The same for the statistics, from the GPUs' first uuids.
    let mut number_of_stats: BTreeMap<u32, i64> = BTreeMap::new();
    for g in stats.gpus.values() {
        if let Some(uuid) = g.uuid {
            number_of_stats.entry(uuid).or_insert(g.gpu);
        }
    }
    stats.number_processes(&number_of_stats);
    let (gpu_stats, process_stats, process_rows_unsummarized) = stats.finish();
    DeviceLog {
        source: source.unwrap_or("none"),
        numbering: numbering.unwrap_or(GpuNumbering::DriverIndex),
        uuids,
        gpus,
        processes,
        spans: spans
            .into_iter()
            .map(|(gpu, (rows, range))| GpuSpan { gpu, rows, range })
            .collect(),
        rows_outside_window,
        rows_folded,
        zoneless_times,
        warnings,
        gpu_stats,
        process_stats,
        process_rows_unsummarized,
    }
}

// ---------------------------------------------------------------------------------------
// Profiler outputs as the main input
// ---------------------------------------------------------------------------------------

/// White space before the first value of a JSON input: this much or more is refused, by
/// the main input and `--trace` alike (the main input sniffs this much of its start).
pub const MAX_LEADING_SPACE: usize = 4096;

/// The words for an input that starts with more white space than that.
pub fn leading_space_message(expected: &str) -> String {
    format!(
        "{MAX_LEADING_SPACE} bytes or more of white space before the first value; expected {expected}"
    )
}

/// Whether the first bytes of a (decompressed) file look like a profiler output: a Kineto /
/// Chrome trace, an `export_memory_timeline` JSON, or its HTML form. The input layer then
/// reads it with [`read_profile_snapshot`] instead of as a snapshot.
pub fn is_profile(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(&head[..head.len().min(4096)]);
    let t = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    if let Some(rest) = t.strip_prefix('{') {
        return [
            "\"traceEvents\"",
            "\"schemaVersion\"",
            "\"deviceProperties\"",
            "\"baseTimeNanoseconds\"",
        ]
        .iter()
        .any(|k| rest.contains(k));
    }
    if let Some(rest) = t.strip_prefix('[') {
        let rest = rest.trim_start();
        if rest.starts_with('[') {
            return true;
        }
        // Chrome's bare list of events, not a bare list of snapshot segments.
        return rest.starts_with('{')
            && (rest.contains("\"ph\"") || rest.contains("\"[memory]\""))
            && !rest.contains("\"total_size\"");
    }
    t.starts_with('<') && t.contains("GPU Memory Timeline HTML")
}

/// Reads a profiler output (see [`read_profile`]) and converts it into a snapshot (see
/// [`convert`]).
pub fn read_profile_snapshot<R: Read>(reader: R) -> Result<Converted, DevlogError> {
    let trace = read_profile(reader)?;
    Ok(to_snapshot(&trace))
}
