//! Analyses: each takes a [`crate::model::Snapshot`] and gives a plain report struct
//! (serialisable, no formatting).

pub mod align;
pub mod attribution;
pub mod budget;
pub mod categories;
pub mod device;
pub mod device_memory;
pub mod diff;
pub mod flame;
pub mod frames;
pub mod gpus;
pub mod group_series;
pub mod leaks;
pub mod live;
pub mod moment;
pub mod oom;
pub mod phases;
pub mod ranks;
pub mod reconcile;
pub mod report;
pub mod segment_map;
pub mod summary;
pub mod timeline_report;
pub mod timeline_view;
pub mod top;
pub mod trace_lanes;
