//! The README's examples are real: every block of README.md and docs/*.md that starts with
//! `$ vramlens ...` and is not cut short (`...`) is what the command prints today.

mod common;

use assert_cmd::Command;
use common::root;
use std::path::PathBuf;

/// README.md, then docs/*.md by name: the documents whose examples are checked.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root().join("README.md"));
    docs
}

#[test]
fn readme_examples_match_the_output() {
    let outputs = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (k, doc) in documents().iter().enumerate() {
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        let text = std::fs::read_to_string(doc).unwrap();
        // A folder per document, so two documents may name the same output file.
        let folder = outputs.path().join(k.to_string());
        std::fs::create_dir(&folder).unwrap();
        checked += check_examples(&name, &text, &folder);
    }
    assert!(checked >= 3, "{checked} examples checked");
}

/// Runs the examples of one document; returns how many were checked.
fn check_examples(doc: &str, text: &str, outputs: &std::path::Path) -> usize {
    let mut checked = 0;
    for block in text.split("```").skip(1).step_by(2) {
        let body = block
            .trim_start_matches(|c: char| c != '\n')
            .trim_start_matches('\n');
        let Some(first) = body.lines().next() else {
            continue;
        };
        let Some(command) = first.strip_prefix("$ vramlens ") else {
            continue;
        };
        let elided = body.lines().any(|l| l.trim() == "...");
        // Examples on the real files run where `../shared/data` is (CI has it).
        if command.contains("../shared/data") && common::shared_data().is_none() {
            eprintln!("skipped (no ../shared/data): {doc}: vramlens {command}");
            continue;
        }
        if elided {
            // Cut short: every line shown is a line of the output, in that order.
            if command.contains(" -o ") {
                continue;
            }
            let out = Command::cargo_bin("vramlens")
                .unwrap()
                .current_dir(root())
                .args(command.split_whitespace())
                .output()
                .unwrap();
            let printed = String::from_utf8(out.stdout).unwrap();
            let mut lines = printed.lines();
            for shown in body.lines().skip(1).filter(|l| l.trim() != "...") {
                assert!(
                    lines.any(|l| l == shown),
                    "{doc} example `vramlens {command}`: the line {shown:?} is not printed (or not in this order):\n{printed}"
                );
            }
            checked += 1;
            continue;
        }
        let expected: String = body.lines().skip(1).map(|l| format!("{l}\n")).collect();
        // Files the example writes go to a temporary folder, not into the checkout.
        let mut args: Vec<String> = command.split_whitespace().map(str::to_string).collect();
        let mut written = Vec::new();
        for k in 1..args.len() {
            if matches!(args[k - 1].as_str(), "-o" | "--output") {
                written.push(outputs.join(&args[k]));
                args[k] = written[written.len() - 1].display().to_string();
            }
        }
        let out = Command::cargo_bin("vramlens")
            .unwrap()
            .current_dir(root())
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            expected,
            "{doc} example `vramlens {command}`"
        );
        for file in &written {
            assert!(
                file.exists(),
                "{doc} example `vramlens {command}` wrote no {file:?}"
            );
        }
        checked += 1;
    }
    checked
}

#[test]
fn the_first_screen_says_what_a_first_build_costs() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    // The first screen: the two commands, then what to expect of them the first time.
    let first: String = readme.lines().take(25).collect::<Vec<_>>().join(" ");
    assert!(first.contains("cargo run --release -- summary testdata/sample.pickle"));
    assert!(first.contains("cargo test "));
    // Measured both ways: on idle cores, and with other work on them.
    assert!(
        first.contains(
            "On a 2-core machine with nothing else running, the first `cargo run --release` took"
        ),
        "{first}"
    );
    assert!(first.contains("the first `cargo test` 4"), "{first}");
    assert!(
        first.contains("with other work on the same two cores"),
        "{first}"
    );
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The lines of a document outside its fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push(line);
        }
    }
    out
}

#[test]
fn links_between_the_documents_lead_to_a_file_and_heading() {
    let mut checked = 0;
    for doc in documents() {
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&doc).unwrap();
        for line in prose(&text) {
            for (i, _) in line.match_indices("](") {
                let rest = &line[i + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = &rest[..end];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, fragment) = match target.split_once('#') {
                    Some((p, f)) => (p, Some(f)),
                    None => (target, None),
                };
                let file = if path.is_empty() {
                    doc.clone()
                } else {
                    doc.parent().unwrap().join(path)
                };
                assert!(file.exists(), "{name}: link to {target}: no {file:?}");
                if let Some(fragment) = fragment {
                    let linked = std::fs::read_to_string(&file).unwrap();
                    let found = prose(&linked).iter().any(|l| {
                        l.starts_with('#') && anchor(l.trim_start_matches('#')) == fragment
                    });
                    assert!(found, "{name}: link to {target}: no such heading");
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "{checked} links checked");
}
