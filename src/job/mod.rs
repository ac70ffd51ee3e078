//! What a training job compiles to: a list of rank classes and the links between them.
//!
//! A rank class is one device program and how many real GPUs run it. Ranks whose programs
//! are identical are one class, simulated once and counted `count` times (every
//! data-parallel replica or FSDP shard, and the tensor-parallel ranks of one group, which
//! stepsim simulates as one). Where programs differ, each difference is its own class: a
//! pipeline stage runs its own layers (P classes); under `[jitter]` every data-parallel rank
//! draws its own compute times (one class per rank, P x DP with a pipeline). The classes
//! run together on one engine, each on its own device and allocator ([`run`]), tied by
//! [`Job::links`]: a receive waits for the matching send on the stage before, a collective
//! for every rank's barrier. [`crate::report::job`] reports every class and picks the
//! headline by one rule.
//!
//! Adding a parallelism dimension whose ranks differ is a new [`Role`] and a step in
//! [`compile`] that turns each class into the classes it splits into (as [`with_jitter`]
//! does), not a new runner.

pub mod run;

use std::sync::Arc;

use crate::engine::{link_parts, Link, PartLink, Program};
use crate::hardware::Cluster;
use crate::model::LayerDag;
use crate::plan::Plan;
use crate::schedule::{self, jitter::JitterConfig, Schedule};

/// Which GPUs of the job a rank class stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Every GPU of the job runs this program.
    Replicas,
    /// Pipeline stage `stage`: all its data-parallel (and tensor-parallel) ranks.
    Stage { stage: u64 },
    /// Under `[jitter]`: data-parallel rank `rank` (its tensor-parallel group), of pipeline
    /// stage `stage` when the job is pipelined.
    Rank { stage: Option<u64>, rank: u64 },
    /// Under uneven MoE routing: expert-parallel rank `ep_rank` of every expert-parallel
    /// group (of pipeline stage `stage`), whose experts receive `copies` token copies per
    /// micro-batch and MoE block where uniform routing gives `uniform`.
    Expert { stage: Option<u64>, ep_rank: u64, copies: u64, uniform: u64 },
}

/// One device program and the GPUs that run it.
#[derive(Debug, Clone)]
pub struct RankClass {
    pub role: Role,
    /// Real GPUs that run this program.
    pub count: u64,
    /// The first of them in Megatron-LM's rank order (tensor fastest, then context, data,
    /// pipeline); the class's GPUs are `first_rank + i x stride` for i below `count`.
    pub first_rank: u64,
    /// 1, or for an expert-parallel rank's class expert tensor x expert (its GPUs come in
    /// runs of `run` consecutive ranks, one run every `stride` ranks of its stage).
    pub stride: u64,
    /// Consecutive GPUs per run: 1, or the expert-tensor-parallel degree for an
    /// expert-parallel rank's class (the GPUs are `first_rank + (i / run) x stride + i % run`).
    pub run: u64,
    /// Who holds what on these GPUs (a pipeline stage's own plan).
    pub plan: Arc<Plan>,
    pub schedule: Schedule,
}

impl RankClass {
    /// "0-31", or "5" for a class of one GPU; "2-3 every 8, to 27" for runs of two.
    pub fn ranks(&self) -> String {
        let run = self.run.max(1);
        match (self.count, self.stride) {
            (0 | 1, _) => format!("{}", self.first_rank),
            (n, 0 | 1) => format!("{}-{}", self.first_rank, self.first_rank + n - 1),
            (n, s) if run > 1 && n > run => {
                let last = self.first_rank + (n / run - 1) * s + run - 1;
                format!("{}-{} every {s}, to {last}", self.first_rank, self.first_rank + run - 1)
            }
            (n, _) if run > 1 => format!("{}-{}", self.first_rank, self.first_rank + n - 1),
            (n, s) => format!("{}-{} every {s}", self.first_rank, self.first_rank + (n - 1) * s),
        }
    }
}

