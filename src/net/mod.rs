//! Collective cost models: NCCL-style rings with an alpha-beta cost over a two-level topology
//! (NVLink/NVSwitch inside a node, the node's NICs between nodes).
//!
//! Bus-bandwidth factors follow nccl-tests' `PERFORMANCE.md`: all-gather and reduce-scatter
//! move (n-1)/n of the full buffer through every rank's link, all-reduce 2(n-1)/n.
//!
//! Across nodes NCCL runs one ring per NIC rail, so a node's inter-node traffic is spread
//! over all its NICs: for n ranks on k nodes, each GPU's NIC carries (k-1)/n of the buffer
//! per all-gather (the other nodes' shards arriving over this GPU's rail), while NVLink still
//! carries (n-1)/n of it. The two stages pipeline, so the slower one sets the time. This is
//! why nccl-tests' inter-node bus bandwidth exceeds one NIC's rate: measured on 4 nodes of
//! 8 x B200 with 8 x 400 Gb/s EFA, all-reduce busbw is 381.8 GB/s at 16 GiB, i.e. per-GPU
//! inter-node rate busbw (k-1)/(n-1) = 36.9 GB/s, 74% of the 50 GB/s NIC (stas00
//! ml-engineering `network/README.md`; checked in this module's tests).

use serde::Serialize;

pub mod deepep;
pub mod nccl_memory;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllGather,
    ReduceScatter,
    AllReduce,
    /// Each rank sends 1/n of its buffer to every rank (MoE token dispatch and combine).
    AllToAll,
}

/// The links a process group's rings run over.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    pub ranks: u64,
    /// Ranks of the group that share a node.
    pub ranks_per_node: u64,
    /// Intra-node link per GPU, one direction, bytes/s.
    pub nvlink_bytes_per_s: f64,
    /// Each GPU's share of its node's NICs, one direction, bytes/s.
    pub network_bytes_per_s: f64,
    /// The share of that rate large collectives reach, by the node's fabric
    /// ([`NETWORK_EFFICIENCY`], [`IB_NDR_EFFICIENCY`]).
    pub network_efficiency: f64,
    /// The most bus bandwidth NCCL's tuner gives a ring on the LL protocol inside one node,
    /// bytes/s, by GPU generation ([`ll_max_bus_bytes_per_s`]); infinite where unknown.
    pub ll_max_bytes_per_s: f64,
    /// NVLS channels where NCCL may run an all-reduce of this group with NVLink SHARP
    /// ([`nvls_channels`]; the node has NVSwitch multicast and `[nccl] nvls` is on); 0: it
    /// cannot.
    pub nvls_channels: u64,
    /// The NVLS rates of [`NVLS_BY_CHUNK`] (measured on H100) scaled to this GPU
    /// ([`nvls_rate_scale`]).
    pub nvls_rate_scale: f64,
    /// The fewest ranks whose all-reduce runs on NVLS ([`nvls_min_ranks`]).
    pub nvls_min_ranks: u64,
    /// The factor on a multi-node ring all-reduce's latency ([`ring_plateau`]).
    pub ring_plateau: f64,
}

/// NCCL's NVLS (NVLink SHARP) all-reduce inside one NVSwitch node: each GPU reduces its share
/// of the buffer with multimem loads through the switch and broadcasts the result with
/// multimem stores, so NVLink carries each byte about once each way where a ring carries it
/// 2(n-1)/n times. NCCL's tuner (`src/graph/tuning.cc`) prices it at a 25 us latency
/// (`hwLat` NVLINK NVLS Simple) and picks it over the rings from about 1 MB on 8 x H100.
/// Its achieved rate depends on the chunk NCCL cuts the buffer into (`src/enqueue.cc`,
/// NCCL 2.18 to 2.30: 128 KiB, `NCCL_NVLS_CHUNKSIZE`; 64 KiB below 64 chunks per concurrent
/// operation, 32 KiB below 8 of those, 16 KiB below 2 of those, where the concurrent
/// operations are the NVLS channels x the node's GPUs): small chunks pay a fixed cost per
/// chunk. What each chunk size reaches is measured, not derived: see [`NVLS_BY_CHUNK`].
pub const NVLS_LATENCY_S: f64 = 25e-6;

