//! What if: the recorded requests replayed through the allocator model
//! ([`crate::allocator`]) under other capacities and settings. [`simulate`] gives the
//! `simulate` command's scenarios; [`oom_what_if`] asks, for each recorded OOM, which
//! setting would have let its request through.

pub mod oom_what_if;
pub mod simulate;
