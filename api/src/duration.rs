//! `agent.machineReconcileInterval`: a Go duration string (`"10m"`, `"1h30m"`, `"1.5s"`) or an
//! integer number of nanoseconds, serialised back as Go formats durations (`"10m0s"`).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative duration read and written as Go's `time.Duration`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

/// Why a duration string did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

const UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a Go duration string. Negative durations are rejected (the config forbids them).
pub fn parse_go_duration(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_string(),
        reason,
    };
    let mut s = input;
    if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    } else if let Some(rest) = s.strip_prefix('-') {
        if rest == "0" {
            return Ok(Duration::ZERO);
        }
        return Err(err("must not be negative"));
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut total: u128 = 0;
    while !s.is_empty() {
        let int_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (int_part, rest) = s.split_at(int_end);
        let (frac_part, rest) = match rest.strip_prefix('.') {
            Some(r) => {
                let e = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
                r.split_at(e)
            }
            None => ("", rest),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(err("expected a number"));
        }
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let (unit, rest) = rest.split_at(unit_end);
        let scale = UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, n)| *n)
            .ok_or_else(|| {
                err(if unit.is_empty() {
                    "missing unit"
                } else {
                    "unknown unit"
                })
            })?;
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| err("number too large"))?
        };
        let mut value = int.checked_mul(scale).ok_or_else(|| err("overflow"))?;
        if !frac_part.is_empty() {
            // Go truncates the fraction at nanosecond precision.
            let mut frac_scale = scale;
            for d in frac_part.bytes() {
                frac_scale /= 10;
                if frac_scale == 0 {
                    break;
                }
                value += u128::from(d - b'0') * frac_scale;
            }
        }
        total = total.checked_add(value).ok_or_else(|| err("overflow"))?;
        s = rest;
    }
    if total > i64::MAX as u128 {
        return Err(err("overflow"));
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Formats like Go's `Duration.String()`: `"0s"`, `"300ms"`, `"1.5s"`, `"10m0s"`, `"1h0m0s"`.
pub fn format_go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000_000_000 {
        let (unit, scale) = if ns < 1_000 {
            ("ns", 1)
        } else if ns < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", frac(ns, scale));
    }
    let h = ns / 3_600_000_000_000;
    let rem = ns % 3_600_000_000_000;
    let m = rem / 60_000_000_000;
    let s_ns = rem % 60_000_000_000;
    let secs = format!("{}s", frac(s_ns, 1_000_000_000));
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

fn frac(v: u128, scale: u128) -> String {
    let int = v / scale;
    let mut f = v % scale;
    if f == 0 {
        return int.to_string();
    }
    let mut digits = scale.to_string().len() - 1;
    while f.is_multiple_of(10) {
        f /= 10;
        digits -= 1;
    }
    format!("{int}.{f:0digits$}")
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_go_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = GoDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"10m\" or an integer number of nanoseconds")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GoDuration, E> {
                parse_go_duration(v.trim())
                    .map(GoDuration)
                    .map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GoDuration, E> {
                Ok(GoDuration(Duration::from_nanos(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GoDuration, E> {
                u64::try_from(v)
                    .map(|n| GoDuration(Duration::from_nanos(n)))
                    .map_err(|_| E::custom("duration must not be negative"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<GoDuration, E> {
                if v < 0.0 || v.fract() != 0.0 || v > i64::MAX as f64 {
                    return Err(E::custom(
                        "duration must be a non-negative whole number of nanoseconds",
                    ));
                }
                Ok(GoDuration(Duration::from_nanos(v as u64)))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_go_forms() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("10m", 600_000_000_000),
            ("1h30m", 5_400_000_000_000),
            ("1.5s", 1_500_000_000),
            ("300ms", 300_000_000),
            ("2us", 2_000),
            ("2µs", 2_000),
            ("1h0m0s", 3_600_000_000_000),
            (".5m", 30_000_000_000),
            ("+5s", 5_000_000_000),
        ];
        for (s, ns) in cases {
            assert_eq!(
                parse_go_duration(s).unwrap(),
                Duration::from_nanos(*ns),
                "{s}"
            );
        }
    }

    #[test]
    fn rejects_bad_forms() {
        for s in ["", "10", "-1s", "1x", "m", "1..5s", "s10"] {
            assert!(parse_go_duration(s).is_err(), "{s:?} should fail");
        }
    }

    #[test]
    fn formats_as_go() {
        let cases: &[(u64, &str)] = &[
            (0, "0s"),
            (600_000_000_000, "10m0s"),
            (3_600_000_000_000, "1h0m0s"),
            (1_500_000_000, "1.5s"),
            (300_000_000, "300ms"),
            (1_500, "1.5µs"),
            (5, "5ns"),
            (3_723_000_000_000, "1h2m3s"),
        ];
        for (ns, s) in cases {
            assert_eq!(format_go_duration(Duration::from_nanos(*ns)), *s);
        }
    }

    #[test]
    fn json_accepts_string_and_integer() {
        let d: GoDuration = serde_json::from_str("\"10m\"").unwrap();
        assert_eq!(d.0, Duration::from_secs(600));
        let d: GoDuration = serde_json::from_str("600000000000").unwrap();
        assert_eq!(d.0, Duration::from_secs(600));
        assert!(serde_json::from_str::<GoDuration>("-5").is_err());
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"10m0s\"");
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(ns in 0u64..(i64::MAX as u64)) {
            let d = Duration::from_nanos(ns);
            prop_assert_eq!(parse_go_duration(&format_go_duration(d)).unwrap(), d);
        }
    }
}
