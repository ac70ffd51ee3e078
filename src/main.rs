//! The stepsim command line: parse, call the library, print, exit.
//!
//! Exit codes: 0 = the simulation ran (whatever its verdict), 2 = bad input (scenario file,
//! flags) or an output that could not be written, 3 = internal error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use stepsim::scenario::Scenario;

#[derive(Parser)]
#[command(
    name = "stepsim",
    version,
    about = "Simulate one LLM training step across many GPUs: memory over time, the OOM point, throughput"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a scenario; print the report and write report.json, memory.csv, trace.json
    /// (Chrome trace), memory.png and timeline.png.
    Run {
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Output folder (default: output/<scenario name>/).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print report.json to stdout instead of the text report.
        #[arg(long)]
        json: bool,
        /// trace.json with every task and memory change even past 250,000 events (by default
        /// a larger job's trace shows repeated micro-batches as one slice per stream and phase).
        #[arg(long, value_name = "full", value_parser = ["full"])]
        trace: Option<String>,
        /// memory.csv with every change even past 1,000,000 rows (by default a larger job's
        /// keeps each of 2,000 stretches' highest allocated and reserved and last samples).
        #[arg(long = "memory-csv", value_name = "full", value_parser = ["full"])]
        memory_csv: Option<String>,
        /// Also write each rank class's allocator as a PyTorch memory snapshot
        /// (snapshot.pickle, or snapshot-<class>.pickle per class): open it in
        /// pytorch.org/memory_viz like a `torch.cuda.memory._dump_snapshot()` of a real run.
        #[arg(long)]
        snapshot: bool,
        /// Simulate every micro-batch of a repeating schedule through the event loop. By
        /// default, once a pipeline's steady state (or a run of accumulated micro-batches)
        /// schedules exactly as a few micro-batches before, the later ones are played
        /// straight into the allocators: the same output, faster. This flag is for checking
        /// that.
        #[arg(long = "every-period")]
        every_period: bool,
        /// Play every rank of a `[jitter]` job in one event loop. By default the ranks, which
        /// meet only at the barriers before data-parallel collectives, are played one at a
        /// time from barrier to barrier: the same output, faster. This flag is for checking
        /// that.
        #[arg(long = "one-loop")]
        one_loop: bool,
    },
    /// Validate a scenario and print what stepsim derived from it, without simulating.
    Check {
        /// Scenario file (TOML).
        scenario: PathBuf,
    },
    /// List the model zoo: `[model] name = "<name>"` takes a model's released config.json.
    Models,
    /// Simulate every configuration of a sweep file in parallel; write sweep.csv, sweep.json,
    /// heatmap.png and print the answer (best configuration, smallest GPU count that fits,
    /// frontier, where it runs out of memory). `sweep merge` joins the shards of a sweep.
    Sweep(stepsim::sweep::cli::SweepArgs),
    /// Explain an OOM (or a peak within --margin of capacity): what was live and why, and which
    /// single change fits at what cost; writes the run's outputs (report.json, memory.csv,
    /// trace.json, memory.png, timeline.png) plus explain.png.
    Explain {
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Output folder (default: output/<scenario name>/).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Fraction of capacity within which a run that fits is still explained.
        #[arg(long, default_value_t = stepsim::explain::DEFAULT_MARGIN)]
        margin: f64,
    },
    /// Write a scenario from a framework's own config, saying what was mapped, what was
    /// assumed and what could not be expressed (the scenario is validated before it is written).
    #[command(subcommand)]
    Import(ImportCommand),
}

