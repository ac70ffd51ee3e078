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
    /// Further errors of the same file, as (dotted field, message), each found with the fields
    /// named before it left out ([`super::recovery`]); empty when there is one error, or when
    /// the rest cannot be told apart from effects of leaving fields out.
    pub also: Vec<(String, String)>,
}

impl ScenarioError {
    pub fn new(file: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        ScenarioError { file: file.to_path_buf(), field: field.into(), message: message.into(), also: Vec::new() }
    }
}

impl ScenarioError {
    /// The error as text: `lead`, then each error with the prefix `name` gives its field
    /// (`name("")` for a whole-file error). Display names the file and the fields; an import
    /// names the config keys that set them.
    pub fn describe(&self, lead: &str, name: impl Fn(&str) -> String) -> String {
        let mut o = format!("{lead}{}{}", name(&self.field), self.message);
        let n = self.also.len();
        if n == 0 {
            return o;
        }
        // Recovery stopped at its cap: there may be more.
        let cap = if n + 1 >= super::recovery::MAX_ERRORS {
            format!(" (stopping at {} in all)", n + 1)
        } else {
            String::new()
        };
        if n == 1 {
            o.push_str(&format!(
                "\n1 more{cap}, found by reading the file without the field above (fixing it can change this one):"
            ));
        } else {
            o.push_str(&format!("\n{n} more{cap}, each found by reading the file without the fields above it (fixing one can change the next):"));
        }
        for (field, message) in &self.also {
            o.push_str(&format!("\n  {}{message}", name(field)));
        }
        o
    }
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |field: &str| if field.is_empty() { String::new() } else { format!("field `{field}`: ") };
        f.write_str(&self.describe(&format!("{}: ", self.file.display()), name))
    }
}

impl std::error::Error for ScenarioError {}

/// Turns a TOML/serde error into one that names the dotted field, found from the error's span:
/// the key on the offending line, inside the last `[table]` header above it.
pub(crate) fn from_toml(file: &Path, src: &str, err: &toml::de::Error) -> ScenarioError {
    let msg = err.message().to_string();
    let field = match err.span() {
        Some(span) => field_at(src, span, &msg),
        None => String::new(),
    };
    // 1-based line of the span's start (counting newlines: a span at the very start of a line
    // belongs to that line, not the one before).
    let line = err.span().map(|s| src.as_bytes()[..s.start.min(src.len())].iter().filter(|&&b| b == b'\n').count() + 1);
    let mut message = msg.replace('\n', " ");
    if let Some(l) = line {
        message = format!("{message} (line {l})");
    }
    ScenarioError::new(file, field, message)
}

fn field_at(src: &str, span: std::ops::Range<usize>, msg: &str) -> String {
    let offset = span.start.min(src.len());
    let mut table = String::new();
    let mut key = String::new();
    let mut pos = 0usize;
    for line in src.split_inclusive('\n') {
        let start = pos;
        pos += line.len();
        let t = line.trim();
        if t.starts_with('[') {
            if start <= offset {
                // `[name]`, `[[name]]`, possibly followed by `# comment`.
                table = t.trim_start_matches('[').split(']').next().unwrap_or("").trim().to_string();
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
    // "missing field `x`" points at the table that lacks `x`, not at a key: its `[header]`, its
    // inline `{ ... }` value (named by the key on that line), or, for the top level, the
    // document's first lines (comments, the first key) or an empty span.
    if let Some(rest) = msg.strip_prefix("missing field `") {
        let first = src.as_bytes().get(offset).copied();
        if first == Some(b'{') {
            table = join(&table, &key);
        } else if span.is_empty() || first != Some(b'[') {
            table.clear();
        }
        key = rest.split('`').next().unwrap_or("").to_string();
    }
    join(&table, &key)
}

fn join(table: &str, key: &str) -> String {
    match (table.is_empty(), key.is_empty()) {
        (true, _) => key.to_string(),
        (false, true) => table.to_string(),
        (false, false) => format!("{table}.{key}"),
    }
}

/// The 1-based line where the dotted `field` is written in `src` (its key, or its `[table]`
/// header), for errors found on a table rather than the text: None when it is not written
/// there (a missing field) or the text does not parse.
pub(crate) fn line_of(src: &str, field: &str) -> Option<usize> {
    let doc = toml_edit::ImDocument::parse(src).ok()?;
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    let mut span = None;
    let mut parts = field.split('.').peekable();
    while let Some(p) = parts.next() {
        let (key, item) = table.get_key_value(p)?;
        span = key.span().or_else(|| item.span());
        if parts.peek().is_some() {
            table = item.as_table_like()?;
        }
    }
    let start = span?.start.min(src.len());
    Some(src.as_bytes()[..start].iter().filter(|&&b| b == b'\n').count() + 1)
}
