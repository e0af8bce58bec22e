//! `vramlens export`: every file's tables into one dataset folder, partitioned by file.
//!
//! Each file's rows go to a partition of its own in every table
//! (`OUTDIR/<table>/file=<key>/part-0.<ext>`), its key made from its name, its bytes and
//! its path ([`partition_key`]), so the bytes of every file are the same for any number of
//! threads, and the same input is the same partition whichever run, shard or machine
//! wrote it: exporting it again replaces its rows. Everything is written under a
//! hidden folder inside OUTDIR first and each partition moved into place at the end, with
//! the run's manifest (`OUTDIR/manifest/`). Several exports (the shards of one job) may
//! write into one OUTDIR at once. OUTDIR and the folders in it are never reached through a
//! link, and an OUTDIR holding anything export did not write is written into only with
//! `--force`.

use crate::cli::{ExportArgs, ExportFormat, Shard};
use crate::cmd::attribution_options;
use crate::cmd::read_snapshot;
use anyhow::{Context, Result, anyhow, bail};
use rayon::prelude::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use vramlens::analysis::device::check_device;
use vramlens::analysis::kinds::attribution::{AttributionOptions, Attributor};
use vramlens::analysis::reports::summary::{DeviceSummary, summary_with};
use vramlens::analysis::what_if::simulate::{FleetFigures, fleet_figures};
use vramlens::export::{
    PARTITION_COLUMN, RowCounts, SCHEMA_VERSION, Source, Table, TableWriter, WithSource,
    partition_key, write_events, write_lifetimes, write_snapshot_rows, write_stacks,
};
use vramlens::input::ReadOptions;
use vramlens::model::Snapshot;

/// The folder of OUTDIR that holds the manifests of the exports written into it.
pub const MANIFEST_DIR: &str = "manifest";

/// Names of the hidden folders exports write into first.
const STAGING_PREFIX: &str = ".vramlens-export.";

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

/// Is the name one export writes at the top of OUTDIR?
fn is_export_entry(name: &str) -> bool {
    name == MANIFEST_DIR
        || name.starts_with(STAGING_PREFIX)
        || Table::ALL.iter().any(|t| t.name() == name)
}

/// What export reads of a manifest in OUTDIR: its schema version and the partition
/// each file was exported to.
#[derive(serde::Deserialize)]
struct ManifestSeen {
    #[serde(default)]
    schema_version: Value,
    #[serde(default)]
    files: Vec<FileSeen>,
}

#[derive(serde::Deserialize)]
struct FileSeen {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    status: Option<String>,
}

/// The manifests in OUTDIR, by file name, and the entries of `manifest/` that were not
/// read, each with why (a link, a pipe, a device or a file too long is never opened or
/// read whole: other writers share the folder).
fn read_manifests(out: &Path) -> (Vec<(String, ManifestSeen)>, Vec<String>) {
    let dir = out.join(MANIFEST_DIR);
    let Ok(entries) = fs::read_dir(&dir) else {
        return (Vec::new(), Vec::new());
    };
    let mut names: Vec<std::ffi::OsString> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    let mut found = Vec::new();
    let mut not_read = Vec::new();
    for name in names {
        let shown = name.to_string_lossy().into_owned();
        if !shown.ends_with(".json") {
            continue;
        }
        let path = dir.join(&name);
        match crate::cmd::output::outdir::read_regular(&path) {
            Ok(bytes) => {
                if let Ok(m) = serde_json::from_slice::<ManifestSeen>(&bytes) {
                    found.push((shown, m));
                }
            }
            Err(why) => not_read.push(format!("{}: {why}", crate::cmd::shown_path(&path))),
        }
    }
    (found, not_read)
}

/// The schema version of every manifest in OUTDIR that is not this release's, with its
/// file name.
fn other_schema_versions(manifests: &[(String, ManifestSeen)]) -> Vec<(String, String)> {
    manifests
        .iter()
        .filter(|(_, m)| m.schema_version != json!(SCHEMA_VERSION))
        .map(|(name, m)| (name.clone(), m.schema_version.to_string()))
        .collect()
}

