//! `stepsim run --snapshot`: each rank class's simulated allocator as a PyTorch memory
//! snapshot, the pickle `torch.cuda.memory._dump_snapshot()` writes, so the simulated step
//! opens in pytorch.org/memory_viz (Active Memory Timeline, Allocator State History) and in
//! `torch.cuda._memory_viz`, beside a snapshot of the real run.
//!
//! The layout is that of `torch.cuda.memory._snapshot()` (read in PyTorch's
//! `torch/csrc/cuda/Module.cpp` / `memory_snapshot.cpp`, `torch/cuda/_memory_viz.py` and
//! `torch/utils/viz/MemoryViz.js`): `segments` (address, sizes, stream, pool type, blocks and
//! their states), `device_traces` (one list per device: alloc, free_requested,
//! free_completed, segment_alloc, segment_free, segment_map, segment_unmap and oom entries
//! with address, size, stream and `time_us`) and `allocator_settings`. Where a real snapshot
//! has Python stack frames, each tensor's `frames` name what stepsim knows instead: the tensor
//! (`name`), the op or collective that allocated it (`filename`) and its block (`line`, -1
//! outside the transformer blocks), then the step, phase and micro-batch; a segment's entry
//! has the frames of the request it was made for, as PyTorch records the context of the
//! `cudaMalloc`. Each entry also carries the tensor's memory.csv `category`, which memory_viz
//! colours by ("unknown" for segment entries). A top-level `stepsim` dict says which scenario
//! and rank class the file is, and that times are simulated.
//!
//! One device per file: device 0 is the rank class's GPU. Times are simulated microseconds
//! from the start of the run (a real snapshot's are wall-clock).

use std::collections::HashMap;

use super::pickle::{Memo, Pickler};
use crate::memory::history::{Action, Block, History, Segment, NO_TENSOR};
use crate::schedule::Schedule;

/// What the snapshot says about where it came from.
#[derive(Debug, Clone)]
pub struct Origin<'a> {
    pub scenario: &'a str,
    pub rank_class: &'a str,
    /// `PYTORCH_CUDA_ALLOC_CONF` the scenario's `[allocator]` corresponds to.
    pub alloc_conf: &'a str,
}

/// The snapshot of one rank class's run.
pub fn render(h: &History, sched: &Schedule, origin: &Origin) -> Vec<u8> {
    let frames = TensorFrames::of(sched);
    let mut p = Pickler::new();
    let mut memo: HashMap<u32, Memo> = HashMap::new();
    p.dict_begin();

    p.str("segments");
    p.list_begin();
    for s in &h.segments {
        segment(&mut p, s, &frames, &mut memo);
    }
    p.list_end();

    p.str("device_traces");
    p.list_begin();
    p.list_begin();
    for e in &h.events {
        p.dict_begin();
        p.str("action");
        p.str(e.action.name());
        p.str(if e.action == Action::Oom { "device_free" } else { "addr" });
        p.uint(e.addr);
        p.str("size");
        p.uint(e.size);
        p.str("stream");
        p.uint(u64::from(e.stream));
        p.str("time_us");
        p.uint(e.time_ns / 1000);
        p.str("frames");
        frames.write(&mut p, e.tensor, &mut memo);
        // Entries without a tensor (segments, an OOM) are "unknown", memory_viz's own name for
        // them: some versions of its loader fail on a snapshot whose categories lack it
        // (`annotate_snapshot` appends it through a misspelt field).
        let tensor_entry = !matches!(e.action, Action::SegmentAlloc | Action::SegmentMap);
        p.str("category");
        p.str(frames.category(e.tensor).filter(|_| tensor_entry).unwrap_or("unknown"));
        p.dict_end();
    }
    p.list_end();
    p.list_end();

    p.str("allocator_settings");
    p.dict_begin();
    p.str("PYTORCH_CUDA_ALLOC_CONF");
    p.str(origin.alloc_conf);
    p.str("max_split_size");
    // PyTorch writes SIZE_MAX as a signed 64-bit integer: -1 when unlimited.
    p.int(i64::try_from(h.settings.max_split_size).unwrap_or(-1));
    p.str("expandable_segments");
    p.bool(h.settings.expandable_segments);
    p.str("roundup_power2_divisions");
    p.dict_begin();
    for (i, &d) in h.settings.roundup_power2_divisions.iter().enumerate() {
        p.str(&(1u64 << i).to_string());
        p.uint(d);
    }
    p.dict_end();
    p.dict_end();

    p.str("stepsim");
    p.dict_begin();
    p.str("scenario");
    p.str(origin.scenario);
    p.str("rank_class");
    p.str(origin.rank_class);
    p.str("version");
    p.str(env!("CARGO_PKG_VERSION"));
    p.str("capacity_bytes");
    p.uint(h.capacity);
    p.str("time");
    p.str("simulated microseconds from the start of the run");
    p.str("frames");
    p.str("name: the tensor; filename: the op or collective that allocated it; line: its transformer block (-1 outside the blocks); then the step, phase and micro-batch");
    p.dict_end();

    p.dict_end();
    p.finish()
}

