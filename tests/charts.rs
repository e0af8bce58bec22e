//! Charts that agree with each other: one call site has one colour in every chart of a
//! file, the zoom panel stacks its bands as the whole chart does, the budget chart's axis
//! and capacity labels read cleanly, the segments map shows its free holes and the
//! timeline the device's readings. Each test runs the binary and reads the SVG with an
//! XML parser.

use assert_cmd::Command;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `vramlens ARGS -o DIR/NAME` and gives the file written.
fn chart(dir: &Path, name: &str, args: &[&str]) -> String {
    let out = dir.join(name);
    Command::cargo_bin("vramlens")
        .unwrap()
        .current_dir(root())
        .args(args)
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    std::fs::read_to_string(&out).unwrap()
}

/// The H200 recording that ran out of memory (testdata/gpu/README.md).
const OOM: &str = "testdata/gpu/oom/oom_snapshot.pickle";

/// The first line of an element's `<title>` child.
fn title(n: roxmltree::Node) -> Option<String> {
    n.children()
        .find(|c| c.has_tag_name("title"))
        .and_then(|t| t.text())
        .map(|t| t.lines().next().unwrap_or("").to_string())
}

/// Whether `n` is inside the timeline's zoom panel (the group moved under the chart).
fn in_zoom(n: roxmltree::Node) -> bool {
    n.ancestors()
        .any(|a| a.has_tag_name("g") && a.attribute("transform").is_some())
}

/// Each band's fill in the whole timeline (not its zoom panel), by name, and their
/// names bottom to top.
fn timeline_bands(svg: &str, zoom: bool) -> (BTreeMap<String, String>, Vec<String>) {
    let doc = roxmltree::Document::parse(svg).unwrap();
    let mut fills = BTreeMap::new();
    let mut order = Vec::new();
    for n in doc.descendants().filter(|n| n.has_tag_name("polygon")) {
        let (Some(label), Some(fill)) = (n.attribute("data-label"), n.attribute("fill")) else {
            continue;
        };
        if in_zoom(n) != zoom {
            continue;
        }
        if !order.iter().any(|o| o == label) {
            order.push(label.to_string());
        }
        let old = fills.insert(label.to_string(), fill.to_string());
        assert!(old.is_none_or(|o| o == fill), "{label}: two fills");
    }
    (fills, order)
}

/// The fill of each legend entry with a name (a swatch whose tooltip is the name).
fn legend_fills(svg: &str) -> BTreeMap<String, String> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.has_tag_name("rect"))
        .filter_map(|n| Some((title(n)?, n.attribute("fill")?.to_string())))
        .collect()
}

/// The fill of each flame graph box, by its frame's name.
fn flame_fills(svg: &str) -> BTreeMap<String, String> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.has_tag_name("g"))
        .filter_map(|g| {
            let rect = g.children().find(|c| c.has_tag_name("rect"))?;
            Some((title(g)?, rect.attribute("fill")?.to_string()))
        })
        .collect()
}

#[test]
fn a_call_site_has_one_colour_in_the_timeline_the_segments_map_and_the_flame_graph() {
    let dir = tempfile::tempdir().unwrap();
    let timeline = chart(dir.path(), "t.svg", &["timeline", OOM]);
    let segments = chart(dir.path(), "s.svg", &["segments", OOM, "--at", "peak"]);
    let flame = chart(dir.path(), "f.svg", &["flamegraph", OOM]);
    let (bands, _) = timeline_bands(&timeline, false);
    let (zoom_bands, _) = timeline_bands(&timeline, true);
    let legend = legend_fills(&segments);
    let flame = flame_fills(&flame);
    // The two call sites that hold the memory at the OOM, and their palette entries as
    // FNV-1a, MurmurHash3's finaliser and a multiply-shift into 20 entries give them
    // (worked out apart from the code, in Python).
    for (site, fill) in [
        ("<string>:31:leaky_eval", "#73deb3"),
        ("<string>:30:leaky_eval", "#51ae29"),
    ] {
        assert_eq!(
            bands.get(site).map(String::as_str),
            Some(fill),
            "timeline {site}"
        );
        assert_eq!(
            zoom_bands.get(site).map(String::as_str),
            Some(fill),
            "zoom {site}"
        );
        assert_eq!(
            legend.get(site).map(String::as_str),
            Some(fill),
            "segments {site}"
        );
        assert_eq!(
            flame.get(site).map(String::as_str),
            Some(fill),
            "flame {site}"
        );
    }
    // Every group the segments map and the timeline both show: one colour.
    let mut shared = 0;
    for (name, fill) in &legend {
        if let Some(band) = bands.get(name) {
            assert_eq!(band, fill, "{name}: timeline {band}, segments {fill}");
            shared += 1;
        }
    }
    assert!(shared >= 5, "only {shared} groups in both charts");
}

