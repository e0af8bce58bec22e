//! Command-line arguments (clap). Parsing only; no I/O.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use vramlens::analysis::kinds::attribution::GroupBy;
use vramlens::analysis::moments::chart::BandBy;
use vramlens::analysis::moments::moment::Moment;

/// `--by` of the timeline: a grouping, or `allocation` (one band each).
fn band_by(s: &str) -> Result<BandBy, String> {
    if s == "allocation" {
        return Ok(BandBy::Allocation);
    }
    s.parse::<GroupBy>()
        .map(BandBy::Group)
        .map_err(|_| format!("expected callsite, category, stack, file or allocation, found {s:?}"))
}

#[derive(Parser, Debug)]
#[command(
    name = "vramlens",
    version,
    about = "Analyze PyTorch CUDA memory snapshots: what was allocated, where, and why it ran out",
    long_about = None
)]
pub struct Cli {
    /// Worker threads, at most 1024 (default or 0: one per core). Output is identical for
    /// any number.
    #[arg(
        long,
        global = true,
        value_name = "N",
        value_parser = parse_threads,
        display_order = 900
    )]
    pub threads: Option<usize>,
    /// Redact what the output shows of the snapshots' strings, with the rules and defaults
    /// of `vramlens redact`: file paths cut to the package, home folders, user and host
    /// names removed; every number is kept. The paths of the inputs are cut the same way.
    #[arg(long, global = true, display_order = 901)]
    pub redact: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// The most worker threads `--threads` accepts.
pub const MAX_THREADS: usize = 1024;

/// The one rule every command follows when `--device` is not given (the README says it).
const DEVICE_CHOSEN: &str = "Device (default: the first with an OOM, else the one whose requested memory peaked highest; the output says which was chosen)";
/// `diff`'s `--device`: the same rule, applied to each file on its own.
const DEVICE_IN_BOTH: &str = "Device in both files (default: each file's own, by the rule every command follows: the first with an OOM, else the one whose requested memory peaked highest)";

fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<u64>() {
        Ok(n) if n <= MAX_THREADS as u64 => Ok(n as usize),
        Ok(_) => Err(format!(
            "at most {MAX_THREADS} threads (0 means one per core)"
        )),
        Err(_) => Err(format!(
            "expected a whole number from 0 (one per core) to {MAX_THREADS}"
        )),
    }
}

