//! What a snapshot holds beyond the fields the analyses read, kept so that it can be
//! written back whole ([`super::encode`]): keys this version does not interpret (with
//! their values), `forward_frames` of segments and blocks, and the full `history` of
//! 1.13/2.0 blocks (the model's blocks carry only the newest record).
//!
//! Extras are sparse: most snapshots have none but the history of 2.0 files.

use super::frames::{StackId, StrId};
use crate::pickle::Value;
use std::collections::BTreeMap;

/// A value kept as it was read, for keys the model does not interpret.
#[derive(Clone, Debug, PartialEq)]
pub enum Extra {
    None,
    Bool(bool),
    Int(i128),
    /// An integer beyond `i128`, as little-endian two's-complement bytes.
    BigInt(Box<[u8]>),
    Float(f64),
    Str(String),
    Bytes(Box<[u8]>),
    /// A list (sets are kept as lists).
    List(Vec<Extra>),
    Tuple(Vec<Extra>),
    Dict(Vec<(Extra, Extra)>),
    /// A list of frames, interned like every other stack.
    Stack(StackId),
    /// A list whose elements were decoded as trace entries elsewhere; not kept.
    Dropped,
}

impl Extra {
    /// Converts a value read from the file.
    pub fn from_value(v: &Value) -> Extra {
        match v {
            Value::None => Extra::None,
            Value::Bool(b) => Extra::Bool(*b),
            Value::Int(i) => Extra::Int(*i as i128),
            Value::BigInt(bytes) => match v.as_i128() {
                Some(i) => Extra::Int(i),
                None => Extra::BigInt(bytes.as_ref().into()),
            },
            Value::Float(f) => Extra::Float(*f),
            Value::Str(s) => Extra::Str(s.to_string()),
            Value::Bytes(b) => Extra::Bytes(b.as_ref().into()),
            Value::List(items) | Value::Set(items) => {
                Extra::List(items.iter().map(Extra::from_value).collect())
            }
            Value::Tuple(items) => Extra::Tuple(items.iter().map(Extra::from_value).collect()),
            Value::Dict(pairs) => Extra::Dict(
                pairs
                    .iter()
                    .map(|(k, v)| (Extra::from_value(k), Extra::from_value(v)))
                    .collect(),
            ),
            Value::Handle(id) => Extra::Stack(StackId(*id as u32)),
            Value::Absorbed { .. } => Extra::Dropped,
        }
    }

    /// Every string inside, for rewriting in place.
    /// Visits every text of the value: strings, bytes (as text, decoded lossily, and
    /// written back as its UTF-8 when changed or not UTF-8), and dict keys.
    pub fn strings_mut(&mut self, f: &mut dyn FnMut(&mut String)) {
        match self {
            Extra::Str(s) => f(s),
            Extra::Bytes(b) => {
                let mut text = String::from_utf8_lossy(b).into_owned();
                let exact = text.as_bytes() == &b[..];
                let before = text.clone();
                f(&mut text);
                if text != before || !exact {
                    *b = text.into_bytes().into_boxed_slice();
                }
            }
            Extra::List(items) | Extra::Tuple(items) => {
                for item in items {
                    item.strings_mut(f);
                }
            }
            Extra::Dict(pairs) => {
                for (k, v) in pairs {
                    k.strings_mut(f);
                    v.strings_mut(f);
                }
            }
            _ => {}
        }
    }
}

/// Keys of one dict that the model does not interpret, in file order.
pub type ExtraKeys = Vec<(String, Extra)>;

/// Where in the file a segment, block or annotation extra belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Place {
    /// The top-level dict.
    Root,
    /// `segments[segment]`, or `host_segments[segment]` when `host`.
    Segment { host: bool, segment: u32 },
    /// `blocks[block]` of that segment.
    Block {
        host: bool,
        segment: u32,
        block: u32,
    },
    /// `external_annotations[index]`.
    Annotation(u32),
}

/// One record of a 1.13/2.0 block `history` (newest first in the file).
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryRecord {
    pub addr: u64,
    pub real_size: Option<u64>,
    pub stack: Option<StackId>,
    /// 2.0 `cpp_frames` text.
    pub cpp_frames: Option<StrId>,
    pub extra: ExtraKeys,
}

/// The `history` of one block.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockHistory {
    /// The block's own `requested_size` key (2.0); the model's block takes the newest
    /// record's `real_size` instead.
    pub requested_size: Option<u64>,
    pub records: Vec<HistoryRecord>,
}

/// Everything kept beyond the model's fields. Trace entries keep theirs beside the
/// events ([`super::DeviceTrace::extra_keys`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extras {
    pub keys: BTreeMap<Place, ExtraKeys>,
    /// `forward_frames` of segments and blocks (2.11 and later).
    pub forward_frames: BTreeMap<Place, Vec<StrId>>,
    pub history: BTreeMap<Place, BlockHistory>,
}

impl Extras {
    pub fn add_key(&mut self, place: Place, key: &str, value: &Value) {
        self.keys
            .entry(place)
            .or_default()
            .push((key.to_string(), Extra::from_value(value)));
    }

    pub fn keys_at(&self, place: Place) -> &[(String, Extra)] {
        self.keys.get(&place).map_or(&[], |k| k.as_slice())
    }
}
