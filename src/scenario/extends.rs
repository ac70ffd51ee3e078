//! `extends = "base.toml"`: a scenario that inherits another and changes a few fields, so a
//! family of runs (the same job on 8 and 32 GPUs, with and without checkpointing) shares one
//! base instead of copies that drift apart.
//!
//! The rules, as a reader of the two files would expect them:
//! - the path is relative to the file that says `extends` (like `model.hf_config`), and a
//!   base may extend another, up to [`MAX_DEPTH`] files; a cycle is an error naming the chain;
//! - a key the file gives replaces the base's; a table (`[training]`) merges key by key, so
//!   the file states only what differs; an array is replaced whole;
//! - `name` is not inherited (a scenario is named for its own file unless it says otherwise,
//!   so two scenarios never write into one output folder by accident); `description` is;
//! - a base's relative `model.hf_config` stays relative to the base's folder.
//!
//! Each file is read and parsed on its own first, so a syntax error names its own file and
//! line; validation runs once, on the merged scenario, and names the file that was loaded.

use std::path::{Path, PathBuf};

use super::error::ScenarioError;

/// Files in one `extends` chain, the loaded one included.
pub const MAX_DEPTH: usize = 16;

/// The scenario at `path` as one TOML table with every `extends` resolved, and the chain of
/// files it came from (the loaded file first).
pub fn resolve(path: &Path) -> Result<(toml::Table, Vec<PathBuf>), ScenarioError> {
    let mut chain = Vec::new();
    let table = resolve_in(path, &mut chain)?;
    Ok((table, chain))
}

fn resolve_in(path: &Path, chain: &mut Vec<PathBuf>) -> Result<toml::Table, ScenarioError> {
    let canonical = std::fs::canonicalize(path).map_err(|e| match chain.last() {
        Some(child) => {
            ScenarioError::new(child, "extends", format!("cannot read the base scenario {}: {e}", path.display()))
        }
        None => ScenarioError::new(path, "", format!("cannot read the scenario file: {e}")),
    })?;
    let names = |chain: &[PathBuf], last: &Path| {
        chain
            .iter()
            .map(|p| p.display().to_string())
            .chain([last.display().to_string()])
            .collect::<Vec<_>>()
            .join(" -> ")
    };
    if let Some(first) = chain.first() {
        if chain.iter().any(|p| std::fs::canonicalize(p).is_ok_and(|c| c == canonical)) {
            return Err(ScenarioError::new(
                first,
                "extends",
                format!("the chain of bases comes back to a file already in it: {}", names(chain, path)),
            ));
        }
        if chain.len() >= MAX_DEPTH {
            return Err(ScenarioError::new(
                first,
                "extends",
                format!("at most {MAX_DEPTH} files in one chain of bases: {} ...", names(chain, path)),
            ));
        }
    }
    chain.push(path.to_path_buf());
    let src = super::read_text(path)?;
    let mut table: toml::Table = toml::from_str(&src).map_err(|e| super::error::from_toml(path, &src, &e))?;
    let Some(ext) = table.remove("extends") else { return Ok(table) };
    let toml::Value::String(rel) = ext else {
        return Err(ScenarioError::new(
            path,
            "extends",
            format!("must be the path of the base scenario (a string, relative to this file), got {}", ext.type_str()),
        ));
    };
    let base_path = path.parent().unwrap_or(Path::new(".")).join(&rel);
    let mut base = resolve_in(&base_path, chain)?;
    base.remove("name");
    rebase_paths(&mut base, Path::new(&rel).parent().unwrap_or(Path::new("")));
    merge(&mut base, table);
    Ok(base)
}

/// A base's relative file paths, made relative to the file that extends it (`dir`: the
/// base's folder as seen from there).
fn rebase_paths(base: &mut toml::Table, dir: &Path) {
    if let Some(toml::Value::Table(model)) = base.get_mut("model") {
        if let Some(toml::Value::String(p)) = model.get_mut("hf_config") {
            if Path::new(p.as_str()).is_relative() {
                *p = dir.join(p.as_str()).to_string_lossy().into_owned();
            }
        }
    }
}

/// `over` onto `base`: tables key by key, everything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::merge;

    #[test]
    fn tables_merge_key_by_key_and_the_rest_is_replaced() {
        let mut base: toml::Table = toml::from_str(
            "description = \"b\"\n[training]\nmicro_batch = 4\nseq_len = 2048\nempty_cache = [\"a\", \"b\"]\n",
        )
        .unwrap();
        let over: toml::Table = toml::from_str("[training]\nmicro_batch = 1\nempty_cache = [\"c\"]\n").unwrap();
        merge(&mut base, over);
        let t = base["training"].as_table().unwrap();
        assert_eq!(t["micro_batch"].as_integer(), Some(1));
        assert_eq!(t["seq_len"].as_integer(), Some(2048));
        assert_eq!(t["empty_cache"].as_array().unwrap().len(), 1);
        assert_eq!(base["description"].as_str(), Some("b"));
    }
}
