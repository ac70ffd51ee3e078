//! timeline.png (issue 24): every rank class gets a row group on one time axis, the image
//! height stays bounded however many classes a job has, every class is drawn or named in
//! the note, and the picture is byte-identical for the same input. What the rows show is
//! honest: each kind's drawn area tracks its share of the time, the red band's length the
//! report's exposed communication, short pipeline transfers stay visible, and a run that
//! stopped at t = 0 says so on a sensible axis.

use std::path::Path;

use stepsim::report::timeline_png::{
    axis_end_s, column_fills, entry, entry_name, exposed_columns, exposed_intervals, layout, layout_of, lone_columns,
    nothing_ran, row_tasks, Group, KINDS, MAX_GROUPS, MAX_HEIGHT, PLOT_COLS,
};
use stepsim::scenario::Scenario;
use stepsim::schedule::StreamClass;

/// A small GPT on `pipeline` A100s, one per stage, 1F1B over 2 x `pipeline` micro-batches.
fn pipelined(pipeline: usize) -> Scenario {
    let toml = format!(
        "[model]\nfamily = \"gpt\"\nn_layers = {pipeline}\nhidden = 1024\nn_heads = 16\nvocab = 1024\nmax_seq_len = 1024\n\
         [hardware]\ngpu = \"a100-80gb\"\ngpus = {pipeline}\ngpus_per_node = {}\n\
         [parallel]\npipeline = {pipeline}\nschedule = \"1f1b\"\n\
         [training]\nmicro_batch = 1\nseq_len = 1024\ngrad_accum = {}\nsteps = 2\nattention = \"flash\"\n",
        pipeline.min(8),
        2 * pipeline
    );
    Scenario::from_toml(Path::new("<timeline>"), &toml).unwrap()
}

/// Writes a job's outputs into `dir`; returns the simulation.
fn write(s: &Scenario, dir: &Path) -> stepsim::Simulation {
    let sim = stepsim::simulate(s).unwrap();
    let views: Vec<_> = (0..sim.job.classes.len())
        .map(|k| (&sim.job.classes[k].schedule, &sim.run.traces[k], &sim.class_reports[k]))
        .collect();
    let traces: Vec<_> = views.iter().map(|v| v.1).collect();
    let plan = stepsim::report::write::OutputPlan::of(&sim.report, &traces, Default::default());
    stepsim::report::write::write_job(dir, &sim.report, &views, &sim.job.links, sim.headline, &plan).unwrap();
    drop(views);
    sim
}

/// Width and height from the PNG's IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert!(b.starts_with(b"\x89PNG\r\n\x1a\n") && &b[12..16] == b"IHDR", "{} is not a PNG", path.display());
    (u32::from_be_bytes(b[16..20].try_into().unwrap()), u32::from_be_bytes(b[20..24].try_into().unwrap()))
}

/// The row groups [`stepsim::report::write::write_job`] draws, named by class index.
fn groups(sim: &stepsim::Simulation) -> Vec<Group<'_>> {
    (0..sim.job.classes.len())
        .map(|k| Group {
            name: format!("class {k}"),
            sched: &sim.job.classes[k].schedule,
            trace: &sim.run.traces[k],
            steps: &sim.class_reports[k].steps,
        })
        .collect()
}

fn shipped(name: &str) -> Scenario {
    Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name)).unwrap()
}

#[test]
fn a_pipeline_gets_one_row_group_per_stage() {
    let dir = tempfile::tempdir().unwrap();
    let sim = write(&pipelined(4), dir.path());
    assert_eq!(sim.job.classes.len(), 4, "one class per stage");
    // The layout of what is drawn: a stream that ran nothing (here the data-parallel "nccl"
    // stream, data parallelism 1) has no row, so rows are not counted from the program.
    let lay = layout_of(&groups(&sim), sim.headline);
    assert_eq!(lay.drawn, vec![0, 1, 2, 3], "every stage drawn, stage 0 on top");
    assert!(lay.left_out.is_empty() && lay.note.is_empty());
    assert!(!lay.compact, "four stages: every stream has its own row");
    assert_eq!(png_size(&dir.path().join("timeline.png")), (lay.width, lay.height), "the image is that layout");
}

