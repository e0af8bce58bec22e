//! Tables for query engines: snapshots, allocation lifetimes, trace events and stacks as
//! rows, written as Parquet or JSON Lines (the schema is in `docs/export.md`).
//!
//! Takes a decoded [`Snapshot`] with its [`Summary`] and gives rows to a [`TableWriter`],
//! one table at a time. Lifetimes come from the replay engine ([`DeviceReplay`]): a row is
//! written when an allocation's memory goes back to the allocator, the ones still alive
//! and the survivors when the pass ends, so no table is ever held whole. Call sites and
//! categories are the attribution's ([`Attributor`]), computed once per stack.
//!
//! It does not choose files, folders or names on disk (that is the command's), and it
//! writes no file itself: a writer owns the bytes.

pub mod jsonl;
#[cfg(feature = "parquet")]
pub mod parquet;

use crate::analysis::kinds::attribution::{Attributor, GroupKey, GroupKind, Site};
use crate::analysis::kinds::decision::Evidence;
use crate::analysis::reports::summary::{DeviceSummary, Summary, SummaryPass};
use crate::model::frames::FxMap;
use crate::model::{Action, Snapshot, StackId};
use crate::timeline::replay::{Aggregator, DeviceReplay, End, PoolId, PoolLookup, Running};
use crate::timeline::{Lifetime, Origin};
use std::io;
use std::path::Path;
use std::sync::mpsc::{SyncSender, sync_channel};

/// Version of the tables' schema (columns, types, meanings). Raised on any change that
/// could break a query; added columns raise it too.
pub const SCHEMA_VERSION: u32 = 5;

/// The type of a column, as engines see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A signed 64-bit integer (bytes, event indices, times in microseconds).
    I64,
    /// An unsigned 64-bit integer (addresses and stream handles, which may reach 2^63).
    U64,
    F64,
    Bool,
    /// UTF-8 text.
    Str,
    /// A moment in UTC, in microseconds since the Unix epoch (a Parquet TIMESTAMP).
    Timestamp,
}

impl Kind {
    /// The name `docs/export.md` uses.
    pub fn name(self) -> &'static str {
        match self {
            Kind::I64 => "int64",
            Kind::U64 => "uint64",
            Kind::F64 => "double",
            Kind::Bool => "boolean",
            Kind::Str => "string",
            Kind::Timestamp => "timestamp",
        }
    }
}

/// One column of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub kind: Kind,
    pub nullable: bool,
    /// Values are mostly distinct (addresses, event indices, times): a dictionary would
    /// cost time and save nothing, so Parquet stores them plain.
    pub distinct: bool,
}

pub(crate) const fn col(name: &'static str, kind: Kind) -> Column {
    Column {
        name,
        kind,
        nullable: false,
        distinct: false,
    }
}

pub(crate) const fn opt(name: &'static str, kind: Kind) -> Column {
    Column {
        name,
        kind,
        nullable: true,
        distinct: false,
    }
}

impl Column {
    pub(crate) const fn distinct(self) -> Column {
        Column {
            distinct: true,
            ..self
        }
    }
}

/// One value of a row, in the order of the table's columns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cell<'a> {
    I64(Option<i64>),
    U64(Option<u64>),
    F64(Option<f64>),
    Bool(Option<bool>),
    Str(Option<&'a str>),
    /// Microseconds since the Unix epoch, UTC.
    Ts(Option<i64>),
}

impl Cell<'_> {
    pub fn kind(&self) -> Kind {
        match self {
            Cell::I64(_) => Kind::I64,
            Cell::U64(_) => Kind::U64,
            Cell::F64(_) => Kind::F64,
            Cell::Bool(_) => Kind::Bool,
            Cell::Str(_) => Kind::Str,
            Cell::Ts(_) => Kind::Timestamp,
        }
    }

    pub fn is_null(&self) -> bool {
        match self {
            Cell::I64(v) => v.is_none(),
            Cell::U64(v) => v.is_none(),
            Cell::F64(v) => v.is_none(),
            Cell::Bool(v) => v.is_none(),
            Cell::Str(v) => v.is_none(),
            Cell::Ts(v) => v.is_none(),
        }
    }
}

/// Bytes, event indices and times: below 2^63 by construction (the decoder checks sizes
/// and their sums; event indices are below 2^32).
fn int(v: u64) -> Cell<'static> {
    Cell::I64(Some(v.min(i64::MAX as u64) as i64))
}

fn int_opt(v: Option<u64>) -> Cell<'static> {
    Cell::I64(v.map(|v| v.min(i64::MAX as u64) as i64))
}

/// The tables, in the order they are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Snapshots,
    Lifetimes,
    Events,
    Stacks,
}

impl Table {
    pub const ALL: [Table; 4] = [
        Table::Snapshots,
        Table::Lifetimes,
        Table::Events,
        Table::Stacks,
    ];

