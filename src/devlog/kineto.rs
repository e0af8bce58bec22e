//! Profiler traces read event by event: the `[memory]` instant events of a Kineto / Chrome
//! trace (spec 8.2) from `torch.profiler` with `profile_memory=True`, with the operator,
//! Python-function and annotation spans (`X` events) that enclose them; and, through the
//! same entrance, `export_memory_timeline` JSON (see [`super::memory_timeline`]).
//!
//! The JSON is read with serde visitors that keep only what is used: each event's fields
//! are matched by name as they stream past, strings go through one reused buffer, and
//! everything else (kernel events, their arguments, device properties) is skipped without
//! being stored. So memory follows the number of `[memory]` events and operator spans, not
//! the size of the file.
//!
//! Times: Kineto since May 2024 writes `ts` relative to the top-level
//! `baseTimeNanoseconds`; older traces write absolute Unix µs. Both become Unix
//! nanoseconds here ([`TraceClock`] says which was found).

use super::DevlogError;
use super::json::{BytesInto, Chunks, CutError, Num, OtherKind, SyntaxError, serde_message};
use super::memory_timeline::{self, RowItem, Rows};
use super::profile::{
    MemoryEvent, ProfileKind, ProfileTrace, Span, SpanKind, TRACE_KIND, TraceClock,
};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read};

/// Reads a profiler output (plain or gzip, sniffed by the magic `1f 8b`) event by event:
/// a Kineto / Chrome trace (the 2021 shape has only `Device Type`, `Device Id` and `Bytes`
/// in its `[memory]` events), or an `export_memory_timeline` JSON file (raw rows or
/// category totals). All other events are skipped; `[OutOfMemory]` events are counted.
pub fn read_profile<R: Read>(reader: R) -> Result<ProfileTrace, DevlogError> {
    let mut buffered = BufReader::with_capacity(1 << 16, reader);
    let head = buffered.fill_buf().map_err(|e| DevlogError::Io {
        message: e.to_string(),
    })?;
    if head.starts_with(&[0x1f, 0x8b]) {
        let gz = flate2::bufread::MultiGzDecoder::new(buffered);
        return read_plain(BufReader::with_capacity(1 << 16, gz), true);
    }
    read_plain(buffered, false)
}

fn read_plain<R: BufRead>(mut r: R, gzip: bool) -> Result<ProfileTrace, DevlogError> {
    let io = |e: std::io::Error| {
        let message = e.to_string().to_lowercase();
        if gzip {
            DevlogError::Gzip { message }
        } else {
            DevlogError::Io { message }
        }
    };
    // Skip a byte-order mark and white space, and look at the first byte.
    let mut at_start = true;
    let mut skipped = 0usize;
    let first = loop {
        let head = r.fill_buf().map_err(io)?;
        if head.is_empty() {
            return Err(DevlogError::Empty {
                expected: TRACE_KIND,
            });
        }
        if at_start && head.starts_with(b"\xef\xbb\xbf") {
            r.consume(3);
            at_start = false;
            continue;
        }
        at_start = false;
        let n = head.iter().take_while(|b| b.is_ascii_whitespace()).count();
        if skipped + n >= super::MAX_LEADING_SPACE {
            return Err(DevlogError::WrongKind {
                message: super::leading_space_message(TRACE_KIND),
            });
        }
        if n < head.len() {
            let first = head[n];
            r.consume(n);
            break first;
        }
        let len = head.len();
        skipped += len;
        r.consume(len);
    };
    match first {
        0x80 => {
            return Err(DevlogError::WrongKind {
                message: format!(
                    "this is a pickle (a memory snapshot?), not {TRACE_KIND}; read it as a snapshot"
                ),
            });
        }
        b'<' => {
            let head = r.fill_buf().map_err(io)?;
            return Err(DevlogError::WrongKind {
                message: memory_timeline::html_message(head),
            });
        }
        _ => {}
    }
    let mut sink = Sink::default();
    let mut chunks = Chunks::new(r);
    let result = cut(&mut chunks, &mut sink);
    if let Some(e) = sink.error.take() {
        return Err(e);
    }
    match result {
        Ok(()) => sink.finish(),
        Err(CutError::Io(e)) => Err(io(e)),
        Err(CutError::Syntax(e)) => Err(DevlogError::Line {
            line: e.line,
            message: format!(
                "column {}: expected {TRACE_KIND}, found invalid JSON ({})",
                e.column, e.message
            ),
        }),
    }
}

