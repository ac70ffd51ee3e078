//! Offload copies: parameters fetched from the host (or NVMe) before their all-gather, the
//! reduced gradient partition copied to the host, and the CPU optimizer step with its NVMe
//! swaps (DeepSpeed ZeRO-Offload / ZeRO-Infinity `offload_optimizer` / `offload_param`,
//! `DeepSpeedCPUAdam`; FSDP `CPUOffload(offload_params=True)`).

use super::{Builder, Category, Phase, TaskKind, TaskLabel, COMPUTE, NCCL};
use crate::net::Collective;

impl Builder<'_> {
    /// Parameter offload: the unit's partition comes to the GPU before its all-gather (from
    /// NVMe through the host first, for ZeRO-Infinity). Returns the all-gather's dependencies
    /// and the GPU buffers it frees.
    ///
    /// DeepSpeed copies its 16-bit partition into a GPU buffer. FSDP's `pre_unshard` copies
    /// the shard in the parameter dtype (FP32) with `non_blocking=True`, so PyTorch's `copy_`
    /// lands it in a temporary of that dtype on the GPU and casts it there into the
    /// low-precision `_mp_shard` (`Copy.cu`: conversions of non-blocking copies happen on the
    /// GPU), which the all-gather then reads.
    pub(super) fn fetch_offloaded(
        &mut self,
        step: u32,
        mb: u32,
        phase: Phase,
        u: usize,
        mut deps: Vec<u32>,
        off: &crate::plan::OffloadConfig,
    ) -> (Vec<u32>, Vec<u32>) {
        let plan = self.plan;
        let el = plan.units[u].shard_params;
        let (pb, cb) = (self.pr().param.bytes(), self.pr().compute.bytes());
        let name = &plan.units[u].name;
        let label = |what: String, kind| TaskLabel::new(step, phase, mb, what, kind, Some(u));
        if off.parameters == Some(crate::plan::OffloadDevice::Nvme) {
            let what = text!(self.names, "read {name} partition from NVMe");
            deps = vec![self.nvme(true, el * pb, deps, off, label(what, TaskKind::Recv))];
        }
        let copy = self.buffer(
            el * pb,
            Category::CommBuffers,
            text!(self.names, "{name} partition copied to the GPU ({})", self.pr().param.name()),
        );
        // FSDP under mixed precision casts the copy into the _mp_shard the all-gather reads;
        // the FP32 temporary dies with the cast, at the copy's end.
        let cast = plan.parallel.framework.offloads_master_parameters() && pb != cb;
        // FSDP2 (`FSDPParam.all_gather_inputs` under CPUOffloadPolicy): the pinned host shard
        // is copied with `.to(device, non_blocking=True)` and cast to `param_dtype`
        // (`_to_dtype_if_needed`) inside `foreach_all_gather` (issued on the all-gather
        // copy-in stream; stepsim keeps the copy on the H2D link, which the copy-in waits
        // for); the copy-in then reads the cast shard and both are freed.
        let fsdp2 = plan.parallel.framework.fsdp2_buffers();
        let gathered_from = if cast {
            let name = if fsdp2 {
                text!(self.names, "{name} all-gather input ({}, the copied shard cast)", self.pr().compute.name())
            } else {
                text!(self.names, "{name} _mp_shard ({})", self.pr().compute.name())
            };
            self.buffer(el * cb, Category::CommBuffers, name)
        } else {
            copy
        };
        let alloc = if cast { vec![copy, gathered_from] } else { vec![copy] };
        let what = text!(self.names, "copy {name} partition to the GPU ({}, H2D)", self.pr().param.name());
        let secs = (el * pb) as f64 / off.h2d_bytes_per_s;
        let h = self.task(self.h2d_stream, secs, deps, alloc, label(what, TaskKind::Recv).with_work(0.0, el * pb));
        if cast {
            self.free_at(h, &[copy]);
        }
        (vec![h], vec![gathered_from])
    }

    /// An NVMe transfer of `bytes` (a read, or a write) at this GPU's share of the node's
    /// NVMe bandwidth, after `deps`.
    pub(super) fn nvme(
        &mut self,
        read: bool,
        bytes: u64,
        deps: Vec<u32>,
        off: &crate::plan::OffloadConfig,
        label: TaskLabel,
    ) -> u32 {
        let rate = if read { off.nvme_read_bytes_per_s } else { off.nvme_write_bytes_per_s };
        self.task(self.nvme_stream, bytes as f64 / rate, deps, [], label.with_work(0.0, bytes))
    }

    /// The offloaded step: the CPU optimizer on the host partition once every gradient
    /// partition has arrived (DeepSpeedCPUAdam, or FSDP's optimizer on CPU tensors), with the
    /// optimizer state read from NVMe before it and written back after it (DeepSpeed's
    /// default `pipeline_read = pipeline_write = false`: one after the other); then the
    /// updated 16-bit partition back to the GPU (and, when parameters are replicated, their
    /// all-gather) unless parameters are offloaded too (written to NVMe when they live
    /// there); then `zero_grad()`.
    pub(super) fn offloaded_optimizer(&mut self, step: u32, el: u64, off: &crate::plan::OffloadConfig) {
        use crate::plan::OffloadDevice;
        let plan = self.plan;
        let pb = self.pr().param.bytes();
        let state_bytes = plan.optimizer_partition_bytes();
        let lbl = |what: String, kind| TaskLabel::new(step, Phase::Optimizer, 0, what, kind, None);
        let mut deps = self.step_comm.clone();
        if off.optimizer == OffloadDevice::Nvme {
            let what = text!(self.names, "read optimizer state from NVMe (swap in)");
            deps = vec![self.nvme(true, state_bytes, deps, off, lbl(what, TaskKind::Recv))];
        }
        let what = text!(self.names, "{} ({el} parameters)", plan.parallel.framework.host_optimizer_step());
        let mut last =
            self.task(self.cpu_stream, el as f64 / off.cpu_adam_params_per_s, deps, [], lbl(what, TaskKind::Optimizer));
        if off.optimizer == OffloadDevice::Nvme {
            let what = text!(self.names, "write optimizer state to NVMe (swap out)");
            last = self.nvme(false, state_bytes, vec![last], off, lbl(what, TaskKind::Send));
        }
        match off.parameters {
            None => {
                let what = text!(self.names, "copy updated parameters to the GPU ({}, H2D)", self.pr().param.name());
                last = self.task(
                    self.h2d_stream,
                    (el * pb) as f64 / off.h2d_bytes_per_s,
                    [last],
                    [],
                    lbl(what, TaskKind::Recv).with_work(0.0, el * pb),
                );
                if !plan.params_sharded && plan.grads_reduced() {
                    let (bytes, expert) = (plan.total_params() * pb, plan.expert_params() * pb);
                    let secs = self.cost.dp_collective_s(Collective::AllGather, bytes, expert);
                    let what = text!(self.names, "all-gather updated parameters");
                    last = self.task(NCCL, secs, [last], [], lbl(what, TaskKind::AllGather).with_work(0.0, bytes));
                }
            }
            Some(OffloadDevice::Cpu) => {}
            Some(OffloadDevice::Nvme) => {
                let bytes = plan.local_total(plan.params_sharded) * pb;
                let what = text!(self.names, "write updated parameters to NVMe ({})", self.pr().param.name());
                last = self.nvme(false, bytes, vec![last], off, lbl(what, TaskKind::Send));
            }
        }
        let z = self.task(COMPUTE, 0.0, [last], [], lbl(text!(self.names, "zero_grad()"), TaskKind::ZeroGrad));
        let grads: Vec<u32> = self.grad_bufs.iter().chain(self.op_grad_bufs.iter()).flatten().copied().collect();
        self.free_at(z, &grads);
        self.last_task_of_prev_step = Some(z);
    }
}
