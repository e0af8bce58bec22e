//! Glue for each subcommand: read inputs, run an analysis, render.

pub mod budget;
pub mod charts;
pub mod diff;
pub mod export;
pub mod oom;
pub mod output;
pub mod reconcile;
pub mod redact;
pub mod report;
pub mod session;
pub mod simulate;
pub mod summary;
pub mod top;

use anyhow::{Context, Result, anyhow};

/// Set by `--redact`: every snapshot read is redacted before any analysis.
static REDACT: std::sync::OnceLock<vramlens::redact::RedactOptions> = std::sync::OnceLock::new();

/// Makes [`read_snapshot`] redact what it reads (`--redact`).
pub fn redact_reads() {
    let _ = REDACT.set(vramlens::redact::RedactOptions::default());
}

/// Is `--redact` on?
pub fn redacting() -> bool {
    REDACT.get().is_some()
}

/// The paths of inputs (snapshots, traces, logs, folders) as outputs record them: as
/// given, or with `--redact` made absolute and cut and cleaned together by the redaction
/// rules ([`vramlens::redact::input_paths`]), so no home folder or user name is shown.
pub fn recorded_paths(paths: &[&std::path::Path]) -> Vec<String> {
    let Some(options) = REDACT.get() else {
        return paths.iter().map(|p| p.display().to_string()).collect();
    };
    let absolute: Vec<String> = paths
        .iter()
        .map(|p| {
            if p.as_os_str() == "-" {
                return "-".to_string();
            }
            std::path::absolute(p)
                .unwrap_or_else(|_| p.to_path_buf())
                .display()
                .to_string()
        })
        .collect();
    vramlens::redact::input_paths(&absolute, options)
}

/// One input's path as outputs record it ([`recorded_paths`]).
pub fn recorded_path(path: &std::path::Path) -> String {
    recorded_paths(&[path]).remove(0)
}

/// Reads a snapshot for a command, redacted when `--redact` was given (its strings and
/// the path it is named by).
pub fn read_snapshot(
    path: &std::path::Path,
    options: vramlens::input::ReadOptions,
) -> Result<(vramlens::model::Snapshot, vramlens::input::SourceInfo), vramlens::input::ReadError> {
    let (mut snap, mut info) = vramlens::input::read_snapshot(path, options)?;
    if let Some(options) = REDACT.get() {
        vramlens::redact::apply(&mut snap, options);
        info.path = recorded_path(path);
    }
    Ok((snap, info))
}
/// [`read_snapshot`] of bytes already read (standard input, a pipe), named `label`.
pub fn read_snapshot_bytes(
    bytes: &[u8],
    label: &str,
) -> Result<(vramlens::model::Snapshot, vramlens::input::SourceInfo), vramlens::input::ReadError> {
    let (mut snap, mut info) = vramlens::input::read_snapshot_bytes(bytes).map_err(|error| {
        vramlens::input::ReadError {
            path: if label == "-" {
                "standard input".into()
            } else {
                vramlens::units::shown(label).into_owned()
            },
            error,
        }
    })?;
    info.path = label.to_string();
    if let Some(options) = REDACT.get() {
        vramlens::redact::apply(&mut snap, options);
        info.path = recorded_path(std::path::Path::new(label));
    }
    Ok((snap, info))
}
use output::{check_output, write_new_file};

/// A path as error messages name it: control characters (a newline in a file name) shown
/// as text (`\n`), so the message stays one line and still names the file exactly.
pub(crate) fn shown_path(path: &std::path::Path) -> String {
    vramlens::units::shown(&path.display().to_string()).into_owned()
}

/// Reads and merges device logs line by line, keeping only the rows inside `keep`, in a
/// bounded series when there are many (finer in the `focus` ranges; see
/// [`vramlens::devlog::LogLimits`]).
fn read_device_logs_in(
    paths: &[std::path::PathBuf],
    utc_offset_minutes: i32,
    keep: Option<vramlens::devlog::TimeRange>,
    focus: &[vramlens::devlog::TimeRange],
) -> Result<vramlens::devlog::DeviceLog> {
    let options = vramlens::devlog::DeviceLogOptions {
        clock: vramlens::devlog::ClockOptions { utc_offset_minutes },
        keep,
        limits: Default::default(),
    };
    let mut logs = Vec::new();
    for path in paths {
        let file = vramlens::input::open_side_input(path)
            .with_context(|| format!("cannot read {}", shown_path(path)))?;
        logs.push(
            vramlens::devlog::read_device_log_near(file, options, focus)
                .with_context(|| format!("failed to read device log {}", shown_path(path)))?,
        );
    }
    Ok(vramlens::devlog::merge(logs))
}

/// Several errors, one line each on stderr (e.g. every bad file of `summary`).
#[derive(Debug)]
pub struct Failures(pub Vec<anyhow::Error>);

impl std::fmt::Display for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e:#}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failures {}

