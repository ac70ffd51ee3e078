//! Plan + DAG -> one rank's [`Program`]: initialisation, then for each step and micro-batch
//! the forward ops, the backward ops (with recomputation under activation checkpointing),
//! FSDP/ZeRO all-gathers and reduce-scatters, DDP bucket all-reduces, the optimizer step and
//! `zero_grad(set_to_none=True)`.
//!
//! Streams: `compute`, and `nccl`: every collective of the data-parallel process group in
//! the order the CPU issues it, because NCCL runs the operations of one communicator in
//! issue order even when PyTorch enqueues them from different CUDA streams (FSDP's unshard
//! and post-backward streams share the process group).
//!
//! Lifetimes follow PyTorch:
//! - a forward output no backward needs is freed after its last forward consumer; a saved
//!   one after the backward of the last op that saved it;
//! - a gradient w.r.t. an activation is allocated by the first consumer's backward and freed
//!   after its producer's backward;
//! - FSDP: a unit's gathered parameters live from its all-gather to the end of its forward
//!   (`reshard_after_forward`, never for the root unit) and again from the backward
//!   all-gather to the end of its backward; its unsharded gradients live until its
//!   reduce-scatter finishes; the sharded gradient is created by the first reduce-scatter of
//!   the step and freed by `zero_grad`;
//! - Adam's moments are created at the first `optimizer.step()` under FSDP (PyTorch creates
//!   optimizer state lazily) and at engine initialisation under DeepSpeed.

pub mod cost;
pub mod flash_rates;
pub mod jitter;
pub mod label;
pub mod routing;
pub mod scores_rates;

use crate::engine::{BufferSpec, Program, Task};
use crate::hardware::Cluster;
use crate::memory::Category;
use crate::model::LayerDag;
use crate::net::Collective;
use crate::plan::{Checkpointing, OptimizerImpl, Plan};

pub use cost::Cost;
pub use label::{Phase, TaskKind, TaskLabel};
pub use megatron::partial_grad_params;

/// A label or buffer name: formatted when the schedule keeps names, empty (no allocation)
/// for [`build_lean`].
macro_rules! text {
    ($names:expr, $($arg:tt)*) => {
        if $names { $crate::schedule::text_of(format_args!($($arg)*)) } else { String::new() }
    };
}

/// `format!` into one allocation of the text's exact size: a large program names a million
/// tasks and buffers, and `format!` grows each name's string piece by piece (a reallocation
/// or two per name, a tenth of a named build's time).
pub(crate) fn text_of(args: std::fmt::Arguments) -> String {
    use std::fmt::Write;
    thread_local! {
        static SCRATCH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    if let Some(s) = args.as_str() {
        return s.to_string();
    }
    SCRATCH.with(|b| {
        let mut b = b.borrow_mut();
        b.clear();
        b.write_fmt(args).expect("formatting into a String cannot fail");
        String::from(b.as_str())
    })
}

pub mod activation_offload;
mod backward;
pub mod checkpoint;
mod deepspeed;
pub mod dualpipe;
mod ep_overlap;
pub mod fine_grained_offload;
mod forward;
mod free_lists;
mod grad_reduction;
mod init;
mod megatron;
mod offload;
mod optimizer;
pub mod pipeline;
mod recompute;
mod sharding;
mod span;
mod tensor_parallel;
mod zero3_fetch;

pub const COMPUTE: u16 = 0;
pub const NCCL: u16 = 1;

/// A point in another stage's program a pipeline transfer waits for: the end of virtual
/// stage `virtual_stage`'s forward (or backward) of micro-batch `mb` in step `step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Port {
    pub step: u32,
    pub mb: u32,
    pub virtual_stage: u64,
    pub forward: bool,
}

/// What one micro-batch's forward of one chunk leaves for its backward.
pub(super) struct Fwd {
    free_fwd: free_lists::FreeLists,
    free_bwd: free_lists::FreeLists,
    /// Per block, what activation offload took to the host (empty without it).
    offload: Vec<activation_offload::BlockOffload>,
    /// Offload groups whose GPU copies are freed (Transformer Engine's count).
    offload_count: usize,
    loss_task: u32,
    inputs: Vec<u32>,
}

/// The most empty lists a builder keeps for reuse ([`Builder::give_back`]).
const MAX_SPARES: usize = 8;

/// A rank's program with the labels its tasks point to.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub program: Program,
    /// Shared: the ranks of one program under `[jitter]` differ only in their durations.
    pub labels: std::sync::Arc<Vec<TaskLabel>>,
    /// Model FLOPs of one step (forward + backward, no recompute), for MFU.
    pub model_flops_per_step: f64,
    /// FLOPs the hardware executes per step, recompute included, for HFU.
    pub hardware_flops_per_step: f64,
}

/// The streams that run host work under offload rather than GPU-to-GPU communication: PCIe
/// copies to and from the host, NVMe transfers, and the CPU optimizer step. A report counts
/// compute waiting on them apart from compute waiting on collectives, so an offloaded job
/// whose step is the CPU's Adam does not read as communication-bound.
pub const HOST_STREAMS: [&str; 4] = ["h2d", "d2h", "nvme", "cpu"];

/// What a stream runs, for splitting a step's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamClass {
    Compute,
    /// Collectives and pipeline transfers (NCCL, tensor/expert parallel, p2p, copy-in).
    Comm,
    /// [`HOST_STREAMS`].
    Host,
}

impl Schedule {
    pub fn stream_class(&self, stream: u16) -> StreamClass {
        if stream == COMPUTE {
            StreamClass::Compute
        } else if HOST_STREAMS.contains(&self.program.streams[stream as usize].as_str()) {
            StreamClass::Host
        } else {
            StreamClass::Comm
        }
    }
}

