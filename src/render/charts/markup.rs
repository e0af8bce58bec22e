//! One escaper for the markup writers, the SVG charts and the HTML report: text from a
//! file as XML 1.0 character data or attribute values that a parser accepts whole.
//!
//! Markup characters become references. Characters XML forbids cannot pass: C0 controls
//! other than tab, newline and carriage return are shown as visible text (`\x1b`), and so
//! are DEL, C1 controls, bidirectional formatting characters and U+E000
//! ([`crate::units::escape_char`]); Unicode noncharacters (U+FFFE, U+FFFF, U+FDD0 to
//! U+FDEF, the last two of every plane) become U+FFFD, the replacement character. Lone
//! surrogates cannot occur in a Rust string.

use crate::units::{escape_char, is_noncharacter};

/// Which markup the text goes into.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    /// An SVG chart: tab, newline and carriage return kept (tooltips are multi-line).
    Xml,
    /// The HTML report: newline kept, tab and carriage return shown as `\t`, `\r`.
    Html,
}

fn escape(s: &str, dialect: Dialect) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' if dialect == Dialect::Xml => out.push_str("&apos;"),
            '\'' => out.push_str("&#39;"),
            '\n' => out.push('\n'),
            '\t' | '\r' if dialect == Dialect::Xml => out.push(c),
            '\r' => out.push_str("\\r"),
            c if is_noncharacter(c) => out.push('\u{fffd}'),
            c => match escape_char(c) {
                Some(e) => out.push_str(&e),
                None => out.push(c),
            },
        }
    }
    out
}

/// Text for XML content and attribute values (the SVG charts).
pub fn xml(s: &str) -> String {
    escape(s, Dialect::Xml)
}

/// Text for HTML content and attribute values (the report), before addresses are broken.
pub fn html(s: &str) -> String {
    escape(s, Dialect::Html)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_characters_never_pass() {
        let s = "a<b>&\"'\u{0}\u{1b}\u{7f}\u{9b}\u{202e}\u{fffe}\u{ffff}\u{fdd0}\u{1fffe}\u{10ffff}\t\n\r z";
        assert_eq!(
            xml(s),
            "a&lt;b&gt;&amp;&quot;&apos;\\x00\\x1b\\x7f\\u{9b}\\u{202e}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\t\n\r z"
        );
        assert_eq!(
            html(s),
            "a&lt;b&gt;&amp;&quot;&#39;\\x00\\x1b\\x7f\\u{9b}\\u{202e}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\\t\n\\r z"
        );
        // Characters XML allows pass as themselves.
        assert_eq!(
            xml("é ✓ \u{fffd} \u{fdcf} \u{fdf0} \u{1f600}"),
            "é ✓ \u{fffd} \u{fdcf} \u{fdf0} \u{1f600}"
        );
    }
}