/// What every importer takes besides its config: the GPUs the scenario runs on and where
/// the scenario goes.
#[derive(clap::Args)]
struct ImportTarget {
    /// GPU (catalog key, e.g. h100-sxm).
    #[arg(long)]
    gpu: String,
    /// GPUs per node (default: the GPU's usual node).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    gpus_per_node: Option<u64>,
    /// Write the scenario here (default: print it).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Subcommand)]
enum ImportCommand {
    /// A DeepSpeed ds_config.json (batch sizes, ZeRO stage, precision, offload, bucket sizes);
    /// the model, GPUs and sequence length come from the flags.
    Deepspeed {
        /// The ds_config.json.
        config: PathBuf,
        /// A zoo model (`stepsim models`) or the path of a Hugging Face config.json.
        #[arg(long)]
        model: String,
        /// GPUs in the job (the data-parallel size: ds_config.json holds no model parallelism).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        gpus: u64,
        /// Tokens per sequence.
        #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
        seq_len: u64,
        /// train_micro_batch_size_per_gpu, where the config says "auto" or nothing.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        micro_batch: Option<u64>,
        /// gradient_accumulation_steps, where the config says "auto" or nothing.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        grad_accum: Option<u64>,
        /// Activation checkpointing of the model: none | full | selective | selective-op.
        #[arg(long, default_value = "none")]
        checkpointing: String,
        /// What the Trainer's --bf16 / --fp16 fill a bf16/fp16 "enabled": "auto" with.
        #[arg(long, value_parser = ["bf16", "fp16", "fp32"])]
        dtype: Option<String>,
        /// The DeepSpeed release the job runs (e.g. 0.14.4; default 0.16.5, the one stepsim
        /// follows): it decides what initialisation leaves in PyTorch's cache and when Adam's
        /// moments are made.
        #[arg(long)]
        deepspeed_version: Option<String>,
        #[command(flatten)]
        target: ImportTarget,
    },
    /// Megatron-LM's arguments: the command line, or the `arguments` block a training log
    /// prints (every argument with its value); the GPU from the flag.
    Megatron {
        /// A file holding the arguments (command line or log block).
        args: PathBuf,
        /// GPUs in the job (a log's world_size is used when this is absent).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        gpus: Option<u64>,
        /// The padded vocabulary size, where the arguments give none (it comes from the tokenizer).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        vocab: Option<u64>,
        #[command(flatten)]
        target: ImportTarget,
    },
    /// A torchtitan job TOML (parallel degrees, batch, precision, checkpointing, float8); the
    /// model from its name and flavor (or --model), the GPU from the flag.
    Torchtitan {
        /// The job TOML (train_configs/*.toml).
        config: PathBuf,
        /// GPUs in the job: needed when data_parallel_shard_degree is -1.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        gpus: Option<u64>,
        /// A zoo model or a config.json, instead of the config's model name and flavor.
        #[arg(long)]
        model: Option<String>,
        #[command(flatten)]
        target: ImportTarget,
    },
}

/// A panic is a stepsim bug, whatever the input: say so in one line, with where it happened,
/// and exit 3 (internal error) like every other internal error, not with Rust's 101 and its
/// backtrace hint. Outputs are staged (`report::write::publish`), so none is left as if
/// complete. (The picture writers catch a renderer's panic and report a write error; the
/// line is printed for those too, since it is still a bug.)
fn main() -> ExitCode {
    stepsim::keep_freed_memory();
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!(
            "error: internal error{at}: {what}. This is a bug in stepsim, not in the input; please report it with the scenario or sweep file"
        );
    }));
    std::panic::catch_unwind(cli_main).unwrap_or(ExitCode::from(3))
}

