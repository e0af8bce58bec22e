//! `torch.profiler`'s `export_memory_timeline` output (spec 8.1), in its three forms:
//!
//! - `*.raw.json.gz`: `[[timestamp_ns, action, numbytes, category], ...]`, one row per
//!   change of a tensor's storage (action 1 pre-existing, 2 create, 3 new version, 4
//!   destroy; bytes negative when memory goes); pre-existing rows carry -1 and are placed
//!   at the smallest time, as PyTorch's own JSON export places them.
//! - `*.json`: `[times, sizes]`, the bytes of each category after each time (the first of
//!   each row's 9 numbers is unused); times in ns (2.1) or µs (2.2 and later).
//! - `*.html`: a picture of the plot with no data in it, named as such.
//!
//! The rows are read by [`super::kineto`]'s streaming reader (both are JSON lists); here
//! they become [`MemoryEvent`]s with PyTorch's category, so that bytes can be grouped the
//! way the profiler sorted them. Rows name no device and no address.

use super::DevlogError;
use super::json::Num;
use super::json::OtherKind;
use super::profile::{Category, MemoryEvent, ProfileKind, ProfileTrace, TRACE_KIND, TraceClock};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// Rows as they stream in; the second element tells the two JSON forms apart.
#[derive(Default)]
pub(crate) struct Rows {
    /// The first element, while it may still be the `times` list of the category form.
    first: Option<Vec<Num>>,
    /// (timestamp_ns or -1, action, bytes, category index) of the raw form.
    raw: Vec<(i64, u8, i64, u8)>,
    /// The category form's `times` and `sizes`.
    categories: Option<(Vec<Num>, Vec<Vec<Num>>)>,
}

const ROW_SHAPE: &str = "memory-timeline raw rows [timestamp_ns, action, numbytes, category]";

fn found(items: &[RowItem]) -> String {
    if items.iter().any(|i| matches!(i, RowItem::List(_))) {
        format!("a list of {} items holding lists", items.len())
    } else {
        format!("a list of {} numbers", items.len())
    }
}

impl Rows {
    pub(crate) fn push(&mut self, index: usize, items: Vec<RowItem>) -> Result<(), DevlogError> {
        if self.categories.is_some() {
            return Err(DevlogError::Json {
                path: format!("[{index}]"),
                message: "expected [times, sizes] (two lists), found a third element".into(),
            });
        }
        let all_numbers = items.iter().all(|i| matches!(i, RowItem::Num(_)));
        let all_lists = !items.is_empty() && items.iter().all(|i| matches!(i, RowItem::List(_)));
        if index == 0 && all_numbers {
            self.first = Some(nums(items));
            return Ok(());
        }
        if index == 1 && all_lists && self.first.is_some() {
            let times = self.first.take().unwrap_or_default();
            let sizes = items
                .into_iter()
                .map(|i| match i {
                    RowItem::List(l) => l,
                    RowItem::Num(n) => vec![n],
                })
                .collect();
            self.categories = Some((times, sizes));
            return Ok(());
        }
        if let Some(first) = self.first.take() {
            let row = first.into_iter().map(RowItem::Num).collect::<Vec<_>>();
            self.raw_row(0, &row)?;
        }
        self.raw_row(index, &items)
    }

    fn raw_row(&mut self, index: usize, items: &[RowItem]) -> Result<(), DevlogError> {
        if items.len() != 4 || !items.iter().all(|i| matches!(i, RowItem::Num(_))) {
            return Err(DevlogError::Json {
                path: format!("[{index}]"),
                message: format!(
                    "expected {TRACE_KIND} or {ROW_SHAPE}, found {}",
                    found(items)
                ),
            });
        }
        let int = |k: usize, what: &str| -> Result<i64, DevlogError> {
            let RowItem::Num(n) = items[k] else {
                unreachable!("checked above")
            };
            n.int().ok_or_else(|| DevlogError::Json {
                path: format!("[{index}][{k}]"),
                message: format!("{what}: expected an integer, found {}", n.describe()),
            })
        };
        let ts = int(0, "timestamp_ns")?;
        let action = int(1, "action")?;
        let bytes = int(2, "numbytes")?;
        let category = int(3, "category")?;
        if !(1..=4).contains(&action) {
            return Err(DevlogError::Json {
                path: format!("[{index}][1]"),
                message: format!("action: expected 1 to 4, found {action}"),
            });
        }
        if Category::from_index(category).is_none() {
            return Err(DevlogError::Json {
                path: format!("[{index}][3]"),
                message: format!("category: expected 0 to 7, found {category}"),
            });
        }
        self.raw.push((ts, action as u8, bytes, category as u8));
        Ok(())
    }
}

