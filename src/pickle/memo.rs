//! The memo: which indices the file ever reads back, and the stored values of those.
//!
//! A first pass over the opcodes ([`scan_references`]) records every index a GET reads.
//! The reader then keeps only values that will be read again. Snapshots memoize every
//! dict, list, tuple and string (millions of them), but read back only the shared ones
//! (key strings, frame dicts, frames lists), so memory follows the result, not the file.
//!
//! No table is sized by an index written in the file: an index is kept in a dense bit set
//! only while it is below the number of stores (PUT, MEMOIZE) met so far, which real
//! picklers never exceed; anything else goes to a sorted set that grows by one entry per
//! opcode at most.

use super::ops::{Input, Op, ReadInput, SliceInput, next_op, text_index};
use super::vm::SharedKey;
use super::{Error, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

/// A set of memo indices: dense bits below a bound that follows the file's stores, a
/// sorted set above it.
#[derive(Debug, Default, Clone)]
pub struct IndexSet {
    words: Vec<u64>,
    sparse: BTreeSet<u64>,
}

impl IndexSet {
    /// Inserts and reports whether the index was new. `bound`: indices below it may go
    /// to the dense part (the number of stores met so far, plus one).
    #[inline]
    pub fn insert(&mut self, index: u64, bound: u64) -> bool {
        let word = (index / 64) as usize;
        let bit = 1u64 << (index % 64);
        if let Some(w) = self.words.get_mut(word) {
            if *w & bit != 0 {
                return false;
            }
            if self.sparse.is_empty() || !self.sparse.contains(&index) {
                *w |= bit;
                return true;
            }
            return false;
        }
        if index < bound && !self.sparse.contains(&index) {
            self.words.resize(word + 1, 0);
            self.words[word] |= bit;
            true
        } else {
            self.sparse.insert(index)
        }
    }

    #[inline]
    pub fn contains(&self, index: u64) -> bool {
        let word = (index / 64) as usize;
        match self.words.get(word) {
            Some(w) if w & (1u64 << (index % 64)) != 0 => true,
            _ => !self.sparse.is_empty() && self.sparse.contains(&index),
        }
    }
}

/// Reads of one index, saturating: `MANY` means "never release".
const MANY: u8 = u8::MAX;

/// What the first pass learns: the indices that GET opcodes read (with a slot number
/// and whether they are read once or more), and how many stores the file makes.
#[derive(Debug, Default)]
pub struct MemoReferences {
    read: IndexSet,
    /// Slot of each read index: reads per slot (1 or `MANY`).
    reads: Vec<u8>,
    /// Number of set bits before each dense word.
    rank: Vec<u32>,
    dense_count: usize,
    sparse_slots: BTreeMap<u64, usize>,
}

impl MemoReferences {
    /// Builds the slot table from the indices read at least once and those read again.
    pub fn from_sets(read: IndexSet, many: &IndexSet) -> Self {
        let mut rank = Vec::with_capacity(read.words.len());
        let mut reads = Vec::new();
        let mut total = 0u32;
        for (w, &word) in read.words.iter().enumerate() {
            rank.push(total);
            total += word.count_ones();
            let mut bits = word;
            while bits != 0 {
                let index = (w * 64) as u64 + bits.trailing_zeros() as u64;
                reads.push(if many.contains(index) { MANY } else { 1 });
                bits &= bits - 1;
            }
        }
        let dense_count = total as usize;
        let sparse_slots = read
            .sparse
            .iter()
            .enumerate()
            .map(|(i, &idx)| (idx, dense_count + i))
            .collect();
        reads.extend(
            read.sparse
                .iter()
                .map(|&idx| if many.contains(idx) { MANY } else { 1 }),
        );
        MemoReferences {
            read,
            reads,
            rank,
            dense_count,
            sparse_slots,
        }
    }

    /// Number of distinct indices read back.
    pub fn len(&self) -> usize {
        self.dense_count + self.sparse_slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot of an index that is read back, or None when nothing reads it.
    #[inline]
    pub fn slot(&self, index: u64) -> Option<usize> {
        let word = (index / 64) as usize;
        if let Some(&w) = self.read.words.get(word) {
            let bit = 1u64 << (index % 64);
            if w & bit != 0 {
                return Some(self.rank[word] as usize + (w & (bit - 1)).count_ones() as usize);
            }
        }
        if self.sparse_slots.is_empty() {
            return None;
        }
        self.sparse_slots.get(&index).copied()
    }
}

/// What one stretch of opcodes reads back: indices read once, and read more than once.
#[derive(Debug, Default)]
pub struct ScanCounts {
    pub read: IndexSet,
    pub many: IndexSet,
    /// PUT and MEMOIZE opcodes met.
    pub stores: u64,
}

impl ScanCounts {
    #[inline]
    fn get(&mut self, index: u64, bound: u64) {
        if !self.read.insert(index, bound) {
            self.many.insert(index, bound);
        }
    }

    pub fn finish(self) -> MemoReferences {
        MemoReferences::from_sets(self.read, &self.many)
    }
}

/// Scans opcodes up to STOP (or the end of `input` when `until_stop` is false),
/// counting reads. `stores_before` bounds the indices stored before this stretch.
pub fn scan<I: Input>(
    input: &mut I,
    stores_before: u64,
    until_stop: bool,
) -> Result<(ScanCounts, bool), Error> {
    let mut counts = ScanCounts::default();
    let mut start = 0u64;
    loop {
        if !until_stop && input.window().is_empty() {
            return Ok((counts, false));
        }
        let index = match next_op(input, &mut start)? {
            Op::Stop => return Ok((counts, true)),
            Op::Memoize | Op::Put(_) | Op::TextPut(_) => {
                counts.stores += 1;
                continue;
            }
            Op::Get(i) => i,
            Op::TextGet(arg) => text_index(arg, start)?,
            _ => continue,
        };
        // An index read back must have been stored before: below the stores so far for
        // any real pickler. Others (explicit PUT indices far apart) go to a sorted set.
        counts.get(index, stores_before + counts.stores + 1);
    }
}

/// First pass: walks every opcode up to STOP and records the memo indices read back.
/// Also rejects code-running opcodes before anything is built.
pub fn scan_references<R: Read>(reader: R) -> Result<MemoReferences, Error> {
    let mut input = ReadInput::new(reader);
    Ok(scan(&mut input, 0, true)?.0.finish())
}

/// [`scan_references`] over bytes held in memory.
pub fn scan_slice(bytes: &[u8]) -> Result<MemoReferences, Error> {
    let mut input = SliceInput::new(bytes);
    Ok(scan(&mut input, 0, true)?.0.finish())
}

/// What a memo slot holds.
#[derive(Debug, Clone)]
enum Slot {
    Empty,
    /// A container still on the stack was memoized; holds its stack position.
    Pending(usize),
    /// A stored value (an entry of the value table).
    Full(u32),
    /// Every counted read has happened.
    Released,
}

/// A stored value. References pushed by GET point here, not to the slot, so storing
/// another value at the same index never touches the stack.
#[derive(Debug)]
struct Entry {
    value: Value,
    depth: u32,
    stamp: u64,
    /// References pushed by GET and not yet consumed.
    outstanding: u32,
    /// Whether a slot still holds this entry.
    in_slot: bool,
}

/// Outcome of [`Memo::lookup`].
pub enum MemoRead {
    /// The slot holds a value (this entry); the read is counted and a reference is
    /// outstanding.
    Full(u32),
    /// More reads than the first pass counted (the input changed between passes).
    Exhausted,
    /// The index holds a container still on the stack, at this position.
    Pending(usize),
    Missing,
}

/// Values of referenced indices, plus the count of distinct indices ever stored (MEMOIZE
/// stores at that count, as Python's `len(memo)`).
///
/// A GET does not copy the value: the stack holds a reference to the entry until the
/// value is consumed ([`Memo::consume`] or [`Memo::consumed`]); an entry is dropped when
/// no slot holds it and no reference waits for it.
pub struct Memo {
    refs: MemoReferences,
    slots: Vec<Slot>,
    /// Reads left per slot, counted at GET; `MANY` never runs out.
    remaining: Vec<u8>,
    entries: Vec<Entry>,
    free: Vec<u32>,
    stored: IndexSet,
    stored_count: u64,
    store_ops: u64,
    stamps: u64,
    /// Every store so far was at the next index (MEMOIZE, or PUT of the next index, as
    /// both Python's and PyTorch's C++ pickler write): indices are then predictable.
    sequential: bool,
}

impl Memo {
    pub fn new(refs: MemoReferences) -> Self {
        let slots = vec![Slot::Empty; refs.len()];
        let remaining = refs.reads.clone();
        Memo {
            refs,
            slots,
            remaining,
            entries: Vec::new(),
            free: Vec::new(),
            stored: IndexSet::default(),
            stored_count: 0,
            store_ops: 0,
            stamps: 0,
            sequential: true,
        }
    }

    /// The index MEMOIZE stores at.
    pub fn next_index(&self) -> u64 {
        self.stored_count
    }

    /// Records a store at `index`; returns the slot when the value must be kept.
    #[inline]
    pub fn store_slot(&mut self, index: u64) -> Option<usize> {
        self.sequential &= index == self.stored_count;
        self.store_ops += 1;
        if self.stored.insert(index, self.store_ops + 1) {
            self.stored_count += 1;
        }
        self.refs.slot(index)
    }

    /// Stack position of the open container a slot waits for, if any.
    pub fn pending_position(&self, slot: usize) -> Option<usize> {
        match self.slots[slot] {
            Slot::Pending(pos) => Some(pos),
            _ => None,
        }
    }

    fn detach(&mut self, slot: usize) {
        if let Slot::Full(e) = self.slots[slot] {
            let entry = &mut self.entries[e as usize];
            entry.in_slot = false;
            if entry.outstanding == 0 {
                self.release(e);
            }
        }
    }

    fn release(&mut self, e: u32) {
        self.entries[e as usize].value = Value::None;
        self.free.push(e);
    }

    pub fn set_pending(&mut self, slot: usize, pos: usize) {
        self.detach(slot);
        self.slots[slot] = Slot::Pending(pos);
    }

    #[inline]
    pub fn set(&mut self, slot: usize, value: Value, depth: u32) {
        self.detach(slot);
        self.stamps += 1;
        let entry = Entry {
            value,
            depth,
            stamp: self.stamps,
            outstanding: 0,
            in_slot: true,
        };
        let e = match self.free.pop() {
            Some(e) => {
                self.entries[e as usize] = entry;
                e
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        self.slots[slot] = Slot::Full(e);
    }

    /// A GET: counts the read and, for a value, records an outstanding reference.
    #[inline]
    pub fn lookup(&mut self, index: u64) -> MemoRead {
        let Some(slot) = self.refs.slot(index) else {
            return MemoRead::Missing;
        };
        match self.slots[slot] {
            Slot::Full(e) => {
                match self.remaining[slot] {
                    MANY => {}
                    0 => return MemoRead::Exhausted,
                    1 => {
                        self.remaining[slot] = 0;
                        self.slots[slot] = Slot::Released;
                        self.entries[e as usize].in_slot = false;
                    }
                    n => self.remaining[slot] = n - 1,
                }
                self.entries[e as usize].outstanding += 1;
                MemoRead::Full(e)
            }
            Slot::Pending(pos) => MemoRead::Pending(pos),
            Slot::Released if self.remaining[slot] == 0 => MemoRead::Exhausted,
            Slot::Empty | Slot::Released => MemoRead::Missing,
        }
    }

    /// The value stored at `index` with its key, without counting a read: for a builder
    /// that decodes straight from the bytes ([`super::Builder::take_items`]). None unless
    /// the slot holds a value. Values read this way stay until the end of the read.
    #[inline]
    pub fn peek_index(&self, index: u64) -> Option<(SharedKey, &Value)> {
        match self.slots[self.refs.slot(index)?] {
            Slot::Full(e) => {
                let entry = &self.entries[e as usize];
                Some((
                    SharedKey {
                        slot: e,
                        stamp: entry.stamp,
                    },
                    &entry.value,
                ))
            }
            _ => None,
        }
    }

    /// Whether a value stored at `index` is read back later (then it must be kept).
    #[inline]
    pub fn is_read_back(&self, index: u64) -> bool {
        self.refs.slot(index).is_some()
    }

    /// The index of the next store, while every store so far went to the next index
    /// (None once a file has stored out of order).
    #[inline]
    pub fn next_sequential(&self) -> Option<u64> {
        self.sequential.then_some(self.stored_count)
    }

    /// A store made by a builder that decoded a value straight from the bytes: `value`
    /// is kept when the index is read back (it must then be given).
    pub fn store(&mut self, index: u64, value: Option<Value>, depth: u32) {
        if let Some(slot) = self.store_slot(index)
            && let Some(v) = value
        {
            self.set(slot, v, depth);
        }
    }

    /// The value of an entry a reference points to, with its depth and stamp.
    #[inline]
    pub fn peek(&self, e: u32) -> (&Value, u32, u64) {
        let entry = &self.entries[e as usize];
        (&entry.value, entry.depth, entry.stamp)
    }

    /// Ends one outstanding reference, dropping the value after the last one.
    #[inline]
    pub fn consumed(&mut self, e: u32) {
        let entry = &mut self.entries[e as usize];
        entry.outstanding -= 1;
        if entry.outstanding == 0 && !entry.in_slot {
            self.release(e);
        }
    }

    /// A copy of the value (sharing its containers), ending the reference.
    #[inline]
    pub fn consume(&mut self, e: u32) -> (Value, u32) {
        let (v, d, _) = self.peek(e);
        let out = (v.clone(), d);
        self.consumed(e);
        out
    }
}
