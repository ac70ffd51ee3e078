//! DeepSpeed's own gradient buffers, as its optimizer wrappers allocate them (DeepSpeed 0.16,
//! commit 38327e0; the same mechanisms since the 2022 releases BigScience trained with):
//!
//! - `DeepSpeedZeroOptimizer` (`runtime/zero/stage_1_and_2.py`), ZeRO stages 1 and 2:
//!   - the IPG bucket, `torch.empty(reduce_bucket_size)` in the model dtype (two with
//!     `overlap_comm`): allocated by every `backward()` (`DeepSpeedZeroOptimizer.backward`),
//!     or, under the pipeline engine whose backward runs outside ZeRO, by
//!     `reduce_gradients(pipeline_parallel=True)`; released by the reduction's epilogue
//!     (`_release_ipg_buffers` in `overlapping_partition_gradients_reduce_epilogue`), which
//!     ZeRO-2 runs after every micro-batch and ZeRO-1 at the accumulation boundary;
//!   - ZeRO-1's epilogue keeps the rank's partition of the reduced gradients
//!     (`averaged_gradients`, `get_flat_partition`) and frees the full 16-bit gradients
//!     (`zero_grad(set_to_none=True)`);
//!   - `step()` flattens the partition's gradients and casts them to the FP32 master dtype
//!     (`single_grad_partition = flatten_dense_tensors_aligned(...).to(fp32)`), which lives
//!     through the update; the flattened 16-bit copy is a temporary of the cast.
//! - `FP16_Optimizer` (`runtime/fp16/fused_optimizer.py`), FP16 without ZeRO: see
//!   [`DeepspeedOptimizer::Fp16Optimizer`]; the engine's boundary all-reduce and the step's
//!   FP32 list and flat gradient.
//! - `BF16_Optimizer` (`runtime/bf16_optimizer.py`): an FP32 gradient buffer of every local
//!   parameter (`fp32_groups_gradients_flat = torch.zeros_like(bf16_groups_flat, fp32)`)
//!   from initialisation, not partitioned. Every micro-batch's backward starts with
//!   `clear_lp_grads()` (`param.grad = None`: the 16-bit `.grad`s of the previous
//!   micro-batch are freed and autograd allocates them anew) and ends with
//!   `update_hp_grads()`, which adds each `.grad` into the FP32 buffer through an FP32 copy
//!   (`hp_grad.add_(lp.grad.to(fp32))`, one parameter tensor at a time) and keeps the
//!   `.grad`s: `BF16_Optimizer.backward`, and `PipelineEngine._exec_backward_pass` on stages
//!   before the last. Nothing frees them at the step (`_take_model_step` skips `zero_grad`
//!   for BF16_Optimizer). The same in the 2022 code BigScience trained with (commit 56c522386,
//!   "bf16+pipeline parallelism"). The pipeline engine all-reduces the FP32 gradients in
//!   buckets of `MEMORY_OPT_ALLREDUCE_SIZE` elements, each flattened into a new tensor
//!   (`_bf16_reduce_grads`, `buffered_allreduce_fallback`, pipe/engine.py and engine.py).

use super::{Builder, Category, Collective, Phase, TaskKind, TaskLabel, COMPUTE, NCCL};
use crate::model::Dtype;
use crate::plan::{DeepspeedOptimizer, Sharding, DEEPSPEED_ALLREDUCE_BUCKET};

fn init_label(what: String) -> TaskLabel {
    TaskLabel::new(0, Phase::Init, 0, what, TaskKind::Init, None)
}

