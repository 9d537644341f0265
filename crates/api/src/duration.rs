//! Go-style durations (`300ms`, `30s`, `5m`, `1h30m`): how the flags and the rollout's `bakeTime` and
//! `waveTimeout` spell them, read and written by one rule.

use std::time::Duration;

/// Reads a Go-style duration: `300ms`, `30s`, `5m`, `1h`, sums such as `1m30s`, and `0`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?}: use e.g. 30s, 5m, 1h30m");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
        if digits == 0 {
            return Err(invalid());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.saturating_mul(60)),
            "h" => Duration::from_secs(number.saturating_mul(3600)),
            _ => return Err(invalid()),
        };
        total = total.saturating_add(part);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// Writes `duration` as Go does for whole seconds (`10m`, `1h30m`, `45s`); below a second, in
/// milliseconds (`300ms`).
pub fn format(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let mut text = String::new();
    for (value, unit) in [(hours, "h"), (minutes, "m"), (seconds, "s")] {
        if value > 0 {
            text.push_str(&format!("{value}{unit}"));
        }
    }
    if text.is_empty() {
        text = format!("{}ms", duration.as_millis());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_go_writes() {
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
        for bad in ["", "5", "m", "5x", "-1s", "1.5s"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn writes_what_it_reads() {
        assert_eq!(format(Duration::from_secs(600)), "10m");
        assert_eq!(format(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format(Duration::from_secs(45)), "45s");
        assert_eq!(format(Duration::from_millis(300)), "300ms");
        for text in ["10m", "1h30m", "45s", "300ms"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
