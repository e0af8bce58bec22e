//! A model of PyTorch's CUDA caching allocator, checked against the recording before it
//! answers "what if" (spec `caching-allocator.md`).
//!
//! Sits between [`crate::timeline`] (what happened) and [`crate::analysis`] (what it
//! means): it takes a snapshot's device trace and gives what the caching allocator does
//! with the same requests under other settings or another capacity.
//!
//! - [`settings`]: `PYTORCH_CUDA_ALLOC_CONF` read as PyTorch reads it, and the release
//!   profiles where PyTorch changed behaviour.
//! - [`model`]: the allocator itself (pools, best fit, split and merge, segment sizes,
//!   `max_split_size`, garbage collection, expandable segments, the out-of-memory retry).
//! - [`device`]: what `cudaMalloc` answers: a capacity, and the recorded addresses while
//!   the calls are the recording's, the model's own after.
//! - [`requests`]: a recording turned into requests (allocations, frees, `empty_cache`
//!   calls) and the outputs each allocator call recorded.
//! - [`start`]: the allocator's state at the trace's first event, rebuilt backwards
//!   from the final segments.
//! - [`prepared`]: a device's recording ready to replay: its requests, its start state,
//!   its settings.
//! - [`identity`]: the recorded requests replayed with the recorded settings, compared
//!   event by event with the recording.
//! - [`checked`]: a recording prepared and checked once, shared by every analysis of a
//!   command that replays it.
//! - [`midway`]: the state in the middle of a recording, rebuilt from it, for a check in
//!   two halves at once.
//! - [`scenario`]: the requests replayed under other settings and capacities, the first
//!   out-of-memory error, and the smallest capacity that runs them.
//!
//! Nothing here formats words: `analysis::what_if::simulate` gathers the answers and `render`
//! words them.

pub mod checked;
pub mod device;
pub mod identity;
pub mod midway;
pub mod model;
pub mod prepared;
pub mod requests;
pub mod scenario;
pub mod settings;
pub mod start;

pub use model::{Allocator, BlockId, Device, ModelEvent, Oom, PoolKey, device_ask_at_most};
pub use settings::{ConfError, Profile, Settings};
