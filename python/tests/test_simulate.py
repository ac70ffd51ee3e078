"""stepsim.simulate against `stepsim run`: the same report.json and memory.csv for every
shipped scenario, and the same report whatever form the scenario takes."""

from __future__ import annotations

import copy
import json
import csv
import pathlib
from typing import Any, Dict, List

import pytest

import stepsim
from conftest import REPO, SCENARIOS

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli", reason="Python < 3.11 needs tomli to read TOML in the tests")

ALL = sorted(p.stem for p in SCENARIOS.glob("*.toml"))
# memory.csv of gpt3-175b has 4.7 million rows: its text is compared whole, its columns by
# length only (reading it into Python lists takes seconds and ~1.5 GB).
HUGE_MEMORY = {"gpt3-175b"}


def read_memory_csv(path: pathlib.Path) -> Dict[str, List[Any]]:
    """memory.csv as columns, read with Python's csv module (a rank class that holds a comma,
    "stage 0, expert rank 3 (ranks 3)", is quoted)."""
    cols: Dict[str, List[Any]] = {"time_s": [], "rank_class": [], "category": [], "bytes": []}
    with open(path, newline="") as f:
        rows = csv.reader(f)
        assert next(rows) == ["time_s", "rank_class", "category", "bytes"]
        for t, rank_class, category, nbytes in rows:
            cols["time_s"].append(float(t))
            cols["rank_class"].append(rank_class)
            cols["category"].append(category)
            cols["bytes"].append(int(nbytes))
    return cols


@pytest.mark.parametrize("name", ALL)
def test_report_and_memory_equal_the_cli(name: str, run_cli) -> None:
    path = SCENARIOS / f"{name}.toml"
    # The Python report's memory is every change; the CLI summarises a memory.csv past
    # 1,000,000 rows unless asked for every change.
    cli = run_cli("run", path.relative_to(REPO), *(["--memory-csv", "full"] if name in HUGE_MEMORY else []))
    if cli.returncode == 2:
        # A scenario `stepsim run` refuses: the same refusal, the same message.
        with pytest.raises(stepsim.ScenarioError) as e:
            stepsim.simulate(path.relative_to(REPO))
        assert f"error: {e.value}" == cli.stderr.strip()
        return
    assert cli.returncode == 0, cli.stderr
    report = stepsim.simulate(str(path))
    with open(cli.out / "report.json") as f:
        text = f.read()
    assert report.to_dict() == json.loads(text)
    assert report.to_json() == text
    csv = cli.out / "memory.csv"
    assert report.memory_csv() == csv.read_text()
    cols = report.memory(as_frame=False)
    assert list(cols) == ["time_s", "rank_class", "category", "bytes"]
    if name in HUGE_MEMORY:
        assert len(cols["bytes"]) == sum(1 for _ in open(csv)) - 1
    else:
        assert cols == read_memory_csv(csv)
        assert all(type(b) is int for b in cols["bytes"])


def test_typed_properties_match_the_dict() -> None:
    r = stepsim.simulate(SCENARIOS / "100b-32gpu-fsdp-ac.toml")
    d = r.to_dict()
    assert r.verdict == d["verdict"]["verdict"] == "fits"
    assert r.fits is True and r.oom is None
    assert r.headroom == d["verdict"]["headroom"]
    assert r.peak == d["peak"] and r.peak_breakdown == d["peak"]["breakdown"]
    assert r.model_state == d["model_state_per_gpu"]
    assert r.throughput == d["throughput"]
    assert r.step_time_s == d["throughput"]["step_time_s"]
    assert r.tokens_per_s == d["throughput"]["tokens_per_s"]
    assert r.tokens_per_s_per_gpu == d["throughput"]["tokens_per_s_per_gpu"]
    assert r.mfu == d["throughput"]["mfu"]
    assert r.rank_classes == d["rank_classes"]
    assert r.capacity == d["capacity"]
    assert r.phase_peaks == d["phase_peaks"] and r.steps == d["steps"]
    assert r.scenario == "100b-32gpu-fsdp-ac" and r.job == "train" and r.gpus == 32
    assert r.param_count == d["param_count"] and r.assumptions == d["assumptions"]
    assert r.inference is None and r.explanation is None
    assert r.stepsim_version == stepsim.__version__
    # Properties are copies.
    r.peak["allocated"]["bytes"] = 0
    assert r.peak == d["peak"]
    assert "fits" in repr(r)


