//! The agent unit's start limit (`StartLimitIntervalSec=`, `StartLimitBurst=`): how long to
//! wait before a step that starts the unit so that its starts stay within the limit
//! ([`wait_needed`], pure), and the parsing of what it is computed from: the unit's settings
//! (`systemctl show`), its starts in the current boot (the journal), and the guest's clock.
//!
//! systemd counts every start of a unit that passes the limit, a restart or an automatic
//! `Restart=` included, and refuses (and fails the unit) past `burst` starts in `interval`.
//! The starts are the journal entries PID 1 logs when it begins a start job for the unit
//! ("Starting …", `MESSAGE_ID=7d4958e842da4a758f6c1cdc7b36dcc5`, `UNIT=` the unit); PID 1 logs
//! that message only after the start passed the limit, so every such entry is a counted start.
//! Its `__MONOTONIC_TIMESTAMP` is on the clock the limit uses (`CLOCK_MONOTONIC`), which, unlike
//! the wall clock, a snapshot restore does not move: the guest's "now" is `/proc/uptime` (the
//! boot-time clock, equal to the monotonic one on a VM that never suspends).
//!
//! systemd's limiter is a fixed window that `systemctl reset-failed` also resets. systemd does
//! not log a reset, but the agent's recovery does, right after it resets the unit
//! ([`flex_api::upgrade::START_LIMIT_RESET_LOG`] in the recovery unit's journal): starts
//! before the last such line no longer count. The wait is otherwise the sliding-window bound:
//! no more than `burst` starts in any `interval`, counting the new ones as happening now. That
//! bound holds whatever windows systemd had, so it is never too short; it may be longer than
//! strictly needed.

use std::time::Duration;

/// systemd's "unit starting" message (`SD_MESSAGE_UNIT_STARTING`).
pub const MESSAGE_ID_STARTING: &str = "7d4958e842da4a758f6c1cdc7b36dcc5";

/// Added to every wait: the clocks are read over SSH, to centiseconds.
pub const MARGIN: Duration = Duration::from_secs(1);

/// A unit's start limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartLimit {
    /// `StartLimitIntervalSec=`; `None` for `infinity`.
    pub interval: Option<Duration>,
    /// `StartLimitBurst=`.
    pub burst: u32,
}

impl StartLimit {
    /// Whether systemd limits starts at all (a zero interval or burst turns the limit off).
    pub fn enabled(&self) -> bool {
        self.burst > 0 && self.interval != Some(Duration::ZERO)
    }
}

impl std::fmt::Display for StartLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.interval {
            Some(i) => write!(f, "{} starts in {}s", self.burst, i.as_secs()),
            None => write!(f, "{} starts per boot", self.burst),
        }
    }
}

/// Why no wait helps.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartLimitError {
    /// The step alone needs more starts than the limit allows.
    #[error("the step needs {needed} starts, more than the start limit's {burst}")]
    TooMany {
        /// Starts the step needs.
        needed: u32,
        /// The limit's burst.
        burst: u32,
    },
    /// The interval is infinite and the boot's starts already use up the limit.
    #[error(
        "{recent} starts this boot and {needed} more exceed the start limit of {burst} per boot"
    )]
    Never {
        /// Starts this boot.
        recent: usize,
        /// Starts the step needs.
        needed: u32,
        /// The limit's burst.
        burst: u32,
    },
}

/// How long to wait from `now` so that `needed` starts made then stay within `limit`, given the
/// unit's earlier `starts` (all on the same clock as `now`, in any order). Zero when they fit
/// already; otherwise until enough of the starts of the last `interval` are older than
/// `interval` (a start exactly `interval` old still counts, as in systemd), plus [`MARGIN`].
pub fn wait_needed(
    limit: StartLimit,
    starts: &[Duration],
    needed: u32,
    now: Duration,
) -> Result<Duration, StartLimitError> {
    if needed == 0 || !limit.enabled() {
        return Ok(Duration::ZERO);
    }
    if needed > limit.burst {
        return Err(StartLimitError::TooMany {
            needed,
            burst: limit.burst,
        });
    }
    let mut recent: Vec<Duration> = starts
        .iter()
        .copied()
        .filter(|s| limit.interval.is_none_or(|i| *s + i >= now))
        .collect();
    recent.sort();
    let allowed = (limit.burst - needed) as usize;
    if recent.len() <= allowed {
        return Ok(Duration::ZERO);
    }
    let Some(interval) = limit.interval else {
        return Err(StartLimitError::Never {
            recent: recent.len(),
            needed,
            burst: limit.burst,
        });
    };
    // The first `excess` of them must age out; the last of those decides.
    let excess = recent.len() - allowed;
    let until = recent[excess - 1] + interval + MARGIN;
    Ok(until.saturating_sub(now))
}

