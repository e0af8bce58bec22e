//! The fast path for the bulk of a snapshot: trace entries decoded straight from the
//! pickle bytes into packed events, with their frames lists.
//!
//! A trace entry, as Python's pickler (protocols 2 to 5) and PyTorch's C++ pickler write
//! it, is `EMPTY_DICT [store] MARK (key value)* SETITEMS`: every key a memo read of a
//! shared string (or the string itself, the first time), every value a small integer,
//! a memo read (the action name, a shared frames list, a shared string) or a short
//! string, or a frames list of memo reads of frame dicts. Entries of that shape are
//! decoded one after another (passing the batch ends between them) without making a
//! single pickle value: a [`Cursor`] reads the opcodes, and this file says which keys
//! and values an entry has. At anything else (a key or value of another shape, a frame
//! seen for the first time, a store read back as a dict, a value the decoder would warn
//! about or refuse) the fast path stops and leaves the entry to the reader, which
//! decodes it as values: results, warnings and errors are the same either way (the tests
//! compare both on every fixture and real snapshot).
//!
//! With more than one thread, stretches of a file held in memory are decoded ahead by
//! workers ([`Workers`]): a worker starts at a frame boundary (protocol 4 frames hold
//! whole opcodes), finds the first entry, and decodes entries with what it knows (the
//! memo indices of keys, actions, frames and frames lists the reader had met when the
//! workers started), leaving memo reads it cannot resolve as references. The reader,
//! when it gets to the first entry of such a run, checks that its memo count is the one
//! the worker assumed, resolves the references with its own memo in the order the
//! sequential path would have met them (so every id is the same), and appends the run.
//! A run that cannot be used is dropped and that stretch decoded as usual: output is
//! identical for any number of threads.

use super::*;
use crate::pickle::opcodes::{
    APPEND, BINGET, EMPTY_DICT, EMPTY_LIST, FRAME_HEADER, LONG_BINGET, MARK, SETITEMS,
};
use crate::pickle::{
    Cursor, FastTake, ListId, Memo, MemoReferences, SharedBytes, SharedRelease, Value,
};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Entry keys the fast path decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Key {
    Action,
    Addr,
    DeviceFree,
    Size,
    Stream,
    TimeUs,
    Frames,
    CompileContext,
    UserMetadata,
}

impl Key {
    fn from_name(s: &str) -> Option<Key> {
        Some(match s {
            "action" => Key::Action,
            "addr" => Key::Addr,
            "device_free" => Key::DeviceFree,
            "size" => Key::Size,
            "stream" => Key::Stream,
            "time_us" => Key::TimeUs,
            "frames" => Key::Frames,
            "compile_context" => Key::CompileContext,
            "user_metadata" => Key::UserMetadata,
            _ => return None,
        })
    }

    /// Whether a string value of this key is kept ("N/A" and "" are the defaults).
    fn keeps(self, s: &str) -> bool {
        match self {
            Key::CompileContext => s != "N/A",
            _ => !s.is_empty(),
        }
    }
}

/// What a value read back from the memo is, for the fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    Key(Key),
    Action(Action),
    /// A frames list taken over while reading.
    Stack(StackId),
    Other,
}

fn classify_str(s: &str) -> Class {
    if let Some(k) = Key::from_name(s) {
        return Class::Key(k);
    }
    match Action::from_name(s) {
        Action::Other => Class::Other,
        a => Class::Action(a),
    }
}

fn classify(v: &Value) -> Class {
    match v {
        Value::Str(s) => classify_str(s),
        Value::Handle(id) => Class::Stack(StackId(*id as u32)),
        _ => Class::Other,
    }
}

/// As `as_u64_wrapping`: a non-negative integer below 2^64, or a negative i64 taken as
/// its two's-complement bits.
fn wrapping(v: i128) -> Option<u64> {
    u64::try_from(v)
        .ok()
        .or_else(|| i64::try_from(v).ok().map(|i| i as u64))
}

fn size(v: i128) -> Option<u64> {
    u64::try_from(v).ok().filter(|&s| s <= MAX_SIZE)
}

/// A frame, frames list or string an entry refers to: an id, something the worker made
/// (numbered in its run), or a memo index to resolve later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Ref {
    Id(u32),
    Local(u32),
    Deferred(u64),
}

/// What a memo store of the entry keeps, when the index is read back later.
pub(super) enum StoreVal {
    Unread,
    /// A frames list (None: an empty list).
    Stack(Option<Ref>),
    Str(Box<str>),
}

/// A memo store the entry makes, committed once the whole entry is decoded.
pub(super) struct Store {
    index: u64,
    value: StoreVal,
}

/// One entry decoded from the bytes.
struct Entry {
    action: Action,
    /// A memo index to resolve for the action (a worker met a name it did not know).
    action_at: Option<u64>,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: Option<i64>,
    stack: Option<Ref>,
    compile_context: Option<Ref>,
    user_metadata: Option<Ref>,
    keys: EntryKeys,
}

/// Where what an entry refers to is looked up: the reader's memo and tables (the main
/// thread), or what a worker knows.
trait Resolve {
    /// A key or action name read back from the memo; None stops the fast path.
    fn class(&mut self, index: u64) -> Option<Class>;
    /// An action name read back that `class` did not know (a worker defers it).
    fn action_at(&mut self, index: u64) -> Option<Option<u64>> {
        let _ = index;
        None
    }
    /// A frames list read back from the memo.
    fn stack_at(&mut self, index: u64) -> Option<Ref>;
    /// Starts a frames list.
    fn frames_start(&mut self);
    /// Adds the frame dict read back from the memo at `index` to the list.
    fn frame_push(&mut self, index: u64) -> Option<()>;
    /// Frames in the list so far.
    fn frames_len(&self) -> usize;
    /// The frames list (not empty).
    fn frames_end(&mut self) -> Option<Ref>;
    /// A string value of `key` read back from the memo: None stops, Some(None) is the
    /// key's default.
    fn text_at(&mut self, index: u64, key: Key) -> Option<Option<Ref>>;
    /// A string value of `key` written in place.
    fn text(&mut self, s: &str, key: Key) -> Option<Option<Ref>>;
    fn read_back(&self, index: u64) -> bool;
}

