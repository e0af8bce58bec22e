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
