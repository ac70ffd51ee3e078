//! Per-rank compute jitter and stragglers, drawn with a seeded RNG.
//!
//! All data-parallel ranks run the same program, but not at the same speed: kernels vary a
//! little from rank to rank, and a slow GPU (thermal throttling, a bad link) holds everyone
//! back, because every FSDP all-gather / reduce-scatter and DDP all-reduce waits for the
//! slowest rank.
//!
//! [`ranks`] simulates every data-parallel rank: each gets its own copy of the program with
//! its own compute times (op i takes d_i (1 + cv z) with z standard normal, drawn per rank
//! and op; a straggler rank is `straggler_slowdown` slower on every op), and a barrier
//! before every collective of the data-parallel groups lets it start on all ranks only once
//! every rank has issued it. Fast ranks run ahead until they need a collective, so
//! prefetched collectives absorb some of the noise and the rest shows as waiting. Tensor-
//! parallel collectives stay inside a rank's program (the ranks of one tensor-parallel group
//! are simulated as one).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{Schedule, TaskKind, COMPUTE, NCCL};
use crate::engine::{PartLink, Program, Task};

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

/// Every data-parallel rank's program and the barriers between them; in `links`, part r
/// is rank r's program and part `programs.len()` the barrier program.
pub struct RankRun {
    pub programs: Vec<Program>,
    pub barrier: Program,
    pub links: Vec<PartLink>,
}

/// [`RankRun`] of `sched` over `ranks` data-parallel ranks: rank r's compute tasks take
/// their own draws; every collective on the NCCL stream waits for a barrier that waits for
/// that collective's dependencies on every rank. The barriers run on device 0 and take no
/// time.
///
/// `group` numbers the set of ranks drawn (a pipeline stage: each stage's ranks draw from
/// their own ChaCha stream of `cfg.seed`, group 0 being the stream a run without pipeline
/// uses), and `first` is the job-wide index of rank 0 here: the first `cfg.stragglers`
/// simulated ranks of the job are the stragglers.
pub fn ranks(sched: &Schedule, cfg: &JitterConfig, ranks: u64, group: u64, first: u64) -> RankRun {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    rng.set_stream(group);
    let n = ranks.max(1) as usize;
    let prog = &sched.program;
    let mut programs = Vec::with_capacity(n);
    for r in 0..n {
        let mut p = prog.clone();
        let slow = if first + (r as u64) < cfg.stragglers { 1.0 + cfg.straggler_slowdown } else { 1.0 };
        for task in p.tasks.iter_mut().filter(|x| x.stream == COMPUTE && x.duration_ns > 0) {
            let z = if cfg.compute_cv > 0.0 { normal(&mut rng) } else { 0.0 };
            let f = (1.0 + cfg.compute_cv * z).max(0.0) * slow;
            task.duration_ns = (task.duration_ns as f64 * f).round() as u64;
        }
        programs.push(p);
    }
    let (barrier, links) = barriers(prog, &sched.labels, n, |task, kind| {
        task.stream == NCCL && matches!(kind, TaskKind::AllGather | TaskKind::ReduceScatter | TaskKind::AllReduce)
    });
    RankRun { programs, barrier, links }
}

/// A barrier program for `n` copies of `prog` (the same tasks and dependencies, run as parts
/// 0..n; the barrier is part n): each task `waits` selects starts only once its
/// dependencies are done on every copy. The barriers run on device 0 and take no time.
pub fn barriers(
    prog: &Program,
    labels: &[super::TaskLabel],
    n: usize,
    waits: impl Fn(&Task, TaskKind) -> bool,
) -> (Program, Vec<PartLink>) {
    let mut barrier = Program { streams: vec!["barrier".into()], stream_device: vec![0], ..Default::default() };
    let mut links = Vec::new();
    for (i, task) in prog.tasks.iter().enumerate() {
        if !waits(task, labels[task.label as usize].kind) {
            continue;
        }
        let b = barrier.push_task(Task { stream: 0, ctas: 0, duration_ns: 0, label: task.label }, &[], &[], &[]);
        for r in 0..n {
            for &d in prog.deps.of(i) {
                links.push(PartLink { part: n, task: b, dep_part: r, dep: d });
            }
            links.push(PartLink { part: r, task: i as u32, dep_part: n, dep: b });
        }
    }
    (barrier, links)
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