/// Decodes one entry at the cursor (at its EMPTY_DICT). `next` is the memo index of the
/// next store; the entry's stores are collected, to be committed with the entry.
fn decode_entry<R: Resolve>(
    r: &mut R,
    c: &mut Cursor,
    next: &mut u64,
    stores: &mut Vec<Store>,
) -> Option<Entry> {
    c.expect(EMPTY_DICT)?;
    // The entry dict itself: kept only if nothing reads it back.
    if let Some(index) = c.store(*next)? {
        if r.read_back(index) {
            return None;
        }
        stores.push(Store {
            index,
            value: StoreVal::Unread,
        });
        *next += 1;
    }
    c.expect(MARK)?;
    let mut e = Entry {
        action: Action::Other,
        action_at: None,
        addr: 0,
        size: 0,
        stream: 0,
        time_us: None,
        stack: None,
        compile_context: None,
        user_metadata: None,
        keys: EntryKeys::default(),
    };
    let mut has_action = false;
    loop {
        let key = match c.peek()? {
            SETITEMS => {
                c.expect(SETITEMS)?;
                break;
            }
            BINGET | LONG_BINGET => match r.class(c.get()?)? {
                Class::Key(k) => k,
                _ => return None,
            },
            // A key written in place (its first time in the file).
            _ => {
                let s = c.text()?;
                let k = Key::from_name(s)?;
                stored_text(r, c, next, stores, s)?;
                k
            }
        };
        match key {
            Key::Action => {
                has_action = true;
                e.action_at = None;
                if c.at_get()? {
                    let index = c.get()?;
                    match r.class(index) {
                        Some(Class::Action(a)) => e.action = a,
                        Some(_) => return None,
                        None => e.action_at = Some(r.action_at(index)??),
                    }
                } else {
                    let s = c.text()?;
                    e.action = match classify_str(s) {
                        Class::Action(a) => a,
                        _ => return None,
                    };
                    stored_text(r, c, next, stores, s)?;
                }
            }
            Key::Addr => e.addr = wrapping(c.int()?)?,
            Key::DeviceFree => e.addr = size(c.int()?)?,
            Key::Size => e.size = size(c.int()?)?,
            Key::Stream => e.stream = wrapping(c.int()?)?,
            Key::TimeUs => {
                e.keys.time_us = true;
                let t = i64::try_from(c.int()?).ok()?;
                if t.unsigned_abs() > MAX_TIME_US as u64 {
                    return None;
                }
                e.time_us = Some(t);
            }
            Key::Frames => {
                e.keys.frames = true;
                e.stack = Some(if c.peek()? == EMPTY_LIST {
                    frames_list(r, c, next, stores)?
                } else {
                    r.stack_at(c.get()?)?
                });
            }
            Key::CompileContext | Key::UserMetadata => {
                let v = if c.at_get()? {
                    r.text_at(c.get()?, key)?
                } else {
                    let s = c.text()?;
                    let v = r.text(s, key)?;
                    stored_text(r, c, next, stores, s)?;
                    v
                };
                if key == Key::CompileContext {
                    e.keys.compile_context = true;
                    e.compile_context = v;
                } else {
                    e.keys.user_metadata = true;
                    e.user_metadata = v;
                }
            }
        }
    }
    has_action.then_some(e)
}

/// The store after a string written in place, if any.
fn stored_text<R: Resolve>(
    r: &mut R,
    c: &mut Cursor,
    next: &mut u64,
    stores: &mut Vec<Store>,
    s: &str,
) -> Option<()> {
    if let Some(index) = c.store(*next)? {
        let value = if r.read_back(index) {
            StoreVal::Str(s.into())
        } else {
            StoreVal::Unread
        };
        stores.push(Store { index, value });
        *next += 1;
    }
    Some(())
}

/// A frames list written in place: `EMPTY_LIST [store]` then nothing (empty), one memo
/// read and APPEND, or batches of memo reads of frame dicts. An empty list is none the
/// reader takes over: it decodes it as values, to the empty stack.
fn frames_list<R: Resolve>(
    r: &mut R,
    c: &mut Cursor,
    next: &mut u64,
    stores: &mut Vec<Store>,
) -> Option<Ref> {
    c.expect(EMPTY_LIST)?;
    let list_store = c.store(*next)?;
    if list_store.is_some() {
        *next += 1;
    }
    r.frames_start();
    loop {
        match c.peek()? {
            // Batches of memo reads of frame dicts.
            MARK => {
                c.expect(MARK)?;
                c.gets_to_appends(|index| r.frame_push(index))?;
            }
            BINGET | LONG_BINGET if r.frames_len() == 0 => {
                r.frame_push(c.get()?)?;
                c.expect(APPEND)?;
                break;
            }
            _ => break,
        }
    }
    let stack = if r.frames_len() == 0 {
        None
    } else {
        Some(r.frames_end()?)
    };
    if let Some(index) = list_store {
        let value = if r.read_back(index) {
            StoreVal::Stack(stack)
        } else {
            StoreVal::Unread
        };
        stores.push(Store { index, value });
    }
    Some(stack.unwrap_or(Ref::Id(0)))
}

// ---------------------------------------------------------------------------------------
// The main thread: resolved against the reader's memo at once.

/// Bytes the fast path decodes per call, at most (it stops at the entry boundary after).
const FAST_RUN: usize = 1 << 20;

/// Entries the reader decodes before workers start (by default).
pub(super) const WORKERS_AFTER: u64 = 1024;

/// Size of the direct-mapped caches by memo index.
const CACHE: usize = 1 << 16;

