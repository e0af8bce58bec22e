//! The second pass: a stack machine over the data-only opcodes that builds [`Value`]s.
//!
//! Containers are mutable only while they are being built ("open"); once consumed by
//! their parent, a tuple, POP or STOP, they are frozen behind an `Rc`. A GET pushes a
//! reference to the memo slot, not a copy; most references are consumed by a
//! [`Builder`] that takes over the elements of a list as they are appended (a snapshot's
//! trace entries and frames lists), so those never exist as a value tree.

pub use super::memo::Memo;
use super::memo::{MemoRead, MemoReferences, SharedKey};
use super::opcodes;
use super::ops::{Input, Op, ReadInput, Release, SliceInput, next_op, text_index};
use super::value::ListId;
use super::{Error, Value};
use std::io::Read;
use std::rc::Rc;

/// Deepest nesting of containers accepted (also the most MARKs open at once, each of
/// which opens a level). Snapshots nest about 6 deep. Siblings are not limited: PyTorch's
/// C++ pickler writes a whole trace as one batch.
pub const MAX_DEPTH: u32 = 1000;
/// Most digits of a protocol 0 decimal integer, as Python's
/// `sys.int_info.default_max_str_digits` (Python refuses longer ones too).
pub const MAX_DECIMAL_DIGITS: usize = 4300;
/// Values the reader may hold at once (on its stack, in containers, in the memo) beyond
/// an eighth of the bytes read so far. Every opcode makes at most one value, and a
/// snapshot's bulk (trace entries, frames lists) goes to the [`Builder`] as it is read,
/// so a real file stays far below; a pickle that only piles up values (a decompression
/// bomb of `None`s in one list) is stopped at a few hundred MB.
pub const HELD_VALUES_FLOOR: u64 = 1 << 22;

/// Values a value holds, itself included: what the reader counted when it was built.
/// Containers shared with other places (the memo) count once, where they were built.
fn weight(v: &Value) -> u64 {
    match v {
        Value::List(l) | Value::Tuple(l) | Value::Set(l) if Rc::strong_count(l) == 1 => {
            1 + l.iter().map(weight).sum::<u64>()
        }
        Value::Dict(d) if Rc::strong_count(d) == 1 => {
            1 + d.iter().map(|(k, v)| weight(k) + weight(v)).sum::<u64>()
        }
        _ => 1,
    }
}

/// Lets the consumer of a pickle take over list elements as they are appended.
pub trait Builder {
    /// Called with the first element appended to a list; returning true makes every
    /// element of that list go to [`Builder::absorb`] / [`Builder::absorb_shared`]
    /// instead of into the list, and the list is replaced by what
    /// [`Builder::close_list`] returns.
    fn wants_list(&mut self, list: ListId, first: &Value) -> bool;
    /// Takes one element of a list that [`Builder::wants_list`] accepted.
    fn absorb(&mut self, list: ListId, index: u64, item: Value);
    /// Takes one element that is a memo value read back (shared with other places).
    /// `key` identifies that stored value, so it can serve as a cache key.
    fn absorb_shared(&mut self, list: ListId, index: u64, key: SharedKey, item: &Value) {
        let _ = key;
        self.absorb(list, index, item.clone());
    }
    /// The value that stands for a taken-over list once it is complete.
    fn close_list(&mut self, list: ListId, len: u64) -> Value {
        Value::Absorbed { list, len }
    }
    /// Told, before elements are appended to a list, how many bytes have been read: a
    /// builder can size its budgets by it.
    fn reached(&mut self, offset: u64) {
        let _ = offset;
    }
    /// A fast path: `bytes` (unread input at absolute `offset`) starts with an EMPTY_DICT
    /// that would become the next element of `list`, in a batch opened directly above
    /// it; `taking` is whether the builder already takes that list over (None: not
    /// decided yet). The builder may decode elements straight from the bytes, as long as
    /// the result is what taking over the same elements would give, recording memo
    /// stores through `memo` (values read back must be given). It returns the bytes
    /// and elements it took (it may also pass batch ends, `APPENDS MARK`, between
    /// elements); zero leaves everything to the reader. Taking elements of a list
    /// not decided yet decides it.
    fn take_items(
        &mut self,
        list: ListId,
        taking: Option<bool>,
        bytes: &[u8],
        offset: u64,
        memo: &mut Memo,
    ) -> FastTake {
        let _ = (list, taking, bytes, offset, memo);
        FastTake::default()
    }
    /// Whether [`Builder::take_items`] may take elements of this list (`list` is None
    /// while the list is still empty): if so, the reader hands over the dicts it made
    /// above the open batch when a sibling dict starts, before asking.
    fn fast_list(&mut self, list: Option<ListId>, taking: Option<bool>) -> bool {
        let _ = (list, taking);
        false
    }
    /// Offered by [`super::Reader`], before the second pass, where the input is large
    /// and workers were allowed: stretches of the bytes the builder may decode ahead on
    /// its own threads (for [`Builder::take_items`] to use once the reader gets there).
    /// Ignored by default.
    fn read_ahead(&mut self, plan: super::ReadAhead) {
        let _ = plan;
    }
}

