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
