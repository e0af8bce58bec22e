//! The reports that combine the other rooms into one command's answer: [`summary`],
//! [`top`] (who holds memory at a moment), [`diff`] (two snapshots), [`ranks`] (the
//! ranks of one job side by side) and [`report`] (everything the HTML page shows).

pub mod device_log;
pub mod diff;
pub mod ranks;
pub mod report;
pub mod summary;
pub mod top;
