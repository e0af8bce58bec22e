//! Lines folded at the terminal's width, so a long answer reads as a paragraph and not as
//! one line the terminal cuts wherever it ends.
//!
//! [`Wrapped`] sits at the end of the text output, after [`super::terminal::TerminalText`]
//! (so the only escape sequences it meets are the program's own styles, which take no
//! width). A line wider than the width is broken at spaces, a figure kept with its unit;
//! its continuation lines start under the line's last column (after its last run of two or
//! more spaces: the value of a `label   value` row), else two columns in from its own
//! indentation; a table row whose last column leaves too little room stays whole. A word
//! wider than the room (a path, a frame) is left whole. Lines that fit pass through unchanged,
//! and the output of machines (JSON, folded stacks) never goes through here: the binary
//! folds only text written to a terminal.

use std::io::{self, Write};

/// Below this, folding helps nobody: lines pass unchanged.
const MIN_WIDTH: usize = 40;

/// A writer that folds lines wider than `width` columns.
pub struct Wrapped<W: Write> {
    inner: W,
    width: usize,
    line: Vec<u8>,
}

impl<W: Write> Wrapped<W> {
    pub fn new(inner: W, width: usize) -> Self {
        Wrapped {
            inner,
            width,
            line: Vec::new(),
        }
    }

    fn emit_line(&mut self) -> io::Result<()> {
        let line = std::mem::take(&mut self.line);
        match std::str::from_utf8(&line) {
            Ok(text) if self.width >= MIN_WIDTH && columns(text) > self.width => {
                for (i, part) in fold(text, self.width).iter().enumerate() {
                    if i > 0 {
                        self.inner.write_all(b"\n")?;
                    }
                    self.inner.write_all(part.as_bytes())?;
                }
                Ok(())
            }
            _ => self.inner.write_all(&line),
        }
    }
}

impl<W: Write> Write for Wrapped<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut rest = buf;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&rest[..nl]);
            self.emit_line()?;
            self.inner.write_all(b"\n")?;
            rest = &rest[nl + 1..];
        }
        self.line.extend_from_slice(rest);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.line.is_empty() {
            self.emit_line()?;
        }
        self.inner.flush()
    }
}

/// Columns `s` takes: its characters, less the escape sequences of styles (`ESC [ ... m`).
fn columns(s: &str) -> usize {
    let mut n = 0;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            skip_escape(&mut chars);
        } else {
            n += 1;
        }
    }
    n
}

/// Room a continuation line keeps at least, when it hangs under a column.
const MIN_ROOM: usize = 24;

/// Where a line's continuation lines start, or None to leave the line whole. A line with
/// columns (runs of two or more spaces) continues under its last column, when that leaves
/// [`MIN_ROOM`] columns; when it does not, the line is a wide table row, which folding
/// would scramble, and stays whole. A line without columns continues two columns in from
/// its own indentation.
fn hanging_indent(line: &str, width: usize) -> Option<usize> {
    let lead = line.len() - line.trim_start_matches(' ').len();
    // The column of the first character after the last run of two or more spaces.
    let mut last_column = None;
    let mut col = lead;
    let mut run = 0;
    let mut chars = line[lead..].chars();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                skip_escape(&mut chars);
                continue;
            }
            ' ' => run += 1,
            _ => {
                if run >= 2 {
                    last_column = Some(col);
                }
                run = 0;
            }
        }
        col += 1;
    }
    match last_column {
        Some(c) if width >= c + MIN_ROOM => Some(c),
        Some(_) => None,
        None => Some((lead + 2).min(width / 2)),
    }
}

/// Skips the rest of an escape sequence of a style (`[`, parameters, one final byte).
fn skip_escape(chars: &mut std::str::Chars) {
    for d in chars.by_ref() {
        if ('@'..='~').contains(&d) && d != '[' {
            break;
        }
    }
}

/// Units a figure is never parted from: `3.9 GiB` stays on one line.
const UNITS: [&str; 9] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "ms", "s", "µs"];

/// The words of `text`, each with the spaces before it (runs of spaces inside a row are
/// kept); a number and its unit are one word.
fn words(text: &str) -> Vec<(&str, &str)> {
    // (start of the gap, start of the word, end of the word), as byte offsets.
    let mut spans: Vec<(usize, usize, usize)> = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let rest = &text[start..];
        let spaces = rest.len() - rest.trim_start_matches(' ').len();
        let Some(len) = rest[spaces..]
            .find(' ')
            .or(Some(rest.len() - spaces))
            .filter(|&l| l > 0)
        else {
            break;
        };
        let (word_start, end) = (start + spaces, start + spaces + len);
        let unit = text[word_start..end].trim_end_matches([',', ';', ':', ')', '.']);
        match spans.last_mut() {
            Some(last)
                if spaces == 1
                    && UNITS.contains(&unit)
                    && text[..last.2].ends_with(|c: char| c.is_ascii_digit()) =>
            {
                last.2 = end;
            }
            _ => spans.push((start, word_start, end)),
        }
        start = end;
    }
    spans
        .into_iter()
        .map(|(g, w, e)| (&text[g..w], &text[w..e]))
        .collect()
}

