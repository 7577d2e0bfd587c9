//! Cron schedules: a named task template fired at the times of a cron expression. Schedules live
//! in the queue (`schedules`, one JSON per name); coordinators fire them through `fire.lua`, which
//! creates each fire time's task once however many coordinators race, under the deterministic id
//! `<name>-<fire time, UTC, YYYYMMDDTHHMMSSZ>`.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::ConnectionLike;
use serde::{Deserialize, Serialize};

use crate::cron::{zone, Cron};
use crate::error::{Error, Result};
use crate::home::Home;
use crate::model::TaskSpec;
use crate::scripts::{scripts, KeyArgs};

// the rule lives in `names`, with every other name's; re-exported where it always was
pub use crate::names::{validate_schedule_name as validate_name, MAX_SCHEDULE_NAME_LEN as MAX_NAME_LEN};
/// Default lateness after which a fire time counts as missed.
pub const DEFAULT_MISFIRE_GRACE: Duration = Duration::from_secs(60);

pub use crate::schedule_policy::{Misfire, Overlap};

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// Its name (1-40 of `[A-Za-z0-9._-]`).
    pub name: String,
    /// The cron expression.
    pub cron: String,
    /// The IANA time zone the expression is read in.
    pub tz: String,
    /// While the previous task runs.
    pub overlap: Overlap,
    /// Fire times missed while no coordinator ran.
    pub misfire: Misfire,
    /// A fire time handled later than this counts as missed.
    pub misfire_grace_ms: u64,
    /// The task's priority.
    pub priority: i64,
    /// The task hash fields (as [`TaskSpec::fields`]).
    pub fields: Vec<(String, String)>,
    /// When the schedule was added (ms): fire times before it never count.
    pub created_ms: u64,
}

/// A schedule's progress, for `schedule list`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScheduleState {
    /// The last fire time handled (fired or skipped), ms.
    pub last_fire_ms: Option<u64>,
    /// The task of the last fire.
    pub last_task: Option<String>,
    /// The next fire time, ms.
    pub next_fire_ms: Option<u64>,
}

/// How one fire time was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// This call created the task.
    Created,
    /// Another coordinator had handled it (or the schedule was removed).
    AlreadyHandled,
    /// Skipped: it was missed and the schedule skips misfires.
    Missed,
    /// Skipped: the previous task is unfinished and the schedule skips overlaps.
    Overlapping,
    /// The task id existed already (left alone).
    Exists,
    /// The task was refused (its spec is outside this version's limits); the fire time counts
    /// as handled.
    Refused,
    /// The fire time is later than the Redis server's clock: nothing done, try again.
    NotDueYet,
}

/// The task id of a fire time: `<name>-YYYYMMDDTHHMMSSZ` (UTC).
pub fn task_id(name: &str, fire_ms: u64) -> String {
    let ts = jiff::Timestamp::from_millisecond(fire_ms as i64).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{name}-{}", ts.strftime("%Y%m%dT%H%M%SZ"))
}

