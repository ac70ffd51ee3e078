//! What concurrent tasks of one device share: its NVLink, its share of the node's NICs (send
//! and receive directions apart, as the links are full duplex), its PCIe directions, and its
//! streaming multiprocessors.
//!
//! Links: a stream's tasks use the links its bit mask names ([`Program::stream_links`]);
//! while k tasks are in flight on a link, each gets 1/k of it (processor sharing), and a task
//! on several links moves at the rate of the most crowded one. Two collectives that overlap
//! therefore finish together no earlier than the pair would one after the other: prefetching
//! a second all-gather does not find twice the bandwidth. A task's whole duration is shared,
//! its latency part too: a simplification that matters only for small transfers overlapping
//! large ones.
//!
//! SMs: an NCCL collective's kernel holds one thread block per channel on an SM for as long
//! as it runs (`Task::ctas`), so a compute kernel that overlaps it (a stream with the [`SMS`]
//! bit) runs on the SMs left: at (SMs - CTAs held) / SMs of its solo rate, the CTAs of every
//! collective in flight on the device added (at most [`MAX_HELD`] of the SMs). The
//! collective itself keeps its rate. Measured on H100, an `ncclAllGather` holds 24 of the 132
//! SMs while a GEMM beside it slows down (NVIDIA developer forum, "NCCL kernels and compute
//! overlap", thread 337991); 24 is the ring channel count NCCL's topology search gives inside
//! an 8-GPU NVSwitch node ([`crate::net::nccl_memory`]).
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
/// Not a link: the stream's kernels run on the SMs collectives take thread blocks from.
pub const SMS: u8 = 1 << 5;
/// The most of a device's SMs that collectives are taken to hold at once (thread blocks
/// beyond it wait for SMs rather than slow compute further).
pub const MAX_HELD: f64 = 0.5;

/// A task in flight.
#[derive(Debug, Clone)]
struct Active {
    task: u32,
    mask: u8,
    /// Thread blocks its kernel holds on SMs (an NCCL collective's channels), else 0.
    ctas: u32,
    /// Solo nanoseconds of work left, as of `since`.
    work: f64,
    since: u64,
    /// Current rate: 1 / the most crowded link's count, times the SMs left where it
    /// computes.
    rate: f64,
    /// The engine's sequence number of this task's current end event; earlier ones are stale.
    seq: u64,
}

/// One device's tasks in flight and what they hold.
#[derive(Debug, Default, Clone)]
struct Device {
    active: Vec<Active>,
    /// Tasks in flight per link.
    count: [u32; LINKS],
    /// Compute tasks in flight (streams with [`SMS`]).
    computing: u32,
    /// Thread blocks collectives in flight hold.
    ctas: u32,
    /// The device's SMs (0: SM sharing not modelled).
    sms: u32,
}

impl Device {
    /// Whether a task with `mask` and `ctas` changes any rate here, or has its own changed.
    fn interacts(&self, mask: u8, ctas: u32) -> bool {
        let links = mask & ((1 << LINKS) - 1);
        self.active.iter().any(|a| a.mask & links != 0)
            || (self.sms > 0 && ((ctas > 0 && self.computing > 0) || (mask & SMS != 0 && self.ctas > 0)))
    }

    fn hold(&mut self, mask: u8, ctas: u32, sign: i32) {
        let step = |c: &mut u32| *c = c.wrapping_add_signed(sign);
        for (l, c) in self.count.iter_mut().enumerate() {
            if mask & (1 << l) != 0 {
                step(c);
            }
        }
        if mask & SMS != 0 {
            step(&mut self.computing);
        }
        self.ctas = self.ctas.wrapping_add_signed(sign * ctas as i32);
    }

    /// The share of the SMs a compute kernel finds free.
    fn sm_rate(&self) -> f64 {
        if self.sms == 0 || self.ctas == 0 {
            return 1.0;
        }
        1.0 - (f64::from(self.ctas) / f64::from(self.sms)).min(MAX_HELD)
    }
}

/// The shared links and SMs of every device and the tasks in flight on them.
#[derive(Debug, Default)]
pub struct SharedLinks {
    devices: Vec<Device>,
}

impl SharedLinks {
    /// `sms`: each device's SM count (0 where SM sharing is not modelled).
    pub fn new(sms: &[u32]) -> SharedLinks {
        SharedLinks { devices: sms.iter().map(|&s| Device { sms: s, ..Default::default() }).collect() }
    }

