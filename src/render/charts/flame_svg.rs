//! A flame graph as SVG: the root at the bottom, each frame a box as wide as its share of
//! the live bytes, labelled with its function and bytes where they fit, tooltips
//! (`<title>`) with the whole name, bytes, share and count; no script.

use crate::analysis::kinds::flame::FlameNode;
use crate::render::charts::svg::{Colors, Svg, escape, name_color, num, text_on};
use crate::render::words::labels::clip;
use crate::units::{bytes, percent};
use std::io::{self, Write};

const WIDTH: f64 = 1200.0;
const ROW: f64 = 17.0;
const TOP: f64 = 56.0;
const SIDE: f64 = 10.0;
/// Boxes narrower than this (pixels) are left out; their bytes stay in the parent.
const MIN_WIDTH: f64 = 0.5;
/// Average width of a character at font size 11, for fitting labels.
const CHAR: f64 = 6.2;

/// Rows of boxes drawn: boxes narrower than [`MIN_WIDTH`] are not drawn and take no row
/// (a few bytes 12 frames deep would otherwise leave the graph's top rows empty).
fn depth(n: &FlameNode, scale: f64) -> usize {
    if (n.bytes as f64 * scale) < MIN_WIDTH {
        return 0;
    }
    1 + n
        .children
        .iter()
        .map(|c| depth(c, scale))
        .max()
        .unwrap_or(0)
}

/// A frame's colour: the colour the timeline, the segments map and the report's legends
/// give the call site of that name ([`name_color`]), so a call site reads alike in every
/// chart; blue for torch's own frames (never a call site under the default rules) and
/// grey for the element that stands for C++ frames.
fn frame_color(name: &str) -> String {
    if is_cpp_element(name) {
        return "hsl(0,0%,70%)".into();
    }
    if is_torch_frame(name) {
        let h = crate::render::charts::svg::name_hash(name);
        return format!(
            "hsl({},{}%,{}%)",
            195 + h % 40,
            60 + (h >> 8) % 25,
            62 + (h >> 16) % 14
        );
    }
    name_color(name).to_string()
}

/// The element that stands for a run of C++ frames.
fn is_cpp_element(name: &str) -> bool {
    name.starts_with('(') && (name.ends_with(" C++ frame)") || name.ends_with(" C++ frames)"))
}

/// A frame of torch itself.
fn is_torch_frame(name: &str) -> bool {
    name.contains("/torch/") || name.starts_with("torch/")
}

/// Whether a frame is a call site a colour tells apart: not torch's own (blue), not the
/// element that stands for C++ frames (grey).
fn is_call_site(name: &str) -> bool {
    !is_cpp_element(name) && !is_torch_frame(name)
}

/// The names of the frames drawn (wide enough to be seen), largest first (ties by name),
/// each once.
fn frames_drawn(root: &FlameNode, scale: f64) -> Vec<&str> {
    let mut best: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    let mut stack: Vec<&FlameNode> = root.children.iter().collect();
    while let Some(node) = stack.pop() {
        if node.bytes as f64 * scale < MIN_WIDTH {
            continue;
        }
        let e = best.entry(node.name.as_str()).or_insert(0);
        *e = (*e).max(node.bytes);
        stack.extend(node.children.iter());
    }
    let mut out: Vec<(u64, &str)> = best.into_iter().map(|(n, b)| (b, n)).collect();
    out.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    out.into_iter().map(|(_, name)| name).collect()
}

/// Characters of a name kept, at the least, before a box's bytes in its label.
const MIN_NAME: usize = 6;

/// A box label of at most `fits` characters: the function and the box's bytes first
/// (what a reader looks for), then where, cut to the room left (`forward (1.2 GiB)
/// nanogpt/model.py:42`); in a narrower box the function cut before the bytes
/// (`forward_b… (3.9 GiB)`), and in the narrowest the function alone, cut.
fn label(name: &str, size_bytes: u64, fits: usize) -> String {
    let short = crate::render::words::labels::short_frame(name);
    let (function, place) = match short.rsplit_once(" in ") {
        Some((place, function)) => (function.to_string(), Some(place.to_string())),
        None => (short, None),
    };
    let size = format!("({})", bytes(size_bytes));
    let size_len = size.chars().count();
    let head = format!("{function} {size}");
    let head_len = head.chars().count();
    if head_len > fits {
        return match fits.checked_sub(size_len + 1) {
            Some(room) if room >= MIN_NAME => format!("{} {size}", clip(&function, room)),
            _ => clip(&function, fits),
        };
    }
    match place {
        // Room for the place, or a telling part of it, after two spaces.
        Some(p) if fits >= head_len + 2 + 6 => format!("{head}  {}", clip(&p, fits - head_len - 2)),
        _ => head,
    }
}

