//! The plain-text report printed by `stepsim run`.

use std::fmt::Write;

use super::{fmt_bytes, Report, Verdict};
use crate::scenario::Scenario;

pub fn sep(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn render(r: &Report, s: &Scenario) -> String {
    let mut o = String::new();
    let m = &s.model;
    let c = &s.cluster;
    let t = &s.training;
    let p = &s.parallel;
    let _ = writeln!(o, "stepsim {} - scenario {}", r.stepsim_version, r.scenario);
    if !r.description.is_empty() {
        for line in r.description.lines() {
            let _ = writeln!(o, "  {line}");
        }
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Model      {} family, {} layers, hidden {}, {} heads ({} kv), ffn {}, vocab {}{}",
        format!("{:?}", m.family).to_lowercase(),
        m.n_layers,
        m.hidden,
        m.n_heads,
        m.n_kv_heads,
        m.ffn_hidden,
        m.vocab,
        if m.tie_embeddings { ", tied embeddings" } else { "" }
    );
    let mut extras = Vec::new();
    if m.head_dim_override.is_some() {
        extras.push(format!("head_dim {} (queries {} wide)", m.head_dim(), m.q_dim()));
    }
    if m.qkv_bias && !m.style.o_bias {
        extras.push("q/k/v biases".to_string());
    }
    if m.qk_norm && !m.style.qk_norm_full_width {
        extras.push("q/k head RMSNorm".to_string());
    }
    if let Some(moe) = &m.moe {
        let blocks = moe.pattern_words(m.n_layers);
        let mut line = format!(
            "mixture of experts in {blocks}: {} experts of ffn {}, top-{} routing{}",
            moe.num_experts,
            moe.expert_ffn_hidden,
            moe.top_k,
            moe.group_limit_words().map_or(String::new(), |w| format!(" from {w} (group-limited)"))
        );
        if moe.shared_expert_ffn_hidden > 0 {
            line.push_str(&format!(
                ", shared experts of ffn {}{}",
                moe.shared_expert_ffn_hidden,
                if moe.shared_expert_gate { " (sigmoid-gated)" } else { "" }
            ));
        }
        extras.push(line);
    }
    if let Some(mla) = &m.mla {
        let q = if mla.q_lora_rank > 0 { format!("query rank {}", mla.q_lora_rank) } else { "direct queries".into() };
        extras.push(format!(
            "multi-head latent attention: {q}, key-value latent {}, per head q/k {} + {} rope, v {}",
            mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        ));
    }
    if let Some(mtp) = &m.mtp {
        extras.push(mtp_words(m, mtp));
    }
    extras.extend(m.block_notes(s.workload.seq_len));
    if !extras.is_empty() {
        let _ = writeln!(o, "           {}", extras.join(", "));
    }
    if let Some(src) = &r.model_source {
        let _ = writeln!(o, "           from {src}");
    }
    match r.active_param_count {
        Some(a) => {
            let _ = writeln!(
                o,
                "           {} parameters ({}), {} ({}) active per token",
                sep(r.param_count),
                r.param_count_human,
                sep(a),
                super::human_count(a)
            );
        }
        None => {
            let _ = writeln!(o, "           {} parameters ({})", sep(r.param_count), r.param_count_human);
        }
    }
    let _ = writeln!(
        o,
        "Hardware   {} x {} ({} x {}), capacity {} per GPU = device {} - CUDA context {}{}",
        c.gpus,
        c.gpu.name,
        plural(u64::from(c.nodes()), "node"),
        c.gpus_per_node,
        fmt_bytes(r.capacity.bytes),
        fmt_bytes(c.memory_bytes),
        fmt_bytes(c.cuda_context_bytes),
        match s.nccl_bytes() {
            0 => String::new(),
            n => format!(" - NCCL buffers {}", fmt_bytes(n)),
        } + &match s.deepep_bytes() {
            0 => String::new(),
            n => format!(" - DeepEP buffers {}", fmt_bytes(n)),
        }
    );
    if c.nodes() > 1 {
        let _ = writeln!(
            o,
            "           node {}: {} x {:.0} Gb/s NICs = {:.1} GB/s per GPU across nodes; {:.0} GB/s per GPU inside a node",
            c.node,
            c.nics_per_node,
            c.nic_bytes_per_s * 8.0 / 1e9,
            c.network_bytes_per_s() / 1e9,
            c.gpu.nvlink_bytes_per_s / 1e9
        );
    } else if c.gpus > 1 {
        let _ = writeln!(
            o,
            "           node {}: one node, no traffic across nodes; {:.0} GB/s per GPU inside it",
            c.node,
            c.gpu.nvlink_bytes_per_s / 1e9
        );
    }
    if let Some(inf) = &r.inference {
        super::inference::header(r, inf, &mut o);
        common(r, &mut o);
        super::inference::timing_text(inf, &mut o);
        assumptions(r, &mut o);
        return o;
    }
    let fw = p.framework.display(p.sharding, u64::from(c.gpus));
    let fsdp_flags = if p.framework == crate::plan::Framework::Deepspeed {
        let d = &p.deepspeed;
        format!(
            "reduce_bucket_size={:e}, allgather_bucket_size={:e}, overlap_comm={}, contiguous_gradients={}",
            d.reduce_bucket_size as f64, d.allgather_bucket_size as f64, d.overlap_comm, d.contiguous_gradients
        )
    } else if p.framework == crate::plan::Framework::Megatron {
        let m = &p.megatron;
        format!(
            "overlap_grad_reduce={}, overlap_param_gather={}, tp_comm_overlap={}{}",
            m.overlap_grad_reduce,
            m.overlap_param_gather,
            m.tp_comm_overlap,
            if m.overlap_moe_expert_parallel_comm { ", overlap_moe_expert_parallel_comm=true" } else { "" }
        )
    } else if matches!(p.sharding, crate::plan::Sharding::None | crate::plan::Sharding::Zero1)
        && p.framework != crate::plan::Framework::Fsdp1
    {
        format!(
            "bucket_cap_mb={}, gradient_as_bucket_view={}",
            p.bucket_bytes as f64 / (1u64 << 20) as f64,
            p.gradient_as_bucket_view
        )
    } else if p.framework == crate::plan::Framework::Fsdp2 {
        format!(
            "fully_shard(reshard_after_forward={}), MixedPrecisionPolicy(param_dtype={}, reduce_dtype={}), backward prefetch {}{}{}",
            match p.post_forward_shard {
                Some(n) => n.to_string(),
                None => (p.reshard_after_forward && p.sharding != crate::plan::Sharding::Zero2).to_string(),
            },
            s.training.precision.compute.name(),
            s.training.precision.grad.name(),
            if p.backward_prefetch == crate::plan::BackwardPrefetch::None { "off" } else { "one unit ahead" },
            if p.no_sync { ", set_requires_gradient_sync(False) until the last micro-batch" } else { "" },
            if p.async_tp { ", async TP (sequence-parallel collectives pipelined with their GEMMs)" } else { "" }
        )
    } else {
        let mp = if p.framework == crate::plan::Framework::Fsdp1 {
            let pr = &s.training.precision;
            format!(
                ", MixedPrecision(param_dtype={}, reduce_dtype={}), use_orig_params={}",
                pr.compute.name(),
                pr.grad.name(),
                if p.use_orig_params { "True" } else { "False" }
            )
        } else {
            String::new()
        };
        format!(
            "reshard_after_forward={}, backward_prefetch={}, limit_all_gathers={}{mp}{}{}",
            p.reshard_after_forward && p.sharding != crate::plan::Sharding::Zero2,
            p.backward_prefetch.display(),
            p.limit_all_gathers,
            if p.no_sync { ", no_sync (gradients reduced in the last micro-batch only)" } else { "" },
            if p.async_tp { ", async TP (sequence-parallel collectives pipelined with their GEMMs)" } else { "" }
        )
    };
    let mp = &p.model_parallel;
    if mp.tensor * mp.pipeline * mp.expert * mp.expert_tensor * mp.context > 1 {
        let mut parts = vec![format!("tensor {}", mp.tensor)];
        if mp.sequence_parallel {
            parts.push("sequence parallel".into());
        }
        if mp.context > 1 {
            parts.push(format!(
                "context {} ({} of each sequence per GPU, {})",
                mp.context,
                s.training.seq_len / mp.context,
                if mp.context_comm == crate::model::ContextComm::AllGather {
                    "keys and values all-gathered: PyTorch context_parallel, rotate method allgather"
                } else if mp.context_comm == crate::model::ContextComm::AllToAll {
                    "Ulysses: all-to-alls give each GPU the whole sequence of 1/context of the heads"
                } else if p.framework == crate::plan::Framework::Megatron {
                    "keys and values around a ring"
                } else {
                    "keys and values around a ring: PyTorch context_parallel, rotate method alltoall"
                }
            ));
        }
        if mp.pipeline > 1 {
            parts.push(format!("pipeline {} ({}", mp.pipeline, mp.schedule.name()));
            if mp.virtual_stages > 1 {
                let last = parts.len() - 1;
                parts[last].push_str(&format!(", {} chunks per stage", mp.virtual_stages));
            }
            let last = parts.len() - 1;
            parts[last].push(')');
        }
        let _ = writeln!(
            o,
            "Parallel   {}{} x data parallel {} = {} GPUs; over the data-parallel{} ranks {}{}",
            if p.fsdp_expert_split() {
                "torchtitan (FSDP2 over expert parallelism) "
            } else if mp.tensor * mp.pipeline * mp.expert * mp.expert_tensor > 1
                || p.framework == crate::plan::Framework::Megatron
            {
                "Megatron-LM "
            } else {
                ""
            },
            parts.join(", "),
            s.dp_degree(),
            c.gpus,
            if mp.context > 1 { " x context-parallel" } else { "" },
            p.sharding_display(),
            if p.async_tp { "; async TP (sequence-parallel collectives pipelined with their GEMMs)" } else { "" }
        );
    } else {
        let _ = writeln!(
            o,
            "Parallel   {} over {}{}, {} semantics; {}",
            p.sharding_display(),
            plural(u64::from(c.gpus), "GPU"),
            if p.sharding == crate::plan::Sharding::HybridShard {
                let shard = crate::plan::shard_group(p, u64::from(c.gpus), u64::from(c.gpus_per_node));
                format!(
                    " (sharded over groups of {shard}{}, {} replicas all-reducing)",
                    if p.hsdp_shard.is_some() { "" } else { ", a node's" },
                    (u64::from(c.gpus) / shard.max(1)).max(1)
                )
            } else {
                String::new()
            },
            fw,
            fsdp_flags
        );
    }
    if let Some(moe) = &s.model.moe {
        let (ep, etp) = (mp.expert, mp.expert_tensor);
        let edp = mp.expert_data_parallel(u64::from(c.gpus));
        // Under torchtitan's HSDP each replica holds every expert, sharded over its own efsdp
        // mesh.
        let hsdp_efsdp = (s.parallel.fsdp_expert_split() && s.parallel.sharding == crate::plan::Sharding::HybridShard)
            .then(|| crate::plan::efsdp(&s.parallel, u64::from(c.gpus), u64::from(c.gpus_per_node)));
        // Expert tensor parallelism: each expert's width split over `etp` consecutive GPUs,
        // the received tokens all-gathered over them and the experts' output reduce-scattered.
        let split = if etp > 1 {
            format!(
                "expert tensor parallel {etp}: each expert's width split over {etp} consecutive GPUs ({} of {} per GPU; the tokens the all-to-all brings all-gathered over them before the experts, the output reduce-scattered after); ",
                moe.expert_ffn_hidden / etp,
                moe.expert_ffn_hidden
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "Experts    {split}expert parallel {ep}: {} of {} experts of each MoE block on every GPU; each expert{} on {} ({}){}",
            moe.num_experts / ep,
            moe.num_experts,
            if etp > 1 { " slice" } else { "" },
            plural(edp, "GPU"),
            if let Some(e) = hsdp_efsdp {
                format!(
                    "{} replicas of torchtitan's efsdp mesh of {}: FSDP2 shards the experts' parameters, gradients and optimizer state over each, all-gathers and reduce-scatters them there, and the replicas all-reduce the gradient shards",
                    edp / e.max(1),
                    plural(e, "GPU")
                )
            } else if s.parallel.fsdp_expert_split() {
                "torchtitan's efsdp mesh: FSDP2 shards the experts' parameters, gradients and optimizer state over it, all-gathers and reduce-scatters them there".to_string()
            } else if edp > 1 {
                "its expert-data-parallel group: expert gradients are reduced there, and sharded optimizer state split over it".to_string()
            } else {
                "no expert gradient reduction".to_string()
            },
            match (ep > 1, s.parallel.deepep.is_some()) {
                (false, _) => "",
                (true, false) => "; tokens reach them by all-to-all (dispatch and combine) over the expert-parallel group",
                (true, true) => "; tokens reach them by DeepEP's dispatch and combine over the expert-parallel group (once per rank, and across nodes once per node, a token reaches)",
            }
        );
    }
    let _ = writeln!(
        o,
        "Training   micro-batch {} x seq {} x grad_accum {}, {:?} ({:?}), precision {}, checkpointing {}{}, {} attention, {} kernels{}",
        t.micro_batch,
        t.seq_len,
        t.grad_accum,
        t.optimizer,
        t.optimizer_impl,
        t.precision.preset,
        t.checkpointing.name(),
        match t.checkpoint_blocks {
            crate::plan::CheckpointBlocks::All => String::new(),
            crate::plan::CheckpointBlocks::EveryNth(n) => {
                let th = match (n % 10, n % 100) {
                    (1, x) if x != 11 => "st",
                    (2, x) if x != 12 => "nd",
                    (3, x) if x != 13 => "rd",
                    _ => "th",
                };
                format!(" (every {n}{th} block: torchtitan selective_ac_option = \"{n}\")")
            }
            crate::plan::CheckpointBlocks::FirstPerChunk(n) => {
                format!(" (the first {n} blocks of each model chunk: --recompute-method block --recompute-num-layers {n})")
            }
        } + &if t.recompute_modules == [crate::plan::RecomputeModule::CoreAttn] {
            String::new()
        } else {
            format!(
                " (--recompute-modules {})",
                t.recompute_modules.iter().map(|m| m.name()).collect::<Vec<_>>().join(" ")
            )
        },
        s.workload.attention_label(),
        s.workload.kernels.name(),
        if s.workload.loss.is_eager() { String::new() } else { format!(", loss {}", s.workload.loss.name()) }
    );
    if let Some(a) = &r.activation_offload {
        let what = if !a.modules.is_empty() {
            format!("activations saved in the modules {} of every layer to pinned host memory (Megatron-Core fine-grained activation offloading)", a.modules.join(", "))
        } else {
            format!(
                "activations of the first {} blocks to pinned host memory ({})",
                a.blocks,
                if a.method == "overlapped" {
                    "overlapped: Megatron-Core --cpu-offloading, Transformer Engine's offload handler"
                } else {
                    "synchronous: PyTorch offload_wrapper, copies on the compute stream"
                }
            )
        };
        let _ = writeln!(
            o,
            "Offload    {what}: {} per GPU per micro-batch ({} for a node of {}); copies at {:.0} GB/s D2H, {:.0} GB/s H2D",
            fmt_bytes(a.host_bytes_per_gpu.bytes),
            fmt_bytes(a.host_bytes_per_gpu.bytes.saturating_mul(u64::from(s.cluster.gpus_per_node))),
            s.cluster.gpus_per_node,
            a.d2h_bytes_per_s / 1e9,
            a.h2d_bytes_per_s / 1e9
        );
    }
    if let Some(f) = &r.fp8 {
        let _ = writeln!(
            o,
            "FP8        {} ({}): {} of {} linears (the transformer blocks'; LM head{} and attention core in {}), {:.0}% of the forward FLOPs; forward, input-gradient and {} GEMMs at {:.0} TFLOP/s dense FP8{}",
            f.recipe,
            match f.recipe {
                "delayed" => "Transformer Engine delayed scaling, Megatron-Core",
                "blockwise" => "Transformer Engine Float8BlockScaling, Megatron-Core",
                "mxfp8" => "Transformer Engine MXFP8BlockScaling, Megatron-Core",
                _ => "torchao float8, dynamic scaling",
            },
            f.fp8_linears,
            f.linears,
            if r.active_param_count.is_some() { ", routers" } else { "" },
            t.precision.compute.name(),
            f.fp8_flops_share * 100.0,
            if f.wgrad_fp8 { "weight-gradient" } else { "(in 16 bits) weight-gradient" },
            f.fp8_peak_flops / 1e12,
            if f.weight_workspaces.bytes > 0 {
                format!(
                    "; saved linear inputs in FP8; FP8 weight and transpose workspaces {}; {}",
                    fmt_bytes(f.weight_workspaces.bytes),
                    match f.amax_history_len {
                        Some(n) if f.recipe == "delayed" => format!("amax history {n} rows"),
                        _ => "scales from each block's own amax (no history)".to_string(),
                    }
                )
            } else {
                format!(
                    "; saved linear inputs in 16 bits (torchao keeps the high-precision input){}{}",
                    if f.float8_tensor_parallel { "; sequence-parallel inputs all-gathered in FP8 (float8 TP)" } else { "" },
                    if f.fsdp_all_gather { "; weights all-gathered in FP8 (enable_fsdp_float8_all_gather)" } else { "" }
                )
            }
        );
    }
    if let Some(l) = &s.workload.lora {
        let frozen: u64 = r.param_count.saturating_sub(r.trainable_params);
        let _ = writeln!(
            o,
            "LoRA       rank {} (alpha {}) on {}, lora_dropout {}; trainable {} of {} parameters ({:.3}%); frozen base {} ({} params){}",
            l.rank,
            l.alpha,
            l.targets.join(", "),
            l.dropout,
            sep(r.trainable_params),
            sep(r.param_count),
            100.0 * r.trainable_params as f64 / r.param_count.max(1) as f64,
            l.base_label(),
            crate::report::human_count(frozen),
            match (l.base, l.prepare_kbit) {
                (crate::model::WeightFormat::Half, _) => String::new(),
                (_, true) => ", other frozen weights fp32 and the hidden states between blocks fp32 (prepare_model_for_kbit_training)".into(),
                (_, false) => format!(
                    ", other frozen weights and the hidden states {} (no prepare_model_for_kbit_training: lora.prepare_kbit_training = false{})",
                    s.training.precision.compute.name(),
                    if s.parallel.params_sharded() { ", the default where the parameters are sharded, as TRL's trainers skip it there" } else { "" }
                ),
            }
        );
    }
    let ms = &r.model_state_per_gpu;
    let shared_flat = s.workload.lora.as_ref().is_some_and(|l| l.shared_flat);
    let _ = writeln!(o, "\nModel state per GPU at rest (steady state, after backward)");
    for (name, b) in [
        ("parameters", &ms.parameters),
        ("master weights", &ms.master_weights),
        ("gradients", &ms.gradients),
        ("optimizer state", &ms.optimizer_state),
    ] {
        if b.bytes > 0 {
            let _ = writeln!(o, "  {name:<18} {}", fmt_bytes(b.bytes));
        }
    }
    let _ = writeln!(
        o,
        "  {:<18} {}  = {:.3} B per parameter on this GPU ({:.0} B/param under the precision policy{}, {} params; naive average over {} {})",
        "total",
        fmt_bytes(ms.total.bytes),
        ms.bytes_per_param_per_gpu,
        ms.bytes_per_param,
        if r.trainable_params < r.param_count && shared_flat {
            format!(
                " for the {} trainable ones, the frozen base as stored with its gradients (one FlatParameter per block with the adapters)",
                sep(r.trainable_params)
            )
        } else if r.trainable_params < r.param_count {
            format!(" for the {} trainable ones, the frozen base as stored", sep(r.trainable_params))
        } else {
            String::new()
        },
        r.param_count_human,
        plural(u64::from(c.gpus), "GPU"),
        fmt_bytes(ms.naive_average.bytes)
    );
    if r.rank_classes.iter().any(|k| k.expert_rank.is_some()) {
        let _ = writeln!(o, "           (of the headline rank class; every expert-parallel rank below)");
        let _ = writeln!(o, "\nExpert-parallel ranks under uneven routing (each a rank class: its experts' own load; every all-to-all and data-parallel collective waits for all of them)");
        for k in r.rank_classes.iter().take(MAX_CLASS_ROWS) {
            let _ = writeln!(o, "  ranks {:<14} {}", k.ranks, k.note);
        }
        if r.rank_classes.len() > MAX_CLASS_ROWS {
            let _ = writeln!(o, "  ... {} more in report.json (rank_classes)", r.rank_classes.len() - MAX_CLASS_ROWS);
        }
    } else if r.rank_classes.iter().any(|k| k.rank.is_some()) {
        let _ = writeln!(o, "           (of the headline rank; every simulated rank below)");
        let _ = writeln!(o, "\nRanks under [jitter] (each a rank class: its own compute draws)");
        for k in r.rank_classes.iter().take(MAX_CLASS_ROWS) {
            let _ = writeln!(o, "  ranks {:<10} {}", k.ranks, k.note);
        }
        if r.rank_classes.len() > MAX_CLASS_ROWS {
            let _ = writeln!(o, "  ... {} more in report.json (rank_classes)", r.rank_classes.len() - MAX_CLASS_ROWS);
        }
    } else if r.rank_classes.iter().any(|k| k.stage.is_some()) {
        let _ = writeln!(o, "           (of the headline stage; every pipeline stage below)");
        let _ = writeln!(o, "\nPipeline stages (each a rank class: its ranks run identical programs)");
        for k in &r.rank_classes {
            let _ = writeln!(o, "  ranks {:<10} {}", k.ranks, k.note);
        }
    }

    common(r, &mut o);
    if let Some(rt) = &r.routing {
        routing(rt, matches!(r.verdict, Verdict::Oom(_)), &mut o);
    }
    if let Some(off) = &r.offload {
        offload(off, &mut o);
    }
    time(r, s, &mut o);
    assumptions(r, &mut o);
    o
}

/// Rows of the per-rank table the text prints under `[jitter]` (report.json has them all).
const MAX_CLASS_ROWS: usize = 16;

fn offload(x: &super::OffloadReport, o: &mut String) {
    let _ = writeln!(
        o,
        "\nOffload    {}: {} per GPU on the host ({}), {} per node of {} host memory: {}",
        x.mode,
        fmt_bytes(x.host_bytes_per_gpu.bytes),
        x.host_holds,
        fmt_bytes(x.host_bytes_per_node.bytes),
        fmt_bytes(x.host_capacity.bytes),
        if x.host_fits { "fits" } else { "HOST OOM: the node's CPU memory cannot hold the offloaded state" }
    );
    if x.nvme_bytes_per_gpu.bytes > 0 {
        let _ = writeln!(
            o,
            "           NVMe: {} per GPU, {} per node of {}: {}",
            fmt_bytes(x.nvme_bytes_per_gpu.bytes),
            fmt_bytes(x.nvme_bytes_per_node.bytes),
            fmt_bytes(x.nvme_capacity.bytes),
            if x.nvme_fits { "fits" } else { "NVMe FULL: the node's drives cannot hold the offloaded state" }
        );
    }
    let back = if x.parameters_on == "gpu" { "updated parameters back" } else { "parameter partitions fetched" };
    let _ = writeln!(
        o,
        "           saves {} of GPU memory per GPU; per step {} of gradients to the host at {:.0} GB/s, {} of {back} at {:.0} GB/s, CPU optimizer {:.2} s at {:.2e} params/s (assumed)",
        fmt_bytes(x.gpu_memory_saved.bytes),
        fmt_bytes(x.d2h_bytes_per_step.bytes),
        x.d2h_gb_per_s,
        fmt_bytes(x.h2d_bytes_per_step.bytes),
        x.h2d_gb_per_s,
        x.cpu_adam_s,
        x.cpu_adam_params_per_s
    );
    if x.nvme_read_bytes_per_step.bytes + x.nvme_write_bytes_per_step.bytes > 0 {
        let _ = writeln!(
            o,
            "           NVMe per step: {} read at {:.2} GB/s, {} written at {:.2} GB/s (per GPU: the node's bandwidth shared by its GPUs)",
            fmt_bytes(x.nvme_read_bytes_per_step.bytes),
            x.nvme_read_gb_per_s,
            fmt_bytes(x.nvme_write_bytes_per_step.bytes),
            x.nvme_write_gb_per_s
        );
    }
    if let (Some(a), Some(b)) = (x.step_time_with_s, x.step_time_without_s) {
        let _ = writeln!(
            o,
            "           step time {a:.3} s with offload vs {b:.3} s without it ({:+.1}%; without offload, memory unbounded); host copies, NVMe and the CPU step count as host work in the time split below",
            100.0 * (a / b - 1.0)
        );
    }
}

/// Uneven routing beside uniform routing.
fn routing(rt: &super::RoutingReport, ran_out: bool, o: &mut String) {
    let ratio = |c: u64| c as f64 / rt.uniform_copies.max(1) as f64;
    let coolest = if rt.coolest_copies == rt.hottest_copies {
        "every rank the same".to_string()
    } else {
        format!("the coolest, rank {}: {}, {:.2}x", rt.coolest_rank, sep(rt.coolest_copies), ratio(rt.coolest_copies))
    };
    let _ = writeln!(
        o,
        "\nRouting    {}: expert-parallel rank {} receives {} token copies per micro-batch and MoE block, {:.2}x the uniform {} ({coolest})",
        rt.routing,
        rt.hottest_rank,
        sep(rt.hottest_copies),
        ratio(rt.hottest_copies),
        sep(rt.uniform_copies)
    );
    if let Some(f) = rt.capacity_factor {
        let _ = writeln!(
            o,
            "           capacity factor {f}{}: {:.1}% of each rank's token copies dropped (over an expert's capacity, Megatron-Core --moe-expert-capacity-factor)",
            if rt.padded { ", every expert padded to its capacity" } else { "" },
            rt.dropped_fraction * 100.0
        );
    }
    let secs = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{t:.3} s"));
    let _ = writeln!(
        o,
        "           {} {} at its highest rank class, step {}; uniform routing: peak {} ({}), step {}",
        if ran_out { "would need (simulated again with unbounded memory)" } else { "peaks at" },
        fmt_bytes(rt.peak_needed.bytes),
        secs(rt.step_time_s),
        fmt_bytes(rt.uniform_peak.bytes),
        if rt.uniform_fits { "fits" } else { "OOM" },
        secs(rt.uniform_step_time_s)
    );
}

fn assumptions(r: &Report, o: &mut String) {
    let _ = writeln!(o, "\nAssumptions");
    for a in &r.assumptions {
        let _ = writeln!(o, "  - {a}");
    }
}

/// The verdict, the peak and its breakdown, the allocator and the peak of each phase.
fn common(r: &Report, o: &mut String) {
    let _ = writeln!(o);
    match &r.verdict {
        Verdict::Fits { headroom } => {
            let _ = writeln!(
                o,
                "Verdict    FITS: {} of headroom at the peak (capacity less max_memory_reserved)",
                fmt_bytes(headroom.bytes)
            );
            if !r.offload_fits {
                let what = if r.offload.as_ref().is_some_and(|x| x.host_fits) { "NVMe" } else { "host memory" };
                let _ = writeln!(
                    o,
                    "           on the GPU only: the node's {what} cannot hold the offloaded state, so the run fails at initialisation (see Offload)"
                );
            }
        }
        Verdict::Oom(x) => {
            let layer = x.at.layer.map(|l| format!(", layer {l}")).unwrap_or_default();
            if x.at.step == 0 {
                let _ = writeln!(
                    o,
                    "Verdict    OOM at initialisation (before the first step), phase init{}, `{}`",
                    layer, x.at.op
                );
            } else {
                let _ = writeln!(
                    o,
                    "Verdict    OOM in step {}, phase {}{}, op `{}`, micro-batch {} (t = {:.3} s)",
                    x.at.step,
                    x.at.phase.name(),
                    layer,
                    x.at.op,
                    x.at.micro_batch,
                    x.at.time_s
                );
            }
            let _ = writeln!(o, "           tried to allocate {} for {}", fmt_bytes(x.requested.bytes), x.tensor);
            let _ = writeln!(
                o,
                "           {} already allocated of {} capacity ({} free)",
                fmt_bytes(x.allocated.bytes),
                fmt_bytes(x.capacity.bytes),
                fmt_bytes(x.free.bytes)
            );
            let _ = writeln!(o, "  live at that instant, by category:");
            for cb in &x.live_by_category {
                let _ = writeln!(o, "    {:<40} {}", cb.label, fmt_bytes(cb.size.bytes));
            }
            let _ = writeln!(o, "  largest live tensors:");
            for (n, b) in x.largest_live.iter().take(5) {
                let _ = writeln!(o, "    {:<60} {}", n, fmt_bytes(b.bytes));
            }
            super::allocator::oom_text(&r.allocator, o);
        }
    }
    if let Some(pk) = &r.peak {
        let layer = pk.at.layer.map(|l| format!(", layer {l}")).unwrap_or_default();
        let _ = writeln!(
            o,
            "\nPeak       {} allocated (live tensors), {} reserved (max_memory_reserved)",
            fmt_bytes(pk.allocated.bytes),
            fmt_bytes(pk.reserved.bytes)
        );
        let _ = writeln!(o, "           at step {}, {}{}, op `{}`", pk.at.step, pk.at.phase.name(), layer, pk.at.op);
        for cb in &pk.breakdown {
            let _ = writeln!(o, "    {:<40} {}", cb.label, fmt_bytes(cb.size.bytes));
        }
    }
    super::allocator::text(&r.allocator, o);
    if !r.phase_peaks.is_empty() {
        let _ = writeln!(o, "\nPeak by phase");
        for pp in &r.phase_peaks {
            let _ = writeln!(
                o,
                "  step {} {:<10} {}  at `{}`",
                pp.step,
                pp.phase.name(),
                fmt_bytes(pp.allocated.bytes),
                pp.op
            );
        }
    }
}

/// Step times, throughput and the checkpointing cost of a training step.
fn time(r: &Report, s: &Scenario, o: &mut String) {
    if !r.steps.is_empty() {
        let _ = writeln!(o, "\nTime");
        for st in &r.steps {
            let pct = |x: f64| 100.0 * x / st.time_s.max(1e-12);
            if st.host_busy_s > 0.0 {
                let _ = writeln!(
                    o,
                    "  step {}: {:.3} s (compute busy {:.3} s, communication busy {:.3} s, host busy {:.3} s, compute idle {:.3} s)",
                    st.step, st.time_s, st.compute_busy_s, st.comm_busy_s, st.host_busy_s, st.compute_idle_s
                );
                let _ = writeln!(
                    o,
                    "          split: compute {:.3} s, exposed communication {:.3} s, exposed host work {:.3} s, idle {:.3} s; busy: compute {:.0}%, communication {:.0}% (any collective or transfer running), host {:.0}% (CPU optimizer step, PCIe copies, NVMe)",
                    st.compute_busy_s,
                    st.exposed_comm_s,
                    st.exposed_host_s,
                    st.idle_s,
                    pct(st.compute_busy_s),
                    pct(st.comm_busy_s),
                    pct(st.host_busy_s)
                );
            } else {
                let _ = writeln!(
                    o,
                    "  step {}: {:.3} s (compute busy {:.3} s, communication busy {:.3} s, compute idle {:.3} s)",
                    st.step, st.time_s, st.compute_busy_s, st.comm_busy_s, st.compute_idle_s
                );
                let _ = writeln!(
                    o,
                    "          split: compute {:.3} s, exposed communication {:.3} s, idle {:.3} s; busy: compute {:.0}%, communication {:.0}% (any collective or transfer running)",
                    st.compute_busy_s,
                    st.exposed_comm_s,
                    st.idle_s,
                    pct(st.compute_busy_s),
                    pct(st.comm_busy_s)
                );
            }
            if st.sm_contention_s > 0.0 {
                let alone = st.compute_busy_s - st.sm_contention_s;
                let _ = writeln!(
                    o,
                    "          compute beside collectives ran {:.3} s longer than alone (+{:.1}%): their thread blocks held SMs",
                    st.sm_contention_s,
                    100.0 * st.sm_contention_s / alone.max(1e-12)
                );
            }
            if st.recompute_s > 0.0 {
                let base = st.compute_busy_s - st.recompute_s - st.sm_contention_s;
                let _ = writeln!(o, "          activation checkpointing recomputes for {:.3} s: +{:.1}% compute over the same step without it", st.recompute_s, 100.0 * st.recompute_s / base.max(1e-12));
            }
        }
    }
    if let Some(tp) = &r.throughput {
        let _ = writeln!(
            o,
            "  steady state: {:.3} s/step, {} tokens/step, {:.0} tokens/s ({:.1} per GPU), MFU {:.1}%, HFU {:.1}%",
            tp.step_time_s,
            sep(tp.tokens_per_step),
            tp.tokens_per_s,
            tp.tokens_per_s_per_gpu,
            tp.mfu * 100.0,
            tp.hfu * 100.0
        );
        if let (Some(j), Some(cfg)) = (&tp.jitter, &s.jitter) {
            let _ = writeln!(
                o,
                "  jitter (seed {}, compute CV {:.1}%, {} straggler(s) at +{:.0}%): over {} steady step(s) median {:.3} s, p99 {:.3} s (min {:.3}, max {:.3})",
                cfg.seed,
                cfg.compute_cv * 100.0,
                cfg.stragglers,
                cfg.straggler_slowdown * 100.0,
                j.steps,
                j.median_s,
                j.p99_s,
                j.min_s,
                j.max_s
            );
        }
        let v = &tp.verdict;
        let _ =
            writeln!(o, "Throughput {}: {} ({})", if v.acceptable { "ACCEPTABLE" } else { "POOR" }, v.bound, v.reason);
        for a in &tp.assumptions {
            let _ = writeln!(o, "    - {a}");
        }
        if let Some(cc) = &r.checkpointing_cost {
            let _ = writeln!(
                o,
                "  activation checkpointing: {:.3} s/step vs {:.3} s without it ({:+.1}%); without it the peak would be {}",
                cc.step_time_with_s,
                cc.step_time_without_s,
                cc.slowdown * 100.0,
                fmt_bytes(cc.peak_without.bytes)
            );
        }
    } else if matches!(r.verdict, Verdict::Oom(_)) {
        let _ = writeln!(o, "\nTime       not reported: the step did not complete");
    }
}

/// `stepsim models`: each zoo model with its type, shape, parameter count and source.
/// "1 GPU", "8 GPUs".
fn plural(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

pub fn zoo_table() -> String {
    use std::fmt::Write;
    let mut o = format!(
        "{:<19} {:<11} {:>7}  {:>6}  {:>11}  {:>16}  {:>16}  {}\n",
        "model", "type", "layers", "hidden", "heads (kv)", "parameters", "active (MoE)", "source"
    );
    for z in crate::model::hf::ZOO {
        let Ok(h) = crate::model::hf::parse(z.config) else { continue };
        let cfg = h.model_config(h.position_table().unwrap_or(1));
        // A mixture of experts: the parameters one token uses (top-k experts of each block).
        let active = if cfg.moe.is_some() { sep(cfg.active_param_count()) } else { "-".to_string() };
        let _ = writeln!(
            o,
            "{:<19} {:<11} {:>7}  {:>6}  {:>5} ({:>3})  {:>16}  {:>16}  {}",
            z.name,
            h.model_type,
            h.n_layers,
            h.hidden,
            h.n_heads,
            h.n_kv_heads,
            sep(cfg.param_count()),
            active,
            z.source
        );
    }
    o.push_str("use one with [model] name = \"<model>\"; any other config.json with [model] hf_config = \"path/config.json\"\n");
    o
}

/// The multi-token prediction modules in words, for the Model line and `stepsim check`.
pub(crate) fn mtp_words(m: &crate::model::ModelConfig, mtp: &crate::model::MtpConfig) -> String {
    let kind = if m.is_moe_layer(m.mtp_spec_layer()) { "MoE" } else { "dense" };
    format!(
        "multi-token prediction: {} module{} after the last block (each enorm, hnorm, eh_proj 2h -> h, a {kind} layer, its final norm: {} parameters; embedding and head shared), loss scale {}, on the last stage",
        mtp.layers,
        if mtp.layers == 1 { "" } else { "s" },
        sep(m.mtp_module_params()),
        mtp.loss_scale
    )
}
