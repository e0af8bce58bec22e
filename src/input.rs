//! Opening inputs: file checks, compression and format sniffing, then the pickle or JSON
//! path into a [`Snapshot`].
//!
//! Formats are told by content, never by file name. Files that vramlens recognises but
//! that are not snapshots (Chrome/Kineto traces, memory-timeline exports, nvidia-smi CSV,
//! other compressors' output) are named as such in the error.
//!
//! A regular file is mapped into memory (both passes of the pickle reader run over the
//! mapping, with no copy); standard input (`-`) and pipes are read into memory first.
//! gzip content is never held whole: each pass decompresses it again as a stream, checks
//! every member's CRC and length, and stops as soon as what it gave exceeds a compression
//! ratio no snapshot reaches of the compressed bytes taken so far. Side inputs (profiler
//! traces, device logs, logs of messages) are opened with the same guard
//! ([`open_side_input`]).

use crate::model::{DecodeError, Snapshot, SnapshotBuilder};
use crate::pickle::{self, Value};
use flate2::bufread::MultiGzDecoder;
use std::cell::Cell;
use std::fs::File;
use std::io::{self, IsTerminal, Read, Write};
use std::path::Path;
use std::rc::Rc;

/// Progress is shown for inputs larger than this, on terminals only.
const PROGRESS_THRESHOLD: u64 = 100 * 1024 * 1024;

/// gzip content may decompress to at most this many times the compressed size (plus
/// [`GZIP_SLACK`]). Real snapshots compress 10 to 25 times; a decompression bomb
/// reaches 1000.
pub const GZIP_MAX_RATIO: u64 = 200;
/// Decompressed bytes always allowed, whatever the compressed size.
pub const GZIP_SLACK: u64 = 16 << 20;

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

/// What kind of file a snapshot came from.
#[derive(Debug, Clone, Copy, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    Pickle,
    Json,
    /// A `_memory_viz` page with the snapshot inside.
    Html,
    /// A profiler trace converted into a snapshot (its `[memory]` events).
    KinetoTrace,
    /// An `export_memory_timeline` file converted into a snapshot.
    MemoryTimeline,
}

impl SourceFormat {
    /// The name the JSON outputs and the export tables give it.
    pub fn name(self) -> &'static str {
        match self {
            SourceFormat::Pickle => "pickle",
            SourceFormat::Json => "json",
            SourceFormat::Html => "html",
            SourceFormat::KinetoTrace => "kineto_trace",
            SourceFormat::MemoryTimeline => "memory_timeline",
        }
    }
}

