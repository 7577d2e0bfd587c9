//! Quantities as people read them: durations (`850ms`, `12.3s`, `4m05s`) and rates, three
//! significant digits at most (`19.8/s`, `1,234/s`), for the CLI's outputs.

/// Seconds as people read them: `12.3s`, `4m05s`, `2h07m`.
pub fn human_secs(s: f64) -> String {
    match s {
        s if s < 60.0 => format!("{s:.1}s"),
        s if s < 3600.0 => format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64),
        s => format!("{}h{:02}m", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64),
    }
}

/// A duration in ms as people read it: `850ms`, `12.3s`, `4m05s`.
pub fn human_ms(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        human_secs(ms as f64 / 1000.0)
    }
}

/// A rate as people read it, three significant digits at most: `1,234/s`, `19.8/s`, `0.52/s`.
pub fn rate(per_sec: f64) -> String {
    if !per_sec.is_finite() || per_sec <= 0.0 {
        return "0/s".to_owned();
    }
    if per_sec >= 100.0 {
        let whole = per_sec.round() as u64;
        let digits = whole.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        return format!("{out}/s");
    }
    let magnitude = per_sec.log10().floor() as i32;
    let decimals = (2 - magnitude).max(0) as usize;
    let shown = format!("{per_sec:.decimals$}");
    let shown = if shown.contains('.') { shown.trim_end_matches('0').trim_end_matches('.').to_owned() } else { shown };
    format!("{shown}/s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_people_read_them() {
        let shown: Vec<String> = [19.7729, 0.5234, 1234.4, 100.2, 5.0, 0.0, f64::NAN].map(rate).into();
        assert_eq!(shown, ["19.8/s", "0.523/s", "1,234/s", "100/s", "5/s", "0/s", "0/s"]);
        assert_eq!(human_ms(850), "850ms");
        assert_eq!(human_ms(12_340), "12.3s");
    }
}