/// Takes the top level apart: an object whose `traceEvents` list is read element by
/// element (and `baseTimeNanoseconds` kept, other keys skipped), or a list of events or
/// rows. Each element is parsed on its own bytes.
fn cut<R: Read>(chunks: &mut Chunks<R>, sink: &mut Sink) -> Result<(), CutError> {
    match chunks.peek()? {
        Some(b'{') => {
            chunks.expect(b'{', "an object")?;
            if !chunks.eat(b'}')? {
                loop {
                    let key = {
                        let (bytes, place) = chunks.value()?;
                        parse::<String>(bytes, place)?
                    };
                    chunks.expect(b':', "`:`")?;
                    match key.as_str() {
                        "traceEvents" if chunks.peek()? == Some(b'[') => {
                            sink.saw_trace_events = true;
                            sink.list = "traceEvents";
                            elements(chunks, sink)?;
                        }
                        "traceEvents" => {
                            sink.saw_trace_events = true;
                            sink.list = "traceEvents";
                            let (bytes, place) = chunks.value()?;
                            let v = parse::<Num>(bytes, place)?;
                            sink.error = Some(DevlogError::Json {
                                path: "traceEvents".into(),
                                message: format!("expected a list, found {}", v.kind()),
                            });
                            return Ok(());
                        }
                        "baseTimeNanoseconds" => {
                            let (bytes, place) = chunks.value()?;
                            sink.base_time_ns = parse::<Num>(bytes, place)?.int();
                        }
                        _ => {
                            let (bytes, place) = chunks.value()?;
                            serde_json::from_slice::<IgnoredAny>(bytes)
                                .map_err(|e| syntax(&e, place))?;
                            if key == "segments" || key == "device_traces" {
                                sink.saw_snapshot_keys = true;
                            }
                            if sink.top_keys.len() < 8 {
                                sink.top_keys.push(key);
                            }
                        }
                    }
                    if chunks.eat(b',')? {
                        continue;
                    }
                    chunks.expect(b'}', "`,` or `}`")?;
                    break;
                }
            }
        }
        Some(b'[') => {
            sink.list = "";
            elements(chunks, sink)?;
        }
        Some(_) => return Err(chunks.error_here("expected value")),
        None => return Err(chunks.error_here("EOF while parsing a value")),
    }
    match chunks.peek()? {
        None => Ok(()),
        Some(_) => Err(chunks.error_here("trailing characters")),
    }
}

/// The elements of a list, each parsed by [`Element`] on its own bytes.
fn elements<R: Read>(chunks: &mut Chunks<R>, sink: &mut Sink) -> Result<(), CutError> {
    chunks.expect(b'[', "a list")?;
    sink.index = 0;
    if chunks.eat(b']')? {
        return Ok(());
    }
    loop {
        let (bytes, place) = chunks.value()?;
        let mut de = serde_json::Deserializer::from_slice(bytes);
        match Element(sink).deserialize(&mut de).and_then(|()| de.end()) {
            Ok(()) => {}
            Err(_) if sink.error.is_some() => return Ok(()),
            Err(e) => return Err(syntax(&e, place)),
        }
        sink.index += 1;
        if chunks.eat(b',')? {
            continue;
        }
        chunks.expect(b']', "`,` or `]`")?;
        return Ok(());
    }
}

/// A value of its own bytes.
fn parse<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    place: (usize, usize),
) -> Result<T, CutError> {
    serde_json::from_slice(bytes).map_err(|e| syntax(&e, place))
}

