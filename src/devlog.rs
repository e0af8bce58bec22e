//! Device-level memory logs and profiler allocator events: the evidence a user may bring
//! beside a snapshot.
//!
//! A side entrance beside the snapshot flow, like [`crate::oom_log`]: it takes the text or
//! bytes of a file and gives plain, sorted samples. It imports no other module of the crate,
//! so reports can put "what the driver saw" and "what the profiler saw" beside what the
//! snapshot shows. It does no analysis, pairing or resampling.
//!
//! Two families are read:
//!
//! - [`read_device_log`]: what the driver reports per GPU and per process.
//!   - `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` and
//!     `--query-compute-apps=...` logs (spec 8.3): columns are found by header name, the
//!     bracketed unit of the header (`memory.used [MiB]`) or of the value (`1234 MiB`) is
//!     applied, and memory without any unit is MiB, the only unit nvidia-smi prints for it.
//!     Unavailable values (`[N/A]`, `[Not Supported]`, `[Insufficient Permissions]`, ...)
//!     become `None`. Header-less files are read when their columns have one of the common
//!     layouts (see [`read_device_log`]). A hand-written header may call the GPU number
//!     `gpu`; when it also has an `index` column, `gpu` wins (a warning says so).
//!   - the NVML JSON lines `python -m vramlens.capture` writes (`nvml.jsonl`).
//!
//!   nvidia-smi prints its `timestamp` in local time without a zone; [`ClockOptions`] says
//!   how far that is from UTC. ISO 8601 stamps with a zone (from `date -Iseconds`) carry
//!   their own offset and ignore it. Times are turned into Unix microseconds with a small
//!   days-from-civil function, so no calendar crate is needed.
//!
//! - [`read_kineto`]: `[memory]` instant events of a Kineto / Chrome trace (spec 8.2) from
//!   `torch.profiler` with `profile_memory=True`, and the rows of an
//!   `export_memory_timeline(*.raw.json.gz)` file (spec 8.1).
//!
//! Nothing here panics on any input: every problem is a [`DevlogError`] naming the line (text
//! formats) or the JSON path (traces), or a counted warning for the tolerated ones (a
//! truncated last line, a process row without a pid).

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Read;

const MIB: u64 = 1 << 20;

/// One reading of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSample {
    /// Unix time in microseconds (UTC).
    pub time_us: i64,
    /// GPU index as the driver numbers it; -1 when the log does not say.
    pub gpu: i64,
    pub uuid: Option<String>,
    pub used_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
}

/// One process's memory on one GPU at one time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessSample {
    /// Unix time in microseconds (UTC).
    pub time_us: i64,
    /// GPU index when the log says it (or [`merge`] could tell it from the uuid).
    pub gpu: Option<i64>,
    pub gpu_uuid: Option<String>,
    pub pid: u64,
    pub used_bytes: Option<u64>,
}

/// A device-level log: readings sorted by (time_us, gpu), processes sorted by (time_us, pid),
/// ties in file order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceLog {
    /// `"nvidia-smi"` or `"nvml"`; after [`merge`] also `"mixed"` (sources differ) or
    /// `"none"` (nothing merged).
    pub source: &'static str,
    pub gpus: Vec<GpuSample>,
    pub processes: Vec<ProcessSample>,
    /// One line per kind of tolerated problem, with its count and first line.
    pub warnings: Vec<String>,
}

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
    /// A file vramlens knows, but of another kind.
    #[error("{message}")]
    WrongKind { message: String },
}

/// How to read the clock of a device log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockOptions {
    /// Minutes to add to nvidia-smi's local timestamps to get UTC (nvidia-smi prints local
    /// time without a zone): -480 for a log written at UTC+8. Default 0: the log is taken as
    /// UTC. Timestamps that carry a zone (ISO 8601 `+08:00`, `Z`) ignore it.
    pub utc_offset_minutes: i32,
}

/// Counted warnings, one line per kind, in order of first appearance.
#[derive(Default)]
struct Warnings {
    kinds: Vec<(String, usize, usize)>,
}

impl Warnings {
    fn add(&mut self, kind: &str, line: usize) {
        match self.kinds.iter_mut().find(|(k, _, _)| k == kind) {
            Some(entry) => entry.1 += 1,
            None => self.kinds.push((kind.to_string(), 1, line)),
        }
    }

