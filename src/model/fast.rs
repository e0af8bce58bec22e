//! The fast path for the bulk of a snapshot: trace entries decoded straight from the
//! pickle bytes into packed events, with their frames lists.
//!
//! A trace entry, as Python's pickler (protocols 2 to 5) and PyTorch's C++ pickler write
//! it, is `EMPTY_DICT [store] MARK (key value)* SETITEMS`: every key a memo read of a
//! shared string, every value a small integer, a memo read (the action name, a shared
//! frames list, a shared string) or a short string, or a frames list of memo reads of
//! frame dicts. [`SnapshotBuilder::take_entries`] decodes such entries one after
//! another (passing the batch ends between them) without making a single pickle value,
//! and stops, leaving the rest to the reader, at anything else: a key or value of
//! another shape, a string or frame seen for the first time, a store that is read back
//! as a dict, a value the decoder would warn about or refuse. The reader then decodes
//! that entry as values, so results, warnings and errors are the same either way; the
//! tests check it on every fixture and real snapshot.

use super::*;
use crate::pickle::{FastTake, ListId, Memo, Value};
use std::rc::Rc;

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

/// What a value read back from the memo is, for the fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    Key(Key),
    Action(Action),
    /// A frames list taken over while reading.
    Stack(StackId),
    Other,
}

fn classify(v: &Value) -> Class {
    match v {
        Value::Str(s) => {
            let key = match &**s {
                "action" => Key::Action,
                "addr" => Key::Addr,
                "device_free" => Key::DeviceFree,
                "size" => Key::Size,
                "stream" => Key::Stream,
                "time_us" => Key::TimeUs,
                "frames" => Key::Frames,
                "compile_context" => Key::CompileContext,
                "user_metadata" => Key::UserMetadata,
                name => {
                    return match Action::from_name(name) {
                        Action::Other => Class::Other,
                        a => Class::Action(a),
                    };
                }
            };
            Class::Key(key)
        }
        Value::Handle(id) => Class::Stack(StackId(*id as u32)),
        _ => Class::Other,
    }
}

/// A cursor over the bytes of one entry. Every read returns None at the end of the
/// bytes or at an opcode of another kind, which ends the fast path there.
struct Cur<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Cur<'a> {
    /// Skips FRAME opcodes (protocol 4 frames start between any two objects).
    #[inline]
    fn frames(&mut self) -> Option<()> {
        while *self.b.get(self.p)? == 0x95 {
            self.p += 9;
        }
        Some(())
    }

    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.frames()?;
        self.b.get(self.p).copied()
    }

    #[inline]
    fn expect(&mut self, op: u8) -> Option<()> {
        (self.peek()? == op).then(|| self.p += 1)
    }

    #[inline]
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.p..self.p + n)?;
        self.p += n;
        Some(s)
    }

    /// BINGET or LONG_BINGET.
    #[inline]
    fn get(&mut self) -> Option<u64> {
        match self.peek()? {
            b'h' => {
                let i = *self.b.get(self.p + 1)?;
                self.p += 2;
                Some(i as u64)
            }
            b'j' => {
                let b = self.b.get(self.p + 1..self.p + 5)?;
                self.p += 5;
                Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64)
            }
            _ => None,
        }
    }

    /// A memo store after an object: Some(None) when there is none, Some(Some(i)) for
    /// MEMOIZE (at `next`) or BINPUT/LONG_BINPUT of `next`; None for a PUT elsewhere.
    #[inline]
    fn store(&mut self, next: u64) -> Option<Option<u64>> {
        let index = match self.peek()? {
            0x94 => {
                self.p += 1;
                next
            }
            b'q' => {
                let i = *self.b.get(self.p + 1)? as u64;
                self.p += 2;
                i
            }
            b'r' => {
                let b = self.b.get(self.p + 1..self.p + 5)?;
                self.p += 5;
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64
            }
            _ => return Some(None),
        };
        (index == next).then_some(Some(index))
    }

    /// BININT1, BININT2, BININT or LONG1 (up to 16 bytes).
    #[inline]
    fn int(&mut self) -> Option<i128> {
        match self.peek()? {
            b'K' => Some(self.bytes(2)?[1] as i128),
            b'M' => {
                let b = self.bytes(3)?;
                Some(u16::from_le_bytes([b[1], b[2]]) as i128)
            }
            b'J' => {
                let b = self.bytes(5)?;
                Some(i32::from_le_bytes([b[1], b[2], b[3], b[4]]) as i128)
            }
            0x8a => {
                let n = *self.b.get(self.p + 1)? as usize;
                if n == 0 || n > 16 {
                    return None;
                }
                self.p += 2;
                let b = self.bytes(n)?;
                let mut buf = if b[n - 1] & 0x80 != 0 {
                    [0xff; 16]
                } else {
                    [0; 16]
                };
                buf[..n].copy_from_slice(b);
                Some(i128::from_le_bytes(buf))
            }
            _ => None,
        }
    }

    /// SHORT_BINUNICODE or BINUNICODE, as valid UTF-8.
    #[inline]
    fn text(&mut self) -> Option<&'a str> {
        let n = match self.peek()? {
            0x8c => {
                let n = *self.b.get(self.p + 1)? as usize;
                self.p += 2;
                n
            }
            b'X' => {
                let b = self.b.get(self.p + 1..self.p + 5)?;
                self.p += 5;
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
            }
            _ => return None,
        };
        std::str::from_utf8(self.bytes(n)?).ok()
    }
}