/// The program's dependency and allocation lists, buffers and buffer names while the builder
/// writes them: the program holds them behind `Arc`s (shared by `[jitter]`'s per-rank
/// copies), and `Arc::make_mut` on every push was a tenth of building a pipeline stage's
/// program, two atomic operations a task.
#[derive(Clone, Default)]
struct Tables {
    deps: crate::engine::TaskLists,
    alloc: crate::engine::TaskLists,
    buffers: Vec<BufferSpec>,
    names: Vec<String>,
}

impl Tables {
    /// `prog` holding these tables.
    fn into_program(self, mut prog: Program) -> Program {
        prog.deps = self.deps.into();
        prog.alloc = self.alloc.into();
        prog.buffers = self.buffers.into();
        prog.names = self.names.into();
        prog
    }
}

/// A model-parallel collective as its time depends on it: (group, collective, bytes).
type TpKey = (Option<crate::model::CommGroup>, crate::net::Collective, u64);

struct Builder<'a> {
    dag: &'a LayerDag,
    plan: &'a Plan,
    cost: &'a Cost,
    /// The program so far; its tasks' frees are in `frees` and its lists, buffers and names
    /// in `tables` until [`Builder::finish`].
    prog: Program,
    tables: Tables,
    /// Empty lists for reuse ([`Builder::spare`]).
    spares: Vec<Vec<u32>>,
    /// A task of an earlier step followed one of a later step: the program's steps are not
    /// ranges ([`Program::step_starts`] is left empty).
    steps_interleaved: bool,
    /// Model-parallel collectives' (time, stream) by (group, collective, bytes): every layer
    /// and micro-batch repeats the same few ([`Builder::tp_task`]).
    tp_times: Vec<(TpKey, (f64, u16))>,
    /// (task, buffer) for every free, in the order the builder decided them: a task's frees
    /// are often known only after later tasks are written.
    frees: Vec<(u32, u32)>,
    labels: Vec<TaskLabel>,
    /// The checkpointing decisions for this DAG and policy: per tensor, per block the ops
    /// recomputed in backward, and per block whether it is a checkpoint region (shared by the
    /// configurations that agree on them, [`checkpoint::plan`]).
    ck: std::sync::Arc<checkpoint::Checkpoints>,
    /// Per tensor: the block whose activation offload takes it to the host
    /// ([`activation_offload::offload_targets`]; empty without offload).
    offload_of: Vec<Option<u64>>,
    /// Fine-grained activation offloading's groups (None for the other methods).
    fine: Option<fine_grained_offload::FineGroups>,
    /// Transformer Engine's window map for overlapped activation offload.
    offload_window: Vec<u64>,
    /// Each unit's gathered parameters, while gathered (FSDP / ZeRO-3). Without a pipeline
    /// every unit is resharded by the end of each micro-batch's backward; a pipeline stage
    /// keeps them across micro-batches (see `sharding`).
    gathered: Vec<Option<u32>>,
    /// Unsharded weight gradients awaiting their unit's reduce-scatter, per unit, and (a
    /// pipeline stage accumulating across micro-batches) the accumulated one of each op.
    unit_grads: Vec<Vec<u32>>,
    acc_grads: Vec<Option<u32>>,
    /// FSDP2 ([`crate::plan::Framework::fsdp2_buffers`]): each unit's flat all-gather output
    /// awaiting its copy-out, the forward's last copy-out, and the last reduce-scatter (task,
    /// flat input) whose input awaits the next post-backward.
    fsdp2_ag: Vec<Option<u32>>,
    fsdp2_fwd_copy_out: Option<u32>,
    fsdp2_fwd_tail: Option<u32>,
    /// FSDP2 `reshard_after_forward = n`: each unit's post-forward shard, until its backward.
    post_fwd_shard: Vec<Option<u32>>,
    fsdp2_rs: Option<(u32, u32)>,
    /// FSDP2's all-gather copy-in stream, where each flat all-gather output is allocated.
    ag_copy_in_stream: u16,
    /// Whether the main thread's (forward) and autograd's (backward) cuBLAS workspaces exist.
    blas_workspaces: [bool; 2],
    /// DualPipe's deferred weight gradients (`WeightGradStore`).
    wgrad: dualpipe::WeightGradStore,
    /// DualPipeV's turn at the last rank: each micro-batch's gradient buffer passed from
    /// chunk 1's backward to chunk 0's on this rank (the activation needs no entry: chunk 1
    /// reads chunk 0's output where it is).
    handoff: std::collections::HashMap<u32, u32>,
    /// Transformer Engine's workspaces taken: its GEMMs', its grouped GEMMs'.
    te_workspaces: [bool; 2],
    /// Sharded gradient buffers of the current step, per unit (created by the first reduce).
    grad_bufs: Vec<Option<u32>>,
    /// Persistent full gradients of the current step, per op (DDP / ZeRO-1 / ZeRO-2 replicated).
    op_grad_bufs: Vec<Option<u32>>,
    /// Comm tasks of the current step that the optimizer must wait for.
    step_comm: Vec<u32>,
    last_task_of_prev_step: Option<u32>,
    /// DeepSpeed: the live IPG bucket, and ZeRO-1's reduced gradient partition awaiting the
    /// step (see `deepspeed`).
    ds_ipg: Option<u32>,
    ds_grad_partition: Option<u32>,
    /// DeepSpeed ZeRO-3's submodule-by-submodule fetching (see `zero3_fetch`), where it
    /// replaces the per-unit all-gathers.
    zero3: Option<zero3_fetch::Zero3Fetch>,
    /// Megatron: the stage's gradient buckets, and each bucket's parameter all-gather of
    /// this step not yet waited for (`--overlap-param-gather`; see `megatron`).
    mg_buckets: megatron::Buckets,
    mg_param_ag: Vec<Option<u32>>,
    hw_flops: f64,
    /// Each op's forward seconds and backward (seconds, input-gradient share), computed at
    /// the op's first use (NaN before): every micro-batch, step and recomputation runs the
    /// same op at the same cost, and a GEMM's kernel model searches its split-K each time.
    op_secs: Vec<(f64, (f64, f64))>,
    /// Whether tasks and buffers get their names (false: [`build_lean`]).
    names: bool,
    /// Per model chunk this stage runs: its op range, the tensor it receives from the
    /// previous stage and the one it sends on, and its virtual stage index.
    chunk_ops: Vec<(usize, usize)>,
    /// Per chunk: the range of tensor numbers its ops read and write (and it receives and
    /// sends), where a backward's gradient buffers live ([`span::Span`]).
    chunk_tensors: Vec<(usize, usize)>,
    /// Each chunk's layers cut at their all-to-alls, for Megatron's combined 1F1B
    /// ([`ep_overlap::ChunkOps`]; empty until its first combined step).
    chunk_layers: Vec<ep_overlap::ChunkOps>,
    /// Elements of this rank's largest parameter tensor (a tied head's counted as its own):
    /// the size of per-parameter temporaries such as BF16_Optimizer's FP32 `.grad` copy.
    largest_local_param: u64,
    chunk_in: Vec<Option<usize>>,
    chunk_out: Vec<Option<usize>>,
    chunk_vs: Vec<u64>,
    tp_stream: u16,
    /// The MoE router's all-reduces of tokens per expert ([`crate::model::CommGroup::TensorContext`],
    /// [`crate::model::CommGroup::Stage`]); `u16::MAX` without them.
    aux_stream: u16,
    /// Per stream: the thread blocks its collectives hold on SMs ([`Task::ctas`]).
    stream_ctas: Vec<u16>,
    /// MoE all-to-alls (dispatch and combine) over the expert-parallel group.
    ep_stream: u16,
    /// Offload: host-to-device and device-to-host copies (separate copy engines, so the two
    /// directions overlap), NVMe reads and writes, and the CPU optimizer step.
    h2d_stream: u16,
    d2h_stream: u16,
    nvme_stream: u16,
    cpu_stream: u16,
    send_stream: u16,
    recv_stream: u16,
    /// Bytes of the activation crossing a stage boundary.
    p2p_bytes: u64,
    /// The last pipeline send not yet waited for, and the compute task it follows: Megatron-LM's
    /// schedules (`p2p_communication._communicate`: `batch_isend_irecv(ops)`, `req.wait()`,
    /// then a device synchronize) and DeepSpeed's pipeline engine post a stage's send together
    /// with its next receive after the compute before them, and wait for both, so the two
    /// transfers overlap each other (opposite directions of the link) but not compute.
    pending_send: Option<(u32, u32)>,
    /// Tasks other stages' transfers wait for, and the transfers that wait.
    ready: std::collections::HashMap<Port, u32>,
    ext_deps: Vec<(u32, Port)>,
}

