//! Model families turned into a [`LayerDag`]: ops with parameters, FLOPs and saved tensors.
//! Nothing here knows about GPUs; tensor parallelism is a way of cutting the graph
//! ([`TensorSplit`]), so the DAG of one tensor-parallel rank is built here.

pub mod config;
pub mod dag;
pub mod eager;
pub mod fp8;
pub mod hf;
pub mod lora;
pub mod quant;

pub use config::{
    Attention, AuxLoss, BlockStyle, ContextComm, Dtype, Family, FlashKernel, KernelStack, LossKind, MlaConfig,
    ModelConfig, MoeConfig, MtpConfig, NormPlacement, RoutedCopies, RoutingScale, SlidingWindow, TensorSplit,
    WindowPattern, Workload,
};
pub use dag::{
    build, CommGroup, FlashOp, Fp8Gemm, LayerDag, Op, OpId, OpKind, Region, ScoresShape, Tensor, TensorId, TensorKind,
    TpComm,
};
pub use fp8::{Fp8Config, Fp8Recipe};
pub use lora::LoraConfig;
pub use quant::{kv_bytes_per_token, KvDtype, WeightFormat};