impl Command {
    /// Whether it writes text for people to stdout (not JSON, not folded stacks), which
    /// may be folded at a terminal's width.
    pub fn writes_prose(&self) -> bool {
        match self {
            Command::Summary(a) => !a.json,
            Command::Timeline(a) => !a.json,
            Command::Segments(a) => !a.json,
            Command::Oom(a) => !a.json,
            Command::Reconcile(a) => !a.json,
            Command::Top(a) => !a.json,
            Command::Diff(a) => !a.json,
            Command::Check(a) => !a.json,
            Command::Budget(a) => !a.json,
            Command::Redact(a) => !a.json,
            Command::Simulate(a) => !a.json,
            Command::Report(_) | Command::Export(_) => true,
            Command::Flamegraph(_) => false,
        }
    }
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
    /// What was live at a moment (default: the peak), grouped by call site, category,
    /// stack or file: who held the memory.
    Top(TopArgs),
    /// The live bytes at a moment (default: the peak) as a flame graph (SVG, -o), or as
    /// folded stacks (`frame;frame BYTES`) that inferno and speedscope read (--folded).
    Flamegraph(FlamegraphArgs),
    /// Two snapshots compared by call site, category, stack or file at a moment (default:
    /// each one's peak): bytes and counts in each, the change, new and gone groups.
    Diff(DiffArgs),
    /// A VRAM budget from measured snapshots: what the run needs at its peak (weights,
    /// gradients, optimizer state, activations, caches, workspaces, communication,
    /// allocator overhead, memory outside the allocator), which GPUs it fits with
    /// headroom, and from runs at several sizes how it grows and what a new size needs.
    Budget(BudgetArgs),
    /// A budget gate for CI: exit 0 when the peak is within --max-peak and/or within
    /// --tolerance of a --baseline snapshot's, 1 when over (listing the groups that
    /// grew), 2 on bad input.
    Check(CheckArgs),
    /// Write a copy of a snapshot to share: every number kept, file paths cut, user and host
    /// names removed (and function names and code hashed with --strip-code). Runs locally;
    /// nothing is uploaded.
    Redact(RedactArgs),
    /// One self-contained HTML file to share an analysis: summary, timeline, what was
    /// live at the peak and at each OOM, segments, verdicts; nothing loaded when viewed.
    Report(ReportArgs),
    /// Tables for query engines (DuckDB, Spark, Polars): one row per file and device,
    /// per allocation, per stack frame and (--events) per trace entry, as Parquet or JSON
    /// Lines in a folder partitioned by file (schema in docs/export.md).
    Export(ExportArgs),
    /// What if: the recorded requests replayed through a model of PyTorch's caching
    /// allocator, checked against the recording first, on other GPUs (--gpu) and under
    /// other settings (--alloc-conf): would it run out of memory, where and why, and the
    /// smallest device that runs it.
    Simulate(SimulateArgs),
}

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Snapshot file with a trace (recorded with torch.cuda.memory._record_memory_history).
    #[arg(value_name = "SNAPSHOT")]
    pub snapshot: PathBuf,
    #[arg(long, value_name = "N", help = DEVICE_CHOSEN)]
    pub device: Option<i64>,
    /// A GPU to fit: a name (h100, h200, h20, gh200, b200, a100-80gb, a100-40gb, l40s,
    /// rtxa6000, a40, l4, a10, rtx4090, rtx3090, rtx5090, mi300x, mi250x, v100, t4) or a
    /// size (24GiB). Repeatable. Default: the
    /// capacity the recorded out-of-memory error implies, else no limit.
    #[arg(long = "gpu", value_name = "NAME|SIZE", value_parser = parse_gpu)]
    pub gpus: Vec<vramlens::analysis::budget::gpus::Gpu>,
    /// Memory outside the allocator on those GPUs (CUDA context, NCCL buffers, other
    /// libraries): a size such as 800MiB. Default: 1 GiB, the top of the usual range.
    #[arg(long, value_name = "SIZE", value_parser = parse_outside, conflicts_with_all = ["nvml", "log"])]
    pub outside: Option<u64>,
    #[command(flatten)]
    pub device_logs: DeviceLogArgs,
    /// Allocator settings to try, in PYTORCH_CUDA_ALLOC_CONF syntax (read as that
    /// PyTorch release reads it), e.g. "expandable_segments:True" or
    /// "max_split_size_mb:128,garbage_collection_threshold:0.6". Repeatable; the
    /// recording's own settings are always the first scenario.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    pub alloc_confs: Vec<String>,
    /// The PyTorch release whose allocator to model, e.g. 2.4 or 2.10 (default: guessed
    /// from the file's fields).
    #[arg(long, value_name = "VERSION", value_parser = vramlens::allocator::Profile::parse)]
    pub torch: Option<vramlens::allocator::Profile>,
    /// Skip the search for the smallest device (a dozen replays per setting).
    #[arg(long)]
    pub no_min_capacity: bool,
    /// Write a chart of reserved memory per scenario to this SVG file.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Overwrite the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

/// A size, or 0 (nothing outside the allocator).
fn parse_outside(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    vramlens::units::parse_size_arg(s)
}

fn parse_gpu(s: &str) -> Result<vramlens::analysis::budget::gpus::Gpu, String> {
    vramlens::analysis::budget::gpus::find(s)
}

/// A headroom in percent: a number from 0 to 1000.
fn parse_headroom(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1000.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a percentage from 0 to 1000, found {s:?}")),
    }
}

fn parse_vary(s: &str) -> Result<vramlens::analysis::budget::Vary, String> {
    s.parse()
}