fn cli_main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match cli.command {
        Command::Run { scenario, out, json, trace, memory_csv, snapshot, every_period, one_loop } => {
            let output = stepsim::report::write::OutputDetail {
                full_trace: trace.is_some(),
                full_memory_csv: memory_csv.is_some(),
            };
            run(&scenario, out, json, output, stepsim::SimOptions { history: snapshot, every_period, one_loop })
        }
        Command::Sweep(args) => stepsim::sweep::cli::main(args),
        Command::Explain { scenario, out, margin } => explain(&scenario, out, margin),
        Command::Models => {
            print!("{}", stepsim::report::text::zoo_table());
            ExitCode::SUCCESS
        }
        Command::Import(ImportCommand::Deepspeed {
            config,
            model,
            gpus,
            seq_len,
            micro_batch,
            grad_accum,
            checkpointing,
            dtype,
            deepspeed_version,
            target: ImportTarget { gpu, gpus_per_node, out },
        }) => {
            let model = match model_arg(model) {
                Ok(m) => m,
                Err(code) => return code,
            };
            let args = stepsim::import::deepspeed::DeepspeedArgs {
                model,
                gpu,
                gpus,
                gpus_per_node,
                seq_len,
                micro_batch,
                grad_accum,
                checkpointing,
                dtype,
                version: deepspeed_version,
            };
            import(&config, out, |name, text| stepsim::import::deepspeed::import(name, text, &args), "deepspeed")
        }
        Command::Import(ImportCommand::Megatron {
            args,
            gpus,
            vocab,
            target: ImportTarget { gpu, gpus_per_node, out },
        }) => {
            let a = stepsim::import::megatron::MegatronArgs { gpu, gpus, gpus_per_node, vocab };
            import(&args, out, |name, text| stepsim::import::megatron::import(name, text, &a), "megatron")
        }
        Command::Import(ImportCommand::Torchtitan {
            config,
            gpus,
            model,
            target: ImportTarget { gpu, gpus_per_node, out },
        }) => {
            let model = match model.map(model_arg).transpose() {
                Ok(m) => m,
                Err(code) => return code,
            };
            let args = stepsim::import::torchtitan::TorchtitanArgs { model, gpu, gpus, gpus_per_node };
            import(&config, out, |name, text| stepsim::import::torchtitan::import(name, text, &args), "torchtitan")
        }
        Command::Check { scenario } => match Scenario::load(&scenario) {
            Ok(s) => {
                println!(
                    "{}: ok: {} parameters, {} x {}",
                    scenario.display(),
                    s.model.param_count(),
                    s.cluster.gpus,
                    s.cluster.gpu.name
                );
                print!("{}", stepsim::report::check::summary(&s));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
    }
}

fn run(
    path: &std::path::Path,
    out: Option<PathBuf>,
    json: bool,
    output: stepsim::report::write::OutputDetail,
    opts: stepsim::SimOptions,
) -> ExitCode {
    let snapshot = opts.history;
    let s = match Scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = stepsim::scenario::limits::full_report_fits(path, &s) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    if snapshot && s.allocator.kind == stepsim::memory::AllocatorKind::Exact {
        eprintln!(
            "error: {}: field `allocator.kind`: --snapshot writes the caching allocator's segments and addresses; the exact model (\"exact\") has none: use \"caching\" (the default) or drop --snapshot",
            path.display()
        );
        return ExitCode::from(2);
    }
    let sim = match stepsim::simulate_with(&s, opts) {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(3);
        }
    };
    if let Err(e) = sim.check_invariants() {
        eprintln!("error: {e}");
        return ExitCode::from(3);
    }
    let dir = out.unwrap_or_else(|| PathBuf::from("output").join(&s.name));
    let views: Vec<_> = (0..sim.job.classes.len())
        .map(|k| (&sim.job.classes[k].schedule, &sim.run.traces[k], &sim.class_reports[k]))
        .collect();
    let alloc_conf = s.allocator.alloc_conf();
    let traces: Vec<_> = views.iter().map(|v| v.1).collect();
    let plan = stepsim::report::write::OutputPlan::of(&sim.report, &traces, output);
    let written = stepsim::report::write::publish(&dir, |d| {
        let mut w = stepsim::report::write::write_job(d, &sim.report, &views, &sim.job.links, sim.headline, &plan)?;
        if snapshot {
            w.extend(stepsim::report::write::write_snapshots(d, &sim.report, &views, &s.name, &alloc_conf)?);
        }
        Ok(w)
    });
    let written = match written {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: cannot write outputs: {e}");
            return ExitCode::from(2);
        }
    };
    let text = if json {
        stepsim::report::write::report_json(&sim.report)
    } else {
        let files = written.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
        let notes: String = plan.notes().iter().map(|n| format!("{n}\n")).collect();
        format!("{}\nWrote {files}\n{notes}", stepsim::report::text::render(&sim.report, &s))
    };
    // A closed pipe (`stepsim run ... | head`) is not an error of the simulation.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    // The process ends here: handing the simulation's millions of small allocations back one
    // by one would cost a large job ~0.15 s for nothing (the OS takes the pages back at exit).
    drop(views);
    std::mem::forget(sim);
    ExitCode::SUCCESS
}

