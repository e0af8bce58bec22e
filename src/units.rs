//! Bytes and times as text, at fixed precision (the only place human units are made), and
//! text from a file as one visible line ([`shown`]).

use std::borrow::Cow;

/// The most memory any one device is taken to hold, 1 PiB (2^50 bytes): the largest GPUs
/// hold under 0.2 TiB, so a size past it in a log or on the command line is damaged or
/// edited, and bytes below it add up (millions of them) without leaving `u64`.
pub const MAX_DEVICE_BYTES: u64 = 1 << 50;

/// A count with its noun, singular for one: `1 block`, `3 blocks`, `1 other group`.
pub fn count(n: usize, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// The binary unit [`bytes()`] prints `n` in: its name and its size in bytes (`B` for
/// less than 1 KiB).
/// A whole number with commas between groups of three digits: `6,488`.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn binary_unit(n: u64) -> (&'static str, u64) {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return ("B", 1);
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    // Rounding may carry into the next unit (1023.96 KiB prints as 1024.0 KiB otherwise).
    if format!("{value:.1}") == "1024.0" && unit + 1 < UNITS.len() {
        unit += 1;
    }
    (UNITS[unit], 1u64 << (10 * (unit as u32 + 1)))
}

/// Binary units with one decimal: `512 B`, `1.5 KiB`, `23.0 GiB`.
pub fn bytes(n: u64) -> String {
    match binary_unit(n) {
        ("B", _) => format!("{n} B"),
        (name, scale) => format!("{:.1} {name}", n as f64 / scale as f64),
    }
}

/// As [`bytes()`], with two decimals from 1 GiB up (as CUDA's OOM message prints them), for
/// figures set side by side whose differences are a few MiB: `139.77 GiB`.
pub fn bytes_fine(n: u64) -> String {
    if (1 << 30..1 << 40).contains(&n) {
        format!("{:.2} GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        bytes(n)
    }
}

/// Signed bytes: a minus sign for negative values, none otherwise.
pub fn bytes_signed(n: i64) -> String {
    if n < 0 {
        format!("-{}", bytes(n.unsigned_abs()))
    } else {
        bytes(n as u64)
    }
}

/// A duration in microseconds: `850 us`, `12.3 ms`, `4.56 s`, `2 h 03 min`.
pub fn duration_us(us: i64) -> String {
    let a = us.unsigned_abs();
    let sign = if us < 0 { "-" } else { "" };
    if a < 1000 {
        format!("{sign}{a} us")
    } else if a < 1_000_000 {
        format!("{sign}{:.1} ms", a as f64 / 1e3)
    } else if a < 600_000_000 {
        format!("{sign}{:.2} s", a as f64 / 1e6)
    } else {
        let minutes = a / 60_000_000;
        format!("{sign}{} h {:02} min", minutes / 60, minutes % 60)
    }
}

// The civil calendar, written once: every date vramlens prints or reads (its own times,
// nvidia-smi's and ISO 8601 stamps in `devlog::clock`) goes through these three. Proleptic
// Gregorian dates and days since 1970-01-01 (Howard Hinnant's `civil_from_days` and
// `days_from_civil`); no calendar crate, as none is among the dependencies and three
// functions are all the calendar needed.

/// Days since 1970-01-01 to a proleptic Gregorian date.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (inverse of `civil_from_days`).
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days in a month of the proleptic Gregorian calendar.
pub(crate) fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        _ => 28,
    }
}

/// How a file's times read: Unix time, or a clock with no base (a profiler trace of
/// Kineto's April-May 2024 releases, or memory-timeline totals), whose times are shown as
/// offsets from the file's first event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Clock {
    #[default]
    Unix,
    Relative {
        first_us: i64,
    },
}

impl Clock {
    /// A time as text: a UTC date, or how long after the first event.
    pub fn time(self, us: i64) -> String {
        match self {
            Clock::Unix => utc_time(us),
            Clock::Relative { first_us } => {
                let d = us.saturating_sub(first_us);
                if d < 0 {
                    format!("{} before the first event", duration_us(d.saturating_neg()))
                } else {
                    format!("{} after the first event", duration_us(d))
                }
            }
        }
    }
}

