//! Command-line arguments (clap). Parsing only; no I/O.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "vramlens",
    version,
    about = "Analyze PyTorch CUDA memory snapshots: what was allocated, where, and why it ran out",
    long_about = None
)]
pub struct Cli {
    /// Worker threads (default: one per core). Output is identical for any number.
    #[arg(long, global = true, value_name = "N")]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Per-device totals: segments, blocks, reserved/allocated/active bytes, free memory,
    /// trace coverage, OOM events, allocator settings and warnings.
    Summary(SummaryArgs),
    /// Replay the trace of one device: draw the memory timeline as SVG (-o), list what
    /// was live at a moment (--at), or print the peaks.
    Timeline(TimelineArgs),
    /// The allocator's segments and blocks at a moment: an SVG (-o), a table, or JSON.
    Segments(SegmentsArgs),
    /// OOM post-mortem: the request, what the device and allocator had, what was live,
    /// and verdicts (capacity, fragmentation, memory outside PyTorch, ...) with knobs.
    Oom(OomArgs),
    /// PyTorch's reserved and allocated memory against device readings (nvidia-smi CSV or
    /// NVML samples): the gap split into memory outside the allocator and other processes.
    Reconcile(ReconcileArgs),
    /// Write a copy of a snapshot to share: every number kept, file paths cut, user and host
    /// names removed (and function names and code hashed with --strip-code). Runs locally;
    /// nothing is uploaded.
    Redact(RedactArgs),
}

#[derive(Args, Debug)]
pub struct SummaryArgs {
    /// Snapshot files (pickle from torch.cuda.memory._dump_snapshot, gzip or JSON).
    #[arg(required = true, value_name = "SNAPSHOT")]
    pub files: Vec<PathBuf>,
    /// Only this device.
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    /// One JSON object per file, one per line (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum XArg {
    /// Event index, as the official viewer.
    Events,
    /// time_us (PyTorch 2.2 and later), from the first event.
    Time,
}

#[derive(Args, Debug)]
pub struct TimelineArgs {
    /// Snapshot file.
    #[arg(value_name = "SNAPSHOT")]
    pub file: PathBuf,
    /// Write the chart to this SVG file.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Overwrite the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Device (default: the one with the longest trace, as the official viewer).
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    /// What the x axis counts.
    #[arg(long, value_enum, default_value = "events")]
    pub x: XArg,
    /// Allocations drawn individually; the rest are merged into one band.
    #[arg(long, default_value_t = 40, value_name = "N")]
    pub top: usize,
    /// Part of the x axis to draw: event indices for --x events, milliseconds since the
    /// first event for --x time, e.g. 1000..5000.
    #[arg(long, value_name = "A..B")]
    pub window: Option<String>,
    /// List what was live: peak, oom, event:N or time:T (Unix microseconds).
    #[arg(long, value_name = "MOMENT")]
    pub at: Option<String>,
    /// Frames shown per allocation with --at.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub frames: usize,
    /// Device readings to draw beside PyTorch's lines (nvidia-smi CSV or NVML JSON lines).
    #[arg(long, value_name = "FILE")]
    pub nvml: Vec<PathBuf>,
    /// Minutes to add to nvidia-smi's local timestamps to get UTC.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "MINUTES",
        allow_hyphen_values = true
    )]
    pub utc_offset: i32,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct SegmentsArgs {
    /// Snapshot file.
    #[arg(value_name = "SNAPSHOT")]
    pub file: PathBuf,
    /// Write the picture to this SVG file.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Overwrite the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Device (default: the one with the longest trace).
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    /// The moment: end (default), peak, oom, event:N or time:T (Unix microseconds).
    #[arg(long, value_name = "MOMENT")]
    pub at: Option<String>,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct OomArgs {
    /// Snapshot dumped at or after the OOM.
    #[arg(value_name = "SNAPSHOT")]
    pub snapshot: Option<PathBuf>,
    /// A log with "CUDA out of memory" messages (both forms PyTorch has printed).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Memory of the device, e.g. 40GiB (else taken from the OOM message when given).
    #[arg(long, value_name = "SIZE")]
    pub device_total: Option<String>,
    /// Only this device.
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ReconcileArgs {
    /// Snapshot file (PyTorch 2.2 or later: its events carry times).
    #[arg(value_name = "SNAPSHOT")]
    pub snapshot: PathBuf,
    /// Device readings: nvidia-smi CSV (--query-gpu and/or --query-compute-apps) or NVML
    /// JSON lines from scripts/vramlens_capture.py. Repeat for several files.
    #[arg(long, value_name = "FILE", required = true)]
    pub nvml: Vec<PathBuf>,
    /// A profiler (Kineto/Chrome) trace with [memory] events.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Minutes to add to nvidia-smi's local timestamps to get UTC (e.g. -420 for UTC-7).
    #[arg(
        long,
        default_value_t = 0,
        value_name = "MINUTES",
        allow_hyphen_values = true
    )]
    pub utc_offset: i32,
    /// Only this device.
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum TextModeArg {
    /// Keep the text (paths cut, names removed).
    Keep,
    /// Replace it by a keyed hash.
    Hash,
    /// Replace it by the empty string.
    Drop,
}

#[derive(Args, Debug)]
pub struct RedactArgs {
    /// Snapshot file (pickle, gzip, JSON, or a torch.cuda._memory_viz HTML page).
    #[arg(value_name = "SNAPSHOT")]
    pub file: PathBuf,
    /// Write the redacted snapshot (a pickle PyTorch's tools open) to this file.
    #[arg(short, long, value_name = "FILE", required_unless_present = "show")]
    pub output: Option<PathBuf>,
    /// Overwrite the output file if it exists (never the input).
    #[arg(long)]
    pub force: bool,
    /// Also replace function names, line numbers and code text by keyed hashes (equal
    /// frames stay equal, distinct frames stay distinct).
    #[arg(long)]
    pub strip_code: bool,
    /// Secret mixed into the hashes; without it anyone can check a guessed name against
    /// a hash. The same salt gives the same hashes in every file.
    #[arg(long, value_name = "TEXT")]
    pub salt: Option<String>,
    /// What to do with external annotation names (record_function regions).
    #[arg(long, value_enum, default_value = "keep", value_name = "MODE")]
    pub annotations: TextModeArg,
    /// What to do with user_metadata of trace entries.
    #[arg(long, value_enum, default_value = "keep", value_name = "MODE")]
    pub metadata: TextModeArg,
    /// Leave strings matching this regular expression untouched (repeatable).
    #[arg(long, value_name = "REGEX")]
    pub keep: Vec<String>,
    /// Also remove this word wherever it appears, e.g. a host or project name
    /// (repeatable).
    #[arg(long, value_name = "WORD")]
    pub scrub: Vec<String>,
    /// List each string that would change, with its replacement and count; write nothing
    /// (not even the -o file).
    #[arg(long)]
    pub show: bool,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}