/// The input each partition key of OUTDIR's manifests was exported from: (path as
/// recorded, SHA-256, manifest), the first manifest by name where several say.
fn keys_taken(out: &Path) -> BTreeMap<String, (String, String, String)> {
    let mut taken = BTreeMap::new();
    for (name, m) in read_manifests(out).0 {
        for f in m.files {
            if f.status.as_deref() != Some("exported") {
                continue;
            }
            if let (Some(key), Some(path), Some(sha)) = (f.file, f.path, f.sha256) {
                taken.entry(key).or_insert((path, sha, name.clone()));
            }
        }
    }
    taken
}

/// Every check of the output folder before any input is read: a real folder (or a new
/// name in an existing folder); one that holds anything but what export writes only with
/// `--force`; its table and manifest folders real folders; no tables of another schema
/// version.
pub fn check_output_dir(out: &Path, force: bool, _events: bool) -> Result<()> {
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
    let mut names: Vec<String> = fs::read_dir(out)
        .with_context(|| format!("cannot read folder {}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    let foreign: Vec<&String> = names.iter().filter(|n| !is_export_entry(n)).collect();
    if !foreign.is_empty() && !force {
        let shown: Vec<&str> = foreign.iter().take(3).map(|s| s.as_str()).collect();
        bail!(
            "{}: holds files export did not write ({}{}); use --force to write its tables there (those files are left alone)",
            out.display(),
            shown.join(", "),
            if foreign.len() > 3 { ", ..." } else { "" }
        );
    }
    for name in Table::ALL.iter().map(|t| t.name()).chain([MANIFEST_DIR]) {
        let path = out.join(name);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(m) => bail!(
                "{}: is {}; export writes only into the folders it made",
                path.display(),
                kind_of(&m)
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot check {}", crate::cmd::shown_path(&path)));
            }
        }
    }
    let has_tables = Table::ALL
        .iter()
        .any(|t| names.iter().any(|n| n == t.name()));
    if has_tables && !names.iter().any(|n| n == MANIFEST_DIR) {
        bail!(
            "{}: holds tables of an earlier vramlens (schema version 1, no manifest); export into a new folder",
            out.display()
        );
    }
    let (manifests, not_read) = read_manifests(out);
    for why in &not_read {
        eprintln!("vramlens: skipped {why}");
    }
    if let Some((file, version)) = other_schema_versions(&manifests).first() {
        bail!(
            "{}: holds tables of schema version {version} ({MANIFEST_DIR}/{file}); this vramlens writes version {SCHEMA_VERSION}: export into a new folder",
            out.display()
        );
    }
    Ok(())
}

/// Removes the hidden folders of earlier runs that ended before they could clean up
/// (killed): only those known to be stale ([`crate::cmd::output::outdir::is_stale`]: their writer's
/// lock can be taken on this machine, or they have none and are a day old). A folder
/// another writer may own (on another machine, in another PID namespace) is left alone;
/// so is one that cannot be removed (the tables never read it: it is not a table's name).
fn remove_stale_staging(out: &Path) {
    let Ok(entries) = fs::read_dir(out) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(STAGING_PREFIX)) else {
            continue;
        };
        let Some((pid, nonce)) = rest.split_once('.') else {
            continue;
        };
        let ours = pid.parse::<u32>().is_ok()
            && nonce.len() == 16
            && nonce.bytes().all(|b| b.is_ascii_hexdigit());
        if !ours {
            continue;
        }
        let path = e.path();
        if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_dir())
            && crate::cmd::output::outdir::is_stale(&path)
        {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// Creates a folder unless it is there; never through a link.
fn ensure_dir(path: &Path) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(path)
                .with_context(|| format!("cannot check {}", crate::cmd::shown_path(path)))?;
            if meta.file_type().is_dir() {
                Ok(())
            } else {
                bail!(
                    "{}: is {}; export writes only into the folders it made",
                    path.display(),
                    kind_of(&meta)
                )
            }
        }
        Err(e) => Err(e).with_context(|| format!("cannot create {}", crate::cmd::shown_path(path))),
    }
}