/// A memo store the entry makes, committed once the whole entry is decoded.
pub(super) struct Store {
    index: u64,
    value: Option<Value>,
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

impl SnapshotBuilder {
    /// The class of the value stored at a memo index (cached by the stored value).
    #[inline]
    fn class_of(&mut self, memo: &Memo, index: u64) -> Option<Class> {
        let (key, value) = memo.peek_index(index)?;
        let slot = key.slot as usize;
        if let Some(&(stamp, class)) = self.classes.get(slot)
            && stamp == key.stamp
        {
            return Some(class);
        }
        let class = classify(value);
        if slot >= self.classes.len() {
            self.classes.resize(slot + 1, (0, Class::Other));
        }
        self.classes[slot] = (key.stamp, class);
        Some(class)
    }

    /// A string value of an entry (compile_context, user_metadata): a memo read or a
    /// short string written in place. Returns the value when it must be interned
    /// (`keep` says whether it is), and records the store of one written in place.
    fn text_value(
        &mut self,
        c: &mut Cur,
        memo: &Memo,
        next: &mut u64,
        stores: &mut Vec<Store>,
        keep: impl Fn(&str) -> bool,
    ) -> Option<Option<Value>> {
        if matches!(c.peek()?, b'h' | b'j') {
            let (_, v) = memo.peek_index(c.get()?)?;
            let Value::Str(s) = v else { return None };
            return Some(keep(s).then(|| v.clone()));
        }
        let s = c.text()?;
        let v = keep(s).then(|| Value::Str(Rc::from(s)));
        if let Some(index) = c.store(*next)? {
            let read_back = memo.is_read_back(index);
            stores.push(Store {
                index,
                value: read_back.then(|| v.clone().unwrap_or_else(|| Value::Str(Rc::from(s)))),
            });
            *next += 1;
        }
        Some(v)
    }

    /// A frames list written in place: `EMPTY_LIST [store]` then nothing (empty), one
    /// memo read and APPEND, or batches of memo reads of frame dicts.
    fn frames_list(
        &mut self,
        c: &mut Cur,
        memo: &Memo,
        next: &mut u64,
        stores: &mut Vec<Store>,
    ) -> Option<StackId> {
        c.expect(b']')?;
        let list_store = c.store(*next)?;
        if list_store.is_some() {
            *next += 1;
        }
        let mut frames = std::mem::take(&mut self.dec.scratch);
        frames.clear();
        let r = (|| {
            loop {
                match c.peek()? {
                    b'(' => {
                        c.p += 1;
                        while c.peek()? != b'e' {
                            let (key, v) = memo.peek_index(c.get()?)?;
                            frames.push(self.dec.shared_frame(key, v).ok()?);
                        }
                        c.p += 1;
                    }
                    b'h' | b'j' if frames.is_empty() => {
                        let (key, v) = memo.peek_index(c.get()?)?;
                        frames.push(self.dec.shared_frame(key, v).ok()?);
                        c.expect(b'a')?;
                        return Some(());
                    }
                    _ => return Some(()),
                }
            }
        })();
        if r.is_none() {
            self.dec.scratch = frames;
            return None;
        }
        // An empty list is no frames list the reader takes over; it decodes it as values
        // (to the empty stack, already interned).
        let (id, value) = if frames.is_empty() {
            (StackId(0), Value::List(Rc::new(Vec::new())))
        } else {
            let id = self.dec.frames.intern_stack(&frames);
            (id, Value::Handle(id.0 as u64))
        };
        self.dec.scratch = frames;
        if let Some(index) = list_store {
            stores.push(Store {
                index,
                value: memo.is_read_back(index).then_some(value),
            });
        }
        Some(id)
    }

    /// Decodes one entry at the start of `b` into `trace`, or nothing (None).
    fn fast_entry(&mut self, b: &[u8], memo: &mut Memo, list: ListId) -> Option<usize> {
        let mut c = Cur { b, p: 0 };
        c.expect(b'}')?;
        let mut next = memo.next_sequential()?;
        let mut stores = std::mem::take(&mut self.stores);
        stores.clear();
        let r = self.fast_entry_body(&mut c, memo, &mut next, &mut stores);
        let done = match r {
            Some(e) => self.commit(e, memo, &mut stores, list),
            None => None,
        };
        self.stores = stores;
        done.map(|()| c.p)
    }

