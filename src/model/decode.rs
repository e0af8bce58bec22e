//! Values to [`Snapshot`]: key by key, tolerant of version differences, strict on types.
//!
//! [`SnapshotBuilder`] plugs into the pickle reader so that trace entries are decoded into
//! compact events while the file is read and never exist as a value tree.

#[path = "trace_entries.rs"]
mod trace_entries;

use super::frames::{FrameId, FxMap};
use super::round_trip::{BlockHistory, HistoryRecord};
use super::trace::{NewEvent, UNKNOWN_FREE};
use super::*;
use crate::pickle::{self, ListId, SharedKey, Value};
use std::rc::Rc;

/// A field that does not hold what a snapshot needs there.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct DecodeError {
    /// Key path such as `device_traces[0][17].size` (empty for the root).
    pub path: String,
    pub message: String,
}

impl DecodeError {
    fn new(message: impl Into<String>) -> Self {
        DecodeError {
            path: String::new(),
            message: message.into(),
        }
    }

    /// Prefixes the path with the place of the enclosing value.
    fn under(mut self, prefix: &str) -> Self {
        self.path = format!("{prefix}{}", self.path);
        self
    }

    fn root(self) -> Self {
        if self.path.is_empty() {
            DecodeError {
                path: "(root)".into(),
                ..self
            }
        } else {
            self
        }
    }
}

/// Short description of a value for "found ..." messages.
/// The first object of a file `torch.save` wrote in its legacy format
/// (`torch/serialization.py`'s `MAGIC_NUMBER`).
const TORCH_SAVE_LEGACY_MAGIC: i128 = 0x1950a86a20f9469cfc6c;

fn describe(v: &Value) -> String {
    match v {
        Value::Str(s) => {
            let shown: String = s.chars().take(40).collect();
            format!("str {shown:?}")
        }
        Value::Int(i) => format!("int {i}"),
        Value::BigInt(_) => match v.as_i128() {
            Some(i) => format!("int {i}"),
            None => "int (more than 128 bits)".into(),
        },
        // A JSON integer past u64 arrives as a float: say the number, not a kind it may
        // not have been written as.
        Value::Float(f) if f.fract() == 0.0 && f.abs() >= 9.2e18 => {
            format!("{f}, a number past the 64-bit integers")
        }
        Value::Float(f) => format!("float {f}"),
        Value::Bool(b) => format!("bool {}", if *b { "True" } else { "False" }),
        Value::None => "None".into(),
        Value::List(l) => format!("list of {} items", l.len()),
        Value::Absorbed { len, .. } => format!("list of {len} items"),
        Value::Dict(d) => format!("dict of {} keys", d.len()),
        other => other.type_name().into(),
    }
}

fn expected(what: &str, v: &Value) -> DecodeError {
    DecodeError::new(format!("expected {what}, found {}", describe(v)))
}

fn field(key: &str) -> String {
    format!(".{key}")
}

/// Sizes are bytes of device memory: below 2^63 (8 EiB), so that sums and differences
/// of them stay exact in the analyses.
const MAX_SIZE: u64 = i64::MAX as u64;

fn as_size(v: &Value) -> Result<u64, DecodeError> {
    match v.as_u64() {
        Some(u) if u <= MAX_SIZE => Ok(u),
        Some(_) => Err(expected("a size below 2^63 bytes", v)),
        None => Err(expected("a non-negative int", v)),
    }
}

/// Times are Unix microseconds (or microseconds from the start of a recording):
/// within 2^53 us (285 years) of 1970. Beyond that a time is not a time.
const MAX_TIME_US: i64 = 1 << 53;

/// A name from the file as a warning keeps it: at most 60 characters (then `...`), so
/// a file of long unknown keys cannot make the warnings large.
fn shown(name: &str) -> String {
    let mut out: String = name.chars().take(60).collect();
    if out.len() < name.len() {
        out.push_str("...");
    }
    out
}

/// Model bytes a decoded snapshot may take: this much, plus twice the content size.
/// Values shared through the pickle memo are decoded once per reference, so a small
/// file could otherwise expand without bound; a real snapshot's model is a fraction of
/// its file.
pub const MODEL_BUDGET_FLOOR: u64 = 64 << 20;

/// Per device (and for the host), the sum of all sizes read so far; it must stay below
/// 2^63 so that every total the analyses form is exact.
#[derive(Default)]
struct SizeTotals(BTreeMap<i64, u64>);

/// The key of the host's sizes in [`SizeTotals`].
const HOST: i64 = i64::MIN;

impl SizeTotals {
    fn add(&mut self, device: i64, size: u64) -> Result<(), DecodeError> {
        let t = self.0.entry(device).or_insert(0);
        match t.checked_add(size).filter(|&s| s <= MAX_SIZE) {
            Some(s) => {
                *t = s;
                Ok(())
            }
            None => Err(DecodeError::new(format!(
                "sizes on {} add up to more than 2^63 bytes (8 EiB); expected the sizes of one device's memory",
                if device == HOST {
                    "the host".to_string()
                } else {
                    format!("device {device}")
                }
            ))),
        }
    }
}

/// Integers written through C++ `int64` may be negative reinterpretations of pointers.
fn as_u64_wrapping(v: &Value) -> Result<u64, DecodeError> {
    if let Some(u) = v.as_u64() {
        return Ok(u);
    }
    v.as_i64()
        .map(|i| i as u64)
        .ok_or_else(|| expected("an int", v))
}

fn as_i64(v: &Value) -> Result<i64, DecodeError> {
    v.as_i64().ok_or_else(|| expected("an int", v))
}

fn as_str(v: &Value) -> Result<&str, DecodeError> {
    v.as_str().ok_or_else(|| expected("a str", v))
}

fn as_pool(v: &Value) -> Result<(i64, i64), DecodeError> {
    match v.as_seq() {
        Some([a, b]) => Ok((as_i64(a)?, as_i64(b)?)),
        _ => Err(expected("a pair of ints", v)),
    }
}

fn as_dict(v: &Value, what: &str) -> Result<Rc<Vec<(Value, Value)>>, DecodeError> {
    match v {
        Value::Dict(d) => Ok(d.clone()),
        _ => Err(expected(what, v)),
    }
}

