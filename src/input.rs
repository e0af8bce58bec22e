//! Opening inputs: file checks, gzip and format sniffing, then the pickle or JSON path
//! into a [`Snapshot`].
//!
//! Formats are told by content, never by file name. Files that vramlens recognises but
//! that are not snapshots (Chrome/Kineto traces, memory-timeline exports, nvidia-smi CSV)
//! are named as such in the error.

use crate::model::{DecodeError, Snapshot, SnapshotBuilder, decode_json};
use crate::pickle;
use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

/// Progress is shown for inputs larger than this, on terminals only.
const PROGRESS_THRESHOLD: u64 = 100 * 1024 * 1024;

/// Why an input could not be read. The message names the place in the file.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Pickle(#[from] pickle::Error),
    #[error("{0}")]
    Decode(#[from] DecodeError),
    #[error("{0}")]
    WrongKind(String),
    /// A profiler trace or memory timeline that could not be read.
    #[error("{0}")]
    Profile(#[from] crate::devlog::DevlogError),
}

/// A failure to read one file, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {error}")]
pub struct ReadError {
    pub path: String,
    pub error: InputError,
}

/// What the input was, as reported beside the analysis.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
pub struct SourceInfo {
    /// The path as given.
    pub path: String,
    pub size_bytes: u64,
    /// "pickle", "json" or "html" (a `_memory_viz` page with the snapshot inside); for
    /// profiler outputs converted into a snapshot, "kineto_trace" or "memory_timeline".
    pub format: &'static str,
    pub gzip: bool,
    pub pickle_protocol: Option<u8>,
}

/// Reading options.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Show a progress line on stderr for large files (when stderr is a terminal).
    pub progress: bool,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Pickle,
    Json,
    /// A page written by `torch.cuda._memory_viz trace_plot/segment_plot`.
    Html,
}

/// Counts bytes read from the file (compressed bytes for gzip) for the progress line.
struct Counting<R> {
    inner: R,
    read: u64,
    progress: Option<Progress>,
}

struct Progress {
    label: String,
    total: u64,
    shown_percent: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if let Some(p) = &mut self.progress {
            let percent = (self.read * 100)
                .checked_div(p.total)
                .unwrap_or(100)
                .min(100);
            if percent != p.shown_percent {
                p.shown_percent = percent;
                let mut err = io::stderr().lock();
                let _ = write!(err, "\r{} {percent:3}%", p.label);
                if percent == 100 {
                    let _ = write!(err, "\r{}\r", " ".repeat(p.label.len() + 5));
                }
                let _ = err.flush();
            }
        }
        Ok(n)
    }
}

fn io_error(e: io::Error) -> InputError {
    InputError::Io(match e.kind() {
        io::ErrorKind::NotFound => "no such file".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    })
}

struct Opened {
    path: PathBuf,
    size: u64,
    gzip: bool,
    progress: bool,
}

impl Opened {
    /// A fresh stream over the (decompressed) content; each pass opens its own.
    /// `label` names the pass in the progress line; None reads without one.
    fn stream(&self, label: Option<&str>) -> Result<Box<dyn Read>, InputError> {
        let file = File::open(&self.path).map_err(io_error)?;
        let show = self.progress && self.size > PROGRESS_THRESHOLD;
        let progress = label.filter(|_| show).map(|label| Progress {
            label: format!("{label} {}", self.path.display()),
            total: self.size,
            shown_percent: u64::MAX,
        });
        let counting = Counting {
            inner: file,
            read: 0,
            progress,
        };
        Ok(if self.gzip {
            Box::new(MultiGzDecoder::new(io::BufReader::with_capacity(
                1 << 20,
                counting,
            )))
        } else {
            Box::new(counting)
        })
    }
}

/// Names inputs that are not snapshots, from the first bytes of the content.
fn sniff(head: &[u8]) -> Result<Kind, InputError> {
    let text = String::from_utf8_lossy(&head[..head.len().min(4096)]);
    let trimmed = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        return Ok(Kind::Json);
    }
    let first_line = trimmed.lines().next().unwrap_or("");
    if first_line.contains("memory.used") || first_line.starts_with("timestamp") {
        return Err(InputError::WrongKind(
            "this is an nvidia-smi CSV log, not a memory snapshot; expected a PyTorch memory snapshot pickle (device-level logs are read by `vramlens reconcile --nvml`, not yet available in this version)".into(),
        ));
    }
    if trimmed.starts_with("<!DOCTYPE") || trimmed.starts_with("<html") {
        return Ok(Kind::Html);
    }
    match head.first() {
        // PROTO (protocols 2-5) or the opcodes a protocol 0/1 pickle can start with.
        Some(
            0x80 | b'(' | b']' | b'}' | b')' | b'N' | b'K' | b'J' | b'M' | b'X' | b'V' | b'S'
            | b'I' | b'L' | b'F' | b'G' | b'c' | b'U' | b'T',
        ) => Ok(Kind::Pickle),
        _ => {
            let shown: Vec<String> = head.iter().take(4).map(|b| format!("{b:02x}")).collect();
            Err(InputError::WrongKind(format!(
                "not a pickle, gzip or JSON file (starts with bytes {}); expected a PyTorch memory snapshot",
                shown.join(" ")
            )))
        }
    }
}