    /// The folder name of the table in the output folder.
    pub fn name(self) -> &'static str {
        match self {
            Table::Snapshots => "snapshots",
            Table::Lifetimes => "lifetimes",
            Table::Events => "events",
            Table::Stacks => "stacks",
        }
    }

    /// The columns of the table's files. The partition column `file` is not among them:
    /// it is the name of the folder each file's rows are in (`file=<key>`).
    pub fn columns(self) -> &'static [Column] {
        match self {
            Table::Snapshots => &SNAPSHOT_COLUMNS,
            Table::Lifetimes => &LIFETIME_COLUMNS,
            Table::Events => &EVENT_COLUMNS,
            Table::Stacks => &STACK_COLUMNS,
        }
    }
}

/// The partition column: every table is split into one folder per input file.
pub const PARTITION_COLUMN: &str = "file";

/// `source_path` and `source_sha256`: the first columns of every table but `snapshots`
/// (which has them among its own), added by [`WithSource`] to the rows the `write_*`
/// functions make.
pub const SOURCE_COLUMNS: usize = 2;

impl Table {
    /// The columns of the rows the `write_*` function of the table gives.
    pub fn row_columns(self) -> &'static [Column] {
        match self {
            Table::Snapshots => self.columns(),
            _ => &self.columns()[SOURCE_COLUMNS..],
        }
    }
}

/// The widest row of any table.
const MAX_COLUMNS: usize = 64;

/// Puts the file's path and SHA-256 in front of every row of a table (every table but
/// `snapshots`), so any table can be joined or filtered by file alone.
pub struct WithSource {
    inner: Box<dyn TableWriter>,
    path: String,
    sha256: String,
}

impl WithSource {
    pub fn new(inner: Box<dyn TableWriter>, path: &str, sha256: &str) -> Self {
        WithSource {
            inner,
            path: path.to_string(),
            sha256: sha256.to_string(),
        }
    }
}

impl TableWriter for WithSource {
    fn write_row(&mut self, cells: &[Cell]) -> io::Result<()> {
        let n = cells.len() + SOURCE_COLUMNS;
        if n > MAX_COLUMNS {
            return Err(row_misfit());
        }
        let mut row = [Cell::I64(None); MAX_COLUMNS];
        row[0] = Cell::Str(Some(&self.path));
        row[1] = Cell::Str(Some(&self.sha256));
        row[SOURCE_COLUMNS..n].copy_from_slice(cells);
        self.inner.write_row(&row[..n])
    }

    fn finish(self: Box<Self>) -> io::Result<u64> {
        self.inner.finish()
    }
}

use Kind::{Bool, F64, I64, Str, Timestamp, U64};

const SNAPSHOT_COLUMNS: [Column; 46] = [
    col("schema_version", I64),
    col("source_path", Str),
    col("source_sha256", Str),
    col("source_size_bytes", I64),
    col("source_format", Str),
    col("gzip", Bool),
    col("layout_min_release", Str),
    opt("layout_max_release", Str),
    opt("expandable_segments", Bool),
    opt("max_split_size_bytes", I64),
    opt("garbage_collection_threshold", F64),
    opt("alloc_conf", Str),
    col("warnings", I64),
    opt("device", I64),
    col("segments", I64),
    col("reserved_bytes", I64),
    col("allocated_bytes", I64),
    col("requested_bytes", I64),
    col("trace_events", I64),
    opt("trace_first_time_us", I64),
    opt("trace_first_time", Timestamp),
    opt("trace_last_time_us", I64),
    opt("trace_last_time", Timestamp),
    col("trace_looks_truncated", Bool),
    col("trace_has_timeline", Bool),
    opt("peak_requested_bytes", I64),
    opt("peak_requested_event", I64),
    opt("peak_requested_time_us", I64),
    opt("peak_requested_time", Timestamp),
    opt("peak_allocated_bytes", I64),
    opt("peak_allocated_event", I64),
    opt("peak_allocated_time_us", I64),
    opt("peak_allocated_time", Timestamp),
    opt("peak_reserved_bytes", I64),
    opt("peak_reserved_event", I64),
    opt("peak_reserved_time_us", I64),
    opt("peak_reserved_time", Timestamp),
    col("oom_count", I64),
    opt("first_oom_event", I64),
    opt("first_oom_request_bytes", I64),
    opt("first_oom_device_free_bytes", I64),
    opt("first_oom_time_us", I64),
    opt("first_oom_time", Timestamp),
    opt("sim_model_exact", Bool),
    opt("sim_min_capacity_bytes", I64),
    opt("sim_min_capacity_expandable_bytes", I64),
];