#[test]
fn sixteen_stages_are_all_drawn_within_a_bounded_height() {
    let dir = tempfile::tempdir().unwrap();
    let sim = write(&pipelined(16), dir.path());
    assert_eq!(sim.job.classes.len(), 16);
    let lay = layout_of(&groups(&sim), sim.headline);
    assert_eq!(lay.drawn, (0..16).collect::<Vec<_>>(), "16 stages: every one drawn");
    assert!(lay.compact, "16 groups: compute and one communication row each");
    let (w, h) = png_size(&dir.path().join("timeline.png"));
    assert_eq!((w, h), (lay.width, lay.height));
    assert_eq!(w, 1400, "memory.png's width");
    assert!(h <= 1000, "16 stages in {h} px");
}

/// The maximal runs of consecutive indices in `v` (sorted).
fn index_runs(v: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &k in v {
        match runs.last_mut() {
            Some(r) if r.1 + 1 == k => r.1 = k,
            _ => runs.push((k, k)),
        }
    }
    runs
}

#[test]
fn every_class_is_drawn_or_named_in_the_note() {
    for n in [1, 5, 16, 17, 32, 100, 5000] {
        let names: Vec<String> =
            (0..n).map(|k| format!("stage {}, data-parallel rank {} (ranks {k})", k / 8, k % 8)).collect();
        let lay = layout(&names, &vec![5; n], n / 3);
        assert!(lay.drawn.len() <= MAX_GROUPS && lay.drawn.contains(&(n / 3)), "{n}: the headline is drawn");
        let mut all: Vec<usize> = lay.drawn.iter().chain(&lay.left_out).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<_>>(), "{n}: drawn and left out partition the classes");
        assert_eq!(lay.left_out.is_empty(), lay.note.is_empty(), "{n}: a note exactly when classes are left out");
        let note = lay.note.join(" ");
        let last = lay.left_out.last().copied();
        let by_name = lay.left_out.iter().all(|&k| {
            note.contains(&format!("{};", names[k])) || (Some(k) == last && note.ends_with(&format!("{}.", names[k])))
        });
        let by_number = index_runs(&lay.left_out).iter().all(|&(a, b)| {
            let run = if a == b { format!("{a}") } else { format!("{a}-{b}") };
            [" ", ","].iter().any(|pre| [",", "."].iter().any(|post| note.contains(&format!("{pre}{run}{post}"))))
        });
        assert!(by_name || (by_number && note.contains("classes")), "{n}: a class left out but not named: {note}");
        assert!(n > 32 || lay.left_out.is_empty() || by_name, "{n}: few enough to name each");
        assert!(lay.note.len() <= 6 && lay.height <= MAX_HEIGHT, "{n} classes: {} px", lay.height);
    }
}

#[test]
fn many_classes_stay_bounded_and_the_picture_is_deterministic() {
    let s = Scenario::load(Path::new("scenarios/mixtral-8x7b-h100-ep8-hot-expert.toml")).unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sim = write(&s, a.path());
    write(&s, b.path());
    assert!(sim.job.classes.len() > MAX_GROUPS, "more classes than groups");
    let (w, h) = png_size(&a.path().join("timeline.png"));
    assert!(w == 1400 && h <= MAX_HEIGHT, "{w} x {h}");
    let bytes = |d: &Path| std::fs::read(d.join("timeline.png")).unwrap();
    assert!(bytes(a.path()) == bytes(b.path()), "byte-identical for the same input");
}

