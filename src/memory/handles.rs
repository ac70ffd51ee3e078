//! Per tensor handle, a value: what an allocator keeps of each live tensor.

/// A value per tensor handle, for the handles from the lowest seen on up; `empty` for a
/// handle without one. A device of a run of several sees the handles of its own part of the
/// run's numbering only (a pipeline stage's or a rank's buffers follow the earlier ones'): a
/// table from handle 0 would hold, and fill, an entry for every buffer of every earlier
/// part, and 256 ranks' tables grow with the square of the ranks.
#[derive(Debug, Clone)]
pub(crate) struct HandleTable<T> {
    /// The handle of `values[0]`.
    base: usize,
    values: Vec<T>,
    empty: T,
}

impl<T: Copy + PartialEq> HandleTable<T> {
    pub fn new(empty: T) -> Self {
        HandleTable { base: 0, values: Vec::new(), empty }
    }

    pub fn get(&self, id: usize) -> Option<T> {
        self.values.get(id.checked_sub(self.base)?).copied()
    }

    pub fn get_mut(&mut self, id: usize) -> Option<&mut T> {
        self.values.get_mut(id.checked_sub(self.base)?)
    }

    /// The entry of `id`, made if needed.
    pub fn slot_mut(&mut self, id: usize) -> &mut T {
        if self.values.is_empty() {
            self.base = id;
        } else if id < self.base {
            self.values.splice(0..0, std::iter::repeat_n(self.empty, self.base - id));
            self.base = id;
        }
        let i = id - self.base;
        if self.values.len() <= i {
            self.values.resize(i + 1, self.empty);
        }
        &mut self.values[i]
    }

    pub fn slot(&mut self, id: usize) -> T {
        *self.slot_mut(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_handles_from_the_lowest_seen() {
        let mut t = HandleTable::new(0u64);
        *t.slot_mut(1000) = 7;
        assert_eq!((t.base, t.values.len()), (1000, 1));
        *t.slot_mut(998) = 5;
        assert_eq!((t.get(998), t.get(999), t.get(1000), t.get(5)), (Some(5), Some(0), Some(7), None));
        assert_eq!(t.values.len(), 3);
    }
}