/// Converts a value to JSON (for allocator settings and other free-form data), spending
/// budget for every value made (a value shared through the memo is copied per reference).
fn to_json(
    v: &Value,
    spend: &mut dyn FnMut(u64) -> Result<(), DecodeError>,
) -> Result<serde_json::Value, DecodeError> {
    use serde_json::Value as J;
    // A JSON value with its share of the containers holding it.
    spend(64)?;
    Ok(match v {
        Value::None | Value::Absorbed { .. } | Value::Handle(_) => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::BigInt(_) => match (v.as_u64(), v.as_i128()) {
            (Some(u), _) => J::from(u),
            (None, Some(i)) => J::String(i.to_string()),
            _ => J::String("(integer out of range)".into()),
        },
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Value::Str(s) => {
            spend(s.len() as u64)?;
            J::String(s.to_string())
        }
        Value::Bytes(b) => {
            spend(2 * b.len() as u64)?;
            J::String(b.iter().map(|x| format!("{x:02x}")).collect())
        }
        Value::List(l) | Value::Tuple(l) | Value::Set(l) => J::Array(
            l.iter()
                .map(|x| to_json(x, spend))
                .collect::<Result<_, _>>()?,
        ),
        Value::Dict(d) => {
            let mut map = serde_json::Map::new();
            for (k, v) in d.iter() {
                let key = match k {
                    Value::Str(s) => {
                        spend(s.len() as u64)?;
                        s.to_string()
                    }
                    other => to_json(other, spend)?.to_string(),
                };
                map.insert(key, to_json(v, spend)?);
            }
            J::Object(map)
        }
    })
}

/// Most device traces a snapshot may list (CUDA device ordinals are small).
pub const MAX_DEVICES: usize = 1 << 16;

/// Decoding state shared by all parts: interning tables, caches and warnings.
struct Decoder {
    frames: FrameTable,
    /// Frame dicts read back from the memo: (stamp, frame) by memo slot.
    frame_cache: Vec<(u64, FrameId)>,
    /// Frames lists that failed to decode while being read, with the error.
    frame_errors: FxMap<ListId, DecodeError>,
    scratch: Vec<FrameId>,
    warnings: Warnings,
    features: Features,
    /// Long strings already interned, by the address of their shared buffer (which the
    /// entry keeps alive): a string referenced from many places is hashed once.
    long_strings: FxMap<usize, (Rc<str>, StrId)>,
    /// Frames lists shared through the memo (not taken over while reading), decoded once.
    list_cache: FxMap<usize, SharedList>,
    /// Model bytes decoded so far, and the most allowed (see [`MODEL_BUDGET_FLOOR`]).
    spent: u64,
    budget: u64,
    sizes: SizeTotals,
    extras: Extras,
    /// The segment being decoded: (in host_segments, index), for placing extras.
    at_segment: (bool, u32),
    /// The annotation being decoded (its place in its list), for placing extras.
    at_annotation: u32,
}

/// A frames list shared through the memo (kept alive by the entry) and what it decoded to.
type SharedList = (Rc<Vec<Value>>, Result<StackId, DecodeError>);

/// Strings at least this long are interned by identity first.
const LONG_STRING: usize = 64;

impl Decoder {
    fn new() -> Self {
        Decoder {
            frames: FrameTable::new(),
            frame_cache: Vec::new(),
            frame_errors: FxMap::default(),
            scratch: Vec::new(),
            warnings: Warnings::default(),
            features: Features::default(),
            long_strings: FxMap::default(),
            list_cache: FxMap::default(),
            spent: 0,
            budget: MODEL_BUDGET_FLOOR,
            sizes: SizeTotals::default(),
            extras: Extras::default(),
            at_segment: (false, 0),
            at_annotation: 0,
        }
    }

    /// Sets the budget from the content size (bytes read so far, or the whole file).
    fn set_content_bytes(&mut self, bytes: u64) {
        self.budget = self
            .budget
            .max(MODEL_BUDGET_FLOOR.saturating_add(bytes.saturating_mul(2)));
    }