/// The hidden folder inside OUTDIR that the tables are written to first.
struct Staging {
    out: PathBuf,
    dir: PathBuf,
    /// OUTDIR was made by this run (removed again when nothing is published).
    created: bool,
    done: bool,
    /// The lock on the folder's lock file, held while this run writes (what tells other
    /// writers the folder is in use); `None` where locks cannot be taken.
    _lock: Option<File>,
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
            let dir = out.join(format!("{STAGING_PREFIX}{pid}.{nonce:016x}"));
            match fs::create_dir(&dir) {
                Ok(()) => {
                    let mut staging = Staging {
                        out: out.to_path_buf(),
                        dir,
                        created,
                        done: false,
                        _lock: None,
                    };
                    staging._lock = crate::cmd::output::outdir::lock_staging(&staging.dir)
                        .with_context(|| format!("cannot write into {}", out.display()))?;
                    return Ok(staging);
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

    /// The partition folder of a table for one file, the `slot`-th input of the run (each
    /// input writes a folder of its own, whatever its key).
    fn partition(&self, slot: usize, table: Table, key: &str) -> PathBuf {
        self.dir
            .join(slot.to_string())
            .join(table.name())
            .join(format!("{PARTITION_COLUMN}={key}"))
    }

    /// The same place once published, for messages.
    fn published(&self, table: Table, key: &str) -> PathBuf {
        self.out
            .join(table.name())
            .join(format!("{PARTITION_COLUMN}={key}"))
    }

    /// Moves each file's partitions into place, replacing the ones there (the same file's
    /// rows from an earlier export), then the manifest. The manifest folder is made first,
    /// so a folder with tables always has one (what tells it from an older export).
    fn publish(
        mut self,
        tables: &[Table],
        keys: &[(usize, &str)],
        manifest: (&str, &[u8]),
    ) -> Result<()> {
        let manifests = self.out.join(MANIFEST_DIR);
        ensure_dir(&manifests)?;
        let replaced = self.dir.join("replaced");
        fs::create_dir(&replaced)
            .with_context(|| format!("cannot write into {}", self.dir.display()))?;
        for &t in tables {
            let table_dir = self.out.join(t.name());
            ensure_dir(&table_dir)?;
            let old_dir = replaced.join(t.name());
            fs::create_dir(&old_dir)
                .with_context(|| format!("cannot write into {}", self.dir.display()))?;
            for (i, &(slot, key)) in keys.iter().enumerate() {
                let src = self.partition(slot, t, key);
                let dst = self.published(t, key);
                // Another export of the same file may publish it at the same moment:
                // whichever comes last stays (the rows are the same file's).
                let mut tries = 0;
                loop {
                    match fs::symlink_metadata(&dst) {
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(e)
                                .with_context(|| format!("cannot check {}", dst.display()));
                        }
                        Ok(m) if m.file_type().is_dir() => {
                            // Moved aside first (removed with the hidden folder), so the
                            // partition is missing only between two renames.
                            let old = old_dir.join(format!("{i}.{tries}"));
                            match fs::rename(&dst, &old) {
                                Ok(()) => {}
                                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                                Err(e) => {
                                    return Err(e).with_context(|| {
                                        format!("cannot replace {}", dst.display())
                                    });
                                }
                            }
                        }
                        Ok(m) => bail!(
                            "{}: is {}; export replaces only the partitions it wrote",
                            dst.display(),
                            kind_of(&m)
                        ),
                    }
                    match fs::rename(&src, &dst) {
                        Ok(()) => break,
                        Err(_) if tries < 8 && dst.exists() => tries += 1,
                        Err(e) => {
                            return Err(e)
                                .with_context(|| format!("cannot write {}", dst.display()));
                        }
                    }
                }
            }
        }
        let (name, bytes) = manifest;
        let staged = self.dir.join(name);
        fs::write(&staged, bytes).with_context(|| format!("cannot write {}", staged.display()))?;
        let dst = manifests.join(name);
        fs::rename(&staged, &dst).with_context(|| format!("cannot write {}", dst.display()))?;
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

fn hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// An input, hashed: a regular file is hashed from its mapped pages while it is read;
/// standard input, a pipe or a device is read once, here, and its bytes kept.
struct Input {
    sha256: String,
    key: String,
    held: Option<Vec<u8>>,
}

/// Hashes an input (SHA-256 of its bytes as stored).
fn hash_input(path: &Path, key_path: &Path) -> Result<Input> {
    let regular = path.as_os_str() != "-" && fs::metadata(path).is_ok_and(|m| m.is_file());
    let shown = || {
        if path.as_os_str() == "-" {
            "standard input".to_string()
        } else {
            path.display().to_string()
        }
    };
    let (sha256, held) = if regular {
        let mut hasher = Sha256::new();
        vramlens::input::for_each_piece(path, |piece| hasher.update(piece))
            .with_context(|| format!("cannot read {}", shown()))?;
        (hex(&hasher.finalize()), None)
    } else {
        let mut bytes = Vec::new();
        if path.as_os_str() == "-" {
            io::stdin().lock().read_to_end(&mut bytes)
        } else {
            File::open(path).and_then(|mut f| f.read_to_end(&mut bytes))
        }
        .with_context(|| format!("cannot read {}", shown()))?;
        (hex(&Sha256::digest(&bytes)), Some(bytes))
    };
    Ok(Input {
        key: partition_key(key_path, &sha256),
        sha256,
        held,
    })
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

/// Every string export writes comes from the snapshot read here (frame file names and
/// function names, settings, action names), redacted by [`read_snapshot`] with
/// `--redact`, or from its path (as recorded: redacted with `--redact`).
fn before_export(snap: Snapshot) -> Snapshot {
    snap
}

struct Job<'a> {
    format: ExportFormat,
    simulate: bool,
    tables: &'a [Table],
    device: Option<i64>,
    attribution: &'a AttributionOptions,
    staging: &'a Staging,
    /// `--redact`: the key and `source_path` are made from the recorded path.
    redacting: bool,
}

/// Reads one file and writes its partition of every table. The summary behind the
/// `snapshots` row comes from the replay that makes the `lifetimes` rows (one replay per
/// device), so that table is written last.
fn export_file(
    job: &Job,
    slot: usize,
    path: &Path,
    recorded: &str,
    hashed: &mut Option<Input>,
) -> Result<RowCounts> {
    let key_path = if job.redacting {
        Path::new(recorded)
    } else {
        path
    };
    // A regular file is hashed while it is read (each from the mapped file); anything
    // else is read once, by the hash, and decoded from the bytes kept.
    let regular = path.as_os_str() != "-" && fs::metadata(path).is_ok_and(|m| m.is_file());
    let (snap, info) = if regular {
        let (input, read) = rayon::join(
            || hash_input(path, key_path),
            || read_snapshot(path, ReadOptions { progress: true }),
        );
        *hashed = Some(input?);
        read?
    } else {
        let input = hash_input(path, key_path)?;
        let bytes = input.held.as_deref().unwrap_or_default();
        let read = crate::cmd::read_snapshot_bytes(bytes, &path.display().to_string());
        *hashed = Some(input);
        read?
    };
    let mut info = info;
    if job.redacting {
        info.path = recorded.to_string();
    }
    let input = hashed.as_ref().expect("hashed above");
    let name = input.key.as_str();
    let snap = before_export(snap);
    check_device(&snap, job.device).map_err(|e| anyhow!("{}: {e}", info.path))?;
    let devices: Vec<i64> = snap
        .devices()
        .into_iter()
        .filter(|d| job.device.is_none_or(|want| want == *d))
        .collect();
    // The summaries the lifetimes' replay found, one per device.
    let mut summaries: Vec<DeviceSummary> = Vec::new();
    let mut write_table = |table: Table| -> Result<u64> {
        let dir = job.staging.partition(slot, table, name);
        let file_name = format!("part-0.{}", extension(job.format));
        let shown = job.staging.published(table, name).join(&file_name);
        let written = (|| -> io::Result<u64> {
            fs::create_dir_all(&dir)?;
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(dir.join(&file_name))?;
            let mut w = table_writer(job.format, table, file)?;
            if table != Table::Snapshots {
                w = Box::new(WithSource::new(w, &info.path, &input.sha256));
            }
            match table {
                Table::Snapshots => {
                    let summary =
                        summary_with(&snap, &info, &devices, std::mem::take(&mut summaries));
                    let source = Source {
                        sha256: &input.sha256,
                    };
                    let simulated: Vec<(i64, FleetFigures)> = if job.simulate {
                        use rayon::prelude::*;
                        devices
                            .par_iter()
                            .filter_map(|&d| fleet_figures(&snap, d).map(|f| (d, f)))
                            .collect()
                    } else {
                        Vec::new()
                    };
                    write_snapshot_rows(&summary, &source, &simulated, &mut *w)?
                }
                Table::Lifetimes => {
                    let attr = Attributor::new(&snap.frames, job.attribution);
                    summaries = write_lifetimes(&snap, &devices, attr, &mut *w)?;
                }
                Table::Events => write_events(&snap, &devices, &mut *w)?,
                Table::Stacks => write_stacks(&snap, &mut *w)?,
            }
            w.finish()
        })();
        written.map_err(|e| anyhow!("cannot write {}: {e}", shown.display()))
    };
    let others = job.tables.iter().filter(|t| **t != Table::Snapshots);
    let snapshots = job.tables.iter().filter(|t| **t == Table::Snapshots);
    let written = others
        .chain(snapshots)
        .try_fold(RowCounts::default(), |mut counts, &table| {
            counts.add(table, write_table(table)?);
            Ok(counts)
        });
    if written.is_err() {
        // A file is in the dataset whole or not at all.
        for &t in job.tables {
            let _ = fs::remove_dir_all(job.staging.partition(slot, t, name));
        }
    }
    written
}

/// What became of one input of this export.
enum Outcome {
    Exported(RowCounts),
    /// The same path as an earlier input, given again: one partition holds both.
    Duplicate(usize),
    Failed(anyhow::Error),
}

/// The SHA-256 of the whole input list (each path as given, or with `--redact` as
/// recorded, then a newline), naming the job that the shards of one dataset share.
fn list_sha256(files: &[String]) -> String {
    let mut hasher = Sha256::new();
    for f in files {
        hasher.update(f.as_bytes());
        hasher.update(b"\n");
    }
    hex(&hasher.finalize())
}

fn rows_json(c: &RowCounts, tables: &[Table]) -> Value {
    let map: serde_json::Map<String, Value> = tables
        .iter()
        .map(|&t| (t.name().to_string(), json!(c.rows(t))))
        .collect();
    Value::Object(map)
}

/// The files of the shard asked for: every N-th of the list, from the K-th.
fn shard_files<T: Clone>(all: &[T], shard: Shard) -> Vec<T> {
    all.iter()
        .enumerate()
        .filter(|(i, _)| *i as u64 % u64::from(shard.count) == u64::from(shard.index))
        .map(|(_, f)| f.clone())
        .collect()
}

/// For each file, the earlier place of the same path in the list, if any: a path given
/// twice (as a file and in its folder, say) is exported once, the first time, as both
/// would be the same partition.
fn duplicates_of(files: &[PathBuf]) -> Vec<Option<usize>> {
    let mut first_of: BTreeMap<&Path, usize> = BTreeMap::new();
    files
        .iter()
        .enumerate()
        .map(|(i, f)| match first_of.get(f.as_path()) {
            Some(&j) => Some(j),
            None => {
                first_of.insert(f.as_path(), i);
                None
            }
        })
        .collect()
}

/// What the files' outcomes add up to: the rows, the partitions written, the manifest's
/// entry of each file, the duplicates and the errors, in the files' order.
#[derive(Default)]
struct Tally<'h> {
    total: RowCounts,
    /// The partitions to publish: (input's place in the run, key).
    keys: Vec<(usize, &'h str)>,
    errors: Vec<anyhow::Error>,
    manifest_files: Vec<Value>,
    duplicates: Vec<String>,
}

/// The inputs of a run as its manifest and tables record them.
struct Recorded<'a> {
    /// Each input's path as given, in the files' order.
    given: &'a [PathBuf],
    /// Each input's path as recorded (as given, or redacted), in the files' order.
    paths: &'a [String],
    /// The partition keys OUTDIR's manifests hold, each with its input ([`keys_taken`]).
    taken: &'a BTreeMap<String, (String, String, String)>,
}

fn tally<'h>(
    recorded: &Recorded,
    outcomes: Vec<Outcome>,
    hashed: &'h [Option<Input>],
    tables: &[Table],
) -> Tally<'h> {
    let mut t = Tally::default();
    // The keys of this run so far: key to (input, SHA-256).
    let mut claimed: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for (i, (o, h)) in outcomes.into_iter().zip(hashed).enumerate() {
        let path = recorded.paths[i].as_str();
        let (key, sha) = match h {
            Some(input) => (json!(input.key), json!(input.sha256)),
            None => (Value::Null, Value::Null),
        };
        let mut entry = json!({"path": path, "file": key, "sha256": sha});
        // A key names one input (its path and bytes): one taken by another input, in this
        // run or in OUTDIR, is refused rather than its rows replaced.
        let o = match (o, h) {
            (Outcome::Exported(c), Some(input)) => {
                let mine = (path, input.sha256.as_str());
                let key = input.key.as_str();
                match claimed.get(key) {
                    Some(&(j, sha)) if (recorded.paths[j].as_str(), sha) == mine => {
                        Outcome::Duplicate(j)
                    }
                    Some(&(j, _)) => Outcome::Failed(key_taken(
                        path,
                        key,
                        &format!(
                            "{} of this export",
                            vramlens::units::shown(&recorded.paths[j])
                        ),
                    )),
                    None => match recorded.taken.get(key) {
                        Some((p, sha, manifest)) if (p.as_str(), sha.as_str()) != mine => {
                            Outcome::Failed(key_taken(
                                path,
                                key,
                                &format!(
                                    "{} (sha256 {}) in {MANIFEST_DIR}/{}",
                                    vramlens::units::shown(p),
                                    vramlens::units::shown(sha),
                                    vramlens::units::shown(manifest)
                                ),
                            ))
                        }
                        _ => {
                            claimed.insert(key, (i, &input.sha256));
                            Outcome::Exported(c)
                        }
                    },
                }
            }
            (o, _) => o,
        };
        match o {
            Outcome::Exported(c) => {
                for table in Table::ALL {
                    t.total.add(table, c.rows(table));
                }
                if let Some(input) = h {
                    t.keys.push((i, &input.key));
                }
                entry["status"] = json!("exported");
                entry["rows"] = rows_json(&c, tables);
            }
            Outcome::Duplicate(j) => {
                entry["status"] = json!("duplicate");
                entry["duplicate_of"] = json!(recorded.paths[j]);
                t.duplicates.push(format!(
                    "{} (as {})",
                    vramlens::units::shown(path),
                    vramlens::units::shown(&recorded.paths[j])
                ));
            }
            Outcome::Failed(e) => {
                entry["status"] = json!("failed");
                // The message names the file as given; the manifest as recorded.
                let given = &recorded.given[i];
                let error = format!("{e:#}")
                    .replace(&crate::cmd::shown_path(given), path)
                    .replace(&given.display().to_string(), path);
                entry["error"] = json!(error);
                t.errors.push(e);
            }
        }
        t.manifest_files.push(entry);
    }
    t
}