/// A serde error in a value that starts at `place`, placed in the whole text.
fn syntax(e: &serde_json::Error, place: (usize, usize)) -> CutError {
    let (line, column) = if e.line() <= 1 {
        (place.0, place.1 + e.column().saturating_sub(1))
    } else {
        (place.0 + e.line() - 1, e.column())
    };
    CutError::Syntax(SyntaxError {
        line,
        column,
        message: serde_message(e),
    })
}

/// A pid or tid: a number, or a string (interned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Id {
    None,
    Int(i64),
    Str(u32),
}

/// What the reader has seen so far.
#[derive(Default)]
struct Sink {
    /// "traceEvents" inside an object, "" for a bare top-level list.
    list: &'static str,
    /// Index of the element being read in that list.
    index: usize,
    /// The top-level list holds rows (memory timeline) rather than events.
    rows_mode: Option<bool>,
    base_time_ns: Option<i64>,
    saw_trace_events: bool,
    saw_snapshot_keys: bool,
    top_keys: Vec<String>,
    /// Times here are relative ns as in the file (base not added yet).
    memory: Vec<MemoryEvent>,
    spans: Vec<Span>,
    names: Vec<String>,
    name_ids: BTreeMap<String, u32>,
    strings: BTreeMap<String, u32>,
    threads: BTreeMap<(Id, Id), u32>,
    thread_names: Vec<String>,
    out_of_memory: u64,
    /// Elements among events that are not events.
    skipped: u64,
    events: u64,
    rows: Rows,
    error: Option<DevlogError>,
    ph: Vec<u8>,
    name: Vec<u8>,
    cat: Vec<u8>,
    pid: Vec<u8>,
    tid: Vec<u8>,
    call_stack: Vec<u8>,
}

impl Sink {
    fn path(&self) -> String {
        if self.saw_trace_events || self.rows_mode.is_some() {
            format!("{}[{}]", self.list, self.index)
        } else {
            "(top level)".to_string()
        }
    }

    fn fail<E: de::Error>(&mut self, path: String, message: String) -> E {
        self.error = Some(DevlogError::Json { path, message });
        E::custom("stopped")
    }

    fn intern_id(&mut self, id: PendingId, which_pid: bool) -> Id {
        match id {
            PendingId::None => Id::None,
            PendingId::Int(i) => Id::Int(i),
            PendingId::Str => {
                let raw = if which_pid { &self.pid } else { &self.tid };
                let text = String::from_utf8_lossy(raw);
                // 2021 traces write a thread's id as a string on operators and as a number
                // on memory events: one thread.
                if let Some(i) = text.parse::<i64>().ok().filter(|i| i.to_string() == text) {
                    return Id::Int(i);
                }
                if let Some(&i) = self.strings.get(text.as_ref()) {
                    return Id::Str(i);
                }
                let i = self.strings.len() as u32;
                self.strings.insert(text.into_owned(), i);
                Id::Str(i)
            }
        }
    }

    fn thread(&mut self, pid: Id, tid: Id) -> u32 {
        if let Some(&t) = self.threads.get(&(pid, tid)) {
            return t;
        }
        let t = self.thread_names.len() as u32;
        self.threads.insert((pid, tid), t);
        let show = |id: Id, s: &BTreeMap<String, u32>| match id {
            Id::None => "?".to_string(),
            Id::Int(i) => i.to_string(),
            Id::Str(k) => s
                .iter()
                .find(|(_, v)| **v == k)
                .map_or("?".to_string(), |(s, _)| s.clone()),
        };
        let name = format!("{}/{}", show(pid, &self.strings), show(tid, &self.strings));
        self.thread_names.push(name);
        t
    }

    fn name_id(&mut self) -> u32 {
        let text = String::from_utf8_lossy(&self.name).into_owned();
        self.intern_name(text)
    }

    fn intern_name(&mut self, text: String) -> u32 {
        if let Some(&i) = self.name_ids.get(text.as_str()) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(text.clone());
        self.name_ids.insert(text, i);
        i
    }