#[test]
fn the_red_band_is_the_reports_exposed_communication() {
    let sim = stepsim::simulate(&pipelined(4)).unwrap();
    for k in 0..4 {
        let (sc, tr, r) = (&sim.job.classes[k].schedule, &sim.run.traces[k], &sim.class_reports[k]);
        let marked: u64 = exposed_intervals(sc, tr, &r.steps, StreamClass::Comm).iter().map(|(s, e)| e - s).sum();
        let reported: f64 = r.steps.iter().map(|s| s.exposed_comm_s).sum();
        assert!(reported > 0.0, "stage {k}: a pipeline exposes its transfers");
        let rel = (marked as f64 / 1e9 - reported).abs() / reported;
        assert!(rel < 0.02, "stage {k}: band {} s vs report {reported} s", marked as f64 / 1e9);
    }
}

/// FSDP with CPU offload: the step waits on the CPU's Adam, not on the network. The amber
/// band is the report's `exposed_host_s`, the red band its `exposed_comm_s`, and the verdict
/// names the host.
#[test]
fn offload_waits_on_the_host_not_on_communication() {
    let s = Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/100b-8gpu-fsdp-cpu-offload.toml"))
        .unwrap();
    let sim = stepsim::simulate(&s).unwrap();
    let (sc, tr, r) = (&sim.job.classes[0].schedule, &sim.run.traces[0], &sim.class_reports[0]);
    let band = |which| exposed_intervals(sc, tr, &r.steps, which).iter().map(|(s, e)| e - s).sum::<u64>() as f64 / 1e9;
    let st = r.steps.last().unwrap();
    assert!(st.host_busy_s > 0.0 && st.exposed_host_s > 0.5 * st.time_s, "{st:?}");
    assert!(st.exposed_comm_s < st.exposed_host_s, "{st:?}");
    let (host, comm) = (band(StreamClass::Host), band(StreamClass::Comm));
    let (host_r, comm_r): (f64, f64) =
        (r.steps.iter().map(|s| s.exposed_host_s).sum(), r.steps.iter().map(|s| s.exposed_comm_s).sum());
    assert!((host - host_r).abs() <= 0.02 * host_r, "host band {host} s vs report {host_r} s");
    assert!((comm - comm_r).abs() <= 0.02 * comm_r.max(1e-3), "comm band {comm} s vs report {comm_r} s");
    // The split adds up to the step.
    let sum = st.compute_busy_s + st.exposed_comm_s + st.exposed_host_s + st.idle_s;
    assert!((sum - st.time_s).abs() < 1e-6 * st.time_s, "{st:?}");
    let v = &sim.report.throughput.as_ref().unwrap().verdict;
    assert_eq!(v.bound, "host-bound", "{v:?}");
}

/// Per kind, its drawn share of a row (pixels over columns x height) and its share of the
/// row's time (busy ns over the axis), for the tasks of `streams`.
fn drawn_and_true(g: &Group, streams: &[u16], end_ns: u64, height: u32) -> Vec<(usize, f64, f64)> {
    let tasks = row_tasks(g.sched, g.trace, streams);
    let ns_per_col = end_ns as f64 / PLOT_COLS as f64;
    let fills = column_fills(&tasks, ns_per_col, PLOT_COLS, height);
    (0..KINDS)
        .filter_map(|k| {
            let busy: u64 = tasks.iter().filter(|t| t.2 == k).map(|t| t.1 - t.0).sum();
            let px: u32 = fills.iter().map(|c| c[k]).sum();
            (busy > 0).then(|| (k, f64::from(px) / (PLOT_COLS as f64 * f64::from(height)), busy as f64 / end_ns as f64))
        })
        .collect()
}

