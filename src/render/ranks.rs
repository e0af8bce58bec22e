//! Text rendering of a [`RanksReport`].

use crate::analysis::kinds::attribution::GroupKind;
use crate::analysis::reports::ranks::{OUTLIER_MARGIN, RanksReport};
use crate::render::Style;
use crate::render::words::labels::{clip, group_name_display, group_name_text, tiny_frame};
use crate::units::shown;
use crate::units::{bytes, bytes_signed};
use std::io::{self, Write};

pub fn write_ranks_text(out: &mut dyn Write, r: &RanksReport, style: Style) -> io::Result<()> {
    writeln!(
        out,
        "{}",
        style.heading(&format!("{} snapshots side by side", r.rows.len()))
    )?;
    writeln!(
        out,
        "  {:>10}  {:>13}  {:>10}  {:>4}  {:<44}  file",
        "peak", "peak reserved", "vs median", "OOMs", "largest group at the peak"
    )?;
    for row in &r.rows {
        let group = match (&row.top_group, row.top_group_kind, row.top_group_bytes) {
            (Some(g), Some(kind), Some(b)) => {
                let name = match kind {
                    GroupKind::Frame | GroupKind::Stack => tiny_frame(&group_name_text(g)),
                    _ => group_name_display(g, kind),
                };
                format!("{} {}", bytes(b), clip(&name, 34))
            }
            _ => "-".into(),
        };
        writeln!(
            out,
            "  {:>10}  {:>13}  {:>10}  {:>4}  {group:<44}  {}{}",
            row.peak_requested_bytes.map_or("no trace".into(), bytes),
            // Without a trace, the reserved bytes of the final state, said so.
            row.peak_reserved_bytes
                .map_or_else(|| format!("{} (end)", bytes(row.reserved_bytes)), bytes),
            row.peak_over_median
                .map_or("-".into(), |x| format!("{:.1}%", (x - 1.0) * 100.0)),
            row.ooms,
            shown(&row.path),
            if row.outlier {
                style.warn("  <- outlier")
            } else {
                String::new()
            }
        )?;
    }
    let outliers = r.rows.iter().filter(|x| x.outlier).count();
    match outliers {
        _ if r.series.is_some() => {
            let s = r.series.expect("a series");
            match s.vary {
                Some(vary) => writeln!(
                    out,
                    "  the files' names state sizes ({} {} to {}): one model at several sizes, not ranks of one job, so no file is an outlier (vramlens budget FILES... predicts another size)",
                    crate::render::budget::vary_label(vary),
                    s.smallest,
                    s.largest
                )?,
                None => writeln!(
                    out,
                    "  the files' names differ in one number ({} to {}) that is no rank's: read as one model at several sizes, not ranks of one job, so no file is an outlier (an inference from the names)",
                    s.smallest, s.largest
                )?,
            }
        }
        _ if r.model_sizes.is_some() => writeln!(
            out,
            "  the files' names state model sizes ({}): several models, not ranks of one job, so no file is an outlier (an inference from the names)",
            r.model_sizes
                .iter()
                .flatten()
                .map(|m| shown(m).into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        )?,
        _ if r.median_peak_bytes.is_none() => writeln!(
            out,
            "  no file has a trace that shows memory over time: no peaks to compare"
        )?,
        0 => writeln!(
            out,
            "  no rank's peak is more than {:.0}% above the median's",
            OUTLIER_MARGIN * 100.0
        )?,
        n => writeln!(
            out,
            "  {} more than {:.0}% above the median's ({})",
            if n == 1 {
                "1 rank's peak is".to_string()
            } else {
                format!("{n} ranks' peaks are")
            },
            OUTLIER_MARGIN * 100.0,
            r.median_peak_bytes.map_or("?".into(), bytes)
        )?,
    }
    if !r.differences.is_empty() {
        let what = if r.series.is_some() || r.model_sizes.is_some() {
            "file"
        } else {
            "rank"
        };
        writeln!(
            out,
            "  largest {what} ({}) against the median {what} ({}) at their peaks:",
            shown(r.largest.as_deref().unwrap_or("?")),
            shown(r.median.as_deref().unwrap_or("?"))
        )?;
        for g in &r.differences {
            writeln!(
                out,
                "    {:>11}  {}",
                if g.delta_bytes > 0 {
                    format!("+{}", bytes_signed(g.delta_bytes))
                } else {
                    bytes_signed(g.delta_bytes)
                },
                group_name_display(&g.name, g.kind)
            )?;
        }
    }
    Ok(())
}
