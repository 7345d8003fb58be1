//! The value parsers that clap calls: durations, the TTL, the drift factor.
//!
//! A leaf: it imports nothing from the crate, so that [`crate::cli`] (which hands these functions to
//! clap, so that a bad value is reported with the name of its flag) and [`crate::config`] (which
//! validates everything else) both use it without importing each other.

use std::time::Duration;

/// Longest accepted duration: anything beyond a year is a typo, not a lease.
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Shortest lease worth asking for: the fixed clock-drift allowance alone is 2 ms, so a shorter TTL
/// could never be granted and would only ever look busy.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The lease TTL when none is given (and `renew`'s for a lock whose grant recorded none).
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// Parses `250ms`, `30s`, `1h30m` (humantime) or a bare, possibly fractional, number of seconds.
/// Zero is allowed here; see [`parse_positive_duration`].
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration; use e.g. 250ms, 30s, 2m, 1h30m or seconds like 0.5".into());
    }
    if s.starts_with('-') {
        return Err("a duration cannot be negative".into());
    }
    let d = if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let secs: f64 = s
            .parse()
            .map_err(|_| format!("'{s}' is not a number of seconds; use e.g. 10, 0.5 or 30s"))?;
        if secs > MAX_DURATION.as_secs_f64() {
            return Err(too_long());
        }
        Duration::from_secs_f64(secs)
    } else {
        humantime::parse_duration(s)
            .map_err(|e| format!("{e}; use e.g. 250ms, 30s, 2m, 1h30m or seconds like 0.5"))?
    };
    if d > MAX_DURATION {
        return Err(too_long());
    }
    Ok(d)
}

fn too_long() -> String {
    "longer than a year; that is surely a typo".into()
}

/// A duration of at least one millisecond (TTL, node timeout): Redis counts in milliseconds.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration_or_zero(text)?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    if d < Duration::from_millis(1) {
        return Err("must be at least 1ms".into());
    }
    Ok(d)
}

/// A lease TTL: at least [`MIN_TTL`].
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let d = parse_positive_duration(text)?;
    if d < MIN_TTL {
        return Err(
            "must be at least 10ms: the clock-drift allowance alone is 2ms, so a shorter lease \
             could never be granted"
                .into(),
        );
    }
    Ok(d)
}

/// The Redlock clock-drift factor: a fraction of the TTL in [0, 0.5).
pub fn parse_drift_factor(text: &str) -> Result<f64, String> {
    let f: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number; use a fraction such as 0.01"))?;
    if !(0.0..0.5).contains(&f) {
        return Err("must be at least 0 and below 0.5 (0.01 is the usual value)".into());
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration_or_zero("1.5").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration_or_zero("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_duration_or_zero("1h30m").unwrap(),
            Duration::from_secs(5400)
        );
        assert!(parse_positive_duration("0").is_err());
        assert!(parse_positive_duration("0s").is_err());
        assert!(parse_duration_or_zero("-1").is_err());
        assert!(parse_duration_or_zero("abc").is_err());
        assert!(parse_duration_or_zero("1e400").is_err());
        assert!(parse_duration_or_zero("100y").is_err());
        assert!(parse_duration_or_zero("nan").is_err());
    }
}