const LIFETIME_COLUMNS: [Column; 27] = [
    col("source_path", Str),
    col("source_sha256", Str),
    col("device", I64),
    col("addr", U64).distinct(),
    col("version", I64),
    col("requested_bytes", I64),
    col("block_bytes", I64),
    col("stream", U64),
    opt("pool_id", Str),
    col("origin", Str),
    opt("alloc_event", I64).distinct(),
    opt("alloc_time_us", I64).distinct(),
    opt("alloc_time", Timestamp).distinct(),
    opt("free_requested_event", I64).distinct(),
    opt("free_requested_time_us", I64).distinct(),
    opt("free_requested_time", Timestamp).distinct(),
    opt("free_completed_event", I64).distinct(),
    opt("free_completed_time_us", I64).distinct(),
    opt("free_completed_time", Timestamp).distinct(),
    col("callsite", Str),
    col("callsite_short", Str),
    col("callsite_kind", Str),
    col("category", Str),
    col("category_evidence", Str),
    col("category_inferred", Bool),
    opt("stack_id", I64),
    opt("free_stack_id", I64),
];

const EVENT_COLUMNS: [Column; 13] = [
    col("source_path", Str),
    col("source_sha256", Str),
    col("device", I64),
    col("event", I64).distinct(),
    col("action", Str),
    opt("addr", U64).distinct(),
    col("size_bytes", I64),
    col("stream", U64),
    opt("pool_id", Str),
    opt("time_us", I64).distinct(),
    opt("time", Timestamp).distinct(),
    opt("stack_id", I64),
    opt("device_free_bytes", I64),
];

const STACK_COLUMNS: [Column; 7] = [
    col("source_path", Str),
    col("source_sha256", Str),
    col("stack_id", I64),
    col("frame", I64),
    col("filename", Str),
    col("line", I64),
    col("name", Str),
];

/// Receives the rows of one table of one file (from any one thread).
pub trait TableWriter: Send {
    /// One row: a cell per column, in the table's order.
    fn write_row(&mut self, cells: &[Cell]) -> io::Result<()>;
    /// Writes what is buffered and ends the file; gives the number of rows.
    fn finish(self: Box<Self>) -> io::Result<u64>;
}

/// A row that does not fit the table is a bug in this module, not bad input.
pub(crate) fn check_row(columns: &[Column], cells: &[Cell]) -> io::Result<()> {
    let fits = columns.len() == cells.len()
        && columns
            .iter()
            .zip(cells)
            .all(|(c, v)| c.kind == v.kind() && (c.nullable || !v.is_null()));
    if fits { Ok(()) } else { Err(row_misfit()) }
}

pub(crate) fn row_misfit() -> io::Error {
    io::Error::other("internal error: a row does not fit the table's columns")
}

/// What export writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExportOptions {
    /// Also the `events` table (one row per trace entry).
    pub events: bool,
}

/// Where a snapshot came from, beside what the reader reported.
#[derive(Debug, Clone)]
pub struct Source<'a> {
    /// SHA-256 of the file's bytes as stored, in lowercase hex.
    pub sha256: &'a str,
}

/// Rows written per table of one file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowCounts {
    pub snapshots: u64,
    pub lifetimes: u64,
    pub events: u64,
    pub stacks: u64,
}

impl RowCounts {
    pub fn rows(&self, table: Table) -> u64 {
        match table {
            Table::Snapshots => self.snapshots,
            Table::Lifetimes => self.lifetimes,
            Table::Events => self.events,
            Table::Stacks => self.stacks,
        }
    }

    pub fn add(&mut self, table: Table, rows: u64) {
        match table {
            Table::Snapshots => self.snapshots += rows,
            Table::Lifetimes => self.lifetimes += rows,
            Table::Events => self.events += rows,
            Table::Stacks => self.stacks += rows,
        }
    }
}

/// The `pool_id` pair as one value, such as `0,0` (the default pool) or `1,0`; each
/// pool's text made once (a device has a handful).
#[derive(Default)]
struct PoolTexts(Vec<((i64, i64), String)>);

impl PoolTexts {
    fn of(&mut self, pool: PoolId) -> Option<&str> {
        let pool = pool?;
        let i = match self.0.iter().position(|(p, _)| *p == pool) {
            Some(i) => i,
            None => {
                self.0.push((pool, format!("{},{}", pool.0, pool.1)));
                self.0.len() - 1
            }
        };
        Some(&self.0[i].1)
    }
}

/// A stack id as exported: None for an absent or empty stack (nothing in `stacks`).
fn stack_cell(snap: &Snapshot, stack: Option<StackId>) -> Cell<'static> {
    Cell::I64(
        stack
            .filter(|&s| !snap.frames.stack(s).is_empty())
            .map(|s| s.0 as i64),
    )
}

