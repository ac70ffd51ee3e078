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
#[derive(Debug, Clone, Copy, PartialEq)]
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

/// One sample as kept: the change of one category (or none) and the totals after it. A
/// [`Sample`] carries every category's live bytes, eight times the size; a large run
/// records millions of samples, and writing them whole cost a quarter of its time and
/// most of its memory. [`Timeline::samples`] rebuilds them in order.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Change {
    time_ns: u64,
    delta: i64,
    allocated: u64,
    reserved: u64,
    active: u64,
    task: u32,
    /// The category changed; [`NO_CATEGORY`] for a change of the totals alone.
    category: u8,
}

const NO_CATEGORY: u8 = u8::MAX;
/// Every this many changes, the live bytes by category before the next one, so that one
/// sample is rebuilt from at most this many changes ([`Timeline::sample`]).
const CHECKPOINT: usize = 1024;

/// Every change of a GPU's memory, in order, plus the running peaks.
///
/// With the curve (`Timeline::default()`) every sample is kept ([`Timeline::samples`]), for
/// memory.csv, the plots and explain. Without it ([`Timeline::peaks_only`]) only what a
/// report reads is kept: a [`Mark`] per run of samples of one task and the two peak samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// Every sample, as the change it made; empty without the curve.
    changes: Vec<Change>,
    /// The live bytes by category before changes 0, CHECKPOINT, 2 CHECKPOINT, ...
    checkpoints: Vec<[u64; Category::COUNT]>,
    marks: Vec<Mark>,
    peaks_only: bool,
    /// Without the marks too ([`Timeline::headline`]).
    no_marks: bool,
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

    /// A timeline that keeps the two peak samples alone: no curve and no marks. What a sweep
    /// row reads of a run (its peaks); the marks, one per task, are written to memory that is
    /// not otherwise touched, and on a pipeline's millions of samples that cost more than the
    /// peaks.
    pub fn headline() -> Self {
        Timeline { peaks_only: true, no_marks: true, ..Default::default() }
    }

    /// Whether the samples are kept.
    pub fn has_curve(&self) -> bool {
        !self.peaks_only
    }

    /// Room for `n` samples, so that a large program's timeline is not copied as it grows.
    pub fn reserve(&mut self, n: usize) {
        if !self.peaks_only {
            self.changes.reserve_exact(n);
        }
        if !self.no_marks {
            self.marks.reserve_exact(n);
        }
    }

    /// How many samples the curve holds (0 without it).
    pub fn sample_count(&self) -> usize {
        self.changes.len()
    }

    /// Every sample of the curve, in order (none without it).
    pub fn samples(&self) -> Samples<'_> {
        Samples { changes: &self.changes, next: 0, current: [0; Category::COUNT] }
    }

    /// Whether each category ever holds bytes on the curve: one held at some sample had a
    /// positive change before it (every category starts at zero). One pass over the changes,
    /// where asking each category of the samples rebuilt every sample once per category.
    pub fn categories_held(&self) -> [bool; Category::COUNT] {
        let mut held = [false; Category::COUNT];
        for c in self.changes.iter().filter(|c| c.delta > 0 && c.category != NO_CATEGORY) {
            held[usize::from(c.category)] = true;
        }
        held
    }

    /// Sample `i` of the curve.
    pub fn sample(&self, i: usize) -> Option<Sample> {
        self.changes.get(i)?;
        let from = i / CHECKPOINT * CHECKPOINT;
        let mut it = Samples { changes: &self.changes, next: from, current: self.checkpoints[i / CHECKPOINT] };
        it.nth(i - from)
    }

    pub fn current(&self) -> &[u64; Category::COUNT] {
        &self.current
    }

    /// Records a change of `delta` bytes (positive: allocation) in `cat`.
    pub fn record(&mut self, time_ns: u64, cat: Category, delta: i64, totals: Totals, task: usize) {
        self.keep(time_ns, cat.index() as u8, delta, totals, task);
        let c = &mut self.current[cat.index()];
        *c = apply(*c, delta);
        self.push(time_ns, totals, task);
    }

    /// Records a change of the totals alone (`empty_cache`, a released cache), if any.
    pub fn record_totals(&mut self, time_ns: u64, totals: Totals, task: usize) {
        if totals != self.last {
            self.keep(time_ns, NO_CATEGORY, 0, totals, task);
            self.push(time_ns, totals, task);
        }
    }

    /// Keeps the change for the curve (before it changes `current`).
    #[inline]
    fn keep(&mut self, time_ns: u64, category: u8, delta: i64, t: Totals, task: usize) {
        if self.peaks_only {
            return;
        }
        if self.changes.len() % CHECKPOINT == 0 {
            self.checkpoints.push(self.current);
        }
        self.changes.push(Change {
            time_ns,
            delta,
            allocated: t.allocated,
            reserved: t.reserved,
            active: t.active,
            task: task as u32,
            category,
        });
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
        // What a report reads of the marks is the first highest of each (step, phase), and
        // one task's samples share its step and phase: of a run of samples of one task, the
        // first of the highest stands for them all.
        if !self.no_marks {
            let mark = Mark { task: task as u32, allocated: t.allocated };
            match self.marks.last_mut() {
                Some(m) if m.task == mark.task => {
                    if mark.allocated > m.allocated {
                        *m = mark;
                    }
                }
                _ => self.marks.push(mark),
            }
        }
        self.last = t;
        self.recorded += 1;
    }

    /// The samples a summary of the curve keeps (trace.json's counters, memory.csv past its
    /// row budget): in each of `buckets` equal stretches of the run, the first samples with the
    /// stretch's highest allocated and reserved bytes, and its last sample. The peaks of
    /// allocated and reserved bytes are kept exactly, and every stretch ends in its true state.
    pub fn summary_samples(&self, buckets: u64) -> Vec<bool> {
        let samples = &self.changes;
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

    /// The peaks a report states, (`max_memory_allocated`, `max_memory_reserved`): the highest
    /// allocated bytes, and the highest reserved (the allocated peak's own where no reserved
    /// peak was recorded); None before any sample.
    pub fn peak_bytes(&self) -> Option<(u64, u64)> {
        let p = self.peak()?;
        Some((p.allocated, self.peak_reserved().map_or(p.reserved, |r| r.reserved)))
    }

    /// The samples' tasks and live bytes, in order (with or without the curve): of each run of
    /// consecutive samples of one task, the first with the most live bytes.
    pub fn marks(&self) -> &[Mark] {
        &self.marks
    }

    /// Renumbers the tasks of every sample by `task - offset`: a stage's view of a run of
    /// several stages' programs.
    pub fn shift_tasks(&mut self, offset: usize) {
        self.offset_tasks(-(offset as i64));
    }

    /// Renumbers the tasks of every sample by `task + by`: a rank played on its own
    /// ([`crate::engine::by_rank`]) numbers its tasks from 0, the run from its first task.
    pub fn offset_tasks(&mut self, by: i64) {
        let at = |t: u32| (i64::from(t) + by) as u32;
        for s in self.peak.iter_mut().chain(self.peak_reserved.iter_mut()) {
            s.task = at(s.task as u32) as usize;
        }
        for c in &mut self.changes {
            c.task = at(c.task);
        }
        for m in &mut self.marks {
            m.task = at(m.task);
        }
    }
}

