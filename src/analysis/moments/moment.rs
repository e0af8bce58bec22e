//! Moments of a device's timeline as users name them (`--at`), resolved to the event
//! just after which the state is taken.

use crate::analysis::HOW_TO_RECORD;
use crate::model::{Action, DeviceTrace};
use crate::timeline::coverage::NoTimeline;
use crate::timeline::replay::{Aggregator, DeviceReplay, Running};
use crate::units::{duration_us, parse_duration_us, parse_utc_time, utc_time, utc_time_to};
use serde::Serialize;

/// A time as given after `time:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSpec {
    /// A UTC date-time, or Unix microseconds: the span its last digit names, `unit_us`
    /// microseconds from `from_us` (`.006` is a millisecond, no fraction a second; a plain
    /// integer is one microsecond).
    Unix { from_us: i64, unit_us: i64 },
    /// Microseconds after the first timed event (`+1.5s`).
    Offset(i64),
}

/// The unit of the last digit of a date-time (`.006` is a millisecond, no fraction a
/// second), in microseconds.
fn precision_us(t: &str) -> i64 {
    let t = t.trim_end_matches(" UTC").trim_end_matches('Z');
    let time = t.rsplit([' ', 'T']).next().unwrap_or("");
    match time.split_once('.') {
        Some((_, frac)) => 10i64.pow(6u32.saturating_sub(frac.len().min(6) as u32)),
        None if time.matches(':').count() >= 2 => 1_000_000,
        None => 60_000_000,
    }
}

/// A moment of the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moment {
    /// Where requested memory peaks (the official viewer's maximum).
    Peak,
    /// The first `oom` event.
    Oom,
    /// After the last event (the state the snapshot was taken in).
    End,
    /// Just after event N.
    Event(usize),
    /// An event stamped within the time as given (the one with the most requested
    /// memory when several are), else the last event before it. `text` is what followed
    /// `time:`, for messages.
    Time { spec: TimeSpec, text: String },
}

impl std::str::FromStr for Moment {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "expected peak, oom, end, event:N or time:T (a UTC date-time as printed, e.g. \"2025-06-15 15:06:40.006 UTC\", an offset from the first event such as +1.5s, or Unix microseconds), found {s:?}"
            )
        };
        match s {
            "peak" => Ok(Moment::Peak),
            "oom" => Ok(Moment::Oom),
            "end" => Ok(Moment::End),
            _ => {
                if let Some(n) = s.strip_prefix("event:") {
                    n.trim().parse().map(Moment::Event).map_err(|_| bad())
                } else if let Some(t) = s.strip_prefix("time:") {
                    let t = t.trim();
                    let spec = if let Some(offset) = t.strip_prefix('+') {
                        parse_duration_us(offset).map(TimeSpec::Offset)
                    } else if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
                        t.parse().ok().map(|us| TimeSpec::Unix {
                            from_us: us,
                            unit_us: 1,
                        })
                    } else {
                        // Times print truncated (to the millisecond): a time given to
                        // some precision means the whole of that last unit.
                        parse_utc_time(t).map(|us| TimeSpec::Unix {
                            from_us: us,
                            unit_us: precision_us(t),
                        })
                    };
                    spec.map(|spec| Moment::Time {
                        spec,
                        text: t.to_string(),
                    })
                    .ok_or_else(bad)
                } else {
                    Err(bad())
                }
            }
        }
    }
}

/// What a time was read as: "2020-01-01 00:00:00 UTC, the whole second".
fn read_as(spec: TimeSpec, first_us: i64) -> String {
    match spec {
        TimeSpec::Unix { from_us, unit_us } => {
            let whole = match unit_us {
                1 => "",
                60_000_000 => ", the whole minute",
                1_000_000 => ", the whole second",
                1000 => ", the whole millisecond",
                _ => ", to its last digit",
            };
            format!("{}{whole}", utc_time_to(from_us, unit_us))
        }
        TimeSpec::Offset(d) => format!(
            "{}, {} after the first event",
            utc_time_to(first_us.saturating_add(d), 1),
            duration_us(d)
        ),
    }
}

/// "from 2025-06-15 15:06:40.000 UTC to 2025-06-15 15:06:40.030 UTC (+0us to +30795us)":
/// the trace's times, in forms `time:` reads back.
fn trace_range(first_us: i64, last_us: i64) -> String {
    format!(
        "from {} to {} (+0us to +{}us)",
        utc_time(first_us),
        utc_time(last_us),
        last_us.saturating_sub(first_us)
    )
}

