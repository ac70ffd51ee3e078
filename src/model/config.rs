//! What a model is, independent of how it is trained or where it runs.

use serde::Serialize;

/// Element types a tensor can be stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Fp32,
    Bf16,
    Fp16,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp32 => 4,
            Dtype::Bf16 | Dtype::Fp16 => 2,
        }
    }
    pub fn parse(s: &str) -> Option<Dtype> {
        match s {
            "fp32" | "float32" => Some(Dtype::Fp32),
            "bf16" | "bfloat16" => Some(Dtype::Bf16),
            "fp16" | "float16" => Some(Dtype::Fp16),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
        }
    }
}

/// Decoder-only transformer families stepsim builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// GPT-2/3 style: LayerNorm with bias, GELU MLP, learned positions, tied embeddings.
    Gpt,
    /// Llama style: RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, untied.
    Llama,
}

/// Architecture hyper-parameters, as a model card states them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub family: Family,
    pub n_layers: u64,
    pub hidden: u64,
    pub n_heads: u64,
    pub n_kv_heads: u64,
    pub ffn_hidden: u64,
    pub vocab: u64,
    /// Learned-position table length (GPT) or rotary cache length (Llama).
    pub max_seq_len: u64,
    pub tie_embeddings: bool,
    /// Dropout probability; a non-zero value saves 1-byte masks (Korthikanti et al. 2022).
    pub dropout: f64,
    /// A LayerNorm after the embeddings (BLOOM's `word_embeddings_layernorm`,
    /// Megatron-DeepSpeed `--embed-layernorm`).
    pub embedding_norm: bool,
    /// Width of one attention head when it is not hidden / n_heads (Hugging Face `head_dim`:
    /// Gemma's 256, Qwen3's 128, Mistral-Nemo's 128 at hidden 5120); llama family only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_dim_override: Option<u64>,
    /// Biases on the q, k and v projections (Qwen2 / Qwen2.5); llama family only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub qkv_bias: bool,
    /// RMSNorm of each query and key head before rotary embeddings, one weight of head_dim
    /// each, shared by the heads (Qwen3's `q_norm` / `k_norm`); llama family only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// Mixture-of-experts MLPs (Mixtral, Qwen-MoE, DeepSeek); llama family only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
    /// DeepSeek's multi-head latent attention in place of q, k, v projections; llama family
    /// only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaConfig>,
    /// Where a block departs from its family's layout (GPT-NeoX, OLMo, OLMo 2, Gemma 2/3);
    /// read from Hugging Face configs.
    #[serde(skip_serializing_if = "BlockStyle::is_default")]
    pub style: BlockStyle,
    /// Sliding-window (local) attention in some or all blocks (Mistral, Gemma 2/3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<SlidingWindow>,
    /// DeepSeek-V3's multi-token prediction modules after the last block (Megatron-Core
    /// `--mtp-num-layers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpConfig>,
}

/// Multi-token prediction as DeepSeek-V3 trains it (arXiv 2412.19437, Sec. 2.2) and
/// Megatron-Core implements it (`megatron/core/transformer/multi_token_prediction.py`):
/// `layers` sequential modules after the main model, on its last pipeline stage. Module k
/// takes the hidden state of depth k - 1 (the main model's output after its final norm, for
/// the first) and the embedding of the tokens shifted k places (`roll_tensor`), normalises
/// each with its own RMSNorm (`hnorm`, `enorm`), projects their concatenation 2h -> h
/// (`eh_proj`, no bias), runs one transformer layer built from the last block's spec (a MoE
/// block for DeepSeek-V3) and its own final RMSNorm (`final_layernorm`), then the shared
/// output head and a cross-entropy against the labels shifted k places. Embedding and head
/// are the main model's (shared, not counted again).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MtpConfig {
    /// Prediction depth D (`--mtp-num-layers`; Hugging Face `num_nextn_predict_layers`).
    pub layers: u64,
    /// `--mtp-loss-scaling-factor` (Megatron's default 0.1; DeepSeek-V3's lambda, 0.3 for
    /// its first 10T tokens and 0.1 after): the mean of the D losses is scaled by it. It
    /// changes no memory or time.
    pub loss_scale: f64,
}

/// Departures from the family's block that change parameters, saved tensors or kernels, each
/// as the Hugging Face modelling code of the architecture builds it. The default is the
/// family's own block (Llama's or GPT-2's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BlockStyle {
    /// Gpt family: rotary positions on this many dimensions of each head in place of a learned
    /// position table (GPT-NeoX's `rotary_pct` x head_dim, applied to the first dimensions;
    /// `GPTNeoXAttention` builds new q and k while v stays a view of the fused projection).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotary_dims: Option<u64>,
    /// The MLP reads the block's input, not the attention's residual sum: `x + attn(ln1(x)) +
    /// mlp(ln2(x))` (GPT-NeoX's `use_parallel_residual`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub parallel_residual: bool,
    /// Where the block's norms sit.
    #[serde(skip_serializing_if = "NormPlacement::is_pre")]
    pub norms: NormPlacement,
    /// Norms without weights or biases (OLMo's `OlmoLayerNorm`: `F.layer_norm` with no affine
    /// parameters, a mean-centred LayerNorm).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub weightless_norms: bool,
    /// The query and key norms span every head together (OLMo 2's `q_norm` of
    /// heads x head_dim and `k_norm` of kv_heads x head_dim) rather than one head's width.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm_full_width: bool,
    /// A bias on the attention's output projection (Hugging Face `attention_bias` on Llama,
    /// OLMo, Gemma, Qwen3 and gpt-oss biases q, k, v and o; `qkv_bias` holds the first three).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub o_bias: bool,
    /// gpt-oss's attention sinks: one learned logit per head (`GptOssAttention.sinks`) that
    /// joins every query's softmax, taking probability mass and writing nothing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub attention_sinks: bool,
    /// Gemma 2's `final_logit_softcapping`: `tanh(logits / cap) x cap` before the loss, in
    /// eager PyTorch three element-wise kernels of which tanh saves its output.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub final_logit_softcap: bool,
    /// Gemma 2's `attn_logit_softcapping`: the same on attention scores (inside the kernel with
    /// FlashAttention; three passes over the s x s scores, tanh's output saved, in math
    /// attention).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub attn_logit_softcap: bool,
}

