//! What can go wrong with a sweep, and the exit code each class earns.

use std::fmt;
use std::path::Path;

use crate::scenario::ScenarioError;

/// Why a sweep (or a merge) stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum SweepError {
    /// A bad sweep file, base scenario, flag or resumable state: fix the input (exit 2).
    Input(String),
    /// An output that could not be written or read back (exit 2).
    Output(String),
    /// A simulator bug (a schedule that cannot run): exit 3.
    Internal(String),
}

impl SweepError {
    /// `<file>: field `<field>`: <message>`, the shape of a scenario error.
    pub fn field(file: &Path, field: &str, message: impl fmt::Display) -> SweepError {
        if field.is_empty() {
            SweepError::Input(format!("{}: {message}", file.display()))
        } else {
            SweepError::Input(format!("{}: field `{field}`: {message}", file.display()))
        }
    }

    pub fn scenario(e: &ScenarioError) -> SweepError {
        SweepError::Input(e.to_string())
    }

    pub fn output(what: impl fmt::Display) -> SweepError {
        SweepError::Output(what.to_string())
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            SweepError::Input(_) | SweepError::Output(_) => 2,
            SweepError::Internal(_) => 3,
        }
    }
}

impl fmt::Display for SweepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SweepError::Input(m) | SweepError::Output(m) | SweepError::Internal(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SweepError {}
