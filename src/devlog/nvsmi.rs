//! nvidia-smi CSV logs (spec 8.3): `--query-gpu=...` readings and `--query-compute-apps=...`
//! process rows, read line by line.
//!
//! Columns are found by header name; the bracketed unit of the header (`memory.used [MiB]`)
//! or of the value (`1234 MiB`) is applied, and memory without any unit is MiB, the only
//! unit nvidia-smi prints for it. Unavailable values (`[N/A]`, `[Not Supported]`,
//! `[Insufficient Permissions]`, ...) become `None`. Header-less files are read when their
//! columns have one of the common layouts: `timestamp, index, uuid, memory.used,
//! memory.total`, `timestamp, gpu_uuid, pid, used_memory` or `timestamp, index,
//! memory.used, memory.total`. A hand-written header may call the GPU number `gpu`; when
//! it also has an `index` column, `gpu` wins (a warning says so).
//!
//! GPU numbers: nvidia-smi's `index` when the log has it; else the order in which uuids
//! first appear; else, for logs with neither, rows sharing a timestamp are one reading of
//! several GPUs, numbered by their place in it (a log whose readings do not come in equal
//! groups is one GPU, number 0).

use super::clock::{Stamp, parse_stamp};
use super::{
    DeviceLog, DeviceLogOptions, DevlogError, GpuNumbering, GpuSample, Lines, LogBuilder, MIB,
    ProcessSample, Warnings, line_error, quote,
};
use crate::units::{Rounding, UnitWords, scaled_bytes};
use std::io::BufRead;

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