fn parse_target(s: &str) -> Result<vramlens::analysis::budget::TargetSize, String> {
    s.parse()
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Snapshot files, or folders of them (the ranks of a job: one section per file and a
    /// table of ranks).
    #[arg(required = true, value_name = "SNAPSHOT")]
    pub files: Vec<PathBuf>,
    /// Write the report to this HTML file.
    #[arg(short, long, value_name = "FILE", required = true)]
    pub output: PathBuf,
    /// Replace the output file if it exists (a regular file only).
    #[arg(long)]
    pub force: bool,
    #[arg(long, value_name = "N", help = DEVICE_CHOSEN)]
    pub device: Option<i64>,
    /// A profiler trace of the same run (Kineto/Chrome JSON or an export_memory_timeline
    /// file) for the reconciliation ledger (with --nvml).
    #[arg(long, value_name = "FILE", requires = "nvml")]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub device_logs: DeviceLogArgs,
    /// Go on when the device log's or the trace's times do not overlap the snapshot's
    /// (without using them).
    #[arg(long)]
    pub allow_no_overlap: bool,
    /// Memory of the device for the OOM verdicts: a byte count, 80GiB (2^30 bytes each)
    /// or 80GB (10^9 bytes each).
    #[arg(long, value_name = "SIZE")]
    pub device_total: Option<String>,
    /// Leave out the page's style sheet and script, a one-line note in place of each: for
    /// golden files of what the report says (hidden: a page without them is not for
    /// sharing).
    #[arg(long, hide = true)]
    pub without_assets: bool,
    #[command(flatten)]
    pub attribution: AttributionArgs,
}

/// The file format of `export`'s tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Parquet,
    Jsonl,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Snapshot files, or folders of them.
    #[arg(required = true, value_name = "SNAPSHOT")]
    pub files: Vec<PathBuf>,
    /// The dataset's folder (OUTDIR/<table>/file=<key>/part-0.<format>): new, empty, or
    /// one export wrote; the files exported are added, replacing their own earlier rows.
    #[arg(short, long, required = true, value_name = "OUTDIR")]
    pub output: PathBuf,
    /// Export only the K-th of N shares of the inputs (from 0: every N-th file of the
    /// list, starting at the K-th), so N tasks given the same list fill one dataset.
    #[arg(long, value_name = "K/N", value_parser = parse_shard)]
    pub shard: Option<Shard>,
    /// parquet or jsonl (JSON Lines).
    #[arg(long, value_enum, default_value = "parquet", value_name = "FORMAT")]
    pub format: ExportFormat,
    /// Write into a folder that holds files export did not write (they are left alone).
    #[arg(long)]
    pub force: bool,
    /// Also the events table: one row per trace entry (as large as the trace).
    #[arg(long)]
    pub events: bool,
    /// Fill the snapshots table's sim_* columns: each device's requests replayed through
    /// the allocator model, the smallest capacity that runs them with the recorded
    /// settings and with expandable segments (a few dozen replays per device).
    #[arg(long)]
    pub simulate: bool,
    /// Only this device (default: every device).
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    #[command(flatten)]
    pub attribution: AttributionArgs,
}

