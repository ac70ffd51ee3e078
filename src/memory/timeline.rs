//! Memory over time of one simulated GPU, by category.

use super::category::Category;

/// The allocator's totals after one event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Live tensor bytes, each rounded as the allocator rounds it.
    pub allocated: u64,
    /// Bytes reserved from the device.
    pub reserved: u64,
    /// Blocks in use or waiting on another stream (PyTorch's `active_bytes`).
    pub active: u64,
}

/// The state after one allocation or free (or a change of the allocator's own holdings).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Simulated time, nanoseconds.
    pub time_ns: u64,
    pub by_category: [u64; Category::COUNT],
    pub allocated: u64,
    pub reserved: u64,
    pub active: u64,
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
    pub fn record(&mut self, time_ns: u64, cat: Category, delta: i64, totals: Totals, task: usize) {
        let c = &mut self.current[cat.index()];
        *c = (*c as i64 + delta).max(0) as u64;
        self.push(time_ns, totals, task);
    }

    /// Records a change of the totals alone (`empty_cache`, a released cache), if any.
    pub fn record_totals(&mut self, time_ns: u64, totals: Totals, task: usize) {
        let same = match self.samples.last() {
            Some(s) => s.allocated == totals.allocated && s.reserved == totals.reserved && s.active == totals.active,
            None => totals == Totals::default(),
        };
        if !same {
            self.push(time_ns, totals, task);
        }
    }

    fn push(&mut self, time_ns: u64, t: Totals, task: usize) {
        self.samples.push(Sample {
            time_ns,
            by_category: self.current,
            allocated: t.allocated,
            reserved: t.reserved,
            active: t.active,
            task,
        });
        let i = self.samples.len() - 1;
        if self.peak_index.is_none_or(|p| t.allocated > self.samples[p].allocated) {
            self.peak_index = Some(i);
        }
        if self.peak_reserved_index.is_none_or(|p| t.reserved > self.samples[p].reserved) {
            self.peak_reserved_index = Some(i);
        }
    }

    pub fn peak(&self) -> Option<&Sample> {
        self.peak_index.map(|i| &self.samples[i])
    }

    /// The sample of the highest `reserved` (first one if tied).
    pub fn peak_reserved(&self) -> Option<&Sample> {
        self.peak_reserved_index.map(|i| &self.samples[i])
    }
}
