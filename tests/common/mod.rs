//! Helpers shared by the integration tests: the real binary, and scenarios that cover the
//! scheduler's branches. (Each test crate uses some of them.)

pub mod fuzzing;

use std::path::Path;
use std::process::{Command, Output};

/// Runs the built `stepsim` binary with `args` in `cwd`.
#[allow(dead_code)]
pub fn stepsim(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stepsim"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("cannot start the stepsim binary")
}

/// Process output as text.
#[allow(dead_code)]
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Variants of the shipped `100b-32gpu-fsdp-ac` scenario that cover the scheduler's branches
/// the shipped scenarios do not: gradient accumulation with checkpointing, selective
/// recomputation with math attention, DeepSpeed ZeRO-2, hybrid sharding, DDP with
/// accumulation.
#[allow(dead_code)]
pub fn schedule_variants(root: &Path) -> Vec<stepsim::scenario::Scenario> {
    let ac = std::fs::read_to_string(root.join("scenarios/100b-32gpu-fsdp-ac.toml")).unwrap();
    let variants = [
        ac.replace("grad_accum = 1", "grad_accum = 3").replace("n_layers = 80", "n_layers = 6"),
        ac.replace("\"full\"", "\"selective\"")
            .replace("\"flash\"", "\"math\"")
            .replace("n_layers = 80", "n_layers = 6"),
        ac.replace("framework = \"fsdp\"", "framework = \"deepspeed\"").replace("\"full_shard\"", "\"zero2\""),
        ac.replace("\"full_shard\"", "\"hybrid_shard\"").replace("n_layers = 80", "n_layers = 6"),
        ac.replace("\"full_shard\"", "\"none\"")
            .replace("n_layers = 80", "n_layers = 4")
            .replace("grad_accum = 1", "grad_accum = 2"),
    ];
    variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            stepsim::scenario::Scenario::from_toml(Path::new(&format!("variant-{i}.toml")), v)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}
