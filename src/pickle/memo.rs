//! The memo: which indices the file ever reads back, and the stored values of those.
//!
//! A first pass over the opcodes ([`scan_references`]) records every index a GET reads.
//! The reader then keeps only values that will be read again. Snapshots memoize every
//! dict, list, tuple and string (millions of them), but read back only the shared ones
//! (key strings, frame dicts, frames lists), so memory follows the result, not the file.

use super::ops::{Input, Op, next_op, text_index};
use super::{Error, Value};
use std::collections::{BTreeSet, HashMap};
use std::io::Read;

/// Indices below this are kept in a dense bit set; larger ones (possible only through
/// explicit PUT/GET indices) in a sorted set, so a hostile index cannot size a bitmap.
const DENSE_LIMIT: u64 = 1 << 28;

/// A set of memo indices with constant-time rank, so referenced values live in a
/// compact vector.
#[derive(Debug, Default, Clone)]
pub struct IndexSet {
    words: Vec<u64>,
    sparse: BTreeSet<u64>,
}

impl IndexSet {
    /// Inserts and reports whether the index was new.
    #[inline]
    pub fn insert(&mut self, index: u64) -> bool {
        if index < DENSE_LIMIT {
            let word = (index / 64) as usize;
            if word >= self.words.len() {
                self.words.resize(word + 1, 0);
            }
            let bit = 1u64 << (index % 64);
            let new = self.words[word] & bit == 0;
            self.words[word] |= bit;
            new
        } else {
            self.sparse.insert(index)
        }
    }
}

/// Reads of one index, saturating: `MANY` means "never release".
const MANY: u8 = u8::MAX;

/// The indices that GET opcodes read, with a slot number and a read count for each.
#[derive(Debug, Default)]
pub struct MemoReferences {
    set: IndexSet,
    /// How many times each slot is read (saturating at `MANY`).
    reads: Vec<u8>,
    /// Number of set bits before each dense word.
    rank: Vec<u32>,
    dense_count: usize,
    sparse_slots: HashMap<u64, usize>,
}

impl MemoReferences {
    fn finish(set: IndexSet, dense_reads: Vec<u8>, sparse_reads: HashMap<u64, u8>) -> Self {
        let mut rank = Vec::with_capacity(set.words.len());
        let mut reads = Vec::new();
        let mut total = 0u32;
        for (w, &word) in set.words.iter().enumerate() {
            rank.push(total);
            total += word.count_ones();
            let mut bits = word;
            while bits != 0 {
                let index = w * 64 + bits.trailing_zeros() as usize;
                reads.push(dense_reads[index]);
                bits &= bits - 1;
            }
        }
        let dense_count = total as usize;
        let sparse_slots = set
            .sparse
            .iter()
            .enumerate()
            .map(|(i, &idx)| (idx, dense_count + i))
            .collect();
        reads.extend(set.sparse.iter().map(|idx| sparse_reads[idx]));
        MemoReferences {
            set,
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
        if index < DENSE_LIMIT {
            let word = (index / 64) as usize;
            let w = *self.set.words.get(word)?;
            let bit = 1u64 << (index % 64);
            if w & bit == 0 {
                return None;
            }
            Some(self.rank[word] as usize + (w & (bit - 1)).count_ones() as usize)
        } else {
            self.sparse_slots.get(&index).copied()
        }
    }
}

/// First pass: walks every opcode up to STOP and records the memo indices read back.
/// Also rejects code-running opcodes before anything is built.
pub fn scan_references<R: Read>(reader: R) -> Result<MemoReferences, Error> {
    let mut input = Input::new(reader);
    let mut set = IndexSet::default();
    let mut dense_reads: Vec<u8> = Vec::new();
    let mut sparse_reads: HashMap<u64, u8> = HashMap::new();
    let mut start = 0u64;
    loop {
        let index = match next_op(&mut input, &mut start)? {
            Op::Stop => break,
            Op::Get(i) => i,
            Op::TextGet(arg) => text_index(arg, start)?,
            _ => continue,
        };
        set.insert(index);
        let count = if index < DENSE_LIMIT {
            let i = index as usize;
            if i >= dense_reads.len() {
                dense_reads.resize(i + 1, 0);
            }
            &mut dense_reads[i]
        } else {
            sparse_reads.entry(index).or_insert(0)
        };
        *count = count.saturating_add(1);
    }
    Ok(MemoReferences::finish(set, dense_reads, sparse_reads))
}

/// What a memo slot holds.
#[derive(Debug, Clone)]
pub enum Slot {
    Empty,
    /// A container still on the stack was memoized; holds its stack position.
    Pending(usize),
    /// A value, its nesting depth, and a stamp unique to this store.
    Full(Value, u32, u64),
    /// Every counted read has happened; the value was dropped.
    Released,
}

/// Outcome of [`Memo::lookup`].
pub enum MemoRead {
    /// The slot holds a value; the read is counted and a reference is outstanding.
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
/// A GET does not copy the value: the stack holds a reference to the slot until the
/// value is consumed ([`Memo::consume`] or [`Memo::consumed`]), and only then is the read
/// counted, so a slot is never released while a reference to it waits on the stack.
pub struct Memo {
    refs: MemoReferences,
    slots: Vec<Slot>,
    /// Reads left per slot, counted at GET; `MANY` never runs out.
    remaining: Vec<u8>,
    /// References pushed by GET and not yet consumed, per slot. A value is dropped when
    /// no read is left and no reference is outstanding.
    outstanding: Vec<u32>,
    stored: IndexSet,
    stored_count: u64,
    stamps: u64,
}

impl Memo {
    pub fn new(refs: MemoReferences) -> Self {
        let slots = vec![Slot::Empty; refs.len()];
        let remaining = refs.reads.clone();
        let outstanding = vec![0; refs.len()];
        Memo {
            refs,
            slots,
            remaining,
            outstanding,
            stored: IndexSet::default(),
            stored_count: 0,
            stamps: 0,
        }
    }