/// What [`Builder::take_items`] took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastTake {
    pub bytes: usize,
    pub items: u64,
}

/// A builder that takes nothing: plain values all the way down.
pub struct PlainBuilder;

impl Builder for PlainBuilder {
    fn wants_list(&mut self, _list: ListId, _first: &Value) -> bool {
        false
    }
    fn absorb(&mut self, _list: ListId, _index: u64, _item: Value) {}
}

/// What a successful parse returns besides the root.
#[derive(Debug, Clone, Default)]
pub struct ParseInfo {
    /// Version byte of the first PROTO opcode (absent in protocols 0 and 1).
    pub protocol: Option<u8>,
    /// Bytes read up to and including STOP.
    pub bytes: u64,
    /// Bytes after STOP (read to the end, so a compressed stream's checksums are
    /// verified), and whether any of them is not NUL.
    pub trailing_bytes: u64,
    pub trailing_nonzero: bool,
}

enum Contents {
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Set(Vec<Value>),
}

struct Open {
    contents: Contents,
    /// 1 + deepest child so far.
    depth: u32,
    /// Memo slots to fill with the frozen value.
    memo_slots: Vec<usize>,
    id: ListId,
    /// For lists: None until the first element, then whether the builder takes them.
    absorbing: Option<bool>,
    absorbed: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    List,
    Dict,
    Set,
}

/// Bytes of lookahead a stream's window is given before a builder's fast path looks at it.
const FAST_LOOKAHEAD: usize = 1 << 16;

/// A new empty container of a kind: each has an identity of its own, as in Python.
fn empty_value(kind: Kind) -> Value {
    match kind {
        Kind::List => Value::List(Rc::new(Vec::new())),
        Kind::Dict => Value::Dict(Rc::new(Vec::new())),
        Kind::Set => Value::Set(Rc::new(Vec::new())),
    }
}

/// No memo slot waits for an empty container.
const NO_SLOT: u32 = u32::MAX;

/// Freezes an item into a value, filling the memo slots that wait for it.
// The boxes themselves are what is reused (stack items hold `Box<Open>`).
#[allow(clippy::vec_box)]
fn close_item<B: Builder>(
    item: Item,
    memo: &mut Memo,
    spare: &mut Vec<Box<Open>>,
    builder: &mut B,
) -> (Value, u32) {
    match item {
        Item::Val(v, d) => (v, d),
        Item::Ref(e) => memo.consume(e),
        Item::Empty(kind, slot) => {
            let value = empty_value(kind);
            if slot != NO_SLOT {
                memo.set(slot as usize, value.clone(), 1);
            }
            (value, 1)
        }
        Item::Open(mut o) => {
            let contents = std::mem::replace(&mut o.contents, Contents::List(Vec::new()));
            let value = match contents {
                Contents::List(items) => {
                    if o.absorbing == Some(true) {
                        builder.close_list(o.id, o.absorbed)
                    } else {
                        Value::List(Rc::new(items))
                    }
                }
                Contents::Dict(pairs) => Value::Dict(Rc::new(pairs)),
                Contents::Set(items) => Value::Set(Rc::new(items)),
            };
            for &slot in &o.memo_slots {
                memo.set(slot, value.clone(), o.depth);
            }
            let depth = o.depth;
            o.memo_slots.clear();
            if spare.len() < 4096 {
                spare.push(o);
            }
            (value, depth)
        }
    }
}

enum Item {
    /// A value with its nesting depth.
    Val(Value, u32),
    /// A memo value read back, not yet consumed (an entry of the memo's value table).
    Ref(u32),
    /// A container under construction that holds nothing yet, with the memo slot that
    /// waits for it ([`NO_SLOT`] if none): the common case costs no allocation.
    Empty(Kind, u32),
    Open(Box<Open>),
}

