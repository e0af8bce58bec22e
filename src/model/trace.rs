//! Trace events of one device, stored compactly.
//!
//! A large snapshot holds tens of millions of trace entries of about 60 bytes each in the
//! file. Each is kept in 20 bytes: address with action and stream packed beside it, size,
//! time (an offset from a base per block of 4096 events) and stack id. An address keeps its
//! low 48 bits in place and its high 16 bits once per block; the rare address whose high
//! bits are not its block's, and a size of 4 GiB or more, are kept beside the events. Fields that are
//! almost always at their default (pool ids, compile context, user metadata, forward
//! frames, keys vramlens does not know) live in sparse side tables keyed by event index.

use super::frames::{FxMap, StackId, StrId};
use super::round_trip::ExtraKeys;

/// What a trace entry records (spec section 3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Action {
    Alloc = 0,
    FreeRequested = 1,
    FreeCompleted = 2,
    SegmentAlloc = 3,
    SegmentFree = 4,
    SegmentMap = 5,
    SegmentUnmap = 6,
    Snapshot = 7,
    Oom = 8,
    Annotate = 9,
    /// An action this version does not know; its name is kept beside the event.
    Other = 15,
}

impl Action {
    pub const KNOWN: [Action; 10] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
        Action::Annotate,
    ];

    pub fn from_name(name: &str) -> Action {
        match name {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            "annotate" => Action::Annotate,
            _ => Action::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
            Action::Other => "other",
        }
    }

    #[inline]
    fn from_bits(bits: u8) -> Action {
        Action::KNOWN
            .get(bits as usize)
            .copied()
            .unwrap_or(Action::Other)
    }
}

/// Addresses are kept in place by their low 48 bits (all of every x86-64 and arm64
/// user-space pointer); the high 16 bits are kept once per block of events.
const ADDR_BITS: u32 = 48;
const ADDR_ESCAPE: u64 = (1 << ADDR_BITS) - 1;
const ACTION_SHIFT: u32 = ADDR_BITS;
const STREAM_SHIFT: u32 = ADDR_BITS + 4;
/// A size of 4 GiB or more: in a side table.
const SIZE_ESCAPE: u32 = u32::MAX;
const STREAM_ESCAPE: u64 = (1 << 12) - 1;
const NO_STACK: u32 = u32::MAX;
/// Times are kept as offsets from a base per block of events.
const TIME_BLOCK_BITS: u32 = 12;
const NO_TIME: u32 = u32::MAX;
/// An offset that does not fit (or goes back before the block's base): in a side table.
const TIME_ESCAPE: u32 = u32::MAX - 1;
const NO_BASE: i64 = i64::MIN;
/// `device_free` of an `oom` entry that is not a size (stored in place of `addr`).
pub const UNKNOWN_FREE: u64 = u64::MAX;
/// Streams looked up by a linear scan below this many, by a hash map above.
const STREAM_SCAN: usize = 8;

/// One event as stored: 20 bytes, 4-byte aligned.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
struct Packed {
    /// `addr` (or `device_free` for an `oom` entry; 48 bits) | action (4 bits) | stream
    /// index (12 bits).
    addr_action_stream: u64,
    size: u32,
    /// `time_us` minus the base of the event's block of 4096 events.
    time: u32,
    stack: u32,
}

/// One trace entry, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    pub action: Action,
    /// `addr` of the entry; for `oom` entries this is `device_free` instead.
    pub addr: u64,
    pub size: u64,
    /// The raw `stream` value (a `cudaStream_t` handle, 0 for the default stream).
    pub stream: u64,
    /// `time_us` when the entry has one (PyTorch 2.2 and later).
    pub time_us: Option<i64>,
    /// The entry's `frames`, when it has the key.
    pub stack: Option<StackId>,
}

impl TraceEvent {
    /// Free bytes the device reported, for `oom` entries (None when the file's value was
    /// not a size).
    pub fn device_free(&self) -> Option<u64> {
        (self.action == Action::Oom && self.addr != UNKNOWN_FREE).then_some(self.addr)
    }
}

