//! `vramlens report`: one self-contained HTML page. Its bytes hold no address and nothing
//! that loads, its figures are the ones computed independently for the fixtures, it is the
//! same for any number of threads, it never replaces a file without `--force`, and it
//! stays under 10 MB. The tests marked "needs chromium" load it in headless Chromium with
//! networking off and act on it (`#selftest` makes the page's script click, zoom and pick,
//! and write what happened into the page).

mod common;

use assert_cmd::Command;
use common::{require_shared_data, root};
use regex::Regex;
use std::path::{Path, PathBuf};

fn vramlens() -> Command {
    let mut c = Command::cargo_bin("vramlens").unwrap();
    c.current_dir(root()).env_remove("NO_COLOR");
    c
}

/// Writes the report of `args` to `out` and returns its text.
fn report(args: &[&str], out: &Path) -> String {
    vramlens()
        .arg("report")
        .args(args)
        .arg("-o")
        .arg(out)
        .assert()
        .success();
    std::fs::read_to_string(out).unwrap()
}

/// Every value of `data-NAME` in elements matching `tag` with `class`, in page order.
fn attrs(html: &str, open_tag: &str, name: &str) -> Vec<String> {
    let tag = Regex::new(&format!(r#"<{open_tag}[^>]*>"#)).unwrap();
    let attr = Regex::new(&format!(r#"\sdata-{name}="([^"]*)""#)).unwrap();
    tag.find_iter(html)
        .filter_map(|m| attr.captures(m.as_str()).map(|c| c[1].to_string()))
        .collect()
}

/// Text as the page writes it.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn expected(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(root().join(name)).unwrap()).unwrap()
}

/// What a page may not hold if it is to load nothing: addresses, and every element or
/// attribute that fetches.
fn assert_self_contained(html: &str) {
    let lower = html.to_ascii_lowercase();
    for banned in [
        "http://",
        "https://",
        "ftp://",
        "file://",
        "//cdn",
        "url(",
        "@import",
        "<link",
        "<img",
        "<iframe",
        "<object",
        "<embed",
        "<video",
        "<audio",
        "<source",
        " src=",
        "srcset=",
        "<base",
        "xlink:href",
        "fetch(",
        "xmlhttprequest",
        "websocket",
        "eventsource",
        "import(",
    ] {
        assert!(!lower.contains(banned), "the page holds {banned:?}");
    }
    // The only links go to places in the page.
    for href in Regex::new(r#"href="([^"]*)""#)
        .unwrap()
        .captures_iter(&lower)
    {
        assert!(href[1].starts_with('#'), "link to {:?}", &href[1]);
    }
    assert!(lower.contains(
        r#"<meta http-equiv="content-security-policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'">"#
    ));
    // One script, inline.
    assert_eq!(lower.matches("<script").count(), 1);
    assert!(lower.contains("<script>\n"));
}

#[test]
fn sample_report_is_self_contained_with_the_independent_figures() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.html");
    let html = report(&["testdata/sample.pickle"], &out);
    assert!(html.starts_with("<!DOCTYPE html>\n"));
    assert_self_contained(&html);
    assert!(html.len() < 10_000_000);
    // Figures of the device computed by scripts/expected.py (stdlib pickle).
    let e = &expected("testdata/sample.pickle.expected.json")["devices"][0];
    let file = |name: &str| attrs(&html, r#"section class="file""#, name);
    assert_eq!(file("path"), ["testdata/sample.pickle"]);
    assert_eq!(file("device"), ["0"]);
    for (attr, key) in [
        ("peak-requested-bytes", "peak_requested_bytes"),
        ("peak-allocated-bytes", "peak_allocated_bytes"),
        ("peak-reserved-bytes", "peak_reserved_bytes"),
        ("reserved-bytes", "reserved_bytes"),
        ("allocated-bytes", "allocated_bytes"),
        ("requested-bytes", "requested_bytes"),
    ] {
        assert_eq!(file(attr), [e[key].to_string()], "{attr}");
    }
    assert_eq!(file("events"), ["330"]);
    assert_eq!(file("ooms"), ["1"]);
    // The moments: the peak (event 71), the OOM (event 322), the end (event 329).
    let moment = |name: &str| attrs(&html, r#"div class="moment""#, name);
    assert_eq!(moment("kind"), ["peak", "oom", "end"]);
    assert_eq!(moment("event"), ["71", "322", "329"]);
    // At the peak the live requests add up to the peak; the table's rows to that total.
    assert_eq!(
        moment("total-bytes")[0],
        e["peak_requested_bytes"].to_string()
    );
    let peak = &html[html.find(r#"data-kind="peak""#).unwrap()..];
    // (the rows past the first twelve sit in a closed <details> under the table)
    let peak = &peak[..peak.find("<h5>Flame graph").unwrap()];
    assert!(peak.contains("<details class=\"more-rows\"><summary>"));
    let rows: u64 = attrs(peak, "tr data-name", "bytes")
        .iter()
        .map(|b| b.parse::<u64>().unwrap())
        .sum();
    assert_eq!(rows, 468296708);
    // Each chart of the other renderers is inline, without its XML prolog: the two
    // timelines (each with its plot's viewport inside), a flame graph and a segment map
    // per moment, and the what-if's chart.
    assert_eq!(html.matches("<svg ").count(), 2 * 2 + 3 * 2 + 1);
    assert_eq!(html.matches("<svg class=\"plot\"").count(), 2);
    assert!(!html.contains("<?xml"));
    let charts = |kind: &str| {
        Regex::new(&format!(
            r#"<div class="chart[^"]*" data-chart="{kind}"[^>]*>\n<svg "#
        ))
        .unwrap()
        .find_iter(&html)
        .count()
    };
    assert_eq!(charts("timeline"), 2);
    assert_eq!(charts("flame"), 3);
    assert_eq!(charts("segments"), 3);
    // The OOM verdict, from the independent figures of the OOM entry: the request
    // (6,593,446,400 bytes) is more than the reserved memory at the end plus what the
    // device had free, so it is one of capacity, naming both and their sum.
    let exp = expected("testdata/sample.pickle.expected.json");
    let dev = &exp["devices"][0];
    let oom = &dev["ooms"][0];
    let (request, free) = (
        oom["size"].as_u64().unwrap(),
        oom["device_free"].as_u64().unwrap(),
    );
    // Reserved at the OOM: the end's, less the 2 MiB small segment of the copy stream
    // that the prefetch after the OOM made (scripts/gen_fixtures.py, make_sample).
    let reserved = dev["reserved_bytes"].as_u64().unwrap() - (2 << 20);
    assert!(request > reserved + free);
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64);
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    let verdict = regex::Regex::new(r#"<p class="verdict">(capacity: [^<]*)</p>"#)
        .unwrap()
        .captures(&html)
        .expect("a capacity verdict")[1]
        .to_string();
    for figure in [
        format!("the request ({})", gib(request)),
        format!(
            "at most {} (reserved {} + free on the device {})",
            gib(reserved + free),
            mib(reserved),
            gib(free)
        ),
    ] {
        assert!(verdict.contains(&figure), "{figure:?} not in {verdict}");
    }
    assert!(html.contains("reserved             138.0 MiB"));
    // The page opens with the answer: the verdict (with a link to its evidence) before
    // the timeline, the OOM's figures before the tables of what was live.
    let at = |needle: &str| html.find(needle).unwrap_or_else(|| panic!("{needle}"));
    let answer = &html[at("id=\"f0-answer\"")..at("id=\"f0-timeline\"")];
    assert!(
        answer.contains(&format!(
            "<p class=\"verdict\"><b>verdict</b>: {verdict}</p>"
        )),
        "{answer}"
    );
    assert!(answer.contains("href=\"#f0-oom\""));
    assert!(at("<section id=\"f0-oom\">") < at("<section id=\"f0-live\">"));
    // Segment maps are closed, their totals in the line that opens them.
    assert_eq!(
        html.matches("<details class=\"segments\"><summary>")
            .count(),
        3
    );
    // The end's map: the final state's totals (scripts/expected.py).
    let b = |n: u64| vramlens::units::bytes(n);
    let (reserved, allocated) = (
        e["reserved_bytes"].as_u64().unwrap(),
        e["allocated_bytes"].as_u64().unwrap(),
    );
    assert!(html.contains(&format!(
        "<details class=\"segments\"><summary>{} segments: reserved {}, allocated {}, free {} (open to draw the map)</summary>",
        e["segments"],
        b(reserved),
        b(allocated),
        b(reserved - allocated)
    )));
    assert!(html.contains("Warnings while reading"));
}

/// A file of two devices: both are covered, the one with the OOM (device 2) first, each
/// with its own sections and headline figures (from scripts/expected.py).
#[test]
fn every_device_of_a_file_has_its_sections_the_oom_first() {
    let dir = tempfile::tempdir().unwrap();
    let html = report(
        &["testdata/multi_device.pickle"],
        &dir.path().join("r.html"),
    );
    assert_eq!(attrs(&html, r#"div class="device""#, "device"), ["2", "0"]);
    assert!(!html.contains("--device N"));
    assert!(
        !html.contains("--device "),
        "the page names no option to choose a device"
    );
    assert!(html.contains("device 2 (the device with the OOM, peak "));
    let e = &expected("testdata/multi_device.pickle.expected.json")["devices"];
    // The device picker: a button per device, the OOM's first, each with its peak.
    let mib = |b: u64| vramlens::units::bytes(b);
    let picker = Regex::new(r#"data-picker="f0-device">(.*?)</div>"#)
        .unwrap()
        .captures(&html)
        .expect("a device picker")[1]
        .to_string();
    let buttons: Vec<String> =
        Regex::new(r#"<button type="button" data-value="\d+"[^>]*>([^<]*)</button>"#)
            .unwrap()
            .captures_iter(&picker)
            .map(|c| c[1].to_string())
            .collect();
    assert_eq!(
        buttons,
        [
            format!(
                "device 2: an OOM, peak {}",
                mib(e[1]["peak_requested_bytes"].as_u64().unwrap())
            ),
            format!(
                "device 0: peak {}",
                mib(e[0]["peak_requested_bytes"].as_u64().unwrap())
            ),
        ]
    );
    let pane = |device: &str| {
        let start = html
            .find(&format!(r#"data-device="{device}">"#))
            .unwrap_or_else(|| panic!("pane of device {device}"));
        let rest = &html[start..];
        rest[..rest.find("<div class=\"device\"").unwrap_or(rest.len())].to_string()
    };
    // The second pane: its own answer section and a headline with its own peak.
    let zero = pane("0");
    assert!(zero.contains(r#"id="f0-d0-answer""#));
    assert!(zero.contains(&format!(
        r#"data-bytes="{}""#,
        e[0]["peak_requested_bytes"].as_u64().unwrap()
    )));
    let two = pane("2");
    assert!(two.contains(r#"id="f0-answer""#));
    assert!(two.contains("<b>verdict</b>"));
    // One id per element of the page.
    let ids = Regex::new(r#"\sid="([^"]+)""#).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for c in ids.captures_iter(&html) {
        assert!(seen.insert(c[1].to_string()), "id {} twice", &c[1]);
    }
}

#[test]
fn text_blocks_wrap_their_long_lines() {
    let dir = tempfile::tempdir().unwrap();
    let html = report(
        &["testdata/gpu/oom/oom_snapshot.pickle"],
        &dir.path().join("r.html"),
    );
    // Every rule for <pre> in the page's style wraps: no line is cut at the box's edge.
    let rules: Vec<String> = Regex::new(r"(?m)^pre \{([^}]*)\}")
        .unwrap()
        .captures_iter(&html)
        .map(|c| c[1].to_string())
        .collect();
    assert!(!rules.is_empty());
    assert!(
        rules.iter().all(|r| r.contains("white-space: pre-wrap")),
        "{rules:?}"
    );
    assert!(html.contains("<pre>"));
}

#[test]
fn same_bytes_for_one_thread_and_many() {
    let dir = tempfile::tempdir().unwrap();
    let files = ["testdata/sample.pickle", "testdata/multi_device.pickle"];
    let mut pages = Vec::new();
    for threads in ["1", "4"] {
        let out = dir.path().join(format!("r{threads}.html"));
        vramlens()
            .args(["--threads", threads, "report"])
            .args(files)
            .arg("-o")
            .arg(&out)
            .assert()
            .success();
        pages.push(std::fs::read(&out).unwrap());
    }
    assert!(pages[0] == pages[1], "the pages differ");
}

#[test]
fn an_existing_file_is_kept_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.html");
    std::fs::write(&out, "mine").unwrap();
    vramlens()
        .args(["report", "testdata/sample.pickle", "-o"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(format!(
            "vramlens: error: {}: already exists; use --force to overwrite it\n",
            out.display()
        ));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "mine");
    vramlens()
        .args(["report", "testdata/sample.pickle", "--force", "-o"])
        .arg(&out)
        .assert()
        .success();
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .starts_with("<!DOCTYPE html>")
    );
}

#[test]
fn the_report_is_named_html() {
    vramlens()
        .args(["report", "testdata/sample.pickle", "-o", "report.svg"])
        .assert()
        .code(2)
        .stderr(
            "vramlens: error: report.svg: vramlens writes the report as HTML, not .svg; name the file .html\n",
        );
}

#[test]
fn several_files_give_a_table_of_ranks_and_a_file_picker() {
    let dir = tempfile::tempdir().unwrap();
    let ranks = dir.path().join("ranks");
    std::fs::create_dir(&ranks).unwrap();
    for (i, f) in ["testdata/sample.pickle", "testdata/v2_2.pickle"]
        .iter()
        .enumerate()
    {
        std::fs::copy(root().join(f), ranks.join(format!("rank{i}.pickle"))).unwrap();
    }
    // Written into the folder: a second run does not take the report for a snapshot.
    let out = ranks.join("report.html");
    let first = report(&[ranks.to_str().unwrap()], &out);
    vramlens()
        .arg("report")
        .arg(&ranks)
        .arg("--force")
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    let html = std::fs::read_to_string(&out).unwrap();
    assert_eq!(html, first);
    assert_self_contained(&html);
    let paths = attrs(&html, r#"section class="file""#, "path");
    assert_eq!(paths.len(), 2);
    assert!(paths[0].ends_with("rank0.pickle") && paths[1].ends_with("rank1.pickle"));
    assert_eq!(attrs(&html, "tr data-show-file", "show-file"), ["0", "1"]);
    assert_eq!(html.matches("<option value=").count(), 2);
    // The rows carry each file's peak, as summary gives it.
    let peaks: Vec<String> = ["testdata/sample.pickle", "testdata/v2_2.pickle"]
        .iter()
        .map(|f| {
            expected(&format!("{f}.expected.json"))["devices"][0]["peak_requested_bytes"]
                .to_string()
        })
        .collect();
    assert_eq!(
        attrs(&html, "tr data-show-file", "peak-requested-bytes"),
        peaks
    );
    assert_eq!(
        attrs(&html, r#"section class="file""#, "peak-requested-bytes"),
        peaks
    );
}

#[test]
fn many_files_stay_under_ten_megabytes() {
    let dir = tempfile::tempdir().unwrap();
    let ranks = dir.path().join("ranks");
    std::fs::create_dir(&ranks).unwrap();
    let snapshot = "testdata/gpu/oom/snapshot.pickle";
    let n = 4;
    for i in 0..n {
        std::fs::copy(root().join(snapshot), ranks.join(format!("rank{i}.pickle"))).unwrap();
    }
    let one = report(&[snapshot], &dir.path().join("one.html"));
    let html = report(&[ranks.to_str().unwrap()], &dir.path().join("all.html"));
    // One file's report times the files would be over the bound; parts are left out.
    assert!(one.len() * n > 10_000_000, "{} bytes", one.len());
    assert!(!one.contains("is left out to keep this report under"));
    assert!(html.len() < 10_000_000, "{} bytes", html.len());
    assert_eq!(
        attrs(&html, r#"section class="file""#, "peak-requested-bytes").len(),
        n
    );
    let notes = html
        .matches("is left out to keep this report under")
        .count();
    assert!(notes >= n, "{notes} notes");
    // The largest parts go first; the timeline by call site and the tables stay.
    assert!(html.contains("Draw it with <code>vramlens segments "));
    assert_eq!(
        html.matches(concat!(
            r#"data-value="callsite">"#,
            "\n<h4 class=\"nojs-only\">By call site</h4>\n",
            r#"<div class="chart zoomable" data-chart="timeline">"#
        ))
        .count(),
        n
    );
    assert_self_contained(&html);
}

/// The report of our H200 OOM with its NVML readings and its OOM log.
fn oom_report_with_readings() -> String {
    let dir = tempfile::tempdir().unwrap();
    report(
        &[
            "testdata/gpu/oom/oom_snapshot.pickle",
            "--nvml",
            "testdata/gpu/oom/nvml.jsonl",
            "--log",
            "testdata/gpu/oom/oom.log",
        ],
        &dir.path().join("r.html"),
    )
}

#[test]
fn device_readings_add_the_ledger_and_the_device_line() {
    let html = oom_report_with_readings();
    assert_self_contained(&html);
    let ledger = String::from_utf8(
        vramlens()
            .args([
                "reconcile",
                "testdata/gpu/oom/oom_snapshot.pickle",
                "--nvml",
                "testdata/gpu/oom/nvml.jsonl",
            ])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    // The reconcile command's words, escaped for the page, less the OOM's ledger (the
    // OOM moment is also the end: one ledger of four lines), which the OOM section has.
    let lines: Vec<&str> = ledger.lines().collect();
    let at_oom = lines
        .iter()
        .position(|l| l.starts_with("  oom = end event 4409"))
        .unwrap();
    let without: Vec<&str> = lines[..at_oom]
        .iter()
        .chain(&lines[at_oom + 5..])
        .copied()
        .collect();
    assert!(
        html.contains(&format!("<pre>{}\n</pre>", escape(&without.join("\n")))),
        "{ledger}"
    );
    assert!(html.contains("The readings at the OOM are in <a href="));
    assert!(html.contains("device used (nvidia-smi / NVML)"));
    // The OOM message of the log gives the device's total to the verdicts.
    assert!(html.contains("(from the OOM message)"));
}

/// The cells of the OOM ledger's rows, by label.
fn ledger_rows(html: &str) -> Vec<(String, Vec<String>)> {
    let start = html.find("<table class=\"ledger\">").unwrap();
    let table = &html[start..start + html[start..].find("</table>").unwrap()];
    table
        .split("<tr><th>")
        .skip(1)
        .map(|row| {
            let label = row[..row.find("</th>").unwrap()].to_string();
            let cells = row
                .split("<td class=\"num\">")
                .skip(1)
                .map(|c| c[..c.find("</td>").unwrap()].to_string())
                .collect();
            (label, cells)
        })
        .collect()
}

#[test]
fn the_oom_has_one_ledger_of_the_message_and_the_reading_side_by_side() {
    let html = oom_report_with_readings();
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let gib2 = |b: f64| format!("{:.2} GiB", b / GIB);
    // The message: "total capacity of 139.80 GiB of which 31.12 MiB is free. Including
    // non-PyTorch memory, this process has 139.76 GiB memory in use".
    let total = (139.80 * GIB).round();
    let in_use = total - (31.12 * MIB).round();
    let process = (139.76 * GIB).round();
    // The snapshot's reserved bytes at the OOM (its last event), from scripts/expected.py.
    let expected = expected("testdata/gpu/oom/oom_snapshot.pickle.expected.json");
    let reserved = expected["devices"][0]["reserved_bytes"].as_f64().unwrap();
    // The NVML reading nearest before the OOM (the last one at or before 19:15:32.632911).
    let text = std::fs::read_to_string(root().join("testdata/gpu/oom/nvml.jsonl")).unwrap();
    let reading = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["time_us"].as_i64().unwrap() <= 1_795_979_732_632_911)
        .max_by_key(|r| r["time_us"].as_i64().unwrap())
        .unwrap();
    let r_total = reading["total_bytes"].as_f64().unwrap();
    let r_used = reading["used_bytes"].as_f64().unwrap();
    let r_process = reading["processes"][0]["used_bytes"].as_f64().unwrap();
    let rows = ledger_rows(&html);
    let row = |label: &str| {
        rows.iter()
            .find(|(l, _)| l.starts_with(label))
            .unwrap_or_else(|| panic!("{label}: {rows:?}"))
            .1
            .clone()
    };
    assert_eq!(row("device total"), [gib2(total), gib2(r_total)]);
    assert_eq!(row("in use on the device"), [gib2(in_use), gib2(r_used)]);
    assert_eq!(
        row("this process"),
        [gib2(process), format!("{} (pid 463)", gib2(r_process))]
    );
    assert_eq!(row("PyTorch reserved")[0], gib2(reserved));
    assert_eq!(
        row("this process outside")[0],
        format!("{:.1} MiB", (process - reserved) / MIB)
    );
    assert_eq!(
        row("other processes")[0],
        format!("{:.1} MiB", (in_use - process) / MIB)
    );
    assert_eq!(
        row("other processes")[1],
        format!("{:.1} MiB", (r_used - r_process) / MIB)
    );
    // Why they differ: the driver's reserve (the totals' difference), NVML counting it,
    // the reading's instant.
    assert!(html.contains(&escape(&format!(
        "The reading's total is {:.1} MiB more than the message's",
        (r_total - total) / MIB
    ))));
    assert!(html.contains(&escape("NVML's used figure counts the driver's reserve")));
    let skew_ms = (1_795_979_732_632_911 - reading["time_us"].as_i64().unwrap()) as f64 / 1000.0;
    assert!(
        html.contains(&format!("nvml reading, {skew_ms:.1} ms before the OOM")),
        "{skew_ms}"
    );
    // No second ledger of the OOM moment in the readings section.
    assert!(!html.contains("oom = end event 4409"));
}

#[test]
fn a_file_without_a_trace_has_its_final_state() {
    let dir = tempfile::tempdir().unwrap();
    let html = report(&["testdata/v1_13_list.pickle"], &dir.path().join("r.html"));
    assert_eq!(attrs(&html, r#"div class="moment""#, "kind"), ["end"]);
    assert!(html.contains("has no trace: nothing to draw, only the final state is known"));
    assert_eq!(html.matches("data-chart=\"segments\">\n<svg ").count(), 1);
    // The answer is the final state and who holds it (the sums from scripts/expected.py).
    let e = &expected("testdata/v1_13_list.pickle.expected.json")["devices"][0];
    let answer =
        &html[html.find("id=\"f0-answer\"").unwrap()..html.find("id=\"f0-timeline\"").unwrap()];
    assert!(
        answer.contains(&format!(
            "No OOM is recorded. Final state (no trace recorded): {} requested by ",
            vramlens::units::bytes(e["requested_bytes"].as_u64().unwrap())
        )),
        "{answer}"
    );
    assert!(answer.contains("<ul class=\"holders\">\n<li>"), "{answer}");
}

#[test]
fn a_file_without_a_device_keeps_its_summary_and_the_rows_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let html = report(
        &["testdata/empty.pickle", "testdata/sample.pickle"],
        &dir.path().join("r.html"),
    );
    assert_eq!(
        attrs(&html, r#"section class="file""#, "path"),
        ["testdata/empty.pickle", "testdata/sample.pickle"]
    );
    assert_eq!(attrs(&html, r#"section class="file""#, "device"), ["0"]);
    assert!(html.contains("no device: the file has no segment and no trace entry"));
    assert!(html.contains("no device has a segment or a trace entry"));
    // The one rank row is the sample's, and points at its section.
    assert_eq!(attrs(&html, "tr data-show-file", "show-file"), ["1"]);
    assert!(html.contains(r##"<a href="#f1">testdata/sample.pickle</a>"##));
}

#[test]
fn a_bad_file_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.html");
    vramlens()
        .args([
            "report",
            "testdata/sample.pickle",
            "testdata/bad/truncated.pickle",
            "-o",
        ])
        .arg(&out)
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicates::str::starts_with(
            "vramlens: error: testdata/bad/truncated.pickle: ",
        ));
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn stdout_says_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.html");
    let stdout = vramlens()
        .args(["report", "testdata/sample.pickle", "-o"])
        .arg(&out)
        .output()
        .unwrap()
        .stdout;
    let size = std::fs::metadata(&out).unwrap().len();
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        format!(
            "{}: {} (1 snapshot)\n",
            out.display(),
            vramlens::units::bytes(size)
        )
    );
}

/// Every real snapshot gives a page under 10 MB that loads nothing, whose headline
/// figures are the ones `scripts/expected.py --real` computed with Python's pickle.
#[test]
#[ignore = "needs ../shared/data"]
fn every_real_snapshot_gives_a_page_with_the_independent_figures() {
    let data = require_shared_data();
    let expected: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/data/real_expected.json")).unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (rel, e) in &expected {
        let path = data.join(rel);
        assert!(path.exists(), "{rel}: not in ../shared/data");
        let out = dir.path().join(format!("{checked}.html"));
        let html = report(&[path.to_str().unwrap()], &out);
        assert!(html.len() < 10_000_000, "{rel}: {} bytes", html.len());
        assert_self_contained(&html);
        let file = |name: &str| attrs(&html, r#"section class="file""#, name);
        let devices = e["devices"].as_array().unwrap();
        match file("device").first() {
            None => assert!(devices.is_empty(), "{rel}: no device shown"),
            Some(d) => {
                let d: i64 = d.parse().unwrap();
                let want = devices.iter().find(|x| x["device"] == d).unwrap();
                for (attr, key) in [
                    ("reserved-bytes", "reserved_bytes"),
                    ("allocated-bytes", "allocated_bytes"),
                    ("requested-bytes", "requested_bytes"),
                    ("peak-requested-bytes", "peak_requested_bytes"),
                    ("peak-allocated-bytes", "peak_allocated_bytes"),
                    ("peak-reserved-bytes", "peak_reserved_bytes"),
                ] {
                    let got = file(attr).first().cloned();
                    let want = (!want[key].is_null()).then(|| want[key].to_string());
                    assert_eq!(got, want, "{rel}: {attr}");
                }
                let ooms = want["ooms"].as_array().unwrap().len();
                assert_eq!(file("ooms"), [ooms.to_string()], "{rel}");
            }
        }
        checked += 1;
    }
    assert!(checked > 0);
}

// --- In a browser -----------------------------------------------------------------

fn chromium() -> &'static str {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chromium not found in /usr/bin: this test needs it (apt-get install chromium)")
}

/// Chromium's flags: headless, no network (names resolve nowhere, no proxy lookup), no
/// background traffic, a fresh profile.
fn browser(profile: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(chromium());
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--no-first-run",
        "--no-proxy-server",
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// Loads the page with `#selftest`, returns what its script recorded and the console
/// lines Chromium printed.
fn selftest(page: &Path, profile: &Path) -> (serde_json::Value, Vec<String>) {
    let out = browser(profile)
        .args([
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1400,1000",
            "--virtual-time-budget=10000",
            "--dump-dom",
        ])
        .arg(format!("file://{}#selftest", page.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "chromium failed");
    let dom = String::from_utf8(out.stdout).unwrap();
    let console: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    let result = Regex::new(r#"(?s)<pre id="selftest-result">(.*?)</pre>"#)
        .unwrap()
        .captures(&dom)
        .unwrap_or_else(|| panic!("no self-test result in the page; console: {console:?}"))[1]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    (serde_json::from_str(&result).unwrap(), console)
}

fn view_box(v: &serde_json::Value) -> Vec<f64> {
    v.as_str()
        .unwrap()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect()
}

#[test]
#[ignore = "needs chromium"]
fn sample_report_works_in_chromium_without_a_network() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("r.html");
    let html = report(&["testdata/sample.pickle"], &page);
    let (r, console) = selftest(&page, &dir.path().join("profile"));
    assert!(console.is_empty(), "console: {console:?}");
    assert_eq!(r["errors"], serde_json::json!([]), "{r}");
    // Nothing was fetched, and nothing tried to be.
    assert_eq!(r["violations"], serde_json::json!([]), "{r}");
    assert_eq!(r["resources"], 0, "{r}");
    let s = &r["steps"];
    // The wheel with Ctrl zooms the time axis in around the pointer: the plot shows a
    // part of its range, the page's picture, the y axis and the legend stay; the x
    // axis's ticks are drawn anew inside the part shown. A drag pans; reset restores.
    let z = &s["zoom"];
    let (before, zoomed, panned) = (&z["before"], &z["zoomed"], &z["panned"]);
    assert_eq!(before["svg"], "0 0 1280 640");
    assert_eq!(view_box(&before["plot"]), [80.0, 0.0, 870.0, 640.0]);
    assert_eq!(zoomed["svg"], before["svg"]);
    let zb = view_box(&zoomed["plot"]);
    assert!(
        zb[2] < 0.6 * 870.0 && zb[1] == 0.0 && zb[3] == 640.0,
        "{zb:?}"
    );
    assert_eq!(zoomed["yLabels"], before["yLabels"]);
    assert!(!before["yLabels"].as_array().unwrap().is_empty());
    assert_eq!(zoomed["legend"], before["legend"]);
    assert_ne!(zoomed["ticks"], before["ticks"]);
    // The axis's range, as the chart wrote it.
    let attr = |name: &str| -> f64 {
        Regex::new(&format!(r#"class="x-axis" [^>]*data-{name}="([^"]+)""#))
            .unwrap()
            .captures(&html)
            .unwrap()[1]
            .parse()
            .unwrap()
    };
    let (x_min, x_max) = (attr("x-min"), attr("x-max"));
    let range: Vec<f64> = zoomed["range"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let (lo, hi) = (
        x_min + range[0] * (x_max - x_min),
        x_min + range[1] * (x_max - x_min),
    );
    let ticks: Vec<f64> = zoomed["ticks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t.as_str()
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(ticks.len() >= 3, "{ticks:?}");
    assert!(
        ticks.iter().all(|&t| t >= lo - 1e-6 && t <= hi + 1e-6),
        "{ticks:?} in {lo}..{hi}"
    );
    // The plot shows the same part as the range says.
    assert!(
        (zb[0] - (80.0 + range[0] * 870.0)).abs() < 0.01,
        "{zb:?} {range:?}"
    );
    let pr = &panned["range"];
    assert!(pr[0].as_f64().unwrap() < range[0], "{pr} {range:?}");
    assert!(
        ((pr[1].as_f64().unwrap() - pr[0].as_f64().unwrap()) - (range[1] - range[0])).abs() < 1e-9
    );
    assert_eq!(z["reset"]["plot"], before["plot"]);
    assert_eq!(z["reset"]["ticks"], before["ticks"]);
    // A wheel without a modifier leaves the chart and scrolls the page.
    assert_eq!(s["zoom"]["plainWheelScrolls"], true, "{s}");
    // The largest band is the call site with the most at the peak (196.5 MiB at
    // model.py:192); its panel gives its size and whole stack.
    assert_eq!(
        s["band"]["label"],
        "/home/alice/nanogpt/model.py:192:forward"
    );
    let panel = &s["band"]["panel"];
    assert_eq!(panel["open"], true);
    assert_eq!(panel["title"], "nanogpt/model.py:192 in forward");
    let body = panel["body"].as_str().unwrap();
    assert!(body.contains(&format!("({} bytes)", s["band"]["bytes"].as_str().unwrap())));
    // The tooltip's first frames, then the whole stack, outermost frame last.
    let whole = body
        .split_once("the whole stack of its largest allocation, innermost first:\n")
        .unwrap_or_else(|| panic!("no whole stack: {body}"))
        .1;
    assert_eq!(
        whole.lines().next(),
        Some("/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py:3494:cross_entropy")
    );
    assert_eq!(
        whole.lines().last(),
        Some("/home/alice/nanogpt/train.py:251:<module>")
    );
    // A flame box of the top row: the frames under it, root first.
    let flame = s["flame"]["panel"]["body"].as_str().unwrap();
    let under: Vec<&str> = flame
        .split_once("outermost first:\n")
        .unwrap()
        .1
        .lines()
        .collect();
    assert_eq!(under[0], "all");
    assert_eq!(under[1], "/home/alice/nanogpt/train.py:251:<module>");
    assert_eq!(s["flame"]["panel"]["title"], s["flame"]["box"]);
    // The first row of the table at the peak, with its stack.
    assert_eq!(
        s["row"]["panel"]["title"],
        "nanogpt/model.py:192 in forward"
    );
    assert!(
        s["row"]["panel"]["body"]
            .as_str()
            .unwrap()
            .starts_with("196.5 MiB requested (206045188 bytes) in 2 allocations")
    );
    // The pickers show one moment and one grouping at a time.
    assert_eq!(s["moment"]["before"], serde_json::json!(["0"]));
    assert_eq!(s["moment"]["shown"], serde_json::json!(["2"]));
    assert_eq!(s["view"]["before"], serde_json::json!(["callsite"]));
    assert_eq!(s["view"]["shown"], serde_json::json!(["category"]));
    // The page as loaded holds the independent peak.
    let exp = expected("testdata/sample.pickle.expected.json");
    assert_eq!(
        attrs(&html, r#"section class="file""#, "peak-requested-bytes"),
        [exp["devices"][0]["peak_requested_bytes"].to_string()]
    );
}

#[test]
#[ignore = "needs chromium"]
fn the_file_picker_switches_files_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("r.html");
    report(&["testdata/sample.pickle", "testdata/v2_2.pickle"], &page);
    let (r, console) = selftest(&page, &dir.path().join("profile"));
    assert!(console.is_empty(), "console: {console:?}");
    assert_eq!(r["errors"], serde_json::json!([]), "{r}");
    assert_eq!(r["files"], 2);
    assert_eq!(r["visibleFiles"], serde_json::json!(["0"]));
    assert_eq!(r["steps"]["file"]["shown"], serde_json::json!(["1"]));
    // The link of the first row of the table of ranks shows the first file again.
    assert_eq!(r["steps"]["rankLink"]["shown"], serde_json::json!(["0"]));
    assert_eq!(r["steps"]["rankLink"]["picker"], "0");
    assert_eq!(r["steps"]["rankLink"]["hash"], "#f0");
}

/// Screenshots of the page in Chromium, to look at (kept when VRAMLENS_SCREENSHOTS names
/// a folder).
fn screenshot(page: &Path, png: &Path, profile: &Path) {
    let status = browser(profile)
        .args(["--hide-scrollbars", "--window-size=1400,2400"])
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()))
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let decoder = png::Decoder::new(std::fs::File::open(png).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1400, 2400));
    let channels = info.color_type.samples();
    let colored = buf[..info.buffer_size()]
        .chunks(channels)
        .filter(|p| {
            let (r, g, b) = (p[0] as i32, p[1] as i32, p[2] as i32);
            (r - g).abs() > 40 || (g - b).abs() > 40 || (r - b).abs() > 40
        })
        .count();
    assert!(colored > 50_000, "only {colored} coloured pixels");
}

#[test]
#[ignore = "needs chromium and ../shared/data"]
fn a_real_oom_report_works_in_chromium() {
    let data = require_shared_data();
    let dir = tempfile::tempdir().unwrap();
    let keep = std::env::var_os("VRAMLENS_SCREENSHOTS").map(PathBuf::from);
    let shots = keep.clone().unwrap_or_else(|| dir.path().to_path_buf());
    for (name, files) in [
        (
            "ccl-bench",
            vec![data.join("ccl-bench-torchtitan-fsdp-oom")],
        ),
        (
            "expandable",
            vec![data.join("code-location-expandable-oom/memory_snapshot.pickle")],
        ),
    ] {
        let page = dir.path().join(format!("{name}.html"));
        let args: Vec<&str> = files.iter().map(|f| f.to_str().unwrap()).collect();
        let html = report(&args, &page);
        assert!(html.len() < 10_000_000);
        assert_self_contained(&html);
        let (r, console) = selftest(&page, &dir.path().join(format!("profile-{name}")));
        assert!(console.is_empty(), "{name}: console: {console:?}");
        assert_eq!(r["errors"], serde_json::json!([]), "{name}: {r}");
        assert_eq!(r["violations"], serde_json::json!([]), "{name}: {r}");
        assert_eq!(r["resources"], 0, "{name}: {r}");
        assert_eq!(r["steps"]["band"]["panel"]["open"], true, "{name}: {r}");
        let body = r["steps"]["band"]["panel"]["body"].as_str().unwrap();
        assert!(
            body.contains("the whole stack of its largest allocation, innermost first:\n"),
            "{name}: {body}"
        );
        // Each file's OOM is a moment.
        assert!(attrs(&html, r#"div class="moment""#, "kind").contains(&"oom".to_string()));
        // Every device is covered, the one with the OOM first, and the page never sends
        // its reader to a command-line option to see another.
        assert!(!html.contains("--device N"), "{name}");
        if name == "expandable" {
            assert_eq!(
                attrs(&html, r#"div class="device""#, "device"),
                ["1", "0", "2"]
            );
            let d = &r["steps"]["device"];
            assert_eq!(d["before"], serde_json::json!(["0"]), "{r}");
            assert_eq!(d["shown"], serde_json::json!(["1"]), "{r}");
            assert_eq!(d["device"], "0", "{r}");
            assert!(d["charts"].as_u64().unwrap() > 0, "{r}");
        }
        screenshot(
            &page,
            &shots.join(format!("{name}.png")),
            &dir.path().join(format!("shot-{name}")),
        );
    }
}

/// The report's budget is `budget`'s: a run that leaks says so first and fits no device
/// (our H200 recording, testdata/README.md gpu/oom/, grows in `leaky_eval` step after
/// step), and a run that ran out of memory is budgeted at its first OOM; the same job
/// without the leak (gpu/ok/) names none and is budgeted at its peak.
#[test]
fn the_budget_section_names_a_leak_and_budgets_an_oom_at_the_oom() {
    let dir = tempfile::tempdir().unwrap();
    let section = |file: &str, name: &str| {
        let out = dir.path().join(name);
        let html = report(&[file], &out);
        let start = html.find("-budget\">\n<h3>").expect("a budget section");
        let end = start + html[start..].find("</section>").unwrap();
        html[start..end].to_string()
    };
    let leaking = section("testdata/gpu/oom/oom_snapshot.pickle", "leak.html");
    assert!(
        leaking.contains("<h3>Budget at the first OOM</h3>"),
        "{leaking}"
    );
    assert!(
        leaking.contains(
            "leaks (an inference from the trace&#39;s samples): &lt;string&gt;:31 in leaky_eval"
        ),
        "{leaking}"
    );
    assert_eq!(
        leaking.matches("does not fit: the run leaks").count(),
        6,
        "every GPU of the list: {leaking}"
    );
    let ok = section("testdata/gpu/ok/snapshot.pickle", "ok.html");
    assert!(ok.contains("<h3>Budget at the peak</h3>"), "{ok}");
    assert!(!ok.contains("leaks (an inference"), "{ok}");
    assert!(!ok.contains("the run leaks"), "{ok}");
}

/// The lines of a budget text that fit it on a GPU, and its outside-the-allocator line.
fn budget_answer(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            let t = l.trim_start();
            ["RTX 4090", "L40S", "A100", "H100", "H200", "B200"]
                .iter()
                .any(|g| t.starts_with(g))
                || t.starts_with("outside the allocator")
                || t.starts_with("needs ")
        })
        .map(|l| l.trim().to_string())
        .collect()
}

/// The report's budget is `budget`'s: the same run, the same memory outside the allocator
/// (from the same readings and log), and the same replays at each GPU's capacity.
fn report_budget_is_budget(args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let page = report(args, &dir.path().join("r.html"));
    let start = page
        .find("<section id=\"")
        .and_then(|_| {
            Regex::new(r#"<section id="[^"]*-budget">"#)
                .unwrap()
                .find(&page)
        })
        .expect("a budget section")
        .end();
    let section = Some(&page[start..])
        .and_then(|s| s.split("<pre>").nth(1))
        .and_then(|s| s.split("</pre>").next())
        .expect("a budget section");
    let section = section
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'");
    let out = vramlens().arg("budget").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let budget = String::from_utf8(out.stdout).unwrap();
    let (ours, theirs) = (budget_answer(&section), budget_answer(&budget));
    assert!(ours.len() >= 8, "{ours:?}");
    assert_eq!(ours, theirs, "{args:?}");
}

#[test]
fn the_reports_budget_is_budgets_with_readings_and_a_log() {
    report_budget_is_budget(&[
        "testdata/gpu/oom/oom_snapshot.pickle",
        "--nvml",
        "testdata/gpu/oom/nvml.jsonl",
        "--log",
        "testdata/gpu/oom/oom.log",
    ]);
    report_budget_is_budget(&["testdata/gpu/ok/snapshot.pickle"]);
}

#[test]
#[ignore = "needs ../shared/data"]
fn the_reports_budget_is_budgets_on_a_real_oom() {
    let data = require_shared_data();
    let f = data.join("ccl-bench-torchtitan-fsdp-oom/rank0_memory_snapshot.pickle");
    report_budget_is_budget(&[f.to_str().unwrap()]);
}

/// The legend swatches of a page's charts (timeline and zoom: 18x10, segments: 14x10):
/// (name, fill).
fn legend_swatches(html: &str) -> Vec<(String, String)> {
    let re = Regex::new(
        r#"<rect [^>]*width="(?:18|14)" height="10" fill="([^"]+)"[^>]*><title>([^<]*)</title></rect>"#,
    )
    .unwrap();
    re.captures_iter(html)
        .map(|c| (c[2].to_string(), c[1].to_string()))
        .collect()
}

/// Within one device's page, a name has one colour in every chart, and no two names
/// share a colour.
fn one_colour_per_name(args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let page = report(args, &dir.path().join("r.html"));
    let swatches = legend_swatches(&page);
    assert!(swatches.len() >= 3, "{args:?}: {swatches:?}");
    let mut by_name = std::collections::BTreeMap::new();
    let mut by_colour = std::collections::BTreeMap::new();
    for (name, fill) in &swatches {
        if name.starts_with('(') {
            continue; // the merged rest and other shared greys
        }
        let was = by_name.insert(name.clone(), fill.clone());
        assert!(
            was.is_none() || was.as_ref() == Some(fill),
            "{args:?}: {name} is {was:?} and {fill}"
        );
        let other = by_colour.insert(fill.clone(), name.clone());
        assert!(
            other.is_none() || other.as_ref() == Some(name),
            "{args:?}: {fill} is both {other:?} and {name}"
        );
    }
}

#[test]
fn no_two_call_sites_share_a_colour_in_a_report() {
    one_colour_per_name(&["testdata/gpu/oom/oom_snapshot.pickle"]);
    one_colour_per_name(&["testdata/sample.pickle"]);
}

#[test]
#[ignore = "needs ../shared/data"]
fn no_two_call_sites_share_a_colour_in_a_real_oom_report() {
    let data = require_shared_data();
    for f in [
        "ccl-bench-torchtitan-fsdp-oom/rank0_memory_snapshot.pickle",
        "ccl-bench-torchtitan-fsdp-oom/rank1_memory_snapshot.pickle",
    ] {
        one_colour_per_name(&[data.join(f).to_str().unwrap()]);
    }
    let f = data.join("code-location-expandable-oom/memory_snapshot.pickle");
    one_colour_per_name(&[f.to_str().unwrap(), "--device", "1"]);
}