/// A job's rank classes, the programs that run beside them without memory of their own
/// (jitter's barriers), and the dependencies between all of them in the run's numbering
/// (classes first, in order, then `extra`; see [`crate::engine::run_parts`]).
#[derive(Debug, Clone)]
pub struct Job {
    pub classes: Vec<RankClass>,
    pub extra: Vec<Program>,
    pub links: Vec<Link>,
}

impl Job {
    /// Every program of the run, classes first: the parts of [`crate::engine::run_parts`].
    pub fn parts(&self) -> Vec<&Program> {
        self.classes.iter().map(|c| &c.schedule.program).chain(&self.extra).collect()
    }
}

/// Compiles a training job: the first `steps` steps of each class's program (all of them
/// for a report; fewer for the sweeps' early-OOM prefixes, see
/// [`schedule::build_lean_prefix`]), with or without the text of labels and buffer names.
///
/// `expert_loads`: under uneven MoE routing, the token copies each expert-parallel rank
/// receives per micro-batch and MoE block ([`with_routing`]).
#[allow(clippy::too_many_arguments)]
pub fn compile(
    dag: &LayerDag,
    plan: &Plan,
    cluster: &Cluster,
    jitter: Option<&JitterConfig>,
    expert_loads: Option<&[u64]>,
    names: bool,
    steps: u32,
) -> Job {
    if let Some(loads) = expert_loads.filter(|l| uneven(Some(l))) {
        return with_routing(dag, plan, cluster, loads, names, steps);
    }
    let (classes, links) = base_classes(dag, plan, cluster, names, steps);
    match jitter {
        Some(cfg) => with_jitter(classes, &links, cfg),
        None => linked(classes, &links),
    }
}

/// A job of `classes` alone, tied by `links` in the run's numbering.
fn linked(classes: Vec<RankClass>, links: &[PartLink]) -> Job {
    let parts: Vec<&Program> = classes.iter().map(|c| &c.schedule.program).collect();
    let links = link_parts(&parts, links);
    Job { classes, extra: Vec::new(), links }
}

/// The classes before any split by rank: one per pipeline stage with the stages' links, or
/// the replicas.
fn base_classes(
    dag: &LayerDag,
    plan: &Plan,
    cluster: &Cluster,
    names: bool,
    steps: u32,
) -> (Vec<RankClass>, Vec<PartLink>) {
    if plan.pipeline() > 1 {
        return pipeline_classes(dag, plan, cluster, names, steps);
    }
    let schedule = schedule::build_with(dag, plan, cluster, names, steps);
    (vec![replicas(Arc::new(plan.clone()), schedule)], Vec::new())
}

/// Whether expert-parallel ranks receive different token counts, so that each is a class
/// ([`with_routing`]).
fn uneven(expert_loads: Option<&[u64]>) -> bool {
    expert_loads.is_some_and(|l| l.len() > 1)
}

/// Whether every GPU of a job runs one program, so that [`compile`] makes one class of
/// replicas ([`of_replicas`]): no pipeline, no `[jitter]`, no uneven routing.
pub fn one_program(pipeline: u64, jitter: bool, expert_loads: Option<&[u64]>) -> bool {
    pipeline <= 1 && !jitter && !uneven(expert_loads)
}

/// Whether a job is a pipeline whose stages are its classes, so that [`compile`] makes one
/// class per stage ([`of_pipeline`]): no `[jitter]`, no uneven routing.
pub fn plain_pipeline(pipeline: u64, jitter: bool, expert_loads: Option<&[u64]>) -> bool {
    pipeline > 1 && !jitter && !uneven(expert_loads)
}

/// The class of a job whose GPUs all run one program.
fn replicas(plan: Arc<Plan>, schedule: Schedule) -> RankClass {
    RankClass { role: Role::Replicas, count: plan.gpus, first_rank: 0, stride: 1, run: 1, plan, schedule }
}

/// The job [`compile`] makes where [`one_program`] holds, from a program the caller built
/// ([`schedule::build_lean_staged`]).
pub fn of_replicas(plan: Arc<Plan>, schedule: Schedule) -> Job {
    Job { classes: vec![replicas(plan, schedule)], extra: Vec::new(), links: Vec::new() }
}

