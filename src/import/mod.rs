//! `stepsim import`: a scenario from the configuration a user already has, saying what it
//! mapped, what it assumed and what it could not express (issue 19). The scenario is
//! validated before it is written, so an import that exits 0 always loads.

pub mod deepspeed;
pub mod megatron;
pub mod torchtitan;

use std::fmt;

/// Where the model comes from on the command line: a zoo name or a `config.json`.
#[derive(Debug, Clone)]
pub enum ModelArg {
    Zoo(String),
    /// A path as it should be written in the scenario (relative to the scenario's folder, or
    /// absolute).
    HfConfig(String),
}

impl ModelArg {
    /// The `[model]` line.
    pub fn toml(&self) -> String {
        match self {
            ModelArg::Zoo(n) => format!("name = {}", quote(n)),
            ModelArg::HfConfig(p) => format!("hf_config = {}", quote(p)),
        }
    }
}

/// A TOML basic string.
pub(crate) fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A scenario made from a framework config, with what it rests on.
#[derive(Debug, Clone, Default)]
pub struct Import {
    /// The scenario's TOML (without the header).
    pub toml: String,
    /// Config keys turned into scenario fields.
    pub mapped: Vec<String>,
    /// What the config does not say and stepsim assumed.
    pub assumed: Vec<String>,
    /// Keys that change memory or time that stepsim cannot express (the result may differ).
    pub not_expressed: Vec<String>,
    /// Keys read and ignored: they change neither memory nor time.
    pub ignored: Vec<String>,
}

impl Import {
    /// The scenario file: a comment header with the four lists, then the TOML.
    pub fn render(&self, tool: &str) -> String {
        let mut o = format!("# Scenario written by `stepsim import {tool}`.\n");
        for (title, items) in [
            ("Mapped", &self.mapped),
            ("Assumed (not in the config)", &self.assumed),
            ("Not expressed (changes memory or time; the simulation leaves it out)", &self.not_expressed),
            ("Read and ignored (no effect on memory or time)", &self.ignored),
        ] {
            if items.is_empty() {
                continue;
            }
            o.push_str(&format!("#\n# {title}:\n"));
            for i in items {
                o.push_str(&format!("#   - {}\n", i.replace('\n', " ")));
            }
        }
        o.push('\n');
        o.push_str(&self.toml);
        o
    }
}

/// A config that cannot be imported: the file, the key and what is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportError {
    pub file: String,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: key `{}`: {}", self.file, self.key, self.message)
        }
    }
}

impl std::error::Error for ImportError {}
