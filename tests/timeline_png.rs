//! timeline.png (issue 24): every rank class gets a row group on one time axis, the image
//! height stays bounded however many classes a job has, every class is drawn or named in
//! the note, and the picture is byte-identical for the same input.

use std::path::Path;

use stepsim::report::timeline_png::{exposed_intervals, layout, MAX_GROUPS, MAX_HEIGHT};
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
    stepsim::report::write::write_job(dir, &sim.report, &views, &sim.job.links, sim.headline, false).unwrap();
    drop(views);
    sim
}

/// Width and height from the PNG's IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert!(b.starts_with(b"\x89PNG\r\n\x1a\n") && &b[12..16] == b"IHDR", "{} is not a PNG", path.display());
    (u32::from_be_bytes(b[16..20].try_into().unwrap()), u32::from_be_bytes(b[20..24].try_into().unwrap()))
}

fn streams(sim: &stepsim::Simulation) -> Vec<usize> {
    sim.job.classes.iter().map(|c| c.schedule.program.streams.len()).collect()
}

#[test]
fn a_pipeline_gets_one_row_group_per_stage() {
    let dir = tempfile::tempdir().unwrap();
    let sim = write(&pipelined(4), dir.path());
    assert_eq!(sim.job.classes.len(), 4, "one class per stage");
    let names: Vec<String> = (0..4).map(|k| format!("stage {k}")).collect();
    let lay = layout(&names, &streams(&sim), sim.headline);
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
    let names: Vec<String> = (0..16).map(|k| format!("stage {k}")).collect();
    let lay = layout(&names, &streams(&sim), sim.headline);
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
