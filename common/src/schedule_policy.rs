//! A schedule's policies: what a fire time does while the previous task is unfinished
//! ([`Overlap`]), and what a coordinator does with the fire times it missed ([`Misfire`]).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What a fire time does while the schedule's previous task is unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// No task for this fire time.
    Skip,
    /// A task for every fire time.
    Allow,
}

/// What happens to fire times missed while no coordinator ran (later than the grace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Misfire {
    /// They are skipped; the schedule goes on at its next fire time.
    Skip,
    /// The latest of them runs once, as soon as a coordinator runs.
    RunOnce,
}

impl Overlap {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
        }
    }
}

impl Misfire {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Misfire::Skip => "skip",
            Misfire::RunOnce => "run-once",
        }
    }
}

impl std::str::FromStr for Overlap {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "skip" => Ok(Overlap::Skip),
            "allow" => Ok(Overlap::Allow),
            _ => Err(Error::invalid(format!("overlap policy '{s}': expected skip or allow"))),
        }
    }
}

impl std::str::FromStr for Misfire {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "skip" => Ok(Misfire::Skip),
            "run-once" => Ok(Misfire::RunOnce),
            _ => Err(Error::invalid(format!("misfire policy '{s}': expected skip or run-once"))),
        }
    }
}
