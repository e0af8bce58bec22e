//! Analyses: each takes a [`crate::model::Snapshot`] and gives a plain report struct
//! (serialisable, no formatting).

pub mod budget;
pub mod device;
pub mod kinds;
pub mod moments;
pub mod oom;
pub mod reports;
pub mod what_if;

/// How to record a trace, for devices that have none (or one that shows nothing). Words
/// for people, printed by the analyses' own errors (no moment, no timeline) and by the
/// renderers (`summary`, `top`); it sits here, not in the replay, so the replay holds
/// no sentences, and here rather than in `render` so the errors can name it without
/// the analyses reading the renderers.
pub const HOW_TO_RECORD: &str = "record one with torch.cuda.memory._record_memory_history(max_entries=100000) before the work, then torch.cuda.memory._dump_snapshot(path)";

/// `part / whole` rounded to 4 decimals (half up, in integers, so one rule gives every
/// share and ratio of the JSON outputs); a whole of 0 counts as 1.
pub fn share(part: u64, whole: u64) -> f64 {
    ten_thousandths(part, whole) as f64 / 10_000.0
}

/// `part / whole` in units of 1/10000, rounded half up.
pub fn ten_thousandths(part: u64, whole: u64) -> u64 {
    let whole = whole.max(1) as u128;
    ((part as u128 * 20_000 + whole) / (whole * 2)) as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn shares_round_half_up_to_four_decimals() {
        assert_eq!(super::share(1, 3), 0.3333);
        assert_eq!(super::share(2, 3), 0.6667);
        // 1/8 = 0.125 exactly: 1250 ten-thousandths.
        assert_eq!(super::share(1, 8), 0.125);
        // 0.00005 exactly rounds up.
        assert_eq!(super::share(1, 20_000), 0.0001);
        assert_eq!(super::share(3, 2), 1.5);
        assert_eq!(super::share(5, 0), 5.0);
        assert_eq!(super::share(u64::MAX, u64::MAX), 1.0);
    }
}
