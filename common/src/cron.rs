//! Cron expressions and their fire times in an IANA time zone.
//!
//! Five fields `minute hour day-of-month month day-of-week` (fires at second 0), or six with
//! seconds first. Each field takes `*` (or `?`), numbers, ranges `a-b`, steps `*/n`, `a-b/n`,
//! `a/n`, and lists of those; months `JAN`-`DEC`, weekdays `SUN`-`SAT` (0 or 7 is Sunday). When
//! both day fields are restricted (neither starts with `*`) a day matches either (Vixie cron). `@yearly`, `@annually`,
//! `@monthly`, `@weekly`, `@daily`, `@midnight` and `@hourly` stand for the usual expressions.
//!
//! Fire times are found in civil time of the zone: a time skipped by a daylight-saving jump
//! fires shifted by the gap (02:30 in a 02:00-03:00 gap fires at 03:30); a time repeated by a
//! fall-back fires once, at its first occurrence.

use std::fmt;
use std::str::FromStr;

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::error::Error;

/// A parsed cron expression.
#[derive(Clone, PartialEq, Eq)]
pub struct Cron {
    seconds: u64,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Both day fields restricted: a day matches either.
    day_or: bool,
    text: String,
}

impl fmt::Debug for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cron({:?})", self.text)
    }
}

impl fmt::Display for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

const MONTHS: [&str; 12] = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// One field's name, bounds and value names (the first name stands for `min`).
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

fn bad(expr: &str, why: impl fmt::Display) -> Error {
    Error::invalid(format!("invalid cron expression '{expr}': {why}"))
}

impl Field {
    fn value(&self, expr: &str, s: &str) -> Result<u32, Error> {
        if let Some(i) = self.names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(self.min + i as u32);
        }
        let v: u32 = s.parse().map_err(|_| bad(expr, format!("'{s}' is not a valid {}", self.name)))?;
        if v < self.min || v > self.max {
            return Err(bad(expr, format!("{} {v} is outside {}-{}", self.name, self.min, self.max)));
        }
        Ok(v)
    }

    /// The bit set of one field; `*` and `?` set every bit.
    fn parse(&self, expr: &str, text: &str) -> Result<u64, Error> {
        let mut set = 0u64;
        for part in text.split(',') {
            let (range, step) = match part.split_once('/') {
                Some((r, s)) => {
                    let step: u32 = s.parse().map_err(|_| bad(expr, format!("step '{s}' is not a number")))?;
                    if step == 0 {
                        return Err(bad(expr, "a step must be at least 1"));
                    }
                    (r, step)
                }
                None => (part, 1),
            };
            let (lo, hi) = if range == "*" || range == "?" {
                (self.min, self.max)
            } else if let Some((a, b)) = range.split_once('-') {
                let (a, b) = (self.value(expr, a)?, self.value(expr, b)?);
                if a > b {
                    return Err(bad(expr, format!("range {a}-{b} of {} runs backwards", self.name)));
                }
                (a, b)
            } else if range.is_empty() {
                return Err(bad(expr, format!("empty {} field item", self.name)));
            } else {
                let a = self.value(expr, range)?;
                // `a/n` runs from a to the end of the field
                (a, if part.contains('/') { self.max } else { a })
            };
            let mut v = lo;
            while v <= hi {
                set |= 1 << v;
                v += step;
            }
        }
        Ok(set)
    }
}

const SECOND: Field = Field { name: "second", min: 0, max: 59, names: &[] };
const MINUTE: Field = Field { name: "minute", min: 0, max: 59, names: &[] };
const HOUR: Field = Field { name: "hour", min: 0, max: 23, names: &[] };
const DAY: Field = Field { name: "day of month", min: 1, max: 31, names: &[] };
const MONTH: Field = Field { name: "month", min: 1, max: 12, names: &MONTHS };
const WEEKDAY: Field = Field { name: "day of week", min: 0, max: 7, names: &WEEKDAYS };

