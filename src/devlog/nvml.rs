//! The NVML JSON-lines file `scripts/vramlens_capture.py` writes (`nvml.jsonl`), read line
//! by line: one object a line with `time_us` (Unix µs), `gpu` (NVML's index), `uuid`,
//! `total_bytes`, `used_bytes`, `free_bytes` and `processes` (`[{pid, used_bytes}]` or
//! null).

use super::{
    DeviceLog, DevlogError, GpuNumbering, GpuSample, Lines, LogBuilder, ProcessSample, Warnings,
    json, line_error,
};
use serde_json::Value;
use std::io::BufRead;

/// Reads the lines from the first content line on (`first` is its number and text).
pub(crate) fn read<R: BufRead>(
    first: (usize, String),
    mut lines: Lines<R>,
    mut log: LogBuilder,
) -> Result<DeviceLog, DevlogError> {
    let mut warnings = Warnings::default();
    let mut pending = Some(first);
    loop {
        let (line, raw) = match pending.take() {
            Some(p) => p,
            None => match lines.next_line()? {
                Some((n, l)) => (n, l.to_string()),
                None => break,
            },
        };
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let value: Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(e) => {
                // A damaged last line (the sampler was killed mid-write) is tolerated.
                if lines.rest_is_blank()? {
                    warnings.add("truncated last line skipped", line);
                    break;
                }
                return Err(line_error(
                    line,
                    format!(
                        "expected a JSON object, found invalid JSON ({})",
                        json::serde_message(&e)
                    ),
                ));
            }
        };
        read_object(line, &value, &mut log, &mut warnings)?;
    }
    Ok(log.finish("nvml", GpuNumbering::DriverIndex, warnings))
}

fn read_object(
    line: usize,
    value: &Value,
    log: &mut LogBuilder,
    warnings: &mut Warnings,
) -> Result<(), DevlogError> {
    let Some(obj) = value.as_object() else {
        return Err(line_error(
            line,
            format!("expected a JSON object, found {}", json::kind(value)),
        ));
    };
    let time_us = match obj.get("time_us") {
        Some(v) => json::as_int(v).ok_or_else(|| {
            line_error(
                line,
                format!("time_us: expected an integer, found {}", json::kind(v)),
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
        Some(v) => Some(json::as_int(v).ok_or_else(|| {
            line_error(
                line,
                format!("gpu: expected an integer, found {}", json::kind(v)),
            )
        })?),
    };
    let uuid = opt_string(obj.get("uuid"), "uuid", line)?.map(|u| log.uuid(u));
    log.push_gpu(GpuSample {
        time_us,
        gpu: gpu.unwrap_or(-1),
        uuid,
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
                        format!(
                            "processes[{k}]: expected an object, found {}",
                            json::kind(p)
                        ),
                    ));
                };
                let pid = match p.get("pid").and_then(json::as_int) {
                    Some(pid) if pid >= 0 => pid as u64,
                    _ => {
                        warnings.add("process without a valid pid skipped", line);
                        continue;
                    }
                };
                log.push_process(ProcessSample {
                    time_us,
                    gpu,
                    gpu_uuid: uuid,
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
                format!(
                    "processes: expected a list or null, found {}",
                    json::kind(v)
                ),
            ));
        }
    }
    Ok(())
}

fn opt_string<'a>(
    v: Option<&'a Value>,
    key: &str,
    line: usize,
) -> Result<Option<&'a str>, DevlogError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(line_error(
            line,
            format!("{key}: expected a string, found {}", json::kind(v)),
        )),
    }
}

fn opt_bytes(v: Option<&Value>, key: &str, line: usize) -> Result<Option<u64>, DevlogError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match json::as_int(v) {
            Some(n) if n >= 0 => super::device_bytes(n as u64, key, line, &v.to_string()).map(Some),
            _ => match v.as_u64() {
                Some(n) => super::device_bytes(n, key, line, &v.to_string()).map(Some),
                None => Err(line_error(
                    line,
                    format!(
                        "{key}: expected a byte count, found {}",
                        json::kind_value(v)
                    ),
                )),
            },
        },
    }
}
