//! Errors a scenario file can earn, each naming the file, the field and what is allowed.

use std::fmt;
use std::path::{Path, PathBuf};

/// A scenario (or flag) that cannot be simulated, with enough detail to fix it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioError {
    /// The file the problem is in (or `<inline>` for scenarios built in code).
    pub file: PathBuf,
    /// Dotted path of the offending field, e.g. `model.n_heads`; empty for whole-file errors.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl ScenarioError {
    pub fn new(file: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        ScenarioError { file: file.to_path_buf(), field: field.into(), message: message.into() }
    }
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(f, "{}: field `{}`: {}", self.file.display(), self.field, self.message)
        }
    }
}

impl std::error::Error for ScenarioError {}

/// Turns a TOML/serde error into one that names the dotted field, found from the error's span:
/// the key on the offending line, inside the last `[table]` header above it.
pub(crate) fn from_toml(file: &Path, src: &str, err: &toml::de::Error) -> ScenarioError {
    let msg = err.message().to_string();
    let field = match err.span() {
        Some(span) => field_at(src, span.start, &msg),
        None => String::new(),
    };
    let line = err.span().map(|s| src[..s.start.min(src.len())].lines().count().max(1));
    let mut message = msg.replace('\n', " ");
    if let Some(l) = line {
        message = format!("{message} (line {l})");
    }
    ScenarioError::new(file, field, message)
}

fn field_at(src: &str, offset: usize, msg: &str) -> String {
    let offset = offset.min(src.len());
    let mut table = String::new();
    let mut key = String::new();
    let mut pos = 0usize;
    for line in src.split_inclusive('\n') {
        let start = pos;
        pos += line.len();
        let t = line.trim();
        if t.starts_with('[') {
            if start <= offset {
                table = t.trim_matches(|c| c == '[' || c == ']').trim().to_string();
                key.clear();
            }
        } else if let Some((k, _)) = t.split_once('=') {
            if start <= offset && offset < pos.max(start + 1) {
                key = k.trim().trim_matches('"').to_string();
            }
        }
        if pos > offset {
            break;
        }
    }
    // "missing field `x`" points at the table itself: name the missing key.
    if key.is_empty() {
        if let Some(rest) = msg.strip_prefix("missing field `") {
            key = rest.split('`').next().unwrap_or("").to_string();
        }
    }
    match (table.is_empty(), key.is_empty()) {
        (true, _) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    }
}
