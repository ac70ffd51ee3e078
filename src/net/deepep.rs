//! DeepEP's normal (high-throughput) dispatch and combine kernels, as Megatron-Core's flex
//! token dispatcher runs them (`--moe-token-dispatcher-type flex
//! --moe-flex-dispatcher-backend deepep`; `megatron/core/transformer/moe/fused_a2a.py`,
//! DeepEP's legacy `Buffer`, deepseek-ai/DeepEP dd758ca `csrc/legacy/`).
//!
//! Where NCCL's all-to-all moves every (token, expert) copy, DeepEP moves a token once per
//! rank it reaches inside a node, and across nodes once per node: over RDMA to the GPU of the
//! same local index on each node its experts live on, which forwards it over NVLink to the
//! ranks there. Group-limited routing (DeepSeek-V3's node-limited routing, Megatron's
//! `--moe-router-num-groups` / `--moe-router-group-topk`) bounds the nodes a token reaches.
//! The kernels run on a fixed number of SMs (Megatron's default 20).
//!
//! Rates: what DeepEP's own benchmark measures on H800 with CX7 400 Gb/s NICs in the
//! DeepSeek-V3 setting (docs/legacy.md "Normal kernels with NVLink and RDMA forwarding":
//! 4096 tokens, hidden 7168, top-4 groups, top-8 experts; EP 64 dispatch 51 GB/s, combine
//! 50 GB/s of "logical" RDMA bandwidth, which counts a token's own node among the nodes it
//! is sent to). Of those logical bytes, the remote share (7 of 8 nodes by symmetry) crosses
//! the NIC: 51 x 7/8 = 44.6 GB/s of 50, [`DEEPEP_RDMA_EFFICIENCY`]. NVLink forwarding runs
//! at the links' efficiency of the rings ([`super::LINK_EFFICIENCY`]); DeepEP's intranode
//! figure, 153-158 GB/s of ~160, is of that order. tests/deepep.rs checks the whole table.

use super::{Group, ALPHA_INTER_S, ALPHA_INTRA_S, LINK_EFFICIENCY};

/// The share of a NIC's rate DeepEP's internode kernels move across nodes: 51 GB/s logical
/// at EP 64 x 7/8 remote, over 50 GB/s (see the module doc).
pub const DEEPEP_RDMA_EFFICIENCY: f64 = 51.0 * 7.0 / 8.0 / 50.0;

/// GPUs of a node DeepEP's kernels forward among (`LEGACY_NUM_MAX_NVL_PEERS`).
pub const NVL_PEERS: u64 = 8;

/// The EP sizes DeepEP has a configuration for (`Buffer.get_dispatch_config`; others fail
/// its assertion "Unsupported number of EP ranks"), with the dispatch and combine configs'
/// NVLink and RDMA receive chunks in tokens (`Config(num_sms, nvl_send, nvl_recv,
/// rdma_send, rdma_recv)`: only the receive sizes size the buffers; `Config`'s constructor
/// rounds the RDMA one up to a multiple of the RDMA send chunk).
/// (EP ranks, dispatch (NVLink, RDMA) receive tokens, combine (NVLink, RDMA) receive tokens).
type RankConfig = (u64, (u64, u64), (u64, u64));

const CONFIGS: [RankConfig; 12] = [
    (2, (256, 132), (256, 132)),
    (4, (256, 132), (256, 132)),
    (8, (256, 132), (256, 132)),
    (16, (288, 140), (288, 132)),
    (24, (288, 128), (288, 128)),
    (32, (288, 128), (288, 128)),
    (48, (288, 128), (288, 128)),
    (64, (288, 128), (288, 128)),
    (96, (480, 132), (480, 128)),
    (128, (560, 132), (560, 128)),
    (144, (720, 132), (720, 128)),
    (160, (720, 132), (720, 128)),
];

/// The EP sizes DeepEP accepts.
pub fn supported_ranks() -> Vec<u64> {
    CONFIGS.iter().map(|c| c.0).collect()
}

/// DeepEP dispatch and combine over one expert-parallel group: the routing that decides
/// where a token goes, and the SMs the kernels run on.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeepEp {
    pub experts: u64,
    pub top_k: u64,
    /// Expert groups (consecutive experts) and how many of them a token may use: DeepSeek's
    /// `n_group` / `topk_group`, Megatron's `--moe-router-num-groups` /
    /// `--moe-router-group-topk`; 1 / 1 without group-limited routing.
    pub groups: u64,
    pub group_topk: u64,
    /// SMs the kernels hold (Megatron `--moe-flex-dispatcher-num-sms`, default 20).
    pub sms: u64,
    /// Under uneven routing, each expert's share of the token copies
    /// ([`crate::schedule::routing::Routing::expert_shares`]); None under uniform routing.
    #[serde(skip)]
    pub shares: Option<std::sync::Arc<[f64]>>,
}