/// The refusal of an input whose partition key another input holds.
fn key_taken(path: &str, key: &str, holder: &str) -> anyhow::Error {
    anyhow!(
        "{}: its partition key {key} is taken by {holder}; nothing of it was written (a key names one input: give this file at another path, or export into another folder)",
        vramlens::units::shown(path)
    )
}

/// The manifest of the run (its file name and bytes): the inputs, the shard, each file's
/// outcome and the files of the folders left out.
/// What the inputs' folders held that was not read.
struct Passed<'a> {
    /// Files that are not a snapshot by name or content (as recorded).
    files: &'a [String],
    /// Folders with no snapshot file, each with why.
    folders: &'a [String],
}

fn manifest(
    args: &ExportArgs,
    all: &[String],
    passed: Passed,
    shard: Shard,
    tables: &[Table],
    manifest_files: Vec<Value>,
) -> Result<(String, Vec<u8>)> {
    let list = list_sha256(all);
    let manifest = json!({
        "schema_version": SCHEMA_VERSION,
        "vramlens": env!("CARGO_PKG_VERSION"),
        "format": extension(args.format),
        "tables": tables.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "device": args.device,
        "inputs": {"files": all.len(), "list_sha256": list},
        "shard": {"index": shard.index, "count": shard.count},
        "files": manifest_files,
        "skipped": passed.files.iter().map(|p| json!({
            "path": p,
            "reason": "not a snapshot: no snapshot extension, and not a pickle or gzip stream by its first bytes",
        })).collect::<Vec<_>>(),
        "skipped_folders": passed.folders,
    });
    let name = format!(
        "{}.shard-{:05}-of-{:05}.json",
        &list[..16],
        shard.index,
        shard.count
    );
    let mut bytes = serde_json::to_vec_pretty(&manifest)?;
    bytes.push(b'\n');
    Ok((name, bytes))
}

