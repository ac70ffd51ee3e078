//! Storage of weights and of the KV cache outside training: weight-only quantization
//! formats (what a GPTQ / AWQ / bitsandbytes checkpoint holds per parameter) and the KV
//! cache a decoder keeps per token. The first slice of issue 8 (inference, QLoRA); the
//! byte counts follow the formats' source code, cited in docs/research/issue8-sources.md.

use serde::Serialize;

use super::config::ModelConfig;

/// How a linear layer's weight is stored. Only the linear layers of the transformer blocks
/// are quantized; embeddings, the LM head, norms and biases stay in the 16-bit compute
/// dtype (AutoGPTQ's `outside_layer_modules`, AutoAWQ's default, bitsandbytes' skipped
/// modules).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "format")]
pub enum WeightFormat {
    /// BF16 / FP16: 2 bytes.
    Half,
    /// LLM.int8() / per-channel INT8: one byte per weight and one FP32 scale per output row
    /// (bitsandbytes `int8_vectorwise_quant`: `row_stats` float32).
    Int8,
    /// GPTQ / AWQ 4-bit with `group` input features per group: 4-bit weights, one FP16
    /// scale and one 4-bit zero point (packed eight per int32) per group and output feature.
    Int4 { group: u64 },
    /// bitsandbytes NF4 (QLoRA): 4-bit codes in blocks of 64 with one FP32 absmax per block;
    /// with double quantization the absmax values are 8-bit codes in blocks of 256 with one
    /// FP32 scale per 256 blocks.
    Nf4 { double_quant: bool },
}

/// bitsandbytes `quantize_4bit` default block size.
pub const NF4_BLOCK: u64 = 64;
/// bitsandbytes double quantization: first-level absmax values per second-level block.
pub const NF4_DQ_BLOCK: u64 = 256;

impl WeightFormat {
    /// Bytes of one `inputs` x `outputs` weight matrix in this format, scales included.
    pub fn linear_bytes(self, inputs: u64, outputs: u64) -> u64 {
        let n = inputs * outputs;
        match self {
            WeightFormat::Half => 2 * n,
            WeightFormat::Int8 => n + 4 * outputs,
            WeightFormat::Int4 { group } => {
                let groups = inputs.div_ceil(group.max(1)) * outputs;
                // FP16 scale (2 B) + 4-bit zero (half a byte) per group.
                n.div_ceil(2) + 2 * groups + groups.div_ceil(2)
            }
            WeightFormat::Nf4 { double_quant } => {
                let blocks = n.div_ceil(NF4_BLOCK);
                let absmax = if double_quant { blocks + 4 * blocks.div_ceil(NF4_DQ_BLOCK) } else { 4 * blocks };
                n.div_ceil(2) + absmax
            }
        }
    }

    /// Bytes per parameter of a large matrix (scales amortised), for reports.
    pub fn bytes_per_param(self) -> f64 {
        let (i, o) = (1 << 16, 1 << 16);
        self.linear_bytes(i, o) as f64 / (i * o) as f64
    }
}

/// KV-cache element types: what vLLM (`kv_cache_dtype`) and TensorRT-LLM offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvDtype {
    Half,
    Fp8,
}

impl KvDtype {
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::Half => 2,
            KvDtype::Fp8 => 1,
        }
    }
}