    /// A task of `duration_ns` solo nanoseconds starts at `now` on `mask`'s links of `device`,
    /// holding `ctas` thread blocks. Sets `out` to the new end time of every task whose end
    /// changed, this one included, in task order.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &mut self,
        now: u64,
        device: usize,
        mask: u8,
        ctas: u32,
        task: u32,
        duration_ns: u64,
        out: &mut Vec<(u32, u64)>,
    ) {
        out.clear();
        let d = &mut self.devices[device];
        let ctas = if d.sms > 0 { ctas } else { 0 };
        let alone = !d.interacts(mask, ctas);
        if !alone {
            advance(d, now);
        }
        d.hold(mask, ctas, 1);
        d.active.push(Active { task, mask, ctas, work: duration_ns as f64, since: now, rate: 1.0, seq: 0 });
        if alone {
            // Nobody's rate changes: the common case, without the general bookkeeping.
            out.push((task, now + duration_ns));
        } else {
            rerate(d, now, Some(task), out);
        }
    }

    /// `task` of `device` finished at `now`. Sets `out` to the new end times of the tasks it
    /// leaves faster, in task order.
    pub fn finish(&mut self, now: u64, device: usize, task: u32, out: &mut Vec<(u32, u64)>) {
        out.clear();
        let d = &mut self.devices[device];
        let Some(i) = d.active.iter().position(|a| a.task == task) else { return };
        let a = d.active.swap_remove(i);
        let shared = d.interacts(a.mask, a.ctas);
        if shared {
            advance(d, now);
        }
        d.hold(a.mask, a.ctas, -1);
        if shared {
            rerate(d, now, None, out);
        }
    }

    /// Records the sequence number of `task`'s newest end event.
    pub fn set_seq(&mut self, device: usize, task: u32, seq: u64) {
        if let Some(a) = self.devices[device].active.iter_mut().find(|a| a.task == task) {
            a.seq = seq;
        }
    }

    /// What the rates to come depend on, per device: its tasks in flight in task order, each
    /// as `task` numbers it, with its links, thread blocks, work left, rate, and time and
    /// sequence number relative to `now` and `seq0`.
    pub fn period_state(&self, now: u64, seq0: u64, task: &dyn Fn(u32) -> [i64; 2], out: &mut Vec<i64>) {
        for d in &self.devices {
            let mut active: Vec<&Active> = d.active.iter().collect();
            active.sort_unstable_by_key(|a| a.task);
            out.push(active.len() as i64);
            for a in active {
                out.extend(task(a.task));
                out.extend([
                    i64::from(a.mask),
                    i64::from(a.ctas),
                    a.work.to_bits() as i64,
                    a.since as i64 - now as i64,
                    a.rate.to_bits() as i64,
                    a.seq as i64 - seq0 as i64,
                ]);
            }
        }
    }

    /// Whether renumbering every task in flight by `shift` keeps their order on each device
    /// (the order rates are handed out in).
    pub fn keeps_order(&self, shift: &dyn Fn(u32) -> u32) -> bool {
        self.devices.iter().all(|d| {
            let mut ids: Vec<u32> = d.active.iter().map(|a| a.task).collect();
            ids.sort_unstable();
            ids.windows(2).all(|w| shift(w[0]) < shift(w[1]))
        })
    }

    /// Moves every task in flight `dt` later, renumbered by `shift`, its end event's sequence
    /// number `dseq` on.
    pub fn advance(&mut self, dt: u64, dseq: u64, shift: &dyn Fn(u32) -> u32) {
        for a in self.devices.iter_mut().flat_map(|d| d.active.iter_mut()) {
            a.task = shift(a.task);
            a.since += dt;
            a.seq += dseq;
        }
    }

    /// Whether an end event of `task` with sequence number `seq` is its newest one.
    pub fn is_current(&self, device: usize, task: u32, seq: u64) -> bool {
        self.devices[device].active.iter().any(|a| a.task == task && a.seq == seq)
    }
}

/// Charges the work done since each task's last change.
fn advance(d: &mut Device, now: u64) {
    for a in d.active.iter_mut() {
        a.work = (a.work - (now - a.since) as f64 * a.rate).max(0.0);
        a.since = now;
    }
}

