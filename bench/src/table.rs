//! The printed table: each figure's median against its target (the issue's), with a verdict.

use std::collections::BTreeMap;

use serde::Serialize;

use super::scenario::{Figures, Scenario};
use super::targets::Target::{self, AtLeast, AtMost};
use super::targets::SPECS;

/// One line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The scenario's name.
    pub scenario: &'static str,
    /// What the figure is.
    pub figure: &'static str,
    /// The median, formatted with its unit.
    pub value: String,
    /// The median.
    pub number: f64,
    /// Its unit.
    pub unit: &'static str,
    /// The target, as text (`-` when none).
    pub target: String,
    /// `met`, or by how much it is short.
    pub verdict: String,
    /// None when the figure has no target.
    pub met: Option<bool>,
}

/// The rows for the medians, then the comparison with BullMQ where both sides ran.
pub(crate) fn rows(medians: &BTreeMap<Scenario, Figures>) -> Vec<Row> {
    let mut out = Vec::new();
    for s in SPECS {
        if let Some(&v) = medians.get(&s.scenario).and_then(|f| f.get(s.key)) {
            out.push(row(s.scenario.name(), s.figure, v, s.unit, s.decimals, s.target));
        }
    }
    let get = |s: Scenario, k: &str| medians.get(&s).and_then(|f| f.get(k)).copied();
    let (e2e, bull) = (Scenario::E2e, Scenario::Bullmq);
    if let (Some(ours), Some(theirs)) = (get(e2e, "shards_per_s"), get(bull, "process_rate")) {
        let r = ours / theirs;
        out.push(row("compare", "e2e shards/s ÷ BullMQ jobs/s", r, "×", 1, AtLeast(10.0, None)));
    }
    if let (Some(ours), Some(theirs)) = (get(e2e, "cpu_us_per_shard"), get(bull, "cpu_us_per_job")) {
        out.push(row("compare", "BullMQ Redis CPU ÷ ours, per item", theirs / ours, "×", 1, Target::None));
    }
    if let (Some(ours), Some(theirs)) = (get(e2e, "commands_per_shard"), get(bull, "commands_per_job")) {
        out.push(row("compare", "BullMQ Redis commands ÷ ours, per item", theirs / ours, "×", 1, Target::None));
    }
    if let (Some(ours), Some(theirs)) = (get(Scenario::DispatchRouted, "bytes_per_shard"), get(bull, "bytes_per_job")) {
        out.push(row("compare", "BullMQ bytes per waiting job ÷ routed shard", theirs / ours, "×", 1, Target::None));
    }
    // a ratio over a zero is no figure
    out.retain(|r| r.number.is_finite());
    out
}

fn row(scenario: &'static str, figure: &'static str, v: f64, unit: &'static str, decimals: usize, t: Target) -> Row {
    let with_unit = |x: f64| {
        let n = number(x, decimals);
        match unit {
            "" => n,
            "×" | "%" => format!("{n}{unit}"),
            u => format!("{n} {u}"),
        }
    };
    let short = |missing: f64, limit: f64| {
        if limit == 0.0 {
            format!("short by {}", with_unit(missing))
        } else {
            format!("short by {} ({:.0}%)", with_unit(missing), missing / limit.abs() * 100.0)
        }
    };
    let (target, verdict, met) = match t {
        Target::None => ("-".to_owned(), String::new(), None),
        AtMost(limit, aim) => {
            let met = v <= limit;
            let mut verdict = if met { "met".to_owned() } else { short(v - limit, limit) };
            let mut target = format!("≤ {}", with_unit(limit));
            if let Some(aim) = aim {
                target.push_str(&format!(" (aim {})", number(aim, decimals)));
                if met && v > aim {
                    verdict.push_str(&format!("; aim {}", short(v - aim, aim)));
                }
            }
            (target, verdict, Some(met))
        }
        AtLeast(limit, aim) => {
            let met = v >= limit;
            let mut verdict = if met { "met".to_owned() } else { short(limit - v, limit) };
            let mut target = format!("≥ {}", with_unit(limit));
            if let Some(aim) = aim {
                target.push_str(&format!(" (aim {})", number(aim, decimals)));
                if met && v < aim {
                    verdict.push_str(&format!("; aim {}", short(aim - v, aim)));
                }
            }
            (target, verdict, Some(met))
        }
    };
    Row { scenario, figure, value: with_unit(v), number: v, unit, target, verdict, met }
}

/// `decimals` places; whole numbers of five digits or more get thousands separators.
fn number(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    if decimals > 0 || x.abs() < 10_000.0 {
        return s;
    }
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

/// The table as text, columns padded.
pub(crate) fn render(rows: &[Row]) -> String {
    let header = ["scenario", "figure", "value", "target", "verdict"];
    let cells: Vec<[&str; 5]> =
        rows.iter().map(|r| [r.scenario, r.figure, r.value.as_str(), r.target.as_str(), r.verdict.as_str()]).collect();
    let mut width = header.map(|h| h.chars().count());
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let line = |c: [&str; 5]| {
        let mut s = String::new();
        for (i, (cell, w)) in c.iter().zip(width).enumerate() {
            let pad = w - cell.chars().count();
            // numbers right-aligned
            if i == 2 {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                if i < 4 {
                    s.push_str(&" ".repeat(pad));
                }
            }
            if i < 4 {
                s.push_str("  ");
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header);
    out.push_str(&line(width.map(|w| "-".repeat(w)).each_ref().map(String::as_str)));
    let mut last = "";
    for (r, c) in rows.iter().zip(&cells) {
        let mut c = *c;
        if r.scenario == last {
            c[0] = "";
        }
        last = r.scenario;
        out.push_str(&line(c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_say_by_how_much() {
        let r = row("e2e", "cpu", 3.0, "µs", 2, AtMost(5.0, Some(2.5)));
        assert_eq!(r.verdict, "met; aim short by 0.50 µs (20%)");
        assert_eq!(r.target, "≤ 5.00 µs (aim 2.50)");
        let r = row("primes", "ratio", 81.0, "%", 1, AtLeast(90.0, None));
        assert_eq!(r.verdict, "short by 9.0% (10%)");
        assert_eq!(r.met, Some(false));
        let r = row("upkeep", "lost", 0.0, "", 0, AtMost(0.0, None));
        assert_eq!(r.verdict, "met");
        assert_eq!(number(1234567.0, 0), "1,234,567");
        assert_eq!(number(999.0, 0), "999");
    }

    #[test]
    fn rows_follow_the_medians_and_compare_when_both_ran() {
        let mut m = BTreeMap::new();
        m.insert(Scenario::E2e, Figures::from([("shards_per_s", 300_000.0), ("cpu_us_per_shard", 2.0)]));
        m.insert(Scenario::Bullmq, Figures::from([("process_rate", 30_000.0), ("cpu_us_per_job", 26.0)]));
        let rows = rows(&m);
        let cmp = rows.iter().find(|r| r.figure.starts_with("e2e shards/s")).unwrap();
        assert_eq!(cmp.value, "10.0×");
        assert_eq!(cmp.verdict, "met");
        assert!(render(&rows).lines().count() >= rows.len() + 2);
    }
}
