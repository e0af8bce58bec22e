//! The device's view: which device a command looks at (this file), the device's own
//! memory readings at an OOM ([`device_memory`]), PyTorch against nvidia-smi or NVML
//! ([`reconcile`]), a profiler trace lined up with the snapshot ([`align`]) and its
//! events as lanes ([`trace_lanes`]).
//!
//! Which device a command looks at when the user does not say, one rule for every
//! command: the first device with an OOM, else the one whose requested memory peaked
//! highest (ties: the lower index); with the peak of every device, so that each output can
//! name the others and how large they are.

pub mod align;
pub mod device_memory;
pub mod reconcile;
pub mod trace_lanes;

use crate::model::{Action, Snapshot};
use serde::Serialize;

/// Why a device was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceReason {
    /// `--device N`.
    Asked,
    /// The file has one device.
    Only,
    /// The first device with an `oom` event.
    Oom,
    /// The highest peak of requested memory (the final state's, without a timeline).
    LargestPeak,
}

/// The device a command reports on, and the others the file has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceChoice {
    pub device: i64,
    pub reason: DeviceReason,
    /// The file's other devices, ascending.
    pub others: Vec<i64>,
    /// Every device's peak of requested memory (the final state's without a timeline),
    /// ascending by device, when the file has several and none was asked for.
    pub peaks: Vec<(i64, u64)>,
}

impl DeviceChoice {
    /// The peak of a device, when known.
    pub fn peak_of(&self, device: i64) -> Option<u64> {
        self.peaks
            .iter()
            .find(|(d, _)| *d == device)
            .map(|&(_, b)| b)
    }
}

/// The peak of requested memory of a device: its timeline's, else its final state's.
pub fn device_peak(snap: &Snapshot, device: i64) -> u64 {
    let r = crate::timeline::replay::DeviceReplay::new(snap, device);
    let mut peaks = crate::timeline::replay::Peaks::default();
    r.run(&mut peaks);
    if r.has_timeline() {
        peaks.requested.bytes
    } else {
        snap.segments_of(device)
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state.is_active())
            .map(|b| b.requested_size)
            .sum()
    }
}

/// Why no device could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("the file has no device: no segment and no trace entry")]
    NoDevice,
    #[error("device {asked} has no segment and no trace entry in this file; it has {}", list(.devices))]
    Absent { asked: i64, devices: Vec<i64> },
}

fn list(devices: &[i64]) -> String {
    let names: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    match names.len() {
        1 => format!("device {}", names[0]),
        _ => format!("devices {}", names.join(", ")),
    }
}

/// The first device with an `oom` entry.
pub fn oom_device(snap: &Snapshot) -> Option<i64> {
    snap.devices().into_iter().find(|&d| {
        snap.trace(d)
            .is_some_and(|t| (0..t.len()).any(|i| t.action(i) == Action::Oom))
    })
}

/// Checks an asked device or picks one by the module's rule.
pub fn choose_device(snap: &Snapshot, asked: Option<i64>) -> Result<DeviceChoice, DeviceError> {
    use rayon::prelude::*;
    let devices = snap.devices();
    if devices.is_empty() {
        return Err(DeviceError::NoDevice);
    }
    let mut peaks = Vec::new();
    let (device, reason) = match asked {
        Some(d) if devices.contains(&d) => (d, DeviceReason::Asked),
        Some(asked) => return Err(DeviceError::Absent { asked, devices }),
        None if devices.len() == 1 => (devices[0], DeviceReason::Only),
        None => {
            peaks = devices
                .par_iter()
                .map(|&d| (d, device_peak(snap, d)))
                .collect();
            match oom_device(snap) {
                Some(d) => (d, DeviceReason::Oom),
                None => {
                    let &(d, _) = peaks
                        .iter()
                        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
                        .expect("non-empty");
                    (d, DeviceReason::LargestPeak)
                }
            }
        }
    };
    Ok(DeviceChoice {
        device,
        reason,
        others: devices.into_iter().filter(|&d| d != device).collect(),
        peaks,
    })
}

/// Checks a device filter for commands that report every device (`summary`, `oom`).
pub fn check_device(snap: &Snapshot, asked: Option<i64>) -> Result<(), DeviceError> {
    match asked {
        Some(d) if !snap.devices().contains(&d) => Err(DeviceError::Absent {
            asked: d,
            devices: snap.devices(),
        }),
        _ => Ok(()),
    }
}
