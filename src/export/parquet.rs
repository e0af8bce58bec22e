//! Parquet files through the `parquet` crate's column writers (no Arrow arrays in
//! between): rows are buffered per column and written as a row group every
//! [`ROW_GROUP_ROWS`] rows, so memory stays bounded whatever the table's length.
//!
//! Files are uncompressed (dictionary and run-length encodings still apply: call sites,
//! categories and streams repeat), format 1.0 pages, plain logical types that DuckDB,
//! Spark, Polars and pyarrow read: `int64`, `int64` marked unsigned, `double`, `boolean`,
//! UTF-8 strings, timestamps (UTC microseconds). The file's key-value metadata names the table and the schema version.

use super::{Cell, Column, Kind, SCHEMA_VERSION, TableWriter, row_misfit};
use crate::model::frames::FxMap;
use bytes::Bytes;
use parquet::basic::{LogicalType, Repetition, TimeUnit, Type as PhysicalType};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;
use parquet::schema::types::Type;
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

/// Rows per row group: a few MB of buffers for the widest table, and row groups large
/// enough for engines to read in parallel.
pub const ROW_GROUP_ROWS: usize = 65_536;

fn parquet_error(e: ParquetError) -> io::Error {
    match e {
        ParquetError::External(inner) => match inner.downcast::<io::Error>() {
            Ok(io) => *io,
            Err(other) => io::Error::other(other.to_string()),
        },
        other => io::Error::other(other.to_string()),
    }
}