def test_oom_report() -> None:
    r = stepsim.simulate(SCENARIOS / "100b-32gpu-fsdp.toml")
    d = r.to_dict()
    assert r.verdict == "oom" and not r.fits
    assert r.oom == d["verdict"]
    assert (r.oom["step"], r.oom["phase"], r.oom["layer"]) == (1, "backward", 79)
    assert r.headroom is None and r.throughput is None and r.step_time_s is None and r.mfu is None


def test_offload_the_node_cannot_hold_does_not_fit() -> None:
    """ZeRO-Offload of the 100B model with 512 GB of host memory: each GPU holds its share,
    but the node cannot hold the 1.62 TB of offloaded state, so the run fails at
    initialisation. The GPU's verdict stays "fits"; the job does not fit, as a sweep's row
    (OOM at init) and explain say."""
    tree = tomllib.loads((SCENARIOS / "100b-8gpu-zero3-offload.toml").read_text())
    tree["name"] = "offload-512gb-host"
    tree["offload"]["cpu_memory"] = "512GB"
    r = stepsim.simulate(tree)
    assert r.verdict == "fits" and not r.fits
    assert r.to_dict()["offload"]["host_fits"] is False
    assert r.oom is None and r.headroom is not None
    assert "fails at initialisation" in repr(r), repr(r)
    assert stepsim.simulate(SCENARIOS / "100b-8gpu-zero3-offload.toml").fits


def test_inference_report() -> None:
    r = stepsim.simulate(SCENARIOS / "100b-1gpu-int4-inference.toml")
    assert r.job == "inference" and r.fits
    assert r.inference is not None and r.inference["max_fit"]["max_batch"] >= 1


def test_memory_frame() -> None:
    pd = pytest.importorskip("pandas")
    r = stepsim.simulate(SCENARIOS / "gpt-13b-pp4-1f1b.toml")
    df = r.memory()
    assert isinstance(df, pd.DataFrame)
    cols = r.memory(as_frame=False)
    assert list(df.columns) == list(cols)
    assert df["bytes"].tolist() == cols["bytes"]
    assert df["rank_class"].tolist() == cols["rank_class"]
    # Several rank classes: every pipeline stage.
    assert df["rank_class"].nunique() == 4


def _with_name(name: str, text: str) -> str:
    return f'name = "{name}"\n' + text


# A plain model, a zoo model (mixtral), a Hugging Face config path is not used by the
# shipped files; offload and pipeline stages exercise the report's optional parts.
FORMS = ["gpt-1.3b-1gpu", "mixtral-8x7b-h100-ep8-hot-expert", "100b-8gpu-zero3-offload", "gpt-13b-pp4-interleaved-1f1b"]


@pytest.mark.parametrize("name", FORMS)
def test_dict_and_toml_string_give_the_path_report(name: str) -> None:
    path = SCENARIOS / f"{name}.toml"
    expected = stepsim.simulate(str(path)).to_dict()
    assert stepsim.simulate(path).to_dict() == expected  # os.PathLike
    text = path.read_text()
    assert stepsim.simulate(_with_name(name, text)).to_dict() == expected
    tree = tomllib.loads(text)
    tree["name"] = name
    assert stepsim.simulate(tree).to_dict() == expected
    # Without a name an inline scenario is "<inline>"; nothing else changes.
    inline = stepsim.simulate(text).to_dict()
    assert inline["scenario"] == "<inline>"
    inline["scenario"] = name
    assert inline == expected


def test_dict_is_not_modified() -> None:
    tree = tomllib.loads((SCENARIOS / "gpt-1.3b-1gpu.toml").read_text())
    before = copy.deepcopy(tree)
    stepsim.simulate(tree)
    assert tree == before


def test_simulation_releases_the_gil() -> None:
    import threading
    import time

    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    time.sleep(0.05)
    before = ticks
    start = time.perf_counter()
    stepsim.simulate(SCENARIOS / "gpt-13b-pp4-gpipe.toml")
    elapsed = time.perf_counter() - start
    during = ticks - before
    stop.set()
    t.join()
    # With the GIL held the counting thread could not run at all during the call; released,
    # it ticks about once a millisecond.
    assert during >= 5 and during >= 0.25 * elapsed / 0.001, (elapsed, during)
