//! Links that concurrent transfers share: each device's NVLink, its share of the node's NICs
//! (send and receive directions apart, as the links are full duplex), and its PCIe
//! directions. A stream's tasks use the links its bit mask names ([`Program::stream_links`]);
//! while k tasks are in flight on a link, each gets 1/k of it (processor sharing), and a task
//! on several links moves at the rate of the most crowded one. Two collectives that overlap
//! therefore finish together no earlier than the pair would one after the other: prefetching
//! a second all-gather does not find twice the bandwidth.
//!
//! A task's whole duration is shared, its latency part too: a simplification that matters
//! only for small transfers overlapping large ones.
//!
//! [`Program::stream_links`]: super::Program::stream_links

/// The links a stream can name, one bit each.
pub const NVLINK: u8 = 1;
pub const NET_TX: u8 = 1 << 1;
pub const NET_RX: u8 = 1 << 2;
pub const PCIE_H2D: u8 = 1 << 3;
pub const PCIE_D2H: u8 = 1 << 4;
/// How many link bits there are.
pub const LINKS: usize = 5;

/// A task in flight on shared links.
#[derive(Debug, Clone)]
struct Active {
    task: u32,
    device: usize,
    mask: u8,
    /// Solo nanoseconds of work left, as of `since`.
    work: f64,
    since: u64,
    /// Current rate (1 / the most crowded link's count).
    rate: f64,
    /// The engine's sequence number of this task's current end event; earlier ones are stale.
    seq: u64,
}

/// The shared links of every device and the tasks in flight on them.
#[derive(Debug, Default)]
pub struct SharedLinks {
    active: Vec<Active>,
    /// Tasks in flight per (device, link).
    count: Vec<[u32; LINKS]>,
}

impl SharedLinks {
    pub fn new(devices: usize) -> SharedLinks {
        SharedLinks { active: Vec::new(), count: vec![[0; LINKS]; devices] }
    }

    /// A task of `duration_ns` solo nanoseconds starts at `now` on `mask`'s links of
    /// `device`. Sets `out` to the new end time of every task whose end changed, this one
    /// included, in task order.
    pub fn start(&mut self, now: u64, device: usize, mask: u8, task: u32, duration_ns: u64, out: &mut Vec<(u32, u64)>) {
        out.clear();
        let alone = !self.active.iter().any(|a| a.device == device && a.mask & mask != 0);
        if !alone {
            self.advance(now, device);
        }
        for (l, c) in self.count[device].iter_mut().enumerate() {
            if mask & (1 << l) != 0 {
                *c += 1;
            }
        }
        self.active.push(Active { task, device, mask, work: duration_ns as f64, since: now, rate: 1.0, seq: 0 });
        if alone {
            // Nobody's rate changes: the common case, without the general bookkeeping.
            out.push((task, now + duration_ns));
        } else {
            self.rerate(now, device, Some(task), out);
        }
    }

    /// `task` finished at `now`. Sets `out` to the new end times of the tasks it leaves
    /// faster, in task order.
    pub fn finish(&mut self, now: u64, task: u32, out: &mut Vec<(u32, u64)>) {
        out.clear();
        let Some(i) = self.active.iter().position(|a| a.task == task) else { return };
        let a = self.active.swap_remove(i);
        let shared = self.active.iter().any(|b| b.device == a.device && b.mask & a.mask != 0);
        if shared {
            self.advance(now, a.device);
        }
        for (l, c) in self.count[a.device].iter_mut().enumerate() {
            if a.mask & (1 << l) != 0 {
                *c -= 1;
            }
        }
        if shared {
            self.rerate(now, a.device, None, out);
        }
    }

    /// Records the sequence number of `task`'s newest end event.
    pub fn set_seq(&mut self, task: u32, seq: u64) {
        if let Some(a) = self.active.iter_mut().find(|a| a.task == task) {
            a.seq = seq;
        }
    }

    /// Whether an end event of `task` with sequence number `seq` is its newest one.
    pub fn is_current(&self, task: u32, seq: u64) -> bool {
        self.active.iter().any(|a| a.task == task && a.seq == seq)
    }

    /// Charges the work done since each task's last change on `device`.
    fn advance(&mut self, now: u64, device: usize) {
        for a in self.active.iter_mut().filter(|a| a.device == device) {
            a.work = (a.work - (now - a.since) as f64 * a.rate).max(0.0);
            a.since = now;
        }
    }

    /// New rates on `device`; the tasks whose rate changed, and the one that just started,
    /// get a new end.
    fn rerate(&mut self, now: u64, device: usize, started: Option<u32>, out: &mut Vec<(u32, u64)>) {
        let count = self.count[device];
        out.clear();
        for a in self.active.iter_mut().filter(|a| a.device == device) {
            let crowd = (0..LINKS).filter(|l| a.mask & (1 << l) != 0).map(|l| count[l]).max().unwrap_or(1).max(1);
            let rate = 1.0 / f64::from(crowd);
            if rate != a.rate || Some(a.task) == started {
                a.rate = rate;
                out.push((a.task, now + (a.work / rate).ceil() as u64));
            }
        }
        out.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's calls, returning what they set.
    fn start(l: &mut SharedLinks, now: u64, device: usize, mask: u8, task: u32, d: u64) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        l.start(now, device, mask, task, d, &mut out);
        out
    }

    fn finish(l: &mut SharedLinks, now: u64, task: u32) -> Vec<(u32, u64)> {
        let mut out = vec![(99, 99)];
        l.finish(now, task, &mut out);
        out
    }

    #[test]
    fn a_task_alone_ends_after_its_duration() {
        let mut l = SharedLinks::new(1);
        assert_eq!(start(&mut l, 100, 0, NVLINK, 7, 1000), vec![(7, 1100)]);
        assert_eq!(finish(&mut l, 1100, 7), vec![]);
    }

    #[test]
    fn two_transfers_on_one_link_share_it() {
        let mut l = SharedLinks::new(1);
        start(&mut l, 0, 0, NET_TX | NET_RX, 1, 1000);
        // At 500 the first has 500 ns of work left; both now move at half speed.
        let ends = start(&mut l, 500, 0, NET_TX | NET_RX, 2, 1000);
        assert_eq!(ends, vec![(1, 1500), (2, 2500)]);
        // When the first finishes, the second has 500 left at full speed: the pair ends at
        // 2000, exactly as one after the other.
        assert_eq!(finish(&mut l, 1500, 1), vec![(2, 2000)]);
    }

    #[test]
    fn full_duplex_directions_and_other_devices_do_not_interfere() {
        let mut l = SharedLinks::new(2);
        start(&mut l, 0, 0, NET_TX, 1, 1000);
        assert_eq!(start(&mut l, 0, 0, NET_RX, 2, 1000), vec![(2, 1000)]);
        assert_eq!(start(&mut l, 0, 1, NET_TX, 3, 1000), vec![(3, 1000)]);
        // A collective on both directions slows both one-way transfers of its device.
        let ends = start(&mut l, 0, 0, NET_TX | NET_RX, 4, 1000);
        assert_eq!(ends, vec![(1, 2000), (2, 2000), (4, 2000)]);
    }
}