/// `--shard K/N`: the K-th (from 0) of N shares of the inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    let (k, n) = s
        .split_once('/')
        .ok_or_else(|| format!("expected K/N (such as 0/8), found {s:?}"))?;
    let number = |v: &str| {
        v.trim()
            .parse::<u32>()
            .map_err(|_| format!("expected K/N with whole numbers, found {s:?}"))
    };
    let (index, count) = (number(k)?, number(n)?);
    if count == 0 || index >= count {
        return Err(format!(
            "expected K/N with 0 <= K < N (shards count from 0), found {s:?}"
        ));
    }
    Ok(Shard { index, count })
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The snapshot compared against.
    #[arg(value_name = "BASE")]
    pub base: PathBuf,
    /// The snapshot compared.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    /// The moment in each: peak (default), oom, end, event:N or time:T.
    #[arg(long, default_value = "peak", value_name = "MOMENT")]
    pub at: Moment,
    /// Grouping: callsite, category, stack or file.
    #[arg(long, default_value = "callsite", value_name = "KEY")]
    pub by: GroupBy,
    /// Changes listed in text (JSON lists all).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub limit: usize,
    #[arg(long, value_name = "N", help = DEVICE_IN_BOTH)]
    pub device: Option<i64>,
    #[command(flatten)]
    pub attribution: AttributionArgs,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The snapshot checked.
    #[arg(value_name = "SNAPSHOT")]
    pub file: PathBuf,
    /// The budget: the peak may not exceed this (a byte count, 20GiB: 2^30 bytes each, or
    /// 20GB: 10^9 bytes each).
    #[arg(long, value_name = "SIZE")]
    pub max_peak: Option<String>,
    /// A snapshot of the accepted state: the peak may exceed its peak by --tolerance.
    #[arg(long, value_name = "BASE")]
    pub baseline: Option<PathBuf>,
    /// Percent the peak may exceed the baseline's: autotuning and allocator rounding
    /// move peaks between identical runs.
    #[arg(long, default_value_t = 5.0, value_name = "PCT")]
    pub tolerance: f64,
    /// Which peak: allocated (block bytes, as torch.cuda.max_memory_allocated), requested
    /// (the official viewer's timeline) or reserved.
    #[arg(long, default_value = "allocated", value_name = "METRIC")]
    pub metric: String,
    /// Check the value at this moment instead of the peak: end, oom, event:N or time:T
    /// (peak is the default). A file without a trace has its final state only: every
    /// moment is that state.
    #[arg(long, value_name = "MOMENT")]
    pub at: Option<Moment>,
    /// Grouping of the report of what grew: callsite, category, stack or file.
    #[arg(long, default_value = "callsite", value_name = "KEY")]
    pub by: GroupBy,
    #[arg(long, value_name = "N", help = DEVICE_CHOSEN)]
    pub device: Option<i64>,
    #[command(flatten)]
    pub attribution: AttributionArgs,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BudgetArgs {
    /// Snapshots or folders of them: each one run, or a series of one workload at
    /// several batch sizes or sequence lengths.
    #[arg(value_name = "SNAPSHOT", required = true)]
    pub files: Vec<PathBuf>,
    /// A GPU to fit: a name (h100, h200, h20, gh200, b200, a100-80gb, a100-40gb, l40s,
    /// rtxa6000, a40, l4, a10, rtx4090, rtx3090, rtx5090, mi300x, mi250x, v100, t4) or a
    /// size (24GiB). Repeatable; default: rtx4090,
    /// l40s, a100-80gb, h100, h200, b200.
    #[arg(long = "gpu", value_name = "NAME|SIZE", value_parser = parse_gpu)]
    pub gpus: Vec<vramlens::analysis::budget::gpus::Gpu>,
    /// Memory to keep free on the device, in percent of the budget (0 to 1000). Default:
    /// the most the peak varies where the files repeat it (steps, devices), else 10.
    #[arg(long, value_name = "PCT", value_parser = parse_headroom)]
    pub headroom: Option<f64>,
    #[command(flatten)]
    pub device_logs: DeviceLogArgs,
    /// What differs between the files of a series: batch, seq, or batch,seq (both).
    /// Default: what their names state (ctx512, seq256, cl2048; bs8, batch4; both:
    /// bs4_seq512).
    #[arg(long, value_name = "KIND", value_parser = parse_vary)]
    pub vary: Option<vramlens::analysis::budget::Vary>,
    /// The size of one file of a series, FILE=VALUE (FILE=BATCHxSEQ where both vary);
    /// repeatable. Default: from the name.
    #[arg(long = "size", value_name = "FILE=VALUE")]
    pub sizes: Vec<String>,
    /// Predict the budget at this batch size or sequence length (needs a series): a whole
    /// number from 1 to 2^32; where batch and sequence both vary, BATCHxSEQ (8x1024).
    #[arg(long, value_name = "VALUE", value_parser = parse_target)]
    pub target: Option<vramlens::analysis::budget::TargetSize>,
    /// A gate for CI: exit 1 when the budget (or, with --target, the prediction) with the
    /// headroom does not fit every --gpu, or the run ran out of memory (it fits only as far
    /// as its OOM), 0 when it does, 2 on bad input.
    #[arg(long, requires = "gpus")]
    pub check: bool,
    /// Only this device (default: every device of every file: GPUs do not pool memory,
    /// so the one that needs the most decides).
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    /// Write a chart (SVG): the budget of each file stacked by line, the prediction, and
    /// each GPU's capacity.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Overwrite the chart if it exists.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub attribution: AttributionArgs,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct FlamegraphArgs {
    /// Snapshot file.
    #[arg(value_name = "SNAPSHOT")]
    pub file: PathBuf,
    /// Write the flame graph (SVG) here; with --folded, the folded stacks.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Folded stacks instead of SVG: one `frame;frame;frame BYTES` line per stack, root
    /// first, to standard output unless -o is given. The same frames as the graph's boxes
    /// (--all-frames applies).
    #[arg(long)]
    pub folded: bool,
    /// Keep every frame of each stack, Python and C++, as recorded (less the allocator's
    /// and interpreter's plumbing the official viewer hides too). By default a stack is
    /// its Python frames with the C++ frames under the innermost one as one
    /// `(N C++ frames)` box (the C++ glue between two Python frames is left out); a stack
    /// without a Python frame is its call site as `top` names it, e.g.
    /// `(backward of MmBackward0)`, over one `(N C++ frames)` box.
    #[arg(long)]
    pub all_frames: bool,
    /// Overwrite the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// The moment: peak (default), oom, end, event:N or time:T.
    #[arg(long, default_value = "peak", value_name = "MOMENT")]
    pub at: Moment,
    #[arg(long, value_name = "N", help = DEVICE_CHOSEN)]
    pub device: Option<i64>,
    #[command(flatten)]
    pub attribution: AttributionArgs,
}