impl FromStr for Cron {
    type Err = Error;

    fn from_str(expr: &str) -> Result<Self, Error> {
        let expanded = match expr.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            e if e.starts_with('@') => {
                return Err(bad(expr, "unknown macro (use @yearly, @monthly, @weekly, @daily, @hourly)"))
            }
            e => e,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (sec, rest) = match fields.len() {
            5 => ("0", &fields[..]),
            6 => (fields[0], &fields[1..]),
            n => {
                return Err(bad(
                    expr,
                    format!("{n} fields; expected 5 (minute hour day month weekday) or 6 (with seconds first)"),
                ))
            }
        };
        let mut weekdays = WEEKDAY.parse(expr, rest[4])?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        let restricted = |f: &str| !f.starts_with('*') && !f.starts_with('?');
        Ok(Cron {
            seconds: SECOND.parse(expr, sec)?,
            minutes: MINUTE.parse(expr, rest[0])?,
            hours: HOUR.parse(expr, rest[1])?,
            days: DAY.parse(expr, rest[2])?,
            months: MONTH.parse(expr, rest[3])?,
            weekdays,
            day_or: restricted(rest[2]) && restricted(rest[4]),
            text: expr.trim().to_owned(),
        })
    }
}

fn has(set: u64, v: i8) -> bool {
    set & (1 << v) != 0
}

/// Looks up an IANA time zone (`UTC`, `Europe/Berlin`, ...), with a clear error.
pub fn zone(name: &str) -> Result<TimeZone, Error> {
    TimeZone::get(name).map_err(|_| {
        Error::invalid(format!("unknown time zone '{name}' (use an IANA name such as UTC or Europe/Berlin)"))
    })
}

/// Time `ms` (Unix milliseconds) in zone `tz`, to the second (`2026-12-01 03:00:00 CET`); the
/// milliseconds as they are for a zone that is not known.
pub fn show(ms: u64, tz: &str) -> String {
    let Ok(z) = zone(tz) else { return ms.to_string() };
    let ts = Timestamp::from_millisecond(ms as i64).unwrap_or(Timestamp::UNIX_EPOCH);
    ts.to_zoned(z).strftime("%Y-%m-%d %H:%M:%S %Z").to_string()
}

fn ts_ms(ms: u64) -> Timestamp {
    Timestamp::from_millisecond(ms as i64).unwrap_or(Timestamp::MAX)
}

impl Cron {
    fn day_matches(&self, dt: DateTime) -> bool {
        let dom = has(self.days, dt.day());
        let dow = has(self.weekdays, dt.weekday().to_sunday_zero_offset());
        if self.day_or {
            dom || dow
        } else {
            dom && dow
        }
    }

    /// The first fire time strictly after `after_ms` (ms since the epoch) in `tz`; `None` when
    /// there is none within the next few years (such as `0 0 30 2 *`).
    pub fn next_after(&self, after_ms: u64, tz: &TimeZone) -> Option<u64> {
        let after = ts_ms(after_ms);
        // fire times are whole seconds: start at the first whole second of civil time after it
        let mut dt = tz.to_datetime(after).with().subsec_nanosecond(0).build().ok()?.checked_add(1.second()).ok()?;
        let limit = dt.year() + 5;
        while dt.year() <= limit {
            if !has(self.months, dt.month()) {
                dt = dt.first_of_month().checked_add(1.month()).ok()?.start_of_day();
            } else if !self.day_matches(dt) {
                dt = dt.tomorrow().ok()?.start_of_day();
            } else if !has(self.hours, dt.hour()) {
                dt = dt.checked_add(1.hour()).ok()?.with().minute(0).second(0).build().ok()?;
            } else if !has(self.minutes, dt.minute()) {
                dt = dt.checked_add(1.minute()).ok()?.with().second(0).build().ok()?;
            } else if !has(self.seconds, dt.second()) {
                dt = dt.checked_add(1.second()).ok()?;
            } else {
                let ts = tz.to_ambiguous_timestamp(dt).compatible().ok()?;
                if ts > after {
                    return Some(ts.as_millisecond() as u64);
                }
                dt = dt.checked_add(1.second()).ok()?;
            }
        }
        None
    }