/// Parses a systemd time span as `systemctl show` prints it: `5min`, `1min 30s`, `1.500s`,
/// `300ms`, `0`, `infinity`. `Ok(None)` is infinity.
pub fn parse_timespan(s: &str) -> anyhow::Result<Option<Duration>> {
    let s = s.trim();
    if s == "infinity" {
        return Ok(None);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        anyhow::bail!("empty time span");
    }
    while !rest.is_empty() {
        rest = rest.trim_start();
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_end);
        let value: f64 = num
            .parse()
            .map_err(|_| anyhow::anyhow!("time span {s:?}: bad number {num:?}"))?;
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c.is_whitespace())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let secs = match unit {
            "" | "s" | "sec" | "second" | "seconds" => 1.0,
            "us" | "usec" | "µs" => 1e-6,
            "ms" | "msec" => 1e-3,
            "m" | "min" | "minute" | "minutes" => 60.0,
            "h" | "hr" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86_400.0,
            "w" | "week" | "weeks" => 604_800.0,
            "M" | "month" | "months" => 2_629_800.0,
            "y" | "year" | "years" => 31_557_600.0,
            other => anyhow::bail!("time span {s:?}: unknown unit {other:?}"),
        };
        total += value * secs;
        rest = after;
    }
    Ok(Some(Duration::from_secs_f64(total)))
}

/// Parses `systemctl show -p StartLimitIntervalUSec -p StartLimitBurst <unit>`.
pub fn parse_limit(show: &str) -> anyhow::Result<StartLimit> {
    let mut interval = None;
    let mut burst = None;
    for line in show.lines() {
        match line.split_once('=') {
            Some(("StartLimitIntervalUSec", v)) => interval = Some(parse_timespan(v)?),
            Some(("StartLimitBurst", v)) => burst = Some(v.trim().parse::<u32>()?),
            _ => {}
        }
    }
    match (interval, burst) {
        (Some(interval), Some(burst)) => Ok(StartLimit { interval, burst }),
        _ => anyhow::bail!("no StartLimitIntervalUSec and StartLimitBurst in {show:?}"),
    }
}

/// The start times (monotonic, since boot) of `unit` in `journalctl -o json` lines: entries
/// with [`MESSAGE_ID_STARTING`] and `UNIT=unit`; other lines are ignored.
pub fn parse_starts(journal_json: &str, unit: &str) -> Vec<Duration> {
    journal_json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v.get("MESSAGE_ID").and_then(|m| m.as_str()) == Some(MESSAGE_ID_STARTING)
                && v.get("UNIT").and_then(|u| u.as_str()) == Some(unit)
        })
        .filter_map(|v| {
            v.get("__MONOTONIC_TIMESTAMP")
                .and_then(|t| t.as_str())
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_micros)
        })
        .collect()
}

/// The guest's clock from `/proc/uptime` (its first field, seconds).
pub fn parse_uptime(text: &str) -> anyhow::Result<Duration> {
    let first = text.split_whitespace().next().unwrap_or_default();
    let secs: f64 = first
        .parse()
        .map_err(|_| anyhow::anyhow!("/proc/uptime: {text:?}"))?;
    Ok(Duration::from_secs_f64(secs))
}

/// The unit whose journal records the agent's start-limit resets.
pub use flex_api::status::RECOVERY_UNIT;

/// The times (monotonic, since boot) of the recovery's start-limit resets in
/// `journalctl -o json` lines: entries whose `MESSAGE` contains
/// [`flex_api::upgrade::START_LIMIT_RESET_LOG`].
pub fn parse_resets(journal_json: &str) -> Vec<Duration> {
    journal_json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v.get("MESSAGE")
                .and_then(|m| m.as_str())
                .is_some_and(|m| m.contains(flex_api::upgrade::START_LIMIT_RESET_LOG))
        })
        .filter_map(|v| {
            v.get("__MONOTONIC_TIMESTAMP")
                .and_then(|t| t.as_str())
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_micros)
        })
        .collect()
}

