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

/// What every sample contributes to the per-(step, phase) peaks of a report: the task that
/// recorded it and the live bytes after it. A tenth of a [`Sample`]'s size, so a run that
/// does not need the curve (a sweep's) writes little memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub task: u32,
    pub allocated: u64,
}

/// Every change of a GPU's memory, in order, plus the running peaks.
///
/// With the curve (`Timeline::default()`) every [`Sample`] is kept, for memory.csv, the
/// plots and explain. Without it ([`Timeline::peaks_only`]) only what a report reads is kept:
/// a [`Mark`] per run of samples of one task and the two peak samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// Every sample; empty without the curve.
    pub samples: Vec<Sample>,
    marks: Vec<Mark>,
    peaks_only: bool,
    current: [u64; Category::COUNT],
    /// Index (in recording order, = into `samples` with the curve) of the highest
    /// `allocated` (first one if tied).
    pub peak_index: Option<usize>,
    /// Index of the highest `reserved`.
    pub peak_reserved_index: Option<usize>,
    peak: Option<Sample>,
    peak_reserved: Option<Sample>,
    /// The last sample's totals (what `record_totals` compares with).
    last: Totals,
    recorded: usize,
}

impl Timeline {
    /// A timeline that keeps the peaks and the marks but not the curve.
    pub fn peaks_only() -> Self {
        Timeline { peaks_only: true, ..Default::default() }
    }

    /// Whether the samples are kept.
    pub fn has_curve(&self) -> bool {
        !self.peaks_only
    }

    /// Room for `n` samples, so that a large program's timeline is not copied as it grows.
    pub fn reserve(&mut self, n: usize) {
        if !self.peaks_only {
            self.samples.reserve_exact(n);
        }
        self.marks.reserve_exact(n);
    }

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
        if totals != self.last {
            self.push(time_ns, totals, task);
        }
    }

    fn push(&mut self, time_ns: u64, t: Totals, task: usize) {
        let sample = |current: &[u64; Category::COUNT]| Sample {
            time_ns,
            by_category: *current,
            allocated: t.allocated,
            reserved: t.reserved,
            active: t.active,
            task,
        };
        let i = self.recorded;
        if self.peak.as_ref().is_none_or(|p| t.allocated > p.allocated) {
            self.peak_index = Some(i);
            self.peak = Some(sample(&self.current));
        }
        if self.peak_reserved.as_ref().is_none_or(|p| t.reserved > p.reserved) {
            self.peak_reserved_index = Some(i);
            self.peak_reserved = Some(sample(&self.current));
        }
        if !self.peaks_only {
            self.samples.push(sample(&self.current));
        }
        // What a report reads of the marks is the first highest of each (step, phase), and
        // one task's samples share its step and phase: of a run of samples of one task, the
        // first of the highest stands for them all.
        let mark = Mark { task: task as u32, allocated: t.allocated };
        match self.marks.last_mut() {
            Some(m) if m.task == mark.task => {
                if mark.allocated > m.allocated {
                    *m = mark;
                }
            }
            _ => self.marks.push(mark),
        }
        self.last = t;
        self.recorded += 1;
    }

    /// The samples a summary of the curve keeps (trace.json's counters, memory.csv past its
    /// row budget): in each of `buckets` equal stretches of the run, the first samples with the
    /// stretch's highest allocated and reserved bytes, and its last sample. The peaks of
    /// allocated and reserved bytes are kept exactly, and every stretch ends in its true state.
    pub fn summary_samples(&self, buckets: u64) -> Vec<bool> {
        let samples = &self.samples;
        let mut keep = vec![false; samples.len()];
        let (Some(first), Some(last)) = (samples.first(), samples.last()) else { return keep };
        let span = (last.time_ns - first.time_ns).max(1);
        let bucket = |t: u64| (u128::from(t - first.time_ns) * u128::from(buckets) / u128::from(span)) as u64;
        let mut i = 0;
        while i < samples.len() {
            let b = bucket(samples[i].time_ns);
            let (mut top, mut top_reserved) = (i, i);
            let mut j = i;
            while j < samples.len() && bucket(samples[j].time_ns) == b {
                if samples[j].allocated > samples[top].allocated {
                    top = j;
                }
                if samples[j].reserved > samples[top_reserved].reserved {
                    top_reserved = j;
                }
                j += 1;
            }
            keep[top] = true;
            keep[top_reserved] = true;
            keep[j - 1] = true;
            i = j;
        }
        keep
    }

    /// The sample of the highest `allocated` (first one if tied).
    pub fn peak(&self) -> Option<&Sample> {
        self.peak.as_ref()
    }

    /// The sample of the highest `reserved` (first one if tied).
    pub fn peak_reserved(&self) -> Option<&Sample> {
        self.peak_reserved.as_ref()
    }

    /// The samples' tasks and live bytes, in order (with or without the curve): of each run of
    /// consecutive samples of one task, the first with the most live bytes.
    pub fn marks(&self) -> &[Mark] {
        &self.marks
    }

    /// Renumbers the tasks of every sample by `task - offset`: a stage's view of a run of
    /// several stages' programs.
    pub fn shift_tasks(&mut self, offset: usize) {
        for s in self.samples.iter_mut().chain(self.peak.iter_mut()).chain(self.peak_reserved.iter_mut()) {
            s.task -= offset;
        }
        for m in &mut self.marks {
            m.task -= offset as u32;
        }
    }
}