/// Why a moment cannot be found in a trace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MomentError {
    #[error(
        "{0}, so no moment but its final state, which --at end shows; {how}",
        how = HOW_TO_RECORD
    )]
    NoTrace(NoTimeline),
    #[error("device {device} has no oom event in its trace")]
    NoOom { device: i64 },
    #[error("event {event} is out of range; device {device} has {events} events (0..{last})", last = events.saturating_sub(1))]
    EventOutOfRange {
        device: i64,
        event: usize,
        events: usize,
    },
    #[error("this trace has no time_us (PyTorch before 2.2); use event:N")]
    NoTimes,
    #[error(
        "time:{text} (read as {read}) is before the first event of device {device}: its trace runs {range}",
        read = read_as(*spec, *first_us),
        range = trace_range(*first_us, *last_us)
    )]
    BeforeFirst {
        device: i64,
        text: String,
        spec: TimeSpec,
        first_us: i64,
        last_us: i64,
    },
    #[error(
        "time:{text} (read as {read}) is after the last event of device {device}: its trace runs {range}; --at end is the state after its last event",
        read = read_as(*spec, *first_us),
        range = trace_range(*first_us, *last_us)
    )]
    AfterLast {
        device: i64,
        text: String,
        spec: TimeSpec,
        first_us: i64,
        last_us: i64,
    },
}

/// Events stamped within the time given, when more than one: the moment is the one of
/// them with the most requested memory (so a printed peak time finds the peak).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SameTime {
    /// How many events are stamped within the time given.
    pub events: u32,
    pub first_event: u32,
    pub last_event: u32,
}

/// What kind of moment was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MomentKind {
    Peak,
    Oom,
    End,
    Event,
    Time,
}

impl MomentKind {
    /// The word `--at` takes for it (and the JSON outputs give).
    pub fn name(self) -> &'static str {
        match self {
            MomentKind::Peak => "peak",
            MomentKind::Oom => "oom",
            MomentKind::End => "end",
            MomentKind::Event => "event",
            MomentKind::Time => "time",
        }
    }
}

/// A moment resolved to a state of the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ResolvedMoment {
    /// What was asked for.
    pub kind: MomentKind,
    /// The state is taken just after this event; null: before the first event.
    pub event: Option<u32>,
    pub time_us: Option<i64>,
    /// Whether the device's trace shows memory over time; false: the moment is the final
    /// state, the only one known (see [`crate::timeline::coverage`]).
    pub has_timeline: bool,
    /// For `time:`, the events that share the time given, when several do.
    pub same_time: Option<SameTime>,
    /// How the file's times read (for the text).
    #[serde(skip)]
    pub clock: crate::units::Clock,
}

/// Scanning as time runs up to `to_us` (events without a time are skipped; a
/// later-stamped event ends the scan, so times that go backwards never move the answer
/// back): the last event stamped at or before it, and the first and last events stamped
/// from `from_us` on with how many there are.
fn scan_time(
    trace: &DeviceTrace,
    from_us: i64,
    to_us: i64,
) -> (Option<usize>, Option<(usize, usize, u32)>) {
    let mut last = None;
    let mut within: Option<(usize, usize, u32)> = None;
    for i in 0..trace.len() {
        match trace.time_us(i) {
            Some(t) if t > 0 && t <= to_us => {
                last = Some(i);
                if t >= from_us {
                    within = Some(match within {
                        None => (i, i, 1),
                        Some((a, _, n)) => (a, i, n + 1),
                    });
                }
            }
            Some(t) if t > to_us => break,
            _ => {}
        }
    }
    (last, within)
}

/// Latest event time of a trace (times can go backwards).
fn latest_time(trace: &DeviceTrace) -> Option<i64> {
    (0..trace.len()).filter_map(|i| trace.stamped_time(i)).max()
}

/// The event among those stamped within `[from_us, to_us]` (between `first` and `last`)
/// after which the most memory is requested; the first to reach it.
struct MostRequested<'t> {
    trace: &'t DeviceTrace,
    first: usize,
    last: usize,
    from_us: i64,
    to_us: i64,
    best: Option<(i64, usize)>,
}

impl Aggregator for MostRequested<'_> {
    fn event(&mut self, i: usize, _action: Action, run: &Running) {
        if i < self.first || i > self.last {
            return;
        }
        let stamped = self
            .trace
            .time_us(i)
            .is_some_and(|t| t >= self.from_us && t <= self.to_us);
        if stamped && self.best.is_none_or(|(b, _)| run.requested > b) {
            self.best = Some((run.requested, i));
        }
    }
}

