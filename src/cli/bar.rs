//! The progress bar on stderr; drawn only when stderr is a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shardctl_common::model::TaskInfo;

pub struct Bar(ProgressBar);

impl Bar {
    pub fn new() -> Self {
        let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40.cyan/blue} {pos}/{len} shards {msg} ({rate}, eta {eta})",
            )
            .expect("valid template")
            // as people read a rate ("19.8/s", not indicatif's "19.7729/s")
            .with_key("rate", |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&shardctl::units::rate(s.per_sec()));
            })
            .progress_chars("=> "),
        );
        Bar(pb)
    }

    pub fn update(&self, t: &TaskInfo) {
        self.0.set_length(t.total);
        self.0.set_position(t.done + t.failed);
        let mut msg = String::new();
        if t.failed > 0 {
            msg = format!("{} failed", t.failed);
        }
        if !t.state.is_finished() && t.done + t.failed == t.total {
            msg.push_str(" aggregating");
        }
        self.0.set_message(msg);
    }

    /// A line on stderr above the bar (or alone when stderr is no terminal).
    pub fn note(&self, line: &str) {
        if self.0.is_hidden() {
            eprintln!("{line}");
        } else {
            self.0.println(line);
        }
    }

    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}