/// Caches by memo index. The fast path runs only while every store went to the next
/// index, so an index is stored once and its value never changes (values read back are
/// kept to the end): what an index holds can be remembered by the index.
pub(super) struct IndexCache {
    classes: Box<[(u64, Class)]>,
    /// Frames by memo index (below 2^32; u32::MAX: none).
    frames: Box<[(u32, FrameId)]>,
}

/// Size of the direct-mapped cache of frames by memo index.
const FRAME_CACHE: usize = 1 << 14;

impl Default for IndexCache {
    fn default() -> Self {
        IndexCache {
            classes: vec![(u64::MAX, Class::Other); CACHE].into_boxed_slice(),
            frames: vec![(u32::MAX, FrameId(0)); FRAME_CACHE].into_boxed_slice(),
        }
    }
}

/// The main thread's resolver.
struct Main<'a> {
    dec: &'a mut Decoder,
    cache: &'a mut IndexCache,
    classes: &'a mut Vec<(u64, Class)>,
    memo: &'a Memo,
}

impl Main<'_> {
    #[cold]
    fn class_miss(&mut self, index: u64) -> Option<Class> {
        let (key, value) = self.memo.peek_index(index)?;
        let slot = key.slot as usize;
        let class = match self.classes.get(slot) {
            Some(&(stamp, class)) if stamp == key.stamp => class,
            _ => {
                let class = classify(value);
                if slot >= self.classes.len() {
                    self.classes.resize(slot + 1, (0, Class::Other));
                }
                self.classes[slot] = (key.stamp, class);
                class
            }
        };
        self.cache.classes[index as usize & (CACHE - 1)] = (index, class);
        Some(class)
    }

    #[cold]
    fn frame_miss(&mut self, index: u64) -> Option<FrameId> {
        let (key, v) = self.memo.peek_index(index)?;
        let id = self.dec.shared_frame(key, v).ok()?;
        if let Ok(i) = u32::try_from(index) {
            self.cache.frames[index as usize & (FRAME_CACHE - 1)] = (i, id);
        }
        Some(id)
    }

    fn frame_id(&mut self, index: u64) -> Option<FrameId> {
        let (i, id) = self.cache.frames[index as usize & (FRAME_CACHE - 1)];
        if i as u64 == index {
            return Some(id);
        }
        self.frame_miss(index)
    }

    fn intern_text(&mut self, v: &Value) -> Option<Ref> {
        Some(Ref::Id(self.dec.intern(v).ok()?.0))
    }
}

impl Resolve for Main<'_> {
    #[inline(always)]
    fn class(&mut self, index: u64) -> Option<Class> {
        let (i, class) = self.cache.classes[index as usize & (CACHE - 1)];
        if i == index {
            return Some(class);
        }
        self.class_miss(index)
    }

    fn stack_at(&mut self, index: u64) -> Option<Ref> {
        match self.class(index)? {
            Class::Stack(id) => Some(Ref::Id(id.0)),
            _ => None,
        }
    }

    fn frames_start(&mut self) {
        self.dec.scratch.clear();
    }

    #[inline(always)]
    fn frame_push(&mut self, index: u64) -> Option<()> {
        let (i, id) = self.cache.frames[index as usize & (FRAME_CACHE - 1)];
        let id = if i as u64 == index {
            id
        } else {
            self.frame_miss(index)?
        };
        self.dec.scratch.push(id);
        Some(())
    }

    fn frames_len(&self) -> usize {
        self.dec.scratch.len()
    }

    fn frames_end(&mut self) -> Option<Ref> {
        let ids = std::mem::take(&mut self.dec.scratch);
        let id = self.dec.frames.intern_stack(&ids);
        self.dec.scratch = ids;
        Some(Ref::Id(id.0))
    }

    fn text_at(&mut self, index: u64, key: Key) -> Option<Option<Ref>> {
        let (_, v) = self.memo.peek_index(index)?;
        let Value::Str(s) = v else { return None };
        if !key.keeps(s) {
            return Some(None);
        }
        let v = v.clone();
        Some(Some(self.intern_text(&v)?))
    }

    fn text(&mut self, s: &str, key: Key) -> Option<Option<Ref>> {
        if !key.keeps(s) {
            return Some(None);
        }
        Some(Some(self.intern_text(&Value::Str(Rc::from(s)))?))
    }

    fn read_back(&self, index: u64) -> bool {
        self.memo.is_read_back(index)
    }
}

/// The value a store keeps in the reader's memo (refs resolved to ids).
fn store_value(v: StoreVal, stack: impl Fn(Ref) -> Option<u32>) -> Option<Option<Value>> {
    Some(match v {
        StoreVal::Unread => None,
        StoreVal::Stack(None) => Some(Value::List(Rc::new(Vec::new()))),
        StoreVal::Stack(Some(r)) => Some(Value::Handle(stack(r)? as u64)),
        StoreVal::Str(s) => Some(Value::Str(Rc::from(&*s))),
    })
}

impl SnapshotBuilder {
    /// Decodes one entry at the start of `b` into the trace of `list`, or nothing.
    fn fast_entry(&mut self, b: &[u8], memo: &mut Memo, list: ListId) -> Option<usize> {
        let mut c = Cursor::new(b, 0);
        let mut next = memo.next_sequential()?;
        let mut stores = std::mem::take(&mut self.stores);
        stores.clear();
        let entry = {
            let mut r = Main {
                dec: &mut self.dec,
                cache: &mut self.cache,
                classes: &mut self.classes,
                memo,
            };
            decode_entry(&mut r, &mut c, &mut next, &mut stores)
        };
        let done = match entry {
            Some(e) if e.action_at.is_none() => self.commit(e, memo, &mut stores, list),
            _ => None,
        };
        self.stores = stores;
        done.map(|()| c.pos())
    }