    /// The index MEMOIZE stores at.
    pub fn next_index(&self) -> u64 {
        self.stored_count
    }

    /// Records a store at `index`; returns the slot when the value must be kept.
    #[inline]
    pub fn store_slot(&mut self, index: u64) -> Option<usize> {
        if self.stored.insert(index) {
            self.stored_count += 1;
        }
        self.refs.slot(index)
    }

    /// Whether a slot holds a value (which references on the stack may point to).
    pub fn is_full(&self, slot: usize) -> bool {
        matches!(self.slots[slot], Slot::Full(..))
    }

    /// Stack position of the open container a slot waits for, if any.
    pub fn pending_position(&self, slot: usize) -> Option<usize> {
        match self.slots[slot] {
            Slot::Pending(pos) => Some(pos),
            _ => None,
        }
    }

    pub fn set_pending(&mut self, slot: usize, pos: usize) {
        self.slots[slot] = Slot::Pending(pos);
    }

    #[inline]
    pub fn set(&mut self, slot: usize, value: Value, depth: u32) {
        self.stamps += 1;
        self.slots[slot] = Slot::Full(value, depth, self.stamps);
    }

    /// A GET: counts the read and, for a value, records an outstanding reference.
    #[inline]
    pub fn lookup(&mut self, index: u64) -> MemoRead {
        let Some(slot) = self.refs.slot(index) else {
            return MemoRead::Missing;
        };
        match &self.slots[slot] {
            Slot::Full(..) => {
                match self.remaining[slot] {
                    MANY => {}
                    0 => return MemoRead::Exhausted,
                    n => self.remaining[slot] = n - 1,
                }
                self.outstanding[slot] += 1;
                MemoRead::Full(slot as u32)
            }
            Slot::Pending(pos) => MemoRead::Pending(*pos),
            Slot::Empty | Slot::Released => MemoRead::Missing,
        }
    }

    /// The value of a full slot with its depth and stamp.
    #[inline]
    pub fn peek(&self, slot: u32) -> (&Value, u32, u64) {
        match &self.slots[slot as usize] {
            Slot::Full(v, d, stamp) => (v, *d, *stamp),
            _ => unreachable!("references on the stack point to full slots"),
        }
    }

    /// Ends one outstanding reference, releasing the value after the last one.
    #[inline]
    pub fn consumed(&mut self, slot: u32) {
        let slot = slot as usize;
        self.outstanding[slot] -= 1;
        if self.outstanding[slot] == 0 && self.remaining[slot] == 0 {
            self.slots[slot] = Slot::Released;
        }
    }

    /// A copy of the value (sharing its containers), counting the read.
    #[inline]
    pub fn consume(&mut self, slot: u32) -> (Value, u32) {
        let (v, d, _) = self.peek(slot);
        let out = (v.clone(), d);
        self.consumed(slot);
        out
    }
}
