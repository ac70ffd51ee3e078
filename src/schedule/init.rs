//! Initialisation: what is on the GPU before the first forward (parameters unit by unit,
//! master weights, module buffers, DDP's reducer buckets, DeepSpeed's optimizer state,
//! Megatron's gradient buffer).

use super::{Builder, Category, Phase, TaskKind, TaskLabel, COMPUTE};

impl Builder<'_> {
    /// Initialisation: parameters (loaded unit by unit, so an OOM names the layer), master
    /// weights, module buffers, DDP buckets, and DeepSpeed's optimizer state.
    pub(super) fn init(&mut self) {
        let plan = self.plan;
        let pbytes = self.pr().param.bytes();
        let lbl = |what: String, unit: Option<usize>| TaskLabel::new(0, Phase::Init, 0, what, TaskKind::Init, unit);
        // Offloaded parameters stay on the host (or NVMe) between uses.
        let on_gpu = !plan.params_offloaded();
        // DeepSpeed's ZeRO-1/2, BF16_Optimizer and FP16_Optimizer move the parameters Megatron
        // (or the user) made, tensor by tensor, into one flat buffer ([`Self::deepspeed_flat_init`]).
        let flat = plan.deepspeed_flattens();
        let mut constructed = Vec::new();
        for u in 0..plan.units.len() {
            if flat {
                let t = self.construct_unit(u);
                constructed.extend(t);
                continue;
            }
            let el = plan.local(u, plan.params_sharded);
            let name = text!(self.names, "{} parameters ({})", plan.units[u].name, self.pr().param.name());
            let mut alloc = self.spare();
            if on_gpu {
                alloc.push(self.buffer(el * pbytes, Category::Parameters, name.clone()));
            }
            let un = &plan.units[u];
            let frozen = if plan.params_sharded { un.frozen_shard_bytes } else { un.frozen_bytes };
            if frozen > 0 {
                let what = text!(self.names, "{} frozen base weights", un.name);
                alloc.push(self.buffer(frozen, Category::Parameters, what));
            }
            self.task(COMPUTE, 0.0, [], &alloc, lbl(text!(self.names, "load {}", plan.units[u].name), Some(u)));
            self.give_back(alloc);
        }
        let offload = plan.parallel.offload.is_some();
        // Under the precision-aware optimizer the master is FusedAdam's state, made at the
        // first step ([`Builder::optimizer`]).
        let aware = self.pr().aware.is_some();
        if let Some(m) = self.pr().master.filter(|_| !offload && !aware && !flat) {
            for u in 0..plan.units.len() {
                let el = plan.optimized(u, plan.optimizer_sharded);
                let b = self.buffer(
                    el * m.bytes(),
                    Category::MasterWeights,
                    text!(self.names, "{} master weights ({})", plan.units[u].name, m.name()),
                );
                self.task(
                    COMPUTE,
                    0.0,
                    [],
                    [b],
                    lbl(text!(self.names, "master weights of {}", plan.units[u].name), Some(u)),
                );
            }
        }
        if self.dag.buffer_bytes > 0 {
            let b = self.buffer(
                self.dag.buffer_bytes,
                Category::Buffers,
                text!(self.names, "rotary cos/sin tables (fp32)"),
            );
            self.task(COMPUTE, 0.0, [], [b], lbl(text!(self.names, "module buffers"), None));
        }
        self.fp8_init();
        if plan.ddp_reducer() && !plan.parallel.gradient_as_bucket_view && plan.pipeline() == 1 {
            let bytes = plan.total_params() * self.pr().grad.bytes();
            let b = self.buffer(
                bytes,
                Category::CommBuffers,
                text!(self.names, "DDP gradient buckets (gradient_as_bucket_view=False)"),
            );
            self.task(COMPUTE, 0.0, [], [b], lbl(text!(self.names, "DDP reducer buckets"), None));
        }
        if plan.optimizer_state_at_init() && !offload && !flat {
            for u in 0..plan.units.len() {
                let b = self.optimizer_state_buffer(u);
                self.task(
                    COMPUTE,
                    0.0,
                    [],
                    [b],
                    lbl(text!(self.names, "optimizer state of {}", plan.units[u].name), Some(u)),
                );
            }
        }
        self.deepspeed_init(constructed);
        self.megatron_init();
        self.last_task_of_prev_step = self.last_task();
    }
}

impl Builder<'_> {
    /// Transformer Engine's persistent FP8 state (see [`crate::model::fp8`]): each unit's FP8
    /// weight copies (rowwise and columnwise: 2 B per parameter of its FP8 linears, plus block
    /// scales; kept across steps because Megatron passes `is_first_microbatch`), and under
    /// delayed scaling every FP8 linear's amax histories and scales.
    fn fp8_init(&mut self) {
        let Some(cfg) = self.dag.workload.fp8.filter(|f| f.recipe.is_te()) else {
            return;
        };
        let lbl = |what: String, unit: Option<usize>| TaskLabel::new(0, Phase::Init, 0, what, TaskKind::Init, unit);
        let mut linears = 0;
        for u in 0..self.plan.units.len() {
            let regions = &self.plan.units[u].regions;
            let ops = self.dag.ops.iter().filter(|o| o.fp8.is_some() && regions.contains(&o.region));
            let (n, params) = ops.fold((0, 0), |(n, p), o| (n + 1, p + o.params));
            linears += n;
            if params == 0 {
                continue;
            }
            let b = self.buffer(
                cfg.recipe.workspace_bytes(params),
                Category::Buffers,
                text!(
                    self.names,
                    "{} FP8 weight and transpose workspaces (Transformer Engine)",
                    self.plan.units[u].name
                ),
            );
            self.task(
                COMPUTE,
                0.0,
                [],
                [b],
                lbl(text!(self.names, "FP8 workspaces of {}", self.plan.units[u].name), Some(u)),
            );
        }
        // Block scaling is current: no amax history.
        if linears > 0 && cfg.recipe == crate::model::Fp8Recipe::Delayed {
            let bytes = linears * crate::model::fp8::scaling_state_bytes(cfg.amax_history_len);
            let b = self.buffer(
                bytes,
                Category::Buffers,
                text!(self.names, "FP8 amax histories ({} rows) and scales of {linears} linears", cfg.amax_history_len),
            );
            self.task(COMPUTE, 0.0, [], [b], lbl(text!(self.names, "FP8 scaling state"), None));
        }
    }
}
