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

use super::opcodes::*;
use super::ops::{Input, Op, RELEASE_STEP, ReadInput, Release, SliceInput, next_op, text_index};
use super::{Error, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

/// Identifies one stored memo value: `slot` is small and dense (usable as an index),
/// `stamp` is unique to the store (a slot may be stored again with another value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedKey {
    pub slot: u32,
    pub stamp: u64,
}

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

    /// The set `0..n`.
    pub fn first(n: u64) -> IndexSet {
        let mut words = vec![u64::MAX; (n / 64) as usize];
        if !n.is_multiple_of(64) {
            words.push((1u64 << (n % 64)) - 1);
        }
        IndexSet {
            words,
            sparse: BTreeSet::new(),
        }
    }

    /// Adds every index of `other`.
    pub fn union(&mut self, other: &IndexSet) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
        for &i in &other.sparse {
            let word = (i / 64) as usize;
            if word < self.words.len() {
                self.words[word] |= 1u64 << (i % 64);
            } else {
                self.sparse.insert(i);
            }
        }
        // An index of `self`'s sparse part may now be in the dense part too.
        let words = &self.words;
        self.sparse.retain(|&i| {
            words
                .get((i / 64) as usize)
                .is_none_or(|w| w & (1u64 << (i % 64)) == 0)
        });
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

