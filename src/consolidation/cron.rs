//! Five-field cron schedules (minute hour day-of-month month day-of-week,
//! in UTC) for consolidation rules: `*`, `*/n`, `a`, `a-b`, `a-b/n` and
//! lists, plus `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`. As in
//! cron, when both day fields are restricted a day matching either runs.

use chrono::{DateTime, Datelike, Timelike, Utc};

/// A parsed schedule: for each field, the set of values it runs at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    days_restricted: bool,
    weekdays_restricted: bool,
}

fn field(text: &str, name: &str, min: u32, max: u32) -> Result<(u64, bool), String> {
    let mut set = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("{name}: bad step {step:?}"))?;
                (range, step)
            }
            None => (part, 1),
        };
        let number = |t: &str| -> Result<u32, String> {
            t.parse::<u32>()
                .ok()
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| format!("{name}: {t:?} is not a number from {min} to {max}"))
        };
        let (low, high) = match range {
            "*" => (min, max),
            r => match r.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None if step > 1 => (number(r)?, max),
                None => {
                    let n = number(r)?;
                    (n, n)
                }
            },
        };
        if low > high {
            return Err(format!("{name}: range {range:?} runs backwards"));
        }
        let mut n = low;
        while n <= high {
            set |= 1 << n;
            n += step;
        }
    }
    Ok((set, text != "*"))
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let expanded = match text.trim() {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            "@yearly" | "@annually" => "0 0 1 1 *",
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), got {}",
                fields.len()
            ));
        };
        let (minutes, _) = field(minute, "minute", 0, 59)?;
        let (hours, _) = field(hour, "hour", 0, 23)?;
        let (days, days_restricted) = field(day, "day of month", 1, 31)?;
        let (months, _) = field(month, "month", 1, 12)?;
        let (mut weekdays, weekdays_restricted) = field(weekday, "day of week", 0, 7)?;
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1; // 7 is Sunday too
        }
        Ok(Schedule {
            minutes,
            hours,
            days,
            months,
            weekdays,
            days_restricted,
            weekdays_restricted,
        })
    }

    /// Whether the schedule runs in the minute holding `time`.
    pub fn matches(&self, time: DateTime<Utc>) -> bool {
        let bit = |set: u64, n: u32| set & (1 << n) != 0;
        let day = bit(self.days, time.day());
        let weekday = bit(self.weekdays, time.weekday().num_days_from_sunday());
        let day_ok = match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => day || weekday,
            _ => day && weekday,
        };
        bit(self.minutes, time.minute())
            && bit(self.hours, time.hour())
            && bit(self.months, time.month())
            && day_ok
    }

    /// Whether a rule last run at `last_run` is due at `now`: the current
    /// minute matches and the rule has not run in it yet.
    pub fn is_due(&self, last_run: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
        let minute_start = now
            .with_second(0)
            .and_then(|t| t.with_nanosecond(0))
            .unwrap_or(now);
        self.matches(now) && last_run.is_none_or(|last| last < minute_start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default()
    }

    #[test]
    fn parses_and_matches() {
        let every_5 = Schedule::parse("*/5 * * * *").expect("valid");
        assert!(every_5.matches(at("2026-01-01T10:15:30Z")));
        assert!(!every_5.matches(at("2026-01-01T10:16:00Z")));
        let weekday_mornings = Schedule::parse("30 9 * * 1-5").expect("valid");
        assert!(
            weekday_mornings.matches(at("2026-11-23T09:30:00Z")),
            "a Monday"
        );
        assert!(
            !weekday_mornings.matches(at("2026-11-22T09:30:00Z")),
            "a Sunday"
        );
        let either_day = Schedule::parse("0 0 1 * 0").expect("valid");
        assert!(either_day.matches(at("2026-11-22T00:00:00Z")), "a Sunday");
        assert!(either_day.matches(at("2026-12-01T00:00:00Z")), "the first");
        assert!(!either_day.matches(at("2026-12-02T00:00:00Z")));
        assert!(
            Schedule::parse("@daily")
                .expect("valid")
                .matches(at("2026-05-05T00:00:59Z"))
        );
        assert!(
            Schedule::parse("0 0 * * 7")
                .expect("valid")
                .matches(at("2026-11-22T00:00:00Z"))
        );
    }

    #[test]
    fn refuses_bad_schedules() {
        for bad in [
            "",
            "* * * *",
            "60 * * * *",
            "* 24 * * *",
            "*/0 * * * *",
            "5-1 * * * *",
            "a * * * *",
            "* * 0 * *",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn due_once_per_minute() {
        let hourly = Schedule::parse("@hourly").expect("valid");
        let now = at("2026-01-01T10:00:20Z");
        assert!(hourly.is_due(None, now));
        assert!(hourly.is_due(Some(at("2026-01-01T09:00:00Z")), now));
        assert!(!hourly.is_due(Some(at("2026-01-01T10:00:05Z")), now));
        assert!(!hourly.is_due(None, at("2026-01-01T10:01:00Z")));
    }
}