/// Resolves a moment; `peak` runs the replay for the peak when asked.
pub fn resolve(
    r: &DeviceReplay,
    moment: Moment,
    peak: impl FnOnce() -> Option<usize>,
) -> Result<ResolvedMoment, MomentError> {
    let trace = r.trace;
    let n = trace.len();
    let device = r.device;
    // Without a timeline the final state is all the file has: the peak asked for by
    // default is that state (the output says so); any other moment is refused.
    let moment = if moment == Moment::Peak && r.no_timeline().is_some() {
        Moment::End
    } else {
        moment
    };
    if moment != Moment::End
        && let Some(none) = r.no_timeline()
    {
        return Err(MomentError::NoTrace(none));
    }
    let mut same_time = None;
    let (kind, event) = match moment {
        Moment::Peak => (MomentKind::Peak, peak()),
        Moment::Oom => (
            MomentKind::Oom,
            Some(
                (0..n)
                    .find(|&i| trace.action(i) == Action::Oom)
                    .ok_or(MomentError::NoOom { device })?,
            ),
        ),
        Moment::End => (MomentKind::End, n.checked_sub(1)),
        Moment::Event(i) if i < n => (MomentKind::Event, Some(i)),
        Moment::Event(event) => {
            return Err(MomentError::EventOutOfRange {
                device,
                event,
                events: n,
            });
        }
        Moment::Time { spec, text } => {
            let first_us = trace.first_stamped_time().ok_or(MomentError::NoTimes)?;
            let last_us = latest_time(trace).unwrap_or(first_us);
            let (from_us, unit_us) = match spec {
                TimeSpec::Unix { from_us, unit_us } => (from_us, unit_us.max(1)),
                TimeSpec::Offset(d) => (first_us.saturating_add(d), 1),
            };
            let to_us = from_us.saturating_add(unit_us - 1);
            if from_us > last_us {
                return Err(MomentError::AfterLast {
                    device,
                    text,
                    spec,
                    first_us,
                    last_us,
                });
            }
            match scan_time(trace, from_us, to_us) {
                (_, Some((a, b, count))) if count > 1 => {
                    same_time = Some(SameTime {
                        events: count,
                        first_event: a as u32,
                        last_event: b as u32,
                    });
                    let mut most = MostRequested {
                        trace,
                        first: a,
                        last: b,
                        from_us,
                        to_us,
                        best: None,
                    };
                    r.run(&mut most);
                    (MomentKind::Time, Some(most.best.map_or(b, |(_, i)| i)))
                }
                (Some(i), _) => (MomentKind::Time, Some(i)),
                (None, _) => {
                    return Err(MomentError::BeforeFirst {
                        device,
                        text,
                        spec,
                        first_us,
                        last_us,
                    });
                }
            }
        }
    };
    Ok(ResolvedMoment {
        kind,
        event: event.map(|i| i as u32),
        time_us: event.and_then(|i| trace.stamped_time(i)),
        has_timeline: r.has_timeline(),
        same_time,
        clock: r.snap.clock(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_parse() {
        assert_eq!("peak".parse::<Moment>(), Ok(Moment::Peak));
        assert_eq!("end".parse::<Moment>(), Ok(Moment::End));
        assert_eq!("event:12".parse::<Moment>(), Ok(Moment::Event(12)));
        let time = |spec, text: &str| {
            Ok(Moment::Time {
                spec,
                text: text.to_string(),
            })
        };
        assert_eq!(
            "time:+1.5s".parse::<Moment>(),
            time(TimeSpec::Offset(1_500_000), "+1.5s")
        );
        assert_eq!(
            "time:1750000000000000".parse::<Moment>(),
            time(
                TimeSpec::Unix {
                    from_us: 1_750_000_000_000_000,
                    unit_us: 1
                },
                "1750000000000000"
            )
        );
        assert_eq!(
            "time:2025-06-15 15:06:40.006 UTC".parse::<Moment>(),
            time(
                TimeSpec::Unix {
                    from_us: 1_750_000_000_006_000,
                    unit_us: 1000
                },
                "2025-06-15 15:06:40.006 UTC"
            )
        );
        assert_eq!(
            "time:2020-01-01 00:00:00".parse::<Moment>(),
            time(
                TimeSpec::Unix {
                    from_us: 1_577_836_800_000_000,
                    unit_us: 1_000_000
                },
                "2020-01-01 00:00:00"
            )
        );
        assert!("time:soon".parse::<Moment>().is_err());
        assert!("event:-1".parse::<Moment>().is_err());
    }

    #[test]
    fn times_are_read_as_what_they_name() {
        assert_eq!(
            read_as(
                TimeSpec::Unix {
                    from_us: 1_577_836_800_000_000,
                    unit_us: 1_000_000
                },
                0
            ),
            "2020-01-01 00:00:00 UTC, the whole second"
        );
        assert_eq!(
            read_as(TimeSpec::Offset(1_500_000), 1_750_000_000_000_108),
            "2025-06-15 15:06:41.500108 UTC, 1.50 s after the first event"
        );
        assert_eq!(
            trace_range(1_750_000_000_000_108, 1_750_000_000_030_903),
            "from 2025-06-15 15:06:40.000 UTC to 2025-06-15 15:06:40.030 UTC (+0us to +30795us)"
        );
    }
}
