"""Shared fixtures: the repository, the release CLI to compare against, and its outputs.

The CLI is ``$STEPSIM_BIN`` if set, else ``$CARGO_TARGET_DIR/release/stepsim``, else
``target/release/stepsim`` of the repository (``cargo build --release`` builds it; python/ci.sh
does). Tests that compare with it are skipped, saying why, when it is missing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Dict, NamedTuple, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "scenarios"


def cli_path() -> Path:
    if os.environ.get("STEPSIM_BIN"):
        return Path(os.environ["STEPSIM_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    return target / "release" / "stepsim"


class CliRun(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    out: Path


@pytest.fixture(scope="session")
def cli() -> Path:
    """The release CLI, or a skip naming where it was looked for."""
    path = cli_path()
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.skip(
            f"no stepsim CLI at {path}: run `cargo build --release` (or set STEPSIM_BIN) to compare with the CLI"
        )
    return path


class _Runner:
    """Runs the CLI once per (command, file) and keeps what it wrote."""

    def __init__(self, cli: Path, root: Path) -> None:
        self.cli = cli
        self.root = root
        self.done: Dict[str, CliRun] = {}

    def __call__(self, command: str, path: Path, *extra: str, out: Optional[str] = None) -> CliRun:
        key = " ".join([command, str(path), *extra])
        if key not in self.done:
            dest = self.root / (out or f"{command}-{len(self.done)}")
            p = subprocess.run(
                [str(self.cli), command, str(path), "--out", str(dest), *extra],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=600,
            )
            self.done[key] = CliRun(p.returncode, p.stdout, p.stderr, dest)
        return self.done[key]


@pytest.fixture(scope="session")
def run_cli(cli: Path, tmp_path_factory: pytest.TempPathFactory) -> _Runner:
    """``run_cli("run", path)``: the CLI's exit code, output and output folder (cached)."""
    return _Runner(cli, tmp_path_factory.mktemp("cli"))
