//! A data-only pickle reader.
//!
//! Takes bytes (any `Read`), gives a [`Value`] tree. It understands the data opcodes of
//! protocols 0 to 5 and nothing else: opcodes that import, call or build objects
//! (GLOBAL, REDUCE, BUILD, ...) end the read with [`Error::NotDataOnly`], so nothing in a
//! file is ever run. Reading takes two passes over the input: [`scan_references`] finds the
//! memo indices that are read back, then [`parse_with`] builds values and keeps only those.
//! [`Reader`] runs both over bytes held in memory, giving pages back behind it and
//! offering a builder stretches to decode ahead on other threads. Every error carries the
//! byte offset of the opcode at fault. [`opcodes`] names every opcode byte, and a
//! [`Cursor`] reads a layout a builder knows straight from the bytes (its fast path).
//!
//! [`PickleWriter`] goes the other way: it writes data-only protocol 4 pickles laid out as
//! CPython's pickler lays them out.
//!
//! This module knows nothing of PyTorch: it imports no other module of the crate.

mod cursor;
mod memo;
pub mod opcodes;
mod ops;
mod reader;
mod value;
mod vm;
mod write;

pub use cursor::Cursor;
pub use memo::{
    MemoReferences, SharedKey, Stretches, chunks, scan_references, scan_slice, scan_slice_chunks,
    scan_slice_releasing, step,
};
pub use ops::{MAX_STREAM_ARGUMENT, RELEASE_STEP, Release};
pub use reader::{READ_AHEAD_MIN_BYTES, ReadAhead, Reader, SharedBytes, SharedRelease};
pub use value::{ListId, Value};
pub use vm::{
    Builder, FastTake, HELD_VALUES_FLOOR, MAX_DECIMAL_DIGITS, MAX_DEPTH, Memo, ParseInfo,
    PlainBuilder, parse_slice, parse_slice_releasing, parse_with,
};
pub use write::{FRAME_SIZE_TARGET, MemoId, PickleWriter};

/// Why a pickle could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    #[error(
        "byte {offset}: truncated pickle: expected {needed} more byte(s) for {what}, found end of file"
    )]
    Truncated {
        offset: u64,
        needed: u64,
        what: &'static str,
    },
    #[error(
        "byte {offset}: not a data-only pickle: opcode {opcode}; vramlens never runs code from a file"
    )]
    NotDataOnly { offset: u64, opcode: &'static str },
    #[error("byte {offset}: more than {limit} {what}")]
    TooDeep {
        offset: u64,
        limit: u64,
        what: &'static str,
    },
    #[error(
        "byte {offset}: an argument of {bytes} bytes ({what}); at most {limit} bytes are read for one opcode from a stream (compressed or piped input)"
    )]
    TooLarge {
        offset: u64,
        bytes: u64,
        limit: u64,
        what: &'static str,
    },
    #[error(
        "byte {offset}: {values} values held at once after {offset} bytes; a memory snapshot never needs that many (refusing a memory bomb)"
    )]
    TooManyValues { offset: u64, values: u64 },
    #[error("byte {offset}: {message}")]
    Invalid { offset: u64, message: String },
    #[error("byte {offset}: read error: {message}")]
    Io { offset: u64, message: String },
}

/// Reads a whole pickle held in memory (both passes over the same bytes).
pub fn parse_bytes(bytes: &[u8]) -> Result<(Value, ParseInfo), Error> {
    let refs = scan_slice(bytes)?;
    parse_slice(bytes, refs, &mut PlainBuilder)
}