/// The line saying what was exported, and the paths given twice.
fn write_exported(
    out: &mut dyn Write,
    args: &ExportArgs,
    t: &Tally,
    files: usize,
    all: usize,
    shard: Shard,
    tables: &[Table],
) -> Result<()> {
    let counts: Vec<String> = tables
        .iter()
        .map(|&table| format!("{} {} rows", table.name(), t.total.rows(table)))
        .collect();
    let of_shard = if shard.count > 1 {
        format!(" (shard {}/{} of {all} inputs)", shard.index, shard.count)
    } else {
        String::new()
    };
    writeln!(
        out,
        "exported {} of {files} files{of_shard} to {} ({}): {}",
        t.keys.len(),
        crate::cmd::shown_path(&args.output),
        extension(args.format),
        counts.join(", ")
    )?;
    if !t.duplicates.is_empty() {
        writeln!(
            out,
            "not exported again, given twice: {}",
            t.duplicates.join(", ")
        )?;
    }
    Ok(())
}

/// The files of the folders that were left out, named.
fn write_skipped(out: &mut dyn Write, skipped: &[String]) -> Result<()> {
    if skipped.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = skipped
        .iter()
        .map(|p| vramlens::units::shown(p).into_owned())
        .collect();
    writeln!(
        out,
        "left out {} file{} of the folders that {} not a snapshot by name or content: {}",
        skipped.len(),
        if skipped.len() == 1 { "" } else { "s" },
        if skipped.len() == 1 { "is" } else { "are" },
        names.join(", ")
    )?;
    Ok(())
}