/// Unix-epoch microseconds as `YYYY-MM-DD HH:MM:SS.mmm UTC`.
pub fn utc_time(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let millis = us.rem_euclid(1_000_000) / 1000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{millis:03} UTC",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Unix-epoch microseconds as RFC 3339 text in UTC with six decimals, such as
/// `2024-05-01T12:00:00.000001Z` (what Spark and DuckDB parse as a timestamp).
pub fn utc_rfc3339(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Unix-epoch microseconds as a UTC date-time written to the digit of `unit_us` (a minute,
/// a second, or a power of ten of microseconds below it): `2025-06-15 15:06 UTC`,
/// `2025-06-15 15:06:40 UTC`, `2025-06-15 15:06:40.006 UTC`, `… 15:06:40.006586 UTC`.
pub fn utc_time_to(us: i64, unit_us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    let minute = format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        (rem / 60) % 60
    );
    if unit_us >= 60_000_000 {
        return format!("{minute} UTC");
    }
    let second = format!("{minute}:{:02}", rem % 60);
    if unit_us >= 1_000_000 {
        return format!("{second} UTC");
    }
    // Digits of the fraction: 1 for a tenth of a second ... 6 for a microsecond.
    let mut digits = 6;
    let mut unit = unit_us.max(1);
    while unit >= 10 && digits > 1 {
        unit /= 10;
        digits -= 1;
    }
    let fraction = format!("{micros:06}");
    format!("{second}.{} UTC", &fraction[..digits])
}

/// Percent with one decimal, `-` when the whole is zero.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// A UTC date-time as vramlens prints it (`2025-06-15 15:06:40.006 UTC`) or in ISO form
/// (`2025-06-15T15:06:40.006Z`), to Unix microseconds. Seconds and fractions optional.
pub fn parse_utc_time(s: &str) -> Option<i64> {
    let s = s.trim();
    let s = s
        .strip_suffix(" UTC")
        .or_else(|| s.strip_suffix('Z'))
        .unwrap_or(s);
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: u32 = d.next()?.parse().ok()?;
    let day: u32 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut t = time.split(':');
    let h: i64 = t.next()?.parse().ok()?;
    let min: i64 = t.next()?.parse().ok()?;
    let sec = t.next().unwrap_or("0");
    if t.next().is_some() || h > 23 || min > 59 {
        return None;
    }
    let (whole, frac) = sec.split_once('.').unwrap_or((sec, ""));
    let whole: i64 = whole.parse().ok()?;
    if whole > 60 || frac.len() > 6 || !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let micros: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse().ok()?
    };
    let days = days_from_civil(y, m, day);
    Some(((days * 86_400 + h * 3600 + min * 60 + whole) * 1_000_000) + micros)
}

/// A duration such as `1.5s`, `300ms`, `12us`, `2min` or `1h`, to microseconds.
pub fn parse_duration_us(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale = match unit.trim() {
        "us" | "µs" => 1.0,
        "ms" => 1e3,
        "s" | "" => 1e6,
        "min" | "m" => 60e6,
        "h" => 3600e6,
        _ => return None,
    };
    let us = value * scale;
    (us.is_finite() && us < 1e18).then_some(us.round() as i64)
}

/// Whose words a size's unit is in: the same word means another multiple to each
/// (`KB` is 10^3 bytes on the command line and 1024 in PyTorch's messages), so each
/// reader names its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitWords {
    /// Options such as `--max-peak`: `KB` .. `TB` powers of ten, `KiB` .. `TiB` and a
    /// bare `K` .. `T` (as `ls -h` prints) powers of two, `B` or nothing bytes; any case.
    CommandLine,
    /// PyTorch's messages: `bytes`, `byte`, `B`, and `KiB` .. `EiB` or `KB` .. `EB`, all
    /// binary (its MPS allocator prints `KB` for 1024 bytes); any case.
    PyTorch,
    /// nvidia-smi's values and headers: `B`, `KiB`/`KB` .. `TiB`/`TB`, binary, as written.
    NvidiaSmi,
}