/// Where one token goes, on average, under uniform routing over an expert-parallel group:
/// how many ranks and nodes it reaches, and of those nodes how many are not its own (by
/// symmetry its own node is among them with the chance any one node is).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fanout {
    pub ranks: f64,
    pub nodes: f64,
    pub remote_nodes: f64,
}

/// ln C(n, r).
fn ln_choose(n: u64, r: u64) -> f64 {
    if r > n {
        return f64::NEG_INFINITY;
    }
    let r = r.min(n - r);
    (0..r).map(|i| ((n - i) as f64).ln() - ((i + 1) as f64).ln()).sum()
}

impl DeepEp {
    /// The chance that a token's `top_k` experts include one of the experts `lo..hi`.
    /// Routing is uniform: the token picks `group_topk` of the `groups` groups, equally
    /// likely, then `top_k` distinct experts equally likely among the picked groups'.
    pub fn hit_probability(&self, lo: u64, hi: u64) -> f64 {
        let (e, k, g, gk) = (self.experts, self.top_k, self.groups.max(1), self.group_topk.max(1));
        let size = e / g;
        let pool = gk * size;
        // The groups experts lo..hi touch, and how many of its experts lie in each.
        let touched: Vec<u64> =
            (lo / size..hi.div_ceil(size)).map(|j| hi.min((j + 1) * size) - lo.max(j * size)).collect();
        let t = touched.len();
        // count[j][c]: subsets of j touched groups holding c of the experts.
        let span = (hi - lo) as usize;
        let mut count = vec![vec![0.0f64; span + 1]; t + 1];
        count[0][0] = 1.0;
        for (i, &c) in touched.iter().enumerate() {
            for j in (0..=i).rev() {
                for s in (0..=span - c as usize).rev() {
                    let x = count[j][s];
                    if x > 0.0 {
                        count[j + 1][s + c as usize] += x;
                    }
                }
            }
        }
        let ln_all = ln_choose(g, gk);
        let ln_pool = ln_choose(pool, k);
        let mut miss = 0.0;
        for (j, row) in count.iter().enumerate() {
            // A given set of j touched groups picked and the other gk - j from the untouched.
            let p_set = (ln_choose(g - t as u64, gk.saturating_sub(j as u64)) - ln_all).exp();
            if j as u64 > gk || p_set == 0.0 {
                continue;
            }
            for (c, &n) in row.iter().enumerate() {
                if n > 0.0 {
                    miss += n * p_set * (ln_choose(pool - c as u64, k) - ln_pool).exp();
                }
            }
        }
        (1.0 - miss).clamp(0.0, 1.0)
    }

    /// [`Self::hit_probability`] under uneven routing: experts `lo..hi` hold `w` times their
    /// uniform share of the copies, and a token misses them as it would miss `w` independent
    /// sets of uniform share each, `(1 - p)^w`. Exact at `w = 1`, `w` times the uniform
    /// chance while hits are rare, and never past 1: a token that picks several of a hot
    /// rank's experts still reaches the rank once. (The routing model gives each expert's
    /// share of the copies, not which experts a token picks together; this is the stated
    /// assumption that joins them.)
    pub fn skewed_hit_probability(&self, lo: u64, hi: u64, shares: &[f64]) -> f64 {
        let uniform = self.hit_probability(lo, hi);
        let share: f64 = shares[lo as usize..hi as usize].iter().sum();
        let w = share * self.experts as f64 / (hi - lo).max(1) as f64;
        1.0 - (1.0 - uniform).powf(w)
    }

    /// Under uneven routing: the chance a token reaches the busiest rank and the busiest
    /// node, and the busiest rank's copies over a rank's own (`ep` x its experts' share).
    pub fn busiest(&self, ep: u64, per_node: u64) -> Option<(f64, f64, f64)> {
        let shares = self.shares.as_deref()?;
        let ep = ep.max(1);
        let per_node = per_node.clamp(1, ep);
        let (er, en) = (self.experts / ep, self.experts * per_node / ep);
        let rank_hit = (0..ep).map(|r| self.skewed_hit_probability(r * er, (r + 1) * er, shares)).fold(0.0, f64::max);
        let node_hit = (0..ep.div_ceil(per_node))
            .map(|n| self.skewed_hit_probability(n * en, ((n + 1) * en).min(self.experts), shares))
            .fold(0.0, f64::max);
        let busiest_share =
            (0..ep).map(|r| shares[(r * er) as usize..((r + 1) * er) as usize].iter().sum::<f64>()).fold(0.0, f64::max);
        Some((rank_hit, node_hit, (ep as f64 * busiest_share).max(1e-12)))
    }