    fn finish(self) -> Vec<String> {
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

fn line_error(line: usize, message: impl Into<String>) -> DevlogError {
    DevlogError::Line {
        line,
        message: message.into(),
    }
}

/// Text for a found value in messages: quoted, and cut when long.
fn quote(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() > MAX {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut:?}...")
    } else {
        format!("{s:?}")
    }
}

// ---------------------------------------------------------------------------------------
// Device logs
// ---------------------------------------------------------------------------------------

const DEVICE_LOG_KIND: &str = "an nvidia-smi CSV or NVML JSON lines";

/// Reads an nvidia-smi CSV or an NVML JSON-lines file, told apart by content.
///
/// CSV: the `--query-gpu` form gives [`GpuSample`]s, the `--query-compute-apps` form (it has
/// a `pid` column) gives [`ProcessSample`]s. With or without header, with or without units in
/// values and header. Timestamps are `YYYY/MM/DD HH:MM:SS.mmm` in local time (`clock` turns
/// it into UTC) or ISO 8601, with or without a zone. A header line may repeat (appended
/// logs); a line `No running processes found` is skipped; a truncated last line is skipped
/// with a warning. Without a header the columns must be one of
/// `timestamp, index, uuid, memory.used, memory.total`,
/// `timestamp, gpu_uuid, pid, used_memory` or `timestamp, index, memory.used, memory.total`.
///
/// JSON lines: one object a line with `time_us` (Unix µs), `gpu`, `uuid`, `total_bytes`,
/// `used_bytes`, `free_bytes` and `processes` (`[{pid, used_bytes}]` or null).
pub fn read_device_log(text: &str, clock: ClockOptions) -> Result<DeviceLog, DevlogError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err(DevlogError::Empty {
            expected: DEVICE_LOG_KIND,
        });
    }
    if trimmed.starts_with('[') || (trimmed.starts_with('{') && text.contains("\"traceEvents\"")) {
        return Err(DevlogError::WrongKind {
            message: format!(
                "this is a JSON document (a Kineto/Chrome trace or memory timeline?), not {DEVICE_LOG_KIND}; read it as a profiler trace"
            ),
        });
    }
    let mut log = if trimmed.starts_with('{') {
        read_nvml_jsonl(text)?
    } else {
        read_nvsmi_csv(text, clock)?
    };
    log.gpus.sort_by_key(|s| (s.time_us, s.gpu));
    log.processes.sort_by_key(|p| (p.time_us, p.pid));
    Ok(log)
}

/// Several logs (for example the gpu and apps CSVs of one run) merged into one.
///
/// Samples are concatenated and sorted again (ties keep the order of `logs`); a process
/// sample without a GPU index gets the index of the GPU whose uuid it names, when a GPU
/// sample gives one. Warnings are kept once each.
pub fn merge(logs: Vec<DeviceLog>) -> DeviceLog {
    let mut source: Option<&'static str> = None;
    let mut gpus = Vec::new();
    let mut processes = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    for log in logs {
        source = match source {
            None => Some(log.source),
            Some(s) if s == log.source => Some(s),
            Some(_) => Some("mixed"),
        };
        gpus.extend(log.gpus);
        processes.extend(log.processes);
        for w in log.warnings {
            if !warnings.contains(&w) {
                warnings.push(w);
            }
        }
    }
    gpus.sort_by_key(|s| (s.time_us, s.gpu));
    processes.sort_by_key(|p| (p.time_us, p.pid));
    // uuid -> index; the first sample (in sorted order) naming a uuid decides.
    let mut index_of: BTreeMap<&str, i64> = BTreeMap::new();
    for s in &gpus {
        if let Some(uuid) = &s.uuid
            && s.gpu >= 0
        {
            index_of.entry(uuid.as_str()).or_insert(s.gpu);
        }
    }
    for p in &mut processes {
        if p.gpu.is_none() {
            p.gpu = p.gpu_uuid.as_deref().and_then(|u| index_of.get(u)).copied();
        }
    }
    DeviceLog {
        source: source.unwrap_or("none"),
        gpus,
        processes,
        warnings,
    }
}

/// The 1-based number of the last line that is not blank.
fn last_content_line(text: &str) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, _)| i + 1)
        .last()
        .unwrap_or(0)
}