/// What the input was, as reported beside the analysis.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
pub struct SourceInfo {
    /// The path as given (`-` for standard input).
    pub path: String,
    /// Bytes of the file as stored (compressed bytes for gzip).
    pub size_bytes: u64,
    pub format: SourceFormat,
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

/// The bytes of the input as stored: a mapping of a regular file, or what a pipe held.
enum Data {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl AsRef<[u8]> for Data {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::ops::Deref for Data {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Data::Mapped(m) => m,
            Data::Owned(v) => v,
        }
    }
}

fn io_error(e: io::Error) -> InputError {
    InputError::Io(match e.kind() {
        io::ErrorKind::NotFound => "no such file".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    })
}

fn empty() -> InputError {
    InputError::WrongKind("empty file; expected a PyTorch memory snapshot".into())
}

/// Reads a pipe, a FIFO or standard input to its end. The first bytes are sniffed before
/// the rest is read, so an endless stream of something else fails at once.
fn read_stream(mut r: impl Read) -> Result<Data, InputError> {
    let mut buf = Vec::new();
    (&mut r)
        .take(4096)
        .read_to_end(&mut buf)
        .map_err(io_error)?;
    if buf.is_empty() {
        return Err(empty());
    }
    if compression(&buf)?.is_none() {
        sniff(&buf)?;
    }
    r.read_to_end(&mut buf).map_err(io_error)?;
    Ok(Data::Owned(buf))
}

fn open(path: &Path) -> Result<Data, InputError> {
    if path.as_os_str() == "-" {
        let stdin = io::stdin();
        if stdin.is_terminal() {
            return Err(InputError::Io(
                "standard input is a terminal; pipe a snapshot into vramlens, or name a file"
                    .into(),
            ));
        }
        return read_stream(stdin.lock());
    }
    let meta = std::fs::metadata(path).map_err(io_error)?;
    let ft = meta.file_type();
    if ft.is_dir() {
        return Err(InputError::Io(
            "is a directory; expected a snapshot file".into(),
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() || ft.is_block_device() {
            return Err(InputError::Io(
                "is a device, not a file (a device such as /dev/zero never ends); expected a snapshot file"
                    .into(),
            ));
        }
    }
    let file = File::open(path).map_err(io_error)?;
    if !ft.is_file() {
        // A FIFO (`<(...)`, mkfifo) or a socket: read it as a stream.
        return read_stream(file);
    }
    if meta.len() == 0 {
        return Err(empty());
    }
    // SAFETY: the mapping is read-only and private to this process. If another process
    // truncates the file while it is mapped, reading the lost pages raises SIGBUS; a
    // snapshot being rewritten while vramlens reads it is not supported (as for any
    // reader that maps files).
    match unsafe { memmap2::Mmap::map(&file) } {
        Ok(m) => {
            #[cfg(unix)]
            let _ = m.advise(memmap2::Advice::Sequential);
            Ok(Data::Mapped(m))
        }
        // Some file systems cannot map: read the file instead.
        Err(_) => read_stream(file),
    }
}

pub use crate::model::RECORD_ADVICE;

/// The name of a zip's first entry (its first local file header), if whole.
fn zip_first_name(raw: &[u8]) -> Option<&[u8]> {
    let len = u16::from_le_bytes([*raw.get(26)?, *raw.get(27)?]) as usize;
    raw.get(30..30 + len)
}

/// Compressed formats by their magic bytes: Some(true) for gzip (read), an error naming
/// the others.
fn compression(raw: &[u8]) -> Result<Option<bool>, InputError> {
    let named = |name: &str, tool: &str| {
        Err(InputError::WrongKind(format!(
            "{name}-compressed; decompress it first ({tool}), or compress with gzip, which vramlens reads"
        )))
    };
    match raw {
        [0x1f, 0x8b, ..] => Ok(Some(true)),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => named("zstd", "zstd -d FILE"),
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => named("xz", "xz -d FILE"),
        [b'B', b'Z', b'h', ..] => named("bzip2", "bunzip2 FILE"),
        [b'P', b'K', 3, 4, ..] if zip_first_name(raw).is_some_and(|n| n.ends_with(b"data.pkl")) => {
            Err(InputError::WrongKind(format!(
                "a file torch.save wrote (a zip holding data.pkl: tensors or a model's state), not a memory snapshot; {RECORD_ADVICE}"
            )))
        }
        [b'P', b'K', 3, 4, ..] => Err(InputError::WrongKind(
            "a zip archive; unpack the snapshot from it first (unzip FILE)".into(),
        )),
        _ => Ok(None),
    }
}

/// Compressed bytes held in memory, read by the gzip decoder; shows how far it got.
struct Tracked<'a> {
    data: &'a [u8],
    pos: usize,
    progress: Option<Progress>,
    /// Gives the pages of a mapped file back once read (the profiler-trace pass).
    release: Option<pickle::Release<'a>>,
    /// Bytes before this were given back.
    released: usize,
}

/// A streaming pass gives the mapped pages it has read back this often.
const RELEASE_BYTES: usize = 8 << 20;

struct Progress {
    label: String,
    shown_percent: u64,
}

impl Read for Tracked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = io::BufRead::fill_buf(self)?.len().min(buf.len());
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        io::BufRead::consume(self, n);
        Ok(n)
    }
}

impl io::BufRead for Tracked<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        let end = self.data.len().min(self.pos + (1 << 20));
        Ok(&self.data[self.pos..end])
    }
    fn consume(&mut self, n: usize) {
        self.pos += n;
        if let Some(release) = self.release
            && self.pos - self.released >= RELEASE_BYTES
        {
            release(self.released, self.pos);
            self.released = self.pos;
        }
        if let Some(p) = &mut self.progress {
            let percent = (self.pos as u64 * 100) / self.data.len().max(1) as u64;
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
    }
}

