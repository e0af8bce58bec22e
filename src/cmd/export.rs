//! `vramlens export`: every file's tables into one folder, partitioned by file.
//!
//! Files are read and written in parallel, each into its own partition folders
//! (`OUTDIR/<table>/file=<name>/part-0.<ext>`), so the bytes of every file are the same
//! for any number of threads. Everything is written under a hidden folder inside OUTDIR
//! first and moved into place at the end: a failed run leaves the tables that were there.
//! OUTDIR and the tables in it are never reached through a link, and an OUTDIR that is not
//! empty is written into only with `--force`, which replaces just the tables written.

use super::attribution_options;
use super::read_snapshot;
use crate::cli::{ExportArgs, ExportFormat};
use anyhow::{Context, Result, anyhow, bail};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use vramlens::analysis::attribution::{AttributionOptions, Attributor};
use vramlens::analysis::device::check_device;
use vramlens::analysis::summary::{Summary, SummaryOptions, analyze_summary};
use vramlens::export::{
    PARTITION_COLUMN, RowCounts, Source, Table, TableWriter, partition_names, write_events,
    write_lifetimes, write_snapshot_rows, write_stacks,
};
use vramlens::input::ReadOptions;
use vramlens::model::Snapshot;

/// The tables an export writes.
fn tables(events: bool) -> Vec<Table> {
    Table::ALL
        .into_iter()
        .filter(|t| events || *t != Table::Events)
        .collect()
}

fn extension(format: ExportFormat) -> &'static str {
    match format {
        ExportFormat::Parquet => "parquet",
        ExportFormat::Jsonl => "jsonl",
    }
}

/// What a path is, for a refusal.
fn kind_of(meta: &fs::Metadata) -> &'static str {
    let ft = meta.file_type();
    if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_file() {
        "a file"
    } else {
        "not a folder"
    }
}

/// Every check of the output folder before any input is read: a real folder (or a new
/// name in an existing folder), empty unless `--force`, and with `--force` the tables to
/// replace real folders too.
pub fn check_output_dir(out: &Path, force: bool, events: bool) -> Result<()> {
    let meta = match fs::symlink_metadata(out) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent = out
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !parent.is_dir() {
                bail!(
                    "{}: folder {} does not exist",
                    out.display(),
                    parent.display()
                );
            }
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("cannot check {}", out.display())),
    };
    if !meta.file_type().is_dir() {
        bail!(
            "{}: is {}; export writes its tables into a folder (a new name, or an existing folder)",
            out.display(),
            kind_of(&meta)
        );
    }
    // What a killed run left is no reason to refuse the folder.
    remove_stale_staging(out);
    let mut entries =
        fs::read_dir(out).with_context(|| format!("cannot read folder {}", out.display()))?;
    if entries.next().is_none() {
        return Ok(());
    }
    let names: Vec<&str> = tables(events).iter().map(|t| t.name()).collect();
    if !force {
        bail!(
            "{}: already exists and is not empty; use --force to replace the tables export writes there ({})",
            out.display(),
            names.join(", ")
        );
    }
    for name in names {
        let path = out.join(name);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(m) => bail!(
                "{}: is {}; export replaces only the table folders it wrote",
                path.display(),
                kind_of(&m)
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot check {}", path.display())),
        }
    }
    Ok(())
}

