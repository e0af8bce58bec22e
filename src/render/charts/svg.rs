//! A small streaming SVG writer: elements go straight to the output, coordinates at fixed
//! precision, all text escaped. Tooltips are `<title>` children, which every browser
//! shows without JavaScript.

use std::fmt::Write as _;
use std::io::{self, Write};

/// Escapes text for XML content and attribute values ([`crate::render::charts::markup::xml`]: markup
/// characters as references, nothing XML forbids).
pub fn escape(s: &str) -> String {
    crate::render::charts::markup::xml(s)
}

/// A coordinate with one decimal (deterministic, compact).
pub fn num(v: f64) -> String {
    let v = if v.is_finite() { v } else { 0.0 };
    let s = format!("{v:.1}");
    match s.strip_suffix(".0") {
        Some(int) if int != "-0" => int.to_string(),
        Some(_) => "0".to_string(),
        None => s,
    }
}

/// Points as `x,y x,y ...`.
pub fn points(pts: &[(f64, f64)]) -> String {
    let mut s = String::with_capacity(pts.len() * 12);
    for (i, (x, y)) in pts.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let _ = write!(s, "{},{}", num(*x), num(*y));
    }
    s
}

/// FNV-1a hash of a name: the same in every chart and every run.
pub fn name_hash(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// Stable colour of a name: its hash to a hue, fixed saturation and lightness.
pub fn color(name: &str) -> String {
    let h = name_hash(name);
    format!(
        "hsl({},{}%,{}%)",
        h % 360,
        55 + (h >> 9) % 20,
        50 + (h >> 17) % 15
    )
}

/// A qualitative palette: 20 hues 18 degrees apart, taken 126 degrees apart in turn and
/// alternately dark and light, so neighbouring bands differ in hue and lightness and two
/// entries of close hue (three apart) differ in lightness.
pub const PALETTE: [&str; 20] = [
    "#296bae", "#de739e", "#51ae29", "#7388de", "#ae2936", "#73de73", "#3629ae", "#de8873",
    "#29ae51", "#9e73de", "#ae6b29", "#73deb3", "#8629ae", "#dec973", "#29aea0", "#de73de",
    "#a0ae29", "#73c9de", "#ae2986", "#b3de73",
];

/// An axis step: the smallest of `multiples` (ascending, ending at 10) times a power of
/// ten that is at least `raw`. Always finite and positive: a `raw` that is not (zero,
/// negative, NaN, infinite) is taken as the nearest value that is, so that a loop stepping
/// by it moves.
pub fn round_step(raw: f64, multiples: &[f64]) -> f64 {
    let raw = if raw.is_nan() {
        1.0
    } else {
        raw.clamp(1e-300, 1e300)
    };
    let p = 10f64.powi(raw.log10().floor() as i32);
    multiples
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// The most ticks an axis draws, whatever its range and step.
pub const MAX_TICKS: usize = 64;

/// The ticks of an axis from `lo` to `hi`: the whole multiples `k · step` inside the range,
/// ascending, each value once, at most [`MAX_TICKS`]. They are counted with an integer `k`, never by adding the step to a
/// float, so a step below the resolution of the floats at that offset cannot stall the
/// loop; ticks that the floats cannot tell apart are drawn once. None for a range or step
/// that is not finite, or a step that is not positive.
pub fn axis_ticks(lo: f64, hi: f64, step: f64) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite() && step.is_finite() && step > 0.0) || hi < lo {
        return Vec::new();
    }
    let first = (lo / step).ceil();
    let last = (hi / step).floor();
    if !(first.is_finite() && last.is_finite()) || last < first {
        return Vec::new();
    }
    let mut ticks: Vec<f64> = Vec::new();
    for k in 0..MAX_TICKS {
        let v = (first + k as f64) * step;
        if v > hi {
            break;
        }
        if ticks.last() != Some(&v) {
            ticks.push(v);
        }
    }
    ticks
}

/// The colour of a group's name (a call site, a stack, a file) or an allocation's label:
/// the palette's entry its hash picks. It depends on the name alone, so one call site has
/// one colour in the timeline and its zoom panel, the segments map, the flame graph and
/// every legend of the report, whatever else a chart shows. The hash is mixed before it
/// picks (FNV's low bits barely differ between names that differ in a line number).
pub fn name_color(name: &str) -> &'static str {
    let mut h = name_hash(name);
    // The finaliser of MurmurHash3: every input bit moves every output bit.
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    PALETTE[((h as u64 * PALETTE.len() as u64) >> 32) as usize]
}

