//! What a simulation tells a person: the verdict, the peak and its breakdown, model state
//! per GPU, step time, tokens/s and MFU, as text, `report.json`, `memory.csv` and
//! `memory.png`.

pub mod allocator;
pub mod check;
pub mod chrome_trace;
pub mod finite;
pub mod inference;
pub mod intervals;
pub mod invariants;
pub mod job;
pub mod pickle;
pub mod png;
pub mod snapshot;
pub mod text;
pub mod timeline_png;
pub mod write;

use serde::Serialize;

use crate::engine::Trace;
use crate::memory::Category;
use crate::model::LayerDag;
use crate::plan::{ModelState, Plan};
use crate::scenario::Scenario;
use crate::schedule::{Phase, Schedule, StreamClass, TaskKind};

/// Bytes shown both ways: GB = 1e9 bytes, GiB = 2^30 bytes.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Bytes {
    pub bytes: u64,
    pub gb: f64,
    pub gib: f64,
}

impl Bytes {
    pub fn new(bytes: u64) -> Bytes {
        Bytes { bytes, gb: round4(bytes as f64 / 1e9), gib: round4(bytes as f64 / (1u64 << 30) as f64) }
    }
}

/// The MoE assumption's clause on the auxiliary load-balancing loss ([`crate::model::AuxLoss`]):
/// what the router keeps and sends for it, or why none runs. Its bytes and kernels are read
/// from the loss's op in the DAG (the first MoE block's, under Megatron-Core), the figures the
/// schedule allocated and timed.
fn aux_loss_words(dag: &LayerDag, plan: &Plan, rows: u64) -> String {
    use crate::model::AuxLoss;
    let Some(moe) = &dag.config.moe else { return String::new() };
    let mp = &plan.parallel.model_parallel;
    let e = moe.num_experts;
    let saved = |op: &crate::model::Op| fmt_bytes(op.saves.iter().map(|&t| dag.tensors[t].bytes).sum());
    let op_named = |f: &dyn Fn(&str) -> bool| dag.ops.iter().find(|o| f(&o.name));
    match dag.workload.aux_loss {
        AuxLoss::None => match plan.parallel.framework {
            crate::plan::Framework::Megatron => format!("no auxiliary load-balancing loss (--moe-aux-loss-coeff 0, Megatron-Core's default; [moe] aux_loss = \"aux_loss\" and the others simulate one: its FP32 scores over every expert, {} per MoE block and micro-batch, saved, and the counts of tokens per expert all-reduced)", fmt_bytes(rows * e * 4)),
            crate::plan::Framework::Fsdp2 => "no auxiliary load-balancing loss (torchtitan balances the experts with a bias the optimizer updates, load_balance_coeff)".to_string(),
            _ => "no auxiliary load-balancing loss (Hugging Face computes one only with output_router_logits = true: [moe] aux_loss = \"aux_loss\")".to_string(),
        },
        AuxLoss::Megatron { local, global } => {
            let Some(op) = op_named(&|n| n.ends_with("router.aux_loss")) else { return String::new() };
            let tp_cp = mp.tensor * mp.context.max(1);
            let mut counts = Vec::new();
            if local > 0 {
                counts.push(if tp_cp > 1 {
                    format!("all-reduced over tensor x context ({tp_cp} GPUs) for each of the {local} per-micro-batch loss{}", if local > 1 { "es" } else { "" })
                } else {
                    "kept on the GPU for the per-micro-batch loss (tensor x context is one GPU)".to_string()
                });
            }
            if global {
                let stage = mp.tensor * plan.dp;
                let tree = if stage > plan.gpus_per_node { ", across nodes on NCCL's tree with the LL protocol" } else { "" };
                counts.push(format!("all-reduced over the stage's tensor x data x context ranks ({stage} GPUs{tree}) for global_aux_loss"));
            }
            format!(
                "the auxiliary load-balancing loss (Megatron-Core router.py with --moe-aux-loss-coeff > 0): the router scores the logits over all {e} experts once more in FP32 and keeps them for the backward ({} per MoE block and micro-batch), builds the routing map (int32, then bool: {} of scratch), and its {e} int64 counts of tokens per expert are {}{}; about {} kernels forward and {} backward (--moe-router-fusion off)",
                saved(op),
                fmt_bytes(op.fwd_scratch),
                counts.join(" and "),
                if tp_cp > 1 || global { ", each all-reduce blocking the next kernel" } else { "" },
                op.launches[0],
                op.launches[1]
            )
        }
        AuxLoss::AllBlocks => {
            let Some(op) = op_named(&|n| n == "load_balancing_loss") else { return String::new() };
            let kept: u64 = op.inputs.iter().map(|&t| dag.tensors[t].bytes).sum();
            format!(
                "Hugging Face's load-balancing loss (load_balancing_loss_func, output_router_logits = true) after the language model's loss: every MoE block's router logits are kept to the end of the forward ({} for {} blocks), concatenated and softmaxed (the softmax, {}, saved for the backward), and the one-hot mask of each token's top {} experts is built in int64 with a float copy to average (with the concatenation {}), all live at once; its backward hands each block's router its share of the gradient at the start of the backward",
                fmt_bytes(kept),
                op.inputs.len(),
                saved(op),
                moe.top_k,
                fmt_bytes(op.fwd_scratch)
            )
        }
    }
}

/// "50.62 GB (47.14 GiB)".
pub fn fmt_bytes(b: u64) -> String {
    let gb = b as f64 / 1e9;
    let gib = b as f64 / (1u64 << 30) as f64;
    if b >= 10_000_000 {
        format!("{gb:.2} GB ({gib:.2} GiB)")
    } else {
        format!("{:.2} MB ({:.2} MiB)", b as f64 / 1e6, b as f64 / (1u64 << 20) as f64)
    }
}

pub(crate) fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

#[derive(Debug, Clone, Serialize)]
pub struct CategoryBytes {
    pub category: &'static str,
    pub label: &'static str,
    #[serde(flatten)]
    pub size: Bytes,
}

pub fn breakdown(by_cat: &[u64; Category::COUNT]) -> Vec<CategoryBytes> {
    let mut v: Vec<CategoryBytes> = Category::ALL
        .iter()
        .filter(|c| by_cat[c.index()] > 0)
        .map(|&c| CategoryBytes { category: c.key(), label: c.label(), size: Bytes::new(by_cat[c.index()]) })
        .collect();
    v.sort_by(|a, b| b.size.bytes.cmp(&a.size.bytes).then(a.category.cmp(b.category)));
    v
}