struct Machine<'b, B: Builder> {
    stack: Vec<Item>,
    /// Values made and not handed over or dropped (see [`HELD_VALUES_FLOOR`]).
    held: u64,
    marks: Vec<usize>,
    memo: Memo,
    /// Boxes of finished containers, reused for new ones (stack items hold `Box<Open>`).
    #[allow(clippy::vec_box)]
    spare: Vec<Box<Open>>,
    builder: &'b mut B,
    next_id: u64,
    offset: u64,
}

impl<B: Builder> Machine<'_, B> {
    fn err(&self, message: impl Into<String>) -> Error {
        Error::Invalid {
            offset: self.offset,
            message: message.into(),
        }
    }

    fn push_val(&mut self, v: Value) {
        self.held += 1;
        self.stack.push(Item::Val(v, 0));
    }

    fn open(&mut self, kind: Kind) {
        self.held += 1;
        self.stack.push(Item::Empty(kind, NO_SLOT));
    }

    /// The container under construction at stack position `pos`, given a box first if
    /// it was still empty.
    fn open_at(&mut self, pos: usize) -> Option<&mut Open> {
        if let Item::Empty(kind, slot) = self.stack[pos] {
            self.next_id += 1;
            let fresh = Open {
                contents: match kind {
                    Kind::List => Contents::List(Vec::new()),
                    Kind::Dict => Contents::Dict(Vec::new()),
                    Kind::Set => Contents::Set(Vec::new()),
                },
                depth: 1,
                memo_slots: Vec::new(),
                id: ListId(self.next_id),
                absorbing: None,
                absorbed: 0,
            };
            // Reuse the boxes of finished containers: one allocation less per container.
            let mut boxed = match self.spare.pop() {
                Some(mut b) => {
                    *b = fresh;
                    b
                }
                None => Box::new(fresh),
            };
            if slot != NO_SLOT {
                boxed.memo_slots.push(slot as usize);
            }
            self.stack[pos] = Item::Open(boxed);
        }
        match &mut self.stack[pos] {
            Item::Open(o) => Some(o),
            _ => None,
        }
    }

    /// At an EMPTY_DICT directly above an open batch of a list: lets the builder take
    /// elements straight from the bytes. True when it took some.
    fn try_fast<I: Input>(&mut self, input: &mut I) -> Result<bool, Error> {
        let len = self.stack.len();
        let Some(&mark) = self.marks.last() else {
            return Ok(false);
        };
        if mark == 0 || mark > len {
            return Ok(false);
        }
        match &self.stack[mark - 1] {
            Item::Empty(Kind::List, _) => {}
            Item::Open(o)
                if matches!(o.contents, Contents::List(_)) && o.absorbing != Some(false) => {}
            _ => return Ok(false),
        }
        let (id, taking) = match &self.stack[mark - 1] {
            Item::Open(o) => (Some(o.id), o.absorbing),
            _ => (None, None),
        };
        if !self.builder.fast_list(id, taking) {
            return Ok(false);
        }
        if len > mark {
            // Dicts the reader made (elements the fast path left to it) are finished now
            // that a sibling starts: hand them over first, in order, as APPENDS would.
            // (Only a tuple of such dicts would have used them otherwise.)
            let dicts = self.stack[mark..].iter().all(|i| match i {
                Item::Open(o) => matches!(o.contents, Contents::Dict(_)),
                Item::Empty(k, _) => *k == Kind::Dict,
                Item::Val(v, _) => matches!(v, Value::Dict(_)),
                Item::Ref(_) => false,
            });
            if !dicts {
                return Ok(false);
            }
            self.fill_batch(mark)?;
            if let Item::Open(o) = &self.stack[mark - 1]
                && o.absorbing == Some(false)
            {
                return Ok(false);
            }
        }
        let len = mark;
        if input.window().len() < FAST_LOOKAHEAD {
            input.fill(FAST_LOOKAHEAD, "lookahead")?;
        }
        let Some(o) = self.open_at(len - 1) else {
            return Ok(false);
        };
        let (id, taking) = (o.id, o.absorbing);
        let offset = input.offset();
        let taken = self
            .builder
            .take_items(id, taking, input.window(), offset, &mut self.memo);
        if taken.bytes == 0 {
            return Ok(false);
        }
        if taken.items > 0
            && let Item::Open(o) = &mut self.stack[len - 1]
        {
            o.absorbing = Some(true);
            o.absorbed += taken.items;
        }
        input.advance(taken.bytes);
        Ok(true)
    }

    fn close(&mut self, item: Item) -> (Value, u32) {
        close_item(item, &mut self.memo, &mut self.spare, self.builder)
    }

    /// Turns a reference on top of the stack into a value (before DUP or a memo store).
    fn materialize_top(&mut self) {
        if let Some(Item::Ref(slot)) = self.stack.last() {
            let (v, d) = self.memo.consume(*slot);
            *self.stack.last_mut().expect("checked") = Item::Val(v, d);
        }
    }

    fn pop(&mut self, what: &str) -> Result<(Value, u32), Error> {
        if matches!(self.marks.last(), Some(&m) if m >= self.stack.len()) {
            return Err(self.err(format!("{what} would pop a MARK")));
        }
        match self.stack.pop() {
            Some(item) => Ok(self.close(item)),
            None => Err(self.err(format!("{what} on an empty stack"))),
        }
    }

    /// Pops everything above the last MARK, frozen.
    fn pop_mark(&mut self, what: &str) -> Result<Vec<(Value, u32)>, Error> {
        let m = self.take_mark(what)?;
        let items: Vec<Item> = self.stack.drain(m..).collect();
        Ok(items.into_iter().map(|i| self.close(i)).collect())
    }

    fn take_mark(&mut self, what: &str) -> Result<usize, Error> {
        self.marks
            .pop()
            .ok_or_else(|| self.err(format!("{what} without a MARK")))
    }

    fn check_depth(&self, depth: u32) -> Result<u32, Error> {
        if depth > MAX_DEPTH {
            Err(Error::TooDeep {
                offset: self.offset,
                limit: MAX_DEPTH as u64,
                what: "levels of nesting",
            })
        } else {
            Ok(depth)
        }
    }

    /// Moves the items at `stack[start..]` into the open container at `stack[start - 1]`
    /// (APPEND(S), SETITEM(S), ADDITEMS), freezing each item on the way.
    fn fill(&mut self, start: usize, kind: Kind, what: &str) -> Result<(), Error> {
        self.fill_inner(start, kind, what, false)
    }

    /// Hands the elements above the open batch at `mark` to the list below it, keeping
    /// the batch open.
    fn fill_batch(&mut self, mark: usize) -> Result<(), Error> {
        self.fill_inner(mark, Kind::List, "APPENDS", true)
    }

    fn fill_inner(
        &mut self,
        start: usize,
        kind: Kind,
        what: &str,
        keep_mark: bool,
    ) -> Result<(), Error> {
        let offset = self.offset;
        let fail = |message: String| Error::Invalid { offset, message };
        let target_ok = match start.checked_sub(1).and_then(|i| self.stack.get(i)) {
            Some(Item::Empty(k, _)) if *k == kind => Ok(()),
            Some(Item::Empty(Kind::Dict, _)) => Err(format!("{what} into a dict")),
            Some(Item::Empty(Kind::List, _)) => Err(format!("{what} into a list")),
            Some(Item::Empty(Kind::Set, _)) => Err(format!("{what} into a set")),
            Some(Item::Open(o)) => match (&o.contents, kind) {
                (Contents::List(_), Kind::List)
                | (Contents::Dict(_), Kind::Dict)
                | (Contents::Set(_), Kind::Set) => Ok(()),
                (Contents::Dict(_), _) => Err(format!("{what} into a dict")),
                (Contents::List(_), _) => Err(format!("{what} into a list")),
                (Contents::Set(_), _) => Err(format!("{what} into a set")),
            },
            Some(Item::Val(v, _)) => Err(format!(
                "{what} into a finished {}; only containers still being built can be filled",
                v.type_name()
            )),
            Some(Item::Ref(slot)) => Err(format!(
                "{what} into a finished {} read from the memo; only containers still being built can be filled",
                self.memo.peek(*slot).0.type_name()
            )),
            None => Err(format!("{what} with no container to fill")),
        };
        target_ok.map_err(fail)?;
        if !keep_mark && self.marks.last().is_some_and(|&m| m >= start) {
            return Err(fail(format!("{what} across a MARK")));
        }
        let count = self.stack.len() - start;
        if kind == Kind::Dict && !count.is_multiple_of(2) {
            return Err(fail(format!("{what} with an odd number of items")));
        }
        if count == 0 {
            return Ok(());
        }
        self.open_at(start - 1);
        let Machine {
            stack,
            memo,
            spare,
            builder,
            held,
            ..
        } = self;
        let (below, above) = stack.split_at_mut(start);
        let Some(Item::Open(o)) = below.last_mut() else {
            unreachable!("target checked above");
        };
        let mut depth = o.depth;
        let mut take = |slot: &mut Item, memo: &mut Memo, builder: &mut B| match slot {
            Item::Val(v, d) => (std::mem::replace(v, Value::None), *d),
            Item::Ref(s) => memo.consume(*s),
            Item::Open(_) | Item::Empty(..) => {
                let item = std::mem::replace(slot, Item::Val(Value::None, 0));
                close_item(item, memo, spare, builder)
            }
        };
        match &mut o.contents {
            Contents::List(list) => {
                builder.reached(offset);
                for slot in above.iter_mut() {
                    if let Item::Open(_) | Item::Empty(..) = slot {
                        let (v, d) = take(slot, memo, builder);
                        *slot = Item::Val(v, d);
                    }
                    let absorbing = match o.absorbing {
                        Some(a) => a,
                        None => {
                            let a = match slot {
                                Item::Val(v, _) => builder.wants_list(o.id, v),
                                Item::Ref(s) => builder.wants_list(o.id, memo.peek(*s).0),
                                Item::Open(_) | Item::Empty(..) => false,
                            };
                            o.absorbing = Some(a);
                            a
                        }
                    };
                    if !absorbing {
                        list.reserve(count);
                        let (v, d) = take(slot, memo, builder);
                        depth = depth.max(d + 1);
                        list.push(v);
                        continue;
                    }
                    let index = o.absorbed;
                    o.absorbed += 1;
                    if let Item::Ref(s) = slot {
                        // Shared values go to the builder by reference: no copy at all.
                        let (v, d, stamp) = memo.peek(*s);
                        depth = depth.max(d + 1);
                        let key = SharedKey { slot: *s, stamp };
                        builder.absorb_shared(o.id, index, key, v);
                        memo.consumed(*s);
                        *slot = Item::Val(Value::None, 0);
                        *held = held.saturating_sub(1);
                    } else {
                        let (v, d) = take(slot, memo, builder);
                        depth = depth.max(d + 1);
                        *held = held.saturating_sub(weight(&v));
                        builder.absorb(o.id, index, v);
                    }
                }
            }
            Contents::Set(set) => {
                set.reserve(count);
                for slot in above.iter_mut() {
                    let (v, d) = take(slot, memo, builder);
                    depth = depth.max(d + 1);
                    set.push(v);
                }
            }
            Contents::Dict(pairs) => {
                // Repeated keys are kept; lookups take the last one, as Python's dict would.
                pairs.reserve(count / 2);
                for pair in above.chunks_exact_mut(2) {
                    let (k, v) = pair.split_at_mut(1);
                    let (key, dk) = take(&mut k[0], memo, builder);
                    let (value, dv) = take(&mut v[0], memo, builder);
                    depth = depth.max(dk + 1).max(dv + 1);
                    pairs.push((key, value));
                }
            }
        }
        o.depth = depth;
        stack.truncate(start);
        self.check_depth(depth)?;
        Ok(())
    }

    fn tuple(&mut self, items: Vec<(Value, u32)>) -> Result<(), Error> {
        let depth = self.check_depth(1 + items.iter().map(|(_, d)| *d).max().unwrap_or(0))?;
        let values = items.into_iter().map(|(v, _)| v).collect();
        self.held += 1;
        self.stack
            .push(Item::Val(Value::Tuple(Rc::new(values)), depth));
        Ok(())
    }

    fn memo_put(&mut self, index: u64) -> Result<(), Error> {
        if self.stack.is_empty() {
            return Err(self.err("memo store with an empty stack"));
        }
        let Some(slot) = self.memo.store_slot(index) else {
            return Ok(());
        };
        // Overwriting an index an open container would fill when it closes: it no longer
        // owns the index (legal, never written by real picklers). References already on
        // the stack keep the value they read: they point to the memo's value table.
        if let Some(pos) = self.memo.pending_position(slot) {
            match self.stack.get_mut(pos) {
                Some(Item::Open(o)) => o.memo_slots.retain(|&s| s != slot),
                Some(Item::Empty(_, s)) if *s as usize == slot => *s = NO_SLOT,
                _ => {}
            }
        }
        self.materialize_top();
        let pos = self.stack.len() - 1;
        match &mut self.stack[pos] {
            Item::Val(v, d) => {
                let (v, d) = (v.clone(), *d);
                self.memo.set(slot, v, d);
            }
            Item::Empty(_, s) if *s == NO_SLOT && slot < NO_SLOT as usize => {
                *s = slot as u32;
                self.memo.set_pending(slot, pos);
            }
            Item::Empty(..) | Item::Open(_) => {
                if let Some(o) = self.open_at(pos) {
                    o.memo_slots.push(slot);
                }
                self.memo.set_pending(slot, pos);
            }
            Item::Ref(_) => unreachable!("materialized above"),
        }
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Result<(), Error> {
        match self.memo.lookup(index) {
            MemoRead::Full(slot) => {
                self.held += 1;
                self.stack.push(Item::Ref(slot));
                Ok(())
            }
            MemoRead::Exhausted => Err(self.err(format!(
                "memo index {index} is read more often than the first pass counted; \
                 did the file change while it was being read?"
            ))),
            MemoRead::Pending(pos) => {
                // A container whose items are all written but that its parent has not
                // consumed yet (a frames list read again further down the same dict).
                // Reading it while it still receives a batch would be a cycle.
                // A real cycle fails later, when the frozen container is filled again.
                if !matches!(self.stack.get(pos), Some(Item::Open(_) | Item::Empty(..))) {
                    return Err(self.err(format!(
                        "memo reference {index} to a container that is still being filled; \
                         recursive structures are not snapshot data"
                    )));
                }
                let item = std::mem::replace(&mut self.stack[pos], Item::Val(Value::None, 0));
                let (v, d) = self.close(item);
                self.stack[pos] = Item::Val(v, d);
                self.memo_get(index)
            }
            MemoRead::Missing => Err(self.err(format!(
                "memo reference {index} to an index that was never stored"
            ))),
        }
    }
}