/// The `snapshots` rows of a file: one per device of the summary, or one with a null
/// device when the file has none.
pub fn write_snapshot_rows(
    summary: &Summary,
    source: &Source,
    simulated: &[(i64, crate::analysis::what_if::simulate::FleetFigures)],
    out: &mut dyn TableWriter,
) -> io::Result<()> {
    let empty = DeviceSummary::default();
    let no_device = [None];
    let devices: Vec<Option<&DeviceSummary>> = if summary.devices.is_empty() {
        no_device.to_vec()
    } else {
        summary.devices.iter().map(Some).collect()
    };
    let warnings: u64 = summary.warnings.total();
    for d in devices {
        let dev = d.unwrap_or(&empty);
        let first_oom = dev.ooms.first();
        let sim = d.and_then(|d| {
            simulated
                .iter()
                .find(|(device, _)| *device == d.device)
                .map(|(_, f)| f)
        });
        let event = |e: Option<u32>| Cell::I64(e.map(i64::from));
        let row = [
            int(SCHEMA_VERSION as u64),
            Cell::Str(Some(&summary.source.path)),
            Cell::Str(Some(source.sha256)),
            int(summary.source.size_bytes),
            Cell::Str(Some(summary.source.format.name())),
            Cell::Bool(Some(summary.source.gzip)),
            Cell::Str(Some(summary.layout.min_release)),
            Cell::Str(summary.layout.max_release),
            Cell::Bool(summary.settings.expandable_segments),
            int_opt(summary.settings.max_split_size_bytes),
            Cell::F64(
                summary
                    .settings
                    .garbage_collection_threshold
                    .filter(|v| v.is_finite()),
            ),
            Cell::Str(summary.settings.alloc_conf.as_deref()),
            int(warnings),
            Cell::I64(d.map(|d| d.device)),
            int(dev.segments as u64),
            int(dev.reserved_bytes),
            int(dev.allocated_bytes),
            int(dev.requested_bytes),
            int(dev.trace.events as u64),
            Cell::I64(dev.trace.first_time_us),
            Cell::Ts(dev.trace.first_time_us),
            Cell::I64(dev.trace.last_time_us),
            Cell::Ts(dev.trace.last_time_us),
            Cell::Bool(Some(dev.trace.looks_truncated)),
            Cell::Bool(Some(dev.trace.has_timeline)),
            int_opt(dev.peak_requested_bytes),
            event(dev.peak_requested_event),
            Cell::I64(dev.peak_requested_time_us),
            Cell::Ts(dev.peak_requested_time_us),
            int_opt(dev.peak_allocated_bytes),
            event(dev.peak_allocated_event),
            Cell::I64(dev.peak_allocated_time_us),
            Cell::Ts(dev.peak_allocated_time_us),
            int_opt(dev.peak_reserved_bytes),
            event(dev.peak_reserved_event),
            Cell::I64(dev.peak_reserved_time_us),
            Cell::Ts(dev.peak_reserved_time_us),
            int(dev.ooms.len() as u64),
            int_opt(first_oom.map(|o| o.index as u64)),
            int_opt(first_oom.map(|o| o.size)),
            int_opt(first_oom.and_then(|o| o.device_free)),
            Cell::I64(first_oom.and_then(|o| o.time_us)),
            Cell::Ts(first_oom.and_then(|o| o.time_us)),
            Cell::Bool(sim.map(|f| f.model_exact)),
            int_opt(sim.and_then(|f| f.min_capacity_bytes)),
            int_opt(sim.and_then(|f| f.min_capacity_expandable_bytes)),
        ];
        out.write_row(&row)?;
    }
    Ok(())
}

/// Call site and its kind of one stack, as written.
#[derive(Clone)]
struct Names {
    callsite: String,
    /// The call site as `top` shows it.
    short: String,
    kind: GroupKind,
}

/// Attribution names, computed once per stack; categories, per allocation by the rules
/// of its device.
struct SiteNames<'f> {
    attr: Attributor<'f>,
    /// The categories of each device, in the order of the replays.
    devices: Vec<crate::analysis::kinds::categories::DeviceCategories<'f>>,
    /// One slot per stack id, then one for "no stack" and one for "before recording".
    slots: Vec<Option<Names>>,
}