/// Builds the program of one rank (all ranks of a DP group run the same program).
pub fn build(dag: &LayerDag, plan: &Plan, cluster: &Cluster) -> Schedule {
    build_with(dag, plan, cluster, true, plan.training.steps)
}

/// The same program as [`build`] (tasks, durations, dependencies, buffers and their sizes and
/// categories, label steps, phases, kinds, units and regions), without the text: every
/// label's `what` is empty and every buffer points to one empty name. For callers that need
/// the verdict and the numbers, not the story (sweeps); formatting thousands of names is a
/// large part of building a schedule.
pub fn build_lean(dag: &LayerDag, plan: &Plan, cluster: &Cluster) -> Schedule {
    build_with(dag, plan, cluster, false, plan.training.steps)
}

/// The first `steps` steps (0: initialisation only) of [`build_lean`]'s program: the same
/// tasks, in the same order, as far as they go. Every task of step k + 1 waits (directly or
/// through its stream) for the `zero_grad()` that ends step k, so up to the end of step
/// `steps` the prefix runs exactly as the whole program does: an OOM within it is the whole
/// program's OOM.
pub fn build_lean_prefix(dag: &LayerDag, plan: &Plan, cluster: &Cluster, steps: u32) -> Schedule {
    build_with(dag, plan, cluster, false, steps.min(plan.training.steps))
}

/// The first `steps` steps of one rank's program, with (`names`) or without the text of its
/// labels and buffer names.
pub fn build_with(dag: &LayerDag, plan: &Plan, cluster: &Cluster, names: bool, steps: u32) -> Schedule {
    let cost = Cost::for_plan(cluster, plan);
    let mut b = Builder::new(dag, plan, &cost, names);
    b.reserve(steps);
    b.init();
    for step in 1..=steps {
        b.step(step);
    }
    b.into_schedule(model_flops_per_step(dag, plan), steps)
}

/// A point of an unpipelined rank's lean program where everything after it waits for one
/// task's end, so that the program built so far runs exactly as the whole program does until
/// then: an out-of-memory before that end is the whole program's ([`build_lean_staged`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The first `k` steps (0: initialisation only), as [`build_lean_prefix`] builds them:
    /// every task of step k + 1 waits, directly or through its stream, for step k's
    /// `zero_grad()`, the prefix's last task.
    Steps(u32),
    /// Initialisation and step 1's first forward: every later task waits for that forward's
    /// loss. Where one micro-batch's activations do not fit, the backward is never built.
    /// Not offered by Megatron's combined 1F1B, whose second forward runs beside the first
    /// backward.
    FirstForward,
    /// A pipeline's initialisation and the first `n` slots of step 1's schedule on every
    /// stage (a slot: one forward or backward of one chunk), the slot after them built and
    /// held ([`pipeline::build_staged`]). Its run stops when a held task could start; an
    /// out-of-memory before then is the whole program's.
    Slots(u32),
}