/// NVLS all-reduce on 8 x H100 by NCCL's chunk size: (chunk bytes, latency beyond
/// [`NVLS_LATENCY_S`] in s, bus bandwidth in bytes/s), each the minimax fit of nccl-tests'
/// all_reduce_perf times on one p5.48xlarge node (tests/fixtures/nccl_tests_h100_allreduce.csv)
/// over the sizes NCCL runs at that chunk, from 2 MiB (below it the LL ring is faster): 16 KiB
/// over 2-4 MiB, 32 KiB over 8-32 MiB, 64 KiB over 64-512 MiB, 128 KiB over 1-16 GiB; each
/// within 2.2% of its sizes. The bus bandwidth grows with the chunk (307 to 478 GB/s: the
/// per-chunk synchronisation amortised over more bytes); 128 KiB chunks start about 0.4 ms
/// later than the rate alone gives (the 1 and 2 GiB rows run at 442 GB/s, from 4 GiB 476).
pub const NVLS_BY_CHUNK: [(u64, f64, f64); 4] =
    [(16 << 10, 6.5e-6, 307e9), (32 << 10, 21e-6, 381e9), (64 << 10, 39e-6, 446e9), (128 << 10, 390e-6, 478e9)];

/// The NVLS channels NCCL opens inside one node (`src/transport/nvls.cc`): 16 on Hopper
/// (`NVLS_NCHANNELS_SM90`), 24 on a Blackwell NVSwitch node (`NVLS_NCHANNELS_SM100_NVL`);
/// `compute_capability` as major x 10 + minor.
pub fn nvls_channels(compute_capability: Option<u32>) -> u64 {
    match compute_capability {
        Some(c) if c >= 100 => 24,
        _ => 16,
    }
}

/// The fewest GPUs of a node whose all-reduce NCCL runs on NVLS: measured, nccl-tests bus
/// bandwidth rises above the rings' only from 5 GPUs on H200 and from 6 on B200 (stas00
/// ml-engineering `network/README.md`, as quoted in shared/reference/SEMANTICS.md 5.3).
pub fn nvls_min_ranks(compute_capability: Option<u32>) -> u64 {
    match compute_capability {
        Some(c) if c >= 100 => 6,
        _ => 5,
    }
}

/// The NVLink bandwidth (bytes/s per direction) of the GPU [`NVLS_BY_CHUNK`] was measured
/// on: the H100 SXM's 450 GB/s (`src/hardware`, NVIDIA's datasheet).
pub const NVLS_MEASURED_NVLINK_BYTES_PER_S: f64 = 450e9;

/// NCCL's NVLS efficiency by generation (`nvlsEfficiency` in `src/graph/tuning.cc`): 0.85
/// on Hopper, 0.74 on Blackwell.
fn nvls_efficiency(compute_capability: Option<u32>) -> f64 {
    match compute_capability {
        Some(c) if c >= 100 => 0.74,
        _ => 0.85,
    }
}

/// [`NVLS_BY_CHUNK`]'s rates on another GPU: in proportion to its NVLink bandwidth and to
/// NCCL's NVLS efficiency for its generation ([`nvls_efficiency`]). An assumption: only the
/// H100's are measured.
pub fn nvls_rate_scale(nvlink_bytes_per_s: f64, compute_capability: Option<u32>) -> f64 {
    nvlink_bytes_per_s / NVLS_MEASURED_NVLINK_BYTES_PER_S * nvls_efficiency(compute_capability)
        / nvls_efficiency(Some(90))
}

/// The chunk NCCL cuts an NVLS all-reduce of `bytes` into, `concurrent` = NVLS channels x
/// the node's GPUs (`src/enqueue.cc`).
pub fn nvls_chunk_bytes(bytes: u64, concurrent: u64) -> u64 {
    let mut chunk: u64 = 128 << 10;
    if bytes < 64 * concurrent * chunk {
        chunk = 64 << 10;
    }
    if bytes < 8 * concurrent * chunk {
        chunk = 32 << 10;
    }
    if bytes < 2 * concurrent * chunk {
        chunk = 16 << 10;
    }
    chunk
}

