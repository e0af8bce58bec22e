//! Glue for each subcommand: read inputs, run an analysis, render.

pub mod summary;
pub mod timeline;
