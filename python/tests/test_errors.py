"""Errors: a bad scenario raises stepsim.ScenarioError naming the file and the field, whatever
form the scenario takes; nothing else escapes as a panic."""

from __future__ import annotations

import copy
import pathlib

import pytest

import stepsim
from conftest import REPO, SCENARIOS

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli", reason="Python < 3.11 needs tomli to read TOML in the tests")

BASE = tomllib.loads((SCENARIOS / "gpt-1.3b-1gpu.toml").read_text())


def changed(section: str, key: str, value: object) -> dict:
    tree = copy.deepcopy(BASE)
    tree[section][key] = value
    return tree


@pytest.mark.parametrize(
    "section,key,value,field,says",
    [
        ("model", "n_heads", 0, "model.n_heads", "positive"),
        ("model", "n_headz", 16, "model.n_headz", "unknown field"),
        ("model", "n_heads", "sixteen", "model.n_heads", "invalid type"),
        ("model", "n_heads", None, "model.n_heads", "None"),
        ("training", "micro_batch", 2**70, "training.micro_batch", "out of range"),
        ("hardware", "gpu", "h9000", "hardware.gpu", "h9000"),
    ],
)
def test_dict_errors_name_the_field(section: str, key: str, value: object, field: str, says: str) -> None:
    with pytest.raises(stepsim.ScenarioError) as e:
        stepsim.simulate(changed(section, key, value))
    err = e.value
    assert isinstance(err, ValueError)
    assert err.file == "<inline>"
    assert err.field == field
    assert says in err.message
    assert str(err) == f"<inline>: field `{field}`: {err.message}"


def test_toml_string_error_names_field_and_line() -> None:
    text = (SCENARIOS / "gpt-1.3b-1gpu.toml").read_text().replace("n_heads = 16", "n_heads = 0")
    with pytest.raises(stepsim.ScenarioError) as e:
        stepsim.simulate(text)
    assert (e.value.file, e.value.field) == ("<inline>", "model.n_heads")


def test_file_error_names_the_file(tmp_path: pathlib.Path, run_cli) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text((SCENARIOS / "gpt-1.3b-1gpu.toml").read_text().replace("[training]", "[training]\nmicro_batchh = 1"))
    with pytest.raises(stepsim.ScenarioError) as e:
        stepsim.simulate(bad)
    assert e.value.file == str(bad)
    assert e.value.field == "training.micro_batchh"
    # The CLI's message, word for word.
    cli = run_cli("run", bad)
    assert cli.returncode == 2 and cli.stderr.strip() == f"error: {e.value}"


def test_missing_file() -> None:
    with pytest.raises(stepsim.ScenarioError) as e:
        stepsim.simulate("scenarios/no-such-scenario.toml")
    assert e.value.file == "scenarios/no-such-scenario.toml"
    assert e.value.field == ""
    assert "cannot read the scenario file" in e.value.message


def test_not_a_scenario() -> None:
    with pytest.raises(TypeError):
        stepsim.simulate(42)  # type: ignore[arg-type]
    with pytest.raises(stepsim.ScenarioError) as e:
        stepsim.simulate({"model": {"n_layers": float("nan")}})
    assert e.value.file == "<inline>"
    with pytest.raises(stepsim.ScenarioError):
        stepsim.simulate({"model": object()})


def test_too_large_for_a_full_report() -> None:
    # About 2 x 2048 x 1200 tasks: over what a full report holds (2 million), within what a
    # sweep's lean path runs; refused before anything is simulated, as `stepsim run` does.
    tree = changed("training", "grad_accum", 2048)
    with pytest.raises(stepsim.ScenarioError) as e:
        stepsim.simulate(tree)
    assert e.value.field == "training.grad_accum"
    assert "a full report holds" in e.value.message


def test_error_classes() -> None:
    assert issubclass(stepsim.ScenarioError, ValueError)
    assert issubclass(stepsim.SweepError, ValueError)
    assert issubclass(stepsim.SimulationError, RuntimeError)


def test_relative_path_is_relative_to_the_working_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert stepsim.simulate("scenarios/gpt-1.3b-1gpu.toml").fits