/// How allocations are attributed to call sites and categories.
#[derive(Args, Debug, Clone, Default)]
pub struct AttributionArgs {
    /// Frames matching this pattern (regex over `filename:line:name`) are never skipped
    /// when looking for the call site, e.g. 'torch/nn/modules/'.
    #[arg(long, value_name = "REGEX")]
    pub keep: Option<String>,
    /// Frames matching this pattern are skipped when looking for the call site, as
    /// torch's own frames are, e.g. 'transformers/'.
    #[arg(long, value_name = "REGEX")]
    pub skip: Option<String>,
    /// Category rules tried before the built-in ones: one `category = regex` per line.
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Snapshot file; several files or a folder (the ranks of a job) give a table of ranks
    /// with the outliers and what differs between the largest rank and the median one.
    #[arg(required = true, value_name = "SNAPSHOT")]
    pub files: Vec<PathBuf>,
    /// The moment: peak (default), oom, end, event:N, or time:T (a UTC date-time as
    /// printed, +1.5s after the first event, or Unix microseconds).
    #[arg(long, default_value = "peak", value_name = "MOMENT")]
    pub at: Moment,
    /// Grouping: callsite (the innermost frame of your code), category, stack or file.
    #[arg(long, default_value = "callsite", value_name = "KEY")]
    pub by: GroupBy,
    /// Groups listed; the rest are merged into one line.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub limit: usize,
    /// Also list leak suspects: groups whose live bytes grew across repeated steps up to
    /// the moment and are still alive there.
    #[arg(long)]
    pub leaks: bool,
    #[arg(long, value_name = "N", help = DEVICE_CHOSEN)]
    pub device: Option<i64>,
    #[command(flatten)]
    pub attribution: AttributionArgs,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct SummaryArgs {
    /// Snapshot files (pickle from torch.cuda.memory._dump_snapshot, gzip or JSON), or
    /// folders of them (every rank of a job: a table of ranks follows); an nvidia-smi or
    /// NVML log is summed up per GPU and process.
    #[arg(required = true, value_name = "SNAPSHOT")]
    pub files: Vec<PathBuf>,
    /// After the reports, a table of the files as ranks of one job (implied by a folder).
    #[arg(long)]
    pub ranks: bool,
    /// Only this device (default: every device).
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    /// For an nvidia-smi log given alone: minutes to add to its local timestamps to get
    /// UTC (e.g. -420 for UTC-7); without it its times are shown as written.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "MINUTES",
        allow_hyphen_values = true
    )]
    pub utc_offset: i32,
    /// One JSON object per file, one per line (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

/// What the x axis counts (described in the --x help, so the help stays compact).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum XArg {
    Events,
    Time,
}

/// The clock of nvidia-smi's readings, as timeline and report word it (budget and
/// reconcile say it in their own words: the log's times, an example offset).
#[derive(Args, Debug)]
pub struct ClockArgs {
    /// Minutes to add to nvidia-smi's local timestamps to get UTC (e.g. -420 for UTC-7).
    #[arg(
        long,
        default_value_t = 0,
        value_name = "MINUTES",
        allow_hyphen_values = true
    )]
    pub utc_offset: i32,
}

