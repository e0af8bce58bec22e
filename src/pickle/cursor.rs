//! A cursor over pickle bytes held in memory, for decoders that read a layout they know
//! straight from the bytes, without making values.
//!
//! Takes a slice and a position, and reads one opcode at a time as what it stands for: a
//! memo read (its index), a memo store (checked against the index the next store gets),
//! a small integer, a short string. FRAME headers between opcodes are passed over (frames
//! hold whole opcodes, so one never splits an argument). Every read gives None at the end
//! of the bytes or at an opcode of another kind, and the cursor may have moved by then:
//! a caller that stops at None goes back to a copy it kept, or hands the place to the
//! reader ([`super::parse_with`]), which decodes it in full and makes any error. It
//! checks nothing the reader would refuse, and knows nothing of what the values mean.

use super::opcodes::*;

/// A position in pickle bytes held in memory (see the module's notes). Copy it to come
/// back to a place.
#[derive(Clone, Copy, Debug)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    #[inline(always)]
    pub fn new(bytes: &'a [u8], pos: usize) -> Self {
        Cursor { bytes, pos }
    }

    /// Offset of the next opcode in the bytes.
    #[inline(always)]
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Whether the byte at the cursor, before any FRAME is passed, is the opcode `op`.
    #[inline(always)]
    pub fn is_at(&self, op: u8) -> bool {
        self.bytes.get(self.pos) == Some(&op)
    }

    #[cold]
    fn skip_frames(&mut self) -> Option<()> {
        while *self.bytes.get(self.pos)? == FRAME {
            self.pos += FRAME_HEADER;
        }
        Some(())
    }

    /// The next opcode (after any FRAMEs), not taken.
    #[inline(always)]
    pub fn peek(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        if b != FRAME {
            return Some(b);
        }
        self.skip_frames()?;
        self.bytes.get(self.pos).copied()
    }

    /// Takes the next opcode if it is `op`, one without an argument (MARK, EMPTY_DICT,
    /// SETITEMS, ...).
    #[inline(always)]
    pub fn expect(&mut self, op: u8) -> Option<()> {
        (self.peek()? == op).then(|| self.pos += 1)
    }

    /// Takes one FRAME header at the cursor, when all of it is there.
    #[inline]
    pub fn frame(&mut self) -> Option<()> {
        (self.is_at(FRAME) && self.bytes.len() - self.pos >= FRAME_HEADER)
            .then(|| self.pos += FRAME_HEADER)
    }

    /// The end of one batch of a list's items and the start of the next: APPENDS then
    /// MARK (picklers write lists in batches of 1000).
    #[inline]
    pub fn next_batch(&mut self) -> Option<()> {
        self.expect(APPENDS)?;
        self.expect(MARK)
    }

    #[inline(always)]
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..self.pos + n)?;
        self.pos += n;
        Some(s)
    }

    /// The index of a memo read: BINGET or LONG_BINGET.
    #[inline(always)]
    pub fn get(&mut self) -> Option<u64> {
        match self.peek()? {
            BINGET => {
                let i = *self.bytes.get(self.pos + 1)?;
                self.pos += 2;
                Some(i as u64)
            }
            LONG_BINGET => {
                let b = self.bytes.get(self.pos + 1..self.pos + 5)?;
                self.pos += 5;
                Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64)
            }
            _ => None,
        }
    }

    /// Whether the next opcode is a memo read ([`Cursor::get`] takes it).
    #[inline(always)]
    pub fn at_get(&mut self) -> Option<bool> {
        Some(is_binget(self.peek()?))
    }

    /// A memo store after an object: Some(None) when there is none, Some(Some(i)) for
    /// MEMOIZE (at `next`) or BINPUT/LONG_BINPUT of `next`; None for a PUT elsewhere.
    #[inline(always)]
    pub fn store(&mut self, next: u64) -> Option<Option<u64>> {
        let index = match self.peek()? {
            MEMOIZE => {
                self.pos += 1;
                next
            }
            BINPUT => {
                let i = *self.bytes.get(self.pos + 1)? as u64;
                self.pos += 2;
                i
            }
            LONG_BINPUT => {
                let b = self.bytes.get(self.pos + 1..self.pos + 5)?;
                self.pos += 5;
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64
            }
            _ => return Some(None),
        };
        (index == next).then_some(Some(index))
    }

    /// An integer: BININT1, BININT2, BININT or LONG1 (up to 16 bytes).
    #[inline(always)]
    pub fn int(&mut self) -> Option<i128> {
        match self.peek()? {
            BININT1 => Some(self.bytes(2)?[1] as i128),
            BININT2 => {
                let b = self.bytes(3)?;
                Some(u16::from_le_bytes([b[1], b[2]]) as i128)
            }
            BININT => {
                let b = self.bytes(5)?;
                Some(i32::from_le_bytes([b[1], b[2], b[3], b[4]]) as i128)
            }
            LONG1 => {
                let n = *self.bytes.get(self.pos + 1)? as usize;
                if n == 0 || n > 16 {
                    return None;
                }
                self.pos += 2;
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

    /// A string: SHORT_BINUNICODE or BINUNICODE, as valid UTF-8.
    #[inline]
    pub fn text(&mut self) -> Option<&'a str> {
        let n = match self.peek()? {
            SHORT_BINUNICODE => {
                let n = *self.bytes.get(self.pos + 1)? as usize;
                self.pos += 2;
                n
            }
            BINUNICODE => {
                let b = self.bytes.get(self.pos + 1..self.pos + 5)?;
                self.pos += 5;
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
            }
            _ => return None,
        };
        std::str::from_utf8(self.bytes(n)?).ok()
    }

    /// A batch of memo reads up to its APPENDS, after the MARK (FRAMEs may come
    /// between): `each` is given every index in order, and a None from it stops the
    /// batch. None at anything else, the cursor then where it was.
    #[inline(always)]
    pub fn gets_to_appends(&mut self, mut each: impl FnMut(u64) -> Option<()>) -> Option<()> {
        let b = self.bytes;
        let mut p = self.pos;
        loop {
            match *b.get(p)? {
                LONG_BINGET => {
                    let x = b.get(p + 1..p + 5)?;
                    p += 5;
                    each(u32::from_le_bytes([x[0], x[1], x[2], x[3]]) as u64)?;
                }
                BINGET => {
                    let i = *b.get(p + 1)?;
                    p += 2;
                    each(i as u64)?;
                }
                APPENDS => {
                    p += 1;
                    break;
                }
                FRAME => p += FRAME_HEADER,
                _ => return None,
            }
        }
        self.pos = p;
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pass_frames_and_stop_at_other_opcodes() {
        // FRAME, EMPTY_DICT MEMOIZE MARK, "size" BININT2 513, FRAME, LONG1 -2, SETITEMS.
        let mut b = vec![FRAME, 0, 0, 0, 0, 0, 0, 0, 0, EMPTY_DICT, MEMOIZE, MARK];
        b.extend_from_slice(&[SHORT_BINUNICODE, 4, b's', b'i', b'z', b'e']);
        b.extend_from_slice(&[BININT2, 0x01, 0x02]);
        b.extend_from_slice(&[FRAME, 0, 0, 0, 0, 0, 0, 0, 0, LONG1, 1, 0xfe, SETITEMS]);
        let mut c = Cursor::new(&b, 0);
        assert!(c.is_at(FRAME) && !c.is_at(EMPTY_DICT));
        assert_eq!(c.expect(EMPTY_DICT), Some(()));
        assert_eq!(c.store(7), Some(Some(7)));
        assert_eq!(c.store(8), Some(None), "no store here");
        assert_eq!(c.expect(MARK), Some(()));
        let before = c;
        assert_eq!(c.int(), None, "a string is not an integer");
        assert_eq!(before.pos(), c.pos());
        assert_eq!(c.text(), Some("size"));
        assert_eq!(c.int(), Some(0x0201));
        assert_eq!(c.int(), Some(-2));
        assert_eq!(c.expect(SETITEMS), Some(()));
        assert_eq!(c.peek(), None);
    }

    #[test]
    fn a_store_of_another_index_and_a_batch_of_gets() {
        let b = [BINPUT, 3];
        assert_eq!(Cursor::new(&b, 0).store(4), None);
        let b = [
            LONG_BINGET,
            1,
            1,
            0,
            0,
            FRAME,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            BINGET,
            9,
            APPENDS,
        ];
        let mut got = Vec::new();
        let mut c = Cursor::new(&b, 0);
        let each = |i| {
            got.push(i);
            Some(())
        };
        assert_eq!(c.gets_to_appends(each), Some(()));
        assert_eq!((got, c.pos()), (vec![257, 9], b.len()));
        let mut c = Cursor::new(&b[..4], 0);
        assert_eq!(c.gets_to_appends(|_| Some(())), None);
        assert_eq!(c.pos(), 0);
        assert_eq!(
            Cursor::new(&b[5..12], 0).frame(),
            None,
            "a FRAME header cut short"
        );
    }
}
