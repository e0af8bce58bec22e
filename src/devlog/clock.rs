//! Clocks and time zones of side inputs: nvidia-smi's local timestamps, ISO 8601 stamps with
//! a zone, and the whole-hour shift that would line up two time ranges (a time-zone slip).
//!
//! Times become Unix microseconds through the one civil calendar of [`crate::units`].
//! Nothing here reads files.

use crate::units::{days_from_civil, days_in_month};

/// How to read the clock of a device log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockOptions {
    /// Minutes to add to nvidia-smi's local timestamps to get UTC (nvidia-smi prints local
    /// time without a zone): -480 for a log written at UTC+8. Default 0: the log is taken as
    /// UTC. Timestamps that carry a zone (ISO 8601 `+08:00`, `Z`) ignore it.
    pub utc_offset_minutes: i32,
}

/// Fixed-width decimal number, digits only.
fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 9 {
        return None;
    }
    s.parse().ok()
}

/// A timestamp read from a log: Unix µs, and whether the text carried its own zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub time_us: i64,
    /// The text had no zone: it is local time and the clock offset was applied.
    pub zoneless: bool,
}

#[cfg(test)]
/// Unix µs of `YYYY/MM/DD HH:MM:SS[.fff]` or ISO 8601 `YYYY-MM-DDTHH:MM:SS[.fff][Z|±HH:MM]`.
/// Without a zone the time is local and `offset_minutes` is added.
pub(crate) fn parse_timestamp(s: &str, offset_minutes: i32) -> Option<i64> {
    parse_stamp(s, offset_minutes).map(|s| s.time_us)
}

/// As [`parse_timestamp`], telling whether the stamp had a zone.
pub(crate) fn parse_stamp(s: &str, offset_minutes: i32) -> Option<Stamp> {
    let s = s.trim();
    if !s.is_ascii() || s.len() < 19 {
        return None;
    }
    let (date, rest) = s.split_at(10);
    let sep = date.as_bytes()[4];
    if !(sep == b'/' || sep == b'-') || date.as_bytes()[7] != sep {
        return None;
    }
    let year = i64::from(digits(&date[0..4])?);
    let month = digits(&date[5..7])?;
    let day = digits(&date[8..10])?;
    if year < 1 || !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let rest = rest.strip_prefix(['T', ' '])?;
    if rest.len() < 8 || rest.as_bytes()[2] != b':' || rest.as_bytes()[5] != b':' {
        return None;
    }
    let hour = digits(&rest[0..2])?;
    let minute = digits(&rest[3..5])?;
    let second = digits(&rest[6..8])?;
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &rest[8..];
    let mut micros: i64 = 0;
    if let Some(frac) = rest.strip_prefix(['.', ',']) {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        // Keep microseconds; finer digits are dropped.
        let kept = &frac[..n.min(6)];
        micros = i64::from(digits(kept)?) * 10i64.pow(6 - kept.len() as u32);
        rest = &frac[n..];
    }
    let zone_minutes: Option<i64> = if rest.is_empty() {
        None
    } else if rest == "Z" || rest == "z" {
        Some(0)
    } else {
        let sign = match rest.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let z = &rest[1..];
        let (h, m) = match z.len() {
            2 => (digits(z)?, 0),
            4 => (digits(&z[..2])?, digits(&z[2..])?),
            5 if z.as_bytes()[2] == b':' => (digits(&z[..2])?, digits(&z[3..])?),
            _ => return None,
        };
        if h > 23 || m > 59 {
            return None;
        }
        Some(sign * i64::from(h * 60 + m))
    };
    let days = days_from_civil(year, month, day);
    let seconds =
        days * 86_400 + i64::from(hour) * 3_600 + i64::from(minute) * 60 + i64::from(second);
    let local_us = seconds * 1_000_000 + micros;
    // Local time = UTC + zone, so UTC = local - zone; a zone-less stamp gets the clock offset.
    let shift_minutes = match zone_minutes {
        Some(z) => -z,
        None => i64::from(offset_minutes),
    };
    Some(Stamp {
        time_us: local_us.checked_add(shift_minutes.checked_mul(60_000_000)?)?,
        zoneless: zone_minutes.is_none(),
    })
}

/// An inclusive range of Unix microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TimeRange {
    pub first_us: i64,
    pub last_us: i64,
}

impl TimeRange {
    pub fn new(first_us: i64, last_us: i64) -> TimeRange {
        TimeRange {
            first_us: first_us.min(last_us),
            last_us: first_us.max(last_us),
        }
    }

