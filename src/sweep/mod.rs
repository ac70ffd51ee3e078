//! Capacity-planning sweeps: many configurations of one base scenario, simulated in parallel
//! on rayon's pool, streamed to `sweep.csv`, and the answer a planner wants (the best
//! configuration for an objective, the smallest GPU count that fits, the (GPUs, tokens/s)
//! frontier, where it runs out of memory), `sweep.json` and `heatmap.png`.
//!
//! - [`spec`]: the sweep file, axes, expansion into validated scenarios;
//! - [`filter`]: the constraints a configuration must meet;
//! - [`summary`]: what one simulation contributes (a lean schedule, no story);
//! - [`run`]: parallel execution, incremental output, `--resume`, `--shard`, merge;
//! - [`cli`]: the `stepsim sweep` subcommand;
//! - [`output`]: the CSV row format; [`answer`]: the objective, frontier and OOM regions;
//!   [`heatmap`]: the PNG.
//!
//! ```no_run
//! use stepsim::sweep::{self, RunOptions, SweepSpec};
//! let spec = SweepSpec::load("scenarios/sweeps/100b-capacity.toml".as_ref())?;
//! let opts = RunOptions { out: "output/100b-capacity".into(), jobs: None, shard: None, resume: false, progress: false };
//! let done = sweep::run(&spec, &opts)?;
//! print!("{}", sweep::answer::render(done.answer.as_ref().unwrap()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod answer;
pub mod cli;
pub mod error;
pub mod filter;
pub mod heatmap;
pub mod output;
pub mod run;
pub mod spec;
pub mod summary;

pub use error::SweepError;
pub use run::{finalize, merge, run, Finished, RunOptions, Shard};
pub use spec::SweepSpec;