/// What the first pass learns: the indices that GET opcodes read, each with a slot
/// number.
#[derive(Debug, Default, Clone)]
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
    /// Builds the slot table from the indices read back (each kept to the end).
    pub fn from_read(read: IndexSet) -> Self {
        let mut rank = Vec::with_capacity(read.words.len());
        let mut total = 0u32;
        for &word in &read.words {
            rank.push(total);
            total += word.count_ones();
        }
        let dense_count = total as usize;
        let sparse_slots: BTreeMap<u64, usize> = read
            .sparse
            .iter()
            .enumerate()
            .map(|(i, &idx)| (idx, dense_count + i))
            .collect();
        let reads = vec![MANY; dense_count + sparse_slots.len()];
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

/// What one stretch of opcodes reads back, and how many stores it makes.
#[derive(Debug)]
pub struct ScanCounts {
    pub read: IndexSet,
    /// PUT and MEMOIZE opcodes met, and of those the PUTs (explicit indices).
    pub stores: u64,
    pub puts: u64,
    /// Indices read recently (direct-mapped, +1; 0 is empty): most reads are of a few
    /// thousand shared values, and the set is large, so this saves a cache miss per read.
    recent: Box<[u32]>,
}

const RECENT: usize = 1 << 14;

impl Default for ScanCounts {
    fn default() -> Self {
        ScanCounts {
            read: IndexSet::default(),
            stores: 0,
            puts: 0,
            recent: vec![0; RECENT].into_boxed_slice(),
        }
    }
}

impl ScanCounts {
    /// A GET of `index`. An index read back must have been stored before: below the
    /// stores so far for any real pickler (`bound`); others (explicit PUT indices far
    /// apart) go to a sorted set.
    #[inline(always)]
    fn get(&mut self, index: u64, bound: u64) {
        let at = index as usize & (RECENT - 1);
        if self.recent[at] as u64 == index + 1 {
            return;
        }
        if index < u32::MAX as u64 {
            self.recent[at] = index as u32 + 1;
        }
        if let Some(w) = self.read.words.get((index / 64) as usize)
            && w & (1u64 << (index % 64)) != 0
        {
            return;
        }
        self.read.insert(index, bound);
    }

    /// Adds the counts of a later stretch.
    fn merge(&mut self, other: ScanCounts) {
        self.read.union(&other.read);
        self.stores += other.stores;
        self.puts += other.puts;
    }

    /// Values read back are kept until the end of the read (they are the shared parts of
    /// a snapshot: strings, frames, frames lists), so reads are not counted.
    pub fn finish(self) -> MemoReferences {
        MemoReferences::from_read(self.read)
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
        counts.get(index, stores_before + counts.stores + 1);
    }
}

/// [`scan`] over `data[start..end]` (whole opcodes), with the opcodes of snapshots read
/// by a table and anything else by [`next_op`] (which also makes every error).
/// Returns the counts and where STOP was, if it was.
fn scan_range(
    data: &[u8],
    start: usize,
    end: usize,
    stores_before: u64,
    release: Option<Release>,
) -> Result<(ScanCounts, Option<usize>), Error> {
    let r = scan_range_inner(data, start, end, stores_before, release);
    if let Some(f) = release {
        f(start, end);
    }
    r
}

fn scan_range_inner(
    data: &[u8],
    start: usize,
    end: usize,
    stores_before: u64,
    release: Option<Release>,
) -> Result<(ScanCounts, Option<usize>), Error> {
    let mut counts = ScanCounts::default();
    let d = &data[..end];
    let mut p = start;
    let mut released = start;
    let mut next_release = if release.is_some() {
        start + RELEASE_STEP
    } else {
        usize::MAX
    };
    // The opcodes of snapshots, each with its argument inside `d` (else the general
    // decoder below takes the opcode and makes any error).
    while p < end {
        if p >= next_release {
            if let Some(f) = release {
                f(released, p);
            }
            released = p;
            next_release = p + RELEASE_STEP;
        }
        let op = d[p];
        let step = match op {
            BINGET if p + 2 <= end => {
                counts.get(d[p + 1] as u64, stores_before + counts.stores + 1);
                2
            }
            LONG_BINGET if p + 5 <= end => {
                let i = u32::from_le_bytes([d[p + 1], d[p + 2], d[p + 3], d[p + 4]]) as u64;
                counts.get(i, stores_before + counts.stores + 1);
                5
            }
            MEMOIZE => {
                counts.stores += 1;
                1
            }
            MARK | EMPTY_DICT | EMPTY_LIST | EMPTY_TUPLE | SETITEMS | APPENDS | APPEND
            | SETITEM | NONE | TUPLE | LIST | DICT | POP | POP_MARK | DUP | TUPLE1 | TUPLE2
            | TUPLE3 | NEWTRUE | NEWFALSE | EMPTY_SET | ADDITEMS | FROZENSET => 1,
            BININT1 | PROTO if p + 2 <= end => 2,
            BININT2 if p + 3 <= end => 3,
            BININT if p + 5 <= end => 5,
            BINFLOAT | FRAME if p + 9 <= end => 9,
            SHORT_BINUNICODE | LONG1 | SHORT_BINSTRING | SHORT_BINBYTES
                if p + 2 <= end && p + 2 + d[p + 1] as usize <= end =>
            {
                2 + d[p + 1] as usize
            }
            BINUNICODE | BINSTRING | BINBYTES if p + 5 <= end => {
                let n = u32::from_le_bytes([d[p + 1], d[p + 2], d[p + 3], d[p + 4]]) as usize;
                if end - p - 5 >= n { 5 + n } else { 0 }
            }
            BINPUT if p + 2 <= end => {
                counts.stores += 1;
                counts.puts += 1;
                2
            }
            LONG_BINPUT if p + 5 <= end => {
                counts.stores += 1;
                counts.puts += 1;
                5
            }
            STOP => return Ok((counts, Some(p + 1))),
            _ => 0,
        };
        if step > 0 {
            p += step;
            continue;
        }
        // Anything else, and every error, through the general decoder.
        let mut input = SliceInput::new_at(d, p);
        let mut at = 0u64;
        let index = match next_op(&mut input, &mut at)? {
            Op::Stop => return Ok((counts, Some(input.pos()))),
            Op::Memoize => {
                counts.stores += 1;
                None
            }
            Op::Put(_) | Op::TextPut(_) => {
                counts.stores += 1;
                counts.puts += 1;
                None
            }
            Op::Get(i) => Some(i),
            Op::TextGet(arg) => Some(text_index(arg, at)?),
            _ => None,
        };
        if let Some(i) = index {
            counts.get(i, stores_before + counts.stores + 1);
        }
        p = input.pos();
    }
    Ok((counts, None))
}

/// How far past a cut's target a FRAME is looked for (Python's frames are about 64 KiB).
const CUT_SEARCH: usize = 1 << 20;
/// Headers a FRAME must lead through, by their lengths, to be taken for a cut.
const CUT_HOPS: usize = 3;

/// Whether the `hops` headers from `q` on are FRAMEs, each after the last by its length
/// (or the bytes end there).
fn frames_chain(data: &[u8], q: usize, hops: usize) -> bool {
    let mut p = q;
    for _ in 0..hops {
        if p == data.len() {
            return true;
        }
        let Some(header) = data.get(p..p.saturating_add(FRAME_HEADER)) else {
            return false;
        };
        if header[0] != FRAME {
            return false;
        }
        let n = u64::from_le_bytes(header[1..].try_into().expect("8 bytes"));
        match usize::try_from(n)
            .ok()
            .and_then(|n| p.checked_add(FRAME_HEADER)?.checked_add(n))
        {
            Some(next) if next <= data.len() => p = next,
            _ => return false,
        }
    }
    true
}

/// Stretches to scan or read in parallel: `[start, end)` ranges cut at a FRAME near each
/// of about `n` evenly spaced places, found without walking the frames before it (each
/// header read brings in its page, and a walk reads thousands). A cut is a byte 0x95
/// whose next headers, by their lengths, are FRAMEs too: most likely, not surely, where
/// an opcode starts. The scan from a true start confirms it ([`scan_slice_chunks`]). One
/// stretch for bytes without frames.
pub fn chunks(data: &[u8], n: usize) -> Vec<(usize, usize)> {
    let mut bounds = vec![0];
    for k in 1..n.max(1) {
        let target = (data.len() / n * k).max(bounds[bounds.len() - 1] + 1);
        let end = target.saturating_add(CUT_SEARCH).min(data.len());
        let Some(window) = data.get(target..end) else {
            break;
        };
        let cut = window
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == FRAME)
            .map(|(i, _)| target + i)
            .find(|&q| frames_chain(data, q, CUT_HOPS));
        if let Some(q) = cut {
            bounds.push(q);
        }
    }
    bounds.push(data.len());
    bounds.windows(2).map(|w| (w[0], w[1])).collect()
}

