//! How a mixture of experts' router spreads tokens over the experts, and so over the
//! expert-parallel ranks that hold them.
//!
//! Routing is uneven in practice: early in training, and persistently for some experts,
//! one expert receives several times the average (Megatron-Core's MoE README warns that a
//! dropless MoE "suffers from an imbalanced token distribution at the early stage of
//! training ... which may lead to poor performance and out-of-memory (OOM) issues"). The rank
//! holding the hottest experts computes more, saves more activations, and every all-to-all
//! waits for it. stepsim models this as a fixed share of the token copies per expert, the
//! same in every micro-batch and MoE block (a persistently hot expert, the case that sets
//! the peak): uniform, a Zipf law over the experts in a seeded order, or shares the user
//! measured.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// The `[moe]` section's routing.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "routing")]
pub enum Routing {
    /// Every expert receives tokens x top_k / experts copies.
    Uniform,
    /// Expert j of a seeded random order receives a share proportional to 1 / (j + 1)^exponent.
    Zipf { exponent: f64, seed: u64 },
    /// Measured tokens per expert (any scale), in expert order.
    Measured { tokens_per_expert: Vec<f64> },
}

/// Megatron-Core's token dropping (`--moe-expert-capacity-factor`,
/// `--moe-pad-expert-input-to-capacity`; `moe_utils.py` `get_capacity` and
/// `topk_softmax_with_capacity`): each rank sends an expert at most
/// ceil(tokens x top_k / experts x factor) copies of its tokens and drops the rest (the
/// lowest-probability ones by default); padded, every expert receives exactly that many.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Capacity {
    pub factor: f64,
    pub pad: bool,
}

impl Capacity {
    /// Copies one rank may send one expert, when it routes `copies` over `experts`.
    pub fn per_expert(&self, copies: u64, experts: u64) -> u64 {
        (copies as f64 / experts.max(1) as f64 * self.factor).ceil() as u64
    }
}

impl Routing {
    pub fn is_uniform(&self) -> bool {
        matches!(self, Routing::Uniform)
    }

    /// Each expert's share of the token copies, in expert order; they sum to 1.
    pub fn expert_shares(&self, experts: u64) -> Vec<f64> {
        let n = experts.max(1) as usize;
        let raw: Vec<f64> = match self {
            Routing::Uniform => vec![1.0; n],
            Routing::Zipf { exponent, seed } => {
                let mut order: Vec<usize> = (0..n).collect();
                order.shuffle(&mut ChaCha8Rng::seed_from_u64(*seed));
                let mut w = vec![0.0; n];
                for (j, &expert) in order.iter().enumerate() {
                    w[expert] = 1.0 / ((j + 1) as f64).powf(*exponent);
                }
                w
            }
            Routing::Measured { tokens_per_expert } => tokens_per_expert.clone(),
        };
        let sum: f64 = raw.iter().sum();
        raw.iter().map(|x| x / sum).collect()
    }

    /// Token copies each of `ep` expert-parallel ranks receives per micro-batch and MoE
    /// block, rank r holding experts r E/ep .. (r + 1) E/ep, when every rank routes `copies`
    /// (its tokens x top_k): the group's ep x copies split by the experts' shares. Rounded to
    /// whole copies; the sum is exact.
    pub fn rank_copies(&self, experts: u64, ep: u64, copies: u64) -> Vec<u64> {
        let per = (experts / ep.max(1)).max(1) as usize;
        let ranks: Vec<f64> = self.expert_shares(experts).chunks(per).map(|c| c.iter().sum()).collect();
        largest_remainder(&ranks, copies * ep)
    }
}

/// `total` split by `shares` (summing to 1) into whole parts: each share's floor, then one
/// more to the largest remainders (the lowest index first among equals), so the parts sum to
/// `total` exactly.
fn largest_remainder(shares: &[f64], total: u64) -> Vec<u64> {
    let mut out: Vec<u64> = shares.iter().map(|x| (x * total as f64).floor() as u64).collect();
    let mut rest = total.saturating_sub(out.iter().sum());
    let mut frac: Vec<(usize, f64)> =
        shares.iter().enumerate().map(|(i, x)| (i, x * total as f64 - out[i] as f64)).collect();
    frac.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    for (i, _) in frac {
        if rest == 0 {
            break;
        }
        out[i] += 1;
        rest -= 1;
    }
    out
}

