//! Text rendering of [`LogSummary`]: a device log alone, per GPU and per process.

use crate::analysis::reports::device_log::{LogSummary, UseFigures};
use crate::devlog::GpuNumbering;
use crate::render::Style;
use crate::render::summary::row;
use crate::units::{bytes, duration_us, percent, shown, utc_time_to};
use std::io::{self, Write};

/// Processes listed one by one; the rest are counted.
const MAX_PROCESSES_SHOWN: usize = 20;
/// GPUs whose uuids are listed under the table.
const MAX_UUIDS_SHOWN: usize = 16;

/// A uuid in a table cell: its first 12 characters (`GPU-a33ac4bd`), the whole one listed
/// under the table.
fn short_uuid(u: &str) -> String {
    let cut: String = u.chars().take(12).collect();
    if cut.len() < u.len() {
        format!("{}…", shown(&cut))
    } else {
        shown(u).into_owned()
    }
}

/// How the summary writes a time: to the second, or the millisecond when the log has
/// them; without the date when the whole log is one day; without "UTC" when the log's
/// times named no zone (they are its local time).
struct Times {
    unit_us: i64,
    one_day: bool,
    zoneless: bool,
}

impl Times {
    fn of(s: &LogSummary) -> Times {
        let all: Vec<i64> = s
            .gpus
            .iter()
            .filter_map(|g| g.used)
            .chain(s.processes.iter().filter_map(|p| p.used))
            .flat_map(|u| {
                [
                    u.first_time_us,
                    u.last_time_us,
                    u.peak_time_us,
                    u.lowest_time_us,
                ]
            })
            .collect();
        let unit_us = if all.iter().all(|t| t.rem_euclid(1_000_000) == 0) {
            1_000_000
        } else {
            1_000
        };
        let day = |t: i64| t.div_euclid(86_400_000_000);
        let one_day = all.windows(2).all(|w| day(w[0]) == day(w[1]));
        Times {
            unit_us,
            one_day,
            zoneless: s.local_times,
        }
    }

    /// With the date; the zone is said once, in the heading ([`Times::zone`]).
    fn full(&self, t: i64) -> String {
        utc_time_to(t, self.unit_us)
            .trim_end_matches(" UTC")
            .to_string()
    }

    fn zone(&self) -> &'static str {
        if self.zoneless {
            "the log's local time, as written: its timestamps name no zone (--utc-offset turns them into UTC)"
        } else {
            "UTC"
        }
    }

    /// Without the date when the log is one day.
    fn short(&self, t: i64) -> String {
        let full = self.full(t);
        if self.one_day {
            full.split_once(' ')
                .map_or(full.clone(), |(_, rest)| rest.to_string())
        } else {
            full
        }
    }
}