fn read_nvml_jsonl(text: &str) -> Result<DeviceLog, DevlogError> {
    let last = last_content_line(text);
    let mut warnings = Warnings::default();
    let mut gpus = Vec::new();
    let mut processes = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let value: Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(_) if line == last => {
                warnings.add("truncated last line skipped", line);
                continue;
            }
            Err(e) => {
                return Err(line_error(
                    line,
                    format!(
                        "expected a JSON object, found invalid JSON ({})",
                        serde_message(&e)
                    ),
                ));
            }
        };
        let Some(obj) = value.as_object() else {
            return Err(line_error(
                line,
                format!("expected a JSON object, found {}", json_kind(&value)),
            ));
        };
        let time_us = match obj.get("time_us") {
            Some(v) => as_int(v).ok_or_else(|| {
                line_error(
                    line,
                    format!("time_us: expected an integer, found {}", json_kind(v)),
                )
            })?,
            None => {
                return Err(line_error(
                    line,
                    "expected a \"time_us\" key, found none".to_string(),
                ));
            }
        };
        let gpu = match obj.get("gpu") {
            None | Some(Value::Null) => None,
            Some(v) => Some(as_int(v).ok_or_else(|| {
                line_error(
                    line,
                    format!("gpu: expected an integer, found {}", json_kind(v)),
                )
            })?),
        };
        let uuid = opt_string(obj.get("uuid"), "uuid", line)?;
        gpus.push(GpuSample {
            time_us,
            gpu: gpu.unwrap_or(-1),
            uuid: uuid.clone(),
            used_bytes: opt_bytes(obj.get("used_bytes"), "used_bytes", line)?,
            total_bytes: opt_bytes(obj.get("total_bytes"), "total_bytes", line)?,
            free_bytes: opt_bytes(obj.get("free_bytes"), "free_bytes", line)?,
        });
        match obj.get("processes") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                for (k, p) in list.iter().enumerate() {
                    let Some(p) = p.as_object() else {
                        return Err(line_error(
                            line,
                            format!("processes[{k}]: expected an object, found {}", json_kind(p)),
                        ));
                    };
                    let pid = match p.get("pid").and_then(as_int) {
                        Some(pid) if pid >= 0 => pid as u64,
                        _ => {
                            warnings.add("process without a valid pid skipped", line);
                            continue;
                        }
                    };
                    processes.push(ProcessSample {
                        time_us,
                        gpu,
                        gpu_uuid: uuid.clone(),
                        pid,
                        used_bytes: opt_bytes(
                            p.get("used_bytes"),
                            &format!("processes[{k}].used_bytes"),
                            line,
                        )?,
                    });
                }
            }
            Some(v) => {
                return Err(line_error(
                    line,
                    format!("processes: expected a list or null, found {}", json_kind(v)),
                ));
            }
        }
    }
    Ok(DeviceLog {
        source: "nvml",
        gpus,
        processes,
        warnings: warnings.finish(),
    })
}

fn opt_string(v: Option<&Value>, key: &str, line: usize) -> Result<Option<String>, DevlogError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(line_error(
            line,
            format!("{key}: expected a string, found {}", json_kind(v)),
        )),
    }
}

fn opt_bytes(v: Option<&Value>, key: &str, line: usize) -> Result<Option<u64>, DevlogError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match as_int(v) {
            Some(n) if n >= 0 => Ok(Some(n as u64)),
            _ => match v.as_u64() {
                Some(n) => Ok(Some(n)),
                None => Err(line_error(
                    line,
                    format!("{key}: expected a byte count, found {}", json_kind_value(v)),
                )),
            },
        },
    }
}

/// What a column of an nvidia-smi CSV holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Time,
    /// nvidia-smi's `index`.
    Index,
    /// A hand-written `gpu` column.
    HandGpu,
    Uuid,
    Pid,
    Used,
    Total,
    Free,
    Other,
}

fn role_of(name: &str) -> Role {
    match name.to_ascii_lowercase().as_str() {
        "timestamp" => Role::Time,
        "index" => Role::Index,
        "gpu" => Role::HandGpu,
        "uuid" | "gpu_uuid" => Role::Uuid,
        "pid" => Role::Pid,
        "memory.used" | "used_memory" | "used_gpu_memory" => Role::Used,
        "memory.total" => Role::Total,
        "memory.free" => Role::Free,
        _ => Role::Other,
    }
}

/// Splits `memory.used [MiB]` into the name and the unit's multiplier.
fn split_header_field(field: &str) -> (&str, Option<u64>) {
    let field = field.trim();
    if let Some(open) = field.find('[') {
        let name = field[..open].trim();
        let unit = field[open + 1..].trim_end_matches(']').trim();
        (name, unit_multiplier(unit))
    } else {
        (field, None)
    }
}

fn unit_multiplier(unit: &str) -> Option<u64> {
    match unit {
        "B" => Some(1),
        "KiB" | "KB" => Some(1 << 10),
        "MiB" | "MB" => Some(MIB),
        "GiB" | "GB" => Some(1 << 30),
        "TiB" | "TB" => Some(1 << 40),
        _ => None,
    }
}

/// The columns of one CSV section (from its header, or inferred).
struct Columns {
    roles: Vec<Role>,
    /// Unit multiplier of each column from the header, when it names one.
    units: Vec<Option<u64>>,
    /// Column of each role (first one), by role.
    time: Option<usize>,
    gpu: Option<usize>,
    uuid: Option<usize>,
    pid: Option<usize>,
    used: Option<usize>,
    total: Option<usize>,
    free: Option<usize>,
    /// Line of the header (0 when inferred).
    header_line: usize,
}