/// The Parquet schema of a table.
pub fn schema(table: &str, columns: &[Column]) -> io::Result<Type> {
    let fields = columns
        .iter()
        .map(|c| {
            let (physical, logical) = match c.kind {
                Kind::I64 => (PhysicalType::INT64, None),
                Kind::U64 => (PhysicalType::INT64, Some(LogicalType::integer(64, false))),
                Kind::F64 => (PhysicalType::DOUBLE, None),
                Kind::Bool => (PhysicalType::BOOLEAN, None),
                Kind::Str => (PhysicalType::BYTE_ARRAY, Some(LogicalType::String)),
                // UTC (adjusted): DuckDB TIMESTAMP WITH TIME ZONE, Spark timestamp.
                Kind::Timestamp => (
                    PhysicalType::INT64,
                    Some(LogicalType::timestamp(true, TimeUnit::MICROS)),
                ),
            };
            let repetition = if c.nullable {
                Repetition::OPTIONAL
            } else {
                Repetition::REQUIRED
            };
            Type::primitive_type_builder(c.name, physical)
                .with_repetition(repetition)
                .with_logical_type(logical)
                .build()
                .map(Arc::new)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(parquet_error)?;
    Type::group_type_builder(table)
        .with_fields(fields)
        .build()
        .map_err(parquet_error)
}

/// Values of one column for the row group being filled.
enum Values {
    I64(Vec<i64>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    Str(Strings),
}

/// A string column's values for one row group: each distinct string once, and each
/// row's as an index into them. The columns of a table repeat a few strings (the source,
/// call sites, categories) on every row: a row costs a lookup, not a copy, and the
/// encoder is handed one shared buffer per distinct string.
#[derive(Default)]
struct Strings {
    rows: Vec<u32>,
    distinct: Vec<Bytes>,
    index: FxMap<Bytes, u32>,
}

impl Strings {
    fn with_capacity(rows: usize) -> Self {
        Strings {
            rows: Vec::with_capacity(rows),
            ..Strings::default()
        }
    }

    fn push(&mut self, s: &str) {
        let s = s.as_bytes();
        // Most rows repeat the row before's value.
        if let Some(&last) = self.rows.last()
            && self.distinct[last as usize] == s
        {
            self.rows.push(last);
            return;
        }
        let i = match self.index.get(s) {
            Some(&i) => i,
            None => {
                let i = self.distinct.len() as u32;
                let bytes = Bytes::copy_from_slice(s);
                self.distinct.push(bytes.clone());
                self.index.insert(bytes, i);
                i
            }
        };
        self.rows.push(i);
    }

    fn clear(&mut self) {
        self.rows.clear();
        self.distinct.clear();
        self.index.clear();
    }

    /// Each row's value, in order.
    fn values(&self) -> Vec<ByteArray> {
        self.rows
            .iter()
            .map(|&i| ByteArray::from(self.distinct[i as usize].clone()))
            .collect()
    }
}

struct ColumnBuffer {
    kind: Kind,
    values: Values,
    /// Definition levels of a nullable column (1: a value, 0: null).
    levels: Option<Vec<i16>>,
}

impl ColumnBuffer {
    fn new(c: &Column) -> Self {
        let values = match c.kind {
            Kind::I64 | Kind::U64 | Kind::Timestamp => Values::I64(Vec::new()),
            Kind::F64 => Values::F64(Vec::new()),
            Kind::Bool => Values::Bool(Vec::new()),
            Kind::Str => Values::Str(Strings::default()),
        };
        ColumnBuffer {
            kind: c.kind,
            values,
            levels: c.nullable.then(Vec::new),
        }
    }

    /// An empty buffer for the next row group, with room for as much as this one holds,
    /// so that filling it never moves it.
    fn fresh_like(&self) -> Self {
        let values = match &self.values {
            Values::I64(v) => Values::I64(Vec::with_capacity(v.len())),
            Values::F64(v) => Values::F64(Vec::with_capacity(v.len())),
            Values::Bool(v) => Values::Bool(Vec::with_capacity(v.len())),
            Values::Str(strings) => Values::Str(Strings::with_capacity(strings.rows.len())),
        };
        ColumnBuffer {
            kind: self.kind,
            values,
            levels: self.levels.as_ref().map(|l| Vec::with_capacity(l.len())),
        }
    }

    /// Empties the buffer for the next row group, keeping its memory (pages already
    /// touched cost nothing to fill again).
    fn clear(&mut self) {
        match &mut self.values {
            Values::I64(v) => v.clear(),
            Values::F64(v) => v.clear(),
            Values::Bool(v) => v.clear(),
            Values::Str(strings) => strings.clear(),
        }
        if let Some(levels) = &mut self.levels {
            levels.clear();
        }
    }

    /// Adds the cell; false when it does not fit the column (another kind, or a null in
    /// a column without nulls).
    fn push(&mut self, cell: &Cell) -> bool {
        if cell.kind() != self.kind {
            return false;
        }
        let present = match (&mut self.values, *cell) {
            (Values::I64(v), Cell::I64(Some(x))) => {
                v.push(x);
                true
            }
            // Unsigned values are stored as their two's-complement bits, as Parquet
            // stores UINT_64.
            (Values::I64(v), Cell::U64(Some(x))) => {
                v.push(x as i64);
                true
            }
            (Values::I64(v), Cell::Ts(Some(x))) => {
                v.push(x);
                true
            }
            (Values::F64(v), Cell::F64(Some(x))) => {
                v.push(x);
                true
            }
            (Values::Bool(v), Cell::Bool(Some(x))) => {
                v.push(x);
                true
            }
            (Values::Str(strings), Cell::Str(Some(s))) => {
                strings.push(s);
                true
            }
            _ => false,
        };
        match &mut self.levels {
            Some(levels) => {
                levels.push(present as i16);
                true
            }
            None => present,
        }
    }
}

/// Where row groups are encoded and written: here while the table is small, then on a
/// thread of its own, so encoding overlaps with making the next rows.
enum Sink<W: Write + Send + 'static> {
    Here(SerializedFileWriter<W>),
    Thread {
        groups: SyncSender<Vec<ColumnBuffer>>,
        /// Groups written, their buffers handed back to be filled again.
        written: Receiver<Vec<ColumnBuffer>>,
        worker: JoinHandle<io::Result<SerializedFileWriter<W>>>,
    },
    Closed,
}

/// Writes one table's rows to one Parquet file.
pub struct ParquetWriter<W: Write + Send + 'static> {
    sink: Sink<W>,
    buffers: Vec<ColumnBuffer>,
    buffered: usize,
    rows: u64,
    /// A row did not fit: part of it may be in the buffers, so nothing more is written.
    misfit: bool,
}

impl<W: Write + Send + 'static> ParquetWriter<W> {
    pub fn new(out: W, table: &str, columns: &'static [Column]) -> io::Result<Self> {
        let mut props = WriterProperties::builder()
            .set_created_by(format!("vramlens {}", env!("CARGO_PKG_VERSION")))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_key_value_metadata(Some(vec![
                KeyValue::new("vramlens.table".into(), table.to_string()),
                KeyValue::new("vramlens.schema_version".into(), SCHEMA_VERSION.to_string()),
            ]));
        for c in columns.iter().filter(|c| c.distinct) {
            props = props.set_column_dictionary_enabled(ColumnPath::from(c.name), false);
        }
        let writer = SerializedFileWriter::new(
            out,
            Arc::new(schema(table, columns)?),
            Arc::new(props.build()),
        )
        .map_err(parquet_error)?;
        Ok(ParquetWriter {
            sink: Sink::Here(writer),
            buffers: columns.iter().map(ColumnBuffer::new).collect(),
            buffered: 0,
            rows: 0,
            misfit: false,
        })
    }

    /// Hands the buffered rows over as a row group. A full group (more are coming)
    /// moves the writing to its own thread; at most one group waits for it.
    fn flush_row_group(&mut self, last: bool) -> io::Result<()> {
        if self.buffered == 0 {
            return Ok(());
        }
        let recycled = match &self.sink {
            Sink::Thread { written, .. } => written.try_recv().ok(),
            _ => None,
        };
        let fresh = match recycled {
            Some(mut buffers) => {
                buffers.iter_mut().for_each(ColumnBuffer::clear);
                buffers
            }
            None => self.buffers.iter().map(ColumnBuffer::fresh_like).collect(),
        };
        let group = std::mem::replace(&mut self.buffers, fresh);
        self.buffered = 0;
        if !last && let Sink::Here(_) = self.sink {
            let Sink::Here(mut writer) = std::mem::replace(&mut self.sink, Sink::Closed) else {
                unreachable!("matched above")
            };
            let (groups, received) = sync_channel::<Vec<ColumnBuffer>>(1);
            let (give_back, written) = sync_channel::<Vec<ColumnBuffer>>(1);
            let worker = std::thread::Builder::new()
                .name("vramlens-parquet".into())
                .spawn(move || {
                    for group in received {
                        write_group(&mut writer, &group)?;
                        // One group waits to be filled again at most; past that (or
                        // once the rows are done) it is dropped.
                        let _ = give_back.try_send(group);
                    }
                    Ok(writer)
                })?;
            self.sink = Sink::Thread {
                groups,
                written,
                worker,
            };
        }
        match &mut self.sink {
            Sink::Here(writer) => write_group(writer, &group),
            Sink::Thread { groups, .. } => match groups.send(group) {
                Ok(()) => Ok(()),
                // The thread stopped on an error: it tells which.
                Err(_) => self.join().map(drop),
            },
            Sink::Closed => Err(io::Error::other("parquet file already closed")),
        }
    }

    /// The file writer back from wherever it is, once every group is written.
    fn join(&mut self) -> io::Result<SerializedFileWriter<W>> {
        match std::mem::replace(&mut self.sink, Sink::Closed) {
            Sink::Here(writer) => Ok(writer),
            Sink::Thread {
                groups,
                written,
                worker,
            } => {
                drop(groups);
                drop(written);
                worker
                    .join()
                    .map_err(|_| io::Error::other("the parquet writer thread panicked"))?
            }
            Sink::Closed => Err(io::Error::other("parquet file already closed")),
        }
    }
}