impl BlockStyle {
    pub fn is_default(&self) -> bool {
        *self == BlockStyle::default()
    }

    /// Norms in one block (each with a weight, unless weightless).
    pub fn norms_per_block(&self) -> u64 {
        match self.norms {
            NormPlacement::Pre | NormPlacement::Post => 2,
            NormPlacement::Sandwich => 4,
        }
    }
}

/// Where a block's norms sit around attention and the MLP.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormPlacement {
    /// Before each (GPT-2, Llama): `x + attn(norm(x))`.
    #[default]
    Pre,
    /// After each, inside the residual (OLMo 2): `x + norm(attn(x))`.
    Post,
    /// Before and after each (Gemma 2 and 3's four norms): `x + norm(attn(norm(x)))`.
    Sandwich,
}

impl NormPlacement {
    pub fn is_pre(&self) -> bool {
        *self == NormPlacement::Pre
    }
}

/// Sliding-window attention: a query attends to itself and the `window` tokens before it (the
/// causal band FlashAttention-2 computes with `window_size`; Hugging Face's flash path), in
/// the blocks `pattern` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlidingWindow {
    pub window: u64,
    pub pattern: WindowPattern,
    /// Chunked local attention instead (Llama 4's `attention_chunk_size`): the sequence is cut
    /// into chunks of `window` tokens and a query attends to the tokens of its own chunk up to
    /// itself.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub chunked: bool,
}

/// Which blocks attend locally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowPattern {
    /// Every block (Mistral 7B v0.1).
    All,
    /// Every block but each `n`th, which attends globally: block l is global when
    /// (l + 1) % n == 0 (Gemma 2: n = 2, its even blocks local; Gemma 3's
    /// `sliding_window_pattern` 6: five local to one global).
    GlobalEvery(u64),
    /// Blocks from this index on (Qwen2's `max_window_layers` with `use_sliding_window`).
    From(u64),
}

impl SlidingWindow {
    /// The window of block `l`, where it attends locally.
    pub fn window_of(&self, l: u64) -> Option<u64> {
        let local = match self.pattern {
            WindowPattern::All => true,
            WindowPattern::GlobalEvery(n) => (l + 1) % n.max(1) != 0,
            WindowPattern::From(k) => l >= k,
        };
        local.then_some(self.window)
    }

    /// Whether a local block attends to the whole of an `s`-token sequence anyway.
    pub fn covers(&self, s: u64) -> bool {
        if self.chunked {
            self.window >= s
        } else {
            self.window.saturating_add(1) >= s
        }
    }

    /// The share of causal attention's query-key pairs a local block computes over an
    /// `s`-token sequence ([`SlidingWindow::causal_share`], or its chunked counterpart).
    pub fn share(&self, s: u64) -> f64 {
        if self.chunked {
            SlidingWindow::chunked_share(self.window, s)
        } else {
            SlidingWindow::causal_share(self.window, s)
        }
    }

    /// Query-key pairs chunked attention computes, chunks of `c` tokens over a causal sequence
    /// of `s`, as a share of s (s + 1) / 2: each whole chunk its own triangle c (c + 1) / 2, the
    /// last r = s mod c tokens r (r + 1) / 2. 1 when one chunk covers the sequence.
    pub fn chunked_share(c: u64, s: u64) -> f64 {
        if c >= s {
            return 1.0;
        }
        let (q, r) = ((s / c) as f64, (s % c) as f64);
        let c = c as f64;
        let pairs = q * c * (c + 1.0) / 2.0 + r * (r + 1.0) / 2.0;
        let s = s as f64;
        pairs / (s * (s + 1.0) / 2.0)
    }

    /// Query-key pairs a block of window `w` computes over a causal sequence of `s` tokens, as
    /// a share of full causal attention's s (s + 1) / 2: each query i meets min(i, w) + 1 keys.
    /// 1 when the window covers the sequence.
    pub fn causal_share(w: u64, s: u64) -> f64 {
        if w + 1 >= s {
            return 1.0;
        }
        let (w, s) = (w as f64, s as f64);
        // Queries 0..=w meet i + 1 keys (the triangle), the rest w + 1 each.
        let band = (w + 1.0) * (w + 2.0) / 2.0 + (s - w - 1.0) * (w + 1.0);
        band / (s * (s + 1.0) / 2.0)
    }
}

/// Multi-head latent attention (DeepSeek-V2/V3; Hugging Face `DeepseekV3Attention`,
/// Megatron-Core `MLASelfAttention`): queries through a low-rank down projection, its
/// RMSNorm and an up projection to every head's no-rope and rope parts; keys and values
/// through one shared down projection to a compressed latent (plus one rope key shared by
/// the heads), its RMSNorm, and an up projection to every head's no-rope key and value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MlaConfig {
    /// Rank of the query down projection (`q_lora_rank`); 0: a direct h -> heads projection
    /// (DeepSeek-V2-Lite).
    pub q_lora_rank: u64,
    /// Rank of the key-value latent (`kv_lora_rank`).
    pub kv_lora_rank: u64,
    /// Per-head widths: the query/key part without rotary (`qk_nope_head_dim`), the rotary
    /// part (`qk_rope_head_dim`, one key shared by the heads) and the value (`v_head_dim`).
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

impl MlaConfig {
    /// A query's (and key's) width per head.
    pub fn qk_head_dim(&self) -> u64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Parameters of the attention of one block for `heads` heads over hidden `h`: the
    /// projections and the two latent RMSNorms (not the block's input norm).
    pub fn params(&self, h: u64, heads: u64) -> u64 {
        let q = match self.q_lora_rank {
            0 => h * heads * self.qk_head_dim(),
            r => h * r + r + r * heads * self.qk_head_dim(),
        };
        let kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            + self.kv_lora_rank
            + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim);
        let o = heads * self.v_head_dim * h;
        q + kv + o
    }
}