impl UnitWords {
    /// Bytes per `unit`, None for a word these are not.
    pub fn multiplier(self, unit: &str) -> Option<u128> {
        let power = match self {
            UnitWords::CommandLine => match unit.to_ascii_lowercase().as_str() {
                "" | "b" => return Some(1),
                "k" | "kib" => 1,
                "m" | "mib" => 2,
                "g" | "gib" => 3,
                "t" | "tib" => 4,
                "kb" => return Some(1_000),
                "mb" => return Some(1_000_000),
                "gb" => return Some(1_000_000_000),
                "tb" => return Some(1_000_000_000_000),
                _ => return None,
            },
            UnitWords::PyTorch => match unit.to_ascii_lowercase().as_str() {
                "b" | "byte" | "bytes" => 0,
                "kib" | "kb" => 1,
                "mib" | "mb" => 2,
                "gib" | "gb" => 3,
                "tib" | "tb" => 4,
                "pib" | "pb" => 5,
                "eib" | "eb" => 6,
                _ => return None,
            },
            UnitWords::NvidiaSmi => match unit {
                "B" => 0,
                "KiB" | "KB" => 1,
                "MiB" | "MB" => 2,
                "GiB" | "GB" => 3,
                "TiB" | "TB" => 4,
                _ => return None,
            },
        };
        Some(1u128 << (10 * power))
    }
}

/// How a size's fraction of a byte is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// To the nearest byte, halves up (a printed value read back).
    HalfUp,
    /// Down to the byte (nvidia-smi's values).
    Down,
}

/// `int.frac` (decimal digits, either part may be empty) times `multiplier`, in whole
/// bytes, exact (integers, no float error); None when a part holds anything but digits
/// or the value is above `u64::MAX`. Fraction digits past the 19th are ignored: 1e-19 of
/// the largest unit (EiB) is 0.12 byte, and 10^19 × 2^60 stays inside u128.
pub fn scaled_bytes(int: &str, frac: &str, multiplier: u128, rounding: Rounding) -> Option<u64> {
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac = &frac[..frac.len().min(19)];
    let mut whole: u128 = 0;
    for digit in int.bytes() {
        whole = whole
            .checked_mul(10)?
            .checked_add(u128::from(digit - b'0'))?;
    }
    let mut numerator: u128 = 0;
    for digit in frac.bytes() {
        numerator = numerator * 10 + u128::from(digit - b'0');
    }
    let denominator = 10u128.pow(frac.len() as u32);
    let fraction = match rounding {
        Rounding::HalfUp => (numerator * multiplier + denominator / 2) / denominator,
        Rounding::Down => numerator * multiplier / denominator,
    };
    let total = whole.checked_mul(multiplier)?.checked_add(fraction)?;
    u64::try_from(total).ok()
}

/// A size given on the command line: a plain byte count, or a number with a unit in the
/// command line's words ([`UnitWords::CommandLine`]), rounded to the nearest byte.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let Some(multiplier) = UnitWords::CommandLine.multiplier(unit.trim()) else {
        return Err(format!(
            "expected a size such as 85899345920, 80GiB (2^30 bytes each) or 80GB (10^9 bytes each), found {s:?}"
        ));
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let at_least = |rounding| scaled_bytes(int, frac, multiplier, rounding);
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(format!("expected a number before the unit, found {s:?}"));
    }
    // At least one whole byte before rounding, and at most what a device holds.
    let bytes = match (at_least(Rounding::Down), at_least(Rounding::HalfUp)) {
        (Some(down), Some(bytes)) if down >= 1 && bytes <= MAX_DEVICE_BYTES => bytes,
        (Some(0), _) => {
            return Err(format!("{s:?} is not a size a device can have"));
        }
        _ => {
            return Err(format!(
                "{s:?} is more than any device holds (at most 1 PiB, 2^50 bytes)"
            ));
        }
    };
    // A bare number is bytes; one under a MiB was surely meant in a unit.
    if unit.trim().is_empty() && bytes < 1 << 20 {
        return Err(format!(
            "{t:?} without a unit is {t} bytes: did you mean {t}GB or {t}GiB?"
        ));
    }
    Ok(bytes)
}

/// Bidirectional formatting characters: embeddings, overrides and isolates (U+202A to
/// U+202E, U+2066 to U+2069) and the marks (U+200E, U+200F, U+061C). Text from a file
/// never gets to reorder what a reader sees.
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

