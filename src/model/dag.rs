//! The layer DAG: a transformer as the ops that matter for memory, each knowing its
//! parameters, its FLOPs, the tensors it writes and the tensors autograd saves for backward.
//!
//! Saved tensors follow what PyTorch's autograd keeps for each op (and what Korthikanti et
//! al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Sec. 4.1 count):
//! a linear layer saves its input; a norm saves its input and FP32 per-row statistics; an
//! element-wise activation saves its input; a product saves both factors; a residual add
//! saves nothing; the attention core saves q, k, v and its output (plus, for math attention,
//! the s x s softmax output, and with dropout the mask and dropped probabilities; for flash
//! attention the FP32 log-sum-exp instead). Views (split, transpose, reshape of contiguous
//! data) allocate nothing and share their base's storage.

use petgraph::graph::{DiGraph, NodeIndex};
use serde::Serialize;

use super::config::{
    Attention, AuxLoss, ContextComm, Dtype, Family, KernelStack, MlaConfig, ModelConfig, MoeConfig, NormPlacement,
    RoutedCopies, RoutingScale, Workload,
};
use crate::net::Collective;

/// Index of a tensor in [`LayerDag::tensors`].
pub type TensorId = usize;
/// Index of an op in [`LayerDag::ops`] (also its topological position).
pub type OpId = usize;

/// What a tensor is, for categorising memory and for selective recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// An activation flowing between ops (gets a gradient).
    Activation,
    /// Small per-row FP32 statistics a kernel keeps for its backward (norm rstd, flash LSE).
    Stats,
    /// A dropout mask, one byte per element.
    Mask,
    /// The s x s attention probabilities of math attention (what selective recompute drops).
    AttentionScores,
    /// Integer token ids or targets (no gradient).
    Index,
}

/// A tensor storage the graph allocates.
#[derive(Debug, Clone, Serialize)]
pub struct Tensor {
    pub name: String,
    pub bytes: u64,
    pub kind: TensorKind,
    pub producer: Option<OpId>,
}

/// Which FSDP unit / checkpoint region an op belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Region {
    /// Embeddings (root unit, forward side).
    Embed,
    /// Transformer block `i`.
    Block(u64),
    /// Final norm, LM head and loss (root unit, head side).
    Head,
}

/// The coarse op type, which decides its cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Embedding,
    Norm,
    Linear,
    Rope,
    AttentionCore,
    Elementwise,
    Dropout,
    Cast,
    Loss,
    /// A tensor-parallel collective ([`TpComm`]): no kernel of its own on the compute stream.
    TpComm,
}

/// A tensor-parallel collective between ops: Megatron's conjugate operators. `f` (before a
/// column-parallel linear) is the identity forward and an all-reduce of the input gradient
/// backward; `g` (after a row-parallel linear) all-reduces forward and is the identity
/// backward. With sequence parallelism the all-reduces become an all-gather of the sequence
/// one way and a reduce-scatter the other, and the column-parallel linear keeps only its
/// sequence shard for backward, all-gathering it again there (`backward_buffer`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TpComm {
    /// The process group the collective runs over.
    pub group: CommGroup,
    pub forward: Option<Collective>,
    pub backward: Option<Collective>,
    /// The full (unsharded) buffer the collective moves, bytes.
    pub bytes: u64,
    /// What the forward collective moves when it differs from the backward's: torchao's
    /// float8 tensor parallelism all-gathers a sequence-parallel input in FP8, while the
    /// gradient is reduce-scattered in 16 bits.
    pub forward_bytes: Option<u64>,
    /// A buffer the backward collective allocates (the re-gathered input of a sequence-
    /// parallel linear), freed after the backward of op `backward_buffer_until`.
    pub backward_buffer: u64,
    pub backward_buffer_until: Option<OpId>,
}

/// Which ranks a collective between ops runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommGroup {
    /// The tensor-parallel group (Megatron's `f` and `g`).
    Tensor,
    /// The expert-parallel group (MoE token dispatch and combine).
    Expert,
    /// The expert-tensor-parallel group (`--expert-tensor-parallel-size` consecutive ranks):
    /// the token dispatcher's all-gather of the received tokens before the experts and
    /// reduce-scatter of their output after.
    ExpertTensor,
    /// Tensor x context ranks (Megatron's `tp_cp_group`): the auxiliary losses' counts of
    /// tokens per expert.
    TensorContext,
    /// Every rank of the pipeline stage, tensor x data x context (`tp_dp_cp_group`): the
    /// global auxiliary loss's counts.
    Stage,
}

/// One op of the forward pass.
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    /// PyTorch-style qualified name, e.g. `layers.12.attention.wq`.
    pub name: String,
    pub kind: OpKind,
    pub region: Region,
    /// Parameter elements this op owns.
    pub params: u64,
    /// Parameters this op reads but another op owns (a tied LM head reads the embedding).
    pub shared_params: u64,
    /// Forward FLOPs (model FLOPs: 2 per multiply-add).
    pub fwd_flops: f64,
    /// Backward FLOPs as the kernels execute them.
    pub bwd_flops: f64,
    /// Bytes the forward kernel reads and writes (for memory-bound ops).
    pub fwd_bytes: f64,
    /// Bytes the backward kernels read and write, where they are not the generic twice the
    /// forward's (see [`Op::backward_bytes`]).
    pub bwd_bytes: Option<f64>,
    /// Bytes of memory-bound kernels the op runs one after another with its matmuls, forward
    /// and backward (math attention's scale-mask-softmax and dropout passes over the b a s^2
    /// scores): their time adds to the roofline of the matmuls instead of hiding under it.
    pub chain_bytes: [f64; 2],
    /// Hugging Face's eager attention: the shape of its batched GEMMs over the scores, each
    /// timed by the GEMM kernel model or its traffic over the scores at the measured bandwidth
    /// of PyTorch's kernels there (`crate::schedule::scores_rates`), as are `chain_bytes`.
    /// None for Megatron's CoreAttention (math attention), timed as one roofline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scores: Option<ScoresShape>,
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<TensorId>,
    /// Tensors autograd keeps alive for this op's backward.
    pub saves: Vec<TensorId>,
    /// Scratch the forward kernel needs while it runs (freed when it ends).
    pub fwd_scratch: u64,
    /// Scratch the backward kernels need while they run (freed when they end).
    #[serde(skip_serializing_if = "is_zero")]
    pub bwd_scratch: u64,
    /// For matmuls: (M, N, K) of the forward GEMM (tokens, output features, input features),
    /// which decides how well it fills the GPU.
    pub gemm: Option<[u64; 3]>,
    /// Split across tensor-parallel ranks (its FLOPs are 1/t of the model's).
    pub tp_sharded: bool,
    /// A weight duplicated over the tensor-parallel group and run on each rank's sequence
    /// shard (MLA's down projections under sequence parallelism): its gradient is partial,
    /// and Megatron all-reduces it over the group once per step.
    pub tp_partial_grad: bool,
    /// A column-parallel linear reading the output of an `f` collective (its backward
    /// overlaps that collective with its weight-gradient GEMM).
    pub column_parallel: bool,
    pub comm: Option<TpComm>,
    /// LoRA: elements of the frozen base weights this op holds (no gradient, no optimizer
    /// state), and their bytes as stored; `params` are then the adapters' (see model::lora).
    pub frozen_params: u64,
    pub frozen_bytes: u64,
    /// LoRA with a block's frozen base and its adapters in one FSDP1 FlatParameter
    /// (`use_orig_params=True`, [`super::LoraConfig::shared_flat`]): of `params`, the frozen
    /// base's elements. The FlatParameter requires grad, so autograd computes their
    /// gradients (weight-gradient GEMMs, saved inputs) and FSDP1 reduces and keeps them like
    /// any parameter's; only the optimizer, which never receives them, holds no state.
    pub flat_frozen: u64,
    /// A routed expert's weights: sharded by expert parallelism, replicated over the
    /// expert-data-parallel group, and its gradients reduced there.
    pub expert: bool,
    /// FP8 training: this linear's GEMMs run on the FP8 tensor cores ([`super::fp8`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp8: Option<Fp8Gemm>,
    /// Context parallelism: the keys and values of this rank's tokens, bytes, that the
    /// attention core passes to the next context-parallel rank at each ring step (and, in
    /// backward, with their gradients).
    #[serde(skip_serializing_if = "is_zero")]
    pub cp_kv_bytes: u64,
    /// Kernels the op launches, forward and backward: one, or an eager chain's
    /// ([`super::eager`]), each paying the launch overhead.
    #[serde(skip_serializing_if = "one_launch")]
    pub launches: [u32; 2],
    /// An attention core run by a fused kernel timed at its measured rates
    /// (`crate::schedule::flash_rates`). None: Megatron's default fused attention (the
    /// end-to-end fit) or math attention.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flash: Option<FlashOp>,
}

/// Materialised attention's batched GEMMs: `batch` = micro-batch x this rank's query heads
/// matrices of `queries` x `keys` scores, heads `qk` wide for the scores and `v` wide for
/// the values, in `bytes`-byte elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ScoresShape {
    pub batch: u64,
    pub queries: u64,
    pub keys: u64,
    pub qk: u64,
    pub v: u64,
    pub bytes: u64,
}

/// What sets a fused attention kernel's measured rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FlashOp {
    pub kernel: super::FlashKernel,
    /// The keys each query block meets.
    pub keys: u64,
    pub head_dim: u64,
}

fn one_launch(x: &[u32; 2]) -> bool {
    *x == [1, 1]
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// Which of an FP8 linear's three GEMMs run in FP8: the forward and the input gradient
/// always, the weight gradient as the recipe says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Fp8Gemm {
    pub wgrad: bool,
}

static NEXT_DAG_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The model as a petgraph DAG of ops (edges carry the tensor flowing between them).
#[derive(Debug, Clone)]
pub struct LayerDag {
    pub ops: Vec<Op>,
    pub tensors: Vec<Tensor>,
    pub graph: DiGraph<OpId, TensorId>,
    /// Token ids fed to the embedding, and targets read by the loss.
    pub inputs: Vec<TensorId>,
    /// Constant buffers (rotary tables), bytes.
    pub buffer_bytes: u64,
    pub config: ModelConfig,
    pub workload: Workload,
    /// Set by [`super::lora::apply`]: a frozen base with adapters.
    pub lora: Option<super::lora::LoraConfig>,
    /// Unique to each [`build`] (a clone keeps it): tables derived from the DAG are cached by
    /// it across the configurations of a sweep that share the DAG
    /// ([`crate::schedule::checkpoint::plan`]). A DAG is not changed after it is built.
    pub id: u64,
}

impl Op {
    /// An op of `params` parameters with no FLOPs, bytes or tensors yet (the rest filled in
    /// by whoever builds it).
    pub fn new(name: String, kind: OpKind, region: Region, params: u64) -> Op {
        Op {
            name,
            kind,
            region,
            params,
            shared_params: 0,
            fwd_flops: 0.0,
            bwd_flops: 0.0,
            fwd_bytes: 0.0,
            bwd_bytes: None,
            chain_bytes: [0.0, 0.0],
            scores: None,
            inputs: vec![],
            outputs: vec![],
            saves: vec![],
            fwd_scratch: 0,
            bwd_scratch: 0,
            gemm: None,
            tp_sharded: false,
            tp_partial_grad: false,
            column_parallel: false,
            comm: None,
            frozen_params: 0,
            flat_frozen: 0,
            frozen_bytes: 0,
            expert: false,
            fp8: None,
            cp_kv_bytes: 0,
            launches: [1, 1],
            flash: None,
        }
    }

    /// Bytes the backward moves (activations and gradients, not weights): the op's own
    /// figure, else twice the forward's (a backward reads what the forward read plus the
    /// output gradient and writes the input gradients).
    pub fn backward_bytes(&self) -> f64 {
        self.bwd_bytes.unwrap_or(2.0 * self.fwd_bytes)
    }

    /// The weight-gradient GEMM of a frozen base weight that autograd differentiates only
    /// because it shares a FlatParameter with trainable adapters ([`Op::flat_frozen`]): the
    /// forward's FLOPs of the base GEMM.
    pub fn wasted_wgrad_flops(&self) -> f64 {
        match self.gemm {
            Some([m, n, k]) if self.flat_frozen > 0 => 2.0 * (m * n * k) as f64,
            _ => 0.0,
        }
    }
}