/// Optional keys of trace entries, remembered to tell which PyTorch layout wrote a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryKeys {
    pub time_us: bool,
    pub frames: bool,
    pub compile_context: bool,
    pub user_metadata: bool,
    pub forward_frames: bool,
    pub pool_id: bool,
    pub internal_metadata: bool,
    pub cpp_frames: bool,
}

impl EntryKeys {
    pub fn merge(&mut self, o: EntryKeys) {
        self.time_us |= o.time_us;
        self.frames |= o.frames;
        self.compile_context |= o.compile_context;
        self.user_metadata |= o.user_metadata;
        self.forward_frames |= o.forward_frames;
        self.pool_id |= o.pool_id;
        self.internal_metadata |= o.internal_metadata;
        self.cpp_frames |= o.cpp_frames;
    }
}

/// The trace of one device (or the host trace), in file order (oldest first).
#[derive(Default, Debug)]
pub struct DeviceTrace {
    events: Vec<Packed>,
    /// Distinct raw stream values; events store an index into this.
    streams: Vec<u64>,
    /// Index of each stream, once there are more than a few.
    stream_index: FxMap<u64, u32>,
    /// `time_us` of the first timed event of each block of 4096 events.
    time_base: Vec<i64>,
    /// The high 16 bits of the address of the first event of each block of 4096 events:
    /// an address in the block with other high bits is kept in a side table. A trace's
    /// addresses share their high bits, so a trace whose addresses all sit at or above
    /// 2^48 keeps them in place as well.
    addr_high: Vec<u16>,
    /// Fields almost always at their default, kept apart so an empty trace stays small.
    rare: Option<Box<Rare>>,
    pub keys: EntryKeys,
    /// Sum of the sizes of the entries decoded into this trace (kept below 2^63).
    pub(crate) size_total: u64,
}

#[derive(Default, Debug)]
struct Rare {
    big_addrs: Vec<(u32, u64)>,
    big_sizes: Vec<(u32, u64)>,
    big_times: Vec<(u32, i64)>,
    big_streams: Vec<(u32, u64)>,
    other_actions: Vec<(u32, StrId)>,
    /// Pool ids other than the default `(0, 0)`.
    pools: Vec<(u32, (i64, i64))>,
    /// compile_context values other than "N/A".
    compile_context: Vec<(u32, StrId)>,
    /// user_metadata values other than "".
    user_metadata: Vec<(u32, StrId)>,
    internal_metadata: Vec<(u32, StrId)>,
    cpp_frames: Vec<(u32, StrId)>,
    forward_frames: Vec<(u32, Vec<StrId>)>,
    /// Keys the model does not interpret (and `category`), kept for writing back.
    extra_keys: Vec<(u32, ExtraKeys)>,
}

/// Which side table a string id of [`DeviceTrace::strings_mut`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceString {
    OtherAction,
    CompileContext,
    UserMetadata,
    InternalMetadata,
    CppFrames,
    ForwardFrames,
}

fn sparse_get<T>(table: &[(u32, T)], index: u32) -> Option<&T> {
    table
        .binary_search_by_key(&index, |(i, _)| *i)
        .ok()
        .map(|p| &table[p].1)
}

/// The parts of one entry to append; see [`DeviceTrace::push`].
#[derive(Debug, Default, Clone)]
pub struct NewEvent {
    pub action: Option<Action>,
    pub other_action: Option<StrId>,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub time_us: Option<i64>,
    pub stack: Option<StackId>,
    pub pool: Option<(i64, i64)>,
    pub compile_context: Option<StrId>,
    pub user_metadata: Option<StrId>,
    pub internal_metadata: Option<StrId>,
    pub cpp_frames: Option<StrId>,
    pub forward_frames: Option<Vec<StrId>>,
    pub extra_keys: Option<ExtraKeys>,
}

impl DeviceTrace {
    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Makes room for `n` more events.
    pub fn reserve(&mut self, n: usize) {
        self.events.reserve(n);
    }

