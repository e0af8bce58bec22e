//! Renderers: report structs to text for people, JSON for scripts, SVG charts and the
//! one-page HTML report ([`html`]), written to any `io::Write`. No analysis happens here.

pub mod budget;
pub mod charts;
pub mod device;
pub mod device_log;
pub mod diff;
pub mod html;
pub mod moments;
pub mod oom;
pub mod ranks;
pub mod redact;
pub mod simulate;
pub mod summary;
pub mod top;
pub mod words;

use std::io::{self, Write};

/// Text styling: bold headings only on a terminal, never with NO_COLOR. The styles are
/// markers that [`words::terminal::TerminalText`] turns into escape codes (file content cannot
/// forge them); text styled with colour must be written through it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Style {
    pub color: bool,
}

impl Style {
    /// Colour when `is_terminal` and NO_COLOR is unset or empty.
    pub fn detect(is_terminal: bool) -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            color: is_terminal && !no_color,
        }
    }

    pub fn heading(&self, s: &str) -> String {
        if self.color {
            styled(words::terminal::Mark::Heading, s)
        } else {
            s.to_string()
        }
    }

    pub fn warn(&self, s: &str) -> String {
        if self.color {
            styled(words::terminal::Mark::Warning, s)
        } else {
            s.to_string()
        }
    }
}

fn styled(mark: words::terminal::Mark, s: &str) -> String {
    format!(
        "{}{s}{}",
        words::terminal::marker(mark),
        words::terminal::marker(words::terminal::Mark::Reset)
    )
}

/// Compact JSON in which DEL, the C1 controls, the style marker, bidirectional formatting
/// characters and noncharacters are `\u` escapes too (serde_json escapes only C0), so no
/// string from a file reaches a terminal raw; a JSON reader gets the same strings.
struct SafeJson;

impl serde_json::ser::Formatter for SafeJson {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        // Most strings are ASCII below DEL, with nothing to escape: one write, no scan by
        // character (a summary of 100,000 devices is 100 MB of such fragments).
        if fragment.is_ascii() && !fragment.as_bytes().contains(&0x7f) {
            return writer.write_all(fragment.as_bytes());
        }
        let mut run = 0;
        for (i, c) in fragment.char_indices() {
            if ('\u{7f}'..='\u{9f}').contains(&c)
                || c == words::terminal::MARK
                || crate::units::is_bidi_control(c)
                || crate::units::is_noncharacter(c)
            {
                writer.write_all(&fragment.as_bytes()[run..i])?;
                // Past the BMP (noncharacters such as U+1FFFE) as a surrogate pair.
                for unit in c.encode_utf16(&mut [0; 2]) {
                    write!(writer, "\\u{:04x}", unit)?;
                }
                run = i + c.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[run..])
    }
}

/// Writes any report as one line of JSON.
pub fn write_json<T: serde::Serialize>(out: &mut dyn Write, report: &T) -> io::Result<()> {
    let mut ser = serde_json::Serializer::with_formatter(&mut *out, SafeJson);
    // An I/O error (a closed pipe) keeps its kind.
    report.serialize(&mut ser).map_err(io::Error::from)?;
    writeln!(out)
}
