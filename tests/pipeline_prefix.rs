//! A pipeline's program cut within step 1 ([`Stage::Slots`]): a sweep that runs only the
//! prefix gets the whole program's outcome wherever the prefix answers, and the structural
//! fact that makes it so holds on every slot of the programs built here.

use std::path::{Path, PathBuf};

use stepsim::job::run::Record;
use stepsim::scenario::Scenario;
use stepsim::schedule::pipeline::{self, Pipeline};
use stepsim::schedule::{Stage, Staged};
use stepsim::sweep::summary::{self, Outcome};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Pipelines over the schedules and frameworks the builder distinguishes (1F1B, interleaved,
/// GPipe; Megatron with its overlap flags and the distributed optimizer, DeepSpeed; tied and
/// untied embeddings), shrunk to build quickly, each at micro-batches from one that fits to
/// ones that run out of memory in the forward or the backward.
fn cases() -> Vec<Scenario> {
    let read = |name: &str| std::fs::read_to_string(root().join("scenarios").join(name)).unwrap();
    let small = |t: String| t.replace("n_layers = 40", "n_layers = 8").replace("grad_accum = 16", "grad_accum = 8");
    let bases = [
        ("1f1b", small(read("gpt-13b-pp4-1f1b.toml"))),
        ("interleaved", small(read("gpt-13b-pp4-interleaved-1f1b.toml"))),
        ("gpipe", small(read("gpt-13b-pp4-gpipe.toml"))),
        (
            "deepspeed",
            small(read("gpt-13b-pp4-1f1b.toml"))
                .replace("[parallel]\n", "[parallel]\nframework = \"deepspeed\"\nsharding = \"zero1\"\n")
                .replace("\"bf16-mixed-adam\"", "\"bf16-mixed-adam-fp32-grads\""),
        ),
        (
            "megatron-overlap",
            read("megatron-70b-h100-overlap.toml")
                .replace("n_layers = 84", "n_layers = 8")
                .replace("gpus = 768", "gpus = 32")
                .replace("pipeline = 2", "pipeline = 4"),
        ),
    ];
    let mut out = Vec::new();
    for (name, text) in bases {
        for mb in [1, 32, 40, 48, 64] {
            let t = text
                .replace("micro_batch = 2\n", &format!("micro_batch = {mb}\n"))
                .replace("micro_batch = 1\n", &format!("micro_batch = {mb}\n"));
            let path = format!("{name}-mb{mb}.toml");
            out.push(Scenario::from_toml(Path::new(&path), &t).unwrap_or_else(|e| panic!("{path}: {e}")));
        }
    }
    out
}

fn plan_of(s: &Scenario, dag: &stepsim::model::LayerDag) -> stepsim::plan::Plan {
    stepsim::plan::Plan::new(
        dag,
        s.parallel.clone(),
        s.training.clone(),
        u64::from(s.cluster.gpus),
        u64::from(s.cluster.gpus_per_node),
    )
}

/// The prefix is the whole program's beginning, and every task a cut leaves out of it (past
/// the held slot) waits, directly, across a link or behind its stream, for a task at or past
/// the cut ([`pipeline::cut_is_closed`]): so no task outside the prefix starts before a held
/// one could, which is what lets the prefix's run stop there.
fn closed(whole: &Pipeline, prefix: &pipeline::Prefix, what: &str) -> Result<(), String> {
    for (k, (w, p)) in whole.stages.iter().zip(&prefix.pipeline.stages).enumerate() {
        let (w, p) = (&w.schedule.program, &p.schedule.program);
        assert!(prefix.cut[k] as usize <= p.tasks.len(), "{what}: stage {k}'s cut past its tasks");
        assert_eq!(&w.tasks[..p.tasks.len()], &p.tasks[..], "{what}: stage {k}'s prefix is not the whole's beginning");
        for t in 0..p.tasks.len() {
            assert_eq!(w.deps.of(t), p.deps.of(t), "{what}: stage {k} task {t}'s dependencies");
            assert_eq!(w.alloc.of(t), p.alloc.of(t), "{what}: stage {k} task {t}'s allocations");
        }
    }
    for l in &prefix.pipeline.links {
        assert!(whole.links.contains(l), "{what}: link {l:?} is not the whole program's");
    }
    let built: Vec<u32> = prefix.pipeline.stages.iter().map(|st| st.schedule.program.tasks.len() as u32).collect();
    pipeline::cut_is_closed(whole, &prefix.cut, &built).map_err(|e| format!("{what}: {e}"))
}

#[test]
fn every_task_left_out_of_a_cut_waits_for_the_held_slot() {
    let mut cuts = 0;
    for s in cases() {
        let dag = stepsim::model::build(&s.model, &s.workload);
        let plan = plan_of(&s, &dag);
        let whole = pipeline::build(&dag, &plan, &s.cluster, false, plan.training.steps);
        let slots = pipeline::order(
            s.parallel.model_parallel.schedule,
            s.parallel.model_parallel.pipeline,
            0,
            s.training.grad_accum,
            s.parallel.model_parallel.virtual_stages,
        )
        .len() as u32;
        for n in 0..slots {
            let staged = pipeline::build_staged(&dag, &plan, &s.cluster, &[Stage::Slots(n)], Some);
            match staged {
                Staged::Answered(mut prefix) => {
                    assert_eq!(prefix.stage, Stage::Slots(n));
                    closed(&whole, &prefix, &format!("{} cut after {n} slots", s.name)).unwrap();
                    cuts += 1;
                    // Without the held slot the next slot's first tasks wait only for the
                    // prefix: the check must see it.
                    prefix.cut =
                        prefix.pipeline.stages.iter().map(|st| st.schedule.program.tasks.len() as u32).collect();
                    let open = closed(&whole, &prefix, "without its held slot");
                    assert!(open.is_err(), "{}: a cut after {n} slots holds without its held slot", s.name);
                }
                // Only a cut at the step's last slot has no slot to hold.
                Staged::Whole(_) => assert_eq!(n + 1, slots, "{}: no prefix at {n} of {slots} slots", s.name),
            }
        }
    }
    assert!(cuts >= 200, "{cuts} cuts checked");
}

#[test]
fn a_cut_within_step_one_changes_no_outcome() {
    let mut by_prefix = 0;
    let mut phases = std::collections::BTreeSet::new();
    for s in cases() {
        let whole = summary::simulate_whole(&s).unwrap();
        assert_eq!(summary::simulate(&s).unwrap(), whole, "{}", s.name);
        let dag = stepsim::model::build(&s.model, &s.workload);
        let n = pipeline::fill_slots(&s.parallel, s.training.grad_accum);
        let total = |job: &stepsim::job::Job| job.classes.iter().map(|c| c.schedule.program.tasks.len()).sum::<usize>();
        let mut sizes = Vec::new();
        for stages in [vec![Stage::Slots(n)], vec![Stage::Steps(0), Stage::Slots(n), Stage::Steps(1)]] {
            let o = stepsim::simulate_lean_with(&s, &dag, &stages, Record::Headline, |job, run| {
                (Outcome::of_run(&s, job, run), total(job))
            })
            .unwrap();
            assert_eq!(o.0, whole, "{} with {stages:?}", s.name);
            sizes.push(o.1);
        }
        let all = stepsim::simulate_lean_with(&s, &dag, &[], Record::Headline, |job, _| total(job)).unwrap();
        println!("{}: {:?}, the cut's program {} of {all} tasks", s.name, whole.oom, sizes[0]);
        if sizes[0] < all {
            by_prefix += 1;
            let at = whole.oom.expect("a prefix answers only with an out-of-memory");
            phases.insert((at.step, at.phase.name()));
        }
    }
    println!("answered by the cut: {by_prefix}, at {phases:?}");
    assert!(by_prefix >= 5, "only {by_prefix} configurations were answered by the cut");
    assert!(phases.contains(&(1, "forward")) && phases.contains(&(1, "backward")), "{phases:?}");
}