    /// Checks an entry as the decoder would, then records its stores and appends it.
    fn commit(
        &mut self,
        e: Entry,
        memo: &mut Memo,
        stores: &mut Vec<Store>,
        list: ListId,
    ) -> Option<()> {
        let id = |r: Option<Ref>| match r {
            Some(Ref::Id(i)) => Some(Some(i)),
            None => Some(None),
            _ => None,
        };
        let (stack, cc, um) = (id(e.stack)?, id(e.compile_context)?, id(e.user_metadata)?);
        let p = self.pending.get_mut(&list)?;
        let total = checked_entry(e.action, e.addr, e.size, p.trace.size_total)?;
        let per_event = DeviceTrace::bytes_per_event() as u64;
        if self.dec.spent + per_event > self.dec.budget {
            return None;
        }
        self.dec.spent += per_event;
        for s in stores.drain(..) {
            match s.value {
                StoreVal::Unread => memo.store_unread(s.index),
                value => {
                    // A key or action name written in place and read back: known by its
                    // index from now on (the workers start from these caches).
                    if let StoreVal::Str(name) = &value {
                        let class = classify_str(name);
                        if class != Class::Other {
                            self.cache.classes[s.index as usize & (CACHE - 1)] = (s.index, class);
                        }
                    }
                    let v = store_value(value, |r| match r {
                        Ref::Id(i) => Some(i),
                        _ => None,
                    })?;
                    memo.store(s.index, v, 2);
                }
            }
        }
        p.trace.size_total = total;
        p.trace.keys.merge(e.keys);
        p.trace.push_common(
            e.action,
            e.addr,
            e.size,
            e.stream,
            e.time_us,
            stack.map(StackId),
            cc.map(StrId),
            um.map(StrId),
        );
        self.fast_entries += 1;
        Some(())
    }

    /// [`crate::pickle::Builder::take_items`] for trace lists: decodes entries one after
    /// another, with the batch ends between them, and splices in the runs workers
    /// decoded ahead.
    pub(super) fn take_entries(
        &mut self,
        list: ListId,
        taking: Option<bool>,
        bytes: &[u8],
        offset: u64,
        memo: &mut Memo,
    ) -> FastTake {
        let mut taken = FastTake::default();
        match taking {
            Some(true) => match self.pending.get_mut(&list) {
                Some(p) if p.error.is_none() => {}
                _ => return taken,
            },
            Some(false) => return taken,
            None => {
                if self.pending.contains(&list) {
                    return taken;
                }
                // The list is decided by its first element: an entry.
                self.pending.insert(list, PendingTrace::default());
                match self.fast_entry(bytes, memo, list) {
                    Some(n) => {
                        taken.bytes = n;
                        taken.items = 1;
                    }
                    None => {
                        self.pending.remove(&list);
                        return taken;
                    }
                }
            }
        }
        self.dec.set_content_bytes(offset);
        // Workers start once the reader has met the keys, actions and frames of the
        // first entries: what they know comes from its caches.
        if self.parallel.is_some() && self.fast_entries >= self.workers_after {
            self.start_workers(offset);
        }
        let mut pos = taken.bytes;
        loop {
            if pos >= FAST_RUN {
                break;
            }
            let rest = &bytes[pos..];
            if Cursor::new(rest, 0).is_at(EMPTY_DICT) {
                if let Some(n) = self.splice(offset + pos as u64, memo, list) {
                    pos += n.bytes;
                    taken.items += n.items;
                    taken.bytes = pos;
                    continue;
                }
                match self.fast_entry(rest, memo, list) {
                    Some(n) => {
                        pos += n;
                        taken.items += 1;
                        taken.bytes = pos;
                        continue;
                    }
                    None => break,
                }
            }
            // A batch end and the next batch's MARK, or a FRAME, between entries.
            let mut c = Cursor::new(rest, 0);
            if c.next_batch().is_some() && c.peek() == Some(EMPTY_DICT) {
                pos += c.pos();
                taken.bytes = pos;
                continue;
            }
            if Cursor::new(rest, 0).frame().is_some() {
                pos += FRAME_HEADER;
                taken.bytes = pos;
                continue;
            }
            break;
        }
        taken
    }
}

/// The checks the decoder makes on an entry (a segment lies below 2^64; the trace's sizes
/// stay below 2^63): the new size total, or None.
#[inline]
fn checked_entry(action: Action, addr: u64, size: u64, total: u64) -> Option<u64> {
    let segment_action = matches!(
        action,
        Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
    );
    if segment_action && addr.checked_add(size).is_none() {
        return None;
    }
    total.checked_add(size).filter(|&t| t <= MAX_SIZE)
}

// ---------------------------------------------------------------------------------------
// Workers: runs of entries decoded ahead, on other threads.

/// What the reader knew when the workers started: classes of memo indices (keys,
/// actions, frames lists) and frames, by index (a copy of its caches).
struct Known {
    classes: Box<[(u64, Class)]>,
    frames: Box<[(u32, FrameId)]>,
}

/// A worker's resolver: what it knows, what it made, and what it left for later.
struct Worker<'a> {
    known: &'a Known,
    refs: &'a MemoReferences,
    /// Frames lists the run made, by content.
    stacks: FxMap<Vec<Ref>, u32>,
    stack_list: Vec<Vec<Ref>>,
    strings: Vec<Box<str>>,
    /// Frames lists the run stored and reads back, by memo index.
    defs: FxMap<u64, Ref>,
    /// Memo indices to resolve (with their use), numbered in order of first use, with a
    /// direct-mapped cache in front.
    deferred: FxMap<(u64, Role), u32>,
    recent: Box<[((u64, Role), u32)]>,
    deferred_list: Vec<(u64, Role)>,
    /// What the reader must intern, in the order the sequential path would.
    order: Vec<Use>,
    /// The frames list being read.
    frames: Vec<Ref>,
}

/// How a deferred memo index was used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Role {
    Frame,
    Stack,
    Action,
    Text(u8),
}

