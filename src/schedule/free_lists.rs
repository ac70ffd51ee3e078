//! The buffers a micro-batch's pass frees after each op, filed by op.
//!
//! A forward files each buffer under the op after which it dies (its last consumer, or the
//! backward op that last reads it), and the pass takes an op's list when it reaches the op.
//! Kept as one vector of lists, every op whose list was written owned a heap allocation,
//! made and dropped once per micro-batch: a quarter of the sweep's calls to `malloc`. Here
//! every list is a chain through one arena of nodes, appended at its tail so an op's
//! buffers come back in the order they were filed (the order the program frees them in).
//! The lists' ends are a [`super::span::Span`]: they start at the chunk's op range and grow
//! to any op outside it.

use super::span::Span;

#[derive(Debug)]
pub(super) struct FreeLists {
    /// Per op: the (first, last) node of its list, None for an empty list.
    ends: Span<Option<(u32, u32)>>,
    /// (buffer, next node; None for the last of its list).
    nodes: Vec<(u32, Option<u32>)>,
}

impl FreeLists {
    /// Empty lists for ops `lo..hi`.
    pub fn new(lo: usize, hi: usize) -> Self {
        FreeLists { ends: Span::new(lo, hi), nodes: Vec::with_capacity(2 * hi.saturating_sub(lo)) }
    }

    /// Files buffer `b` to be freed after op `i`, after those filed there before.
    pub fn push(&mut self, i: usize, b: u32) {
        let node = self.nodes.len() as u32;
        self.nodes.push((b, None));
        let end = &mut self.ends[i];
        match end {
            None => *end = Some((node, node)),
            Some((_, last)) => {
                self.nodes[*last as usize].1 = Some(node);
                *last = node;
            }
        }
    }

    /// Moves op `i`'s buffers onto the end of `out`, in the order they were filed, and
    /// empties its list.
    pub fn take_into(&mut self, i: usize, out: &mut Vec<u32>) {
        let Some((first, _)) = self.ends[i] else { return };
        self.ends[i] = None;
        let mut n = Some(first);
        while let Some(k) = n {
            let (b, next) = self.nodes[k as usize];
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