impl<'f> SiteNames<'f> {
    fn new(attr: Attributor<'f>, replays: &[DeviceReplay<'f>]) -> Self {
        let devices = replays
            .iter()
            .map(|r| crate::analysis::kinds::categories::DeviceCategories::build(r, &attr))
            .collect();
        SiteNames {
            slots: vec![None; attr.frames().stack_count() + 2],
            devices,
            attr,
        }
    }

    fn compute(&self, l: &Lifetime) -> Names {
        let site = self.attr.site(l);
        let callsite = self.attr.site_name(&site);
        let kind = Attributor::kind(&GroupKey::Site(site));
        Names {
            short: crate::render::words::labels::group_display(&callsite, kind),
            callsite,
            kind,
        }
    }

    /// The category of a lifetime of the `device`-th replay, and what decided it.
    fn category(
        &self,
        device: usize,
        l: &Lifetime,
    ) -> (&str, crate::analysis::kinds::categories::Decision) {
        let d = match self.devices.get(device) {
            Some(c) => c.decide(&self.attr, l),
            None => self.attr.decide(l),
        };
        let name = self
            .attr
            .categories
            .get(d.category as usize)
            .map_or("other", String::as_str);
        (name, d)
    }

    /// The slot of a lifetime's names: its stack's when the stack has frames; else the
    /// site tells (an empty stack names no frame, so the origin decides, as it does for
    /// no stack at all).
    fn slot(&self, l: &Lifetime) -> usize {
        let stacks = self.slots.len() - 2;
        match Attributor::allocation_stack(l) {
            Some(s) if (s.0 as usize) < stacks && !self.attr.frames().stack(s).is_empty() => {
                s.0 as usize
            }
            _ if self.attr.site(l) == Site::BeforeRecording => stacks + 1,
            _ => stacks,
        }
    }

    /// Finds a lifetime's names, once per slot; [`SiteNames::of`] then reads them.
    fn fill(&mut self, l: &Lifetime) {
        let i = self.slot(l);
        if self.slots[i].is_none() {
            self.slots[i] = Some(self.compute(l));
        }
    }

    /// A lifetime's names, found by [`SiteNames::fill`].
    fn of(&self, l: &Lifetime) -> &Names {
        self.slots[self.slot(l)]
            .as_ref()
            .expect("filled before it is read")
    }
}

/// A lifetime the replay closed (its free completed, or the pass ended with it alive),
/// with what its row needs from that pass.
struct Closed {
    /// Index of the device among the replays.
    device: usize,
    lifetime: Lifetime,
    /// A survivor's stream and pool: its segment's, known only to the pass.
    segment: Option<(u64, PoolId)>,
}

/// Lifetimes handed from the replay to the row writer at a time.
const BATCH: usize = 16_384;

/// Collects the lifetimes of one device's replay in the order of the rows, and hands
/// them over in batches.
struct Collect<'s> {
    device: usize,
    batch: Vec<Closed>,
    send: &'s SyncSender<Vec<Closed>>,
    /// The writer stopped (on an error it reports): the rest is dropped.
    stopped: bool,
}

impl Collect<'_> {
    fn add(&mut self, lifetime: &Lifetime, segment: Option<(u64, PoolId)>) {
        if self.stopped {
            return;
        }
        self.batch.push(Closed {
            device: self.device,
            lifetime: *lifetime,
            segment,
        });
        if self.batch.len() >= BATCH {
            self.hand_over();
        }
    }

    fn hand_over(&mut self) {
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        if !batch.is_empty() && self.send.send(batch).is_err() {
            self.stopped = true;
        }
    }
}

impl Aggregator for Collect<'_> {
    fn wants_versions(&self) -> bool {
        true
    }

    fn free_completed(&mut self, _i: usize, l: &Lifetime, _run: &Running) {
        self.add(l, None);
    }

    fn finish(&mut self, end: &End) {
        for l in end.open {
            self.add(l, None);
        }
        for l in end.survivors {
            let stream = end.streams.get(l.stream as usize).copied().unwrap_or(0);
            let pool = end.pools.get(l.pool as usize).copied().flatten();
            self.add(l, Some((stream, pool)));
        }
        self.hand_over();
    }
}

/// Makes and writes the rows of closed lifetimes.
struct LifetimeRows<'a, 'f> {
    snap: &'a Snapshot,
    replays: &'a [DeviceReplay<'a>],
    /// One per replay.
    pools: Vec<PoolLookup>,
    pool_texts: PoolTexts,
    names: SiteNames<'f>,
    /// Each evidence's code, written once.
    evidence_codes: FxMap<Evidence, String>,
    out: &'a mut dyn TableWriter,
}