fn explain(path: &std::path::Path, out: Option<PathBuf>, margin: f64) -> ExitCode {
    if !(0.0..1.0).contains(&margin) {
        eprintln!("error: --margin: must be a fraction in [0, 1), got {margin}");
        return ExitCode::from(2);
    }
    let s = match Scenario::load(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = stepsim::explain::accepts(path, &s) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let mut sim = match stepsim::simulate(&s) {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(3);
        }
    };
    let e = stepsim::explain::explain(&s, &sim, margin);
    sim.report.explanation = serde_json::to_value(&e).ok();
    if let Err(e) = sim.check_invariants() {
        eprintln!("error: {e}");
        return ExitCode::from(3);
    }
    let dir = out.unwrap_or_else(|| PathBuf::from("output").join(&s.name));
    let written = stepsim::report::write::publish(&dir, |d| {
        let mut w = stepsim::report::write::write_all(d, &sim.report, sim.schedule(), sim.trace(), Default::default())?;
        w.push(stepsim::report::write::explain_png(d, &sim.report, sim.schedule(), sim.trace(), e.time_s)?);
        Ok(w)
    });
    let written = match written {
        Ok(w) => w,
        Err(err) => {
            eprintln!("error: cannot write outputs: {err}");
            return ExitCode::from(2);
        }
    };
    let files = written.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    let text = format!("{}\nWrote {files}\n", stepsim::explain::render(&e, &s));
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    ExitCode::SUCCESS
}

/// Reads a framework config, imports it with `f`, validates the scenario and prints or writes
/// it (atomically); exit 2 with nothing written when any step fails.
fn import(
    config: &std::path::Path,
    out: Option<PathBuf>,
    f: impl Fn(&str, &str) -> Result<stepsim::import::Import, stepsim::import::ImportError>,
    tool: &str,
) -> ExitCode {
    let name = config.display().to_string();
    let text = match std::fs::read_to_string(config) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {name}: cannot read the config: {e}");
            return ExitCode::from(2);
        }
    };
    let im = match f(&name, &text) {
        Ok(im) => im,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let scenario = im.render(tool);
    let as_path = out.clone().unwrap_or_else(|| PathBuf::from("<imported>.toml"));
    if let Err(e) = Scenario::from_toml(&as_path, &scenario) {
        eprintln!("error: {}", im.refusal(&name, &e));
        return ExitCode::from(2);
    }
    let Some(out) = out else {
        print!("{scenario}");
        return ExitCode::SUCCESS;
    };
    let tmp = out.with_extension("toml.partial");
    if let Err(e) = std::fs::write(&tmp, &scenario).and_then(|_| std::fs::rename(&tmp, &out)) {
        let _ = std::fs::remove_file(&tmp);
        eprintln!("error: cannot write {}: {e}", out.display());
        return ExitCode::from(2);
    }
    println!(
        "Wrote {}: {} mapped, {} assumed, {} not expressed, {} ignored (listed at the top of the file)",
        out.display(),
        im.mapped.len(),
        im.assumed.len(),
        im.not_expressed.len(),
        im.ignored.len()
    );
    for n in &im.not_expressed {
        println!("  not expressed: {n}");
    }
    ExitCode::SUCCESS
}

/// `--model`: a config.json path (made absolute, so the scenario loads from anywhere) or a
/// zoo name.
fn model_arg(model: String) -> Result<stepsim::import::ModelArg, ExitCode> {
    if model.ends_with(".json") || std::path::Path::new(&model).is_file() {
        match std::fs::canonicalize(&model) {
            Ok(p) => Ok(stepsim::import::ModelArg::HfConfig(p.to_string_lossy().into_owned())),
            Err(e) => {
                eprintln!("error: --model {model}: cannot read the config.json: {e}");
                Err(ExitCode::from(2))
            }
        }
    } else {
        Ok(stepsim::import::ModelArg::Zoo(model))
    }
}
