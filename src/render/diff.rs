//! Text rendering of a [`DiffReport`] and a [`CheckReport`].

use crate::analysis::reports::diff::{
    Change, CheckReport, DiffReport, GroupChange, LimitKind, Metric, merge_rest,
};
use crate::render::Style;
use crate::render::words::labels::{group_name_display, moment_text};
use crate::units::shown;
use crate::units::{bytes, bytes_signed};
use std::io::{self, Write};

fn change_rows(out: &mut dyn Write, groups: &[GroupChange], limit: usize) -> io::Result<()> {
    writeln!(
        out,
        "  {:>11}  {:>10}  {:>10}          group",
        "change", "base", "new"
    )?;
    for g in groups.iter().take(limit) {
        let what = match g.change {
            Change::New => "new",
            Change::Gone => "gone",
            Change::Grew => "grew",
            Change::Shrank => "shrank",
            Change::Same => "same",
        };
        writeln!(
            out,
            "  {:>11}  {:>10}  {:>10}  {what:<7} {}  [{}]",
            if g.delta_bytes > 0 {
                format!("+{}", bytes_signed(g.delta_bytes))
            } else {
                bytes_signed(g.delta_bytes)
            },
            bytes(g.base_bytes),
            bytes(g.new_bytes),
            group_name_display(&g.name, g.kind),
            g.category
        )?;
    }
    if let Some(rest) = merge_rest(groups, limit) {
        writeln!(
            out,
            "  {:>11}  {}",
            bytes_signed(rest.delta_bytes),
            group_name_display(&rest.name, rest.kind)
        )?;
    }
    Ok(())
}

pub fn write_diff_text(
    out: &mut dyn Write,
    r: &DiffReport,
    limit: usize,
    style: Style,
) -> io::Result<()> {
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "base {} (device {}, {}): {}",
            shown(&r.base.path),
            r.base.device,
            moment_text(&r.base.moment),
            bytes(r.base.total_bytes)
        ))
    )?;
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "new  {} (device {}, {}): {}",
            shown(&r.new.path),
            r.new.device,
            moment_text(&r.new.moment),
            bytes(r.new.total_bytes)
        ))
    )?;
    writeln!(
        out,
        "  change {} requested; reserved {} -> {}",
        bytes_signed(r.delta_bytes),
        bytes(r.base.reserved_bytes.max(0) as u64),
        bytes(r.new.reserved_bytes.max(0) as u64)
    )?;
    change_rows(out, &r.groups, limit)
}

pub fn write_check_text(out: &mut dyn Write, r: &CheckReport, style: Style) -> io::Result<()> {
    let metric = match r.metric {
        Metric::Allocated => "allocated",
        Metric::Requested => "requested",
        Metric::Reserved => "reserved",
    };
    let verdict = if r.passed { "PASS" } else { "FAIL" };
    writeln!(
        out,
        "{}",
        style.heading(&format!(
            "{verdict}: {} device {}: {}",
            shown(&r.path),
            r.device,
            match &r.moment {
                None => format!("peak {metric} {}", bytes(r.peak_bytes)),
                Some(m) if !m.has_timeline => format!(
                    "{metric} {}, {}",
                    bytes(r.peak_bytes),
                    crate::render::words::labels::moment_text(m)
                ),
                Some(m) => format!(
                    "{metric} {} {}",
                    bytes(r.peak_bytes),
                    crate::render::words::labels::moment_text(m)
                ),
            }
        ))
    )?;
    if r.final_state_only {
        writeln!(
            out,
            "  (no trace recorded: the final state is the only figure the file has, and it is what is checked)"
        )?;
    }
    for l in &r.limits {
        let what = match l.kind {
            LimitKind::MaxPeak => "the budget (--max-peak)".to_string(),
            LimitKind::Baseline => format!(
                "the baseline {} ({}) + {}%",
                shown(r.baseline_path.as_deref().unwrap_or("?")),
                bytes(r.baseline_peak_bytes.unwrap_or(0)),
                r.tolerance_percent.unwrap_or(0.0)
            ),
        };
        // The limit as understood, in bytes too: `36GB` is 36 * 10^9, `36GiB` 36 * 2^30.
        let exact = if l.kind == LimitKind::MaxPeak {
            format!(" ({} bytes)", l.limit_bytes)
        } else {
            String::new()
        };
        writeln!(
            out,
            "  {} {what}: {}{exact}",
            if l.passed { "within" } else { "over" },
            bytes(l.limit_bytes)
        )?;
    }
    if !r.grew.is_empty() {
        writeln!(out, "  grew since the baseline (at each one's peak):")?;
        change_rows(out, &r.grew, 10)?;
    }
    Ok(())
}
