//! Collective cost models. This is the interface the full interconnect model will fill in;
//! today a collective is an NCCL-style ring with an alpha-beta cost over the slowest link the
//! group crosses.
//!
//! Bus-bandwidth factors follow nccl-tests' `PERFORMANCE.md`: all-gather and reduce-scatter
//! move (n-1)/n of the full buffer through every rank's link, all-reduce 2(n-1)/n.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllGather,
    ReduceScatter,
    AllReduce,
}

/// The links a process group's ring runs over.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    pub ranks: u64,
    /// Ranks of the group that share a node (the ring crosses nodes when ranks > this).
    pub ranks_per_node: u64,
    pub nvlink_bytes_per_s: f64,
    pub network_bytes_per_s: f64,
}

/// Fraction of a link's unidirectional spec a large ring collective reaches: ~80% measured
/// by nccl-tests on A100 and H200 (stas00 ml-engineering `network/README.md`).
pub const LINK_EFFICIENCY: f64 = 0.8;
/// Per-step latency of a ring collective, seconds (NCCL's Simple protocol is a few us per
/// hop; inter-node hops cost more).
pub const ALPHA_INTRA_S: f64 = 5e-6;
pub const ALPHA_INTER_S: f64 = 10e-6;

impl Group {
    /// Bandwidth of the ring's slowest hop, bytes/s: NVLink inside a node, each GPU's share
    /// of the network across nodes.
    pub fn ring_bandwidth(&self) -> f64 {
        let bw = if self.ranks > self.ranks_per_node {
            self.network_bytes_per_s.min(self.nvlink_bytes_per_s)
        } else {
            self.nvlink_bytes_per_s
        };
        bw * LINK_EFFICIENCY
    }

    /// Seconds for a collective whose full (unsharded) buffer is `bytes`.
    pub fn time_s(&self, op: Collective, bytes: u64) -> f64 {
        let n = self.ranks;
        if n <= 1 || bytes == 0 {
            return 0.0;
        }
        let frac = (n - 1) as f64 / n as f64;
        let (factor, steps) = match op {
            Collective::AllGather | Collective::ReduceScatter => (frac, n - 1),
            Collective::AllReduce => (2.0 * frac, 2 * (n - 1)),
        };
        let alpha = if n > self.ranks_per_node { ALPHA_INTER_S } else { ALPHA_INTRA_S };
        steps as f64 * alpha + bytes as f64 * factor / self.ring_bandwidth()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: u64, per_node: u64) -> Group {
        Group { ranks: n, ranks_per_node: per_node, nvlink_bytes_per_s: 450e9, network_bytes_per_s: 50e9 }
    }

    #[test]
    fn all_reduce_costs_twice_an_all_gather_in_bandwidth() {
        let g = group(8, 8);
        let b = 8u64 << 30;
        let ag = g.time_s(Collective::AllGather, b) - 7.0 * ALPHA_INTRA_S;
        let ar = g.time_s(Collective::AllReduce, b) - 14.0 * ALPHA_INTRA_S;
        assert!((ar / ag - 2.0).abs() < 1e-9);
        // 8 GiB * 7/8 over 360 GB/s.
        assert!((ag - (b as f64 * 0.875 / 360e9)).abs() < 1e-12);
    }

    #[test]
    fn crossing_nodes_is_bound_by_the_network() {
        let b = 1u64 << 30;
        assert!(group(16, 8).time_s(Collective::AllGather, b) > 8.0 * group(8, 8).time_s(Collective::AllGather, b));
        assert_eq!(group(1, 8).time_s(Collective::AllReduce, b), 0.0);
    }
}
