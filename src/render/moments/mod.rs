//! Text of the moments: the blocks alive at one instant ([`live`]), the peaks of the
//! timeline ([`timeline_text`]) and the segments at one moment ([`segments_text`]).

pub mod live;
pub mod segments_text;
pub mod timeline_text;
