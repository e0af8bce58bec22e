//! vramlens: reads PyTorch CUDA memory snapshots and explains them.
//!
//! Data flows one way: [`input`] (bytes, sniffed) → [`pickle`] (values) → [`model`]
//! (a typed [`model::Snapshot`]) → [`timeline`] (the replay: a forward pass over a
//! device's events, pairing them into lifetimes and feeding running totals to the
//! analyses' aggregators) → [`analysis`] (report structs) → [`render`] (text, JSON, SVG
//! charts, and the one-page HTML report of [`render::html`]).
//!
//! Beside that flow: [`devlog`] reads the side inputs (device logs, profiler
//! traces, OOM messages), [`export`] writes the replay's rows as tables, [`redact`]
//! rewrites a snapshot's strings for sharing, and [`units`] writes bytes and times as text.

pub mod allocator;
pub mod analysis;
pub mod devlog;
pub mod export;
pub mod input;
pub mod model;
pub mod pickle;
pub mod redact;
pub mod render;
pub mod timeline;
pub mod units;