/// One class per pipeline stage ([`schedule::pipeline`]), with the stages' links.
fn pipeline_classes(
    dag: &LayerDag,
    plan: &Plan,
    cluster: &Cluster,
    names: bool,
    steps: u32,
) -> (Vec<RankClass>, Vec<PartLink>) {
    stage_classes(plan, schedule::pipeline::build(dag, plan, cluster, names, steps))
}

/// A class per stage of `pipe`, each for its share of `plan`'s GPUs, and the stages' links.
fn stage_classes(plan: &Plan, pipe: schedule::pipeline::Pipeline) -> (Vec<RankClass>, Vec<PartLink>) {
    let per = plan.gpus / plan.pipeline();
    let classes = pipe
        .stages
        .into_iter()
        .enumerate()
        .map(|(k, st)| RankClass {
            role: Role::Stage { stage: k as u64 },
            count: per,
            first_rank: k as u64 * per,
            stride: 1,
            run: 1,
            plan: st.plan,
            schedule: st.schedule,
        })
        .collect();
    (classes, pipe.links)
}

/// The job [`compile`] makes of a pipeline without `[jitter]` or uneven routing, from stages
/// the caller built ([`schedule::pipeline::build_staged`]).
pub fn of_pipeline(plan: &Plan, pipe: schedule::pipeline::Pipeline) -> Job {
    let (classes, links) = stage_classes(plan, pipe);
    linked(classes, &links)
}

/// Uneven MoE routing: every class (the replicas, or each pipeline stage) splits into its
/// expert-parallel ranks, rank r built on the DAG whose experts receive `loads[r]` token
/// copies (its expert GEMMs, its saved activations) and whose all-to-alls last as long as the
/// busiest rank's. A barrier program per class makes every all-to-all and every
/// data-parallel collective wait for all of the class's expert-parallel ranks (the hot rank
/// holds everyone back). Rank r of one stage sends to rank r of the next.
fn with_routing(dag: &LayerDag, plan: &Plan, cluster: &Cluster, loads: &[u64], names: bool, steps: u32) -> Job {
    let ep = loads.len();
    let etp = plan.parallel.model_parallel.expert_tensor.max(1);
    let busiest = loads.iter().copied().max().unwrap_or(0);
    // What every rank receives under uniform routing: its own tokens' copies.
    let split = dag.workload.split;
    let rows = dag.tokens() / if split.sequence_parallel { split.tensor.max(1) } else { 1 };
    let uniform = rows * dag.config.moe.as_ref().map_or(1, |m| m.top_k);
    // Per expert-parallel rank: its classes (one per stage) and the pipeline's links.
    let mut per_rank: Vec<(Vec<RankClass>, Vec<PartLink>)> = Vec::with_capacity(ep);
    for (r, &copies) in loads.iter().enumerate() {
        let mut w = dag.workload.clone();
        w.routed = Some(crate::model::RoutedCopies { received: copies, busiest });
        let variant = crate::model::build(&dag.config, &w);
        let (mut classes, links) = base_classes(&variant, plan, cluster, names, steps);
        for c in &mut classes {
            let stage = match c.role {
                Role::Stage { stage } => Some(stage),
                _ => None,
            };
            c.role = Role::Expert { stage, ep_rank: r as u64, copies, uniform };
            // Expert-parallel rank r is the expert-tensor-parallel group of ranks etp x r to
            // etp x (r + 1) - 1 of every etp x ep (Megatron-Core's expert rank order, which
            // has no context axis: under context parallelism the stage's context ranks are
            // further runs of the same expert-data-parallel group).
            c.count /= ep as u64;
            c.first_rank += r as u64 * etp;
            c.stride = ep as u64 * etp;
            c.run = etp;
        }
        per_rank.push((classes, links));
    }
    let n = per_rank[0].0.len();
    // Part numbering: stage k's expert rank r is k ep + r; stage k's barrier n ep + k.
    let part = |k: usize, r: usize| k * ep + r;
    let mut classes = Vec::with_capacity(n * ep);
    let mut barriers = Vec::with_capacity(n);
    let mut part_links = Vec::new();
    let mut stage_classes: Vec<Vec<RankClass>> = (0..n).map(|_| Vec::with_capacity(ep)).collect();
    for (r, (cls, links)) in per_rank.into_iter().enumerate() {
        for l in links {
            part_links.push(PartLink {
                part: part(l.part, r),
                task: l.task,
                dep_part: part(l.dep_part, r),
                dep: l.dep,
            });
        }
        for (k, c) in cls.into_iter().enumerate() {
            stage_classes[k].push(c);
        }
    }
    for (k, cls) in stage_classes.into_iter().enumerate() {
        let template = &cls[0].schedule;
        let (barrier, links) = schedule::jitter::barriers(&template.program, &template.labels, ep, |task, kind| {
            use schedule::TaskKind;
            kind == TaskKind::AllToAll
                || (task.stream == schedule::NCCL
                    && matches!(kind, TaskKind::AllGather | TaskKind::ReduceScatter | TaskKind::AllReduce))
        });
        let barrier_part = n * ep + k;
        part_links.extend(links.into_iter().map(|l| {
            let p = |x: usize| if x == ep { barrier_part } else { part(k, x) };
            PartLink { part: p(l.part), task: l.task, dep_part: p(l.dep_part), dep: l.dep }
        }));
        barriers.push(barrier);
        classes.extend(cls);
    }
    let parts: Vec<&Program> = classes.iter().map(|c| &c.schedule.program).chain(&barriers).collect();
    let links = link_parts(&parts, &part_links);
    Job { classes, extra: barriers, links }
}

