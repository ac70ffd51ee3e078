//! The device memory NCCL allocates for its communicators, which PyTorch's caching allocator
//! never sees (it shows in `nvidia-smi`, not in `max_memory_reserved`).
//!
//! Read in NVIDIA/nccl at commit 5067397c (2.30.7), with version boundaries from its history:
//! - **Connection buffers** (`computeBuffSizes`, src/init.cc; `include/device.h`): every
//!   connection of a channel to a peer holds the three protocols' buffers together, LL
//!   512 KiB, LL128 4,915,200 B and SIMPLE 4 MiB (`NCCL_BUFFSIZE`). Over NVLink (p2p
//!   transport, `p2pSendSetup` / `p2pRecvSetup`, src/transport/p2p.cc) the receiver holds
//!   all three (10 MiB once rounded to the 2 MiB IPC / cuMem granularity) and the sender
//!   2 MiB of control memory, except between two A100s, which use P2P read: 6 MiB each side.
//!   Over the network with GPUDirect RDMA (`sendProxyConnect` / `recvProxyConnect`,
//!   src/transport/net.cc) each side holds about 9.2 MiB (10 MiB under cuMem).
//! - **Channels**: the topology search gives 24 ring channels inside an 8-GPU NVSwitch node
//!   (logged on A100 and H100: nccl-tests#100, nccl#1410) and 16 across H100 nodes
//!   (nccl#1453); `p2pnChannels` is the next power of two, and point-to-point uses all of
//!   them per peer inside a node (`ncclTopoComputeP2pChannels`, src/graph/paths.cc). Across
//!   nodes point-to-point goes through shared pools of p2pnChannels x 16 x 128 KiB per
//!   direction; a communicator that spans nodes is counted as if all its peers were remote.
//!   Nodes without NVSwitch (DGX-1, PCIe) are assumed to run 8 channels.
//! - **Which connections exist**: since NCCL 2.22 with cuMem on every rank
//!   (`NCCL_RUNTIME_CONNECT=1`, src/init.cc; `ncclCollPreconnect`, src/group.cc) a
//!   communicator connects an algorithm's channels when a collective first uses it: the ring
//!   for all-gather / reduce-scatter / all-reduce, the tree for all-reduces across nodes,
//!   NVLS (NVSwitch multicast, H100 and later) for all-reduces inside a node. Before, or
//!   without cuMem, ring, tree and NVLS are all connected at init, with a shared network
//!   send pool of p2pnChannels x 16 x 512 KiB, allocated even inside one node.
//!   Point-to-point connections (pipeline sends, ring attention, MoE all-to-all) are always
//!   made on first use, for every channel of that peer (`enqueue.cc`).
//! - **Fixed per communicator under cuMem** (`ncclCuMemAlloc` rounds every device allocation
//!   to 2 MiB, on by default since 2.19.1): 3 allocations per initialised channel
//!   (`initChannel`, src/channel.cc) and 2 for the device communicator (`devCommSetup`);
//!   with NVLS, 16 peer structures and a credit buffer at init, and when first used a data
//!   buffer of heads x 16 channels x 2 x 8 x 128 KiB = 256 MiB on an 8-GPU node.
//!
//! Checked against nccl#964 (4 x A100 over NVLink, NCCL before runtime connect and cuMem,
//! after one all-reduce): 544 MB for a 2-rank communicator and 688 MB for a larger one on
//! rank 0, the tree's root (this module's tests).

use serde::Serialize;

const MIB: u64 = 1 << 20;
/// The granularity of cuMem allocations and of CUDA IPC buffers (`CUDA_IPC_MIN`).
const GRANULE: u64 = 2 * MIB;
const LL: u64 = 8 * 512 * 8 * 16;
const LL128: u64 = 120 * 640 * 8 * 8;
const SIMPLE: u64 = 4 * MIB;
/// `ncclSendMem` / `ncclRecvMem`.
const CONTROL: u64 = 4096;
/// A point-to-point chunk of the shared network pools: 512 KiB at init (eager), 128 KiB for
/// lazily connected sends over the network.
const NET_POOL_CHUNK: u64 = 512 << 10;
const NET_P2P_CHUNK: u64 = 128 << 10;
/// `NVLS_CHUNKSIZE` x 8 slots x 2 directions per channel and head, 16 NVLS channels.
const NVLS_DATA_PER_HEAD: u64 = 16 * 2 * 8 * (128 << 10);
const NVLS_CHANNELS: u64 = 16;

