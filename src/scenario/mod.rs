//! Scenario files (TOML): serde types mirroring what a user's FSDP / DeepSpeed / training
//! config says, defaults, and validation with errors that name the file and the field.

mod allocator;
pub mod byte_size;
pub mod custom_gpu;
mod deepspeed;
pub mod error;
pub mod extends;
mod file;
mod fp8;
mod inference;
pub mod limits;
mod lora;
mod megatron;
mod model_source;
mod moe;
mod mtp;
pub mod nccl;
mod offload;
mod parallel;
mod recovery;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use allocator::validate_allocator;
use custom_gpu::validate_gpu;
use deepspeed::validate_deepspeed;
pub use error::ScenarioError;
pub use file::*;
use fp8::{validate_fp8, Fp8Context};
use inference::{inference_lengths, inference_standin, job_kind, validate_inference};
pub use lora::prepare_kbit_default;
use lora::validate_lora;
pub use megatron::ep_overlap_refusal;
use megatron::{check_ep_overlap, validate_megatron};
pub use moe::{deepep_for, deepep_refusal};
use moe::{validate_expert_parallel, validate_mla, validate_moe};
use mtp::{check_mtp, validate_mtp};
use offload::validate_offload;
pub use offload::*;
use parallel::{validate_context, validate_model_parallel};

use crate::hardware::{self, Cluster};
use crate::memory::{AllocatorKind, AllocatorSettings, EmptyCacheAt};
use crate::model::{Attention, Dtype, Family, FlashKernel, KernelStack, ModelConfig, Workload};
use crate::plan::{
    BackwardPrefetch, Checkpointing, Framework, ModelParallel, OptimizerImpl, OptimizerKind, ParallelConfig,
    PipelineSchedule, Precision, Sharding, TrainingConfig,
};

/// PyTorch's CUDA context with lazy module loading (the default since CUDA 11.7 / PyTorch
/// 2.0) holds about 300-500 MB outside the caching allocator (pytorch/pytorch#107667,
/// #109888); we take 512 MiB.
pub const DEFAULT_CUDA_CONTEXT: u64 = 512 << 20;

/// The CUDA context when every kernel image is loaded at start-up (`CUDA_MODULE_LOADING=EAGER`,
/// the only mode before CUDA 11.7, e.g. PyTorch 1.10-1.12 stacks): 1,573 MiB measured with
/// nvidia-smi on an A100 by BigScience (`python -c "import torch; torch.ones(1).cuda()"`,
/// bigscience train/tr11-176B-ml/chronicles-prequel.md; 1,271 MiB on a V100).
pub const EAGER_CUDA_CONTEXT: u64 = 1573 << 20;

/// The most ranks `[jitter]` simulates one by one (data-parallel ranks x pipeline stages).
pub const MAX_JITTER_RANKS: u64 = 1024;

// ---------------------------------------------------------------- validated scenario

/// A scenario that passed validation: everything downstream can trust it.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub source: PathBuf,
    /// Where `[model]` came from when not from its own fields: a zoo model or a
    /// `config.json`, with its `model_type`.
    pub model_source: Option<String>,
    pub model: ModelConfig,
    pub workload: Workload,
    pub cluster: Cluster,
    pub parallel: ParallelConfig,
    /// For an inference job, a stand-in (pure 16-bit, one step of batch x prompt_len) that
    /// only the layer DAG's shape reads; [`Scenario::inference`] holds the job.
    pub training: TrainingConfig,
    pub allocator: AllocatorSettings,
    pub jitter: Option<crate::schedule::jitter::JitterConfig>,
    /// A mixture of experts' routing (`[moe]`); uniform for every other model.
    pub routing: crate::schedule::routing::Routing,
    /// Token dropping (`[moe] capacity_factor`); None: dropless.
    pub capacity: Option<crate::schedule::routing::Capacity>,
    pub job: JobKind,
    pub inference: Option<crate::infer::InferenceConfig>,
    /// `[nccl]`: the settings NCCL's memory depends on ([`Scenario::nccl`]).
    pub nccl: crate::net::nccl_memory::NcclConfig,
}

impl Scenario {
    /// The workload its layer DAG is built from: the scenario's, with what depends on the
    /// plan filled in (autocast's copies of LoRA adapters' inputs,
    /// [`crate::model::LoraConfig::input_casts`]). Every DAG of a scenario is built from it,
    /// so a variant that changes the sharding or the precision (explain's changes, a sweep's
    /// axes) gets its own.
    pub fn dag_workload(&self) -> Workload {
        let mut w = self.workload.clone();
        if let Some(l) = w.lora.as_mut() {
            let pr = &self.training.precision;
            let half = l.base == crate::model::WeightFormat::Half;
            l.input_casts = (half && pr.autocast_casts(self.parallel.params_sharded())).then(|| pr.param.bytes());
        }
        w
    }

    /// Reads and validates a scenario file, with its chain of bases when it says
    /// `extends = "base.toml"` ([`extends`]). An invalid file's error lists every error
    /// recovery can find ([`ScenarioError::also`], [`recovery`]).
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let src = read_text(path)?;
        let extends = toml::from_str::<toml::Table>(&src).is_ok_and(|t| t.contains_key("extends"));
        if !extends {
            return Scenario::from_toml(path, &src);
        }
        let (table, chain) = extends::resolve(path)?;
        let first = match Scenario::from_value(path, toml::Value::Table(table.clone())) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        // The merged table has no lines to cite; its errors name the loaded file.
        let mut e = recovery::knock_out(first, table, |t| check_table(path, None, t));
        let bases: Vec<String> = chain[1..].iter().map(|p| p.display().to_string()).collect();
        e.message = format!("{} (in the scenario as it extends {})", e.message, bases.join(", which extends "));
        Err(e)
    }

    /// Parses and validates scenario text; `path` names it in errors. An invalid scenario's
    /// error lists every error recovery can find ([`ScenarioError::also`]); text that is not
    /// TOML has one.
    pub fn from_toml(path: &Path, src: &str) -> Result<Scenario, ScenarioError> {
        check_control(path, src)?;
        let first = match toml::from_str::<ScenarioFile>(src) {
            Ok(file) => match validate(path, &stem(path), file) {
                Ok(s) => return Ok(s),
                Err(e) => e,
            },
            Err(e) => error::from_toml(path, src, &e),
        };
        match toml::from_str::<toml::Table>(src) {
            Ok(table) => Err(recovery::knock_out(first, table, |t| check_table(path, Some(src), t))),
            Err(_) => Err(first),
        }
    }

    /// Validates a scenario given as a TOML value tree (a table with `[model]`, `[hardware]`,
    /// ...), as sweeps build them; `path` names it in errors and gives the default name.
    /// Validation and messages are those of [`Scenario::from_toml`]; a type error names its
    /// dotted field (there are no lines to cite). One error: a sweep's configurations are
    /// reported one by one.
    pub fn from_value(path: &Path, value: toml::Value) -> Result<Scenario, ScenarioError> {
        let file = ScenarioFile::deserialize(value).map_err(|e| value_error(path, &e))?;
        validate(path, &stem(path), file)
    }

    /// NCCL's communicators on the rank class holding the most, and their memory, for the
    /// scenario as it stands (a sweep or a counterfactual that changes the layout changes
    /// them).
    pub fn nccl_estimate(&self) -> nccl::NcclEstimate {
        nccl::estimate(self, self.nccl)
    }

    /// `[nccl] nvls` (`NCCL_NVLS_ENABLE`): NCCL's NVLS buffers in its memory, and where the
    /// node has NVLS the time model's all-reduces inside a node on it
    /// ([`crate::hardware::Cluster::nvls`]); the one place that sets both.
    pub fn set_nvls(&mut self, on: bool) {
        self.nccl.nvls = on;
        self.cluster.nvls_off = !on;
    }

    /// Bytes NCCL holds on each GPU outside the allocator: `allocator.nccl_buffers` as
    /// given, else [`Scenario::nccl_estimate`].
    pub fn nccl_bytes(&self) -> u64 {
        self.allocator.nccl_buffers.unwrap_or_else(|| self.nccl_estimate().per_gpu)
    }

    /// Bytes DeepEP's buffers hold on each GPU outside the allocator (0 without DeepEP):
    /// Megatron's `get_buffer` sizes them for tokens of hidden x max(element size, 2) bytes.
    pub fn deepep_bytes(&self) -> u64 {
        let Some(d) = &self.parallel.deepep else { return 0 };
        let hidden_bytes = self.model.hidden * self.training.precision.compute.bytes().max(2);
        d.buffer_bytes(self.parallel.model_parallel.expert, hidden_bytes).unwrap_or(0)
    }

    /// Bytes held on each GPU outside the allocator: the CUDA context, NCCL's buffers and
    /// DeepEP's.
    pub fn outside_bytes(&self) -> u64 {
        self.cluster.cuda_context_bytes + self.nccl_bytes() + self.deepep_bytes()
    }

    /// Bytes the allocator may reserve: device memory less the CUDA context, NCCL's buffers
    /// and DeepEP's.
    pub fn allocator_capacity(&self) -> u64 {
        self.cluster.capacity_bytes().saturating_sub(self.nccl_bytes()).saturating_sub(self.deepep_bytes())
    }

    /// Data-parallel replicas: gpus / (tensor x pipeline).
    pub fn dp_degree(&self) -> u64 {
        self.parallel.model_parallel.data_parallel(u64::from(self.cluster.gpus))
    }

    /// Token copies each expert-parallel rank receives per micro-batch and MoE block under
    /// uneven routing; None when every rank receives what it sends (uniform routing, a dense
    /// model, or one expert-parallel rank).
    pub fn expert_loads(&self) -> Option<Vec<u64>> {
        let moe = self.model.moe.as_ref()?;
        let mp = &self.parallel.model_parallel;
        if (self.routing.is_uniform() && self.capacity.is_none()) || mp.expert <= 1 {
            return None;
        }
        let copies = self.routed_copies();
        let loads = match self.capacity {
            Some(cap) => self.routing.capped_rank_copies(moe.num_experts, mp.expert, copies, cap).0,
            None => self.routing.rank_copies(moe.num_experts, mp.expert, copies),
        };
        // Every rank receiving what it sends is the uniform job.
        (!loads.iter().all(|&l| l == copies)).then_some(loads)
    }

    /// Token copies one rank routes per micro-batch and MoE block: its rows (its 1/context of
    /// each sequence, and of that the sequence shard under sequence parallelism) x top_k; 0
    /// for a dense model. Megatron-Core's router sees only the rank's own tokens (`router.py`
    /// `TopKRouter.routing`: `logits.view(-1, num_moe_experts)` of this rank's [s/cp, b]
    /// rows), and a capacity factor caps each expert at a share of those (`moe_utils.py`
    /// `apply_router_token_dropping`: `get_capacity(num_tokens=num_tokens * router_topk)`
    /// with `num_tokens` the routing map's local rows).
    pub fn routed_copies(&self) -> u64 {
        let mp = &self.parallel.model_parallel;
        let rows = self.workload.micro_batch * self.workload.seq_len
            / mp.context.max(1)
            / if mp.sequence_parallel { mp.tensor } else { 1 };
        self.model.moe.as_ref().map_or(0, |m| rows * m.top_k)
    }

    /// Token copies a rank drops per micro-batch and MoE block under `[moe] capacity_factor`.
    pub fn dropped_copies(&self) -> u64 {
        match (&self.model.moe, self.capacity) {
            (Some(m), Some(cap)) => {
                let ep = self.parallel.model_parallel.expert;
                self.routing.capped_rank_copies(m.num_experts, ep, self.routed_copies(), cap).1
            }
            _ => 0,
        }
    }

    /// The ranks `[jitter]` simulates one by one: every data-parallel rank of every
    /// pipeline stage.
    pub fn jitter_ranks(&self) -> u64 {
        self.dp_degree() * self.parallel.model_parallel.pipeline
    }

    /// The tasks the simulation will hold, estimated ([`limits::estimated_tasks`]): a
    /// training job's ranks simulated x steps x micro-batches x per-micro-batch work; 0 for
    /// an inference job.
    pub fn estimated_tasks(&self) -> u64 {
        if self.inference.is_some() {
            return 0;
        }
        let ep = self.parallel.model_parallel.expert;
        let ranks = limits::simulated_ranks(
            self.jitter.is_some().then(|| self.dp_degree()),
            ep,
            (!self.routing.is_uniform() || self.capacity.is_some()) && ep > 1,
        );
        let est = limits::estimated_tasks(
            self.model.size_layers(),
            u64::from(self.training.steps),
            self.training.grad_accum,
            ranks,
        );
        u64::try_from(est).unwrap_or(u64::MAX)
    }

    /// Tokens one optimizer step consumes across all ranks.
    pub fn tokens_per_step(&self) -> u64 {
        self.training.micro_batch * self.training.seq_len * self.training.grad_accum * self.dp_degree()
    }
}

