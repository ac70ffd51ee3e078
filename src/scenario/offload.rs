//! `[offload]`: DeepSpeed ZeRO-Offload / ZeRO-Infinity and FSDP CPU offload, validated against
//! the sharding and framework they need, with the host and NVMe defaults.

use super::*;

/// Default host memory of a node: 2 TB (DGX A100 and DGX H100 datasheets).
pub const DEFAULT_CPU_MEMORY: u64 = 2_000_000_000_000;
/// DeepSpeedCPUAdam's rate per GPU process: an assumption (no measured step time was found;
/// the ZeRO-Offload paper reports only a 5-7x speed-up over PyTorch's CPU Adam).
pub const DEFAULT_CPU_ADAM_PARAMS_PER_S: f64 = 1e9;
/// PyTorch's own Adam on CPU tensors (FSDP's CPU offload): DeepSpeed's tutorial puts
/// DeepSpeedCPUAdam at 5-7x its speed; 6x is assumed.
pub const DEFAULT_TORCH_CPU_ADAM_PARAMS_PER_S: f64 = DEFAULT_CPU_ADAM_PARAMS_PER_S / 6.0;
/// Default NVMe of a node: a DGX H100's eight 3.84 TB U.2 drives (datasheet).
pub const DEFAULT_NVME_CAPACITY: u64 = 30_720_000_000_000;
/// Default NVMe bandwidth of a node, bytes/s: DeepNVMe's measured 10 GB/s read and 5 GB/s
/// write over 4 SSDs in RAID-0 (DeepSpeed blog `deepspeed-gds`).
pub const DEFAULT_NVME_READ_BYTES_PER_S: f64 = 10e9;
pub const DEFAULT_NVME_WRITE_BYTES_PER_S: f64 = 5e9;

/// Measured pinned-memory copy rates per GPU, (host-to-device, device-to-host), by PCIe
/// generation (docs/research/issue8-sources.md): Gen4 about 25 GB/s each way (A100,
/// nvbandwidth's copy-engine tests); Gen5 55.4 GB/s host-to-device (H200, stas00
/// ml-engineering's PCIe 5 figure, 88% of the link, as quoted in shared/reference/SEMANTICS.md
/// 5.3; nvbandwidth's `host_to_device_memcpy_ce` example gives 55.6) and 53 GB/s back (H100,
/// nvidia/nvbandwidth#24); Gen3 taken as half of Gen4. The copies are copy-engine copies:
/// PyTorch's `copy_` / `.to(non_blocking=True)` between pinned host memory and the GPU is a
/// `cudaMemcpyAsync`, which the DMA engines run. The 35 GB/s host-to-device once used here
/// was nvbandwidth#24's `host_to_device_memcpy_sm`, a copy kernel on the SMs, which PyTorch's
/// copies do not use.
pub fn pcie_bytes_per_s(gen: u8) -> (f64, f64) {
    match gen {
        0..=3 => (12.5e9, 12.5e9),
        4 => (25e9, 25e9),
        _ => (55.4e9, 53e9),
    }
}