/// A mixture-of-experts MLP, in the terms of Hugging Face's configs and Megatron-Core's
/// `--num-experts` / `--moe-router-topk` / `--moe-ffn-hidden-size` /
/// `--moe-shared-expert-intermediate-size` / `--moe-layer-freq`: a router (one linear from
/// the hidden state to one logit per expert, no bias), `num_experts` SwiGLU experts of width
/// `expert_ffn_hidden` of which each token uses `top_k`, and optionally shared experts every
/// token passes through.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoeConfig {
    pub num_experts: u64,
    /// Experts each token is routed to (HF `num_experts_per_tok`).
    pub top_k: u64,
    /// FFN width of one routed expert (HF `moe_intermediate_size`; Mixtral's
    /// `intermediate_size`).
    pub expert_ffn_hidden: u64,
    /// FFN width of the shared experts together (DeepSeek `n_shared_experts` x
    /// `moe_intermediate_size`, Qwen2-MoE `shared_expert_intermediate_size`); 0: none.
    pub shared_expert_ffn_hidden: u64,
    /// Qwen2-MoE's sigmoid gate on the shared expert's output (one linear h -> 1).
    pub shared_expert_gate: bool,
    /// Leading blocks with a dense MLP of `ffn_hidden` (DeepSeek `first_k_dense_replace`).
    pub first_dense_layers: u64,
    /// Past them, block l is a mixture of experts when l % `every` == `offset`: Megatron's
    /// `--moe-layer-freq N` (every N, offset 0), DeepSeek's `moe_layer_freq`, Qwen-MoE's
    /// `decoder_sparse_step` and Llama 4's `interleave_moe_layer_step` s (every s, offset
    /// s - 1); the other blocks have a dense MLP of `ffn_hidden`.
    #[serde(skip_serializing_if = "is_one")]
    pub every: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
    /// Blocks whose MLP is dense whatever the pattern says (Qwen-MoE's `mlp_only_layers`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dense_layers: Vec<u64>,
    /// Biases on the router (one per expert) and on every expert's projections (gpt-oss's
    /// `GptOssTopKRouter.bias`, `gate_up_proj_bias`, `down_proj_bias`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub biases: bool,
    /// Group-limited routing: the experts in `router_groups` groups of consecutive experts,
    /// of which a token's `top_k` come from its best `router_group_topk` (DeepSeek's
    /// `n_group` / `topk_group`, node-limited routing with a group per node; Megatron's
    /// `--moe-router-num-groups` / `--moe-router-group-topk`). 1 / 1: not limited. It changes
    /// which ranks and nodes a token reaches, so only a dispatcher that sends a token once
    /// per rank or node (DeepEP) moves fewer bytes for it.
    #[serde(skip_serializing_if = "is_one")]
    pub router_groups: u64,
    #[serde(skip_serializing_if = "is_one")]
    pub router_group_topk: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

impl MoeConfig {
    /// Group-limited routing in words ("the best 4 of 8 groups of 32 experts"); None without.
    pub fn group_limit_words(&self) -> Option<String> {
        (self.router_groups > 1).then(|| {
            format!(
                "the best {} of {} groups of {} experts",
                self.router_group_topk,
                self.router_groups,
                self.num_experts / self.router_groups
            )
        })
    }

    /// Whether block `l`'s MLP is this mixture of experts.
    pub fn is_moe_layer(&self, l: u64) -> bool {
        l >= self.first_dense_layers && l % self.every.max(1) == self.offset && !self.dense_layers.contains(&l)
    }

    /// The pattern in words: "every block", "blocks 3-60", "every 2nd block from block 1", with
    /// the blocks listed dense, for a model of `n_layers` blocks.
    pub fn pattern_words(&self, n_layers: u64) -> String {
        let mut w = match (self.every.max(1), self.first_dense_layers) {
            (1, 0) => "every block".to_string(),
            (1, k) => format!("blocks {k}-{} (the first {k} dense)", n_layers.saturating_sub(1)),
            (n, k) => {
                let first = (k..n_layers).find(|&l| l % n == self.offset).unwrap_or(k);
                format!("every {} block from block {first}", ordinal(n))
            }
        };
        if !self.dense_layers.is_empty() {
            let list: Vec<String> = self.dense_layers.iter().map(|l| l.to_string()).collect();
            w.push_str(&format!(" but blocks {} (dense)", list.join(", ")));
        }
        w
    }
    /// Parameters of one MoE MLP: router, every expert, shared experts and their gate.
    pub fn mlp_params(&self, h: u64) -> u64 {
        self.router_params(h) + self.num_experts * self.expert_params(h) + self.shared_params(h)
    }
    /// Parameters of the MoE MLP one token uses: router, `top_k` experts, the shared ones.
    pub fn active_mlp_params(&self, h: u64) -> u64 {
        self.router_params(h) + self.top_k * self.expert_params(h) + self.shared_params(h)
    }
    /// One expert: gate, up and down projections (and their biases).
    pub fn expert_params(&self, h: u64) -> u64 {
        3 * h * self.expert_ffn_hidden + if self.biases { 2 * self.expert_ffn_hidden + h } else { 0 }
    }
    pub fn router_params(&self, h: u64) -> u64 {
        self.num_experts * h + if self.biases { self.num_experts } else { 0 }
    }
    pub fn shared_params(&self, h: u64) -> u64 {
        3 * h * self.shared_expert_ffn_hidden + if self.shared_expert_gate { h } else { 0 }
    }
}

impl ModelConfig {
    /// Llama-2-70B's model card (80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672,
    /// vocabulary 32000, context 4096): the reference shape the tests share.
    pub fn llama2_70b() -> ModelConfig {
        ModelConfig {
            family: Family::Llama,
            n_layers: 80,
            hidden: 8192,
            n_heads: 64,
            n_kv_heads: 8,
            ffn_hidden: 28672,
            vocab: 32000,
            max_seq_len: 4096,
            tie_embeddings: false,
            dropout: 0.0,
            embedding_norm: false,
            head_dim_override: None,
            qkv_bias: false,
            qk_norm: false,
            moe: None,
            mla: None,
            style: BlockStyle::default(),
            sliding_window: None,
            mtp: None,
        }
    }

