//! Renderers: report structs to text for people or JSON for scripts, written to any
//! `io::Write`. No analysis happens here.

pub mod live;
pub mod oom;
pub mod redact;
pub mod segments_svg;
pub mod summary;
pub mod svg;
pub mod timeline_svg;
pub mod timeline_text;

use std::io::{self, Write};

/// Text styling: bold headings only on a terminal, never with NO_COLOR.
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
            format!("\x1b[1m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    pub fn warn(&self, s: &str) -> String {
        if self.color {
            format!("\x1b[33m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

/// Writes any report as one line of JSON.
pub fn write_json<T: serde::Serialize>(out: &mut dyn Write, report: &T) -> io::Result<()> {
    serde_json::to_writer(&mut *out, report).map_err(io::Error::other)?;
    writeln!(out)
}