    /// Counts model bytes about to be decoded; refuses a file that expands beyond the
    /// budget through shared references.
    fn spend(&mut self, bytes: u64) -> Result<(), DecodeError> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > self.budget {
            return Err(DecodeError::new(format!(
                "the decoded snapshot would exceed {} MiB ({} MiB plus twice the file's size): a value shared through the pickle memo is expanded once per reference; refusing a memory bomb",
                self.budget >> 20,
                MODEL_BUDGET_FLOOR >> 20
            )));
        }
        Ok(())
    }

    /// A `time_us` value: None (with a warning) when it is beyond any real time.
    fn time_us(&mut self, v: &Value) -> Result<Option<i64>, DecodeError> {
        if !matches!(v, Value::Int(_) | Value::BigInt(_) | Value::Bool(_)) {
            return Err(expected("an int", v));
        }
        match v
            .as_i64()
            .filter(|t| t.unsigned_abs() <= MAX_TIME_US as u64)
        {
            Some(t) => Ok(Some(t)),
            None => {
                self.warnings.add(Warning::TimeOutOfRange);
                Ok(None)
            }
        }
    }

    /// Interns a string value; long ones by the identity of their shared buffer.
    fn intern(&mut self, v: &Value) -> Result<StrId, DecodeError> {
        let Value::Str(rc) = v else {
            return Err(expected("a str", v));
        };
        if rc.len() < LONG_STRING {
            return Ok(self.frames.intern_str(rc));
        }
        let key = rc.as_ptr() as usize;
        if let Some((_, id)) = self.long_strings.get(&key) {
            return Ok(*id);
        }
        self.spend(rc.len() as u64)?;
        let id = self.frames.intern_str(rc);
        self.long_strings.insert(key, (rc.clone(), id));
        Ok(id)
    }

    fn frame(&mut self, v: &Value) -> Result<FrameId, DecodeError> {
        let Value::Dict(d) = v else {
            return Err(expected("a frame dict", v));
        };
        let (mut filename, mut name, mut line) = (None, None, None);
        for (k, val) in d.iter() {
            match k.as_str() {
                Some("filename") => filename = Some(val),
                Some("name") => name = Some(val),
                // -1 ("unknown") is sometimes written as 2^64 - 1: keep it as -1.
                Some("line") => {
                    line = Some(as_u64_wrapping(val).map_err(|e| e.under(".line"))? as i64)
                }
                _ => {} // FX keys (2.10+ augment_with_fx_traces) and others are not used.
            }
        }
        if filename.is_none() || name.is_none() || line.is_none() {
            self.warnings.add(Warning::FrameIncomplete);
        }
        // Filename first, then name: string ids follow this order.
        let empty = self.frames.intern_str("");
        let filename = match filename {
            Some(f) => self.intern(f).map_err(|e| e.under(".filename"))?,
            None => empty,
        };
        let name = match name {
            Some(n) => self.intern(n).map_err(|e| e.under(".name"))?,
            None => empty,
        };
        Ok(self.frames.intern_frame(Frame {
            filename,
            name,
            line: line.unwrap_or(0),
        }))
    }

    /// Whether [`Decoder::frame`] would decode this value without an error (it does not
    /// intern): the most budget interning it may spend, or None.
    fn frame_checks(&self, v: &Value) -> Option<u64> {
        let Value::Dict(d) = v else {
            return None;
        };
        let mut spend = 0;
        for (k, val) in d.iter() {
            match k.as_str() {
                Some("filename" | "name") => match val {
                    Value::Str(s) => spend += s.len() as u64,
                    _ => return None,
                },
                Some("line") => {
                    as_u64_wrapping(val).ok()?;
                }
                _ => {}
            }
        }
        Some(spend)
    }

    /// A frame dict read back from the memo: decoded once per stored value.
    fn shared_frame(&mut self, key: SharedKey, v: &Value) -> Result<FrameId, DecodeError> {
        let slot = key.slot as usize;
        if let Some(&(stamp, id)) = self.frame_cache.get(slot)
            && stamp == key.stamp
        {
            return Ok(id);
        }
        let id = self.frame(v)?;
        if slot >= self.frame_cache.len() {
            self.frame_cache.resize(slot + 1, (0, FrameId(0)));
        }
        self.frame_cache[slot] = (key.stamp, id);
        Ok(id)
    }

    fn stack(&mut self, v: &Value) -> Result<StackId, DecodeError> {
        let list = match v {
            // A frames list the builder took over while reading.
            Value::Handle(id) => return Ok(StackId(*id as u32)),
            Value::Absorbed { list, .. } => {
                return Err(self
                    .frame_errors
                    .get(list)
                    .cloned()
                    .unwrap_or_else(|| expected("a list of frames", v)));
            }
            Value::List(list) | Value::Tuple(list) => list,
            _ => return Err(expected("a list of frames", v)),
        };
        // A list shared through the memo is decoded once (the entry keeps it alive, so
        // its address stays its own).
        let shared = Rc::strong_count(list) > 1;
        let key = Rc::as_ptr(list) as usize;
        if shared && let Some((_, r)) = self.list_cache.get(&key) {
            return r.clone();
        }
        let r = self.decode_stack(list);
        if shared {
            self.list_cache.insert(key, (list.clone(), r.clone()));
        }
        r
    }

    fn decode_stack(&mut self, list: &[Value]) -> Result<StackId, DecodeError> {
        self.spend(4 * list.len() as u64)?;
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        for (i, f) in list.iter().enumerate() {
            match self.frame(f) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    self.scratch = ids;
                    return Err(e.under(&format!("[{i}]")));
                }
            }
        }
        let id = self.frames.intern_stack(&ids);
        self.scratch = ids;
        Ok(id)
    }

    fn str_list(&mut self, v: &Value) -> Result<Vec<StrId>, DecodeError> {
        let items = v.as_seq().ok_or_else(|| expected("a list of str", v))?;
        self.spend(4 * items.len() as u64)?;
        items
            .iter()
            .enumerate()
            .map(|(i, s)| self.intern(s).map_err(|e| e.under(&format!("[{i}]"))))
            .collect()
    }

    /// Decodes one trace entry into `out`. Errors carry the path below the entry.
    fn entry(&mut self, v: &Value, out: &mut DeviceTrace) -> Result<(), DecodeError> {
        let Value::Dict(d) = v else {
            return Err(expected("a trace entry dict", v));
        };
        self.spend(DeviceTrace::bytes_per_event() as u64)?;
        let mut e = NewEvent::default();
        let keys = &mut out.keys;
        for (k, val) in d.iter() {
            let Some(key) = k.as_str() else {
                self.warnings.add(Warning::NonStringEntryKey);
                continue;
            };
            let r: Result<(), DecodeError> = (|| {
                match key {
                    "action" => {
                        let name = as_str(val)?;
                        let action = Action::from_name(name);
                        if action == Action::Other {
                            self.warnings.add(Warning::UnknownAction(shown(name)));
                            e.other_action = Some(self.intern(val)?);
                        }
                        e.action = Some(action);
                    }
                    "addr" => e.addr = as_u64_wrapping(val)?,
                    // Free bytes cudaMemGetInfo reported (oom entries): a size.
                    "device_free" => match val.as_u64().filter(|&f| f <= MAX_SIZE) {
                        Some(f) => e.addr = f,
                        None if val.as_i128().is_some() => {
                            self.warnings.add(Warning::OomFreeNotASize);
                            e.addr = UNKNOWN_FREE;
                        }
                        None => return Err(expected("an int", val)),
                    },
                    "size" => e.size = as_size(val)?,
                    "stream" => e.stream = as_u64_wrapping(val)?,
                    "time_us" => {
                        keys.time_us = true;
                        e.time_us = self.time_us(val)?;
                    }
                    "frames" => {
                        keys.frames = true;
                        e.stack = Some(self.stack(val)?);
                    }
                    "compile_context" => {
                        keys.compile_context = true;
                        let s = as_str(val)?;
                        if s != "N/A" {
                            e.compile_context = Some(self.intern(val)?);
                        }
                    }
                    "user_metadata" => {
                        keys.user_metadata = true;
                        let s = as_str(val)?;
                        if !s.is_empty() {
                            e.user_metadata = Some(self.intern(val)?);
                        }
                    }
                    "internal_metadata" => {
                        keys.internal_metadata = true;
                        e.internal_metadata = Some(self.intern(val)?);
                    }
                    "cpp_frames" => {
                        keys.cpp_frames = true;
                        e.cpp_frames = Some(self.intern(val)?);
                    }
                    "pool_id" => {
                        keys.pool_id = true;
                        e.pool = Some(as_pool(val)?);
                    }
                    "forward_frames" => {
                        keys.forward_frames = true;
                        e.forward_frames = Some(self.str_list(val)?);
                    }
                    // Written only by the profiler-to-snapshot converter; kept, not used.
                    "category" => e
                        .extra_keys
                        .get_or_insert_with(Vec::new)
                        .push((key.to_string(), Extra::from_value(val))),
                    other => {
                        self.warnings.add(Warning::UnknownEntryKey(shown(other)));
                        e.extra_keys
                            .get_or_insert_with(Vec::new)
                            .push((key.to_string(), Extra::from_value(val)));
                    }
                }
                Ok(())
            })();
            r.map_err(|err| err.under(&field(key)))?;
        }
        let Some(action) = e.action else {
            return Err(DecodeError::new(
                "expected a trace entry with an 'action' key",
            ));
        };
        // A segment lies in the address space. (Blocks may not: a ring buffer that wrapped
        // leaves frees of address -1, written as 2^64 - 1.)
        let segment_action = matches!(
            action,
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
        );
        if segment_action && e.addr.checked_add(e.size).is_none() {
            return Err(DecodeError::new(format!(
                "expected memory below 2^64, found {} bytes at address 0x{:x}",
                e.size, e.addr
            ))
            .under(".size"));
        }
        out.size_total = out
            .size_total
            .checked_add(e.size)
            .filter(|&t| t <= MAX_SIZE)
            .ok_or_else(|| {
                DecodeError::new(
                    "sizes of this trace add up to more than 2^63 bytes (8 EiB); expected the sizes of one device's memory",
                )
                .under(".size")
            })?;
        out.push(e);
        Ok(())
    }

    fn trace_list(&mut self, v: &Value, pending: &mut Pending) -> Result<DeviceTrace, DecodeError> {
        match v {
            Value::Absorbed { list, .. } => match pending.remove(list) {
                Some(p) => match p.error {
                    Some((i, err)) => Err(err.under(&format!("[{i}]"))),
                    None => Ok(p.trace),
                },
                None => Err(DecodeError::new(
                    "trace list shared with another place in the file; expected one list per device",
                )),
            },
            Value::List(items) => {
                let mut trace = DeviceTrace::default();
                for (i, item) in items.iter().enumerate() {
                    self.entry(item, &mut trace)
                        .map_err(|e| e.under(&format!("[{i}]")))?;
                }
                Ok(trace)
            }
            other => Err(expected("a list of trace entries", other)),
        }
    }

    /// One record of a 1.13/2.0 block `history`.
    fn history_record(&mut self, v: &Value) -> Result<HistoryRecord, DecodeError> {
        let d = as_dict(v, "a history dict")?;
        let mut record = HistoryRecord {
            addr: 0,
            real_size: None,
            stack: None,
            cpp_frames: None,
            extra: Vec::new(),
        };
        for (k, val) in d.iter() {
            let Some(key) = k.as_str() else { continue };
            let r: Result<(), DecodeError> = (|| {
                match key {
                    "addr" => record.addr = as_u64_wrapping(val)?,
                    "real_size" => record.real_size = Some(as_size(val)?),
                    "frames" => record.stack = Some(self.stack(val)?),
                    "cpp_frames" => record.cpp_frames = Some(self.frames.intern_str(as_str(val)?)),
                    other => record
                        .extra
                        .push((other.to_string(), Extra::from_value(val))),
                }
                Ok(())
            })();
            r.map_err(|err| err.under(&field(key)))?;
        }
        Ok(record)
    }

    fn block(&mut self, v: &Value, address: u64, index: u32) -> Result<Block, DecodeError> {
        let d = as_dict(v, "a block dict")?;
        let (mut size, mut state, mut requested, mut stored_address) = (None, None, None, None);
        let (mut stack, mut has_frames, mut history_first) = (None, false, None);
        let (host, segment) = self.at_segment;
        let place = Place::Block {
            host,
            segment,
            block: index,
        };
        let mut history: Option<BlockHistory> = None;
        for (k, val) in d.iter() {
            let Some(key) = k.as_str() else { continue };
            let r: Result<(), DecodeError> = (|| {
                match key {
                    "size" => size = Some(as_size(val)?),
                    "requested_size" => requested = Some(as_size(val)?),
                    "address" => stored_address = Some(as_u64_wrapping(val)?),
                    "state" => {
                        state = Some(match as_str(val)? {
                            "active_allocated" => BlockState::ActiveAllocated,
                            "active_pending_free" => BlockState::ActivePendingFree,
                            "inactive" => BlockState::Inactive,
                            other => {
                                self.warnings.add(Warning::UnknownBlockState(shown(other)));
                                BlockState::Other(self.intern(val)?)
                            }
                        })
                    }
                    "frames" => {
                        has_frames = true;
                        stack = Some(self.stack(val)?);
                    }
                    "history" => {
                        self.features.block_history = true;
                        let items = val.as_seq().ok_or_else(|| expected("a list", val))?;
                        let mut records = Vec::with_capacity(items.len());
                        for (i, item) in items.iter().enumerate() {
                            let record = self
                                .history_record(item)
                                .map_err(|e| e.under(&format!("[{i}]")))?;
                            records.push(record);
                        }
                        if let Some(first) = records.first() {
                            history_first = Some((first.real_size, first.stack));
                        }
                        history.get_or_insert_with(BlockHistory::default).records = records;
                    }
                    "forward_frames" => {
                        self.features.forward_frames = true;
                        let strings = self.str_list(val)?;
                        self.extras.forward_frames.insert(place, strings);
                    }
                    other => {
                        self.warnings.add(Warning::UnknownBlockKey(shown(other)));
                        self.extras.add_key(place, other, val);
                    }
                }
                Ok(())
            })();
            r.map_err(|err| err.under(&field(key)))?;
        }
        let size = size.ok_or_else(|| DecodeError::new("expected a block with 'size'"))?;
        let state = state.ok_or_else(|| DecodeError::new("expected a block with 'state'"))?;
        if has_frames {
            self.features.block_frames = true;
        }
        if let Some(a) = stored_address
            && a != address
        {
            self.warnings.add(Warning::BlockAddressMismatch);
        }
        // 2.1+: requested_size; 1.13/2.0: the newest history record (spec 2.3, 6.1).
        if let Some(mut h) = history {
            h.requested_size = requested;
            self.extras.history.insert(place, h);
        }
        let requested_size = if has_frames {
            requested.unwrap_or(size)
        } else {
            match history_first {
                Some((Some(real), frames)) => {
                    stack = stack.or(frames);
                    real
                }
                _ => requested.unwrap_or(size),
            }
        };
        Ok(Block {
            address,
            size,
            requested_size,
            state,
            stack,
        })
    }

    fn segment(&mut self, v: &Value) -> Result<Segment, DecodeError> {
        let d = as_dict(v, "a segment dict")?;
        self.spend(std::mem::size_of::<Segment>() as u64)?;
        let mut s = Segment {
            device: 0,
            address: 0,
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: None,
            stream: 0,
            segment_type: SegmentType::Other,
            pool_id: None,
            is_expandable: false,
            stack: None,
            blocks: Vec::new(),
        };
        let (mut has_address, mut has_total, mut has_device) = (false, false, false);
        let mut blocks_value = None;
        let segment_place = Place::Segment {
            host: self.at_segment.0,
            segment: self.at_segment.1,
        };
        for (k, val) in d.iter() {
            let Some(key) = k.as_str() else { continue };
            let r: Result<(), DecodeError> = (|| {
                match key {
                    "device" => {
                        has_device = true;
                        s.device = as_i64(val)?
                    }
                    "address" => {
                        has_address = true;
                        s.address = as_u64_wrapping(val)?
                    }
                    "total_size" => {
                        has_total = true;
                        s.total_size = as_size(val)?
                    }
                    "allocated_size" => s.allocated_size = as_size(val)?,
                    "active_size" => s.active_size = as_size(val)?,
                    "requested_size" => {
                        self.features.segment_requested_size = true;
                        s.requested_size = Some(as_size(val)?)
                    }
                    "stream" => s.stream = as_u64_wrapping(val)?,
                    "segment_type" => {
                        s.segment_type = match as_str(val)? {
                            "large" => SegmentType::Large,
                            "small" => SegmentType::Small,
                            other => {
                                self.warnings.add(Warning::UnknownSegmentType(shown(other)));
                                self.extras.add_key(segment_place, key, val);
                                SegmentType::Other
                            }
                        }
                    }
                    "segment_pool_id" => {
                        self.features.segment_pool_id = true;
                        s.pool_id = Some(as_pool(val)?)
                    }
                    "is_expandable" => {
                        s.is_expandable = val.as_bool().ok_or_else(|| expected("a bool", val))?
                    }
                    "frames" => s.stack = Some(self.stack(val)?),
                    "forward_frames" => {
                        self.features.forward_frames = true;
                        let strings = self.str_list(val)?;
                        self.extras.forward_frames.insert(segment_place, strings);
                    }
                    "blocks" => blocks_value = Some(val.clone()),
                    other => {
                        self.warnings.add(Warning::UnknownSegmentKey(shown(other)));
                        self.extras.add_key(segment_place, other, val);
                    }
                }
                Ok(())
            })();
            r.map_err(|err| err.under(&field(key)))?;
        }
        if !has_address || !has_total {
            return Err(DecodeError::new(
                "expected a segment dict with 'address' and 'total_size'",
            ));
        }
        if !has_device {
            self.warnings.add(Warning::SegmentWithoutDevice);
        }
        if s.address.checked_add(s.total_size).is_none() {
            return Err(DecodeError::new(format!(
                "expected memory below 2^64, found {} bytes at address 0x{:x}",
                s.total_size, s.address
            ))
            .under(".total_size"));
        }
        if let Some(bv) = blocks_value {
            let items = bv
                .as_seq()
                .ok_or_else(|| expected("a list of blocks", &bv).under(".blocks"))?;
            self.spend((items.len() * std::mem::size_of::<Block>()) as u64)
                .map_err(|e| e.under(".blocks"))?;
            s.blocks.reserve_exact(items.len());
            let mut address = s.address;
            for (i, b) in items.iter().enumerate() {
                let block = self
                    .block(b, address, i as u32)
                    .map_err(|e| e.under(&format!(".blocks[{i}]")))?;
                address = address.wrapping_add(block.size);
                s.blocks.push(block);
            }
        }
        let sum: u64 = s.blocks.iter().map(|b| b.size).sum();
        if sum != s.total_size {
            self.warnings.add(Warning::BlockSizesMismatch);
        }
        Ok(s)
    }

    /// Adds a segment's sizes to its device's total (the host's for host segments).
    fn account(&mut self, s: &Segment, host: bool) -> Result<(), DecodeError> {
        let device = if host { HOST } else { s.device };
        for (size, key) in [
            (s.total_size, ".total_size"),
            (s.allocated_size, ".allocated_size"),
            (s.active_size, ".active_size"),
            (s.requested_size.unwrap_or(0), ".requested_size"),
        ] {
            self.sizes.add(device, size).map_err(|e| e.under(key))?;
        }
        for (i, b) in s.blocks.iter().enumerate() {
            for (size, key) in [(b.size, "size"), (b.requested_size, "requested_size")] {
                self.sizes
                    .add(device, size)
                    .map_err(|e| e.under(&format!(".blocks[{i}].{key}")))?;
            }
        }
        Ok(())
    }

    /// The segments list under `name` ("" for a bare list at the root): taken over
    /// while reading, or a list of values.
    fn segments(
        &mut self,
        v: &Value,
        name: &str,
        taken: &mut Lists<Taken<Segment>>,
    ) -> Result<Vec<Segment>, DecodeError> {
        let segments = match v {
            Value::Absorbed { list, .. } => match taken.remove(list) {
                Some(t) => t.result().map_err(|e| e.under(name))?,
                None => {
                    return Err(DecodeError::new(
                        "segments list shared with another place in the file; expected one list",
                    )
                    .under(name));
                }
            },
            _ => {
                let items = v
                    .as_seq()
                    .ok_or_else(|| expected("a list of segments", v).under(name))?;
                items
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        self.at_segment = (name == "host_segments", i as u32);
                        self.segment(s)
                            .map_err(|e| e.under(&format!("{name}[{i}]")))
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        for (i, s) in segments.iter().enumerate() {
            self.account(s, name == "host_segments")
                .map_err(|e| e.under(&format!("{name}[{i}]")))?;
        }
        Ok(segments)
    }

    /// One `external_annotations` record; None (left out) when its time is not a time.
    fn annotation(&mut self, a: &Value) -> Result<Option<Annotation>, DecodeError> {
        let d = as_dict(a, "an annotation dict")?;
        let mut ann = Annotation {
            name: String::new(),
            stage: String::new(),
            device: 0,
            time_us: 0,
        };
        let mut time_ok = true;
        for (k, val) in d.iter() {
            match k.as_str() {
                Some("name") => {
                    let s = as_str(val).map_err(|e| e.under(".name"))?;
                    self.spend(s.len() as u64)?;
                    ann.name = s.into()
                }
                Some("stage") => {
                    let s = as_str(val).map_err(|e| e.under(".stage"))?;
                    self.spend(s.len() as u64)?;
                    ann.stage = s.into()
                }
                Some("device") => ann.device = as_i64(val).map_err(|e| e.under(".device"))?,
                Some("time_us") => match self.time_us(val).map_err(|e| e.under(".time_us"))? {
                    Some(t) => ann.time_us = t,
                    None => time_ok = false,
                },
                Some(other) => {
                    self.warnings.add(Warning::UnknownAnnotationKey);
                    self.extras
                        .add_key(Place::Annotation(self.at_annotation), other, val);
                }
                None => self.warnings.add(Warning::UnknownAnnotationKey),
            }
        }
        self.spend(std::mem::size_of::<Annotation>() as u64)?;
        // An annotation is a moment: one without a real time is left out.
        Ok(time_ok.then_some(ann))
    }

    fn annotations(
        &mut self,
        v: &Value,
        taken: &mut Lists<Taken<Option<Annotation>>>,
    ) -> Result<Vec<Annotation>, DecodeError> {
        let all = match v {
            Value::Absorbed { list, .. } => match taken.remove(list) {
                Some(t) => t.result()?,
                None => {
                    return Err(DecodeError::new(
                        "annotations list shared with another place in the file; expected one list",
                    ));
                }
            },
            _ => {
                let items = v.as_seq().ok_or_else(|| expected("a list", v))?;
                items
                    .iter()
                    .enumerate()
                    .map(|(i, a)| {
                        self.at_annotation = i as u32;
                        self.annotation(a).map_err(|e| e.under(&format!("[{i}]")))
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        Ok(all.into_iter().flatten().collect())
    }
}

/// Items of a list taken over while reading (segments, annotations), or the first error
/// met in it with its index.
struct Taken<T> {
    items: Vec<T>,
    error: Option<(u64, DecodeError)>,
}

impl<T> Default for Taken<T> {
    fn default() -> Self {
        Taken {
            items: Vec::new(),
            error: None,
        }
    }
}

impl<T> Taken<T> {
    fn result(self) -> Result<Vec<T>, DecodeError> {
        match self.error {
            Some((i, e)) => Err(e.under(&format!("[{i}]"))),
            None => Ok(self.items),
        }
    }
}

/// A trace list taken over while reading, or the first error met in it.
#[derive(Default)]
struct PendingTrace {
    trace: DeviceTrace,
    error: Option<(u64, DecodeError)>,
}

/// Lists being taken over, newest last (lookups almost always hit the last one).
struct Lists<T>(Vec<(ListId, T)>);

impl<T> Default for Lists<T> {
    fn default() -> Self {
        Lists(Vec::new())
    }
}

impl<T> Lists<T> {
    #[inline]
    fn get_mut(&mut self, list: &ListId) -> Option<&mut T> {
        self.0
            .iter_mut()
            .rev()
            .find(|(id, _)| id == list)
            .map(|(_, t)| t)
    }

    fn insert(&mut self, list: ListId, value: T) {
        match self.get_mut(&list) {
            Some(t) => *t = value,
            None => self.0.push((list, value)),
        }
    }

    fn get(&self, list: &ListId) -> Option<&T> {
        self.0
            .iter()
            .rev()
            .find(|(id, _)| id == list)
            .map(|(_, t)| t)
    }

    fn contains(&self, list: &ListId) -> bool {
        self.0.iter().any(|(id, _)| id == list)
    }

    fn remove(&mut self, list: &ListId) -> Option<T> {
        let pos = self.0.iter().rposition(|(id, _)| id == list)?;
        Some(self.0.remove(pos).1)
    }
}

type Pending = Lists<PendingTrace>;

/// Plugs into [`pickle::parse_with`]: decodes trace entries and frames lists as they are
/// read, then [`SnapshotBuilder::finish`] decodes the rest of the tree.
pub struct SnapshotBuilder {
    dec: Decoder,
    pending: Pending,
    /// Segments lists and annotations lists being read, decoded item by item.
    segment_lists: Lists<Taken<Segment>>,
    /// Whether a segments list taken over is `host_segments`.
    segment_list_host: Lists<bool>,
    segment_lists_seen: u32,
    annotation_lists: Lists<Taken<Option<Annotation>>>,
    /// The fast path's classes of memo values (by memo value) and pending stores.
    classes: Vec<(u64, trace_entries::Class)>,
    cache: Box<trace_entries::IndexCache>,
    stores: Vec<trace_entries::Store>,
    /// Workers decoding stretches ahead: what they may use, then the running ones.
    parallel: Option<trace_entries::Parallel>,
    workers: Option<trace_entries::Workers>,
    /// Whether trace entries may be decoded straight from the bytes, and how many were.
    fast: bool,
    fast_entries: u64,
    spliced_entries: u64,
    workers_after: u64,
    /// Frames lists being read: their frames so far, or the first error.
    frames_lists: Lists<Result<Vec<FrameId>, DecodeError>>,
}

impl Default for SnapshotBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn is_frame_dict(v: &Value) -> bool {
    v.get("line").is_some() && (v.get("filename").is_some() || v.get("name").is_some())
}

impl pickle::Builder for SnapshotBuilder {
    fn wants_list(&mut self, list: ListId, first: &Value) -> bool {
        // Trace entries are dicts with a string 'action'; frames are dicts with 'line' and
        // 'filename'/'name'; segments have 'total_size'; annotations 'stage' and 'name'.
        // Nothing else in a snapshot looks like any of them. Taking lists over as they
        // are read keeps the reader from holding them as values.
        if matches!(first.get("action"), Some(Value::Str(_))) {
            self.pending.insert(list, PendingTrace::default());
        } else if is_frame_dict(first) {
            self.frames_lists.insert(list, Ok(Vec::new()));
        } else if first.get("total_size").is_some() {
            self.segment_lists.insert(list, Taken::default());
            // `segments` comes before `host_segments` in every release that writes both:
            // a second segments list read is the host's (for placing extras).
            self.segment_list_host
                .insert(list, self.segment_lists_seen > 0);
            self.segment_lists_seen += 1;
        } else if first.get("stage").is_some() && first.get("name").is_some() {
            self.annotation_lists.insert(list, Taken::default());
        } else {
            return false;
        }
        true
    }

    fn absorb(&mut self, list: ListId, index: u64, item: Value) {
        self.take(list, index, None, &item);
    }

    fn absorb_shared(&mut self, list: ListId, index: u64, key: SharedKey, item: &Value) {
        self.take(list, index, Some(key), item);
    }

    fn reached(&mut self, offset: u64) {
        self.dec.set_content_bytes(offset);
    }

    fn fast_list(&mut self, list: Option<ListId>, taking: Option<bool>) -> bool {
        self.fast
            && match (list, taking) {
                (_, None) => true,
                (Some(l), Some(true)) => self.pending.contains(&l),
                _ => false,
            }
    }

    /// Workers decode trace entries ahead in the stretches (`trace_entries.rs`).
    fn read_ahead(&mut self, plan: pickle::ReadAhead) {
        self.set_parallel_inner(trace_entries::Parallel {
            data: plan.data,
            release: plan.release,
            chunks: std::sync::Arc::new(plan.stretches),
            refs: std::sync::Arc::new(plan.refs),
            workers: plan.workers,
        });
    }

    fn take_items(
        &mut self,
        list: ListId,
        taking: Option<bool>,
        bytes: &[u8],
        offset: u64,
        memo: &mut pickle::Memo,
    ) -> pickle::FastTake {
        if !self.fast {
            return pickle::FastTake::default();
        }
        self.take_entries(list, taking, bytes, offset, memo)
    }

    fn close_list(&mut self, list: ListId, len: u64) -> Value {
        match self.frames_lists.remove(&list) {
            Some(Ok(frames)) => Value::Handle(self.dec.frames.intern_stack(&frames).0 as u64),
            Some(Err(e)) => {
                self.dec.frame_errors.insert(list, e);
                Value::Absorbed { list, len }
            }
            None => Value::Absorbed { list, len },
        }
    }
}

impl SnapshotBuilder {
    /// One element of a list taken over: a frame of a frames list or a trace entry.
    fn take(&mut self, list: ListId, index: u64, key: Option<SharedKey>, item: &Value) {
        if let Some(Ok(frames)) = self.frames_lists.get_mut(&list) {
            let id = match key {
                Some(key) => self.dec.shared_frame(key, item),
                None => self.dec.frame(item),
            };
            match id {
                Ok(id) => frames.push(id),
                Err(e) => {
                    self.frames_lists
                        .insert(list, Err(e.under(&format!("[{index}]"))));
                }
            }
            return;
        }
        if let Some(p) = self.pending.get_mut(&list) {
            if p.error.is_none()
                && let Err(e) = self.dec.entry(item, &mut p.trace)
            {
                p.error = Some((index, e));
            }
            return;
        }
        if let Some(t) = self.segment_lists.get_mut(&list) {
            if t.error.is_none() {
                let host = self.segment_list_host.get_mut(&list).is_some_and(|h| *h);
                self.dec.at_segment = (host, index as u32);
                match self.dec.segment(item) {
                    Ok(s) => t.items.push(s),
                    Err(e) => t.error = Some((index, e)),
                }
            }
            return;
        }
        if let Some(t) = self.annotation_lists.get_mut(&list)
            && t.error.is_none()
        {
            self.dec.at_annotation = index as u32;
            match self.dec.annotation(item) {
                Ok(a) => t.items.push(a),
                Err(e) => t.error = Some((index, e)),
            }
        }
    }
}

impl SnapshotBuilder {
    pub fn new() -> Self {
        SnapshotBuilder {
            dec: Decoder::new(),
            pending: Pending::default(),
            frames_lists: Lists::default(),
            segment_lists: Lists::default(),
            segment_list_host: Lists::default(),
            segment_lists_seen: 0,
            annotation_lists: Lists::default(),
            classes: Vec::new(),
            cache: Box::default(),
            stores: Vec::new(),
            parallel: None,
            workers: None,
            fast: true,
            fast_entries: 0,
            spliced_entries: 0,
            workers_after: trace_entries::WORKERS_AFTER,
        }
    }

    /// Turns the fast path for trace entries off (on by default): every entry is then
    /// decoded from pickle values. The result is the same; tests compare the two.
    pub fn set_fast_path(&mut self, on: bool) {
        self.fast = on;
    }

    /// Lets `workers` threads decode stretches of `data` (the bytes the reader reads)
    /// ahead of the reader; `stretches` and `refs` come from the first pass
    /// ([`pickle::scan_slice_chunks`]). The result is the same as without.
    /// [`pickle::Reader`] offers the same through [`pickle::Builder::read_ahead`].
    pub fn set_parallel(
        &mut self,
        data: pickle::SharedBytes,
        stretches: pickle::Stretches,
        refs: pickle::MemoReferences,
        workers: usize,
    ) {
        self.set_parallel_inner(trace_entries::Parallel {
            data,
            release: None,
            chunks: std::sync::Arc::new(stretches),
            refs: std::sync::Arc::new(refs),
            workers,
        });
    }

    /// Starts the workers after this many entries (1024 by default, once the reader has
    /// met the keys and actions workers need; tests and the fuzz target use fewer).
    pub fn set_workers_after(&mut self, entries: u64) {
        self.workers_after = entries;
    }

    /// Trace entries decoded by the fast path so far.
    pub fn fast_entries(&self) -> u64 {
        self.fast_entries
    }

    /// Of those, entries decoded ahead by workers.
    pub fn spliced_entries(&self) -> u64 {
        self.spliced_entries
    }

    /// Decodes the root value read from `content_bytes` bytes of pickle (or JSON): the
    /// decoded model may take [`MODEL_BUDGET_FLOOR`] plus twice that.
    pub fn finish_sized(
        mut self,
        root: &Value,
        content_bytes: u64,
    ) -> Result<Snapshot, DecodeError> {
        self.dec.set_content_bytes(content_bytes);
        self.finish(root)
    }

    /// Decodes the root value read by the pickle reader (or converted from JSON), with
    /// the budget of the bytes seen while reading (at least [`MODEL_BUDGET_FLOOR`]).
    pub fn finish(mut self, root: &Value) -> Result<Snapshot, DecodeError> {
        let dec = &mut self.dec;
        let mut snap = Snapshot::default();
        match root {
            Value::List(items) => {
                if let Some(first) = items.first()
                    && first.get("total_size").is_none()
                {
                    return Err(DecodeError::new(format!(
                        "not a memory snapshot: expected a dict with 'segments' or a list of segment dicts, found a list whose first item is {}",
                        describe(first)
                    ))
                    .root());
                }
                dec.features.root_is_list = true;
                snap.segments = dec.segments(root, "", &mut self.segment_lists)?;
            }
            Value::Absorbed { list, .. } if self.segment_lists.contains(list) => {
                dec.features.root_is_list = true;
                snap.segments = dec.segments(root, "", &mut self.segment_lists)?;
            }
            Value::Dict(pairs) => {
                if root.get("segments").is_none() {
                    let mut keys: Vec<String> = pairs
                        .iter()
                        .take(8)
                        .map(|(k, _)| match k {
                            Value::Str(s) => format!("'{s}'"),
                            other => describe(other),
                        })
                        .collect();
                    if pairs.len() > 8 {
                        keys.push("...".into());
                    }
                    return Err(DecodeError::new(format!(
                        "not a memory snapshot: expected a dict with 'segments', found a dict with keys {}",
                        keys.join(", ")
                    ))
                    .root());
                }
                for (k, v) in pairs.iter() {
                    let Some(key) = k.as_str() else {
                        dec.warnings.add(Warning::NonStringTopLevelKey);
                        continue;
                    };
                    match key {
                        "segments" => {
                            snap.segments = dec.segments(v, "segments", &mut self.segment_lists)?
                        }
                        "device_traces" => {
                            dec.features.device_traces = true;
                            let lists = v.as_seq().ok_or_else(|| {
                                expected("a list of lists", v).under("device_traces")
                            })?;
                            if lists.len() > MAX_DEVICES {
                                return Err(DecodeError::new(format!(
                                    "{} lists; expected one per device (at most {MAX_DEVICES})",
                                    lists.len()
                                ))
                                .under("device_traces"));
                            }
                            for (d, list) in lists.iter().enumerate() {
                                let t = dec
                                    .trace_list(list, &mut self.pending)
                                    .and_then(|t| {
                                        dec.spend(std::mem::size_of::<DeviceTrace>() as u64)?;
                                        Ok(t)
                                    })
                                    .map_err(|e| e.under(&format!("device_traces[{d}]")))?;
                                snap.device_traces.push(t);
                            }
                        }
                        "host_segments" => {
                            dec.features.host_segments = true;
                            snap.host_segments =
                                dec.segments(v, "host_segments", &mut self.segment_lists)?;
                        }
                        "host_traces" => {
                            snap.host_trace = dec
                                .trace_list(v, &mut self.pending)
                                .map_err(|e| e.under("host_traces"))?;
                        }
                        "allocator_settings" => {
                            dec.features.allocator_settings = true;
                            let d =
                                as_dict(v, "a dict").map_err(|e| e.under("allocator_settings"))?;
                            let mut map = BTreeMap::new();
                            for (k, v) in d.iter() {
                                let key = k.as_str().unwrap_or("");
                                let value = to_json(v, &mut |n| dec.spend(n))
                                    .map_err(|e| e.under(&format!("allocator_settings.{key}")))?;
                                map.insert(key.to_string(), value);
                            }
                            dec.features.graph_capture_record_stream_reuse =
                                map.contains_key("graph_capture_record_stream_reuse");
                            dec.features.max_cached_size = map.contains_key("max_cached_size");
                            snap.allocator_settings = Some(map);
                        }
                        "external_annotations" => {
                            dec.features.external_annotations = true;
                            snap.external_annotations = dec
                                .annotations(v, &mut self.annotation_lists)
                                .map_err(|e| e.under("external_annotations"))?;
                        }
                        other => {
                            dec.warnings.add(Warning::UnknownTopLevelKey(shown(other)));
                            dec.extras.add_key(Place::Root, other, v);
                        }
                    }
                }
            }
            // The magic number that opens torch.save's legacy (pre-zip) format.
            other if other.as_i128() == Some(TORCH_SAVE_LEGACY_MAGIC) => {
                return Err(DecodeError::new(format!(
                    "a file torch.save wrote (its legacy format: tensors or a model's state), not a memory snapshot; {}",
                    super::RECORD_ADVICE
                ))
                .root());
            }
            other => {
                return Err(DecodeError::new(format!(
                    "not a memory snapshot: expected a dict with 'segments' or a list of segments, found {}",
                    describe(other)
                ))
                .root());
            }
        }
        // Per device, the trace's sizes and the segments' together stay below 2^63.
        for (d, t) in snap.device_traces.iter().enumerate() {
            dec.sizes
                .add(d as i64, t.size_total)
                .map_err(|e| e.under(&format!("device_traces[{d}]")))?;
        }
        dec.sizes
            .add(HOST, snap.host_trace.size_total)
            .map_err(|e| e.under("host_traces"))?;
        // Segments grouped by device (file order within a device), so that the
        // segments of one device are found by a binary search.
        snap.segments.sort_by_key(|s| s.device);
        let mut entries = EntryKeys::default();
        for t in snap.device_traces.iter().chain([&snap.host_trace]) {
            entries.merge(t.keys);
        }
        dec.features.entries = entries;
        snap.frames = std::mem::take(&mut dec.frames);
        snap.features = std::mem::take(&mut dec.features);
        snap.warnings = std::mem::take(&mut dec.warnings);
        snap.extras = std::mem::take(&mut dec.extras);
        Ok(snap)
    }
}

/// Decodes a value tree (from any source) into a snapshot.
pub fn decode_value(root: &Value) -> Result<Snapshot, DecodeError> {
    SnapshotBuilder::new().finish(root)
}

fn from_json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::None,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::from_le_signed(&(u as i128).to_le_bytes())
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => Value::Str(Rc::from(s.as_str())),
        J::Array(a) => Value::List(Rc::new(a.iter().map(from_json).collect())),
        J::Object(o) => Value::Dict(Rc::new(
            o.iter()
                .map(|(k, v)| (Value::Str(Rc::from(k.as_str())), from_json(v)))
                .collect(),
        )),
    }
}

/// Decodes a snapshot written as JSON (the structure the web viewer also accepts).
pub fn decode_json(json: &serde_json::Value) -> Result<Snapshot, DecodeError> {
    decode_value(&from_json(json))
}
