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
        // Checked arithmetic throughout: any value past MAX_NANOS is "out of range", never a
        // panic (debug) or a wrapped value (release).
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| err(OUT_OF_RANGE))?
        };
        let mut value = int
            .checked_mul(scale)
            .filter(|v| *v <= MAX_NANOS)
            .ok_or_else(|| err(OUT_OF_RANGE))?;
        if !frac_part.is_empty() {
            // Go truncates the fraction at nanosecond precision.
            let mut frac_scale = scale;
            for d in frac_part.bytes() {
                frac_scale /= 10;
                if frac_scale == 0 {
                    break;
                }
                value = value
                    .checked_add(u128::from(d - b'0') * frac_scale)
                    .ok_or_else(|| err(OUT_OF_RANGE))?;
            }
        }
        total = total
            .checked_add(value)
            .filter(|t| *t <= MAX_NANOS)
            .ok_or_else(|| err(OUT_OF_RANGE))?;
        s = rest;
    }
    nanos_to_duration(total).ok_or_else(|| err(OUT_OF_RANGE))
}

/// The largest duration accepted, in nanoseconds: Go's `time.Duration` range (`i64::MAX`,
/// about 292 years), for the string and the integer form alike.
pub const MAX_NANOS: u128 = i64::MAX as u128;

const OUT_OF_RANGE: &str = "out of range (at most 2562047h47m16.854775807s, i64::MAX nanoseconds)";

fn nanos_to_duration(ns: u128) -> Option<Duration> {
    if ns > MAX_NANOS {
        return None;
    }
    u64::try_from(ns).ok().map(Duration::from_nanos)
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
                nanos_to_duration(u128::from(v))
                    .map(GoDuration)
                    .ok_or_else(|| E::custom(format!("integer duration {OUT_OF_RANGE}")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GoDuration, E> {
                u64::try_from(v)
                    .map(|n| GoDuration(Duration::from_nanos(n)))
                    .map_err(|_| E::custom("duration must not be negative"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<GoDuration, E> {
                if v < 0.0 || v.fract() != 0.0 {
                    return Err(E::custom(
                        "duration must be a non-negative whole number of nanoseconds",
                    ));
                }
                // `i64::MAX as f64` rounds up to 2^63, itself out of range.
                if v >= i64::MAX as f64 {
                    return Err(E::custom(format!("integer duration {OUT_OF_RANGE}")));
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

    /// Real parser, no fakes: values past Go's `time.Duration` range (i64::MAX ns) are an
    /// error in both forms, never a panic (debug) or a wrapped value (release).
    #[test]
    fn out_of_range_is_an_error_not_a_panic_or_wrap() {
        for s in [
            "340282366920938463463374607431768211.9us",
            "340282366920938463463374607431768211455ns",
            "9223372036854775808ns",
            "9223372036.854775808s",
            "2562048h",
            "2562047h47m16.854775808s",
            "99999999999999999999999999999999999999999999h",
            "0.99999999999999999999999999999999999999999999999h",
        ] {
            let r = std::panic::catch_unwind(|| parse_go_duration(s));
            let r = r.unwrap_or_else(|_| panic!("{s:?} panicked"));
            if s.starts_with("0.") {
                assert!(r.is_ok(), "{s:?}: {r:?}");
                continue;
            }
            let e = r.expect_err(s).to_string();
            assert!(e.contains("out of range"), "{s:?}: {e}");
        }
        assert_eq!(
            parse_go_duration("9223372036854775807ns").unwrap(),
            Duration::from_nanos(i64::MAX as u64)
        );
        assert_eq!(
            parse_go_duration("2562047h47m16.854775807s").unwrap(),
            Duration::from_nanos(i64::MAX as u64)
        );
        // The integer form has the same range.
        assert!(serde_json::from_str::<GoDuration>("9223372036854775807").is_ok());
        for v in ["9223372036854775808", "18446744073709551615", "1e19"] {
            let e = serde_json::from_str::<GoDuration>(v)
                .unwrap_err()
                .to_string();
            assert!(e.contains("out of range"), "{v}: {e}");
        }
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(ns in 0u64..(i64::MAX as u64)) {
            let d = Duration::from_nanos(ns);
            prop_assert_eq!(parse_go_duration(&format_go_duration(d)).unwrap(), d);
        }
    }
}