impl Columns {
    fn new(
        roles: Vec<Role>,
        units: Vec<Option<u64>>,
        header_line: usize,
        warnings: &mut Warnings,
    ) -> Columns {
        let find = |r: Role| roles.iter().position(|&x| x == r);
        let hand = find(Role::HandGpu);
        let index = find(Role::Index);
        if hand.is_some() && index.is_some() {
            warnings.add(
                "columns \"gpu\" and \"index\" both present: the GPU number is read from \"gpu\"",
                header_line,
            );
        }
        Columns {
            time: find(Role::Time),
            gpu: hand.or(index),
            uuid: find(Role::Uuid),
            pid: find(Role::Pid),
            used: find(Role::Used),
            total: find(Role::Total),
            free: find(Role::Free),
            roles,
            units,
            header_line,
        }
    }
}

fn split_csv(line: &str) -> Vec<&str> {
    line.split(',').map(str::trim).collect()
}

fn is_unavailable(v: &str) -> bool {
    let v = v.trim();
    v.is_empty() || (v.starts_with('[') && v.ends_with(']')) || v.eq_ignore_ascii_case("n/a")
}

fn is_gpu_uuid(v: &str) -> bool {
    v.starts_with("GPU-") || v.starts_with("MIG-")
}

fn is_plain_int(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())
}

/// A memory value, or one nvidia-smi could not read.
fn is_memory_value(v: &str) -> bool {
    is_unavailable(v) || parse_memory(v, None).is_ok()
}

/// Column roles for a file without header, from its first row; None when not a known layout.
fn infer_roles(fields: &[&str]) -> Option<Vec<Role>> {
    use Role::*;
    if fields.is_empty() || parse_timestamp(fields[0], 0).is_none() {
        return None;
    }
    let rest = &fields[1..];
    match rest.len() {
        4 if is_plain_int(rest[0])
            && is_gpu_uuid(rest[1])
            && is_memory_value(rest[2])
            && is_memory_value(rest[3]) =>
        {
            Some(vec![Time, Index, Uuid, Used, Total])
        }
        3 if is_gpu_uuid(rest[0]) && is_plain_int(rest[1]) && is_memory_value(rest[2]) => {
            Some(vec![Time, Uuid, Pid, Used])
        }
        3 if is_plain_int(rest[0]) && is_memory_value(rest[1]) && is_memory_value(rest[2]) => {
            Some(vec![Time, Index, Used, Total])
        }
        _ => None,
    }
}

/// A header line names at least one known column and does not start with a timestamp.
fn header_roles(fields: &[&str]) -> Option<(Vec<Role>, Vec<Option<u64>>)> {
    if fields
        .first()
        .is_some_and(|f| parse_timestamp(f, 0).is_some())
    {
        return None;
    }
    let mut roles = Vec::with_capacity(fields.len());
    let mut units = Vec::with_capacity(fields.len());
    for f in fields {
        let (name, unit) = split_header_field(f);
        roles.push(role_of(name));
        units.push(unit);
    }
    if roles.iter().all(|&r| r == Role::Other) {
        return None;
    }
    Some((roles, units))
}

/// A memory value: `1234`, `1234 MiB`, `1.5 GiB`; the value's unit, else the header's, else MiB.
fn parse_memory(v: &str, header_unit: Option<u64>) -> Result<u64, ()> {
    let v = v.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, unit) = (&v[..split], v[split..].trim());
    let mult = if unit.is_empty() {
        header_unit.unwrap_or(MIB)
    } else {
        unit_multiplier(unit).ok_or(())?
    };
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if int_part.is_empty()
        || !is_plain_int(int_part)
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(());
    }
    let int: u64 = int_part.parse().map_err(|_| ())?;
    let mut bytes = int.checked_mul(mult).ok_or(())?;
    if !frac_part.is_empty() {
        // Exact to the byte: floor(0.frac * mult), at most 18 digits considered.
        let digits = &frac_part[..frac_part.len().min(18)];
        let frac: u128 = digits.parse().map_err(|_| ())?;
        let scale = 10u128.pow(digits.len() as u32);
        let extra = (frac * mult as u128 / scale) as u64;
        bytes = bytes.checked_add(extra).ok_or(())?;
    }
    Ok(bytes)
}

