//! CUDA out-of-memory messages found in text logs.
//!
//! A side entrance beside the snapshot flow: it takes the text of a log (a training run's
//! stderr, a CI log, a pasted traceback) and gives every out-of-memory error message PyTorch
//! printed in it as an [`OomMessage`], in order. It reads no snapshot and imports no other
//! module, so a report can put "what PyTorch said when it failed" beside what the snapshot
//! shows.
//!
//! Both forms the caching allocator has printed are read (`c10/cuda/CUDACachingAllocator.cpp`,
//! also hipified for ROCm and mirrored by the XPU allocator):
//!
//! - [`OomForm::Old`] (1.0 to 2.0): `CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0;
//!   15.78 GiB total capacity; 14.56 GiB already allocated; 3.44 MiB free; 14.75 GiB
//!   reserved in total by PyTorch)`, optionally followed by the `max_split_size_mb` hint.
//!   Early 1.x releases (to about 1.4) ended in `X cached)` instead, where "cached" meant
//!   reserved minus allocated (the allocator's own comment: "memory held by the allocator
//!   but not used by the program"); the `free` or `allowed` (memory fraction) item may be
//!   missing or present.
//! - [`OomForm::New`] (2.1 and later): `CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0
//!   has a total capacity of 79.15 GiB of which 3.44 MiB is free. Process 12345 has 79.14 GiB
//!   memory in use. Including non-PyTorch memory, this process has 79.14 GiB memory in use.
//!   Of the allocated memory 77.50 GiB is allocated by PyTorch, and 1.20 GiB is reserved by
//!   PyTorch but unallocated.`, then a hint. The 2.1 releases spelled `total capacty`; later
//!   ones may add `X allowed;` and `with X allocated in private pools (e.g., CUDA Graphs),`.
//!
//! The backend word may be `CUDA`, `HIP` (ROCm) or `XPU` (Intel). A message may start after
//! any log prefix (`[rank3]:`, a timestamp, a logger's fields, the exception name) and may be
//! wrapped over several lines; continuation lines lose the start line's prefix (matched by
//! shape, digits aside, so changing timestamps still match) and common log prefixes. Lines
//! are joined with one space, so a wrap in the middle of a word is not mended.
//!
//! The reading is a small grammar over the known sentences, tolerant of missing parts: it
//! stops at the first text that is not part of the message, keeps every number read up to
//! there, and never fails. Text that only mentions "out of memory" without
//! `Tried to allocate <size>` (for example the driver's `CUDA error: out of memory`) is not
//! reported: it carries no numbers.
//!
//! PyTorch prints sizes with two decimals (`format_size`: bytes up to 1 KiB, then KiB, MiB,
//! GiB), so every `*_bytes` value here is the printed value converted to bytes: within
//! ±0.005 of the printed unit of the true value (±5.4 MB for a value printed in GiB), and
//! sums of two printed values within twice that.

use crate::units::{MAX_DEVICE_BYTES, Rounding, UnitWords, scaled_bytes};
use serde::Serialize;

/// Which wording of the message PyTorch used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomForm {
    /// Before 2.1: the numbers in one parenthesis, `(GPU 0; X total capacity; ...)`.
    Old,
    /// 2.1 and later: sentences, `GPU 0 has a total capacity of X of which Y is free. ...`.
    New,
}

