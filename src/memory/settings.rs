//! The `[allocator]` section of a scenario, validated: which allocator model, its
//! `PYTORCH_CUDA_ALLOC_CONF` options, where the program calls `torch.cuda.empty_cache()`, and
//! the memory held outside the allocator.

use serde::Serialize;

use super::allocator::{Allocator, ExactAllocator};
use super::caching::{CachingAllocator, CachingConfig, ROUNDUP_INTERVALS};

/// Which allocator model tensors go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocatorKind {
    /// PyTorch's CUDA caching allocator: segments, pools, splitting, fragmentation.
    Caching,
    /// Live bytes only, each rounded to 512 B: reserved = allocated, no fragmentation.
    Exact,
}

/// A point of the training loop where the program calls `torch.cuda.empty_cache()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EmptyCacheAt {
    /// Once the model and its state are on the GPU, before the first step.
    AfterInit,
    /// After each micro-batch's forward.
    AfterForward,
    /// After each micro-batch's backward.
    AfterBackward,
    /// After each `optimizer.step()`.
    AfterOptimizer,
    /// At the end of each training step (after `zero_grad()`).
    AfterStep,
}

impl EmptyCacheAt {
    pub const NAMES: [&'static str; 5] =
        ["after_init", "after_forward", "after_backward", "after_optimizer", "after_step"];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "after_init" => EmptyCacheAt::AfterInit,
            "after_forward" => EmptyCacheAt::AfterForward,
            "after_backward" => EmptyCacheAt::AfterBackward,
            "after_optimizer" => EmptyCacheAt::AfterOptimizer,
            "after_step" => EmptyCacheAt::AfterStep,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// The validated `[allocator]` section.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocatorSettings {
    pub kind: AllocatorKind,
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
    /// `max_split_size_mb`, in MiB; None: unlimited (PyTorch's default).
    pub max_split_size_mb: Option<u64>,
    /// `roundup_power2_divisions` (one value for every interval); 0: off (the default).
    pub roundup_power2_divisions: u64,
    /// Where `torch.cuda.empty_cache()` is called.
    pub empty_cache: Vec<EmptyCacheAt>,
    /// Bytes of one cuBLAS workspace (`CUBLAS_WORKSPACE_CONFIG`'s total), which PyTorch takes
    /// from the caching allocator per (handle, stream) ([`crate::plan::TrainingConfig::blas_workspace`]).
    pub cublas_workspace: u64,
    /// NCCL communicator buffers per GPU, bytes, held outside the allocator, as given
    /// (None: [`crate::scenario::Scenario::nccl_bytes`] estimates them).
    pub nccl_buffers: Option<u64>,
}

impl Default for AllocatorSettings {
    fn default() -> Self {
        AllocatorSettings {
            kind: AllocatorKind::Caching,
            expandable_segments: false,
            max_split_size_mb: None,
            roundup_power2_divisions: 0,
            empty_cache: Vec::new(),
            cublas_workspace: 0,
            nccl_buffers: None,
        }
    }
}

impl AllocatorSettings {
    /// The caching allocator's configuration for a device of `device_total` bytes whose
    /// allocator may reserve `capacity`.
    pub fn caching_config(&self, capacity: u64, device_total: u64) -> CachingConfig {
        let mut c = CachingConfig::new(capacity);
        c.device_total = device_total;
        c.expandable_segments = self.expandable_segments;
        c.max_split_size = self.max_split_size_mb.map_or(u64::MAX, |m| m.saturating_mul(1 << 20));
        c.roundup_power2_divisions = [self.roundup_power2_divisions; ROUNDUP_INTERVALS];
        c
    }

    /// A fresh allocator of this kind.
    pub fn build(&self, capacity: u64, device_total: u64) -> Box<dyn Allocator> {
        match self.kind {
            AllocatorKind::Exact => Box::new(ExactAllocator::new(capacity)),
            AllocatorKind::Caching => Box::new(CachingAllocator::new(self.caching_config(capacity, device_total))),
        }
    }

    /// The `PYTORCH_CUDA_ALLOC_CONF` value these options correspond to ("" for the defaults).
    pub fn alloc_conf(&self) -> String {
        let mut parts = Vec::new();
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if let Some(m) = self.max_split_size_mb {
            parts.push(format!("max_split_size_mb:{m}"));
        }
        if self.roundup_power2_divisions > 1 {
            parts.push(format!("roundup_power2_divisions:{}", self.roundup_power2_divisions));
        }
        parts.join(",")
    }
}
