//! Five-field cron schedules (minute hour day-of-month month day-of-week,
//! in UTC) for consolidation rules. Parsing and matching are croner's:
//! ranges, steps, lists, month and weekday names, `L`, `W` and `#`, and
//! the `@hourly`…`@yearly` nicknames, with cron's rule that when both day
//! fields are restricted a day matching either runs. What stays here is
//! what Engram adds: five fields only (no seconds), `@midnight`, and
//! "due once per minute".

use chrono::{DateTime, Timelike, Utc};
use croner::Cron;

/// The five fields' names, in order.
const FIELDS: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];

/// A parsed schedule.
#[derive(Debug, Clone)]
pub struct Schedule(Cron);

impl Schedule {
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = match text.trim() {
            "@midnight" => "@daily",
            other => other,
        };
        let fields = text.split_whitespace().count();
        if !text.starts_with('@') && fields != 5 {
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), got {fields}"
            ));
        }
        Cron::new(text).parse().map(Schedule).map_err(|err| {
            // croner does not say which field it refused ("Number out of
            // bounds"): the one that, replaced by `*`, makes it parse.
            let fields: Vec<&str> = text.split_whitespace().collect();
            let culprit = (fields.len() == 5)
                .then(|| {
                    (0..5).find(|&at| {
                        let mut tried = fields.clone();
                        tried[at] = "*";
                        Cron::new(&tried.join(" ")).parse().is_ok()
                    })
                })
                .flatten();
            match culprit {
                Some(at) => format!("the {} field {:?}: {err}", FIELDS[at], fields[at]),
                None => err.to_string(),
            }
        })
    }

    /// Whether the schedule runs in the minute holding `time`.
    pub fn matches(&self, time: DateTime<Utc>) -> bool {
        self.0.is_time_matching(&minute_of(time)).unwrap_or(false)
    }

    /// Whether a rule last run at `last_run` is due at `now`: the current
    /// minute matches and the rule has not run in it yet.
    pub fn is_due(&self, last_run: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
        self.matches(now) && last_run.is_none_or(|last| last < minute_of(now))
    }
}

/// The start of the minute holding `time` (the schedule has no seconds
/// field, so it matches only second 0).
fn minute_of(time: DateTime<Utc>) -> DateTime<Utc> {
    time.with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(time)
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
        let named = Schedule::parse("0 12 * JAN-MAR MON").expect("names parse");
        assert!(
            named.matches(at("2026-01-05T12:00:00Z")),
            "a Monday in January"
        );
        assert!(
            !named.matches(at("2026-04-06T12:00:00Z")),
            "a Monday in April"
        );
        assert!(
            Schedule::parse("@midnight")
                .expect("valid")
                .matches(at("2026-05-05T00:00:10Z"))
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
            "0 * * * * *",
            "@sometimes",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?}");
        }
        for (bad, names) in [
            ("61 * * * *", "the minute field \"61\": "),
            ("0 9 * 13 *", "the month field \"13\": "),
            ("0 9 * * mon-fry", "the day-of-week field \"mon-fry\": "),
        ] {
            let err = Schedule::parse(bad).expect_err(bad);
            assert!(err.starts_with(names), "{bad}: {err}");
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
