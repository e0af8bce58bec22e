//! vramlens: reads PyTorch CUDA memory snapshots and explains them.
//!
//! Data flows one way: [`input`] (bytes, sniffed) → [`pickle`] (values) → [`model`]
//! (a typed [`model::Snapshot`]) → [`analysis`] (report structs) → [`render`] (text, JSON).

pub mod analysis;
pub mod devlog;
pub mod export;
pub mod input;
pub mod model;
pub mod oom_log;
pub mod pickle;
pub mod redact;
pub mod render;
pub mod timeline;
pub mod units;