/// KV-cache bytes per token of context of one sequence on one tensor-parallel rank: keys
/// and values, every layer, this rank's KV heads: 2 x layers x kv_heads/t x head_dim x bytes
/// (the formula vLLM and NVIDIA's inference guides use). With more ranks than KV heads each
/// rank keeps a replica of one head (vLLM replicates KV heads when t > kv_heads).
pub fn kv_bytes_per_token(cfg: &ModelConfig, tensor: u64, dtype: KvDtype) -> u64 {
    let heads = cfg.n_kv_heads.div_ceil(tensor.max(1)).max(1);
    2 * cfg.n_layers * heads * cfg.head_dim() * dtype.bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Attention, OpKind, Region, Workload};

    fn llama2_70b() -> ModelConfig {
        ModelConfig::llama2_70b()
    }

    #[test]
    fn llama2_70b_keeps_320_kib_of_kv_cache_per_token() {
        // 2 x 80 layers x 8 KV heads x 128 x 2 B = 327,680 B (docs/research/issue8-sources.md §6).
        assert_eq!(kv_bytes_per_token(&llama2_70b(), 1, KvDtype::Half), 327_680);
        // 4096 tokens: 1.25 GiB per sequence.
        assert_eq!(4096 * kv_bytes_per_token(&llama2_70b(), 1, KvDtype::Half), 5 << 28);
        // TP 8: one KV head per rank; TP 16 replicates it rather than splitting a head.
        assert_eq!(kv_bytes_per_token(&llama2_70b(), 8, KvDtype::Half), 327_680 / 8);
        assert_eq!(kv_bytes_per_token(&llama2_70b(), 16, KvDtype::Half), 327_680 / 8);
        assert_eq!(kv_bytes_per_token(&llama2_70b(), 1, KvDtype::Fp8), 163_840);
    }

    #[test]
    fn quantized_formats_cost_what_their_kernels_store() {
        // GPTQ / AWQ g=128: 0.5 + 2/128 + 0.5/128 = 0.51953 B/param.
        let int4 = WeightFormat::Int4 { group: 128 }.bytes_per_param();
        assert!((int4 - (0.5 + 2.5 / 128.0)).abs() < 1e-9, "{int4}");
        // NF4: 0.5 + 4/64 = 0.5625 B/param; double quantization 0.5 + 1/64 + 4/(64 x 256).
        let nf4 = WeightFormat::Nf4 { double_quant: false }.bytes_per_param();
        assert!((nf4 - 0.5625).abs() < 1e-9, "{nf4}");
        let dq = WeightFormat::Nf4 { double_quant: true }.bytes_per_param();
        assert!((dq - (0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0))).abs() < 1e-9, "{dq}");
        // INT8 with an FP32 scale per output row of an 8192 x 28672 MLP weight.
        assert_eq!(WeightFormat::Int8.linear_bytes(8192, 28672), 8192 * 28672 + 4 * 28672);
        assert_eq!(WeightFormat::Half.linear_bytes(8192, 8192), 2 * 8192 * 8192);
        // A ragged last group still carries a scale and zero.
        assert_eq!(WeightFormat::Int4 { group: 128 }.linear_bytes(130, 1), 65 + 2 * 2 + 1);
    }

    #[test]
    fn gpt_fast_decode_reads_the_bytes_of_the_quantized_weights() {
        // gpt-fast (tests/fixtures/gpt_fast_decode.json): Llama-2-70B int8 on one A100, batch
        // 1: 19.13 tok/s at 1322.58 GB/s, i.e. 69.1 GB read per token. The block linears in
        // INT8 plus the BF16 embedding and head must come to that within 2%.
        // The block linears' shapes come from the layer DAG (gemm = [tokens, out, in]).
        let cfg = llama2_70b();
        let w = Workload { logits_fp32: false, ..Workload::plain(1, 1, Attention::Flash) };
        let dag = crate::model::build(&cfg, &w);
        let bytes: u64 = dag
            .ops
            .iter()
            .filter(|o| o.kind == OpKind::Linear)
            .map(|o| match (o.region, o.gemm) {
                (Region::Block(_), Some([_, out, inp])) => WeightFormat::Int8.linear_bytes(inp, out),
                // The LM head stays BF16; decode reads all of it (the embedding only one row).
                _ => 2 * (o.params + o.shared_params),
            })
            .sum();
        let fx: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/gpt_fast_decode.json")).unwrap();
        let row = &fx["rows"][0];
        assert_eq!(row["weights"], "int8");
        let published = row["gb_per_s"].as_f64().unwrap() * 1e9 / row["tokens_per_s"].as_f64().unwrap();
        let err = bytes as f64 / published - 1.0;
        assert!(err.abs() < 0.02, "stepsim {bytes} B vs gpt-fast {published:.3e} B ({:+.1}%)", 100.0 * err);
    }
}