fn utf8(bytes: &[u8]) -> Rc<str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Rc::from(s),
        // Python writes lone surrogates with 'surrogatepass'; keep what can be kept.
        Err(_) => Rc::from(String::from_utf8_lossy(bytes).as_ref()),
    }
}

fn text_int(arg: &[u8], offset: u64) -> Result<Value, Error> {
    let s = std::str::from_utf8(arg).unwrap_or("").trim();
    let s = s.strip_suffix('L').unwrap_or(s);
    match s {
        "00" => return Ok(Value::Bool(false)),
        "01" => return Ok(Value::Bool(true)),
        _ => {}
    }
    if let Ok(i) = s.parse::<i64>() {
        return Ok(Value::Int(i));
    }
    if let Ok(i) = s.parse::<i128>() {
        return Ok(Value::from_le_signed(&i.to_le_bytes()));
    }
    let digits = s.trim_start_matches(['-', '+']).len();
    if digits > MAX_DECIMAL_DIGITS {
        return Err(Error::Invalid {
            offset,
            message: format!(
                "a decimal integer of {digits} digits; Python reads at most {MAX_DECIMAL_DIGITS} (sys.int_info.default_max_str_digits)"
            ),
        });
    }
    decimal_to_le(s).ok_or_else(|| Error::Invalid {
        offset,
        message: format!("expected a decimal integer, found {s:?}"),
    })
}