impl LayerDag {
    /// Parameters counted from the ops (checked against the closed form in tests): the
    /// trainable ones and, under LoRA, the frozen base.
    pub fn param_count(&self) -> u64 {
        self.ops.iter().map(|o| o.params + o.frozen_params).sum()
    }
    pub fn region_params(&self, r: Region) -> u64 {
        self.ops.iter().filter(|o| o.region == r).map(|o| o.params).sum()
    }
    /// Ops in forward (topological) order.
    pub fn ops_of(&self, r: Region) -> impl Iterator<Item = (OpId, &Op)> {
        self.ops.iter().enumerate().filter(move |(_, o)| o.region == r)
    }
    /// Bytes of tensors saved for backward by the ops of a region (each storage once),
    /// optionally leaving out per-row statistics.
    pub fn saved_bytes(&self, r: Region, include_stats: bool) -> u64 {
        let mut seen = vec![false; self.tensors.len()];
        let mut total = 0;
        for (_, op) in self.ops_of(r) {
            for &t in &op.saves {
                if !seen[t] && (include_stats || self.tensors[t].kind != TensorKind::Stats) {
                    seen[t] = true;
                    total += self.tensors[t].bytes;
                }
            }
        }
        total
    }
    /// FLOPs this rank executes in one forward pass of one micro-batch.
    pub fn forward_flops(&self) -> f64 {
        self.ops.iter().map(|o| o.fwd_flops).sum()
    }
    /// Model FLOPs of one forward pass of one micro-batch of the whole model (every
    /// tensor-parallel rank's share of the split ops, replicated ops once).
    pub fn model_forward_flops(&self) -> f64 {
        let t = self.workload.split.tensor as f64;
        // Under sequence parallelism each tensor-parallel rank routes its own tokens to the
        // experts: the experts' work is split t ways too (expert tensor parallelism leaves a
        // rank's expert FLOPs as they are: etp x the copies at 1/etp of the width).
        let sp = self.workload.split.sequence_parallel;
        let split = |o: &Op| o.tp_sharded || (o.expert && sp);
        self.ops.iter().map(|o| if split(o) { o.fwd_flops * t } else { o.fwd_flops }).sum()
    }
    /// Elements of the word embedding a pipeline's last stage holds a copy of when it is
    /// not the first: the LM head's weight when tied, and the embedding multi-token
    /// prediction looks its tokens up in (Megatron-Core `LanguageModule.
    /// setup_embeddings_and_output_layer`: "if use Multi-Token Prediction (MTP), we also need
    /// to maintain duplicated embedding weights in mtp process stage"; one copy serves both),
    /// whose gradients `_allreduce_word_embedding_grads` all-reduces with the first stage's.
    pub fn embedding_copy_params(&self) -> u64 {
        self.ops.iter().filter(|o| o.region == Region::Head).map(|o| o.shared_params).max().unwrap_or(0)
    }
    /// Blocks of the DAG: the model's and the multi-token prediction modules'
    /// ([`ModelConfig::blocks`]).
    pub fn blocks(&self) -> u64 {
        self.config.blocks()
    }
    /// Tokens of a micro-batch this rank holds (its share of each sequence under context
    /// parallelism).
    pub fn tokens(&self) -> u64 {
        self.workload.micro_batch * self.workload.seq_len / self.workload.split.context.max(1)
    }
}

struct Builder {
    ops: Vec<Op>,
    tensors: Vec<Tensor>,
    region: Region,
    /// Tensor-parallel degree and sequence parallelism.
    tp: u64,
    sp: bool,
    /// Context-parallel degree.
    cp: u64,
    /// Bytes of the whole hidden state of a micro-batch (what TP collectives move).
    full: u64,
    /// The tensor the last `f` collective handed to column-parallel linears.
    f_out: Option<TensorId>,
    /// SwiGLU as one fused kernel ([`Workload::fused_swiglu`]).
    fused_swiglu: bool,
    /// Where the routing probabilities scale the copies ([`Workload::routing_scale`]), with
    /// `InActivation` only where the SwiGLU is fused.
    routing_scale: RoutingScale,
    /// The fused SwiGLU saves an FP8 copy of its input ([`Workload::swiglu_fp8_input_store`]).
    swiglu_fp8_input_store: bool,
    /// The model's norms have no parameters (OLMo's).
    weightless_norms: bool,
    /// The kernels of the memory-bound ops ([`Workload::kernels`]).
    kernels: KernelStack,
    /// The auxiliary load-balancing loss ([`Workload::aux_loss`]).
    aux_loss: AuxLoss,
    /// Every MoE block's router logits, which Hugging Face's load-balancing loss reads at the
    /// end of the forward ([`AuxLoss::AllBlocks`]).
    router_logits: Vec<TensorId>,
    /// Bytes per element of each tensor, by [`TensorId`]: what a GEMM's shape is read from
    /// and what a cast or a type-promoting op sees (QLoRA's FP32 stream beside 16-bit
    /// attention).
    elem: Vec<u64>,
    /// The residual stream's element bytes: `c`, or 4 under QLoRA's
    /// `prepare_model_for_kbit_training` (PEFT, `utils/other.py`), which upcasts every
    /// parameter that is not 4-bit to FP32. The FP32 embedding then writes FP32 hidden states;
    /// `LlamaRMSNorm` returns `self.weight * hidden_states.to(input_dtype)`, FP32 with an FP32
    /// weight; bitsandbytes' `Linear4bit.forward` casts its input to the compute dtype and
    /// returns `matmul_4bit(...).to(inp_dtype)`, FP32 again; rotary, SiLU, the product and the
    /// residual adds are not autocast ops. Only SDPA (an autocast lower-precision op, which
    /// casts q, k and v) and o_proj after it run in 16 bits, and o_proj's output is promoted
    /// back to FP32 by the residual add (bitsandbytes#1515: the last hidden state is FP32).
    stream: u64,
}

impl Builder {
    /// A tensor written by the op about to be added (the next index).
    fn tensor(&mut self, name: &str, elems: u64, bytes_per: u64, kind: TensorKind) -> TensorId {
        self.tensors.push(Tensor {
            name: name.to_string(),
            bytes: elems * bytes_per,
            kind,
            producer: Some(self.ops.len()),
        });
        self.elem.push(bytes_per);
        self.tensors.len() - 1
    }
    fn input(&mut self, name: &str, elems: u64) -> TensorId {
        self.tensors.push(Tensor { name: name.to_string(), bytes: elems * 8, kind: TensorKind::Index, producer: None });
        self.elem.push(8);
        self.tensors.len() - 1
    }
    #[allow(clippy::too_many_arguments)]
    fn op(
        &mut self,
        name: String,
        kind: OpKind,
        params: u64,
        flops: (f64, f64),
        inputs: Vec<TensorId>,
        outputs: Vec<TensorId>,
        saves: Vec<TensorId>,
    ) -> OpId {
        let io_bytes: u64 = inputs.iter().chain(outputs.iter()).map(|&t| self.tensors[t].bytes).sum();
        self.ops.push(Op {
            fwd_flops: flops.0,
            bwd_flops: flops.1,
            fwd_bytes: io_bytes as f64,
            inputs,
            outputs,
            saves,
            ..Op::new(name, kind, self.region, params)
        });
        self.ops.len() - 1
    }

    /// An op split across tensor-parallel ranks: `flops` are the whole op's, this rank runs
    /// 1/t of them.
    #[allow(clippy::too_many_arguments)]
    fn op_tp(
        &mut self,
        name: String,
        kind: OpKind,
        params: u64,
        flops: (f64, f64),
        inputs: Vec<TensorId>,
        outputs: Vec<TensorId>,
        saves: Vec<TensorId>,
    ) -> OpId {
        let t = self.tp as f64;
        let column = self.tp > 1 && kind == OpKind::Linear && inputs.first() == self.f_out.as_ref();
        let id = self.op(name, kind, params, (flops.0 / t, flops.1 / t), inputs, outputs, saves);
        self.ops[id].tp_sharded = self.tp > 1;
        self.ops[id].column_parallel = column;
        id
    }

    fn comm_op(&mut self, name: String, inputs: Vec<TensorId>, outputs: Vec<TensorId>, comm: TpComm) -> OpId {
        let id = self.op(name, OpKind::TpComm, 0, (0.0, 0.0), inputs, outputs, vec![]);
        self.ops[id].fwd_bytes = 0.0;
        self.ops[id].comm = Some(comm);
        id
    }

    fn tp_comm(&self, forward: Option<Collective>, backward: Option<Collective>) -> TpComm {
        self.tp_comm_of(self.full, forward, backward)
    }

    /// A tensor-parallel collective of a tensor whose whole (unsharded) size is `full` bytes.
    fn tp_comm_of(&self, full: u64, forward: Option<Collective>, backward: Option<Collective>) -> TpComm {
        TpComm {
            group: CommGroup::Tensor,
            forward,
            backward,
            bytes: full,
            forward_bytes: None,
            backward_buffer: 0,
            backward_buffer_until: None,
        }
    }

    /// Megatron's `f` before a column-parallel linear; returns the tensor the linear reads
    /// (`x` itself, or with sequence parallelism the all-gathered sequence).
    fn f_op(&mut self, name: &str, x: TensorId, c: u64) -> TensorId {
        self.f_op_of(name, x, self.full, c)
    }

    /// [`Self::f_op`] for a tensor of `full` bytes whole (MLA's latents, narrower than the
    /// hidden state).
    fn f_op_of(&mut self, name: &str, x: TensorId, full: u64, c: u64) -> TensorId {
        if self.tp == 1 {
            return x;
        }
        if !self.sp {
            let comm = self.tp_comm_of(full, None, Some(Collective::AllReduce));
            self.comm_op(format!("{name}.tp_copy"), vec![x], vec![], comm);
            self.f_out = Some(x);
            return x;
        }
        let out = self.tensor(&format!("{name}.sp_all_gather.out"), full / c, c, TensorKind::Activation);
        let comm = self.tp_comm_of(full, Some(Collective::AllGather), Some(Collective::ReduceScatter));
        self.comm_op(format!("{name}.sp_all_gather"), vec![x], vec![out], comm);
        self.f_out = Some(out);
        out
    }

    /// Sequence parallelism: the column-parallel linears from op `first` on kept only their
    /// input's shard, so backward all-gathers it again for their weight gradients.
    fn regather_op(&mut self, name: &str, first: OpId) {
        self.regather_op_of(name, first, self.full)
    }

    /// [`Self::regather_op`] for an input of `full` bytes whole.
    fn regather_op_of(&mut self, name: &str, first: OpId, full: u64) {
        if self.tp > 1 && self.sp {
            let mut comm = self.tp_comm_of(full, None, Some(Collective::AllGather));
            comm.backward_buffer = full;
            comm.backward_buffer_until = Some(first);
            self.comm_op(format!("{name}.sp_regather"), vec![], vec![], comm);
        }
    }

    /// Megatron's `g` after a row-parallel linear: the partial sums `y` are all-reduced in
    /// place (or reduce-scattered to this rank's sequence shard).
    fn g_op(&mut self, name: &str, y: TensorId, c: u64) -> TensorId {
        if self.tp == 1 {
            return y;
        }
        if !self.sp {
            let comm = self.tp_comm(Some(Collective::AllReduce), None);
            self.comm_op(format!("{name}.tp_all_reduce"), vec![y], vec![], comm);
            return y;
        }
        let shard = self.full / c / self.tp;
        let out = self.tensor(&format!("{name}.sp_reduce_scatter.out"), shard, c, TensorKind::Activation);
        let comm = self.tp_comm(Some(Collective::ReduceScatter), Some(Collective::AllGather));
        self.comm_op(format!("{name}.sp_reduce_scatter"), vec![y], vec![out], comm);
        out
    }
}