/// A reader of compressed bytes that knows how many the decoder has taken.
trait Consumed {
    fn consumed(&self) -> u64;
}

impl Consumed for Tracked<'_> {
    fn consumed(&self) -> u64 {
        self.pos as u64
    }
}

/// A gzip stream that refuses to give more than the ratio allows of the compressed bytes
/// taken so far: a decompression bomb is stopped after [`GZIP_SLACK`] and a few
/// kilobytes of it, never held, whatever the file's size.
struct Guard<R: io::BufRead + Consumed> {
    inner: MultiGzDecoder<R>,
    out: u64,
}

impl<R: io::BufRead + Consumed> Guard<R> {
    fn new(compressed: R) -> Self {
        Guard {
            inner: MultiGzDecoder::new(compressed),
            out: 0,
        }
    }
}

impl<R: io::BufRead + Consumed> Read for Guard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self
            .inner
            .read(buf)
            .map_err(|e| io::Error::new(e.kind(), format!("gzip: {e}")))?;
        self.out += n as u64;
        let taken = self.inner.get_ref().consumed();
        if self.out > GZIP_SLACK.saturating_add(GZIP_MAX_RATIO.saturating_mul(taken)) {
            return Err(io::Error::other(format!(
                "gzip: the content decompresses to more than {GZIP_MAX_RATIO} times its compressed size of {taken} bytes read so far; refusing what looks like a decompression bomb (if it is a real snapshot, decompress it first)"
            )));
        }
        Ok(n)
    }
}

/// Compressed bytes of a side input, counted as the decoder takes them.
struct CountedBuf<R> {
    inner: R,
    taken: u64,
}

impl<R: io::BufRead> Read for CountedBuf<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.taken += n as u64;
        Ok(n)
    }
}

impl<R: io::BufRead> io::BufRead for CountedBuf<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, n: usize) {
        self.taken += n as u64;
        self.inner.consume(n);
    }
}

impl<R> Consumed for CountedBuf<R> {
    fn consumed(&self) -> u64 {
        self.taken
    }
}

/// Opens a side input (a profiler trace given with `--trace`, a device log, a log of
/// messages) under the main input's rules: gzip is sniffed by content and decompressed
/// as a stream under the same ratio guard, so no side input can hold more than the
/// snapshot could.
pub fn open_side_input(path: &Path) -> io::Result<Box<dyn io::BufRead>> {
    let file = File::open(path)?;
    let mut buffered = io::BufReader::with_capacity(1 << 16, file);
    let gzip = io::BufRead::fill_buf(&mut buffered)?.starts_with(&[0x1f, 0x8b]);
    let counted = CountedBuf {
        inner: buffered,
        taken: 0,
    };
    let mut text: Box<dyn io::BufRead> = if gzip {
        Box::new(io::BufReader::with_capacity(1 << 16, Guard::new(counted)))
    } else {
        Box::new(counted)
    };
    // UTF-16 text (what Windows PowerShell's `>` writes), told by its byte-order mark,
    // read as the UTF-8 it stands for.
    let little_endian = match io::BufRead::fill_buf(&mut text)? {
        [0xff, 0xfe, ..] => Some(true),
        [0xfe, 0xff, ..] => Some(false),
        _ => None,
    };
    Ok(match little_endian {
        Some(le) => {
            text.consume(2);
            Box::new(io::BufReader::with_capacity(
                1 << 16,
                Utf16Text {
                    inner: text,
                    little_endian: le,
                    pending: Vec::new(),
                    out: Vec::new(),
                    at: 0,
                },
            ))
        }
        None => text,
    })
}

/// UTF-16 text as UTF-8: unpaired surrogates become U+FFFD, an odd last byte too.
struct Utf16Text<R> {
    inner: R,
    little_endian: bool,
    /// Bytes read but not decoded yet: half a code unit, or a high surrogate waiting for
    /// its pair.
    pending: Vec<u8>,
    /// Decoded bytes not given yet, from `at` on.
    out: Vec<u8>,
    at: usize,
}