fn read_nvsmi_csv(text: &str, clock: ClockOptions) -> Result<DeviceLog, DevlogError> {
    let last = last_content_line(text);
    let mut warnings = Warnings::default();
    let mut gpus = Vec::new();
    let mut processes = Vec::new();
    let mut columns: Option<Columns> = None;
    let mut warned_no_time = false;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        if raw.to_ascii_lowercase().starts_with("no running processes") {
            continue;
        }
        let fields = split_csv(raw);
        if let Some((roles, units)) = header_roles(&fields) {
            let cols = Columns::new(roles, units, line, &mut warnings);
            if cols.pid.is_none()
                && cols.used.is_none()
                && cols.total.is_none()
                && cols.free.is_none()
            {
                return Err(line_error(
                    line,
                    format!(
                        "expected a header with a memory.used, memory.total, memory.free or pid column, found {}",
                        quote(raw)
                    ),
                ));
            }
            columns = Some(cols);
            continue;
        }
        if columns.is_none() {
            let Some(roles) = infer_roles(&fields) else {
                let message = if fields
                    .first()
                    .is_some_and(|f| parse_timestamp(f, 0).is_some())
                {
                    format!(
                        "expected a header line naming the columns (this row's columns are not a known header-less layout), found {}",
                        quote(raw)
                    )
                } else {
                    format!(
                        "expected an nvidia-smi CSV header (such as \"timestamp, index, memory.used [MiB]\") or a row starting with a timestamp, found {}",
                        quote(raw)
                    )
                };
                return Err(line_error(line, message));
            };
            let units = vec![None; roles.len()];
            columns = Some(Columns::new(roles, units, 0, &mut warnings));
        }
        let Some(cols) = &columns else { continue };
        if fields.len() != cols.roles.len() {
            if line == last {
                warnings.add("truncated last line skipped", line);
                continue;
            }
            let from = if cols.header_line > 0 {
                format!("the header on line {}", cols.header_line)
            } else {
                "the first row".to_string()
            };
            return Err(line_error(
                line,
                format!(
                    "expected {} fields as in {from}, found {}",
                    cols.roles.len(),
                    fields.len()
                ),
            ));
        }
        let time_us = match cols.time {
            Some(c) => parse_timestamp(fields[c], clock.utc_offset_minutes).ok_or_else(|| {
                line_error(
                    line,
                    format!(
                        "timestamp: expected YYYY/MM/DD HH:MM:SS.mmm or ISO 8601, found {}",
                        quote(fields[c])
                    ),
                )
            })?,
            None => {
                if !warned_no_time {
                    warnings.add("no timestamp column: samples are at time 0", line);
                    warned_no_time = true;
                }
                0
            }
        };
        let memory = |c: Option<usize>, name: &str| -> Result<Option<u64>, DevlogError> {
            let Some(c) = c else { return Ok(None) };
            let v = fields[c];
            if is_unavailable(v) {
                return Ok(None);
            }
            parse_memory(v, cols.units[c]).map(Some).map_err(|()| {
                line_error(
                    line,
                    format!(
                        "{name}: expected a size such as 1234 or 1234 MiB, found {}",
                        quote(v)
                    ),
                )
            })
        };
        let gpu = match cols.gpu {
            Some(c) if !is_unavailable(fields[c]) => {
                Some(fields[c].parse::<i64>().map_err(|_| {
                    line_error(
                        line,
                        format!("gpu index: expected an integer, found {}", quote(fields[c])),
                    )
                })?)
            }
            _ => None,
        };
        let uuid = cols
            .uuid
            .map(|c| fields[c])
            .filter(|v| !is_unavailable(v))
            .map(str::to_string);
        let used_bytes = memory(cols.used, "used memory")?;
        if let Some(c) = cols.pid {
            if is_unavailable(fields[c]) {
                warnings.add("process row without a pid skipped", line);
                continue;
            }
            let pid = fields[c].parse::<u64>().map_err(|_| {
                line_error(
                    line,
                    format!("pid: expected an integer, found {}", quote(fields[c])),
                )
            })?;
            processes.push(ProcessSample {
                time_us,
                gpu,
                gpu_uuid: uuid,
                pid,
                used_bytes,
            });
        } else {
            gpus.push(GpuSample {
                time_us,
                gpu: gpu.unwrap_or(-1),
                uuid,
                used_bytes,
                total_bytes: memory(cols.total, "memory.total")?,
                free_bytes: memory(cols.free, "memory.free")?,
            });
        }
    }
    Ok(DeviceLog {
        source: "nvidia-smi",
        gpus,
        processes,
        warnings: warnings.finish(),
    })
}

// ---------------------------------------------------------------------------------------
// Time
// ---------------------------------------------------------------------------------------

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        _ => 28,
    }
}

/// Fixed-width decimal number, digits only.
fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 9 {
        return None;
    }
    s.parse().ok()
}