/// NCCL's cap on a single-node ring's LL bus bandwidth (`llMaxBws` in `src/graph/tuning.cc`,
/// `busBw = std::min(llMaxBw, busBw * .5)`): 87.7 GB/s from compute capability 8.0 (Ampere,
/// and the 8.6 and 8.9 parts), 141 from 9.0 (Hopper), 282 from 10.0 (Blackwell), 39 below
/// (Volta). Below its half-link rate on every NVSwitch part (A100: 120 GB/s, H100: 180), so
/// NCCL's LL carries less than half the link and hands over to LL128 at smaller sizes.
/// `compute_capability` as major x 10 + minor; None (an AMD part, which RCCL tunes): no cap.
pub fn ll_max_bus_bytes_per_s(compute_capability: Option<u32>) -> f64 {
    match compute_capability {
        Some(c) if c >= 100 => 282e9,
        Some(c) if c >= 90 => 141e9,
        Some(c) if c >= 80 => 87.7e9,
        Some(_) => 39e9,
        None => f64::INFINITY,
    }
}

/// Fraction of NVLink's unidirectional spec a large ring collective reaches inside a node:
/// 8 x A100 all-reduce busbw 234.9 GB/s of 300 (78%), 8 x H200 ring 367.6 of 450 (82%)
/// (nccl-tests figures in stas00 ml-engineering `network/README.md`).
pub const LINK_EFFICIENCY: f64 = 0.8;
/// Fraction of the NIC rate a large collective reaches across nodes on EFA: 74% (see module
/// doc); taken for every fabric without its own measurement.
pub const NETWORK_EFFICIENCY: f64 = 0.74;
/// The same on InfiniBand NDR (400 Gb/s ConnectX-7): "For NDR @ 400Gbps you should see
/// 46-48GB/s per NIC" (NCCL's maintainer, nvidia/nccl-tests#290, 2025-03): 47 of 50 GB/s.
pub const IB_NDR_EFFICIENCY: f64 = 0.94;
/// Per-step latency, seconds, of what NCCL's tuner does not time here: point-to-point
/// transfers, context parallelism's ring steps, all-to-alls and DeepEP's kernels (a few us
/// on NVLink, more across the network; an assumption of the Simple protocol's order of
/// magnitude). Ring collectives take the tuner's own latencies: [`SIMPLE_BASE_S`],
/// [`LL128_BASE_S`], [`LL_BASE_S`] inside a node, [`SIMPLE_NET_HOP_S`] and
/// [`ring_plateau`] across nodes.
pub const ALPHA_INTRA_S: f64 = 5e-6;
pub const ALPHA_INTER_S: f64 = 10e-6;
/// NCCL's low-latency (LL) protocol, which its tuner picks for small messages: a fixed
/// launch latency plus a short per-hop latency, at half the link bandwidth (each 8-byte
/// line carries 4 bytes of data and a 4-byte flag). Ring LL over NVLink: `baseLat` 6.6 us and
/// `hwLat` 0.6 us per step in NCCL 2.18+'s `src/graph/tuning.cc`. Used inside a node only;
/// it is what a decode step's small tensor-parallel all-reduces run with.
pub const LL_BASE_S: f64 = 6.6e-6;
pub const LL_HOP_S: f64 = 0.6e-6;
pub const LL_BANDWIDTH_FRACTION: f64 = 0.5;
/// NCCL's LL128 protocol on a ring over NVLink, which its tuner picks for mid-sized messages
/// inside a node (tens of KiB to tens of MiB): `baseLat` 14 us and `hwLat` 1.9 us per step,
/// at 0.92 of the link (120 of every 128 bytes carry data) (`src/graph/tuning.cc`,
/// `ncclTopoTuneModel`, NCCL 2.18 to 2.27).
pub const LL128_BASE_S: f64 = 14e-6;
pub const LL128_HOP_S: f64 = 1.9e-6;
pub const LL128_BANDWIDTH_FRACTION: f64 = 0.92;
/// NCCL's Simple protocol on a ring, as its tuner times it: `baseLat` 8.4 us and `hwLat`
/// 3.4 us per step over NVLink (`src/graph/tuning.cc`), inside a node and for a ring's steps
/// that stay inside one across nodes (there the tuner takes the larger of it and 3 x the
/// host's network overhead, 1 us on Intel hosts: NVLink's 3.4 us; 6 us on AMD hosts, not
/// modelled).
pub const SIMPLE_BASE_S: f64 = 8.4e-6;
pub const SIMPLE_NVLINK_HOP_S: f64 = 3.4e-6;
/// The tuner's latency for a Simple ring step that crosses the network: `hwLat` NET Ring
/// Simple 14 us (`tuning.cc`; plus the network plugin's reported latency, which NCCL's
/// InfiniBand transport gives as 0). A ring has `nInterSteps` of them: nodes - 1 per pass.
pub const SIMPLE_NET_HOP_S: f64 = 14e-6;
/// The tuner's "plateau effect of ring": an all-reduce ring across nodes on the Simple
/// protocol takes 1.4 times its latency from compute capability 8.0 (1.9 before)
/// (`ncclTopoGetAlgoTime` in `tuning.cc`, for every size of at least 64 bytes per channel and
/// rank; smaller all-reduces take the tree's LL protocol here, [`TREE_LL_BASE_S`]).
pub fn ring_plateau(compute_capability: Option<u32>) -> f64 {
    match compute_capability {
        Some(c) if c < 80 => 1.9,
        _ => 1.4,
    }
}
/// NCCL's tree all-reduce on the LL protocol, which its tuner picks for small all-reduces
/// across nodes: a chain inside each node and a double binary tree over the nodes, reduced up
/// and broadcast down, so `baseLat` plus twice (the node's chain hops + log2(nodes) network
/// hops) (`src/graph/tuning.cc`, NCCL 2.18+: `baseLat` Tree LL 6.8 us, `hwLat` NVLink Tree LL
/// 0.6 us, NET Tree LL 5.0 us). Used for all-reduces of at most [`TREE_LL_MAX_BYTES`] across
/// nodes, where the ring's latency grows with every rank's step and the tree's with log2 of
/// the nodes: a MoE router's counts of tokens per expert over a whole stage.
pub const TREE_LL_BASE_S: f64 = 6.8e-6;
pub const TREE_LL_NET_HOP_S: f64 = 5.0e-6;
/// The size up to which the tree-LL estimate is taken: NCCL's LL protocol carries messages of
/// a few tens of KiB at most (its tuner moves to LL128 / Simple beyond them); larger
/// all-reduces keep the ring model the throughput suites were fitted with.
pub const TREE_LL_MAX_BYTES: u64 = 64 << 10;

