//! Text that reaches a terminal: nothing read from a file may drive it.
//!
//! Strings from a snapshot or a log (frame names, file names, allocator settings, action
//! and annotation names) may hold escape sequences: colours, a window title (OSC 0), a
//! hyperlink (OSC 8), a cleared screen. [`TerminalText`] wraps the output of every text
//! renderer and shows each control character as visible text: a tab as `\t`, the other C0
//! controls but newline as `\x1b`, DEL as `\x7f`, C1 controls (U+0080 to U+009F) and
//! bidirectional formatting characters (U+202E) as `\u{9b}`, bytes that are not UTF-8 as
//! `\xff`. A newline from a file cannot be told from the renderers' own here: the
//! renderers print every name through [`crate::units::shown`], which shows it as `\n`.
//!
//! The program's own styling ([`crate::render::Style`]) cannot be sent as escape sequences through
//! such a filter, and must not be confusable with file content. So `Style` writes a marker
//! (a private-use character, U+E000, then a key drawn at random when the process starts,
//! then one letter) that only `TerminalText` turns into the styles' escape codes, which
//! `anstyle` writes (`Mark`). File content cannot know the key; a U+E000 in it is shown
//! as `\u{e000}`. JSON is written with these characters as `\u` escapes
//! ([`crate::render::write_json`]), so it passes through unchanged.
//!
//! Why markers rather than writing styles as the text is written (`anstream`, `termcolor`):
//! the renderers build lines as strings holding file content and styles together, and one
//! filter at the output that escapes everything but the markers is what makes a forged
//! escape impossible, whatever a renderer forgets; writing codes directly would need
//! every renderer to escape every name itself.

use std::borrow::Cow;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, Write};
use std::sync::OnceLock;

/// Starts a style marker.
pub(crate) const MARK: char = '\u{E000}';
const MARK_LEN: usize = MARK.len_utf8();
const KEY_LEN: usize = 16;

/// What a marker stands for: a style to start, or the end of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mark {
    /// Headings: bold.
    Heading,
    /// Warnings: yellow.
    Warning,
    /// Back to plain text.
    Reset,
}

const HEADING: anstyle::Style = anstyle::Style::new().bold();
const WARNING: anstyle::Style = anstyle::AnsiColor::Yellow.on_default();

impl Mark {
    /// The letter that ends its marker.
    fn letter(self) -> char {
        match self {
            Mark::Heading => 'b',
            Mark::Warning => 'y',
            Mark::Reset => '0',
        }
    }

    fn of_letter(b: u8) -> Option<Mark> {
        [Mark::Heading, Mark::Warning, Mark::Reset]
            .into_iter()
            .find(|m| m.letter() as u32 == u32::from(b))
    }

    /// Its escape codes (SGR), as `anstyle` writes them.
    fn write_to(self, out: &mut dyn Write) -> io::Result<()> {
        match self {
            Mark::Heading => HEADING.write_to(out),
            Mark::Warning => WARNING.write_to(out),
            Mark::Reset => write!(out, "{}", anstyle::Reset.render()),
        }
    }
}

fn key() -> &'static str {
    static KEY: OnceLock<String> = OnceLock::new();
    KEY.get_or_init(|| {
        let k = RandomState::new().hash_one(0x7672_616d_6c65_6e73u64);
        format!("{k:0width$x}", width = KEY_LEN)
    })
}

/// The marker `TerminalText` turns into the escape codes of `mark`.
pub(crate) fn marker(mark: Mark) -> String {
    format!("{MARK}{}{}", key(), mark.letter())
}

/// A character shown as visible text instead of itself: all but the newline, which only
/// the renderers write (names from a file reach them through [`crate::units::shown`]).
fn escaped(c: char) -> Option<String> {
    if c == '\n' {
        None
    } else {
        crate::units::escape_char(c)
    }
}