/// Bytes per unit of nvidia-smi's words ([`UnitWords::NvidiaSmi`]).
fn unit_multiplier(unit: &str) -> Option<u64> {
    UnitWords::NvidiaSmi
        .multiplier(unit)
        .and_then(|m| u64::try_from(m).ok())
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
    if fields.is_empty() || parse_stamp(fields[0], 0).is_none() {
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
    if fields.first().is_some_and(|f| parse_stamp(f, 0).is_some()) {
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
pub(crate) fn parse_memory(v: &str, header_unit: Option<u64>) -> Result<u64, ()> {
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
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if !is_plain_int(int_part) {
        return Err(());
    }
    // Exact to the byte, the fraction rounded down.
    scaled_bytes(int_part, frac_part, u128::from(mult), Rounding::Down).ok_or(())
}

/// GPU numbers for logs without an index or uuid column: the place of each row in its group
/// of rows sharing a timestamp.
#[derive(Default)]
struct RowGroups {
    last_time: Option<i64>,
    place: i64,
    /// Sizes of the finished groups.
    sizes: Vec<i64>,
}

impl RowGroups {
    fn place_of(&mut self, time_us: i64) -> i64 {
        if self.last_time == Some(time_us) {
            self.place += 1;
        } else {
            if self.last_time.is_some() {
                self.sizes.push(self.place + 1);
            }
            self.last_time = Some(time_us);
            self.place = 0;
        }
        self.place
    }

    /// Whether every group but the last has the same size, above one: readings of several
    /// GPUs. Otherwise the repeated stamps are a coarse clock and the log is one GPU.
    fn several_gpus(&self) -> bool {
        let mut sizes = self.sizes.clone();
        if self.last_time.is_some() {
            sizes.push(self.place + 1);
        }
        let Some(&first) = sizes.first() else {
            return false;
        };
        let last = sizes.len() - 1;
        // At least two full readings, all of the same size (the last may be cut short).
        first > 1
            && sizes.iter().filter(|&&s| s == first).count() >= 2
            && sizes
                .iter()
                .enumerate()
                .all(|(i, &s)| s == first || (i == last && s < first))
    }
}

/// Reads the CSV from its first content line on (`first` is its number and text).
///
/// Without a header the columns must be one of `timestamp, index, uuid, memory.used,
/// memory.total`, `timestamp, gpu_uuid, pid, used_memory` or `timestamp, index,
/// memory.used, memory.total`.
pub(crate) fn read<R: BufRead>(
    first: (usize, String),
    mut lines: Lines<R>,
    options: DeviceLogOptions,
    mut log: LogBuilder,
) -> Result<DeviceLog, DevlogError> {
    let clock = options.clock;
    let mut warnings = Warnings::default();
    let mut columns: Option<Columns> = None;
    let mut warned_no_time = false;
    let mut numbering: Option<GpuNumbering> = None;
    let mut groups = RowGroups::default();
    // Rows of one reading share their timestamp's text: it is read once.
    let mut last_stamp: (String, Option<Stamp>) = (String::new(), None);
    let mut pending = Some(first);
    loop {
        let (line, raw_owned) = match pending.take() {
            Some(p) => p,
            None => match lines.next_line()? {
                Some((n, l)) => (n, l.to_string()),
                None => break,
            },
        };
        let raw = raw_owned.trim();
        if raw.is_empty() {
            continue;
        }
        const NO_PROCESSES: &str = "no running processes";
        if raw
            .get(..NO_PROCESSES.len())
            .is_some_and(|h| h.eq_ignore_ascii_case(NO_PROCESSES))
        {
            continue;
        }
        let fields = split_csv(raw);
        // A row starting with the timestamp of the row before is no header.
        let same_stamp = last_stamp.1.is_some() && fields.first() == Some(&last_stamp.0.as_str());
        if !same_stamp && let Some((roles, units)) = header_roles(&fields) {
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
                let message = if fields.first().is_some_and(|f| parse_stamp(f, 0).is_some()) {
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
            // A short last line (the logger was killed mid-write) is tolerated.
            if lines.rest_is_blank()? {
                warnings.add("truncated last line skipped", line);
                break;
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
        match read_row(
            line,
            &fields,
            cols,
            clock,
            &mut warnings,
            &mut warned_no_time,
            &mut last_stamp,
        )? {
            Row::Skip(kind) => warnings.add(kind, line),
            Row::Process(mut p, uuid, zoneless) => {
                log.zoneless_times |= zoneless;
                p.gpu_uuid = uuid.map(|u| log.uuid(&u));
                log.push_process(p);
            }
            Row::Gpu(mut s, uuid, zoneless) => {
                log.zoneless_times |= zoneless;
                s.uuid = uuid.map(|u| log.uuid(&u));
                let how = if cols.gpu.is_some() {
                    GpuNumbering::DriverIndex
                } else if let Some(u) = s.uuid {
                    s.gpu = i64::from(u);
                    GpuNumbering::UuidOrder
                } else {
                    s.gpu = groups.place_of(s.time_us);
                    GpuNumbering::RowOrder
                };
                numbering.get_or_insert(how);
                log.push_gpu(s);
            }
        }
    }
    let numbering = numbering.unwrap_or(GpuNumbering::DriverIndex);
    if numbering == GpuNumbering::RowOrder && !groups.several_gpus() {
        log.collapse_to_one_gpu();
    }
    Ok(log.finish("nvidia-smi", numbering, warnings))
}

enum Row {
    Gpu(GpuSample, Option<String>, bool),
    Process(ProcessSample, Option<String>, bool),
    Skip(&'static str),
}

fn read_row(
    line: usize,
    fields: &[&str],
    cols: &Columns,
    clock: super::ClockOptions,
    warnings: &mut Warnings,
    warned_no_time: &mut bool,
    last_stamp: &mut (String, Option<Stamp>),
) -> Result<Row, DevlogError> {
    let (time_us, zoneless) = match cols.time {
        Some(c) => {
            let stamp = match last_stamp.1 {
                Some(known) if last_stamp.0 == fields[c] => known,
                _ => {
                    let stamp = parse_stamp(fields[c], clock.utc_offset_minutes).ok_or_else(|| {
                        line_error(
                            line,
                            format!(
                                "timestamp: expected YYYY/MM/DD HH:MM:SS.mmm or ISO 8601, found {}",
                                quote(fields[c])
                            ),
                        )
                    })?;
                    last_stamp.0.clear();
                    last_stamp.0.push_str(fields[c]);
                    last_stamp.1 = Some(stamp);
                    stamp
                }
            };
            (stamp.time_us, stamp.zoneless)
        }
        None => {
            if !*warned_no_time {
                warnings.add("no timestamp column: samples are at time 0", line);
                *warned_no_time = true;
            }
            (0, false)
        }
    };
    let memory = |c: Option<usize>, name: &str| -> Result<Option<u64>, DevlogError> {
        let Some(c) = c else { return Ok(None) };
        let v = fields[c];
        if is_unavailable(v) {
            return Ok(None);
        }
        let bytes = parse_memory(v, cols.units[c]).map_err(|()| {
            line_error(
                line,
                format!(
                    "{name}: expected a size such as 1234 or 1234 MiB, found {}",
                    quote(v)
                ),
            )
        })?;
        super::device_bytes(bytes, name, line, v).map(Some)
    };
    let gpu = match cols.gpu {
        Some(c) if !is_unavailable(fields[c]) => Some(fields[c].parse::<i64>().map_err(|_| {
            line_error(
                line,
                format!("gpu index: expected an integer, found {}", quote(fields[c])),
            )
        })?),
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
            return Ok(Row::Skip("process row without a pid skipped"));
        }
        let pid = fields[c].parse::<u64>().map_err(|_| {
            line_error(
                line,
                format!("pid: expected an integer, found {}", quote(fields[c])),
            )
        })?;
        return Ok(Row::Process(
            ProcessSample {
                time_us,
                gpu,
                gpu_uuid: None,
                pid,
                used_bytes,
            },
            uuid,
            zoneless,
        ));
    }
    Ok(Row::Gpu(
        GpuSample {
            time_us,
            gpu: gpu.unwrap_or(-1),
            uuid: None,
            used_bytes,
            total_bytes: memory(cols.total, "memory.total")?,
            free_bytes: memory(cols.free, "memory.free")?,
        },
        uuid,
        zoneless,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn row_groups() {
        let mut g = RowGroups::default();
        for t in [1, 1, 2, 2, 3] {
            g.place_of(t);
        }
        assert!(g.several_gpus());
        let mut g = RowGroups::default();
        for t in [1, 1, 2, 3, 3] {
            g.place_of(t);
        }
        assert!(!g.several_gpus());
        let mut g = RowGroups::default();
        for t in [1, 1, 2] {
            g.place_of(t);
        }
        assert!(!g.several_gpus());
        let mut g = RowGroups::default();
        for t in [1, 2, 3] {
            g.place_of(t);
        }
        assert!(!g.several_gpus());
    }
}