impl Group {
    pub fn nodes(&self) -> u64 {
        self.ranks.div_ceil(self.ranks_per_node.clamp(1, self.ranks.max(1)))
    }

    /// Seconds for a collective whose full (unsharded) buffer is `bytes` (for an
    /// all-to-all: each rank's send buffer, which it also receives).
    pub fn time_s(&self, op: Collective, bytes: u64) -> f64 {
        let n = self.ranks;
        if n <= 1 || bytes == 0 {
            return 0.0;
        }
        if op == Collective::AllToAll {
            return self.all_to_all_s(bytes);
        }
        let k = self.nodes();
        let (passes, steps) = match op {
            Collective::AllGather | Collective::ReduceScatter => (1.0, n - 1),
            Collective::AllReduce => (2.0, 2 * (n - 1)),
            Collective::AllToAll => unreachable!("all-to-all returned above"),
        };
        let s = bytes as f64;
        let g = self.ranks_per_node.min(n);
        // What each rank moves over NVLink, and its time at the ring's share of the link.
        let intra_bytes = if g > 1 { passes * s * (n - 1) as f64 / n as f64 } else { 0.0 };
        let intra = intra_bytes / (self.nvlink_bytes_per_s * LINK_EFFICIENCY);
        let inter = if k > 1 {
            passes * s * (k - 1) as f64 / n as f64 / (self.network_bytes_per_s * self.network_efficiency)
        } else {
            0.0
        };
        if k > 1 {
            // NCCL's ring latency (`tuning.cc`): of the ring's steps, those that cross a node
            // boundary pay the network's latency, the others NVLink's (`nInterSteps`: nodes - 1
            // per pass, twice for an all-reduce), an all-reduce's times its plateau factor.
            let inter_steps = passes as u64 * (k - 1);
            let latency = SIMPLE_BASE_S
                + (steps - inter_steps) as f64 * SIMPLE_NVLINK_HOP_S
                + inter_steps as f64 * SIMPLE_NET_HOP_S;
            let plateau = if op == Collective::AllReduce { self.ring_plateau } else { 1.0 };
            let simple = latency * plateau + intra.max(inter);
            if op == Collective::AllReduce && bytes <= TREE_LL_MAX_BYTES {
                return simple.min(self.tree_ll_all_reduce_s(bytes));
            }
            return simple;
        }
        // Inside a node NCCL's tuner times each ring protocol, its latency and its share of
        // the link (`tuning.cc`), and runs the fastest for the size: LL for small messages,
        // LL128 for mid-sized ones, Simple for large ones.
        let steps = steps as f64;
        let simple = SIMPLE_BASE_S + steps * SIMPLE_NVLINK_HOP_S + intra;
        let ll = LL_BASE_S + steps * LL_HOP_S + intra_bytes / self.ll_bus_bytes_per_s();
        let ll128 = LL128_BASE_S + steps * LL128_HOP_S + intra / LL128_BANDWIDTH_FRACTION;
        let rings = simple.min(ll).min(ll128);
        match self.nvls_all_reduce_s(op, bytes) {
            Some(nvls) => rings.min(nvls),
            None => rings,
        }
    }

