//! Text rendering of a [`TopReport`].

use crate::analysis::device::DeviceChoice;
use crate::analysis::kinds::attribution::GroupKind;
use crate::analysis::moments::leaks::LeakReport;
use crate::analysis::reports::top::TopReport;
use crate::render::Style;
use crate::render::words::labels::{
    MomentTotals, group_display, group_name_display, write_moment_heading,
};
use crate::units::bytes;
use std::io::{self, Write};

fn by_name(report: &TopReport) -> &'static str {
    match report.by {
        crate::analysis::kinds::attribution::GroupBy::Callsite => "call site",
        crate::analysis::kinds::attribution::GroupBy::Category => "category",
        crate::analysis::kinds::attribution::GroupBy::Stack => "stack",
        crate::analysis::kinds::attribution::GroupBy::File => "file",
    }
}

/// What decided a category group's bytes: its two largest parts by evidence, with
/// their bytes when there are several.
fn decided_by(g: &crate::analysis::reports::top::Group) -> String {
    let Some(part) = g.categories.first() else {
        return String::new();
    };
    let word = |e: &crate::analysis::kinds::categories::EvidencePart| {
        format!(
            "{}{}",
            if e.inferred { "~" } else { "" },
            crate::render::words::evidence::words(&e.evidence)
        )
    };
    match &part.by_evidence[..] {
        [] => String::new(),
        [one] => word(one),
        [a, b, rest @ ..] => {
            let more = if rest.is_empty() {
                String::new()
            } else {
                format!("; {} more", rest.len())
            };
            format!(
                "{} ({}); {} ({}){more}",
                word(a),
                bytes(a.bytes),
                word(b),
                bytes(b.bytes)
            )
        }
    }
}

/// A group's category as the table shows it: `~` when inferred, and the main category's
/// share when the group holds others too.
fn category_cell(g: &crate::analysis::reports::top::Group) -> String {
    if g.category.is_empty() {
        return String::new();
    }
    let mark = if g.category_inferred { "~" } else { "" };
    if g.category_share < 0.995 {
        format!("{mark}{} {:.0}%", g.category, g.category_share * 100.0)
    } else {
        format!("{mark}{}", g.category)
    }
}

pub fn write_top_text(
    out: &mut dyn Write,
    r: &TopReport,
    choice: &DeviceChoice,
    style: Style,
) -> io::Result<()> {
    write_moment_heading(
        out,
        &MomentTotals {
            path: &r.path,
            moment: &r.moment,
            requested_bytes: r.total_bytes,
            count: r.count,
            allocated_bytes: r.allocated_bytes,
            reserved_bytes: r.reserved_bytes,
        },
        choice,
        style,
    )?;
    if r.freed_after_trace_count > 0 {
        writeln!(
            out,
            "  {}",
            crate::render::words::labels::freed_after_trace_text(
                r.freed_after_trace_count as u64,
                r.freed_after_trace_bytes
            )
        )?;
    }
    if r.groups.is_empty() {
        return writeln!(out, "  nothing was live");
    }
    let by_category = r.by == crate::analysis::kinds::attribution::GroupBy::Category;
    let width = r
        .groups
        .iter()
        .map(|g| group_name_display(&g.name, g.kind).chars().count())
        .max()
        .unwrap_or(0)
        .max(8);
    if by_category {
        writeln!(
            out,
            "  {:>10}  {:>6}  {:>6}  {:>10}  {:<width$}  decided by",
            "bytes", "share", "count", "largest", "category"
        )?;
    } else {
        writeln!(
            out,
            "  {:>10}  {:>6}  {:>6}  {:>10}  {:<21} {}",
            "bytes",
            "share",
            "count",
            "largest",
            "category",
            by_name(r)
        )?;
    }
    for g in &r.groups {
        let head = format!(
            "  {:>10}  {:>5.1}%  {:>6}  {:>10}  ",
            bytes(g.bytes),
            g.share * 100.0,
            g.count,
            bytes(g.largest_bytes),
        );
        if by_category {
            let name = group_name_display(&g.name, g.kind);
            let decided = decided_by(g);
            writeln!(out, "{head}{name:<width$}  {decided}")?;
        } else {
            writeln!(
                out,
                "{head}{:<21} {}",
                category_cell(g),
                group_name_display(&g.name, g.kind)
            )?;
        }
    }
    if r.groups.iter().any(|g| g.category_inferred) {
        writeln!(
            out,
            "  ~ inferred: decided by sizes, or by a lifetime the trace shows only in part (--json gives category_evidence)"
        )?;
    }
    if let Some(l) = &r.leaks {
        write_leaks(out, l, style)?;
    }
    if !r.moment.has_timeline {
        writeln!(
            out,
            "  (only the final state is known, as no trace was recorded: {})",
            crate::analysis::HOW_TO_RECORD
        )?;
    } else if r
        .groups
        .iter()
        .any(|g| g.kind == GroupKind::BeforeRecording)
    {
        writeln!(
            out,
            "  (memory allocated before recording began has no allocation stack in the file: start torch.cuda.memory._record_memory_history(max_entries=100000) earlier to see it)"
        )?;
    }
    Ok(())
}

/// The leak suspects of a [`LeakReport`].
pub fn write_leaks(out: &mut dyn Write, l: &LeakReport, style: Style) -> io::Result<()> {
    writeln!(out, "{}", style.heading("leak suspects"))?;
    let evidence = format!(
        "{} step annotations and {} falls of the total by a tenth before this moment",
        l.steps.step_annotations, l.steps.total_drops
    );
    if !l.steps.repeated() {
        return writeln!(
            out,
            "  none can be named: the trace shows no repeated steps before this moment ({evidence}), so steady growth cannot be told from one step's activations"
        );
    }
    if l.suspects.is_empty() {
        return writeln!(
            out,
            "  none: no group grew steadily across the steps ({evidence})"
        );
    }
    for s in &l.suspects {
        writeln!(
            out,
            "  {:>10}  {}  grew by {} in {} of {} samples since event {}  [{}]",
            bytes(s.bytes),
            group_display(&s.name, s.kind),
            bytes(s.growth_bytes),
            s.rises,
            s.samples,
            s.since_event.map_or("start".into(), |e| e.to_string()),
            s.category
        )?;
    }
    Ok(())
}
