//! The commands that draw a chart to a file (`-o`) or print its text: `timeline`,
//! `segments` and `flamegraph`.

pub mod flamegraph;
pub mod segments;
pub mod timeline;