    /// An all-reduce inside one node on NVLS ([`NVLS_LATENCY_S`]), where NCCL runs one: on
    /// NVSwitch multicast, from [`nvls_min_ranks`] GPUs.
    fn nvls_all_reduce_s(&self, op: Collective, bytes: u64) -> Option<f64> {
        let n = self.ranks;
        if op != Collective::AllReduce || self.nvls_channels == 0 || n < self.nvls_min_ranks || self.nodes() > 1 {
            return None;
        }
        let chunk = nvls_chunk_bytes(bytes, self.nvls_channels * n);
        let &(_, fill, bus) = NVLS_BY_CHUNK.iter().find(|c| c.0 == chunk)?;
        let bus_bytes = bytes as f64 * 2.0 * (n - 1) as f64 / n as f64;
        Some(NVLS_LATENCY_S + fill + bus_bytes / (bus * self.nvls_rate_scale))
    }

    /// LL's share of the ring's rate inside a node: half (each 8-byte line carries 4 bytes).
    fn ll_link_share(&self) -> f64 {
        self.nvlink_bytes_per_s * LINK_EFFICIENCY * LL_BANDWIDTH_FRACTION
    }

    /// The bus bandwidth of a ring on the LL protocol inside a node: half the link's ring
    /// rate, at most NCCL's cap for the generation ([`ll_max_bus_bytes_per_s`]).
    pub fn ll_bus_bytes_per_s(&self) -> f64 {
        self.ll_link_share().min(self.ll_max_bytes_per_s)
    }

    /// Whether NCCL's LL cap, not half the link, sets the LL rate inside a node.
    pub fn ll_cap_binds(&self) -> bool {
        self.ll_max_bytes_per_s < self.ll_link_share()
    }

    /// A small all-reduce across nodes on NCCL's tree with the LL protocol ([`TREE_LL_BASE_S`]):
    /// the latency of the chain and the tree, up and down, and each byte over the NIC twice at
    /// LL's half rate.
    fn tree_ll_all_reduce_s(&self, bytes: u64) -> f64 {
        let g = self.ranks_per_node.clamp(1, self.ranks);
        let k = self.nodes();
        let tree_hops = u64::from(k.ilog2());
        let latency = TREE_LL_BASE_S + 2.0 * ((g - 1) as f64 * LL_HOP_S + tree_hops as f64 * TREE_LL_NET_HOP_S);
        let wire = 2.0 * bytes as f64 / (self.network_bytes_per_s * self.network_efficiency * LL_BANDWIDTH_FRACTION);
        latency + wire
    }

    /// An all-to-all as NCCL runs it (`ncclSend`/`ncclRecv` to every peer inside one group
    /// call, the way Megatron-Core's `all_to_all` and `torch.distributed.all_to_all_single`
    /// reach it): every peer exchange is in flight at once, so there is one latency, not one
    /// per ring step, plus the LL protocol's per-peer launch cost. Of each rank's buffer, 1/n
    /// stays on the rank, (g-1)/n goes to the other g-1 ranks of its node over NVLink and
    /// (n-g)/n leaves the node over this GPU's NIC rail (NCCL's PXN routes a peer on another
    /// node through the rail-aligned GPU); the two paths run at once, so the slower sets the
    /// time, at the same link and network efficiencies as the rings (an assumption:
    /// nccl-tests' alltoall busbw, factor (n-1)/n, is quoted at about the all-gather's).
    fn all_to_all_s(&self, bytes: u64) -> f64 {
        let n = self.ranks as f64;
        let g = self.ranks_per_node.clamp(1, self.ranks) as f64;
        let s = bytes as f64;
        let intra = s * (g - 1.0) / n / (self.nvlink_bytes_per_s * LINK_EFFICIENCY);
        let inter = s * (n - g) / n / (self.network_bytes_per_s * self.network_efficiency);
        let alpha = if self.nodes() > 1 { ALPHA_INTER_S } else { ALPHA_INTRA_S };
        alpha + (n - 1.0) * LL_HOP_S + intra.max(inter)
    }