impl<R: Read> Utf16Text<R> {
    /// Decodes the whole code units of `pending`, keeping back a trailing high surrogate
    /// unless `end` (then an odd byte and a lone surrogate become U+FFFD).
    fn decode(&mut self, end: bool) {
        let whole = self.pending.len() / 2 * 2;
        let mut units: Vec<u16> = self.pending[..whole]
            .chunks_exact(2)
            .map(|p| {
                if self.little_endian {
                    u16::from_le_bytes([p[0], p[1]])
                } else {
                    u16::from_be_bytes([p[0], p[1]])
                }
            })
            .collect();
        let mut keep = self.pending.len() - whole;
        if !end && units.last().is_some_and(|u| (0xd800..0xdc00).contains(u)) {
            units.pop();
            keep += 2;
        }
        let mut text = String::with_capacity(units.len());
        for c in char::decode_utf16(units) {
            text.push(c.unwrap_or(char::REPLACEMENT_CHARACTER));
        }
        if end && keep > 0 {
            text.push(char::REPLACEMENT_CHARACTER);
            keep = 0;
        }
        self.out.extend_from_slice(text.as_bytes());
        let from = self.pending.len() - keep;
        self.pending.drain(..from);
    }
}

impl<R: Read> Read for Utf16Text<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.out.len() {
            self.out.clear();
            self.at = 0;
            let mut chunk = [0u8; 1 << 14];
            let n = self.inner.read(&mut chunk)?;
            if n == 0 {
                if self.pending.is_empty() {
                    return Ok(0);
                }
                self.decode(true);
            } else {
                self.pending.extend_from_slice(&chunk[..n]);
                self.decode(false);
            }
        }
        let n = buf.len().min(self.out.len() - self.at);
        buf[..n].copy_from_slice(&self.out[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Counts the bytes a stream has given (for the JSON budget).
struct Counted<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// The content of the input: the bytes themselves, or a gzip stream over them.
struct Content<'a> {
    raw: &'a [u8],
    gzip: bool,
    progress: bool,
    label: String,
}

impl<'a> Content<'a> {
    /// A fresh stream over the decompressed content; each pass opens its own.
    /// `pass` names the pass in the progress line (None: no progress line).
    fn stream(&self, pass: Option<&str>) -> Box<dyn Read + 'a> {
        self.stream_releasing(pass, None)
    }

    /// As [`Content::stream`], for a single pass: `release` gives the pages of a mapped
    /// file back as they are read, so the mapping does not add the file's size to the
    /// process's memory (the profiler-trace reader keeps only events, not text).
    fn stream_releasing(
        &self,
        pass: Option<&str>,
        release: Option<pickle::Release<'a>>,
    ) -> Box<dyn Read + 'a> {
        if !self.gzip {
            if release.is_none() {
                return Box::new(self.raw);
            }
            return Box::new(Tracked {
                data: self.raw,
                pos: 0,
                progress: None,
                release,
                released: 0,
            });
        }
        let compressed = self.raw.len() as u64;
        let show = self.progress && compressed * 10 > PROGRESS_THRESHOLD;
        let tracked = Tracked {
            data: self.raw,
            pos: 0,
            progress: pass.filter(|_| show).map(|pass| Progress {
                label: format!("{pass} {}", self.label),
                shown_percent: u64::MAX,
            }),
            release,
            released: 0,
        };
        Box::new(Guard::new(tracked))
    }
}

/// The commands that read device logs, for messages about them.
const DEVICE_LOG_COMMANDS: &str = "expected a PyTorch memory snapshot (read the log beside one with `vramlens reconcile SNAPSHOT --nvml FILE`, or draw it on a chart with `vramlens timeline SNAPSHOT -o chart.svg --nvml FILE`)";

/// Whether a line is one reading of an NVML log (`vramlens_capture.py`'s `nvml.jsonl`):
/// a JSON object with a time and the device's used bytes, which no snapshot has at its
/// root.
fn is_nvml_line(line: &str) -> bool {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line.trim())
        .is_ok_and(|o| o.contains_key("time_us") && o.contains_key("used_bytes"))
}