/// One out-of-memory message found in a log.
///
/// Every `*_bytes` value is a printed two-decimal value converted to bytes (see the module
/// documentation for the precision); `None` when the message did not say it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomMessage {
    /// 1-based line of the log where the message starts.
    pub line: usize,
    /// 1-based line of the log where the message ends (equal to `line` unless it wrapped).
    pub end_line: usize,
    /// Which wording PyTorch used. A message cut off right after `Tried to allocate X`, with
    /// neither `(` nor `.` after it, counts as old (the new form puts the `.` right after X).
    pub form: OomForm,
    /// The backend word: `"CUDA"`, `"HIP"` or `"XPU"`.
    pub backend: String,
    /// The Python exception named just before the message on its first line, such as
    /// `torch.OutOfMemoryError`, `torch.cuda.OutOfMemoryError` or `RuntimeError`.
    pub exception: Option<String>,
    /// `Tried to allocate X`: the request that failed, after the allocator's rounding.
    pub requested_bytes: Option<u64>,
    /// The device index, from `GPU N` (or `Device N`).
    pub gpu: Option<i64>,
    /// Old form: `X total capacity`; new form: `has a total capacity of X`.
    pub total_capacity_bytes: Option<u64>,
    /// Free memory on the device as the driver reported it (old: `X free`; new:
    /// `of which X is free`).
    pub free_bytes: Option<u64>,
    /// The per-process limit set with `set_per_process_memory_fraction` (`X allowed;`).
    pub allowed_bytes: Option<u64>,
    /// Old form: "already allocated"; new form: "allocated by PyTorch" (which includes
    /// [`private_pools_bytes`](Self::private_pools_bytes) when that is present).
    pub allocated_by_pytorch_bytes: Option<u64>,
    /// Old form: "reserved in total by PyTorch", or for the early 1.x `X cached` wording
    /// allocated + cached (that "cached" was reserved minus allocated, see
    /// [`reserved_unallocated_bytes`](Self::reserved_unallocated_bytes)); new form: allocated +
    /// reserved-but-unallocated, which is what the allocator had reserved.
    pub reserved_by_pytorch_bytes: Option<u64>,
    /// New form: "reserved by PyTorch but unallocated". Old form: the early 1.x `X cached`
    /// value (memory held by the allocator but not used), or else reserved minus
    /// allocated, derived from the two printed values (0 when rounding makes it negative).
    pub reserved_unallocated_bytes: Option<u64>,
    /// New form only: `with X allocated in private pools (e.g., CUDA Graphs)`, a part of
    /// [`allocated_by_pytorch_bytes`](Self::allocated_by_pytorch_bytes).
    pub private_pools_bytes: Option<u64>,
    /// New form only: "Including non-PyTorch memory, this process has X memory in use".
    pub this_process_bytes: Option<u64>,
    /// New form: every "Process P has X memory in use" (other processes on the device), in
    /// printed order, as (pid, bytes); the pid is `None` when it is not a number.
    pub processes: Vec<(Option<u64>, u64)>,
    /// The message text as found, from the exception name (when there is one) to the end of
    /// the message or its hint: wrapped lines joined, whitespace runs made one space, trimmed.
    pub text: String,
    /// A size in the message is above 1 PiB ([`MAX_DEVICE_BYTES`]); one above 16 EiB
    /// (`u64::MAX` bytes) was kept as `u64::MAX`. No device has that much memory, so the log
    /// is damaged or edited.
    pub oversized: bool,
    /// How many times the log has this message, with the same text (a training loop that
    /// retries prints it again and again): 1 when once. Repeats are counted, not kept.
    pub count: u64,
    /// 1-based line where the last repeat starts (equal to `line` when once).
    pub last_line: usize,
}

/// Reads a size as PyTorch prints it and returns it in bytes, rounded to the nearest byte.
///
/// Takes a decimal number (`20`, `20.00`; no sign or exponent) and a unit, with or without a
/// space between them: `bytes`, `byte`, `B`, `KiB`, `MiB`, `GiB`, `TiB`, `PiB`, `EiB`, and
/// `KB`, `MB`, `GB`, `TB`, `PB`, `EB` read as binary units as PyTorch means them (its MPS
/// allocator prints `KB` for 1024 bytes). Units are matched without regard to case. Returns
/// `None` for anything else, a number without a unit, or a value above `u64::MAX`.
///
/// ```
/// use vramlens::devlog::oom_log::parse_size;
/// assert_eq!(parse_size("20.00 MiB"), Some(20 * 1024 * 1024));
/// assert_eq!(parse_size("512 bytes"), Some(512));
/// assert_eq!(parse_size("1.5 KiB"), Some(1536));
/// assert_eq!(parse_size("20.00"), None);
/// ```
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    match size_prefix(text) {
        Some((bytes, used)) if used == text.len() => Some(bytes),
        _ => None,
    }
}

/// Every out-of-memory message in `log`, in the order they appear.
///
/// Never fails: text that is not a message is skipped, and a message cut short keeps what
/// was read up to the cut. A log without any message gives an empty `Vec`. The same message
/// printed twice (an exception and a logger repeating it) is reported twice.
pub fn parse_oom_messages(log: &str) -> Vec<OomMessage> {
    // Reading from memory cannot fail.
    parse_oom_messages_from(log.as_bytes()).unwrap_or_default()
}

/// As [`parse_oom_messages`], reading the log line by line: memory holds the lines of one
/// message at most (65 lines, each cut into pieces of 1 MiB), whatever the log's size.
/// Invalid UTF-8 is replaced; only an I/O error fails.
///
/// A message whose text was met before is counted on the first one (`count`,
/// `last_line`), so memory and output grow with the distinct messages, not the repeats.
pub fn parse_oom_messages_from<R: std::io::BufRead>(reader: R) -> std::io::Result<Vec<OomMessage>> {
    let mut window = LineWindow::new(reader);
    let mut found: Vec<OomMessage> = Vec::new();
    let mut by_text: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut col = 0usize;
    loop {
        if window.lines.is_empty() {
            window.skip_lines_without_marker()?;
        }
        if window.fill(1)? == 0 {
            break;
        }
        let Some(marker) = find_marker(&window.lines[0], col) else {
            window.advance(1);
            col = 0;
            continue;
        };
        window.fill(WINDOW_LINES + 1)?;
        let view: Vec<&str> = window.lines.iter().map(String::as_str).collect();
        match read_message(&view, 0, marker) {
            Some((mut message, (end_line, end_col))) => {
                message.line = window.numbers[0];
                message.end_line = window.numbers[end_line];
                message.last_line = message.line;
                match by_text.get(&message.text) {
                    Some(&i) => {
                        found[i].count += 1;
                        found[i].last_line = message.line;
                    }
                    None => {
                        by_text.insert(message.text.clone(), found.len());
                        found.push(message);
                    }
                }
                window.advance(end_line);
                col = end_col;
            }
            None => col = marker.end,
        }
    }
    Ok(found)
}

