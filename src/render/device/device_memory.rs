//! Words for the device's memory at an OOM ([`crate::analysis::device::device_memory`]): a table
//! with a column per source and the reasons their figures differ, for the report.

use crate::analysis::device::device_memory::OomLedger;
use crate::render::device::reconcile::offset_words;
use crate::units::{bytes, bytes_fine};

/// The ledger as a table: the column heads (after the row labels' column), the rows
/// (label, one cell per column), and the reasons the columns differ.
pub struct LedgerTable {
    pub heads: Vec<String>,
    pub rows: Vec<(&'static str, Vec<String>)>,
    pub reasons: Vec<String>,
}

/// Below this, two figures are the same for the reader.
const MIB: i64 = 1 << 20;

fn signed(n: i64) -> String {
    if n < 0 {
        format!("-{}", bytes_fine(n.unsigned_abs()))
    } else {
        bytes_fine(n as u64)
    }
}

pub fn ledger_table(l: &OomLedger) -> LedgerTable {
    let unknown = || "unknown".to_string();
    let opt = |v: Option<u64>| v.map_or_else(unknown, bytes_fine);
    let opt_signed = |v: Option<i64>| v.map_or_else(unknown, signed);
    let mut heads = Vec::new();
    let mut rows: Vec<(&'static str, Vec<String>)> = vec![
        ("device total", Vec::new()),
        (
            "in use on the device (every process, the driver)",
            Vec::new(),
        ),
        ("this process", Vec::new()),
        ("PyTorch reserved (the snapshot)", Vec::new()),
        (
            "this process outside the allocator (CUDA context, libraries)",
            Vec::new(),
        ),
        (
            "other processes (and the driver, where counted)",
            Vec::new(),
        ),
    ];
    let mut push = |cells: [String; 6]| {
        for (row, cell) in rows.iter_mut().zip(cells) {
            row.1.push(cell);
        }
    };
    let mut reasons = Vec::new();
    if let Some(m) = &l.message {
        heads.push(match (m.total_from_option, m.line) {
            (true, _) => "--device-total and the OOM event".to_string(),
            (false, Some(line)) => format!("OOM message (log line {line})"),
            (false, None) => "OOM message".to_string(),
        });
        push([
            opt(m.total_bytes),
            opt(m.in_use_bytes),
            opt(m.this_process_bytes),
            bytes_fine(l.reserved_bytes),
            opt(m.process_outside_allocator_bytes),
            opt(m.other_processes_bytes),
        ]);
    }
    if let Some(r) = &l.reading {
        let when = match offset_words(r.skew_us) {
            None => "at the OOM".to_string(),
            Some(w) => format!("{w} the OOM"),
        };
        heads.push(format!("{} reading, {when}", r.source));
        push([
            opt(r.total_bytes),
            bytes_fine(r.used_bytes),
            match (r.process_bytes, r.pid) {
                (Some(p), Some(pid)) => format!("{} (pid {pid})", bytes_fine(p)),
                (p, _) => opt(p),
            },
            signed(r.reserved_then_bytes),
            opt_signed(r.process_outside_allocator_bytes),
            opt_signed(r.other_processes_bytes),
        ]);
    }
    if let Some(d) = l.totals_differ_bytes.filter(|d| d.abs() >= MIB) {
        reasons.push(if d > 0 {
            format!(
                "The reading's total is {} more than the message's: memory the driver reserves for itself, which CUDA's total (the message's) leaves out.",
                bytes(d as u64)
            )
        } else {
            format!(
                "The reading's total is {} less than the message's: the two are of different GPUs, or the driver's accounting changed.",
                bytes(d.unsigned_abs())
            )
        });
    }
    if let Some(r) = &l.reading {
        match (r.source, r.idle_use) {
            ("nvml", Some(idle)) if idle.used_bytes >= MIB as u64 => reasons.push(format!(
                "NVML's used figure counts the driver's reserve: before this job's process appeared the GPU already had {} in use (the lowest of {} readings), so the reading's \"other processes and the driver\" holds it; the message's figure, like nvidia-smi's memory.used, does not.",
                bytes(idle.used_bytes),
                idle.readings
            )),
            ("nvml", _) => reasons.push(
                "NVML's used figure counts the memory the driver reserves for itself; the message's figure, like nvidia-smi's memory.used, does not.".into(),
            ),
            ("nvidia-smi", _) => reasons.push(
                "nvidia-smi's memory.used leaves out the memory the driver reserves for itself, as the message's figures do.".into(),
            ),
            _ => {}
        }
        if let Some(w) = offset_words(r.skew_us) {
            reasons.push(format!(
                "The reading was taken {w} the OOM, when PyTorch had {} reserved: its figures are those of that instant, not of the OOM.",
                signed(r.reserved_then_bytes)
            ));
        }
    }
    if l.message.as_ref().is_some_and(|m| !m.total_from_option) {
        reasons.push(
            "The message prints its figures in GiB with two decimals: each is within 5 MiB of the true value.".into(),
        );
    }
    LedgerTable {
        heads,
        rows,
        reasons,
    }
}