/// Whether a first line is an nvidia-smi CSV's: its header, or (`--format=csv,noheader`)
/// a row of values with memory in MiB, starting with a timestamp or an index (a digit,
/// which no pickle starts with).
fn is_nvidia_smi_line(line: &str) -> bool {
    line.contains("memory.used")
        || line.starts_with("timestamp")
        || (line.starts_with(|c: char| c.is_ascii_digit())
            && line.matches(',').count() >= 2
            && line.contains(" MiB"))
}

/// A device log's format, told from its first line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceLogKind {
    NvidiaSmi,
    Nvml,
}

/// The device log the first bytes of a (decompressed) file start, if they start one.
fn device_log_kind(head: &[u8]) -> Option<DeviceLogKind> {
    let text = String::from_utf8_lossy(&head[..head.len().min(4096)]);
    let trimmed = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    let first_line = trimmed.lines().next().unwrap_or("");
    if trimmed.starts_with('{') {
        is_nvml_line(first_line).then_some(DeviceLogKind::Nvml)
    } else if trimmed.starts_with('[') {
        None
    } else {
        is_nvidia_smi_line(first_line).then_some(DeviceLogKind::NvidiaSmi)
    }
}

/// Whether a file (gzip or not) is an nvidia-smi CSV or NVML JSON-lines log, by its first
/// line: what `summary` sums up instead of reading it as a snapshot. Only a regular file
/// is looked at (None for anything else): a pipe's first bytes, once read, would be gone
/// for the reader that follows.
pub fn device_log_kind_of(path: &Path) -> io::Result<Option<DeviceLogKind>> {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(None);
    }
    let mut input = open_side_input(path)?;
    let head = io::BufRead::fill_buf(&mut input)?;
    Ok(device_log_kind(head))
}

/// Names inputs that are not snapshots, from the first bytes of the content.
fn sniff(head: &[u8]) -> Result<Kind, InputError> {
    let text = String::from_utf8_lossy(&head[..head.len().min(4096)]);
    let trimmed = text.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    if trimmed.is_empty() && head.len() >= crate::devlog::MAX_LEADING_SPACE {
        return Err(InputError::WrongKind(crate::devlog::leading_space_message(
            "a PyTorch memory snapshot",
        )));
    }
    match device_log_kind(head) {
        Some(DeviceLogKind::Nvml) => {
            return Err(InputError::WrongKind(format!(
                "this is an NVML device log (JSON lines of GPU memory readings, as vramlens_capture.py writes), not a memory snapshot; {DEVICE_LOG_COMMANDS}"
            )));
        }
        Some(DeviceLogKind::NvidiaSmi) => {
            return Err(InputError::WrongKind(format!(
                "this is an nvidia-smi CSV log, not a memory snapshot; {DEVICE_LOG_COMMANDS}"
            )));
        }
        None => {}
    }
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        return Ok(Kind::Json);
    }
    let lower = trimmed
        .get(..trimmed.len().min(16))
        .unwrap_or("")
        .to_ascii_lowercase();
    if lower.starts_with("<!doctype html") || lower.starts_with("<html") {
        return Ok(Kind::Html);
    }
    if head.starts_with(&[0xff, 0xfe]) || head.starts_with(&[0xfe, 0xff]) {
        return Err(InputError::WrongKind(
            "UTF-16 text (as Windows PowerShell writes), not a memory snapshot; expected a PyTorch memory snapshot (a device log or a log of messages in UTF-16 is read where logs are: summary LOG, --nvml, --log)".into(),
        ));
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
fn classify_json(v: &Value) -> Result<(), InputError> {
    if let Some(pairs) = v.as_dict() {
        if pairs.iter().any(|(k, _)| k.as_str() == Some("traceEvents")) {
            return Err(InputError::WrongKind(
                "this is a Chrome/Kineto profiler trace (JSON with traceEvents), not a memory snapshot; expected a PyTorch memory snapshot (read its [memory] events beside a snapshot with `vramlens reconcile SNAPSHOT --nvml LOG --trace FILE`)".into(),
            ));
        }
    } else if let Some(rows) = v.as_seq()
        && rows.first().and_then(|r| r.as_seq()).is_some_and(|r| {
            r.iter().all(|x| {
                matches!(x, Value::Int(_) | Value::BigInt(_) | Value::Float(_))
                    || x.as_seq().is_some()
            })
        })
    {
        return Err(InputError::WrongKind(
            "this is a torch.profiler export_memory_timeline file, not a memory snapshot; expected a PyTorch memory snapshot".into(),
        ));
    }
    Ok(())
}

/// JSON values, built straight into pickle values (one tree, not two), object keys sorted
/// with the last of repeated keys kept (as a JSON object map holds them). Values are
/// budgeted against the bytes read, as the pickle reader's are.
#[derive(Clone, Copy)]
struct JsonSeed<'c> {
    values: &'c Cell<u64>,
    bytes: &'c Cell<u64>,
}