    /// The range widened by `margin_us` on both sides.
    pub fn widen(self, margin_us: i64) -> TimeRange {
        TimeRange {
            first_us: self.first_us.saturating_sub(margin_us),
            last_us: self.last_us.saturating_add(margin_us),
        }
    }

    pub fn contains(self, t: i64) -> bool {
        (self.first_us..=self.last_us).contains(&t)
    }

    pub fn overlaps(self, o: TimeRange) -> bool {
        self.first_us <= o.last_us && o.first_us <= self.last_us
    }

    /// The smallest range holding both.
    pub fn union(self, o: TimeRange) -> TimeRange {
        TimeRange {
            first_us: self.first_us.min(o.first_us),
            last_us: self.last_us.max(o.last_us),
        }
    }

    /// Extends the range (or starts one) to hold `t`.
    pub fn include(range: &mut Option<TimeRange>, t: i64) {
        *range = Some(match *range {
            None => TimeRange::new(t, t),
            Some(r) => r.union(TimeRange::new(t, t)),
        });
    }
}

/// Time zones are at most 14 hours from UTC.
const MAX_ZONE_HOURS: i64 = 14;
const HOUR_US: i64 = 3_600_000_000;

/// The whole-hour shifts, within a time zone's reach (±14 h), that would make `log` (as
/// read) overlap `reference` once added to the log's times, smallest first by size. Empty
/// when none would, or when the ranges already overlap.
pub fn whole_hour_shifts(log: TimeRange, reference: TimeRange) -> Vec<i64> {
    if log.overlaps(reference) {
        return Vec::new();
    }
    // Shifted log [first + d, last + d] overlaps [r0, r1] when r0 - last <= d <= r1 - first.
    let lo = reference.first_us.saturating_sub(log.last_us);
    let hi = reference.last_us.saturating_sub(log.first_us);
    let mut hours: Vec<i64> = (-MAX_ZONE_HOURS..=MAX_ZONE_HOURS)
        .filter(|h| *h != 0)
        .filter(|h| (lo..=hi).contains(&(h * HOUR_US)))
        .collect();
    hours.sort_by_key(|h| (h.abs(), *h));
    hours
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(
            parse_timestamp("2025/06/13 00:27:52.195", 0),
            Some(1_749_774_472_195_000)
        );
        assert_eq!(
            parse_timestamp("2025/06/13 00:27:52.195", -60),
            Some(1_749_774_472_195_000 - 3_600_000_000)
        );
        assert_eq!(
            parse_timestamp("2025-09-08T17:26:50+08:00", 123),
            Some(1_757_323_610_000_000)
        );
        assert_eq!(
            parse_timestamp("2025-09-08T09:26:50Z", 0),
            Some(1_757_323_610_000_000)
        );
        assert_eq!(
            parse_timestamp("2025-09-08T09:26:50.5-0130", 0),
            Some(1_757_323_610_500_000 + 90 * 60_000_000)
        );
        assert!(parse_stamp("2025/06/13 00:27:52.195", 0).unwrap().zoneless);
        assert!(!parse_stamp("2025-09-08T09:26:50Z", 0).unwrap().zoneless);
        for bad in [
            "",
            "2025/13/01 00:00:00",
            "2025/02/29 00:00:00",
            "2025/06/13 24:00:00",
            "2025/06/13T00:00:00x",
            "2025/06/13 00:00:00.",
            "2025-06/13 00:00:00",
            "héllo wörld, 2025/06/13",
        ] {
            assert_eq!(parse_timestamp(bad, 0), None, "{bad}");
        }
    }

    #[test]
    fn shifts_that_line_up_two_ranges() {
        let h = HOUR_US;
        // A 30 s log read 8 hours late against a 2 s trace inside it.
        let trace = TimeRange::new(100 * h + 10_000_000, 100 * h + 12_000_000);
        let log = TimeRange::new(108 * h, 108 * h + 30_000_000);
        assert_eq!(whole_hour_shifts(log, trace), vec![-8]);
        // Overlapping ranges need no shift; ranges days apart have none within 14 h.
        assert!(whole_hour_shifts(trace, trace).is_empty());
        assert!(whole_hour_shifts(TimeRange::new(0, 1), trace).is_empty());
        // A 3-hour log 5 hours away: 3 shifts (-5, -6, -7 hours... within its span) fit.
        let long = TimeRange::new(105 * h, 108 * h);
        assert_eq!(whole_hour_shifts(long, trace), vec![-5, -6, -7]);
    }
}
