//! A data-only pickle writer (protocol 4) that lays out bytes as CPython's C pickler does
//! when `pickle.dump` writes to a file.
//!
//! The caller walks its own data and calls one method per value; containers are opened
//! with their length and closed explicitly. Sharing is the caller's choice: every string,
//! list, dict and tuple gets a memo slot ([`MemoId`]) when written, and [`PickleWriter::get`]
//! refers back to it, as CPython does for an object it has already written. What this
//! reproduces of CPython's output:
//!
//! - `PROTO 4`, then FRAME opcodes: a frame is closed at the first object boundary once it
//!   holds 64 KiB or more (CPython checks before saving each object); a closing frame under
//!   4 bytes gets no header; a string of 64 KiB or more is written outside any frame.
//! - Lists and dicts: `EMPTY_LIST`/`EMPTY_DICT` + `MEMOIZE`, then a single item with
//!   `APPEND`/`SETITEM`, or batches of at most 1000 between `MARK` and `APPENDS`/`SETITEMS`
//!   (a dict whose length is a multiple of 1000 ends with an empty batch, as CPython's does).
//! - Tuples: `EMPTY_TUPLE` (not memoised), `TUPLE1..3` or `MARK .. TUPLE`, then `MEMOIZE`.
//! - Integers in the smallest of `BININT1`, `BININT2`, `BININT`, `LONG1`/`LONG4` (minimal
//!   two's complement); floats as `BINFLOAT`; strings as `SHORT_BINUNICODE`, `BINUNICODE`
//!   or `BINUNICODE8`, each followed by `MEMOIZE`; memo references as `BINGET` or
//!   `LONG_BINGET`.
//!
//! It writes nothing that imports or calls (no GLOBAL, REDUCE, BUILD), and, like the
//! reader, knows nothing of PyTorch.

use std::io::{self, Write};

use super::opcodes::{
    APPEND, APPENDS, BINBYTES, BINBYTES8, BINFLOAT, BINGET, BININT, BININT1, BININT2, BINUNICODE,
    BINUNICODE8, EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, FRAME, LONG_BINGET, LONG1, LONG4, MARK,
    MEMOIZE, NEWFALSE, NEWTRUE, NONE, PROTO, SETITEM, SETITEMS, SHORT_BINBYTES, SHORT_BINUNICODE,
    STOP, TUPLE, TUPLE1, TUPLE2, TUPLE3,
};

/// CPython closes a frame at the first object boundary past this many bytes.
pub const FRAME_SIZE_TARGET: usize = 64 * 1024;
/// Frames shorter than this are written without a FRAME header.
const FRAME_SIZE_MIN: usize = 4;
/// Items per MARK .. APPENDS / SETITEMS batch.
const BATCH_SIZE: u64 = 1000;

/// The memo slot of a value already written; pass it to [`PickleWriter::get`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemoId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    List,
    Dict,
    Tuple,
}

#[derive(Debug)]
struct Open {
    kind: Kind,
    /// Items announced (pairs for a dict).
    len: u64,
    /// Values written so far (a dict counts keys and values).
    values: u64,
}

fn misuse(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message.to_string())
}

/// Writes one pickle (protocol 4) to `out`. Call [`PickleWriter::finish`] at the end.
pub struct PickleWriter<W: Write> {
    out: W,
    /// The current frame's bytes (FRAME header excluded).
    frame: Vec<u8>,
    frame_open: bool,
    memo_len: u32,
    open: Vec<Open>,
    /// The root value has been written.
    done: bool,
}