/// Unicode noncharacters (U+FDD0 to U+FDEF, and the last two code points of every plane,
/// U+FFFE and U+FFFF among them): never text; XML forbids U+FFFE and U+FFFF.
pub fn is_noncharacter(c: char) -> bool {
    let n = c as u32;
    (0xfdd0..=0xfdef).contains(&n) || n & 0xfffe == 0xfffe
}

/// How a character of a file's text is shown when it must not act: `\n`, `\t` for
/// newline and tab, `\x1b` for the other C0 controls and DEL, `\u{9b}` for C1 controls,
/// bidirectional formatting characters, noncharacters (`\u{fffe}`) and U+E000 (the start
/// of the renderers' style marker); `None` for a character shown as itself.
pub fn escape_char(c: char) -> Option<String> {
    let n = c as u32;
    match c {
        '\n' => Some("\\n".into()),
        '\t' => Some("\\t".into()),
        _ if n < 0x20 || n == 0x7f => Some(format!("\\x{n:02x}")),
        _ if (0x80..=0x9f).contains(&n)
            || is_bidi_control(c)
            || is_noncharacter(c)
            || c == '\u{e000}' =>
        {
            Some(format!("\\u{{{n:x}}}"))
        }
        _ => None,
    }
}

/// A string from a file (a frame, a file name, an annotation, a message) as it is printed
/// in text: on one line, every control and bidirectional formatting character shown as
/// visible text ([`escape_char`]), so no name can start a line of its own, shift columns
/// or reorder what is read. Every text renderer prints names through this.
pub fn shown(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| escape_char(c).is_some()) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match escape_char(c) {
            Some(e) => out.push_str(&e),
            None => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// One frame as a field of the folded-stack format (`frame;frame BYTES` on one line, as
/// inferno and flamegraph.pl read it): shown on one line ([`shown`]) and `;`, the frame
/// separator, as `,` (the format has no escape; stackcollapse scripts replace it too).
pub fn folded_field(s: &str) -> String {
    shown(s).replace(';', ",")
}

/// Whether a count is zero (for fields written only when they are not).
pub fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_in_the_unit_binary_unit_names() {
        for (n, text, unit) in [
            (0u64, "0 B", ("B", 1u64)),
            (1023, "1023 B", ("B", 1)),
            (1024, "1.0 KiB", ("KiB", 1 << 10)),
            // 1023.96 KiB rounds to 1024.0: printed as the next unit.
            (1_048_535, "1.0 MiB", ("MiB", 1 << 20)),
            (150_066_157_322, "139.8 GiB", ("GiB", 1 << 30)),
            (u64::MAX, "16.0 EiB", ("EiB", 1 << 60)),
        ] {
            assert_eq!(bytes(n), text, "{n}");
            assert_eq!(binary_unit(n), unit, "{n}");
        }
    }

    #[test]
    fn text_from_a_file_is_shown_on_one_visible_line() {
        let s = "a\nb\tc\rd\u{1b}[2J\u{7f}\u{85}\u{202e}e\u{2066}f\u{200f}\u{e000} é ✓ \\n";
        assert_eq!(
            shown(s),
            "a\\nb\\tc\\x0dd\\x1b[2J\\x7f\\u{85}\\u{202e}e\\u{2066}f\\u{200f}\\u{e000} é ✓ \\n"
        );
        assert!(matches!(shown("plain é"), Cow::Borrowed(_)));
        // Already shown text is shown the same (renderers may pass a name twice).
        assert_eq!(shown(&shown(s)), shown(s));
        assert_eq!(folded_field("a;b\nc d"), "a,b\\nc d");
        for c in ['\u{202a}', '\u{202e}', '\u{2066}', '\u{2069}'] {
            assert!(is_bidi_control(c));
        }
        assert!(!is_bidi_control('\u{2065}') && !is_bidi_control('\u{202f}'));
        for c in [
            '\u{fffe}',
            '\u{ffff}',
            '\u{fdd0}',
            '\u{fdef}',
            '\u{10fffe}',
            '\u{2ffff}',
        ] {
            assert!(is_noncharacter(c), "{c:?}");
        }
        assert!(!is_noncharacter('\u{fffd}') && !is_noncharacter('\u{fdcf}'));
        // Noncharacters are shown, not printed raw.
        assert_eq!(shown("a\u{fffe}b\u{ffff}"), "a\\u{fffe}b\\u{ffff}");
        assert_eq!(shown("\u{10fffe}"), "\\u{10fffe}");
    }

    #[test]
    fn byte_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(2 * 1024 * 1024), "2.0 MiB");
        assert_eq!(bytes(1024 * 1024 - 1), "1.0 MiB");
        assert_eq!(bytes(40 * (1 << 30)), "40.0 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(bytes_signed(-2048), "-2.0 KiB");
        assert_eq!(bytes_signed(5), "5 B");
    }

    /// The calendar, tested once for every date vramlens reads or prints.
    #[test]
    fn civil_dates_and_days_since_1970() {
        for (days, date) in [
            (0, (1970, 1, 1)),
            (-1, (1969, 12, 31)),
            (11_017, (2000, 3, 1)),
            (11_016, (2000, 2, 29)),
            (19_782, (2024, 2, 29)),
            (2_932_896, (9999, 12, 31)),
            (-719_162, (1, 1, 1)),
        ] {
            assert_eq!(civil_from_days(days), date, "{days}");
            assert_eq!(days_from_civil(date.0, date.1, date.2), days, "{date:?}");
        }
        for d in -800_000..3_000_000 {
            let (y, m, day) = civil_from_days(d);
            assert!((1..=days_in_month(y, m)).contains(&day));
            assert_eq!(days_from_civil(y, m, day), d);
        }
        assert_eq!(days_in_month(2024, 2), 29);
        assert_eq!(days_in_month(2025, 2), 28);
        assert_eq!(days_in_month(1900, 2), 28);
        assert_eq!(days_in_month(2000, 2), 29);
        assert_eq!(days_in_month(2025, 4), 30);
    }

    #[test]
    fn times() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00.000 UTC");
        // 2025-05-31 22:05:25.406 UTC
        assert_eq!(
            utc_time(1_748_729_125_406_508),
            "2025-05-31 22:05:25.406 UTC"
        );
        assert_eq!(utc_time(951_782_400_000_000), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(duration_us(999), "999 us");
        assert_eq!(duration_us(12_345), "12.3 ms");
        assert_eq!(duration_us(4_560_000), "4.56 s");
        assert_eq!(duration_us(7_380_000_000), "2 h 03 min");
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(1, 0), "-");
    }

    #[test]
    fn grouped_digits() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(6488), "6,488");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }

    #[test]
    fn counts_take_the_singular_for_one() {
        assert_eq!(count(1, "block", "blocks"), "1 block");
        assert_eq!(count(0, "block", "blocks"), "0 blocks");
        assert_eq!(count(2, "other group", "other groups"), "2 other groups");
    }

    #[test]
    fn size_arguments_read_si_and_binary_units() {
        assert_eq!(parse_size_arg("85899345920"), Ok(80 << 30));
        assert_eq!(parse_size_arg("80G"), Ok(80 << 30));
        assert_eq!(parse_size_arg("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_size_arg("36GB"), Ok(36_000_000_000));
        assert_eq!(parse_size_arg("512MB"), Ok(512_000_000));
        assert_eq!(parse_size_arg("80 GiB"), Ok(80 << 30));
        assert_eq!(parse_size_arg("39.39GiB"), Ok(42_294_690_447));
        assert_eq!(parse_size_arg("81920MiB"), Ok(80 << 30));
        assert!(parse_size_arg("lots").is_err());
        assert!(parse_size_arg("0").is_err());
        assert!(parse_size_arg("9999999999TB").is_err());
        // 1 PiB is the most a device is taken to hold: 1024 TiB is taken, a byte more not.
        assert_eq!(parse_size_arg("1024TiB"), Ok(1 << 50));
        assert_eq!(
            parse_size_arg("1125899906842625"),
            Err(
                "\"1125899906842625\" is more than any device holds (at most 1 PiB, 2^50 bytes)"
                    .into()
            )
        );
        assert!(parse_size_arg("80 parsecs").is_err());
    }

    /// One reading of a number and a unit for every reader; each names its words.
    #[test]
    fn the_same_word_is_the_multiple_its_writer_means() {
        assert_eq!(UnitWords::CommandLine.multiplier("KB"), Some(1_000));
        assert_eq!(UnitWords::PyTorch.multiplier("KB"), Some(1_024));
        assert_eq!(UnitWords::NvidiaSmi.multiplier("KB"), Some(1_024));
        assert_eq!(UnitWords::CommandLine.multiplier("g"), Some(1 << 30));
        assert_eq!(UnitWords::PyTorch.multiplier("bytes"), Some(1));
        assert_eq!(UnitWords::PyTorch.multiplier("EiB"), Some(1 << 60));
        // nvidia-smi's words are matched as written.
        assert_eq!(UnitWords::NvidiaSmi.multiplier("mib"), None);
        assert_eq!(UnitWords::NvidiaSmi.multiplier("MiB"), Some(1 << 20));
        // 1.5 KiB and 0.0005 KiB (0.512 byte) rounded each way; digits past the 19th
        // are ignored; a value past u64::MAX is none.
        assert_eq!(scaled_bytes("1", "5", 1024, Rounding::HalfUp), Some(1536));
        assert_eq!(scaled_bytes("0", "0005", 1024, Rounding::HalfUp), Some(1));
        assert_eq!(scaled_bytes("0", "0005", 1024, Rounding::Down), Some(0));
        assert_eq!(
            scaled_bytes("1", "00000000000000000009", 1 << 60, Rounding::Down),
            Some(1 << 60)
        );
        assert_eq!(scaled_bytes("16", "", 1 << 60, Rounding::Down), None);
        assert_eq!(scaled_bytes("1", "x", 1, Rounding::Down), None);
        // The command line: a fraction of a byte rounds, less than one byte is refused.
        assert_eq!(parse_size_arg("1.5KiB"), Ok(1536));
        assert_eq!(parse_size_arg(".5KiB"), Ok(512));
        assert_eq!(parse_size_arg("1048576.6"), Ok(1_048_577));
        assert!(parse_size_arg("0.6").is_err());
        // A bare number is bytes: under a MiB it was meant in a unit, and is refused.
        assert_eq!(
            parse_size_arg("80"),
            Err("\"80\" without a unit is 80 bytes: did you mean 80GB or 80GiB?".to_string())
        );
        assert!(parse_size_arg("1048575").is_err());
        assert_eq!(parse_size_arg("1048576"), Ok(1 << 20));
        assert_eq!(parse_size_arg("80KiB"), Ok(80 << 10));
        assert!(parse_size_arg("1.2.3GiB").is_err());
    }

    #[test]
    fn parsed_times_round_trip() {
        for us in [
            0,
            1_748_729_125_406_000,
            951_782_400_000_000,
            1_750_000_000_123_000,
        ] {
            assert_eq!(parse_utc_time(&utc_time(us)), Some(us));
        }
        assert_eq!(
            parse_utc_time("2025-05-31T22:05:25.406508Z"),
            Some(1_748_729_125_406_508)
        );
        assert_eq!(
            parse_utc_time("2025-05-31 22:05"),
            Some(1_748_729_100_000_000)
        );
        assert_eq!(parse_utc_time("2025-13-01 00:00"), None);
        let t = 1_750_000_000_006_586;
        assert_eq!(utc_time_to(t, 1), "2025-06-15 15:06:40.006586 UTC");
        assert_eq!(utc_time_to(t, 1000), "2025-06-15 15:06:40.006 UTC");
        assert_eq!(utc_time_to(t, 100_000), "2025-06-15 15:06:40.0 UTC");
        assert_eq!(utc_time_to(t, 1_000_000), "2025-06-15 15:06:40 UTC");
        assert_eq!(utc_time_to(t, 60_000_000), "2025-06-15 15:06 UTC");
        for unit in [1, 10, 1000, 100_000, 1_000_000, 60_000_000] {
            assert_eq!(
                parse_utc_time(&utc_time_to(t - t % unit, unit)),
                Some(t - t % unit)
            );
        }
        assert_eq!(parse_utc_time("yesterday"), None);
        assert_eq!(parse_duration_us("1.5s"), Some(1_500_000));
        assert_eq!(parse_duration_us("300ms"), Some(300_000));
        assert_eq!(parse_duration_us("12us"), Some(12));
        assert_eq!(parse_duration_us("2min"), Some(120_000_000));
        assert_eq!(parse_duration_us("NaNs"), None);
        assert_eq!(parse_duration_us("5 parsecs"), None);
    }
}