fn nums(items: Vec<RowItem>) -> Vec<Num> {
    items
        .into_iter()
        .filter_map(|i| match i {
            RowItem::Num(n) => Some(n),
            RowItem::List(_) => None,
        })
        .collect()
}

/// Unix ns from 1973 on: anything smaller is not a Unix time.
const UNIX_NS: i64 = 100_000_000_000_000_000;

pub(crate) fn finish(mut rows: Rows, events_read: u64) -> Result<ProfileTrace, DevlogError> {
    if let Some((times, sizes)) = rows.categories.take() {
        return categories(times, sizes, events_read);
    }
    if let Some(first) = rows.first.take() {
        let row = first.into_iter().map(RowItem::Num).collect::<Vec<_>>();
        rows.raw_row(0, &row)?;
    }
    let min_ts = rows
        .raw
        .iter()
        .map(|r| r.0)
        .filter(|&t| t >= 0)
        .min()
        .unwrap_or(0);
    let memory: Vec<MemoryEvent> = rows
        .raw
        .iter()
        .map(|&(ts, _action, bytes, category)| MemoryEvent {
            time_ns: if ts >= 0 { ts } else { min_ts },
            device_type: -1,
            device_id: -1,
            bytes,
            total_allocated: None,
            total_reserved: None,
            addr: None,
            thread: None,
            category: Category::from_index(i64::from(category)),
        })
        .collect();
    let mut memory = memory;
    memory.sort_by_key(|m| m.time_ns);
    Ok(ProfileTrace {
        kind: ProfileKind::MemoryTimelineRaw,
        clock: if min_ts >= UNIX_NS {
            TraceClock::Unix
        } else {
            TraceClock::Unknown
        },
        base_time_ns: None,
        memory,
        spans: Vec::new(),
        names: Vec::new(),
        threads: Vec::new(),
        out_of_memory_events: 0,
        skipped_elements: 0,
        events_read,
    })
}

/// Synthetic address of a category's memory in the category form: one block per category,
/// replaced whenever its total changes.
pub fn category_address(c: Category) -> u64 {
    0x0c47_0000_0000_0000 + ((c as u64) << 40)
}