/// The colour of a group or band: a built-in category's fixed colour, else its name's
/// ([`name_color`]).
pub fn group_color(
    name: &str,
    kind: crate::analysis::kinds::attribution::GroupKind,
) -> &'static str {
    if kind == crate::analysis::kinds::attribution::GroupKind::Category
        && let Some(c) = category_color(name)
    {
        return c;
    }
    name_color(name)
}

/// The colours of the groups (call sites, stacks, files, categories) that one chart, or
/// every chart of one report, shows: no two names share a colour. A category keeps its
/// fixed colour; any other name takes its own palette entry ([`name_color`], so a call
/// site mostly reads alike in charts made apart), unless a name before it took that
/// entry: then the first entry no name took, and past the palette, hues generated a
/// golden angle apart. Names are given largest first, so the largest keep their own.
#[derive(Debug, Clone, Default)]
pub struct Colors {
    by_name: std::collections::BTreeMap<String, String>,
    /// Colours given so far.
    taken: std::collections::BTreeSet<String>,
    /// Hues generated so far, past the palette.
    generated: u32,
}

impl Colors {
    pub fn new<'a>(
        groups: impl IntoIterator<Item = (&'a str, crate::analysis::kinds::attribution::GroupKind)>,
    ) -> Colors {
        use crate::analysis::kinds::attribution::GroupKind;
        let groups: Vec<(&str, GroupKind)> = groups.into_iter().collect();
        let mut book = Colors::default();
        // Categories first: their colours are fixed.
        for &(name, kind) in &groups {
            if kind == GroupKind::Category
                && let Some(c) = category_color(name)
            {
                book.taken.insert(c.to_string());
                book.by_name.insert(name.to_string(), c.to_string());
            }
        }
        for &(name, _) in &groups {
            book.assign(name);
        }
        book
    }

    /// This book with more names, each given a colour no name here has (by the same rule,
    /// in the order given); the names it has keep theirs.
    pub fn with_names<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Colors {
        let mut book = self.clone();
        for name in names {
            book.assign(name);
        }
        book
    }

    fn assign(&mut self, name: &str) {
        if self.by_name.contains_key(name) {
            return;
        }
        let own = name_color(name);
        let colour = if !self.taken.contains(own) {
            own.to_string()
        } else if let Some(free) = PALETTE.iter().find(|c| !self.taken.contains(**c)) {
            free.to_string()
        } else {
            loop {
                self.generated += 1;
                let k = self.generated;
                let hue = (k as f64 * 137.508) % 360.0;
                let c = format!("hsl({hue:.1},60%,{}%)", [42, 58, 50][k as usize % 3]);
                if !self.taken.contains(&c) {
                    break c;
                }
            }
        };
        self.taken.insert(colour.clone());
        self.by_name.insert(name.to_string(), colour);
    }

    /// A group's colour: the one given it here, else its category's or name's
    /// ([`group_color`]).
    pub fn group(
        &self,
        name: &str,
        kind: crate::analysis::kinds::attribution::GroupKind,
    ) -> String {
        match self.by_name.get(name) {
            Some(c) => c.clone(),
            None => group_color(name, kind).to_string(),
        }
    }

    /// The colour given a name here, if any.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.by_name.get(name).map(String::as_str)
    }
}

/// The colour of text written on a `#rrggbb` fill: white on the palette's dark entries,
/// black on everything else (hsl fills are light).
pub fn text_on(fill: &str) -> &'static str {
    let channel = |i: usize| {
        fill.get(i..i + 2)
            .and_then(|c| u8::from_str_radix(c, 16).ok())
            .map_or(255.0, f64::from)
    };
    if fill.len() != 7 || !fill.starts_with('#') {
        return "#000000";
    }
    let luma = 0.299 * channel(1) + 0.587 * channel(3) + 0.114 * channel(5);
    if luma < 135.0 { "#ffffff" } else { "#000000" }
}

/// Fixed colours of the built-in categories, so charts compare at a glance.
pub fn category_color(name: &str) -> Option<&'static str> {
    Some(match name {
        "parameters" => "#4e79a7",
        "gradients" => "#f28e2b",
        "optimizer_state" => "#b07aa1",
        "step_temporaries" => "#d7b5d8",
        "activations" => "#59a14f",
        "backward_temporaries" => "#76b7b2",
        "caches" => "#e15759",
        "communication" => "#edc948",
        "workspaces" => "#9c755f",
        "compile" => "#ff9da7",
        "inputs" => "#86bcb6",
        "autocast_copies" => "#a0cbe8",
        "other" => "#bab0ac",
        "unknown" => "#d4d4d4",
        _ => return None,
    })
}

