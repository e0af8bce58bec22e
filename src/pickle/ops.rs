//! Buffered byte input and opcode decoding, shared by the reference scan and the reader.
//!
//! The input is read through a window that only grows as real bytes arrive, so a length
//! field in a hostile file can never make us allocate more than the file holds.

use super::Error;
use super::opcodes::*;
use std::io::Read;

const INITIAL_BUFFER: usize = 1 << 20;

/// Most bytes one opcode argument may take when reading from a stream (compressed or
/// piped input), where the window must hold it: no memory snapshot has a string or an
/// integer anywhere near this, and a decompression bomb is stopped before it costs
/// more. Input held in memory has no such limit (its arguments are slices of it).
pub const MAX_STREAM_ARGUMENT: usize = 256 << 20;

/// A forward-only byte source with lookahead and absolute offsets: a slice held in
/// memory (the window is all of it) or a stream read through a growing window.
pub trait Input {
    /// Unread bytes available now (may be fewer than an opcode needs).
    fn window(&self) -> &[u8];
    /// Marks `n` bytes of the window as read.
    fn advance(&mut self, n: usize);
    /// Makes at least `n` bytes available; false at end of input.
    fn fill(&mut self, n: usize, what: &'static str) -> Result<bool, Error>;
    /// Absolute offset of the next unread byte.
    fn offset(&self) -> u64;

    #[inline]
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], Error> {
        if self.window().len() < n && !self.fill(n, what)? {
            return Err(Error::Truncated {
                offset: self.offset(),
                needed: n as u64,
                what,
            });
        }
        self.advance(n);
        Ok(self.taken(n))
    }

    /// The `n` bytes just passed by [`Input::advance`].
    fn taken(&self, n: usize) -> &[u8];

    #[inline]
    fn byte(&mut self, what: &'static str) -> Result<u8, Error> {
        Ok(self.take(1, what)?[0])
    }

    /// A length-prefixed payload whose length came from the file: refuse lengths that
    /// cannot be a size on this machine, then read (a stream's window grows only as
    /// data arrives).
    fn take_len(&mut self, len: u64, what: &'static str) -> Result<&[u8], Error> {
        let n = usize::try_from(len).map_err(|_| Error::Truncated {
            offset: self.offset(),
            needed: len,
            what,
        })?;
        self.take(n, what)
    }

    /// A newline-terminated line (protocol 0 text arguments), without the newline.
    fn line(&mut self, what: &'static str) -> Result<&[u8], Error> {
        let mut scanned = 0;
        loop {
            if let Some(i) = self.window()[scanned..].iter().position(|&b| b == b'\n') {
                let len = scanned + i;
                self.advance(len + 1);
                let line = self.taken(len + 1);
                return Ok(&line[..len]);
            }
            scanned = self.window().len();
            if !self.fill(scanned + 1, what)? {
                return Err(Error::Truncated {
                    offset: self.offset(),
                    needed: 1,
                    what,
                });
            }
        }
    }

    /// Reads to the end of the input, counting the bytes and whether any is not NUL.
    fn drain(&mut self) -> Result<(u64, bool), Error> {
        let mut bytes = 0u64;
        let mut nonzero = false;
        loop {
            let w = self.window();
            let n = w.len();
            if n == 0 {
                if !self.fill(1, "the rest of the input")? {
                    return Ok((bytes, nonzero));
                }
                continue;
            }
            nonzero |= w.iter().any(|&b| b != 0);
            bytes += n as u64;
            self.advance(n);
        }
    }
}

/// Told that the bytes `[start, end)` of a slice being read are behind the reader, so a
/// mapping of a file can give their pages back (they are read again if needed).
pub type Release<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// Bytes read between two [`Release`] calls, and bytes kept behind the reader: the
/// pages a reader holds of a mapped file (8 MiB: at 32, they were 18 of the 157 MiB
/// `summary` holds for a 300 MB file, and giving pages back four times as often costs
/// no measurable time).
pub const RELEASE_STEP: usize = 8 << 20;
const RELEASE_MARGIN: usize = 1 << 20;

/// Input held in memory: the window is the whole rest of the slice.
pub struct SliceInput<'a> {
    data: &'a [u8],
    pos: usize,
    base: u64,
    release: Option<Release<'a>>,
    released: usize,
    next_release: usize,
}

