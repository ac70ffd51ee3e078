//! What every report must satisfy before a file is written from it: no float that is not a
//! number, no category above the total it is part of, nothing allocated beyond what the
//! allocator reserved, a job that fits within capacity, and positive step times. A report
//! that breaks one is a stepsim bug, and is refused (exit 3) rather than printed: a
//! planner's wrong figure is worse than none.

use super::{finite, Report, Verdict};

/// The first invariant `r` breaks, in words, or Ok.
pub fn check(r: &Report) -> Result<(), String> {
    if let Some(at) = finite::first_non_finite(r) {
        return Err(format!("a figure is not a number: {at}"));
    }
    if let Some(p) = &r.peak {
        let (a, res) = (p.allocated.bytes, p.reserved.bytes);
        if a > res {
            return Err(format!("peak allocated {a} B is above peak reserved {res} B"));
        }
        let mut sum = 0u128;
        for c in &p.breakdown {
            sum += u128::from(c.size.bytes);
        }
        if sum > u128::from(a) {
            return Err(format!("the peak's categories add up to {sum} B, above the peak's {a} B"));
        }
        if let Some(ph) = r.phase_peaks.iter().find(|ph| ph.allocated.bytes > a) {
            return Err(format!(
                "step {} {:?}'s peak {} B is above the run's peak {a} B",
                ph.step, ph.phase, ph.allocated.bytes
            ));
        }
        if matches!(r.verdict, Verdict::Fits { .. }) && r.offload_fits && res > r.capacity.bytes {
            return Err(format!("fits with {res} B reserved, above capacity {} B", r.capacity.bytes));
        }
    }
    if let Verdict::Oom(o) = &r.verdict {
        if o.allocated.bytes > o.capacity.bytes {
            return Err(format!(
                "at the OOM, {} B allocated is above capacity {} B",
                o.allocated.bytes, o.capacity.bytes
            ));
        }
    }
    let ms = &r.model_state_per_gpu;
    for (name, b) in [
        ("parameters", ms.parameters),
        ("master_weights", ms.master_weights),
        ("gradients", ms.gradients),
        ("optimizer_state", ms.optimizer_state),
    ] {
        if b.bytes > ms.total.bytes {
            return Err(format!("model state: {name} {} B is above the total {} B", b.bytes, ms.total.bytes));
        }
    }
    if let Some(s) = r.steps.iter().find(|s| s.time_s <= 0.0 || s.start_s < 0.0) {
        return Err(format!("step {} starts at {} s and lasts {} s", s.step, s.start_s, s.time_s));
    }
    if let Some(t) = &r.throughput {
        if t.step_time_s <= 0.0 || t.tokens_per_s <= 0.0 || t.mfu < 0.0 || t.hfu < 0.0 {
            return Err(format!(
                "throughput: step {} s, {} tokens/s, MFU {}, HFU {}",
                t.step_time_s, t.tokens_per_s, t.mfu, t.hfu
            ));
        }
    }
    Ok(())
}