pub struct Svg<'a> {
    pub out: &'a mut dyn Write,
}

impl Svg<'_> {
    pub fn begin(&mut self, width: f64, height: f64, title: &str) -> io::Result<()> {
        writeln!(
            self.out,
            r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<title>{t}</title>
<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>"##,
            w = num(width),
            h = num(height),
            t = escape(title)
        )
    }

    pub fn end(&mut self) -> io::Result<()> {
        writeln!(self.out, "</svg>")
    }

    pub fn text(
        &mut self,
        x: f64,
        y: f64,
        anchor: &str,
        attrs: &str,
        text: &str,
    ) -> io::Result<()> {
        writeln!(
            self.out,
            r#"<text x="{}" y="{}" text-anchor="{anchor}"{attrs}>{}</text>"#,
            num(x),
            num(y),
            escape(text)
        )
    }

    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, attrs: &str) -> io::Result<()> {
        writeln!(
            self.out,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}"{attrs}/>"#,
            num(x1),
            num(y1),
            num(x2),
            num(y2)
        )
    }

    pub fn rect(
        &mut self,
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        attrs: &str,
        title: Option<&str>,
    ) -> io::Result<()> {
        write!(
            self.out,
            r#"<rect x="{}" y="{}" width="{}" height="{}"{attrs}"#,
            num(x),
            num(y),
            num(w.max(0.0)),
            num(h.max(0.0))
        )?;
        self.close("rect", title)
    }

    pub fn polygon(
        &mut self,
        pts: &[(f64, f64)],
        attrs: &str,
        title: Option<&str>,
    ) -> io::Result<()> {
        write!(self.out, r#"<polygon points="{}"{attrs}"#, points(pts))?;
        self.close("polygon", title)
    }

    pub fn polyline(
        &mut self,
        pts: &[(f64, f64)],
        attrs: &str,
        title: Option<&str>,
    ) -> io::Result<()> {
        write!(
            self.out,
            r#"<polyline points="{}" fill="none"{attrs}"#,
            points(pts)
        )?;
        self.close("polyline", title)
    }

    /// Ends an element opened with `<tag ...`: with a tooltip child, or self-closed.
    fn close(&mut self, tag: &str, title: Option<&str>) -> io::Result<()> {
        match title {
            Some(t) => writeln!(self.out, "><title>{}</title></{tag}>", escape(t)),
            None => writeln!(self.out, "/>"),
        }
    }
}

