"""stepsim.explain against `stepsim explain`: the same text, the same report.json (with its
explanation), and the same refusals."""

from __future__ import annotations

import copy
import json

import pytest

import stepsim
from conftest import REPO, SCENARIOS

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli", reason="Python < 3.11 needs tomli to read TOML in the tests")


@pytest.mark.parametrize("name", ["100b-32gpu-fsdp", "gpt-1.3b-1gpu", "100b-8gpu-ddp"])
def test_explain_equals_the_cli(name: str, run_cli) -> None:
    path = (SCENARIOS / f"{name}.toml").relative_to(REPO)
    cli = run_cli("explain", path)
    assert cli.returncode == 0, cli.stderr
    e = stepsim.explain(REPO / path)
    text, wrote = cli.stdout.rsplit("\nWrote ", 1)
    assert e.text == text and str(e) == text
    with open(cli.out / "report.json") as f:
        cli_report = json.load(f)
    assert e.report.to_dict() == cli_report
    assert e.to_dict() == cli_report["explanation"] == e.report.explanation


def test_explain_fields() -> None:
    e = stepsim.explain(SCENARIOS / "100b-32gpu-fsdp.toml")
    d = e.to_dict()
    assert e.status == d["status"] == "oom"
    assert e.answer == d["answer"] and "fits" in e.answer
    assert e.counterfactuals == d["counterfactuals"] and len(e.counterfactuals) > 3
    assert not e.report.fits


def test_explain_shards_a_replicated_job_over_more_gpus() -> None:
    # DDP's replicated state does not shrink with the GPU count; FULL_SHARD over more GPUs fits.
    e = stepsim.explain(SCENARIOS / "100b-8gpu-ddp.toml")
    rows = [c for c in e.counterfactuals if c["change"].startswith("GPUs 8 -> ")]
    assert [c["fits"] for c in rows] == [False, True]
    assert rows[1]["change"].endswith("FULL_SHARD / ZeRO-3") and "FULL_SHARD" in e.answer


def test_margin() -> None:
    assert stepsim.DEFAULT_MARGIN == 0.05
    fits = SCENARIOS / "gpt-1.3b-1gpu.toml"
    assert stepsim.explain(fits).status == "fits"
    for bad in (-0.1, 1.0, 2.0):
        with pytest.raises(ValueError, match="margin"):
            stepsim.explain(fits, margin=bad)


def test_explain_refuses_inference(run_cli) -> None:
    path = (SCENARIOS / "100b-1gpu-int4-inference.toml").relative_to(REPO)
    with pytest.raises(stepsim.ScenarioError) as e:
        stepsim.explain(REPO / path)
    assert e.value.file == str(REPO / path)
    cli = run_cli("explain", path)
    assert cli.returncode == 2
    # The CLI's reason (the binding adds where to go from Python).
    assert cli.stderr.split(": ", 2)[2].split(";")[0] == e.value.message.split(";")[0]


def test_explain_takes_lora_and_offers_qlora() -> None:
    # The 16-bit 70B base does not load on one A100; QLoRA's 4-bit base fits there.
    e = stepsim.explain(SCENARIOS / "llama2-70b-lora-1gpu.toml")
    assert e.status == "oom"
    assert "QLoRA" in e.answer


def test_explain_refuses_a_job_too_large_to_explain() -> None:
    # ~2 steps x 512 x 1200 tasks: a full report holds it, 16 simulations of it do not.
    tree = tomllib.loads((SCENARIOS / "gpt-1.3b-1gpu.toml").read_text())
    tree = copy.deepcopy(tree)
    tree["training"]["grad_accum"] = 512
    with pytest.raises(stepsim.ScenarioError) as e:
        stepsim.explain(tree)
    assert e.value.field == "training.grad_accum"
    assert "explain simulates this job" in e.value.message