    pub fn head_dim(&self) -> u64 {
        self.head_dim_override.unwrap_or(self.hidden / self.n_heads)
    }
    /// Width of all query heads together (the q projection's output and o's input).
    pub fn q_dim(&self) -> u64 {
        self.n_heads * self.head_dim()
    }
    pub fn kv_dim(&self) -> u64 {
        self.n_kv_heads * self.head_dim()
    }

    /// Parameters of one dense transformer block, closed form.
    pub fn params_per_block(&self) -> u64 {
        self.attention_params() + self.dense_mlp_params()
    }

    /// The attention half of a block with its norm (and, for Llama, the MLP's norm).
    fn attention_params(&self) -> u64 {
        let (h, kv, q) = (self.hidden, self.kv_dim(), self.q_dim());
        match self.family {
            // q, o: h*q; k, v: h*kv; two RMSNorm weights; q, k, v biases; q and k head norms.
            Family::Llama => {
                if let Some(mla) = &self.mla {
                    return mla.params(h, self.n_heads) + 2 * h;
                }
                let bias = if self.qkv_bias { q + 2 * kv } else { 0 };
                let qk_norm = match (self.qk_norm, self.style.qk_norm_full_width) {
                    (false, _) => 0,
                    (true, false) => 2 * self.head_dim(),
                    (true, true) => q + kv,
                };
                let o_bias = if self.style.o_bias { h } else { 0 };
                let sinks = if self.style.attention_sinks { self.n_heads } else { 0 };
                2 * h * q + 2 * h * kv + self.block_norm_params() + bias + o_bias + qk_norm + sinks
            }
            // qkv h*(h + 2kv) + its bias, proj h*h + h, two LayerNorms 2*2h (kv = h without
            // grouped-query attention).
            Family::Gpt => (h + 1) * (h + 2 * kv) + h * h + h + self.block_norm_params(),
        }
    }

    /// Parameters of one norm over the hidden state: RMSNorm's weight (Llama), LayerNorm's
    /// weight and bias (GPT), none for a weightless norm (OLMo).
    pub fn norm_params(&self) -> u64 {
        match (self.style.weightless_norms, self.family) {
            (true, _) => 0,
            (false, Family::Llama) => self.hidden,
            (false, Family::Gpt) => 2 * self.hidden,
        }
    }

    /// The norms of one block (counted with its attention half).
    fn block_norm_params(&self) -> u64 {
        self.style.norms_per_block() * self.norm_params()
    }

    fn dense_mlp_params(&self) -> u64 {
        let (h, f) = (self.hidden, self.ffn_hidden);
        match self.family {
            // gate, up, down.
            Family::Llama => 3 * h * f,
            // fc h*f + f, proj f*h + h.
            Family::Gpt => 2 * h * f + f + h,
        }
    }