/// One thing to intern when a run is spliced, in order.
#[derive(Clone, Copy)]
enum Use {
    /// A memo index met for the first time: a frame, a frames list, an action or a string.
    Deferred(u32),
    /// A frames list the worker made.
    Stack(u32),
    /// A string the worker met written in place.
    Str(u32),
}

impl Worker<'_> {
    #[inline]
    fn defer(&mut self, index: u64, role: Role) -> u32 {
        let at = index as usize & (CACHE - 1);
        let (key, n) = self.recent[at];
        if key == (index, role) {
            return n;
        }
        self.defer_miss(index, role)
    }

    #[cold]
    fn defer_miss(&mut self, index: u64, role: Role) -> u32 {
        let at = index as usize & (CACHE - 1);
        if let Some(&n) = self.deferred.get(&(index, role)) {
            self.recent[at] = ((index, role), n);
            return n;
        }
        let n = self.deferred_list.len() as u32;
        self.deferred_list.push((index, role));
        self.deferred.insert((index, role), n);
        self.recent[at] = ((index, role), n);
        self.order.push(Use::Deferred(n));
        n
    }

    /// How much the worker has made, to undo an entry it could not finish.
    fn mark(&self) -> (usize, usize, usize, usize) {
        (
            self.order.len(),
            self.stack_list.len(),
            self.strings.len(),
            self.deferred_list.len(),
        )
    }

    fn undo(&mut self, (order, stacks, strings, deferred): (usize, usize, usize, usize)) {
        self.order.truncate(order);
        for s in self.stack_list.drain(stacks..) {
            self.stacks.remove(&s);
        }
        self.strings.truncate(strings);
        for d in self.deferred_list.drain(deferred..) {
            self.deferred.remove(&d);
            let at = d.0 as usize & (CACHE - 1);
            if self.recent[at].0 == d {
                self.recent[at] = ((u64::MAX, Role::Frame), 0);
            }
        }
    }
}

impl Resolve for Worker<'_> {
    #[inline(always)]
    fn class(&mut self, index: u64) -> Option<Class> {
        match self.known.classes[index as usize & (CACHE - 1)] {
            (i, c @ (Class::Key(_) | Class::Action(_))) if i == index => Some(c),
            _ => None,
        }
    }

    fn action_at(&mut self, index: u64) -> Option<Option<u64>> {
        Some(Some(self.defer(index, Role::Action) as u64))
    }

    fn stack_at(&mut self, index: u64) -> Option<Ref> {
        if let (i, Class::Stack(id)) = self.known.classes[index as usize & (CACHE - 1)]
            && i == index
        {
            return Some(Ref::Id(id.0));
        }
        if let Some(&r) = self.defs.get(&index) {
            return Some(r);
        }
        Some(Ref::Deferred(self.defer(index, Role::Stack) as u64))
    }

    fn frames_start(&mut self) {
        self.frames.clear();
    }

    #[inline(always)]
    fn frame_push(&mut self, index: u64) -> Option<()> {
        let (i, id) = self.known.frames[index as usize & (FRAME_CACHE - 1)];
        let r = if i as u64 == index {
            Ref::Id(id.0)
        } else {
            Ref::Deferred(self.defer(index, Role::Frame) as u64)
        };
        self.frames.push(r);
        Some(())
    }

    fn frames_len(&self) -> usize {
        self.frames.len()
    }

    fn frames_end(&mut self) -> Option<Ref> {
        if let Some(&n) = self.stacks.get(&self.frames) {
            return Some(Ref::Local(n));
        }
        let n = self.stack_list.len() as u32;
        self.stack_list.push(self.frames.clone());
        self.stacks.insert(self.frames.clone(), n);
        self.order.push(Use::Stack(n));
        Some(Ref::Local(n))
    }

    fn text_at(&mut self, index: u64, key: Key) -> Option<Option<Ref>> {
        let role = Role::Text((key == Key::CompileContext) as u8);
        Some(Some(Ref::Deferred(self.defer(index, role) as u64)))
    }

    fn text(&mut self, s: &str, key: Key) -> Option<Option<Ref>> {
        if !key.keeps(s) {
            return Some(None);
        }
        let n = self.strings.len() as u32;
        self.strings.push(s.into());
        self.order.push(Use::Str(n));
        Some(Some(Ref::Local(n)))
    }

    fn read_back(&self, index: u64) -> bool {
        self.refs.slot(index).is_some()
    }
}

/// Ids in a run's trace: a ref packed in 32 bits (id, made by the run, or deferred).
const LOCAL: u32 = 1 << 30;
const DEFERRED: u32 = 2 << 30;

fn pack(r: Ref) -> Option<u32> {
    match r {
        Ref::Id(i) if i < LOCAL => Some(i),
        Ref::Local(i) if i < LOCAL => Some(LOCAL | i),
        Ref::Deferred(i) if i < LOCAL as u64 => Some(DEFERRED | i as u32),
        _ => None,
    }
}

/// Entries a worker decoded ahead, to be spliced into the trace by the reader.
struct Run {
    /// Byte offsets of the first entry and just past the last.
    start: u64,
    end: u64,
    /// The memo index of the first store of the run, and the number of stores.
    base: u64,
    stores: u64,
    trace: DeviceTrace,
    /// Entries whose action is a deferred memo read, and that deferred number.
    actions: Vec<(u32, u32)>,
    defs: Vec<(u64, StoreVal)>,
    stack_list: Vec<Vec<Ref>>,
    strings: Vec<Box<str>>,
    deferred_list: Vec<(u64, Role)>,
    order: Vec<Use>,
    spent: u64,
}

