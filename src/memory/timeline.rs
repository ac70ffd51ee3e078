//! Memory over time of one simulated GPU, by category.

use super::category::Category;

/// The state after one allocation or free.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Simulated time, nanoseconds.
    pub time_ns: u64,
    pub by_category: [u64; Category::COUNT],
    pub allocated: u64,
    pub reserved: u64,
    /// The task whose allocation or free this was.
    pub task: usize,
}

/// Every change of a GPU's memory, in order, plus the running peak.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub samples: Vec<Sample>,
    current: [u64; Category::COUNT],
    /// Index into `samples` of the highest `allocated` (first one if tied).
    pub peak_index: Option<usize>,
    /// Index of the highest `reserved`.
    pub peak_reserved_index: Option<usize>,
}

impl Timeline {
    pub fn current(&self) -> &[u64; Category::COUNT] {
        &self.current
    }

    /// Records a change of `delta` bytes (positive: allocation) in `cat`.
    pub fn record(&mut self, time_ns: u64, cat: Category, delta: i64, allocated: u64, reserved: u64, task: usize) {
        let c = &mut self.current[cat.index()];
        *c = (*c as i64 + delta).max(0) as u64;
        self.samples.push(Sample { time_ns, by_category: self.current, allocated, reserved, task });
        let i = self.samples.len() - 1;
        if self.peak_index.is_none_or(|p| allocated > self.samples[p].allocated) {
            self.peak_index = Some(i);
        }
        if self.peak_reserved_index.is_none_or(|p| reserved > self.samples[p].reserved) {
            self.peak_reserved_index = Some(i);
        }
    }

    pub fn peak(&self) -> Option<&Sample> {
        self.peak_index.map(|i| &self.samples[i])
    }
}
