//! The pickle writer against CPython: a pickle written by CPython's `pickle.dump` is read
//! back into values (sharing kept as shared `Rc`s) and written again with one memo slot
//! per shared object; the bytes must be identical, frames, batches and memo numbers
//! included. Skipped, saying so, without `python3`.

mod common;

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::process::Command;
use vramlens::pickle::{MemoId, PickleWriter, Value, parse_bytes};

/// Writes a value tree, memoising by object identity as CPython does.
struct ByIdentity {
    memo: HashMap<usize, MemoId>,
}

impl ByIdentity {
    fn key(v: &Value) -> Option<usize> {
        match v {
            Value::Str(s) => Some(s.as_ptr() as usize),
            Value::Bytes(b) => Some(b.as_ptr() as usize),
            Value::List(l) | Value::Tuple(l) => Some(std::rc::Rc::as_ptr(l) as usize),
            Value::Dict(d) => Some(std::rc::Rc::as_ptr(d) as usize),
            _ => None,
        }
    }

    fn write(&mut self, w: &mut PickleWriter<Vec<u8>>, v: &Value) -> io::Result<()> {
        if let Some(k) = Self::key(v)
            && let Some(&id) = self.memo.get(&k)
        {
            return w.get(id);
        }
        let id = match v {
            Value::None => return w.none(),
            Value::Bool(b) => return w.bool(*b),
            Value::Int(i) => return w.int_i64(*i),
            Value::BigInt(b) => return w.int_le_bytes(b),
            Value::Float(f) => return w.float(*f),
            Value::Str(s) => Some(w.str(s)?),
            Value::Bytes(b) => Some(w.bytes(b)?),
            Value::List(items) => {
                let id = w.begin_list(items.len())?;
                for item in items.iter() {
                    self.write(w, item)?;
                }
                w.end_list()?;
                Some(id)
            }
            Value::Tuple(items) => {
                w.begin_tuple(items.len())?;
                for item in items.iter() {
                    self.write(w, item)?;
                }
                w.end_tuple()?
            }
            Value::Dict(pairs) => {
                let id = w.begin_dict(pairs.len())?;
                for (k, val) in pairs.iter() {
                    self.write(w, k)?;
                    self.write(w, val)?;
                }
                w.end_dict()?;
                Some(id)
            }
            other => panic!("value not expected in this test: {other:?}"),
        };
        if let (Some(k), Some(id)) = (Self::key(v), id) {
            self.memo.insert(k, id);
        }
        Ok(())
    }
}

fn rewrite(bytes: &[u8]) -> Vec<u8> {
    let (root, _) = parse_bytes(bytes).expect("our reader reads CPython's pickle");
    let mut w = PickleWriter::new(Vec::new()).unwrap();
    ByIdentity {
        memo: HashMap::new(),
    }
    .write(&mut w, &root)
    .unwrap();
    w.finish().unwrap()
}

fn first_difference(a: &[u8], b: &[u8]) -> String {
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    format!(
        "lengths {} and {}, first difference at byte {at}: {:02x?} vs {:02x?}",
        a.len(),
        b.len(),
        &a[at.saturating_sub(4)..(at + 12).min(a.len())],
        &b[at.saturating_sub(4)..(at + 12).min(b.len())]
    )
}

const GENERATOR: &str = r#"
import pickle, sys
key = "shared_key"
frame = {"filename": "/x/y.py", "name": "f", "line": 3}
frames = [frame, {"filename": "/x/z.py", "name": "g", "line": -1}]
ints = [0, 1, 255, 256, 65535, 65536, -1, -129, 2**31 - 1, 2**31, -2**31, -2**31 - 1,
        2**47 + 5, 2**63 - 1, 2**63, 2**64 - 1, -2**63, 2**100, -2**100, 2**2100]
empty = []
big = "b" * 70000 + "\u00e9\u4e2d"
root = {
    "segments": [{key: i, "frames": frames, "t": (i, -i), "s": str(i) * (i % 7)} for i in range(3000)],
    "ints": ints,
    "floats": [0.0, -0.5, 1e300, float("inf")],
    "flags": [True, False, None],
    "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4, 5)],
    "exactly_1000": {str(i): i for i in range(1000)},
    "exactly_2000": list(range(2000)),
    "one": [frames],
    "one_dict": {"k": frames},
    "big": [big, big, "after"],
    "bytes": [b"", b"ab", b"c" * 300, b"d" * 70000],
    "unicode": ["caf\u00e9", "\U0001F600" * 100],
    "tail": [[frame] * 3 for _ in range(20000)],
    "empties": [[], [], {}, {}, empty, empty, {"e": empty}],
}
with open(sys.argv[1], "wb") as f:
    pickle.dump(root, f, protocol=4)
"#;

#[test]
fn rewriting_a_cpython_pickle_gives_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cpython.pickle");
    match Command::new("python3")
        .arg("-c")
        .arg(GENERATOR)
        .arg(&path)
        .status()
    {
        Ok(s) => assert!(s.success(), "python3 failed to write the pickle"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            println!("SKIPPED: python3 not found; the writer was not compared with CPython");
            return;
        }
        Err(e) => panic!("could not run python3: {e}"),
    }
    let original = std::fs::read(&path).unwrap();
    assert!(
        original.len() > 400_000,
        "the generator should span many frames"
    );
    let again = rewrite(&original);
    assert!(original == again, "{}", first_difference(&original, &again));
}

fn protocol_4_pickles(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            protocol_4_pickles(&path, out);
        } else if std::fs::read(&path)
            .map(|b| b.starts_with(&[0x80, 4]))
            .unwrap_or(false)
        {
            out.push(path);
        }
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn every_real_protocol_4_snapshot_rewrites_to_the_same_bytes() {
    let data = common::shared_data().expect("../shared/data is missing");
    let mut files = Vec::new();
    protocol_4_pickles(&data, &mut files);
    files.sort();
    assert!(!files.is_empty(), "no protocol 4 pickle in ../shared/data");
    for path in &files {
        let original = std::fs::read(path).unwrap();
        let again = rewrite(&original);
        assert!(
            original == again,
            "{}: {}",
            path.display(),
            first_difference(&original, &again)
        );
    }
    eprintln!("{} real snapshots rewritten byte for byte", files.len());
}
