//! Values for snapshots a test writes itself, with serde-pickle (a pickle writer that is
//! not vramlens's): strings, integers and dicts with string keys.

use serde_pickle::{HashableValue as HV, Value as SV};
use std::collections::BTreeMap;

pub fn s(v: &str) -> SV {
    SV::String(v.to_string())
}

pub fn i(v: i64) -> SV {
    SV::I64(v)
}

pub fn dict(items: Vec<(&str, SV)>) -> SV {
    SV::Dict(
        items
            .into_iter()
            .map(|(k, v)| (HV::String(k.to_string()), v))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// A snapshot read with serde-pickle (not vramlens's reader).
pub fn load(path: &std::path::Path) -> SV {
    let bytes = std::fs::read(path).unwrap();
    serde_pickle::value_from_slice(
        &bytes,
        serde_pickle::DeOptions::new().replace_recursive_structures(),
    )
    .unwrap()
}

/// The value at a string key of a dict.
pub fn get(d: &SV, k: &str) -> Option<SV> {
    match d {
        SV::Dict(m) => m.get(&HV::String(k.to_string())).cloned(),
        _ => None,
    }
}

/// An integer, however the pickle wrote it.
pub fn int(v: Option<SV>) -> i128 {
    match v {
        Some(SV::I64(i)) => i as i128,
        Some(SV::Int(i)) => i.to_string().parse().unwrap(),
        other => panic!("expected an int, found {other:?}"),
    }
}

/// A list's items (none for anything else).
pub fn list(v: Option<SV>) -> Vec<SV> {
    match v {
        Some(SV::List(l)) => l,
        _ => Vec::new(),
    }
}

/// A `cudaMalloc` segment of the large pool of device 0 at `addr` made of `blocks` (address, size, state) in address order.
pub fn segment(addr: i64, blocks: &[(i64, i64, &str)]) -> SV {
    let active: i64 = blocks
        .iter()
        .filter(|b| b.2 != "inactive")
        .map(|b| b.1)
        .sum();
    let block = |&(a, size, state): &(i64, i64, &str)| {
        dict(vec![
            ("address", i(a)),
            ("size", i(size)),
            (
                "requested_size",
                i(if state == "inactive" { 0 } else { size }),
            ),
            ("state", s(state)),
            ("frames", SV::List(vec![])),
        ])
    };
    dict(vec![
        ("device", i(0)),
        ("address", i(addr)),
        ("total_size", i(blocks.iter().map(|b| b.1).sum())),
        ("allocated_size", i(active)),
        ("active_size", i(active)),
        ("requested_size", i(active)),
        ("stream", i(0)),
        ("segment_type", s("large")),
        ("segment_pool_id", SV::Tuple(vec![i(0), i(0)])),
        ("is_expandable", SV::Bool(false)),
        ("blocks", SV::List(blocks.iter().map(block).collect())),
        ("frames", SV::List(vec![])),
    ])
}
