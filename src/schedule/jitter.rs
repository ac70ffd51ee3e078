//! Per-rank compute jitter and stragglers, drawn with a seeded RNG.
//!
//! All data-parallel ranks run the same program, but not at the same speed: kernels vary a
//! little from rank to rank, and a slow GPU (thermal throttling, a bad link) holds everyone
//! back, because every FSDP all-gather / reduce-scatter and DDP all-reduce waits for the
//! slowest rank. stepsim draws every rank's time for each compute segment between two
//! collectives (the ops of one layer's forward, one layer's backward, ...) and lets the
//! segment take the slowest rank's time: op i of the segment takes d_i (1 + cv z) on a rank,
//! so the segment's time on rank r is D + cv sqrt(sum d_i^2) z_r with z_r standard normal;
//! a straggler rank is `straggler_slowdown` slower on every segment. The program, still
//! simulated once, gets each segment's maximum over all ranks, spread over its ops in
//! proportion to their nominal durations.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{Schedule, COMPUTE};

/// The `[jitter]` section of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JitterConfig {
    pub seed: u64,
    /// Coefficient of variation of each op's compute time across ranks.
    pub compute_cv: f64,
    /// How many ranks are persistently slow, and by how much (0.1 = 10% slower).
    pub stragglers: u64,
    pub straggler_slowdown: f64,
}

/// A standard normal draw (Box-Muller), deterministic for a given RNG state.
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(1e-300);
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Rewrites the durations of the compute stream's tasks; `ranks` is how many ranks share
/// the program.
pub fn apply(sched: &mut Schedule, cfg: &JitterConfig, ranks: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let tasks = &mut sched.program.tasks;
    let labels = &sched.labels;
    // Segments: maximal runs of compute tasks with the same (step, micro-batch, phase, layer).
    let mut i = 0;
    while i < tasks.len() {
        if tasks[i].stream != COMPUTE || tasks[i].duration_ns == 0 {
            i += 1;
            continue;
        }
        let key = |t: &super::Task| {
            let l = &labels[t.label as usize];
            (l.step, l.micro_batch, l.phase, l.layer())
        };
        let k0 = key(&tasks[i]);
        let mut members = vec![i];
        let mut j = i + 1;
        while j < tasks.len() {
            if tasks[j].stream == COMPUTE {
                if key(&tasks[j]) != k0 {
                    break;
                }
                members.push(j);
            }
            j += 1;
        }
        let d: f64 = members.iter().map(|&m| tasks[m].duration_ns as f64).sum();
        let spread =
            cfg.compute_cv * members.iter().map(|&m| (tasks[m].duration_ns as f64).powi(2)).sum::<f64>().sqrt();
        let mut worst = d;
        if spread > 0.0 {
            for _ in 0..ranks.max(1) {
                worst = worst.max(d + spread * normal(&mut rng));
            }
        }
        if cfg.stragglers > 0 {
            worst = worst.max(d * (1.0 + cfg.straggler_slowdown) + spread * normal(&mut rng));
        }
        let scale = if d > 0.0 { worst / d } else { 1.0 };
        for &m in &members {
            tasks[m].duration_ns = (tasks[m].duration_ns as f64 * scale).round() as u64;
        }
        i = j;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_draws_have_unit_variance_and_are_reproducible() {
        let mut a = ChaCha8Rng::seed_from_u64(7);
        let xs: Vec<f64> = (0..20000).map(|_| normal(&mut a)).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "{mean} {var}");
        let mut b = ChaCha8Rng::seed_from_u64(7);
        assert_eq!(normal(&mut b), xs[0]);
    }
}