pub struct FlameTitle<'a> {
    pub heading: &'a str,
    pub subtitle: &'a str,
}

///
/// `colors`: those of the report the graph is part of, which a frame named as a call site
/// of the report's other charts takes.
pub fn write_flame_svg(
    out: &mut dyn Write,
    root: &FlameNode,
    title: &FlameTitle,
    colors: Option<&Colors>,
) -> io::Result<()> {
    let scale = if root.bytes == 0 {
        0.0
    } else {
        (WIDTH - 2.0 * SIDE) / root.bytes as f64
    };
    let rows = depth(root, scale).max(1);
    let height = TOP + rows as f64 * ROW + 30.0;
    let mut svg = Svg { out };
    svg.begin(WIDTH, height, title.heading)?;
    svg.text(
        SIDE,
        22.0,
        "start",
        r#" font-size="16" font-weight="bold""#,
        title.heading,
    )?;
    svg.text(SIDE, 40.0, "start", "", title.subtitle)?;
    let bottom = TOP + rows as f64 * ROW;
    // Every call site drawn gets a colour of its own (the report's where it has one),
    // the largest first; torch's frames stay in their blues, C++ frames grey.
    let book = colors.cloned().unwrap_or_default().with_names(
        frames_drawn(root, scale)
            .into_iter()
            .filter(|name| is_call_site(name)),
    );
    let mut stack = vec![(root, SIDE, 0usize)];
    while let Some((node, x, level)) = stack.pop() {
        let w = node.bytes as f64 * scale;
        if w < MIN_WIDTH {
            continue;
        }
        let y = bottom - (level + 1) as f64 * ROW;
        let fill = if level == 0 {
            "hsl(0,0%,80%)".to_string()
        } else {
            // The book holds the report's names and the call sites drawn: others are
            // torch's frames and the C++ element.
            book.get(&node.name)
                .map_or_else(|| frame_color(&node.name), str::to_string)
        };
        let category = match node.category.as_str() {
            "" => String::new(),
            c if node.category_share < 0.995 => {
                format!("; mostly {c} ({:.0}%)", node.category_share * 100.0)
            }
            c => format!("; {c}"),
        };
        let tip = format!(
            "{}\n{} ({} of the live bytes), {} allocation{}{category}",
            node.name,
            bytes(node.bytes),
            percent(node.bytes, root.bytes),
            node.count,
            if node.count == 1 { "" } else { "s" }
        );
        writeln!(
            svg.out,
            r##"<g><title>{}</title><rect x="{}" y="{}" width="{}" height="{}" fill="{fill}" stroke="#ffffff" stroke-width="0.5" data-bytes="{}"/>"##,
            escape(&tip),
            num(x),
            num(y),
            num(w),
            num(ROW - 1.0),
            node.bytes
        )?;
        let fits = ((w - 6.0) / CHAR).floor().max(0.0) as usize;
        if fits >= 4 {
            let label = label(&node.name, node.bytes, fits);
            writeln!(
                svg.out,
                r#"<text x="{}" y="{}" font-size="11"{}>{}</text>"#,
                num(x + 3.0),
                num(y + ROW - 5.0),
                match text_on(&fill) {
                    "#000000" => String::new(),
                    c => format!(r#" fill="{c}""#),
                },
                escape(&label)
            )?;
        }
        writeln!(svg.out, "</g>")?;
        let mut cx = x;
        let mut children = Vec::new();
        for c in &node.children {
            children.push((c, cx, level + 1));
            cx += c.bytes as f64 * scale;
        }
        // Draw left to right.
        stack.extend(children.into_iter().rev());
    }
    svg.text(
        SIDE,
        height - 10.0,
        "start",
        r##" fill="#555555""##,
        "width: live bytes at the moment; bottom: outermost frame; hover a box for its whole name, share and count",
    )?;
    svg.end()
}