/// Encodes one row group's columns and writes them.
fn write_group<W: Write + Send>(
    writer: &mut SerializedFileWriter<W>,
    buffers: &[ColumnBuffer],
) -> io::Result<()> {
    let mut group = writer.next_row_group().map_err(parquet_error)?;
    for buffer in buffers {
        let mut column = group
            .next_column()
            .map_err(parquet_error)?
            .ok_or_else(|| io::Error::other("parquet schema has fewer columns"))?;
        let levels = buffer.levels.as_deref();
        match &buffer.values {
            Values::I64(v) => column
                .typed::<Int64Type>()
                .write_batch(v, levels, None)
                .map(drop),
            Values::F64(v) => column
                .typed::<DoubleType>()
                .write_batch(v, levels, None)
                .map(drop),
            Values::Bool(v) => column
                .typed::<BoolType>()
                .write_batch(v, levels, None)
                .map(drop),
            Values::Str(strings) => column
                .typed::<ByteArrayType>()
                .write_batch(&strings.values(), levels, None)
                .map(drop),
        }
        .map_err(parquet_error)?;
        column.close().map_err(parquet_error)?;
    }
    group.close().map_err(parquet_error)?;
    Ok(())
}

impl<W: Write + Send + 'static> TableWriter for ParquetWriter<W> {
    fn write_row(&mut self, cells: &[Cell]) -> io::Result<()> {
        // A row that does not fit is a bug here, not bad input: the file is abandoned.
        self.misfit = self.misfit
            || cells.len() != self.buffers.len()
            || !self
                .buffers
                .iter_mut()
                .zip(cells)
                .all(|(b, cell)| b.push(cell));
        if self.misfit {
            return Err(row_misfit());
        }
        self.buffered += 1;
        self.rows += 1;
        if self.buffered >= ROW_GROUP_ROWS {
            self.flush_row_group(false)?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> io::Result<u64> {
        if self.misfit {
            return Err(row_misfit());
        }
        self.flush_row_group(true)?;
        let writer = self.join()?;
        let mut out = writer.into_inner().map_err(parquet_error)?;
        out.flush()?;
        Ok(self.rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{col, opt};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    const COLUMNS: [Column; 3] = [
        col("n", Kind::I64).distinct(),
        opt("even", Kind::Str),
        col("half", Kind::F64),
    ];

    /// The string of an even row: runs of one value, values again after others, and a
    /// value only the later groups hold (the buffers of a group written are filled
    /// again: nothing of the earlier group may show).
    fn even_text(i: usize) -> &'static str {
        match (i / 6) % 5 {
            0 | 3 => "even",
            1 => "even, in a run",
            2 => "",
            _ if i > ROW_GROUP_ROWS => "only past the first group",
            _ => "even",
        }
    }

    /// A file of `rows` rows, as the writer leaves it.
    fn written(rows: usize) -> Vec<u8> {
        let dir =
            std::env::temp_dir().join(format!("vramlens-parquet-{}-{rows}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.parquet");
        let file = std::fs::File::create(&path).unwrap();
        let mut w: Box<dyn TableWriter> =
            Box::new(ParquetWriter::new(file, "t", &COLUMNS).unwrap());
        for i in 0..rows {
            let even = (i % 2 == 0).then(|| even_text(i));
            w.write_row(&[
                Cell::I64(Some(i as i64)),
                Cell::Str(even),
                Cell::F64(Some(i as f64 / 2.0)),
            ])
            .unwrap();
        }
        assert_eq!(w.finish().unwrap(), rows as u64);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        bytes
    }

    #[test]
    fn rows_past_one_group_are_written_in_order_by_the_writer_thread() {
        // Three full groups and a part: the full ones go through the thread.
        let rows = 3 * ROW_GROUP_ROWS + 17;
        let reader = SerializedFileReader::new(Bytes::from(written(rows))).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 4);
        assert_eq!(reader.metadata().file_metadata().num_rows(), rows as i64);
        for (i, row) in reader.get_row_iter(None).unwrap().enumerate() {
            let row = row.unwrap();
            let cols: Vec<&Field> = row.get_column_iter().map(|(_, f)| f).collect();
            assert_eq!(cols[0], &Field::Long(i as i64));
            let even = if i % 2 == 0 {
                Field::Str(even_text(i).into())
            } else {
                Field::Null
            };
            assert_eq!(cols[1], &even, "row {i}");
            assert_eq!(cols[2], &Field::Double(i as f64 / 2.0));
        }
    }

    #[test]
    fn a_row_that_does_not_fit_the_columns_is_refused() {
        let mut w = ParquetWriter::new(Vec::new(), "t", &COLUMNS).unwrap();
        let f = Cell::F64(Some(0.0));
        assert!(
            w.write_row(&[Cell::I64(Some(1)), Cell::Str(None), f])
                .is_ok()
        );
        // A null where the column has none, another kind, a cell short; then nothing
        // more is taken.
        for row in [
            vec![Cell::I64(None), Cell::Str(None), f],
            vec![Cell::U64(Some(1)), Cell::Str(None), f],
            vec![Cell::I64(Some(1)), Cell::Str(None)],
        ] {
            let e = w.write_row(&row).unwrap_err();
            assert!(e.to_string().contains("does not fit"), "{e}");
        }
        assert!(
            w.write_row(&[Cell::I64(Some(1)), Cell::Str(None), f])
                .is_err()
        );
        assert!(Box::new(w).finish().is_err());
    }

    #[test]
    fn a_small_table_is_written_without_a_thread() {
        let reader = SerializedFileReader::new(Bytes::from(written(5))).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 1);
        assert_eq!(reader.metadata().file_metadata().num_rows(), 5);
    }

    /// Fails every write after the first `ok` bytes.
    struct Failing {
        ok: usize,
    }

    impl Write for Failing {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.ok < buf.len() {
                return Err(io::Error::other("disk full"));
            }
            self.ok -= buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_error_on_the_thread_comes_back_to_the_caller() {
        let mut w: Box<dyn TableWriter> =
            Box::new(ParquetWriter::new(Failing { ok: 1000 }, "t", &COLUMNS).unwrap());
        let mut error = None;
        for i in 0..4 * ROW_GROUP_ROWS {
            if let Err(e) = w.write_row(&[
                Cell::I64(Some(i as i64)),
                Cell::Str(None),
                Cell::F64(Some(0.0)),
            ]) {
                error = Some(e);
                break;
            }
        }
        let error = error
            .or_else(|| w.finish().err())
            .expect("the error is reported");
        assert!(error.to_string().contains("disk full"), "{error}");
    }
}
