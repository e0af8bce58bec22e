//! [`Snapshot`] back to a pickle, laid out as `torch.cuda.memory._dump_snapshot` writes it.
//!
//! Keys follow the layout of the release the file came from (spec sections 1.3, 2 and 3):
//! a 1.13 list root, 2.0 blocks with `history`, 2.1+ blocks with `address` and `frames`,
//! and the optional trace keys each trace had. Objects are shared as PyTorch's dumper
//! shares them (spec 5.1): one string per key name, action, state and segment type; one
//! dict per distinct frame and one list per distinct stack, written where first met and
//! referred back to afterwards; the empty string and one-character strings once (CPython
//! keeps those as single objects); everything else written where it stands. Keys the
//! model does not interpret come back from [`super::Extras`] after the known ones.
//!
//! What does not come back: FX keys of frames (`fx_node_*`, `fx_original_trace`), dict
//! keys that are not strings, and a block `address` that disagreed with its position
//! (blocks are written at segment address plus preceding sizes). Tuples inside allocator
//! settings are written as lists, and `stream` values are written as unsigned integers.

use super::frames::{FrameId, StackId, StrId};
use super::round_trip::{BlockHistory, Extra, Place};
use super::trace::DeviceTrace;
use super::{Action, Annotation, Block, BlockState, Segment, SegmentType, Snapshot};
use crate::pickle::{MemoId, PickleWriter};
use std::collections::HashMap;
use std::io::{self, Write};

/// Writes `snap` as a protocol 4 pickle to `out` and gives `out` back.
pub fn write_snapshot<W: Write>(snap: &Snapshot, out: W) -> io::Result<W> {
    let mut e = Encoder {
        w: PickleWriter::new(out)?,
        snap,
        shared: HashMap::new(),
        frame_memo: vec![None; snap.frames.frame_count()],
        stack_memo: vec![None; snap.frames.stack_count()],
        old_frame_keys: snap.features.root_is_list || snap.features.block_history,
    };
    if snap.features.root_is_list {
        e.segments(&snap.segments, false)?;
    } else {
        e.root()?;
    }
    e.w.finish()
}