/// What the reader gives the workers: the bytes, where they may start, the memo count
/// at each start, and which stores are read back.
pub(super) struct Parallel {
    pub(super) data: SharedBytes,
    /// Gives back the pages of bytes a worker has read (a mapped file's).
    pub(super) release: Option<SharedRelease>,
    /// `(start, end, stores before start)` of each stretch, in order.
    pub(super) chunks: Arc<Vec<(usize, usize, u64)>>,
    pub(super) refs: Arc<MemoReferences>,
    /// Workers to start (threads besides the reader's).
    pub(super) workers: usize,
}

/// A stretch's state: free, taken by a worker, taken by the reader.
const FREE: u8 = 0;
const WORKER: u8 = 1;
const READER: u8 = 2;

struct Shelf {
    state: Vec<AtomicU8>,
    runs: Mutex<Vec<Option<Option<Run>>>>,
    ready: Condvar,
    cancel: AtomicBool,
}

/// The workers of one read, and the runs they left.
pub(super) struct Workers {
    chunks: Arc<Vec<(usize, usize, u64)>>,
    shelf: Arc<Shelf>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The next stretch the reader has not reached yet.
    next: usize,
    /// A run taken off the shelf that starts ahead of the reader.
    ahead: Option<Run>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shelf.cancel.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A worker's loop: stretches from the last one down, until the reader has taken one.
struct Job {
    data: SharedBytes,
    release: Option<SharedRelease>,
    chunks: Arc<Vec<(usize, usize, u64)>>,
    first: usize,
    refs: Arc<MemoReferences>,
    known: Arc<Known>,
    shelf: Arc<Shelf>,
    /// The next stretch to take (counting down), shared by the workers.
    next: Arc<std::sync::atomic::AtomicIsize>,
}

fn work(job: Job) {
    let Job {
        data,
        release,
        chunks,
        first,
        refs,
        known,
        shelf,
        next,
    } = job;
    let bytes = (*data).as_ref();
    loop {
        let k = next.fetch_sub(1, Ordering::Relaxed);
        if k < first as isize || shelf.cancel.load(Ordering::Relaxed) {
            return;
        }
        let k = k as usize;
        if shelf.state[k]
            .compare_exchange(FREE, WORKER, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let (start, end, base) = chunks[k];
        // A run is only ever a speed-up: should decoding one fail in any way, the reader
        // decodes that stretch itself.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            decode_run(bytes, start, end, base, &known, &refs, &shelf.cancel)
        }))
        .ok()
        .flatten();

        if let (Some(f), Some(r)) = (&release, &run) {
            f(start, r.end as usize);
        }
        let mut runs = shelf.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs[k] = Some(run);
        shelf.ready.notify_all();
    }
}

/// Decodes the entries that start in `[start, end)`: finds the first (counting the
/// stores before it), then decodes them one after another.
fn decode_run(
    bytes: &[u8],
    start: usize,
    end: usize,
    base: u64,
    known: &Known,
    refs: &MemoReferences,
    cancel: &AtomicBool,
) -> Option<Run> {
    let mut w = Worker {
        known,
        refs,
        stacks: FxMap::default(),
        stack_list: Vec::new(),
        strings: Vec::new(),
        defs: FxMap::default(),
        deferred: FxMap::default(),
        recent: vec![((u64::MAX, Role::Frame), 0); CACHE].into_boxed_slice(),
        deferred_list: Vec::new(),
        order: Vec::new(),
        frames: Vec::new(),
    };
    let mut stores = Vec::new();
    // Find the first entry: walk opcodes from the stretch's start, counting stores.
    let mut p = start;
    let mut next = base;
    loop {
        if p >= end || cancel.load(Ordering::Relaxed) {
            return None;
        }
        if Cursor::new(bytes, p).is_at(EMPTY_DICT) {
            let mark = w.mark();
            let mut c = Cursor::new(bytes, p);
            let mut n = next;
            stores.clear();
            let ok = decode_entry(&mut w, &mut c, &mut n, &mut stores).is_some();
            w.undo(mark);
            if ok {
                break;
            }
        }
        let (np, stored) = crate::pickle::step(bytes, p)?;
        next += stored;
        p = np;
    }
    let mut run = Run {
        start: p as u64,
        end: p as u64,
        base: next,
        stores: 0,
        trace: DeviceTrace::default(),
        actions: Vec::new(),
        defs: Vec::new(),
        stack_list: Vec::new(),
        strings: Vec::new(),
        deferred_list: Vec::new(),
        order: Vec::new(),
        spent: 0,
    };
    let mut c = Cursor::new(bytes, p);
    let mut count = 0u64;
    while c.pos() < end {
        if count.is_multiple_of(4096) && cancel.load(Ordering::Relaxed) {
            return None;
        }
        let at = c;
        if c.peek() == Some(EMPTY_DICT) {
            c = at;
            let mark = w.mark();
            let mut n = next;
            stores.clear();
            let done =
                decode_entry(&mut w, &mut c, &mut n, &mut stores).and_then(|e| append(&mut run, e));
            if done.is_none() {
                w.undo(mark);
                break;
            }
            for s in stores.drain(..) {
                match s.value {
                    StoreVal::Unread => {}
                    StoreVal::Stack(Some(r)) => {
                        w.defs.insert(s.index, r);
                        run.defs.push((s.index, StoreVal::Stack(Some(r))));
                    }
                    v => run.defs.push((s.index, v)),
                }
            }
            run.stores += n - next;
            next = n;
            count += 1;
            run.end = c.pos() as u64;
            continue;
        }
        // Batch ends between entries (FRAMEs are passed by the cursor).
        c = at;
        if c.next_batch().is_some() && c.peek() == Some(EMPTY_DICT) {
            continue;
        }
        break;
    }
    if count == 0 {
        return None;
    }
    run.stack_list = w.stack_list;
    run.strings = w.strings;
    run.deferred_list = w.deferred_list;
    run.order = w.order;
    Some(run)
}

