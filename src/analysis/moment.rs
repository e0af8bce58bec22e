//! Moments of a device's timeline as users name them (`--at`), resolved to the event
//! just after which the state is taken.

use crate::model::{Action, DeviceTrace};
use crate::timeline::replay::DeviceReplay;
use crate::timeline::traced::{HOW_TO_RECORD, NoTimeline};
use crate::units::{parse_duration_us, parse_utc_time};
use serde::Serialize;

/// A time as given after `time:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSpec {
    /// Unix time in microseconds (a plain integer, or a UTC date-time).
    Unix(i64),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// Where requested memory peaks (the official viewer's maximum).
    Peak,
    /// The first `oom` event.
    Oom,
    /// After the last event (the state the snapshot was taken in).
    End,
    /// Just after event N.
    Event(usize),
    /// The last event at or before this time.
    Time(TimeSpec),
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
                    if let Some(offset) = t.strip_prefix('+') {
                        parse_duration_us(offset)
                            .map(|us| Moment::Time(TimeSpec::Offset(us)))
                            .ok_or_else(bad)
                    } else if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
                        t.parse()
                            .map(|us| Moment::Time(TimeSpec::Unix(us)))
                            .map_err(|_| bad())
                    } else {
                        // Times print truncated (to the millisecond): a time given to
                        // some precision means the whole of that last unit.
                        parse_utc_time(t)
                            .map(|us| Moment::Time(TimeSpec::Unix(us + precision_us(t) - 1)))
                            .ok_or_else(bad)
                    }
                } else {
                    Err(bad())
                }
            }
        }
    }
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
    #[error("{time} is before the first event of device {device} ({first})", time = crate::units::utc_time(*time_us), first = crate::units::utc_time(*first_us))]
    BeforeFirst {
        device: i64,
        time_us: i64,
        first_us: i64,
    },
}

/// A moment resolved to a state of the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ResolvedMoment {
    /// What was asked for: "peak", "oom", "end", "event" or "time".
    pub kind: &'static str,
    /// The state is taken just after this event; null: before the first event.
    pub event: Option<u32>,
    pub time_us: Option<i64>,
    /// Whether the device's trace shows memory over time; false: the moment is the final
    /// state, the only one known (see [`crate::timeline::traced`]).
    pub has_timeline: bool,
}

/// The last event at or before `time_us`, scanning as time runs (events without a time
/// are skipped; a later-stamped event ends the scan, so times that go backwards never
/// move the answer back).
pub fn event_at_time(trace: &DeviceTrace, time_us: i64) -> Option<usize> {
    let mut best = None;
    for i in 0..trace.len() {
        match trace.time_us(i) {
            Some(t) if t > 0 && t <= time_us => best = Some(i),
            Some(t) if t > time_us => break,
            _ => {}
        }
    }
    best
}

/// First event time of a trace (events with time 0 are unstamped).
pub fn first_time(trace: &DeviceTrace) -> Option<i64> {
    (0..trace.len()).find_map(|i| trace.time_us(i).filter(|&t| t > 0))
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
    if moment != Moment::End
        && let Some(none) = r.no_timeline()
    {
        return Err(MomentError::NoTrace(none));
    }
    let (kind, event) = match moment {
        Moment::Peak => ("peak", peak()),
        Moment::Oom => (
            "oom",
            Some(
                (0..n)
                    .find(|&i| trace.action(i) == Action::Oom)
                    .ok_or(MomentError::NoOom { device })?,
            ),
        ),
        Moment::End => ("end", n.checked_sub(1)),
        Moment::Event(i) if i < n => ("event", Some(i)),
        Moment::Event(event) => {
            return Err(MomentError::EventOutOfRange {
                device,
                event,
                events: n,
            });
        }
        Moment::Time(spec) => {
            let first = first_time(trace).ok_or(MomentError::NoTimes)?;
            let t = match spec {
                TimeSpec::Unix(t) => t,
                TimeSpec::Offset(d) => first.saturating_add(d),
            };
            match event_at_time(trace, t) {
                Some(i) => ("time", Some(i)),
                None => {
                    return Err(MomentError::BeforeFirst {
                        device,
                        time_us: t,
                        first_us: first,
                    });
                }
            }
        }
    };
    Ok(ResolvedMoment {
        kind,
        event: event.map(|i| i as u32),
        time_us: event.and_then(|i| trace.time_us(i)).filter(|&t| t > 0),
        has_timeline: r.has_timeline(),
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
        assert_eq!(
            "time:+1.5s".parse::<Moment>(),
            Ok(Moment::Time(TimeSpec::Offset(1_500_000)))
        );
        assert_eq!(
            "time:1750000000000000".parse::<Moment>(),
            Ok(Moment::Time(TimeSpec::Unix(1_750_000_000_000_000)))
        );
        assert_eq!(
            "time:2025-06-15 15:06:40.006 UTC".parse::<Moment>(),
            Ok(Moment::Time(TimeSpec::Unix(1_750_000_000_006_999)))
        );
        assert!("time:soon".parse::<Moment>().is_err());
        assert!("event:-1".parse::<Moment>().is_err());
    }
}
