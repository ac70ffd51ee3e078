"""The package: its version is the crate's, it is typed and documented, and the example
notebook runs."""

from __future__ import annotations

import importlib.metadata
import inspect
import pathlib
import re
import subprocess
import sys

import stepsim
from conftest import REPO


def workspace_version() -> str:
    text = (REPO / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[1]
    m = re.search(r'^version\s*=\s*"([^"]+)"', section, re.M)
    assert m, "no version in [workspace.package]"
    return m.group(1)


def test_version_is_the_crates() -> None:
    assert stepsim.__version__ == workspace_version()
    assert importlib.metadata.version("stepsim") == stepsim.__version__


def test_typed_and_documented() -> None:
    pkg = pathlib.Path(stepsim.__file__).parent
    assert (pkg / "py.typed").is_file()
    assert (pkg / "_stepsim.pyi").is_file()
    assert stepsim.__doc__
    for name in stepsim.__all__:
        obj = getattr(stepsim, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"stepsim.{name} has no docstring"
    for cls in (stepsim.Report, stepsim.Explanation):
        for name, member in vars(cls).items():
            if not name.startswith("_") and (isinstance(member, property) or inspect.isfunction(member)):
                assert member.__doc__, f"{cls.__name__}.{name} has no docstring"
    for name in ("columns", "total", "close"):
        assert getattr(stepsim.SweepRows, name).__doc__, f"SweepRows.{name} has no docstring"


def test_notebook_runs(tmp_path: pathlib.Path) -> None:
    notebook = REPO / "examples" / "notebook.py"
    p = subprocess.run([sys.executable, str(notebook)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "verdict: fits" in out
    assert "peak:" in out and "throughput:" in out and "MFU" in out
    assert "memory curve:" in out
    assert "100b-32gpu-fsdp: oom in step 1, backward, layer 79" in out
    assert "400 configurations" in out and "best rows" in out