/// `line` cut at spaces into parts of at most `width` columns (a word wider than the room
/// stays whole), the parts after the first indented by [`hanging_indent`]; a wide table
/// row stays whole.
fn fold(line: &str, width: usize) -> Vec<String> {
    let Some(indent) = hanging_indent(line, width) else {
        return vec![line.to_string()];
    };
    let pad = " ".repeat(indent);
    let lead = line.len() - line.trim_start_matches(' ').len();
    let mut parts = Vec::new();
    let mut current = line[..lead].to_string();
    let mut current_cols = lead;
    // True at the start of the line and of each continuation line: no gap before the word.
    let mut fresh = true;
    for (gap, word) in words(&line[lead..]) {
        let w = columns(word);
        if !fresh && current_cols + gap.len() + w > width {
            parts.push(std::mem::take(&mut current));
            current = pad.clone();
            current_cols = indent;
        } else if !fresh {
            current.push_str(gap);
            current_cols += gap.len();
        }
        current.push_str(word);
        current_cols += w;
        fresh = false;
    }
    parts.push(current);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(text: &str, width: usize) -> String {
        let mut w = Wrapped::new(Vec::new(), width);
        // Written in pieces, as renderers do.
        for piece in text.as_bytes().chunks(7) {
            w.write_all(piece).unwrap();
        }
        w.flush().unwrap();
        String::from_utf8(w.inner).unwrap()
    }

    #[test]
    fn short_lines_pass_unchanged() {
        let text = "a short line\n  and another\n\nlast without newline";
        assert_eq!(through(text, 40), text);
        // A first word as long as the hanging indent keeps its space.
        let text = "on one device, with some headroom assumed where nothing shows how it varies\n";
        assert_eq!(
            through(text, 40),
            "on one device, with some headroom\n  assumed where nothing shows how it\n  varies\n"
        );
    }

    #[test]
    fn prose_folds_at_spaces_two_columns_in() {
        let text = "note: the request did not fit because the memory was held in small holes of the cache\n";
        let out = through(text, 40);
        assert_eq!(
            out,
            "note: the request did not fit because\n  the memory was held in small holes of\n  the cache\n"
        );
        assert!(out.lines().all(|l| l.len() <= 40));
        // Only spaces changed: the words are the same, in order.
        let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(words(&out), words(text));
    }

    #[test]
    fn a_label_row_continues_under_its_value() {
        let text = "  headroom             3.1 GiB left on the device, less than its ten percent headroom\n";
        let out = through(text, 60);
        assert_eq!(
            out,
            "  headroom             3.1 GiB left on the device, less than\n                       its ten percent headroom\n"
        );
    }

    #[test]
    fn styles_take_no_width_and_long_words_stay_whole() {
        let bold = "\x1b[1m";
        let reset = "\x1b[0m";
        let text = format!("{bold}Heading{reset} {}\n", "word ".repeat(10).trim_end());
        let out = through(&text, 40);
        let first = out.lines().next().unwrap();
        assert_eq!(columns(first), 37, "{out:?}");
        let path = "/a/very/long/path/that/is/wider/than/the/terminal/itself.py:12";
        let out = through(&format!("see {path} here\n"), 40);
        assert_eq!(out, format!("see\n  {path}\n  here\n"));
    }

    #[test]
    fn a_figure_keeps_its_unit() {
        let text = "the live blocks (33.7 GiB) plus the request (3.9 GiB) fit in 38.3 GiB, 12 s\n";
        let out = through(text, 50);
        assert_eq!(
            out,
            "the live blocks (33.7 GiB) plus the request\n  (3.9 GiB) fit in 38.3 GiB, 12 s\n"
        );
    }

    #[test]
    fn a_table_row_continues_under_its_last_column_or_stays_whole() {
        let row =
            "    weights      3.7 GiB   9.5%  parameters 3.7 GiB: sizes of one copy of the model\n";
        assert_eq!(
            through(row, 60),
            "    weights      3.7 GiB   9.5%  parameters 3.7 GiB: sizes\n                                 of one copy of the model\n"
        );
        // Its last column starts too far right to leave room: the row stays whole.
        let wide = "  recorded  38.3 GiB  38.1 GiB  4.4 GiB  +164 -12  1  event 3,273  39.5 GiB\n";
        assert_eq!(through(wide, 60), wide);
    }

    #[test]
    fn narrow_widths_leave_lines_alone() {
        let text = "a line of some length that would fold at any normal width at all\n";
        assert_eq!(through(text, 20), text);
    }
}