/// Issue: ga8 (FSDP, gradient accumulation, full checkpointing) drew no recompute though the
/// text says 4.18 s/step of it, and no reduce-scatter: each column showed only the kind that
/// ran longest in it. Now a column's fill is each kind's share of its time, so every kind's
/// drawn area tracks its time.
#[test]
fn every_kinds_drawn_area_tracks_its_share_of_the_time() {
    let toml = "[model]\nfamily = \"llama\"\nn_layers = 32\nhidden = 4096\nn_heads = 32\nffn_hidden = 11008\n\
                vocab = 32000\nmax_seq_len = 4096\n[hardware]\ngpu = \"a100-80gb\"\ngpus = 8\n\
                [parallel]\nsharding = \"full_shard\"\n[training]\nmicro_batch = 2\nseq_len = 4096\ngrad_accum = 4\n\
                activation_checkpointing = \"full\"\nattention = \"flash\"\n";
    let sim = stepsim::simulate(&Scenario::from_toml(Path::new("<ga>"), toml).unwrap()).unwrap();
    let gs = groups(&sim);
    let g = &gs[0];
    let end = g.trace.end_time_ns;
    for (streams, h) in [(&[0u16][..], 24), (&[1u16][..], 14)] {
        for (k, drawn, time) in drawn_and_true(g, streams, end, h) {
            let name = entry_name(k);
            // Within 10% of the time share, or half a percent of the row for a kind whose
            // every pixel column gets its minimum pixel.
            assert!(
                (drawn - time).abs() <= (0.1 * time).max(0.005),
                "streams {streams:?}, {name}: drawn {drawn:.4} of the row, ran {time:.4} of the time"
            );
        }
    }
    let compute = drawn_and_true(g, &[0], end, 24);
    let share = |v: &[(usize, f64, f64)], k: usize| v.iter().find(|x| x.0 == k).map_or(0.0, |x| x.1);
    assert!(share(&compute, entry(stepsim::schedule::TaskKind::Recompute)) > 0.1, "recompute is a visible band");
    let comm = drawn_and_true(g, &[1], end, 14);
    assert!(share(&comm, entry(stepsim::schedule::TaskKind::ReduceScatter)) > 0.0, "reduce-scatters are drawn");
}

/// Issue: 100b-4gpu-tp4-inference drew its "tp" row as one solid all-reduce bar although
/// all-reduces take 8% of decode; the row now fills that share.
#[test]
fn a_stream_busy_a_few_percent_is_not_drawn_full() {
    let sim = stepsim::simulate(&shipped("100b-4gpu-tp4-inference.toml")).unwrap();
    let gs = groups(&sim);
    let tp = gs[0].sched.program.streams.iter().position(|s| s == "tp").unwrap() as u16;
    let v = drawn_and_true(&gs[0], &[tp], gs[0].trace.end_time_ns, 14);
    let (_, drawn, time) = v.iter().copied().find(|x| x.0 == entry(stepsim::schedule::TaskKind::AllReduce)).unwrap();
    assert!(time < 0.15, "all-reduces {time}");
    assert!(drawn < 0.2 && (drawn - time).abs() <= 0.1 * time + 0.02, "tp row filled {drawn} for a busy share {time}");
}

/// Issue: the red band marked a column when any of its time was exposed, so it ran under the
/// whole first forward of every GPipe stage (0.7 s) while the report says 0.111 s. Now its
/// drawn length is the report's exposed communication.
#[test]
fn the_red_bands_drawn_length_is_the_reports_exposed_communication() {
    let sim = stepsim::simulate(&shipped("gpt-13b-pp4-gpipe.toml")).unwrap();
    let gs = groups(&sim);
    let end = gs.iter().map(|g| g.trace.end_time_ns).max().unwrap();
    let ns_per_col = end as f64 / PLOT_COLS as f64;
    for (k, g) in gs.iter().enumerate() {
        let cols =
            exposed_columns(&exposed_intervals(g.sched, g.trace, g.steps, StreamClass::Comm), ns_per_col, PLOT_COLS);
        let drawn = cols.iter().filter(|&&m| m).count() as f64 * ns_per_col / 1e9;
        let reported: f64 = g.steps.iter().map(|s| s.exposed_comm_s).sum();
        assert!(reported > 0.1, "stage {k}: {reported}");
        assert!((drawn - reported).abs() <= 0.05 * reported, "stage {k}: band {drawn} s vs report {reported} s");
    }
}

