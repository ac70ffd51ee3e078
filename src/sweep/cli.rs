//! `stepsim sweep SWEEP [--out DIR] [--jobs N] [--shard I/N] [--resume]` and
//! `stepsim sweep merge SWEEP SHARD_DIR... [--out DIR]`: parse, run, print, exit code.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use super::{answer, merge, run, Finished, RunOptions, Shard, SweepError, SweepSpec};

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SweepArgs {
    #[command(subcommand)]
    pub command: Option<SweepCommand>,
    /// Sweep file (TOML): a base scenario, axes, filter, objective.
    #[arg(required = true)]
    pub sweep: Option<PathBuf>,
    /// Output folder (default: output/<sweep name>/, or output/<sweep name>/shard-I-of-N/).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Run only the I-th of N deterministic slices (1-based), e.g. a Slurm array task.
    #[arg(long, value_name = "I/N", value_parser = parse_shard)]
    pub shard: Option<Shard>,
    /// Continue an interrupted sweep in the same output folder, skipping what finished.
    #[arg(long)]
    pub resume: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum SweepCommand {
    /// Join the outputs of all N shards of a sweep into one sweep.csv, sweep.json and heatmap.
    Merge {
        /// The sweep file the shards ran.
        sweep: PathBuf,
        /// The shards' output folders.
        #[arg(required = true)]
        shards: Vec<PathBuf>,
        /// Output folder (default: output/<sweep name>/).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    s.parse()
}

fn fail(e: &SweepError) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(e.exit_code())
}

/// Runs the `sweep` subcommand.
pub fn main(args: SweepArgs) -> ExitCode {
    match args.command {
        Some(SweepCommand::Merge { sweep, shards, out }) => {
            let spec = match SweepSpec::load(&sweep) {
                Ok(s) => s,
                Err(e) => return fail(&e),
            };
            let out = out.unwrap_or_else(|| PathBuf::from("output").join(&spec.name));
            match merge(&spec, &shards, &out) {
                Ok(f) => print_finished(&spec, &f, None),
                Err(e) => fail(&e),
            }
        }
        None => {
            let Some(path) = args.sweep else {
                eprintln!("error: name a sweep file: stepsim sweep SWEEP");
                return ExitCode::from(2);
            };
            let spec = match SweepSpec::load(&path) {
                Ok(s) => s,
                Err(e) => return fail(&e),
            };
            let out = args.out.unwrap_or_else(|| {
                let base = PathBuf::from("output").join(&spec.name);
                match args.shard {
                    Some(s) => base.join(format!("shard-{}-of-{}", s.index, s.count)),
                    None => base,
                }
            });
            let opts = RunOptions {
                out,
                jobs: args.jobs,
                shard: args.shard,
                resume: args.resume,
                progress: std::io::stderr().is_terminal(),
            };
            let t0 = Instant::now();
            match run(&spec, &opts) {
                Ok(f) => print_finished(&spec, &f, Some((t0, args.shard))),
                Err(e) => fail(&e),
            }
        }
    }
}

fn print_finished(spec: &SweepSpec, f: &Finished, timing: Option<(Instant, Option<Shard>)>) -> ExitCode {
    if let Some((t0, _)) = timing {
        if f.simulated > 0 {
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "simulated {} configurations in {secs:.1} s ({:.0} per second){}",
                f.simulated,
                f.simulated as f64 / secs.max(1e-9),
                if f.simulated < f.rows {
                    format!("; {} were already done", f.rows - f.simulated)
                } else {
                    String::new()
                }
            );
        }
    }
    let files = f.files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    let text = match (&f.answer, timing.and_then(|t| t.1)) {
        (Some(a), _) => format!("{}\nWrote {files}\n", answer::render(a)),
        (None, shard) => format!(
            "Shard {} of sweep {}: {} configurations, {} run out of memory.\nWrote {files}\nWhen every shard is done: stepsim sweep merge {} <the shards' output folders>\n",
            shard.map(|s| s.to_string()).unwrap_or_default(),
            spec.name,
            f.rows,
            f.ooms,
            spec.source.display()
        ),
    };
    // A closed pipe (`stepsim sweep ... | head`) is not an error of the sweep.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    ExitCode::SUCCESS
}
