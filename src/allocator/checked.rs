//! A device's recording prepared and checked once for a whole command: every analysis
//! that replays it (a budget's fits, the what-ifs of its OOMs, the report's what-if)
//! reads the same check and the same replay with no limit instead of making its own.

use super::identity::{
    Checked, Identity, Parting, check_sharing, check_sharing_until_departure, split_point,
};
use super::prepared::{NotReplayable, Prepared};
use super::scenario::{Outcome, Search};
use super::settings::{Profile, Settings};
use crate::model::Snapshot;
use std::sync::Mutex;

/// Runs `check` on `p` and `beside` at the same time. The check is told where the replay
/// with no limit parts from its own (`Parting`); that replay then goes on alone, beside
/// the rest of the check. Gives the check's identity, the replay with no limit (the
/// check's own where they never parted, else the one that went on alone; None where the
/// check told of neither) and what `beside` made.
pub fn check_beside<R: Send>(
    p: &Prepared,
    check: impl FnOnce(&Prepared, &(dyn Fn(Parting) + Sync)) -> Checked + Send,
    beside: impl FnOnce() -> R + Send,
) -> (Identity, Option<(Outcome, Option<Search>)>, R) {
    let parted: Mutex<Option<(Outcome, Option<Search>)>> = Mutex::new(None);
    let (checked, made) = rayon::scope(|scope| {
        let parted = &parted;
        let part = move |parting: Parting| {
            scope.spawn(move |_| {
                let resumed = parting.track.resume(p, parting.at);
                *parted.lock().expect("no panic holds it") = Some(resumed);
            });
        };
        rayon::join(|| check(p, &part), beside)
    });
    let parted = parted.into_inner().expect("no panic holds it");
    (checked.identity, checked.scenario.or(parted), made)
}

/// A device's recording prepared ([`Prepared`]), its identity check, and the replay with
/// the recorded settings and no limit.
pub struct CheckedRun {
    pub prepared: Prepared,
    pub identity: Identity,
    /// The replay with the recorded settings and no limit; None where the recorded
    /// settings set a memory fraction (a limit of their own).
    pub unlimited: Option<Outcome>,
    /// Replays with no limit under other settings, made already by the command.
    pub others: Vec<(Settings, Outcome)>,
}

impl CheckedRun {
    /// Prepares `device`'s recording (under `profile`, else the one guessed) and checks
    /// it: the replay with no limit is the check's own as far as the two are one
    /// ([`check_sharing`]), and goes on alone from where they part.
    pub fn new(
        snap: &Snapshot,
        device: i64,
        profile: Option<Profile>,
    ) -> Result<Self, NotReplayable> {
        let prepared = Prepared::new(snap, device, profile)?;
        Ok(Self::checked_by(prepared, |p, part| {
            check_sharing(snap, p, false, part, split_point(p))
        }))
    }

    /// [`CheckedRun::new`] for a command that asks only whether the model reproduces the
    /// recording ([`Identity::exact`]): the check stops at its first departure
    /// ([`check_sharing_until_departure`]). Where there is none, the check is whole;
    /// otherwise `identity` holds it only up to there, which answers `exact` and nothing
    /// else (the what-ifs of an OOM need [`CheckedRun::new`]).
    pub fn until_departure(
        snap: &Snapshot,
        device: i64,
        profile: Option<Profile>,
    ) -> Result<Self, NotReplayable> {
        let prepared = Prepared::new(snap, device, profile)?;
        Ok(Self::checked_by(prepared, |p, part| {
            check_sharing_until_departure(snap, p, part)
        }))
    }

    /// The run checked by `check` ([`check_beside`], with nothing beside it).
    fn checked_by(
        prepared: Prepared,
        check: impl FnOnce(&Prepared, &(dyn Fn(Parting) + Sync)) -> Checked + Send,
    ) -> Self {
        let (identity, unlimited, ()) = check_beside(&prepared, check, || ());
        let unlimited = unlimited.map(|(o, _)| o);
        Self::from_parts(prepared, identity, unlimited, Vec::new())
    }

    /// A run checked elsewhere: the check, the outcome of the replay with no limit, and
    /// those under other settings.
    pub fn from_parts(
        prepared: Prepared,
        identity: Identity,
        unlimited: Option<Outcome>,
        others: Vec<(Settings, Outcome)>,
    ) -> Self {
        let unlimited = unlimited.filter(|_| prepared.settings.memory_fraction.is_none());
        CheckedRun {
            prepared,
            identity,
            unlimited,
            others,
        }
    }

    /// The replay with no limit under `settings`, where it was made (none is with a
    /// memory fraction, a limit of its own).
    pub fn unlimited_under(&self, settings: &Settings) -> Option<&Outcome> {
        if settings.memory_fraction.is_some() {
            return None;
        }
        if *settings == self.prepared.settings {
            return self.unlimited.as_ref();
        }
        self.others
            .iter()
            .find(|(s, _)| s == settings)
            .map(|(_, o)| o)
    }
}