impl Routing {
    /// One rank's `copies` split over the experts by their shares (largest remainders, lowest
    /// expert first).
    pub fn expert_copies(&self, experts: u64, copies: u64) -> Vec<u64> {
        largest_remainder(&self.expert_shares(experts), copies)
    }

    /// [`Routing::rank_copies`] under a capacity: every rank routes the same split of its
    /// `copies`, keeps at most the capacity per expert (exactly it, padded), so rank r
    /// receives ep x the kept copies of its experts. Also returns the copies each rank drops.
    pub fn capped_rank_copies(&self, experts: u64, ep: u64, copies: u64, cap: Capacity) -> (Vec<u64>, u64) {
        let c = cap.per_expert(copies, experts);
        let per = (experts / ep.max(1)).max(1) as usize;
        let split = self.expert_copies(experts, copies);
        let kept: Vec<u64> = split.iter().map(|&n| if cap.pad { c } else { n.min(c) }).collect();
        let dropped = split.iter().map(|&n| n.saturating_sub(c)).sum();
        (kept.chunks(per).map(|k| ep * k.iter().sum::<u64>()).collect(), dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_routing_gives_every_rank_its_own_copies() {
        assert_eq!(Routing::Uniform.rank_copies(8, 4, 4096), vec![4096; 4]);
    }

    #[test]
    fn zipf_shares_follow_the_law_in_a_seeded_order() {
        let r = Routing::Zipf { exponent: 1.0, seed: 7 };
        let s = r.expert_shares(8);
        let h8: f64 = (1..=8).map(|j| 1.0 / j as f64).sum();
        let mut sorted = s.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        for (j, x) in sorted.iter().enumerate() {
            assert!((x - 1.0 / ((j + 1) as f64 * h8)).abs() < 1e-12);
        }
        assert_eq!(s, r.expert_shares(8), "same seed, same order");
        assert_ne!(s, Routing::Zipf { exponent: 1.0, seed: 8 }.expert_shares(8));
        let c = r.rank_copies(8, 8, 1000);
        assert_eq!(c.iter().sum::<u64>(), 8000);
        assert_eq!(*c.iter().max().unwrap(), (8000.0 / h8).round() as u64);
    }

    /// Capacity 1.0 over 8 experts of 1000 copies: 125 per expert. Shares 3:1:...:1 split
    /// 1000 as 300 and 100 each; the hot expert keeps 125, the others all 100 (dropped: 175);
    /// padded, every expert receives 125 from each of the 4 ranks.
    #[test]
    fn capacity_caps_each_expert_and_padding_fills_it() {
        let r = Routing::Measured { tokens_per_expert: vec![3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0] };
        let cap = Capacity { factor: 1.0, pad: false };
        assert_eq!(cap.per_expert(1000, 8), 125);
        assert_eq!(r.expert_copies(8, 1000), vec![300, 100, 100, 100, 100, 100, 100, 100]);
        let (ranks, dropped) = r.capped_rank_copies(8, 4, 1000, cap);
        assert_eq!(ranks, vec![4 * 225, 4 * 200, 4 * 200, 4 * 200]);
        assert_eq!(dropped, 175);
        let (ranks, dropped) = r.capped_rank_copies(8, 4, 1000, Capacity { factor: 1.0, pad: true });
        assert_eq!(ranks, vec![4 * 250; 4]);
        assert_eq!(dropped, 175);
    }

    #[test]
    fn measured_shares_are_normalised_and_summed_per_rank() {
        let r = Routing::Measured { tokens_per_expert: vec![3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0] };
        // Two experts per rank: rank 0 holds 4 of 10 shares.
        assert_eq!(r.rank_copies(8, 4, 1000), vec![1600, 800, 800, 800]);
    }
}