    /// nccl-tests' bus bandwidth this model predicts, bytes/s.
    pub fn bus_bandwidth(&self, op: Collective, bytes: u64) -> f64 {
        let n = self.ranks as f64;
        let factor = match op {
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
        };
        bytes as f64 * factor / self.time_s(op, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: u64, per_node: u64, nvlink: f64, net: f64) -> Group {
        Group {
            ranks: n,
            ranks_per_node: per_node,
            nvlink_bytes_per_s: nvlink,
            network_bytes_per_s: net,
            network_efficiency: NETWORK_EFFICIENCY,
            ll_max_bytes_per_s: f64::INFINITY,
            nvls_channels: 0,
            nvls_rate_scale: 1.0,
            nvls_min_ranks: 5,
            ring_plateau: 1.4,
        }
    }

    /// 512 ranks on 64 nodes of 8: a 2 KiB all-reduce (a MoE router's 256 int64 counts) on
    /// NCCL's tree-LL: 6.8 + 2 x (7 x 0.6 + 6 x 5.0) = 75.2 us plus the bytes, where the
    /// ring's 1,022 steps would cost 5.7 ms; past 64 KiB the ring model stands.
    #[test]
    fn small_all_reduces_across_nodes_take_the_tree() {
        let g = group(512, 8, 450e9, 50e9);
        let wire = 2.0 * 2048.0 / (50e9 * NETWORK_EFFICIENCY * 0.5);
        let t = g.time_s(Collective::AllReduce, 2048);
        assert!((t - (75.2e-6 + wire)).abs() < 1e-9, "{t}");
        // Past 64 KiB the ring: 2 x 63 steps cross nodes, the other 2 x 448 stay on NVLink,
        // at NCCL's tuner latencies times its plateau factor.
        let big = g.time_s(Collective::AllReduce, TREE_LL_MAX_BYTES + 1);
        let latency = (SIMPLE_BASE_S + 126.0 * SIMPLE_NET_HOP_S + 896.0 * SIMPLE_NVLINK_HOP_S) * 1.4;
        assert!(big > latency && big < latency + 20e-6, "{big}");
        // Inside a node the LL ring is unchanged.
        let node = group(8, 8, 450e9, 50e9);
        assert!(node.time_s(Collective::AllReduce, 2048) < 20e-6);
    }

    #[test]
    fn all_reduce_costs_twice_an_all_gather_in_bandwidth() {
        let g = group(8, 8, 450e9, 50e9);
        let b = 8u64 << 30;
        let ag = g.time_s(Collective::AllGather, b) - (SIMPLE_BASE_S + 7.0 * SIMPLE_NVLINK_HOP_S);
        let ar = g.time_s(Collective::AllReduce, b) - (SIMPLE_BASE_S + 14.0 * SIMPLE_NVLINK_HOP_S);
        assert!((ar / ag - 2.0).abs() < 1e-9);
        // 8 GiB * 7/8 over 360 GB/s.
        assert!((ag - (b as f64 * 0.875 / 360e9)).abs() < 1e-12);
        assert_eq!(group(1, 8, 450e9, 50e9).time_s(Collective::AllReduce, b), 0.0);
    }

    /// nccl-tests busbw at 16 GiB (stas00 ml-engineering network/README.md): 8 x A100
    /// all-reduce 234.89 GB/s, 8 x H200 ring all-reduce 367.61 GB/s, 4 nodes of 8 x B200 over
    /// 8 x 50 GB/s EFA 381.80 GB/s. Tolerance 5%.
    #[test]
    fn bus_bandwidth_matches_nccl_tests() {
        let b = 16u64 << 30;
        for (name, g, measured) in [
            ("8 x A100", group(8, 8, 300e9, 25e9), 234.89e9),
            ("8 x H200", group(8, 8, 450e9, 50e9), 367.61e9),
            ("4 x 8 B200", group(32, 8, 900e9, 50e9), 381.80e9),
        ] {
            let bw = g.bus_bandwidth(Collective::AllReduce, b);
            println!("{name}: predicted {:.1} GB/s, measured {:.1} GB/s", bw / 1e9, measured / 1e9);
            assert!((bw / measured - 1.0).abs() < 0.05, "{name}: {bw} vs {measured}");
        }
    }

    /// Small messages inside a node run NCCL's LL protocol: an 8-rank all-reduce of one
    /// decode token's hidden state (8192 x 2 B) costs 6.6 + 14 x 0.6 us plus the bytes at
    /// half bandwidth, not the Simple protocol's 14 x 5 us; large ones stay on Simple.
    #[test]
    fn small_messages_inside_a_node_take_the_low_latency_protocol() {
        let g = group(8, 8, 300e9, 25e9);
        let wire = |b: u64, share: f64| 2.0 * b as f64 * 7.0 / 8.0 / (300e9 * LINK_EFFICIENCY * share);
        let b = 8192 * 2;
        let t = g.time_s(Collective::AllReduce, b);
        assert!((t - (6.6e-6 + 14.0 * 0.6e-6 + wire(b, LL_BANDWIDTH_FRACTION))).abs() < 1e-12, "{t}");
        // 8 MiB: LL128, 107 us, its latency under Simple's (117 us) and most of the link where
        // LL has half of it (137 us).
        let mid = 8u64 << 20;
        let ll128 = 14e-6 + 14.0 * 1.9e-6 + wire(mid, 0.92);
        assert!((g.time_s(Collective::AllReduce, mid) - ll128).abs() < 1e-12);
        // 1 GiB: Simple, its 8.4 us and 3.4 us per step against the whole link share.
        let big = 1u64 << 30;
        let simple = 8.4e-6 + 14.0 * 3.4e-6 + wire(big, 1.0);
        assert!((g.time_s(Collective::AllReduce, big) - simple).abs() < 1e-12);
    }

    /// NCCL caps a ring's LL bus bandwidth by generation (`llMaxBws`): on 8 H100s LL carries
    /// 141 GB/s, not half of the 360 GB/s the link gives rings, so a 128 KiB all-reduce,
    /// which LL still wins, takes its bytes at 141 GB/s; an A100 node's cap is 87.7 GB/s,
    /// and a part NCCL does not tune (the ROCm one) has none.
    #[test]
    fn ll_bandwidth_is_capped_by_generation() {
        let g = Group { ll_max_bytes_per_s: ll_max_bus_bytes_per_s(Some(90)), ..group(8, 8, 450e9, 50e9) };
        let b = 128u64 << 10;
        let bus = 2.0 * b as f64 * 7.0 / 8.0;
        let ll = 6.6e-6 + 14.0 * 0.6e-6 + bus / 141e9;
        let ll128 = 14e-6 + 14.0 * 1.9e-6 + bus / (450e9 * LINK_EFFICIENCY * 0.92);
        assert!(ll < ll128, "LL still wins at 128 KiB");
        assert!((g.time_s(Collective::AllReduce, b) - ll).abs() < 1e-12);
        let uncapped = group(8, 8, 450e9, 50e9).time_s(Collective::AllReduce, b);
        assert!(uncapped < ll);
        assert_eq!(ll_max_bus_bytes_per_s(Some(80)), 87.7e9);
        assert_eq!(ll_max_bus_bytes_per_s(Some(100)), 282e9);
        assert_eq!(ll_max_bus_bytes_per_s(None), f64::INFINITY);
    }

    /// NCCL's chunk rule on 8 H100 (16 channels x 8 GPUs concurrent): 128 KiB from 1 GiB,
    /// 64 KiB from 64 MiB, 32 KiB from 8 MiB, 16 KiB below. NVLS times only all-reduces of 5
    /// or more GPUs inside one node, and only where faster than the rings: a 1 GiB all-reduce
    /// at 128 KiB chunks, a 64 KiB one on the LL ring.
    #[test]
    fn nvls_takes_large_all_reduces_of_a_node_at_its_chunk_rate() {
        const MIB: u64 = 1 << 20;
        let ops = 16 * 8;
        assert_eq!(nvls_chunk_bytes(1024 * MIB, ops), 128 << 10);
        assert_eq!(nvls_chunk_bytes(1024 * MIB - 1, ops), 64 << 10);
        assert_eq!(nvls_chunk_bytes(64 * MIB, ops), 64 << 10);
        assert_eq!(nvls_chunk_bytes(64 * MIB - 1, ops), 32 << 10);
        assert_eq!(nvls_chunk_bytes(8 * MIB, ops), 32 << 10);
        assert_eq!(nvls_chunk_bytes(8 * MIB - 1, ops), 16 << 10);
        let nvls = |n: u64, per_node: u64| Group {
            nvls_channels: 16,
            ll_max_bytes_per_s: ll_max_bus_bytes_per_s(Some(90)),
            ..group(n, per_node, 450e9, 50e9)
        };
        let rings = |n: u64, per_node: u64| Group { nvls_channels: 0, ..nvls(n, per_node) };
        let b = 1024 * MIB;
        let expect = NVLS_LATENCY_S + 390e-6 + b as f64 * 2.0 * 7.0 / 8.0 / 478e9;
        assert!((nvls(8, 8).time_s(Collective::AllReduce, b) - expect).abs() < 1e-12);
        assert!(nvls(8, 8).time_s(Collective::AllReduce, b) < rings(8, 8).time_s(Collective::AllReduce, b));
        for (n, per_node, op) in [
            (4, 4, Collective::AllReduce),
            (16, 8, Collective::AllReduce),
            (8, 8, Collective::AllGather),
            (8, 8, Collective::ReduceScatter),
        ] {
            assert_eq!(nvls(n, per_node).time_s(op, b), rings(n, per_node).time_s(op, b), "{n} {per_node} {op:?}");
        }
        let small = 64 << 10;
        assert_eq!(nvls(8, 8).time_s(Collective::AllReduce, small), rings(8, 8).time_s(Collective::AllReduce, small));
        assert_eq!((nvls_channels(Some(90)), nvls_channels(Some(100))), (16, 24));
        assert_eq!((nvls_min_ranks(Some(90)), nvls_min_ranks(Some(100))), (5, 6));
        assert!((nvls_rate_scale(900e9, Some(100)) - 2.0 * 0.74 / 0.85).abs() < 1e-12);
    }

    /// An 8-rank all-to-all inside a node moves 7/8 of each buffer over NVLink; across 8
    /// nodes with one rank each every byte but 1/8 leaves through the NIC.
    #[test]
    fn all_to_all_moves_what_leaves_the_rank_over_its_links() {
        let b = 1u64 << 30;
        let one = group(8, 8, 450e9, 50e9).time_s(Collective::AllToAll, b);
        let want = ALPHA_INTRA_S + 7.0 * LL_HOP_S + b as f64 * 7.0 / 8.0 / (450e9 * LINK_EFFICIENCY);
        assert!((one - want).abs() < 1e-12, "{one} {want}");
        let spread = group(8, 1, 450e9, 50e9).time_s(Collective::AllToAll, b);
        let want = ALPHA_INTER_S + 7.0 * LL_HOP_S + b as f64 * 7.0 / 8.0 / (50e9 * NETWORK_EFFICIENCY);
        assert!((spread - want).abs() < 1e-12);
        // 64 ranks on 8 nodes: 56/64 of the buffer crosses the NIC, 7/64 stays on NVLink.
        let big = group(64, 8, 450e9, 50e9).time_s(Collective::AllToAll, b);
        let want = ALPHA_INTER_S + 63.0 * LL_HOP_S + b as f64 * 56.0 / 64.0 / (50e9 * NETWORK_EFFICIENCY);
        assert!((big - want).abs() < 1e-12);
        assert_eq!(group(1, 8, 450e9, 50e9).time_s(Collective::AllToAll, b), 0.0);
    }

    #[test]
    fn crossing_nodes_is_bound_by_the_nics_of_the_whole_node() {
        let b = 1u64 << 30;
        let one = group(8, 8, 450e9, 50e9).time_s(Collective::AllGather, b);
        let two = group(16, 8, 450e9, 50e9).time_s(Collective::AllGather, b);
        // Inter-node: 1/16 of the buffer per NIC at 37 GB/s vs 7/8 over 360 GB/s NVLink.
        assert!(two > one && two < 2.5 * one, "{one} {two}");
        // One GPU per node (the replica group of hybrid sharding): every byte crosses a NIC.
        let rep = group(4, 1, 450e9, 50e9).time_s(Collective::AllReduce, b);
        let latency = (SIMPLE_BASE_S + 6.0 * SIMPLE_NET_HOP_S) * 1.4;
        assert!((rep - (latency + 2.0 * 0.75 * b as f64 / 37e9)).abs() < 1e-6);
    }
}
