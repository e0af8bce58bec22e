//! The setup every command of one snapshot shares: read the file (redacted with
//! `--redact`), choose the device by the one rule ([`choose_device`]), compile the
//! attribution options, and on demand the replay of that device, an attributor bound to
//! its categories, and the live set at a moment. A command is then its analysis and its
//! renderer.

use crate::cli::AttributionArgs;
use crate::cmd::{attribution_options, read_snapshot};
use anyhow::{Result, anyhow};
use std::path::Path;
use vramlens::analysis::device::{DeviceChoice, choose_device};
use vramlens::analysis::kinds::attribution::{AttributionOptions, Attributor};
use vramlens::analysis::moments::moment::{Moment, ResolvedMoment};
use vramlens::analysis::reports::top::{LiveState, Versions, resolve_live_bound};
use vramlens::input::{ReadOptions, SourceInfo};
use vramlens::model::Snapshot;
use vramlens::timeline::replay::DeviceReplay;

/// One snapshot opened for a command, its device chosen.
pub struct Session {
    pub snap: Snapshot,
    pub info: SourceInfo,
    pub choice: DeviceChoice,
    pub attribution: AttributionOptions,
}

/// The live set at a moment, with the replay and the bound attributor that found it.
pub struct LiveMoment<'s> {
    pub replay: DeviceReplay<'s>,
    pub attr: Attributor<'s>,
    pub moment: ResolvedMoment,
    pub live: LiveState,
}

impl Session {
    /// The attribution options of the command line, compiled (before anything is read:
    /// a bad pattern is refused first).
    pub fn options(args: &AttributionArgs) -> Result<AttributionOptions> {
        attribution_options(args)
    }

    /// Reads `path` (with a progress line on long reads) and chooses its device: `device`
    /// when given, else the one every command picks. Errors name the file.
    pub fn open(path: &Path, device: Option<i64>, attribution: AttributionOptions) -> Result<Self> {
        let (snap, info) = read_snapshot(path, ReadOptions { progress: true })?;
        let choice =
            choose_device(&snap, device).map_err(|e| anyhow!("{}: {e}", info.path.as_str()))?;
        Ok(Session {
            snap,
            info,
            choice,
            attribution,
        })
    }

    /// The file as the outputs name it.
    pub fn path(&self) -> &str {
        &self.info.path
    }

    /// The replay of the chosen device.
    pub fn replay(&self) -> DeviceReplay<'_> {
        DeviceReplay::new(&self.snap, self.choice.device)
    }

    /// An attributor of the file bound to the categories of `replay`'s device: made once
    /// per device, and shared by every analysis of the command.
    pub fn bound_attributor<'s>(&'s self, replay: &DeviceReplay<'s>) -> Attributor<'s> {
        vramlens::analysis::kinds::categories::bound_attributor(replay, &self.attribution)
    }

    /// What was live at `moment` on the chosen device (versions not counted: for
    /// outputs that show no allocation's label), from one replay when the moment is the
    /// peak; the attributor comes bound to the device's categories, found at the same
    /// time.
    pub fn live_at(&self, moment: Moment) -> Result<LiveMoment<'_>> {
        let replay = self.replay();
        let (found, attr) = resolve_live_bound(&replay, moment, Versions::NotNeeded, (), || {
            self.bound_attributor(&replay)
        });
        let (moment, live) = found.map_err(|e| anyhow!("{}: {e}", self.path()))?;
        Ok(LiveMoment {
            replay,
            attr,
            moment,
            live,
        })
    }
}