impl Schedule {
    /// A schedule of `spec` (its id is ignored) at the times of `cron` in `tz`; every part is
    /// checked, with a message that says what is wrong.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        cron: &str,
        tz: &str,
        overlap: Overlap,
        misfire: Misfire,
        misfire_grace: Duration,
        spec: &TaskSpec,
        now_ms: u64,
    ) -> Result<Self> {
        validate_name(name)?;
        let parsed: Cron = cron.parse()?;
        let z = zone(tz)?;
        if parsed.next_after(now_ms, &z).is_none() {
            return Err(Error::invalid(format!("cron expression '{cron}' never fires in the next five years")));
        }
        if spec.has_keys || spec.delay.is_some() {
            return Err(Error::invalid("a schedule's task cannot have a keys file or a delay"));
        }
        let mut probe = spec.clone();
        probe.id = task_id(name, now_ms);
        probe.validate()?;
        Ok(Schedule {
            name: name.to_owned(),
            cron: parsed.to_string(),
            tz: tz.to_owned(),
            overlap,
            misfire,
            misfire_grace_ms: misfire_grace.as_millis() as u64,
            priority: spec.priority,
            // each fire draws its own nonce (an incarnation of its own): none is stored
            fields: spec.fields().into_iter().filter(|(f, _)| *f != "nonce").map(|(f, v)| (f.to_owned(), v)).collect(),
            created_ms: now_ms,
        })
    }

    fn parts(&self) -> Result<(Cron, jiff::tz::TimeZone)> {
        Ok((self.cron.parse()?, zone(&self.tz)?))
    }

    /// The next fire time after `after_ms`.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        let (c, z) = self.parts().ok()?;
        c.next_after(after_ms, &z)
    }

    /// What a coordinator does at `now_ms` when `last_ms` is the last fire time handled (or the
    /// creation time): `None` when no fire time is due, else the latest due fire time and
    /// whether it runs. Earlier due fire times are skipped; the latest runs unless it is later
    /// than the grace and misfires are skipped.
    pub fn due(&self, last_ms: u64, now_ms: u64) -> Option<(u64, bool)> {
        let (c, z) = self.parts().ok()?;
        let latest = c.last_at_or_before(now_ms, &z).filter(|&t| t > last_ms)?;
        let late = now_ms.saturating_sub(latest) > self.misfire_grace_ms;
        Some((latest, !late || self.misfire == Misfire::RunOnce))
    }

    /// Handles fire time `fire_ms` (see `fire.lua`).
    pub async fn fire<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        home: &Home,
        fire_ms: u64,
        run: bool,
    ) -> Result<Fired> {
        let id = task_id(&self.name, fire_ms);
        // on a partitioned queue a task is a home record (created here, once) and its shares
        // (created next; if this process dies first, the reconciliation creates them; routed
        // ones are placed by the next rebalance)
        let mut inv = scripts().fire.keyed(home, &KeyArgs { task: Some(&id), ..Default::default() });
        inv.arg(home.prefix())
            .arg(&self.name)
            .arg(fire_ms)
            .arg(u8::from(run))
            .arg(self.overlap.as_str())
            .arg(&id)
            .arg(self.priority)
            .arg(self.created_ms);
        // each fire a task of its own incarnation: a fresh nonce, never the stored one
        for (f, v) in self.fields.iter().filter(|(f, _)| f != "nonce") {
            inv.arg(f).arg(v);
        }
        let nonce = crate::incarnation::nonce();
        inv.arg("nonce").arg(&nonce);
        inv.arg("schedule").arg(&self.name).arg("fire_ms").arg(fire_ms);
        // on a partitioned queue the script adds the queue's current layout to the record
        let code: i64 = inv.invoke_async(con).await?;
        if code == 1 {
            let layout = crate::partition::layout::task_layout(con, home, &id).await?;
            // its shares (none to create for a task of one partition: its home record is its share)
            let h: std::collections::HashMap<String, String> =
                redis::cmd("HGETALL").arg(home.task(&id)).query_async(con).await?;
            if let Some(t) = crate::model::TaskInfo::from_hash(&id, &h)? {
                let spec = crate::partition::spread::spec_of(&t, self.priority);
                // under the dispatch lease its record was created with (its nonce the token)
                crate::partition::spread::create_shares(con, &layout, &spec, &t.inc, &nonce, None).await?;
            }
        }
        Ok(match code {
            1 => Fired::Created,
            0 => Fired::AlreadyHandled,
            2 => Fired::Missed,
            3 => Fired::Overlapping,
            -4 => Fired::Exists,
            -8 => Fired::Refused,
            -11 => Fired::NotDueYet,
            c => return Err(Error::Protocol(format!("fire.lua returned {c}"))),
        })
    }
}

/// Adds `s`; a schedule of that name is refused unless `replace`.
pub async fn add<C: ConnectionLike + Send>(con: &mut C, home: &Home, s: &Schedule, replace: bool) -> Result<()> {
    validate_name(&s.name)?;
    let json = serde_json::to_string(s).expect("a schedule serializes");
    let cmd = if replace { "HSET" } else { "HSETNX" };
    let added: i64 = redis::cmd(cmd).arg(home.schedules()).arg(&s.name).arg(json).query_async(con).await?;
    if !replace && added == 0 {
        return Err(Error::invalid(format!(
            "a schedule named '{}' exists (remove it first, or add with --replace)",
            s.name
        )));
    }
    Ok(())
}

/// Removes schedule `name` and its progress; false when there was none.
pub async fn remove<C: ConnectionLike + Send>(con: &mut C, home: &Home, name: &str) -> Result<bool> {
    validate_name(name)?;
    let (n, _): (i64, i64) = redis::pipe()
        .atomic()
        .hdel(home.schedules(), name)
        .hdel(home.schedule_state(), &[format!("{name}:last"), format!("{name}:task")])
        .query_async(con)
        .await?;
    Ok(n == 1)
}

