//! Interned strings, frames and stacks.
//!
//! Snapshots repeat the same frames and whole stacks many times (PyTorch shares one list
//! object per distinct traceback). Every distinct string, frame and stack is stored once
//! and referred to by a small id; ids follow first appearance in the file, so they are
//! deterministic.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A small, fast, deterministic hasher (FxHash) for the interning maps.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().unwrap()));
        }
        for &b in chunks.remainder() {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // The multiply leaves the entropy of aligned keys (addresses are multiples of 512)
        // in the high bits; bring it down to the bits hash tables index with.
        self.0.rotate_left(26)
    }
}

pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrId(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u32);

/// A stack of frames, innermost first (as PyTorch stores them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u32);

/// One stack frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: StrId,
    pub name: StrId,
    pub line: i64,
}

/// Longest string of a frame or a trace entry kept whole (file and function names, code
/// contexts). Real names are far shorter, but for some C++ template names; the first 960
/// bytes of those are more than a reader takes in, and every output repeats a name once
/// per stack that holds it (a report draws each stack up to six times).
pub const MAX_STR_BYTES: usize = 1024;

/// How much of a string longer than [`MAX_STR_BYTES`] is kept.
const KEPT_BYTES: usize = 960;

/// A string longer than [`MAX_STR_BYTES`] as it is kept: its first 960 bytes (at a
/// character boundary), then `…[cut: N bytes, FNV-1a HASH]`, so that two long names that
/// differ past the cut stay apart and a reader sees that it was cut.
pub fn cut_long(s: &str) -> String {
    let mut end = KEPT_BYTES.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let hash = s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{}…[cut: {} bytes, {hash:016x}]", &s[..end], s.len())
}

/// All distinct strings, frames and stacks of one snapshot.
#[derive(Default)]
pub struct FrameTable {
    strings: Vec<Box<str>>,
    string_ids: FxMap<Box<str>, StrId>,
    frames: Vec<Frame>,
    frame_ids: FxMap<Frame, FrameId>,
    /// Start of each stack in `stack_frames`; stack i spans starts[i]..starts[i+1].
    stack_starts: Vec<u32>,
    stack_frames: Vec<FrameId>,
    stack_ids: FxMap<Box<[FrameId]>, StackId>,
}

impl FrameTable {
    pub fn new() -> Self {
        let mut t = FrameTable {
            stack_starts: vec![0],
            ..Default::default()
        };
        // Stack 0 is the empty stack, string 0 the empty string.
        t.intern_stack(&[]);
        t.intern_str("");
        t
    }

    /// The id of a string, added when new. A string longer than [`MAX_STR_BYTES`] is kept
    /// cut ([`cut_long`]): every output repeats a frame's name once per stack that holds
    /// it, so a long name shared by many stacks would make outputs grow with references
    /// times length rather than with the file.
    pub fn intern_str(&mut self, s: &str) -> StrId {
        let cut;
        let s = if s.len() > MAX_STR_BYTES {
            cut = cut_long(s);
            cut.as_str()
        } else {
            s
        };
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = StrId(self.strings.len() as u32);
        self.strings.push(s.into());
        self.string_ids.insert(s.into(), id);
        id
    }

    pub fn intern_frame(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = FrameId(self.frames.len() as u32);
        self.frames.push(frame);
        self.frame_ids.insert(frame, id);
        id
    }

    pub fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        if let Some(&id) = self.stack_ids.get(frames) {
            return id;
        }
        let id = StackId((self.stack_starts.len() - 1) as u32);
        self.stack_frames.extend_from_slice(frames);
        self.stack_starts.push(self.stack_frames.len() as u32);
        self.stack_ids.insert(frames.into(), id);
        id
    }

    pub fn str(&self, id: StrId) -> &str {
        &self.strings[id.0 as usize]
    }

    pub fn frame(&self, id: FrameId) -> Frame {
        self.frames[id.0 as usize]
    }

    /// Frames of a stack, innermost first.
    pub fn stack(&self, id: StackId) -> &[FrameId] {
        let i = id.0 as usize;
        &self.stack_frames[self.stack_starts[i] as usize..self.stack_starts[i + 1] as usize]
    }

    pub fn stack_count(&self) -> usize {
        self.stack_starts.len() - 1
    }

    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_strings_are_kept_cut_and_apart() {
        let mut t = FrameTable::new();
        let a = format!("{}a", "é".repeat(5000));
        let b = format!("{}b", "é".repeat(5000));
        let (ia, ib) = (t.intern_str(&a), t.intern_str(&b));
        assert_ne!(ia, ib);
        assert_eq!(t.intern_str(&a), ia);
        let kept = t.str(ia);
        assert!(kept.len() < MAX_STR_BYTES, "{}", kept.len());
        assert!(kept.starts_with(&"é".repeat(480)));
        assert!(!kept.starts_with(&"é".repeat(481)));
        assert!(kept.contains("…[cut: 10001 bytes, "), "{}", &kept[950..]);
        let short = "x".repeat(MAX_STR_BYTES);
        let id = t.intern_str(&short);
        assert_eq!(t.str(id), short);
    }

    #[test]
    fn interning_is_stable_and_deduplicates() {
        let mut t = FrameTable::new();
        let a = t.intern_str("train.py");
        let b = t.intern_str("forward");
        assert_eq!(t.intern_str("train.py"), a);
        let f1 = t.intern_frame(Frame {
            filename: a,
            name: b,
            line: 3,
        });
        let f2 = t.intern_frame(Frame {
            filename: a,
            name: b,
            line: 4,
        });
        assert_ne!(f1, f2);
        let s = t.intern_stack(&[f1, f2]);
        assert_eq!(t.intern_stack(&[f1, f2]), s);
        assert_ne!(t.intern_stack(&[f2, f1]), s);
        assert_eq!(t.stack(s), &[f1, f2]);
        assert_eq!(t.stack(StackId(0)), &[] as &[FrameId]);
        assert_eq!(t.str(a), "train.py");
        assert_eq!(t.stack_count(), 3);
    }
}