/// A scenario's default name: its file's stem.
fn stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "scenario".into())
}

/// Validates `table` for [`recovery`], as [`Scenario::from_value`] does; a type or
/// unknown-field error cites its line in `src` (the file's text, when there is one) as
/// [`Scenario::from_toml`]'s first error does.
fn check_table(path: &Path, src: Option<&str>, table: &toml::Table) -> Result<(), ScenarioError> {
    let file = ScenarioFile::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
        let mut e = value_error(path, &e);
        if let Some(line) = src.and_then(|s| error::line_of(s, &e.field)) {
            e.message = format!("{} (line {line})", e.message);
        }
        e
    })?;
    validate(path, &stem(path), file).map(|_| ())
}

/// Which blocks full checkpointing wraps: torchtitan's every n-th block, or Megatron's
/// `--recompute-method block --recompute-num-layers n` (the first n of each model chunk);
/// `uniform` with one layer is every block. Megatron's uniform groups of n > 1 blocks (one
/// checkpoint over several blocks) are not simulated.
fn validate_checkpoint_blocks(
    v: &V,
    t: &TrainingSection,
    ck: Checkpointing,
    framework: Framework,
) -> Result<crate::plan::CheckpointBlocks, ScenarioError> {
    use crate::plan::CheckpointBlocks;
    let full = |field: &str| -> Result<(), ScenarioError> {
        if ck != Checkpointing::Full {
            return Err(v.err(
                field,
                "selects which blocks full checkpointing wraps: set training.activation_checkpointing = \"full\"",
            ));
        }
        Ok(())
    };
    if let Some(n) = t.checkpoint_every {
        full("training.checkpoint_every")?;
        if t.recompute_method.is_some() || t.recompute_num_layers.is_some() {
            return Err(v.err("training.checkpoint_every", "is torchtitan's option; Megatron's recompute_method / recompute_num_layers say the same another way: set one of them"));
        }
        if framework == Framework::Megatron {
            return Err(v.err("training.checkpoint_every", "is torchtitan's option; under framework = \"megatron\" set training.recompute_method and recompute_num_layers"));
        }
        let n = v.positive("training.checkpoint_every", n)?;
        return Ok(if n == 1 { CheckpointBlocks::All } else { CheckpointBlocks::EveryNth(n) });
    }
    match (t.recompute_method.as_deref(), t.recompute_num_layers) {
        (None, None) => Ok(CheckpointBlocks::All),
        (None, Some(_)) => Err(v.err(
            "training.recompute_num_layers",
            "needs training.recompute_method (\"uniform\" or \"block\"), as Megatron's --recompute-num-layers does",
        )),
        (Some(m), n) => {
            full("training.recompute_method")?;
            if framework.is_pytorch() {
                return Err(v.err("training.recompute_method", "is Megatron-LM's flag (framework = \"megatron\" or Megatron-DeepSpeed's \"deepspeed\"); under PyTorch set training.checkpoint_every"));
            }
            let method = v.choice("training.recompute_method", m, &["uniform", "block"])?;
            let n = v.positive("training.recompute_num_layers", n.unwrap_or(1))?;
            match (method, n) {
                ("uniform", 1) => Ok(CheckpointBlocks::All),
                ("uniform", _) => Err(v.err("training.recompute_num_layers", format!("uniform recomputation of groups of {n} blocks (one checkpoint over several blocks) is not simulated yet; use 1, or recompute_method = \"block\""))),
                _ => Ok(CheckpointBlocks::FirstPerChunk(n)),
            }
        }
    }
}

/// `training.activation_offload`: saved activations to pinned host memory, as Megatron-Core
/// (Transformer Engine's handler) or PyTorch (`offload_wrapper`) do it, with the limits
/// Megatron's `TransformerConfig` sets: no pipeline parallelism, no recomputation, fewer
/// offloaded layers than the model has.
fn validate_activation_offload(
    v: &V,
    t: &TrainingSection,
    ck: Checkpointing,
    parallel: &ParallelConfig,
    n_layers: u64,
    cluster: &Cluster,
) -> Result<Option<crate::plan::ActivationOffload>, ScenarioError> {
    use crate::plan::ActivationOffloadMethod;
    let method = match v.choice(
        "training.activation_offload",
        t.activation_offload.as_deref().unwrap_or("none"),
        &["none", "overlapped", "synchronous"],
    )? {
        "none" => {
            if t.activation_offload_layers.is_some() {
                return Err(v.err(
                    "training.activation_offload_layers",
                    "needs training.activation_offload = \"overlapped\" or \"synchronous\"",
                ));
            }
            return Ok(None);
        }
        "overlapped" => ActivationOffloadMethod::Overlapped,
        _ => ActivationOffloadMethod::Synchronous,
    };
    let field = "training.activation_offload";
    match (method, parallel.framework) {
        (ActivationOffloadMethod::Overlapped, Framework::Megatron) => {}
        (ActivationOffloadMethod::Overlapped, _) => {
            return Err(v.err(field, "\"overlapped\" is Megatron-Core's --cpu-offloading (Transformer Engine's offload handler): set parallel.framework = \"megatron\"; under PyTorch use \"synchronous\" (offload_wrapper)"))
        }
        (ActivationOffloadMethod::Synchronous, Framework::Megatron) => {
            return Err(v.err(field, "Megatron-Core offloads with Transformer Engine's handler: use \"overlapped\""))
        }
        _ => {}
    }
    if parallel.model_parallel.pipeline > 1 {
        return Err(v.err(field, "activation offload with pipeline parallelism is not simulated (Megatron-Core refuses --cpu-offloading with a pipeline)"));
    }
    if ck != Checkpointing::None {
        return Err(v.err(field, "offloads what checkpointing would drop: Megatron-Core refuses --cpu-offloading with recomputation, and PyTorch's offload_wrapper replaces the checkpoint wrapper; set training.activation_checkpointing = \"none\""));
    }
    let most = method.most_blocks(n_layers);
    let blocks = match t.activation_offload_layers {
        Some(n) => v.positive("training.activation_offload_layers", n)?,
        None => most,
    };
    if blocks == 0 || blocks > most {
        return Err(v.err(
            "training.activation_offload_layers",
            format!(
                "must be from 1 to {most}{}",
                if method == ActivationOffloadMethod::Overlapped {
                    " (fewer than the model's layers, as Megatron's --cpu-offloading-num-layers must be)"
                } else {
                    " (the model's layers)"
                }
            ),
        ));
    }
    Ok(Some(activation_offload(cluster, method, blocks)))
}