pub fn run(args: &ExportArgs, out: &mut dyn Write) -> Result<()> {
    #[cfg(not(feature = "parquet"))]
    if args.format == ExportFormat::Parquet {
        bail!(NO_PARQUET);
    }
    let attribution = attribution_options(&args.attribution)?;
    let inputs = crate::cmd::expand_inputs_listing(&args.files)?;
    let (all, skipped) = (inputs.files, inputs.left_out);
    let shard = args.shard.unwrap_or(Shard { index: 0, count: 1 });
    // Every shard lists the same inputs: the first says what was passed over, once for
    // the dataset (each manifest keeps it).
    let says_inputs = shard.index == 0;
    if says_inputs {
        for why in &inputs.empty_folders {
            eprintln!("vramlens: skipped {why}");
        }
    }
    let files = shard_files(&all, shard);
    // Paths as the manifest and the tables record them: the whole list's (and the files
    // left out), cut together with --redact, so that every shard records them alike.
    let mut listed: Vec<&Path> = all.iter().map(PathBuf::as_path).collect();
    listed.extend(skipped.iter().map(PathBuf::as_path));
    let mut all_recorded = crate::cmd::recorded_paths(&listed);
    let skipped_recorded = all_recorded.split_off(all.len());
    let paths = shard_files(&all_recorded, shard);
    let tables = tables(args.events);
    let staging = Staging::create(&args.output)?;
    let duplicate_of = duplicates_of(&files);
    let job = Job {
        format: args.format,
        simulate: args.simulate,
        tables: &tables,
        device: args.device,
        attribution: &attribution,
        staging: &staging,
        redacting: crate::cmd::redacting(),
    };
    let (outcomes, hashed): (Vec<Outcome>, Vec<Option<Input>>) = files
        .par_iter()
        .zip(duplicate_of.par_iter())
        .enumerate()
        .map(|(slot, (path, dup))| match dup {
            Some(j) => (Outcome::Duplicate(*j), None),
            None => {
                let mut hashed = None;
                let outcome = match export_file(&job, slot, path, &paths[slot], &mut hashed) {
                    Ok(c) => Outcome::Exported(c),
                    Err(e) => Outcome::Failed(e),
                };
                (outcome, hashed)
            }
        })
        .unzip();
    let taken = keys_taken(&args.output);
    let recorded = Recorded {
        given: &files,
        paths: &paths,
        taken: &taken,
    };
    let mut t = tally(&recorded, outcomes, &hashed, &tables);
    // Nothing is written when no file could be read, except a shard's manifest (so that
    // a reader sees the shard ran, with what failed, and a shard with no file at all).
    if !t.keys.is_empty() || files.is_empty() || args.shard.is_some() {
        let entries = std::mem::take(&mut t.manifest_files);
        let passed_over = Passed {
            files: &skipped_recorded,
            folders: &inputs.empty_folders,
        };
        let (name, bytes) = manifest(args, &all_recorded, passed_over, shard, &tables, entries)?;
        staging.publish(&tables, &t.keys, (&name, &bytes))?;
        write_exported(out, args, &t, files.len(), all.len(), shard, &tables)?;
    }
    if says_inputs {
        write_skipped(out, &skipped_recorded)?;
    }
    match t.errors.len() {
        0 => Ok(()),
        1 => Err(t.errors.remove(0)),
        _ => Err(crate::cmd::Failures(t.errors).into()),
    }
}
