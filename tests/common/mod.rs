//! Helpers shared by the integration tests that drive the real binary.

use std::path::Path;
use std::process::{Command, Output};

/// Runs the built `stepsim` binary with `args` in `cwd`.
pub fn stepsim(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stepsim"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("cannot start the stepsim binary")
}

/// Process output as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