/// One value of a dict being written.
enum V<'a> {
    Int(i128),
    Bool(bool),
    /// A string PyTorch shares (key names, actions, states, segment types).
    Shared(&'a str),
    Text(&'a str),
    Str(StrId),
    Pool((i64, i64)),
    Stack(StackId),
    Strs(&'a [StrId]),
    Segments(&'a [Segment], bool),
    Blocks(&'a Segment, bool, u32),
    History(&'a BlockHistory),
    Trace(&'a DeviceTrace),
    Traces(&'a [DeviceTrace]),
    Annotations(&'a [Annotation]),
    Settings,
}

struct Encoder<'a, W: Write> {
    w: PickleWriter<W>,
    snap: &'a Snapshot,
    shared: HashMap<String, MemoId>,
    frame_memo: Vec<Option<MemoId>>,
    stack_memo: Vec<Option<MemoId>>,
    /// 1.13/2.0 frames list `filename, name, line`; 2.1+ `name, filename, line`.
    old_frame_keys: bool,
}

/// PyTorch's allocator_settings keys in the order it inserts them.
const SETTINGS_ORDER: [&str; 11] = [
    "PYTORCH_CUDA_ALLOC_CONF",
    "max_split_size",
    "garbage_collection_threshold",
    "expandable_segments",
    "pinned_num_register_threads",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "graph_capture_record_stream_reuse",
    "max_round_threshold",
    "max_cached_size",
    "roundup_power2_divisions",
];

impl<'a, W: Write> Encoder<'a, W> {
    fn shared_str(&mut self, s: &str) -> io::Result<()> {
        if let Some(&id) = self.shared.get(s) {
            return self.w.get(id);
        }
        let id = self.w.str(s)?;
        self.shared.insert(s.to_string(), id);
        Ok(())
    }

    /// A string written where it stands, except those CPython keeps as single objects.
    fn text(&mut self, s: &str) -> io::Result<()> {
        let mut chars = s.chars();
        let single = match (chars.next(), chars.next()) {
            (None, _) => true,
            (Some(c), None) => (c as u32) < 0x100,
            _ => false,
        };
        if single {
            self.shared_str(s)
        } else {
            self.w.str(s).map(|_| ())
        }
    }

    fn frame(&mut self, id: FrameId) -> io::Result<()> {
        if let Some(m) = self.frame_memo[id.0 as usize] {
            return self.w.get(m);
        }
        let f = self.snap.frames.frame(id);
        let fields = if self.old_frame_keys {
            [
                ("filename", V::Str(f.filename)),
                ("name", V::Str(f.name)),
                ("line", V::Int(f.line as i128)),
            ]
        } else {
            [
                ("name", V::Str(f.name)),
                ("filename", V::Str(f.filename)),
                ("line", V::Int(f.line as i128)),
            ]
        };
        let m = self.dict(&fields, &[])?;
        self.frame_memo[id.0 as usize] = Some(m);
        Ok(())
    }

    /// A frames list: one list per distinct stack, except the empty one, which PyTorch
    /// creates anew wherever a dict has no context.
    fn stack(&mut self, id: StackId) -> io::Result<()> {
        let frames = self.snap.frames.stack(id);
        if frames.is_empty() {
            self.w.begin_list(0)?;
            return self.w.end_list();
        }
        if let Some(m) = self.stack_memo[id.0 as usize] {
            return self.w.get(m);
        }
        let m = self.w.begin_list(frames.len())?;
        for &f in frames {
            self.frame(f)?;
        }
        self.w.end_list()?;
        self.stack_memo[id.0 as usize] = Some(m);
        Ok(())
    }

    fn dict(&mut self, fields: &[(&str, V)], extra: &[(String, Extra)]) -> io::Result<MemoId> {
        let id = self.w.begin_dict(fields.len() + extra.len())?;
        for (k, v) in fields {
            self.shared_str(k)?;
            self.value(v)?;
        }
        for (k, v) in extra {
            self.shared_str(k)?;
            self.extra(v)?;
        }
        self.w.end_dict()?;
        Ok(id)
    }

    fn value(&mut self, v: &V) -> io::Result<()> {
        match *v {
            V::Int(i) => self.w.int(i),
            V::Bool(b) => self.w.bool(b),
            V::Shared(s) => self.shared_str(s),
            V::Text(s) => self.text(s),
            V::Str(id) => {
                let s = self.snap.frames.str(id);
                self.text(s)
            }
            V::Pool((a, b)) => {
                self.w.begin_tuple(2)?;
                self.w.int_i64(a)?;
                self.w.int_i64(b)?;
                self.w.end_tuple().map(|_| ())
            }
            V::Stack(id) => self.stack(id),
            V::Strs(ids) => {
                self.w.begin_list(ids.len())?;
                for &id in ids {
                    self.value(&V::Str(id))?;
                }
                self.w.end_list()
            }
            V::Segments(segments, host) => self.segments(segments, host),
            V::Blocks(segment, host, index) => self.blocks(segment, host, index),
            V::History(h) => self.history(h),
            V::Trace(t) => self.trace(t),
            V::Traces(traces) => {
                self.w.begin_list(traces.len())?;
                for t in traces {
                    self.trace(t)?;
                }
                self.w.end_list()
            }
            V::Annotations(list) => self.annotations(list),
            V::Settings => self.settings(),
        }
    }

    fn extra(&mut self, x: &Extra) -> io::Result<()> {
        match x {
            Extra::None | Extra::Dropped => self.w.none(),
            Extra::Bool(b) => self.w.bool(*b),
            Extra::Int(i) => self.w.int(*i),
            Extra::BigInt(bytes) => self.w.int_le_bytes(bytes),
            Extra::Float(f) => self.w.float(*f),
            Extra::Str(s) => self.text(s),
            Extra::Bytes(b) => self.w.bytes(b).map(|_| ()),
            Extra::List(items) => {
                self.w.begin_list(items.len())?;
                for item in items {
                    self.extra(item)?;
                }
                self.w.end_list()
            }
            Extra::Tuple(items) => {
                self.w.begin_tuple(items.len())?;
                for item in items {
                    self.extra(item)?;
                }
                self.w.end_tuple().map(|_| ())
            }
            Extra::Dict(pairs) => {
                self.w.begin_dict(pairs.len())?;
                for (k, v) in pairs {
                    self.extra(k)?;
                    self.extra(v)?;
                }
                self.w.end_dict()
            }
            Extra::Stack(id) => self.stack(*id),
        }
    }

    fn root(&mut self) -> io::Result<()> {
        let snap = self.snap;
        let f = &snap.features;
        let mut fields = vec![("segments", V::Segments(&snap.segments, false))];
        if f.device_traces {
            fields.push(("device_traces", V::Traces(&snap.device_traces)));
        }
        if snap.allocator_settings.is_some() {
            fields.push(("allocator_settings", V::Settings));
        }
        if f.external_annotations {
            fields.push((
                "external_annotations",
                V::Annotations(&snap.external_annotations),
            ));
        }
        if f.host_segments {
            fields.push(("host_segments", V::Segments(&snap.host_segments, true)));
            fields.push(("host_traces", V::Trace(&snap.host_trace)));
        }
        self.dict(&fields, snap.extras.keys_at(Place::Root))?;
        Ok(())
    }

    fn segments(&mut self, segments: &[Segment], host: bool) -> io::Result<()> {
        self.w.begin_list(segments.len())?;
        for (i, s) in segments.iter().enumerate() {
            self.segment(s, host, i as u32)?;
        }
        self.w.end_list()
    }

    fn segment(&mut self, s: &Segment, host: bool, index: u32) -> io::Result<()> {
        let snap = self.snap;
        let extras = &snap.extras;
        let place = Place::Segment {
            host,
            segment: index,
        };
        let mut fields = vec![
            ("device", V::Int(s.device as i128)),
            ("address", V::Int(s.address as i128)),
            ("total_size", V::Int(s.total_size as i128)),
            ("allocated_size", V::Int(s.allocated_size as i128)),
            ("active_size", V::Int(s.active_size as i128)),
        ];
        if let Some(r) = s.requested_size {
            fields.push(("requested_size", V::Int(r as i128)));
        }
        fields.push(("stream", V::Int(s.stream as i128)));
        match s.segment_type {
            SegmentType::Large => fields.push(("segment_type", V::Shared("large"))),
            SegmentType::Small => fields.push(("segment_type", V::Shared("small"))),
            // An unknown type name is among the extra keys.
            SegmentType::Other => {}
        }
        if let Some(p) = s.pool_id {
            fields.push(("segment_pool_id", V::Pool(p)));
        }
        if s.pool_id.is_some() || s.is_expandable {
            fields.push(("is_expandable", V::Bool(s.is_expandable)));
        }
        // PyTorch sets `frames` at once when there is no context, and after the blocks
        // when the stack had to be symbolised.
        let empty_stack = s.stack.filter(|&st| snap.frames.stack(st).is_empty());
        if let Some(st) = empty_stack {
            fields.push(("frames", V::Stack(st)));
        }
        fields.push(("blocks", V::Blocks(s, host, index)));
        if let Some(st) = s.stack.filter(|_| empty_stack.is_none()) {
            fields.push(("frames", V::Stack(st)));
        }
        if let Some(ff) = extras.forward_frames.get(&place) {
            fields.push(("forward_frames", V::Strs(ff)));
        }
        self.dict(&fields, extras.keys_at(place))?;
        Ok(())
    }

    fn blocks(&mut self, s: &Segment, host: bool, segment: u32) -> io::Result<()> {
        self.w.begin_list(s.blocks.len())?;
        for (i, b) in s.blocks.iter().enumerate() {
            self.block(
                b,
                Place::Block {
                    host,
                    segment,
                    block: i as u32,
                },
            )?;
        }
        self.w.end_list()
    }

    fn block(&mut self, b: &Block, place: Place) -> io::Result<()> {
        let snap = self.snap;
        let f = &snap.features;
        let history = snap.extras.history.get(&place);
        let mut fields = Vec::with_capacity(7);
        if f.block_frames {
            fields.push(("address", V::Int(b.address as i128)));
        }
        fields.push(("size", V::Int(b.size as i128)));
        match history {
            Some(h) => {
                if let Some(r) = h.requested_size {
                    fields.push(("requested_size", V::Int(r as i128)));
                }
            }
            None if f.segment_requested_size || f.block_frames => {
                fields.push(("requested_size", V::Int(b.requested_size as i128)));
            }
            None => {}
        }
        let state = match b.state {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
            BlockState::Other(id) => snap.frames.str(id),
        };
        fields.push(("state", V::Shared(state)));
        match history {
            Some(h) => fields.push(("history", V::History(h))),
            None => {
                if let Some(st) = b.stack {
                    fields.push(("frames", V::Stack(st)));
                }
            }
        }
        if let Some(ff) = snap.extras.forward_frames.get(&place) {
            fields.push(("forward_frames", V::Strs(ff)));
        }
        self.dict(&fields, snap.extras.keys_at(place))?;
        Ok(())
    }

    fn history(&mut self, h: &BlockHistory) -> io::Result<()> {
        self.w.begin_list(h.records.len())?;
        for r in &h.records {
            let mut fields = vec![("addr", V::Int(r.addr as i128))];
            if let Some(real) = r.real_size {
                fields.push(("real_size", V::Int(real as i128)));
            }
            if let Some(st) = r.stack {
                fields.push(("frames", V::Stack(st)));
            }
            if let Some(c) = r.cpp_frames {
                fields.push(("cpp_frames", V::Str(c)));
            }
            self.dict(&fields, &r.extra)?;
        }
        self.w.end_list()
    }

    fn trace(&mut self, t: &DeviceTrace) -> io::Result<()> {
        let snap = self.snap;
        let names = &snap.frames;
        self.w.begin_list(t.len())?;
        for i in 0..t.len() {
            let e = t.get(i);
            let action = match (e.action, t.other_action(i)) {
                (Action::Other, Some(name)) => names.str(name),
                (a, _) => a.name(),
            };
            let mut fields = Vec::with_capacity(12);
            fields.push(("action", V::Shared(action)));
            let addr_key = if e.action == Action::Oom {
                "device_free"
            } else {
                "addr"
            };
            fields.push((addr_key, V::Int(e.addr as i128)));
            fields.push(("size", V::Int(e.size as i128)));
            fields.push(("stream", V::Int(e.stream as i128)));
            if let Some(time) = e.time_us {
                fields.push(("time_us", V::Int(time as i128)));
            }
            if t.keys.compile_context {
                fields.push((
                    "compile_context",
                    t.compile_context(i).map_or(V::Text("N/A"), V::Str),
                ));
            }
            if t.keys.user_metadata {
                fields.push((
                    "user_metadata",
                    t.user_metadata(i).map_or(V::Text(""), V::Str),
                ));
            }
            if let Some(m) = t.internal_metadata(i) {
                fields.push(("internal_metadata", V::Str(m)));
            }
            if t.keys.pool_id {
                fields.push(("pool_id", V::Pool(t.pool_id(i))));
            }
            if let Some(st) = e.stack {
                fields.push(("frames", V::Stack(st)));
            }
            if let Some(ff) = t.forward_frames(i) {
                fields.push(("forward_frames", V::Strs(ff)));
            }
            if let Some(c) = t.cpp_frames(i) {
                fields.push(("cpp_frames", V::Str(c)));
            }
            self.dict(&fields, t.extra_keys(i))?;
        }
        self.w.end_list()
    }

    fn annotations(&mut self, list: &[Annotation]) -> io::Result<()> {
        let snap = self.snap;
        let extras = &snap.extras;
        self.w.begin_list(list.len())?;
        for (i, a) in list.iter().enumerate() {
            let fields = [
                ("stage", V::Text(&a.stage)),
                ("name", V::Text(&a.name)),
                ("device", V::Int(a.device as i128)),
                ("time_us", V::Int(a.time_us as i128)),
            ];
            self.dict(&fields, extras.keys_at(Place::Annotation(i as u32)))?;
        }
        self.w.end_list()
    }

    fn settings(&mut self) -> io::Result<()> {
        let snap = self.snap;
        let Some(map) = &snap.allocator_settings else {
            return self.w.none();
        };
        let mut keys: Vec<&String> = map.keys().collect();
        let rank = |k: &str| {
            SETTINGS_ORDER
                .iter()
                .position(|o| *o == k)
                .unwrap_or(SETTINGS_ORDER.len())
        };
        keys.sort_by_key(|k| (rank(k), (*k).clone()));
        self.w.begin_dict(keys.len())?;
        for k in keys {
            self.shared_str(k)?;
            self.json(&map[k])?;
        }
        self.w.end_dict()
    }

    fn json(&mut self, v: &serde_json::Value) -> io::Result<()> {
        use serde_json::Value as J;
        match v {
            J::Null => self.w.none(),
            J::Bool(b) => self.w.bool(*b),
            J::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => self.w.int_i64(i),
                (None, Some(u)) => self.w.int_u64(u),
                _ => self.w.float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => self.text(s),
            J::Array(items) => {
                self.w.begin_list(items.len())?;
                for item in items {
                    self.json(item)?;
                }
                self.w.end_list()
            }
            J::Object(map) => {
                // roundup_power2_divisions: keys "1", "2", "4", ... in numeric order.
                let mut keys: Vec<&String> = map.keys().collect();
                if keys.iter().all(|k| k.parse::<u64>().is_ok()) {
                    keys.sort_by_key(|k| k.parse::<u64>().unwrap_or(0));
                }
                self.w.begin_dict(keys.len())?;
                for k in keys {
                    self.text(k)?;
                    self.json(&map[k])?;
                }
                self.w.end_dict()
            }
        }
    }
}