impl LifetimeRows<'_, '_> {
    fn write(&mut self, closed: &Closed) -> io::Result<()> {
        let l = &closed.lifetime;
        let replay = &self.replays[closed.device];
        let trace = replay.trace;
        // Stream and pool: the alloc's (or, from before the trace, the free's); a
        // survivor's are its segment's.
        let (stream, pool) = match (closed.segment, l.alloc.or(l.free_completed)) {
            (Some(segment), _) => segment,
            (None, Some(e)) => (
                trace.get(e.index()).stream,
                self.pools[closed.device].pool(replay, e.index()),
            ),
            (None, None) => (0, None),
        };
        let time_us =
            |e: Option<crate::timeline::EventIdx>| e.and_then(|e| trace.time_us(e.index()));
        let event = |e: Option<crate::timeline::EventIdx>| Cell::I64(e.map(|e| e.index() as i64));
        let origin = match l.origin {
            Origin::Traced => "traced",
            Origin::BeforeTrace => "before_trace",
            Origin::Survivor => "survivor",
        };
        let pool = self.pool_texts.of(pool);
        let free_stack = match l.origin {
            Origin::BeforeTrace => l.stack(),
            _ => None,
        };
        let snap = self.snap;
        self.names.fill(l);
        let names = self.names.of(l);
        let (category, decision) = self.names.category(closed.device, l);
        let evidence = self
            .evidence_codes
            .entry(decision.evidence)
            .or_insert_with(|| decision.evidence.code(&snap.frames));
        let row = [
            Cell::I64(Some(replay.device)),
            Cell::U64(Some(l.addr)),
            int(l.version as u64),
            int(l.size),
            int(replay.block_bytes_of(l)),
            Cell::U64(Some(stream)),
            Cell::Str(pool),
            Cell::Str(Some(origin)),
            event(l.alloc),
            Cell::I64(time_us(l.alloc)),
            Cell::Ts(time_us(l.alloc)),
            event(l.free_requested),
            Cell::I64(time_us(l.free_requested)),
            Cell::Ts(time_us(l.free_requested)),
            event(l.free_completed),
            Cell::I64(time_us(l.free_completed)),
            Cell::Ts(time_us(l.free_completed)),
            Cell::Str(Some(&names.callsite)),
            Cell::Str(Some(&names.short)),
            Cell::Str(Some(names.kind.name())),
            Cell::Str(Some(category)),
            Cell::Str(Some(evidence)),
            Cell::Bool(Some(decision.inferred())),
            stack_cell(snap, Attributor::allocation_stack(l)),
            stack_cell(snap, free_stack),
        ];
        self.out.write_row(&row)
    }
}

/// The `lifetimes` rows of the given devices: allocations whose free completed, in the
/// order of those frees, then the ones still alive at the end by allocation, then the
/// survivors from before the trace.
///
/// The replay runs here while another thread makes the rows of the lifetimes it closed
/// (names, pools, times looked up in the trace) and hands them to the writer. The same
/// replay finds each device's summary (for the `snapshots` row), given back in the order
/// of `devices`.
pub fn write_lifetimes(
    snap: &Snapshot,
    devices: &[i64],
    attr: Attributor,
    out: &mut dyn TableWriter,
) -> io::Result<Vec<DeviceSummary>> {
    let replays: Vec<DeviceReplay> = devices
        .iter()
        .map(|&d| DeviceReplay::new(snap, d))
        .collect();
    let (send, batches) = sync_channel::<Vec<Closed>>(2);
    std::thread::scope(|scope| {
        let replays = &replays;
        let writer = std::thread::Builder::new()
            .name("vramlens-rows".into())
            .spawn_scoped(scope, move || -> io::Result<()> {
                let mut rows = LifetimeRows {
                    snap,
                    replays,
                    pools: replays.iter().map(DeviceReplay::pools).collect(),
                    pool_texts: PoolTexts::default(),
                    names: SiteNames::new(attr, replays),
                    evidence_codes: FxMap::default(),
                    out,
                };
                for batch in batches {
                    for closed in &batch {
                        rows.write(closed)?;
                    }
                }
                Ok(())
            })?;
        let mut summaries = Vec::with_capacity(replays.len());
        for (device, replay) in replays.iter().enumerate() {
            let mut collect = Collect {
                device,
                batch: Vec::with_capacity(BATCH),
                send: &send,
                stopped: false,
            };
            let mut summary = SummaryPass::new(replay);
            replay.run((&mut collect, &mut summary));
            if collect.stopped {
                break;
            }
            summaries.push(summary.finish(snap, replay));
        }
        drop(send);
        writer
            .join()
            .map_err(|_| io::Error::other("the lifetime row writer panicked"))??;
        Ok(summaries)
    })
}

/// The `events` rows of the given devices: every trace entry in file order.
pub fn write_events(snap: &Snapshot, devices: &[i64], out: &mut dyn TableWriter) -> io::Result<()> {
    for &device in devices {
        let replay = DeviceReplay::new(snap, device);
        let trace = replay.trace;
        let mut pool = String::new();
        let mut pools = replay.pools();
        for i in 0..trace.len() {
            let e = trace.get(i);
            let action = match e.action {
                Action::Other => trace
                    .other_action(i)
                    .map_or("other", |s| snap.frames.str(s)),
                a => a.name(),
            };
            let oom = e.action == Action::Oom;
            // Pools are told for allocations and frees only.
            let has_pool = matches!(
                e.action,
                Action::Alloc | Action::FreeRequested | Action::FreeCompleted
            );
            let pool_cell = if has_pool {
                pool.clear();
                if let Some((a, b)) = pools.pool(&replay, i) {
                    use std::fmt::Write;
                    let _ = write!(pool, "{a},{b}");
                    Cell::Str(Some(&pool))
                } else {
                    Cell::Str(None)
                }
            } else {
                Cell::Str(None)
            };
            let row = [
                Cell::I64(Some(device)),
                int(i as u64),
                Cell::Str(Some(action)),
                Cell::U64((!oom).then_some(e.addr)),
                int(e.size),
                Cell::U64(Some(e.stream)),
                pool_cell,
                Cell::I64(e.time_us),
                Cell::Ts(e.time_us),
                stack_cell(snap, e.stack),
                int_opt(e.device_free()),
            ];
            out.write_row(&row)?;
        }
    }
    Ok(())
}