/// A decimal integer of any size as an integer value (two's complement, little-endian).
fn decimal_to_le(s: &str) -> Option<Value> {
    let (negative, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Magnitude in base 2^32, least significant limb first.
    let mut limbs: Vec<u32> = vec![0];
    for d in digits.bytes() {
        let mut carry = (d - b'0') as u64;
        for limb in limbs.iter_mut() {
            let v = *limb as u64 * 10 + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            limbs.push(carry as u32);
        }
    }
    let mut bytes: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    bytes.push(0); // room for the sign bit
    if negative {
        // Two's complement: invert and add one.
        let mut carry = 1u16;
        for b in bytes.iter_mut() {
            let v = (!*b) as u16 + carry;
            *b = v as u8;
            carry = v >> 8;
        }
    }
    Some(Value::from_le_signed(&bytes))
}

/// Decodes a protocol 0 quoted STRING argument (Python 2 `str`, read as Latin-1).
fn quoted(arg: &[u8], offset: u64) -> Result<Value, Error> {
    let inner = match arg {
        [q @ (b'\'' | b'"'), rest @ .., last] if last == q => rest,
        _ => {
            return Err(Error::Invalid {
                offset,
                message: "expected a quoted STRING argument".into(),
            });
        }
    };
    let mut out = String::new();
    let mut i = 0;
    while i < inner.len() {
        let c = inner[i];
        if c == b'\\' && i + 1 < inner.len() {
            i += 1;
            match inner[i] {
                b'n' => out.push('\n'),
                b't' => out.push('\t'),
                b'r' => out.push('\r'),
                b'\\' => out.push('\\'),
                b'\'' => out.push('\''),
                b'"' => out.push('"'),
                b'x' if i + 2 < inner.len() => {
                    let hex = std::str::from_utf8(&inner[i + 1..i + 3]).unwrap_or("");
                    let b = u8::from_str_radix(hex, 16).map_err(|_| Error::Invalid {
                        offset,
                        message: "bad \\x escape in STRING".into(),
                    })?;
                    out.push(b as char);
                    i += 2;
                }
                other => {
                    out.push('\\');
                    out.push(other as char);
                }
            }
        } else {
            out.push(c as char);
        }
        i += 1;
    }
    Ok(Value::Str(Rc::from(out.as_str())))
}

/// Decodes raw-unicode-escape (protocol 0 UNICODE): `\uXXXX` and `\UXXXXXXXX` escapes,
/// other bytes Latin-1.
fn raw_unicode(arg: &[u8]) -> Value {
    let mut out = String::new();
    let mut i = 0;
    while i < arg.len() {
        let width = match (arg[i], arg.get(i + 1)) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            _ => 0,
        };
        if width > 0 && i + 2 + width <= arg.len() {
            let hex = std::str::from_utf8(&arg[i + 2..i + 2 + width]).unwrap_or("");
            if let Some(c) = u32::from_str_radix(hex, 16).ok().and_then(char::from_u32) {
                out.push(c);
                i += 2 + width;
                continue;
            }
        }
        out.push(arg[i] as char);
        i += 1;
    }
    Value::Str(Rc::from(out.as_str()))
}