/// `[jitter]`: each class splits into its data-parallel ranks, each with its own compute
/// draws ([`schedule::jitter::ranks`]) and a barrier program per class before every
/// data-parallel collective. A link between two classes (pipeline stages) ties the same
/// data-parallel rank of both: stage k's replica r sends to stage k + 1's replica r.
fn with_jitter(classes: Vec<RankClass>, links: &[PartLink], cfg: &JitterConfig) -> Job {
    let dp = classes.first().map_or(1, |c| c.plan.dp.max(1));
    let tensor = classes.first().map_or(1, |c| c.plan.parallel.model_parallel.tensor);
    let pipelined = classes.len() > 1;
    let n = classes.len();
    let mut out = Vec::with_capacity(n * dp as usize);
    let mut barriers = Vec::with_capacity(n);
    let mut part_links = Vec::new();
    // Part numbering of the result: class k's rank r is k dp + r; class k's barrier is
    // n dp + k.
    let rank_part = |k: usize, r: usize| k * dp as usize + r;
    for (k, c) in classes.into_iter().enumerate() {
        let run = schedule::jitter::ranks(&c.schedule, cfg, dp, k as u64, k as u64 * dp);
        let barrier_part = n * dp as usize + k;
        part_links.extend(run.links.iter().map(|l| {
            let part = |p: usize| if p == dp as usize { barrier_part } else { rank_part(k, p) };
            PartLink { part: part(l.part), task: l.task, dep_part: part(l.dep_part), dep: l.dep }
        }));
        for (r, program) in run.programs.into_iter().enumerate() {
            let stage = pipelined.then_some(k as u64);
            out.push(RankClass {
                role: Role::Rank { stage, rank: r as u64 },
                count: tensor,
                first_rank: c.first_rank + r as u64 * tensor,
                stride: 1,
                run: 1,
                plan: c.plan.clone(),
                schedule: Schedule {
                    program,
                    labels: c.schedule.labels.clone(),
                    model_flops_per_step: c.schedule.model_flops_per_step,
                    hardware_flops_per_step: c.schedule.hardware_flops_per_step,
                },
            });
        }
        barriers.push(run.barrier);
    }
    for l in links {
        for r in 0..dp as usize {
            part_links.push(PartLink {
                part: rank_part(l.part, r),
                task: l.task,
                dep_part: rank_part(l.dep_part, r),
                dep: l.dep,
            });
        }
    }
    let parts: Vec<&Program> = out.iter().map(|c| &c.schedule.program).chain(&barriers).collect();
    let links = link_parts(&parts, &part_links);
    Job { classes: out, extra: barriers, links }
}