/// `s` with every control character shown as visible text (for one line of an error
/// message: newlines are kept as they are, the caller joins lines).
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| escaped(c).is_some()) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match escaped(c) {
            Some(e) => out.push_str(&e),
            None => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Length of the UTF-8 sequence a lead byte starts; 0 for a byte that cannot start one.
fn utf8_len(b: u8) -> usize {
    match b {
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => 0,
    }
}

/// A writer that shows control characters as visible text and turns style markers into
/// SGR codes. A character or marker split across two writes is held until the next one.
pub struct TerminalText<W: Write> {
    inner: W,
    pending: Vec<u8>,
}

impl<W: Write> TerminalText<W> {
    pub fn new(inner: W) -> Self {
        TerminalText {
            inner,
            pending: Vec::new(),
        }
    }

    /// Writes what can be decided of `data`; returns how many bytes were used (the rest
    /// is an incomplete character or marker, unless `at_end`).
    fn filter(&mut self, data: &[u8], at_end: bool) -> io::Result<usize> {
        let key = key().as_bytes();
        let mut i = 0;
        let mut run = 0; // start of bytes passed through unchanged
        while i < data.len() {
            let b = data[i];
            if b < 0x80 {
                if (b < 0x20 && b != b'\n') || b == 0x7f {
                    self.inner.write_all(&data[run..i])?;
                    let e = crate::units::escape_char(b as char).unwrap_or_default();
                    self.inner.write_all(e.as_bytes())?;
                    run = i + 1;
                }
                i += 1;
                continue;
            }
            let len = utf8_len(b);
            let avail = data.len() - i;
            if len > avail {
                let prefix_ok = data[i + 1..].iter().all(|&c| c & 0xc0 == 0x80);
                if !at_end && len > 0 && prefix_ok {
                    break;
                }
            }
            let c = (len > 0 && len <= avail)
                .then(|| std::str::from_utf8(&data[i..i + len]).ok())
                .flatten()
                .and_then(|s| s.chars().next());
            let Some(c) = c else {
                self.inner.write_all(&data[run..i])?;
                write!(self.inner, "\\x{b:02x}")?;
                i += 1;
                run = i;
                continue;
            };
            if c == MARK {
                let rest = &data[i + MARK_LEN..];
                let whole = MARK_LEN + KEY_LEN + 1;
                if rest.len() < KEY_LEN + 1 && !at_end && key.starts_with(rest) {
                    break;
                }
                if rest.len() > KEY_LEN
                    && &rest[..KEY_LEN] == key
                    && let Some(mark) = Mark::of_letter(rest[KEY_LEN])
                {
                    self.inner.write_all(&data[run..i])?;
                    mark.write_to(&mut self.inner)?;
                    i += whole;
                    run = i;
                    continue;
                }
            }
            if let Some(e) = escaped(c) {
                self.inner.write_all(&data[run..i])?;
                self.inner.write_all(e.as_bytes())?;
                run = i + len;
            }
            i += len;
        }
        self.inner.write_all(&data[run..i])?;
        Ok(i)
    }

    fn drain_pending(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            let data = std::mem::take(&mut self.pending);
            self.filter(&data, true)?;
        }
        Ok(())
    }
}

impl<W: Write> Write for TerminalText<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.pending.is_empty() {
            let used = self.filter(buf, false)?;
            self.pending.extend_from_slice(&buf[used..]);
        } else {
            let mut data = std::mem::take(&mut self.pending);
            data.extend_from_slice(buf);
            let used = self.filter(&data, false)?;
            self.pending = data.split_off(used);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.drain_pending()?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::Style;

    fn through(parts: &[&[u8]]) -> String {
        let mut t = TerminalText::new(Vec::new());
        for p in parts {
            t.write_all(p).unwrap();
        }
        t.flush().unwrap();
        String::from_utf8(t.inner).unwrap()
    }

    #[test]
    fn control_characters_become_visible() {
        let s = "a\x1b]0;title\x07b\x1b[2J\r\x08\x7f\u{9b}31m\u{9d}x\u{9c} tab\tnl\n é ✓ \u{202e}rlo\u{2066}";
        assert_eq!(
            through(&[s.as_bytes()]),
            "a\\x1b]0;title\\x07b\\x1b[2J\\x0d\\x08\\x7f\\u{9b}31m\\u{9d}x\\u{9c} tab\\tnl\n é ✓ \\u{202e}rlo\\u{2066}"
        );
        assert_eq!(escape_controls(s), through(&[s.as_bytes()]));
        assert_eq!(through(&[b"ok\xff\xc3("]), "ok\\xff\\xc3(");
    }

    #[test]
    fn styles_are_translated_and_cannot_be_forged() {
        let style = Style { color: true };
        let text = format!(
            "{} {} \u{e000}0000000000000000b \u{e000}",
            style.heading("head"),
            style.warn("warn")
        );
        assert_eq!(
            through(&[text.as_bytes()]),
            "\x1b[1mhead\x1b[0m \x1b[33mwarn\x1b[0m \\u{e000}0000000000000000b \\u{e000}"
        );
        // The same bytes cut anywhere, even inside a character or a marker.
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(
                through(&[&bytes[..cut], &bytes[cut..]]),
                through(&[bytes]),
                "cut at {cut}"
            );
        }
        let plain = Style { color: false };
        assert_eq!(through(&[plain.heading("h").as_bytes()]), "h");
    }
}