/// The starts that still count: those after the last reset.
pub fn counted_starts(starts: &[Duration], resets: &[Duration]) -> Vec<Duration> {
    match resets.iter().max() {
        Some(last) => starts.iter().copied().filter(|s| s > last).collect(),
        None => starts.to_vec(),
    }
}

/// One SSH command for everything [`wait_needed`] needs about `unit`, in sections
/// (`---show`, `---journal`, `---resets`, `---uptime`); [`parse_snapshot`] reads it.
pub fn snapshot_script(unit: &str) -> String {
    format!(
        "echo ---show; systemctl show -p StartLimitIntervalUSec -p StartLimitBurst {unit}; \
         echo ---journal; journalctl -b -o json --no-pager --output-fields=MESSAGE_ID,UNIT \
           MESSAGE_ID={MESSAGE_ID_STARTING} UNIT={unit} _PID=1; \
         echo ---resets; journalctl -b -o json --no-pager --output-fields=MESSAGE \
           -u {RECOVERY_UNIT}; \
         echo ---uptime; cat /proc/uptime"
    )
}

/// The limit, the starts and the clock from [`snapshot_script`]'s output.
pub fn parse_snapshot(
    text: &str,
    unit: &str,
) -> anyhow::Result<(StartLimit, Vec<Duration>, Duration)> {
    let section = |name: &str| -> &str {
        let marker = format!("---{name}\n");
        text.split_once(&marker)
            .map(|(_, rest)| rest.split("\n---").next().unwrap_or_default())
            .unwrap_or_default()
    };
    Ok((
        parse_limit(section("show"))?,
        counted_starts(
            &parse_starts(section("journal"), unit),
            &parse_resets(section("resets")),
        ),
        parse_uptime(section("uptime"))?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    const LIMIT: StartLimit = StartLimit {
        interval: Some(Duration::from_secs(300)),
        burst: 5,
    };

    #[test]
    fn starts_before_the_last_recovery_reset_do_not_count() {
        let resets = parse_resets(&format!(
            "{{\"MESSAGE\":\"2026-12-02T18:00:00Z INFO {}\",\"__MONOTONIC_TIMESTAMP\":\"50000000\"}}\n{{\"MESSAGE\":\"other\",\"__MONOTONIC_TIMESTAMP\":\"90000000\"}}\n",
            flex_api::upgrade::START_LIMIT_RESET_LOG
        ));
        assert_eq!(resets, [s(50)]);
        assert_eq!(
            counted_starts(&[s(10), s(40), s(51), s(60)], &resets),
            [s(51), s(60)]
        );
        assert_eq!(counted_starts(&[s(10)], &[]), [s(10)]);
    }

    #[test]
    fn wait_table() {
        // Starts, starts needed, now, the wait (`None`: no wait helps).
        type Row = (&'static [u64], u32, u64, Option<u64>);
        let table: &[Row] = &[
            // Nothing before: no wait.
            (&[], 1, 1000, Some(0)),
            (&[], 5, 1000, Some(0)),
            // Room left in the interval.
            (&[900, 910, 920], 2, 1000, Some(0)),
            (&[900, 910, 920, 930], 1, 1000, Some(0)),
            // One too many: the oldest must age out (900 + 300 + 1 - 1000).
            (&[900, 910, 920, 930], 2, 1000, Some(201)),
            (&[900, 910, 920, 930, 940], 1, 1000, Some(201)),
            // Two too many: the second oldest decides.
            (&[900, 910, 920, 930, 940], 2, 1000, Some(211)),
            // A step that needs the whole burst waits for every recent start.
            (&[900, 910, 920], 5, 1000, Some(221)),
            // Starts older than the interval do not count.
            (&[100, 200, 699, 700, 900], 2, 1000, Some(0)),
            // Exactly `interval` old: still counts (systemd ages a start out only past it).
            (&[700, 800, 810, 820, 830], 1, 1000, Some(1)),
            // Order does not matter.
            (&[940, 900, 930, 910, 920], 1, 1000, Some(201)),
            // Nothing needed, or more than the burst.
            (&[900, 910, 920, 930, 940], 0, 1000, Some(0)),
            (&[], 6, 1000, None),
        ];
        for (starts, needed, now, want) in table {
            let starts: Vec<Duration> = starts.iter().map(|x| s(*x)).collect();
            let got = wait_needed(LIMIT, &starts, *needed, s(*now));
            match want {
                Some(w) => assert_eq!(
                    got,
                    Ok(s(*w)),
                    "starts {starts:?}, needed {needed}, now {now}"
                ),
                None => assert!(got.is_err(), "starts {starts:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn disabled_and_infinite_limits() {
        let off = StartLimit {
            interval: Some(Duration::ZERO),
            burst: 5,
        };
        assert_eq!(wait_needed(off, &[s(1); 10], 3, s(2)), Ok(Duration::ZERO));
        let off = StartLimit {
            interval: Some(s(10)),
            burst: 0,
        };
        assert_eq!(wait_needed(off, &[s(1); 10], 3, s(2)), Ok(Duration::ZERO));
        let boot = StartLimit {
            interval: None,
            burst: 3,
        };
        assert_eq!(wait_needed(boot, &[s(1)], 2, s(5000)), Ok(Duration::ZERO));
        assert_eq!(
            wait_needed(boot, &[s(1), s(2)], 2, s(5000)),
            Err(StartLimitError::Never {
                recent: 2,
                needed: 2,
                burst: 3
            })
        );
        assert_eq!(LIMIT.to_string(), "5 starts in 300s");
    }

    #[test]
    fn timespans() {
        for (text, secs) in [
            ("5min", Some(300.0)),
            ("1min 30s", Some(90.0)),
            ("1.500s", Some(1.5)),
            ("300ms", Some(0.3)),
            ("10s", Some(10.0)),
            ("0", Some(0.0)),
            ("2h 1min", Some(7260.0)),
            ("infinity", None),
        ] {
            assert_eq!(
                parse_timespan(text).unwrap(),
                secs.map(Duration::from_secs_f64),
                "{text}"
            );
        }
        assert!(parse_timespan("").is_err());
        assert!(parse_timespan("5 parsecs").is_err());
    }

    #[test]
    fn limit_journal_and_uptime() {
        assert_eq!(
            parse_limit("StartLimitIntervalUSec=5min\nStartLimitBurst=5\n").unwrap(),
            LIMIT
        );
        assert!(parse_limit("StartLimitBurst=5\n").is_err());

        let unit = "aks-flex-node-agent.service";
        let journal = format!(
            concat!(
                r#"{{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1700000000000000","__MONOTONIC_TIMESTAMP":"12500000","_BOOT_ID":"b","MESSAGE_ID":"{id}","UNIT":"{unit}"}}"#,
                "\n",
                r#"{{"__MONOTONIC_TIMESTAMP":"13000000","MESSAGE_ID":"39f53479d3a045ac8e11786248231fbf","UNIT":"{unit}"}}"#,
                "\n",
                r#"{{"__MONOTONIC_TIMESTAMP":"14000000","MESSAGE_ID":"{id}","UNIT":"other.service"}}"#,
                "\n",
                "-- No entries --\n",
                r#"{{"__MONOTONIC_TIMESTAMP":"95250000","MESSAGE_ID":"{id}","UNIT":"{unit}"}}"#,
                "\n"
            ),
            id = MESSAGE_ID_STARTING,
            unit = unit
        );
        assert_eq!(
            parse_starts(&journal, unit),
            [
                Duration::from_micros(12_500_000),
                Duration::from_micros(95_250_000)
            ]
        );
        assert_eq!(
            parse_uptime("123.45 200.00\n").unwrap(),
            Duration::from_secs_f64(123.45)
        );
        assert!(parse_uptime("").is_err());

        let text = format!(
            "---show\nStartLimitIntervalUSec=5min\nStartLimitBurst=5\n---journal\n{journal}---uptime\n100.00 50.00\n"
        );
        let (limit, starts, now) = parse_snapshot(&text, unit).unwrap();
        assert_eq!(limit, LIMIT);
        assert_eq!(starts.len(), 2);
        assert_eq!(now, s(100));
        let script = snapshot_script(unit);
        assert!(script.contains(&format!(
            "MESSAGE_ID={MESSAGE_ID_STARTING} UNIT={unit} _PID=1"
        )));
    }
}