fn segment(p: &mut Pickler, s: &Segment, frames: &TensorFrames, memo: &mut HashMap<u32, Memo>) {
    use crate::memory::history::BlockState;
    let sum = |f: &dyn Fn(&Block) -> u64| s.blocks.iter().map(f).sum::<u64>();
    p.dict_begin();
    p.str("device");
    p.int(0);
    p.str("address");
    p.uint(s.addr);
    p.str("total_size");
    p.uint(s.total_size());
    p.str("allocated_size");
    p.uint(sum(&|b| if b.state == BlockState::Allocated { b.size } else { 0 }));
    p.str("active_size");
    p.uint(sum(&|b| if b.state == BlockState::Inactive { 0 } else { b.size }));
    p.str("requested_size");
    p.uint(sum(&|b| if b.state == BlockState::Allocated { b.requested } else { 0 }));
    p.str("stream");
    p.uint(u64::from(s.stream));
    p.str("segment_type");
    p.str(if s.small { "small" } else { "large" });
    p.str("segment_pool_id");
    p.int(0);
    p.int(0);
    p.tuple2();
    p.str("is_expandable");
    p.bool(s.expandable);
    p.str("frames");
    frames.write(p, NO_TENSOR, memo);
    p.str("blocks");
    p.list_begin();
    for b in &s.blocks {
        p.dict_begin();
        p.str("address");
        p.uint(b.addr);
        p.str("size");
        p.uint(b.size);
        p.str("requested_size");
        p.uint(b.requested);
        p.str("state");
        p.str(b.state.name());
        p.str("frames");
        frames.write(p, b.tensor, memo);
        p.dict_end();
    }
    p.list_end();
    p.dict_end();
}

/// Per tensor of the program: its name, its category and the task that allocates it.
struct TensorFrames<'a> {
    sched: &'a Schedule,
    alloc_task: Vec<u32>,
}

impl<'a> TensorFrames<'a> {
    fn of(sched: &'a Schedule) -> Self {
        let prog = &sched.program;
        let mut alloc_task = vec![u32::MAX; prog.buffers.len()];
        for t in 0..prog.alloc.len() {
            for &b in prog.alloc.of(t) {
                if let Some(slot) = alloc_task.get_mut(b as usize) {
                    *slot = t as u32;
                }
            }
        }
        TensorFrames { sched, alloc_task }
    }

    fn category(&self, tensor: u32) -> Option<&'static str> {
        self.sched.program.buffers.get(tensor as usize).map(|b| b.category.key())
    }

    /// The tensor's frames list (memoized: every entry of one tensor shares it).
    fn write(&self, p: &mut Pickler, tensor: u32, memo: &mut HashMap<u32, Memo>) {
        if let Some(&m) = memo.get(&tensor) {
            p.get(m);
            return;
        }
        p.list_begin();
        let prog = &self.sched.program;
        if let Some(buf) = prog.buffers.get(tensor as usize) {
            let name = prog.names.get(buf.name as usize).map_or("", String::as_str);
            let label = self
                .alloc_task
                .get(tensor as usize)
                .and_then(|&t| prog.tasks.get(t as usize))
                .and_then(|t| self.sched.labels.get(t.label as usize));
            let layer = |l: &crate::schedule::TaskLabel| l.layer().and_then(|x| i64::try_from(x).ok()).unwrap_or(-1);
            let (what, layer) = label.map_or(("", -1), |l| (l.what.as_str(), layer(l)));
            frame(p, if name.is_empty() { buf.category.key() } else { name }, what, layer);
            if let Some(l) = label {
                let when = if l.step == 0 {
                    "initialisation".to_string()
                } else {
                    format!("step {}, {}, micro-batch {}", l.step, l.phase.name(), l.micro_batch)
                };
                frame(p, &when, "stepsim", i64::from(l.step));
            }
        }
        p.list_end();
        let m = p.put();
        memo.insert(tensor, m);
    }
}

fn frame(p: &mut Pickler, name: &str, filename: &str, line: i64) {
    p.dict_begin();
    p.str("filename");
    p.str(filename);
    p.str("line");
    p.int(line);
    p.str("name");
    p.str(name);
    p.dict_end();
}