impl<'a> SliceInput<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        SliceInput {
            data,
            pos: 0,
            base: 0,
            release: None,
            released: 0,
            next_release: usize::MAX,
        }
    }

    /// Input that calls `release` for the bytes it has read, every [`RELEASE_STEP`].
    pub fn releasing(data: &'a [u8], release: Option<Release<'a>>) -> Self {
        let mut input = SliceInput::new(data);
        if release.is_some() {
            input.release = release;
            input.next_release = RELEASE_STEP;
        }
        input
    }

    #[cold]
    fn release_behind(&mut self) {
        if let Some(f) = self.release {
            let upto = self.pos.saturating_sub(RELEASE_MARGIN);
            if upto > self.released {
                f(self.released, upto);
                self.released = upto;
            }
        }
        self.next_release = self.pos + RELEASE_STEP;
    }
}

impl<'a> SliceInput<'a> {
    /// Input at position `pos` of `data` (offsets count from the start of `data`).
    pub fn new_at(data: &'a [u8], pos: usize) -> Self {
        let mut input = SliceInput::new(data);
        input.pos = pos;
        input
    }

    /// Position in the slice.
    #[inline]
    pub fn pos(&self) -> usize {
        self.pos
    }
}

impl Input for SliceInput<'_> {
    #[inline]
    fn window(&self) -> &[u8] {
        &self.data[self.pos..]
    }
    #[inline]
    fn advance(&mut self, n: usize) {
        self.pos += n;
        if self.pos >= self.next_release {
            self.release_behind();
        }
    }
    #[inline]
    fn fill(&mut self, n: usize, _what: &'static str) -> Result<bool, Error> {
        Ok(self.data.len() - self.pos >= n)
    }
    #[inline]
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }
    #[inline]
    fn taken(&self, n: usize) -> &[u8] {
        &self.data[self.pos - n..self.pos]
    }
}

/// A stream read through a window that only grows as real bytes arrive, so a length
/// field in a hostile file can never make us allocate more than the stream holds (and
/// never more than [`MAX_STREAM_ARGUMENT`] for one opcode).
pub struct ReadInput<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Absolute offset of `buf[0]`.
    base: u64,
    eof: bool,
}

impl<R: Read> ReadInput<R> {
    pub fn new(inner: R) -> Self {
        ReadInput {
            inner,
            buf: vec![0; INITIAL_BUFFER],
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
        }
    }
}

impl<R: Read> Input for ReadInput<R> {
    #[inline]
    fn window(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }
    #[inline]
    fn advance(&mut self, n: usize) {
        self.pos += n;
    }
    #[inline]
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }
    #[inline]
    fn taken(&self, n: usize) -> &[u8] {
        &self.buf[self.pos - n..self.pos]
    }

    fn fill(&mut self, n: usize, what: &'static str) -> Result<bool, Error> {
        if n > MAX_STREAM_ARGUMENT {
            return Err(Error::TooLarge {
                offset: self.offset(),
                bytes: n as u64,
                limit: MAX_STREAM_ARGUMENT as u64,
                what,
            });
        }
        while self.end - self.pos < n {
            if self.eof {
                return Ok(false);
            }
            if self.pos > 0 {
                self.buf.copy_within(self.pos..self.end, 0);
                self.base += self.pos as u64;
                self.end -= self.pos;
                self.pos = 0;
            }
            if self.end == self.buf.len() {
                let grown = (self.buf.len() * 2).max(INITIAL_BUFFER);
                self.buf.resize(grown, 0);
            }
            let read = loop {
                match self.inner.read(&mut self.buf[self.end..]) {
                    Ok(k) => break k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        return Err(Error::Io {
                            offset: self.offset(),
                            message: e.to_string(),
                        });
                    }
                }
            };
            if read == 0 {
                self.eof = true;
            }
            self.end += read;
        }
        Ok(true)
    }
}

