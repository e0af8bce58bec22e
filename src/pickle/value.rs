//! Values produced by the pickle reader: the plain data types a data-only pickle can hold.

use std::rc::Rc;

/// Identifies one list while it is being built, for [`crate::pickle::Builder`] callbacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListId(pub u64);

/// One unpickled value. Containers are reference counted so that memo references share
/// them instead of copying (snapshots reference one frames list from thousands of places).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    /// An integer that fits in `i64`.
    Int(i64),
    /// A larger integer, as little-endian two's-complement bytes (at least 9 of them).
    BigInt(Rc<[u8]>),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    List(Rc<Vec<Value>>),
    Tuple(Rc<Vec<Value>>),
    Dict(Rc<Vec<(Value, Value)>>),
    Set(Rc<Vec<Value>>),
    /// A list whose elements a [`crate::pickle::Builder`] took over while reading.
    Absorbed {
        list: ListId,
        len: u64,
    },
    /// An opaque value a [`crate::pickle::Builder`] put in place of a list it took over.
    Handle(u64),
}

impl Value {
    /// The Python type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) | Value::Absorbed { .. } | Value::Handle(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an `i128` when it is an integer (or a bool) that fits.
    pub fn as_i128(&self) -> Option<i128> {
        match self {
            Value::Int(i) => Some(*i as i128),
            Value::Bool(b) => Some(*b as i128),
            Value::BigInt(bytes) => {
                if bytes.len() > 16 {
                    // Normalised encodings longer than 16 bytes are out of i128 range.
                    return None;
                }
                let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
                let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
                buf[..bytes.len()].copy_from_slice(bytes);
                Some(i128::from_le_bytes(buf))
            }
            _ => None,
        }
    }

    /// The value as a `u64` when it is a non-negative integer below 2^64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// The value as an `i64` when it is an integer in range.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Elements of a list or tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// Looks a string key up in a dict (linear: snapshot dicts have a dozen keys). When a
    /// key repeats, the last one wins, as in Python.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_dict()?
            .iter()
            .rev()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// Builds an integer value from little-endian two's-complement bytes, as LONG1/LONG4
    /// store them.
    pub fn from_le_signed(bytes: &[u8]) -> Value {
        if bytes.is_empty() {
            return Value::Int(0);
        }
        // Drop redundant sign-extension bytes so that equal numbers compare equal.
        let mut len = bytes.len();
        while len > 1 {
            let last = bytes[len - 1];
            let prev_sign = bytes[len - 2] & 0x80;
            if (last == 0x00 && prev_sign == 0) || (last == 0xff && prev_sign != 0) {
                len -= 1;
            } else {
                break;
            }
        }
        let bytes = &bytes[..len];
        if len <= 8 {
            let negative = bytes[len - 1] & 0x80 != 0;
            let mut buf = if negative { [0xffu8; 8] } else { [0u8; 8] };
            buf[..len].copy_from_slice(bytes);
            Value::Int(i64::from_le_bytes(buf))
        } else {
            Value::BigInt(bytes.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_bytes_normalise_and_convert() {
        assert_eq!(Value::from_le_signed(&[]), Value::Int(0));
        assert_eq!(Value::from_le_signed(&[0xff]), Value::Int(-1));
        assert_eq!(Value::from_le_signed(&[0xff, 0x00]), Value::Int(255));
        assert_eq!(
            Value::from_le_signed(&[0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Value::Int(0)
        );
        // 2^63 needs 9 bytes.
        let v = Value::from_le_signed(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]);
        assert!(matches!(v, Value::BigInt(_)));
        assert_eq!(v.as_u64(), Some(1u64 << 63));
        assert_eq!(v.as_i64(), None);
        // 2^64 - 1
        let v = Value::from_le_signed(&[0xff; 8].iter().copied().chain([0]).collect::<Vec<_>>());
        assert_eq!(v.as_u64(), Some(u64::MAX));
        // -2^63 fits i64.
        assert_eq!(
            Value::from_le_signed(&[0, 0, 0, 0, 0, 0, 0, 0x80]),
            Value::Int(i64::MIN)
        );
        // 2^64 is out of u64 range.
        let v = Value::from_le_signed(&[0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(v.as_u64(), None);
        assert_eq!(v.as_i128(), Some(1i128 << 64));
    }
}