/// Removes the hidden folders of earlier runs that were killed before they could clean
/// up (`.vramlens-export.PID.NONCE`, PID no longer running). Only where the running
/// processes can be told (`/proc`); only folders, never a link; a folder that cannot be
/// removed is left as it is (the tables never read it: it is not a table's name).
fn remove_stale_staging(out: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = fs::read_dir(out) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(".vramlens-export."))
        else {
            continue;
        };
        let Some((pid, nonce)) = rest.split_once('.') else {
            continue;
        };
        let ours = pid.parse::<u32>().is_ok()
            && nonce.len() == 16
            && nonce.bytes().all(|b| b.is_ascii_hexdigit());
        if !ours || Path::new("/proc").join(pid).exists() {
            continue;
        }
        let path = e.path();
        if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_dir()) {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// The hidden folder inside OUTDIR that the tables are written to first.
struct Staging {
    out: PathBuf,
    dir: PathBuf,
    /// OUTDIR was made by this run (removed again when nothing is published).
    created: bool,
    done: bool,
}

impl Staging {
    fn create(out: &Path) -> Result<Staging> {
        let created = match fs::create_dir(out) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Checked before: a real folder. Checked again: not a link planted since.
                let meta = fs::symlink_metadata(out)
                    .with_context(|| format!("cannot check {}", out.display()))?;
                if !meta.file_type().is_dir() {
                    bail!(
                        "{}: is {}; expected a folder",
                        out.display(),
                        kind_of(&meta)
                    );
                }
                false
            }
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", out.display())),
        };
        let pid = std::process::id();
        let mut last = None;
        for _ in 0..64 {
            // A random part so that no other process can plant something at the name.
            let nonce = RandomState::new().hash_one(pid);
            let dir = out.join(format!(".vramlens-export.{pid}.{nonce:016x}"));
            match fs::create_dir(&dir) {
                Ok(()) => {
                    return Ok(Staging {
                        out: out.to_path_buf(),
                        dir,
                        created,
                        done: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot write into {}", out.display()));
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
            .with_context(|| format!("cannot write into {}", out.display()))
    }

    /// The partition folder of a table for one file.
    fn partition(&self, table: Table, name: &str) -> PathBuf {
        self.dir
            .join(table.name())
            .join(format!("{PARTITION_COLUMN}={name}"))
    }

    /// The same place once published, for messages.
    fn published(&self, table: Table, name: &str) -> PathBuf {
        self.out
            .join(table.name())
            .join(format!("{PARTITION_COLUMN}={name}"))
    }

    /// Moves each table into place, replacing the one there (`--force` was checked).
    fn publish(mut self, tables: &[Table], force: bool) -> Result<()> {
        for &t in tables {
            let src = self.dir.join(t.name());
            if !src.exists() {
                fs::create_dir(&src).with_context(|| format!("cannot create {}", src.display()))?;
            }
            let dst = self.out.join(t.name());
            match fs::symlink_metadata(&dst) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("cannot check {}", dst.display())),
                Ok(m) if m.file_type().is_dir() && force => {
                    // Moved aside first (inside the hidden folder, removed with it), so
                    // the table is missing only between two renames.
                    let old = self.dir.join(format!("replaced-{}", t.name()));
                    fs::rename(&dst, &old)
                        .with_context(|| format!("cannot replace {}", dst.display()))?;
                }
                Ok(m) if m.file_type().is_dir() => bail!(
                    "{}: already exists; use --force to replace it",
                    dst.display()
                ),
                Ok(m) => bail!(
                    "{}: is {}; export replaces only the table folders it wrote",
                    dst.display(),
                    kind_of(&m)
                ),
            }
            fs::rename(&src, &dst).with_context(|| format!("cannot write {}", dst.display()))?;
        }
        self.done = true;
        fs::remove_dir_all(&self.dir)
            .with_context(|| format!("cannot remove {}", self.dir.display()))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_dir_all(&self.dir);
            if self.created {
                // Only if still empty: nothing else is ever removed.
                let _ = fs::remove_dir(&self.out);
            }
        }
    }
}

/// SHA-256 of a regular file's bytes (the page cache holds the file; this process does
/// not). None for standard input, pipes and devices.
fn sha256_file(path: &Path) -> Option<String> {
    if path.as_os_str() == "-" || !fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let mut hasher = Sha256::new();
    vramlens::input::for_each_piece(path, |piece| hasher.update(piece)).ok()?;
    let digest = hasher.finalize();
    let mut hex = String::with_capacity(64);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
    }
    Some(hex)
}

/// A writer for one table of one file.
fn table_writer(
    format: ExportFormat,
    table: Table,
    file: File,
) -> io::Result<Box<dyn TableWriter>> {
    let out = BufWriter::with_capacity(1 << 16, file);
    match format {
        ExportFormat::Jsonl => Ok(Box::new(vramlens::export::jsonl::JsonlWriter::new(
            out,
            table.columns(),
        ))),
        #[cfg(feature = "parquet")]
        ExportFormat::Parquet => Ok(Box::new(vramlens::export::parquet::ParquetWriter::new(
            out,
            table.name(),
            table.columns(),
        )?)),
        #[cfg(not(feature = "parquet"))]
        ExportFormat::Parquet => Err(io::Error::other(NO_PARQUET)),
    }
}

#[cfg(not(feature = "parquet"))]
const NO_PARQUET: &str = "--format parquet: this vramlens was built without Parquet support \
    (cargo feature `parquet`); use --format jsonl, or build it with the default features";

/// Redaction hook: every string export writes comes from the snapshot read here (frame
/// file names and function names, settings, action names) or from its path. When the
/// redaction module is part of the build, `export --redact` applies its rules to the
/// snapshot at this point, before any row is made; until then the snapshot passes
/// through unchanged.
fn before_export(snap: Snapshot) -> Snapshot {
    snap
}