/// Builds the DAG of one micro-batch's forward pass on one tensor-parallel rank
/// (`w.split`; the whole model when the degree is 1).
pub fn build(cfg: &ModelConfig, w: &Workload) -> LayerDag {
    let (b, s, h, f, v) = (w.micro_batch, w.seq_len, cfg.hidden, cfg.ffn_hidden, cfg.vocab);
    // Context parallelism: every op but attention's key-value side sees this rank's share of
    // each sequence.
    let cp = w.split.context.max(1);
    let sl = s / cp;
    let t = b * sl;
    let c = w.compute_dtype.bytes();
    // The residual stream's element bytes: the compute dtype's, or FP32 where QLoRA's
    // prepare_model_for_kbit_training left FP32 embeddings and norms ([`Builder::stream`]).
    let sc = if w.lora.as_ref().is_some_and(|l| l.fp32_stream()) { 4 } else { c };
    let tp = w.split.tensor.max(1);
    let sp = w.split.sequence_parallel && tp > 1;
    // Rows of the hidden state this rank holds outside the tensor-parallel regions.
    let rows = if sp { t / tp } else { t };
    let a = cfg.n_heads / tp;
    let kvd = cfg.kv_dim() / tp;
    // The query heads' width (hidden unless head_dim says otherwise), whole and per rank.
    let qd = cfg.q_dim();
    let qt = qd / tp;
    let mut bd = Builder {
        ops: Vec::new(),
        tensors: Vec::new(),
        region: Region::Embed,
        tp,
        sp,
        cp,
        full: t * h * c,
        f_out: None,
        fused_swiglu: w.fused_swiglu,
        routing_scale: match w.routing_scale {
            RoutingScale::InActivation if !w.fused_swiglu => RoutingScale::AfterCombine,
            r => r,
        },
        swiglu_fp8_input_store: w.swiglu_fp8_input_store && w.fused_swiglu,
        weightless_norms: cfg.style.weightless_norms,
        kernels: w.kernels,
        aux_loss: w.aux_loss,
        router_logits: Vec::new(),
        elem: Vec::new(),
        stream: sc,
    };
    // The norm of the hidden state: the family's, or OLMo's weightless LayerNorm.
    let nfam = if cfg.style.weightless_norms { Family::Gpt } else { cfg.family };
    let (pre_norm, post_norm) = match cfg.style.norms {
        NormPlacement::Pre => (true, false),
        NormPlacement::Post => (false, true),
        NormPlacement::Sandwich => (true, true),
    };
    let tokens = bd.input("tokens", t);
    let targets = bd.input("targets", t);

    // Embedding: a gather; backward scatters into the weight gradient and keeps the ids.
    // Vocabulary-parallel under TP: each rank looks up its slice and the partial sums meet
    // in a `g` collective.
    let x0 = bd.tensor("tok_embeddings.out", t * h, sc, TensorKind::Activation);
    let emb =
        bd.op("tok_embeddings".into(), OpKind::Embedding, v * h / tp, (0.0, 0.0), vec![tokens], vec![x0], vec![tokens]);
    bd.ops[emb].tp_sharded = tp > 1;
    let mut x = bd.g_op("tok_embeddings", x0, c);
    if let Some(table) = cfg.position_table() {
        let y = bd.tensor("pos_embeddings.out", rows * h, c, TensorKind::Activation);
        bd.op(
            "pos_embeddings".into(),
            OpKind::Embedding,
            table * h,
            ((rows * h) as f64, 0.0),
            vec![x],
            vec![y],
            vec![],
        );
        x = y;
    }
    if cfg.embedding_norm {
        x = norm_op(&mut bd, cfg.family, "word_embeddings_layernorm", x, rows, h, sc);
    }
    let dropout = cfg.dropout > 0.0;
    // The embeddings' dropout (Megatron-LM `embedding_dropout`, GPT-2's `drop`).
    if dropout && cfg.family == Family::Gpt {
        x = dropout_op(&mut bd, "embedding_dropout", x, rows * h, false);
    }

    let shape =
        BlockShape { cfg, w, b, s, sl, t, h, f, c, tp, cp, rows, a, kvd, qd, qt, nfam, pre_norm, post_norm, dropout };
    for l in 0..cfg.n_layers {
        bd.region = Region::Block(l);
        x = block(&mut bd, &shape, &format!("layers.{l}"), l, x);
    }

    // --- head (a column-parallel LM head and vocabulary-parallel cross-entropy under TP)
    bd.region = Region::Head;
    let nf = norm_op(&mut bd, nfam, "norm", x, rows, h, sc);
    let vt = v / tp;
    let head_params = if cfg.tie_embeddings { 0 } else { vt * h };
    // Multi-token prediction: its modules, heads and losses come first (Megatron-Core's
    // `GPTModel._postprocess` runs `self.mtp` and `process_mtp_loss` before the main head),
    // and the main head reads its chunk of the hidden states they were concatenated into.
    let head_in = match &cfg.mtp {
        Some(m) => mtp_modules(&mut bd, &shape, m.layers, nf, [tokens, targets]),
        None => nf,
    };
    let nf_in = bd.f_op("output", head_in, c);
    if w.loss == super::config::LossKind::FusedLinear {
        fused_linear_cross_entropy(&mut bd, cfg, nf, targets, HeadShape { t, h, v, c, head_params });
    } else {
        let shared = if cfg.tie_embeddings { vt * h } else { 0 };
        lm_head_loss(&mut bd, &shape, "", [nf_in, head_in], targets, (head_params, shared));
    }
    if let Some(moe) = cfg.moe.as_ref().filter(|_| !bd.router_logits.is_empty()) {
        load_balancing_loss(&mut bd, moe, rows, c);
    }

    // cos and sin tables, FP32, max_seq_len x the rotary dimensions each.
    let buffer_bytes = cfg.rotary_dims().map_or(0, |d| 2 * cfg.max_seq_len * d * 4);
    // GEMM shapes of the linear layers, from their input and output tensors.
    for op in bd.ops.iter_mut().filter(|o| o.kind == OpKind::Linear && o.gemm.is_none()) {
        let (x, y) = (op.inputs[0], op.outputs[0]);
        let k = bd.tensors[x].bytes / (t * bd.elem[x]);
        let n = bd.tensors[y].bytes / (t * bd.elem[y]);
        op.gemm = Some([t, n, k]);
    }
    let mut graph = DiGraph::new();
    let nodes: Vec<NodeIndex> = (0..bd.ops.len()).map(|i| graph.add_node(i)).collect();
    for (i, op) in bd.ops.iter().enumerate() {
        for &t in &op.inputs {
            if let Some(p) = bd.tensors[t].producer {
                if p != i {
                    graph.add_edge(nodes[p], nodes[i], t);
                }
            }
        }
    }
    let mut dag = LayerDag {
        ops: bd.ops,
        tensors: bd.tensors,
        graph,
        inputs: vec![tokens, targets],
        buffer_bytes,
        config: cfg.clone(),
        workload: w.clone(),
        lora: None,
        id: NEXT_DAG_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    if let Some(l) = &w.lora {
        super::lora::apply(&mut dag, l, c);
    }
    if let Some(f) = &w.fp8 {
        super::fp8::apply(&mut dag, f, c);
    }
    dag
}

/// What every block of one rank's DAG shares: the model, the workload and the shapes
/// [`build`] derives from them.
struct BlockShape<'a> {
    cfg: &'a ModelConfig,
    w: &'a Workload,
    b: u64,
    s: u64,
    sl: u64,
    t: u64,
    h: u64,
    f: u64,
    c: u64,
    tp: u64,
    cp: u64,
    rows: u64,
    a: u64,
    kvd: u64,
    qd: u64,
    qt: u64,
    nfam: Family,
    pre_norm: bool,
    post_norm: bool,
    dropout: bool,
}

/// One transformer block over the hidden state `x`, its ops named `name`.`op` in the
/// builder's current region: attention, then the MLP (a mixture of experts when block
/// `spec` of the model is one; local attention when block `spec` is local). Returns the
/// block's output.
fn block(bd: &mut Builder, sh: &BlockShape, name: &str, spec: u64, x: TensorId) -> TensorId {
    let BlockShape { cfg, w, b, s, sl, t, h, f, c, tp, cp, rows, a, kvd, qd, qt, nfam, pre_norm, post_norm, dropout } =
        *sh;
    let sc = bd.stream;
    let l = spec;
    let tf = t as f64;
    let lin = |i: u64, o: u64| (2.0 * tf * i as f64 * o as f64, 4.0 * tf * i as f64 * o as f64);
    let p = |n: &str| format!("{name}.{n}");
    // --- attention half
    let n1 = if pre_norm { norm_op(bd, nfam, &p("attention_norm"), x, rows, h, sc) } else { x };
    // MLA's down projections read this rank's rows as they are; its latents are gathered.
    let n1_in = if cfg.mla.is_some() { n1 } else { bd.f_op(&p("attention"), n1, c) };
    let (mut q, mut k, mut vv);
    let mut fused_qkv = None;
    let first_qkv = bd.ops.len();
    match cfg.family {
        Family::Llama if cfg.mla.is_some() => {
            let mla = cfg.mla.as_ref().expect("matched");
            (q, k, vv) = mla_qkv(bd, &p("attention"), mla, n1, MlaShape { t, rows, h, heads: a, c });
        }
        Family::Llama => {
            // Biases add their elements to the (column-parallel, so split) projections.
            let (qb, kvb) = if cfg.qkv_bias { (qt, kvd) } else { (0, 0) };
            let q0 = bd.tensor(&p("attention.wq.out"), t * qt, sc, TensorKind::Activation);
            bd.op_tp(p("attention.wq"), OpKind::Linear, h * qt + qb, lin(h, qd), vec![n1_in], vec![q0], vec![n1]);
            let k0 = bd.tensor(&p("attention.wk.out"), t * kvd, sc, TensorKind::Activation);
            let kp = h * kvd + kvb;
            bd.op_tp(p("attention.wk"), OpKind::Linear, kp, lin(h, kvd * tp), vec![n1_in], vec![k0], vec![n1]);
            vv = bd.tensor(&p("attention.wv.out"), t * kvd, sc, TensorKind::Activation);
            bd.op_tp(p("attention.wv"), OpKind::Linear, kp, lin(h, kvd * tp), vec![n1_in], vec![vv], vec![n1]);
            bd.regather_op(&p("attention"), first_qkv);
            // Qwen3's q_norm / k_norm: an RMSNorm over each head's head_dim (rows are
            // tokens x this rank's heads), one weight vector shared by the heads.
            let (q0, k0) = if cfg.qk_norm && cfg.style.qk_norm_full_width {
                // OLMo 2's: one RMSNorm over all of a token's query heads (and key heads);
                // whole heads on one rank (tensor parallelism is refused with it).
                let qn = norm_op(bd, Family::Llama, &p("attention.q_norm"), q0, t, qt, sc);
                let kn = norm_op(bd, Family::Llama, &p("attention.k_norm"), k0, t, kvd, sc);
                (qn, kn)
            } else if cfg.qk_norm {
                let hd = cfg.head_dim();
                let qn = norm_op(bd, Family::Llama, &p("attention.q_norm"), q0, t * a, hd, sc);
                let kn = norm_op(bd, Family::Llama, &p("attention.k_norm"), k0, t * kvd / hd, hd, sc);
                (qn, kn)
            } else {
                (q0, k0)
            };
            // Rotary: q*cos + rotate_half(q)*sin; mul by a constant buffer saves only the
            // buffer, cat saves nothing, so nothing of q or k is kept.
            q = bd.tensor(&p("attention.rope.q"), t * qt, sc, TensorKind::Activation);
            k = bd.tensor(&p("attention.rope.k"), t * kvd, sc, TensorKind::Activation);
            let id = bd.op_tp(
                p("attention.rope"),
                OpKind::Rope,
                0,
                (6.0 * tf * (qd + kvd * tp) as f64, 6.0 * tf * (qd + kvd * tp) as f64),
                vec![q0, k0],
                vec![q, k],
                vec![],
            );
            // q*cos and rotate_half(q) live while the sum is formed.
            bd.ops[id].fwd_scratch = 2 * t * qt * sc;
            // Over FP32 q and k ([`Builder::stream`]) no cast brackets Hugging Face's chain.
            let cost = if sc != c { super::eager::rope_unfused(sc) } else { super::eager::rope(c) };
            eager_rope(bd, id, t * (qt + kvd), t * qt, cost);
            if kvd < qt && w.repeat_kv {
                (k, vv) = repeat_kv(bd, &p("attention"), [k, vv], [t * kvd, t * qt], sc);
            }
            if sc != c {
                [q, k, vv] = sdpa_cast(bd, &p("attention.sdpa_cast"), [q, k, vv], c);
            }
        }
        Family::Gpt => {
            // One fused projection: this rank's query heads, then its key and value heads
            // (fewer under grouped-query attention, Megatron's --group-query-attention).
            let width = qt + 2 * kvd;
            let qkv = bd.tensor(&p("attn.c_attn.out"), t * width, c, TensorKind::Activation);
            bd.op_tp(
                p("attn.c_attn"),
                OpKind::Linear,
                (h + 1) * width,
                lin(h, width * tp),
                vec![n1_in],
                vec![qkv],
                vec![n1],
            );
            bd.regather_op(&p("attn"), first_qkv);
            fused_qkv = Some(qkv);
            vv = qkv;
            match cfg.style.rotary_dims {
                // q, k, v are views of the fused projection's output.
                None => (q, k) = (qkv, qkv),
                // GPT-NeoX: the first `rd` dimensions of each query and key head turned and
                // concatenated with the rest into new q and k (cat saves nothing); v stays
                // a view of the fused output, which attention's saved v keeps whole.
                Some(rd) => {
                    q = bd.tensor(&p("attention.rope.q"), t * qt, c, TensorKind::Activation);
                    k = bd.tensor(&p("attention.rope.k"), t * qt, c, TensorKind::Activation);
                    let turned = 2 * cfg.n_heads * rd;
                    let id = bd.op_tp(
                        p("attention.rope"),
                        OpKind::Rope,
                        0,
                        (6.0 * tf * turned as f64, 6.0 * tf * turned as f64),
                        vec![qkv],
                        vec![q, k],
                        vec![],
                    );
                    // x*cos and rotate_half(x) of the turned part live while they are summed.
                    bd.ops[id].fwd_scratch = 2 * t * (turned / tp) * c;
                    eager_rope(bd, id, t * turned / tp, t * turned / tp / 2, super::eager::rope(c));
                }
            }
            if kvd < qt && w.repeat_kv {
                (k, vv) = repeat_kv(bd, &p("attention"), [qkv, qkv], [t * kvd, t * qt], c);
            }
        }
    }
    // Each head's query and key width, and its value and output width (MLA's differ).
    let (qk_w, v_w) =
        cfg.mla.as_ref().map_or((qd, qd), |m| (cfg.n_heads * m.qk_head_dim(), cfg.n_heads * m.v_head_dim));
    let (qd, qt) = (v_w, v_w / tp);
    let o = bd.tensor(&p("attention.core.out"), t * qt, c, TensorKind::Activation);
    // Q K^T over the query/key width, then P V over the value width.
    // Under context parallelism this rank's queries (s / cp) meet every key (s).
    let att_f = 2.0 * (b * sl * s) as f64 * (qk_w + v_w) as f64;
    // A local block's flash kernel computes only the window's band of the causal square;
    // math attention computes every score and masks them.
    let local = cfg.sliding_window.as_ref().filter(|sw| sw.window_of(l).is_some() && !sw.covers(s));
    let att_f = match local {
        Some(sw) if w.attention == Attention::Flash => att_f * sw.share(s),
        _ => att_f,
    };
    let mut saves = vec![q];
    for x in [k, vv] {
        if !saves.contains(&x) {
            saves.push(x);
        }
    }
    let mut outs = vec![o];
    match w.attention {
        Attention::Flash => {
            let lse = bd.tensor(&p("attention.core.lse"), b * a * sl, 4, TensorKind::Stats);
            outs.push(lse);
            saves.push(o);
            saves.push(lse);
        }
        Attention::Math | Attention::Eager => {
            if w.attention == Attention::Eager && c != 4 {
                // softmax(..., dtype=torch.float32) saves its FP32 output for its backward;
                // `.to(query.dtype)` makes the 16-bit copy the next matmul saves.
                let p32 = bd.tensor(&p("attention.core.softmax_fp32"), b * a * s * s, 4, TensorKind::AttentionScores);
                outs.push(p32);
                saves.push(p32);
            }
            let probs = bd.tensor(&p("attention.core.softmax"), b * a * s * s, c, TensorKind::AttentionScores);
            outs.push(probs);
            saves.push(probs);
            if dropout {
                let mask = bd.tensor(&p("attention.core.dropout_mask"), b * a * s * s, 1, TensorKind::AttentionScores);
                let dp = bd.tensor(&p("attention.core.dropout_out"), b * a * s * s, c, TensorKind::AttentionScores);
                outs.push(mask);
                outs.push(dp);
                saves.push(mask);
                saves.push(dp);
            }
        }
    }
    let inputs: Vec<TensorId> = saves.iter().copied().filter(|&x| x == q || x == k || x == vv).collect();
    // The gpt family's q, k and v are views of the fused projection's output: each reads
    // its heads' share of it.
    let share = |x: TensorId, width: u64| match fused_qkv {
        Some(f) if f == x => bd.tensors[f].bytes / (qt + 2 * kvd) * width,
        _ => bd.tensors[x].bytes,
    };
    let (q_bytes, k_bytes, v_bytes) = (share(q, qt), share(k, kvd), share(vv, kvd));
    let qkvo = (q_bytes + k_bytes + v_bytes + bd.tensors[o].bytes) as f64;
    // Flash backward recomputes the scores: 2.5x the forward's matmul work.
    let bwd_f = match w.attention {
        Attention::Flash => 2.5 * att_f,
        Attention::Math | Attention::Eager => 2.0 * att_f,
    };
    let kv_bytes = k_bytes + v_bytes;
    // gpt-oss's sinks: one logit per head of this rank.
    let sinks = if cfg.style.attention_sinks { a } else { 0 };
    let core = bd.op_tp(p("attention.core"), OpKind::AttentionCore, sinks, (att_f, bwd_f), inputs, outs, saves);
    if let Some(kernel) = w.timed_flash_kernel() {
        bd.ops[core].flash = Some(FlashOp { kernel, keys: w.flash_keys(), head_dim: qk_w / cfg.n_heads });
    }
    if cp > 1 {
        let o_bytes = bd.tensors[o].bytes;
        let (moved, scratch) = match w.split.context_comm {
            // Two receive buffers of the ring (Transformer Engine's p2p_comm_buffers).
            ContextComm::Ring => (kv_bytes, 2 * kv_bytes),
            // The whole sequence's keys and values, all-gathered (PyTorch's
            // _AllGatherRotater).
            ContextComm::AllGather => (kv_bytes, cp * kv_bytes),
            // Ulysses: q, k and v all-to-all'd in (the head-sharded copies exist beside
            // the sequence-sharded ones while the all-to-all runs), the output out; the
            // same bytes again for the gradients in backward.
            ContextComm::AllToAll => (qkvo as u64, qkvo as u64 - o_bytes),
        };
        bd.ops[core].cp_kv_bytes = moved;
        bd.ops[core].fwd_scratch += scratch;
    }
    if w.attention.materialised() {
        // Math attention is a chain of kernels over the n = b a s^2 scores of this rank's
        // heads (Megatron-LM's CoreAttention): a batched GEMM writes the scores (n c bytes),
        // a fused scale-mask-softmax reads and writes them (2 n c), dropout reads them and
        // writes the dropped probabilities and a 1-byte mask (2 n c + n), and a second
        // batched GEMM reads them (n c). Backward: the two GEMMs of attention-over-V write dP
        // and read P (2 n c), dropout's backward reads dP and the mask and writes its
        // gradient (2 n c + n), softmax's reads y and dy and writes dx (3 n c), and the two
        // GEMMs of QK^T read dS (2 n c). The GEMMs' head dimension is small, so they are
        // memory-bound on the s^2 tensor; the softmax and dropout passes run after them, not
        // under them: their time adds. Hugging Face's eager attention runs the same GEMMs
        // with its own passes between them ([`eager_scores`]).
        let n = (b * a * s * s) as f64;
        let cf = c as f64;
        let op = &mut bd.ops[core];
        op.fwd_bytes = qkvo + 2.0 * n * cf;
        op.bwd_bytes = Some(2.0 * qkvo + 4.0 * n * cf);
        if w.attention == Attention::Eager {
            let shape = ScoresShape {
                batch: b * a,
                queries: s,
                keys: s,
                qk: qk_w / cfg.n_heads,
                v: v_w / cfg.n_heads,
                bytes: c,
            };
            eager_scores(op, shape, dropout, cfg.style.attn_logit_softcap);
        } else {
            // The raw scores exist while softmax runs.
            op.fwd_scratch = b * a * s * s * c;
            op.chain_bytes = if dropout { [4.0 * n * cf + n, 5.0 * n * cf + n] } else { [2.0 * n * cf, 3.0 * n * cf] };
            if cfg.style.attn_logit_softcap {
                // Gemma 2's eager attention caps the scores before softmax: a division, tanh
                // (which saves its output) and a multiplication, each reading and writing the
                // scores; backward: the multiplication's (2 n c), tanh's reads y and dy and
                // writes dx (3 n c), the division's (2 n c).
                op.chain_bytes[0] += 6.0 * n * cf;
                op.chain_bytes[1] += 7.0 * n * cf;
            }
        }
    }
    if cfg.style.attn_logit_softcap && w.attention.materialised() {
        let capped = bd.tensor(&p("attention.core.softcap"), b * a * s * s, c, TensorKind::AttentionScores);
        bd.ops[core].outputs.push(capped);
        bd.ops[core].saves.push(capped);
    }
    // Row-parallel output projection: its bias is added once, after the reduction.
    let ao = bd.tensor(&p("attention.wo.out"), t * h, c, TensorKind::Activation);
    let wo_bias = if cfg.family == Family::Gpt || cfg.style.o_bias { h } else { 0 };
    bd.op_tp(p("attention.wo"), OpKind::Linear, qt * h + wo_bias, lin(qd, h), vec![o], vec![ao], vec![o]);
    let ao = bd.g_op(&p("attention"), ao, c);
    let ao = if post_norm { norm_op(bd, nfam, &p("post_attention_norm"), ao, rows, h, sc) } else { ao };
    let fused = dropout && cfg.family == Family::Gpt;
    let ao = if dropout { dropout_op(bd, &p("attention.dropout"), ao, rows * h, fused) } else { ao };
    let h1 = residual_op(bd, &p("residual1"), x, ao, rows * h, fused);

    // --- MLP half (GPT-NeoX's parallel residual feeds it the block's input)
    let mlp_in = if cfg.style.parallel_residual { x } else { h1 };
    let n2 = if pre_norm { norm_op(bd, nfam, &p("ffn_norm"), mlp_in, rows, h, sc) } else { mlp_in };
    let ft = f / tp;
    let mlp_out = match cfg.family {
        Family::Llama => match &cfg.moe {
            Some(m) if cfg.is_moe_layer(l) => {
                let (ep, etp) = (w.split.expert.max(1), w.split.expert_tensor.max(1));
                let shape = MoeShape { rows, tokens: t, h, c, ep, etp, routed: w.routed };
                moe_mlp(bd, &p("feed_forward"), m, n2, shape)
            }
            _ => swiglu_mlp(bd, &p("feed_forward"), n2, t, h, f, sc),
        },
        Family::Gpt => {
            let n2_in = bd.f_op(&p("mlp"), n2, c);
            let first = bd.ops.len();
            let g = bd.tensor(&p("mlp.c_fc.out"), t * ft, c, TensorKind::Activation);
            bd.op_tp(p("mlp.c_fc"), OpKind::Linear, (h * f + f) / tp, lin(h, f), vec![n2_in], vec![g], vec![n2]);
            bd.regather_op(&p("mlp"), first);
            let ge = bd.tensor(&p("mlp.gelu.out"), t * ft, c, TensorKind::Activation);
            bd.op_tp(
                p("mlp.gelu"),
                OpKind::Elementwise,
                0,
                (8.0 * tf * f as f64, 16.0 * tf * f as f64),
                vec![g],
                vec![ge],
                vec![g],
            );
            let d = bd.tensor(&p("mlp.c_proj.out"), t * h, c, TensorKind::Activation);
            bd.op_tp(p("mlp.c_proj"), OpKind::Linear, f * h / tp + h, lin(f, h), vec![ge], vec![d], vec![ge]);
            bd.g_op(&p("mlp"), d, c)
        }
    };
    let mlp_out =
        if post_norm { norm_op(bd, nfam, &p("post_feedforward_norm"), mlp_out, rows, h, sc) } else { mlp_out };
    let mlp_out = if dropout { dropout_op(bd, &p("mlp.dropout"), mlp_out, rows * h, fused) } else { mlp_out };
    residual_op(bd, &p("residual2"), h1, mlp_out, rows * h, fused)
}

