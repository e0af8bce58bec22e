//! Small JSON helpers shared by the readers: numbers read leniently, kinds named for error
//! messages, and the pieces of a streaming reader (numbers and ids that never allocate).

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::fmt;

/// An integer from a JSON number: integers as they are, floats only when whole and in range.
pub(crate) fn as_int(v: &Value) -> Option<i64> {
    if let Some(n) = v.as_i64() {
        return Some(n);
    }
    if v.is_u64() {
        return None;
    }
    float_as_int(v.as_f64()?)
}

/// A whole float in the range of i64.
pub(crate) fn float_as_int(f: f64) -> Option<i64> {
    // 2^63 as f64 is exact; anything at or above it does not fit.
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    (f.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&f)).then_some(f as i64)
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The kind, with the value when it is short.
pub(crate) fn kind_value(v: &Value) -> String {
    match v {
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {}", super::quote(s)),
        Value::Bool(b) => format!("{b}"),
        other => kind(other).to_string(),
    }
}

/// serde_json's message without its " at line L column C" suffix (the caller places it).
pub(crate) fn serde_message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// A JSON value read without keeping it: a number, or what else it was (for messages).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Num {
    Int(i64),
    /// Above i64::MAX.
    Big(u64),
    Float(f64),
    Null,
    /// Not a number: a string, boolean, list or object.
    Other(OtherKind),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OtherKind {
    String,
    Bool(bool),
    List,
    Object,
}

impl Num {
    /// An integer: integers as they are, floats only when whole.
    pub(crate) fn int(self) -> Option<i64> {
        match self {
            Num::Int(i) => Some(i),
            Num::Float(f) => float_as_int(f),
            _ => None,
        }
    }

    pub(crate) fn float(self) -> Option<f64> {
        match self {
            Num::Int(i) => Some(i as f64),
            Num::Big(u) => Some(u as f64),
            Num::Float(f) => Some(f),
            _ => None,
        }
    }

    /// What it was, for messages ("the number 1.5", "a string").
    pub(crate) fn describe(self) -> String {
        match self {
            Num::Int(i) => format!("the number {i}"),
            Num::Big(u) => format!("the number {u}"),
            // Far from 1, in exponent form: `1e308`, not 309 digits.
            Num::Float(f) if f != 0.0 && !(1e-6..1e16).contains(&f.abs()) => {
                format!("the number {f:e}")
            }
            Num::Float(f) => format!("the number {f}"),
            Num::Null => "null".into(),
            Num::Other(OtherKind::String) => "a string".into(),
            Num::Other(OtherKind::Bool(b)) => format!("{b}"),
            Num::Other(OtherKind::List) => "a list".into(),
            Num::Other(OtherKind::Object) => "an object".into(),
        }
    }

    /// The kind only ("a number", "a string").
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Num::Int(_) | Num::Big(_) | Num::Float(_) => "a number",
            Num::Null => "null",
            Num::Other(OtherKind::String) => "a string",
            Num::Other(OtherKind::Bool(_)) => "a boolean",
            Num::Other(OtherKind::List) => "a list",
            Num::Other(OtherKind::Object) => "an object",
        }
    }
}

impl<'de> de::Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Num, D::Error> {
        d.deserialize_any(NumVisitor)
    }
}

struct NumVisitor;

