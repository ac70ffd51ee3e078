//! Device memory: what every byte is for ([`Category`]), the [`Allocator`] every tensor goes
//! through (PyTorch's caching allocator, [`CachingAllocator`], or exact live-byte accounting,
//! [`ExactAllocator`]), and the per-GPU timeline the engine records.

pub mod allocator;
pub mod caching;
pub mod category;
mod handles;
pub mod history;
pub mod settings;
pub mod timeline;

pub use allocator::{AllocError, Allocator, AllocatorStats, ExactAllocator, OomCause, Snapshot, PYTORCH_BLOCK};
pub use caching::{CachingAllocator, CachingConfig};
pub use category::Category;
pub use history::History;
pub use settings::{AllocatorKind, AllocatorSettings, EmptyCacheAt};
pub use timeline::{Sample, Timeline, Totals};