/// Unix µs of `YYYY/MM/DD HH:MM:SS[.fff]` or ISO 8601 `YYYY-MM-DDTHH:MM:SS[.fff][Z|±HH:MM]`.
/// Without a zone the time is local and `offset_minutes` is added.
fn parse_timestamp(s: &str, offset_minutes: i32) -> Option<i64> {
    let s = s.trim();
    if !s.is_ascii() || s.len() < 19 {
        return None;
    }
    let (date, rest) = s.split_at(10);
    let sep = date.as_bytes()[4];
    if !(sep == b'/' || sep == b'-') || date.as_bytes()[7] != sep {
        return None;
    }
    let year = i64::from(digits(&date[0..4])?);
    let month = digits(&date[5..7])?;
    let day = digits(&date[8..10])?;
    if year < 1 || !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let rest = rest.strip_prefix(['T', ' '])?;
    if rest.len() < 8 || rest.as_bytes()[2] != b':' || rest.as_bytes()[5] != b':' {
        return None;
    }
    let hour = digits(&rest[0..2])?;
    let minute = digits(&rest[3..5])?;
    let second = digits(&rest[6..8])?;
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &rest[8..];
    let mut micros: i64 = 0;
    if let Some(frac) = rest.strip_prefix(['.', ',']) {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        // Keep microseconds; finer digits are dropped.
        let kept = &frac[..n.min(6)];
        micros = i64::from(digits(kept)?) * 10i64.pow(6 - kept.len() as u32);
        rest = &frac[n..];
    }
    let zone_minutes: Option<i64> = if rest.is_empty() {
        None
    } else if rest == "Z" || rest == "z" {
        Some(0)
    } else {
        let sign = match rest.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let z = &rest[1..];
        let (h, m) = match z.len() {
            2 => (digits(z)?, 0),
            4 => (digits(&z[..2])?, digits(&z[2..])?),
            5 if z.as_bytes()[2] == b':' => (digits(&z[..2])?, digits(&z[3..])?),
            _ => return None,
        };
        if h > 23 || m > 59 {
            return None;
        }
        Some(sign * i64::from(h * 60 + m))
    };
    let days = days_from_civil(year, month, day);
    let seconds =
        days * 86_400 + i64::from(hour) * 3_600 + i64::from(minute) * 60 + i64::from(second);
    let local_us = seconds * 1_000_000 + micros;
    // Local time = UTC + zone, so UTC = local - zone; a zone-less stamp gets the clock offset.
    let shift_minutes = match zone_minutes {
        Some(z) => -z,
        None => i64::from(offset_minutes),
    };
    local_us.checked_add(shift_minutes.checked_mul(60_000_000)?)
}

// ---------------------------------------------------------------------------------------
// Kineto traces
// ---------------------------------------------------------------------------------------

/// One allocator event: a Kineto / Chrome trace `[memory]` instant event (spec 8.2), or one
/// row of `export_memory_timeline` raw output (spec 8.1).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocatorSample {
    /// `ts` as in the file: absolute µs (older Kineto) or µs after `baseTimeNanoseconds`.
    /// For memory-timeline rows, the row's ns divided by 1000; pre-existing rows (-1 in the
    /// file) get the smallest time, as PyTorch's own JSON export does.
    pub ts_us: f64,
    /// `c10::DeviceType` as int: 0 CPU, 1 CUDA; -1 for memory-timeline rows (not recorded).
    pub device_type: i64,
    /// Device index, -1 for CPU (and for memory-timeline rows).
    pub device_id: i64,
    /// +block size on allocation, -block size on free.
    pub bytes: i64,
    /// Allocator-wide allocated bytes of the device after the event (absent in 2021 traces).
    pub total_allocated: Option<i64>,
    /// Allocator-wide reserved bytes of the device after the event (absent in 2021 traces).
    pub total_reserved: Option<i64>,
    pub addr: Option<i64>,
}

/// The allocator events of one trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocatorTrace {
    /// In file order.
    pub samples: Vec<AllocatorSample>,
    /// The top-level `baseTimeNanoseconds` when present (Kineto from May 2024).
    pub base_time_ns: Option<i64>,
    /// `"kineto"` (a Kineto / Chrome trace) or `"memory_timeline_raw"`.
    pub kind: &'static str,
}

const TRACE_KIND: &str = "a Kineto/Chrome trace JSON (torch.profiler with profile_memory=True)";