    /// Whether block `l`'s MLP is a mixture of experts.
    pub fn is_moe_layer(&self, l: u64) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_moe_layer(l))
    }

    /// Blocks whose MLP is a mixture of experts.
    pub fn moe_layers(&self) -> u64 {
        match &self.moe {
            None => 0,
            // The common case without a walk over the blocks.
            Some(m) if m.every <= 1 && m.dense_layers.is_empty() => self.n_layers.saturating_sub(m.first_dense_layers),
            Some(m) => (0..self.n_layers).filter(|&l| m.is_moe_layer(l)).count() as u64,
        }
    }

    /// Parameters of block `l`, closed form.
    pub fn block_params(&self, l: u64) -> u64 {
        match &self.moe {
            Some(m) if self.is_moe_layer(l) => self.attention_params() + m.mlp_params(self.hidden),
            _ => self.params_per_block(),
        }
    }

    /// Parameters one token's forward uses: the whole model for a dense one; for a mixture
    /// of experts, `top_k` experts of each MoE block (the "active" count model cards give).
    /// The multi-token prediction modules count with the share they use.
    pub fn active_param_count(&self) -> u64 {
        let Some(m) = &self.moe else { return self.param_count() };
        let moe_layers = self.moe_layers();
        let mtp = self.mtp_layers() * (self.mtp_module_params() - self.mtp_module_active_params());
        self.param_count() - moe_layers * (m.mlp_params(self.hidden) - m.active_mlp_params(self.hidden)) - mtp
    }

    /// Parameters outside the blocks: embeddings, positions, final norm, LM head.
    pub fn params_outside_blocks(&self) -> u64 {
        let (h, v) = (self.hidden, self.vocab);
        let emb = v * h * if self.tie_embeddings { 1 } else { 2 };
        let norm = self.norm_params();
        let emb_norm = if self.embedding_norm { norm } else { 0 };
        emb + self.position_table().map_or(0, |rows| rows * h) + norm + emb_norm
    }

    /// Rows of the learned position table, where positions are parameters (the gpt family
    /// without rotary dimensions).
    pub fn position_table(&self) -> Option<u64> {
        (self.family == Family::Gpt && self.style.rotary_dims.is_none()).then_some(self.max_seq_len)
    }

    /// Dimensions of each head rotary embeddings turn (none for a learned table).
    pub fn rotary_dims(&self) -> Option<u64> {
        match self.family {
            Family::Llama => Some(self.mla.as_ref().map_or(self.head_dim(), |m| m.qk_rope_head_dim)),
            Family::Gpt => self.style.rotary_dims,
        }
    }

    /// What a reader needs to know of the block beyond its sizes, in words: where it departs
    /// from its family's (the `style`) and its sliding windows against a `seq_len` sequence.
    pub fn block_notes(&self, seq_len: u64) -> Vec<String> {
        let st = &self.style;
        let mut notes = Vec::new();
        if let Some(d) = st.rotary_dims {
            notes.push(format!("rotary positions on {d} of {} dims per head (no position table)", self.head_dim()));
        }
        if st.parallel_residual {
            notes.push("parallel residual (the MLP reads the block's input)".into());
        }
        match st.norms {
            NormPlacement::Pre => {}
            NormPlacement::Post => notes.push("norms after attention and the MLP, inside the residual".into()),
            NormPlacement::Sandwich => notes.push("norms before and after attention and the MLP (4 per block)".into()),
        }
        if st.weightless_norms {
            notes.push("LayerNorms without weights or biases".into());
        }
        if self.qk_norm && st.qk_norm_full_width {
            notes.push("q/k RMSNorm over all heads together".into());
        }
        match (self.qkv_bias, st.o_bias) {
            (true, true) => notes.push("biases on q, k, v and the attention output".into()),
            (false, true) => notes.push("a bias on the attention output".into()),
            _ => {}
        }
        if st.attention_sinks {
            notes.push("attention sinks (one learned logit per head)".into());
        }
        if self.moe.as_ref().is_some_and(|m| m.biases) {
            notes.push("router and expert biases".into());
        }
        if st.attn_logit_softcap {
            notes.push("attention-score soft-capping (in the flash kernel; 3 passes and a saved copy of the scores in math attention)".into());
        }
        if st.final_logit_softcap {
            notes.push("final-logit soft-capping (tanh saves a tokens x vocabulary copy)".into());
        }
        if let Some(sw) = &self.sliding_window {
            let local = (0..self.n_layers).filter(|&l| sw.window_of(l).is_some()).count();
            let effect = if sw.covers(seq_len) {
                format!("covering the whole {seq_len}-token sequence")
            } else {
                format!(
                    "flash computes {:.1}% of causal attention there at {seq_len} tokens; math attention every score",
                    100.0 * sw.share(seq_len)
                )
            };
            let what = if sw.chunked { "chunked attention over chunks" } else { "sliding window" };
            notes.push(format!("{what} of {} tokens in {local} of {} blocks ({effect})", sw.window, self.n_layers));
        }
        notes
    }

    /// Total parameter count, closed form (the DAG's count is tested against this): the
    /// blocks, what is outside them and the multi-token prediction modules.
    pub fn param_count(&self) -> u64 {
        let moe_layers = self.moe_layers();
        let blocks = match &self.moe {
            Some(m) => {
                (self.n_layers - moe_layers) * self.params_per_block()
                    + moe_layers * (self.attention_params() + m.mlp_params(self.hidden))
            }
            None => self.n_layers * self.params_per_block(),
        };
        blocks + self.params_outside_blocks() + self.mtp_layers() * self.mtp_module_params()
    }

    /// Blocks as the simulation's size estimate counts them (`scenario::limits`): each block
    /// once, a MoE block twice, a multi-token prediction module as its layer.
    pub fn size_layers(&self) -> u64 {
        let mtp = self.mtp_layers() * (1 + u64::from(self.is_moe_layer(self.mtp_spec_layer())));
        self.n_layers + self.moe_layers() + mtp
    }

    /// Multi-token prediction modules (0 without).
    pub fn mtp_layers(&self) -> u64 {
        self.mtp.as_ref().map_or(0, |m| m.layers)
    }

    /// Blocks of the DAG: the model's, then one per multi-token prediction module (block
    /// `n_layers + k` is module k's, its norms and projection with it).
    pub fn blocks(&self) -> u64 {
        self.n_layers + self.mtp_layers()
    }

    /// The block whose spec a multi-token prediction module's transformer layer is built
    /// from: Megatron-Core's `get_gpt_mtp_block_spec` takes the decoder's last layer spec
    /// (`spec.layer_specs[-1]`), so the layer is a MoE block when the last block is.
    pub fn mtp_spec_layer(&self) -> u64 {
        self.n_layers.saturating_sub(1)
    }

    /// Parameters of one multi-token prediction module that are its own: `enorm`, `hnorm`
    /// and `final_layernorm` (three norms over the hidden state), `eh_proj` (2h -> h, no
    /// bias) and the transformer layer. The embedding and the output head are shared with
    /// the main model and counted there.
    pub fn mtp_module_params(&self) -> u64 {
        let h = self.hidden;
        3 * self.norm_params() + 2 * h * h + self.block_params(self.mtp_spec_layer())
    }

    /// Of [`ModelConfig::mtp_module_params`], what one token uses (`top_k` routed experts of
    /// a MoE layer).
    pub fn mtp_module_active_params(&self) -> u64 {
        let all = self.mtp_module_params();
        match &self.moe {
            Some(m) if self.is_moe_layer(self.mtp_spec_layer()) => {
                all - (m.mlp_params(self.hidden) - m.active_mlp_params(self.hidden))
            }
            _ => all,
        }
    }
}

/// How attention is computed, which decides whether the s x s scores are saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// FlashAttention / SDPA flash kernel: saves q, k, v, output and the FP32 log-sum-exp.
    Flash,
    /// Materialised scores: saves the softmax output (and dropout mask and output).
    Math,
    /// Materialised scores as Hugging Face's `eager_attention_forward` computes them: the
    /// scaling and the mask as their own kernels, the softmax in FP32 (`dtype=torch.float32`)
    /// and cast back (`.to(query.dtype)`); saves the FP32 softmax and its 16-bit copy.
    Eager,
}

impl Attention {
    /// Whether the s x s scores are materialised (math or eager attention).
    pub fn materialised(self) -> bool {
        matches!(self, Attention::Math | Attention::Eager)
    }
}

/// A fused attention kernel named by the user (`training.attention`), timed at its measured
/// rates ([`crate::schedule::flash_rates`]) in place of the framework's default kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlashKernel {
    /// FlashAttention-2 (the flash-attn package; PyTorch SDPA's flash backend; Hugging Face's
    /// `flash_attention_2`).
    FlashAttention2,
    /// FlashAttention-3 (flash-attn's `hopper` build; Hugging Face's `flash_attention_3`):
    /// Hopper only.
    FlashAttention3,
    /// cuDNN's fused attention (PyTorch SDPA's cuDNN backend; Transformer Engine's
    /// `FusedAttention`).
    Cudnn,
}

