//! The SVG charts: a streaming writer ([`svg`]) and its escaper ([`markup`], which the
//! HTML report shares), the timeline ([`timeline_svg`]), the segment map
//! ([`segments_svg`]) and the flame graph ([`flame_svg`]).

pub mod flame_svg;
pub mod markup;
pub mod segments_svg;
pub mod svg;
pub mod timeline_svg;
