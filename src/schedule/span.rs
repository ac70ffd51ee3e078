//! Values indexed by op or tensor number, held for one pipeline chunk's range only.
//!
//! A micro-batch's forward and backward keep per-op free lists and per-tensor gradient
//! buffers. Sized by the whole DAG, a stage of a 16-stage GPT-3 allocated, zeroed and dropped
//! sixteen times what it used for every micro-batch: 16% of building its program. A `Span`
//! starts at the chunk's range and grows to any index used outside it, so every access means
//! what it meant on a whole-DAG vector.

use std::ops::{Index, IndexMut};

#[derive(Debug)]
pub(super) struct Span<T> {
    base: usize,
    values: Vec<T>,
    /// What an index outside the span reads as.
    outside: T,
}

impl<T: Default + Clone> Span<T> {
    /// Default values for indices `lo..hi`.
    pub fn new(lo: usize, hi: usize) -> Self {
        Span { base: lo, values: vec![T::default(); hi.saturating_sub(lo)], outside: T::default() }
    }
}

impl<T> Index<usize> for Span<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        match i.checked_sub(self.base).and_then(|k| self.values.get(k)) {
            Some(v) => v,
            None => &self.outside,
        }
    }
}

impl<T: Default + Clone> IndexMut<usize> for Span<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        if i < self.base {
            let grow = self.base - i;
            self.values.splice(0..0, std::iter::repeat_n(T::default(), grow));
            self.base = i;
        } else if i - self.base >= self.values.len() {
            self.values.resize(i - self.base + 1, T::default());
        }
        &mut self.values[i - self.base]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_outside_the_span_read_as_default_and_grow_it_when_written() {
        let mut s: Span<Option<u32>> = Span::new(10, 12);
        assert_eq!(s[3], None);
        assert_eq!(s[11], None);
        s[11] = Some(1);
        s[14] = Some(2);
        s[4] = Some(3);
        assert_eq!((s[4], s[5], s[11], s[14], s[15]), (Some(3), None, Some(1), Some(2), None));
        let mut f: Span<Vec<u32>> = Span::new(0, 2);
        f[7].push(9);
        assert_eq!(std::mem::take(&mut f[7]), vec![9]);
        assert!(f[7].is_empty());
    }
}