impl Builder<'_> {
    fn ds_optimizer(&self) -> Option<DeepspeedOptimizer> {
        self.plan.deepspeed_optimizer()
    }

    /// BF16_Optimizer keeps its 16-bit `.grad`s through the step: they are freed by the
    /// next backward's `clear_lp_grads()` ([`Self::bf16_clear_lp_grads`]), not by a
    /// `zero_grad`.
    pub(super) fn keeps_grads_across_steps(&self) -> bool {
        self.ds_optimizer() == Some(DeepspeedOptimizer::Bf16Optimizer)
    }

    /// The dtype of a replicated parameter's `.grad`: the model dtype under BF16_Optimizer
    /// (its FP32 accumulation is a separate buffer), the precision policy's otherwise.
    pub(super) fn replicated_grad_dtype(&self) -> Dtype {
        if self.keeps_grads_across_steps() {
            self.pr().param
        } else {
            self.pr().grad
        }
    }

    /// `DeepSpeedZeroOptimizer_Stage3` is in use ([`DeepspeedOptimizer::ZeroStage3`]).
    pub(super) fn ds_stage3(&self) -> bool {
        self.ds_optimizer() == Some(DeepspeedOptimizer::ZeroStage3)
    }

    /// ZeRO-3 copies each gradient into its IPG bucket as autograd produces it and frees
    /// the parameter's own (`__add_grad_to_ipg_bucket`, with `contiguous_gradients`).
    pub(super) fn ds_stage3_copies_grads(&self) -> bool {
        self.ds_stage3() && self.plan.parallel.deepspeed.contiguous_gradients
    }

    /// ZeRO-3's buffers made when `DeepSpeedZeroOptimizer_Stage3` initialises, kept for the
    /// run: the gradient partitions, the IPG bucket and the largest optimizer sub-group's
    /// FP32 gradient.
    fn deepspeed_stage3_init(&mut self) {
        let plan = self.plan;
        let ds = plan.parallel.deepspeed;
        let (g, m) = (self.pr().grad, self.pr().param);
        let part = plan.local_total(true);
        let mut bufs = vec![self.buffer(
            part * g.bytes(),
            Category::Gradients,
            text!(self.names, "ZeRO-3 gradient partitions (grad_partitions_flat_buffer, {})", g.name()),
        )];
        if ds.contiguous_gradients {
            bufs.push(self.buffer(
                ds.stage3_ipg_bytes(m),
                Category::CommBuffers,
                text!(
                    self.names,
                    "DeepSpeed ZeRO-3 IPG bucket: reduce_bucket_size {:e} elements x {} B",
                    ds.reduce_bucket_size as f64,
                    m.bytes()
                ),
            ));
        }
        let sub = ds.stage3_sub_group_elements(part);
        bufs.push(self.buffer(
            sub * Dtype::Fp32.bytes(),
            Category::Gradients,
            text!(
                self.names,
                "ZeRO-3 FP32 gradient of the largest optimizer sub-group ({sub} elements, sub_group_size {:e})",
                ds.sub_group_size as f64
            ),
        ));
        let what = text!(self.names, "DeepSpeedZeroOptimizer_Stage3 buffers");
        self.task(COMPUTE, 0.0, [], bufs, init_label(what));
    }

    /// Initialisation: ZeRO-3's buffers ([`Self::deepspeed_stage3_init`]); the flat
    /// parameters, master, moments and (BF16_Optimizer) FP32 gradients of the other
    /// wrappers ([`Self::deepspeed_flat_init`]), `constructed` being the parameters as the
    /// model made them.
    pub(super) fn deepspeed_init(&mut self, constructed: Vec<u32>) {
        if self.ds_stage3() {
            self.deepspeed_stage3_init();
            self.zero3_persistent_init();
            return;
        }
        if self.plan.deepspeed_flattens() {
            self.deepspeed_flat_init(constructed);
        } else if self.ds_optimizer() == Some(DeepspeedOptimizer::Bf16Optimizer) {
            self.bf16_fp32_grads_init();
        }
    }

    /// BF16_Optimizer's FP32 gradient buffer of every local parameter, made at
    /// initialisation and kept.
    fn bf16_fp32_grads_init(&mut self) {
        let el = self.plan.local_total(false);
        let b = self.buffer(
            el * Dtype::Fp32.bytes(),
            Category::Gradients,
            text!(
                self.names,
                "BF16_Optimizer fp32_groups_gradients_flat (FP32 gradient accumulation, not partitioned)"
            ),
        );
        let what = text!(self.names, "BF16_Optimizer FP32 gradient buffer");
        self.task(COMPUTE, 0.0, [], [b], init_label(what));
    }

    /// The model's parameters of unit `u` as the model constructs them on the GPU (Megatron's
    /// layers allocate each weight with `torch.empty(..., device=cuda)`): one block per op
    /// (a weight and its bias), and the last pipeline stage's copy of the tied word
    /// embedding. Returns the blocks, which the flattening frees.
    pub(super) fn construct_unit(&mut self, u: usize) -> Vec<u32> {
        let (plan, dag) = (self.plan, self.dag);
        let pb = self.pr().param.bytes();
        let unit = &plan.units[u];
        let mut bufs = Vec::new();
        let mut sum = 0;
        for o in dag.ops.iter().filter(|o| o.params > 0 && unit.regions.contains(&o.region)) {
            sum += o.params;
            bufs.push(self.buffer(
                o.params * pb,
                Category::Parameters,
                text!(self.names, "{} parameters as constructed", o.name),
            ));
        }
        if unit.params > sum {
            let what = text!(self.names, "tied word-embedding copy as constructed");
            bufs.push(self.buffer((unit.params - sum) * pb, Category::Parameters, what));
        }
        let what = text!(self.names, "construct {} on the GPU", unit.name);
        self.task(COMPUTE, 0.0, [], bufs.clone(), TaskLabel::new(0, Phase::Init, 0, what, TaskKind::Init, Some(u)));
        bufs
    }

    /// What DeepSpeed's optimizer wrappers allocate and free as they initialise, in their
    /// order (stage_1_and_2.py, bf16_optimizer.py and fp16/fused_optimizer.py of v0.6.0, the
    /// release BigScience's 2022 runs used, and of v0.16.5):
    /// - the parameters are flattened into one 16-bit buffer: DeepSpeedZeroOptimizer moves
    ///   them to the CPU first (`move_to_cpu`: their GPU blocks are freed, and stay cached
    ///   in PyTorch's allocator until v0.8.0, which empties the cache there:
    ///   [`crate::plan::DeepspeedConfig::empties_cache_after_moving_params`]), then copies
    ///   the flat buffer made on the CPU to the GPU
    ///   (`bit16_groups_flat`); BF16_Optimizer flattens on the GPU and points the parameters
    ///   into it (`_update_storage_to_flattened_tensor`); FP16_Optimizer flattens clones of
    ///   them (`_flatten_dense_tensors([p.clone() ...])`) and frees clones and originals;
    /// - the FP32 master is `partition.clone().float()`: a 16-bit copy of the rank's
    ///   partition, then the FP32 one, then the copy freed;
    /// - BF16_Optimizer's FP32 gradient buffer of every parameter (`zeros_like`);
    /// - `initialize_optimizer_states()` steps the optimizer once on zero gradients so the
    ///   moments exist before any activation (DeepSpeedZeroOptimizer and FP16_Optimizer make a
    ///   zero FP32 gradient of the partition for it and free it after; BF16_Optimizer's is a
    ///   view of its gradient buffer). Since v0.13.2 only FP16_Optimizer steps there; the
    ///   others' moments come with the first step
    ///   ([`crate::plan::DeepspeedConfig::moments_at_init`]), and DeepSpeedZeroOptimizer
    ///   still makes and frees its zero gradient.
    ///
    /// The freed blocks stay in the allocator's cache, where the step's flattened gradient
    /// partition and its FP32 cast later find blocks of their exact sizes.
    fn deepspeed_flat_init(&mut self, constructed: Vec<u32>) {
        let Some(kind) = self.ds_optimizer() else { return };
        let plan = self.plan;
        let (all, part) = (plan.local_total(false), plan.local_total(plan.optimizer_sharded));
        let pr = self.pr();
        let (p16, master) = (pr.param, pr.master.unwrap_or(Dtype::Fp32));
        let flat_name = kind.flat_params_name();
        let flat = self.buffer(
            all * p16.bytes(),
            Category::Parameters,
            text!(self.names, "flat {} parameters ({flat_name})", p16.name()),
        );
        match kind {
            DeepspeedOptimizer::ZeroStage12 => {
                let t = if plan.parallel.deepspeed.empties_cache_after_moving_params() {
                    let what = text!(self.names, "move the parameters to the CPU, then empty_cache()");
                    let t = self.task(COMPUTE, 0.0, [], [], init_label(what));
                    self.prog.empty_cache_after.push(t);
                    t
                } else {
                    let what = text!(self.names, "move the parameters to the CPU (move_to_cpu)");
                    self.task(COMPUTE, 0.0, [], [], init_label(what))
                };
                self.free_at(t, &constructed);
                let what = text!(self.names, "copy the parameters flattened on the CPU to the GPU ({flat_name})");
                self.task(COMPUTE, 0.0, [], [flat], init_label(what));
            }
            DeepspeedOptimizer::Fp16Optimizer => {
                let mut alloc = Vec::with_capacity(constructed.len() + 1);
                for &b in &constructed {
                    let bytes = self.tables.buffers[b as usize].bytes;
                    alloc.push(self.buffer(
                        bytes,
                        Category::OptimizerTemp,
                        text!(self.names, "p.clone() before flattening"),
                    ));
                }
                let mut frees = alloc.clone();
                frees.extend_from_slice(&constructed);
                alloc.push(flat);
                let what = text!(self.names, "flatten clones of the parameters ({flat_name}), then point them into it");
                let t = self.task(COMPUTE, 0.0, [], alloc, init_label(what));
                self.free_at(t, &frees);
            }
            _ => {
                let what = text!(self.names, "flatten the parameters ({flat_name}), then point them into it");
                let t = self.task(COMPUTE, 0.0, [], [flat], init_label(what));
                self.free_at(t, &constructed);
            }
        }
        let m = self.buffer(
            part * master.bytes(),
            Category::MasterWeights,
            text!(self.names, "flat {} master partition", master.name()),
        );
        // FP32 parameters: the clone is the master (`.float()` of an FP32 tensor is itself).
        let clone = (p16 != master).then(|| {
            let what = text!(self.names, "{} copy of the partition (partition.clone().float())", p16.name());
            self.buffer(part * p16.bytes(), Category::OptimizerTemp, what)
        });
        let alloc: Vec<u32> = clone.into_iter().chain([m]).collect();
        let t = self.task(COMPUTE, 0.0, [], alloc, init_label(text!(self.names, "FP32 master weights")));
        self.free_at(t, &Vec::from_iter(clone));
        if kind == DeepspeedOptimizer::Bf16Optimizer {
            self.bf16_fp32_grads_init();
        }
        let mut alloc = Vec::new();
        let mut frees = Vec::new();
        if kind != DeepspeedOptimizer::Bf16Optimizer {
            let g = self.buffer(
                part * master.bytes(),
                Category::OptimizerTemp,
                text!(self.names, "zero FP32 gradient of the partition (initialize_optimizer_states)"),
            );
            alloc.push(g);
            frees.push(g);
        }
        let at_init = plan.optimizer_state_at_init();
        if at_init {
            alloc.extend(self.deepspeed_flat_moments());
        }
        if alloc.is_empty() {
            return;
        }
        let what = if at_init {
            text!(self.names, "optimizer.step() on zero gradients (initialize_optimizer_states)")
        } else {
            text!(self.names, "initialize_optimizer_states (the moments wait for the first step)")
        };
        let t = self.task(COMPUTE, 0.0, [], alloc, init_label(what));
        self.free_at(t, &frees);
    }

    /// Adam's moments over the rank's flat FP32 master partition: one flat tensor each
    /// (`torch.zeros_like(p)` of the flat partition in FusedAdam's state initialisation).
    pub(super) fn deepspeed_flat_moments(&mut self) -> Vec<u32> {
        let plan = self.plan;
        let part = plan.local_total(plan.optimizer_sharded);
        let state = self.pr().optimizer_state;
        let n = plan.training.states_per_param();
        (0..n)
            .map(|i| {
                let what = match (n, i) {
                    (2, 0) => "exp_avg",
                    (2, _) => "exp_avg_sq",
                    _ => "momentum",
                };
                self.buffer(
                    part * state.bytes(),
                    Category::OptimizerState,
                    text!(self.names, "optimizer state: flat {what} ({})", state.name()),
                )
            })
            .collect()
    }

    /// `BF16_Optimizer.clear_lp_grads()` at the start of a micro-batch's backward: the
    /// previous backward's 16-bit `.grad`s are set to None (freed), so this backward's
    /// autograd allocates them again as it produces them.
    pub(super) fn bf16_clear_lp_grads(&mut self, step: u32, mb: u32) {
        if !self.keeps_grads_across_steps() {
            return;
        }
        let grads: Vec<u32> = self.op_grad_bufs.iter_mut().filter_map(Option::take).collect();
        if grads.is_empty() {
            return;
        }
        let label = TaskLabel::new(
            step,
            Phase::Backward,
            mb,
            text!(self.names, "BF16_Optimizer.clear_lp_grads() (.grad = None)"),
            TaskKind::ZeroGrad,
            None,
        );
        let t = self.task(COMPUTE, 0.0, [], [], label);
        self.free_at(t, &grads);
    }

    /// `BF16_Optimizer.update_hp_grads()` after a micro-batch's backward: each parameter's
    /// 16-bit `.grad` is cast to FP32 (a new tensor of the parameter's size) and added into
    /// the FP32 gradient buffer, one parameter tensor after another, so the largest local
    /// parameter's FP32 copy is the transient that matters (on the first pipeline stage the
    /// word embedding's vocabulary / TP x hidden). HBM traffic per element: the cast reads 2 B
    /// and writes 4 B, the add reads 4 + 4 B and writes 4 B. Returns the task, to follow.
    pub(super) fn bf16_update_hp_grads(&mut self, step: u32, mb: u32, after: u32) -> Option<u32> {
        if !self.keeps_grads_across_steps() {
            return None;
        }
        let largest = self.largest_local_param;
        let local = self.plan.local_total(false);
        if largest == 0 || local == 0 {
            return None;
        }
        let lp = self.pr().param.bytes();
        let per_element = lp + 2 * Dtype::Fp32.bytes() + 2 * Dtype::Fp32.bytes();
        let copy = self.buffer(
            largest * Dtype::Fp32.bytes(),
            Category::Gradients,
            text!(
                self.names,
                "FP32 copy of a .grad in BF16_Optimizer.update_hp_grads (largest parameter, {largest} elements)"
            ),
        );
        let label = TaskLabel::new(
            step,
            Phase::Backward,
            mb,
            text!(self.names, "BF16_Optimizer.update_hp_grads(): accumulate .grads into the FP32 buffer"),
            TaskKind::Backward,
            None,
        );
        let secs = self.cost.optimizer_s(local, per_element);
        let t = self.task(COMPUTE, secs, [after], [copy], label.with_work(0.0, local * per_element));
        self.free_at(t, &[copy]);
        Some(t)
    }

    /// The IPG bucket a ZeRO stage 1/2 `backward()` allocates, when one is not live yet
    /// (without a pipeline; the pipeline engine's backward bypasses ZeRO's).
    pub(super) fn deepspeed_backward_start(&mut self, step: u32, mb: u32) {
        if self.ds_optimizer() != Some(DeepspeedOptimizer::ZeroStage12)
            || self.plan.pipeline() > 1
            || self.ds_ipg.is_some()
        {
            return;
        }
        if let Some(b) = self.ipg_bucket() {
            let label = TaskLabel::new(
                step,
                Phase::Backward,
                mb,
                text!(self.names, "DeepSpeedZeroOptimizer.backward(): IPG bucket"),
                TaskKind::Backward,
                None,
            );
            self.task(COMPUTE, 0.0, [], [b], label);
            self.ds_ipg = Some(b);
        }
    }

    fn ipg_bucket(&mut self) -> Option<u32> {
        let ds = self.plan.parallel.deepspeed;
        let dtype = self.pr().param;
        let bytes = ds.ipg_bytes(dtype);
        (bytes > 0).then(|| {
            let n = ds.ipg_buckets();
            let name = text!(
                self.names,
                "DeepSpeed IPG bucket{}: reduce_bucket_size {:e} elements x {} B{}",
                if n == 2 { "s" } else { "" },
                ds.reduce_bucket_size as f64,
                dtype.bytes(),
                if n == 2 { " x 2 (overlap_comm)" } else { "" }
            );
            self.buffer(bytes, Category::CommBuffers, name)
        })
    }

    /// ZeRO-2's epilogue after each micro-batch's reduction: the IPG bucket is released
    /// (DeepSpeed's pipeline engine runs no ZeRO-2).
    pub(super) fn deepspeed_micro_batch_epilogue(&mut self, step: u32, mb: u32) {
        if self.plan.parallel.sharding != Sharding::Zero2 || self.plan.pipeline() > 1 {
            return;
        }
        let Some(b) = self.ds_ipg.take() else { return };
        let label = TaskLabel::new(
            step,
            Phase::Backward,
            mb,
            text!(self.names, "ZeRO-2 reduction epilogue (release IPG bucket)"),
            TaskKind::Backward,
            None,
        );
        let t = self.task(COMPUTE, 0.0, self.step_comm.clone(), [], label);
        self.free_at(t, &[b]);
    }

    /// The data-parallel gradient reduction at the accumulation boundary, as DeepSpeed's
    /// wrappers do it; false when the wrapper reduces elsewhere (ZeRO-2: every micro-batch)
    /// or DeepSpeed's wrappers are not in use.
    pub(super) fn deepspeed_boundary_reduce(&mut self, step: u32, after: Vec<u32>) -> bool {
        let plan = self.plan;
        let cost = self.cost;
        match self.ds_optimizer() {
            Some(DeepspeedOptimizer::ZeroStage12) if plan.parallel.sharding == Sharding::Zero1 => {
                let mut alloc = Vec::new();
                if self.ds_ipg.is_none() {
                    self.ds_ipg = self.ipg_bucket();
                    alloc.extend(self.ds_ipg);
                }
                let g = self.pr().grad;
                let el = plan.local_total(true);
                let part = self.buffer(
                    el * g.bytes(),
                    Category::Gradients,
                    text!(self.names, "ZeRO-1 gradient partition (averaged_gradients, {})", g.name()),
                );
                alloc.push(part);
                let (bytes, expert) = (plan.total_params() * g.bytes(), plan.expert_params() * g.bytes());
                let secs = cost.dp_collective_s(Collective::ReduceScatter, bytes, expert);
                let label = TaskLabel::new(
                    step,
                    Phase::Backward,
                    0,
                    text!(self.names, "reduce gradients through the IPG bucket into the ZeRO-1 partition"),
                    TaskKind::ReduceScatter,
                    None,
                );
                // `averaged_gradients` partitions are allocated on the default stream.
                self.use_compute_pool(&alloc);
                let t = self.task(NCCL, secs, after, alloc, label.with_work(0.0, bytes));
                // The epilogue frees the IPG bucket and every full 16-bit gradient.
                let mut frees: Vec<u32> = self.ds_ipg.take().into_iter().collect();
                frees.extend(self.op_grad_bufs.iter_mut().filter_map(Option::take));
                self.free_at(t, &frees);
                self.ds_grad_partition = Some(part);
                self.step_comm.push(t);
                true
            }
            // The engine's `allreduce_gradients` at the boundary (`buffered_allreduce_fallback`,
            // one bucket's flat copy at a time): BF16_Optimizer's FP32 gradients (pipe/engine.py
            // `_bf16_reduce_grads`), FP16_Optimizer's 16-bit `.grad`s.
            Some(DeepspeedOptimizer::Bf16Optimizer) => {
                let what = text!(self.names, "all-reduce FP32 gradients in buckets (BF16_Optimizer)");
                self.engine_bucketed_all_reduce(step, after, Dtype::Fp32, what)
            }
            Some(DeepspeedOptimizer::Fp16Optimizer) if plan.grads_reduced() => {
                let g = self.pr().grad;
                let what =
                    text!(self.names, "all-reduce {} gradients in buckets (DeepSpeed engine, no ZeRO)", g.name());
                self.engine_bucketed_all_reduce(step, after, g, what)
            }
            _ => false,
        }
    }

    /// Every local gradient all-reduced in `dtype` through flat buckets of up to
    /// `MEMORY_OPT_ALLREDUCE_SIZE` elements after `after`; true (the boundary is reduced).
    fn engine_bucketed_all_reduce(&mut self, step: u32, after: Vec<u32>, dtype: Dtype, what: String) -> bool {
        let plan = self.plan;
        let el = plan.local_total(false);
        let bucket = self.buffer(
            el.min(DEEPSPEED_ALLREDUCE_BUCKET) * dtype.bytes(),
            Category::CommBuffers,
            text!(self.names, "DeepSpeed all-reduce bucket (MEMORY_OPT_ALLREDUCE_SIZE 5e8 elements, {})", dtype.name()),
        );
        let (bytes, expert) = (el * dtype.bytes(), plan.expert_params() * dtype.bytes());
        let secs = self.cost.dp_collective_s(Collective::AllReduce, bytes, expert);
        let label = TaskLabel::new(step, Phase::Backward, 0, what, TaskKind::AllReduce, None);
        self.use_compute_pool(&[bucket]);
        let t = self.task(NCCL, secs, after, [bucket], label.with_work(0.0, bytes));
        self.free_at(t, &[bucket]);
        self.step_comm.push(t);
        true
    }

    /// `FP16_Optimizer.step()`: every 16-bit `.grad` cast to FP32 (a list of new tensors) and
    /// the list flattened into the master's FP32 gradient, then the `.grad`s set to None.
    /// Returns the flat FP32 gradient, which the step frees when it ends, and the task.
    fn fp16_optimizer_flatten(&mut self, step: u32, deps: Vec<u32>) -> (u32, u32) {
        let el = self.plan.local_total(false);
        let g = self.pr().grad;
        let list = self.buffer(
            el * Dtype::Fp32.bytes(),
            Category::OptimizerTemp,
            text!(self.names, "p.grad.to(fp32) of every parameter (FP16_Optimizer.step, before flattening)"),
        );
        let flat = self.buffer(
            el * Dtype::Fp32.bytes(),
            Category::Gradients,
            text!(self.names, "flat FP32 gradient of the master (fp32_groups_flat.grad)"),
        );
        // The casts read 2 B and write 4 B; the flatten reads and writes 4 B each.
        let per = g.bytes() + Dtype::Fp32.bytes() + 2 * Dtype::Fp32.bytes();
        let label = TaskLabel::new(
            step,
            Phase::Optimizer,
            0,
            text!(self.names, "cast and flatten the gradients to FP32 (FP16_Optimizer.step)"),
            TaskKind::Optimizer,
            None,
        );
        let t = self.task(COMPUTE, self.cost.optimizer_s(el, per), deps, [list, flat], label.with_work(0.0, el * per));
        let mut frees = vec![list];
        frees.extend(self.op_grad_bufs.iter_mut().filter_map(Option::take));
        self.free_at(t, &frees);
        (t, flat)
    }

    /// ZeRO stage 1/2 `step()`: the partition's gradients flattened and cast to FP32. Returns
    /// the FP32 partition, which the step frees when it ends, and the task that made it.
    pub(super) fn deepspeed_flatten_partition(&mut self, step: u32, deps: Vec<u32>) -> Option<(u32, u32)> {
        if self.ds_optimizer() == Some(DeepspeedOptimizer::Fp16Optimizer) {
            return Some(self.fp16_optimizer_flatten(step, deps));
        }
        if self.ds_optimizer() != Some(DeepspeedOptimizer::ZeroStage12) {
            return None;
        }
        let plan = self.plan;
        let el = plan.local_total(true);
        let g = self.pr().grad;
        let fp32 = self.buffer(
            el * Dtype::Fp32.bytes(),
            Category::Gradients,
            text!(self.names, "single_grad_partition (flat FP32 gradient partition for the step)"),
        );
        let mut alloc = vec![fp32];
        let mut frees: Vec<u32> = self.ds_grad_partition.take().into_iter().collect();
        // The cast reads the flattened copy once; an FP32 gradient needs no cast (`.to()` of
        // the same dtype returns the flattened tensor itself).
        let copy_bytes = if g == Dtype::Fp32 {
            2 * g.bytes()
        } else {
            let flat = self.buffer(
                el * g.bytes(),
                Category::OptimizerTemp,
                text!(self.names, "flattened {} gradient partition (before the cast)", g.name()),
            );
            alloc.push(flat);
            frees.push(flat);
            3 * g.bytes() + Dtype::Fp32.bytes()
        };
        let secs = self.cost.optimizer_s(el, copy_bytes);
        let label = TaskLabel::new(
            step,
            Phase::Optimizer,
            0,
            text!(self.names, "flatten the gradient partition to FP32 (DeepSpeedZeroOptimizer.step)"),
            TaskKind::Optimizer,
            None,
        );
        let t = self.task(COMPUTE, secs, deps, alloc, label.with_work(0.0, el * copy_bytes));
        self.free_at(t, &frees);
        Some((t, fp32))
    }
}