/// A line's points thinned to what the pixels can show: per half-pixel column of x, the
/// first point, the highest and lowest (smallest and largest y) and the last, in their
/// order; columns of at most four points are kept whole. Extremes and the line's shape
/// survive exactly at that resolution; the output is at most four points per column
/// whatever the length of the input.
pub fn thin_points(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let column = |p: &(f64, f64)| (p.0 * 2.0).floor() as i64;
    let mut out = Vec::with_capacity(pts.len().min(4096));
    let mut start = 0;
    while start < pts.len() {
        let c = column(&pts[start]);
        let end = start + pts[start..].iter().take_while(|p| column(p) == c).count();
        let group = &pts[start..end];
        if group.len() <= 4 {
            out.extend_from_slice(group);
        } else {
            let low = (0..group.len())
                .min_by(|&a, &b| group[a].1.total_cmp(&group[b].1))
                .unwrap_or(0);
            let high = (0..group.len())
                .max_by(|&a, &b| group[a].1.total_cmp(&group[b].1))
                .unwrap_or(0);
            let mut keep = [0, low, high, group.len() - 1];
            keep.sort_unstable();
            let mut last = None;
            for k in keep {
                if last != Some(k) {
                    out.push(group[k]);
                    last = Some(k);
                }
            }
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn thinned_points_keep_the_extremes_and_are_bounded_by_the_columns() {
        // 100,000 points over 100 px: a saw with one spike and one dip.
        let pts: Vec<(f64, f64)> = (0..100_000)
            .map(|i| {
                let x = i as f64 / 1000.0;
                let y = match i {
                    40_000 => -50.0,
                    70_001 => 500.0,
                    _ => (i % 37) as f64,
                };
                (x, y)
            })
            .collect();
        let thin = super::thin_points(&pts);
        assert!(thin.len() <= 4 * 200, "{}", thin.len());
        assert!(thin.contains(&(40.0, -50.0)));
        assert!(thin.contains(&(70.001, 500.0)));
        assert_eq!(thin.first(), pts.first());
        assert_eq!(thin.last(), pts.last());
        // In order of x.
        assert!(thin.windows(2).all(|w| w[0].0 <= w[1].0));
        // Few points pass whole.
        let few = [(0.0, 1.0), (0.1, 2.0), (5.0, 3.0)];
        assert_eq!(super::thin_points(&few), few.to_vec());
    }

    #[test]
    fn no_two_names_of_a_book_share_a_colour() {
        use crate::analysis::kinds::attribution::GroupKind;
        // 300 call sites: more than the palette, and many whose own entries collide.
        let names: Vec<String> = (0..300).map(|i| format!("model.py:{i}:forward")).collect();
        let mut groups: Vec<(&str, GroupKind)> = names
            .iter()
            .map(|n| (n.as_str(), GroupKind::Frame))
            .collect();
        groups.push(("activations", GroupKind::Category));
        let book = Colors::new(groups.iter().copied());
        let colours: std::collections::BTreeSet<String> =
            groups.iter().map(|&(n, k)| book.group(n, k)).collect();
        assert_eq!(colours.len(), groups.len());
        // A category keeps its fixed colour; the first name keeps its own entry.
        assert_eq!(book.group("activations", GroupKind::Category), "#59a14f");
        assert_eq!(
            book.group(&names[0], GroupKind::Frame),
            name_color(&names[0])
        );
        // Two names whose own entries are one: the second takes another.
        let (a, b) = names
            .iter()
            .enumerate()
            .find_map(|(i, a)| {
                names[i + 1..]
                    .iter()
                    .find(|b| name_color(b) == name_color(a))
                    .map(|b| (a, b))
            })
            .expect("20 entries for 300 names collide");
        let two = Colors::new([
            (a.as_str(), GroupKind::Frame),
            (b.as_str(), GroupKind::Frame),
        ]);
        assert_eq!(two.group(a, GroupKind::Frame), name_color(a));
        assert_ne!(two.group(b, GroupKind::Frame), name_color(a));
    }

    use super::*;

    #[test]
    fn escaping_and_numbers() {
        assert_eq!(escape("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&apos;");
        assert_eq!(escape("x\u{1}y\u{fffe}"), "x\\x01y\u{fffd}");
        assert_eq!(num(1.0), "1");
        assert_eq!(num(1.25), "1.2");
        assert_eq!(num(-0.01), "0");
        assert_eq!(num(f64::NAN), "0");
        assert_eq!(points(&[(0.0, 1.5), (2.0, 3.0)]), "0,1.5 2,3");
        assert_eq!(color("train.py:10:forward"), color("train.py:10:forward"));
        assert_ne!(color("a"), color("b"));
    }

    #[test]
    fn ticks_are_counted_and_end_whatever_the_step() {
        // 0, 2, 4, 6, 8, 10: the multiples of 2 from 0 to 10.
        assert_eq!(axis_ticks(0.0, 10.0, 2.0), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        // From 3 to 9: 4, 6, 8.
        assert_eq!(axis_ticks(3.0, 9.0, 2.0), [4.0, 6.0, 8.0]);
        // 2^53 - 3 to 2^53 - 2 in steps of 0.1: the floats there are 1 apart, so the
        // multiples of 0.1 between them round to at most 2 distinct values.
        let lo = 9_007_199_254_740_989.0;
        let t = axis_ticks(lo, lo + 1.0, 0.1);
        assert!(!t.is_empty() && t.len() <= 2, "{t:?}");
        // A step far below a float's resolution, a huge range: at most MAX_TICKS.
        assert!(axis_ticks(0.0, 1e300, 1e-300).len() <= MAX_TICKS);
        assert!(axis_ticks(1e18, 2e18, 1e-3).len() <= MAX_TICKS);
        // Nothing for a step or range that is not finite, or a step that is not positive.
        assert!(axis_ticks(0.0, f64::INFINITY, 1.0).is_empty());
        assert!(axis_ticks(0.0, 1.0, f64::NAN).is_empty());
        assert!(axis_ticks(0.0, 1.0, 0.0).is_empty());
        assert!(axis_ticks(0.0, 1.0, -1.0).is_empty());
        assert!(axis_ticks(2.0, 1.0, 1.0).is_empty());
    }

    #[test]
    fn a_round_step_is_always_finite_and_positive() {
        assert_eq!(round_step(0.3, &[1.0, 2.0, 5.0, 10.0]), 0.5);
        assert_eq!(round_step(7.0, &[1.0, 2.0, 5.0, 10.0]), 10.0);
        for raw in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e-320,
        ] {
            let s = round_step(raw, &[1.0, 2.0, 5.0, 10.0]);
            assert!(s.is_finite() && s > 0.0, "{raw}: {s}");
        }
    }
}
