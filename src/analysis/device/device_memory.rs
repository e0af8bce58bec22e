//! The device's memory at an OOM, side by side from each source that measured it: the
//! OOM message (CUDA's own figures, printed when the allocation failed) and the device
//! reading nearest the OOM (nvidia-smi or NVML), each against the snapshot's reserved
//! bytes, with the facts that tell why their figures differ. Plain data; the report
//! words it.
//!
//! The two sources count differently, and the ledger keeps the evidence of each
//! difference rather than a guess:
//! - CUDA's total (the message's) leaves out the memory the driver reserves for itself;
//!   a reading's total includes it. The difference of the two totals measures it.
//! - NVML's used figure counts that reserve, nvidia-smi's memory.used does not; the
//!   reading's use before the job's process appeared shows which.
//! - A reading is taken at its own instant, not at the OOM: the allocator's reserved
//!   bytes at the reading's instant are the ones its figures are set against.

use crate::analysis::device::reconcile::{DeviceReconciliation, IdleUse, Moment, OverTime};
use crate::analysis::oom::OomAnalysis;
use crate::devlog::oom_log::OomMessage;
use serde::Serialize;

/// What the OOM message (or `--device-total`) gives, against the snapshot's reserved.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MessageFigures {
    /// The log line of the message, when one was read.
    pub line: Option<usize>,
    /// True when the total came from `--device-total` rather than the message.
    pub total_from_option: bool,
    pub total_bytes: Option<u64>,
    /// total − free: every process's use and the driver's.
    pub in_use_bytes: Option<u64>,
    pub this_process_bytes: Option<u64>,
    /// this process − reserved.
    pub process_outside_allocator_bytes: Option<u64>,
    /// in use − this process.
    pub other_processes_bytes: Option<u64>,
}

/// The device reading nearest the OOM (none after it), against the allocator's reserved
/// bytes at the reading's own instant.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReadingFigures {
    /// `"nvidia-smi"`, `"nvml"` or `"mixed"`.
    pub source: &'static str,
    /// Reading time − OOM time (negative: before).
    pub skew_us: i64,
    pub total_bytes: Option<u64>,
    pub used_bytes: u64,
    pub pid: Option<u64>,
    pub process_bytes: Option<u64>,
    /// The allocator's reserved bytes at the reading's instant.
    pub reserved_then_bytes: i64,
    /// process − reserved then.
    pub process_outside_allocator_bytes: Option<i64>,
    /// used − process.
    pub other_processes_bytes: Option<i64>,
    /// The GPU's use before the job's process appeared in the log.
    pub idle_use: Option<IdleUse>,
}

/// The device's memory at one OOM.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OomLedger {
    pub device: i64,
    pub event: Option<u32>,
    /// The snapshot's reserved bytes at the OOM.
    pub reserved_bytes: u64,
    pub message: Option<MessageFigures>,
    pub reading: Option<ReadingFigures>,
    /// reading total − message total: the driver's reserve, which CUDA's total leaves
    /// out (null unless both totals are known).
    pub totals_differ_bytes: Option<i64>,
}

/// The ledger of an OOM analysis, with the device readings of the same device when
/// there are any; None when neither a message nor a reading measured the device.
pub fn oom_ledger(
    a: &OomAnalysis,
    messages: &[OomMessage],
    readings: Option<(&'static str, &DeviceReconciliation)>,
) -> Option<OomLedger> {
    let message = a.device_total_bytes.map(|total| MessageFigures {
        line: crate::analysis::oom::message_about(messages, a.device).map(|m| m.line),
        total_from_option: a.device_total_source == Some("option"),
        total_bytes: Some(total),
        in_use_bytes: a.device_free_bytes.map(|f| total.saturating_sub(f)),
        this_process_bytes: a.this_process_bytes,
        process_outside_allocator_bytes: a.process_outside_allocator_bytes,
        other_processes_bytes: a.other_processes_bytes,
    });
    let reading = readings.and_then(|(source, d)| {
        let l = d
            .ledgers
            .iter()
            .find(|l| l.moment == Moment::Oom && l.event == a.event)?;
        let used = l.device_used_bytes?;
        let skew = l.sample_skew_us?;
        let reading_time = l.time_us + skew;
        let reserved_then =
            reserved_at(&d.over_time, reading_time).unwrap_or(l.reserved_bytes as i64);
        Some(ReadingFigures {
            source,
            skew_us: skew,
            total_bytes: l.device_total_bytes,
            used_bytes: used,
            pid: l.process_pid,
            process_bytes: l.process_used_bytes,
            reserved_then_bytes: reserved_then,
            process_outside_allocator_bytes: l.process_used_bytes.map(|p| p as i64 - reserved_then),
            other_processes_bytes: l.process_used_bytes.map(|p| used as i64 - p as i64),
            idle_use: d.idle_use,
        })
    });
    if message.is_none() && reading.is_none() {
        return None;
    }
    let totals_differ_bytes = match (
        reading.as_ref().and_then(|r| r.total_bytes),
        message
            .as_ref()
            .filter(|m| !m.total_from_option)
            .and_then(|m| m.total_bytes),
    ) {
        (Some(r), Some(m)) => Some(r as i64 - m as i64),
        _ => None,
    };
    Some(OomLedger {
        device: a.device,
        event: a.event,
        reserved_bytes: a.reserved_bytes,
        message,
        reading,
        totals_differ_bytes,
    })
}

/// The reserved bytes the replay had at a reading's time, when the reading is one of the
/// device's readings over time.
fn reserved_at(over_time: &[OverTime], time_us: i64) -> Option<i64> {
    over_time
        .iter()
        .find(|o| o.time_us == time_us)
        .map(|o| o.reserved_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::oom::{OomReport, analyze_messages};
    use crate::devlog::oom_log::parse_oom_messages;

    const MIB: u64 = 1 << 20;

    fn message_analysis(text: &str) -> OomReport {
        let messages = parse_oom_messages(text);
        analyze_messages(messages, Default::default())
    }

    #[test]
    fn a_message_alone_splits_what_is_outside_the_allocator() {
        // total 10 GiB, free 100 MiB: 10140 MiB in use; this process 10000 MiB, PyTorch
        // reserved 9000 MiB: 1000 MiB of the process outside the allocator, 140 MiB in
        // other processes and the driver.
        let r = message_analysis(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 200.00 MiB. GPU 0 has a total capacity of 10.00 GiB of which 100.00 MiB is free. Including non-PyTorch memory, this process has 9.77 GiB memory in use. Of the allocated memory 8.00 GiB is allocated by PyTorch, and 808.00 MiB is reserved by PyTorch but unallocated.\n",
        );
        let a = &r.analyses[0];
        let l = oom_ledger(a, &r.messages, None).unwrap();
        let m = l.message.unwrap();
        let gib = 1u64 << 30;
        assert_eq!(m.total_bytes, Some(10 * gib));
        assert_eq!(m.in_use_bytes, Some(10 * gib - 100 * MIB));
        let process = (9.77 * gib as f64).round() as u64;
        assert_eq!(m.this_process_bytes, Some(process));
        let reserved = 8 * gib + 808 * MIB;
        assert_eq!(l.reserved_bytes, reserved);
        assert_eq!(m.process_outside_allocator_bytes, Some(process - reserved));
        assert_eq!(
            m.other_processes_bytes,
            Some(10 * gib - 100 * MIB - process)
        );
        assert_eq!(m.line, Some(1));
        assert!(l.reading.is_none());
        assert_eq!(l.totals_differ_bytes, None);
    }
}