impl JsonSeed<'_> {
    fn count<E: serde::de::Error>(&self) -> Result<(), E> {
        let n = self.values.get() + 1;
        self.values.set(n);
        if n > pickle::HELD_VALUES_FLOOR + self.bytes.get() / 8 {
            return Err(E::custom(format!(
                "{n} values after {} bytes; a memory snapshot never needs that many (refusing a memory bomb)",
                self.bytes.get()
            )));
        }
        Ok(())
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for JsonSeed<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.count()?;
        Ok(Value::None)
    }
    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Bool(b))
    }
    fn visit_i64<E: serde::de::Error>(self, i: i64) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Int(i))
    }
    fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Value, E> {
        self.count()?;
        Ok(Value::from_le_signed(&(u as i128).to_le_bytes()))
    }
    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Float(f))
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Str(Rc::from(s)))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.count()?;
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            items.push(v);
        }
        Ok(Value::List(Rc::new(items)))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.count()?;
        let mut pairs: Vec<(Rc<str>, Value)> = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            self.count()?;
            let v = map.next_value_seed(self)?;
            pairs.push((Rc::from(k), v));
        }
        // Sorted by key, the last of repeated keys kept.
        pairs.reverse();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs.dedup_by(|b, a| a.0 == b.0);
        Ok(Value::Dict(Rc::new(
            pairs.into_iter().map(|(k, v)| (Value::Str(k), v)).collect(),
        )))
    }
}

fn read_json(content: &Content) -> Result<(Value, u64), InputError> {
    let bytes = Rc::new(Cell::new(0u64));
    let mut reader = io::BufReader::new(Counted {
        inner: content.stream(Some("reading")),
        count: bytes.clone(),
    });
    // A UTF-8 byte-order mark (Windows editors write one) is not JSON: skip it.
    let mut bom = [0u8; 3];
    {
        use io::BufRead;
        let head = reader
            .fill_buf()
            .map_err(|e| InputError::Io(e.to_string()))?;
        let n = head.len().min(3);
        bom[..n].copy_from_slice(&head[..n]);
        if bom == [0xef, 0xbb, 0xbf] {
            reader.consume(3);
        }
    }
    let values = Cell::new(0u64);
    let seed = JsonSeed {
        values: &values,
        bytes: &bytes,
    };
    let mut de = serde_json::Deserializer::from_reader(reader);
    let invalid = |e: serde_json::Error| {
        if e.is_io() {
            return InputError::Io(e.to_string());
        }
        InputError::WrongKind(format!(
            "line {} column {}: invalid JSON: {e}; expected a snapshot written as JSON",
            e.line(),
            e.column()
        ))
    };
    let v = serde::de::DeserializeSeed::deserialize(seed, &mut de).map_err(invalid)?;
    de.end().map_err(invalid)?;
    Ok((v, bytes.get()))
}