impl FlashKernel {
    /// The name `training.attention` takes.
    pub fn name(self) -> &'static str {
        match self {
            FlashKernel::FlashAttention2 => "flash_attention_2",
            FlashKernel::FlashAttention3 => "flash_attention_3",
            FlashKernel::Cudnn => "cudnn",
        }
    }
}

/// The per-micro-batch workload the graph is built for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    pub micro_batch: u64,
    pub seq_len: u64,
    /// Dtype of activations and of the gathered weights the kernels read.
    pub compute_dtype: Dtype,
    pub attention: Attention,
    /// Upcast logits to FP32 before the loss (what most training scripts do).
    pub logits_fp32: bool,
    /// How one rank's share of the graph is cut: Megatron tensor parallelism.
    pub split: TensorSplit,
    /// LoRA / QLoRA fine-tuning: a frozen base with adapters ([`super::lora::apply`]).
    pub lora: Option<super::lora::LoraConfig>,
    /// A mixture of experts under uneven routing: the token copies this expert-parallel
    /// rank's experts receive (None: uniform routing, top_k per token of this rank).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routed: Option<RoutedCopies>,
    /// SwiGLU as one fused kernel that saves only its input, the gate and up projections'
    /// outputs (Megatron-Core's `SwiGLUFunction`), instead of eager PyTorch's SiLU and product,
    /// which also save the SiLU output and the product's other factor.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fused_swiglu: bool,
    /// Where a mixture of experts scales each token copy by its routing probability, which
    /// decides what is saved for the probabilities' gradient ([`RoutingScale`]).
    #[serde(skip_serializing_if = "RoutingScale::is_after_combine")]
    pub routing_scale: RoutingScale,
    /// The fused SwiGLU saves its input as an FP8 (E4M3) cast instead of in 16 bits
    /// (Megatron-Core `--activation-func-fp8-input-store`, [`super::dag`]'s `fused_swiglu`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub swiglu_fp8_input_store: bool,
    /// Which kernels run the memory-bound ops between the GEMMs ([`KernelStack`]).
    #[serde(skip_serializing_if = "KernelStack::is_fused")]
    pub kernels: KernelStack,
    /// Grouped-query keys and values are copied to every query head before attention
    /// (`repeat_kv`): torchtitan's llama until ff0829c10 (2026-01-27, "GQA without kv
    /// repeats") and Hugging Face's eager attention do; SDPA with `enable_gqa`, Hugging Face's
    /// `flash_attention_2` and Transformer Engine read the grouped heads as they are.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub repeat_kv: bool,
    /// Flash attention runs PyTorch's SDPA flash kernel, FlashAttention-2 (every framework but
    /// Megatron, whose Transformer Engine runs cuDNN's fused attention), timed at its measured
    /// rates (`crate::schedule::flash_rates`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub flash2: bool,
    /// The fused attention kernel `training.attention` named, in place of the framework's
    /// default (FlashAttention-2 where `flash2`, else Megatron's end-to-end fit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flash_kernel: Option<FlashKernel>,
    /// FP8 training of the block linears ([`super::fp8`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp8: Option<super::fp8::Fp8Config>,
    /// How the loss is computed from the final hidden states.
    #[serde(skip_serializing_if = "LossKind::is_eager")]
    pub loss: LossKind,
    /// The mixture of experts' auxiliary load-balancing loss ([`AuxLoss`]).
    #[serde(skip_serializing_if = "AuxLoss::is_none")]
    pub aux_loss: AuxLoss,
}

impl Workload {
    /// `micro_batch` x `seq_len` tokens in BF16 with FP32 logits, `attention`, one rank,
    /// nothing else on (no LoRA, FP8, routing or fused kernels): what tests and closed-form
    /// checks build DAGs from, one place to name each field.
    pub fn plain(micro_batch: u64, seq_len: u64, attention: Attention) -> Workload {
        Workload {
            micro_batch,
            seq_len,
            compute_dtype: Dtype::Bf16,
            attention,
            logits_fp32: true,
            split: Default::default(),
            lora: None,
            routed: None,
            fused_swiglu: false,
            routing_scale: Default::default(),
            swiglu_fp8_input_store: false,
            kernels: Default::default(),
            repeat_kv: false,
            flash2: false,
            flash_kernel: None,
            fp8: None,
            loss: Default::default(),
            aux_loss: Default::default(),
        }
    }

    /// How attention is named in the reports: "Flash" or "Math", with the kernel
    /// `training.attention` named.
    pub fn attention_label(&self) -> String {
        match (self.attention, self.flash_kernel) {
            (Attention::Flash, Some(k)) => format!("Flash ({})", k.name()),
            (a, _) => format!("{a:?}"),
        }
    }

    /// The fused attention kernel timed at its measured rates: the one `training.attention`
    /// named, else FlashAttention-2 where the framework runs it (`flash2`); None for math
    /// attention and for Megatron's default fused attention (the end-to-end fit).
    pub fn timed_flash_kernel(&self) -> Option<FlashKernel> {
        match self.attention {
            Attention::Math | Attention::Eager => None,
            Attention::Flash => self.flash_kernel.or(self.flash2.then_some(FlashKernel::FlashAttention2)),
        }
    }

    /// The keys each of FlashAttention's query blocks meets on this rank, which set the
    /// kernel's measured rate ([`crate::schedule::flash_rates`]): under Ulysses (`a2a`) every
    /// head runs on the whole sequence, else a ring step (or the all-gather's local queries)
    /// covers this rank's share of it.
    pub fn flash_keys(&self) -> u64 {
        let cp = self.split.context.max(1);
        if cp > 1 && self.split.context_comm == ContextComm::AllToAll {
            self.seq_len
        } else {
            self.seq_len / cp
        }
    }
}