pub(super) fn validate_offload(
    v: &V,
    o: &OffloadSection,
    parallel: &ParallelConfig,
    cluster: &Cluster,
) -> Result<Option<crate::plan::OffloadConfig>, ScenarioError> {
    use crate::plan::OffloadDevice;
    let device = |field: &str, x: Option<&str>, default: &str| -> Result<Option<OffloadDevice>, ScenarioError> {
        Ok(match v.choice(field, x.unwrap_or(default), &["cpu", "nvme", "none"])? {
            "cpu" => Some(OffloadDevice::Cpu),
            "nvme" => Some(OffloadDevice::Nvme),
            _ => None,
        })
    };
    if parallel.framework == Framework::Megatron {
        return Err(v.err("offload", "offload is not simulated for Megatron-LM (its --optimizer-cpu-offload is not modelled); use parallel.framework = \"deepspeed\" (ZeRO-Offload) or \"fsdp\" (CPUOffload)"));
    }
    let fsdp = parallel.framework.is_pytorch();
    let parameters = device("offload.parameters", o.parameters.as_deref(), "none")?;
    // FSDP offloads the optimizer with the parameters; DeepSpeed's default is the optimizer.
    let optimizer = device("offload.optimizer", o.optimizer.as_deref(), if fsdp { "none" } else { "cpu" })?;
    if fsdp {
        if o.optimizer.is_some() && optimizer.is_some() {
            return Err(v.err("offload.optimizer", "FSDP has no optimizer-only offload: CPUOffload(offload_params=True) moves parameters, gradients and the optimizer step to the CPU; set offload.parameters = \"cpu\" and leave offload.optimizer out (or use parallel.framework = \"deepspeed\")"));
        }
        match parameters {
            None => return Ok(None),
            Some(OffloadDevice::Nvme) => {
                return Err(v.err("offload.parameters", "FSDP's CPUOffload offloads to \"cpu\" only; NVMe offload is DeepSpeed's ZeRO-Infinity (parallel.framework = \"deepspeed\")"))
            }
            Some(OffloadDevice::Cpu) => {}
        }
        if parallel.sharding != Sharding::Zero3 {
            return Err(v.err(
                "offload.parameters",
                format!(
                    "FSDP CPU offload is simulated with parallel.sharding = \"full_shard\", got {}",
                    parallel.sharding.display()
                ),
            ));
        }
    } else {
        let Some(_) = optimizer else {
            if parameters.is_some() {
                return Err(v.err("offload.optimizer", "parameter offload is simulated together with optimizer offload (ZeRO-Infinity: offload_optimizer and offload_param); set offload.optimizer = \"cpu\" or \"nvme\""));
            }
            return Ok(None);
        };
        if !matches!(parallel.sharding, Sharding::Zero2 | Sharding::Zero3) {
            return Err(v.err(
                "offload.optimizer",
                format!(
                    "simulated with ZeRO stage 2 or 3 (parallel.sharding = \"zero2\" | \"zero3\"), got {}",
                    parallel.sharding.display()
                ),
            ));
        }
        if parameters.is_some() && parallel.sharding != Sharding::Zero3 {
            return Err(v.err(
                "offload.parameters",
                format!(
                    "DeepSpeed offloads parameters with ZeRO stage 3 only (parallel.sharding = \"zero3\"), got {}",
                    parallel.sharding.display()
                ),
            ));
        }
    }
    if parallel.model_parallel.pipeline > 1 && !fsdp {
        return Err(v.err("offload", "DeepSpeed offload with pipeline parallelism is not simulated: its pipeline engine runs ZeRO stage 0 or 1 only, and offload is simulated with ZeRO-2/3; use parallel.framework = \"fsdp\" with sharding = \"full_shard\" and offload.parameters = \"cpu\" (FSDP CPU offload on each stage)"));
    }
    // The defaults, then what the section sets, each checked.
    let mut c = default_offload(cluster, parallel.framework, optimizer.unwrap_or(OffloadDevice::Cpu), parameters);
    let rate = |field: &str, x: f64| {
        if x > 0.0 && x.is_finite() {
            Ok(x)
        } else {
            Err(v.err(field, format!("must be a positive number, got {x}")))
        }
    };
    // NVMe bandwidth is the node's, shared by its GPUs.
    let per_gpu = 1e9 / f64::from(cluster.gpus_per_node);
    if let Some(x) = o.cpu_memory {
        c.cpu_memory_bytes = v.positive("offload.cpu_memory", x)?;
    }
    if let Some(x) = o.nvme_capacity {
        c.nvme_capacity_bytes = v.positive("offload.nvme_capacity", x)?;
    }
    if let Some(x) = o.h2d_gb_per_s {
        c.h2d_bytes_per_s = rate("offload.h2d_gb_per_s", x)? * 1e9;
    }
    if let Some(x) = o.d2h_gb_per_s {
        c.d2h_bytes_per_s = rate("offload.d2h_gb_per_s", x)? * 1e9;
    }
    if let Some(x) = o.nvme_read_gb_per_s {
        c.nvme_read_bytes_per_s = rate("offload.nvme_read_gb_per_s", x)? * per_gpu;
    }
    if let Some(x) = o.nvme_write_gb_per_s {
        c.nvme_write_bytes_per_s = rate("offload.nvme_write_gb_per_s", x)? * per_gpu;
    }
    if let Some(x) = o.cpu_adam_params_per_s {
        c.cpu_adam_params_per_s = rate("offload.cpu_adam_params_per_s", x)?;
    }
    Ok(Some(c))
}

/// Offload with every `[offload]` default: a DGX node's host memory and NVMe, pinned copies
/// at the GPU's PCIe generation, the node's NVMe bandwidth shared by its GPUs, and the CPU
/// optimizer of the framework (DeepSpeedCPUAdam, or PyTorch's Adam on CPU tensors).
pub fn default_offload(
    cluster: &Cluster,
    framework: Framework,
    optimizer: crate::plan::OffloadDevice,
    parameters: Option<crate::plan::OffloadDevice>,
) -> crate::plan::OffloadConfig {
    let (h2d, d2h) = pcie_bytes_per_s(cluster.gpu.pcie_gen);
    let per_gpu = f64::from(cluster.gpus_per_node);
    crate::plan::OffloadConfig {
        optimizer,
        parameters,
        cpu_memory_bytes: DEFAULT_CPU_MEMORY,
        nvme_capacity_bytes: DEFAULT_NVME_CAPACITY,
        h2d_bytes_per_s: h2d,
        d2h_bytes_per_s: d2h,
        nvme_read_bytes_per_s: DEFAULT_NVME_READ_BYTES_PER_S / per_gpu,
        nvme_write_bytes_per_s: DEFAULT_NVME_WRITE_BYTES_PER_S / per_gpu,
        cpu_adam_params_per_s: match framework {
            Framework::Fsdp | Framework::Fsdp1 | Framework::Fsdp2 => DEFAULT_TORCH_CPU_ADAM_PARAMS_PER_S,
            Framework::Deepspeed | Framework::Megatron => DEFAULT_CPU_ADAM_PARAMS_PER_S,
        },
    }
}
