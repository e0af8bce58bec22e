//! Feeds arbitrary strings to the writers' escapers and checks what each promises: text
//! on one visible line (`units::shown`, the terminal filter), folded-stack fields, SVG
//! and HTML text that an XML parser accepts, JSON that reads back the same string, and a
//! snapshot pickle (as `redact` writes it) that reads back the same strings, and a row of
//! every export table as Parquet (strings in each text column) that reads back the same.
//! A panic or a broken promise is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use vramlens::export::parquet::ParquetWriter;
use vramlens::export::{Cell, Kind, Table, TableWriter};
use vramlens::model::{Annotation, Snapshot};
use vramlens::render::words::terminal::TerminalText;
use vramlens::units::{folded_field, is_bidi_control, is_noncharacter, shown};

/// A character no text output may carry raw.
fn acts(c: char) -> bool {
    c.is_control() || is_bidi_control(c) || c == '\u{e000}'
}

/// Characters XML 1.0 forbids, or markup that must have been escaped.
fn breaks_xml(c: char) -> bool {
    let n = c as u32;
    (n < 0x20 && !matches!(c, '\t' | '\n' | '\r'))
        || is_noncharacter(c)
        || matches!(c, '<' | '>' | '"' | '\'')
}

/// Every `&` starts one of the references the escapers write.
fn references_ok(s: &str) -> bool {
    s.match_indices('&').all(|(i, _)| {
        ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#39;", "&#47;"]
            .iter()
            .any(|r| s[i..].starts_with(r))
    })
}

/// A `Write` whose bytes stay readable after the writer that owns it is gone.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One row of `table` as Parquet, `s` in every text column and the string's length in
/// the numeric ones; checks the file reads back with `s` in each text column.
fn parquet_round_trip(table: Table, s: &str) {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    let columns = table.row_columns();
    let n = s.len() as i64;
    let cells: Vec<Cell> = columns
        .iter()
        .map(|c| match c.kind {
            Kind::I64 => Cell::I64(Some(n)),
            Kind::U64 => Cell::U64(Some(n as u64)),
            Kind::F64 => Cell::F64(Some(n as f64)),
            Kind::Bool => Cell::Bool(Some(n % 2 == 0)),
            Kind::Str => Cell::Str(Some(s)),
            Kind::Timestamp => Cell::Ts(Some(n)),
        })
        .collect();
    let out = Shared::default();
    let mut w: Box<dyn TableWriter> =
        Box::new(ParquetWriter::new(out.clone(), table.name(), columns).expect("a schema"));
    w.write_row(&cells).expect("a row that fits");
    assert_eq!(w.finish().expect("a file"), 1);
    let bytes = bytes::Bytes::from(std::mem::take(&mut *out.0.lock().unwrap()));
    let reader = SerializedFileReader::new(bytes).expect("its own Parquet reads");
    let rows: Vec<_> = reader
        .get_row_iter(None)
        .expect("rows")
        .map(|r| r.expect("a row"))
        .collect();
    assert_eq!(rows.len(), 1);
    let fields: Vec<_> = rows[0].get_column_iter().collect();
    assert_eq!(fields.len(), columns.len());
    for (c, (name, field)) in columns.iter().zip(fields) {
        assert_eq!(name, c.name);
        if c.kind == Kind::Str {
            assert!(matches!(field, Field::Str(x) if x == s), "{name}: {field:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data).into_owned();

    // Text: one visible line, the same when shown twice.
    let line = shown(&s);
    assert!(!line.chars().any(acts), "{line:?}");
    assert_eq!(shown(&line), line);
    let field = folded_field(&s);
    assert!(!field.contains(';') && !field.chars().any(acts), "{field:?}");

    // The terminal filter over the raw bytes: only the renderers' newlines pass.
    let mut filtered = Vec::new();
    let mut t2 = TerminalText::new(&mut filtered);
    t2.write_all(data).unwrap();
    t2.flush().unwrap();
    drop(t2);
    let filtered = String::from_utf8(filtered).expect("the filter writes UTF-8");
    assert!(
        !filtered.chars().any(|c| c != '\n' && acts(c)),
        "{filtered:?}"
    );

    // SVG and HTML text.
    let svg = vramlens::render::charts::svg::escape(&s);
    assert!(!svg.chars().any(breaks_xml) && references_ok(&svg), "{svg:?}");
    let html = vramlens::render::html::escape_html(&s);
    assert!(!html.chars().any(breaks_xml) && references_ok(&html), "{html:?}");
    assert!(!html.contains("://"), "{html:?}");

    // JSON: the same string read back, nothing that acts on a terminal in the bytes.
    let mut json = Vec::new();
    vramlens::render::write_json(&mut json, &serde_json::json!({ "s": s })).unwrap();
    let text = String::from_utf8(json).unwrap();
    assert!(!text.trim_end().chars().any(acts), "{text:?}");
    let back: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(back["s"].as_str(), Some(s.as_str()));

    // A snapshot pickle holding the string as an annotation and a setting (key and
    // value) reads back the same; redacted, it is still a snapshot.
    let mut snap = Snapshot {
        external_annotations: vec![Annotation {
            name: s.clone(),
            stage: "START".into(),
            device: 0,
            time_us: 1,
        }],
        allocator_settings: Some(BTreeMap::from([
            ("PYTORCH_CUDA_ALLOC_CONF".to_string(), serde_json::json!(s)),
            (format!("k{s}"), serde_json::json!([s])),
        ])),
        ..Snapshot::default()
    };
    snap.features.external_annotations = true;
    let bytes = vramlens::model::encode::write_snapshot(&snap, Vec::new()).unwrap();
    let (read, _) = vramlens::input::read_snapshot_bytes(&bytes).expect("its own pickle reads");
    assert_eq!(read.external_annotations[0].name, s);
    let mut redacted = read;
    vramlens::redact::apply(&mut redacted, &vramlens::redact::RedactOptions::default());
    let bytes = vramlens::model::encode::write_snapshot(&redacted, Vec::new()).unwrap();
    vramlens::input::read_snapshot_bytes(&bytes).expect("a redacted pickle reads");

    // Parquet: the export writer's row of each table, read back.
    for table in Table::ALL {
        parquet_round_trip(table, &s);
    }
});
