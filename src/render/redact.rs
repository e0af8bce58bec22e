//! Text and JSON for `vramlens redact`: what was removed, and with `--show` every
//! distinct string that changed.

use crate::redact::{Field, RedactReport, SCHEMA_VERSION, TextMode};
use crate::render::Style;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, Write};

/// The options a run used, as reported (the salt itself is never shown).
#[derive(Debug, Clone, Serialize)]
pub struct RedactSettings {
    pub strip_code: bool,
    pub salted: bool,
    pub annotations: TextMode,
    pub metadata: TextMode,
    pub keep: Vec<String>,
}

/// One run of `redact`: the report and where it went.
#[derive(Debug, Clone, Serialize)]
pub struct RedactRun<'a> {
    pub schema_version: u32,
    /// The input, as given.
    pub source: &'a str,
    /// The output file (null with `--show`).
    pub output: Option<&'a str>,
    pub written: bool,
    pub options: RedactSettings,
    /// Distinct strings changed per field.
    pub totals: BTreeMap<Field, u64>,
    #[serde(flatten)]
    pub report: &'a RedactReport,
}

impl<'a> RedactRun<'a> {
    pub fn new(
        source: &'a str,
        output: Option<&'a str>,
        written: bool,
        options: RedactSettings,
        report: &'a RedactReport,
    ) -> Self {
        RedactRun {
            schema_version: SCHEMA_VERSION,
            source,
            output,
            written,
            options,
            totals: report.totals(),
            report,
        }
    }
}

fn field_name(f: Field) -> &'static str {
    match f {
        Field::Filename => "file names",
        Field::Function => "function names",
        Field::Annotation => "annotation names",
        Field::UserMetadata => "user metadata",
        Field::CompileContext => "compile contexts",
        Field::InternalMetadata => "internal metadata",
        Field::CppFrames => "C++ stack texts",
        Field::ForwardFrames => "forward tracebacks",
        Field::Setting => "allocator settings",
        Field::OtherKey => "other keys",
    }
}

/// Shows control characters, so that one change stays on one line.
fn one_line(s: &str) -> String {
    crate::units::shown(s).into_owned()
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none found".into()
    } else {
        one_line(&names.join(", "))
    }
}

fn row(out: &mut dyn Write, label: &str, value: impl AsRef<str>) -> io::Result<()> {
    writeln!(out, "  {label:<22} {}", value.as_ref())
}

/// The text report; with `changes`, every distinct change grouped by field.
pub fn write_redact_text(
    out: &mut dyn Write,
    run: &RedactRun,
    changes: bool,
    style: Style,
) -> io::Result<()> {
    let r = run.report;
    let n = r.changes.len();
    let what = if n == 1 { "string" } else { "strings" };
    let head = match (run.written, run.output) {
        (true, Some(o)) => format!(
            "{}: {n} distinct {what} changed, written to {}",
            one_line(run.source),
            one_line(o)
        ),
        _ => format!(
            "{}: {n} distinct {what} would change (nothing written)",
            one_line(run.source)
        ),
    };
    writeln!(out, "{}", style.heading(&head))?;
    row(out, "user names removed", list(&r.names.users))?;
    row(out, "host names removed", list(&r.names.hosts))?;
    if !r.names.words.is_empty() {
        row(out, "words removed", r.names.words.join(", "))?;
    }
    if run.options.strip_code {
        row(
            out,
            "line numbers",
            format!("replaced in {} frames", r.lines_replaced),
        )?;
    }
    if r.kept_by_pattern > 0 {
        row(
            out,
            "kept by --keep",
            format!("{} distinct strings", r.kept_by_pattern),
        )?;
    }
    for (field, count) in &run.totals {
        row(out, field_name(*field), count.to_string())?;
    }
    if !changes {
        return Ok(());
    }
    let mut current = None;
    let width = r
        .changes
        .iter()
        .map(|c| c.count.to_string().len())
        .max()
        .unwrap_or(1);
    for c in &r.changes {
        if current != Some(c.field) {
            current = Some(c.field);
            writeln!(out)?;
            let title = format!("{} ({})", field_name(c.field), run.totals[&c.field]);
            writeln!(out, "{}", style.heading(&title))?;
        }
        let redacted = if c.redacted.is_empty() {
            "(empty)".to_string()
        } else {
            one_line(&c.redacted)
        };
        writeln!(
            out,
            "  {:>width$}  {} -> {}",
            c.count,
            one_line(&c.original),
            redacted
        )?;
    }
    Ok(())
}