/// Every schedule with its progress, by name.
pub async fn list<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    now_ms: u64,
) -> Result<Vec<(Schedule, ScheduleState)>> {
    let (all, state): (HashMap<String, String>, HashMap<String, String>) =
        redis::pipe().hgetall(home.schedules()).hgetall(home.schedule_state()).query_async(con).await?;
    let mut out = Vec::with_capacity(all.len());
    for (name, json) in all {
        // one unreadable schedule (written by another version) must not stop the others
        let s: Schedule = match serde_json::from_str(&json) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(schedule = %name, "schedule not readable, left alone: {e}");
                continue;
            }
        };
        let st = ScheduleState {
            last_fire_ms: state.get(&format!("{name}:last")).and_then(|v| v.parse().ok()),
            last_task: state.get(&format!("{name}:task")).cloned(),
            next_fire_ms: s.next_after(now_ms),
        };
        out.push((s, st));
    }
    out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    Ok(out)
}

/// One round of a coordinator: handles the due fire time of every schedule. Returns what was
/// done, by schedule name, and the next fire time of any schedule.
pub async fn tick<C: ConnectionLike + Send>(
    con: &mut C,
    home: &Home,
    now_ms: u64,
) -> Result<(Vec<(String, u64, Fired)>, Option<u64>)> {
    let mut done = Vec::new();
    let mut next: Option<u64> = None;
    for (s, st) in list(con, home, now_ms).await? {
        let last = st.last_fire_ms.unwrap_or(s.created_ms).max(s.created_ms);
        if let Some((fire_ms, run)) = s.due(last, now_ms) {
            done.push((s.name.clone(), fire_ms, s.fire(con, home, fire_ms, run).await?));
        }
        next = match (next, st.next_fire_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok((done, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> u64 {
        s.parse::<jiff::Timestamp>().unwrap().as_millisecond() as u64
    }

    fn hourly(misfire: Misfire) -> Schedule {
        let spec = TaskSpec::new("x", "noop", 4);
        Schedule::new(
            "h",
            "0 * * * *",
            "UTC",
            Overlap::Allow,
            misfire,
            DEFAULT_MISFIRE_GRACE,
            &spec,
            at("2026-11-30T00:30:00Z"),
        )
        .unwrap()
    }

    #[test]
    fn task_ids_name_the_fire_time() {
        assert_eq!(task_id("nightly", at("2026-11-30T03:00:00Z")), "nightly-20261130T030000Z");
        assert!(crate::model::validate_task_id(&task_id(&"n".repeat(MAX_NAME_LEN), 0)).is_ok());
    }

    #[test]
    fn due_fire_times_and_misfires() {
        let s = hourly(Misfire::Skip);
        let created = s.created_ms;
        assert_eq!(s.due(created, at("2026-11-30T00:59:59Z")), None);
        // on time (within the grace): runs
        assert_eq!(s.due(created, at("2026-11-30T01:00:00.200Z")), Some((at("2026-11-30T01:00:00Z"), true)));
        // handled already
        assert_eq!(s.due(at("2026-11-30T01:00:00Z"), at("2026-11-30T01:00:30Z")), None);
        // no coordinator for hours: the missed fire times are skipped...
        assert_eq!(s.due(created, at("2026-11-30T05:20:00Z")), Some((at("2026-11-30T05:00:00Z"), false)));
        // ... or the latest runs once
        let r = hourly(Misfire::RunOnce);
        assert_eq!(r.due(created, at("2026-11-30T05:20:00Z")), Some((at("2026-11-30T05:00:00Z"), true)));
    }

    #[test]
    fn bad_schedules_are_refused() {
        let spec = TaskSpec::new("x", "noop", 4);
        let g = DEFAULT_MISFIRE_GRACE;
        let e = |r: Result<Schedule>| r.unwrap_err().to_string();
        assert!(e(Schedule::new("a b", "* * * * *", "UTC", Overlap::Skip, Misfire::Skip, g, &spec, 0))
            .contains("schedule name"));
        assert!(
            e(Schedule::new("a", "* * *", "UTC", Overlap::Skip, Misfire::Skip, g, &spec, 0)).contains("invalid cron")
        );
        assert!(e(Schedule::new("a", "* * * * *", "Nowhere/City", Overlap::Skip, Misfire::Skip, g, &spec, 0))
            .contains("unknown time zone"));
        assert!(e(Schedule::new("a", "0 0 31 2 *", "UTC", Overlap::Skip, Misfire::Skip, g, &spec, 0))
            .contains("never fires"));
        let mut bad = spec.clone();
        bad.payload = "{".into();
        assert!(e(Schedule::new("a", "* * * * *", "UTC", Overlap::Skip, Misfire::Skip, g, &bad, 0)).contains("JSON"));
        assert!("sometimes".parse::<Overlap>().unwrap_err().to_string().contains("skip or allow"));
        assert!("later".parse::<Misfire>().unwrap_err().to_string().contains("skip or run-once"));
    }
}