/// First pass: walks every opcode up to STOP and records the memo indices read back.
/// Also rejects code-running opcodes before anything is built.
pub fn scan_references<R: Read>(reader: R) -> Result<MemoReferences, Error> {
    let mut input = ReadInput::new(reader);
    Ok(scan(&mut input, 0, true)?.0.finish())
}

/// [`scan_references`] over bytes held in memory: stretches between frames are scanned
/// in parallel (rayon), then merged in order, so the result and the first error are
/// those of a scan from the start.
pub fn scan_slice(bytes: &[u8]) -> Result<MemoReferences, Error> {
    scan_slice_releasing(bytes, None)
}

/// [`scan_slice`], telling `release` which bytes it has read.
pub fn scan_slice_releasing(
    bytes: &[u8],
    release: Option<Release>,
) -> Result<MemoReferences, Error> {
    Ok(scan_slice_chunks(bytes, rayon::current_num_threads() * 4, release)?.0)
}

/// Stretches of whole opcodes, `(start, end, stores before start)`, from which a reader
/// can start with a known memo count.
pub type Stretches = Vec<(usize, usize, u64)>;

/// [`scan_slice`] over about `n` stretches ([`chunks`]), scanned in parallel (rayon) and
/// merged in order. A stretch's scan that ends without error ends where the next one
/// starts, so each cut is confirmed by the scan before it (from the start on) to be an
/// opcode's start, and the result is that of a scan from the start. Where a stretch
/// fails (a cut that is not an opcode's start, or an error in the file) or no stretch
/// holds STOP, the bytes are scanned again from the start, which gives the result or the
/// first error. Also gives the stretches up to STOP with the stores before each, when
/// every store is a MEMOIZE (then a memo index is the count of stores before it).
pub fn scan_slice_chunks(
    bytes: &[u8],
    n: usize,
    release: Option<Release>,
) -> Result<(MemoReferences, Option<Stretches>), Error> {
    use rayon::prelude::*;
    let parts = chunks(bytes, n);
    let results: Vec<_> = parts
        .par_iter()
        .map(|&(a, b)| scan_range(bytes, a, b, a as u64, release))
        .collect();
    let mut total = ScanCounts::default();
    let mut stretches = Vec::new();
    for (r, &(a, b)) in results.into_iter().zip(&parts) {
        let Ok((counts, stop)) = r else {
            break;
        };
        stretches.push((a, stop.unwrap_or(b), total.stores));
        total.merge(counts);
        if stop.is_some() {
            let sequential = total.puts == 0 && stretches.len() > 1;
            return Ok((total.finish(), sequential.then_some(stretches)));
        }
    }
    let mut input = SliceInput::releasing(bytes, release);
    Ok((scan(&mut input, 0, true)?.0.finish(), None))
}

/// One opcode at `pos`: the position after it, and whether it stores in the memo (1) or
/// not (0). None at STOP or an error (which the reader will meet and report).
pub fn step(bytes: &[u8], pos: usize) -> Option<(usize, u64)> {
    let mut input = SliceInput::new_at(bytes, pos);
    let mut at = 0u64;
    let stored = match next_op(&mut input, &mut at).ok()? {
        Op::Stop => return None,
        Op::Memoize | Op::Put(_) | Op::TextPut(_) => 1,
        _ => 0,
    };
    Some((input.pos(), stored))
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
        self.count_store(index);
        self.refs.slot(index)
    }

    /// Counts a store. While every store went to the next index, the stored indices are
    /// `0..stored_count` and need no set; the set is made at the first other store.
    #[inline]
    fn count_store(&mut self, index: u64) {
        self.store_ops += 1;
        if self.sequential && index == self.stored_count {
            self.stored_count += 1;
            return;
        }
        if self.sequential {
            self.sequential = false;
            self.stored = IndexSet::first(self.stored_count);
        }
        if self.stored.insert(index, self.store_ops + 1) {
            self.stored_count += 1;
        }
    }

    /// A store a builder decoded straight from the bytes, of a value nothing reads back
    /// (it checked [`Memo::is_read_back`]).
    #[inline]
    pub fn store_unread(&mut self, index: u64) {
        self.count_store(index);
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

    /// Stores at `n` indices from `first` on, as `n` MEMOIZEs would (a builder decoded
    /// the values straight from the bytes); `values` are those of indices read back, in
    /// order of index.
    pub fn store_run(&mut self, first: u64, n: u64, values: Vec<(u64, Value)>) {
        let mut values = values.into_iter().peekable();
        for index in first..first + n {
            let slot = self.store_slot(index);
            if let Some(&(i, _)) = values.peek()
                && i == index
            {
                let (_, v) = values.next().expect("peeked");
                if let Some(slot) = slot {
                    self.set(slot, v, 2);
                }
            }
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