/// Grouped-query attention in PyTorch model code: `repeat_kv` expands the key and value heads
/// to every query head (`expand` + `reshape`: a copy), and the attention kernel reads and
/// saves the copies. Megatron / Transformer Engine pass the grouped heads to a kernel that
/// reads them as they are. `[k, v]` are the keys and values (views of one fused projection
/// in the gpt family), `[kv, q]` the elements of one of them and of one copy.
fn repeat_kv(bd: &mut Builder, prefix: &str, [k, v]: [TensorId; 2], [kv, q]: [u64; 2], c: u64) -> (TensorId, TensorId) {
    let kr = bd.tensor(&format!("{prefix}.repeat_kv.k"), q, c, TensorKind::Activation);
    let vr = bd.tensor(&format!("{prefix}.repeat_kv.v"), q, c, TensorKind::Activation);
    let inputs = if k == v { vec![k] } else { vec![k, v] };
    // Backward sums each group's gradients back onto its key-value head: the same bytes the
    // other way.
    let id = bd.op(format!("{prefix}.repeat_kv"), OpKind::Elementwise, 0, (0.0, 0.0), inputs, vec![kr, vr], vec![]);
    bd.ops[id].tp_sharded = bd.tp > 1;
    bd.ops[id].fwd_bytes = (2 * (kv + q) * c) as f64;
    bd.ops[id].bwd_bytes = Some(bd.ops[id].fwd_bytes);
    bd.ops[id].launches = [2, 2];
    (kr, vr)
}
/// The LM head and the loss over this rank's tokens: the output linear reading `x[0]` and
/// saving `x[1]` (the same tensor, or under sequence parallelism its shard), Gemma 2's
/// soft-capping, and the cross-entropy `w.loss` names. `prefix` starts every op's name (""
/// for the main head); the linear owns `weights.0` parameters and reads `weights.1` another
/// op owns (a tied or shared head). A head whose input is a chunk of a larger tensor (the
/// hidden states multi-token prediction concatenates) is charged its chunk.
fn lm_head_loss(
    bd: &mut Builder,
    sh: &BlockShape,
    prefix: &str,
    x: [TensorId; 2],
    targets: TensorId,
    weights: (u64, u64),
) {
    let BlockShape { cfg, w, t, h, c, tp, .. } = *sh;
    let (v, vt, tf) = (cfg.vocab, cfg.vocab / tp, t as f64);
    let n = |s: &str| format!("{prefix}{s}");
    let first = bd.ops.len();
    let logits = bd.tensor(&n("output.logits"), t * vt, c, TensorKind::Activation);
    let lin = (2.0 * tf * h as f64 * v as f64, 4.0 * tf * h as f64 * v as f64);
    let id = bd.op_tp(n("output"), OpKind::Linear, weights.0, lin, vec![x[0]], vec![logits], vec![x[1]]);
    bd.ops[id].shared_params = weights.1;
    let chunk = t * h * bd.elem[x[1]];
    if bd.tensors[x[0]].bytes > chunk {
        bd.ops[id].fwd_bytes = (chunk + t * vt * c) as f64;
        bd.ops[id].gemm = Some([t, vt, h]);
    }
    bd.regather_op(&n("output"), first);
    let logits =
        if cfg.style.final_logit_softcap { softcap_ops(bd, &n("output.softcap"), logits, t, v) } else { logits };
    let one_kernel = |bd: &mut Builder, name: &str, kept: TensorId, save_logits: bool, bytes: [f64; 2]| {
        let loss = bd.tensor(&n("loss"), 1, 4, TensorKind::Activation);
        let saves = if save_logits { vec![logits, kept, targets] } else { vec![kept, targets] };
        let fl = 5.0 * tf * v as f64;
        let id = bd.op_tp(n(name), OpKind::Loss, 0, (fl, fl), vec![logits, targets], vec![kept, loss], saves);
        let e = (t * vt) as f64;
        bd.ops[id].fwd_bytes = bytes[0] * e;
        bd.ops[id].bwd_bytes = Some(bytes[1] * e);
    };
    if w.loss == super::config::LossKind::Compiled {
        // Row reductions over the 16-bit logits: the max, then the sum of exponentials (2 x
        // c read per element); backward reads them again with the log-sum-exp and writes the
        // gradient (2 x c). What it saves is the logits themselves and t FP32 log-sum-exps.
        let lse = bd.tensor(&n("loss.logsumexp"), t, 4, TensorKind::Stats);
        let cf = c as f64;
        one_kernel(bd, "loss.cross_entropy", lse, true, [2.0 * cf, 2.0 * cf]);
    } else if w.loss == super::config::LossKind::VocabParallel {
        // Megatron-Core's vocab_parallel_cross_entropy: the logits are upcast and
        // exponentiated in place into the FP32 softmax it saves (with the target mask);
        // the loss is log(sum exp) - the target's logit. Its backward writes the 16-bit
        // logit gradient. Its passes over the n = tokens x vocab / tp logits, bytes per
        // element (`--cross-entropy-loss-fusion` off, Megatron-Core's default): forward the
        // FP32 copy (2 read, 4 written), the max (4), subtracting it in place (4 + 4), exp in
        // place (4 + 4), the sum (4) and the division in place (4 + 4): 38; backward scaling
        // the saved softmax by the loss's gradient in place (4 + 4) and the cast of the logit
        // gradient back to 16 bits (4 + 2): 14.
        let sm = bd.tensor(&n("loss.softmax"), t * vt, 4, TensorKind::Activation);
        one_kernel(bd, "loss.vocab_parallel_cross_entropy", sm, false, [38.0, 14.0]);
    } else {
        let mut logits = logits;
        let loss_dtype = if w.logits_fp32 { Dtype::Fp32 } else { w.compute_dtype };
        if loss_dtype != w.compute_dtype {
            // logits.float(): a copy; its backward saves nothing.
            let l32 = bd.tensor(&n("output.logits.float"), t * vt, 4, TensorKind::Activation);
            bd.op_tp(n("logits.float"), OpKind::Cast, 0, (0.0, 0.0), vec![logits], vec![l32], vec![]);
            logits = l32;
        }
        // cross_entropy = log_softmax (saves its output) + nll_loss (saves the targets).
        let lb = loss_dtype.bytes();
        let lsm = bd.tensor(&n("loss.log_softmax"), t * vt, lb, TensorKind::Activation);
        bd.op_tp(
            n("loss.log_softmax"),
            OpKind::Loss,
            0,
            (5.0 * tf * v as f64, 5.0 * tf * v as f64),
            vec![logits],
            vec![lsm],
            vec![lsm],
        );
        let loss = bd.tensor(&n("loss"), 1, 4, TensorKind::Activation);
        bd.op(n("loss.nll"), OpKind::Loss, 0, (tf, tf), vec![lsm, targets], vec![loss], vec![targets]);
    }
}