/// Longest piece of a line held at once; longer lines are read in pieces of this size,
/// each numbered as the line it comes from.
const MAX_PIECE_BYTES: u64 = 1 << 20;

/// The lines of a log from the current one on, read as needed.
struct LineWindow<R> {
    reader: R,
    lines: std::collections::VecDeque<String>,
    /// 1-based line number of each held line (pieces of a long line share one).
    numbers: std::collections::VecDeque<usize>,
    next_number: usize,
    /// The last piece read did not end its line.
    in_long_line: bool,
    done: bool,
    buf: Vec<u8>,
    /// Lines moved out of the window, kept to be filled again (no allocation per line).
    spare: Vec<String>,
}

impl<R: std::io::BufRead> LineWindow<R> {
    fn new(reader: R) -> Self {
        LineWindow {
            reader,
            lines: Default::default(),
            numbers: Default::default(),
            next_number: 1,
            in_long_line: false,
            done: false,
            buf: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Reads until `n` lines are held or the log ends; returns how many are held.
    fn fill(&mut self, n: usize) -> std::io::Result<usize> {
        use std::io::{BufRead, Read};
        while self.lines.len() < n && !self.done {
            self.buf.clear();
            let got = (&mut self.reader)
                .take(MAX_PIECE_BYTES)
                .read_until(b'\n', &mut self.buf)?;
            if got == 0 {
                self.done = true;
                break;
            }
            let number = if self.in_long_line {
                self.next_number - 1
            } else {
                self.next_number += 1;
                self.next_number - 1
            };
            self.in_long_line = self.buf.last() != Some(&b'\n');
            if !self.in_long_line {
                self.buf.pop();
                if self.buf.last() == Some(&b'\r') {
                    self.buf.pop();
                }
            }
            let mut line = self.spare.pop().unwrap_or_default();
            line.clear();
            match std::str::from_utf8(&self.buf) {
                Ok(text) => line.push_str(text),
                Err(_) => line.push_str(&String::from_utf8_lossy(&self.buf)),
            }
            self.lines.push_back(line);
            self.numbers.push_back(number);
        }
        Ok(self.lines.len())
    }

    /// Moves past whole lines that cannot hold a message (no " out of memory" in them),
    /// a buffer at a time, only counting them.
    fn skip_lines_without_marker(&mut self) -> std::io::Result<()> {
        loop {
            let buf = self.reader.fill_buf()?;
            let Some(last) = memchr::memrchr(b'\n', buf) else {
                return Ok(());
            };
            let region = &buf[..=last];
            if memchr::memmem::find(region, b" out of memory").is_some() {
                return Ok(());
            }
            let newlines = memchr::memchr_iter(b'\n', region).count();
            // The first newline ends a line already numbered when a long line continues.
            let begun = if self.in_long_line {
                newlines - 1
            } else {
                newlines
            };
            self.next_number += begun;
            self.in_long_line = false;
            self.reader.consume(last + 1);
        }
    }

    fn advance(&mut self, by: usize) {
        for _ in 0..by.min(self.lines.len()) {
            if let Some(line) = self.lines.pop_front() {
                self.spare.push(line);
            }
            self.numbers.pop_front();
        }
    }
}

/// Longest stretch of log, in bytes, read for one message (one with 64 other processes
/// listed is about 4 KiB); bounds the work per marker on hostile input.
const WINDOW_BYTES: usize = 8 * 1024;
/// Most lines one message may span after its first.
const WINDOW_LINES: usize = 64;
/// How far after `If reserved` the hint's `Memory Management` is looked for.
const HINT_BYTES: usize = 400;
/// Most `;`-separated items read inside the old form's parenthesis.
const OLD_ITEMS: usize = 16;

/// Where a `<BACKEND> out of memory` marker starts in a line.
#[derive(Debug, Clone, Copy)]
struct Marker {
    /// Byte offset of the backend word.
    start: usize,
    /// Byte offset just after "out of memory".
    end: usize,
    backend: &'static str,
}

/// The backend words the allocators print before "out of memory".
const BACKENDS: [&str; 3] = ["CUDA", "HIP", "XPU"];

/// The first marker at or after byte `from` of `line`.
fn find_marker(line: &str, from: usize) -> Option<Marker> {
    const TAIL: &str = " out of memory";
    let mut at = from;
    while let Some(found) = line.get(at..).and_then(|rest| rest.find(TAIL)) {
        let tail = at + found;
        let head = &line[..tail];
        for backend in BACKENDS {
            if let Some(before) = head.strip_suffix(backend) {
                let boundary = before
                    .chars()
                    .next_back()
                    .is_none_or(|c| !c.is_alphanumeric() && c != '_');
                if boundary {
                    return Some(Marker {
                        start: before.len(),
                        end: tail + TAIL.len(),
                        backend,
                    });
                }
            }
        }
        at = tail + TAIL.len();
    }
    None
}

/// The exception name ending the text before a marker (`torch.OutOfMemoryError: `), as
/// (byte offset where it starts, name).
fn exception_before(head: &str) -> Option<(usize, &str)> {
    let trimmed = head.trim_end();
    let without_colon = trimmed.strip_suffix(':')?;
    let name_start = without_colon
        .char_indices()
        .rev()
        .take_while(|&(_, c)| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        .last()
        .map(|(i, _)| i)?;
    let name = &without_colon[name_start..];
    (name.ends_with("Error") || name.ends_with("Exception")).then_some((name_start, name))
}

/// A piece of one log line placed in the joined window.
#[derive(Debug, Clone, Copy)]
struct Segment {
    /// Byte offset of the piece in the joined window.
    joined_start: usize,
    /// Its length in bytes.
    len: usize,
    /// Index of its log line.
    line: usize,
    /// Byte offset of the piece in that line.
    col: usize,
}

/// The message starting at `marker` on line `first`, and the (line, byte) to go on from.
fn read_message(
    lines: &[&str],
    first: usize,
    marker: Marker,
) -> Option<(OomMessage, (usize, usize))> {
    let start_line = lines[first];
    let exception = exception_before(&start_line[..marker.start]);
    let text_start = exception.map_or(marker.start, |(at, _)| at);
    // What precedes the message on its line, less the exception name: the log prefix that
    // wrapped lines of the same record repeat.
    let log_prefix = &start_line[..text_start];

    let mut joined = String::new();
    let mut segments = Vec::new();
    let first_piece = clip(&start_line[text_start..], WINDOW_BYTES);
    segments.push(Segment {
        joined_start: 0,
        len: first_piece.len(),
        line: first,
        col: text_start,
    });
    joined.push_str(first_piece);
    for (index, raw) in lines.iter().enumerate().skip(first + 1).take(WINDOW_LINES) {
        if joined.len() >= WINDOW_BYTES {
            break;
        }
        // The stripped line is a suffix of the raw one, so its column is the difference.
        let stripped = strip_log_prefix(raw, log_prefix);
        let col = raw.len() - stripped.len();
        let piece = stripped.trim_end();
        if piece.is_empty() {
            break;
        }
        let piece = clip(piece, WINDOW_BYTES - joined.len());
        joined.push(' ');
        segments.push(Segment {
            joined_start: joined.len(),
            len: piece.len(),
            line: index,
            col,
        });
        joined.push_str(piece);
    }

    let mut reader = Reader {
        text: &joined,
        pos: marker.start - text_start,
        saturated: false,
    };
    let mut message = OomMessage {
        line: first + 1,
        end_line: first + 1,
        form: OomForm::Old,
        backend: marker.backend.to_string(),
        exception: exception.map(|(_, name)| name.to_string()),
        requested_bytes: None,
        gpu: None,
        total_capacity_bytes: None,
        free_bytes: None,
        allowed_bytes: None,
        allocated_by_pytorch_bytes: None,
        reserved_by_pytorch_bytes: None,
        reserved_unallocated_bytes: None,
        private_pools_bytes: None,
        this_process_bytes: None,
        processes: Vec::new(),
        text: String::new(),
        oversized: false,
        count: 1,
        last_line: first + 1,
    };
    let end = read_grammar(&mut reader, &mut message)?;
    message.oversized = reader.saturated;

    message.text = joined[..end]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let (end_line, end_col) = locate(&segments, end);
    message.end_line = end_line + 1;
    Some((message, (end_line, end_col)))
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// (line index, byte in line) of byte `offset` of the joined window.
fn locate(segments: &[Segment], offset: usize) -> (usize, usize) {
    let segment = segments
        .iter()
        .rev()
        .find(|s| s.joined_start <= offset)
        .unwrap_or(&segments[0]);
    let within = (offset - segment.joined_start).min(segment.len);
    (segment.line, segment.col + within)
}

/// Reads the message from the marker on; fills `message` and returns the end offset, or
/// `None` when there is no `Tried to allocate <size>`.
fn read_grammar(reader: &mut Reader, message: &mut OomMessage) -> Option<usize> {
    reader.pos += message.backend.len();
    if !reader.phrase(" out of memory.") || !reader.phrase(" Tried to allocate ") {
        return None;
    }
    message.requested_bytes = Some(reader.size()?);
    let mut end = reader.pos;
    let after_size = reader.pos;
    reader.skip_space();
    if reader.eat("(") {
        message.form = OomForm::Old;
        read_old(reader, message, &mut end);
    } else {
        reader.pos = after_size;
        if reader.eat(".") {
            message.form = OomForm::New;
            end = reader.pos;
            read_new(reader, message, &mut end);
        }
    }
    Some(end)
}

/// The old form's parenthesis (after `(`) and its hint.
fn read_old(reader: &mut Reader, message: &mut OomMessage, end: &mut usize) {
    let mut reserved = None;
    let mut cached = None;
    for _ in 0..OLD_ITEMS {
        reader.skip_space();
        if reader.phrase("GPU ") || reader.phrase("Device ") {
            match reader.int() {
                Some(gpu) => message.gpu = Some(gpu),
                None => break,
            }
        } else if let Some(bytes) = reader.size() {
            // Matched as phrases rather than up to the next `;`, so a message cut off after
            // its last label still gives that value.
            if reader.phrase(" total capacity") {
                message.total_capacity_bytes = Some(bytes);
            } else if reader.phrase(" already allocated") {
                message.allocated_by_pytorch_bytes = Some(bytes);
            } else if reader.phrase(" free") {
                message.free_bytes = Some(bytes);
            } else if reader.phrase(" allowed") {
                message.allowed_bytes = Some(bytes);
            } else if reader.phrase(" reserved in total by PyTorch") {
                reserved = Some(bytes);
            } else if reader.phrase(" cached") {
                cached = Some(bytes);
            } else {
                // Forks add items (`current active`); read past them up to the `;` or `)`.
                reader.until_any(&[';', ')'], 64);
            }
        } else {
            break;
        }
        *end = reader.pos;
        reader.skip_space();
        if reader.eat(";") {
            continue;
        }
        if reader.eat(")") {
            *end = reader.pos;
            read_hints(reader, end);
        }
        break;
    }
    let allocated = message.allocated_by_pytorch_bytes;
    if let Some(cached) = cached {
        message.reserved_unallocated_bytes = Some(cached);
        message.reserved_by_pytorch_bytes = allocated.and_then(|a| a.checked_add(cached));
    }
    if let Some(reserved) = reserved {
        message.reserved_by_pytorch_bytes = Some(reserved);
        message.reserved_unallocated_bytes = allocated.map(|a| reserved.saturating_sub(a));
    }
}

/// The new form's sentences (after `Tried to allocate X.`), in any order, and its hints.
fn read_new(reader: &mut Reader, message: &mut OomMessage, end: &mut usize) {
    let mut unallocated = None;
    loop {
        let before = reader.pos;
        reader.skip_space();
        let progressed = if reader.phrase("GPU ") || reader.phrase("Device ") {
            read_capacity(reader, message, end)
        } else if reader.phrase("Process ") {
            read_process(reader, message, end)
        } else if reader.phrase("Including non-PyTorch memory, this process has ") {
            match reader.size() {
                Some(bytes) if reader.phrase(" memory in use") => {
                    message.this_process_bytes = Some(bytes);
                    reader.eat(".");
                    *end = reader.pos;
                    true
                }
                _ => false,
            }
        } else if reader.phrase("Of the allocated memory ") {
            read_allocated(reader, message, &mut unallocated, end)
        } else if let Some(bytes) = reader.size() {
            if reader.phrase(" allowed;") {
                message.allowed_bytes = Some(bytes);
                *end = reader.pos;
                true
            } else {
                false
            }
        } else {
            reader.pos = before;
            read_hints(reader, end);
            false
        };
        if !progressed {
            break;
        }
    }
    message.reserved_unallocated_bytes = unallocated;
    message.reserved_by_pytorch_bytes = message
        .allocated_by_pytorch_bytes
        .zip(unallocated)
        .and_then(|(a, u)| a.checked_add(u));
}

/// `N has a total capacity of X of which Y is free.` after `GPU `.
fn read_capacity(reader: &mut Reader, message: &mut OomMessage, end: &mut usize) -> bool {
    let Some(gpu) = reader.int() else {
        return false;
    };
    message.gpu = Some(gpu);
    // 2.1 printed "capacty".
    if !reader.phrase(" has a total capacity of ") && !reader.phrase(" has a total capacty of ") {
        return false;
    }
    let Some(total) = reader.size() else {
        return false;
    };
    message.total_capacity_bytes = Some(total);
    *end = reader.pos;
    if !reader.phrase(" of which ") {
        return false;
    }
    let Some(free) = reader.size() else {
        return false;
    };
    // The MLU fork prints no space before "is free".
    if !reader.phrase(" is free") {
        return false;
    }
    message.free_bytes = Some(free);
    reader.eat(".");
    *end = reader.pos;
    true
}

/// `P has X memory in use.` after `Process `.
fn read_process(reader: &mut Reader, message: &mut OomMessage, end: &mut usize) -> bool {
    let pid_text = reader.word(32);
    if pid_text.is_empty() || !reader.phrase(" has ") {
        return false;
    }
    let pid = pid_text.parse::<u64>().ok();
    match reader.size() {
        Some(bytes) if reader.phrase(" memory in use") => {
            message.processes.push((pid, bytes));
            reader.eat(".");
            *end = reader.pos;
            true
        }
        _ => false,
    }
}

/// `X is allocated by PyTorch, [with P allocated in private pools (e.g., CUDA Graphs), ]and
/// U is reserved by PyTorch but unallocated.` after `Of the allocated memory `.
fn read_allocated(
    reader: &mut Reader,
    message: &mut OomMessage,
    unallocated: &mut Option<u64>,
    end: &mut usize,
) -> bool {
    let Some(allocated) = reader.size() else {
        return false;
    };
    if !reader.phrase(" is allocated by PyTorch,") {
        return false;
    }
    message.allocated_by_pytorch_bytes = Some(allocated);
    *end = reader.pos;
    let before_pools = reader.pos;
    if reader.phrase(" with ") {
        match reader.size() {
            Some(pools) if reader.phrase(" allocated in private pools (e.g., CUDA Graphs),") => {
                message.private_pools_bytes = Some(pools);
                *end = reader.pos;
            }
            _ => reader.pos = before_pools,
        }
    }
    if !reader.phrase(" and ") {
        return false;
    }
    match reader.size() {
        Some(bytes) if reader.phrase(" is reserved by PyTorch but unallocated") => {
            *unallocated = Some(bytes);
            reader.eat(".");
            *end = reader.pos;
            true
        }
        _ => false,
    }
}

/// The advice PyTorch appends: `If reserved ... See documentation for Memory Management
/// [and PYTORCH_CUDA_ALLOC_CONF | (url)]`, or XPU's `Please use `empty_cache` ...`.
fn read_hints(reader: &mut Reader, end: &mut usize) {
    loop {
        reader.skip_space();
        if reader.phrase("If reserved") {
            let Some(after) = reader.find_phrase("Memory Management", HINT_BYTES) else {
                // No documentation pointer: take the sentence up to "fragmentation."
                if reader.find_phrase("fragmentation.", HINT_BYTES).is_some() {
                    *end = reader.pos;
                }
                return;
            };
            reader.pos = after;
            *end = after;
            let before = reader.pos;
            if reader.phrase(" and ") && reader.word(64).contains("ALLOC_CONF") {
                *end = reader.pos;
            } else {
                reader.pos = before;
                reader.skip_space();
                if reader.eat("(") {
                    let url = reader.until_any(&[')'], 200);
                    if !url.chars().any(char::is_whitespace) && reader.eat(")") {
                        *end = reader.pos;
                    }
                }
            }
            reader.pos = *end;
        } else if reader.phrase("Please use `empty_cache`") {
            if reader.find_phrase(".", HINT_BYTES).is_some() {
                *end = reader.pos;
            }
            return;
        } else {
            reader.pos = *end;
            return;
        }
    }
}

/// A cursor over the joined window.
struct Reader<'a> {
    text: &'a str,
    pos: usize,
    /// A size above [`MAX_DEVICE_BYTES`] was read (one above `u64::MAX` kept as `u64::MAX`).
    saturated: bool,
}

impl<'a> Reader<'a> {
    fn rest(&self) -> &'a str {
        self.text.get(self.pos..).unwrap_or("")
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    /// Consumes `literal` exactly.
    fn eat(&mut self, literal: &str) -> bool {
        if self.rest().starts_with(literal) {
            self.pos += literal.len();
            true
        } else {
            false
        }
    }

    /// Consumes `phrase` where a leading space matches any whitespace (or none) and each
    /// inner space matches one or more whitespace characters; leaves the cursor alone
    /// when it does not match.
    fn phrase(&mut self, phrase: &str) -> bool {
        let start = self.pos;
        let mut words = phrase.split(' ').peekable();
        if phrase.starts_with(' ') {
            self.skip_space();
            words.next();
        }
        while let Some(word) = words.next() {
            if !self.eat(word) {
                self.pos = start;
                return false;
            }
            if words.peek().is_some() {
                let before = self.pos;
                self.skip_space();
                if self.pos == before {
                    self.pos = start;
                    return false;
                }
            }
        }
        true
    }

    /// Finds `phrase` within `limit` bytes; on success moves past it and returns the new
    /// position, otherwise leaves the cursor alone.
    fn find_phrase(&mut self, phrase: &str, limit: usize) -> Option<usize> {
        let start = self.pos;
        let stop = (start + limit).min(self.text.len());
        let mut at = start;
        while at < stop {
            if self.text.is_char_boundary(at) {
                self.pos = at;
                if self.phrase(phrase) {
                    return Some(self.pos);
                }
            }
            at += 1;
        }
        self.pos = start;
        None
    }

    /// A size (`20.00 MiB`), after optional whitespace.
    fn size(&mut self) -> Option<u64> {
        let start = self.pos;
        self.skip_space();
        match size_prefix_saturating(self.rest()) {
            Some((bytes, used, saturated)) => {
                self.pos += used;
                self.saturated |= saturated || bytes > MAX_DEVICE_BYTES;
                Some(bytes)
            }
            None => {
                self.pos = start;
                None
            }
        }
    }

    /// A decimal integer, optionally negative, after optional whitespace.
    fn int(&mut self) -> Option<i64> {
        let start = self.pos;
        self.skip_space();
        let rest = self.rest();
        let sign = usize::from(rest.starts_with('-'));
        let digits = rest[sign..].bytes().take_while(u8::is_ascii_digit).count();
        match rest[..sign + digits].parse::<i64>() {
            Ok(value) if digits > 0 => {
                self.pos += sign + digits;
                Some(value)
            }
            _ => {
                self.pos = start;
                None
            }
        }
    }

    /// The run of non-whitespace characters here (at most `limit` bytes), possibly empty.
    fn word(&mut self, limit: usize) -> &'a str {
        let rest = self.text.get(self.pos..).unwrap_or("");
        let len = rest
            .char_indices()
            .find(|&(i, c)| c.is_whitespace() || i >= limit)
            .map_or(rest.len(), |(i, _)| i);
        self.pos += len;
        &rest[..len]
    }

    /// The text up to (not including) the first of `stops` within `limit` bytes; empty and
    /// unmoved when none is found.
    fn until_any(&mut self, stops: &[char], limit: usize) -> &'a str {
        let rest = self.text.get(self.pos..).unwrap_or("");
        let window = clip(rest, limit);
        match window.find(stops) {
            Some(len) => {
                self.pos += len;
                &rest[..len]
            }
            None => "",
        }
    }
}

/// A size at the start of `text`: (bytes, bytes of text used). See [`parse_size`].
fn size_prefix(text: &str) -> Option<(u64, usize)> {
    match size_prefix_saturating(text)? {
        (value, used, false) => Some((value, used)),
        (_, _, true) => None,
    }
}

/// As [`size_prefix`], but a value above `u64::MAX` reads as `u64::MAX` and says so:
/// (bytes, bytes of text used, saturated).
fn size_prefix_saturating(text: &str) -> Option<(u64, usize, bool)> {
    let bytes = text.as_bytes();
    let int_len = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if int_len == 0 {
        return None;
    }
    let mut used = int_len;
    let mut frac = "";
    if bytes.get(used) == Some(&b'.') {
        let frac_len = bytes[used + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if frac_len > 0 {
            frac = &text[used + 1..used + 1 + frac_len];
            used += 1 + frac_len;
        }
    }
    let space = text[used..].len() - text[used..].trim_start().len();
    let unit_len = text[used + space..]
        .bytes()
        .take_while(u8::is_ascii_alphabetic)
        .count();
    let unit = &text[used + space..used + space + unit_len];
    let multiplier = UnitWords::PyTorch.multiplier(unit)?;
    let used = used + space + unit_len;
    Some(
        match scaled_bytes(&text[..int_len], frac, multiplier, Rounding::HalfUp) {
            Some(value) => (value, used, false),
            None => (u64::MAX, used, true),
        },
    )
}

/// A continuation line without the log prefix its record repeats: first `start_prefix`
/// (the start line's prefix) matched by shape, digits standing for digits, so a changing
/// timestamp or rank still matches; then common prefixes: `[...]` groups, `(... pid=N)`
/// groups (Ray), timestamps, glog headers, level words and `|`/`:`/`- ` separators.
fn strip_log_prefix<'a>(line: &'a str, start_prefix: &str) -> &'a str {
    let mut rest = line;
    // Only a prefix that ends like one (a separator or a space) is matched by shape, so a
    // stray word before the exception cannot eat the start of a wrapped line.
    let ends_like_prefix = start_prefix
        .chars()
        .next_back()
        .is_some_and(|c| c.is_whitespace() || ":]|)>-".contains(c));
    if ends_like_prefix
        && !start_prefix.trim().is_empty()
        && rest.is_char_boundary(start_prefix.len().min(rest.len()))
        && rest.len() >= start_prefix.len()
        && same_shape(&rest[..start_prefix.len()], start_prefix)
    {
        rest = &rest[start_prefix.len()..];
    }
    for _ in 0..16 {
        let trimmed = rest.trim_start();
        let next = strip_one_prefix(trimmed);
        if next.len() == rest.len() {
            return trimmed;
        }
        rest = next;
    }
    rest.trim_start()
}

