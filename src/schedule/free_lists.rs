//! The buffers a micro-batch's pass frees after each op, filed by op.
//!
//! A forward files each buffer under the op after which it dies (its last consumer, or the
//! backward op that last reads it), and the pass takes an op's list when it reaches the op.
//! Kept as one vector of lists, every op whose list was written owned a heap allocation,
//! made and dropped once per micro-batch: a quarter of the sweep's calls to `malloc`. Here
//! every list is a chain through one arena of nodes, appended at its tail so an op's
//! buffers come back in the order they were filed (the order the program frees them in).
//! Like [`super::span::Span`], the lists start at the chunk's op range and grow to any op
//! outside it.

const NIL: u32 = u32::MAX;

#[derive(Debug)]
pub(super) struct FreeLists {
    base: usize,
    /// Per op from `base`: the (first, last) node of its list, NIL for an empty list.
    ends: Vec<(u32, u32)>,
    /// (buffer, next node).
    nodes: Vec<(u32, u32)>,
}

impl FreeLists {
    /// Empty lists for ops `lo..hi`.
    pub fn new(lo: usize, hi: usize) -> Self {
        let n = hi.saturating_sub(lo);
        FreeLists { base: lo, ends: vec![(NIL, NIL); n], nodes: Vec::with_capacity(2 * n) }
    }

    /// The list of op `i`, the span grown to hold it.
    fn ends_mut(&mut self, i: usize) -> &mut (u32, u32) {
        if i < self.base {
            let grow = self.base - i;
            self.ends.splice(0..0, std::iter::repeat_n((NIL, NIL), grow));
            self.base = i;
        } else if i - self.base >= self.ends.len() {
            self.ends.resize(i - self.base + 1, (NIL, NIL));
        }
        &mut self.ends[i - self.base]
    }

    /// Files buffer `b` to be freed after op `i`, after those filed there before.
    pub fn push(&mut self, i: usize, b: u32) {
        let node = self.nodes.len() as u32;
        self.nodes.push((b, NIL));
        let (first, last) = *self.ends_mut(i);
        if first == NIL {
            self.ends[i - self.base] = (node, node);
        } else {
            self.nodes[last as usize].1 = node;
            self.ends[i - self.base].1 = node;
        }
    }

    /// Moves op `i`'s buffers onto the end of `out`, in the order they were filed, and
    /// empties its list.
    pub fn take_into(&mut self, i: usize, out: &mut Vec<u32>) {
        let Some(e) = i.checked_sub(self.base).and_then(|k| self.ends.get_mut(k)) else { return };
        let mut n = std::mem::replace(e, (NIL, NIL)).0;
        while n != NIL {
            let (b, next) = self.nodes[n as usize];
            out.push(b);
            n = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(f: &mut FreeLists, i: usize) -> Vec<u32> {
        let mut out = Vec::new();
        f.take_into(i, &mut out);
        out
    }

    #[test]
    fn each_op_gives_back_its_buffers_in_filing_order_once() {
        let mut f = FreeLists::new(10, 12);
        f.push(11, 1);
        f.push(10, 2);
        f.push(11, 3);
        f.push(14, 4);
        f.push(4, 5);
        f.push(11, 6);
        assert_eq!(take(&mut f, 11), vec![1, 3, 6]);
        assert_eq!(take(&mut f, 11), Vec::<u32>::new());
        assert_eq!(take(&mut f, 10), vec![2]);
        assert_eq!(take(&mut f, 4), vec![5]);
        assert_eq!(take(&mut f, 14), vec![4]);
        assert_eq!(take(&mut f, 3), Vec::<u32>::new());
        assert_eq!(take(&mut f, 99), Vec::<u32>::new());
        f.push(11, 7);
        assert_eq!(take(&mut f, 11), vec![7]);
    }
}