/// Where a task sits: step, phase, micro-batch, layer, op.
#[derive(Debug, Clone, Serialize)]
pub struct Instant {
    pub time_s: f64,
    pub step: u32,
    pub phase: Phase,
    pub micro_batch: u32,
    pub layer: Option<u64>,
    pub op: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Oom {
    #[serde(flatten)]
    pub at: Instant,
    /// The tensor whose allocation failed.
    pub tensor: String,
    pub requested: Bytes,
    pub allocated: Bytes,
    pub capacity: Bytes,
    /// Free device memory at that instant: capacity less what the allocator reserved.
    pub free: Bytes,
    pub live_by_category: Vec<CategoryBytes>,
    /// The largest live tensors.
    pub largest_live: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Fits { headroom: Bytes },
    Oom(Box<Oom>),
}

#[derive(Debug, Clone, Serialize)]
pub struct Peak {
    #[serde(flatten)]
    pub at: Instant,
    pub allocated: Bytes,
    pub reserved: Bytes,
    pub breakdown: Vec<CategoryBytes>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PhasePeak {
    pub step: u32,
    pub phase: Phase,
    pub allocated: Bytes,
    pub op: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct StepTiming {
    pub step: u32,
    pub start_s: f64,
    pub time_s: f64,
    pub compute_busy_s: f64,
    /// Time any communication stream (collectives, pipeline transfers) runs.
    pub comm_busy_s: f64,
    /// Time any host stream runs under offload (PCIe copies, NVMe, the CPU optimizer step:
    /// [`crate::schedule::HOST_STREAMS`]); 0 without offload.
    pub host_busy_s: f64,
    /// Compute stream idle inside the step: waiting for a collective (exposed communication).
    pub compute_idle_s: f64,
    /// Compute time spent recomputing forward ops under activation checkpointing.
    pub recompute_s: f64,
    /// How much longer compute ran than it would alone, on the SMs collectives' thread
    /// blocks left it ([`crate::engine::links`]); part of `compute_busy_s`.
    pub sm_contention_s: f64,
    /// Communication time not hidden behind compute: the compute stream idle while a
    /// collective or pipeline transfer runs.
    pub exposed_comm_s: f64,
    /// Host work not hidden behind compute or communication: the compute stream idle, no
    /// collective running, while offload's host work runs (the CPU optimizer step, PCIe
    /// copies, NVMe).
    pub exposed_host_s: f64,
    /// Compute stream idle with nothing else running either (dependencies, latency).
    pub idle_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// Steady-state step (the last completed one).
    pub step_time_s: f64,
    pub tokens_per_step: u64,
    pub tokens_per_s: f64,
    pub tokens_per_s_per_gpu: f64,
    /// Model FLOPs (6 N T-style count from the DAG: forward x 3, no recompute) over peak.
    pub mfu: f64,
    /// Hardware FLOPs (recompute included) over peak.
    pub hfu: f64,
    pub model_flops_per_step_per_gpu: f64,
    pub verdict: ThroughputVerdict,
    /// With `[jitter]`: the steady-state steps' median and p99 (nearest rank) step time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter: Option<JitterStats>,
    pub assumptions: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct JitterStats {
    pub steps: usize,
    pub median_s: f64,
    pub p99_s: f64,
    pub min_s: f64,
    pub max_s: f64,
}

/// Median and nearest-rank p99 of the steady-state steps (step 1 excluded when there are
/// more: it creates optimizer state and is not steady).
pub fn jitter_stats(steps: &[StepTiming]) -> Option<JitterStats> {
    let mut t: Vec<f64> = steps.iter().filter(|x| x.step > 1 || steps.len() == 1).map(|x| x.time_s).collect();
    if t.is_empty() {
        return None;
    }
    t.sort_by(f64::total_cmp);
    let rank = |q: f64| t[((q * t.len() as f64).ceil() as usize).clamp(1, t.len()) - 1];
    Some(JitterStats { steps: t.len(), median_s: rank(0.5), p99_s: rank(0.99), min_s: t[0], max_s: t[t.len() - 1] })
}

/// The time side of activation checkpointing.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointingCost {
    /// Steady-state step time of the same scenario without checkpointing (memory unbounded).
    pub step_time_without_s: f64,
    pub step_time_with_s: f64,
    /// Fractional slowdown (0.2 = 20% slower).
    pub slowdown: f64,
    /// Peak it would need without checkpointing.
    pub peak_without: Bytes,
}

/// Uneven MoE routing against uniform routing of the same job.
#[derive(Debug, Clone, Serialize)]
pub struct RoutingReport {
    /// The routing, in the scenario's words.
    pub routing: String,
    /// Token dropping: the capacity factor, padding, and the share of each rank's token
    /// copies dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_factor: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub padded: bool,
    pub dropped_fraction: f64,
    /// Token copies per micro-batch and MoE block: the hottest and coolest expert-parallel
    /// ranks' and what every rank receives under uniform routing.
    pub hottest_rank: u64,
    pub hottest_copies: u64,
    pub coolest_rank: u64,
    pub coolest_copies: u64,
    pub uniform_copies: u64,
    /// Peak allocated of the job's highest class (the hottest rank's stage), simulated with
    /// unbounded memory when the run itself ran out: what it would need.
    pub peak_needed: Bytes,
    /// Steady-state step time under this routing (unbounded memory if the run ran out).
    pub step_time_s: Option<f64>,
    /// The same job with uniform routing, at the real capacity.
    pub uniform_peak: Bytes,
    pub uniform_fits: bool,
    pub uniform_step_time_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelStateReport {
    pub parameters: Bytes,
    pub master_weights: Bytes,
    pub gradients: Bytes,
    pub optimizer_state: Bytes,
    pub total: Bytes,
    /// Bytes of model state per parameter under the precision policy (16 for mixed-precision
    /// Adam), before any sharding.
    pub bytes_per_param: f64,
    /// Bytes this GPU holds per model parameter (16 replicated, 16 / N fully sharded).
    pub bytes_per_param_per_gpu: f64,
    /// The naive "total state / GPUs" figure, for contrast.
    pub naive_average: Bytes,
}

#[derive(Debug, Clone, Serialize)]
pub struct RankClass {
    pub ranks: String,
    pub count: u64,
    pub note: String,
    /// With pipeline parallelism: the stage this class is (or is a rank of).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<job::StageSummary>,
    /// Under `[jitter]`: the data-parallel rank this class is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u64>,
    /// Under uneven MoE routing: the expert-parallel rank this class is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_rank: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub description: String,
    /// Where the model's shape came from (a zoo model or a `config.json`), if not the
    /// scenario's own fields.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_source: Option<String>,
    pub stepsim_version: &'static str,
    /// "train" or "inference".
    pub job: &'static str,
    pub model: serde_json::Value,
    pub param_count: u64,
    pub param_count_human: String,
    /// A mixture of experts: the parameters one token's forward uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_param_count: Option<u64>,
    /// Parameters that get gradients (all of them, but for LoRA's adapters).
    pub trainable_params: u64,
    /// LoRA / QLoRA: the adapters and the frozen base as simulated (rank, alpha, targets,
    /// dropout, the base's storage, whether `prepare_model_for_kbit_training` ran, whether the
    /// base shares FSDP1 FlatParameters with the adapters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<serde_json::Value>,
    pub hardware: serde_json::Value,
    pub capacity: Bytes,
    pub parallel: serde_json::Value,
    pub training: serde_json::Value,
    pub rank_classes: Vec<RankClass>,
    /// The row of `rank_classes` the headline figures are about.
    #[serde(skip)]
    pub headline_class: usize,
    pub model_state_per_gpu: ModelStateReport,
    pub verdict: Verdict,
    pub peak: Option<Peak>,
    pub phase_peaks: Vec<PhasePeak>,
    pub steps: Vec<StepTiming>,
    pub throughput: Option<Throughput>,
    pub checkpointing_cost: Option<CheckpointingCost>,
    /// `stepsim explain`'s answer, when it was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<serde_json::Value>,
    pub assumptions: Vec<String>,
    /// The allocator: max_memory_allocated / reserved, retries, fragmentation, the OOM's cause.
    pub allocator: allocator::AllocatorReport,
    /// Offload: host memory, PCIe traffic, the CPU step, GPU memory saved, time paid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadReport>,
    /// Uneven MoE routing: the hottest expert-parallel rank beside the uniform case.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingReport>,
    /// FP8 training: what runs in FP8 and what it keeps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp8: Option<Fp8Report>,
    /// Activation offload: what goes to pinned host memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activation_offload: Option<ActivationOffloadReport>,
    /// Offload: whether a node's host memory and NVMe hold the offloaded state (true without
    /// offload). When they do not, the run fails at initialisation whatever the GPU does;
    /// every reader of a verdict (text, sweeps, explain) takes it from here. `offload`
    /// carries the same fact with its figures.
    #[serde(skip)]
    pub offload_fits: bool,
    /// An inference job's figures (TTFT, TPOT, KV cache, the largest batch that fits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inference: Option<inference::InferenceReport>,
}

/// What the FP8 recipe does, with the source each figure comes from.
fn fp8_assumption(f: &crate::model::Fp8Config) -> String {
    use crate::model::Fp8Recipe;
    match f.recipe {
        Fp8Recipe::Delayed => format!(
            "FP8 delayed scaling (Transformer Engine 1.x under Megatron-Core, fp8_autocast around the transformer blocks): the blocks' LayerNormLinear / Linear / GroupedLinear GEMMs in FP8 (E4M3 forward, E5M2 gradients; weight gradients {}), the LM head, router, embeddings and attention core in 16 bits; a LayerNormLinear saves its normalised input as the norm kernel wrote it in FP8 (1 B/element) and transposes it in backward (2 B/element of traffic), a Linear cast-transposes its input (4 B/element) and saves the FP8 transpose, every FP8 linear cast-transposes its output gradient (4 B/element); FP8 weight and transpose workspaces persist (2 B per FP8 parameter, refreshed once per step: 4 B/parameter over {} micro-batches); amax histories of {} rows (modules/linear.py, layernorm_linear.py, base.py get_fp8_workspace, v1.12); FP8 GEMMs reach the same fractions of the FP8 peak as 16-bit GEMMs of theirs (cuBLASLt 8192^3 E4M3 at 81% of 1,979 TFLOP/s on H100, against 80% for BF16)",
            if f.wgrad { "in FP8 (--fp8-wgrad)" } else { "in 16 bits (--no-fp8-wgrad)" },
            f.micro_batches,
            f.amax_history_len
        ),
        Fp8Recipe::Blockwise | Fp8Recipe::Mxfp8 => format!(
            "FP8 {} (Transformer Engine 2.x {} under Megatron-Core, --fp8-recipe {}): the blocks' linear GEMMs in FP8 as with delayed scaling (weight gradients {}), scaled per block as they are quantized ({}), no amax history; each input is quantized rowwise and columnwise in one pass (4 B/element and the scales) and only the columnwise FP8 copy is saved for the weight gradient (1 B/element plus {:.3} B of scales; module/linear.py update_usage), the output gradient quantized both ways (4 B/element); FP8 weight copies, rowwise and columnwise, persist ({:.4} B per FP8 parameter with scales, refreshed once per step: 4 B/parameter over {} micro-batches); FP8 GEMMs reach the same fractions of the FP8 peak as the per-tensor ones (no block-scaled GEMM measurement at hand)",
            f.recipe.name(),
            if f.recipe == Fp8Recipe::Blockwise { "Float8BlockScaling" } else { "MXFP8BlockScaling" },
            f.recipe.name(),
            if f.wgrad { "in FP8" } else { "in 16 bits (--no-fp8-wgrad)" },
            if f.recipe == Fp8Recipe::Blockwise {
                "1 x 128 blocks of activations and gradients, 128 x 128 of weights, FP32 scales"
            } else {
                "1 x 32 blocks, E8M0 scales"
            },
            f.recipe.activation_scale_bytes(),
            f.recipe.workspace_bytes(1 << 20) as f64 / f64::from(1u32 << 20),
            f.micro_batches
        ),
        Fp8Recipe::Tensorwise | Fp8Recipe::Rowwise => format!(
            "FP8 {} (torchao Float8Linear, dynamic scaling, as torchtitan converts every linear but the LM head): all three GEMMs of the blocks' linears in FP8; the input is saved in 16 bits; casts are an amax pass and a cast, per element {} (torchao/testing/float8/roofline_utils.py); {}; with tensor and sequence parallelism, tensorwise runs torchao's float8 tensor parallelism (float8_tensor_parallel.py): each sequence-parallel input is cast once on this rank's shard and all-gathered in FP8, its gradient reduce-scattered in 16 bits; FP8 GEMMs reach the same fractions of the FP8 peak as 16-bit GEMMs of theirs",
            f.recipe.name(),
            if f.recipe == Fp8Recipe::Tensorwise { "6 B for inputs and output gradients, 8 B for weights" } else { "8 B for inputs and output gradients, 10 B for weights" },
            if f.fsdp_all_gather {
                "FSDP all-gathers the float8 linears' weights in FP8 (enable_fsdp_float8_all_gather, torchao fsdp_utils.py): each weight is cast on the shard before its forward and backward all-gathers (8 B per shard element), gathered at 1 B/parameter, and copied transposed for the input-gradient GEMM (2 B/parameter)"
            } else {
                "the weight is cast on every micro-batch's forward and backward (FSDP all-gathers it in 16 bits)"
            }
        ),
    }
}

/// Saved activations in pinned host memory, as the headline rank offloads them.
#[derive(Debug, Clone, Serialize)]
pub struct ActivationOffloadReport {
    pub method: &'static str,
    pub blocks: u64,
    /// Fine-grained offloading: Megatron's module names offloaded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<&'static str>,
    /// Per micro-batch: the tensors the schedule offloads (pinned host memory per GPU;
    /// nothing else is in flight without a pipeline).
    pub host_bytes_per_gpu: Bytes,
    pub d2h_bytes_per_s: f64,
    pub h2d_bytes_per_s: f64,
}

pub fn activation_offload_report(dag: &LayerDag, plan: &crate::plan::Plan) -> Option<ActivationOffloadReport> {
    let a = plan.training.activation_offload?;
    Some(ActivationOffloadReport {
        method: a.method.name(),
        blocks: a.blocks,
        modules: a.modules.names(),
        host_bytes_per_gpu: Bytes::new(crate::schedule::activation_offload::host_bytes(dag, plan)),
        d2h_bytes_per_s: a.d2h_bytes_per_s,
        h2d_bytes_per_s: a.h2d_bytes_per_s,
    })
}

fn activation_offload_assumption(a: &crate::plan::ActivationOffload, layers: u64) -> String {
    use crate::plan::ActivationOffloadMethod;
    let rates = format!(
        "pinned copies at {:.0} GB/s device-to-host and {:.0} GB/s host-to-device per GPU (measured PCIe rates, src/scenario/offload.rs)",
        a.d2h_bytes_per_s / 1e9,
        a.h2d_bytes_per_s / 1e9
    );
    match a.method {
        ActivationOffloadMethod::Overlapped => format!(
            "activation offload: Megatron-Core --cpu-offloading --cpu-offloading-num-layers {} of {layers} (Transformer Engine's AsyncDoubleBufferGroupOffloadHandler, cpu_offload_v1.py, one group per layer): each offloaded layer's saved tensors are copied to the host on their own stream; a window map spreads the groups over the layers, and at each window the forward waits for the group's copy and frees it on the GPU, then starts the next group's; backward reloads one group per window into new buffers, waiting for the previous reload first, and layer 0 waits for all; {rates}",
            a.blocks
        ),
        ActivationOffloadMethod::FineGrained => format!(
            "activation offload: Megatron-Core --fine-grained-activation-offloading --offload-modules {} (fine_grained_activation_offload.py): in each of the {layers} layers every listed module's saved tensors of at least {} elements (--min-offloaded-tensor-size) that no other module also saves go to pinned host memory when the module's forward commits (the norms after the residual add that reads their input), copied on their own stream while compute goes on and freed on the GPU when the copy ends; backward reloads a layer's groups into new buffers one layer ahead of the backward that waits for them (Megatron: one group ahead); the pipeline's last chunk keeps each module's last group on the GPU; of each model chunk's other groups the first {} in forward order go (--activation-offload-fraction {}); no --delta-offload-bytes-across-pp-ranks assumed; {rates}",
            a.modules.names().join(" "),
            a.min_elements,
            if a.fraction >= 1.0 { "all".to_string() } else { format!("{:.0}%", a.fraction * 100.0) },
            a.fraction
        ),
        ActivationOffloadMethod::Synchronous => format!(
            "activation offload: PyTorch offload_wrapper / torch.autograd.graph.save_on_cpu(pin_memory=True) on the first {} of {layers} blocks: the pack hook copies each saved tensor to pinned host memory and the unpack hook copies it back when backward needs it, both on the compute stream, so neither overlaps compute (modelled as one copy per block after its forward and one before its backward); {rates}",
            a.blocks
        ),
    }
}

/// FP8 training as the headline rank runs it.
#[derive(Debug, Clone, Serialize)]
pub struct Fp8Report {
    pub recipe: &'static str,
    /// Linears whose GEMMs run in FP8, of all the rank's linears.
    pub fp8_linears: u64,
    pub linears: u64,
    /// Share of the rank's forward FLOPs in FP8 GEMMs.
    pub fp8_flops_share: f64,
    pub wgrad_fp8: bool,
    /// The FP8 tensor-core peak, FLOP/s.
    pub fp8_peak_flops: f64,
    /// Transformer Engine's persistent FP8 weight and transpose workspaces on one GPU (its
    /// pipeline stage's; the stage that holds the most).
    pub weight_workspaces: Bytes,
    pub amax_history_len: Option<u64>,
    /// torchao float8 tensor parallelism: sequence-parallel inputs cast on the shard and
    /// all-gathered in FP8 (tensorwise with tensor and sequence parallelism).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub float8_tensor_parallel: bool,
    /// FSDP all-gathers the float8 linears' weights in FP8 (`enable_fsdp_float8_all_gather`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fsdp_all_gather: bool,
}

pub fn fp8_report(s: &Scenario, dag: &LayerDag, plan: &Plan) -> Option<Fp8Report> {
    let f = dag.workload.fp8?;
    let linears = dag.ops.iter().filter(|o| o.kind == crate::model::OpKind::Linear);
    let (n, fp8) = linears.fold((0, 0), |(n, k), o| (n + 1, k + u64::from(o.fp8.is_some())));
    // The weight workspaces a GPU holds: its pipeline stage's FP8 linears (every chunk of
    // it), on the stage that holds the most.
    let mtp = dag.config.mtp_layers();
    let fp8_params = plan
        .stage_chunks(dag.config.n_layers, mtp)
        .iter()
        .map(|chunks| {
            let held = |o: &&crate::model::Op| o.fp8.is_some() && chunks.iter().any(|c| c.holds(o.region));
            dag.ops.iter().filter(held).map(|o| o.params).sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    let flops: f64 = dag.ops.iter().filter(|o| o.fp8.is_some()).map(|o| o.fwd_flops).sum();
    let delayed = f.recipe == crate::model::Fp8Recipe::Delayed;
    Some(Fp8Report {
        recipe: f.recipe.name(),
        fp8_linears: fp8,
        linears: n,
        fp8_flops_share: round4(flops / dag.forward_flops().max(1.0)),
        wgrad_fp8: f.wgrad,
        fp8_peak_flops: s.cluster.gpu.fp8_flops.unwrap_or(0.0),
        weight_workspaces: Bytes::new(f.recipe.workspace_bytes(fp8_params)),
        amax_history_len: delayed.then_some(f.amax_history_len),
        float8_tensor_parallel: f.float8_tensor_parallel(&dag.workload.split),
        fsdp_all_gather: f.fsdp_all_gather,
    })
}

fn instant(sched: &Schedule, task: usize, time_ns: u64) -> Instant {
    let l = &sched.labels[sched.program.tasks[task].label as usize];
    Instant {
        time_s: time_ns as f64 / 1e9,
        step: l.step,
        phase: l.phase,
        micro_batch: l.micro_batch,
        layer: l.layer(),
        op: l.what.clone(),
    }
}

/// "101.21B", "49.5M": parameter counts as people say them.
pub fn human_count(n: u64) -> String {
    human_count_with(n, 2)
}

/// The same with `b_decimals` decimals for billions.
pub fn human_count_with(n: u64, b_decimals: usize) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.*}B", b_decimals, x / 1e9)
    } else if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else {
        format!("{n}")
    }
}

pub(crate) fn to_json<T: Serialize>(t: &T) -> serde_json::Value {
    serde_json::to_value(t).unwrap_or(serde_json::Value::Null)
}

/// Builds the report from a finished (or OOM-stopped) run.
pub fn build(s: &Scenario, dag: &LayerDag, plan: &Plan, sched: &Schedule, trace: &Trace) -> Report {
    let cap = s.allocator_capacity();
    let ms: ModelState = plan.model_state();
    // The whole model's parameters (a tensor-parallel rank's DAG holds 1/t of most of them,
    // an expert-parallel rank's 1/e of the experts, an expert-tensor-parallel one 1/etp of
    // each).
    let split = dag.workload.split;
    let params = if split.tensor > 1 || split.expert > 1 || split.expert_tensor > 1 {
        dag.config.param_count()
    } else {
        dag.param_count()
    };
    let total_state = ms.total();
    let per_param: u64 = plan.training.precision.bytes_per_param_by_part(plan.training.states_per_param()).iter().sum();
    // LoRA: the full per-parameter policy applies to the adapters only; the frozen base
    // counts as stored, with its gradients where it shares a FlatParameter with them.
    let naive = match &dag.lora {
        Some(_) => {
            let pr = &plan.training.precision;
            (dag.stored_frozen().1
                + dag.flat_frozen_params() * (pr.param.bytes() + pr.grad.bytes())
                + dag.trainable_params() * per_param)
                / plan.gpus.max(1)
        }
        None => params * per_param / plan.gpus.max(1),
    };
    let msr = ModelStateReport {
        parameters: Bytes::new(ms.parameters),
        master_weights: Bytes::new(ms.master_weights),
        gradients: Bytes::new(ms.gradients),
        optimizer_state: Bytes::new(ms.optimizer_state),
        total: Bytes::new(total_state),
        bytes_per_param: per_param as f64,
        bytes_per_param_per_gpu: round4(total_state as f64 / params.max(1) as f64),
        naive_average: Bytes::new(naive),
    };
    let prog = &sched.program;
    let (verdict, peak, phase_peaks) = memory_side(cap, sched, trace);
    // Step timings from the tasks that ran, every step's gathered in one pass over the tasks.
    let mut steps = Vec::new();
    if trace.oom.is_none() {
        #[derive(Default)]
        struct Acc {
            /// Busy nanoseconds of the compute stream (communication is measured as a union below).
            busy: u64,
            /// What the compute stream's tasks would have taken alone.
            solo: u64,
            recompute: u64,
            /// Intervals of the compute, the communication and the host streams.
            intervals: [Vec<(u64, u64)>; 3],
        }
        let n = plan.training.steps as usize;
        let spans = step_spans(plan, sched, trace);
        let mut acc: Vec<Acc> = (0..n).map(|_| Acc::default()).collect();
        for (i, t) in prog.tasks.iter().enumerate() {
            let l = &sched.labels[t.label as usize];
            if l.step == 0 || trace.end_ns[i] == u64::MAX {
                continue;
            }
            let Some(a) = acc.get_mut(l.step as usize - 1) else { continue };
            let st = match sched.stream_class(t.stream) {
                StreamClass::Compute => 0,
                StreamClass::Comm => 1,
                StreamClass::Host => 2,
            };
            if st == 0 {
                a.busy += trace.end_ns[i] - trace.start_ns[i];
                a.solo += t.duration_ns;
            }
            if t.duration_ns > 0 {
                a.intervals[st].push((trace.start_ns[i], trace.end_ns[i]));
            }
            if l.kind == TaskKind::Recompute {
                a.recompute += t.duration_ns;
            }
        }
        for ((k, a), span) in (1..).zip(&mut acc).zip(spans) {
            let (busy, recompute, solo) = (a.busy, a.recompute, a.solo);
            let Some((start, end)) = span else { continue };
            let [compute, comm, host] = &mut a.intervals;
            // Exposure within the period: work begun before it is clipped to its start.
            for v in [&mut *compute, &mut *comm, &mut *host] {
                v.retain(|&(_, e)| e > start);
                v.iter_mut().for_each(|x| x.0 = x.0.max(start));
            }
            let exposed = intervals::uncovered(comm, compute);
            // Host work counts as exposed only where neither compute nor a collective covers it.
            let covering: Vec<(u64, u64)> = compute.iter().chain(comm.iter()).copied().collect();
            let exposed_host = intervals::uncovered(host, &covering);
            // Communication streams overlap one another (tensor-parallel, data-parallel,
            // pipeline): their busy time is the time any of them runs; the same for host work.
            let (comm_busy, host_busy) = (intervals::union_len(comm), intervals::union_len(host));
            let dur = end - start;
            steps.push(StepTiming {
                step: k,
                start_s: start as f64 / 1e9,
                time_s: dur as f64 / 1e9,
                compute_busy_s: busy as f64 / 1e9,
                comm_busy_s: comm_busy as f64 / 1e9,
                host_busy_s: host_busy as f64 / 1e9,
                compute_idle_s: dur.saturating_sub(busy) as f64 / 1e9,
                recompute_s: recompute as f64 / 1e9,
                sm_contention_s: busy.saturating_sub(solo) as f64 / 1e9,
                exposed_comm_s: exposed as f64 / 1e9,
                exposed_host_s: exposed_host as f64 / 1e9,
                idle_s: dur.saturating_sub(busy).saturating_sub(exposed).saturating_sub(exposed_host) as f64 / 1e9,
            });
        }
    }
    let throughput = steps
        .last()
        .map(|st| throughput_of(s, plan, sched.model_flops_per_step, sched.hardware_flops_per_step, st, &steps));
    let pr = &plan.training.precision;
    let assumptions = vec![
        format!(
            "precision \"{}\": parameters {}, compute {}, gradients {}, {}",
            pr.preset,
            pr.param.name(),
            pr.compute.name(),
            pr.grad.name(),
            pr.state_words(plan.training.states_per_param(), "none (parameters are the master)")
        ) + &pr.aware.map_or(String::new(), |pa| format!("; {}", pa.describe(pr.param))),
        allocator::capacity_assumption(s),
        allocator::nccl_assumption(s),
        allocator::assumption(s),
        plan.state_creation(),
        "activations: per-op saved tensors of PyTorch autograd (Korthikanti et al. 2022 counting); gradient accumulation frees each micro-batch's activations in its backward".into(),
        "the CPU is assumed to run ahead of the GPU: collectives are issued as early as their dependencies (and limit_all_gathers) allow, in one NCCL queue per process group".into(),
    ];
    let mut assumptions = assumptions;
    if let Some(line) = deepspeed_assumption(plan) {
        assumptions.push(line);
    } else if plan.parallel.framework == crate::plan::Framework::Deepspeed
        && plan.parallel.sharding == crate::plan::Sharding::Zero3
    {
        // Under offload no optimizer wrapper line is written; the fetching still applies.
        assumptions.push(format!("DeepSpeed ZeRO-3: {}", zero3_fetch_clause(plan)));
    }
    if let Some(line) = megatron_assumption(plan) {
        assumptions.push(line);
    }
    if let Some(line) = fsdp2_assumption(plan) {
        assumptions.push(line);
    }
    if let Some(line) = fsdp1_assumption(plan) {
        assumptions.push(line);
    }
    if let Some(f) = &dag.workload.fp8 {
        assumptions.push(fp8_assumption(f));
    }
    if plan.parallel.async_tp {
        assumptions.push(format!("async TP (torchtitan enable_async_tensor_parallel: torch.compile's micro-pipelined all-gather-matmul and matmul-reduce-scatter over symmetric memory): a sequence-parallel collective and the GEMM it pairs with, split into {} chunks, take max + min / {} (the forward all-gather with the column-parallel linears, the forward reduce-scatter with the row-parallel linear that feeds it, that reduce-scatter's backward all-gather with the linear's input-gradient GEMM; the pairs of Megatron's --tp-comm-overlap); the split GEMMs' lower efficiency is not modelled", plan.parallel.model_parallel.tensor, plan.parallel.model_parallel.tensor));
    }
    if plan.parallel.no_sync {
        assumptions.push("FSDP no_sync (FSDP1 no_sync(), FSDP2 set_requires_gradient_sync(False), HF Accelerate's default under gradient accumulation): each unit's unsharded gradient is created by the step's first backward, later micro-batches accumulate into it (their own gradient a temporary AccumulateGrad adds in), and only the last micro-batch's post-backward reduce-scatters it; parameters are still resharded after each backward".into());
    }
    if let Some(a) = &plan.training.activation_offload {
        assumptions.push(activation_offload_assumption(a, dag.config.n_layers));
    }
    if let Some(m) = &dag.config.mtp {
        let dualpipe = plan.parallel.model_parallel.schedule.is_dualpipe();
        assumptions.push(mtp_assumption(dag, m, dualpipe));
    }
    match dag.workload.loss {
        crate::model::LossKind::Eager => {}
        crate::model::LossKind::VocabParallel => assumptions.push("loss: Megatron-Core's vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py): the 16-bit logits are upcast and exponentiated in place into the FP32 softmax it saves for backward (no separate FP32 copy or log-softmax), and its backward writes the 16-bit logit gradient".into()),
        crate::model::LossKind::Compiled => assumptions.push("loss: torch.compile'd F.cross_entropy(logits.float(), targets), as torchtitan compiles its loss with the model (torchtitan bbb1b61 on, components/loss.py): Inductor fuses the upcast, log-softmax and NLL into row reductions over the 16-bit logits, which it saves with each row's FP32 log-sum-exp; no FP32 copy of the logits exists, and backward recomputes the softmax in one kernel that writes the 16-bit logit gradient (4 B per logit read forward, 4 B read and written backward)".into()),
        crate::model::LossKind::FusedLinear => assumptions.push("loss: Liger-Kernel's LigerFusedLinearCrossEntropyLoss (ops/fused_linear_cross_entropy.py): the LM head and cross-entropy over chunks of next_power_of_2(tokens / ceil(vocab / hidden)) tokens; each chunk's logits, their gradient and the input and weight gradients are computed in forward (three head-sized GEMMs there, none in backward); only one chunk's 16-bit logits exist; the input and weight gradients are kept for backward".into()),
    }
    let cp = plan.parallel.model_parallel.context;
    if cp > 1 {
        let core = dag.ops.iter().find(|o| o.cp_kv_bytes > 0);
        let kv = core.map_or(0, |o| o.cp_kv_bytes);
        let mp = &plan.parallel.model_parallel;
        if mp.context_comm == crate::model::ContextComm::AllToAll {
            assumptions.push(format!(
                "context parallel {cp} as Ulysses ({}): every op but attention runs on {} of {} tokens; before the attention kernel all-to-alls turn q, k and v into the whole sequence of 1/{cp} of the heads, and after it the output back ({} per layer through the all-to-alls, the same for the gradients in backward), not overlapped with compute; parameters are replicated over the context ranks (gradients reduced and state sharded over data x context = {} ranks)",
                if plan.parallel.framework == crate::plan::Framework::Megatron {
                    "Megatron-Core --cp-comm-type a2a"
                } else {
                    "DeepSpeed-Ulysses DistributedAttention"
                },
                s.training.seq_len / cp,
                s.training.seq_len,
                fmt_bytes(kv),
                plan.dp
            ));
        } else if plan.parallel.framework.is_pytorch() {
            assumptions.push(format!(
                "context parallel {cp} (PyTorch's context_parallel as torchtitan applies it to SDPA, rotate method {}): each sequence is cut into {} chunks and GPU i holds chunks i and {} - i (causal load balancing), so every op but attention runs on {} of {} tokens; {}; parameters are replicated over the context ranks, which join FSDP's shard group (data x context = {} ranks)",
                if mp.context_comm == crate::model::ContextComm::AllGather { "allgather" } else { "alltoall" },
                2 * cp,
                2 * cp - 1,
                s.training.seq_len / cp,
                s.training.seq_len,
                if mp.context_comm == crate::model::ContextComm::AllGather {
                    format!("attention all-gathers every rank's keys and values ({} per rank, {} gathered) while it computes its own block, then computes the others; backward gathers them again and reduce-scatters their gradients after the last block", fmt_bytes(kv), fmt_bytes(cp * kv))
                } else {
                    format!("attention runs {cp} steps, each over one block of keys and values while the next ({}) arrives by all-to-all shift, a step lasting as long as the slower of the two", fmt_bytes(kv))
                },
                plan.dp
            ));
        } else {
            assumptions.push(format!(
            "context parallel {cp} (Megatron-Core with Transformer Engine's AttnFuncWithCPAndKVP2P): each sequence is cut into {} chunks and GPU i of the ring holds chunks i and {} - i (causal load balancing), so every op but attention runs on {} of {} tokens; attention runs {cp} steps, each over one block of keys and values while the next block ({} of keys and values per step, {} with their gradients in backward) arrives from the previous rank, a step lasting as long as the slower of the two; two receive buffers live while attention runs; parameters are replicated over the ring, so gradients are reduced and the distributed optimizer sharded over data x context = {} ranks",
            2 * cp,
            2 * cp - 1,
            s.training.seq_len / cp,
            s.training.seq_len,
            fmt_bytes(kv),
            fmt_bytes(2 * kv),
            plan.dp
        ));
        }
    }
    let mp = &plan.parallel.model_parallel;
    if mp.tensor > 1 {
        let mla = dag.config.mla.as_ref().map_or(String::new(), |m| {
            let down = dag.config.hidden * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim);
            let grads = if mp.sequence_parallel {
                format!(
                    "; their weight gradients, partial over the sequence shards, are all-reduced over the group once per step before the optimizer (finalize_model_grads; {} on this GPU)",
                    fmt_bytes(crate::schedule::partial_grad_params(dag, plan) * plan.training.precision.grad.bytes())
                )
            } else {
                String::new()
            };
            format!(
                "; multi-head latent attention (Megatron-Core MLASelfAttention with Transformer Engine): the query and key-value down projections ({} parameters a block) duplicated on every rank and run on the rows it holds, the latents {} for the column-parallel up projections over the heads{grads}",
                down,
                if mp.sequence_parallel { "and the rope key all-gathered from the sequence shards" } else { "read whole (their gradient all-reduced)" }
            )
        });
        assumptions.push(format!(
            "tensor parallel {} (Megatron-LM): column/row-parallel attention and MLP, vocabulary-parallel embedding and head; per layer and direction two {} on the TP group inside a node; a column-parallel linear's input-gradient collective overlaps its weight-gradient GEMM (each GEMM timed with its own output shape); norm and bias gradients are not all-reduced here (small){mla}",
            mp.tensor,
            if mp.sequence_parallel { "all-gathers / reduce-scatters (sequence parallel)" } else { "all-reduces" }
        ));
    }
    if dag.workload.swiglu_fp8_input_store {
        assumptions.push(
            "--activation-func-fp8-input-store (Megatron-Core fused_bias_swiglu.py): each fused SwiGLU (dense, shared and routed experts) saves its input as input.to(torch.float8_e4m3fn), 1 B per element with no scale instead of 2, cast by a second kernel in forward (2 B read, 1 B written) and back in backward into a 16-bit temporary that lives while the kernel runs (1 B read, 2 B written); under --recompute-modules moe_act the experts' activation keeps its 16-bit input instead (CheckpointWithoutOutput saves it) and the rerun casts again".to_string(),
        );
    }
    if let Some(moe) = &dag.config.moe {
        // The tokens this rank routes (its sequence shard under sequence parallelism).
        let rows = dag.tokens() / if mp.sequence_parallel { mp.tensor } else { 1 };
        let copies = rows * moe.top_k;
        let bytes = copies * dag.config.hidden * dag.workload.compute_dtype.bytes();
        // The expert-parallel group and DeepEP's fan-out over it, as the schedule costed them.
        let cost = (plan.parallel.deepep.is_some() && mp.expert > 1)
            .then(|| crate::schedule::Cost::for_plan(&s.cluster, plan));
        let (dispatcher, moved) = match cost.as_ref().and_then(|c| c.deepep.as_ref().map(|(d, f)| (&c.ep_group, d, *f)))
        {
            Some((g, d, f)) => {
                let token = bytes / moe.top_k.max(1);
                // Under uneven routing the fan-out is the busiest receiver's, in units of the
                // busiest rank's copies ([`crate::net::deepep::DeepEp::fanout`]): back to a
                // rank's own tokens.
                let (load, per) = match d.busiest(mp.expert, g.ranks_per_node) {
                    Some((_, _, load)) => (load, "as the busiest node receives"),
                    None => (1.0, "on average"),
                };
                let across = if g.nodes() > 1 {
                    format!(
                        "; across nodes it goes once per node it reaches ({:.2} of {} {per}, {:.2} of them other nodes: {} per GPU over RDMA at {:.0}% of the NIC, DeepEP's EP 64 benchmark, docs/legacy.md) to the GPU of the same local index, which forwards it over NVLink at {:.0}%; the slower of the two sets the time",
                        f.nodes * load,
                        g.nodes(),
                        f.remote_nodes * load,
                        fmt_bytes((f.remote_nodes * load * token as f64) as u64),
                        crate::net::deepep::DEEPEP_RDMA_EFFICIENCY * 100.0,
                        crate::net::LINK_EFFICIENCY * 100.0
                    )
                } else {
                    format!(" over NVLink at {:.0}%", crate::net::LINK_EFFICIENCY * 100.0)
                };
                let groups = moe.group_limit_words().map_or(String::new(), |w| format!(", group-limited ({w})"));
                let reach = match d.busiest(mp.expert, g.ranks_per_node) {
                    Some((rank_hit, node_hit, load)) => {
                        let uniform = crate::net::deepep::DeepEp { shares: None, ..d.clone() };
                        let u = uniform.fanout(mp.expert, g.ranks_per_node);
                        format!(
                            "under the uneven routing the busiest receiver sets its length: a token reaches the rank whose experts draw the most ({:.2}x a rank's own copies) with probability {:.3} and the busiest node with {:.3}, where uniform{groups} routing gives {:.3} and {:.3} (a rank or node holding w x its uniform share of the copies is reached with probability 1 - (1 - p)^w, p the uniform chance: the routing model gives each expert's share, not which experts a token picks together); a token of {}",
                            load,
                            rank_hit,
                            node_hit,
                            u.ranks / mp.expert as f64,
                            u.nodes / g.nodes() as f64,
                            fmt_bytes(token)
                        )
                    }
                    None => format!(
                        "{:.2} of {} on average under uniform{groups} routing, a token of {}",
                        f.ranks,
                        mp.expert,
                        fmt_bytes(token)
                    ),
                };
                (
                    "DeepEP through the flex token dispatcher (deepseek-ai/DeepEP's normal kernels)".to_string(),
                    format!(
                        "each dispatch or combine sends a token once per rank it reaches ({reach}){across}; the kernels hold {} SMs while they run (moe.deepep_sms; Megatron's --moe-flex-dispatcher-num-sms defaults to 20)",
                        d.sms
                    ),
                )
            }
            None => (
                "all-to-all token dispatcher".to_string(),
                format!("each of {} per GPU ({}/{} of it leaves the GPU)", fmt_bytes(bytes), mp.expert - 1, mp.expert),
            ),
        };
        let routing = if s.routing.is_uniform() {
            format!("routing is uniform, every expert receives tokens x top_k / experts copies, so every expert-parallel rank computes {copies} token copies per micro-batch and MoE block")
        } else {
            format!("routing is uneven (the Routing line; each expert-parallel rank is its own rank class, and every all-to-all lasts as long as the busiest rank's), so each expert-parallel rank computes the copies its experts receive (not the uniform {copies}) per micro-batch and MoE block")
        };
        let saved = match dag.workload.routing_scale {
            crate::model::RoutingScale::InActivation if dag.workload.fused_swiglu => {
                "the router's FP32 scores, the dispatched copies (the experts' FC1 input) and their routing probabilities are saved: the probabilities scale each copy inside the experts' fused SwiGLU, which saves them beside its input, and the unpermute only sums the copies home (Megatron-Core 0.13 on, weighted_bias_swiglu_impl; before it the unpermute scaled the combined copies and kept them)"
            }
            crate::model::RoutingScale::AfterCombineFp32 => {
                "the router's FP32 scores, the dispatched copies (the experts' FC1 input) and an FP32 copy of the combined copies are saved: the combine upcasts each copy before scaling it by its routing probability, and the product keeps the upcast copy for the probability's gradient (torchtitan's token dispatcher, routed_output.to(torch.float32) * topk_scores)"
            }
            _ => {
                "the router's FP32 scores, the dispatched copies (the experts' FC1 input) and the combined copies are saved: the product that scales the combined copies by their routing probabilities after the experts keeps them (Megatron-Core's unpermute before 0.13, Hugging Face's expert_layer(x) * routing_weights)"
            }
        };
        assumptions.push(format!(
            "mixture of experts (Megatron-Core MoELayer, {dispatcher}, dropless): {routing} in the grouped GEMMs of its {} of {} experts (each GEMM's rows = copies per local expert); per MoE block and micro-batch {} all-to-alls forward (dispatch, combine) and as many backward, {moved}, on their own stream {}; {saved}; {}; expert gradients are reduced over the expert-data-parallel group after the dense ones, one after the other on the NCCL queue",
            moe.num_experts / mp.expert,
            moe.num_experts,
            if mp.expert > 1 { "two" } else { "no" },
            if plan.parallel.megatron.overlap_moe_expert_parallel_comm {
                "beside the other micro-batch's compute (--overlap-moe-expert-parallel-comm)"
            } else {
                "in series with the compute"
            },
            aux_loss_words(dag, plan, rows)
        ));
        if mp.expert_tensor > 1 {
            let etp = mp.expert_tensor;
            assumptions.push(format!(
                "expert tensor parallel {etp} (Megatron-Core --expert-tensor-parallel-size): each expert's FC1 column- and FC2 row-parallel over {etp} consecutive GPUs ({} of its {} width each); the token dispatcher all-gathers what the all-to-all brought over them before the experts ({} per GPU per MoE block and micro-batch, the gathered copies saved for the experts' backward) and reduce-scatters the experts' output after (as many bytes), in the compute dtype, on the tensor-parallel stream in series with the compute; backward the reverse collectives",
                moe.expert_ffn_hidden / etp,
                moe.expert_ffn_hidden,
                fmt_bytes(etp * bytes)
            ));
        }
        if mp.context > 1 {
            // Megatron-Core: the MoE layer sees this rank's [s/cp, b] rows (moe_layer.py);
            // the expert RankGenerator has cp=1 (parallel_state.py), so a stage's context
            // ranks become expert-data-parallel ranks (distributed_data_parallel.py reduces
            // dense buffers over intra_dp_cp_group, expert ones over intra_expt_dp_group);
            // the load-balancing loss's token counts are all-reduced over tensor x context
            // (router.py, reduce_group=tp_cp_group) only when --moe-aux-loss-coeff > 0 (its
            // default is 0).
            let cp = mp.context;
            let torchtitan = plan.parallel.fsdp_expert_split();
            let edp = if torchtitan {
                format!("FSDP2 shards each expert over its efsdp mesh ({} GPUs, dp_shard x cp x tp / ep), context ranks included", plan.edp)
            } else if plan.edp > 1 {
                format!("each expert slice's expert-data-parallel group ({} GPUs, the ones holding it) spans context ranks too", plan.edp)
            } else {
                "each expert slice lives on one GPU (no expert-data-parallel group)".into()
            };
            let (who, fold, dense) = if torchtitan {
                (
                    "torchtitan",
                    "torchtitan's sparse mesh unflattens dp_shard x cp x tp into efsdp x ep, ep innermost (parallel_dims.py build_mesh)",
                    "the rest is sharded and reduced over dp_shard x cp",
                )
            } else {
                (
                    "Megatron-Core",
                    "Megatron-Core's expert rank generator has no context axis",
                    "dense gradients are reduced over data x context",
                )
            };
            assumptions.push(format!(
                "mixture of experts with context parallel {cp} ({who}): each GPU's router and experts see only its own {} of the {} tokens of each sequence (routing is per token: the MoE layer is the same on fewer tokens); the experts are folded over a stage's tensor x context x data = {} GPUs ({fold}), so {edp}, while {dense} = {} ranks{}",
                s.training.seq_len / cp,
                s.training.seq_len,
                mp.tensor * plan.dp,
                plan.dp,
                if torchtitan || !dag.workload.aux_loss.is_none() {
                    String::new()
                } else {
                    format!("; with an auxiliary loss ([moe] aux_loss) the router would all-reduce its {} int64 counts of tokens per expert over tensor x context", moe.num_experts)
                }
            ));
        }
    }
    if mp.pipeline > 1 {
        let p2p = if mp.overlap_p2p {
            "sends and receives run beside compute (overlap_p2p_communication)"
        } else {
            "a send is posted with the next receive and the stage waits for both before computing on (Megatron-LM's batch_isend_irecv + wait; overlap_p2p_communication = false)"
        };
        if mp.schedule == crate::plan::PipelineSchedule::DualPipeV {
            assumptions.push(format!("pipeline: DualPipeV (deepseek-ai/DualPipe dualpipev.py, Sea AI Lab's cut-in-half DualPipe): the model in {} virtual stages, rank k holding virtual stages k and {} - k, so every micro-batch goes down the ranks and back up, the last rank passing its output (and later the gradient) from one chunk to the other with no transfer, and rank 0 holding the embedding and the head; one copy of the model; DualPipe's eight phases in the steady state run a forward beside a backward of the other chunk layer by layer, each pass's all-to-alls under the other's compute; zero-bubble backwards run their input-gradient GEMMs first and queue the weight-gradient GEMMs (keeping what they read) for the W passes; each chunk's output activation is freed once sent; {p2p}", 2 * mp.pipeline, 2 * mp.pipeline - 1));
        } else if mp.schedule == crate::plan::PipelineSchedule::DualPipe {
            assumptions.push(format!("pipeline: DualPipe (deepseek-ai/DualPipe dualpipe.py, DeepSeek-V3 Sec. 3.2.1): half of each step's micro-batches enter at the first rank, half at the last, so rank k holds model stages k and {} - k (the shallowest and deepest layers, the embedding and the output head, share the end ranks, which need no copy of the word embedding); every stage's parameters exist twice in the pipeline, and their gradients are reduced (and ZeRO-1 shards) over the data-parallel ranks of both copies; in the steady state a forward runs beside the other direction's backward layer by layer, each pass's all-to-alls under the other's compute; zero-bubble backwards run their input-gradient GEMMs first and queue the weight-gradient GEMMs (keeping what they read) for the W passes; each stage's output activation is freed once sent; {p2p}", mp.pipeline - 1));
        } else {
            assumptions.push(format!("pipeline: stages are Megatron-LM's (embedding on the first, LM head and loss on the last, a copy of tied word embeddings there); each stage's output activation is freed once sent (deallocate_pipeline_outputs); {p2p}; tied word-embedding gradients are all-reduced between the first and last stage before the optimizer step"));
        }
    }
    if mp.pipeline > 1 && plan.grads_sharded {
        assumptions.push(format!(
            "FSDP over each pipeline stage's {} data-parallel ranks (torchtitan's FSDP + PP, torch.distributed.pipelining): parameters all-gathered at a unit's first forward of the step{}; gradients accumulated unsharded over the micro-batches (requires_gradient_sync(False)) and each unit reduce-scattered once, after the stage's last backward",
            plan.dp,
            if plan.reshard_after_forward { ", resharded after each forward and gathered again for each backward (reshard_after_forward = true)" } else { " and kept gathered until that reduce-scatter (reshard_after_forward defaults to false with a pipeline)" }
        ));
    }
    if plan.parallel.forward_prefetch {
        assumptions.push("forward_prefetch=True changes nothing here: with the CPU running ahead, the next all-gather is already issued as early as the limiter allows (it matters for CPU-bound runs)".into());
    }
    if plan.parallel.sharding == crate::plan::Sharding::None
        && plan.dp > 1
        && plan.training.grad_accum > 1
        && plan.pipeline() == 1
    {
        assumptions.push("DDP with gradient accumulation: earlier micro-batches run under no_sync(); gradients are all-reduced in the last micro-batch's backward".into());
    }
    let gpus = plan.gpus;
    Report {
        scenario: s.name.clone(),
        description: s.description.clone(),
        model_source: s.model_source.clone(),
        stepsim_version: env!("CARGO_PKG_VERSION"),
        job: "train",
        model: to_json(&s.model),
        param_count: params,
        param_count_human: human_count(params),
        active_param_count: dag.config.moe.as_ref().map(|_| dag.config.active_param_count()),
        trainable_params: if dag.lora.is_some() { dag.trainable_params() } else { params },
        lora: dag.lora.as_ref().map(to_json),
        hardware: to_json(&s.cluster),
        capacity: Bytes::new(cap),
        parallel: to_json(&s.parallel),
        training: to_json(&s.training),
        rank_classes: vec![RankClass {
            ranks: if gpus == 1 { "0".into() } else { format!("0-{}", gpus - 1) },
            count: gpus,
            note: "identical programs (data-parallel replicas / FSDP shards): simulated once".into(),
            stage: None,
            rank: None,
            expert_rank: None,
        }],
        headline_class: 0,
        model_state_per_gpu: msr,
        verdict,
        peak,
        phase_peaks,
        steps,
        throughput,
        checkpointing_cost: None,
        explanation: None,
        assumptions,
        allocator: allocator::build(s, sched, trace),
        offload: None,
        routing: None,
        fp8: fp8_report(s, dag, plan),
        activation_offload: activation_offload_report(dag, plan),
        offload_fits: {
            let (host, nvme) = plan.offload_fits(u64::from(s.cluster.gpus_per_node));
            host && nvme
        },
        inference: None,
    }
}

/// What offload moves where, and what it buys and costs.
#[derive(Debug, Clone, Serialize)]
pub struct OffloadReport {
    /// The framework's name for it, e.g. "DeepSpeed ZeRO-Infinity (offload_optimizer = nvme,
    /// offload_param = cpu)".
    pub mode: String,
    /// Where the optimizer partition and the parameters live: "cpu" | "nvme" | "gpu".
    pub optimizer_on: String,
    pub parameters_on: String,
    /// What the host holds, in words, and piece by piece (per GPU; held for the whole run).
    pub host_holds: String,
    pub host_parts: Vec<HostPart>,
    /// GPU processes sharing a node's host memory and NVMe.
    pub gpus_per_node: u32,
    /// This GPU's offloaded bytes on the host (pinned): FP32 gradient partition, and the
    /// optimizer partition and parameters where they are on the CPU, NVMe swap buffers.
    pub host_bytes_per_gpu: Bytes,
    /// Those of every GPU of a node, against the node's memory.
    pub host_bytes_per_node: Bytes,
    pub host_capacity: Bytes,
    pub host_fits: bool,
    /// This GPU's bytes on NVMe, every GPU's of a node, the node's NVMe capacity.
    pub nvme_bytes_per_gpu: Bytes,
    pub nvme_bytes_per_node: Bytes,
    pub nvme_capacity: Bytes,
    pub nvme_fits: bool,
    /// Per steady step: gradient partitions to the host (FP32, every micro-batch); parameters
    /// to the GPU (the updated partition once, or every partition before each all-gather
    /// when parameters are offloaded); NVMe reads and writes.
    pub d2h_bytes_per_step: Bytes,
    pub h2d_bytes_per_step: Bytes,
    pub nvme_read_bytes_per_step: Bytes,
    pub nvme_write_bytes_per_step: Bytes,
    pub d2h_gb_per_s: f64,
    pub h2d_gb_per_s: f64,
    /// NVMe bandwidth per GPU (the node's shared by its GPUs).
    pub nvme_read_gb_per_s: f64,
    pub nvme_write_gb_per_s: f64,
    pub cpu_adam_s: f64,
    pub cpu_adam_params_per_s: f64,
    /// Model state per GPU without offload less with it.
    pub gpu_memory_saved: Bytes,
    /// Steady-state step time without offload (memory unbounded) and with it.
    pub step_time_without_s: Option<f64>,
    pub step_time_with_s: Option<f64>,
}

/// One piece of the host memory a GPU's process pins for offload.
#[derive(Debug, Clone, Serialize)]
pub struct HostPart {
    pub what: String,
    /// The memory category's key, as in memory.csv.
    pub category: String,
    pub bytes_per_gpu: Bytes,
}

/// The memory side of a report, whatever the job: the verdict against `cap` (with what was
/// live at an OOM), the peak and its breakdown, and the peak of each (step, phase).
pub fn memory_side(cap: u64, sched: &Schedule, trace: &Trace) -> (Verdict, Option<Peak>, Vec<PhasePeak>) {
    let prog = &sched.program;
    let verdict = match &trace.oom {
        None => {
            // What must fit is what the allocator reserved (= allocated for the exact model).
            let peak = trace.timeline.peak_reserved().map_or(0, |p| p.reserved.max(p.allocated));
            Verdict::Fits { headroom: Bytes::new(cap.saturating_sub(peak)) }
        }
        Some(o) => {
            let mut live = [0u64; Category::COUNT];
            for &b in &o.live {
                let spec = &prog.buffers[b as usize];
                live[spec.category.index()] += spec.bytes.div_ceil(512) * 512;
            }
            // The 8 largest (ties by name): selected, then sorted, before any name is copied.
            let key = |b: &u32| {
                let spec = &prog.buffers[*b as usize];
                (std::cmp::Reverse(spec.bytes), prog.names[spec.name as usize].as_str())
            };
            let mut ids = o.live.clone();
            if ids.len() > 8 {
                ids.select_nth_unstable_by(7, |a, b| key(a).cmp(&key(b)));
                ids.truncate(8);
            }
            ids.sort_by(|a, b| key(a).cmp(&key(b)));
            let largest = ids.iter().map(|&b| {
                let spec = &prog.buffers[b as usize];
                (prog.names[spec.name as usize].clone(), spec.bytes)
            });
            let spec = &prog.buffers[o.buffer as usize];
            Verdict::Oom(Box::new(Oom {
                at: instant(sched, o.task as usize, o.time_ns),
                tensor: prog.names[spec.name as usize].clone(),
                requested: Bytes::new(o.error.requested),
                allocated: Bytes::new(o.error.allocated),
                capacity: Bytes::new(o.error.capacity),
                // Free device memory, as cudaMemGetInfo reports it: not reserved by the allocator.
                free: Bytes::new(o.error.capacity.saturating_sub(o.error.reserved)),
                live_by_category: breakdown(&live),
                largest_live: largest.into_iter().map(|(n, b)| (n, Bytes::new(b))).collect(),
            }))
        }
    };
    let peak = trace.timeline.peak().zip(trace.timeline.peak_bytes()).map(|(p, (allocated, reserved))| Peak {
        at: instant(sched, p.task, p.time_ns),
        allocated: Bytes::new(allocated),
        reserved: Bytes::new(reserved),
        breakdown: breakdown(&p.by_category),
    });
    // Peak of each (step, phase): (step, phase, allocated, label of the first task at it),
    // the op's name copied once at the end.
    let mut peaks: Vec<(u32, Phase, u64, u32)> = Vec::new();
    for smp in trace.timeline.marks() {
        let li = prog.tasks[smp.task as usize].label;
        let l = &sched.labels[li as usize];
        match peaks.iter_mut().rev().find(|p| p.0 == l.step && p.1 == l.phase) {
            Some(p) if p.2 >= smp.allocated => {}
            Some(p) => (p.2, p.3) = (smp.allocated, li),
            None => peaks.push((l.step, l.phase, smp.allocated, li)),
        }
    }
    peaks.sort_by_key(|p| (p.0, p.1));
    let phase_peaks = peaks
        .into_iter()
        .map(|(step, phase, allocated, li)| PhasePeak {
            step,
            phase,
            allocated: Bytes::new(allocated),
            op: sched.labels[li as usize].what.clone(),
        })
        .collect();
    (verdict, peak, phase_peaks)
}

/// Each step's span on the clock, by step (None for a step none of whose tasks ran): a step
/// lasts from the end of the one before (the training loop's period: the next step's early
/// work, e.g. a pipeline stage that finished first, or a parameter all-gather left to the
/// next forward, may start before every rank has finished) to its own last task's end; the
/// first step from its first task.
pub(crate) fn step_spans(plan: &Plan, sched: &Schedule, trace: &Trace) -> Vec<Option<(u64, u64)>> {
    let mut first_last = vec![(u64::MAX, 0u64); plan.training.steps as usize];
    crate::job::run::step_extents(sched, &trace.start_ns, &trace.end_ns, &mut first_last);
    let mut prev_end: Option<u64> = None;
    first_last
        .into_iter()
        .map(|(first, last)| {
            if first == u64::MAX {
                return None;
            }
            let start = prev_end.unwrap_or(first);
            prev_end = Some(last);
            Some((start, last))
        })
        .collect()
}

/// `flops` a GPU does per step over what its peak for the policy's compute dtype does in
/// `step_time_s`: MFU with the model's FLOPs, HFU with the hardware's (unrounded).
pub(crate) fn utilisation(s: &Scenario, plan: &Plan, flops: f64, step_time_s: f64) -> f64 {
    flops / (step_time_s * s.cluster.peak_flops(plan.training.precision.compute))
}

/// Multi-token prediction as simulated (`model::dag` `mtp_modules`).
fn mtp_assumption(dag: &LayerDag, m: &crate::model::MtpConfig, dualpipe: bool) -> String {
    let cfg = &dag.config;
    let tokens = dag.tokens();
    let logits = tokens * (cfg.vocab / dag.workload.split.tensor.max(1)) * dag.workload.compute_dtype.bytes();
    // roll_tensor under context parallelism: each rank's two sequence chunks swap their
    // boundary token with the neighbouring ranks (multi_token_prediction.py).
    let cp = match dag.workload.split.context.max(1) {
        1 => String::new(),
        c => format!(
            "; under context parallelism ({c} ranks) each module runs on this rank's share of the tokens, and roll_tensor's point-to-point exchange of the sequence chunks' boundary ids, labels and mask (one element per chunk) is not charged"
        ),
    };
    format!(
        "multi-token prediction (Megatron-Core MultiTokenPredictionBlock, DeepSeek-V3 Sec. 2.2): {d} module{s} after the decoder's final norm on the last pipeline stage (its last virtual stage), each the shared embedding of the tokens rolled k places, enorm and hnorm, eh_proj (2h -> h) over their concatenation, a transformer layer of the last block's kind and a final norm; the D + 1 hidden states concatenated (torch.cat) for the heads, then per depth the shared output head ({logits} of 16-bit logits a micro-batch), the loss ({loss}) and the acceptance argmax, before the main head; it checkpoints with the decoder's layers under Megatron's uniform full recompute and not under block recompute, as MultiTokenPredictionLayer does; {copy}; the rolled label and mask copies (tokens x 8 bytes) are not charged and the loss scale ({scale}) changes no memory or time; MFU counts its FLOPs from the DAG, as num_floating_point_operations counts its layers, eh_proj and logits{cp}",
        d = m.layers,
        s = if m.layers == 1 { "" } else { "s" },
        logits = fmt_bytes(logits),
        loss = dag.workload.loss.name(),
        copy = if dualpipe {
            "under DualPipe the ranks holding the head hold the embedding too and share it (DeepSeek-V3 Sec. 3.2.3)".to_string()
        } else {
            format!(
                "with a pipeline the last stage keeps a copy of the word embedding ({} elements) whose gradient is all-reduced with the first stage's",
                text::sep(dag.embedding_copy_params())
            )
        },
        scale = m.loss_scale,
    )
}

/// Step time, tokens/s, MFU and HFU of a step timing; `model_flops` and `hw_flops` are per
/// GPU per step.
pub fn throughput_of(
    s: &Scenario,
    plan: &Plan,
    model_flops: f64,
    hw_flops: f64,
    st: &StepTiming,
    steps: &[StepTiming],
) -> Throughput {
    let peak_flops = s.cluster.peak_flops(plan.training.precision.compute);

    let tokens = s.tokens_per_step();
    let gpus = plan.gpus as f64;
    let mfu = utilisation(s, plan, model_flops, st.time_s);
    let hfu = utilisation(s, plan, hw_flops, st.time_s);
    Throughput {
            step_time_s: st.time_s,
            tokens_per_step: tokens,
            tokens_per_s: tokens as f64 / st.time_s,
            tokens_per_s_per_gpu: tokens as f64 / st.time_s / gpus,
            mfu: round4(mfu),
            hfu: round4(hfu),
            model_flops_per_step_per_gpu: model_flops,
            verdict: throughput_verdict(st, mfu),
            jitter: s.jitter.as_ref().and_then(|_| jitter_stats(steps)),
            assumptions: vec![
                match (&s.workload.fp8, s.cluster.gpu.fp8_flops) {
                    (Some(_), Some(fp8)) => format!(
                        "peak {:.0} TFLOP/s dense {} ({}); FP8 GEMMs at the {:.0} TFLOP/s dense FP8 peak; MFU and HFU against the {} peak, as NeMo and torchtitan report FP8 runs",
                        peak_flops / 1e12,
                        plan.training.precision.compute.name(),
                        s.cluster.gpu.source,
                        fp8 / 1e12,
                        plan.training.precision.compute.name()
                    ),
                    _ => format!("peak {:.0} TFLOP/s dense {} ({})", peak_flops / 1e12, plan.training.precision.compute.name(), s.cluster.gpu.source),
                },
                format!(
                    "matmuls at {:.0}% (the global fit of src/schedule/cost.rs) of the GEMM kernel's steady rate, {:.1}% of peak ({:.1}% best achievable matmul x {:.3}, {}) = {:.0}% of peak, {}, {}, memory-bound ops at {:.0}% of {:.2} TB/s HBM, {:.0} us per op",
                    crate::schedule::cost::MATMUL_EFFICIENCY * 100.0,
                    crate::schedule::cost::gemm_steady_share(s.cluster.gpu.max_matmul_fraction) * 100.0,
                    s.cluster.gpu.max_matmul_fraction * 100.0,
                    crate::schedule::cost::GEMM_STEADY_OVER_CEILING,
                    if s.cluster.gpu.name == crate::schedule::cost::GEMM_TABLE_GPU {
                        "OpenXLA's measured H100 table over the H100's ceiling"
                    } else {
                        "the ratio OpenXLA's measured H100 table gives over the H100's ceiling, carried to this GPU: an assumption, no table for it"
                    },
                    crate::schedule::cost::MATMUL_EFFICIENCY
                        * crate::schedule::cost::gemm_steady_share(s.cluster.gpu.max_matmul_fraction)
                        * 100.0,
                    match s.cluster.gpu.sms {
                        0 => format!(
                            "each GEMM kernel {:.2} us fixed and {} more K per tile, no waves or split-K (the GPU's SM count is not given)",
                            crate::schedule::cost::GEMM_KERNEL_FIXED_S * 1e6,
                            crate::schedule::cost::GEMM_TILE_K_OVERHEAD
                        ),
                        sms => format!(
                            "each GEMM kernel by its shape, fitted on the H100 table: {}x{} output tiles in waves over {sms} SMs, {} more K per tile, {:.2} us fixed, split-K up to {} for grids short of the SMs (a matmul's input- and weight-gradient GEMMs by their own shapes)",
                            crate::schedule::cost::GEMM_TILE.0,
                            crate::schedule::cost::GEMM_TILE.1,
                            crate::schedule::cost::GEMM_TILE_K_OVERHEAD,
                            crate::schedule::cost::GEMM_KERNEL_FIXED_S * 1e6,
                            crate::schedule::cost::GEMM_SPLIT_K_MAX,
                        ),
                    },
                    attention_rate_text(s),
                    crate::schedule::cost::HBM_EFFICIENCY * 100.0,
                    s.cluster.gpu.hbm_bytes_per_s / 1e12,
                    crate::schedule::cost::OP_OVERHEAD_S * 1e6
                ),
                kernel_stack_text(&s.workload, &s.model),
                format!(
                    "optimizer step{}: memory-bound, {} B per local element at the same HBM rate: {}",
                    if plan.parallel.offload.is_some() { " (when not offloaded to the CPU)" } else { "" },
                    plan.optimizer_step_bytes(),
                    plan.optimizer_step_passes()
                        .iter()
                        .map(|(what, b)| format!("{what} {b} B"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                format!(
                    "collectives: NCCL rings, {:.0}% of {:.0} GB/s NVLink inside a node; across nodes {:.0}% of the node's NICs ({:.1} GB/s per GPU) on per-rail rings (efficiencies from nccl-tests busbw; across nodes by the node's fabric: InfiniBand NDR {:.0}%, NCCL's maintainer in nccl-tests#290; EFA's measured {:.0}% elsewhere); inside one node the fastest of NCCL's ring protocols for the size, at its tuner's latencies and link shares (tuning.cc: LL {:.1} + {:.1} us per step at half the link{}, LL128 {:.0} + {:.1} us per step at {:.0}%, Simple {:.1} + {:.1} us per step{}); rings across nodes on the Simple protocol at its tuner's latencies: {:.1} us plus {:.1} us per step on NVLink and {:.0} us per step that crosses nodes (nodes - 1 of them per pass of the ring), an all-reduce's times {:.1} (tuning.cc's \"plateau effect of ring\"); all-reduces of at most 64 KiB across nodes on NCCL's tree with the LL protocol where it is faster (its tuning.cc latencies)",
                    crate::net::LINK_EFFICIENCY * 100.0,
                    s.cluster.gpu.nvlink_bytes_per_s / 1e9,
                    crate::schedule::cost::nic_efficiency(&s.cluster) * 100.0,
                    s.cluster.network_bytes_per_s() / 1e9,
                    crate::net::IB_NDR_EFFICIENCY * 100.0,
                    crate::net::NETWORK_EFFICIENCY * 100.0,
                    crate::net::LL_BASE_S * 1e6,
                    crate::net::LL_HOP_S * 1e6,
                    {
                        let node = crate::schedule::cost::group_on(&s.cluster, 2, 2);
                        if node.ll_cap_binds() {
                            format!(
                                " and at most {:.1} GB/s of bus bandwidth (its llMaxBws for this generation)",
                                node.ll_max_bytes_per_s / 1e9
                            )
                        } else {
                            String::new()
                        }
                    },
                    crate::net::LL128_BASE_S * 1e6,
                    crate::net::LL128_HOP_S * 1e6,
                    crate::net::LL128_BANDWIDTH_FRACTION * 100.0,
                    crate::net::SIMPLE_BASE_S * 1e6,
                    crate::net::SIMPLE_NVLINK_HOP_S * 1e6,
                    if s.cluster.nvls() {
                        let cc = s.cluster.gpu.arch.compute_capability();
                        let scale = crate::net::nvls_rate_scale(s.cluster.gpu.nvlink_bytes_per_s, cc);
                        let rates: Vec<String> = crate::net::NVLS_BY_CHUNK
                            .iter()
                            .map(|&(c, _, bus)| format!("{} KiB {:.0}", c >> 10, bus * scale / 1e9))
                            .collect();
                        format!(
                            "; all-reduces of {} or more GPUs of a node on NVLink SHARP (NCCL's NVLS) where faster: {:.0} us (tuning.cc) plus a latency and a bus bandwidth by the chunk NCCL cuts the buffer into (enqueue.cc; {} channels) as measured by nccl-tests on 8 H100 ({} GB/s){}",
                            crate::net::nvls_min_ranks(cc),
                            crate::net::NVLS_LATENCY_S * 1e6,
                            crate::net::nvls_channels(cc),
                            rates.join(", "),
                            if (scale - 1.0).abs() > 1e-9 {
                                format!(", here scaled by {scale:.2} for this GPU's NVLink and NCCL's NVLS efficiency (an assumption)")
                            } else {
                                String::new()
                            }
                        )
                    } else if s.cluster.nvls_capable() {
                        "; NVLink SHARP (NCCL's NVLS) off ([nccl] nvls = false): every all-reduce on rings".to_string()
                    } else {
                        String::new()
                    },
                    crate::net::SIMPLE_BASE_S * 1e6,
                    crate::net::SIMPLE_NVLINK_HOP_S * 1e6,
                    crate::net::SIMPLE_NET_HOP_S * 1e6,
                    crate::net::ring_plateau(s.cluster.gpu.arch.compute_capability())
                ),
                {
                    let (intra, inter) = crate::schedule::cost::collective_ctas(&s.cluster);
                    format!(
                        "collectives beside compute: an NCCL kernel holds a thread block per ring channel on the SMs while it runs ({intra} channels inside a node, {inter} across nodes: NCCL's topology search, a ring per NIC doubled), and compute it overlaps runs on the SMs left, e.g. {:.0}% of its rate beside one collective inside a node ({} SMs; measured on H100: an all-gather's 24 blocks beside a GEMM, NVIDIA developer forum thread 337991); collectives' blocks add up to at most half the SMs; pipelined sequence-parallel transfers and point-to-point sends hold none",
                        100.0 * (1.0 - intra as f64 / f64::from(s.cluster.gpu.sms)),
                        s.cluster.gpu.sms
                    )
                },
                if let Some(l) = &s.workload.lora {
                    let qlora = if matches!(l.base, crate::model::WeightFormat::Nf4 { .. }) {
                        ". QLoRA: each NF4 block linear is dequantized to 16 bits by a kernel of its own before its forward GEMM and again before its input-gradient GEMM (bitsandbytes MatMul4Bit), at the memory-bound rate above, its time added to the GEMM's"
                    } else {
                        ""
                    };
                    let pr = &s.training.precision;
                    let stream = if l.fp32_stream() {
                        format!(". prepare_model_for_kbit_training left the embeddings, norms and head in fp32, so the hidden states run in fp32 through every block (bitsandbytes' Linear4bit returns its input's dtype): norms, rotary, the MLP's activations and the residual adds move 4-byte elements; each 4-bit linear casts its input to {c} and its output back (a kernel each way, and their gradients back), autocast casts q, k and v to {c} for SDPA and each adapter's input for lora_A (a fresh copy lora_A keeps), and the head's fp32 weight to {c} for every forward (kept until its backward)", c = pr.compute.name())
                    } else {
                        String::new()
                    };
                    let casts = if s.dag_workload().lora.is_some_and(|l| l.input_casts.is_some()) {
                        format!(
                            ". The {} adapters are held whole: PEFT casts each adapter's input to {} (_cast_input_dtype) and autocast casts it back to {} for lora_A's matmul, two kernels each way per targeted linear at the memory-bound rate, and lora_A keeps its own {} copy",
                            pr.param.name(),
                            pr.param.name(),
                            pr.compute.name(),
                            pr.compute.name()
                        )
                    } else {
                        String::new()
                    };
                    format!("MFU counts the FLOPs a LoRA step needs: forward (base + adapters) plus backward without the frozen weights' gradient GEMMs (input gradients and the adapters' own); HFU adds recomputation. PEFT's adapters run their own memory-bound kernels beside the GEMMs: `* scaling` and the sum with the base's output each way{}, and lora_dropout's where set{qlora}{stream}{casts}", if matches!(l.base, crate::model::WeightFormat::Nf4 { .. }) { ", bitsandbytes' defensive clone of the 4-bit base's output (PEFT's bnb.py)" } else { "" })
                } else {
                    "MFU counts model FLOPs = 3 x forward FLOPs of the DAG (2 per multiply-add, attention included), per Narayanan et al. 2021; HFU adds recomputation".into()
                },
            ],
        }
}

/// Thresholds of the throughput verdict: about 50% MFU "is considered a win" for large
/// models (stas00 ml-engineering, `compute/accelerator/benchmarks/README.md`); below 30% or
/// with more than 15% of the step waiting on communication the configuration is leaving
/// most of its GPUs' time unused.
pub const MFU_ACCEPTABLE: f64 = 0.30;
pub const EXPOSED_COMM_ACCEPTABLE: f64 = 0.15;

/// "How fast", kept apart from "does it fit".
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputVerdict {
    /// "compute-bound", "communication-bound", "host-bound" (offload's host work: the CPU
    /// optimizer step, PCIe copies, NVMe) or "overhead-bound".
    pub bound: &'static str,
    pub acceptable: bool,
    pub exposed_comm_fraction: f64,
    pub exposed_host_fraction: f64,
    pub mfu: f64,
    pub reason: String,
}

pub fn throughput_verdict(st: &StepTiming, mfu: f64) -> ThroughputVerdict {
    let exposed = st.exposed_comm_s / st.time_s.max(1e-12);
    let host = st.exposed_host_s / st.time_s.max(1e-12);
    let idle = st.idle_s / st.time_s.max(1e-12);
    // The largest wait past the threshold names the bound.
    let bound = if host > EXPOSED_COMM_ACCEPTABLE && host >= exposed && host >= idle {
        "host-bound"
    } else if exposed > EXPOSED_COMM_ACCEPTABLE && exposed >= idle {
        "communication-bound"
    } else if idle > EXPOSED_COMM_ACCEPTABLE {
        "overhead-bound"
    } else {
        "compute-bound"
    };
    let acceptable = mfu >= MFU_ACCEPTABLE && exposed <= EXPOSED_COMM_ACCEPTABLE && host <= EXPOSED_COMM_ACCEPTABLE;
    let cmp = |x: f64| if x <= EXPOSED_COMM_ACCEPTABLE { "<=" } else { ">" };
    let mut reason = format!(
        "MFU {:.1}% ({} {:.0}%), {:.1}% of the step waits on communication ({} {:.0}%)",
        mfu * 100.0,
        if mfu >= MFU_ACCEPTABLE { ">=" } else { "<" },
        MFU_ACCEPTABLE * 100.0,
        exposed * 100.0,
        cmp(exposed),
        EXPOSED_COMM_ACCEPTABLE * 100.0
    );
    if st.host_busy_s > 0.0 {
        reason +=
            &format!(", {:.1}% on host work ({} {:.0}%)", host * 100.0, cmp(host), EXPOSED_COMM_ACCEPTABLE * 100.0);
    }
    ThroughputVerdict {
        bound,
        acceptable,
        exposed_comm_fraction: round4(exposed),
        exposed_host_fraction: round4(host),
        mfu: round4(mfu),
        reason,
    }
}

/// Phase spans of the compute stream, for shading plots: (step, phase, start_ns, end_ns).
pub fn phase_spans(sched: &Schedule, trace: &Trace) -> Vec<(u32, Phase, u64, u64)> {
    let mut spans: Vec<(u32, Phase, u64, u64)> = Vec::new();
    for (i, t) in sched.program.tasks.iter().enumerate() {
        let l = &sched.labels[t.label as usize];
        if trace.start_ns[i] == u64::MAX || l.kind.is_comm() && l.kind != TaskKind::AllGather {
            continue;
        }
        let end = if trace.end_ns[i] == u64::MAX { trace.start_ns[i] } else { trace.end_ns[i] };
        match spans.last_mut() {
            Some(last) if last.0 == l.step && last.1 == l.phase => {
                last.2 = last.2.min(trace.start_ns[i]);
                last.3 = last.3.max(end);
            }
            _ => spans.push((l.step, l.phase, trace.start_ns[i], end)),
        }
    }
    spans
}

/// The assumption line stating FSDP2's own buffers ([`crate::plan::Framework::fsdp2_buffers`]
/// cites the source).
fn fsdp2_assumption(plan: &crate::plan::Plan) -> Option<String> {
    if !plan.parallel.framework.fsdp2_buffers() {
        return None;
    }
    let pr = &plan.training.precision;
    let post_forward = match plan.parallel.post_forward_shard {
        Some(n) => format!("; reshard_after_forward = {n}: after its forward each block keeps 1/{n} of its parameters (_to_sharded_post_forward), all-gathered over those {n} ranks for its backward"),
        None => String::new(),
    };
    Some(format!(
        "FSDP2 buffers (PyTorch 2.15 fully_shard): each all-gather writes one flat {c} output, allocated when issued on the all-gather copy-in stream, which the unit's pre-forward / pre-backward copies out into its unsharded parameters (both live during the copy; in forward the next unit's all-gather is issued after this copy-out, in backward the prefetch after the unit's own copy-out); autograd computes unsharded gradients in {c} (param_dtype); each post-backward copies them into one flat {g} reduce-scatter input (reduce_dtype) and frees them, and that input is kept until the next unit's post-backward, which first waits for its reduce-scatter (reduce_scatter_max_input_buffers = 1){post_forward}",
        c = pr.compute.name(),
        g = pr.grad.name()
    ))
}

/// The assumption line stating FSDP1's own buffers ([`crate::plan::Framework::fsdp1_buffers`]
/// cites the source).
fn fsdp1_assumption(plan: &crate::plan::Plan) -> Option<String> {
    if !plan.parallel.framework.fsdp1_buffers() {
        return None;
    }
    let pr = &plan.training.precision;
    let (c, g) = (pr.compute.name(), pr.grad.name());
    let no_shard = plan.parallel.framework.fsdp1_no_shard(plan.parallel.sharding);
    let mp_shard = match (pr.param != pr.compute, no_shard) {
        (true, false) => {
            format!("each all-gather sends this rank's shard cast to {c} (_mp_shard, freed when the all-gather ends); ")
        }
        (true, true) => format!("NO_SHARD: each unit's pre-forward and pre-backward cast its FP32 flat parameter to {c} (_mp_shard, the unsharded parameter), freed at every reshard, the root's after forward too; "),
        (false, true) => "NO_SHARD: units run on their parameters as stored; ".to_string(),
        (false, false) => String::new(),
    };
    let cast = if no_shard {
        format!(", casts it to {g} (reduce_dtype) and all-reduces that copy in place on the post-backward stream; the copy stays as the unit's gradient, the {c} one lives until the all-reduce ends")
    } else if pr.grad != pr.compute {
        format!(", casts it to {g} (reduce_dtype) on the post-backward stream and reduce-scatters that copy; both flat copies live until the reduce-scatter ends")
    } else {
        ", and reduce-scatters it; it lives until the reduce-scatter ends".to_string()
    };
    let accumulate = if plan.pipeline() > 1 {
        " (a pipeline stage's gradients, accumulated over its micro-batches, keep the generic model: unsharded, in the policy's gradient dtype, reduced once)"
    } else if plan.parallel.no_sync {
        " (under no_sync() every micro-batch but the last returns before the cast: the flat gradients accumulate in param_dtype, autograd adding each micro-batch's into them, until the last one casts and reduces them)"
    } else {
        ""
    };
    let orig = match plan.units.iter().any(|u| u.flat_frozen > 0) {
        true => "use_orig_params=True, each block's frozen base and its LoRA adapters in one FlatParameter (wrap = \"block\"): the FlatParameter requires grad, so autograd computes the frozen weights' gradients (their weight-gradient GEMMs, the inputs they save) and FSDP1 reduces and keeps them with the adapters', as if nothing were frozen (the FullyShardedDataParallel docstring's warning, pytorch#104967); only the optimizer, which never receives them, holds no state for them",
        false if plan.parallel.use_orig_params => "use_orig_params=True: the original parameters are views into the FlatParameter, the same bytes",
        false => "use_orig_params=False",
    };
    Some(format!(
        "FSDP1 buffers (PyTorch 2.15 FullyShardedDataParallel, {orig}): {mp_shard}autograd computes the unit's gradients in {c} (views of the unsharded FlatParameter) and concatenates them into one flat {c} gradient of the whole unit when the last one exists (SplitWithSizesBackward); the post-backward hook then reshards the unit{cast}{accumulate}; no limit on reductions in flight, so a comm-bound backward holds several units' flat gradients"
    ))
}

/// The assumption line stating Megatron-LM's communication schedule and overlap flags
/// (src/schedule/megatron.rs cites the source).
fn megatron_assumption(plan: &crate::plan::Plan) -> Option<String> {
    use crate::plan::{Framework, Sharding};
    if plan.parallel.framework != Framework::Megatron {
        return None;
    }
    let mg = plan.parallel.megatron;
    let zero1 = plan.parallel.sharding == Sharding::Zero1;
    let coll = if zero1 { "reduce-scattered (distributed optimizer)" } else { "all-reduced" };
    let grads = match mg.bucket_elements(plan.dp, 0) {
        Some(b) => format!(
            "--overlap-grad-reduce: gradients {coll} in buckets of {b} {} elements ({}) as the last micro-batch's backward completes each{}",
            plan.training.precision.grad.name(),
            if mg.bucket_size.is_some() { "--ddp-bucket-size" } else { "max(4e7, 1e6 x data-parallel size)" },
            if plan.pipeline() > 1 { ", one bucket per model chunk on stages after the first" } else { "" }
        ),
        None => format!("gradients {coll} as one bucket after the backward (finalize_model_grads; --overlap-grad-reduce off)"),
    };
    let params = match (zero1, mg.overlap_param_gather) {
        (false, _) => String::new(),
        (true, true) => "; --overlap-param-gather: the updated parameters are all-gathered bucket by bucket during the next step's first forward, one bucket in flight, each waited for at its first module".into(),
        (true, false) => "; the updated parameters are all-gathered after the optimizer step (--overlap-param-gather off)".into(),
    };
    let tp = if mg.tp_comm_overlap {
        format!("; --tp-comm-overlap: each sequence-parallel all-gather / reduce-scatter is split into {} chunks pipelined with its GEMM (Transformer Engine userbuffers), the pair taking max(GEMM, comm) + min(GEMM, comm) / {}; no slowdown of the GEMM by the communication's SMs is modelled", plan.parallel.model_parallel.tensor, plan.parallel.model_parallel.tensor)
    } else {
        String::new()
    };
    let ep = if mg.overlap_moe_expert_parallel_comm {
        format!(
            "; --overlap-moe-expert-parallel-comm: combined 1F1B (Megatron-Core combined_1f1b.py, TransformerLayerSchedulePlan.run): each steady-state forward runs beside {} backward, forward layer i with backward layer n - 1 - i of the chunk, so one pass's token all-to-alls run while the other computes (comm: combine bwd | dispatch fwd, dispatch bwd | combine fwd; compute: attention fwd | experts bwd, experts fwd | attention bwd){}",
            if plan.pipeline() > 1 { "the backward after it in the interleaved order" } else { "the previous micro-batch's" },
            if plan.pipeline() > 1 { ", with one warm-up forward more" } else { "; the first forward and the last backward run alone" }
        )
    } else {
        String::new()
    };
    Some(format!("Megatron-LM (Megatron-Core 0.8 DistributedDataParallel): {grads}{params}{tp}{ep}"))
}

/// The assumption line naming DeepSpeed's own buffers and their sizes, when its optimizer
/// wrappers are in use (src/schedule/deepspeed.rs cites the source of each).
fn deepspeed_assumption(plan: &crate::plan::Plan) -> Option<String> {
    use crate::plan::{DeepspeedOptimizer, Sharding};
    let which = plan.deepspeed_optimizer()?;
    let ds = plan.parallel.deepspeed;
    let pr = &plan.training.precision;
    let part = plan.local_total(true);
    let pipeline = plan.pipeline() > 1;
    let kept = match (pipeline, plan.parallel.model_parallel.tensor > 1) {
        (true, true) => "; pipeline stage outputs kept until their backward (PipelineEngine pipe_buffers), split over tensor parallelism (PartitionedTensor, 1/TP each) and rebuilt whole for the backward",
        (true, false) => "; pipeline stage outputs kept until their backward (PipelineEngine pipe_buffers)",
        _ => "",
    };
    let kept = format!("{kept}; {}", deepspeed_init_clause(plan, which));
    let line = match which {
        DeepspeedOptimizer::ZeroStage12 => format!(
            "DeepSpeed {}: IPG bucket {} (reduce_bucket_size {:e} elements x {} B{}, contiguous_gradients={}), live {}; {}the step flattens the gradient partition and casts it to FP32 (single_grad_partition {}{}){}",
            which.name(),
            fmt_bytes(ds.ipg_bytes(pr.param)),
            ds.reduce_bucket_size as f64,
            pr.param.bytes(),
            if ds.overlap_comm { " x 2, overlap_comm" } else { "" },
            ds.contiguous_gradients,
            if pipeline {
                "during the reduction after the last backward (reduce_gradients(pipeline_parallel=True))"
            } else if plan.parallel.sharding == Sharding::Zero1 {
                "from the step's first backward to the reduction at the accumulation boundary"
            } else {
                "through each micro-batch's backward and its reduction"
            },
            if plan.parallel.sharding == Sharding::Zero1 {
                "ZeRO-1's epilogue keeps the rank's gradient partition and frees the full 16-bit gradients; "
            } else {
                ""
            },
            fmt_bytes(part * 4),
            if pr.grad.bytes() < 4 {
                format!(", through a {} flattened {} copy", fmt_bytes(part * pr.grad.bytes()), pr.grad.name())
            } else {
                String::new()
            },
            kept,
        ),
        DeepspeedOptimizer::ZeroStage3 => format!(
            "DeepSpeed {}: from initialisation, the gradient partitions {} (grad_partitions_flat_buffer, {}), the IPG bucket {} (reduce_bucket_size {:e} elements x {} B, contiguous_gradients={}; each gradient is copied into it as autograd produces it and freed) and the FP32 gradient of the largest optimizer sub-group {} (min(partition, sub_group_size {:e}) elements x 4 B, initialize_optimizer_states); {}{}",
            which.name(),
            fmt_bytes(part * pr.grad.bytes()),
            pr.grad.name(),
            fmt_bytes(ds.stage3_ipg_bytes(pr.param)),
            ds.reduce_bucket_size as f64,
            pr.param.bytes(),
            ds.contiguous_gradients,
            fmt_bytes(ds.stage3_sub_group_elements(part) * 4),
            ds.sub_group_size as f64,
            zero3_fetch_clause(plan),
            kept,
        ),
        DeepspeedOptimizer::Fp16Optimizer => {
            let el = plan.local_total(false);
            format!(
                "DeepSpeed {}: FP32 master {} and moments of every local parameter from initialisation (fp32_groups_flat, not partitioned); the engine all-reduces the {} .grads at the accumulation boundary in flattened buckets of up to 5e8 elements ({}, buffered_allreduce_fallback); the step casts every .grad to FP32 in a list and flattens it ({} + {}), then frees the {} .grads{}",
                which.name(),
                fmt_bytes(el * 4),
                pr.grad.name(),
                fmt_bytes(el.min(crate::plan::DEEPSPEED_ALLREDUCE_BUCKET) * pr.grad.bytes()),
                fmt_bytes(el * 4),
                fmt_bytes(el * 4),
                pr.grad.name(),
                kept,
            )
        }
        DeepspeedOptimizer::Bf16Optimizer => format!(
            "DeepSpeed {}: FP32 gradient accumulation buffer of every local parameter {} from initialisation (fp32_groups_gradients_flat, not partitioned) beside the {} .grads, which every backward frees as it starts (clear_lp_grads: .grad = None) and ends by adding into the FP32 buffer through an FP32 copy of one parameter's .grad at a time (update_hp_grads), none freed at the step; FP32 gradients all-reduced in flattened buckets of up to 5e8 elements ({}, MEMORY_OPT_ALLREDUCE_SIZE); FP32 master and moments partitioned over data parallelism{}",
            which.name(),
            fmt_bytes(plan.local_total(false) * 4),
            pr.param.name(),
            fmt_bytes(plan.local_total(false).min(crate::plan::DEEPSPEED_ALLREDUCE_BUCKET) * 4),
            kept,
        ),
    };
    Some(format!("{line} (DeepSpeed {}, [deepspeed] version)", ds.version_name()))
}

/// How ZeRO-3 gathers parameters (src/schedule/zero3_fetch.rs).
fn zero3_fetch_clause(plan: &crate::plan::Plan) -> String {
    let ds = plan.parallel.deepspeed;
    if !plan.zero3_fetches_modules() {
        return "parameters gathered a block at a time, as FSDP does (DeepSpeed's module-by-module fetching is modelled without offloaded parameters, experts or LoRA only)".into();
    }
    format!(
        "each module's parameters all-gathered by its forward and backward hooks (fetch_sub_module) and released after it; from the second micro-batch, with the recorded trace, prefetched along it up to stage3_prefetch_bucket_size {:e} elements a fetch while fewer than stage3_max_live_parameters {:e} are gathered, and kept when used again within stage3_max_reuse_distance {:e} elements; parameters of at most stage3_param_persistence_threshold {:e} elements whole on every rank",
        ds.stage3_prefetch_bucket_size as f64,
        ds.stage3_max_live_parameters as f64,
        ds.stage3_max_reuse_distance as f64,
        ds.stage3_param_persistence_threshold as f64
    )
}

/// What DeepSpeed's wrapper does as it initialises, as the release in use does it
/// (src/schedule/deepspeed.rs, `deepspeed_flat_init`).
fn deepspeed_init_clause(plan: &crate::plan::Plan, which: crate::plan::DeepspeedOptimizer) -> String {
    use crate::plan::DeepspeedOptimizer;
    let ds = plan.parallel.deepspeed;
    let moments = if plan.optimizer_state_at_init() {
        "Adam's moments made at initialisation by a step on zero gradients (initialize_optimizer_states)"
    } else {
        "Adam's moments made by the first step (no step at initialisation since v0.13.2)"
    };
    let flat = match which {
        _ if !plan.deepspeed_flattens() => return moments.to_string(),
        DeepspeedOptimizer::ZeroStage3 => return moments.to_string(),
        DeepspeedOptimizer::ZeroStage12 if ds.empties_cache_after_moving_params() => {
            "the parameters moved to the CPU, empty_cache() (since v0.8.0), and flattened into one 16-bit buffer"
        }
        DeepspeedOptimizer::ZeroStage12 => {
            "the parameters moved to the CPU, their blocks left in PyTorch's cache (before v0.8.0), and flattened into one 16-bit buffer"
        }
        DeepspeedOptimizer::Bf16Optimizer => {
            "the parameters flattened into one 16-bit buffer, their own blocks then freed to PyTorch's cache"
        }
        DeepspeedOptimizer::Fp16Optimizer => {
            "clones of the parameters flattened into one 16-bit buffer, clones and originals then freed to PyTorch's cache"
        }
    };
    format!("at initialisation {flat}, the FP32 master made as partition.clone().float(), {moments}")
}

/// A CSV field, quoted when it must be (RFC 4180): a rank class of memory.csv may hold a
/// comma, and so may a sweep's axis value.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The attention kernel's rate as the report states it: a fused kernel's measured rates
/// (FlashAttention-2 where PyTorch model code runs it, or the kernel `training.attention`
/// named), the end-to-end fit for Megatron's default fused attention.
fn attention_rate_text(s: &crate::scenario::Scenario) -> String {
    use crate::model::{Attention, FlashKernel};
    use crate::schedule::flash_rates;
    let fit = crate::schedule::cost::ATTENTION_EFFICIENCY * s.cluster.gpu.max_matmul_fraction * 100.0;
    let w = &s.workload;
    let (seq, hd, arch) = (w.flash_keys(), s.model.head_dim(), s.cluster.gpu.arch);
    match (w.attention, w.timed_flash_kernel()) {
        (Attention::Math, _) if w.flash2 => format!(
            "math attention's GEMMs and passes over the scores (flash attention would run at FlashAttention-2's measured {:.0}% of peak at {seq} tokens and head dim {hd}, on the half of the causal square it computes, src/schedule/flash_rates.rs)",
            flash_rates::flash2_fraction(arch, seq, hd) * 100.0
        ),
        (Attention::Math, _) => format!(
            "math attention's GEMMs and passes over the scores (Megatron's fused flash attention would run at {fit:.0}%, the end-to-end fit ATTENTION_EFFICIENCY)"
        ),
        (Attention::Eager, _) => format!(
            "Hugging Face's eager attention: its batched GEMMs (each by the GEMM kernel model or its traffic) and unfused passes over the scores (scale, mask add, FP32 softmax between two casts; src/model/dag.rs eager_scores), the scores moved at {:.0}% of HBM bandwidth (PyTorch's standard attention on this generation, measured: the FlashAttention-2 paper's benchmark, src/schedule/scores_rates.rs)",
            crate::schedule::scores_rates::scores_hbm_efficiency(s.cluster.gpu.arch) * 100.0
        ),
        (Attention::Flash, None) => format!(
            "fused flash attention (Transformer Engine / Megatron) at {fit:.0}% of peak on the whole causal square's FLOPs (an end-to-end fit, src/schedule/cost.rs ATTENTION_EFFICIENCY)"
        ),
        (Attention::Flash, Some(FlashKernel::FlashAttention2)) => {
            let f = flash_rates::flash2_fraction(arch, seq, hd);
            let by = if w.flash_kernel.is_some() { "the kernel training.attention names" } else { "PyTorch SDPA's flash kernel" };
            format!(
                "attention by FlashAttention-2's measured rate ({by}; the FlashAttention-2 paper's causal forward + backward benchmark, src/schedule/flash_rates.rs): {:.0}% of peak at {seq} tokens and head dim {hd} on this generation, on the half of the causal square the kernel computes",
                f * 100.0
            )
        }
        (Attention::Flash, Some(k)) => {
            let (fwd, bwd) = (flash_rates::fraction(k, arch, seq, hd, false), flash_rates::fraction(k, arch, seq, hd, true));
            let name = if k == FlashKernel::Cudnn { "cuDNN's fused attention" } else { "FlashAttention-3" };
            let carried = if arch == crate::hardware::Arch::Hopper { "" } else { ", carried to this generation as shares of its peak (an assumption)" };
            format!(
                "attention by {name}'s measured rates (training.attention = \"{}\"; the FlashAttention-3 paper's H100 benchmarks, forward with the causal mask, backward without it scaled by the forward's causal share, src/schedule/flash_rates.rs{carried}): forward {:.0}% and backward {:.0}% of peak at {seq} tokens and head dim {hd}, on the half of the causal square the kernel computes",
                k.name(),
                fwd * 100.0,
                bwd * 100.0
            )
        }
    }
}

/// The kernel stack's assumption line.
fn kernel_stack_text(w: &crate::model::Workload, model: &crate::model::ModelConfig) -> String {
    use crate::model::KernelStack;
    let k = w.kernels;
    if !crate::model::eager::differs(model) {
        return format!(
            "kernels: {} (training.kernels); this family's LayerNorm, GELU and residual adds are single kernels in eager PyTorch too, so the setting changes nothing for this model (its attention kernel follows the framework)",
            k.name()
        );
    }
    let copies = if w.repeat_kv {
        "; grouped-query keys and values copied to every query head (training.repeat_kv)"
    } else {
        ""
    };
    let text = match k {
        KernelStack::Eager => {
            let c = w.compute_dtype.bytes();
            let weight = !model.style.weightless_norms;
            let (norm, rope) = (crate::model::eager::rmsnorm(c, weight), crate::model::eager::rope(c));
            format!(
                "kernels: eager PyTorch (training.kernels = \"eager\", the default outside Megatron): RMSNorm as {} kernels forward and {} backward over an FP32 copy, which it saves{} ({:.0} and {:.0} B per element in {} bits); rotary embeddings through FP32 ({:.0} B per element each way); SiLU and the product as two kernels; {:.0} us per kernel (src/model/eager.rs)",
                norm.kernels[0],
                norm.kernels[1],
                if weight { " with the normalised output" } else { "" },
                norm.bytes[0],
                norm.bytes[1],
                8 * c,
                rope.bytes[0],
                crate::schedule::cost::OP_OVERHEAD_S * 1e6
            )
        }
        KernelStack::Compiled => "kernels: torch.compile (training.kernels = \"compiled\"): one fused kernel per norm, rotary embedding and SiLU-product, which saves the product's inputs".to_string(),
        KernelStack::Fused => "kernels: fused (training.kernels = \"fused\", the default under Megatron): one kernel per norm and rotary embedding, grouped-query attention without copies; SwiGLU one kernel under Megatron (--bias-swiglu-fusion), SiLU and the product two kernels in PyTorch model code".to_string(),
    };
    text + copies
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_verdict_separates_compute_and_communication_bound() {
        let st = |compute: f64, exposed: f64, idle: f64| StepTiming {
            step: 1,
            start_s: 0.0,
            time_s: compute + exposed + idle,
            compute_busy_s: compute,
            comm_busy_s: exposed,
            host_busy_s: 0.0,
            compute_idle_s: exposed + idle,
            recompute_s: 0.0,
            sm_contention_s: 0.0,
            exposed_comm_s: exposed,
            exposed_host_s: 0.0,
            idle_s: idle,
        };
        let v = throughput_verdict(&st(9.0, 1.0, 0.0), 0.45);
        assert!(v.acceptable && v.bound == "compute-bound");
        let v = throughput_verdict(&st(3.0, 7.0, 0.0), 0.15);
        assert!(!v.acceptable && v.bound == "communication-bound");
        let v = throughput_verdict(&st(5.0, 0.0, 5.0), 0.2);
        assert!(!v.acceptable && v.bound == "overhead-bound");
        // Offload: the compute stream waits on the CPU's optimizer step.
        let host = StepTiming { host_busy_s: 8.0, exposed_host_s: 7.0, idle_s: 0.0, ..st(3.0, 0.0, 7.0) };
        let v = throughput_verdict(&host, 0.1);
        assert!(!v.acceptable && v.bound == "host-bound", "{v:?}");
        assert!(v.reason.contains("70.0% on host work"), "{}", v.reason);
    }
}