/// Second pass: builds the value tree, keeping memo values only for the indices in
/// `refs`, and hands list elements to `builder` when it asks for them.
pub fn parse_with<R: Read, B: Builder>(
    reader: R,
    refs: MemoReferences,
    builder: &mut B,
) -> Result<(Value, ParseInfo), Error> {
    parse_input(&mut ReadInput::new(reader), refs, builder)
}

/// [`parse_with`] over bytes held in memory.
pub fn parse_slice<B: Builder>(
    bytes: &[u8],
    refs: MemoReferences,
    builder: &mut B,
) -> Result<(Value, ParseInfo), Error> {
    parse_input(&mut SliceInput::new(bytes), refs, builder)
}

/// [`parse_slice`], telling `release` which bytes it has read.
pub fn parse_slice_releasing<B: Builder>(
    bytes: &[u8],
    refs: MemoReferences,
    builder: &mut B,
    release: Option<Release>,
) -> Result<(Value, ParseInfo), Error> {
    parse_input(&mut SliceInput::releasing(bytes, release), refs, builder)
}

fn parse_input<I: Input, B: Builder>(
    input: &mut I,
    refs: MemoReferences,
    builder: &mut B,
) -> Result<(Value, ParseInfo), Error> {
    let mut m = Machine {
        stack: Vec::new(),
        held: 0,
        marks: Vec::new(),
        memo: Memo::new(refs),
        spare: Vec::new(),
        builder,
        next_id: 0,
        offset: 0,
    };
    let mut info = ParseInfo::default();
    loop {
        if m.held > HELD_VALUES_FLOOR + (m.offset >> 3) {
            return Err(Error::TooManyValues {
                offset: m.offset,
                values: m.held,
            });
        }
        if input.window().first() == Some(&opcodes::EMPTY_DICT) && m.try_fast(input)? {
            continue;
        }
        let op = next_op(input, &mut m.offset)?;
        match op {
            Op::Proto(p) => {
                if p > 5 {
                    return Err(m.err(format!("unsupported pickle protocol {p}; expected 0 to 5")));
                }
                info.protocol.get_or_insert(p);
            }
            Op::Frame => {}
            Op::Stop => {
                let (root, _) = m.pop("STOP")?;
                info.bytes = input.offset();
                drop(m);
                (info.trailing_bytes, info.trailing_nonzero) = input.drain()?;
                return Ok((root, info));
            }
            Op::Mark => {
                if m.marks.len() >= MAX_DEPTH as usize {
                    return Err(Error::TooDeep {
                        offset: m.offset,
                        limit: MAX_DEPTH as u64,
                        what: "levels of nesting (MARKs open at once)",
                    });
                }
                m.marks.push(m.stack.len())
            }
            Op::Pop => {
                let (v, _) = m.pop("POP")?;
                m.held = m.held.saturating_sub(weight(&v));
            }
            Op::PopMark => {
                m.pop_mark("POP_MARK")?;
            }
            Op::Dup => {
                m.materialize_top();
                match m.stack.last() {
                    Some(Item::Val(v, d)) => {
                        let item = Item::Val(v.clone(), *d);
                        m.held += 1;
                        m.stack.push(item);
                    }
                    Some(Item::Open(_) | Item::Empty(..)) => {
                        return Err(m.err("DUP of a container still being built is not supported"));
                    }
                    Some(Item::Ref(_)) => unreachable!("materialized above"),
                    None => return Err(m.err("DUP on an empty stack")),
                }
            }
            Op::None => m.push_val(Value::None),
            Op::Bool(b) => m.push_val(Value::Bool(b)),
            Op::Int(i) => m.push_val(Value::Int(i)),
            Op::Long(bytes) => {
                let v = Value::from_le_signed(bytes);
                m.push_val(v);
            }
            Op::TextInt(arg) => {
                let v = text_int(arg, m.offset)?;
                m.push_val(v);
            }
            Op::Float(f) => m.push_val(Value::Float(f)),
            Op::TextFloat(arg) => {
                let f = std::str::from_utf8(arg)
                    .ok()
                    .and_then(|s| s.trim().parse::<f64>().ok())
                    .ok_or_else(|| m.err("expected a decimal float"))?;
                m.push_val(Value::Float(f));
            }
            Op::Str(bytes) => {
                let s = utf8(bytes);
                m.push_val(Value::Str(s));
            }
            Op::QuotedStr(arg) => {
                let v = quoted(arg, m.offset)?;
                m.push_val(v);
            }
            Op::RawUnicode(arg) => {
                let v = raw_unicode(arg);
                m.push_val(v);
            }
            Op::Latin1(bytes) => {
                let s: String = bytes.iter().map(|&b| b as char).collect();
                m.push_val(Value::Str(Rc::from(s.as_str())));
            }
            Op::Bytes(bytes) => {
                let b: Rc<[u8]> = Rc::from(bytes);
                m.push_val(Value::Bytes(b));
            }
            Op::EmptyList => m.open(Kind::List),
            Op::EmptyDict => m.open(Kind::Dict),
            Op::EmptySet => m.open(Kind::Set),
            Op::EmptyTuple => m.push_val(Value::Tuple(Rc::new(Vec::new()))),
            Op::List | Op::Dict => {
                // Build the container under its items, then fill it as APPENDS would.
                let (what, kind) = match op {
                    Op::List => ("LIST", Kind::List),
                    _ => ("DICT", Kind::Dict),
                };
                let mark = m.take_mark(what)?;
                m.open(kind);
                let made = m.stack.pop().expect("just pushed");
                m.stack.insert(mark, made);
                m.fill(mark + 1, kind, what)?;
            }
            Op::FrozenSet => {
                let items = m.pop_mark("FROZENSET")?;
                let depth = m.check_depth(1 + items.iter().map(|(_, d)| *d).max().unwrap_or(0))?;
                let values = items.into_iter().map(|(v, _)| v).collect();
                m.held += 1;
                m.stack.push(Item::Val(Value::Set(Rc::new(values)), depth));
            }
            Op::Tuple => {
                let items = m.pop_mark("TUPLE")?;
                m.tuple(items)?;
            }
            Op::Tuple1 | Op::Tuple2 | Op::Tuple3 => {
                let n = match op {
                    Op::Tuple1 => 1,
                    Op::Tuple2 => 2,
                    _ => 3,
                };
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(m.pop("TUPLE")?);
                }
                items.reverse();
                m.tuple(items)?;
            }
            Op::Append => {
                let start = m
                    .stack
                    .len()
                    .checked_sub(1)
                    .ok_or_else(|| m.err("APPEND on an empty stack"))?;
                m.fill(start, Kind::List, "APPEND")?;
            }
            Op::SetItem => {
                let start = m
                    .stack
                    .len()
                    .checked_sub(2)
                    .ok_or_else(|| m.err("SETITEM needs a key and a value"))?;
                m.fill(start, Kind::Dict, "SETITEM")?;
            }
            Op::Appends | Op::SetItems | Op::AddItems => {
                let (what, kind) = match op {
                    Op::Appends => ("APPENDS", Kind::List),
                    Op::SetItems => ("SETITEMS", Kind::Dict),
                    _ => ("ADDITEMS", Kind::Set),
                };
                let mark = m.take_mark(what)?;
                m.fill(mark, kind, what)?;
            }
            Op::Get(i) => m.memo_get(i)?,
            Op::TextGet(arg) => {
                let i = text_index(arg, m.offset)?;
                m.memo_get(i)?;
            }
            Op::Put(i) => m.memo_put(i)?,
            Op::TextPut(arg) => {
                let i = text_index(arg, m.offset)?;
                m.memo_put(i)?;
            }
            Op::Memoize => {
                let i = m.memo.next_index();
                m.memo_put(i)?;
            }
        }
    }
}