impl<W: Write> PickleWriter<W> {
    /// Starts a pickle: writes `PROTO 4`.
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(&[PROTO, 4])?;
        Ok(PickleWriter {
            out,
            frame: Vec::with_capacity(FRAME_SIZE_TARGET + 4096),
            frame_open: false,
            memo_len: 0,
            open: Vec::new(),
            done: false,
        })
    }

    /// Number of memo slots used so far.
    pub fn memo_len(&self) -> u32 {
        self.memo_len
    }

    fn put(&mut self, bytes: &[u8]) {
        self.frame_open = true;
        self.frame.extend_from_slice(bytes);
    }

    fn commit_frame(&mut self) -> io::Result<()> {
        if !self.frame_open {
            return Ok(());
        }
        if self.frame.len() >= FRAME_SIZE_MIN {
            let mut header = [0u8; 9];
            header[0] = FRAME;
            header[1..].copy_from_slice(&(self.frame.len() as u64).to_le_bytes());
            self.out.write_all(&header)?;
        }
        self.out.write_all(&self.frame)?;
        self.frame.clear();
        self.frame_open = false;
        Ok(())
    }

    /// Called before every value, as CPython's `save()` checks before saving an object.
    fn begin_value(&mut self) -> io::Result<()> {
        if self.done {
            return Err(misuse("pickle writer: a value after the root value"));
        }
        if let Some(top) = self.open.last()
            && top.kind != Kind::Tuple
        {
            let capacity = if top.kind == Kind::Dict {
                top.len * 2
            } else {
                top.len
            };
            if top.values >= capacity {
                return Err(misuse(
                    "pickle writer: more items than the container announced",
                ));
            }
        }
        if self.frame_open && self.frame.len() >= FRAME_SIZE_TARGET {
            self.commit_frame()?;
        }
        Ok(())
    }

    /// Called after every complete value: counts it and writes batch ends.
    fn end_value(&mut self) {
        let Some(top) = self.open.last_mut() else {
            self.done = true;
            return;
        };
        top.values += 1;
        match top.kind {
            Kind::List => {
                if top.len >= 2 && top.values % BATCH_SIZE == 0 && top.values < top.len {
                    self.put(&[APPENDS, MARK]);
                }
            }
            Kind::Dict => {
                // CPython's dict loop starts a new batch after every full one, even when
                // no item is left.
                if top.len >= 2 && top.values % (2 * BATCH_SIZE) == 0 {
                    self.put(&[SETITEMS, MARK]);
                }
            }
            Kind::Tuple => {}
        }
    }

    fn memoize(&mut self) -> MemoId {
        self.put(&[MEMOIZE]);
        let id = MemoId(self.memo_len);
        self.memo_len += 1;
        id
    }

    pub fn none(&mut self) -> io::Result<()> {
        self.begin_value()?;
        self.put(&[NONE]);
        self.end_value();
        Ok(())
    }

    pub fn bool(&mut self, b: bool) -> io::Result<()> {
        self.begin_value()?;
        self.put(&[if b { NEWTRUE } else { NEWFALSE }]);
        self.end_value();
        Ok(())
    }

    pub fn int(&mut self, v: i128) -> io::Result<()> {
        self.begin_value()?;
        if (0..256).contains(&v) {
            self.put(&[BININT1, v as u8]);
        } else if (0..65536).contains(&v) {
            let b = (v as u16).to_le_bytes();
            self.put(&[BININT2, b[0], b[1]]);
        } else if (i32::MIN as i128..=i32::MAX as i128).contains(&v) {
            let mut op = [BININT, 0, 0, 0, 0];
            op[1..].copy_from_slice(&(v as i32).to_le_bytes());
            self.put(&op);
        } else {
            let bytes = v.to_le_bytes();
            let len = minimal_signed_len(&bytes);
            self.put(&[LONG1, len as u8]);
            self.put(&bytes[..len]);
        }
        self.end_value();
        Ok(())
    }

    pub fn int_u64(&mut self, v: u64) -> io::Result<()> {
        self.int(v as i128)
    }

    pub fn int_i64(&mut self, v: i64) -> io::Result<()> {
        self.int(v as i128)
    }

    /// An integer given as little-endian two's-complement bytes (any length).
    pub fn int_le_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() <= 16 {
            let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
            let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
            buf[..bytes.len()].copy_from_slice(bytes);
            return self.int(i128::from_le_bytes(buf));
        }
        self.begin_value()?;
        let len = minimal_signed_len(bytes);
        if len < 256 {
            self.put(&[LONG1, len as u8]);
        } else {
            let mut op = [LONG4, 0, 0, 0, 0];
            op[1..].copy_from_slice(&(len as u32).to_le_bytes());
            self.put(&op);
        }
        self.put(&bytes[..len]);
        self.end_value();
        Ok(())
    }

    pub fn float(&mut self, v: f64) -> io::Result<()> {
        self.begin_value()?;
        let mut op = [BINFLOAT, 0, 0, 0, 0, 0, 0, 0, 0];
        op[1..].copy_from_slice(&v.to_be_bytes());
        self.put(&op);
        self.end_value();
        Ok(())
    }

    /// Writes a header and a payload; payloads of 64 KiB or more go outside any frame.
    fn payload(&mut self, header: &[u8], data: &[u8]) -> io::Result<()> {
        if data.len() >= FRAME_SIZE_TARGET {
            self.commit_frame()?;
            self.out.write_all(header)?;
            self.out.write_all(data)?;
        } else {
            self.put(header);
            self.put(data);
        }
        Ok(())
    }

    /// Writes a string and gives its memo slot.
    pub fn str(&mut self, s: &str) -> io::Result<MemoId> {
        self.begin_value()?;
        let data = s.as_bytes();
        let n = data.len();
        if n < 256 {
            self.payload(&[SHORT_BINUNICODE, n as u8], data)?;
        } else if n <= u32::MAX as usize {
            let mut h = [BINUNICODE, 0, 0, 0, 0];
            h[1..].copy_from_slice(&(n as u32).to_le_bytes());
            self.payload(&h, data)?;
        } else {
            let mut h = [BINUNICODE8, 0, 0, 0, 0, 0, 0, 0, 0];
            h[1..].copy_from_slice(&(n as u64).to_le_bytes());
            self.payload(&h, data)?;
        }
        let id = self.memoize();
        self.end_value();
        Ok(id)
    }

    /// Writes a bytes object and gives its memo slot.
    pub fn bytes(&mut self, data: &[u8]) -> io::Result<MemoId> {
        self.begin_value()?;
        let n = data.len();
        if n < 256 {
            self.payload(&[SHORT_BINBYTES, n as u8], data)?;
        } else if n <= u32::MAX as usize {
            let mut h = [BINBYTES, 0, 0, 0, 0];
            h[1..].copy_from_slice(&(n as u32).to_le_bytes());
            self.payload(&h, data)?;
        } else {
            let mut h = [BINBYTES8, 0, 0, 0, 0, 0, 0, 0, 0];
            h[1..].copy_from_slice(&(n as u64).to_le_bytes());
            self.payload(&h, data)?;
        }
        let id = self.memoize();
        self.end_value();
        Ok(id)
    }

    /// Refers to a value written before (shared object).
    pub fn get(&mut self, id: MemoId) -> io::Result<()> {
        if id.0 >= self.memo_len {
            return Err(misuse(
                "pickle writer: reference to a memo slot not written yet",
            ));
        }
        self.begin_value()?;
        if id.0 < 256 {
            self.put(&[BINGET, id.0 as u8]);
        } else {
            let mut op = [LONG_BINGET, 0, 0, 0, 0];
            op[1..].copy_from_slice(&id.0.to_le_bytes());
            self.put(&op);
        }
        self.end_value();
        Ok(())
    }

    /// Opens a list of `len` items; close it with [`PickleWriter::end_list`].
    pub fn begin_list(&mut self, len: usize) -> io::Result<MemoId> {
        self.begin_value()?;
        self.put(&[EMPTY_LIST]);
        let id = self.memoize();
        if len >= 2 {
            self.put(&[MARK]);
        }
        self.open.push(Open {
            kind: Kind::List,
            len: len as u64,
            values: 0,
        });
        Ok(id)
    }

    pub fn end_list(&mut self) -> io::Result<()> {
        let top = self.close(Kind::List)?;
        match top.len {
            0 => {}
            1 => self.put(&[APPEND]),
            _ => self.put(&[APPENDS]),
        }
        self.end_value();
        Ok(())
    }

    /// Opens a dict of `len` key/value pairs (write key, value, key, value, ...); close it
    /// with [`PickleWriter::end_dict`].
    pub fn begin_dict(&mut self, len: usize) -> io::Result<MemoId> {
        self.begin_value()?;
        self.put(&[EMPTY_DICT]);
        let id = self.memoize();
        if len >= 2 {
            self.put(&[MARK]);
        }
        self.open.push(Open {
            kind: Kind::Dict,
            len: len as u64,
            values: 0,
        });
        Ok(id)
    }

    pub fn end_dict(&mut self) -> io::Result<()> {
        let top = self.close(Kind::Dict)?;
        match top.len {
            0 => {}
            1 => self.put(&[SETITEM]),
            _ => self.put(&[SETITEMS]),
        }
        self.end_value();
        Ok(())
    }

    /// Opens a tuple of `len` items; close it with [`PickleWriter::end_tuple`].
    pub fn begin_tuple(&mut self, len: usize) -> io::Result<()> {
        self.begin_value()?;
        if len > 3 {
            self.put(&[MARK]);
        }
        self.open.push(Open {
            kind: Kind::Tuple,
            len: len as u64,
            values: 0,
        });
        Ok(())
    }

    /// Closes a tuple; gives its memo slot (None for the empty tuple, which CPython does
    /// not memoise).
    pub fn end_tuple(&mut self) -> io::Result<Option<MemoId>> {
        let top = self.close(Kind::Tuple)?;
        let id = match top.len {
            0 => {
                self.put(&[EMPTY_TUPLE]);
                None
            }
            1 => {
                self.put(&[TUPLE1]);
                Some(self.memoize())
            }
            2 => {
                self.put(&[TUPLE2]);
                Some(self.memoize())
            }
            3 => {
                self.put(&[TUPLE3]);
                Some(self.memoize())
            }
            _ => {
                self.put(&[TUPLE]);
                Some(self.memoize())
            }
        };
        self.end_value();
        Ok(id)
    }

    fn close(&mut self, kind: Kind) -> io::Result<Open> {
        match self.open.last() {
            Some(top) if top.kind == kind => {}
            _ => {
                return Err(misuse(
                    "pickle writer: closing a container that is not open",
                ));
            }
        }
        let top = self.open.pop().expect("checked above");
        let expected = if kind == Kind::Dict {
            top.len * 2
        } else {
            top.len
        };
        if top.values != expected {
            return Err(misuse(
                "pickle writer: a container closed with fewer items than announced",
            ));
        }
        Ok(top)
    }

    /// Writes STOP, closes the last frame and gives the output back.
    pub fn finish(mut self) -> io::Result<W> {
        if !self.open.is_empty() || !self.done {
            return Err(misuse(
                "pickle writer: finished before the root value was complete",
            ));
        }
        self.put(&[STOP]);
        self.commit_frame()?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Length of the shortest two's-complement encoding of a little-endian number.
fn minimal_signed_len(bytes: &[u8]) -> usize {
    let mut len = bytes.len();
    while len > 1 {
        let last = bytes[len - 1];
        let sign_below = bytes[len - 2] & 0x80;
        if (last == 0x00 && sign_below == 0) || (last == 0xff && sign_below != 0) {
            len -= 1;
        } else {
            break;
        }
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(f: impl FnOnce(&mut PickleWriter<Vec<u8>>) -> io::Result<()>) -> Vec<u8> {
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        f(&mut w).unwrap();
        w.finish().unwrap()
    }

    /// Bytes as CPython 3.11 `pickle.dumps(x, protocol=4)` gives them (worked by hand
    /// from pickletools listings).
    #[test]
    fn small_values_match_cpython() {
        // pickle.dumps(1, 4): no frame (under 4 bytes).
        assert_eq!(bytes(|w| w.int(1)), b"\x80\x04K\x01.");
        // pickle.dumps(-1, 4)
        assert_eq!(
            bytes(|w| w.int(-1)),
            b"\x80\x04\x95\x06\x00\x00\x00\x00\x00\x00\x00J\xff\xff\xff\xff."
        );
        // pickle.dumps(2**63, 4): LONG1 with 9 bytes.
        assert_eq!(
            bytes(|w| w.int(1 << 63)),
            b"\x80\x04\x95\x0c\x00\x00\x00\x00\x00\x00\x00\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00."
        );
        // pickle.dumps(-2**31 - 1, 4): LONG1 with 5 bytes.
        assert_eq!(
            bytes(|w| w.int(-(1 << 31) - 1)),
            b"\x80\x04\x95\x08\x00\x00\x00\x00\x00\x00\x00\x8a\x05\xff\xff\xff\x7f\xff."
        );
        // pickle.dumps({'a': [1, 'a'], 'b': (0, 0)}, 4) with the list's 'a' the same
        // object as the key.
        let got = bytes(|w| {
            w.begin_dict(2)?;
            let a = w.str("a")?;
            w.begin_list(2)?;
            w.int(1)?;
            w.get(a)?;
            w.end_list()?;
            w.str("b")?;
            w.begin_tuple(2)?;
            w.int(0)?;
            w.int(0)?;
            w.end_tuple()?;
            w.end_dict()
        });
        let body = b"}\x94(\x8c\x01a\x94]\x94(K\x01h\x01e\x8c\x01b\x94K\x00K\x00\x86\x94u.";
        let mut want = vec![PROTO, 4, FRAME];
        want.extend_from_slice(&(body.len() as u64).to_le_bytes());
        want.extend_from_slice(body);
        assert_eq!(got, want);
    }

    #[test]
    fn batches_and_single_items() {
        // One item: APPEND / SETITEM without MARK.
        let got = bytes(|w| {
            w.begin_list(1)?;
            w.none()?;
            w.end_list()
        });
        assert_eq!(got, b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00]\x94Na.");
        // 1000 pairs: a trailing empty batch.
        let got = bytes(|w| {
            w.begin_dict(1000)?;
            for _ in 0..1000 {
                w.bool(true)?;
                w.none()?;
            }
            w.end_dict()
        });
        let marks = got.iter().filter(|&&b| b == MARK).count();
        assert_eq!(marks, 2);
        assert!(got.ends_with(b"\x88Nu(u."));
        // 1000 items in a list: one batch.
        let got = bytes(|w| {
            w.begin_list(1000)?;
            for _ in 0..1000 {
                w.none()?;
            }
            w.end_list()
        });
        assert_eq!(got.iter().filter(|&&b| b == MARK).count(), 1);
    }

    #[test]
    fn misuse_is_an_error_not_a_panic() {
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_list(2).unwrap();
        w.none().unwrap();
        assert!(w.end_list().is_err());
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        assert!(w.get(MemoId(0)).is_err());
        let mut w = PickleWriter::new(Vec::new()).unwrap();
        w.begin_list(0).unwrap();
        assert!(w.none().is_err());
        let w = PickleWriter::new(Vec::new()).unwrap();
        assert!(w.finish().is_err());
    }

    #[test]
    fn minimal_lengths() {
        assert_eq!(minimal_signed_len(&128i128.to_le_bytes()), 2);
        assert_eq!(minimal_signed_len(&(-128i128).to_le_bytes()), 1);
        assert_eq!(minimal_signed_len(&(-129i128).to_le_bytes()), 2);
        assert_eq!(minimal_signed_len(&((1i128 << 63) - 1).to_le_bytes()), 8);
    }
}