/// The `stacks` rows: every frame of every stack of the file, innermost first (frame 0).
pub fn write_stacks(snap: &Snapshot, out: &mut dyn TableWriter) -> io::Result<()> {
    let frames = &snap.frames;
    for id in 0..frames.stack_count() {
        let stack = StackId(id as u32);
        for (k, &f) in frames.stack(stack).iter().enumerate() {
            let frame = frames.frame(f);
            let row = [
                int(id as u64),
                int(k as u64),
                Cell::Str(Some(frames.str(frame.filename))),
                Cell::I64(Some(frame.line)),
                Cell::Str(Some(frames.str(frame.name))),
            ];
            out.write_row(&row)?;
        }
    }
    Ok(())
}

/// Bytes of a file's name kept in its partition key, at most.
pub const KEY_NAME_BYTES: usize = 64;

/// Hex digits of the digest in a partition key: 128 bits, so that no two inputs of a
/// fleet share a key, even names chosen to make two digests meet (a birthday search over
/// 64 bits takes minutes; over 128 it cannot be done). `export` also refuses a key that
/// another input holds.
pub const KEY_DIGEST_HEX: usize = 32;

/// The partition key (`file=<key>`) of an input: its file name, readable, then `~` and the
/// start of the SHA-256 of the file's SHA-256 (`sha256`, lowercase hex) and its path as
/// given, such as `memory_snapshot.pickle~3fa9c1d2e4b5a6f7081b2c3d4e5f6a7b`. It depends on the input alone
/// (not on the other inputs, the shard or the run), so the same file at the same path is
/// the same partition in every export and a re-run replaces its rows, while two files, or
/// two copies of one at two paths, never share one. Letters and digits of any script, `.`,
/// `-` and `_` are kept and any other character becomes `_` (the folder name needs no
/// escaping in any engine), the name is cut at [`KEY_NAME_BYTES`], and the `~` keeps
/// engines that infer partition types from typing the key as a number or a date. The
/// tables hold the path and the file's SHA-256 in full (`source_path`, `source_sha256`).
pub fn partition_key(path: &Path, sha256: &str) -> String {
    let file_name = if path.as_os_str() == "-" {
        "stdin".to_string()
    } else {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut name = String::new();
    for c in file_name.chars() {
        let c = if c.is_alphanumeric() || matches!(c, '.' | '_' | '-') {
            c
        } else {
            '_'
        };
        if name.len() + c.len_utf8() > KEY_NAME_BYTES {
            break;
        }
        name.push(c);
    }
    // Engines skip names starting with `.` or `_` (hidden and metadata files).
    let name = match name.chars().next() {
        None => "snapshot".into(),
        Some('.' | '_') => format!("f{name}"),
        Some(_) => name,
    };
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(sha256.as_bytes());
    hasher.update(b"\n");
    hasher.update(path.as_os_str().as_encoded_bytes());
    let digest = hasher.finalize();
    let mut key = name;
    key.push('~');
    for b in &digest[..KEY_DIGEST_HEX / 2] {
        use std::fmt::Write;
        let _ = write!(key, "{b:02x}");
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str =
        "3fa9c1d2e4b5a6f7081b2c3d4e5f6a7b0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn partition_keys_are_readable_names_with_a_digest() {
        let key = |p: &str| partition_key(Path::new(p), SHA);
        let name = |p: &str| key(p).rsplit_once('~').unwrap().0.to_string();
        assert_eq!(name("job/r0/memory.pickle"), "memory.pickle");
        assert_eq!(name("00042"), "00042");
        assert_eq!(name("/tmp/my snap=1%,.pickle"), "my_snap_1__.pickle");
        assert_eq!(
            name("снимок памяти ü日本.pickle"),
            "снимок_памяти_ü日本.pickle"
        );
        assert_eq!(name("-"), "stdin");
        assert_eq!(name(".hidden.json"), "f.hidden.json");
        // The digest: of the file's digest and its path; 16 hex digits.
        let k = key("job/r0/memory.pickle");
        let digest = k.rsplit_once('~').unwrap().1;
        assert_eq!(digest.len(), KEY_DIGEST_HEX);
        assert!(
            digest
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(
            k,
            key("job/r0/memory.pickle"),
            "the same input, the same key"
        );
        assert_ne!(
            k,
            key("job/r1/memory.pickle"),
            "the same bytes at another path"
        );
        assert_ne!(
            k,
            partition_key(Path::new("job/r0/memory.pickle"), &SHA.replace('3', "4")),
            "other bytes at the same path"
        );
        let long = format!("{}.pickle", "я".repeat(200));
        let k = key(&long);
        assert!(k.len() <= KEY_NAME_BYTES + 1 + KEY_DIGEST_HEX, "{k}");
        assert!(k.starts_with("яяя"));
    }

    /// A device whose trace allocates and frees `n` blocks of 512 bytes, one after
    /// another, at addresses 0x1000, 0x2000, ...
    fn alloc_free_snapshot(n: usize) -> Snapshot {
        use crate::model::trace::{DeviceTrace, NewEvent};
        let mut trace = DeviceTrace::default();
        for i in 0..n {
            for action in [Action::Alloc, Action::FreeCompleted] {
                trace.push(NewEvent {
                    action: Some(action),
                    addr: 0x1000 * (i as u64 + 1),
                    size: 512,
                    ..NewEvent::default()
                });
            }
        }
        Snapshot {
            device_traces: vec![trace],
            ..Snapshot::default()
        }
    }

    /// Keeps the address of each row; fails every write after the first `ok`.
    struct Rows {
        addrs: Vec<u64>,
        ok: usize,
    }

    impl TableWriter for &mut Rows {
        fn write_row(&mut self, cells: &[Cell]) -> io::Result<()> {
            check_row(Table::Lifetimes.row_columns(), cells)?;
            if self.addrs.len() == self.ok {
                return Err(io::Error::other("disk full"));
            }
            let Cell::U64(Some(addr)) = cells[1] else {
                panic!("addr is the second column")
            };
            self.addrs.push(addr);
            Ok(())
        }
        fn finish(self: Box<Self>) -> io::Result<u64> {
            Ok(self.addrs.len() as u64)
        }
    }

    fn lifetimes_of(snap: &Snapshot, rows: &mut Rows) -> io::Result<Vec<DeviceSummary>> {
        let options = crate::analysis::kinds::attribution::AttributionOptions::default();
        let mut out = rows;
        write_lifetimes(
            snap,
            &[0],
            Attributor::new(&snap.frames, &options),
            &mut out,
        )
    }

    #[test]
    fn lifetimes_of_many_batches_come_out_whole_and_in_the_order_of_their_frees() {
        let n = 2 * BATCH + 5;
        let snap = alloc_free_snapshot(n);
        let mut rows = Rows {
            addrs: Vec::new(),
            ok: usize::MAX,
        };
        lifetimes_of(&snap, &mut rows).unwrap();
        let expected: Vec<u64> = (1..=n as u64).map(|i| 0x1000 * i).collect();
        assert_eq!(rows.addrs, expected);
    }

    #[test]
    fn the_lifetimes_replay_gives_each_device_its_summary() {
        // Blocks of 512 bytes held one at a time: the peak is one block, reached by the
        // first allocation (event 0); every block is freed by the end.
        let snap = alloc_free_snapshot(5);
        let mut rows = Rows {
            addrs: Vec::new(),
            ok: usize::MAX,
        };
        let summaries = lifetimes_of(&snap, &mut rows).unwrap();
        assert_eq!(summaries.len(), 1);
        let d = &summaries[0];
        assert_eq!(d.device, 0);
        assert_eq!(d.peak_requested_bytes, Some(512));
        assert_eq!(d.peak_requested_event, Some(0));
        assert_eq!(d.peak_allocated_bytes, Some(512));
        assert_eq!(rows.addrs.len(), 5);
    }

    #[test]
    fn a_write_error_of_the_row_thread_is_returned_and_ends_the_table() {
        let snap = alloc_free_snapshot(3 * BATCH);
        let mut rows = Rows {
            addrs: Vec::new(),
            ok: BATCH + 7,
        };
        let error = lifetimes_of(&snap, &mut rows).unwrap_err();
        assert_eq!(error.to_string(), "disk full");
        assert_eq!(rows.addrs.len(), BATCH + 7);
    }

    #[test]
    fn rows_are_checked_against_columns() {
        let cols = [col("a", I64), opt("b", Str)];
        assert!(check_row(&cols, &[Cell::I64(Some(1)), Cell::Str(None)]).is_ok());
        assert!(check_row(&cols, &[Cell::I64(None), Cell::Str(None)]).is_err());
        assert!(check_row(&cols, &[Cell::U64(Some(1)), Cell::Str(None)]).is_err());
        assert!(check_row(&cols, &[Cell::I64(Some(1))]).is_err());
    }
}