/// `[megatron] offload_modules`: Megatron-Core's fine-grained activation offloading, with the
/// checks `TransformerConfig.__post_init__` makes (known modules, `attn_proj` only with
/// `core_attn`, not with `--cpu-offloading`) and what stepsim does not simulate (full
/// recomputation, whose layers save nothing inside the listed modules).
fn fine_grained_offload(
    v: &V,
    mg: Option<&file::MegatronSection>,
    t: &TrainingSection,
    ck: Checkpointing,
    model: &ModelConfig,
    cluster: &Cluster,
) -> Result<Option<crate::plan::ActivationOffload>, ScenarioError> {
    use crate::plan::OffloadModules;
    let Some(mg) = mg else { return Ok(None) };
    let field = "megatron.offload_modules";
    let Some(names) = &mg.offload_modules else {
        for (field, set) in [
            ("megatron.min_offloaded_tensor_size", mg.min_offloaded_tensor_size.is_some()),
            ("megatron.activation_offload_fraction", mg.activation_offload_fraction.is_some()),
        ] {
            if set {
                return Err(v.err(
                    field,
                    "needs megatron.offload_modules (--fine-grained-activation-offloading --offload-modules)",
                ));
            }
        }
        return Ok(None);
    };
    if names.is_empty() {
        return Err(v.err(field, "lists at least one module (Megatron asserts a non-empty --offload-modules)"));
    }
    let choices: Vec<&str> = OffloadModules::ALL.iter().map(|(n, _)| *n).collect();
    let mut bits = 0u8;
    for n in names {
        if n == "fused_group_mlp" || n == "gdp_qkv" {
            return Err(v.err(
                field,
                format!(
                    "\"{n}\" is not simulated (Transformer Engine's op fuser / gated delta attention); choose from {}",
                    choices.join(", ")
                ),
            ));
        }
        let name = v.choice(field, n, &choices)?;
        bits |= OffloadModules::ALL.iter().find(|(x, _)| *x == name).map_or(0, |(_, b)| *b);
    }
    let modules = OffloadModules(bits);
    if modules.has(OffloadModules::ATTN_PROJ) && !modules.has(OffloadModules::CORE_ATTN) {
        return Err(v.err(field, "\"attn_proj\" needs \"core_attn\" too (Megatron: attn_proj cannot be set to offload_modules alone without core_attn)"));
    }
    if t.activation_offload.as_deref().is_some_and(|m| m != "none") {
        return Err(v.err(field, "fine-grained activation offloading cannot run with --cpu-offloading (training.activation_offload); keep one"));
    }
    if ck == Checkpointing::Full {
        return Err(v.err(field, "fine-grained activation offloading with full recomputation is not simulated (a recomputed layer saves nothing inside its modules); use training.activation_checkpointing = \"selective\" with training.recompute_modules, or \"none\""));
    }
    let min_elements = match mg.min_offloaded_tensor_size {
        Some(x) => v.positive("megatron.min_offloaded_tensor_size", x)?,
        None => OffloadModules::MIN_ELEMENTS,
    };
    let fraction = match mg.activation_offload_fraction {
        Some(f) if f.is_finite() && (0.0..=1.0).contains(&f) => f,
        Some(f) => {
            return Err(v.err(
                "megatron.activation_offload_fraction",
                format!("must be from 0 to 1 (the share of each chunk's eligible groups offloaded), got {f}"),
            ))
        }
        None => 1.0,
    };
    Ok(Some(fine_grained(cluster, model.n_layers, modules, min_elements, fraction)))
}

/// Megatron's fine-grained offloading of `modules` in every one of `n_layers` layers, at the
/// GPU's PCIe rates.
pub fn fine_grained(
    cluster: &Cluster,
    n_layers: u64,
    modules: crate::plan::OffloadModules,
    min_elements: u64,
    fraction: f64,
) -> crate::plan::ActivationOffload {
    let mut a = activation_offload(cluster, crate::plan::ActivationOffloadMethod::FineGrained, n_layers);
    a.modules = modules;
    a.min_elements = min_elements;
    a.fraction = fraction;
    a
}

/// Activation offload of the first `blocks` blocks, with pinned copies at the GPU's PCIe
/// generation's measured rates ([`pcie_bytes_per_s`]).
pub fn activation_offload(
    cluster: &Cluster,
    method: crate::plan::ActivationOffloadMethod,
    blocks: u64,
) -> crate::plan::ActivationOffload {
    let (h2d, d2h) = pcie_bytes_per_s(cluster.gpu.pcie_gen);
    crate::plan::ActivationOffload {
        method,
        blocks,
        modules: Default::default(),
        min_elements: 0,
        fraction: 1.0,
        h2d_bytes_per_s: h2d,
        d2h_bytes_per_s: d2h,
    }
}

/// `training.recompute_modules`: Megatron-Core's `--recompute-modules`, with selective
/// recomputation under Megatron; the MoE and MLA modules need those layers.
fn validate_recompute_modules(
    v: &V,
    t: &TrainingSection,
    ck: Checkpointing,
    framework: Framework,
    model: &ModelConfig,
) -> Result<Vec<crate::plan::RecomputeModule>, ScenarioError> {
    use crate::plan::RecomputeModule;
    let field = "training.recompute_modules";
    let Some(names) = &t.recompute_modules else { return Ok(vec![RecomputeModule::CoreAttn]) };
    if ck != Checkpointing::Selective || framework != Framework::Megatron {
        return Err(v.err(field, "is Megatron-Core's --recompute-modules: set parallel.framework = \"megatron\" and training.activation_checkpointing = \"selective\""));
    }
    if names.is_empty() {
        return Err(v.err(field, "lists at least one module (Megatron's default is [\"core_attn\"])"));
    }
    let choices: Vec<&str> = RecomputeModule::ALL.iter().map(|(n, _)| *n).collect();
    let mut out = Vec::new();
    for n in names {
        let name = v.choice(field, n, &choices)?;
        let m =
            RecomputeModule::ALL.iter().find(|(x, _)| *x == name).map(|(_, m)| *m).unwrap_or(RecomputeModule::CoreAttn);
        let moe = matches!(m, RecomputeModule::Moe | RecomputeModule::MoeAct | RecomputeModule::SharedExperts);
        if moe && model.moe.is_none() {
            return Err(v.err(
                field,
                format!("\"{name}\" recomputes part of a mixture-of-experts layer; this model has none ([model.moe])"),
            ));
        }
        if m == RecomputeModule::SharedExperts && model.moe.as_ref().is_some_and(|x| x.shared_expert_ffn_hidden == 0) {
            return Err(v.err(field, "\"shared_experts\": this mixture of experts has no shared experts"));
        }
        if m == RecomputeModule::MlaUpProj && model.mla.is_none() {
            return Err(v.err(field, "\"mla_up_proj\" recomputes multi-head latent attention's up projections; this model has none ([model.mla])"));
        }
        if !out.contains(&m) {
            out.push(m);
        }
    }
    Ok(out)
}

/// `training.loss`: the cross-entropy implementation. Megatron-Core's own is the default under
/// framework = "megatron"; eager PyTorch's elsewhere. Liger's fused linear cross-entropy is
/// not tensor-parallel (it needs the whole vocabulary on one GPU).
/// `training.kernels`: Megatron runs its fused kernels; every other framework wraps PyTorch
/// model code, eager unless the user compiles it.
fn validate_kernels(v: &V, t: &TrainingSection, framework: Framework) -> Result<KernelStack, ScenarioError> {
    let default = if framework == Framework::Megatron { "fused" } else { "eager" };
    Ok(
        match v.choice("training.kernels", t.kernels.as_deref().unwrap_or(default), &["eager", "compiled", "fused"])? {
            "eager" => KernelStack::Eager,
            "compiled" => KernelStack::Compiled,
            _ => KernelStack::Fused,
        },
    )
}

fn validate_loss(
    v: &V,
    t: &TrainingSection,
    framework: Framework,
    mp: &crate::plan::ModelParallel,
    job: JobKind,
) -> Result<crate::model::LossKind, ScenarioError> {
    use crate::model::LossKind;
    let default = if framework == Framework::Megatron { "vocab-parallel" } else { "eager" };
    let loss = match v.choice(
        "training.loss",
        t.loss.as_deref().unwrap_or(default),
        &["eager", "vocab-parallel", "fused-linear", "compiled"],
    )? {
        "eager" => LossKind::Eager,
        "vocab-parallel" => LossKind::VocabParallel,
        "compiled" => LossKind::Compiled,
        _ => LossKind::FusedLinear,
    };
    if loss == LossKind::Compiled && (mp.tensor > 1 || framework == Framework::Megatron) {
        return Err(v.err(
            "training.loss",
            "\"compiled\" (torch.compile's fused cross-entropy, as torchtitan runs its loss) needs the whole vocabulary on each GPU and PyTorch model code: use parallel.tensor = 1, or \"vocab-parallel\" with tensor parallelism or under Megatron",
        ));
    }
    if loss != LossKind::Eager && t.logits_fp32.is_some() {
        return Err(v.err(
            "training.logits_fp32",
            format!("applies to loss = \"eager\" only (\"{}\" computes in FP32 inside its own kernels)", loss.name()),
        ));
    }
    if loss == LossKind::FusedLinear && mp.tensor > 1 {
        return Err(v.err(
            "training.loss",
            "\"fused-linear\" (Liger's fused linear cross-entropy) needs the whole vocabulary on each GPU: use parallel.tensor = 1, or \"vocab-parallel\" (Megatron's) with tensor parallelism",
        ));
    }
    if loss == LossKind::FusedLinear && job == JobKind::FinetuneLora {
        return Err(v.err(
            "training.loss",
            "\"fused-linear\" with LoRA is not simulated yet (the frozen head has no weight gradient); use \"eager\"",
        ));
    }
    Ok(loss)
}

struct V<'a> {
    path: &'a Path,
}

impl V<'_> {
    fn err(&self, field: &str, msg: impl Into<String>) -> ScenarioError {
        ScenarioError::new(self.path, field, msg)
    }
    fn positive(&self, field: &str, v: i64) -> Result<u64, ScenarioError> {
        if v <= 0 {
            return Err(self.err(field, format!("must be a positive integer, got {v}")));
        }
        Ok(v as u64)
    }
    fn choice<'s>(&self, field: &str, v: &'s str, allowed: &[&str]) -> Result<&'s str, ScenarioError> {
        if allowed.contains(&v) {
            Ok(v)
        } else {
            Err(self.err(
                field,
                format!(
                    "unknown value \"{v}\"; allowed: {}",
                    allowed.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")
                ),
            ))
        }
    }
    fn dtype(&self, field: &str, v: &str) -> Result<Dtype, ScenarioError> {
        Dtype::parse(v)
            .ok_or_else(|| self.err(field, format!("unknown dtype \"{v}\"; allowed: \"fp32\", \"bf16\", \"fp16\"")))
    }
}