    /// Takes one event object; Err(message) stops the reading.
    fn take_event(&mut self, e: RawEvent) -> Result<(), DevlogError> {
        self.events += 1;
        if e.has_name && self.name == b"[OutOfMemory]" {
            self.out_of_memory += 1;
            return Ok(());
        }
        if e.has_name && self.name == b"[memory]" {
            let path = format!("{}[{}]", self.list, self.index);
            let ts = match e.ts {
                Some(v) => rel_ns(v).ok_or_else(|| DevlogError::Json {
                    path: format!("{path}.ts"),
                    message: match v {
                        Num::Int(_) | Num::Big(_) | Num::Float(_) => format!(
                            "expected a time in microseconds within about ±292,000 years of the trace's clock, found {}",
                            v.describe()
                        ),
                        _ => format!("expected a number, found {}", v.kind()),
                    },
                })?,
                None => {
                    return Err(DevlogError::Json {
                        path,
                        message: "expected a \"ts\" key, found none".to_string(),
                    });
                }
            };
            let args = match e.args {
                Some(Args::Object(a)) => a,
                Some(Args::Not(kind)) => {
                    return Err(DevlogError::Json {
                        path: format!("{path}.args"),
                        message: format!("expected an object, found {}", kind.kind()),
                    });
                }
                None => {
                    return Err(DevlogError::Json {
                        path: format!("{path}.args"),
                        message: "expected an object, found nothing".to_string(),
                    });
                }
            };
            let required = |v: Option<Num>, key: &str| -> Result<i64, DevlogError> {
                match v {
                    Some(n) => n.int().ok_or_else(|| DevlogError::Json {
                        path: format!("{path}.args.{key}"),
                        message: format!("expected an integer, found {}", n.describe()),
                    }),
                    None => Err(DevlogError::Json {
                        path: format!("{path}.args"),
                        message: format!("expected a \"{key}\" key, found none"),
                    }),
                }
            };
            let optional = |v: Option<Num>, key: &str| -> Result<Option<i64>, DevlogError> {
                match v {
                    None | Some(Num::Null) => Ok(None),
                    Some(_) => required(v, key).map(Some),
                }
            };
            let addr = match args.addr {
                None | Some(Num::Null) => None,
                // A pointer printed unsigned above i64::MAX keeps its bits; one printed
                // signed below zero does too.
                Some(Num::Big(a)) => Some(a),
                Some(n) => match n.int() {
                    Some(a) => Some(a as u64),
                    None => {
                        return Err(DevlogError::Json {
                            path: format!("{path}.args.Addr"),
                            message: format!("expected an integer, found {}", n.describe()),
                        });
                    }
                },
            };
            let device_type = required(args.device_type, "Device Type")?;
            let device_id = required(args.device_id, "Device Id")?;
            let bytes = required(args.bytes, "Bytes")?;
            let total_allocated = optional(args.total_allocated, "Total Allocated")?;
            let total_reserved = optional(args.total_reserved, "Total Reserved")?;
            let pid = self.intern_id(e.pid, true);
            let tid = self.intern_id(e.tid, false);
            let thread = self.thread(pid, tid);
            self.memory.push(MemoryEvent {
                time_ns: ts,
                device_type,
                device_id,
                bytes,
                total_allocated,
                total_reserved,
                addr,
                thread: Some(thread),
                category: None,
            });
            return Ok(());
        }
        if e.ph_x
            && e.has_name
            && let Some(kind) = e.span_kind
            && let (Some(ts), Some(dur)) = (e.ts.and_then(rel_ns), e.dur.and_then(rel_ns))
            && dur >= 0
        {
            let pid = self.intern_id(e.pid, true);
            let tid = self.intern_id(e.tid, false);
            let thread = self.thread(pid, tid);
            let name = self.name_id();
            let call_stack = match &e.args {
                Some(Args::Object(a)) if a.call_stack && !self.call_stack.is_empty() => {
                    Some(self.intern_name(String::from_utf8_lossy(&self.call_stack).into_owned()))
                }
                _ => None,
            };
            self.spans.push(Span {
                thread,
                start_ns: ts,
                end_ns: ts.saturating_add(dur),
                name,
                kind,
                call_stack,
            });
        }
        Ok(())
    }