/// Attribution options from the command line (patterns compiled, rules file read).
fn attribution_options(
    a: &crate::cli::AttributionArgs,
) -> Result<vramlens::analysis::kinds::attribution::AttributionOptions> {
    let pattern = |flag: &str, p: &Option<String>| -> Result<Option<regex::Regex>> {
        p.as_deref()
            .map(|p| regex::Regex::new(p).map_err(|e| anyhow!("--{flag} {p:?}: {e}")))
            .transpose()
    };
    let rules = match &a.rules {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read rules file {}", shown_path(path)))?;
            vramlens::analysis::kinds::attribution::parse_rules(&text)
                .map_err(|e| anyhow!("{}: {e}", shown_path(path)))?
        }
        None => Vec::new(),
    };
    Ok(vramlens::analysis::kinds::attribution::AttributionOptions {
        keep: pattern("keep", &a.keep)?,
        skip: pattern("skip", &a.skip)?,
        rules,
        ..Default::default()
    })
}

/// The files named: each folder stands for the snapshot files in it (`*.pickle`, `*.pkl`,
/// `*.pickle.gz`, `*.json` and `*.json.gz` (profiler traces too), `*.raw.gz`
/// (`export_memory_timeline`), `*.html`, and files with no extension whose content starts as
/// a pickle or a gzip stream does), by name; other paths as given.
fn expand_inputs(paths: &[std::path::PathBuf]) -> Result<Vec<std::path::PathBuf>> {
    let inputs = expand_inputs_listing(paths)?;
    for why in &inputs.empty_folders {
        eprintln!("vramlens: skipped {why}");
    }
    Ok(inputs.files)
}

/// The inputs a command line names, folders expanded.
struct Inputs {
    /// The files to read, in order.
    files: Vec<std::path::PathBuf>,
    /// Files of the folders that are not a snapshot by name or content.
    left_out: Vec<std::path::PathBuf>,
    /// Among several inputs, the folders with no snapshot file, each with why (shown).
    empty_folders: Vec<String>,
}

/// File names a folder's snapshot files have.
const SNAPSHOT_EXTENSIONS: [&str; 8] = [
    ".pickle",
    ".pkl",
    ".pickle.gz",
    ".pkl.gz",
    ".json",
    ".json.gz",
    ".raw.gz",
    ".html",
];

/// A file with no extension that starts as a pickle (protocol 2 and later) or a gzip
/// stream: how `torch.cuda.memory._dump_snapshot` output looks under any name.
fn looks_like_snapshot(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && (head[0] == 0x80 || head == [0x1f, 0x8b])
}

/// As [`expand_inputs`], with the files of the folders that were left out (not hidden,
/// not a snapshot by name or content) and the folders passed over, for the caller to say.
fn expand_inputs_listing(paths: &[std::path::PathBuf]) -> Result<Inputs> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let mut empty_folders = Vec::new();
    for p in paths {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let mut entries: Vec<std::path::PathBuf> = std::fs::read_dir(p)
            .with_context(|| format!("cannot read folder {}", shown_path(p)))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| {
                f.is_file()
                    && !f
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        entries.sort();
        let mut files = Vec::new();
        for f in entries {
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let by_name = SNAPSHOT_EXTENSIONS.iter().any(|ext| name.ends_with(ext));
            if by_name || (!name.contains('.') && looks_like_snapshot(&f)) {
                files.push(f);
            } else {
                skipped.push(f);
            }
        }
        if files.is_empty() {
            // Folders are read one level deep; say so when the snapshots sit below.
            let below = std::fs::read_dir(p)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|d| d.is_dir() && expand_inputs(std::slice::from_ref(d)).is_ok())
                .count();
            let hint = match below {
                0 => String::new(),
                n => format!(
                    "; {n} of its subfolders {} some (folders are read one level deep): name them, e.g. {}",
                    if n == 1 { "has" } else { "have" },
                    vramlens::units::shown(&recorded_path(&p.join("*/")))
                ),
            };
            let why = format!(
                "{}: a folder with no snapshot file (*.pickle, *.pkl, *.pickle.gz, *.json, *.json.gz, *.raw.gz, *.html, or a pickle with no extension){hint}",
                vramlens::units::shown(&recorded_path(p))
            );
            // Among several inputs (`DIR/*/`), an empty folder is passed over, said so.
            if paths.len() > 1 {
                empty_folders.push(why);
                continue;
            }
            anyhow::bail!(why);
        }
        out.extend(files);
    }
    Ok(Inputs {
        files: out,
        left_out: skipped,
        empty_folders,
    })
}

/// A size option (`--device-total`, `--max-peak`): a byte count, or a number with a unit
/// (see [`vramlens::units::parse_size_arg`]).
pub fn size_option(flag: &str, value: Option<&str>) -> Result<Option<u64>> {
    value
        .map(|s| vramlens::units::parse_size_arg(s).map_err(|e| anyhow!("{flag}: {e}")))
        .transpose()
}

/// `--trace FILE`: a profiler trace (Kineto/Chrome JSON or an export_memory_timeline
/// file) read as a snapshot.
pub fn read_profile_trace(
    path: Option<&std::path::Path>,
) -> Result<Option<vramlens::devlog::Converted>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let file = vramlens::input::open_side_input(path)
        .with_context(|| format!("cannot read {}", shown_path(path)))?;
    vramlens::devlog::read_profile_snapshot(file)
        .map(Some)
        .with_context(|| format!("failed to read trace {}", shown_path(path)))
}
