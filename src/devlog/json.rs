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

/// Reads a string value into a reused buffer (no allocation per value); any other value is
/// skipped and leaves the buffer empty. Returns whether it was a string.
pub(crate) struct StrInto<'a>(pub &'a mut String);

impl<'de> DeserializeSeed<'de> for StrInto<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        self.0.clear();
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrInto<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        self.0.push_str(v);
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