    /// The fan-out over `ep` ranks, `per_node` of them to a node, each holding its
    /// consecutive experts (Megatron's expert placement).
    ///
    /// Under uneven routing ([`Self::shares`]) it is the busiest receiver's: every rank sends
    /// its own tokens, the rank (and the node) whose experts draw the most tokens receives
    /// the most, and the dispatch lasts until it has. The schedule costs an uneven
    /// all-to-all with the busiest rank's copies ([`crate::schedule::routing`]), `ep` x the
    /// busiest rank's share of a rank's own, so the fan-out is divided by that: with it,
    /// [`Self::time_s`] moves a rank's own tokens to the busiest receiver's reach.
    pub fn fanout(&self, ep: u64, per_node: u64) -> Fanout {
        let ep = ep.max(1);
        let per_node = per_node.clamp(1, ep);
        let nodes = ep.div_ceil(per_node);
        let (er, en) = (self.experts / ep, self.experts * per_node / ep);
        let node_range = |n: u64| (n * en, ((n + 1) * en).min(self.experts));
        if let Some((rank_hit, node_hit, load)) = self.busiest(ep, per_node) {
            let node_hits = nodes as f64 * node_hit / load;
            return Fanout {
                ranks: ep as f64 * rank_hit / load,
                nodes: node_hits,
                remote_nodes: node_hits * (1.0 - 1.0 / nodes as f64),
            };
        }
        let ranks: f64 = (0..ep).map(|r| self.hit_probability(r * er, (r + 1) * er)).sum();
        let node_hits: f64 = (0..nodes)
            .map(|n| {
                let (lo, hi) = node_range(n);
                self.hit_probability(lo, hi)
            })
            .sum();
        Fanout { ranks, nodes: node_hits, remote_nodes: node_hits * (1.0 - 1.0 / nodes as f64) }
    }

    /// Seconds for one dispatch (or combine) over `g` of a rank's tokens whose per-copy
    /// all-to-all would move `copy_bytes` (tokens x top_k x hidden x dtype): across nodes the
    /// slower of the RDMA sends (a token once per other node it reaches) and the NVLink side
    /// (a token once per rank it reaches); inside one node the NVLink side only. The NVLink
    /// side counts a token for its own rank too: DeepEP's kernels pass every token through
    /// the receiving ranks' NVLink buffers, the own rank's included, and its benchmark
    /// (`nvl_recv_bytes`, every token a rank receives) reaches 153-158 GB/s of that on
    /// H800's ~160.
    /// `f` is [`DeepEp::fanout`] over `g`.
    pub fn time_s(&self, f: &Fanout, g: &Group, copy_bytes: u64) -> f64 {
        if g.ranks <= 1 || copy_bytes == 0 {
            return 0.0;
        }
        let token_bytes = copy_bytes as f64 / self.top_k.max(1) as f64;
        let nvlink = g.nvlink_bytes_per_s * LINK_EFFICIENCY;
        let nvl = token_bytes * f.ranks / nvlink;
        if g.nodes() <= 1 {
            return ALPHA_INTRA_S + nvl;
        }
        let rdma = token_bytes * f.remote_nodes / (g.network_bytes_per_s * DEEPEP_RDMA_EFFICIENCY);
        ALPHA_INTER_S + rdma.max(nvl)
    }