/// Issue: an OOM run has no step timings, so no red band was drawn while its compute waited
/// on the first all-gathers: without steps, exposure is marked over the run.
#[test]
fn an_oom_run_without_steps_still_shows_its_exposed_communication() {
    let sim = stepsim::simulate(&shipped("100b-8gpu-fsdp.toml")).unwrap();
    let gs = groups(&sim);
    assert!(gs[0].steps.is_empty() && gs[0].trace.oom.is_some(), "an OOM run without step timings");
    let exposed: u64 =
        exposed_intervals(gs[0].sched, gs[0].trace, gs[0].steps, StreamClass::Comm).iter().map(|(s, e)| e - s).sum();
    assert!(exposed > 0, "compute waits on the first all-gather");
}

/// Issue: gpt-13b-pp4-1f1b's stage 0 drew empty send and receive rows although it runs 32 of
/// each: a task narrower than a pixel was a one-column rectangle the bitmap backend filled as
/// empty. Every transfer now fills its pixel column, with a tinted line behind it.
#[test]
fn every_pipeline_transfer_is_visible() {
    let sim = stepsim::simulate(&shipped("gpt-13b-pp4-1f1b.toml")).unwrap();
    let gs = groups(&sim);
    let end = gs.iter().map(|g| g.trace.end_time_ns).max().unwrap();
    for (k, g) in gs.iter().enumerate() {
        for name in ["p2p send", "p2p recv"] {
            let s = g.sched.program.streams.iter().position(|x| x == name).unwrap() as u16;
            let tasks = row_tasks(g.sched, g.trace, &[s]);
            assert!(tasks.len() >= 32, "stage {k} {name}: {}", tasks.len());
            let fills = column_fills(&tasks, end as f64 / PLOT_COLS as f64, PLOT_COLS, 14);
            let ns_per_col = end as f64 / PLOT_COLS as f64;
            for t in &tasks {
                let c = ((t.0 as f64 / ns_per_col) as usize).min(PLOT_COLS - 1);
                assert!(fills[c][t.2] >= 1, "stage {k} {name}: the transfer at {} ns is not drawn", t.0);
            }
            assert!(!lone_columns(&fills).is_empty(), "stage {k} {name}: lone transfers are marked");
        }
    }
}

/// Issue: an OOM while loading weights ends the run at t = 0: the axis had zero width and
/// its tick labels ran together. It now spans one second and the plot says what happened.
#[test]
fn an_oom_at_t_0_gets_an_axis_and_a_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let sim = write(&shipped("100b-8gpu-ddp.toml"), dir.path());
    let gs = groups(&sim);
    let lay = layout_of(&gs, sim.headline);
    assert_eq!(axis_end_s(&gs, &lay.drawn), 1.0);
    let msg = nothing_ran(&gs, &lay.drawn).unwrap();
    assert!(msg.starts_with("out of memory during initialisation at t = 0") && msg.ends_with("nothing ran"), "{msg}");
    assert_eq!(png_size(&dir.path().join("timeline.png")), (lay.width, lay.height));
    assert!(lay.height < 300, "one row and a short legend: {} px", lay.height);
    // A run that took time has its own end and no such sentence.
    let sim = stepsim::simulate(&pipelined(2)).unwrap();
    let gs = groups(&sim);
    assert!(nothing_ran(&gs, &[0, 1]).is_none() && axis_end_s(&gs, &[0, 1]) > 0.0);
}

/// Streams that ran nothing have no row: 1F1B's middle stages run no data-parallel
/// collective, so their "nccl" row is left out.
#[test]
fn streams_that_ran_nothing_have_no_row() {
    let sim = stepsim::simulate(&shipped("gpt-13b-pp4-1f1b.toml")).unwrap();
    let gs = groups(&sim);
    let names: Vec<String> = (0..4).map(|k| format!("class {k}")).collect();
    let lay = layout_of(&gs, sim.headline);
    assert_eq!(lay.height, layout(&names, &[5, 4, 4, 5], sim.headline).height, "stages 1 and 2 have no nccl row");
    assert!(lay.height < layout(&names, &[5; 4], sim.headline).height);
}