/// DeepSeek-V3's multi-token prediction as Megatron-Core runs it in training
/// (`megatron/core/transformer/multi_token_prediction.py`: `MultiTokenPredictionBlock`,
/// `MultiTokenPredictionLayer`, `process_mtp_loss`), `depth` modules after the main model's
/// final norm `nf` (the decoder's output), on one tensor-parallel rank of one context shard:
///
/// - module k (block `n_layers + k`): the word embedding of the tokens rolled k + 1 places
///   (`_get_embeddings`: the shared embedding, in the head's region so that it stays outside
///   the module's checkpoint, as Megatron computes it before `_checkpointed_forward`);
///   `enorm` over it and `hnorm` over the previous depth's output (`_concat_embeddings`), their
///   concatenation (`torch.cat`, 2h wide; its backward takes views), `eh_proj` (2h -> h, no
///   bias), one transformer layer of the last block's kind, and its `final_layernorm`;
/// - the main output and the D modules' outputs concatenated into one (1 + D) x tokens x h
///   tensor (`torch.cat(hidden_states_list)` at the end of the block's forward), whose chunks
///   the heads read and save;
/// - per depth (`process_mtp_loss`): the shared output head, the cross-entropy against the
///   labels rolled k + 1 places (rolled int64 copies of the labels and mask, tokens x 8 bytes,
///   are not charged), and the acceptance count (`_compute_mtp_acceptance_counts`, under
///   no_grad: an argmax over the logits, which keeps them until it has read them).
///
/// Returns the concatenated hidden states, which the main head reads (its first chunk).
fn mtp_modules(bd: &mut Builder, sh: &BlockShape, depth: u64, nf: TensorId, io: [TensorId; 2]) -> TensorId {
    let BlockShape { cfg, t, h, c, tp, rows, nfam, .. } = *sh;
    let [tokens, targets] = io;
    let vt = cfg.vocab / tp;
    let mut outs = vec![nf];
    let mut prev = nf;
    for d in 0..depth {
        let p = |n: &str| format!("mtp.{d}.{n}");
        bd.region = Region::Head;
        let e = bd.tensor(&p("embedding.out"), t * h, c, TensorKind::Activation);
        let id = bd.op(p("embedding"), OpKind::Embedding, 0, (0.0, 0.0), vec![tokens], vec![e], vec![tokens]);
        // The main model's word embedding (a copy on the last pipeline stage, see
        // `LayerDag::embedding_copy_params`): vocabulary-parallel, its partial sums met as
        // the main embedding's are.
        bd.ops[id].shared_params = vt * h;
        bd.ops[id].tp_sharded = tp > 1;
        let e = bd.g_op(&p("embedding"), e, c);
        bd.region = Region::Block(cfg.n_layers + d);
        let en = norm_op(bd, nfam, &p("enorm"), e, rows, h, c);
        let hn = norm_op(bd, nfam, &p("hnorm"), prev, rows, h, c);
        let cat = bd.tensor(&p("concat.out"), rows * 2 * h, c, TensorKind::Activation);
        let id = bd.op(p("concat"), OpKind::Elementwise, 0, (0.0, 0.0), vec![en, hn], vec![cat], vec![]);
        bd.ops[id].bwd_bytes = Some(0.0);
        let y = eh_proj(bd, sh, &p("eh_proj"), cat);
        let y = block(bd, sh, &p("layer"), cfg.mtp_spec_layer(), y);
        prev = norm_op(bd, nfam, &p("final_layernorm"), y, rows, h, c);
        outs.push(prev);
    }
    bd.region = Region::Head;
    let all = bd.tensor("mtp.concat_hidden.out", (depth + 1) * rows * h, c, TensorKind::Activation);
    let id = bd.op("mtp.concat_hidden".into(), OpKind::Elementwise, 0, (0.0, 0.0), outs, vec![all], vec![]);
    bd.ops[id].bwd_bytes = Some(0.0);
    for d in 0..depth {
        let prefix = format!("mtp.{d}.");
        // The column-parallel output layer gathers its chunk's sequence under sequence
        // parallelism, as the main head does.
        let x = bd.f_op_of(&format!("{prefix}output"), all, t * h * c, c);
        lm_head_loss(bd, sh, &prefix, [x, all], targets, (0, vt * h));
        // The head's logits, the tensor the loss read, are the last logits tensor written.
        let logits = bd.ops.iter().rev().find(|o| o.name == format!("{prefix}output")).map(|o| o.outputs[0]);
        let logits = logits.expect("the head was just built");
        let preds = bd.tensor(&format!("{prefix}acceptance.argmax"), t, 8, TensorKind::Index);
        let id = bd.op(
            format!("{prefix}acceptance"),
            OpKind::Elementwise,
            0,
            (0.0, 0.0),
            vec![logits, targets],
            vec![preds],
            vec![],
        );
        bd.ops[id].fwd_bytes = (t * vt * c) as f64;
        bd.ops[id].bwd_bytes = Some(0.0);
    }
    all
}

/// An MTP module's `eh_proj` (2h -> h, no bias) as Megatron-Core builds it
/// (`MultiTokenPredictionLayer._concat_embeddings`): a column-parallel linear with
/// `gather_output=False`, whose h / tp output columns are all-gathered over the
/// tensor-parallel group (`gather_from_tensor_model_parallel_region`; backward keeps this
/// rank's columns) and, under sequence parallelism, split back to this rank's sequence shard
/// (`scatter_to_sequence_parallel_region`; backward all-gathers it) for the transformer layer.
fn eh_proj(bd: &mut Builder, sh: &BlockShape, name: &str, cat: TensorId) -> TensorId {
    let BlockShape { t, h, c, tp, rows, .. } = *sh;
    let tf = t as f64;
    let first = bd.ops.len();
    let x = bd.f_op_of(name, cat, t * 2 * h * c, c);
    let y = bd.tensor(&format!("{name}.out"), t * h / tp, c, TensorKind::Activation);
    let lin = (2.0 * tf * (2 * h) as f64 * h as f64, 4.0 * tf * (2 * h) as f64 * h as f64);
    bd.op_tp(name.to_string(), OpKind::Linear, 2 * h * h / tp, lin, vec![x], vec![y], vec![cat]);
    bd.regather_op_of(name, first, t * 2 * h * c);
    if tp == 1 {
        return y;
    }
    let full = bd.tensor(&format!("{name}.tp_all_gather.out"), t * h, c, TensorKind::Activation);
    let comm = bd.tp_comm_of(t * h * c, Some(Collective::AllGather), None);
    bd.comm_op(format!("{name}.tp_all_gather"), vec![y], vec![full], comm);
    if rows == t {
        return full;
    }
    let shard = bd.tensor(&format!("{name}.sp_scatter.out"), rows * h, c, TensorKind::Activation);
    let comm = bd.tp_comm_of(t * h * c, None, Some(Collective::AllGather));
    bd.comm_op(format!("{name}.sp_scatter"), vec![full], vec![shard], comm);
    shard
}
/// The head's shape: tokens, hidden, vocabulary, activation bytes, the head's own parameters.
struct HeadShape {
    t: u64,
    h: u64,
    v: u64,
    c: u64,
    head_params: u64,
}

/// Liger-Kernel's `LigerFusedLinearCrossEntropyLoss` (`ops/fused_linear_cross_entropy.py`):
/// the tokens run in chunks of next_power_of_2(tokens / ceil(vocab / hidden)); each chunk's
/// logits (chunk x vocab, 16-bit) are computed, turned into their gradient in place by the
/// cross-entropy kernel, and multiplied into the input gradient (chunk x hidden) and the
/// accumulated weight gradient (vocab x hidden), all in forward: three GEMMs of the head's
/// size. Backward only scales the two stored gradients by the loss's gradient. Saves the
/// input and weight gradients; one chunk's logits are scratch.
fn fused_linear_cross_entropy(bd: &mut Builder, cfg: &ModelConfig, x: TensorId, targets: TensorId, sh: HeadShape) {
    let HeadShape { t, h, v, c, head_params } = sh;
    let inc = v.div_ceil(h).max(1);
    let chunk = t.div_ceil(inc).next_power_of_two().min(t.next_power_of_two());
    let gin = bd.tensor("output.fused_ce.grad_input", t * h, c, TensorKind::Activation);
    let gw = bd.tensor("output.fused_ce.grad_weight", v * h, c, TensorKind::Activation);
    let loss = bd.tensor("loss", 1, 4, TensorKind::Activation);
    let f = 2.0 * (t * h * v) as f64;
    let id = bd.op(
        "output".into(),
        OpKind::Linear,
        head_params,
        (3.0 * f + 5.0 * (t * v) as f64, 0.0),
        vec![x, targets],
        vec![gin, gw, loss],
        vec![gin, gw],
    );
    let op = &mut bd.ops[id];
    if cfg.tie_embeddings {
        op.shared_params = v * h;
    }
    op.fwd_scratch = chunk.min(t) * v * c;
    op.gemm = Some([t, v, h]);
    // Backward: read and scale both stored gradients in place.
    op.bwd_bytes = Some(2.0 * ((t * h + v * h) * c) as f64);
}

/// One rank's share of a multi-head latent attention block: tokens, the rows of them this
/// rank holds (t / tp under sequence parallelism), hidden, heads, bytes.
struct MlaShape {
    t: u64,
    rows: u64,
    h: u64,
    heads: u64,
    c: u64,
}