/// What DualPipe (deepseek-ai/DualPipe `DualPipe.step`) needs, and what stepsim does not
/// model with it yet.
fn dualpipe_rules(v: &V, parallel: &ParallelConfig, grad_accum: u64) -> Result<(), ScenarioError> {
    let p = parallel.model_parallel.pipeline;
    let v_shape = parallel.model_parallel.schedule == PipelineSchedule::DualPipeV;
    if v_shape && grad_accum < 2 * p {
        return Err(v.err(
            "training.grad_accum",
            format!("DualPipeV needs at least 2 x parallel.pipeline ({}) micro-batches per step (`num_chunks >= num_ranks * 2`), got {grad_accum}", 2 * p),
        ));
    }
    if !v_shape && (grad_accum % 2 != 0 || grad_accum < 2 * p) {
        return Err(v.err(
            "training.grad_accum",
            format!("DualPipe splits the micro-batches between its two directions and needs an even number of at least 2 x parallel.pipeline ({}) per step (`num_chunks % 2 == 0 and num_chunks >= num_ranks * 2`), got {grad_accum}", 2 * p),
        ));
    }
    if parallel.framework != Framework::Megatron {
        return Err(v.err(
            "parallel.schedule",
            "DualPipe and DualPipeV are simulated on Megatron-style ranks (parallel.framework = \"megatron\", sharding \"none\" or \"zero1\"), as DeepSeek-V3 trained with DualPipe",
        ));
    }
    Ok(())
}

/// Validates a parsed scenario. An error of a model field the file does not set says that
/// its value is the config.json's or the zoo model's, which the user may not know they chose.
fn validate(path: &Path, stem: &str, f: ScenarioFile) -> Result<Scenario, ScenarioError> {
    let inherited = model_source::Inherited::of(&f.model);
    validate_fields(path, stem, f).map_err(|mut e| {
        if let Some(note) = inherited.as_ref().and_then(|i| i.note(&e.field)) {
            e.message.push_str(&note);
        }
        e
    })
}