    /// The last fire time at or before `now_ms` in `tz`, looking back at most about five years:
    /// the mirror of [`Cron::next_after`], walking civil time backwards field by field.
    pub fn last_at_or_before(&self, now_ms: u64, tz: &TimeZone) -> Option<u64> {
        let now = ts_ms(now_ms);
        let mut dt = tz.to_datetime(now).with().subsec_nanosecond(0).build().ok()?;
        let limit = dt.year() - 5;
        let before = |d: DateTime| d.checked_sub(1.second()).ok();
        while dt.year() >= limit {
            dt = if !has(self.months, dt.month()) {
                before(dt.first_of_month().start_of_day())?
            } else if !self.day_matches(dt) {
                before(dt.start_of_day())?
            } else if !has(self.hours, dt.hour()) {
                before(dt.with().minute(0).second(0).build().ok()?)?
            } else if !has(self.minutes, dt.minute()) {
                before(dt.with().second(0).build().ok()?)?
            } else if !has(self.seconds, dt.second()) {
                before(dt)?
            } else {
                let ts = tz.to_ambiguous_timestamp(dt).compatible().ok()?;
                if ts <= now {
                    return Some(ts.as_millisecond() as u64);
                }
                before(dt)?
            };
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> u64 {
        s.parse::<Timestamp>().unwrap().as_millisecond() as u64
    }

    fn show(ms: u64, tz: &TimeZone) -> String {
        tz.to_datetime(ts_ms(ms)).to_string()
    }

    fn next(expr: &str, from: &str, tz: &str) -> String {
        let tz = zone(tz).unwrap();
        show(expr.parse::<Cron>().unwrap().next_after(at(from), &tz).unwrap(), &tz)
    }

    #[test]
    fn fields_and_steps() {
        assert_eq!(next("*/15 * * * *", "2026-11-30T03:07:00Z", "UTC"), "2026-11-30T03:15:00");
        assert_eq!(next("0 3 * * *", "2026-11-30T03:00:00Z", "UTC"), "2026-12-01T03:00:00");
        assert_eq!(next("0 3 * * *", "2026-11-30T02:59:59.5Z", "UTC"), "2026-11-30T03:00:00");
        assert_eq!(next("*/10 * * * * *", "2026-11-30T03:00:01Z", "UTC"), "2026-11-30T03:00:10");
        assert_eq!(next("0 9-17/4 * * MON-FRI", "2026-11-28T00:00:00Z", "UTC"), "2026-11-30T09:00:00");
        assert_eq!(next("@monthly", "2026-11-30T00:00:00Z", "UTC"), "2026-12-01T00:00:00");
        assert_eq!(next("0 0 29 FEB *", "2026-03-01T00:00:00Z", "UTC"), "2028-02-29T00:00:00");
        assert_eq!(next("30 2 1,15 * *", "2026-12-01T03:00:00Z", "UTC"), "2026-12-15T02:30:00");
        // both day fields restricted: either matches (the 13th, or a Friday)
        assert_eq!(next("0 0 13 * 5", "2026-11-01T00:00:00Z", "UTC"), "2026-11-06T00:00:00");
        // a day field starting with `*` is not a restriction: `*/2` and Monday means odd Mondays
        assert_eq!(next("0 0 */2 * MON", "2026-11-30T00:00:01Z", "UTC"), "2026-12-07T00:00:00");
        // 7 is Sunday too
        assert_eq!(next("0 0 * * 7", "2026-11-30T00:00:00Z", "UTC"), "2026-12-06T00:00:00");
    }

    #[test]
    fn time_zones_and_daylight_saving() {
        assert_eq!(next("0 3 * * *", "2026-11-30T00:00:00Z", "Europe/Berlin"), "2026-11-30T03:00:00");
        // 02:30 does not exist on 2026-03-29 in Berlin: it fires right after the gap
        let tz = zone("Europe/Berlin").unwrap();
        let c: Cron = "30 2 * * *".parse().unwrap();
        let t = c.next_after(at("2026-03-28T12:00:00Z"), &tz).unwrap();
        assert_eq!(t, at("2026-03-29T01:30:00Z"), "{}", show(t, &tz));
        // 02:30 happens twice on 2026-10-25: it fires once, at the first
        let t = c.next_after(at("2026-10-24T12:00:00Z"), &tz).unwrap();
        assert_eq!(t, at("2026-10-25T00:30:00Z"));
        let t2 = c.next_after(t, &tz).unwrap();
        assert_eq!(t2, at("2026-10-26T01:30:00Z"), "the repeated hour must not fire again");
    }

    #[test]
    fn last_at_or_before() {
        let utc = TimeZone::UTC;
        let c: Cron = "0 3 * * *".parse().unwrap();
        assert_eq!(c.last_at_or_before(at("2026-11-30T03:00:00Z"), &utc), Some(at("2026-11-30T03:00:00Z")));
        assert_eq!(c.last_at_or_before(at("2026-11-30T02:59:59Z"), &utc), Some(at("2026-11-29T03:00:00Z")));
        let every: Cron = "* * * * * *".parse().unwrap();
        assert_eq!(every.last_at_or_before(at("2026-11-30T03:00:07.300Z"), &utc), Some(at("2026-11-30T03:00:07Z")));
        // a sparse expression: one step per skipped month or day, not per minute
        let feb: Cron = "* * * 2 *".parse().unwrap();
        assert_eq!(feb.last_at_or_before(at("2026-11-30T00:00:00Z"), &utc), Some(at("2026-02-28T23:59:00Z")));
        let leap: Cron = "0 12 29 2 *".parse().unwrap();
        assert_eq!(leap.last_at_or_before(at("2026-11-30T00:00:00Z"), &utc), Some(at("2024-02-29T12:00:00Z")));
        // it agrees with next_after around a daylight-saving gap
        let berlin = zone("Europe/Berlin").unwrap();
        let c: Cron = "30 2 * * *".parse().unwrap();
        assert_eq!(c.last_at_or_before(at("2026-03-29T12:00:00Z"), &berlin), Some(at("2026-03-29T01:30:00Z")));
        let yearly: Cron = "@yearly".parse().unwrap();
        assert_eq!(yearly.last_at_or_before(at("2026-11-30T00:00:00Z"), &utc), Some(at("2026-01-01T00:00:00Z")));
    }

    #[test]
    fn bad_expressions_say_why() {
        for (e, why) in [
            ("* * * *", "4 fields"),
            ("61 * * * *", "minute 61 is outside 0-59"),
            ("* 24 * * *", "hour 24"),
            ("* * 0 * *", "day of month 0"),
            ("* * * 13 *", "month 13"),
            ("* * * * 8", "day of week 8"),
            ("*/0 * * * *", "step must be at least 1"),
            ("5-1 * * * *", "runs backwards"),
            ("x * * * *", "'x' is not a valid minute"),
            ("@often", "unknown macro"),
            ("1,,2 * * * *", "empty"),
        ] {
            let err = e.parse::<Cron>().unwrap_err().to_string();
            assert!(err.contains(why) && err.contains(e), "{e}: {err}");
        }
        assert!(zone("Mars/Olympus").unwrap_err().to_string().contains("unknown time zone 'Mars/Olympus'"));
        assert!("0 0 30 2 *".parse::<Cron>().unwrap().next_after(0, &TimeZone::UTC).is_none());
    }
}