/// DeepSeek's multi-head latent attention up to the attention core, as Hugging Face's
/// `DeepseekV3Attention` runs it (Megatron-Core's `MLASelfAttention` likewise): the query's
/// down projection (`q_a_proj`), its RMSNorm and up projection to every head's no-rope and
/// rope parts (`q_b_proj`; one direct projection without a query rank); the shared down
/// projection to the key-value latent and one rope key (`kv_a_proj_with_mqa`), the latent's
/// RMSNorm and its up projection to every head's no-rope key and value (`kv_b_proj`); then
/// rotary embeddings on the rope parts and each head's key assembled from its no-rope key and
/// the shared rope key (a materialised copy, as `torch.cat` makes it), the value split off
/// contiguous. Each linear saves its input; the assembled q, k and v are what the attention
/// core saves. Returns (q, k, v).
///
/// Under tensor parallelism, as Megatron-Core's `MLASelfAttention` builds it with Transformer
/// Engine (`multi_latent_attention.py`, NVIDIA/Megatron-LM d98e8a6): the down projections
/// are `TELinear(parallel_mode="duplicated")`, whole on every rank and run on the rows it
/// holds (its sequence shard under sequence parallelism), as are the latents' norms; the up
/// projections are column-parallel over the heads, their latent input all-gathered from the
/// sequence shards (and the rope key `k_pos_emb` gathered beside it,
/// `gather_from_sequence_parallel_region`), or, without sequence parallelism, read whole
/// with Megatron's `f` (an all-reduce of its gradient). Each rank then has its heads' q, k
/// and v; the core and the output projection are the dense attention's.
fn mla_qkv(bd: &mut Builder, name: &str, m: &MlaConfig, x: TensorId, sh: MlaShape) -> (TensorId, TensorId, TensorId) {
    let MlaShape { t, rows, h, heads, c } = sh;
    let p = |n: &str| format!("{name}.{n}");
    let tf = t as f64;
    let tp = bd.tp;
    let lin = |i: u64, o: u64| (2.0 * tf * i as f64 * o as f64, 4.0 * tf * i as f64 * o as f64);
    // The duplicated down projections on this rank's rows: under sequence parallelism each
    // rank does its share of the work (counted as split for model FLOPs).
    let rf = rows as f64;
    let lin_rows = |i: u64, o: u64| (2.0 * rf * i as f64 * o as f64, 4.0 * rf * i as f64 * o as f64);
    let on_shard = rows < t;
    let (dn, dr, dv, kvr) = (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank);
    let hq = heads * (dn + dr);
    let q0 = if m.q_lora_rank > 0 {
        let r = m.q_lora_rank;
        let qa = bd.tensor(&p("wq_a.out"), rows * r, c, TensorKind::Activation);
        let id = bd.op(p("wq_a"), OpKind::Linear, h * r, lin_rows(h, r), vec![x], vec![qa], vec![x]);
        bd.ops[id].tp_sharded = on_shard;
        bd.ops[id].tp_partial_grad = on_shard;
        let qn = norm_op(bd, Family::Llama, &p("q_a_norm"), qa, rows, r, c);
        let qn_in = bd.f_op_of(&p("wq_b"), qn, t * r * c, c);
        let first = bd.ops.len();
        let q0 = bd.tensor(&p("wq_b.out"), t * hq, c, TensorKind::Activation);
        bd.op_tp(p("wq_b"), OpKind::Linear, r * hq, lin(r, hq * tp), vec![qn_in], vec![q0], vec![qn]);
        bd.regather_op_of(&p("wq_b"), first, t * r * c);
        q0
    } else {
        let x_in = bd.f_op(&p("wq"), x, c);
        let first = bd.ops.len();
        let q0 = bd.tensor(&p("wq.out"), t * hq, c, TensorKind::Activation);
        bd.op_tp(p("wq"), OpKind::Linear, h * hq, lin(h, hq * tp), vec![x_in], vec![q0], vec![x]);
        bd.regather_op(&p("wq"), first);
        q0
    };
    let kva = bd.tensor(&p("wkv_a.out"), rows * (kvr + dr), c, TensorKind::Activation);
    let id = bd.op(p("wkv_a"), OpKind::Linear, h * (kvr + dr), lin_rows(h, kvr + dr), vec![x], vec![kva], vec![x]);
    bd.ops[id].tp_sharded = on_shard;
    bd.ops[id].tp_partial_grad = on_shard;
    // The latent's RMSNorm reads the first kv_lora_rank columns of wkv_a's output.
    let kvn = norm_op(bd, Family::Llama, &p("kv_a_norm"), kva, rows, kvr, c);
    let kv_in = bd.f_op_of(&p("wkv_b"), kvn, t * kvr * c, c);
    let first = bd.ops.len();
    let up = heads * (dn + dv);
    let kvb = bd.tensor(&p("wkv_b.out"), t * up, c, TensorKind::Activation);
    bd.op_tp(p("wkv_b"), OpKind::Linear, kvr * up, lin(kvr, up * tp), vec![kv_in], vec![kvb], vec![kvn]);
    bd.regather_op_of(&p("wkv_b"), first, t * kvr * c);
    // The rope key: this rank's rows of wkv_a's output, gathered under sequence parallelism.
    let kpos = if on_shard {
        let g = bd.tensor(&p("k_pos_emb.sp_all_gather.out"), t * dr, c, TensorKind::Activation);
        let comm = bd.tp_comm_of(t * dr * c, Some(Collective::AllGather), Some(Collective::ReduceScatter));
        bd.comm_op(p("k_pos_emb.sp_all_gather"), vec![kva], vec![g], comm);
        g
    } else {
        kva
    };
    let q = bd.tensor(&p("rope.q"), t * hq, c, TensorKind::Activation);
    let k = bd.tensor(&p("rope.k"), t * hq, c, TensorKind::Activation);
    let v = bd.tensor(&p("v"), t * heads * dv, c, TensorKind::Activation);
    let rope_f = 6.0 * tf * (heads * dr + dr) as f64;
    let id = bd.op(p("rope"), OpKind::Rope, 0, (rope_f, rope_f), vec![q0, kpos, kvb], vec![q, k, v], vec![]);
    bd.ops[id].tp_sharded = tp > 1;
    // The rope parts' cos/sin products live while the sums are formed.
    bd.ops[id].fwd_scratch = 2 * t * heads * dr * c;
    (q, k, v)
}

/// Llama's SwiGLU MLP over `t` tokens of `x` (`n2` in the block): gate and up projections
/// (column-parallel), SiLU, their product and the down projection (row-parallel), with the
/// tensor-parallel collectives around them.
fn swiglu_mlp(bd: &mut Builder, name: &str, x: TensorId, t: u64, h: u64, f: u64, c: u64) -> TensorId {
    let p = |n: &str| format!("{name}.{n}");
    let ft = f / bd.tp;
    let tf = t as f64;
    let lin = |i: u64, o: u64| (2.0 * tf * i as f64 * o as f64, 4.0 * tf * i as f64 * o as f64);
    let n2 = x;
    let n2_in = bd.f_op(name, n2, c);
    let first = bd.ops.len();
    let g = bd.tensor(&p("w1.out"), t * ft, c, TensorKind::Activation);
    bd.op_tp(p("w1"), OpKind::Linear, h * ft, lin(h, f), vec![n2_in], vec![g], vec![n2]);
    let u = bd.tensor(&p("w3.out"), t * ft, c, TensorKind::Activation);
    bd.op_tp(p("w3"), OpKind::Linear, h * ft, lin(h, f), vec![n2_in], vec![u], vec![n2]);
    bd.regather_op(name, first);
    let m = if bd.fused_swiglu {
        fused_swiglu(bd, &p("swiglu"), [g, u], None, t * ft, c, true).1
    } else {
        let sg = bd.tensor(&p("silu.out"), t * ft, c, TensorKind::Activation);
        let fl = (4.0 * tf * f as f64, 8.0 * tf * f as f64);
        bd.op_tp(p("silu"), OpKind::Elementwise, 0, fl, vec![g], vec![sg], vec![g]);
        let m = bd.tensor(&p("mul.out"), t * ft, c, TensorKind::Activation);
        bd.op_tp(
            p("mul"),
            OpKind::Elementwise,
            0,
            (tf * f as f64, 2.0 * tf * f as f64),
            vec![sg, u],
            vec![m],
            vec![sg, u],
        );
        m
    };
    let d = bd.tensor(&p("w2.out"), t * h, c, TensorKind::Activation);
    bd.op_tp(p("w2"), OpKind::Linear, ft * h, lin(f, h), vec![m], vec![d], vec![m]);
    bd.g_op(name, d, c)
}

/// SwiGLU as one kernel over `elems` elements of each half on this rank, a tensor-parallel
/// slice of the model's where `tp_split` (the dense MLP's; the experts' are not) (Megatron-Core's
/// `SwiGLUFunction`, and `WeightedSwiGLUFunction` when `probs` scale each row, in
/// megatron/core/fusions/fused_bias_swiglu.py; torch.compile fuses the same): silu(g) x u
/// [x probs], saving its input (and the probabilities) and recomputing silu in backward.
///
/// With `--activation-func-fp8-input-store` the saved input is
/// `input.to(torch.float8_e4m3fn)`: 1 B per element and no scale, written by a second kernel
/// (2 B read, 1 B written per element in 16 bits) while the 16-bit input is freed as usual;
/// backward casts it back (1 B read, 2 B written) into a 16-bit temporary that lives while
/// the kernel runs. Returns the op and its output.
fn fused_swiglu(
    bd: &mut Builder,
    name: &str,
    [g, u]: [TensorId; 2],
    probs: Option<TensorId>,
    elems: u64,
    c: u64,
    tp_split: bool,
) -> (OpId, TensorId) {
    let m = bd.tensor(&format!("{name}.out"), elems, c, TensorKind::Activation);
    // FLOPs are the model's: `op_tp` charges this rank its 1/tp.
    let e = (elems * if tp_split { bd.tp } else { 1 }) as f64;
    let (mut fwd, mut bwd) = (5.0 * e, 10.0 * e);
    if probs.is_some() {
        fwd += e;
        bwd += 2.0 * e;
    }
    let mut inputs = vec![g, u];
    inputs.extend(probs);
    let mut outputs = vec![m];
    let mut saves = if bd.swiglu_fp8_input_store {
        let q = bd.tensor(&format!("{name}.input_fp8"), 2 * elems, 1, TensorKind::Activation);
        outputs.push(q);
        vec![q]
    } else {
        vec![g, u]
    };
    saves.extend(probs);
    let id = if tp_split {
        bd.op_tp(name.to_string(), OpKind::Elementwise, 0, (fwd, bwd), inputs, outputs, saves)
    } else {
        bd.op(name.to_string(), OpKind::Elementwise, 0, (fwd, bwd), inputs, outputs, saves)
    };
    if bd.swiglu_fp8_input_store {
        let (cf, ef) = (c as f64, elems as f64);
        let probs_bytes = probs.map_or(0.0, |p| bd.tensors[p].bytes as f64);
        let op = &mut bd.ops[id];
        // The cast's extra read of the input; its write is the saved copy among the outputs.
        op.fwd_bytes += 2.0 * ef * cf;
        // Cast back (1 B read, c written per input element), then the kernel: the input and
        // the output's gradient read, the input's gradient written.
        op.bwd_bytes = Some(2.0 * ef * (1.0 + cf) + 5.0 * ef * cf + 2.0 * probs_bytes);
        op.bwd_scratch = 2 * elems * c;
        op.launches = [2, 2];
    }
    (id, m)
}

/// One rank's share of a MoE block: `rows` tokens of the hidden state (the sequence shard
/// under sequence parallelism), `tokens` of the whole micro-batch (what the tensor-parallel
/// shared experts see), `ep` expert-parallel and `etp` expert-tensor-parallel ranks. Under
/// context parallelism both count this rank's 1/cp of each sequence only: Megatron-Core
/// hands each rank its two chunks (`megatron/core/utils.py` `get_batch_on_this_cp_rank`),
/// `MoELayer.forward` (`moe_layer.py`) takes their `[seq_length, bsz, hidden]` hidden
/// states and routes per token, so nothing else in the block changes.
struct MoeShape {
    rows: u64,
    tokens: u64,
    h: u64,
    c: u64,
    ep: u64,
    etp: u64,
    routed: Option<RoutedCopies>,
}