/// The snapshot pickle embedded in a `_memory_viz` HTML page: the first `"base64"`
/// string of `local_files` (the pickle padded with NUL bytes, which the reader ignores
/// after STOP).
fn embedded_pickle(html: &[u8]) -> Result<Vec<u8>, InputError> {
    use base64::Engine;
    let not_found = || {
        InputError::WrongKind(
            "this is an HTML page without an embedded snapshot; expected a PyTorch memory snapshot, or a page written by torch.cuda._memory_viz trace_plot/segment_plot".into(),
        )
    };
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    let start = find(html, b"local_files").ok_or_else(not_found)?;
    let key = find(&html[start..], b"\"base64\"").ok_or_else(not_found)? + start;
    let open = html[key + 8..]
        .iter()
        .position(|&b| b == b'"')
        .ok_or_else(not_found)?
        + key
        + 9;
    let close = html[open..]
        .iter()
        .position(|&b| b == b'"')
        .ok_or_else(not_found)?
        + open;
    base64::engine::general_purpose::STANDARD
        .decode(html[open..close].trim_ascii())
        .map_err(|e| {
            InputError::WrongKind(format!(
                "the snapshot embedded in this HTML page is not valid base64: {e}"
            ))
        })
}

/// Reads and decodes one snapshot file (`-` reads standard input).
pub fn read_snapshot(
    path: &Path,
    options: ReadOptions,
) -> Result<(Snapshot, SourceInfo), ReadError> {
    let wrap = |error: InputError| ReadError {
        // A control character of the name (a newline) is shown as text: the error is
        // one line, and names the file as it is.
        path: if path.as_os_str() == "-" {
            "standard input".into()
        } else {
            crate::units::shown(&path.display().to_string()).into_owned()
        },
        error,
    };
    read_inner(path, options).map_err(wrap)
}

/// Decodes a snapshot from bytes held in memory, as [`read_snapshot`] reads a file's.
pub fn read_snapshot_bytes(bytes: &[u8]) -> Result<(Snapshot, SourceInfo), InputError> {
    decode_data(
        bytes,
        "(bytes)".into(),
        ReadOptions::default(),
        Held::default(),
    )
}

fn read_inner(path: &Path, options: ReadOptions) -> Result<(Snapshot, SourceInfo), InputError> {
    let data = std::sync::Arc::new(open(path)?);
    let label = path.display().to_string();
    // Pages already read go back to the page cache, so the mapping does not add the
    // file's size to the process's memory.
    let release = matches!(*data, Data::Mapped(_)).then(|| {
        let mapped = data.clone();
        let release: pickle::SharedRelease = std::sync::Arc::new(move |start, end| {
            if let Data::Mapped(map) = &*mapped {
                give_back(map, start, end)
            }
        });
        release
    });
    let held = Held {
        shared: Some(data.clone()),
        release,
    };
    decode_data(&data, label, options, held)
}

/// Where the input's bytes are, for the reader and its workers: held for other threads,
/// and how to give their pages back (a mapped file's).
#[derive(Default)]
struct Held {
    shared: Option<pickle::SharedBytes>,
    release: Option<pickle::SharedRelease>,
}

/// The pickle passes over the content, with the trailing bytes checked. Content held
/// in memory is read with workers on every thread but one, and its pages given back
/// once read, as `held` allows.
fn decode_pickle(
    content: &Content,
    info: &mut SourceInfo,
    padded: bool,
    held: Held,
) -> Result<Snapshot, InputError> {
    let mut builder = SnapshotBuilder::new();
    let (root, parse_info) = if content.gzip {
        let refs = pickle::scan_references(content.stream(Some("scanning")))?;
        pickle::parse_with(content.stream(Some("reading")), refs, &mut builder)?
    } else {
        let mut reader = pickle::Reader::new(content.raw).releasing(held.release);
        if let Some(shared) = held.shared {
            reader = reader.workers(rayon::current_num_threads() - 1, shared);
        }
        reader.parse(&mut builder)?
    };
    info.pickle_protocol = parse_info.protocol;
    let mut snapshot = builder.finish_sized(&root, parse_info.bytes)?;
    drop(root);
    // Pages written by _memory_viz pad the pickle with NUL bytes; anything else after
    // STOP is not part of the snapshot.
    if parse_info.trailing_bytes > 0 && (parse_info.trailing_nonzero || !padded) {
        snapshot.warnings.add(crate::model::Warning::TrailingBytes {
            bytes: parse_info.trailing_bytes,
        });
    }
    Ok(snapshot)
}