/// Where a mixture of experts multiplies each routed copy by its routing probability. The
/// product's backward needs the copies for the probabilities' gradient, so where it runs
/// decides which copies are saved, and in what dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutingScale {
    /// After the combine, in the activations' dtype: the product saves the combined copies
    /// (Megatron-Core 0.8-0.12's `unpermute(..., probs)`; Hugging Face's
    /// `expert_layer(x) * routing_weights`, the weights cast to the hidden states' dtype).
    #[default]
    AfterCombine,
    /// After the combine, upcast: torchtitan's token dispatchers' `combine`
    /// (`routed_output.to(torch.float32) * topk_scores`, torchtitan/models/common/
    /// token_dispatcher.py, b5bcd76) saves an FP32 copy of the combined copies, 4 B per element.
    AfterCombineFp32,
    /// Inside the experts' fused SwiGLU, which saves the probabilities beside its input; the
    /// unpermutation only sums the copies home, saving nothing but its map: Megatron-Core 0.13
    /// on ("Memory efficient token permutation", NVIDIA/Megatron-LM 2659630, 2025-04:
    /// `weighted_bias_swiglu_impl` in `experts.py`, `unpermute` without probabilities in
    /// `token_dispatcher.py`). Only with a fused SwiGLU ([`Workload::fused_swiglu`], which
    /// Megatron always has here); without one the DAG scales after the combine.
    InActivation,
}

impl RoutingScale {
    pub fn is_after_combine(&self) -> bool {
        *self == RoutingScale::AfterCombine
    }
}

/// The router's auxiliary load-balancing loss, as the framework's model code computes it
/// during the forward. Its coefficient changes neither memory nor time, only whether it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuxLoss {
    /// Not computed: Megatron-Core's `--moe-aux-loss-coeff` default 0, Hugging Face's
    /// `output_router_logits = false` (its configs' default), torchtitan (which balances with
    /// an expert bias, `load_balance_coeff`, and has no auxiliary loss).
    #[default]
    None,
    /// Megatron-Core's router, in every MoE block (`router.py` `routing`: with a coefficient
    /// above 0, `compute_routing_scores_for_aux_loss` scores the logits over every expert once
    /// more in FP32 and keeps them for the softmax's backward; each loss counts the tokens per
    /// expert and all-reduces the counts). `global` adds `global_aux_loss`, whose counts are
    /// all-reduced over the stage's tensor x data x context ranks; `local` counts the
    /// per-micro-batch losses (`aux_loss`, `seq_aux_loss`), whose counts are all-reduced over
    /// tensor x context.
    Megatron { local: u8, global: bool },
    /// Hugging Face's `load_balancing_loss_func` after the language-model loss, over every MoE
    /// block's router logits kept to the end of the forward (`output_router_logits = true`).
    AllBlocks,
}

impl AuxLoss {
    /// Megatron-Core's auxiliary losses (`--moe-router-load-balancing-type` values that add
    /// one; `sinkhorn` and `none` do not).
    pub const MEGATRON_TYPES: [&str; 3] = ["aux_loss", "seq_aux_loss", "global_aux_loss"];

    pub fn is_none(&self) -> bool {
        *self == AuxLoss::None
    }
}

/// Which kernels run the memory-bound ops between a block's GEMMs: what changes between an
/// eager PyTorch run, the same run under `torch.compile`, and Megatron's fused kernels.
/// Only the Llama family's ops differ (RMSNorm, rotary embeddings, grouped-query keys and
/// values): GPT-style LayerNorm and GELU are single native kernels in eager PyTorch too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelStack {
    /// Eager PyTorch running the model code as torchtitan (`torchtitan/models/norms.py`
    /// `RMSNorm`, `llama/model.py` `apply_rotary_emb`, 9dec370) and Hugging Face transformers
    /// (`LlamaRMSNorm`, `apply_rotary_pos_emb`) write it: RMSNorm as eight kernels over an FP32
    /// copy, rotary embeddings through FP32 (or half-rotations), SiLU and the product as two
    /// kernels ([`super::eager`]). torchtitan moved to `nn.RMSNorm` on 2025-03-19 (3b39d7ab0),
    /// which PyTorch runs as one fused CUDA kernel from pytorch#153666 (mid-2025): such a run is
    /// `Fused` with SiLU and the product unfused.
    Eager,
    /// `torch.compile` of the same code (torchtitan `compile = true`): Inductor fuses each
    /// element-wise chain into one kernel (a norm, a rotary embedding, SiLU with the product,
    /// whose partitioner saves the product's inputs only); a `repeat_kv` in the model code
    /// still materialises the expanded keys and values, which the attention kernel (an extern
    /// call) reads.
    Compiled,
    /// One kernel per norm and rotary embedding, and grouped-query attention read by the
    /// attention kernel without copies: Megatron-Core / Transformer Engine (which also fuse
    /// SwiGLU), and PyTorch model code on `nn.RMSNorm`'s fused CUDA kernel with SDPA's
    /// `enable_gqa` (torchtitan since 2025; SiLU and the product stay two kernels there).
    #[default]
    Fused,
}

impl KernelStack {
    pub fn is_fused(&self) -> bool {
        *self == KernelStack::Fused
    }
    pub fn name(self) -> &'static str {
        match self {
            KernelStack::Eager => "eager",
            KernelStack::Compiled => "compiled",
            KernelStack::Fused => "fused",
        }
    }
}

/// The cross-entropy implementation, which decides what the head keeps at the largest
/// tensors of a step (tokens x vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossKind {
    /// `F.cross_entropy(logits.float(), targets)`: the 16-bit logits, an FP32 copy, and the
    /// FP32 log-softmax it saves (Hugging Face, torchtitan).
    #[default]
    Eager,
    /// Megatron-Core's `vocab_parallel_cross_entropy` (fused or not): the logits are upcast
    /// and exponentiated in place into an FP32 softmax, which is what it saves; its backward
    /// turns that into the 16-bit logit gradient (`megatron/core/tensor_parallel/
    /// cross_entropy.py`, `fusions/fused_cross_entropy.py`).
    VocabParallel,
    /// Liger-Kernel's `LigerFusedLinearCrossEntropyLoss`: the LM head and the loss as one op
    /// over chunks of tokens, computing each chunk's logits, their gradient and the input and
    /// weight gradients in forward; only one chunk's logits ever exist, and the gradients are
    /// what it saves.
    FusedLinear,
    /// `F.cross_entropy(logits.float(), targets)` under `torch.compile` (torchtitan compiles
    /// its loss with the model since bbb1b61, 2025-04-02, `components/loss.py`): Inductor fuses
    /// the upcast, log-softmax and NLL into row reductions over the 16-bit logits, saves those
    /// logits and each row's FP32 log-sum-exp, and its backward recomputes the softmax in one
    /// kernel that writes the 16-bit logit gradient. No FP32 copy of the logits exists.
    Compiled,
}