/// Appends an entry to a run (refs packed), or nothing.
fn append(run: &mut Run, e: Entry) -> Option<()> {
    let new = NewEvent {
        action: Some(e.action),
        addr: e.addr,
        size: e.size,
        stream: e.stream,
        time_us: e.time_us,
        stack: match e.stack {
            Some(r) => Some(StackId(pack(r)?)),
            None => None,
        },
        compile_context: match e.compile_context {
            Some(r) => Some(StrId(pack(r)?)),
            None => None,
        },
        user_metadata: match e.user_metadata {
            Some(r) => Some(StrId(pack(r)?)),
            None => None,
        },
        ..NewEvent::default()
    };
    let total = checked_entry(e.action, e.addr, e.size, run.trace.size_total)?;
    if let Some(n) = e.action_at {
        run.actions.push((run.trace.len() as u32, n as u32));
    }
    run.spent += DeviceTrace::bytes_per_event() as u64;
    run.trace.size_total = total;
    run.trace.keys.merge(e.keys);
    run.trace.push(new);
    Some(())
}

/// What the reader resolved a deferred memo read to.
#[derive(Clone, Copy)]
enum Resolved {
    Frame(FrameId),
    Stack(StackId),
    Action(Action),
    Text(Option<StrId>),
}

impl SnapshotBuilder {
    /// Lets workers decode stretches of the bytes ahead of the reader.
    pub(super) fn set_parallel_inner(&mut self, par: Parallel) {
        self.parallel = Some(par);
    }

    /// Starts the workers (once the reader has decoded an entry, so that it knows the
    /// keys) on the stretches after `offset`.
    fn start_workers(&mut self, offset: u64) {
        let Some(par) = self.parallel.take() else {
            return;
        };
        let n = par.chunks.len();
        let first = par.chunks.partition_point(|c| (c.0 as u64) <= offset);
        if par.workers == 0 || first >= n {
            return;
        }
        let known = Arc::new(Known {
            classes: self.cache.classes.clone(),
            frames: self.cache.frames.clone(),
        });
        let shelf = Arc::new(Shelf {
            state: (0..n).map(|_| AtomicU8::new(FREE)).collect(),
            runs: Mutex::new((0..n).map(|_| None).collect()),
            ready: Condvar::new(),
            cancel: AtomicBool::new(false),
        });
        let next = Arc::new(std::sync::atomic::AtomicIsize::new(n as isize - 1));
        let threads = (0..par.workers)
            .filter_map(|_| {
                let job = Job {
                    data: par.data.clone(),
                    release: par.release.clone(),
                    chunks: par.chunks.clone(),
                    first,
                    refs: par.refs.clone(),
                    known: known.clone(),
                    shelf: shelf.clone(),
                    next: next.clone(),
                };
                std::thread::Builder::new()
                    .name("vramlens-reader".into())
                    .spawn(move || work(job))
                    .ok()
            })
            .collect();
        self.workers = Some(Workers {
            chunks: par.chunks,
            shelf,
            threads,
            next: first,
            ahead: None,
        });
    }

    /// At an entry boundary `at`: the stretches the reader reaches are taken (if free) or
    /// waited for (if a worker took them); a run that starts here is spliced in.
    fn splice(&mut self, at: u64, memo: &mut Memo, list: ListId) -> Option<FastTake> {
        let w = self.workers.as_mut()?;
        loop {
            if let Some(run) = &w.ahead {
                if run.start > at {
                    return None;
                }
                let run = w.ahead.take().expect("checked");
                if run.start == at {
                    return self.apply(run, memo, list);
                }
                // The reader went past it (it was in another part of the file).
                continue;
            }
            let &(start, _, _) = w.chunks.get(w.next)?;
            if at < start as u64 {
                return None;
            }
            let k = w.next;
            w.next += 1;
            if w.shelf.state[k]
                .compare_exchange(FREE, READER, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // The reader decodes this stretch itself; the workers stop here.
                continue;
            }
            let mut runs = w.shelf.runs.lock().unwrap_or_else(|e| e.into_inner());
            while runs[k].is_none() {
                runs = w.shelf.ready.wait(runs).unwrap_or_else(|e| e.into_inner());
            }
            w.ahead = runs[k].take().flatten();
        }
    }

    /// Splices a run in, or leaves everything as it was (None) when it cannot be used:
    /// checked first, then what it refers to interned in the sequential path's order,
    /// then its events appended and its stores made.
    fn apply(&mut self, run: Run, memo: &mut Memo, list: ListId) -> Option<FastTake> {
        let total = self.run_fits(&run, memo, list)?;
        let ids = self.intern_run(&run, memo)?;
        let n = self.push_run(&run, &ids, list)?;
        let p = self.pending.get_mut(&list)?;
        p.trace.size_total = total;
        p.trace.keys.merge(run.trace.keys);
        self.dec.spent += run.spent;
        self.fast_entries += n as u64;
        self.spliced_entries += n as u64;
        let values: Vec<(u64, Value)> = run
            .defs
            .into_iter()
            .filter_map(|(index, v)| Some((index, store_value(v, |r| ids.stack(r))??)))
            .collect();
        memo.store_run(run.base, run.stores, values);
        Some(FastTake {
            bytes: (run.end - run.start) as usize,
            items: n as u64,
        })
    }

    /// Whether a run can be spliced at the reader's place: the memo count it assumed,
    /// a trace without error whose sizes stay in range, every deferred memo read of the
    /// kind it was taken for, and the budget for it all. Checked before interning
    /// anything, so that a run dropped here leaves the tables as they were (interning
    /// may spend budget on strings). Gives the trace's new size total.
    fn run_fits(&self, run: &Run, memo: &Memo, list: ListId) -> Option<u64> {
        if memo.next_sequential() != Some(run.base) {
            return None;
        }
        let p = self.pending.get(&list)?;
        if p.error.is_some() {
            return None;
        }
        let total = p.trace.size_total.checked_add(run.trace.size_total)?;
        if total > MAX_SIZE {
            return None;
        }
        let mut spend = run.spent + run.strings.iter().map(|s| s.len() as u64).sum::<u64>();
        for &(index, role) in &run.deferred_list {
            let (_, v) = memo.peek_index(index)?;
            let ok = match role {
                Role::Frame => self.dec.frame_checks(v).map(|n| spend += n).is_some(),
                Role::Stack => matches!(classify(v), Class::Stack(_)),
                Role::Action => matches!(classify(v), Class::Action(_)),
                Role::Text(_) => match v {
                    Value::Str(s) => {
                        spend += s.len() as u64;
                        true
                    }
                    _ => false,
                },
            };
            if !ok {
                return None;
            }
        }
        (self.dec.spent + spend <= self.dec.budget).then_some(total)
    }

