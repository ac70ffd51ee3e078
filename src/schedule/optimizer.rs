//! The optimizer step and `zero_grad()`: Adam's state (created at the first `step()` in
//! PyTorch, at engine initialisation in DeepSpeed), the step's temporaries by
//! implementation (`torch/optim/adam.py` `_multi_tensor_adam` / `_single_tensor_adam`), the
//! all-gather of updated parameters under a sharded optimizer, and the gradients freed by
//! `zero_grad(set_to_none=True)`.

use super::{Builder, Category, Collective, OptimizerImpl, Phase, TaskKind, TaskLabel, COMPUTE, NCCL};

impl Builder<'_> {
    pub(super) fn optimizer_state_buffer(&mut self, u: usize) -> u32 {
        let plan = self.plan;
        let el = plan.optimized(u, plan.optimizer_sharded);
        let tr = &plan.training;
        let bytes = el * tr.precision.state_bytes(tr.states_per_param());
        let name = match tr.precision.aware {
            Some(pa) => text!(
                self.names,
                "{} optimizer state (exp_avg {}, exp_avg_sq {}, FusedAdam)",
                plan.units[u].name,
                pa.exp_avg.name(),
                pa.exp_avg_sq.name()
            ),
            None => text!(
                self.names,
                "{} optimizer state ({} x {})",
                plan.units[u].name,
                tr.states_per_param(),
                tr.precision.optimizer_state.name()
            ),
        };
        self.buffer(bytes, Category::OptimizerState, name)
    }

    pub(super) fn optimizer(&mut self, step: u32) {
        let plan = self.plan;
        let tr = &plan.training;
        let pr = &tr.precision;
        let el = plan.optimized_total(plan.optimizer_sharded);
        if let Some(off) = plan.parallel.offload.clone() {
            self.offloaded_optimizer(step, el, &off);
            return;
        }
        let mut alloc = Vec::new();
        let lazy = !plan.optimizer_state_at_init() && step == 1;
        if lazy && tr.states_per_param() > 0 {
            if plan.deepspeed_flattens() {
                alloc.extend(self.deepspeed_flat_moments());
            } else {
                for u in 0..plan.units.len() {
                    alloc.push(self.optimizer_state_buffer(u));
                }
            }
        }
        // FusedAdam's `initialize_state` makes the master with the moments at the first step.
        if let Some(pa) = pr.aware.filter(|_| step == 1) {
            for u in 0..plan.units.len() {
                let el = plan.optimized(u, plan.optimizer_sharded);
                let what = if pa.remainders(pr.param) {
                    text!(self.names, "{} master weights (int16 remainders of the BF16 parameters)", plan.units[u].name)
                } else {
                    text!(self.names, "{} master weights ({}, FusedAdam)", plan.units[u].name, pa.main_params.name())
                };
                alloc.push(self.buffer(el * pr.master_bytes(), Category::MasterWeights, what));
            }
        }
        let sb = pr.optimizer_state.bytes();
        // Foreach Adam's intermediates: the square root of the second moments, and before
        // PyTorch 2.1 a separate out-of-place denominator ([`crate::plan::TrainingConfig::torch_version`]).
        let intermediates = if tr.torch_version < (2, 1) { 2 } else { 1 };
        let temp = match tr.optimizer_impl {
            _ if pr.aware.is_some() => el * pr.aware.map_or(0, |pa| pa.step_temp_bytes()),
            OptimizerImpl::Foreach if tr.states_per_param() == 2 => intermediates * el * sb,
            OptimizerImpl::ForLoop if tr.states_per_param() == 2 => {
                let largest = self.dag.ops.iter().map(|o| o.params - o.flat_frozen).max().unwrap_or(0);
                let largest = if plan.optimizer_sharded { largest.div_ceil(plan.shard_group) } else { largest };
                2 * largest * sb
            }
            _ => 0,
        };
        let mut frees = Vec::new();
        if temp > 0 {
            let name = if pr.aware.is_some() {
                text!(self.names, "FusedAdam's FP32 copies of the non-FP32 states (precision-aware optimizer)")
            } else if intermediates == 2 && tr.optimizer_impl == OptimizerImpl::Foreach {
                let (major, minor) = tr.torch_version;
                text!(
                    self.names,
                    "optimizer.step() temporaries (Foreach, PyTorch {major}.{minor}: sqrt and denominator)"
                )
            } else {
                text!(self.names, "optimizer.step() temporaries ({:?})", tr.optimizer_impl)
            };
            let b = self.buffer(temp, Category::OptimizerTemp, name);
            alloc.push(b);
            frees.push(b);
        }
        let secs = self.cost.optimizer_s(el, plan.optimizer_step_bytes());
        let mut deps = self.step_comm.clone();
        if let Some((flatten, fp32)) = self.deepspeed_flatten_partition(step, deps.clone()) {
            deps = vec![flatten];
            frees.push(fp32);
        }
        let t = self.task(
            COMPUTE,
            secs,
            deps,
            alloc,
            TaskLabel::new(step, Phase::Optimizer, 0, text!(self.names, "optimizer.step()"), TaskKind::Optimizer, None)
                .with_work(0.0, el * plan.optimizer_step_bytes()),
        );
        self.free_at(t, &frees);
        let mut last = t;
        // Replicated parameters with a sharded optimizer: all-gather the updated shards.
        if !plan.params_sharded
            && plan.optimizer_sharded
            && plan.grads_reduced()
            && !self.megatron_defers_param_gather()
        {
            let pb = pr.param.bytes();
            let (bytes, expert) = (plan.total_params() * pb, plan.expert_params() * pb);
            let secs = self.cost.dp_collective_s(Collective::AllGather, bytes, expert);
            last = self.task(
                NCCL,
                secs,
                [t],
                [],
                TaskLabel::new(
                    step,
                    Phase::Optimizer,
                    0,
                    text!(self.names, "all-gather updated parameters"),
                    TaskKind::AllGather,
                    None,
                )
                .with_work(0.0, bytes),
            );
        }
        // BF16_Optimizer's 16-bit `.grad`s outlive the step: the next backward frees them.
        let keep = self.keeps_grads_across_steps();
        let replicated = self.op_grad_bufs.iter().filter(|_| !keep);
        let grads: Vec<u32> = self.grad_bufs.iter().chain(replicated).flatten().copied().collect();
        let z = self.task(
            COMPUTE,
            0.0,
            [last],
            [],
            TaskLabel::new(
                step,
                Phase::Optimizer,
                0,
                if self.is_megatron() {
                    text!(self.names, "zero_grad_buffer() (Megatron: the gradient buffer is zeroed in place)")
                } else {
                    text!(self.names, "zero_grad(set_to_none=True)")
                },
                TaskKind::ZeroGrad,
                None,
            ),
        );
        self.free_at(z, &grads);
        self.last_task_of_prev_step = Some(z);
    }
}