/// The NCCL build and settings a job runs with (`[nccl]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct NcclConfig {
    /// `NCCL_RUNTIME_CONNECT` (NCCL >= 2.22): connect an algorithm when first used.
    pub runtime_connect: bool,
    /// `NCCL_CUMEM_ENABLE` (on by default since 2.19.1): 2 MiB-granular allocations.
    pub cumem: bool,
    /// `NCCL_NVLS_ENABLE`: NVSwitch multicast for all-reduces inside a node, where the
    /// fabric has it (H100 and later on NVSwitch).
    pub nvls: bool,
}

impl NcclConfig {
    /// What PyTorch 2.15's NCCL does by default on hardware with (`nvls_capable`) or without
    /// NVSwitch multicast.
    pub fn default_for(nvls_capable: bool) -> NcclConfig {
        NcclConfig { runtime_connect: true, cumem: true, nvls: nvls_capable }
    }

    /// Connections are made when first used (both settings are needed).
    fn lazy(&self) -> bool {
        self.runtime_connect && self.cumem
    }
}

/// Ring channels NCCL's topology search gives (see the module doc), inside a node and for a
/// communicator across nodes: 24 and 16 on NVSwitch nodes, 8 elsewhere (an assumption).
pub fn ring_channels(nvswitch: bool) -> (u64, u64) {
    if nvswitch {
        (24, 16)
    } else {
        (8, 8)
    }
}

/// The GPU fabric a communicator's channels run over.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fabric {
    /// Ring channels inside one node, and for a communicator that spans nodes.
    pub ring_channels_intra: u64,
    pub ring_channels_inter: u64,
    /// NVLink P2P read (two A100s): the SIMPLE buffer moves to the sender.
    pub p2p_read: bool,
    pub nvls_capable: bool,
    /// GPUs per node (NVLS heads).
    pub gpus_per_node: u64,
}

/// What a communicator is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Traffic {
    /// All-gathers, reduce-scatters or broadcasts; with all-reduces when `all_reduce`.
    Collectives { all_reduce: bool },
    /// Sends to and receives from this many peers.
    PointToPoint { send_peers: u64, recv_peers: u64 },
}

/// A rank's position in the tree of an all-reduce: the root and the leaves hold one of the
/// two extra connections per channel, the ranks between both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreePosition {
    Root,
    Middle,
}

/// One NCCL communicator of one rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Communicator {
    /// The process group, as the report names it.
    pub name: String,
    pub ranks: u64,
    /// Some of its ranks are on other nodes.
    pub spans_nodes: bool,
    pub traffic: Traffic,
}

fn round(bytes: u64, cumem: bool) -> u64 {
    if cumem {
        bytes.div_ceil(GRANULE) * GRANULE
    } else {
        bytes
    }
}