struct Job<'a> {
    format: ExportFormat,
    tables: &'a [Table],
    device: Option<i64>,
    attribution: &'a AttributionOptions,
    staging: &'a Staging,
}

/// Reads one file and writes its partition of every table. The summary behind the
/// `snapshots` row is computed beside the other tables (it is a replay of its own, and
/// the lifetimes' three threads leave part of two cores idle).
fn export_file(job: &Job, path: &Path, name: &str) -> Result<RowCounts> {
    let (sha256, read) = rayon::join(
        || sha256_file(path),
        || read_snapshot(path, ReadOptions { progress: true }),
    );
    let (snap, info) = read?;
    let snap = before_export(snap);
    check_device(&snap, job.device).map_err(|e| anyhow!("{}: {e}", info.path))?;
    let devices: Vec<i64> = snap
        .devices()
        .into_iter()
        .filter(|d| job.device.is_none_or(|want| want == *d))
        .collect();
    let write_table = |table: Table, summary: Option<&Summary>| -> Result<u64> {
        let dir = job.staging.partition(table, name);
        let file_name = format!("part-0.{}", extension(job.format));
        let shown = job.staging.published(table, name).join(&file_name);
        let written = (|| -> io::Result<u64> {
            fs::create_dir_all(&dir)?;
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(dir.join(&file_name))?;
            let mut w = table_writer(job.format, table, file)?;
            match table {
                Table::Snapshots => write_snapshot_rows(
                    summary.expect("the snapshots table is written with the summary"),
                    &Source {
                        sha256: sha256.as_deref(),
                    },
                    &mut *w,
                )?,
                Table::Lifetimes => write_lifetimes(
                    &snap,
                    &devices,
                    Attributor::new(&snap.frames, job.attribution),
                    &mut *w,
                )?,
                Table::Events => write_events(&snap, &devices, &mut *w)?,
                Table::Stacks => write_stacks(&snap, &mut *w)?,
            }
            w.finish()
        })();
        written.map_err(|e| anyhow!("cannot write {}: {e}", shown.display()))
    };
    let (summary, others) = rayon::join(
        || analyze_summary(&snap, &info, SummaryOptions { device: job.device }),
        || -> Result<RowCounts> {
            let mut counts = RowCounts::default();
            for &table in job.tables.iter().filter(|t| **t != Table::Snapshots) {
                counts.add(table, write_table(table, None)?);
            }
            Ok(counts)
        },
    );
    let written = others.and_then(|mut counts| {
        if job.tables.contains(&Table::Snapshots) {
            counts.add(
                Table::Snapshots,
                write_table(Table::Snapshots, Some(&summary))?,
            );
        }
        Ok(counts)
    });
    if written.is_err() {
        // A file is in the dataset whole or not at all.
        for &t in job.tables {
            let _ = fs::remove_dir_all(job.staging.partition(t, name));
        }
    }
    written
}

pub fn run(args: &ExportArgs, out: &mut dyn Write) -> Result<()> {
    #[cfg(not(feature = "parquet"))]
    if args.format == ExportFormat::Parquet {
        bail!(NO_PARQUET);
    }
    let attribution = attribution_options(&args.attribution)?;
    let files = super::expand_inputs(&args.files)?;
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let names = partition_names(&paths);
    let tables = tables(args.events);
    let staging = Staging::create(&args.output)?;
    let job = Job {
        format: args.format,
        tables: &tables,
        device: args.device,
        attribution: &attribution,
        staging: &staging,
    };
    let results: Vec<Result<RowCounts>> = files
        .par_iter()
        .zip(names.par_iter())
        .map(|(path, name)| export_file(&job, path, name))
        .collect();
    let mut total = RowCounts::default();
    let mut exported = 0;
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(c) => {
                exported += 1;
                for t in Table::ALL {
                    total.add(t, c.rows(t));
                }
            }
            Err(e) => errors.push(e),
        }
    }
    // Nothing is replaced when no file could be read.
    if exported > 0 {
        staging.publish(&tables, args.force)?;
        let counts: Vec<String> = tables
            .iter()
            .map(|&t| format!("{} {} rows", t.name(), total.rows(t)))
            .collect();
        writeln!(
            out,
            "exported {exported} of {} files to {} ({}): {}",
            files.len(),
            args.output.display(),
            extension(args.format),
            counts.join(", ")
        )?;
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(super::Failures(errors).into()),
    }
}