/// New rates; the tasks whose rate changed, and the one that just started, get a new end.
fn rerate(d: &mut Device, now: u64, started: Option<u32>, out: &mut Vec<(u32, u64)>) {
    let (count, sm) = (d.count, d.sm_rate());
    out.clear();
    for a in d.active.iter_mut() {
        let crowd = (0..LINKS).filter(|l| a.mask & (1 << l) != 0).map(|l| count[l]).max().unwrap_or(1).max(1);
        let mut rate = 1.0 / f64::from(crowd);
        if a.mask & SMS != 0 {
            rate *= sm;
        }
        if rate != a.rate || Some(a.task) == started {
            a.rate = rate;
            out.push((a.task, now + (a.work / rate).ceil() as u64));
        }
    }
    out.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's calls, returning what they set.
    fn start(l: &mut SharedLinks, now: u64, device: usize, mask: u8, task: u32, d: u64) -> Vec<(u32, u64)> {
        start_ctas(l, now, device, mask, 0, task, d)
    }

    fn start_ctas(l: &mut SharedLinks, now: u64, dv: usize, mask: u8, ctas: u32, task: u32, d: u64) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        l.start(now, dv, mask, ctas, task, d, &mut out);
        out
    }

    fn finish(l: &mut SharedLinks, now: u64, device: usize, task: u32) -> Vec<(u32, u64)> {
        let mut out = vec![(99, 99)];
        l.finish(now, device, task, &mut out);
        out
    }

    #[test]
    fn a_task_alone_ends_after_its_duration() {
        let mut l = SharedLinks::new(&[0]);
        assert_eq!(start(&mut l, 100, 0, NVLINK, 7, 1000), vec![(7, 1100)]);
        assert_eq!(finish(&mut l, 1100, 0, 7), vec![]);
    }

    #[test]
    fn two_transfers_on_one_link_share_it() {
        let mut l = SharedLinks::new(&[0]);
        start(&mut l, 0, 0, NET_TX | NET_RX, 1, 1000);
        // At 500 the first has 500 ns of work left; both now move at half speed.
        let ends = start(&mut l, 500, 0, NET_TX | NET_RX, 2, 1000);
        assert_eq!(ends, vec![(1, 1500), (2, 2500)]);
        // When the first finishes, the second has 500 left at full speed: the pair ends at
        // 2000, exactly as one after the other.
        assert_eq!(finish(&mut l, 1500, 0, 1), vec![(2, 2000)]);
    }

    #[test]
    fn full_duplex_directions_and_other_devices_do_not_interfere() {
        let mut l = SharedLinks::new(&[0, 0]);
        start(&mut l, 0, 0, NET_TX, 1, 1000);
        assert_eq!(start(&mut l, 0, 0, NET_RX, 2, 1000), vec![(2, 1000)]);
        assert_eq!(start(&mut l, 0, 1, NET_TX, 3, 1000), vec![(3, 1000)]);
        // A collective on both directions slows both one-way transfers of its device.
        let ends = start(&mut l, 0, 0, NET_TX | NET_RX, 4, 1000);
        assert_eq!(ends, vec![(1, 2000), (2, 2000), (4, 2000)]);
    }

    /// A GEMM of 1,000 ns solo on a 100-SM device; a collective holding 20 CTAs runs from
    /// 200 to 700: the GEMM does 200 ns of work, then 500 ns at 80% (400), then the last 400
    /// at full rate, ending at 1,100. The collective is not slowed.
    #[test]
    fn compute_runs_on_the_sms_a_collective_leaves() {
        let mut l = SharedLinks::new(&[100]);
        assert_eq!(start(&mut l, 0, 0, SMS, 1, 1000), vec![(1, 1000)]);
        // 800 ns of work left at 0.8: 1,000 ns from 200.
        assert_eq!(start_ctas(&mut l, 200, 0, NVLINK, 20, 2, 500), vec![(1, 1200), (2, 700)]);
        assert_eq!(finish(&mut l, 700, 0, 2), vec![(1, 1100)]);
        assert_eq!(finish(&mut l, 1100, 0, 1), vec![]);
        // A compute task that starts while the collective runs is slowed from its start; on a
        // device without an SM count nothing is.
        start_ctas(&mut l, 2000, 0, NVLINK, 20, 3, 1000);
        assert_eq!(start(&mut l, 2000, 0, SMS, 4, 800), vec![(4, 3000)]);
        let mut plain = SharedLinks::new(&[0]);
        start_ctas(&mut plain, 0, 0, NVLINK, 20, 1, 1000);
        assert_eq!(start(&mut plain, 0, 0, SMS, 2, 800), vec![(2, 800)]);
    }

    /// Two collectives' CTAs add up, to at most half the SMs.
    #[test]
    fn collectives_thread_blocks_add_up_to_a_bound() {
        let mut l = SharedLinks::new(&[100]);
        start(&mut l, 0, 0, SMS, 1, 1000);
        start_ctas(&mut l, 0, 0, NVLINK, 30, 2, 10_000);
        let ends = start_ctas(&mut l, 0, 0, NET_TX | NET_RX, 30, 3, 10_000);
        assert_eq!(ends, vec![(1, 2000), (3, 10_000)]);
    }
}
