//! What kind of memory, and who holds it: each allocation's call stack read as the
//! frames a person recognises ([`frames`]), grouped by call site or module
//! ([`attribution`]), given a category (parameters, gradients, optimizer state,
//! activations, caches, workspaces) by the evidence [`categories`] names, placed in the
//! training step's phases ([`phases`]), and folded into a flame graph ([`flame`]).
//!
//! Change here how gradients are told from activations (`categories`), how a frame is
//! shortened or a user rule matched (`attribution`), or how the step is cut (`phases`).

pub mod attribution;
pub mod categories;
pub mod decision;
pub mod flame;
pub mod frames;
pub mod phases;
