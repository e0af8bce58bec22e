//! Which moment: the replay's series and the memory alive at one instant. [`moment`]
//! resolves `--at` (peak, OOM, a time, an event), [`live`] and [`segment_map`] give the
//! blocks and segments then, [`peaks`] and [`chart`] the series drawn over time,
//! [`leaks`] what grows step after step, and [`group_series`] one group's bytes over
//! time.

pub mod chart;
pub mod group_series;
pub mod leaks;
pub mod live;
pub mod moment;
pub mod peaks;
pub mod segment_map;