fn validate_fields(path: &Path, stem: &str, f: ScenarioFile) -> Result<Scenario, ScenarioError> {
    let v = V { path };
    if f.extends.is_some() {
        return Err(v.err(
            "extends",
            "a base is read only when a scenario is loaded from its file (stepsim run / check / explain, or a sweep's base = \"path\"); an inline sweep base cannot extend one",
        ));
    }
    // --- model
    let m = &f.model;
    let hf = model_source::hf_model(&v, m)?;
    let model_source = hf.as_ref().map(|h| model_source::describe(m, h));
    let from = |get: fn(&crate::model::hf::HfModel) -> u64| hf.as_ref().map(get);
    let family_name = match (&m.family, &hf) {
        (Some(_), Some(h)) => {
            return Err(v.err(
                "model.family",
                format!("the config's model_type (\"{}\") decides the architecture; remove model.family", h.model_type),
            ))
        }
        (Some(f), None) => f.clone(),
        (None, Some(h)) => if h.family == Family::Gpt { "gpt" } else { "llama" }.to_string(),
        (None, None) => {
            return Err(v.err(
                "model.family",
                "is required (or give model.name = \"<zoo model>\" or model.hf_config = \"path/config.json\")",
            ))
        }
    };
    let family = match v.choice("model.family", &family_name, &["gpt", "llama"])? {
        "gpt" => Family::Gpt,
        _ => Family::Llama,
    };
    let n_layers = model_source::field(&v, "model.n_layers", m.n_layers, from(|h| h.n_layers))?;
    let n_layers = v.bounded("model.n_layers", n_layers, limits::MAX_LAYERS)?;
    let hidden = model_source::field(&v, "model.hidden", m.hidden, from(|h| h.hidden))?;
    let hidden = v.bounded("model.hidden", hidden, limits::MAX_HIDDEN)?;
    let n_heads = model_source::field(&v, "model.n_heads", m.n_heads, from(|h| h.n_heads))?;
    let n_heads = v.bounded("model.n_heads", n_heads, limits::MAX_HEADS)?;
    let head_dim = match m.head_dim {
        Some(x) => Some(v.bounded("model.head_dim", x, limits::MAX_HIDDEN)?),
        None => hf.as_ref().and_then(|h| h.head_dim),
    };
    let qkv_bias = m.qkv_bias.unwrap_or(hf.as_ref().is_some_and(|h| h.qkv_bias));
    let qk_norm = m.qk_norm.unwrap_or(hf.as_ref().is_some_and(|h| h.qk_norm));
    if family == Family::Gpt {
        for (field, set) in
            [("model.head_dim", head_dim.is_some()), ("model.qkv_bias", qkv_bias), ("model.qk_norm", qk_norm)]
        {
            if set {
                return Err(v.err(field, "applies to the llama family only (the gpt family's heads are hidden / n_heads wide, with biases everywhere)"));
            }
        }
    }
    let head_dim = head_dim.filter(|&d| d * n_heads != hidden);
    if head_dim.is_none() && hidden % n_heads != 0 {
        return Err(v.err(
            "model.n_heads",
            format!("must divide model.hidden ({hidden}); {n_heads} does not (or set model.head_dim)"),
        ));
    }
    let hd = head_dim.unwrap_or(hidden / n_heads);
    if hd % 2 != 0 && family == Family::Llama {
        return Err(v.err(
            if head_dim.is_some() { "model.head_dim" } else { "model.n_heads" },
            format!("rotary embeddings need an even head dimension; the head dimension is {hd}"),
        ));
    }
    let n_kv_heads = match m.n_kv_heads.or(from(|h| h.n_kv_heads).map(|x| i64::try_from(x).unwrap_or(i64::MAX))) {
        None => n_heads,
        Some(k) => {
            let k = v.positive("model.n_kv_heads", k)?;
            // GPT-NeoX's partial rotary turns whole query and key heads of one fused width.
            if family == Family::Gpt && k != n_heads && hf.as_ref().is_some_and(|h| h.style.rotary_dims.is_some()) {
                return Err(v.err("model.n_kv_heads", format!("this model's partial rotary embedding (GPT-NeoX style) is simulated with multi-head attention: n_kv_heads must equal n_heads ({n_heads}) or be left out")));
            }
            if n_heads % k != 0 {
                return Err(v.err("model.n_kv_heads", format!("must divide model.n_heads ({n_heads}); {k} does not")));
            }
            k
        }
    };
    let ffn_hidden = match m.ffn_hidden.or(from(|h| h.ffn_hidden).map(|x| i64::try_from(x).unwrap_or(i64::MAX))) {
        Some(x) => v.bounded("model.ffn_hidden", x, limits::MAX_FFN)?,
        None => match family {
            Family::Gpt => 4 * hidden,
            // Llama's rule: 2/3 of 4h, rounded up to a multiple of 256.
            Family::Llama => (8 * hidden / 3).div_ceil(256) * 256,
        },
    };
    let vocab = model_source::field(&v, "model.vocab", m.vocab, from(|h| h.vocab))?;
    let vocab = v.bounded("model.vocab", vocab, limits::MAX_VOCAB)?;
    let job = job_kind(&v, &f)?;
    let (inf, standin) = match (job, &f.inference) {
        (JobKind::Inference, Some(i)) => {
            let (batch, prompt, gen) = inference_lengths(&v, i)?;
            (Some((i, (prompt + gen) as u64)), inference_standin(batch, prompt))
        }
        _ => (None, TrainingSection::default()),
    };
    let t = f.training.as_ref().unwrap_or(&standin);
    let micro_batch = v.bounded("training.micro_batch", t.micro_batch, limits::MAX_MICRO_BATCH)?;
    let seq_len = v.bounded("training.seq_len", t.seq_len, limits::MAX_SEQ)?;
    // A GPT-2 config's position table has its own size (`n_positions`): a parameter count.
    let table = hf.as_ref().and_then(|h| h.position_table());
    let max_seq_len = match (m.max_seq_len, table) {
        (Some(x), _) => v.bounded("model.max_seq_len", x, limits::MAX_SEQ)?,
        (None, Some(n)) => v.bounded("model.max_seq_len", i64::try_from(n).unwrap_or(i64::MAX), limits::MAX_SEQ)?,
        (None, None) => inf.map_or(seq_len, |(_, ctx)| ctx),
    };
    if let Some((_, ctx)) = inf {
        if ctx > max_seq_len {
            return Err(v.err(
                "inference.gen_len",
                format!("prompt_len + gen_len = {ctx} tokens exceeds model.max_seq_len ({max_seq_len})"),
            ));
        }
    } else if seq_len > max_seq_len {
        return Err(v.err("training.seq_len", format!("{seq_len} exceeds model.max_seq_len ({max_seq_len})")));
    }
    let dropout = m.dropout.unwrap_or(hf.as_ref().map_or(0.0, |h| h.dropout));
    if !(0.0..1.0).contains(&dropout) {
        return Err(v.err("model.dropout", format!("must be in [0, 1), got {dropout}")));
    }
    let model = ModelConfig {
        family,
        n_layers,
        hidden,
        n_heads,
        n_kv_heads,
        ffn_hidden,
        vocab,
        max_seq_len,
        tie_embeddings: m.tie_embeddings.unwrap_or(hf.as_ref().map_or(family == Family::Gpt, |h| h.tie_embeddings)),
        dropout,
        embedding_norm: m.embedding_norm.unwrap_or(false),
        head_dim_override: head_dim,
        qkv_bias,
        qk_norm,
        moe: validate_moe(&v, m, hf.as_ref(), family, n_layers)?,
        mla: validate_mla(&v, m, hf.as_ref(), family)?,
        style: hf.as_ref().map_or_else(Default::default, |h| crate::model::BlockStyle {
            // OLMo 2's full-width norms go with its QK-norm (an override can turn it off).
            qk_norm_full_width: h.style.qk_norm_full_width && qk_norm,
            ..h.style.clone()
        }),
        sliding_window: hf.as_ref().and_then(|h| h.sliding_window.clone()),
        mtp: validate_mtp(&v, m, family)?,
    };
    limits::check_params(&v, &model)?;
    if model.mla.is_some() {
        for (field, set) in
            [("model.head_dim", head_dim.is_some()), ("model.qkv_bias", qkv_bias), ("model.qk_norm", qk_norm)]
        {
            if set {
                return Err(
                    v.err(field, "does not apply with multi-head latent attention (its widths are in [model.mla])")
                );
            }
        }
        if inf.is_some() {
            return Err(v.err("job.kind", "inference with multi-head latent attention is not simulated yet (its KV cache holds the compressed latent); simulate its training"));
        }
    }
    if model.moe.is_some() && inf.is_some() {
        return Err(v.err(
            "job.kind",
            "inference of a mixture-of-experts model is not simulated yet (decode would read every expert's weights); simulate its training, or a dense model's inference",
        ));
    }
    // A window of w earlier tokens covers a sequence of w + 1 whole. Training computes the
    // band (model::SlidingWindow); a KV cache that keeps only the window is not modelled.
    let local = model.sliding_window.as_ref().filter(|sw| inf.is_some_and(|(_, ctx)| !sw.covers(ctx)));
    if let (Some(sw), Some((_, context))) = (local, inf) {
        let (what, most) = if sw.chunked {
            ("chunked attention (chunks", sw.window)
        } else {
            ("sliding-window attention (window", sw.window + 1)
        };
        return Err(v.err(
            if m.name.is_some() { "model.name" } else { "model.hf_config" },
            format!("the config's {what} {} tokens) is shorter than the context ({context} tokens); in inference its KV cache (the window's tokens only) is not modelled: use a context of at most {most} tokens, or simulate training", sw.window),
        ));
    }

    // --- hardware
    let h = &f.hardware;
    let mut gpu = validate_gpu(&v, h)?;
    let gpus = v.bounded("hardware.gpus", h.gpus, limits::MAX_GPUS)?;
    let node_name = h.node.as_deref().unwrap_or(gpu.default_node);
    let node = hardware::node(node_name).ok_or_else(|| {
        v.err(
            "hardware.node",
            format!("unknown node preset \"{node_name}\"; the presets are: {}", hardware::node_names().join(", ")),
        )
    })?;
    let gpus_per_node = match h.gpus_per_node {
        Some(x) => v.positive("hardware.gpus_per_node", x)?,
        None => gpus.min(u64::from(node.gpus_per_node)),
    };
    let nics_per_node = match h.nics_per_node {
        Some(x) => v.positive("hardware.nics_per_node", x)? as u32,
        None => node.nics_per_node,
    };
    let nic_bytes_per_s = match h.nic_gbps {
        Some(x) if !(x > 0.0 && x.is_finite()) => {
            return Err(v.err("hardware.nic_gbps", format!("must be a positive number of Gb/s, got {x}")))
        }
        Some(x) => x * 1e9 / 8.0,
        None => node.nic_bytes_per_s,
    };
    if let Some(x) = h.nvlink_gb_per_s {
        if !(x > 0.0 && x.is_finite()) {
            return Err(v.err("hardware.nvlink_gb_per_s", format!("must be a positive number of GB/s, got {x}")));
        }
        gpu.nvlink_bytes_per_s = x * 1e9;
    }
    if gpus_per_node > gpus {
        return Err(v.err(
            "hardware.gpus_per_node",
            format!("{gpus_per_node} GPUs per node is more than hardware.gpus ({gpus})"),
        ));
    }
    if gpus % gpus_per_node != 0 {
        return Err(
            v.err("hardware.gpus_per_node", format!("must divide hardware.gpus ({gpus}); {gpus_per_node} does not"))
        );
    }
    if gpus > u64::from(u32::MAX) {
        return Err(v.err("hardware.gpus", "too many GPUs"));
    }
    let memory_bytes = match h.memory_capacity {
        Some(x) => v.positive("hardware.memory_capacity", x)?,
        None => gpu.memory_bytes,
    };
    let loading = v.choice(
        "hardware.cuda_module_loading",
        h.cuda_module_loading.as_deref().unwrap_or("lazy"),
        &["lazy", "eager"],
    )?;
    if h.cuda_module_loading.is_some() && h.cuda_context.is_some() {
        return Err(v.err(
            "hardware.cuda_module_loading",
            "sets the CUDA context's default size; give it or hardware.cuda_context, not both",
        ));
    }
    let cuda_context_bytes = match h.cuda_context {
        Some(x) if x < 0 => return Err(v.err("hardware.cuda_context", format!("must be >= 0 bytes, got {x}"))),
        Some(x) => x as u64,
        None if loading == "eager" => EAGER_CUDA_CONTEXT,
        None => DEFAULT_CUDA_CONTEXT,
    };
    if cuda_context_bytes >= memory_bytes {
        return Err(v.err(
            "hardware.cuda_context",
            format!("{cuda_context_bytes} bytes leaves nothing of the {memory_bytes}-byte device"),
        ));
    }
    let cluster = Cluster {
        gpu,
        gpus: gpus as u32,
        gpus_per_node: gpus_per_node as u32,
        node: node.name.to_string(),
        nics_per_node,
        nic_bytes_per_s,
        memory_bytes,
        cuda_context_bytes,
        nvls_off: false,
    };

    // --- parallel
    let p = &f.parallel;
    let sharding = match v.choice(
        "parallel.sharding",
        p.sharding.as_deref().unwrap_or("none"),
        &["none", "zero1", "zero2", "shard_grad_op", "zero3", "full_shard", "hybrid_shard"],
    )? {
        "none" => Sharding::None,
        "zero1" => Sharding::Zero1,
        "zero2" | "shard_grad_op" => Sharding::Zero2,
        "zero3" | "full_shard" => Sharding::Zero3,
        _ => Sharding::HybridShard,
    };
    let framework = match v.choice(
        "parallel.framework",
        p.framework.as_deref().unwrap_or("fsdp"),
        &["fsdp", "fsdp1", "fsdp2", "deepspeed", "megatron"],
    )? {
        "fsdp" => Framework::Fsdp,
        "fsdp1" => Framework::Fsdp1,
        "fsdp2" => Framework::Fsdp2,
        "megatron" => Framework::Megatron,
        _ => Framework::Deepspeed,
    };
    if framework == Framework::Megatron && !matches!(sharding, Sharding::None | Sharding::Zero1) {
        return Err(v.err(
            "parallel.sharding",
            "Megatron-LM replicates parameters and gradients over data parallelism: use sharding = \"none\" (its DistributedDataParallel) or \"zero1\" (--use-distributed-optimizer); parameter sharding is parallel.framework = \"fsdp\"",
        ));
    }
    if framework == Framework::Fsdp2 && matches!(sharding, Sharding::None | Sharding::Zero1) {
        return Err(v.err(
            "parallel.sharding",
            "FSDP2 (fully_shard) shards parameters: use sharding = \"full_shard\", \"shard_grad_op\" (reshard_after_forward=False) or \"hybrid_shard\"; DDP and ZeroRedundancyOptimizer are parallel.framework = \"fsdp\"",
        ));
    }
    if framework == Framework::Fsdp1 && sharding == Sharding::None && p.pipeline.unwrap_or(1) > 1 {
        return Err(v.err(
            "parallel.sharding",
            "FSDP1's NO_SHARD with pipeline parallelism is not simulated yet; use sharding = \"full_shard\" or \"shard_grad_op\" over each stage's data-parallel ranks, or parallel.framework = \"fsdp\" (DDP)",
        ));
    }
    if framework == Framework::Fsdp1 && sharding == Sharding::Zero1 {
        return Err(v.err(
            "parallel.sharding",
            "FSDP1 has no optimizer-only sharding: use sharding = \"none\" (NO_SHARD), \"shard_grad_op\", \"full_shard\" or \"hybrid_shard\"; ZeroRedundancyOptimizer is parallel.framework = \"fsdp\"",
        ));
    }
    if p.wrap.as_deref() == Some("peft") && f.lora.is_none() {
        return Err(v.err("parallel.wrap", "\"peft\" is PEFT's fsdp_auto_wrap_policy, which wraps LoRA adapters in units of their own: it needs a [lora] section (job.kind = \"finetune-lora\"); use \"block\""));
    }
    v.choice("parallel.wrap", p.wrap.as_deref().unwrap_or("block"), &["block", "peft"])?;
    if p.use_orig_params.is_some() && framework != Framework::Fsdp1 {
        return Err(v.err("parallel.use_orig_params", "is FSDP1's FullyShardedDataParallel argument: set parallel.framework = \"fsdp1\" (FSDP2's fully_shard always keeps the original parameters, as DTensors)"));
    }
    use file::BoolOrInt;
    let (reshard, post_forward_shard) = match p.reshard_after_forward {
        None => (None, None),
        Some(BoolOrInt::Bool(b)) => (Some(b), None),
        Some(BoolOrInt::Int(n)) => {
            let field = "parallel.reshard_after_forward";
            if framework != Framework::Fsdp2 {
                return Err(v.err(field, format!("an int ({n}) is FSDP2's reshard to a smaller mesh: set parallel.framework = \"fsdp2\", or use true / false")));
            }
            if sharding != Sharding::Zero3 {
                return Err(v.err(field, format!("an int ({n}) reshards FULL_SHARD's parameters after forward to {n} ranks: it needs sharding = \"full_shard\"")));
            }
            (Some(true), Some(n))
        }
    };
    if sharding == Sharding::Zero2 && reshard == Some(true) {
        return Err(v.err("parallel.reshard_after_forward", "SHARD_GRAD_OP / zero2 keeps parameters gathered between forward and backward; use sharding = \"full_shard\" to reshard after forward"));
    }
    let backward_prefetch = match v.choice(
        "parallel.backward_prefetch",
        p.backward_prefetch.as_deref().unwrap_or("pre"),
        &["pre", "post", "none"],
    )? {
        "pre" => BackwardPrefetch::Pre,
        "post" => BackwardPrefetch::Post,
        _ => BackwardPrefetch::None,
    };
    let bucket_cap_mb = p.bucket_cap_mb.unwrap_or(25.0);
    if !(bucket_cap_mb > 0.0 && bucket_cap_mb <= limits::MAX_BUCKET_CAP_MB) {
        return Err(v.err(
            "parallel.bucket_cap_mb",
            format!(
                "must be a positive number of MiB up to 2^24 (16 TiB; a bucket larger than the model is one bucket), got {bucket_cap_mb}"
            ),
        ));
    }
    // Defaults: PyTorch 2.x FSDP1 `FullyShardedDataParallel` (reshard_after_forward is
    // implied by FULL_SHARD, backward_prefetch=BACKWARD_PRE, forward_prefetch=False,
    // limit_all_gathers=True) and DDP (`bucket_cap_mb=25`, `gradient_as_bucket_view=False`).
    let mut model_parallel = validate_model_parallel(&v, p, &model, gpus, u64::from(cluster.gpus_per_node), sharding)?;
    (model_parallel.expert, model_parallel.expert_tensor) = validate_expert_parallel(
        &v,
        p,
        &model,
        model_parallel.tensor,
        model_parallel.sequence_parallel,
        model_parallel.context,
        model_parallel.data_parallel(gpus),
        sharding,
        framework,
    )?;
    let megatron = validate_megatron(&v, f.megatron.as_ref(), framework, sharding, &model_parallel)?;
    let parallel = ParallelConfig {
        sharding,
        framework,
        reshard_after_forward: reshard.unwrap_or(true),
        post_forward_shard: None,
        backward_prefetch,
        forward_prefetch: p.forward_prefetch.unwrap_or(false),
        limit_all_gathers: p.limit_all_gathers.unwrap_or(true),
        gradient_as_bucket_view: p.gradient_as_bucket_view.unwrap_or(false),
        // DDP: `self.bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)` (distributed.py).
        bucket_bytes: ((bucket_cap_mb * (1u64 << 20) as f64).floor() as u64).max(1),
        model_parallel,
        offload: None,
        deepspeed: validate_deepspeed(&v, f.deepspeed.as_ref(), framework)?,
        megatron,
        no_sync: p.no_sync.unwrap_or(false),
        hsdp_shard: None,
        async_tp: p.async_tp.unwrap_or(false),
        use_orig_params: p.use_orig_params.unwrap_or(false),
        deepep: None,
    };
    let mut parallel = parallel;
    if parallel.model_parallel.pipeline > 1 {
        if framework == Framework::Deepspeed && matches!(sharding, Sharding::Zero2 | Sharding::Zero3) {
            return Err(v.err(
                "parallel.sharding",
                "DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only (PipelineEngine asserts zero_optimization_stage < 2); use sharding = \"zero1\" or \"none\", or parallel.framework = \"fsdp\" (FSDP over each stage's data-parallel ranks, as torchtitan does)",
            ));
        }
        // torchtitan's reshard_after_forward policy "default": with pipeline parallelism
        // parameters stay gathered across the stage's micro-batches rather than being
        // all-gathered again for each one.
        if p.reshard_after_forward.is_none() && matches!(sharding, Sharding::Zero3) {
            parallel.reshard_after_forward = false;
        }
    }
    if let Some(n) = post_forward_shard {
        // FSDP2 reshards to a divisor of the shard group: data x context ranks.
        let mp = &parallel.model_parallel;
        let shard = gpus / (mp.tensor * mp.pipeline).max(1);
        if n < 2 || n >= shard as i64 || shard % n as u64 != 0 {
            return Err(v.err(
                "parallel.reshard_after_forward",
                format!("an int must divide the {shard} ranks parameters are sharded over and lie strictly between 1 and {shard} (FSDP2's post-forward mesh), got {n}; true reshards to all {shard}"),
            ));
        }
        parallel.post_forward_shard = Some(n as u64);
    }
    if let Some(o) = &f.offload {
        parallel.offload = validate_offload(&v, o, &parallel, &cluster)?;
    }
    if parallel.fsdp_expert_split() {
        // torchtitan's FSDP2 with expert parallelism: what is simulated is each block's
        // all-gather and reduce-scatter split over the two meshes, not yet a post-forward
        // mesh or CPU offload of the expert shard.
        if parallel.post_forward_shard.is_some() {
            return Err(v.err(
                "parallel.reshard_after_forward",
                "an int (FSDP2's post-forward mesh) with expert parallelism is not simulated yet (the routed experts are sharded over their own efsdp mesh); use true or false",
            ));
        }
        if parallel.offload.is_some() {
            return Err(v.err(
                "offload",
                "CPU offload with FSDP2 and expert parallelism is not simulated yet; leave out [offload] or parallel.expert",
            ));
        }
    }
    if parallel.async_tp {
        let mp = &parallel.model_parallel;
        if !framework.is_pytorch() {
            return Err(v.err(
                "parallel.async_tp",
                "is torchtitan's (framework = \"fsdp\"); under Megatron set [megatron] tp_comm_overlap",
            ));
        }
        if mp.tensor < 2 || !mp.sequence_parallel {
            return Err(v.err("parallel.async_tp", "pipelines the sequence-parallel collectives with their GEMMs: needs parallel.tensor > 1 and sequence_parallel = true"));
        }
    }
    if let Some(n) = p.hsdp_shard_size {
        let field = "parallel.hsdp_shard_size";
        if sharding != Sharding::HybridShard {
            return Err(v.err(field, "sets HYBRID_SHARD's shard group: set parallel.sharding = \"hybrid_shard\""));
        }
        let n = v.positive(field, n)?;
        let dp = parallel.model_parallel.data_parallel(gpus);
        if n > dp || dp % n != 0 {
            return Err(v.err(
                field,
                format!("must divide the {dp} data-parallel ranks (each replica shards over it; the replicas all-reduce), got {n}"),
            ));
        }
        parallel.hsdp_shard = Some(n);
    }
    if parallel.fsdp_expert_split() && sharding == Sharding::HybridShard {
        let mp = &parallel.model_parallel;
        let shard = crate::plan::shard_group(&parallel, gpus, u64::from(cluster.gpus_per_node));
        moe::validate_hsdp_expert_parallel(&v, mp.expert, shard)?;
    }
    if parallel.no_sync {
        let why = if !framework.is_pytorch() {
            Some("is FSDP's (no_sync() / set_requires_gradient_sync(False)); DDP, DeepSpeed and Megatron are simulated with their own gradient accumulation")
        } else if !matches!(sharding, Sharding::Zero2 | Sharding::Zero3 | Sharding::HybridShard) {
            Some("needs sharded gradients (sharding = \"shard_grad_op\", \"full_shard\" or \"hybrid_shard\"); DDP already reduces only in the last micro-batch's backward")
        } else if parallel.model_parallel.pipeline > 1 {
            Some("pipeline stages accumulate unsharded gradients over the step already (torch.distributed.pipelining)")
        } else if parallel.offload.is_some() {
            Some("with CPU offload is not simulated")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(v.err("parallel.no_sync", why));
        }
    }

    // --- training
    let grad_accum = match t.grad_accum {
        Some(x) => v.bounded("training.grad_accum", x, limits::MAX_GRAD_ACCUM)?,
        None => 1,
    };
    let steps = match t.steps {
        Some(x) => v.positive("training.steps", x)?,
        None => 2,
    };
    if steps > 100 {
        return Err(v.err("training.steps", format!("at most 100 steps are simulated, got {steps}")));
    }
    let optimizer =
        match v.choice("training.optimizer", t.optimizer.as_deref().unwrap_or("adamw"), &["adamw", "adam", "sgd"])? {
            "adamw" => OptimizerKind::AdamW,
            "adam" => OptimizerKind::Adam,
            _ => OptimizerKind::Sgd,
        };
    if t.momentum.is_some() && optimizer != OptimizerKind::Sgd {
        return Err(v.err("training.momentum", "only applies to optimizer = \"sgd\" (Adam always keeps two moments)"));
    }
    // DeepSpeed's FusedAdam, Megatron's (apex / Transformer Engine) FusedAdam; PyTorch's
    // foreach default otherwise.
    let default_impl =
        if matches!(framework, Framework::Deepspeed | Framework::Megatron) { "fused" } else { "foreach" };
    let optimizer_impl = match v.choice(
        "training.optimizer_impl",
        t.optimizer_impl.as_deref().unwrap_or(default_impl),
        &["foreach", "fused", "for-loop"],
    )? {
        "foreach" => OptimizerImpl::Foreach,
        "fused" => OptimizerImpl::Fused,
        _ => OptimizerImpl::ForLoop,
    };
    let lora_job = job == JobKind::FinetuneLora;
    let preset = t.precision.as_deref().unwrap_or(if lora_job { "fsdp-bf16-mixed" } else { "bf16-mixed-adam" });
    let mut precision = Precision::preset(preset).ok_or_else(|| {
        v.err(
            "training.precision",
            format!(
                "unknown preset \"{preset}\"; allowed: {}",
                Precision::preset_names().iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    if let Some(d) = &t.param_dtype {
        precision.param = v.dtype("training.param_dtype", d)?;
    }
    if let Some(d) = &t.compute_dtype {
        precision.compute = v.dtype("training.compute_dtype", d)?;
    }
    if let Some(d) = &t.grad_dtype {
        precision.grad = v.dtype("training.grad_dtype", d)?;
    }
    if let Some(d) = &t.master_dtype {
        precision.master = if d == "none" {
            None
        } else {
            Some(v.dtype("training.master_dtype", d).map_err(|_| {
                v.err(
                    "training.master_dtype",
                    format!("unknown dtype \"{d}\"; allowed: \"none\", \"fp32\", \"bf16\", \"fp16\""),
                )
            })?)
        };
    }
    if let Some(d) = &t.optimizer_state_dtype {
        precision.optimizer_state = v.dtype("training.optimizer_state_dtype", d)?;
    }
    megatron::apply_precision_aware(&v, f.megatron.as_ref(), sharding, optimizer, &mut precision)?;
    // DeepSpeed's engine runs BF16 without ZeRO through BF16_Optimizer (engine.py
    // `_do_optimizer_sanity_check`: a BF16 model with FP32 gradient accumulation, the default
    // without ZeRO), which partitions the FP32 master and moments over data parallelism as
    // ZeRO-1 does: the same optimizer DeepSpeed picks for ZeRO-1 with FP32 accumulation.
    if framework == Framework::Deepspeed
        && sharding == Sharding::None
        && precision.param == Dtype::Bf16
        && precision.master.is_some()
        && f.offload.is_none()
    {
        return Err(v.err(
            "parallel.sharding",
            "DeepSpeed runs BF16 without ZeRO through BF16_Optimizer, which accumulates gradients in FP32 and partitions the FP32 master and moments over data parallelism like ZeRO-1; simulate it as parallel.sharding = \"zero1\" with training.precision = \"bf16-mixed-adam-fp32-grads\" (DeepSpeed picks the same optimizer there)",
        ));
    }
    if precision.compute == Dtype::Bf16 && cluster.gpu.bf16_flops.is_none() {
        let field = if t.compute_dtype.is_some() { "training.compute_dtype" } else { "training.precision" };
        return Err(v.err(
            field,
            format!(
                "{} has no BF16 tensor cores; compute in \"fp16\" (compute_dtype = \"fp16\") or \"fp32\"",
                cluster.gpu.name
            ),
        ));
    }
    let checkpointing = match v.choice(
        "training.activation_checkpointing",
        t.activation_checkpointing.as_deref().unwrap_or("none"),
        &["none", "full", "selective", "selective-op"],
    )? {
        "none" => Checkpointing::None,
        "full" => Checkpointing::Full,
        "selective" => Checkpointing::Selective,
        _ => Checkpointing::SelectiveOp,
    };
    if checkpointing == Checkpointing::SelectiveOp && parallel.framework == Framework::Megatron {
        return Err(v.err(
            "training.activation_checkpointing",
            "\"selective-op\" is torchtitan's per-op policy (PyTorch's selective checkpoint); Megatron-LM has none: its --recompute-granularity is \"selective\" or \"full\"",
        ));
    }
    let checkpoint_blocks = validate_checkpoint_blocks(&v, t, checkpointing, parallel.framework)?;
    let (attention, flash_kernel) = match v.choice(
        "training.attention",
        t.attention.as_deref().unwrap_or("flash"),
        &["flash", "math", "eager", "sdpa", "flash_attention_2", "flash_attention_3", "cudnn"],
    )? {
        "flash" => (Attention::Flash, None),
        // Hugging Face's default: PyTorch's scaled_dot_product_attention, which a training
        // batch without padding (is_causal) sends to its flash backend, FlashAttention-2.
        "sdpa" => (Attention::Flash, Some(FlashKernel::FlashAttention2)),
        "math" => (Attention::Math, None),
        "eager" => (Attention::Eager, None),
        "flash_attention_2" => (Attention::Flash, Some(FlashKernel::FlashAttention2)),
        "flash_attention_3" => (Attention::Flash, Some(FlashKernel::FlashAttention3)),
        _ => (Attention::Flash, Some(FlashKernel::Cudnn)),
    };
    if parallel.framework == Framework::Megatron {
        let why = match t.attention.as_deref() {
            Some("eager") => Some("\"eager\" is Hugging Face's eager_attention_forward; Megatron-LM's own materialised attention is its CoreAttention: use \"math\""),
            Some("sdpa") => Some("\"sdpa\" is PyTorch's scaled_dot_product_attention, which Megatron-LM does not call: use \"flash\" (Transformer Engine's fused attention) or name the kernel"),
            _ => None,
        };
        if let Some(why) = why {
            return Err(v.err("training.attention", why));
        }
    }
    if let Some(why) = flash_kernel.and_then(|k| crate::schedule::flash_rates::unsupported(k, cluster.gpu.arch)) {
        return Err(v.err("training.attention", why));
    }
    parallel.model_parallel.context_comm =
        validate_context(&v, p, &parallel.model_parallel, &model, parallel.framework, attention, seq_len, job)?;
    let mp = &parallel.model_parallel;
    if mp.sequence_parallel && seq_len % mp.tensor != 0 {
        return Err(v.err(
            "training.seq_len",
            format!("sequence parallelism splits the sequence over {} ranks: {seq_len} is not divisible", mp.tensor),
        ));
    }
    if mp.schedule == PipelineSchedule::Interleaved && grad_accum % mp.pipeline != 0 {
        return Err(v.err(
            "training.grad_accum",
            format!(
                "the interleaved schedule needs the micro-batches per step ({grad_accum}) to be a multiple of parallel.pipeline ({}), as Megatron-LM requires",
                mp.pipeline
            ),
        ));
    }
    if mp.schedule.is_dualpipe() {
        dualpipe_rules(&v, &parallel, grad_accum)?;
    }
    let training = TrainingConfig {
        micro_batch,
        seq_len,
        grad_accum,
        steps: steps as u32,
        optimizer,
        momentum: t.momentum.unwrap_or(true),
        optimizer_impl,
        precision: precision.clone(),
        checkpointing,
        checkpoint_blocks,
        activation_offload: match fine_grained_offload(&v, f.megatron.as_ref(), t, checkpointing, &model, &cluster)? {
            Some(a) => Some(a),
            None => validate_activation_offload(&v, t, checkpointing, &parallel, model.n_layers, &cluster)?,
        },
        recompute_modules: validate_recompute_modules(&v, t, checkpointing, parallel.framework, &model)?,
        clip_grad_norm: t.clip_grad_norm.unwrap_or(true),
        blas_workspace: 0,
        te_workspace: 0,
        torch_version: validate_torch_version(&v, t.torch_version.as_deref())?,
    };
    let loss = validate_loss(&v, t, parallel.framework, &parallel.model_parallel, job)?;
    let kernels = validate_kernels(&v, t, parallel.framework)?;
    let workload = Workload {
        loss,
        // Set from [moe] once the routing is validated.
        aux_loss: Default::default(),
        micro_batch,
        seq_len,
        compute_dtype: precision.compute,
        attention,
        logits_fp32: t.logits_fp32.unwrap_or(true),
        split: crate::model::TensorSplit {
            tensor: parallel.model_parallel.tensor,
            sequence_parallel: parallel.model_parallel.sequence_parallel,
            expert: parallel.model_parallel.expert,
            expert_tensor: parallel.model_parallel.expert_tensor,
            context: parallel.model_parallel.context,
            context_comm: parallel.model_parallel.context_comm,
        },
        lora: None,
        routed: None,
        // Megatron-Core fuses SwiGLU by default (--bias-swiglu-fusion; `SwiGLUFunction` in
        // megatron/core/fusions/fused_bias_swiglu.py); torch.compile fuses it too.
        fused_swiglu: parallel.framework == Framework::Megatron || kernels == KernelStack::Compiled,
        // Megatron-Core 0.13 on scales the copies in its fused SwiGLU; torchtitan (FSDP2)
        // upcasts them to FP32 after the combine; Hugging Face model code scales them after it
        // in 16 bits ([`crate::model::RoutingScale`]).
        routing_scale: match parallel.framework {
            Framework::Megatron => crate::model::RoutingScale::InActivation,
            Framework::Fsdp2 => crate::model::RoutingScale::AfterCombineFp32,
            _ => crate::model::RoutingScale::AfterCombine,
        },
        swiglu_fp8_input_store: megatron::fp8_input_store(&v, f.megatron.as_ref(), &model)?,
        kernels,
        repeat_kv: t.repeat_kv.unwrap_or(kernels != KernelStack::Fused),
        flash2: parallel.framework != Framework::Megatron,
        flash_kernel,
        fp8: validate_fp8(
            &v,
            f.fp8.as_ref(),
            &Fp8Context {
                framework: parallel.framework,
                cluster: &cluster,
                compute: precision.compute,
                job,
                micro_batches: grad_accum,
                sharding: parallel.sharding,
                shard_group: crate::plan::shard_group(
                    &parallel,
                    u64::from(cluster.gpus),
                    u64::from(cluster.gpus_per_node),
                ),
            },
        )?,
    };
    let mut workload = workload;
    check_mtp(&v, &model, &parallel, &workload, &training, job)?;
    check_ep_overlap(&v, &model, &parallel, &training)?;
    let mp = &parallel.model_parallel;
    if model.style.qk_norm_full_width && mp.tensor > 1 {
        return Err(v.err("parallel.tensor", format!("{}: this model's query and key norms span every head (OLMo 2's), which tensor parallelism would split (an all-reduce per norm, not modelled); use parallel.tensor = 1, or FSDP", mp.tensor)));
    }
    if let Some(sw) = model.sliding_window.as_ref().filter(|sw| !sw.covers(seq_len)) {
        if mp.context > 1 {
            return Err(v.err("parallel.context", format!("{}: context parallelism over sliding-window attention (window {} tokens, sequence {seq_len}) is not modelled (the ring would skip blocks outside the window); use parallel.context = 1", mp.context, sw.window)));
        }
    }
    if let Some(l) = &f.lora {
        if model.moe.is_some() || model.mla.is_some() {
            return Err(v.err("lora", "LoRA on a mixture-of-experts or multi-head latent attention model is not simulated yet (adapters on the experts and latent projections); fine-tune a dense model, or simulate full training"));
        }
        if parallel.offload.as_ref().is_some_and(|o| o.parameters.is_some()) {
            return Err(v.err("offload.parameters", "parameter offload with LoRA is not simulated yet (the frozen base would stay on the GPU); offload the optimizer only"));
        }
        if t.precision.is_none() {
            // PEFT upcasts the adapters to FP32 (autocast_adapter_dtype=True) and the step
            // runs under BF16 autocast: FP32 adapters, gradients and Adam moments.
            precision.preset = "peft-lora (fp32 adapters, bf16 autocast)".into();
        }
        let wrap = f.parallel.wrap.as_deref();
        workload.lora = Some(validate_lora(&v, l, &model, &parallel, wrap, &precision)?);
    }
    let allocator = validate_allocator(&v, &f.allocator, &cluster)?;
    // Megatron-Core runs its blocks on Transformer Engine (--transformer-impl
    // transformer_engine, the default), whose GEMMs take their own workspace.
    let te_workspace = if parallel.framework == Framework::Megatron { cluster.gpu.te_workspace_bytes() } else { 0 };
    let training = TrainingConfig {
        precision: precision.clone(),
        blas_workspace: allocator.cublas_workspace,
        te_workspace,
        ..training
    };
    let jitter = match &f.jitter {
        None => None,
        Some(j) => {
            if j.seed < 0 {
                return Err(v.err("jitter.seed", format!("must be a non-negative integer, got {}", j.seed)));
            }
            if parallel.model_parallel.context > 1 {
                return Err(v.err("jitter", "[jitter] with context parallelism is not simulated yet (each ring step would wait for its peer); leave out [jitter] or parallel.context"));
            }
            if parallel.model_parallel.expert > 1 {
                return Err(v.err("jitter", "[jitter] with expert parallelism is not simulated yet (each rank's all-to-alls would have to wait for its peers); leave out [jitter] or parallel.expert"));
            }
            // Jitter simulates every data-parallel rank of every pipeline stage (a program
            // and an allocator each).
            let dp = parallel.model_parallel.data_parallel(gpus);
            let pp = parallel.model_parallel.pipeline;
            let ranks = dp * pp;
            if ranks > MAX_JITTER_RANKS {
                let what = if pp > 1 {
                    format!("{ranks} (data-parallel {dp} x pipeline {pp})")
                } else {
                    format!("{dp} (hardware.gpus / parallel.tensor)")
                };
                return Err(v.err(
                    "jitter",
                    format!("jitter simulates every data-parallel rank of every pipeline stage: at most {MAX_JITTER_RANKS}, got {what}; try the same per-rank noise on fewer GPUs"),
                ));
            }
            let cv = j.compute_cv.unwrap_or(0.0);
            if !(0.0..=1.0).contains(&cv) {
                return Err(v.err("jitter.compute_cv", format!("must be a fraction in [0, 1], got {cv}")));
            }
            let stragglers = match j.stragglers {
                Some(x) if x < 0 || x as u64 > ranks => {
                    return Err(v.err(
                        "jitter.stragglers",
                        format!(
                            "must be between 0 and the simulated ranks ({ranks}: data-parallel x pipeline), got {x}"
                        ),
                    ))
                }
                Some(x) => x as u64,
                None => 0,
            };
            let slow = j.straggler_slowdown.unwrap_or(0.0);
            if !(0.0..=10.0).contains(&slow) {
                return Err(v.err("jitter.straggler_slowdown", format!("must be a fraction in [0, 10], got {slow}")));
            }
            if stragglers > 0 && slow == 0.0 {
                return Err(v.err("jitter.straggler_slowdown", "stragglers need a slowdown > 0 (0.1 = 10% slower)"));
            }
            Some(crate::schedule::jitter::JitterConfig {
                seed: j.seed as u64,
                compute_cv: cv,
                stragglers,
                straggler_slowdown: slow,
            })
        }
    };
    let (routing, capacity) = moe::validate_routing(&v, f.moe.as_ref(), &model, &parallel)?;
    if model.moe.is_some() {
        workload.aux_loss =
            moe::validate_aux_loss(&v, f.moe.as_ref(), &parallel, hf.as_ref().is_some_and(|h| h.output_router_logits))?;
    }
    parallel.deepep = moe::validate_dispatcher(
        &v,
        f.moe.as_ref(),
        &model,
        &parallel,
        &routing,
        capacity.is_some(),
        u64::from(cluster.gpu.sms),
    )?;
    limits::check_tensors(&v, &model, &workload, inf.map(|(_, ctx)| ctx))?;
    if inf.is_none() {
        // [jitter] simulates every data-parallel replica of the model (its stages included);
        // uneven routing every expert-parallel rank, and the job twice more for its report.
        let ep = parallel.model_parallel.expert;
        let ranks = limits::simulated_ranks(
            jitter.is_some().then(|| parallel.model_parallel.data_parallel(gpus)),
            ep,
            (!routing.is_uniform() || capacity.is_some()) && ep > 1,
        );
        // A MoE block holds about twice a dense block's ops.
        limits::check_size(&v, model.size_layers(), steps, grad_accum, ranks)?;
    }
    let inference = match inf {
        Some((i, _)) => {
            if f.offload.is_some() {
                return Err(v.err(
                    "offload",
                    "optimizer offload applies to training jobs; remove [offload] for an inference job",
                ));
            }
            if f.allocator.empty_cache.is_some() {
                return Err(v.err("allocator.empty_cache", "the empty_cache() points are a training step's (after_forward, after_backward, ...); remove it for an inference job"));
            }
            let cfg = validate_inference(&v, i, &cluster, &parallel, f.jitter.is_some())?;
            let blas_workspace = validate_allocator(&v, &f.allocator, &cluster)?.cublas_workspace;
            Some(crate::infer::InferenceConfig { blas_workspace, ..cfg })
        }
        None => None,
    };
    let (training, workload) = match &inference {
        // The stand-in's dtypes are the job's: weights not quantized and activations in the
        // compute dtype; no dropout in eval mode (the DAG is built without it).
        Some(i) => {
            let mut tr = training;
            tr.precision = Precision::preset("bf16").unwrap_or(tr.precision);
            tr.precision.param = i.compute_dtype;
            tr.precision.compute = i.compute_dtype;
            tr.precision.grad = i.compute_dtype;
            tr.precision.optimizer_state = i.compute_dtype;
            tr.steps = 1;
            let mut w = workload;
            w.compute_dtype = i.compute_dtype;
            w.logits_fp32 = false;
            (tr, w)
        }
        None => (training, workload),
    };
    let name = f.name.clone().unwrap_or_else(|| stem.to_string());
    if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
        return Err(
            v.err("name", format!("\"{name}\" cannot name an output folder; use letters, digits, '-', '_' or '.'"))
        );
    }
    let nccl_config = nccl::validate_nccl(&v, f.nccl.as_ref(), &cluster)?;
    let nvls = nccl_config.nvls;
    let mut s = Scenario {
        name,
        description: f.description.clone().unwrap_or_default(),
        source: path.to_path_buf(),
        model_source,
        model,
        workload,
        cluster,
        parallel,
        training,
        allocator,
        jitter,
        routing,
        capacity,
        job,
        inference,
        nccl: nccl_config,
    };
    s.set_nvls(nvls);
    let held = s.nccl_bytes();
    if held >= s.cluster.capacity_bytes() {
        return Err(v.err(
            "allocator.nccl_buffers",
            format!(
                "NCCL's communicators ({held} bytes per GPU, {}) leave nothing of the {} bytes the CUDA context leaves",
                s.nccl_estimate().class,
                s.cluster.capacity_bytes()
            ),
        ));
    }
    Ok(s)
}

/// `training.torch_version`: "MAJOR.MINOR" of a PyTorch release stepsim knows the memory
/// behaviour of (1.10 to 2.15; default 2.15, the release its PyTorch models follow).
fn validate_torch_version(v: &V, x: Option<&str>) -> Result<(u16, u16), ScenarioError> {
    let Some(x) = x else { return Ok((2, 15)) };
    let bad = || {
        v.err(
            "training.torch_version",
            format!("\"{x}\" is not a PyTorch release stepsim models: write \"MAJOR.MINOR\" from \"1.10\" to \"2.15\" (e.g. \"2.0\")"),
        )
    };
    let mut parts = x.trim().split('.');
    let (Some(a), Some(b)) = (parts.next(), parts.next()) else { return Err(bad()) };
    let (Ok(major), Ok(minor)) = (a.parse::<u16>(), b.parse::<u16>()) else { return Err(bad()) };
    if parts.next().is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err(bad());
    }
    match (major, minor) {
        (1, 10..) | (2, 0..=15) => Ok((major, minor)),
        _ => Err(bad()),
    }
}

/// The 1-based line and column just after `before` (the text up to a position).
/// A scenario file's text: UTF-8, and no control character TOML refuses (errors with the
/// line and column, which the parser's own messages lack).
pub(crate) fn read_text(path: &Path) -> Result<String, ScenarioError> {
    let bytes =
        std::fs::read(path).map_err(|e| ScenarioError::new(path, "", format!("cannot read the scenario file: {e}")))?;
    let src = String::from_utf8(bytes).map_err(|e| {
        let ok = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let (line, col) = line_col(&String::from_utf8_lossy(ok));
        ScenarioError::new(
            path,
            "",
            format!("cannot read the scenario file: line {line}, column {col}: not UTF-8 text (TOML files are UTF-8)"),
        )
    })?;
    check_control(path, &src)?;
    Ok(src)
}

/// TOML allows no control character but tab (and CR before LF), even in a comment; the
/// parser's own message for one is empty.
fn check_control(path: &Path, src: &str) -> Result<(), ScenarioError> {
    let bad = src
        .char_indices()
        .find(|&(i, c)| c.is_control() && c != '\t' && c != '\n' && !(c == '\r' && src[i + 1..].starts_with('\n')));
    match bad {
        Some((i, c)) => {
            let (line, col) = line_col(&src[..i]);
            Err(ScenarioError::new(
                path,
                "",
                format!("line {line}, column {col}: control character U+{:04X} is not allowed in TOML, not even in a comment", c as u32),
            ))
        }
        None => Ok(()),
    }
}

fn line_col(before: &str) -> (usize, usize) {
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Turns an error from deserializing a `toml::Value` tree (no spans) into one that names the
/// dotted field: toml appends "in `a.b`" (the table or key) to its message; an unknown or
/// missing field adds its own name.
fn value_error(file: &Path, err: &toml::de::Error) -> ScenarioError {
    let msg = err.message().to_string();
    let full = err.to_string();
    let mut field = full
        .lines()
        .filter_map(|l| l.trim().strip_prefix("in `").and_then(|r| r.strip_suffix('`')))
        .next_back()
        .unwrap_or("")
        .to_string();
    for prefix in ["unknown field `", "missing field `"] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            let key = rest.split('`').next().unwrap_or("");
            if field.rsplit('.').next() != Some(key) {
                field = if field.is_empty() { key.to_string() } else { format!("{field}.{key}") };
            }
        }
    }
    ScenarioError::new(file, field, msg.replace('\n', " "))
}
