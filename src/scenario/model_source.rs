//! Where `[model]` comes from: the fields themselves, a Hugging Face `config.json`
//! (`hf_config`, relative to the scenario file), or a model of the zoo (`name`); fields given
//! beside a config override it.

use super::*;
use crate::model::hf::{self, HfModel};

/// The `config.json` the section names, read and parsed; None when it names none.
pub(super) fn hf_model(v: &V, m: &ModelSection) -> Result<Option<HfModel>, ScenarioError> {
    match (&m.name, &m.hf_config) {
        (Some(_), Some(_)) => {
            Err(v.err("model.hf_config", "give model.name (a zoo model) or model.hf_config (a config.json), not both"))
        }
        (Some(name), None) => {
            let z = hf::zoo(name).ok_or_else(|| {
                v.err(
                    "model.name",
                    format!(
                        "unknown model \"{name}\"; the zoo has: {} (`stepsim models` lists them), or give model.hf_config = \"path/config.json\"",
                        hf::ZOO.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
            let h = hf::parse(z.config).map_err(|e| v.err("model.name", format!("models/{name}.json: {e}")))?;
            Ok(Some(h))
        }
        (None, Some(file)) => {
            let p = v.path.parent().unwrap_or(Path::new(".")).join(file);
            let text = std::fs::read_to_string(&p)
                .map_err(|e| v.err("model.hf_config", format!("cannot read {}: {e}", p.display())))?;
            let h = hf::parse(&text).map_err(|e| v.err("model.hf_config", format!("{}: {e}", p.display())))?;
            Ok(Some(h))
        }
        (None, None) => Ok(None),
    }
}

/// The `[model]` fields a config.json (or zoo model) gives wherever the section does not
/// set them, each with whether the section sets it (an override).
fn overrides(m: &ModelSection) -> [(&'static str, bool); 11] {
    [
        ("n_layers", m.n_layers.is_some()),
        ("hidden", m.hidden.is_some()),
        ("n_heads", m.n_heads.is_some()),
        ("n_kv_heads", m.n_kv_heads.is_some()),
        ("ffn_hidden", m.ffn_hidden.is_some()),
        ("vocab", m.vocab.is_some()),
        ("head_dim", m.head_dim.is_some()),
        ("qkv_bias", m.qkv_bias.is_some()),
        ("qk_norm", m.qk_norm.is_some()),
        ("tie_embeddings", m.tie_embeddings.is_some()),
        ("dropout", m.dropout.is_some()),
    ]
}

/// Where the model's sizes come from when `[model]` does not set them: the config.json or
/// zoo model it names, and which of its fields the section sets itself.
pub(super) struct Inherited {
    /// `model.hf_config = "path"` or `model.name = "zoo model"`, as the file writes it.
    source: String,
    /// [`overrides`] of the section.
    overrides: [(&'static str, bool); 11],
    /// Whether the section writes `[model.moe]` and `[model.mla]` (else the config gives them
    /// whole).
    moe: bool,
    mla: bool,
}

impl Inherited {
    /// None when the section names neither a config.json nor a zoo model.
    pub(super) fn of(m: &ModelSection) -> Option<Inherited> {
        let source = match (&m.hf_config, &m.name) {
            (Some(p), _) => format!("model.hf_config = {}", toml::Value::String(p.clone())),
            (None, Some(n)) => format!("the zoo model, model.name = {}", toml::Value::String(n.clone())),
            (None, None) => return None,
        };
        Some(Inherited { source, overrides: overrides(m), moe: m.moe.is_some(), mla: m.mla.is_some() })
    }

    /// What to add to an error of `field`: that its value is the config's, where the section
    /// does not set it (every field of `[model.moe]` and `[model.mla]` when the section has
    /// none, since the config then gives the whole section).
    pub(super) fn note(&self, field: &str) -> Option<String> {
        let rest = field.strip_prefix("model.")?;
        let from_config = match rest.split_once('.') {
            None => self.overrides.iter().any(|&(f, set)| f == rest && !set),
            Some(("moe", _)) => !self.moe,
            Some(("mla", _)) => !self.mla,
            Some(_) => false,
        };
        from_config.then(|| format!(" (the scenario does not set {field}: the value comes from {})", self.source))
    }
}

/// A required whole-number field: the section's, else the config's, else an error saying
/// how to give it.
pub(super) fn field(v: &V, name: &str, own: Option<i64>, hf: Option<u64>) -> Result<i64, ScenarioError> {
    match (own, hf) {
        (Some(x), _) => Ok(x),
        (None, Some(x)) => Ok(i64::try_from(x).unwrap_or(i64::MAX)),
        (None, None) => Err(
            v.err(name, "is required (or give model.name = \"<zoo model>\" or model.hf_config = \"path/config.json\")")
        ),
    }
}

/// The report's words for where the model came from.
pub(super) fn describe(m: &ModelSection, h: &HfModel) -> String {
    let over: Vec<&str> = overrides(m).iter().filter(|x| x.1).map(|x| x.0).collect();
    let over = if over.is_empty() { String::new() } else { format!("; overridden: {}", over.join(", ")) };
    // DeepSeek-V3's checkpoint holds its multi-token prediction modules; transformers builds
    // none and Megatron trains them only under --mtp-num-layers, so the config's count is
    // said, and whether the scenario trains them.
    let mtp = match (h.nextn_predict_layers, m.mtp.is_some()) {
        (0, _) => String::new(),
        (n, true) => format!("; its num_nextn_predict_layers = {n}: multi-token prediction as [model.mtp] says"),
        (n, false) => format!(
            "; its num_nextn_predict_layers = {n} multi-token prediction module(s) not trained (add [model.mtp] layers = {n}, Megatron --mtp-num-layers)"
        ),
    };
    let over = format!("{over}{mtp}");
    match (&m.name, &m.hf_config) {
        (Some(n), _) => {
            let src = hf::zoo(n).map_or("", |z| z.source);
            format!("zoo model {n} (model_type {}, models/{n}.json from {src}){over}", h.model_type)
        }
        (None, Some(p)) => format!("Hugging Face config {p} (model_type {}){over}", h.model_type),
        (None, None) => String::new(),
    }
}