impl<'de> Visitor<'de> for NumVisitor {
    type Value = Num;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_i64<E>(self, v: i64) -> Result<Num, E> {
        Ok(Num::Int(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Num, E> {
        Ok(i64::try_from(v).map_or(Num::Big(v), Num::Int))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Num, E> {
        Ok(Num::Float(v))
    }

    fn visit_str<E>(self, _: &str) -> Result<Num, E> {
        Ok(Num::Other(OtherKind::String))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Num, E> {
        Ok(Num::Other(OtherKind::Bool(v)))
    }

    fn visit_unit<E>(self) -> Result<Num, E> {
        Ok(Num::Null)
    }

    fn visit_none<E>(self) -> Result<Num, E> {
        Ok(Num::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Num, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Num::Other(OtherKind::List))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Num, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Num::Other(OtherKind::Object))
    }
}

/// Reads a string value's bytes into a reused buffer (no allocation, and no UTF-8 check,
/// per value: callers check what they keep); any other value is skipped and leaves the
/// buffer empty. Returns whether it was a string.
pub(crate) struct BytesInto<'a>(pub &'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for BytesInto<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        self.0.clear();
        d.deserialize_bytes(self)
    }
}

impl<'de> Visitor<'de> for BytesInto<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<bool, E> {
        self.0.extend_from_slice(v);
        Ok(true)
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        self.0.extend_from_slice(v.as_bytes());
        Ok(true)
    }

    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

/// A JSON text read in chunks and cut into values without parsing them: the reader of
/// large traces takes the top level apart here and hands each event's bytes to
/// `serde_json::from_slice`, which is several times faster than parsing from a reader byte
/// by byte. Memory holds one chunk and the value being cut, never the whole text.
pub(crate) struct Chunks<R> {
    reader: R,
    buf: Vec<u8>,
    /// Start of the unread text in `buf`.
    pos: usize,
    eof: bool,
    /// 1-based line of `buf[pos]`, and the offset in `buf` where that line starts (it may
    /// be negative: the line started in an earlier chunk).
    line: usize,
    line_start: isize,
    /// Bytes asked of the reader next: 64 KiB at first, doubling to [`CHUNK`], so small
    /// inputs cost little.
    step: usize,
}

/// Where a syntax problem is, and what was expected.
#[derive(Debug)]
pub(crate) struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// A failure of the cutting: the stream could not be read, or its text is not JSON.
#[derive(Debug)]
pub(crate) enum CutError {
    Io(std::io::Error),
    Syntax(SyntaxError),
}

const CHUNK: usize = 1 << 20;

impl<R: std::io::Read> Chunks<R> {
    pub(crate) fn new(reader: R) -> Self {
        Chunks {
            reader,
            buf: Vec::new(),
            pos: 0,
            eof: false,
            line: 1,
            line_start: 0,
            step: 64 << 10,
        }
    }

    /// Reads more text (a full step, less only at the end); false at the end of the
    /// stream.
    fn more(&mut self) -> Result<bool, CutError> {
        if self.eof {
            return Ok(false);
        }
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.line_start -= self.pos as isize;
            self.pos = 0;
        }
        let len = self.buf.len();
        self.buf.resize(len + self.step, 0);
        self.step = (self.step * 2).min(CHUNK);
        let mut filled = len;
        while filled < self.buf.len() {
            match self.reader.read(&mut self.buf[filled..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.buf.truncate(filled);
                    return Err(CutError::Io(e));
                }
            }
        }
        self.buf.truncate(filled);
        Ok(filled > len)
    }

    /// The position of `buf[at]` as (line, column), both from 1.
    fn place(&self, at: usize) -> (usize, usize) {
        let mut line = self.line;
        let mut start = self.line_start;
        for (i, &b) in self.buf[self.pos..at].iter().enumerate() {
            if b == b'\n' {
                line += 1;
                start = (self.pos + i + 1) as isize;
            }
        }
        (line, (at as isize - start) as usize + 1)
    }

    pub(crate) fn error_here(&self, message: impl Into<String>) -> CutError {
        let at = self.pos.min(self.buf.len());
        let (line, column) = self.place(at);
        CutError::Syntax(SyntaxError {
            line,
            column,
            message: message.into(),
        })
    }

    /// Moves past `n` bytes, keeping the line count.
    fn consume(&mut self, n: usize) {
        let end = self.pos + n;
        let part = &self.buf[self.pos..end];
        if let Some(last) = memchr::memrchr(b'\n', part) {
            self.line += memchr::memchr_iter(b'\n', part).count();
            self.line_start = (self.pos + last + 1) as isize;
        }
        self.pos = end;
    }

    /// The next byte that is not white space, without consuming it; None at the end.
    pub(crate) fn peek(&mut self) -> Result<Option<u8>, CutError> {
        loop {
            while self.pos < self.buf.len() {
                let b = self.buf[self.pos];
                if !matches!(b, b' ' | b'\t' | b'\r' | b'\n') {
                    return Ok(Some(b));
                }
                self.consume(1);
            }
            if !self.more()? {
                return Ok(None);
            }
        }
    }

    /// Consumes the next non-blank byte, which must be `want`.
    pub(crate) fn expect(&mut self, want: u8, what: &str) -> Result<(), CutError> {
        match self.peek()? {
            Some(b) if b == want => {
                self.consume(1);
                Ok(())
            }
            Some(_) => Err(self.error_here(format!("expected {what}"))),
            None => Err(self.error_here(format!("EOF while parsing a value, expected {what}"))),
        }
    }

    /// Consumes `want` if it is the next non-blank byte.
    pub(crate) fn eat(&mut self, want: u8) -> Result<bool, CutError> {
        if self.peek()? == Some(want) {
            self.consume(1);
            return Ok(true);
        }
        Ok(false)
    }

    /// The next value (after white space), cut out whole: its bytes, and the (line,
    /// column) where it starts. The bytes are valid until the next call.
    pub(crate) fn value(&mut self) -> Result<(&[u8], (usize, usize)), CutError> {
        if self.peek()?.is_none() {
            return Err(self.error_here("EOF while parsing a value"));
        }
        let start_place = (
            self.line,
            (self.pos as isize - self.line_start) as usize + 1,
        );
        let first = self.buf[self.pos];
        let (open, close) = match first {
            b'{' => (b'{', b'}'),
            b'[' => (b'[', b']'),
            _ => (0, 0),
        };
        let mut at = self.pos;
        if open == 0 {
            // A string or a scalar: up to its closing quote, or to a delimiter.
            let in_string = first == b'"';
            if in_string {
                at += 1;
            }
            loop {
                if at >= self.buf.len() {
                    let offset = at - self.pos;
                    let got = self.more()?;
                    at = self.pos + offset;
                    if !got {
                        if in_string {
                            return Err(self.error_here("EOF while parsing a string"));
                        }
                        break;
                    }
                    continue;
                }
                let b = self.buf[at];
                if in_string {
                    match memchr::memchr2(b'"', b'\\', &self.buf[at..]) {
                        Some(k) if self.buf[at + k] == b'\\' => {
                            at += k + 2;
                        }
                        Some(k) => {
                            at += k + 1;
                            break;
                        }
                        None => at = self.buf.len(),
                    }
                    continue;
                }
                if matches!(b, b',' | b' ' | b'\t' | b'\r' | b'\n' | b':' | b'}' | b']') {
                    break;
                }
                at += 1;
            }
        } else {
            // A container: only its own brackets and strings matter for finding its end
            // (the other kind of bracket balances inside it).
            let mut depth = 0usize;
            let mut in_string = false;
            loop {
                if at >= self.buf.len() {
                    let offset = at - self.pos;
                    let got = self.more()?;
                    at = self.pos + offset;
                    if !got {
                        return Err(self.error_here("EOF while parsing a value"));
                    }
                    continue;
                }
                if in_string {
                    match memchr::memchr2(b'"', b'\\', &self.buf[at..]) {
                        Some(k) if self.buf[at + k] == b'\\' => at += k + 2,
                        Some(k) => {
                            at += k + 1;
                            in_string = false;
                        }
                        None => at = self.buf.len(),
                    }
                    continue;
                }
                match memchr::memchr3(b'"', open, close, &self.buf[at..]) {
                    None => at = self.buf.len(),
                    Some(k) => {
                        let b = self.buf[at + k];
                        at += k + 1;
                        if b == b'"' {
                            in_string = true;
                        } else if b == open {
                            depth += 1;
                        } else {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                    }
                }
            }
        }
        let start = self.pos;
        self.consume(at - start);
        Ok((&self.buf[start..at], start_place))
    }
}