/// The outermost `<svg>` elements of a page, as text.
fn outermost_svgs(page: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let (mut depth, mut start, mut i) = (0usize, 0usize, 0usize);
    while i < page.len() {
        let rest = &page[i..];
        if rest.starts_with("<svg") {
            if depth == 0 {
                start = i;
            }
            depth += 1;
            i += 4;
        } else if rest.starts_with("</svg>") {
            depth = depth.saturating_sub(1);
            i += 6;
            if depth == 0 {
                found.push(&page[start..i]);
            }
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    found
}

#[test]
fn the_report_colours_a_call_site_as_the_charts_do() {
    let dir = tempfile::tempdir().unwrap();
    let report = chart(dir.path(), "r.html", &["report", OOM]);
    // Each inline chart of the report (an outermost <svg> element), parsed on its own.
    let mut fills: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut charts = 0;
    for svg in outermost_svgs(&report) {
        let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("{e}"));
        charts += 1;
        for n in doc.descendants() {
            let name = n
                .attribute("data-label")
                .map(str::to_string)
                .or_else(|| n.has_tag_name("rect").then(|| title(n)).flatten());
            if let (Some(name), Some(fill)) = (name, n.attribute("fill")) {
                fills.entry(name).or_default().push(fill.to_string());
            }
        }
    }
    assert!(charts >= 3, "{charts} charts");
    let site = fills
        .get("<string>:31:leaky_eval")
        .expect("the call site in the report's charts");
    assert!(site.len() >= 3, "{site:?}");
    assert!(site.iter().all(|f| f == "#73deb3"), "{site:?}");
}

#[test]
fn the_zoom_panel_stacks_its_bands_in_the_whole_charts_order() {
    let dir = tempfile::tempdir().unwrap();
    let timeline = chart(dir.path(), "t.svg", &["timeline", OOM]);
    let (_, main) = timeline_bands(&timeline, false);
    let (_, zoom) = timeline_bands(&timeline, true);
    assert!(zoom.len() >= 4, "{zoom:?}");
    // The whole chart stacks the model's weights first (allocated first), the two call
    // sites of the leaking loop last, :31 under :30.
    let at = |v: &[String], s: &str| v.iter().position(|x| x == s);
    let (m31, m30) = (
        at(&main, "<string>:31:leaky_eval").unwrap(),
        at(&main, "<string>:30:leaky_eval").unwrap(),
    );
    assert!(m31 < m30, "{main:?}");
    let shown: Vec<&String> = zoom.iter().filter(|z| main.contains(z)).collect();
    let in_main: Vec<&String> = main.iter().filter(|m| zoom.contains(m)).collect();
    assert_eq!(shown, in_main, "zoom {zoom:?}, main {main:?}");
}

/// The texts of a class in an SVG: (y, text), top first.
fn texts_of(svg: &str, class: &str) -> Vec<(f64, String)> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    let mut v: Vec<(f64, String)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text") && n.attribute("class") == Some(class))
        .map(|n| {
            (
                n.attribute("y").unwrap().parse().unwrap(),
                n.text().unwrap_or("").to_string(),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

#[test]
fn the_budget_chart_has_round_ticks_and_capacity_labels_apart() {
    let dir = tempfile::tempdir().unwrap();
    let svg = chart(
        dir.path(),
        "b.svg",
        &[
            "budget",
            "testdata/budget/batch_bs8.pickle",
            "--gpu",
            "h200",
            "--gpu",
            "a100-80gb",
            "--gpu",
            "h100",
            "--gpu",
            "a100-40gb",
        ],
    );
    // The highest line is the H200's 139.8 GiB: a quarter of it is 34.95 GiB, the next
    // round step 40 GiB, and the axis ends at the first tick over 139.8 GiB.
    let ticks: Vec<String> = texts_of(&svg, "tick").into_iter().map(|t| t.1).collect();
    assert_eq!(ticks, ["160 GiB", "120 GiB", "80 GiB", "40 GiB", "0 GiB"]);
    // A100 80GB (79.15 GiB) and H100 80GB (79.10 GiB) are 0.2 px apart: their labels are
    // moved at least a font size (11) apart; every label is there once.
    let labels = texts_of(&svg, "capacity");
    let names: Vec<&str> = labels.iter().map(|l| l.1.as_str()).collect();
    assert_eq!(
        names,
        [
            "H200 141GB 139.8 GiB",
            "A100 80GB 79.2 GiB",
            "H100 80GB 79.1 GiB",
            "A100 40GB 39.4 GiB"
        ]
    );
    for w in labels.windows(2) {
        assert!(w[1].0 - w[0].0 >= 11.0, "{labels:?}");
    }
}

#[test]
fn gpus_of_one_capacity_share_a_label() {
    let dir = tempfile::tempdir().unwrap();
    let svg = chart(
        dir.path(),
        "b.svg",
        &[
            "budget",
            "testdata/budget/batch_bs8.pickle",
            "--gpu",
            "a100-80gb",
            "--gpu",
            "79.15GiB",
            "--gpu",
            "2GiB",
        ],
    );
    let labels: Vec<String> = texts_of(&svg, "capacity")
        .into_iter()
        .map(|t| t.1)
        .collect();
    assert_eq!(labels, ["A100 80GB, 79.15GiB 79.2 GiB", "2GiB"]);
    // 79.2 GiB over four steps: 19.8 GiB, rounded up to 20 GiB.
    let ticks: Vec<String> = texts_of(&svg, "tick").into_iter().map(|t| t.1).collect();
    assert_eq!(ticks, ["80 GiB", "60 GiB", "40 GiB", "20 GiB", "0 GiB"]);
}

const GIB: i64 = 1 << 30;
const MIB: i64 = 1 << 20;

/// A final-state snapshot of one 78 GiB segment: 40 GiB allocated, a free hole of
/// 16 MiB, then the rest allocated (written with serde-pickle).
fn one_hole_snapshot(path: &Path) {
    use serde_pickle::{HashableValue as HV, SerOptions, Value as SV};
    let dict = |items: Vec<(&str, SV)>| {
        SV::Dict(
            items
                .into_iter()
                .map(|(k, v)| (HV::String(k.into()), v))
                .collect(),
        )
    };
    let base: i64 = 0x7f00_0000_0000;
    let total = 78 * GIB;
    let parts = [
        (40 * GIB, "active_allocated"),
        (16 * MIB, "inactive"),
        (total - 40 * GIB - 16 * MIB, "active_allocated"),
    ];
    let mut address = base;
    let mut blocks = Vec::new();
    for (size, state) in parts {
        let frames = vec![dict(vec![
            ("filename", SV::String("train.py".into())),
            ("line", SV::I64(7)),
            ("name", SV::String("step".into())),
        ])];
        blocks.push(dict(vec![
            ("address", SV::I64(address)),
            ("size", SV::I64(size)),
            ("requested_size", SV::I64(size)),
            ("state", SV::String(state.into())),
            ("frames", SV::List(frames)),
        ]));
        address += size;
    }
    let used = total - 16 * MIB;
    let segment = dict(vec![
        ("device", SV::I64(0)),
        ("address", SV::I64(base)),
        ("total_size", SV::I64(total)),
        ("allocated_size", SV::I64(used)),
        ("active_size", SV::I64(used)),
        ("requested_size", SV::I64(used)),
        ("stream", SV::I64(0)),
        ("segment_type", SV::String("large".into())),
        ("blocks", SV::List(blocks)),
    ]);
    let root = dict(vec![
        ("segments", SV::List(vec![segment])),
        ("device_traces", SV::List(vec![SV::List(vec![])])),
    ]);
    std::fs::write(
        path,
        serde_pickle::value_to_vec(&root, SerOptions::new()).unwrap(),
    )
    .unwrap();
}

#[test]
fn a_small_hole_in_a_large_segment_is_drawn_visibly() {
    let dir = tempfile::tempdir().unwrap();
    let pickle = dir.path().join("hole.pickle");
    one_hole_snapshot(&pickle);
    let svg = chart(dir.path(), "s.svg", &["segments", pickle.to_str().unwrap()]);
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let holes: Vec<roxmltree::Node> = doc
        .descendants()
        .filter(|n| n.has_tag_name("rect") && n.attribute("class") == Some("hole"))
        .collect();
    assert_eq!(holes.len(), 1, "{svg}");
    let hole = holes[0];
    assert_eq!(hole.attribute("data-bytes"), Some("16777216"));
    let x: f64 = hole.attribute("x").unwrap().parse().unwrap();
    let w: f64 = hole.attribute("width").unwrap().parse().unwrap();
    // 16 MiB of 78 GiB over the 730 px row is 0.15 px: drawn 3 px wide, centred where it
    // is, 40 GiB into the row (230 + 730 * 40 / 78 = 604.4 px).
    assert!(w >= 3.0, "width {w}");
    assert!((x + w / 2.0 - 604.4).abs() < 0.5, "x {x}, width {w}");
    // Drawn over the blocks, not under them.
    let last_block = doc
        .descendants()
        .filter(|n| n.has_tag_name("rect") && n.attribute("data-bytes").is_some())
        .rfind(|n| n.attribute("class") != Some("hole"))
        .unwrap();
    assert!(last_block.range().start < hole.range().start);
}

#[test]
fn the_timeline_shows_the_gap_up_to_the_device_line() {
    let dir = tempfile::tempdir().unwrap();
    let svg = chart(
        dir.path(),
        "t.svg",
        &["timeline", OOM, "--nvml", "testdata/gpu/oom/nvml.jsonl"],
    );
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let gaps: Vec<roxmltree::Node> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("device-gap") && !in_zoom(*n))
        .collect();
    assert!(!gaps.is_empty(), "no gap band");
    for gap in &gaps {
        // Points: the device line left to right, then reserved right to left; each x's
        // two ys at least 3 px apart, so a gap of 0.7 GiB shows at a 150 GiB scale.
        let pts: Vec<(f64, f64)> = gap
            .attribute("points")
            .unwrap()
            .split(' ')
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        let n = pts.len() / 2;
        assert!(n >= 2 && pts.len() == 2 * n, "{pts:?}");
        for i in 0..n {
            let (top, bottom) = (pts[i], pts[pts.len() - 1 - i]);
            assert_eq!(top.0, bottom.0);
            assert!(bottom.1 - top.1 >= 3.0 - 0.05, "{top:?} {bottom:?}");
        }
    }
    // The device line is drawn at least 2 px wide.
    let device = doc
        .descendants()
        .find(|n| {
            n.has_tag_name("polyline") && title(*n).is_some_and(|t| t.starts_with("device used"))
        })
        .unwrap();
    let width: f64 = device.attribute("stroke-width").unwrap().parse().unwrap();
    assert!(width >= 2.0);
}

#[test]
fn the_reports_live_tables_show_each_call_site_in_its_chart_colour() {
    let dir = tempfile::tempdir().unwrap();
    let report = chart(dir.path(), "r.html", &["report", OOM]);
    // Every row of a call site's table begins its call site with the swatch of the
    // colour its band has in the timeline.
    for (name, fill) in [
        ("&lt;string&gt;:31 in leaky_eval", "#73deb3"),
        ("&lt;string&gt;:30 in leaky_eval", "#51ae29"),
    ] {
        let rows: Vec<&str> = report
            .split("<tr data-name=\"")
            .skip(1)
            .filter(|r| r.starts_with(&format!("{name}\"")))
            .map(|r| &r[..r.find("</tr>").unwrap()])
            .collect();
        assert!(!rows.is_empty(), "{name}");
        for r in rows {
            assert!(
                r.contains(&format!(
                    "<span class=\"swatch\" style=\"background:{fill}\">"
                )),
                "{r}"
            );
        }
    }
}

/// In a flame graph, no two call sites drawn share a colour (torch's own frames are
/// blues and the C++ element grey: those are no call sites a colour must tell apart).
fn assert_flame_call_sites_distinct(svg: &str) -> usize {
    let fills = flame_fills(svg);
    let mut by_fill: BTreeMap<&str, &str> = BTreeMap::new();
    let mut sites = 0;
    for (name, fill) in &fills {
        let torch = name.contains("/torch/") || name.starts_with("torch/");
        let cpp = name.starts_with('(') && name.contains("C++ frame");
        if torch || cpp || name == "all" {
            continue;
        }
        sites += 1;
        if let Some(other) = by_fill.insert(fill, name) {
            panic!("{other} and {name} share {fill}");
        }
    }
    sites
}

#[test]
fn no_two_call_sites_of_a_flame_graph_share_a_colour() {
    let dir = tempfile::tempdir().unwrap();
    for (i, file) in [
        OOM,
        "testdata/sample.pickle",
        "testdata/gpu/ok/snapshot.pickle",
    ]
    .iter()
    .enumerate()
    {
        let svg = chart(dir.path(), &format!("f{i}.svg"), &["flamegraph", file]);
        assert!(assert_flame_call_sites_distinct(&svg) >= 3, "{file}");
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn no_two_call_sites_of_a_real_flame_graph_share_a_colour() {
    let data = root().join("../shared/data");
    assert!(data.exists(), "needs ../shared/data");
    let dir = tempfile::tempdir().unwrap();
    for (i, rel) in [
        "ccl-bench-torchtitan-fsdp-oom/rank0_memory_snapshot.pickle",
        "cs336-cliffkai/memory_snapshot_xl_bwd.pickle",
        "transformer-nuggets-mini/mini_snapshot.pickle",
    ]
    .iter()
    .enumerate()
    {
        let file = data.join(rel);
        let svg = chart(
            dir.path(),
            &format!("r{i}.svg"),
            &["flamegraph", file.to_str().unwrap()],
        );
        assert!(assert_flame_call_sites_distinct(&svg) >= 3, "{rel}");
    }
}
