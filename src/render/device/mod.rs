//! Text of the device's view: PyTorch against the device's own readings
//! ([`reconcile`]), why a profiler trace cannot be lined up ([`align`]) and the device's
//! memory at an OOM ([`device_memory`]).

pub mod align;
pub mod device_memory;
pub mod reconcile;
