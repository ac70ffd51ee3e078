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

/// Records the fields every importer takes from its flags: the GPU, the node size (the
/// scenario writes `gpus_per_node` only when the flag gave it) and the model when `--model`
/// named it.
pub(crate) fn flag_origins(im: &mut Import, model: Option<&ModelArg>) {
    im.from_flag("hardware.gpu", "--gpu");
    im.from_flag("hardware.gpus_per_node", "--gpus-per-node");
    match model {
        Some(ModelArg::Zoo(_)) => im.from_flag("model.name", "--model"),
        Some(ModelArg::HfConfig(_)) => im.from_flag("model.hf_config", "--model"),
        None => {}
    }
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
    /// Where scenario fields took their values, as (dotted field, origin): `key `x`` for a
    /// config key, `--flag` for the command line. A scenario that does not validate is then
    /// refused by what the user wrote, not by a field of a file they never saw.
    pub origins: Vec<(String, String)>,
}

impl Import {
    /// Records that the scenario's `field` took its value from config key `key`.
    pub fn from_key(&mut self, field: &str, key: &str) {
        self.origins.push((field.to_string(), format!("key `{key}`")));
    }

    /// Records that the scenario's `field` took its value from a command-line flag.
    pub fn from_flag(&mut self, field: &str, flag: &str) {
        self.origins.push((field.to_string(), flag.to_string()));
    }

    /// Records `field`'s origin in words, where no one key or flag set it (a default derived
    /// from another key, say).
    pub fn from_text(&mut self, field: &str, what: String) {
        self.origins.push((field.to_string(), what));
    }

    /// Records `field`'s origin: the flag when it was given (it overrides the config), else
    /// the key.
    pub fn from_either(&mut self, field: &str, flag: &str, given: bool, key: &str) {
        if given {
            self.from_flag(field, flag)
        } else {
            self.from_key(field, key)
        }
    }

    /// The origin recorded last for `field` (a later record is the value written).
    fn origin(&self, field: &str) -> Option<&str> {
        self.origins.iter().rev().find(|(f, _)| f == field).map(|(_, o)| o.as_str())
    }

    /// Why the scenario imported from `config` does not validate, each error named by the key
    /// or flag that set its field where the importer recorded one (and by the field, which the
    /// message may refer to), else by the field alone. The scenario was never written, so no
    /// file of it is named.
    pub fn refusal(&self, config: &str, e: &crate::scenario::ScenarioError) -> String {
        let name = |field: &str| match (field, self.origin(field)) {
            ("", _) => String::new(),
            (f, Some(o)) => format!("{o} (the scenario's `{f}`): "),
            (f, None) => format!("field `{f}`: "),
        };
        e.describe(&format!("the scenario imported from {config} does not validate, nothing written: "), name)
    }

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
