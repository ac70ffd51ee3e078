//! Model families turned into a [`LayerDag`]: ops with parameters, FLOPs and saved tensors.
//! Nothing here knows about GPUs or parallelism.

pub mod config;
pub mod dag;

pub use config::{Attention, Dtype, Family, ModelConfig, Workload};
pub use dag::{build, LayerDag, Op, OpId, OpKind, Region, Tensor, TensorId, TensorKind};