fn categories(
    times: Vec<Num>,
    sizes: Vec<Vec<Num>>,
    events_read: u64,
) -> Result<ProfileTrace, DevlogError> {
    if times.len() != sizes.len() {
        return Err(DevlogError::Json {
            path: "(top level)".into(),
            message: format!(
                "expected [times, sizes] of the same length, found {} times and {} rows of sizes",
                times.len(),
                sizes.len()
            ),
        });
    }
    // 2.1 wrote ns, later releases µs.
    let max_time = times.iter().filter_map(|t| t.float()).fold(0.0, f64::max);
    let scale: i64 = if max_time >= UNIX_NS as f64 { 1 } else { 1000 };
    let mut current = [0i64; 8];
    let mut memory = Vec::new();
    for (i, (t, row)) in times.iter().zip(&sizes).enumerate() {
        // Integers exactly; floats (2.1 wrote them) to the nearest ns.
        let time = match t.int() {
            Some(v) => v.checked_mul(scale),
            None => t
                .float()
                .map(|f| (f * scale as f64).round())
                .filter(|f| f.is_finite() && f.abs() < 9.2e18)
                .map(|f| f as i64),
        }
        .ok_or_else(|| DevlogError::Json {
            path: format!("[0][{i}]"),
            message: format!("expected a time, found {}", t.describe()),
        })?;
        let offset = match row.len() {
            9 => 1,
            8 => 0,
            n => {
                return Err(DevlogError::Json {
                    path: format!("[1][{i}]"),
                    message: format!("expected 9 numbers (bytes per category), found {n}"),
                });
            }
        };
        // The row's new totals; all the old blocks of changed categories go first, so no
        // moment between two rows holds more than either row.
        let mut changed: Vec<(usize, i64)> = Vec::new();
        for (c, slot) in current.iter().enumerate() {
            let v = row[c + offset];
            let bytes = v
                .float()
                .map(f64::round)
                .filter(|f| f.is_finite() && *f >= 0.0 && *f < 9.2e18)
                .ok_or_else(|| DevlogError::Json {
                    path: format!("[1][{i}][{}]", c + offset),
                    message: format!("expected a byte count, found {}", v.describe()),
                })? as i64;
            if bytes != *slot {
                changed.push((c, bytes));
            }
        }
        let event = |c: usize, bytes: i64| {
            let category = Category::ALL[c];
            MemoryEvent {
                time_ns: time,
                device_type: -1,
                device_id: -1,
                bytes,
                total_allocated: None,
                total_reserved: None,
                addr: Some(category_address(category)),
                thread: None,
                category: Some(category),
            }
        };
        for &(c, _) in &changed {
            if current[c] > 0 {
                memory.push(event(c, -current[c]));
            }
        }
        for &(c, bytes) in &changed {
            if bytes > 0 {
                memory.push(event(c, bytes));
            }
            current[c] = bytes;
        }
    }
    memory.sort_by_key(|m| m.time_ns);
    let first = memory.first().map_or(0, |m| m.time_ns);
    Ok(ProfileTrace {
        kind: ProfileKind::MemoryTimelineCategories,
        clock: if first >= UNIX_NS {
            TraceClock::Unix
        } else {
            TraceClock::Unknown
        },
        base_time_ns: None,
        memory,
        spans: Vec::new(),
        names: Vec::new(),
        threads: Vec::new(),
        out_of_memory_events: 0,
        skipped_elements: 0,
        events_read,
    })
}

/// What an HTML file is, from its first bytes, for the error that refuses it.
pub(crate) fn html_message(head: &[u8]) -> String {
    let text = String::from_utf8_lossy(&head[..head.len().min(4096)]);
    if text.contains("GPU Memory Timeline HTML") || text.contains("data:image/png;base64") {
        "this is the HTML form of export_memory_timeline: a picture of the plot, with no data in it; export to a name ending in .raw.json.gz (the raw events) or .json (bytes per category) for vramlens to read".to_string()
    } else {
        format!(
            "this is an HTML page, not {TRACE_KIND}; a torch.cuda._memory_viz page is read as a snapshot"
        )
    }
}

/// An item of a memory-timeline row: a number, or (in the category form) a list of them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RowItem {
    Num(Num),
    List(Vec<Num>),
}

impl<'de> de::Deserialize<'de> for RowItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RowItem, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RowItem;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number or a list of numbers")
            }
            fn visit_i64<E>(self, v: i64) -> Result<RowItem, E> {
                Ok(RowItem::Num(Num::Int(v)))
            }
            fn visit_u64<E>(self, v: u64) -> Result<RowItem, E> {
                Ok(RowItem::Num(i64::try_from(v).map_or(Num::Big(v), Num::Int)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<RowItem, E> {
                Ok(RowItem::Num(Num::Float(v)))
            }
            fn visit_str<E>(self, _: &str) -> Result<RowItem, E> {
                Ok(RowItem::Num(Num::Other(OtherKind::String)))
            }
            fn visit_bool<E>(self, v: bool) -> Result<RowItem, E> {
                Ok(RowItem::Num(Num::Other(OtherKind::Bool(v))))
            }
            fn visit_unit<E>(self) -> Result<RowItem, E> {
                Ok(RowItem::Num(Num::Null))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RowItem, A::Error> {
                let mut v = Vec::new();
                while let Some(n) = seq.next_element::<Num>()? {
                    v.push(n);
                }
                Ok(RowItem::List(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RowItem, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(RowItem::Num(Num::Other(OtherKind::Object)))
            }
        }
        d.deserialize_any(V)
    }
}