impl Communicator {
    /// Device bytes this rank's copy of the communicator holds.
    pub fn bytes(&self, f: &Fabric, cfg: &NcclConfig, tree: TreePosition) -> u64 {
        if self.ranks < 2 {
            return 0;
        }
        let channels = if self.spans_nodes { f.ring_channels_inter } else { f.ring_channels_intra };
        let p2p_channels = channels.next_power_of_two();
        // Bytes of one connection's send and receive sides.
        let (send, recv) = if self.spans_nodes {
            (round(CONTROL + LL128 + SIMPLE, cfg.cumem), round(CONTROL + LL + LL128 + SIMPLE, cfg.cumem))
        } else if f.p2p_read {
            (round(CONTROL + SIMPLE, true), round(CONTROL + LL + LL128, true))
        } else {
            (round(CONTROL, true), round(CONTROL + LL + LL128 + SIMPLE, true))
        };
        let pair = send + recv;
        let mut total = 0;
        if cfg.cumem {
            // Three allocations per initialised channel, two for the device communicator.
            total += GRANULE * (2 + 3 * channels.max(p2p_channels));
        }
        let nvls = cfg.nvls && f.nvls_capable && !self.spans_nodes && self.ranks > 2;
        if nvls {
            // nvlsDevPeers and the credit buffer, at init even when connecting lazily.
            total += GRANULE * (NVLS_CHANNELS + 1);
        }
        let ring = channels * pair;
        let tree = match (self.ranks, tree) {
            (0..=2, _) => 0,
            (_, TreePosition::Root) => channels * recv,
            (_, TreePosition::Middle) => channels * pair,
        };
        let nvls_data = if nvls { f.gpus_per_node.min(self.ranks) * NVLS_DATA_PER_HEAD } else { 0 };
        if !cfg.lazy() {
            // Everything at init, whatever the group will run.
            total += ring + tree + nvls_data + p2p_channels * 16 * NET_POOL_CHUNK;
        } else if let Traffic::Collectives { all_reduce } = self.traffic {
            total += ring;
            if all_reduce && self.spans_nodes {
                total += tree;
            }
            if all_reduce {
                total += nvls_data;
            }
        }
        if let Traffic::PointToPoint { send_peers, recv_peers } = self.traffic {
            if self.spans_nodes {
                // Shared pools per direction, once; LL buffers are not allocated.
                let pool = p2p_channels * 16 * NET_P2P_CHUNK;
                total += if send_peers > 0 { pool } else { 0 } + if recv_peers > 0 { pool } else { 0 };
            } else {
                total += p2p_channels * (send_peers * send + recv_peers * recv);
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100(channels: u64) -> Fabric {
        Fabric {
            ring_channels_intra: channels,
            ring_channels_inter: 16,
            p2p_read: true,
            nvls_capable: false,
            gpus_per_node: 4,
        }
    }

    /// nccl#964: 4 x A100 over NVLink, PyTorch's NCCL of 2023 (no runtime connect, no cuMem),
    /// after one 4 MB all-reduce: 544 MB per 2-rank communicator, 688 MB for a larger one on
    /// rank 0 (the tree's root). With 24 channels: 24 x (6 + 6) MiB of ring connections and a
    /// 32 x 16 x 512 KiB shared network pool = 544 MiB; the root's tree adds 24 x 6 MiB.
    #[test]
    fn eager_a100_communicators_match_nccl_964() {
        let cfg = NcclConfig { runtime_connect: false, cumem: false, nvls: false };
        let comm = |ranks| Communicator {
            name: "g".into(),
            ranks,
            spans_nodes: false,
            traffic: Traffic::Collectives { all_reduce: true },
        };
        assert_eq!(comm(2).bytes(&a100(24), &cfg, TreePosition::Root), 544 * MIB);
        assert_eq!(comm(4).bytes(&a100(24), &cfg, TreePosition::Root), 688 * MIB);
        assert_eq!(comm(4).bytes(&a100(24), &cfg, TreePosition::Middle), 832 * MIB);
    }

    /// H100 x 8 with NCCL >= 2.22 defaults: a data-parallel communicator that all-reduces
    /// holds 196 MiB of channel structures, 34 MiB of NVLS setup, 24 x 12 MiB of ring
    /// connections and 256 MiB of NVLS buffers; one that only all-gathers and
    /// reduce-scatters has no NVLS buffer. A 2-rank pipeline communicator that sends and
    /// receives holds 32 channels x 12 MiB.
    #[test]
    fn lazy_h100_communicators() {
        let f = Fabric {
            ring_channels_intra: 24,
            ring_channels_inter: 16,
            p2p_read: false,
            nvls_capable: true,
            gpus_per_node: 8,
        };
        let cfg = NcclConfig::default_for(true);
        let c = |traffic| Communicator { name: "g".into(), ranks: 8, spans_nodes: false, traffic };
        let ar = c(Traffic::Collectives { all_reduce: true }).bytes(&f, &cfg, TreePosition::Middle);
        assert_eq!(ar, (196 + 34 + 288 + 256) * MIB);
        let ag = c(Traffic::Collectives { all_reduce: false }).bytes(&f, &cfg, TreePosition::Middle);
        assert_eq!(ag, (196 + 34 + 288) * MIB);
        let pp = Communicator {
            name: "pp".into(),
            ranks: 2,
            spans_nodes: false,
            traffic: Traffic::PointToPoint { send_peers: 1, recv_peers: 1 },
        };
        assert_eq!(pp.bytes(&f, &cfg, TreePosition::Middle), (196 + 32 * 12) * MIB);
        // One GPU per communicator: nothing.
        let one = Communicator { ranks: 1, ..pp };
        assert_eq!(one.bytes(&f, &cfg, TreePosition::Middle), 0);
    }
}