/// Hands the bytes of a regular file to `each` in order, a few MiB at a time, from a
/// mapping whose pages are given back after each piece: no copy, and the process never
/// holds the file (the page cache does). Reads it in pieces where it cannot be mapped.
pub fn for_each_piece(path: &Path, mut each: impl FnMut(&[u8])) -> io::Result<()> {
    const PIECE: usize = 8 << 20;
    let file = File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(());
    }
    // SAFETY: as in `open`: read-only, private; a file truncated while mapped is not
    // supported.
    match unsafe { memmap2::Mmap::map(&file) } {
        Ok(map) => {
            #[cfg(unix)]
            let _ = map.advise(memmap2::Advice::Sequential);
            let mut start = 0;
            while start < map.len() {
                let end = (start + PIECE).min(map.len());
                each(&map[start..end]);
                give_back(&map, start, end);
                start = end;
            }
        }
        Err(_) => {
            let mut file = file;
            let mut buf = vec![0u8; PIECE];
            loop {
                match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => each(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

/// Gives the pages of `[start, end)` of a mapped file back to the page cache.
fn give_back(map: &memmap2::Mmap, start: usize, end: usize) {
    // SAFETY: DONTNEED on a read-only mapping of a file drops this process's copy of the
    // pages; reading them again faults them back in from the file, with the same bytes.
    // The range lies within the mapping.
    let _ = unsafe {
        map.unchecked_advise_range(
            memmap2::UncheckedAdvice::DontNeed,
            start,
            end.saturating_sub(start),
        )
    };
}

fn decode_data(
    raw: &[u8],
    label: String,
    options: ReadOptions,
    held: Held,
) -> Result<(Snapshot, SourceInfo), InputError> {
    if raw.is_empty() {
        return Err(empty());
    }
    let gzip = compression(raw)?.unwrap_or(false);
    let content = Content {
        raw,
        gzip,
        progress: options.progress && io::stderr().is_terminal(),
        // Shown on the terminal: a name cannot drive it.
        label: crate::units::shown(&label).into_owned(),
    };
    let mut head = Vec::with_capacity(4096);
    content
        .stream(None)
        .take(4096)
        .read_to_end(&mut head)
        .map_err(|e| InputError::Io(format!("cannot decompress: {e}")))?;
    if head.is_empty() {
        return Err(InputError::WrongKind(
            "empty content; expected a PyTorch memory snapshot".into(),
        ));
    }
    let mut info = SourceInfo {
        path: label,
        size_bytes: raw.len() as u64,
        format: SourceFormat::Pickle,
        gzip,
        pickle_protocol: None,
    };
    // Profiler traces and memory timelines are converted into a snapshot.
    if crate::devlog::is_profile(&head) {
        let converted = crate::devlog::read_profile_snapshot(
            content.stream_releasing(Some("reading"), held.release.as_deref().map(|f| f as _)),
        )?;
        info.format = match converted.kind {
            crate::devlog::ProfileKind::KinetoTrace => SourceFormat::KinetoTrace,
            _ => SourceFormat::MemoryTimeline,
        };
        return Ok((converted.snapshot, info));
    }
    let snapshot = match sniff(&head)? {
        Kind::Json => {
            info.format = SourceFormat::Json;
            let (value, bytes) = read_json(&content)?;
            // A trace whose first 4 KiB did not give it away.
            if value.get("traceEvents").is_some() {
                drop(value);
                let converted = crate::devlog::read_profile_snapshot(content.stream(None))?;
                info.format = SourceFormat::KinetoTrace;
                return Ok((converted.snapshot, info));
            }
            classify_json(&value)?;
            SnapshotBuilder::new().finish_sized(&value, bytes)?
        }
        Kind::Html => {
            info.format = SourceFormat::Html;
            let bytes = if gzip {
                let mut html = Vec::new();
                content
                    .stream(None)
                    .read_to_end(&mut html)
                    .map_err(|e| InputError::Io(e.to_string()))?;
                embedded_pickle(&html)?
            } else {
                embedded_pickle(raw)?
            };
            let inner = Content {
                raw: &bytes,
                gzip: false,
                progress: false,
                label: String::new(),
            };
            decode_pickle(&inner, &mut info, true, Held::default())?
        }
        Kind::Pickle => decode_pickle(&content, &mut info, false, held)?,
    };
    Ok((snapshot, info))
}