    /// Bytes of memory held per event, for the benchmark notes.
    pub const fn bytes_per_event() -> usize {
        std::mem::size_of::<Packed>()
    }

    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Default::default)
    }

    /// Index of a stream value in the stream table (adding it), or None when the table
    /// is full.
    #[inline]
    fn stream_slot(&mut self, stream: u64) -> Option<u64> {
        if self.streams.len() <= STREAM_SCAN {
            if let Some(p) = self.streams.iter().position(|&s| s == stream) {
                return Some(p as u64);
            }
        } else if let Some(&p) = self.stream_index.get(&stream) {
            return Some(p as u64);
        }
        if self.streams.len() as u64 >= STREAM_ESCAPE {
            return None;
        }
        self.streams.push(stream);
        let p = self.streams.len() - 1;
        if self.streams.len() > STREAM_SCAN {
            if self.stream_index.is_empty() {
                for (i, &s) in self.streams.iter().enumerate() {
                    self.stream_index.insert(s, i as u32);
                }
            } else {
                self.stream_index.insert(stream, p as u32);
            }
        }
        Some(p as u64)
    }

    pub fn push(&mut self, e: NewEvent) {
        let index = self.events.len() as u32;
        let action = e.action.unwrap_or(Action::Other);
        if let Some(name) = e.other_action {
            self.rare().other_actions.push((index, name));
        }
        if let Some(p) = e.pool.filter(|&p| p != (0, 0)) {
            self.rare().pools.push((index, p));
        }
        if let Some(s) = e.internal_metadata {
            self.rare().internal_metadata.push((index, s));
        }
        if let Some(s) = e.cpp_frames {
            self.rare().cpp_frames.push((index, s));
        }
        if let Some(f) = e.forward_frames {
            self.rare().forward_frames.push((index, f));
        }
        if let Some(k) = e.extra_keys {
            self.rare().extra_keys.push((index, k));
        }
        self.push_common(
            action,
            e.addr,
            e.size,
            e.stream,
            e.time_us,
            e.stack,
            e.compile_context,
            e.user_metadata,
        );
    }

    /// An event with none of the rare fields but compile context and user metadata.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn push_common(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        stream: u64,
        time_us: Option<i64>,
        stack: Option<StackId>,
        compile_context: Option<StrId>,
        user_metadata: Option<StrId>,
    ) {
        let index = self.events.len() as u32;
        let e = NewEvent {
            addr,
            size,
            stream,
            time_us,
            stack,
            compile_context,
            user_metadata,
            ..NewEvent::default()
        };
        let size = match u32::try_from(e.size) {
            Ok(s) if s != SIZE_ESCAPE => s,
            _ => {
                self.rare().big_sizes.push((index, e.size));
                SIZE_ESCAPE
            }
        };
        let block = (index >> TIME_BLOCK_BITS) as usize;
        if block == self.time_base.len() {
            self.time_base.push(NO_BASE);
            self.addr_high.push((e.addr >> ADDR_BITS) as u16);
        }
        let low = e.addr & ADDR_ESCAPE;
        let addr_bits = if low == ADDR_ESCAPE || e.addr >> ADDR_BITS != self.addr_high[block] as u64
        {
            self.rare().big_addrs.push((index, e.addr));
            ADDR_ESCAPE
        } else {
            low
        };
        let stream_index = match self.stream_slot(e.stream) {
            Some(p) => p,
            None => {
                self.rare().big_streams.push((index, e.stream));
                STREAM_ESCAPE
            }
        };
        if let Some(s) = e.compile_context {
            self.rare().compile_context.push((index, s));
        }
        if let Some(s) = e.user_metadata {
            self.rare().user_metadata.push((index, s));
        }
        let time = match e.time_us {
            None => NO_TIME,
            Some(t) => {
                let base = &mut self.time_base[block];
                if *base == NO_BASE {
                    *base = t;
                }
                match t.checked_sub(*base).and_then(|d| u32::try_from(d).ok()) {
                    Some(d) if d < TIME_ESCAPE => d,
                    _ => {
                        self.rare().big_times.push((index, t));
                        TIME_ESCAPE
                    }
                }
            }
        };
        self.events.push(Packed {
            addr_action_stream: addr_bits
                | ((action as u64) << ACTION_SHIFT)
                | (stream_index << STREAM_SHIFT),
            size,
            time,
            stack: e.stack.map_or(NO_STACK, |s| s.0),
        });
    }

    #[inline]
    pub fn action(&self, i: usize) -> Action {
        let bits = self.events[i].addr_action_stream;
        Action::from_bits(((bits >> ACTION_SHIFT) & 0xf) as u8)
    }

    /// The stack of event `i` (None: the entry had no `frames` key).
    #[inline]
    pub fn stack(&self, i: usize) -> Option<StackId> {
        let stack = self.events[i].stack;
        (stack != NO_STACK).then_some(StackId(stack))
    }

    /// Event `i`'s `time_us` as the file has it (0 included).
    #[inline]
    pub fn time_us(&self, i: usize) -> Option<i64> {
        self.unpack_time(self.events[i].time, i)
    }

    /// Event `i`'s time when it has one: some writers stamp 0 where they had no clock, so
    /// a time of 0 (or before 1970) counts as none. The one rule every analysis reads
    /// times by.
    #[inline]
    pub fn stamped_time(&self, i: usize) -> Option<i64> {
        self.time_us(i).filter(|&t| t > 0)
    }

    /// The indices of the trace's `oom` events, in order.
    pub fn oom_events(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(|&i| self.action(i) == Action::Oom)
    }

    /// The first stamped time of the trace.
    pub fn first_stamped_time(&self) -> Option<i64> {
        (0..self.len()).find_map(|i| self.stamped_time(i))
    }

    /// The address of event `i`.
    #[inline]
    pub fn addr(&self, i: usize) -> u64 {
        self.unpack_addr(self.events[i].addr_action_stream, i)
    }

    /// The size of event `i`.
    #[inline]
    pub fn size(&self, i: usize) -> u64 {
        self.unpack_size(self.events[i].size, i)
    }

    #[inline]
    pub fn get(&self, i: usize) -> TraceEvent {
        let p = self.events[i];
        let bits = p.addr_action_stream;
        let stream = match bits >> STREAM_SHIFT {
            STREAM_ESCAPE => self.escaped_stream(i),
            s => self.streams[s as usize],
        };
        let stack = p.stack;
        TraceEvent {
            action: Action::from_bits(((bits >> ACTION_SHIFT) & 0xf) as u8),
            addr: self.unpack_addr(bits, i),
            size: self.unpack_size(p.size, i),
            stream,
            time_us: self.unpack_time(p.time, i),
            stack: (stack != NO_STACK).then_some(StackId(stack)),
        }
    }

    /// Event `i`'s address from its packed word.
    #[inline]
    fn unpack_addr(&self, addr_action_stream: u64, i: usize) -> u64 {
        match addr_action_stream & ADDR_ESCAPE {
            ADDR_ESCAPE => self.escaped_addr(i),
            a => ((self.addr_high[i >> TIME_BLOCK_BITS] as u64) << ADDR_BITS) | a,
        }
    }

    /// Event `i`'s size from its packed field.
    #[inline]
    fn unpack_size(&self, size: u32, i: usize) -> u64 {
        match size {
            SIZE_ESCAPE => self.escaped_size(i),
            s => s as u64,
        }
    }

    /// Event `i`'s time from its packed offset.
    #[inline]
    fn unpack_time(&self, time: u32, i: usize) -> Option<i64> {
        match time {
            NO_TIME => None,
            TIME_ESCAPE => self.side(|r| &r.big_times, i).copied(),
            d => Some(self.time_base[i >> TIME_BLOCK_BITS] + d as i64),
        }
    }

    #[cold]
    fn escaped_size(&self, i: usize) -> u64 {
        *self
            .side(|r| &r.big_sizes, i)
            .unwrap_or(&(SIZE_ESCAPE as u64))
    }

    #[cold]
    fn escaped_addr(&self, i: usize) -> u64 {
        *self.side(|r| &r.big_addrs, i).unwrap_or(&ADDR_ESCAPE)
    }

    #[cold]
    fn escaped_stream(&self, i: usize) -> u64 {
        *self.side(|r| &r.big_streams, i).unwrap_or(&0)
    }

    pub fn iter(&self) -> impl Iterator<Item = TraceEvent> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    fn side<T>(&self, table: impl Fn(&Rare) -> &[(u32, T)], i: usize) -> Option<&T> {
        self.rare
            .as_deref()
            .and_then(|r| sparse_get(table(r), i as u32))
    }

    /// The action name as written in the file (unknown names included).
    pub fn other_action(&self, i: usize) -> Option<StrId> {
        self.side(|r| &r.other_actions, i).copied()
    }

    /// Pool id of an event, `(0, 0)` when the entry had the default pool or none.
    pub fn pool_id(&self, i: usize) -> (i64, i64) {
        self.side(|r| &r.pools, i).copied().unwrap_or((0, 0))
    }

    pub fn compile_context(&self, i: usize) -> Option<StrId> {
        self.side(|r| &r.compile_context, i).copied()
    }

    pub fn user_metadata(&self, i: usize) -> Option<StrId> {
        self.side(|r| &r.user_metadata, i).copied()
    }

    pub fn internal_metadata(&self, i: usize) -> Option<StrId> {
        self.side(|r| &r.internal_metadata, i).copied()
    }

    pub fn forward_frames(&self, i: usize) -> Option<&[StrId]> {
        self.side(|r| &r.forward_frames, i).map(|v| v.as_slice())
    }

    pub fn cpp_frames(&self, i: usize) -> Option<StrId> {
        self.side(|r| &r.cpp_frames, i).copied()
    }

    /// Keys of the entry that the model does not interpret, in file order.
    pub fn extra_keys(&self, i: usize) -> &[(String, super::round_trip::Extra)] {
        self.side(|r| &r.extra_keys, i)
            .map_or(&[], |v| v.as_slice())
    }

    /// Every string id held beside the events, with the table it comes from, for
    /// rewriting (redaction).
    pub fn strings_mut(&mut self) -> impl Iterator<Item = (TraceString, &mut StrId)> + '_ {
        fn tagged(
            table: &mut [(u32, StrId)],
            tag: TraceString,
        ) -> impl Iterator<Item = (TraceString, &mut StrId)> + '_ {
            table.iter_mut().map(move |(_, s)| (tag, s))
        }
        self.rare.iter_mut().flat_map(|r| {
            let r = &mut **r;
            tagged(&mut r.other_actions, TraceString::OtherAction)
                .chain(tagged(&mut r.compile_context, TraceString::CompileContext))
                .chain(tagged(&mut r.user_metadata, TraceString::UserMetadata))
                .chain(tagged(
                    &mut r.internal_metadata,
                    TraceString::InternalMetadata,
                ))
                .chain(tagged(&mut r.cpp_frames, TraceString::CppFrames))
                .chain(
                    r.forward_frames
                        .iter_mut()
                        .flat_map(|(_, v)| v.iter_mut().map(|s| (TraceString::ForwardFrames, s))),
                )
        })
    }

    /// The extra keys of every entry that has some, for rewriting.
    pub fn extra_keys_mut(&mut self) -> impl Iterator<Item = &mut ExtraKeys> + '_ {
        self.rare
            .iter_mut()
            .flat_map(|r| r.extra_keys.iter_mut().map(|(_, k)| k))
    }

    /// Removes every `user_metadata` value (all entries then hold the empty default).
    pub fn clear_user_metadata(&mut self) {
        if let Some(r) = self.rare.as_mut() {
            r.user_metadata.clear();
        }
    }

    /// Distinct raw stream values, in order of first appearance.
    pub fn streams(&self) -> &[u64] {
        &self.streams
    }

    /// Names of unknown actions with their event indices.
    pub fn other_actions(&self) -> &[(u32, StrId)] {
        self.rare.as_deref().map_or(&[], |r| &r.other_actions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_every_field() {
        assert_eq!(DeviceTrace::bytes_per_event(), 20);
        let mut t = DeviceTrace::default();
        let cases = [
            (
                Action::Alloc,
                0x7f3a_0000_0000u64,
                4096u64,
                0u64,
                Some(1_700_000_000_000_000i64),
            ),
            (Action::Oom, 123, (1 << 48) + 5, 1u64 << 63, None),
            (Action::SegmentUnmap, u64::MAX, 0, 0x5555_0000_1234, Some(0)),
            // At and around the in-place limits (48-bit addresses, 32-bit sizes).
            (
                Action::SegmentAlloc,
                (1 << 48) - 1,
                u32::MAX as u64,
                0,
                None,
            ),
            (Action::SegmentMap, 1 << 48, (u32::MAX - 1) as u64, 0, None),
            (Action::FreeCompleted, (1 << 48) - 2, 8 << 30, 0, None),
        ];
        for (i, &(action, addr, size, stream, time_us)) in cases.iter().enumerate() {
            t.push(NewEvent {
                action: Some(action),
                addr,
                size,
                stream,
                time_us,
                stack: (i == 1).then_some(StackId(7)),
                pool: Some(if i == 2 { (1, 2) } else { (0, 0) }),
                ..Default::default()
            });
        }
        for (i, &(action, addr, size, stream, time_us)) in cases.iter().enumerate() {
            let e = t.get(i);
            assert_eq!(
                (e.action, e.addr, e.size, e.stream, e.time_us),
                (action, addr, size, stream, time_us)
            );
            assert_eq!((t.action(i), t.addr(i)), (action, addr));
        }
        assert_eq!(t.get(1).stack, Some(StackId(7)));
        assert_eq!(t.get(0).stack, None);
        assert_eq!(t.get(1).device_free(), Some(123));
        assert_eq!(t.pool_id(2), (1, 2));
        assert_eq!(t.pool_id(0), (0, 0));
    }

    #[test]
    fn addresses_at_or_above_2_48_stay_in_place_when_a_block_shares_their_high_bits() {
        let high = 1u64 << 48;
        // Blocks of 4096: the first all at 2^48 and above, the second starting below.
        let addrs: Vec<u64> = (0..10_000u64)
            .map(|i| match i {
                4096 => 0x7f00_0000_0000,
                _ if i % 1000 == 999 => 5,
                _ if i % 1000 == 998 => u64::MAX,
                _ => high + 0x7f00_0000_0000 + i * 512,
            })
            .collect();
        let mut t = DeviceTrace::default();
        for &addr in &addrs {
            t.push(NewEvent {
                action: Some(Action::Alloc),
                addr,
                ..Default::default()
            });
        }
        for (i, &addr) in addrs.iter().enumerate() {
            assert_eq!(t.addr(i), addr, "event {i}");
            assert_eq!(t.get(i).addr, addr, "event {i}");
        }
        // Kept beside the events: every u64::MAX, and each address whose high bits are
        // not those of its block's first address (the low ones among high ones, and the
        // high ones of the block that starts low).
        let beside = t.rare.as_ref().map_or(0, |r| r.big_addrs.len());
        let expected = addrs
            .iter()
            .enumerate()
            .filter(|&(i, &a)| {
                let first = addrs[i / 4096 * 4096];
                a == u64::MAX || a >> 48 != first >> 48
            })
            .count();
        assert_eq!(beside, expected);
        assert!(beside < 4200, "{beside} kept beside the events");
    }

    #[test]
    fn times_round_trip_across_blocks_and_escapes() {
        let t0 = 1_700_000_000_000_000i64;
        let times: Vec<Option<i64>> = (0..10_000i64)
            .map(|i| match i % 7 {
                0 => None,
                1 => Some(-5),
                2 => Some(i64::MAX),
                3 => Some(t0 + i * 1000),
                4 => Some(t0 + (1 << 40)),
                5 => Some(t0 - i),
                _ => Some(t0 + i),
            })
            .collect();
        let mut t = DeviceTrace::default();
        for &time_us in &times {
            t.push(NewEvent {
                action: Some(Action::Alloc),
                time_us,
                ..Default::default()
            });
        }
        for (i, &time_us) in times.iter().enumerate() {
            assert_eq!(t.time_us(i), time_us, "event {i}");
            assert_eq!(t.get(i).time_us, time_us, "event {i}");
        }
    }

    #[test]
    fn many_streams_escape_to_side_table() {
        let mut t = DeviceTrace::default();
        for s in 0..5000u64 {
            t.push(NewEvent {
                action: Some(Action::Alloc),
                stream: s * 16,
                ..Default::default()
            });
        }
        for s in 0..5000usize {
            assert_eq!(t.get(s).stream, s as u64 * 16);
        }
    }
}