/// The program so far, handed out at a [`Stage`], and the task whose end bounds what it
/// answers (the forward's loss at [`Stage::FirstForward`]; None at [`Stage::Steps`], whose
/// prefix ends with the task everything later waits for).
pub struct Prefix {
    pub stage: Stage,
    pub schedule: Schedule,
    pub gate: Option<u32>,
}

/// What [`build_lean_staged`] (and [`pipeline::build_staged`]) ends with.
pub enum Staged<R, W = Schedule> {
    /// A prefix answered the question.
    Answered(R),
    /// No prefix did: the whole program, [`build_lean`]'s (or the whole pipeline).
    Whole(Box<W>),
}

/// [`build_lean`]'s program for an unpipelined rank, built once and handed to `probe` as it
/// grows, at each of `stages` the program reaches (in build order); the first answer ends the
/// build. A sweep that tries prefixes first (a configuration that runs out of memory in
/// initialisation or in step 1's first forward) pays for what it builds only once: where no
/// prefix answers, the whole program is the same builder carried on, not a second build.
/// Each prefix is the program [`build_lean_prefix`] (or, at the first forward, a builder
/// stopped there) would build: the same tasks, dependencies, allocations, frees and labels.
pub fn build_lean_staged<R>(
    dag: &LayerDag,
    plan: &Plan,
    cluster: &Cluster,
    stages: &[Stage],
    mut probe: impl FnMut(Prefix) -> Option<R>,
) -> Staged<R> {
    debug_assert!(plan.pipeline() == 1, "a pipeline stage's program is built by schedule::pipeline");
    let steps = plan.training.steps;
    let cost = Cost::for_plan(cluster, plan);
    let mut b = Builder::new(dag, plan, &cost, false);
    b.reserve(steps);
    b.init();
    let model_flops = model_flops_per_step(dag, plan);
    // The program so far as a schedule of `k` steps, handed to `probe` at `stage`.
    let mut ask = |b: &mut Builder, k: u32, stage: Stage, gate: Option<u32>| {
        let (labels, hw_flops) = (b.lend_labels(), b.hw_flops);
        let schedule = Schedule {
            program: b.program_so_far(),
            labels: labels.clone(),
            model_flops_per_step: model_flops,
            hardware_flops_per_step: hw_flops / k.max(1) as f64,
        };
        let answer = probe(Prefix { stage, schedule, gate });
        b.take_back_labels(labels);
        answer
    };
    let tried = |k: u32| k < steps && stages.contains(&Stage::Steps(k));
    let mut answer = None;
    if tried(0) {
        answer = ask(&mut b, 0, Stage::Steps(0), None);
    }
    for step in 1..=steps {
        if answer.is_some() {
            break;
        }
        if step == 1 && stages.contains(&Stage::FirstForward) {
            b.step_until(step, &mut |b, loss| {
                answer = ask(b, 1, Stage::FirstForward, Some(loss));
                answer.is_none()
            });
            if answer.is_some() {
                break;
            }
        } else {
            b.step(step);
        }
        if tried(step) {
            answer = ask(&mut b, step, Stage::Steps(step), None);
        }
    }
    match answer {
        Some(r) => Staged::Answered(r),
        None => Staged::Whole(Box::new(b.into_schedule(model_flops, steps))),
    }
}