/// One decoded opcode with its argument, borrowed from the input window.
#[derive(Debug)]
pub enum Op<'a> {
    Mark,
    Stop,
    Pop,
    PopMark,
    Dup,
    Proto(u8),
    Frame,
    None,
    Bool(bool),
    Int(i64),
    /// Little-endian two's-complement bytes of LONG1/LONG4.
    Long(&'a [u8]),
    /// A decimal integer from protocol 0 text (INT or LONG).
    TextInt(&'a [u8]),
    Float(f64),
    TextFloat(&'a [u8]),
    Str(&'a [u8]),
    /// A protocol 0 STRING argument, still quoted.
    QuotedStr(&'a [u8]),
    /// A protocol 0 UNICODE argument in raw-unicode-escape.
    RawUnicode(&'a [u8]),
    /// Python 2 `str` from BINSTRING / SHORT_BINSTRING (decoded as Latin-1).
    Latin1(&'a [u8]),
    Bytes(&'a [u8]),
    EmptyList,
    Append,
    Appends,
    List,
    EmptyTuple,
    Tuple,
    Tuple1,
    Tuple2,
    Tuple3,
    EmptyDict,
    Dict,
    SetItem,
    SetItems,
    EmptySet,
    AddItems,
    FrozenSet,
    Get(u64),
    TextGet(&'a [u8]),
    Put(u64),
    TextPut(&'a [u8]),
    Memoize,
}

/// Name of an opcode that runs code or needs objects from outside the file.
fn forbidden_name(code: u8) -> Option<&'static str> {
    Some(match code {
        GLOBAL => "GLOBAL",
        STACK_GLOBAL => "STACK_GLOBAL",
        REDUCE => "REDUCE",
        BUILD => "BUILD",
        INST => "INST",
        OBJ => "OBJ",
        NEWOBJ => "NEWOBJ",
        NEWOBJ_EX => "NEWOBJ_EX",
        PERSID => "PERSID",
        BINPERSID => "BINPERSID",
        EXT1 => "EXT1",
        EXT2 => "EXT2",
        EXT4 => "EXT4",
        NEXT_BUFFER => "NEXT_BUFFER",
        READONLY_BUFFER => "READONLY_BUFFER",
        _ => return None,
    })
}

fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn u64_le(b: &[u8]) -> u64 {
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Decodes the next opcode. `start` receives the opcode's own offset for error messages.
#[inline]
pub fn next_op<'a, I: Input>(input: &'a mut I, start: &mut u64) -> Result<Op<'a>, Error> {
    *start = input.offset();
    // Fast path for the opcodes that make up nearly all of a snapshot, when the window
    // already holds the opcode and its fixed-size argument.
    let w = input.window();
    if w.len() >= 9 {
        let (op, used) = match w[0] {
            LONG_BINGET => (Op::Get(u32_le(&w[1..5]) as u64), 5),
            BINGET => (Op::Get(w[1] as u64), 2),
            MEMOIZE => (Op::Memoize, 1),
            MARK => (Op::Mark, 1),
            BININT1 => (Op::Int(w[1] as i64), 2),
            BININT => (
                Op::Int(i32::from_le_bytes([w[1], w[2], w[3], w[4]]) as i64),
                5,
            ),
            EMPTY_DICT => (Op::EmptyDict, 1),
            EMPTY_LIST => (Op::EmptyList, 1),
            SETITEMS => (Op::SetItems, 1),
            APPENDS => (Op::Appends, 1),
            TUPLE2 => (Op::Tuple2, 1),
            NEWTRUE => (Op::Bool(true), 1),
            NEWFALSE => (Op::Bool(false), 1),
            _ => (Op::Stop, 0),
        };
        if used > 0 {
            input.advance(used);
            return Ok(op);
        }
    }
    let code = input.byte("an opcode")?;
    Ok(match code {
        MARK => Op::Mark,
        STOP => Op::Stop,
        POP => Op::Pop,
        POP_MARK => Op::PopMark,
        DUP => Op::Dup,
        PROTO => Op::Proto(input.byte("the PROTO version")?),
        FRAME => {
            input.take(8, "the FRAME length")?;
            Op::Frame
        }
        NONE => Op::None,
        NEWTRUE => Op::Bool(true),
        NEWFALSE => Op::Bool(false),
        BININT => {
            Op::Int(i32::from_le_bytes(input.take(4, "a BININT")?.try_into().unwrap()) as i64)
        }
        BININT1 => Op::Int(input.byte("a BININT1")? as i64),
        BININT2 => {
            let b = input.take(2, "a BININT2")?;
            Op::Int(u16::from_le_bytes([b[0], b[1]]) as i64)
        }
        LONG1 => {
            let n = input.byte("the LONG1 length")? as u64;
            Op::Long(input.take_len(n, "LONG1 bytes")?)
        }
        LONG4 => {
            let n = i32::from_le_bytes(input.take(4, "the LONG4 length")?.try_into().unwrap());
            if n < 0 {
                return Err(Error::Invalid {
                    offset: *start,
                    message: format!("negative LONG4 length {n}"),
                });
            }
            Op::Long(input.take_len(n as u64, "LONG4 bytes")?)
        }
        INT | LONG => Op::TextInt(input.line("an INT/LONG text argument")?),
        BINFLOAT => Op::Float(f64::from_be_bytes(
            input.take(8, "a BINFLOAT")?.try_into().unwrap(),
        )),
        FLOAT => Op::TextFloat(input.line("a FLOAT text argument")?),
        SHORT_BINUNICODE => {
            let n = input.byte("the SHORT_BINUNICODE length")? as u64;
            Op::Str(input.take_len(n, "SHORT_BINUNICODE bytes")?)
        }
        BINUNICODE => {
            let n = u32_le(input.take(4, "the BINUNICODE length")?) as u64;
            Op::Str(input.take_len(n, "BINUNICODE bytes")?)
        }
        BINUNICODE8 => {
            let n = u64_le(input.take(8, "the BINUNICODE8 length")?);
            Op::Str(input.take_len(n, "BINUNICODE8 bytes")?)
        }
        UNICODE => Op::RawUnicode(input.line("a UNICODE text argument")?),
        STRING => Op::QuotedStr(input.line("a STRING text argument")?),
        BINSTRING => {
            let n = u32_le(input.take(4, "the BINSTRING length")?) as u64;
            Op::Latin1(input.take_len(n, "BINSTRING bytes")?)
        }
        SHORT_BINSTRING => {
            let n = input.byte("the SHORT_BINSTRING length")? as u64;
            Op::Latin1(input.take_len(n, "SHORT_BINSTRING bytes")?)
        }
        SHORT_BINBYTES => {
            let n = input.byte("the SHORT_BINBYTES length")? as u64;
            Op::Bytes(input.take_len(n, "SHORT_BINBYTES bytes")?)
        }
        BINBYTES => {
            let n = u32_le(input.take(4, "the BINBYTES length")?) as u64;
            Op::Bytes(input.take_len(n, "BINBYTES bytes")?)
        }
        BINBYTES8 | BYTEARRAY8 => {
            let n = u64_le(input.take(8, "the BINBYTES8 length")?);
            Op::Bytes(input.take_len(n, "BINBYTES8 bytes")?)
        }
        EMPTY_LIST => Op::EmptyList,
        APPEND => Op::Append,
        APPENDS => Op::Appends,
        LIST => Op::List,
        EMPTY_TUPLE => Op::EmptyTuple,
        TUPLE => Op::Tuple,
        TUPLE1 => Op::Tuple1,
        TUPLE2 => Op::Tuple2,
        TUPLE3 => Op::Tuple3,
        EMPTY_DICT => Op::EmptyDict,
        DICT => Op::Dict,
        SETITEM => Op::SetItem,
        SETITEMS => Op::SetItems,
        EMPTY_SET => Op::EmptySet,
        ADDITEMS => Op::AddItems,
        FROZENSET => Op::FrozenSet,
        BINGET => Op::Get(input.byte("a BINGET index")? as u64),
        LONG_BINGET => Op::Get(u32_le(input.take(4, "a LONG_BINGET index")?) as u64),
        GET => Op::TextGet(input.line("a GET index")?),
        BINPUT => Op::Put(input.byte("a BINPUT index")? as u64),
        LONG_BINPUT => Op::Put(u32_le(input.take(4, "a LONG_BINPUT index")?) as u64),
        PUT => Op::TextPut(input.line("a PUT index")?),
        MEMOIZE => Op::Memoize,
        other => {
            if let Some(name) = forbidden_name(other) {
                return Err(Error::NotDataOnly {
                    offset: *start,
                    opcode: name,
                });
            }
            return Err(Error::Invalid {
                offset: *start,
                message: format!("unknown opcode 0x{other:02x}; expected a pickle opcode"),
            });
        }
    })
}

/// Parses a protocol 0 decimal memo index.
pub fn text_index(arg: &[u8], offset: u64) -> Result<u64, Error> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .ok_or_else(|| Error::Invalid {
            offset,
            message: "expected a decimal memo index".into(),
        })
}