impl LossKind {
    pub fn is_eager(&self) -> bool {
        *self == LossKind::Eager
    }
    pub fn name(self) -> &'static str {
        match self {
            LossKind::Eager => "eager",
            LossKind::VocabParallel => "vocab-parallel",
            LossKind::FusedLinear => "fused-linear",
            LossKind::Compiled => "compiled",
        }
    }
}

/// Token copies per micro-batch and MoE block under uneven routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RoutedCopies {
    /// What this rank's experts receive (and compute, and save activations for).
    pub received: u64,
    /// What the busiest rank of the expert-parallel group receives: every all-to-all lasts
    /// until that rank's share has arrived.
    pub busiest: u64,
}

/// Megatron-LM tensor (and sequence) parallelism: the graph of one tensor-parallel rank.
/// Column-parallel linears (QKV, MLP up, LM head) split their outputs, row-parallel ones
/// (attention output, MLP down) their inputs, attention splits its heads and the embedding
/// its vocabulary; norms, dropout and residuals run on the whole hidden state (`tensor`
/// copies) or, with sequence parallelism, on 1/`tensor` of the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TensorSplit {
    pub tensor: u64,
    pub sequence_parallel: bool,
    /// Expert parallelism (Megatron-Core `--expert-model-parallel-size`): the experts of a
    /// MoE block are spread over this many ranks, each holding num_experts / `expert` of
    /// them; tokens reach them by all-to-all. Every rank routes its own rows (under
    /// sequence parallelism, its sequence shard).
    pub expert: u64,
    /// Expert tensor parallelism (Megatron-Core `--expert-tensor-parallel-size`): each
    /// expert's FC1 is column-parallel and FC2 row-parallel over this many ranks
    /// (`TEColumnParallelGroupedLinear` / `TERowParallelGroupedLinear`); the token
    /// dispatcher all-gathers the tokens its all-to-all received over them before the
    /// experts and reduce-scatters the experts' output after (`MoEAlltoAllTokenDispatcher`).
    #[serde(skip_serializing_if = "is_one")]
    pub expert_tensor: u64,
    /// Context parallelism: this rank holds 1/`context` of each sequence (Megatron-Core's
    /// load-balanced split: chunks i and 2 x context - 1 - i of 2 x context) for every op;
    /// attention runs its queries against the whole sequence's keys and values, which pass
    /// around the context-parallel ring (Transformer Engine's `AttnFuncWithCPAndKVP2P`).
    #[serde(skip_serializing_if = "is_one")]
    pub context: u64,
    /// How context-parallel attention gets the rest of the sequence.
    #[serde(skip_serializing_if = "ContextComm::is_ring")]
    pub context_comm: ContextComm,
}

/// How context-parallel attention meets the whole sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextComm {
    /// Blocks of keys and values passed around a ring under the attention blocks
    /// (Transformer Engine's p2p ring, Megatron `--cp-comm-type p2p`; PyTorch
    /// `context_parallel` with rotate method "alltoall").
    #[default]
    Ring,
    /// Every rank's keys and values all-gathered while the local block computes (PyTorch
    /// `context_parallel`, rotate method "allgather", torchtitan's default).
    AllGather,
    /// Ulysses: all-to-alls turn q, k, v from a sequence shard of every head into the whole
    /// sequence of 1/cp of the heads, and the output back (DeepSpeed-Ulysses, Megatron
    /// `--cp-comm-type a2a`).
    AllToAll,
}

impl ContextComm {
    pub fn is_ring(&self) -> bool {
        *self == ContextComm::Ring
    }
}

fn is_one(x: &u64) -> bool {
    *x == 1
}

impl Default for TensorSplit {
    fn default() -> Self {
        TensorSplit {
            tensor: 1,
            sequence_parallel: false,
            expert: 1,
            expert_tensor: 1,
            context: 1,
            context_comm: ContextComm::Ring,
        }
    }
}

/// "2nd", "3rd", "4th", "11th", "21st".
fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moe_patterns_in_words_and_blocks() {
        let m = MoeConfig {
            num_experts: 8,
            top_k: 2,
            expert_ffn_hidden: 64,
            shared_expert_ffn_hidden: 0,
            shared_expert_gate: false,
            first_dense_layers: 0,
            every: 1,
            offset: 0,
            dense_layers: vec![],
            biases: false,
            router_groups: 1,
            router_group_topk: 1,
        };
        assert_eq!(m.pattern_words(8), "every block");
        let d = MoeConfig { first_dense_layers: 3, ..m.clone() };
        assert_eq!(d.pattern_words(61), "blocks 3-60 (the first 3 dense)");
        let q = MoeConfig { every: 2, offset: 1, dense_layers: vec![5], ..m.clone() };
        assert_eq!(q.pattern_words(8), "every 2nd block from block 1 but blocks 5 (dense)");
        assert_eq!((0..8).filter(|&l| q.is_moe_layer(l)).collect::<Vec<_>>(), [1, 3, 7]);
        let k = MoeConfig { every: 3, offset: 0, first_dense_layers: 1, ..m };
        assert_eq!(k.pattern_words(10), "every 3rd block from block 3");
        assert_eq!(
            (ordinal(1), ordinal(11), ordinal(12), ordinal(22), ordinal(104)),
            ("1st".into(), "11th".into(), "12th".into(), "22nd".into(), "104th".into())
        );
    }
}