/// The lowest and one past the highest tensor that ops `lo..hi` of `dag` read, write or
/// save ((usize::MAX, 0) for none). A pass over every op's tensors, once per DAG and range on
/// a thread: per configuration it was a tenth of a sweep configuration that runs out of
/// memory at initialisation.
fn ops_tensor_span(dag: &LayerDag, lo: usize, hi: usize) -> (usize, usize) {
    /// (DAG, first op, one past the last op).
    type OpRange = (u64, usize, usize);
    thread_local! {
        static SPANS: std::cell::RefCell<Vec<(OpRange, (usize, usize))>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let key = (dag.id, lo, hi);
    SPANS.with(|c| {
        let make = || {
            let ts = dag.ops[lo..hi].iter().flat_map(|o| o.inputs.iter().chain(&o.outputs).chain(&o.saves));
            (key, ts.fold((usize::MAX, 0), |(a, b), &t| (a.min(t), b.max(t + 1))))
        };
        // Room for every DAG a sweep keeps (32, in `sweep::summary`), a few stages each.
        crate::recent::recall(&mut c.borrow_mut(), 128, |k| *k == key, make)
    })
}

/// Model FLOPs of one step of a rank's program (forward + backward, no recomputation), for
/// MFU.
fn model_flops_per_step(dag: &LayerDag, plan: &Plan) -> f64 {
    let tp = plan.parallel.model_parallel.tensor as f64;
    let per_mb = match dag.lora {
        // LoRA: what a frozen base really costs (no weight-gradient GEMMs), not 3 x forward;
        // where the base shares a FlatParameter with the adapters its weight-gradient GEMMs
        // run but are not the model's work ([`crate::model::Op::flat_frozen`]).
        Some(_) => dag.ops.iter().map(|o| o.fwd_flops + o.bwd_flops - o.wasted_wgrad_flops()).sum::<f64>(),
        None => 3.0 * dag.model_forward_flops() / tp,
    };
    per_mb * plan.training.grad_accum as f64
}

impl<'a> Builder<'a> {
    /// [`Cost::forward_s`] of the DAG's op `i`, computed once.
    fn forward_secs(&mut self, i: usize) -> f64 {
        let s = &mut self.op_secs[i].0;
        if s.is_nan() {
            *s = self.cost.forward_s(&self.dag.ops[i]);
        }
        *s
    }

    /// [`Cost::backward_split`] of the DAG's op `i`, computed once.
    fn backward_secs(&mut self, i: usize) -> (f64, f64) {
        let s = &mut self.op_secs[i].1;
        if s.0.is_nan() {
            *s = self.cost.backward_split(&self.dag.ops[i]);
        }
        *s
    }

    fn new(dag: &'a LayerDag, plan: &'a Plan, cost: &'a Cost, names: bool) -> Self {
        let ck = checkpoint::plan(dag, plan);
        let (tensors, recompute_ops) = (&ck.tensors, &ck.recompute_ops);
        let (offload_of, fine) = match plan.training.activation_offload {
            Some(a) if a.method == crate::plan::ActivationOffloadMethod::FineGrained => {
                let (of, groups) = fine_grained_offload::targets(dag, plan, tensors);
                (of, Some(groups))
            }
            _ => (activation_offload::offload_targets(dag, plan, tensors), None),
        };
        let nu = plan.units.len();
        // Each stream with the links its transfers occupy (engine::links): offload copies use
        // one PCIe direction each; compute, NVMe and the CPU none.
        // Compute kernels run on the SMs that collectives' thread blocks leave (SMS).
        use crate::engine::links::SMS;
        let mut prog = Program {
            streams: vec!["compute".into(), "nccl".into()],
            stream_links: vec![SMS, cost.nccl_links()],
            sms: cost.sms as u32,
            ..Default::default()
        };
        let mp = &plan.parallel.model_parallel;
        let mut stream = |name: &str, on: bool, links: u8| {
            if on {
                prog.streams.push(name.into());
                prog.stream_links.push(links);
                (prog.streams.len() - 1) as u16
            } else {
                u16::MAX
            }
        };
        use crate::engine::links::{PCIE_D2H, PCIE_H2D};
        // The expert-tensor-parallel collectives run on the tensor-parallel stream (in series
        // with the experts, as Megatron-Core's dispatcher issues them).
        let tp_stream = stream("tp", mp.tensor > 1 || mp.expert_tensor > 1, cost.tp_links());
        // The MoE router's all-reduces of its counts for the auxiliary losses, on links of
        // their own (the stage's may cross nodes), blocking the compute as the others.
        let aux_counts = dag.ops.iter().any(|o| {
            o.comm.is_some_and(|c| {
                matches!(c.group, crate::model::CommGroup::TensorContext | crate::model::CommGroup::Stage)
            })
        });
        let aux_stream = stream("router counts", aux_counts, cost.aux_count_links());
        let ag_copy_in_stream =
            stream("all-gather copy-in", plan.parallel.framework.fsdp2_buffers() && plan.params_sharded, SMS);
        let ep_stream = stream("ep", mp.expert > 1, cost.ep_links());
        let off = plan.parallel.offload.as_ref();
        let offload = off.is_some();
        let act_overlapped = plan
            .training
            .activation_offload
            .is_some_and(|a| a.method != crate::plan::ActivationOffloadMethod::Synchronous);
        let h2d_stream = stream("h2d", offload || act_overlapped, PCIE_H2D);
        let d2h_stream = stream("d2h", offload || act_overlapped, PCIE_D2H);
        let nvme_stream = stream("nvme", off.is_some_and(|o| o.uses_nvme()), 0);
        let cpu_stream = stream("cpu", offload, 0);
        let send_stream = stream("p2p send", mp.pipeline > 1, cost.p2p_links(true));
        let recv_stream = stream("p2p recv", mp.pipeline > 1, cost.p2p_links(false));
        // The thread blocks each stream's collectives hold. Sequence-parallel collectives
        // pipelined with their GEMMs (Transformer Engine's userbuffers, torchtitan's async
        // TP over symmetric memory) are not NCCL kernels: their cost is the pipelined GEMM's
        // ([`Builder::tp_overlap_gemm_s`]).
        let tp_pipelined = (plan.parallel.framework == crate::plan::Framework::Megatron
            && plan.parallel.megatron.tp_comm_overlap)
            || plan.parallel.async_tp;
        // DeepEP's kernels run on the SMs they are given (`Buffer.num_sms`).
        let stream_ctas = (0..prog.stream_links.len())
            .map(|s| match &cost.deepep {
                Some((d, _)) if s as u16 == ep_stream => d.sms as u16,
                _ if s as u16 == tp_stream && tp_pipelined => 0,
                _ => cost.stream_ctas(prog.stream_links[s]),
            })
            .collect();
        let mut chunk_ops = Vec::new();
        let (mut chunk_in, mut chunk_out, mut chunk_vs) = (Vec::new(), Vec::new(), Vec::new());
        let mut p2p_bytes = 0;
        for ch in &plan.chunks {
            let lo = dag.ops.iter().position(|o| ch.holds(o.region)).unwrap_or(0);
            let hi = dag.ops.iter().rposition(|o| ch.holds(o.region)).map_or(lo, |i| i + 1);
            // A chunk that starts with the model receives nothing, and one that ends with it
            // sends nothing: the scans are skipped, not only empty (over every op and tensor
            // of a 100B model, they were 4% of a sweep of unpipelined configurations).
            let x_in = if lo > 0 {
                dag.ops[lo..hi]
                    .iter()
                    .flat_map(|o| o.inputs.iter().copied())
                    .find(|&t| dag.tensors[t].producer.is_some_and(|p| p < lo))
            } else {
                None
            };
            let x_out = if hi < dag.ops.len() {
                (lo..hi)
                    .flat_map(|i| dag.ops[i].outputs.iter().copied())
                    .find(|&t| tensors[t].last_consumer.is_some_and(|c| c >= hi))
            } else {
                None
            };
            if let Some(x) = x_in.or(x_out) {
                p2p_bytes = dag.tensors[x].bytes;
            }
            chunk_ops.push((lo, hi));
            chunk_in.push(x_in);
            chunk_out.push(x_out);
            chunk_vs.push(ch.virtual_stage);
        }
        // Without names every buffer points at one empty name.
        let tables = Tables { names: if names { Vec::new() } else { vec![String::new()] }, ..Default::default() };
        let mg_buckets = if plan.parallel.framework == crate::plan::Framework::Megatron {
            let mg = &plan.parallel.megatron;
            // Only the first model chunk of the first stage is cut into buckets.
            megatron::Buckets::new(&dag.ops, &chunk_ops, |c| {
                if c == 0 {
                    mg.bucket_elements(plan.dp, plan.stage)
                } else {
                    None
                }
            })
        } else {
            megatron::Buckets { of_op: vec![None; dag.ops.len()], ..Default::default() }
        };
        let mg_param_ag = vec![None; mg_buckets.elements.len()];
        let zero3 = match chunk_ops.as_slice() {
            [only] => zero3_fetch::Zero3Fetch::new(dag, plan, *only, recompute_ops),
            _ => None,
        };
        Builder {
            dag,
            plan,
            cost,
            prog,
            tables,
            frees: Vec::new(),
            spares: Vec::new(),
            steps_interleaved: false,
            tp_times: Vec::new(),
            labels: Vec::new(),
            ck,
            offload_of,
            fine,
            offload_window: match plan.training.activation_offload {
                Some(a) => activation_offload::offload_window(a.blocks, dag.config.n_layers),
                None => Vec::new(),
            },
            gathered: vec![None; nu],
            fsdp2_ag: vec![None; nu],
            fsdp2_fwd_copy_out: None,
            fsdp2_fwd_tail: None,
            post_fwd_shard: vec![None; nu],
            fsdp2_rs: None,
            unit_grads: vec![Vec::new(); nu],
            acc_grads: vec![None; dag.ops.len()],
            grad_bufs: vec![None; nu],
            op_grad_bufs: vec![None; dag.ops.len()],
            step_comm: Vec::new(),
            last_task_of_prev_step: None,
            ds_ipg: None,
            ds_grad_partition: None,
            zero3,
            mg_buckets,
            mg_param_ag,
            hw_flops: 0.0,
            op_secs: vec![(f64::NAN, (f64::NAN, f64::NAN)); dag.ops.len()],
            names,
            largest_local_param: chunk_ops
                .iter()
                .flat_map(|&(lo, hi)| &dag.ops[lo..hi])
                .map(|o| o.params.max(o.shared_params))
                .max()
                .unwrap_or(0),
            chunk_tensors: chunk_ops
                .iter()
                .zip(chunk_in.iter().zip(&chunk_out))
                .map(|(&(lo, hi), (x_in, x_out))| {
                    let ts = x_in.iter().chain(x_out).copied();
                    ts.fold(ops_tensor_span(dag, lo, hi), |(a, b), t| (a.min(t), b.max(t + 1)))
                })
                .map(|(a, b)| if a > b { (0, 0) } else { (a, b) })
                .collect(),
            chunk_ops,
            chunk_layers: Vec::new(),
            chunk_in,
            chunk_out,
            chunk_vs,
            tp_stream,
            aux_stream,
            stream_ctas,
            ag_copy_in_stream,
            blas_workspaces: [false; 2],
            wgrad: dualpipe::WeightGradStore::default(),
            handoff: std::collections::HashMap::new(),
            te_workspaces: [false; 2],
            ep_stream,
            h2d_stream,
            d2h_stream,
            nvme_stream,
            cpu_stream,
            send_stream,
            recv_stream,
            p2p_bytes,
            pending_send: None,
            ready: Default::default(),
            ext_deps: Vec::new(),
        }
    }

    /// Room for the tasks, labels and buffers of `steps` steps (an estimate: forward,
    /// backward and recompute per op, three collectives per unit, per micro-batch), so the
    /// tables are not copied as they grow.
    fn reserve(&mut self, steps: u32) {
        // A pipeline stage runs only its chunks' ops. (Reserving for all of them would ask
        // for several times the room, so large that the memory allocator maps it fresh, and
        // pays a page fault for each page, at every build.)
        let nops = match self.chunk_ops.as_slice() {
            [] => self.dag.ops.len(),
            chunks => chunks.iter().map(|&(lo, hi)| hi - lo).sum(),
        };
        let nu = self.plan.units.len();
        let mbs = steps as usize * self.plan.training.grad_accum as usize;
        let tasks = 3 * nu + 8 + mbs * (3 * nops + 3 * nu) + 4 * steps as usize;
        self.prog.tasks.reserve(tasks);
        self.labels.reserve(tasks);
        let buffers = 4 * nu + 8 + mbs * (3 * nops + 2 * nu);
        self.tables.deps.reserve(tasks, 2 * tasks);
        self.tables.alloc.reserve(tasks, buffers);
        self.frees.reserve(buffers);
        self.tables.buffers.reserve(buffers);
        if self.names {
            self.tables.names.reserve(buffers);
        }
    }

    #[inline]
    fn buffer(&mut self, bytes: u64, category: Category, name: String) -> u32 {
        if self.names {
            self.tables.names.push(name);
        }
        let name = (self.tables.names.len() - 1) as u32;
        self.tables.buffers.push(BufferSpec { bytes, category, name, pool: crate::engine::TASK_STREAM });
        (self.tables.buffers.len() - 1) as u32
    }

    /// Buffers the framework allocates on the compute stream (the CPU's current stream) for
    /// work another stream runs: a pipeline receive (Megatron's `_communicate`, DeepSpeed's
    /// pipe buffers and `torch.distributed.pipelining` all `torch.empty` them before the
    /// NCCL call), a tensor- or expert-parallel collective's output, DeepSpeed's gradient
    /// partitions. They come from the compute stream's pool, where the activations freed
    /// before them are cached (PyTorch's caching allocator reuses a block only on the
    /// stream that allocated it).
    #[inline]
    fn use_compute_pool(&mut self, bufs: &[u32]) {
        for &b in bufs {
            self.tables.buffers[b as usize].pool = COMPUTE;
        }
    }

    #[inline]
    fn task(
        &mut self,
        stream: u16,
        seconds: f64,
        deps: impl AsRef<[u32]>,
        alloc: impl AsRef<[u32]>,
        label: TaskLabel,
    ) -> u32 {
        self.task_of(stream, seconds, deps.as_ref(), alloc.as_ref(), label)
    }

    /// [`Builder::task`] from borrowed lists.
    fn task_of(&mut self, stream: u16, seconds: f64, deps: &[u32], alloc: &[u32], label: TaskLabel) -> u32 {
        let ctas = if label.kind.is_collective() { self.stream_ctas[stream as usize] } else { 0 };
        self.note_step(label.step);
        self.labels.push(label);
        let task = Task { stream, ctas, duration_ns: cost::ns(seconds), label: (self.labels.len() - 1) as u32 };
        self.prog.tasks.push(task);
        self.tables.deps.push(deps);
        self.tables.alloc.push(alloc);
        (self.prog.tasks.len() - 1) as u32
    }

    /// The next task is of step `s`: [`Program::step_starts`] gains the steps it begins, or
    /// is given up (`steps_interleaved`) where a task of an earlier step follows a later's.
    #[inline]
    fn note_step(&mut self, s: u32) {
        let starts = &mut self.prog.step_starts;
        let s = s as usize;
        if s >= starts.len() {
            let t = self.prog.tasks.len() as u32;
            starts.resize(s + 1, t);
        } else if s + 1 < starts.len() {
            self.steps_interleaved = true;
        }
    }

    /// An empty list from the builder's spares: a pass's per-op lists (dependencies,
    /// allocations, frees) are written into the program and dropped at once, so one per op
    /// and list would be a heap allocation and a free per task.
    fn spare(&mut self) -> Vec<u32> {
        self.spares.pop().unwrap_or_default()
    }

    /// Returns a list taken with [`Builder::spare`] (or any other) for reuse. A few are
    /// kept: a pass needs at most four at once, and lists given back without having been
    /// taken (a pass's free lists) would otherwise pile up, one per op.
    fn give_back(&mut self, mut v: Vec<u32>) {
        if self.spares.len() < MAX_SPARES {
            v.clear();
            self.spares.push(v);
        }
    }

    /// The cuBLAS workspace of the thread running `op` (0: the main thread's forward, 1:
    /// autograd's device thread, backward and recomputation), allocated by the thread's first
    /// matmul and never freed ([`crate::plan::TrainingConfig::blas_workspace`]); None when it
    /// exists already, or `op` is no matmul.
    /// Transformer Engine's workspaces a block's linear `op` takes first (Megatron-Core):
    /// one for its GEMMs, and at the first expert GEMM one per compute stream for the grouped
    /// GEMMs; cached for the process, never freed.
    fn te_workspaces(&mut self, op: &crate::model::Op) -> Vec<u32> {
        let ws = self.plan.training.te_workspace;
        let block = matches!(op.region, crate::model::Region::Block(_));
        if ws == 0 || op.kind != crate::model::OpKind::Linear || !block {
            return Vec::new();
        }
        let mut out = Vec::new();
        if !self.te_workspaces[0] {
            self.te_workspaces[0] = true;
            out.push(self.buffer(
                ws,
                Category::BlasWorkspaces,
                text!(self.names, "Transformer Engine cuBLAS workspace"),
            ));
        }
        if op.expert && !self.te_workspaces[1] {
            self.te_workspaces[1] = true;
            for i in 0..crate::hardware::TE_GROUPED_GEMM_STREAMS {
                let what = text!(self.names, "Transformer Engine grouped-GEMM workspace (stream {i})");
                out.push(self.buffer(ws, Category::BlasWorkspaces, what));
            }
        }
        out
    }

    fn blas_workspace(&mut self, op: &crate::model::Op, thread: usize) -> Option<u32> {
        let ws = self.plan.training.blas_workspace;
        if self.blas_workspaces[thread] || op.kind != crate::model::OpKind::Linear || ws == 0 {
            return None;
        }
        self.blas_workspaces[thread] = true;
        let who = if thread == 0 { "main thread: forward" } else { "autograd thread: backward" };
        Some(self.buffer(ws, Category::BlasWorkspaces, text!(self.names, "cuBLAS workspace ({who})")))
    }

    /// `task` frees `bufs` when it ends (after the frees given it before).
    #[inline]
    /// The task created last (what the CPU has issued so far), if any.
    fn last_task(&self) -> Option<u32> {
        self.prog.tasks.len().checked_sub(1).map(|t| t as u32)
    }

    fn free_at(&mut self, task: u32, bufs: &[u32]) {
        self.frees.extend(bufs.iter().map(|&b| (task, b)));
    }

    /// The next task begins a slot of the micro-batch schedule ([`Program::period_marks`]).
    fn mark_period(&mut self) {
        self.prog.period_marks.push(self.prog.tasks.len() as u32);
    }

    /// The next task begins a transformer block's pass ([`Program::layer_marks`]).
    fn mark_layer(&mut self) {
        self.prog.layer_marks.push(self.prog.tasks.len() as u32);
    }

    /// The finished program, its frees filed under their tasks.
    fn finish(&mut self) -> Program {
        let prog = std::mem::take(&mut self.tables).into_program(std::mem::take(&mut self.prog));
        self.filed(prog, false)
    }

    /// The finished program of `steps` steps with its labels, model FLOPs and the hardware
    /// FLOPs the builder counted per step.
    fn into_schedule(mut self, model_flops_per_step: f64, steps: u32) -> Schedule {
        let hardware_flops_per_step = self.hw_flops / steps.max(1) as f64;
        Schedule {
            program: self.finish(),
            labels: std::mem::take(&mut self.labels).into(),
            model_flops_per_step,
            hardware_flops_per_step,
        }
    }

    /// The labels so far, lent to a prefix of the program ([`build_lean_staged`],
    /// [`pipeline::build_staged`]) rather than copied: a copy of every label was a few
    /// percent of a sweep configuration that tries prefixes. The builder has none until
    /// [`Builder::take_back_labels`].
    fn lend_labels(&mut self) -> std::sync::Arc<Vec<TaskLabel>> {
        std::sync::Arc::new(std::mem::take(&mut self.labels))
    }

    /// The labels [`Builder::lend_labels`] lent, back once the prefix is done with them (a
    /// copy where it still holds them).
    fn take_back_labels(&mut self, labels: std::sync::Arc<Vec<TaskLabel>>) {
        debug_assert!(self.labels.is_empty(), "labels written while lent");
        self.labels = std::sync::Arc::try_unwrap(labels).unwrap_or_else(|shared| (*shared).clone());
    }

    /// The program built so far, as [`Builder::finish`] would hand it over, with the builder
    /// left to carry on: a copy of its lists.
    fn program_so_far(&self) -> Program {
        self.filed(self.tables.clone().into_program(self.prog.clone()), true)
    }

    /// `prog` with its tasks' frees filed under them. A `prefix` of the program keeps the
    /// links its streams will have in the whole program wherever a collective may yet hold
    /// thread blocks, so that a run of it can be carried on over the whole program
    /// ([`crate::engine::Paused::resume`]).
    fn filed(&self, mut prog: Program, prefix: bool) -> Program {
        prog.free = crate::engine::TaskLists::from_pairs(prog.tasks.len(), &self.frees).into();
        if self.steps_interleaved {
            prog.step_starts.clear();
        }
        // Without a collective holding thread blocks nothing slows compute: its tasks need not
        // pass through the engine's shared-resource bookkeeping.
        let holds = match prefix {
            true => self.stream_ctas.iter().any(|&c| c > 0),
            false => prog.tasks.iter().any(|t| t.ctas > 0),
        };
        if !holds {
            prog.stream_links.iter_mut().for_each(|l| *l &= !crate::engine::links::SMS);
        }
        prog
    }

    #[inline]
    fn pr(&self) -> &crate::plan::Precision {
        &self.plan.training.precision
    }

    /// A new step's gradient bookkeeping: no gradient of this step exists yet (except
    /// BF16_Optimizer's `.grad`s of the last backward, which the next one frees) and no
    /// collective is pending.
    fn begin_step(&mut self) {
        self.grad_bufs.iter_mut().for_each(|g| *g = None);
        if !self.keeps_grads_across_steps() {
            self.op_grad_bufs.iter_mut().for_each(|g| *g = None);
        }
        self.acc_grads.iter_mut().for_each(|g| *g = None);
        self.step_comm.clear();
    }

    fn step(&mut self, step: u32) {
        self.step_until(step, &mut |_, _| true);
    }

    /// [`Builder::step`], handing the builder and the first micro-batch's loss task to
    /// `after_first_forward` once that forward is built (except in Megatron's combined 1F1B,
    /// see [`Stage::FirstForward`]); where it returns false the step stops there.
    fn step_until(&mut self, step: u32, after_first_forward: &mut dyn FnMut(&mut Self, u32) -> bool) {
        self.begin_step();
        self.megatron_step_start(step);
        let m = self.plan.training.grad_accum;
        if self.plan.parallel.megatron.overlap_moe_expert_parallel_comm && m > 1 {
            // Megatron's combined 1F1B without a pipeline: the first forward alone, then each
            // forward beside the previous micro-batch's backward, then the last backward.
            self.mark_period();
            let mut f = self.forward(step, 0, 0);
            for mb in 1..m as u32 {
                self.mark_period();
                let b = ep_overlap::PairedBackward { mb: mb - 1, chunk: 0, fwd: f, last_mb: false, sync_grads: true };
                f = self.forward_backward(step, mb, 0, b);
            }
            self.backward(step, m as u32 - 1, 0, f, true, true);
        } else {
            for mb in 0..m as u32 {
                self.mark_period();
                let f = self.forward(step, mb, 0);
                if mb == 0 && !after_first_forward(self, f.loss_task) {
                    return;
                }
                // FSDP's no_sync: only the last micro-batch's backward reduces gradients.
                let last_mb = mb + 1 == m as u32;
                let sync = !self.plan.parallel.no_sync || last_mb;
                self.backward(step, mb, 0, f, last_mb, sync);
            }
        }
        self.megatron_partial_grads_all_reduce(step);
        self.optimizer(step);
    }
}
