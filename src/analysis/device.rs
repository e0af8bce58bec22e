//! Which device a command looks at when the user does not say: the one the question is
//! about (the one with an OOM, for OOM questions), else the one with the most activity.

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
    /// The longest trace (then the most reserved memory).
    MostActivity,
}

/// The device a command reports on, and the others the file has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceChoice {
    pub device: i64,
    pub reason: DeviceReason,
    /// The file's other devices, ascending.
    pub others: Vec<i64>,
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

/// Checks an asked device or picks one (`prefer_oom`: the device with an OOM first).
pub fn choose_device(
    snap: &Snapshot,
    asked: Option<i64>,
    prefer_oom: bool,
) -> Result<DeviceChoice, DeviceError> {
    let devices = snap.devices();
    if devices.is_empty() {
        return Err(DeviceError::NoDevice);
    }
    let (device, reason) = match asked {
        Some(d) if devices.contains(&d) => (d, DeviceReason::Asked),
        Some(asked) => return Err(DeviceError::Absent { asked, devices }),
        None if devices.len() == 1 => (devices[0], DeviceReason::Only),
        None => match oom_device(snap).filter(|_| prefer_oom) {
            Some(d) => (d, DeviceReason::Oom),
            None => {
                let activity = |d: i64| {
                    let events = snap.trace(d).map_or(0, |t| t.len());
                    let reserved: u64 = snap.segments_of(d).map(|s| s.total_size).sum();
                    (events, reserved, std::cmp::Reverse(d))
                };
                let d = *devices
                    .iter()
                    .max_by_key(|&&d| activity(d))
                    .expect("non-empty");
                (d, DeviceReason::MostActivity)
            }
        },
    };
    Ok(DeviceChoice {
        device,
        reason,
        others: devices.into_iter().filter(|&d| d != device).collect(),
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
