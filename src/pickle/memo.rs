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

/// The indices that GET opcodes read, with a slot number for each.
#[derive(Debug, Default)]
pub struct MemoReferences {
    set: IndexSet,
    /// Number of set bits before each dense word.
    rank: Vec<u32>,
    dense_count: usize,
    sparse_slots: HashMap<u64, usize>,
}

impl MemoReferences {
    fn finish(set: IndexSet) -> Self {
        let mut rank = Vec::with_capacity(set.words.len());
        let mut total = 0u32;
        for w in &set.words {
            rank.push(total);
            total += w.count_ones();
        }
        let dense_count = total as usize;
        let sparse_slots = set
            .sparse
            .iter()
            .enumerate()
            .map(|(i, &idx)| (idx, dense_count + i))
            .collect();
        MemoReferences {
            set,
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
    let mut start = 0u64;
    loop {
        match next_op(&mut input, &mut start)? {
            Op::Stop => break,
            Op::Get(i) => {
                set.insert(i);
            }
            Op::TextGet(arg) => {
                let i = text_index(arg, start)?;
                set.insert(i);
            }
            _ => {}
        }
    }
    Ok(MemoReferences::finish(set))
}

/// What a memo slot holds.
#[derive(Debug, Clone)]
pub enum Slot {
    Empty,
    /// A container still on the stack was memoized; holds its stack position.
    Pending(usize),
    Full(Value, u32),
}

/// Values of referenced indices, plus the count of distinct indices ever stored (MEMOIZE
/// stores at that count, as Python's `len(memo)`).
pub struct Memo {
    refs: MemoReferences,
    slots: Vec<Slot>,
    stored: IndexSet,
    stored_count: u64,
}

impl Memo {
    pub fn new(refs: MemoReferences) -> Self {
        let slots = vec![Slot::Empty; refs.len()];
        Memo {
            refs,
            slots,
            stored: IndexSet::default(),
            stored_count: 0,
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

    #[inline]
    pub fn set(&mut self, slot: usize, value: Slot) {
        self.slots[slot] = value;
    }

    #[inline]
    pub fn get(&self, index: u64) -> &Slot {
        match self.refs.slot(index) {
            Some(s) => &self.slots[s],
            None => &Slot::Empty,
        }
    }
}
