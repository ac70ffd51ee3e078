//! `stepsim check`: what stepsim derived from a scenario, before simulating it: the
//! parameter count by part, the parallel layout, and the values it filled in.

use std::fmt::Write;

use super::fmt_bytes;
use super::text::sep;
use crate::scenario::Scenario;

/// The derived configuration in a few lines (what `stepsim check` prints after "ok").
pub fn summary(s: &Scenario) -> String {
    let m = &s.model;
    let mut o = String::new();
    let per_block = m.params_per_block();
    let outside = m.params_outside_blocks();
    let heads = match &m.mla {
        Some(mla) => format!(
            "{} heads of multi-head latent attention (q/k {} + {} rope, v {}; latent {}, query rank {})",
            m.n_heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, mla.kv_lora_rank, mla.q_lora_rank
        ),
        None => format!("{} heads ({} kv) of {}", m.n_heads, m.n_kv_heads, m.head_dim()),
    };
    let _ = writeln!(
        o,
        "  model      {} family{}: {} layers x hidden {}, {heads}, ffn {}, vocab {}{}",
        format!("{:?}", m.family).to_lowercase(),
        s.model_source.as_ref().map_or(String::new(), |s| format!(" ({s})")),
        m.n_layers,
        m.hidden,
        m.ffn_hidden,
        m.vocab,
        if m.tie_embeddings { ", tied embeddings" } else { "" }
    );
    let notes = m.block_notes(s.workload.seq_len);
    if !notes.is_empty() {
        let _ = writeln!(o, "  block      {}", notes.join("; "));
    }
    // The multi-token prediction modules' own parameters, as a term of the sums below.
    let mtp = match m.mtp_layers() {
        0 => String::new(),
        d => format!(" + {d} MTP module{} x {}", if d == 1 { "" } else { "s" }, sep(m.mtp_module_params())),
    };
    match &m.moe {
        Some(moe) => {
            let moe_layers = m.moe_layers();
            let dense = m.n_layers - moe_layers;
            let dense_part =
                if dense > 0 { format!("{dense} dense blocks x {} + ", sep(per_block)) } else { String::new() };
            let _ = writeln!(
                o,
                "             {} parameters = {dense_part}{moe_layers} MoE blocks x {} + {} outside them (embeddings, final norm, head){mtp}; {} active per token",
                sep(m.param_count()),
                sep(m.block_params((0..m.n_layers).rev().find(|&l| m.is_moe_layer(l)).unwrap_or(m.n_layers - 1))),
                sep(outside),
                sep(m.active_param_count())
            );
            let _ = writeln!(
                o,
                "  experts    {} of ffn {} per MoE block, top-{}{}{}; expert parallel {}{}{}",
                moe.num_experts,
                moe.expert_ffn_hidden,
                moe.top_k,
                moe.group_limit_words().map_or(String::new(), |w| format!(" from {w}")),
                if moe.shared_expert_ffn_hidden > 0 {
                    format!(", shared experts of ffn {}", moe.shared_expert_ffn_hidden)
                } else {
                    String::new()
                },
                s.parallel.model_parallel.expert,
                match s.parallel.model_parallel.expert_tensor {
                    1 => String::new(),
                    etp => format!(", expert tensor parallel {etp}"),
                },
                match &s.parallel.deepep {
                    Some(d) => format!(", tokens moved by DeepEP ({} SMs)", d.sms),
                    None => String::new(),
                }
            );
        }
        None => {
            let _ = writeln!(
                o,
                "             {} parameters = {} blocks x {} + {} outside them (embeddings, final norm, head){mtp}",
                sep(m.param_count()),
                m.n_layers,
                sep(per_block),
                sep(outside)
            );
        }
    }
    let c = &s.cluster;
    let _ = writeln!(
        o,
        "  hardware   {} x {} ({} per node), {} per GPU usable of {} ({} outside the allocator)",
        c.gpus,
        c.gpu.name,
        c.gpus_per_node,
        fmt_bytes(s.allocator_capacity()),
        fmt_bytes(c.memory_bytes),
        fmt_bytes(c.memory_bytes.saturating_sub(s.allocator_capacity()))
    );
    let p = &s.parallel;
    let mp = &p.model_parallel;
    let _ = writeln!(
        o,
        "  parallel   tensor {}{} x pipeline {} x data {}; sharding {}; framework {:?}{}",
        mp.tensor,
        if mp.sequence_parallel { " (sequence parallel)" } else { "" },
        mp.pipeline,
        s.dp_degree(),
        p.sharding_display(),
        p.framework,
        if mp.pipeline > 1 { format!("; schedule {}", mp.schedule.name()) } else { String::new() }
    );
    let t = &s.training;
    let pr = &t.precision;
    let tokens = t.micro_batch * t.seq_len * t.grad_accum * s.dp_degree();
    let _ = writeln!(
        o,
        "  training   micro-batch {} x seq {} x grad_accum {} x data {} = {} tokens per step; {} steps",
        t.micro_batch,
        t.seq_len,
        t.grad_accum,
        s.dp_degree(),
        sep(tokens),
        t.steps
    );
    let _ = writeln!(
            o,
            "             precision \"{}\" (parameters {}, compute {}, gradients {}, {}); {:?} ({:?}); checkpointing {}; {} attention",
            pr.preset,
            pr.param.name(),
            pr.compute.name(),
            pr.grad.name(),
            pr.state_words(t.states_per_param(), "none"),
            t.optimizer,
            t.optimizer_impl,
            t.checkpointing.name(),
            s.workload.attention_label()
        );
    if let Some(l) = &s.workload.lora {
        let base = l.base_label();
        let prepare = match (l.base, l.prepare_kbit) {
            (crate::model::WeightFormat::Half, _) => String::new(),
            (_, true) => "; prepare_model_for_kbit_training: embeddings, norms, head and hidden states fp32".into(),
            (_, false) => format!(
                "; no prepare_model_for_kbit_training: embeddings, norms, head and hidden states {}",
                pr.compute.name()
            ),
        };
        let _ = writeln!(
            o,
            "  lora       rank {} (alpha {}) on {}, lora_dropout {}; frozen base {base}{prepare}",
            l.rank,
            l.alpha,
            l.targets.join(", "),
            l.dropout
        );
    }
    // The memory savers and gradient-sync options set beyond the defaults, in the scenario's
    // own words.
    let mut extra = Vec::new();
    match t.checkpoint_blocks {
        crate::plan::CheckpointBlocks::All => {}
        crate::plan::CheckpointBlocks::EveryNth(n) => extra.push(format!("checkpoint_every = {n}")),
        crate::plan::CheckpointBlocks::FirstPerChunk(n) => {
            extra.push(format!("recompute_method = \"block\", recompute_num_layers = {n}"))
        }
    }
    if t.recompute_modules != [crate::plan::RecomputeModule::CoreAttn] {
        let names: Vec<&str> = t.recompute_modules.iter().map(|m| m.name()).collect();
        extra.push(format!("recompute_modules = {names:?}"));
    }
    if let Some(a) = &t.activation_offload {
        extra.push(match a.method {
            crate::plan::ActivationOffloadMethod::FineGrained => format!(
                "fine-grained activation offloading of {} in every layer (tensors of {}+ elements{})",
                a.modules.names().join(", "),
                a.min_elements,
                if a.fraction < 1.0 {
                    format!(", the first {:.0}% of each chunk's groups", a.fraction * 100.0)
                } else {
                    String::new()
                }
            ),
            _ => format!("activation_offload = \"{}\" (first {} blocks)", a.method.name(), a.blocks),
        });
    }
    if !s.workload.loss.is_eager() {
        extra.push(format!("loss = \"{}\"", s.workload.loss.name()));
    }
    let p = &s.parallel;
    if p.no_sync {
        extra.push("no_sync (gradients reduced in the last micro-batch)".into());
    }
    if p.async_tp {
        extra.push("async TP".into());
    }
    if s.workload.lora.as_ref().is_some_and(|l| l.shared_flat) {
        extra.push("use_orig_params=True, frozen base and adapters in one FlatParameter per block".into());
    } else if p.use_orig_params {
        extra.push("use_orig_params=True".into());
    }
    if let Some(n) = p.hsdp_shard {
        extra.push(format!("hsdp_shard_size = {n}"));
    }
    if p.model_parallel.context > 1 {
        let how = match p.model_parallel.context_comm {
            crate::model::ContextComm::Ring => "ring of key-value blocks",
            crate::model::ContextComm::AllGather => "keys and values all-gathered",
            crate::model::ContextComm::AllToAll => "Ulysses all-to-all",
        };
        extra.push(format!("context parallel {} ({how})", p.model_parallel.context));
    }
    if let Some(f) = &s.workload.fp8 {
        extra.push(format!(
            "fp8 {}{}",
            f.recipe.name(),
            if f.fsdp_all_gather { " with the FP8 all-gather" } else { "" }
        ));
    }
    if !extra.is_empty() {
        let _ = writeln!(o, "             {}", extra.join("; "));
    }
    o
}