/// Whether two strings are equal once every ASCII digit counts as the same character.
fn same_shape(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .all(|(x, y)| x == y || (x.is_ascii_digit() && y.is_ascii_digit()))
}

/// `text` less one leading log-prefix element, or `text` itself when it starts with none.
fn strip_one_prefix(text: &str) -> &str {
    const LEVELS: [&str; 9] = [
        "CRITICAL", "WARNING", "NOTICE", "ERROR", "FATAL", "DEBUG", "TRACE", "WARN", "INFO",
    ];
    let bytes = text.as_bytes();
    match bytes.first() {
        None => return text,
        Some(b'[') => {
            if let Some(close) = clip(text, 96).find(']') {
                let after = &text[close + 1..];
                return after.strip_prefix(':').unwrap_or(after);
            }
            return text;
        }
        Some(b'(') => {
            if let Some(close) = clip(text, 96).find(')')
                && text[..close].contains("pid=")
            {
                let after = &text[close + 1..];
                return after.strip_prefix(':').unwrap_or(after);
            }
            return text;
        }
        Some(b'|') | Some(b':') => return &text[1..],
        Some(b'-') if bytes.get(1).is_some_and(u8::is_ascii_whitespace) => return &text[1..],
        _ => {}
    }
    // glog: `E0101 12:00:00.123456  4242 file.cc:123] message`.
    if bytes.len() > 5
        && matches!(bytes[0], b'I' | b'W' | b'E' | b'F')
        && bytes[1..5].iter().all(u8::is_ascii_digit)
        && bytes.get(5) == Some(&b' ')
        && let Some(close) = clip(text, 160).find("] ")
    {
        return &text[close + 1..];
    }
    for level in LEVELS {
        if let Some(after) = text.strip_prefix(level)
            && after
                .chars()
                .next()
                .is_none_or(|c| !c.is_alphanumeric() && c != '_')
        {
            return after.strip_prefix(':').unwrap_or(after);
        }
    }
    // A timestamp token: starts with a digit, holds only date/time characters and has a
    // `:` or two `-`/`/` (so a size such as `14.12` at the start of a wrapped line stays).
    let token_len = bytes
        .iter()
        .take_while(|b| b.is_ascii_digit() || b"-:.,/TZ+".contains(b))
        .count();
    let token = &text[..token_len];
    let looks_like_time = token.starts_with(|c: char| c.is_ascii_digit())
        && (token.contains(':')
            || token.matches('-').count() >= 2
            || token.matches('/').count() >= 2);
    if looks_like_time {
        return &text[token_len..];
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_exact() {
        assert_eq!(parse_size("1024.00 KiB"), Some(1 << 20));
        assert_eq!(parse_size("0.5 bytes"), Some(1));
        assert_eq!(parse_size("0.49 bytes"), Some(0));
        assert_eq!(parse_size("16 EiB"), None);
        // 15.99 * 2^60 = 18435214858663483146.24
        assert_eq!(parse_size("15.99 EiB"), Some(18_435_214_858_663_483_146));
        assert_eq!(
            parse_size("99999999999999999999999999999999999999999 B"),
            None
        );
        // Long fractions in the largest unit do not overflow. 15.(19 nines) EiB is
        // 2^64 − 0.115 bytes, which rounds to 2^64: one past u64::MAX.
        let nines = format!("15.{} EiB", "9".repeat(60));
        assert_eq!(parse_size(&nines), None);
        let long = format!("1.5{}1 KiB", "0".repeat(60));
        assert_eq!(parse_size(&long), Some(1536));
        // Only 19 decimals count: 4e-19 EiB = 0.46 byte → 0.
        assert_eq!(parse_size("0.00000000000000000049 EiB"), Some(0));
    }

    #[test]
    fn prefixes() {
        assert_eq!(strip_log_prefix("[rank3]: Process 1", ""), "Process 1");
        assert_eq!(
            strip_log_prefix("2024-08-21 22:56:04,346 ERROR: tail", ""),
            "tail"
        );
        assert_eq!(strip_log_prefix("14.12 GiB is", ""), "14.12 GiB is");
        assert_eq!(
            strip_log_prefix("(e.g., CUDA Graphs)", ""),
            "(e.g., CUDA Graphs)"
        );
        assert_eq!(
            strip_log_prefix("(Worker pid=4242) tail", "(Worker pid=1234) "),
            "tail"
        );
        assert_eq!(
            strip_log_prefix("E0101 12:00:00.123456  4242 a.cc:12] tail", ""),
            "tail"
        );
        assert_eq!(
            strip_log_prefix("10:00:02 app.py:9 - tail", "10:00:01 app.py:9 - "),
            "tail"
        );
    }

    #[test]
    fn exception_names() {
        assert_eq!(
            exception_before("[rank0]: torch.OutOfMemoryError: "),
            Some((9, "torch.OutOfMemoryError"))
        );
        assert_eq!(exception_before("ERROR - "), None);
        assert_eq!(exception_before(""), None);
    }
}