    /// Bytes of the buffers DeepEP's `Buffer` holds on each GPU outside PyTorch's allocator
    /// for `ep` ranks and tokens of `hidden_bytes` (Megatron's `get_buffer`: hidden x
    /// max(element size, 2)): the NVLink buffer (`cudaMalloc`, shared by IPC) and, past one
    /// node, the RDMA buffer (NVSHMEM), each the larger of the dispatch and combine configs'
    /// `get_nvl_buffer_size_hint` / `get_rdma_buffer_size_hint` (csrc/legacy/config.hpp:
    /// per channel (SMs / 2) and peer, receive chunks of the token, its 8-byte source meta,
    /// 128 top-k indices (int64) and weights and 128 scales (FP32)). None: an EP size DeepEP
    /// has no configuration for.
    pub fn buffer_bytes(&self, ep: u64, hidden_bytes: u64) -> Option<u64> {
        let &(_, d, c) = CONFIGS.iter().find(|x| x.0 == ep)?;
        const META: u64 = 8;
        const TOPK: u64 = 128;
        let channels = self.sms / 2;
        let nvl_ranks = ep.min(NVL_PEERS);
        let rdma_ranks = (ep / NVL_PEERS).max(1);
        let align = |x: u64| x.div_ceil(128) * 128;
        let per_token = hidden_bytes + META + TOPK * 8 + TOPK * 4 + TOPK * 4;
        let nvl = |recv: u64| {
            align(channels * nvl_ranks * (2 * rdma_ranks + 3) * 4 + channels * nvl_ranks * recv * per_token)
        };
        let rdma = |recv: u64| {
            if ep <= NVL_PEERS {
                return 0;
            }
            align(
                channels * rdma_ranks * (NVL_PEERS * 2 + 2) * 2 * 4
                    + channels * rdma_ranks * recv * (per_token + 16) * 2,
            )
        };
        Some(nvl(d.0).max(nvl(c.0)) + rdma(d.1).max(rdma(c.1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3(groups: u64, group_topk: u64) -> DeepEp {
        DeepEp { experts: 256, top_k: 8, groups, group_topk, sms: 20, shares: None }
    }

    #[test]
    fn without_groups_a_unit_is_missed_as_the_hypergeometric_says() {
        // 4 of 256 experts: missed when all 8 picks fall among the other 252.
        let miss: f64 = (0..8).map(|i| (252.0 - i as f64) / (256.0 - i as f64)).product();
        assert!((v3(1, 1).hit_probability(0, 4) - (1.0 - miss)).abs() < 1e-12);
        // The whole expert set is always hit; the fan-out over ranks is ep x that.
        assert!((v3(1, 1).hit_probability(0, 256) - 1.0).abs() < 1e-12);
        let f = v3(1, 1).fanout(64, 8);
        assert!((f.ranks - 64.0 * (1.0 - miss)).abs() < 1e-9);
    }

    #[test]
    fn node_limited_routing_bounds_the_nodes_a_token_reaches() {
        // DeepSeek-V3: 8 groups = 8 nodes of 32 experts, 4 picked: a node is picked with
        // chance 1/2 and then hit unless all 8 picks fall in the other 96 of 128.
        let miss: f64 = (0..8).map(|i| (96.0 - i as f64) / (128.0 - i as f64)).product();
        let f = v3(8, 4).fanout(64, 8);
        assert!((f.nodes - 8.0 * 0.5 * (1.0 - miss)).abs() < 1e-9, "{f:?}");
        assert!(f.nodes <= 4.0);
        // A rank (4 experts) lies in one group: picked with chance 1/2, then hit unless all
        // 8 picks fall among the other 124 experts of the 128.
        let miss_r: f64 = (0..8).map(|i| (124.0 - i as f64) / (128.0 - i as f64)).product();
        assert!((f.ranks - 64.0 * 0.5 * (1.0 - miss_r)).abs() < 1e-9, "{f:?}");
        // Without the limit the token reaches more nodes.
        assert!(v3(1, 1).fanout(64, 8).nodes > 5.0);
    }

    #[test]
    fn buffers_follow_deepeps_size_hints() {
        // EP 64, hidden 7168 in BF16, 20 SMs: 10 channels, 8 NVLink peers, 8 RDMA ranks;
        // receive chunks of 288 (NVLink) and 128 (RDMA) tokens.
        let per_token = 14336 + 8 + 1024 + 512 + 512;
        let nvl = (10 * 8 * (2 * 8 + 3) * 4 + 10 * 8 * 288 * per_token) as u64;
        let rdma = (10 * 8 * 18 * 2 * 4 + 10 * 8 * 128 * (per_token + 16) * 2) as u64;
        let align = |x: u64| x.div_ceil(128) * 128;
        assert_eq!(v3(8, 4).buffer_bytes(64, 14336), Some(align(nvl) + align(rdma)));
        // One node: no RDMA buffer. An EP size without a config: none.
        assert!(v3(8, 4).buffer_bytes(8, 14336).unwrap() < align(nvl));
        assert_eq!(v3(8, 4).buffer_bytes(12, 14336), None);
    }
}