/// Rows of cells, each column as wide as its widest cell, two spaces apart; the first
/// row is the heading.
fn write_table(out: &mut dyn Write, rows: &[Vec<String>]) -> io::Result<()> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|x| x.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let mut line = String::from("  ");
        for (c, cell) in r.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < r.len() {
                let pad = width[c] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// "about one every 1.0 s" from the span and the count of readings.
fn spacing(u: &UseFigures) -> Option<String> {
    let span = u.last_time_us.checked_sub(u.first_time_us)?;
    (u.readings > 1 && span > 0).then(|| {
        let every = span / (u.readings as i64 - 1);
        format!("one per {}", duration_us(every))
    })
}

pub fn write_device_log_text(out: &mut dyn Write, s: &LogSummary, style: Style) -> io::Result<()> {
    let times = Times::of(s);
    let source = match s.source {
        "nvml" => "an NVML log",
        _ => "an nvidia-smi log",
    };
    let all: Vec<&UseFigures> = s
        .gpus
        .iter()
        .filter_map(|g| g.used.as_ref())
        .chain(s.processes.iter().filter_map(|p| p.used.as_ref()))
        .collect();
    let first = all.iter().map(|u| u.first_time_us).min();
    let last = all.iter().map(|u| u.last_time_us).max();
    let of = if s.gpus.is_empty() {
        "processes (no readings of whole GPUs)".to_string()
    } else {
        plural(s.gpus.len() as u64, "GPU", "GPUs")
    };
    writeln!(
        out,
        "{}",
        style.heading(&format!("{}: {source} of {of}", shown(&s.path)))
    )?;
    // Readings of whole GPUs, or of processes in a log of processes only.
    let readings: u64 = if s.gpus.is_empty() {
        s.processes.iter().map(|p| p.rows).sum()
    } else {
        s.gpus.iter().map(|g| g.rows).sum()
    };
    if let (Some(first), Some(last)) = (first, last) {
        row(
            out,
            "readings",
            format!(
                "{readings} from {} to {} ({})",
                times.full(first),
                times.short(last),
                duration_us(last - first)
            ),
        )?;
    } else {
        row(
            out,
            "readings",
            format!("{readings}, none with the memory used"),
        )?;
    }
    if first.is_some() || !s.processes.is_empty() {
        row(out, "times", times.zone())?;
    }
    if s.numbering == GpuNumbering::RowOrder && s.gpus.len() > 1 {
        row(
            out,
            "GPU numbers",
            "by place among the rows that share a timestamp (the log has no index column)",
        )?;
    }
    let mut gpus = vec![vec![
        "GPU".to_string(),
        "memory".into(),
        "peak used".into(),
        "at".into(),
        "mean".into(),
        "lowest".into(),
        "last".into(),
        "readings".into(),
    ]];
    for g in &s.gpus {
        let memory = g.total_bytes.map_or("-".to_string(), bytes);
        let mut line = vec![g.gpu.to_string(), memory];
        match &g.used {
            Some(u) => {
                let of_total = g.total_bytes.map_or(String::new(), |t| {
                    format!(" ({})", percent(u.peak_bytes, t))
                });
                let every = spacing(u).map_or(String::new(), |e| format!(", {e}"));
                line.extend([
                    format!("{}{of_total}", bytes(u.peak_bytes)),
                    times.short(u.peak_time_us),
                    bytes(u.mean_bytes),
                    bytes(u.lowest_bytes),
                    bytes(u.last_bytes),
                    format!("{}{every}", u.readings),
                ]);
            }
            None => line.extend([
                "not in the log".to_string(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                g.rows.to_string(),
            ]),
        }
        gpus.push(line);
    }
    if !s.gpus.is_empty() {
        writeln!(out)?;
        write_table(out, &gpus)?;
    }
    let uuids: Vec<String> = s
        .gpus
        .iter()
        .filter_map(|g| {
            g.uuid
                .as_ref()
                .map(|u| format!("GPU {} is {}", g.gpu, shown(u)))
        })
        .collect();
    if !uuids.is_empty() && s.gpus.len() <= MAX_UUIDS_SHOWN {
        writeln!(out, "  ({})", uuids.join("; "))?;
    }
    if s.gpus.iter().any(|g| g.total_bytes.is_none()) {
        writeln!(
            out,
            "  (memory: the log has no memory.total column, so the share of the GPU is not known)"
        )?;
    }
    if !s.processes.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "{}",
            style.heading("Processes: the memory the driver counts for each, largest peak first")
        )?;
        let mut rows = vec![vec![
            "pid".to_string(),
            "GPU".into(),
            "peak".into(),
            "at".into(),
            "mean".into(),
            "seen from".into(),
            "to".into(),
            "readings".into(),
        ]];
        for p in s.processes.iter().take(MAX_PROCESSES_SHOWN) {
            let on = match (p.gpu, &p.gpu_uuid) {
                (Some(g), _) => g.to_string(),
                (None, Some(u)) => short_uuid(u),
                (None, None) => "-".into(),
            };
            let mut line = vec![p.pid.to_string(), on];
            match &p.used {
                Some(u) => line.extend([
                    bytes(u.peak_bytes),
                    times.short(u.peak_time_us),
                    bytes(u.mean_bytes),
                    times.short(u.first_time_us),
                    times.short(u.last_time_us),
                    u.readings.to_string(),
                ]),
                None => line.extend([
                    "no figure in the log".to_string(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    p.rows.to_string(),
                ]),
            }
            rows.push(line);
        }
        write_table(out, &rows)?;
        let mut named: Vec<&str> = s
            .processes
            .iter()
            .take(MAX_PROCESSES_SHOWN)
            .filter(|p| p.gpu.is_none())
            .filter_map(|p| p.gpu_uuid.as_deref())
            .collect();
        named.sort_unstable();
        named.dedup();
        if !named.is_empty() && named.len() <= MAX_UUIDS_SHOWN {
            let list: Vec<String> = named
                .iter()
                .map(|u| format!("{} is {}", short_uuid(u), shown(u)))
                .collect();
            writeln!(
                out,
                "  (GPU: the log names it by uuid only; {})",
                list.join("; ")
            )?;
        }
        let rest = s.processes.len().saturating_sub(MAX_PROCESSES_SHOWN);
        if rest > 0 {
            writeln!(
                out,
                "  ... and {rest} more processes (all of them in --json)"
            )?;
        }
        if s.process_rows_unsummarized > 0 {
            writeln!(
                out,
                "  {} rows of further processes are not summed up (past the first {} processes)",
                s.process_rows_unsummarized,
                crate::devlog::MAX_PROCESS_STATS
            )?;
        }
    }
    for w in &s.warnings {
        writeln!(out, "{}", style.warn(&format!("warning: {}", shown(w))))?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "A device log measures the whole GPU: every process, with the memory its CUDA context"
    )?;
    writeln!(
        out,
        "and libraries take. To see what PyTorch's allocator held and what lay outside it,"
    )?;
    writeln!(
        out,
        "read the log beside a snapshot of the same run: vramlens reconcile SNAPSHOT --nvml {}",
        shown(&s.path)
    )?;
    Ok(())
}