/// The run's device logs, one set of options wherever a command takes them: its device
/// readings with their clock, and its out-of-memory messages.
#[derive(Args, Debug)]
pub struct DeviceLogArgs {
    /// Device readings of the run: nvidia-smi CSV or NVML JSON lines (`python -m
    /// vramlens.capture`); they measure the memory outside the allocator (and `report`
    /// draws them and adds the reconciliation ledger). Repeat for several files.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    pub nvml: Vec<PathBuf>,
    /// A log with the run's CUDA out-of-memory messages: the OOM verdicts read them, and
    /// their "this process has X in use" measures the memory outside the allocator.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    #[command(flatten)]
    pub clock: ClockArgs,
}

impl DeviceLogArgs {
    /// The files given: the readings, then the log.
    pub fn files(&self) -> impl Iterator<Item = &std::path::Path> {
        self.nvml
            .iter()
            .map(PathBuf::as_path)
            .chain(self.log.as_deref())
    }
}

#[derive(Args, Debug)]
pub struct TimelineArgs {
    /// Snapshot file (pickle, gzip, JSON or a memory_viz HTML page).
    #[arg(value_name = "SNAPSHOT")]
    pub file: PathBuf,
    /// Write the chart to this SVG file.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Replace the output file if it exists (a regular file only).
    #[arg(long)]
    pub force: bool,
    #[arg(long, value_name = "N", help = DEVICE_CHOSEN)]
    pub device: Option<i64>,
    /// What the x axis counts: events (one step per allocator event, as the official
    /// viewer) or time (milliseconds since the first event; PyTorch 2.2 and later).
    #[arg(long, value_enum, default_value = "events")]
    pub x: XArg,
    /// What the bands are: callsite (the innermost frame of your code), category, stack,
    /// file, or allocation (one band per allocation, as the official viewer draws).
    #[arg(long, default_value = "callsite", value_name = "KEY", value_parser = band_by)]
    pub by: BandBy,
    /// Bands drawn; the rest are merged into one grey band (more are drawn while it
    /// holds over a tenth of the peak).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub top: usize,
    /// Part of the x axis to draw (with -o): event indices for --x events, milliseconds
    /// since the first event for --x time, e.g. 1000..5000.
    #[arg(long, value_name = "A..B")]
    pub window: Option<String>,
    /// List what was live: peak, oom, end, event:N, or time:T (a UTC date-time as
    /// printed, +1.5s after the first event, or Unix microseconds).
    #[arg(long, value_name = "MOMENT")]
    pub at: Option<Moment>,
    /// Frames shown per allocation with --at.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub frames: usize,
    /// Device readings to draw beside PyTorch's lines (nvidia-smi CSV or NVML JSON lines).
    #[arg(long, value_name = "FILE", num_args = 1..)]
    pub nvml: Vec<PathBuf>,
    /// A profiler trace of the same run (Kineto/Chrome JSON, profile_memory=True): lined
    /// up with the snapshot, its record_function ranges and operators are drawn in lanes
    /// under the chart (with -o). A trace given as SNAPSHOT draws its own spans.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub clock: ClockArgs,
    #[command(flatten)]
    pub attribution: AttributionArgs,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct SegmentsArgs {
    /// Snapshot file (pickle, gzip, JSON or a memory_viz HTML page).
    #[arg(value_name = "SNAPSHOT")]
    pub file: PathBuf,
    /// Write the picture to this SVG file.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Replace the output file if it exists (a regular file only).
    #[arg(long)]
    pub force: bool,
    #[arg(long, value_name = "N", help = DEVICE_CHOSEN)]
    pub device: Option<i64>,
    /// The moment: end (default), peak, oom, event:N, or time:T (a UTC date-time as
    /// printed, +1.5s after the first event, or Unix microseconds).
    #[arg(long, default_value = "end", value_name = "MOMENT")]
    pub at: Moment,
    /// How blocks are coloured: by the callsite (default), category, stack or file of the
    /// allocation that made them.
    #[arg(long, default_value = "callsite", value_name = "KEY")]
    pub by: GroupBy,
    #[command(flatten)]
    pub attribution: AttributionArgs,
    /// JSON instead of text (schema in docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct OomArgs {
    /// Snapshots dumped at or after the OOM, or folders of them (several: one report
    /// each, e.g. every rank).
    #[arg(value_name = "SNAPSHOT")]
    pub snapshots: Vec<PathBuf>,
    /// A log with "CUDA out of memory" messages (both forms PyTorch has printed).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Memory of the device: a byte count, 80GiB (2^30 bytes each) or 80GB (10^9 bytes
    /// each). Else taken from the OOM message when given.
    #[arg(long, value_name = "SIZE")]
    pub device_total: Option<String>,
    /// Only this device (default: every device).
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    #[command(flatten)]
    pub attribution: AttributionArgs,
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
    /// JSON lines from `python -m vramlens.capture`. Repeat for several files.
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub nvml: Vec<PathBuf>,
    /// A profiler trace of the same run (Kineto/Chrome JSON with [memory] events, or an
    /// export_memory_timeline file): lined up with the snapshot, its totals join the ledger.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub clock: ClockArgs,
    /// Only this device (default: every device).
    #[arg(long, value_name = "N")]
    pub device: Option<i64>,
    /// The GPU of the device log to read: nvidia-smi's index, or for a log without an
    /// index column the GPU's place in the log (from 0).
    #[arg(long, value_name = "N")]
    pub gpu: Option<i64>,
    /// Go on when the device log's or the trace's times do not overlap the snapshot's
    /// (without using them).
    #[arg(long)]
    pub allow_no_overlap: bool,
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
    /// Also replace the function names and line numbers of your own code, and code text,
    /// by keyed hashes (equal frames stay equal, distinct frames stay distinct). Libraries'
    /// frames (torch, installed packages, Python's standard library) and the names the
    /// category rules read (`forward`, `__init__`, `step`, a loss, ...) stay, so the copy
    /// has the original's categories (docs/redaction.md).
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Command {
        let mut all = vec!["vramlens"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap().command
    }

    #[test]
    fn groupings_and_moments_are_typed_with_their_defaults() {
        let Command::Top(t) = parse(&["top", "f.pickle"]) else {
            panic!("top");
        };
        assert_eq!((t.by, t.at), (GroupBy::Callsite, Moment::Peak));
        let Command::Top(t) = parse(&["top", "f.pickle", "--by", "stack", "--at", "event:7"])
        else {
            panic!("top");
        };
        assert_eq!((t.by, t.at), (GroupBy::Stack, Moment::Event(7)));
        // The segments' default moment is the end, said where the option is.
        let Command::Segments(s) = parse(&["segments", "f.pickle"]) else {
            panic!("segments");
        };
        assert_eq!(s.at, Moment::End);
        let Command::Timeline(t) = parse(&["timeline", "f.pickle", "--by", "allocation"]) else {
            panic!("timeline");
        };
        assert_eq!((t.by, t.at), (BandBy::Allocation, None));
        let Command::Timeline(t) = parse(&["timeline", "f.pickle", "--at", "oom"]) else {
            panic!("timeline");
        };
        assert_eq!(
            (t.by, t.at),
            (BandBy::Group(GroupBy::Callsite), Some(Moment::Oom))
        );
        let Command::Diff(d) = parse(&["diff", "a", "b", "--by", "file", "--at", "end"]) else {
            panic!("diff");
        };
        assert_eq!((d.by, d.at), (GroupBy::File, Moment::End));
    }

    #[test]
    fn a_bad_grouping_or_moment_is_refused_with_what_is_expected() {
        let err = |args: &[&str]| {
            let mut all = vec!["vramlens"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all).unwrap_err().to_string()
        };
        let e = err(&["top", "f", "--by", "colour"]);
        assert!(e.contains("invalid value 'colour' for '--by <KEY>': expected callsite, category, stack or file"), "{e}");
        let e = err(&["timeline", "f", "--by", "colour"]);
        assert!(
            e.contains("expected callsite, category, stack, file or allocation"),
            "{e}"
        );
        let e = err(&["segments", "f", "--at", "lunch"]);
        assert!(
            e.contains("invalid value 'lunch' for '--at <MOMENT>': expected peak, oom, end"),
            "{e}"
        );
    }
}