/// Tells JSON inputs apart: a snapshot, a Chrome/Kineto trace, or a memory timeline export.
fn classify_json(v: &serde_json::Value) -> Result<(), InputError> {
    if let Some(o) = v.as_object() {
        if o.contains_key("traceEvents") {
            return Err(InputError::WrongKind(
                "this is a Chrome/Kineto profiler trace (JSON with traceEvents), not a memory snapshot; expected a PyTorch memory snapshot (its [memory] events will be read by `vramlens reconcile --trace`, not yet available in this version)".into(),
            ));
        }
    } else if let Some(a) = v.as_array()
        && a.first()
            .and_then(|r| r.as_array())
            .is_some_and(|r| r.iter().all(|x| x.is_number() || x.is_array()))
    {
        return Err(InputError::WrongKind(
            "this is a torch.profiler export_memory_timeline file, not a memory snapshot; expected a PyTorch memory snapshot".into(),
        ));
    }
    Ok(())
}

/// The snapshot pickle embedded in a `_memory_viz` HTML page: the first `"base64"`
/// string of `local_files` (the pickle padded with NUL bytes, which the reader ignores
/// after STOP).
fn embedded_pickle(html: &[u8]) -> Result<Vec<u8>, InputError> {
    use base64::Engine;
    let text = String::from_utf8_lossy(html);
    let not_found = || {
        InputError::WrongKind(
            "this is an HTML page without an embedded snapshot; expected a PyTorch memory snapshot, or a page written by torch.cuda._memory_viz trace_plot/segment_plot".into(),
        )
    };
    let start = text.find("local_files").ok_or_else(not_found)?;
    let key = text[start..].find("\"base64\"").ok_or_else(not_found)? + start;
    let open = text[key + 8..].find('"').ok_or_else(not_found)? + key + 9;
    let close = text[open..].find('"').ok_or_else(not_found)? + open;
    base64::engine::general_purpose::STANDARD
        .decode(text[open..close].trim())
        .map_err(|e| {
            InputError::WrongKind(format!(
                "the snapshot embedded in this HTML page is not valid base64: {e}"
            ))
        })
}

/// Reads and decodes one snapshot file.
pub fn read_snapshot(
    path: &Path,
    options: ReadOptions,
) -> Result<(Snapshot, SourceInfo), ReadError> {
    let wrap = |error: InputError| ReadError {
        path: path.display().to_string(),
        error,
    };
    read_inner(path, options).map_err(wrap)
}

fn read_inner(path: &Path, options: ReadOptions) -> Result<(Snapshot, SourceInfo), InputError> {
    let meta = std::fs::metadata(path).map_err(io_error)?;
    if meta.is_dir() {
        return Err(InputError::Io(
            "is a directory; expected a snapshot file".into(),
        ));
    }
    let size = meta.len();
    if size == 0 {
        return Err(InputError::WrongKind(
            "empty file; expected a PyTorch memory snapshot".into(),
        ));
    }
    let mut magic = [0u8; 2];
    let mut f = File::open(path).map_err(io_error)?;
    let got = f.read(&mut magic).map_err(io_error)?;
    let gzip = got == 2 && magic == [0x1f, 0x8b];
    let opened = Opened {
        path: path.to_path_buf(),
        size,
        gzip,
        progress: options.progress && io::stderr().is_terminal(),
    };
    let mut head = Vec::with_capacity(4096);
    opened
        .stream(None)?
        .take(4096)
        .read_to_end(&mut head)
        .map_err(|e| InputError::Io(format!("cannot decompress: {e}")))?;
    if head.is_empty() {
        return Err(InputError::WrongKind(
            "empty content; expected a PyTorch memory snapshot".into(),
        ));
    }
    let mut info = SourceInfo {
        path: path.display().to_string(),
        size_bytes: size,
        format: "pickle",
        gzip,
        pickle_protocol: None,
    };
    // Profiler traces and memory timelines are converted into a snapshot.
    if crate::devlog::is_profile(&head) {
        let converted = crate::devlog::read_profile_snapshot(opened.stream(Some("reading"))?)?;
        info.format = match converted.kind {
            crate::devlog::ProfileKind::KinetoTrace => "kineto_trace",
            _ => "memory_timeline",
        };
        return Ok((converted.snapshot, info));
    }
    let snapshot = match sniff(&head)? {
        Kind::Json => {
            info.format = "json";
            let json: serde_json::Value = serde_json::from_reader(io::BufReader::new(
                opened.stream(Some("reading"))?,
            ))
            .map_err(|e| {
                InputError::WrongKind(format!(
                    "line {} column {}: invalid JSON: {e}; expected a snapshot written as JSON",
                    e.line(),
                    e.column()
                ))
            })?;
            // A trace whose first 4 KiB did not give it away.
            if json.get("traceEvents").is_some() {
                drop(json);
                let converted = crate::devlog::read_profile_snapshot(opened.stream(None)?)?;
                info.format = "kineto_trace";
                return Ok((converted.snapshot, info));
            }
            classify_json(&json)?;
            decode_json(&json)?
        }
        Kind::Html => {
            info.format = "html";
            let mut html = Vec::new();
            opened
                .stream(None)?
                .read_to_end(&mut html)
                .map_err(|e| InputError::Io(e.to_string()))?;
            let bytes = embedded_pickle(&html)?;
            let refs = pickle::scan_references(bytes.as_slice())?;
            let mut builder = SnapshotBuilder::new();
            let (root, parse_info) = pickle::parse_with(bytes.as_slice(), refs, &mut builder)?;
            info.pickle_protocol = parse_info.protocol;
            builder.finish(&root)?
        }
        Kind::Pickle => {
            let refs = pickle::scan_references(opened.stream(Some("scanning"))?)?;
            let mut builder = SnapshotBuilder::new();
            let (root, parse_info) =
                pickle::parse_with(opened.stream(Some("reading"))?, refs, &mut builder)?;
            info.pickle_protocol = parse_info.protocol;
            let snapshot = builder.finish(&root)?;
            drop(root);
            snapshot
        }
    };
    Ok((snapshot, info))
}