/// A mixture-of-experts MLP as Megatron-Core's `MoELayer` runs it with the all-to-all token
/// dispatcher (`megatron/core/transformer/moe/`: `router.py`, `token_dispatcher.py`,
/// `moe_utils.py` `permute`/`unpermute`, `experts.py`), under uniform routing: every
/// expert-parallel rank receives as many token copies as it sends.
///
/// - **Router**: a linear h -> experts (no bias) over this rank's rows; the softmax's FP32
///   scores are saved for its backward, and the chosen experts' indices (int64) for top-k's
///   and the permutation's.
/// - **Permute**: each token copied once per chosen expert (rows x top_k x h), grouped by
///   destination; `index_select` saves only the indices.
/// - **Dispatch**: an all-to-all over the expert-parallel group moves the copies to the
///   ranks holding their experts (none with one rank). Backward is the reverse all-to-all.
/// - **Expert tensor parallelism** (`etp` > 1, `--expert-tensor-parallel-size`): the
///   dispatcher's `dispatch_postprocess` all-gathers what the all-to-all brought over the
///   expert-tensor-parallel group (`gather_from_sequence_parallel_region(...,
///   group=self.tp_group)`, the group `parallel_state.get_expert_tensor_parallel_group()`),
///   so every rank of it runs its slice of the local experts on all their copies; its
///   backward is a reduce-scatter of the copies' gradients.
/// - **Experts**: this rank's num_experts / ep SwiGLU experts as grouped GEMMs over the
///   copies it received (each GEMM's M is the copies per local expert), saving what the
///   dense MLP saves, per copy. Under expert tensor parallelism FC1 (w1, w3) is column-
///   and FC2 (w2) row-parallel (`TEColumnParallelGroupedLinear` /
///   `TERowParallelGroupedLinear` in `megatron/core/extensions/transformer_engine.py`,
///   `GroupedMLP` in `experts.py`: `divide(moe_ffn_hidden_size, tp_size)`): each rank holds
///   expert_ffn_hidden / etp of every local expert's width and runs it on etp x the
///   copies, so its FLOPs are unchanged and its weights 1/etp.
/// - **Expert-tensor-parallel reduce-scatter** (`combine_preprocess`:
///   `reduce_scatter_to_sequence_parallel_region(..., group=self.tp_group)`): FC2's partial
///   sums are summed over the group and each rank keeps its own copies (the compute dtype,
///   as Megatron-Core 0.8-0.11 reduce-scatters); its backward all-gathers their gradients.
/// - **Combine**: the reverse all-to-all brings each copy home.
/// - **Unpermute**: each copy summed into its token. Where the routing probability scales it
///   follows [`RoutingScale`]: inside the experts' fused SwiGLU (Megatron-Core 0.13 on, which
///   saves the probabilities beside its input; the probabilities saved are this rank's own,
///   as many as it receives under uniform routing), or in the unpermute, whose product saves
///   the copies (in 16 bits: Megatron-Core 0.8-0.12's `unpermute(..., probs)`, Hugging
///   Face's `expert_layer(x) * routing_weights`; upcast to FP32: torchtitan's combine).
/// - **Shared experts** (if any) run beside, as a tensor-parallel SwiGLU MLP over every
///   token; Qwen2-MoE scales theirs by a sigmoid gate (h -> 1).
fn moe_mlp(bd: &mut Builder, name: &str, m: &MoeConfig, x: TensorId, s: MoeShape) -> TensorId {
    let MoeShape { rows, tokens, h, c, ep, etp, routed } = s;
    let p = |n: &str| format!("{name}.{n}");
    // Under expert tensor parallelism each rank holds 1/etp of every expert's width.
    let (e, k, fe) = (m.num_experts, m.top_k, m.expert_ffn_hidden / etp);
    // Copies home again after the combine (this rank's own tokens' copies).
    let home = rows * k;
    let local = (e / ep).max(1);
    // Token copies this rank sends; what it receives (the same under uniform routing); what
    // the busiest rank receives, which sets every all-to-all's length.
    let copies = rows * k;
    let received = routed.map_or(copies, |r| r.received);
    let busiest = routed.map_or(copies, |r| r.busiest.max(r.received));
    // The copies this rank's experts run on: what the expert-tensor-parallel group's ranks
    // received, all-gathered (they hold the same experts, so the same load).
    let gathered = etp * received;
    let (rf, cf, hf, ff, ef) = (rows as f64, gathered as f64, h as f64, fe as f64, e as f64);
    // --- router
    let logits = bd.tensor(&p("router.out"), rows * e, c, TensorKind::Activation);
    let r = bd.op(
        p("router"),
        OpKind::Linear,
        m.router_params(h),
        (2.0 * rf * hf * ef, 4.0 * rf * hf * ef),
        vec![x],
        vec![logits],
        vec![x],
    );
    bd.ops[r].gemm = Some([rows, e, h]);
    let scores = bd.tensor(&p("router.scores"), rows * e, 4, TensorKind::Activation);
    let probs = bd.tensor(&p("router.probs"), copies, 4, TensorKind::Activation);
    let idx = bd.tensor(&p("router.indices"), copies, 8, TensorKind::Index);
    bd.op(
        p("router.softmax_topk"),
        OpKind::Elementwise,
        0,
        (5.0 * rf * ef, 5.0 * rf * ef),
        vec![logits],
        vec![scores, probs, idx],
        vec![scores, idx],
    );
    match bd.aux_loss {
        AuxLoss::Megatron { local, global } => megatron_aux_loss(bd, name, logits, [rows, e], c, (local, global)),
        AuxLoss::AllBlocks => bd.router_logits.push(logits),
        AuxLoss::None => {}
    }
    // --- permute and dispatch
    let perm = bd.tensor(&p("permute.out"), copies * h, c, TensorKind::Activation);
    bd.op(p("permute"), OpKind::Elementwise, 0, (0.0, 0.0), vec![x, idx], vec![perm], vec![idx]);
    let a2a = TpComm {
        group: CommGroup::Expert,
        forward: Some(Collective::AllToAll),
        backward: Some(Collective::AllToAll),
        bytes: busiest * h * c,
        forward_bytes: None,
        backward_buffer: 0,
        backward_buffer_until: None,
    };
    let recv = if ep > 1 {
        let out = bd.tensor(&p("dispatch.out"), received * h, c, TensorKind::Activation);
        bd.comm_op(p("dispatch"), vec![perm], vec![out], a2a);
        out
    } else {
        perm
    };
    // An expert-tensor-parallel collective of the copies: `gathered` copies on the wire.
    let etp_comm = |forward: Collective, backward: Collective| TpComm {
        group: CommGroup::ExpertTensor,
        forward: Some(forward),
        backward: Some(backward),
        bytes: gathered * h * c,
        forward_bytes: None,
        backward_buffer: 0,
        backward_buffer_until: None,
    };
    let recv = if etp > 1 {
        let out = bd.tensor(&p("etp_all_gather.out"), gathered * h, c, TensorKind::Activation);
        let comm = etp_comm(Collective::AllGather, Collective::ReduceScatter);
        bd.comm_op(p("etp_all_gather"), vec![recv], vec![out], comm);
        out
    } else {
        recv
    };
    // --- this rank's experts, grouped GEMMs over the copies received
    let lin = |i: f64, o: f64| (2.0 * cf * i * o, 4.0 * cf * i * o);
    let per_expert = gathered.div_ceil(local);
    let expert = |bd: &mut Builder, n: &str, i: u64, o: u64, input: TensorId| {
        let out = bd.tensor(&p(&format!("experts.{n}.out")), gathered * o, c, TensorKind::Activation);
        let id = bd.op(
            p(&format!("experts.{n}")),
            OpKind::Linear,
            local * (i * o + if m.biases { o } else { 0 }),
            lin(i as f64, o as f64),
            vec![input],
            vec![out],
            vec![input],
        );
        bd.ops[id].expert = true;
        bd.ops[id].gemm = Some([per_expert, o, i]);
        out
    };
    let g = expert(bd, "w1", h, fe, recv);
    let u = expert(bd, "w3", h, fe, recv);
    let weighted = bd.routing_scale == RoutingScale::InActivation;
    let mm = if bd.fused_swiglu {
        let (id, mm) =
            fused_swiglu(bd, &p("experts.swiglu"), [g, u], weighted.then_some(probs), gathered * fe, c, false);
        bd.ops[id].expert = true;
        mm
    } else {
        let sg = bd.tensor(&p("experts.silu.out"), gathered * fe, c, TensorKind::Activation);
        let fl = (4.0 * cf * ff, 8.0 * cf * ff);
        let id = bd.op(p("experts.silu"), OpKind::Elementwise, 0, fl, vec![g], vec![sg], vec![g]);
        bd.ops[id].expert = true;
        let mm = bd.tensor(&p("experts.mul.out"), gathered * fe, c, TensorKind::Activation);
        let fl = (cf * ff, 2.0 * cf * ff);
        let id = bd.op(p("experts.mul"), OpKind::Elementwise, 0, fl, vec![sg, u], vec![mm], vec![sg, u]);
        bd.ops[id].expert = true;
        mm
    };
    let d = expert(bd, "w2", fe, h, mm);
    let d = if etp > 1 {
        let out = bd.tensor(&p("etp_reduce_scatter.out"), received * h, c, TensorKind::Activation);
        let comm = etp_comm(Collective::ReduceScatter, Collective::AllGather);
        bd.comm_op(p("etp_reduce_scatter"), vec![d], vec![out], comm);
        out
    } else {
        d
    };
    // --- combine and unpermute
    let back = if ep > 1 {
        let out = bd.tensor(&p("combine.out"), home * h, c, TensorKind::Activation);
        bd.comm_op(p("combine"), vec![d], vec![out], a2a);
        out
    } else {
        d
    };
    let y = bd.tensor(&p("unpermute.out"), rows * h, c, TensorKind::Activation);
    // A sum of each token's copies, after scaling them where the probabilities were not
    // applied in the experts: its backward hands every copy its token's gradient (and the
    // probabilities theirs, from the copies the product keeps).
    let scaled = (2.0 * home as f64 * hf, 4.0 * home as f64 * hf);
    let (flops, inputs, outputs, saves) = match bd.routing_scale {
        RoutingScale::InActivation => ((home as f64 * hf, 0.0), vec![back, idx], vec![y], vec![idx]),
        RoutingScale::AfterCombine => (scaled, vec![back, probs, idx], vec![y], vec![back, probs]),
        // The copies upcast (4 B each, saved for the probabilities' gradient), scaled, cast
        // back and scatter-added.
        RoutingScale::AfterCombineFp32 => {
            let up = bd.tensor(&p("combine.out.float"), home * h, 4, TensorKind::Activation);
            (scaled, vec![back, probs, idx], vec![y, up], vec![up, probs])
        }
    };
    let id = bd.op(p("unpermute"), OpKind::Elementwise, 0, flops, inputs, outputs, saves);
    if bd.routing_scale == RoutingScale::AfterCombineFp32 {
        // The product's read and write and the cast's read of the FP32 copies, on top of the
        // op's inputs and outputs.
        bd.ops[id].fwd_bytes += 3.0 * (home * h * 4) as f64;
    }
    if m.shared_expert_ffn_hidden == 0 {
        return y;
    }
    // --- shared experts beside the routed ones
    let mut sh = swiglu_mlp(bd, &p("shared_experts"), x, tokens, h, m.shared_expert_ffn_hidden, c);
    if m.shared_expert_gate {
        let gl = bd.tensor(&p("shared_expert_gate.out"), rows, c, TensorKind::Activation);
        bd.op(p("shared_expert_gate"), OpKind::Linear, h, (2.0 * rf * hf, 4.0 * rf * hf), vec![x], vec![gl], vec![x]);
        let gs = bd.tensor(&p("shared_expert_gate.sigmoid"), rows, c, TensorKind::Activation);
        bd.op(
            p("shared_expert_gate.sigmoid"),
            OpKind::Elementwise,
            0,
            (4.0 * rf, 4.0 * rf),
            vec![gl],
            vec![gs],
            vec![gs],
        );
        let gated = bd.tensor(&p("shared_experts.gated"), rows * h, c, TensorKind::Activation);
        bd.op(
            p("shared_experts.gate_mul"),
            OpKind::Elementwise,
            0,
            (rf * hf, 2.0 * rf * hf),
            vec![sh, gs],
            vec![gated],
            vec![sh, gs],
        );
        sh = gated;
    }
    let out = bd.tensor(&p("out"), rows * h, c, TensorKind::Activation);
    let id = bd.op(p("add_shared"), OpKind::Elementwise, 0, (rf * hf, 0.0), vec![y, sh], vec![out], vec![]);
    bd.ops[id].bwd_bytes = Some(0.0);
    out
}

/// Megatron-Core's auxiliary load-balancing losses in one MoE block, with a coefficient above
/// 0 (`router.py` `routing`, `moe_utils.py` `compute_routing_scores_for_aux_loss`,
/// `get_tokens_per_expert_and_token_count`, `switch_load_balancing_loss_func`, NVIDIA/
/// Megatron-LM d98e8a6). The router scores the logits over every expert once more in FP32
/// (softmax, or a normalised sigmoid) and keeps them for that function's backward; a top-k
/// over them builds the routing map (an int32 zero tensor scattered into, then cast to bool:
/// scratch); each loss counts the tokens per expert, all-reduces the counts (int64) over
/// tensor x context (`aux_loss`, `seq_aux_loss`, `local` of them) or the whole stage
/// (`global_aux_loss`) on the compute stream's order, and sums the scores per expert. Every
/// loss reads the same scores, so they are saved once. `MoEAuxLossAutoScaler` keeps only the
/// scalar loss. Unfused (`--moe-router-fusion` off, the default): about 12 kernels forward
/// (softmax, top-k, zeros, cast, scatter, cast, count, sum, product, sum, scale, the tracker's
/// add) and 7 backward (the scaler's gradient, the product's, the expanded gradient made
/// contiguous, the softmax's, its cast to the logits' dtype, the accumulation).
fn megatron_aux_loss(bd: &mut Builder, name: &str, logits: TensorId, [rows, e]: [u64; 2], c: u64, n: (u8, bool)) {
    let p = |s: &str| format!("{name}.{s}");
    let (local, global) = n;
    let scores = bd.tensor(&p("router.aux_scores"), rows * e, 4, TensorKind::Activation);
    let counts = bd.tensor(&p("router.aux_tokens_per_expert"), e, 8, TensorKind::Index);
    let ef = (rows * e) as f64;
    let id = bd.op(
        p("router.aux_loss"),
        OpKind::Elementwise,
        0,
        (6.0 * ef, 6.0 * ef),
        vec![logits],
        vec![scores, counts],
        vec![scores],
    );
    let op = &mut bd.ops[id];
    // Forward: the logits read (c) and the scores written (4); top-k reads them (4); the
    // zeros (4), their cast (4 + 4) and the scatter; the bool cast (4 + 1); the count (1);
    // the scores' sum per expert (4).
    op.fwd_bytes = ef * (c + 30) as f64;
    // Backward: the expanded gradient made contiguous (4), the softmax's backward (4 + 4 +
    // 4), the cast (4 + c) and the accumulation into the logits' gradient (3 c).
    op.bwd_bytes = Some(ef * (20 + 4 * c) as f64);
    op.fwd_scratch = rows * e * 5;
    op.launches = [12, 7];
    let all_reduce = |group: CommGroup| TpComm {
        group,
        forward: Some(Collective::AllReduce),
        backward: None,
        bytes: e * 8,
        forward_bytes: None,
        backward_buffer: 0,
        backward_buffer_until: None,
    };
    // Over one GPU the counts are already whole: no collective.
    let local = if bd.tp * bd.cp > 1 { local } else { 0 };
    for k in 0..local {
        let name = p(&format!("router.aux_counts_all_reduce.{k}"));
        bd.comm_op(name, vec![counts], vec![], all_reduce(CommGroup::TensorContext));
    }
    if global {
        bd.comm_op(p("router.global_aux_counts_all_reduce"), vec![counts], vec![], all_reduce(CommGroup::Stage));
    }
}