    fn fast_entry_body(
        &mut self,
        c: &mut Cur,
        memo: &Memo,
        next: &mut u64,
        stores: &mut Vec<Store>,
    ) -> Option<(NewEvent, EntryKeys)> {
        // The entry dict itself: kept only if nothing reads it back.
        if let Some(index) = c.store(*next)? {
            if memo.is_read_back(index) {
                return None;
            }
            stores.push(Store { index, value: None });
            *next += 1;
        }
        c.expect(b'(')?;
        let mut e = NewEvent::default();
        let mut keys = EntryKeys::default();
        loop {
            if c.peek()? == b'u' {
                c.p += 1;
                break;
            }
            let Class::Key(key) = self.class_of(memo, c.get()?)? else {
                return None;
            };
            match key {
                Key::Action => match self.class_of(memo, c.get()?)? {
                    Class::Action(a) => e.action = Some(a),
                    _ => return None,
                },
                Key::Addr => e.addr = wrapping(c.int()?)?,
                Key::DeviceFree => e.addr = size(c.int()?)?,
                Key::Size => e.size = size(c.int()?)?,
                Key::Stream => e.stream = wrapping(c.int()?)?,
                Key::TimeUs => {
                    keys.time_us = true;
                    let t = i64::try_from(c.int()?).ok()?;
                    if t.unsigned_abs() > MAX_TIME_US as u64 {
                        return None;
                    }
                    e.time_us = Some(t);
                }
                Key::Frames => {
                    keys.frames = true;
                    e.stack = Some(if c.peek()? == b']' {
                        self.frames_list(c, memo, next, stores)?
                    } else {
                        match self.class_of(memo, c.get()?)? {
                            Class::Stack(id) => id,
                            _ => return None,
                        }
                    });
                }
                Key::CompileContext => {
                    keys.compile_context = true;
                    e.compile_context =
                        match self.text_value(c, memo, next, stores, |s| s != "N/A")? {
                            Some(v) => Some(self.dec.intern(&v).ok()?),
                            None => None,
                        };
                }
                Key::UserMetadata => {
                    keys.user_metadata = true;
                    e.user_metadata =
                        match self.text_value(c, memo, next, stores, |s| !s.is_empty())? {
                            Some(v) => Some(self.dec.intern(&v).ok()?),
                            None => None,
                        };
                }
            }
        }
        Some((e, keys))
    }

    /// Checks an entry as the decoder would, then records its stores and appends it.
    fn commit(
        &mut self,
        (e, keys): (NewEvent, EntryKeys),
        memo: &mut Memo,
        stores: &mut Vec<Store>,
        list: ListId,
    ) -> Option<()> {
        let action = e.action?;
        let segment_action = matches!(
            action,
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
        );
        if segment_action && e.addr.checked_add(e.size).is_none() {
            return None;
        }
        let p = self.pending.get_mut(&list)?;
        let total = p.trace.size_total.checked_add(e.size)?;
        if total > MAX_SIZE
            || self.dec.spent + DeviceTrace::bytes_per_event() as u64 > self.dec.budget
        {
            return None;
        }
        self.dec.spent += DeviceTrace::bytes_per_event() as u64;
        for s in stores.drain(..) {
            memo.store(s.index, s.value, 2);
        }
        p.trace.size_total = total;
        p.trace.keys.merge(keys);
        p.trace.push(e);
        self.fast_entries += 1;
        Some(())
    }

    /// [`crate::pickle::Builder::take_items`] for trace lists: decodes entries one after
    /// another, with the batch ends between them.
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
        let mut pos = taken.bytes;
        loop {
            let rest = &bytes[pos..];
            if rest.first() == Some(&b'}') {
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
            // A batch end and the next batch's MARK, then an entry: pass them.
            let mut c = Cur { b: rest, p: 0 };
            if c.expect(b'e').is_some() && c.expect(b'(').is_some() && c.peek() == Some(b'}') {
                let skip = c.p;
                match self.fast_entry(&rest[skip..], memo, list) {
                    Some(n) => {
                        pos += skip + n;
                        taken.items += 1;
                        taken.bytes = pos;
                        continue;
                    }
                    None => {
                        taken.bytes = pos + skip;
                        break;
                    }
                }
            }
            // A FRAME opcode between entries.
            if rest.first() == Some(&0x95) && rest.len() >= 9 {
                pos += 9;
                taken.bytes = pos;
                continue;
            }
            break;
        }
        taken
    }
}