    /// Interns what a run refers to (memo reads it deferred, frames lists and strings it
    /// made) in the order the sequential path would have met them, so every id is the
    /// one that path gives.
    fn intern_run(&mut self, run: &Run, memo: &mut Memo) -> Option<RunIds> {
        let mut ids = RunIds {
            resolved: vec![Resolved::Text(None); run.deferred_list.len()],
            stacks: vec![StackId(0); run.stack_list.len()],
            strings: vec![StrId(0); run.strings.len()],
        };
        let mut r = Main {
            dec: &mut self.dec,
            cache: &mut self.cache,
            classes: &mut self.classes,
            memo,
        };
        for u in &run.order {
            match *u {
                Use::Deferred(n) => {
                    let (index, role) = run.deferred_list[n as usize];
                    ids.resolved[n as usize] = resolve_deferred(&mut r, index, role)?;
                }
                Use::Stack(n) => {
                    let mut frames = Vec::with_capacity(run.stack_list[n as usize].len());
                    for f in &run.stack_list[n as usize] {
                        frames.push(match *f {
                            Ref::Id(f) => FrameId(f),
                            Ref::Deferred(m) => match ids.resolved[m as usize] {
                                Resolved::Frame(f) => f,
                                _ => return None,
                            },
                            Ref::Local(_) => return None,
                        });
                    }
                    ids.stacks[n as usize] = r.dec.frames.intern_stack(&frames);
                }
                Use::Str(n) => {
                    let v = Value::Str(Rc::from(&*run.strings[n as usize]));
                    ids.strings[n as usize] = r.dec.intern(&v).ok()?;
                }
            }
        }
        Some(ids)
    }

    /// Appends a run's events to the trace of `list`, their packed references resolved;
    /// gives how many.
    fn push_run(&mut self, run: &Run, ids: &RunIds, list: ListId) -> Option<usize> {
        let p = self.pending.get_mut(&list)?;
        let mut actions = run.actions.iter().peekable();
        let n = run.trace.len();
        p.trace.reserve(n);
        for i in 0..n {
            let e = run.trace.get(i);
            let mut action = e.action;
            if let Some(&&(at, m)) = actions.peek()
                && at as usize == i
            {
                actions.next();
                if let Resolved::Action(a) = ids.resolved[m as usize] {
                    action = a;
                }
            }
            // A run's events have none of the rare fields but these two.
            p.trace.push_common(
                action,
                e.addr,
                e.size,
                e.stream,
                e.time_us,
                e.stack.and_then(|s| ids.packed_stack(s.0)),
                run.trace
                    .compile_context(i)
                    .and_then(|s| ids.packed_str(s.0).flatten()),
                run.trace
                    .user_metadata(i)
                    .and_then(|s| ids.packed_str(s.0).flatten()),
            );
        }
        Some(n)
    }
}

/// What the reader resolved a deferred memo read of a run to (see [`Role`]).
fn resolve_deferred(r: &mut Main, index: u64, role: Role) -> Option<Resolved> {
    Some(match role {
        Role::Frame => Resolved::Frame(r.frame_id(index)?),
        Role::Stack => match r.stack_at(index)? {
            Ref::Id(s) => Resolved::Stack(StackId(s)),
            _ => return None,
        },
        Role::Action => match r.class(index)? {
            Class::Action(a) => Resolved::Action(a),
            _ => return None,
        },
        Role::Text(cc) => {
            let key = if cc == 1 {
                Key::CompileContext
            } else {
                Key::UserMetadata
            };
            Resolved::Text(match r.text_at(index, key)? {
                Some(Ref::Id(s)) => Some(StrId(s)),
                None => None,
                _ => return None,
            })
        }
    })
}

/// The ids the reader gave what a run refers to: its deferred memo reads, and the
/// frames lists and strings it made (by their numbers in the run).
struct RunIds {
    resolved: Vec<Resolved>,
    stacks: Vec<StackId>,
    strings: Vec<StrId>,
}

impl RunIds {
    /// The stack of a packed reference ([`pack`]).
    fn packed_stack(&self, packed: u32) -> Option<StackId> {
        match packed & (3 << 30) {
            0 => Some(StackId(packed)),
            LOCAL => Some(self.stacks[(packed & !LOCAL) as usize]),
            DEFERRED => match self.resolved[(packed & !DEFERRED) as usize] {
                Resolved::Stack(s) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    /// The string of a packed reference ([`pack`]); Some(None) for a key's default.
    fn packed_str(&self, packed: u32) -> Option<Option<StrId>> {
        match packed & (3 << 30) {
            LOCAL => Some(Some(self.strings[(packed & !LOCAL) as usize])),
            DEFERRED => match self.resolved[(packed & !DEFERRED) as usize] {
                Resolved::Text(t) => Some(t),
                _ => None,
            },
            _ => None,
        }
    }

    /// The stack id a frames list stored by the run stands for.
    fn stack(&self, r: Ref) -> Option<u32> {
        match r {
            Ref::Id(i) => Some(i),
            Ref::Local(n) => Some(self.stacks[n as usize].0),
            Ref::Deferred(m) => match self.resolved[m as usize] {
                Resolved::Stack(s) => Some(s.0),
                _ => None,
            },
        }
    }
}