/// Hugging Face's load-balancing loss (`load_balancing_loss_func` in modeling_mixtral.py,
/// qwen2_moe, qwen3_moe, gpt_oss), computed by `*ForCausalLM.forward` after the language
/// model's loss when `output_router_logits` is set. It reads every MoE block's router logits
/// (kept alive to here by the model's outputs), concatenates them (a copy), takes their
/// softmax in the logits' dtype (saved for its backward), the top-k experts, and their one-hot
/// mask: int64, [blocks x tokens, top_k, experts], then a float copy of it to average, both
/// live at once with the concatenation (the attention mask's path, when one is passed, adds
/// an int64 copy of the same shape; not counted). Its backward hands each block's router
/// its share of the softmax's gradient at the start of the backward, held until that block's
/// backward. About 16 kernels forward, 6 backward.
fn load_balancing_loss(bd: &mut Builder, m: &MoeConfig, rows: u64, c: u64) {
    let inputs = std::mem::take(&mut bd.router_logits);
    let (l, e, k) = (inputs.len() as u64, m.num_experts, m.top_k);
    let all = l * rows * e;
    let mask = all * k;
    let sm = bd.tensor("load_balancing_loss.softmax", all, c, TensorKind::Activation);
    let loss = bd.tensor("load_balancing_loss.out", 1, 4, TensorKind::Activation);
    let af = all as f64;
    let id = bd.op(
        "load_balancing_loss".into(),
        OpKind::Loss,
        0,
        (5.0 * af + 2.0 * mask as f64, 5.0 * af),
        inputs,
        vec![sm, loss],
        vec![sm],
    );
    let op = &mut bd.ops[id];
    op.fwd_scratch = all * c + mask * (8 + 4);
    // The concatenation (c read, c written), the softmax (c + c), top-k (c), the mean of the
    // softmax (c); the one-hot mask (8 written), its float copy (8 + 4) and mean (4).
    op.fwd_bytes = af * (6 * c) as f64 + (mask * 24) as f64;
    // The softmax's backward (the expanded gradient and the output read, c + c; c written).
    op.bwd_bytes = Some(af * (3 * c) as f64);
    op.launches = [16, 6];
}

/// A LayerNorm (GPT: weight + bias, FP32 mean and rstd per row) or RMSNorm (Llama: weight,
/// FP32 rstd per row) over `t` rows of `h`: saves its input and the statistics; returns the
/// output tensor.
fn norm_op(bd: &mut Builder, family: Family, name: &str, x: TensorId, t: u64, h: u64, c: u64) -> TensorId {
    let (params, stats_per_row) = match family {
        Family::Llama => (h, 4),
        Family::Gpt => (2 * h, 8),
    };
    let params = if bd.weightless_norms { 0 } else { params };
    if family == Family::Llama && bd.kernels == KernelStack::Eager {
        return eager_rmsnorm(bd, name, x, t, h, c, params > 0);
    }
    let out = bd.tensor(&format!("{name}.out"), t * h, c, TensorKind::Activation);
    let stats = bd.tensor(&format!("{name}.stats"), t, stats_per_row, TensorKind::Stats);
    let tf = t as f64;
    bd.op(
        name.to_string(),
        OpKind::Norm,
        params,
        (5.0 * tf * h as f64, 8.0 * tf * h as f64),
        vec![x],
        vec![out, stats],
        vec![x, stats],
    );
    out
}

/// Rotary embedding op `id` over `elems` elements of q and k, the larger of which has
/// `largest`, as eager PyTorch runs it (`cost`: [`super::eager::rope`], or Hugging Face's
/// uncast chain over FP32 q and k, [`super::eager::rope_unfused`]): its bytes and launches (per
/// tensor), and the FP32 temporaries of the larger one. Fused kernels keep the op's own.
fn eager_rope(bd: &mut Builder, id: OpId, elems: u64, largest: u64, cost: super::eager::EagerCost) {
    if bd.kernels != KernelStack::Eager {
        return;
    }
    let op = &mut bd.ops[id];
    op.fwd_bytes = cost.bytes[0] * elems as f64;
    op.bwd_bytes = Some(cost.bytes[1] * elems as f64);
    op.launches = [2 * cost.kernels[0], 2 * cost.kernels[1]];
    op.fwd_scratch = op.fwd_scratch.max(super::eager::ROPE_SCRATCH * largest);
}

/// Autocast's casts of FP32 q, k and v to the compute dtype (`c` bytes) for SDPA, a
/// lower-precision autocast op (`KERNEL_CUDA(scaled_dot_product_attention,
/// lower_precision_fp)` in ATen's autocast_mode): three fresh copies (autocast caches only
/// leaf parameters' casts), which SDPA reads and saves in place of the FP32 tensors; backward
/// casts their gradients up again. One kernel per tensor each way, reading and writing.
fn sdpa_cast(bd: &mut Builder, name: &str, xs: [TensorId; 3], c: u64) -> [TensorId; 3] {
    let mut outs = xs;
    for (out, (&x, s)) in outs.iter_mut().zip(xs.iter().zip(["q", "k", "v"])) {
        let elems = bd.tensors[x].bytes / bd.elem[x];
        *out = bd.tensor(&format!("{name}.{s}"), elems, c, TensorKind::Activation);
    }
    let id = bd.op(name.to_string(), OpKind::Cast, 0, (0.0, 0.0), xs.to_vec(), outs.to_vec(), vec![]);
    let op = &mut bd.ops[id];
    op.bwd_bytes = Some(op.fwd_bytes);
    op.launches = [3, 3];
    outs
}

/// RMSNorm as eager PyTorch runs it ([`super::eager::rmsnorm`]): one op carrying the chain's
/// bytes and launches, saving the FP32 copy of its input, the normalised output and the
/// per-row rsqrt, with an FP32 temporary while it runs. The chain's casts and the saved
/// normalised tensor (`.to(input_dtype)`) follow the input's dtype; the output is `c` bytes
/// (FP32 where an FP32 weight promotes it, [`Builder::stream`]). An FP32 input is its own
/// FP32 copy (`x.float()` returns it), kept for backward in place of one.
fn eager_rmsnorm(bd: &mut Builder, name: &str, x: TensorId, t: u64, h: u64, c: u64, weight: bool) -> TensorId {
    let xb = bd.elem[x];
    let cost = super::eager::rmsnorm(xb, weight);
    let (copy_b, normed_b) = super::eager::rmsnorm_saves(xb, weight);
    let n = t * h;
    let out = bd.tensor(&format!("{name}.out"), n, c, TensorKind::Activation);
    let stats = bd.tensor(&format!("{name}.stats"), t, 4, TensorKind::Stats);
    let mut outputs = vec![out, stats];
    let copy = if xb == copy_b {
        x
    } else {
        let copy = bd.tensor(&format!("{name}.float"), n, copy_b, TensorKind::Activation);
        outputs.push(copy);
        copy
    };
    let mut saves = vec![copy, stats];
    if normed_b > 0 {
        let normed = bd.tensor(&format!("{name}.normed"), n, normed_b, TensorKind::Activation);
        outputs.push(normed);
        saves.push(normed);
    }
    let params = if weight { h } else { 0 };
    let tf = t as f64;
    let id = bd.op(
        name.to_string(),
        OpKind::Norm,
        params,
        (5.0 * tf * h as f64, 8.0 * tf * h as f64),
        vec![x],
        outputs,
        saves,
    );
    let op = &mut bd.ops[id];
    op.fwd_bytes = cost.bytes[0] * n as f64;
    op.bwd_bytes = Some(cost.bytes[1] * n as f64);
    op.launches = cost.kernels;
    op.fwd_scratch = super::eager::RMSNORM_SCRATCH * n;
    out
}

/// Gemma 2's final logit soft-capping in eager PyTorch (`Gemma2ForCausalLM.forward`):
/// `logits / cap`, `tanh`, `* cap`, three element-wise kernels over this rank's `t` x `v` / tp
/// logits. Division and multiplication by a constant save nothing; tanh saves its output.
fn softcap_ops(bd: &mut Builder, name: &str, x: TensorId, t: u64, v: u64) -> TensorId {
    let bytes = bd.tensors[x].bytes;
    let n = (t * v) as f64;
    let mut y = x;
    for (step, saves_out) in [("div", false), ("tanh", true), ("mul", false)] {
        let out = bd.tensor(&format!("{name}.{step}.out"), bytes, 1, TensorKind::Activation);
        let saves = if saves_out { vec![out] } else { vec![] };
        bd.op_tp(format!("{name}.{step}"), OpKind::Elementwise, 0, (n, n), vec![y], vec![out], saves);
        y = out;
    }
    y
}

/// Hugging Face's `eager_attention_forward` over the `n` = b a s^2 scores of this rank's
/// heads, in `c`-byte compute (transformers `modeling_llama.py`, every model that copies
/// it): `matmul(q, k^T) * scaling`, `+ attention_mask`, `softmax(dim=-1,
/// dtype=torch.float32).to(query.dtype)`, dropout, `matmul(probs, v)`. Replaces the fused
/// chain's passes of math attention ([`Attention::Math`], Megatron-LM's CoreAttention), bytes
/// per score:
/// - forward: the scaling reads and writes the scores (2c); the mask add reads them and the
///   mask (one [s, s] plane per sequence, broadcast over the heads: read again for each,
///   counted in full) and writes (3c); the softmax's dtype argument is a cast of its own
///   (ATen fuses it into the softmax for FP16 input only; c read, 4 written), the FP32
///   softmax reads and writes (8), and `.to` casts back (4 read, c written); dropout as the
///   fused chain's (2c + 1);
/// - backward: `.to`'s cast of the gradient to FP32 (c + 4), the softmax's backward (reads
///   y and dy, writes dx: 12), the cast back (4 + c), the scaling's (2c); the mask add
///   passes its gradient through;
/// - memory: the FP32 softmax (saved) and its cast input, beside the masked 16-bit scores,
///   while the softmax runs (scratch (c + 4) n); in backward the FP32 gradients of the
///   softmax's output and input are alive together (scratch 8 n);
/// - kernels: 7 forward (two GEMMs, scale, add, cast, softmax, cast) and 8 backward (four
///   GEMMs, cast, softmax backward, cast, scale), one more each with dropout, three more
///   each with Gemma 2's soft cap.
///
/// In FP32 compute the casts are no-ops (`toType` to its own dtype returns the tensor). The
/// op's `scores` get `shape`: its GEMMs are timed one by one, at the bandwidth PyTorch's
/// kernels reach over the scores (`crate::schedule::scores_rates`).
fn eager_scores(op: &mut Op, shape: ScoresShape, dropout: bool, softcap: bool) {
    let n = (shape.batch * shape.queries * shape.keys) as f64;
    let c = shape.bytes;
    let cf = c as f64;
    let casts = if c == 4 { 0.0 } else { 2.0 * cf + 8.0 };
    let drop = if dropout { 2.0 * cf + 1.0 } else { 0.0 };
    let cap = if softcap { [6.0 * cf, 7.0 * cf] } else { [0.0, 0.0] };
    op.chain_bytes =
        [n * (2.0 * cf + 3.0 * cf + casts + 8.0 + drop + cap[0]), n * (casts + 12.0 + 2.0 * cf + drop + cap[1])];
    op.fwd_scratch = if c == 4 { (n * cf) as u64 } else { (n * (cf + 4.0)) as u64 };
    op.bwd_scratch = (n * 8.0) as u64;
    let extra = u32::from(dropout) + 3 * u32::from(softcap);
    let casts_n = if c == 4 { 0 } else { 2 };
    op.launches = [5 + casts_n + extra, 6 + casts_n + extra];
    op.scores = Some(shape);
}

/// Dropout over `elems` elements: saves its 1-byte mask. Backward reads the output gradient
/// and the mask and writes the input gradient (2 c + 1 bytes per element, as the forward).
/// `fused`: it and the residual add after it are one kernel (Megatron-LM's
/// `bias_dropout_add_fused_train`, on by default in its GPT): the dropped values never reach
/// memory, so this op is charged the input read and the mask write, and the add the rest.
fn dropout_op(bd: &mut Builder, name: &str, x: TensorId, elems: u64, fused: bool) -> TensorId {
    let c = bd.elem[x];
    let out = bd.tensor(&format!("{name}.out"), elems, c, TensorKind::Activation);
    let mask = bd.tensor(&format!("{name}.mask"), elems, 1, TensorKind::Mask);
    let id =
        bd.op(name.to_string(), OpKind::Dropout, 0, (elems as f64, elems as f64), vec![x], vec![out, mask], vec![mask]);
    let e = elems as f64;
    let cf = c as f64;
    if fused {
        bd.ops[id].fwd_bytes = e * (cf + 1.0);
    }
    bd.ops[id].bwd_bytes = Some(e * (2.0 * cf + 1.0));
    out
}

/// A residual add `x + y` over `elems` elements. Its own backward launches nothing (the
/// output gradient passes to both inputs as is), but the residual stream `x` also feeds the
/// next norm, so autograd sums its two gradients: one add, reading two and writing one (3 c
/// bytes per element), charged here. `fused`: the dropout before it did the add's work in its
/// kernel ([`dropout_op`]); the add is charged the residual read and the sum's write.
///
/// Mixed dtypes promote: QLoRA's FP32 stream plus o_proj's 16-bit output is FP32
/// ([`Builder::stream`]), and in backward the autograd engine casts the 16-bit input's
/// gradient down to its dtype (`validate_outputs`), a kernel of its own: c + y's bytes per
/// element, one more launch.
fn residual_op(bd: &mut Builder, name: &str, x: TensorId, y: TensorId, elems: u64, fused: bool) -> TensorId {
    let (xb, yb) = (bd.elem[x], bd.elem[y]);
    let c = xb.max(yb);
    let out = bd.tensor(&format!("{name}.out"), elems, c, TensorKind::Activation);
    let id = bd.op(name.to_string(), OpKind::Elementwise, 0, (elems as f64, 0.0), vec![x, y], vec![out], vec![]);
    let ec = (elems * c) as f64;
    if fused {
        bd.ops[id].fwd_bytes = 2.0 * ec;
    }
    let narrower = [xb, yb].iter().filter(|&&b| b != c).map(|&b| (elems * (c + b)) as f64).sum::<f64>();
    bd.ops[id].bwd_bytes = Some(3.0 * ec + narrower);
    bd.ops[id].launches[1] += u32::from(narrower > 0.0);
    out
}
