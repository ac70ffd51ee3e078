//! Device memory: what every byte is for ([`Category`]), the [`Allocator`] every tensor goes
//! through, and the per-GPU timeline the engine records.

pub mod allocator;
pub mod category;
pub mod timeline;

pub use allocator::{AllocError, Allocator, ExactAllocator, PYTORCH_BLOCK};
pub use category::Category;
pub use timeline::{Sample, Timeline};
