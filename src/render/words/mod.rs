//! The words every text renderer shares: names of frames, devices and moments
//! ([`labels`]), what decided a category ([`evidence`]), the warnings met while reading
//! ([`warnings`]), what may reach a terminal ([`terminal`]) and how wide ([`wrap`]).

pub mod evidence;
pub mod labels;
pub mod terminal;
pub mod warnings;
pub mod wrap;
