//! What the fuzz campaigns (tests/fuzz.rs, tests/fuzz_import.rs) share: their size and seed
//! from the environment, and the bounded run of the real binary (issue 22): every case is
//! held to 30 s (or its campaign's bound) and 4 GB resident, read from /proc on Linux, and
//! exits 0 or 2 with a message, never a panic's 101.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A campaign's size and seed: `STEPSIM_FUZZ_SEED` and the named variable, else the defaults
/// (seed 22, the one CI runs).
pub fn campaign_size(var: &str, cases: usize) -> (usize, u64) {
    let cases = std::env::var(var).ok().and_then(|x| x.parse().ok()).unwrap_or(cases);
    let seed = std::env::var("STEPSIM_FUZZ_SEED").ok().and_then(|x| x.parse().ok()).unwrap_or(22);
    (cases, seed)
}

/// What one bounded run of the binary did.
pub struct Outcome {
    pub code: Option<i32>,
    pub seconds: f64,
    /// The process's peak resident memory, where /proc tells it (Linux).
    pub peak_rss: u64,
    pub problem: Option<String>,
    pub stderr: String,
}

/// The memory bound of one case (issue 22: "no memory over 4 GB").
pub const MEMORY_LIMIT: u64 = 4_000_000_000;

/// A process's peak resident set (`VmHWM`), in bytes; 0 where /proc does not say.
fn peak_rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()))
        })
        .map_or(0, |kb| kb * 1024)
}

/// Runs `stepsim ARGS` with the time and memory bounds; the exit code, time, peak memory and
/// stderr, with a problem when a bound is passed or the exit code is neither 0 nor 2.
pub fn run_bounded(args: &[&str], limit: Duration) -> Outcome {
    run_bounded_with(args, limit, &[])
}

/// [`run_bounded`] with these environment variables set.
pub fn run_bounded_with(args: &[&str], limit: Duration, env: &[(&str, &str)]) -> Outcome {
    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stepsim"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start stepsim");
    // stderr is read on a thread so that a chatty process cannot block on a full pipe.
    let mut pipe = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut err = String::new();
        if let Some(e) = pipe.as_mut() {
            let _ = std::io::Read::read_to_string(e, &mut err);
        }
        err
    });
    let mut rss = 0;
    loop {
        // Read before reaping: once waited for, the process's /proc entry is gone.
        rss = rss.max(peak_rss(child.id()));
        let over = if rss > MEMORY_LIMIT {
            Some(format!("over the memory bound: {:.2} GB resident", rss as f64 / 1e9))
        } else if t.elapsed() > limit {
            Some("timed out".to_string())
        } else {
            None
        };
        if over.is_some() {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = reader.join().unwrap_or_default();
            return Outcome { code: None, seconds: t.elapsed().as_secs_f64(), peak_rss: rss, problem: over, stderr };
        }
        if let Ok(Some(status)) = child.try_wait() {
            let stderr = reader.join().unwrap_or_default();
            let code = status.code();
            let problem = match code {
                Some(0) => None,
                Some(2) if stderr.trim().is_empty() => Some("exit 2 with an empty message".into()),
                Some(2) => None,
                _ => Some(format!("exit {code:?}: {}", stderr.lines().take(3).collect::<Vec<_>>().join(" | "))),
            };
            return Outcome { code, seconds: t.elapsed().as_secs_f64(), peak_rss: rss, problem, stderr };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
