//! A data-only pickle reader.
//!
//! Takes bytes (any `Read`), gives a [`Value`] tree. It understands the data opcodes of
//! protocols 0 to 5 and nothing else: opcodes that import, call or build objects
//! (GLOBAL, REDUCE, BUILD, ...) end the read with [`Error::NotDataOnly`], so nothing in a
//! file is ever run. Reading takes two passes over the input: [`scan_references`] finds the
//! memo indices that are read back, then [`parse_with`] builds values and keeps only those.
//! Every error carries the byte offset of the opcode at fault.
//!
//! [`PickleWriter`] goes the other way: it writes data-only protocol 4 pickles laid out as
//! CPython's pickler lays them out.
//!
//! This module knows nothing of PyTorch: it imports no other module of the crate.

mod memo;
mod ops;
mod value;
mod vm;
mod write;

pub use memo::{MemoReferences, scan_references};
pub use value::{ListId, Value};
pub use vm::{Builder, MAX_DEPTH, MAX_OPEN, ParseInfo, PlainBuilder, SharedKey, parse_with};
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
    #[error("byte {offset}: {message}")]
    Invalid { offset: u64, message: String },
    #[error("byte {offset}: read error: {message}")]
    Io { offset: u64, message: String },
}

/// Reads a whole pickle held in memory (both passes over the same bytes).
pub fn parse_bytes(bytes: &[u8]) -> Result<(Value, ParseInfo), Error> {
    let refs = scan_references(bytes)?;
    parse_with(bytes, refs, &mut PlainBuilder)
}