    fn finish(mut self) -> Result<ProfileTrace, DevlogError> {
        if self.rows_mode == Some(true) {
            let rows = std::mem::take(&mut self.rows);
            return memory_timeline::finish(rows, self.events);
        }
        if self.rows_mode.is_none() && !self.saw_trace_events {
            let message = if self.saw_snapshot_keys {
                return Err(DevlogError::WrongKind {
                    message: format!(
                        "this is a memory snapshot in JSON form, not {TRACE_KIND}; read it as a snapshot"
                    ),
                });
            } else {
                let mut keys = self.top_keys.clone();
                keys.sort_unstable();
                format!(
                    "expected a \"traceEvents\" list, found an object with keys {}",
                    if keys.is_empty() {
                        "none".to_string()
                    } else {
                        keys.iter()
                            .map(|k| format!("{k:?}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                )
            };
            return Err(DevlogError::Json {
                path: "(top level)".to_string(),
                message,
            });
        }
        // The clock: relative to the base when the times are small and a base is given.
        const ABSOLUTE_NS: i64 = 1_000_000_000_000_000_000; // 2001-09-09 in Unix ns
        let max_ts = self
            .memory
            .iter()
            .map(|m| m.time_ns)
            .chain(self.spans.iter().map(|s| s.start_ns))
            .max()
            .unwrap_or(0);
        let clock = match self.base_time_ns {
            Some(_) if max_ts < ABSOLUTE_NS => TraceClock::RelativeToBase,
            _ if max_ts >= ABSOLUTE_NS / 10 => TraceClock::Unix,
            None if self.memory.is_empty() && self.spans.is_empty() => TraceClock::Unix,
            _ => TraceClock::Unknown,
        };
        if clock == TraceClock::RelativeToBase {
            let base = self.base_time_ns.unwrap_or(0);
            for m in &mut self.memory {
                m.time_ns = m.time_ns.saturating_add(base);
            }
            for s in &mut self.spans {
                s.start_ns = s.start_ns.saturating_add(base);
                s.end_ns = s.end_ns.saturating_add(base);
            }
        }
        self.memory.sort_by_key(|m| m.time_ns);
        self.spans
            .sort_by_key(|s| (s.thread, s.start_ns, std::cmp::Reverse(s.end_ns)));
        Ok(ProfileTrace {
            kind: ProfileKind::KinetoTrace,
            clock,
            base_time_ns: self.base_time_ns,
            memory: self.memory,
            spans: self.spans,
            names: self.names,
            threads: self.thread_names,
            out_of_memory_events: self.out_of_memory,
            skipped_elements: self.skipped,
            events_read: self.events,
        })
    }
}

/// Microseconds as written (integer or decimal) to whole nanoseconds.
fn rel_ns(v: Num) -> Option<i64> {
    match v {
        Num::Int(i) => i.checked_mul(1000),
        Num::Float(f) => {
            let ns = (f * 1000.0).round();
            (ns.is_finite() && ns.abs() < 9.2e18).then_some(ns as i64)
        }
        _ => None,
    }
}

enum PendingId {
    None,
    Int(i64),
    /// The text is in the sink's pid or tid buffer.
    Str,
}

struct RawEvent {
    ph_x: bool,
    has_name: bool,
    span_kind: Option<SpanKind>,
    pid: PendingId,
    tid: PendingId,
    ts: Option<Num>,
    dur: Option<Num>,
    args: Option<Args>,
}

/// The `args` of an event, as far as `[memory]` events use them.
#[derive(Default)]
struct MemoryArgs {
    /// The event has a `Call stack` string (now in the sink's buffer).
    call_stack: bool,
    device_type: Option<Num>,
    device_id: Option<Num>,
    addr: Option<Num>,
    bytes: Option<Num>,
    total_allocated: Option<Num>,
    total_reserved: Option<Num>,
}

enum Args {
    Object(MemoryArgs),
    Not(Num),
}

/// One element of the event list: an event object, or a memory-timeline row.
struct Element<'a>(&'a mut Sink);

impl<'de> DeserializeSeed<'de> for Element<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Element<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let s = self.0;
        if s.rows_mode == Some(true) {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            let path = s.path();
            return Err(s.fail(
                path,
                "expected a memory-timeline row [timestamp_ns, action, numbytes, category], found an object".into(),
            ));
        }
        if s.list.is_empty() {
            s.rows_mode = Some(false);
        }
        let mut e = RawEvent {
            ph_x: false,
            has_name: false,
            span_kind: None,
            pid: PendingId::None,
            tid: PendingId::None,
            ts: None,
            dur: None,
            args: None,
        };
        s.name.clear();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match key {
                Key::Ph => {
                    map.next_value_seed(BytesInto(&mut s.ph))?;
                    e.ph_x = s.ph == b"X";
                }
                Key::Name => e.has_name = map.next_value_seed(BytesInto(&mut s.name))?,
                Key::Cat => {
                    map.next_value_seed(BytesInto(&mut s.cat))?;
                    e.span_kind = match s.cat.as_slice() {
                        b"cpu_op" | b"Operator" | b"operator" => Some(SpanKind::Operator),
                        b"python_function" => Some(SpanKind::PythonFunction),
                        b"user_annotation" => Some(SpanKind::Annotation),
                        _ => None,
                    };
                }
                Key::Pid => e.pid = map.next_value_seed(IdSeed(&mut s.pid))?,
                Key::Tid => e.tid = map.next_value_seed(IdSeed(&mut s.tid))?,
                Key::Ts => e.ts = Some(map.next_value::<Num>()?),
                Key::Dur => e.dur = Some(map.next_value::<Num>()?),
                Key::Args => e.args = Some(map.next_value_seed(ArgsSeed(&mut s.call_stack))?),
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        match s.take_event(e) {
            Ok(()) => Ok(()),
            Err(error) => {
                s.error = Some(error);
                Err(de::Error::custom("stopped"))
            }
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let s = self.0;
        if s.list.is_empty() && s.rows_mode != Some(false) {
            s.rows_mode = Some(true);
            s.events += 1;
            let mut items = Vec::with_capacity(4);
            while let Some(item) = seq.next_element::<RowItem>()? {
                items.push(item);
            }
            let index = s.index;
            return match s.rows.push(index, items) {
                Ok(()) => Ok(()),
                Err(error) => {
                    s.error = Some(error);
                    Err(de::Error::custom("stopped"))
                }
            };
        }
        // A list among events: skipped, as other non-event elements, and counted.
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        s.skipped += 1;
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.scalar(Num::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.scalar(Num::Big(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.scalar(Num::Float(v))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.scalar(Num::Other(OtherKind::String))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.scalar(Num::Other(OtherKind::Bool(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.scalar(Num::Null)
    }
}

impl Element<'_> {
    /// A scalar among events is skipped; at the top level it is not a trace.
    fn scalar<E: de::Error>(self, v: Num) -> Result<(), E> {
        let s = self.0;
        if s.list.is_empty() {
            let path = s.path();
            return Err(s.fail(
                path,
                format!(
                    "expected {TRACE_KIND} or memory-timeline raw rows [timestamp_ns, action, numbytes, category], found {}",
                    v.describe()
                ),
            ));
        }
        s.skipped += 1;
        Ok(())
    }
}

/// The keys of an event that matter.
enum Key {
    Ph,
    Name,
    Cat,
    Pid,
    Tid,
    Ts,
    Dur,
    Args,
    Other,
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        // Bytes: keys are matched without a UTF-8 check.
        d.deserialize_bytes(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        self.visit_bytes(v.as_bytes())
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Key, E> {
        Ok(match v {
            b"ph" => Key::Ph,
            b"name" => Key::Name,
            b"cat" => Key::Cat,
            b"pid" => Key::Pid,
            b"tid" => Key::Tid,
            b"ts" => Key::Ts,
            b"dur" => Key::Dur,
            b"args" => Key::Args,
            _ => Key::Other,
        })
    }
}

/// A pid or tid: numbers kept, strings copied into a reused buffer.
struct IdSeed<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for IdSeed<'_> {
    type Value = PendingId;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<PendingId, D::Error> {
        let buf = self.0;
        match d.deserialize_any(IdVisitor(buf))? {
            Some(i) => Ok(PendingId::Int(i)),
            None if !buf.is_empty() => Ok(PendingId::Str),
            None => Ok(PendingId::None),
        }
    }
}

struct IdVisitor<'a>(&'a mut Vec<u8>);

impl<'de> Visitor<'de> for IdVisitor<'_> {
    type Value = Option<i64>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number or a string")
    }

    fn visit_i64<E>(self, v: i64) -> Result<Option<i64>, E> {
        self.0.clear();
        Ok(Some(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Option<i64>, E> {
        self.0.clear();
        Ok(Some(v as i64))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Option<i64>, E> {
        self.0.clear();
        Ok(Some(v as i64))
    }

    fn visit_str<E>(self, v: &str) -> Result<Option<i64>, E> {
        self.0.clear();
        // 2021 traces write an operator's tid as text and a memory event's as a number.
        if let Ok(i) = v.trim().parse::<i64>() {
            return Ok(Some(i));
        }
        self.0
            .extend_from_slice(if v.is_empty() { b" " } else { v.as_bytes() });
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<i64>, E> {
        self.0.clear();
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<i64>, E> {
        self.0.clear();
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<i64>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.0.clear();
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<i64>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        self.0.clear();
        Ok(None)
    }
}

/// An event's `args`: the six keys `[memory]` events carry and an operator's `Call stack`
/// (into the buffer), everything else skipped.
struct ArgsSeed<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for ArgsSeed<'_> {
    type Value = Args;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Args, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ArgsSeed<'_> {
    type Value = Args;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Args, A::Error> {
        let mut a = MemoryArgs::default();
        self.0.clear();
        while let Some(key) = map.next_key_seed(ArgKeySeed)? {
            let slot = match key {
                ArgKey::CallStack => {
                    a.call_stack = map.next_value_seed(BytesInto(self.0))?;
                    continue;
                }
                ArgKey::DeviceType => &mut a.device_type,
                ArgKey::DeviceId => &mut a.device_id,
                ArgKey::Addr => &mut a.addr,
                ArgKey::Bytes => &mut a.bytes,
                ArgKey::TotalAllocated => &mut a.total_allocated,
                ArgKey::TotalReserved => &mut a.total_reserved,
                ArgKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = Some(map.next_value::<Num>()?);
        }
        Ok(Args::Object(a))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Args, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Args::Not(Num::Other(OtherKind::List)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Args, E> {
        Ok(Args::Not(Num::Int(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Args, E> {
        Ok(Args::Not(Num::Big(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Args, E> {
        Ok(Args::Not(Num::Float(v)))
    }

    fn visit_str<E>(self, _: &str) -> Result<Args, E> {
        Ok(Args::Not(Num::Other(OtherKind::String)))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Args, E> {
        Ok(Args::Not(Num::Other(OtherKind::Bool(v))))
    }

    fn visit_unit<E>(self) -> Result<Args, E> {
        Ok(Args::Not(Num::Null))
    }
}

enum ArgKey {
    DeviceType,
    DeviceId,
    Addr,
    Bytes,
    TotalAllocated,
    TotalReserved,
    CallStack,
    Other,
}

struct ArgKeySeed;

impl<'de> DeserializeSeed<'de> for ArgKeySeed {
    type Value = ArgKey;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ArgKey, D::Error> {
        d.deserialize_bytes(self)
    }
}

impl<'de> Visitor<'de> for ArgKeySeed {
    type Value = ArgKey;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ArgKey, E> {
        self.visit_bytes(v.as_bytes())
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<ArgKey, E> {
        Ok(match v {
            b"Device Type" => ArgKey::DeviceType,
            b"Device Id" => ArgKey::DeviceId,
            b"Addr" => ArgKey::Addr,
            b"Bytes" => ArgKey::Bytes,
            b"Total Allocated" => ArgKey::TotalAllocated,
            b"Total Reserved" => ArgKey::TotalReserved,
            b"Call stack" => ArgKey::CallStack,
            _ => ArgKey::Other,
        })
    }
}