/// Reads a Kineto / Chrome trace JSON (plain or gzip, sniffed by the magic `1f 8b`) and
/// returns its `[memory]` events in file order; the 2021 shape has only `Device Type`,
/// `Device Id` and `Bytes`. Also reads `export_memory_timeline` raw output
/// (`[[timestamp_ns, action, numbytes, category], ...]`), where only time and bytes are
/// kept. `[OutOfMemory]` and all other events are ignored.
pub fn read_kineto(bytes: &[u8]) -> Result<AllocatorTrace, DevlogError> {
    let mut owned = Vec::new();
    let data: &[u8] = if bytes.starts_with(&[0x1f, 0x8b]) {
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut owned)
            .map_err(|e| DevlogError::Gzip {
                message: e.to_string().to_lowercase(),
            })?;
        &owned
    } else {
        bytes
    };
    let data = data.strip_prefix(b"\xef\xbb\xbf").unwrap_or(data);
    if data.iter().all(u8::is_ascii_whitespace) {
        return Err(DevlogError::Empty {
            expected: TRACE_KIND,
        });
    }
    if data.first() == Some(&0x80) {
        return Err(DevlogError::WrongKind {
            message: format!(
                "this is a pickle (a memory snapshot?), not {TRACE_KIND}; read it as a snapshot"
            ),
        });
    }
    let value: Value = serde_json::from_slice(data).map_err(|e| DevlogError::Line {
        line: e.line(),
        message: format!(
            "column {}: expected {TRACE_KIND}, found invalid JSON ({})",
            e.column(),
            serde_message(&e)
        ),
    })?;
    match &value {
        Value::Object(obj) => {
            let base_time_ns = obj.get("baseTimeNanoseconds").and_then(as_int);
            match obj.get("traceEvents") {
                Some(Value::Array(events)) => Ok(AllocatorTrace {
                    samples: memory_events(events, "traceEvents")?,
                    base_time_ns,
                    kind: "kineto",
                }),
                Some(v) => Err(DevlogError::Json {
                    path: "traceEvents".to_string(),
                    message: format!("expected a list, found {}", json_kind(v)),
                }),
                None if obj.contains_key("segments") || obj.contains_key("device_traces") => {
                    Err(DevlogError::WrongKind {
                        message: format!(
                            "this is a memory snapshot in JSON form, not {TRACE_KIND}; read it as a snapshot"
                        ),
                    })
                }
                None => Err(DevlogError::Json {
                    path: "(top level)".to_string(),
                    message: format!(
                        "expected a \"traceEvents\" list, found an object with keys {}",
                        key_list(obj)
                    ),
                }),
            }
        }
        Value::Array(items) => {
            if items.iter().all(Value::is_object) {
                // Chrome's JSON array format: the events themselves.
                return Ok(AllocatorTrace {
                    samples: memory_events(items, "")?,
                    base_time_ns: None,
                    kind: "kineto",
                });
            }
            if is_category_timeline(items) {
                return Err(DevlogError::WrongKind {
                    message: "this is an export_memory_timeline JSON of category totals, which holds no allocator events; export to a name ending in .raw.json.gz for the raw events".to_string(),
                });
            }
            memory_timeline_raw(items)
        }
        v => Err(DevlogError::Json {
            path: "(top level)".to_string(),
            message: format!("expected {TRACE_KIND}, found {}", json_kind(v)),
        }),
    }
}

/// `[times, sizes]` with `sizes` a list of lists (spec 8.1, `*.json` export).
fn is_category_timeline(items: &[Value]) -> bool {
    items.len() == 2
        && items[0]
            .as_array()
            .is_some_and(|t| t.iter().all(Value::is_number))
        && items[1]
            .as_array()
            .is_some_and(|s| s.iter().all(Value::is_array))
        && items[1].as_array().is_some_and(|s| !s.is_empty())
}

fn memory_events(events: &[Value], list: &str) -> Result<Vec<AllocatorSample>, DevlogError> {
    let mut samples = Vec::new();
    for (i, ev) in events.iter().enumerate() {
        let Some(obj) = ev.as_object() else { continue };
        if obj.get("name").and_then(Value::as_str) != Some("[memory]") {
            continue;
        }
        let path = format!("{list}[{i}]");
        let ts_us = match obj.get("ts") {
            Some(v) => v.as_f64().ok_or_else(|| DevlogError::Json {
                path: format!("{path}.ts"),
                message: format!("expected a number, found {}", json_kind(v)),
            })?,
            None => {
                return Err(DevlogError::Json {
                    path,
                    message: "expected a \"ts\" key, found none".to_string(),
                });
            }
        };
        let Some(args) = obj.get("args").and_then(Value::as_object) else {
            return Err(DevlogError::Json {
                path: format!("{path}.args"),
                message: format!(
                    "expected an object, found {}",
                    obj.get("args").map_or("nothing", json_kind)
                ),
            });
        };
        let required = |key: &str| -> Result<i64, DevlogError> {
            match args.get(key) {
                Some(v) => as_int(v).ok_or_else(|| DevlogError::Json {
                    path: format!("{path}.args.{key}"),
                    message: format!("expected an integer, found {}", json_kind_value(v)),
                }),
                None => Err(DevlogError::Json {
                    path: format!("{path}.args"),
                    message: format!("expected a \"{key}\" key, found none"),
                }),
            }
        };
        let optional = |key: &str| -> Result<Option<i64>, DevlogError> {
            match args.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(_) => required(key).map(Some),
            }
        };
        let addr = match args.get("Addr") {
            None | Some(Value::Null) => None,
            // A pointer printed unsigned above i64::MAX keeps its bits.
            Some(v) => match as_int(v) {
                Some(a) => Some(a),
                None => match v.as_u64() {
                    Some(a) => Some(a as i64),
                    None => {
                        return Err(DevlogError::Json {
                            path: format!("{path}.args.Addr"),
                            message: format!("expected an integer, found {}", json_kind_value(v)),
                        });
                    }
                },
            },
        };
        samples.push(AllocatorSample {
            ts_us,
            device_type: required("Device Type")?,
            device_id: required("Device Id")?,
            bytes: required("Bytes")?,
            total_allocated: optional("Total Allocated")?,
            total_reserved: optional("Total Reserved")?,
            addr,
        });
    }
    Ok(samples)
}

