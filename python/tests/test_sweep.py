"""stepsim.sweep against `stepsim sweep`: the same rows (sweep.csv's header and values), the
same filter, the same errors."""

from __future__ import annotations

import csv
import pathlib
from typing import Any, Dict, List

import pytest

import stepsim
from conftest import REPO, SCENARIOS

SHIPPED = SCENARIOS / "sweeps" / "100b-capacity.toml"

# A small sweep with a filter, a boolean axis and a token budget (the gpu_hours column).
SMALL = """
name = "py-small"
base = "{base}"
token_budget = 1e9
filter = ["micro_batch * grad_accum <= 16"]

[axes]
training.micro_batch = [2, 4, 6, 8]
allocator.expandable_segments = [false, true]
training.grad_accum = [1, 2, 4]
"""


def small_text() -> str:
    return SMALL.format(base=(SCENARIOS / "fragmentation-oom.toml").as_posix())


def read_csv(path: pathlib.Path) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def same(cell: str, value: Any) -> bool:
    """Whether a row's value is what sweep.csv's cell says."""
    if value is None:
        return cell == ""
    if isinstance(value, bool):
        return cell == ("true" if value else "false")
    if isinstance(value, int):
        return cell == str(value)
    if isinstance(value, float):
        return float(cell) == value
    return cell == value


def assert_rows_equal_csv(rows: List[Dict[str, Any]], table: List[Dict[str, str]]) -> None:
    assert len(rows) == len(table)
    for row, line in zip(rows, table):
        assert list(row) == list(line)
        bad = {k: (line[k], v) for k, v in row.items() if not same(line[k], v)}
        assert not bad, f"configuration {row['index']}: {bad}"


def test_shipped_sweep_equals_the_cli(run_cli) -> None:
    cli = run_cli("sweep", SHIPPED.relative_to(REPO))
    assert cli.returncode == 0, cli.stderr
    table = read_csv(cli.out / "sweep.csv")
    it = stepsim.sweep(SHIPPED)
    with open(cli.out / "sweep.csv") as f:
        assert ",".join(it.columns) == f.readline().rstrip("\n")
    assert it.total == len(table) == 400
    rows = list(it)
    # As they finish: every configuration once; sorted, sweep.csv.
    assert sorted(r["index"] for r in rows) == [int(line["index"]) for line in table]
    assert_rows_equal_csv(sorted(rows, key=lambda r: r["index"]), table)
    assert {type(r["gpus"]) for r in rows} == {int}
    assert {r["verdict"] for r in rows} == {"fits", "oom"}


def test_small_sweep_with_filter_equals_the_cli(tmp_path: pathlib.Path, run_cli) -> None:
    spec = tmp_path / "small.toml"
    spec.write_text(small_text())
    cli = run_cli("sweep", spec)
    assert cli.returncode == 0, cli.stderr
    table = read_csv(cli.out / "sweep.csv")
    assert "gpu_hours" in table[0]
    # The filter left out micro_batch x grad_accum > 16: 24 - 4 configurations.
    assert len(table) == 20
    ordered = list(stepsim.sweep(spec, jobs=1, ordered=True))
    assert_rows_equal_csv(ordered, table)
    assert [r["index"] for r in ordered] == [int(line["index"]) for line in table]
    # The text of the same file gives the same rows (in a fresh order).
    as_text = sorted(stepsim.sweep(small_text(), jobs=2), key=lambda r: r["index"])
    assert as_text == ordered
    assert {r["allocator.expandable_segments"] for r in ordered} == {False, True}


def test_stopping_early_stops_the_workers() -> None:
    it = stepsim.sweep(SHIPPED, jobs=2)
    first = [next(it) for _ in range(3)]
    assert len(first) == 3
    it.close()
    assert list(it) == []


@pytest.mark.parametrize(
    "change,field,says",
    [
        ("training.micro_batchh = [1, 2]", "axes.training.micro_batchh", "unknown field"),
        ("training.micro_batch = []", "axes.training.micro_batch", ""),
    ],
)
def test_bad_axis(change: str, field: str, says: str) -> None:
    text = f'base = "{(SCENARIOS / "gpt-1.3b-1gpu.toml").as_posix()}"\n[axes]\n{change}\n'
    with pytest.raises(stepsim.SweepError) as e:
        stepsim.sweep(text)
    assert e.value.kind == "input"
    assert e.value.file == "<inline>"
    assert e.value.field == field
    assert says in e.value.message


def test_errors_equal_the_cli(tmp_path: pathlib.Path, run_cli) -> None:
    spec = tmp_path / "none-pass.toml"
    spec.write_text(small_text().replace("<= 16", "> 1000"))
    with pytest.raises(stepsim.SweepError) as e:
        stepsim.sweep(spec)
    assert (e.value.file, e.value.field) == (str(spec), "filter")
    cli = run_cli("sweep", spec)
    assert cli.returncode == 2 and cli.stderr.strip() == f"error: {e.value}"


def test_bad_jobs_and_sources() -> None:
    for jobs in (0, -3, 10**6):
        with pytest.raises(stepsim.SweepError, match="jobs"):
            stepsim.sweep(SHIPPED, jobs=jobs)
    with pytest.raises(stepsim.SweepError) as e:
        stepsim.sweep("scenarios/sweeps/no-such-sweep.toml")
    assert e.value.file == "scenarios/sweeps/no-such-sweep.toml"
    with pytest.raises(TypeError):
        stepsim.sweep({"base": "x"})  # type: ignore[arg-type]


def test_invalid_configuration_names_axis_and_field() -> None:
    text = f'base = "{(SCENARIOS / "gpt-1.3b-1gpu.toml").as_posix()}"\n[axes]\ntraining.micro_batch = [1, 0]\n'
    with pytest.raises(stepsim.SweepError) as e:
        stepsim.sweep(text)
    assert e.value.file == "<inline>"
    assert e.value.field == "training.micro_batch"
    assert "axis `training.micro_batch` = 0" in e.value.message
