//! JSON Lines: one object per row, keys in the table's column order, nulls written out
//! (so every line has every column and engines infer one schema).

use super::{Cell, Column, TableWriter, check_row};
use std::io::{self, Write};

/// Writes rows as JSON Lines as they come.
pub struct JsonlWriter<W: Write> {
    out: W,
    columns: &'static [Column],
    line: Vec<u8>,
    rows: u64,
}

impl<W: Write> JsonlWriter<W> {
    pub fn new(out: W, columns: &'static [Column]) -> Self {
        JsonlWriter {
            out,
            columns,
            line: Vec::with_capacity(512),
            rows: 0,
        }
    }
}

fn write_value(line: &mut Vec<u8>, cell: &Cell) -> io::Result<()> {
    match *cell {
        Cell::I64(Some(v)) => write!(line, "{v}"),
        Cell::U64(Some(v)) => write!(line, "{v}"),
        // Non-finite values have no JSON form; serde_json writes them as null.
        Cell::F64(Some(v)) => serde_json::to_writer(&mut *line, &v).map_err(io::Error::other),
        Cell::Bool(Some(v)) => line.write_all(if v { b"true" } else { b"false" }),
        Cell::Str(Some(s)) => serde_json::to_writer(&mut *line, s).map_err(io::Error::other),
        Cell::Ts(Some(us)) => write!(line, "\"{}\"", utc_text(us)),
        _ => line.write_all(b"null"),
    }
}

/// Times as RFC 3339 text in UTC (the one calendar of [`crate::units`]).
pub use crate::units::utc_rfc3339 as utc_text;

impl<W: Write + Send> TableWriter for JsonlWriter<W> {
    fn write_row(&mut self, cells: &[Cell]) -> io::Result<()> {
        check_row(self.columns, cells)?;
        let line = &mut self.line;
        line.clear();
        line.push(b'{');
        for (i, (c, cell)) in self.columns.iter().zip(cells).enumerate() {
            if i > 0 {
                line.push(b',');
            }
            line.push(b'"');
            line.extend_from_slice(c.name.as_bytes());
            line.extend_from_slice(b"\":");
            write_value(line, cell)?;
        }
        line.extend_from_slice(b"}\n");
        self.out.write_all(line)?;
        self.rows += 1;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> io::Result<u64> {
        self.out.flush()?;
        Ok(self.rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{Kind, Table, col, opt};

    #[test]
    fn times_are_utc_text() {
        assert_eq!(utc_text(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            utc_text(1_714_564_800_000_001),
            "2024-05-01T12:00:00.000001Z"
        );
        assert_eq!(utc_text(951_782_400_000_000), "2000-02-29T00:00:00.000000Z");
        assert_eq!(utc_text(-1), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn rows_are_json_objects_with_every_column() {
        const COLS: [Column; 5] = [
            col("a", Kind::I64),
            opt("b", Kind::Str),
            col("c", Kind::U64),
            opt("d", Kind::F64),
            opt("e", Kind::Bool),
        ];
        let mut out = Vec::new();
        let mut w = Box::new(JsonlWriter::new(&mut out, &COLS));
        w.write_row(&[
            Cell::I64(Some(-3)),
            Cell::Str(Some("x\"\u{1b}")),
            Cell::U64(Some(u64::MAX)),
            Cell::F64(Some(0.5)),
            Cell::Bool(Some(true)),
        ])
        .unwrap();
        w.write_row(&[
            Cell::I64(Some(0)),
            Cell::Str(None),
            Cell::U64(Some(0)),
            Cell::F64(Some(f64::NAN)),
            Cell::Bool(None),
        ])
        .unwrap();
        assert!(
            w.write_row(&[Cell::I64(None), Cell::Str(None)]).is_err(),
            "a row that does not fit is refused"
        );
        assert_eq!(w.finish().unwrap(), 2);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"a\":-3,\"b\":\"x\\\"\\u001b\",\"c\":18446744073709551615,\"d\":0.5,\"e\":true}\n\
             {\"a\":0,\"b\":null,\"c\":0,\"d\":null,\"e\":null}\n"
        );
        // Every table's column names are plain identifiers (written without escaping).
        for t in Table::ALL {
            for c in t.columns() {
                assert!(
                    c.name
                        .chars()
                        .all(|ch| ch.is_ascii_lowercase() || ch == '_' || ch.is_ascii_digit())
                );
            }
        }
    }
}
