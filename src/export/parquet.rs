//! Parquet files through the `parquet` crate's column writers (no Arrow arrays in
//! between): rows are buffered per column and written as a row group every
//! [`ROW_GROUP_ROWS`] rows, so memory stays bounded whatever the table's length.
//!
//! Files are uncompressed (dictionary and run-length encodings still apply: call sites,
//! categories and streams repeat), format 1.0 pages, plain logical types that DuckDB,
//! Spark, Polars and pyarrow read: `int64`, `int64` marked unsigned, `double`, `boolean`,
//! UTF-8 strings. The file's key-value metadata names the table and the schema version.

use super::{Cell, Column, Kind, SCHEMA_VERSION, TableWriter, check_row};
use bytes::Bytes;
use parquet::basic::{LogicalType, Repetition, Type as PhysicalType};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;
use std::io::{self, Write};
use std::sync::Arc;

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
    /// Strings end to end, with where each one ends.
    Str(Vec<u8>, Vec<usize>),
}

struct ColumnBuffer {
    values: Values,
    /// Definition levels of a nullable column (1: a value, 0: null).
    levels: Option<Vec<i16>>,
}

impl ColumnBuffer {
    fn new(c: &Column) -> Self {
        let values = match c.kind {
            Kind::I64 | Kind::U64 => Values::I64(Vec::new()),
            Kind::F64 => Values::F64(Vec::new()),
            Kind::Bool => Values::Bool(Vec::new()),
            Kind::Str => Values::Str(Vec::new(), Vec::new()),
        };
        ColumnBuffer {
            values,
            levels: c.nullable.then(Vec::new),
        }
    }

    fn push(&mut self, cell: &Cell) {
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
            (Values::F64(v), Cell::F64(Some(x))) => {
                v.push(x);
                true
            }
            (Values::Bool(v), Cell::Bool(Some(x))) => {
                v.push(x);
                true
            }
            (Values::Str(data, ends), Cell::Str(Some(s))) => {
                data.extend_from_slice(s.as_bytes());
                ends.push(data.len());
                true
            }
            _ => false,
        };
        if let Some(levels) = &mut self.levels {
            levels.push(present as i16);
        }
    }

    fn clear(&mut self) {
        match &mut self.values {
            Values::I64(v) => v.clear(),
            Values::F64(v) => v.clear(),
            Values::Bool(v) => v.clear(),
            Values::Str(d, e) => {
                d.clear();
                e.clear();
            }
        }
        if let Some(l) = &mut self.levels {
            l.clear();
        }
    }
}

/// Writes one table's rows to one Parquet file.
pub struct ParquetWriter<W: Write + Send> {
    writer: Option<SerializedFileWriter<W>>,
    columns: &'static [Column],
    buffers: Vec<ColumnBuffer>,
    buffered: usize,
    rows: u64,
}

impl<W: Write + Send> ParquetWriter<W> {
    pub fn new(out: W, table: &str, columns: &'static [Column]) -> io::Result<Self> {
        let props = WriterProperties::builder()
            .set_created_by(format!("vramlens {}", env!("CARGO_PKG_VERSION")))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_key_value_metadata(Some(vec![
                KeyValue::new("vramlens.table".into(), table.to_string()),
                KeyValue::new("vramlens.schema_version".into(), SCHEMA_VERSION.to_string()),
            ]))
            .build();
        let writer =
            SerializedFileWriter::new(out, Arc::new(schema(table, columns)?), Arc::new(props))
                .map_err(parquet_error)?;
        Ok(ParquetWriter {
            writer: Some(writer),
            columns,
            buffers: columns.iter().map(ColumnBuffer::new).collect(),
            buffered: 0,
            rows: 0,
        })
    }

    fn flush_row_group(&mut self) -> io::Result<()> {
        if self.buffered == 0 {
            return Ok(());
        }
        let writer = self
            .writer
            .as_mut()
            .ok_or_else(|| io::Error::other("parquet file already closed"))?;
        let mut group = writer.next_row_group().map_err(parquet_error)?;
        for buffer in &self.buffers {
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
                Values::Str(data, ends) => {
                    // One shared buffer; each value is a slice of it.
                    let all = Bytes::copy_from_slice(data);
                    let mut start = 0;
                    let values: Vec<ByteArray> = ends
                        .iter()
                        .map(|&end| {
                            let v = ByteArray::from(all.slice(start..end));
                            start = end;
                            v
                        })
                        .collect();
                    column
                        .typed::<ByteArrayType>()
                        .write_batch(&values, levels, None)
                        .map(drop)
                }
            }
            .map_err(parquet_error)?;
            column.close().map_err(parquet_error)?;
        }
        group.close().map_err(parquet_error)?;
        for b in &mut self.buffers {
            b.clear();
        }
        self.buffered = 0;
        Ok(())
    }
}

impl<W: Write + Send> TableWriter for ParquetWriter<W> {
    fn write_row(&mut self, cells: &[Cell]) -> io::Result<()> {
        check_row(self.columns, cells)?;
        for (b, cell) in self.buffers.iter_mut().zip(cells) {
            b.push(cell);
        }
        self.buffered += 1;
        self.rows += 1;
        if self.buffered >= ROW_GROUP_ROWS {
            self.flush_row_group()?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> io::Result<u64> {
        self.flush_row_group()?;
        let writer = self
            .writer
            .take()
            .ok_or_else(|| io::Error::other("parquet file already closed"))?;
        let mut out = writer.into_inner().map_err(parquet_error)?;
        out.flush()?;
        Ok(self.rows)
    }
}