/// `export_memory_timeline` raw rows: `[timestamp_ns, action, numbytes, category]`.
fn memory_timeline_raw(items: &[Value]) -> Result<AllocatorTrace, DevlogError> {
    let mut rows: Vec<(Option<i64>, i64)> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let row = match item.as_array() {
            Some(r) if r.len() == 4 => r,
            _ => {
                return Err(DevlogError::Json {
                    path: format!("[{i}]"),
                    message: format!(
                        "expected {TRACE_KIND} or memory-timeline raw rows [timestamp_ns, action, numbytes, category], found {}",
                        json_kind_value(item)
                    ),
                });
            }
        };
        let int = |k: usize, what: &str| -> Result<i64, DevlogError> {
            as_int(&row[k]).ok_or_else(|| DevlogError::Json {
                path: format!("[{i}][{k}]"),
                message: format!(
                    "{what}: expected an integer, found {}",
                    json_kind_value(&row[k])
                ),
            })
        };
        let ts = int(0, "timestamp_ns")?;
        int(1, "action")?;
        let bytes = int(2, "numbytes")?;
        int(3, "category")?;
        rows.push(((ts >= 0).then_some(ts), bytes));
    }
    let min_ts = rows.iter().filter_map(|r| r.0).min().unwrap_or(0);
    let samples = rows
        .into_iter()
        .map(|(ts, bytes)| {
            let ns = ts.unwrap_or(min_ts);
            AllocatorSample {
                // Whole µs and the ns remainder apart, so large epochs keep their precision.
                ts_us: (ns.div_euclid(1000)) as f64 + (ns.rem_euclid(1000)) as f64 / 1000.0,
                device_type: -1,
                device_id: -1,
                bytes,
                total_allocated: None,
                total_reserved: None,
                addr: None,
            }
        })
        .collect();
    Ok(AllocatorTrace {
        samples,
        base_time_ns: None,
        kind: "memory_timeline_raw",
    })
}

// ---------------------------------------------------------------------------------------
// JSON helpers
// ---------------------------------------------------------------------------------------

/// An integer from a JSON number: integers as they are, floats only when whole and in range.
fn as_int(v: &Value) -> Option<i64> {
    if let Some(n) = v.as_i64() {
        return Some(n);
    }
    if v.is_u64() {
        return None;
    }
    let f = v.as_f64()?;
    // 2^63 as f64 is exact; anything at or above it does not fit.
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    (f.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&f)).then_some(f as i64)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The kind, with the value when it is short.
fn json_kind_value(v: &Value) -> String {
    match v {
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {}", quote(s)),
        Value::Bool(b) => format!("{b}"),
        other => json_kind(other).to_string(),
    }
}

fn key_list(obj: &serde_json::Map<String, Value>) -> String {
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).take(8).collect();
    keys.sort_unstable();
    if keys.is_empty() {
        "none".to_string()
    } else {
        keys.iter()
            .map(|k| format!("{k:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// serde_json's message without its " at line L column C" suffix (the caller places it).
fn serde_message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
    }

    #[test]
    fn timestamps() {
        assert_eq!(
            parse_timestamp("2025/06/13 00:27:52.195", 0),
            Some(1_749_774_472_195_000)
        );
        assert_eq!(
            parse_timestamp("2025/06/13 00:27:52.195", -60),
            Some(1_749_774_472_195_000 - 3_600_000_000)
        );
        assert_eq!(
            parse_timestamp("2025-09-08T17:26:50+08:00", 123),
            Some(1_757_323_610_000_000)
        );
        assert_eq!(
            parse_timestamp("2025-09-08T09:26:50Z", 0),
            Some(1_757_323_610_000_000)
        );
        assert_eq!(
            parse_timestamp("2025-09-08T09:26:50.5-0130", 0),
            Some(1_757_323_610_500_000 + 90 * 60_000_000)
        );
        for bad in [
            "",
            "2025/13/01 00:00:00",
            "2025/02/29 00:00:00",
            "2025/06/13 24:00:00",
            "2025/06/13T00:00:00x",
            "2025/06/13 00:00:00.",
            "2025-06/13 00:00:00",
            "héllo wörld, 2025/06/13",
        ] {
            assert_eq!(parse_timestamp(bad, 0), None, "{bad}");
        }
    }

    #[test]
    fn memory_values() {
        assert_eq!(parse_memory("1 MiB", None), Ok(MIB));
        assert_eq!(parse_memory("3", None), Ok(3 * MIB));
        assert_eq!(parse_memory("3", Some(1)), Ok(3));
        assert_eq!(parse_memory("1.5 GiB", None), Ok(3 << 29));
        assert_eq!(parse_memory("12 W", None), Err(()));
        assert_eq!(parse_memory("99999999999999999999", None), Err(()));
        assert_eq!(parse_memory(".5", None), Err(()));
    }
}