/// A category's live bytes after a change of `delta`.
#[inline]
fn apply(c: u64, delta: i64) -> u64 {
    (c as i64 + delta).max(0) as u64
}

/// The samples of a curve, rebuilt in order ([`Timeline::samples`]).
pub struct Samples<'a> {
    changes: &'a [Change],
    next: usize,
    current: [u64; Category::COUNT],
}

impl Iterator for Samples<'_> {
    type Item = Sample;

    fn next(&mut self) -> Option<Sample> {
        let c = self.changes.get(self.next)?;
        self.next += 1;
        if c.category != NO_CATEGORY {
            let x = &mut self.current[c.category as usize];
            *x = apply(*x, c.delta);
        }
        Some(Sample {
            time_ns: c.time_ns,
            by_category: self.current,
            allocated: c.allocated,
            reserved: c.reserved,
            active: c.active,
            task: c.task as usize,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.changes.len() - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Samples<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A category held is one some sample shows above zero, as rebuilding every sample says;
    /// a category only freed (from nothing) or a change of the totals alone holds none.
    #[test]
    fn categories_held_are_those_some_sample_shows() {
        let mut t = Timeline::default();
        let tot = |a: u64| Totals { allocated: a, reserved: 2 * a, active: a };
        t.record(0, Category::ALL[0], 100, tot(100), 0);
        t.record(1, Category::ALL[1], -5, tot(100), 1);
        t.record_totals(2, tot(50), 2);
        t.record(3, Category::ALL[0], -100, tot(0), 3);
        let held = t.categories_held();
        let by_samples: Vec<bool> =
            Category::ALL.iter().map(|c| t.samples().any(|s| s.by_category[c.index()] > 0)).collect();
        assert_eq!(held.to_vec(), by_samples);
        assert_eq!((held[Category::ALL[0].index()], held[Category::ALL[1].index()]), (true, false));
    }
}
