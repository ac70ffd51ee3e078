"""stepsim from Python: simulate one LLM training step across many GPUs (memory over time,
the OOM point, throughput), explain an OOM, and sweep configurations.

The simulator is the Rust crate the ``stepsim`` command line is built from: a report here
is exactly the ``report.json`` that ``stepsim run`` writes for the same scenario.

Example::

    import stepsim

    report = stepsim.simulate("scenarios/gpt-1.3b-1gpu.toml")
    print(report.verdict, report.peak["allocated"]["gb"], report.step_time_s, report.mfu)
    mem = report.memory()  # memory.csv's columns (a pandas DataFrame when pandas is installed)

    for row in stepsim.sweep("scenarios/sweeps/100b-capacity.toml"):
        print(row["hardware.gpus"], row["verdict"], row["tokens_per_s"])

A scenario is a file path (``str`` or ``os.PathLike``), the text of a TOML scenario, or a
``dict`` of its tables (``{"model": {...}, "hardware": {...}, ...}``, the same fields as the
file). Bad input raises :class:`ScenarioError` (or :class:`SweepError`) naming the field;
a simulator bug raises :class:`SimulationError`. Simulations run with the GIL released.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Dict, List, Literal, Optional, Tuple, Union, cast, overload

from . import _stepsim
from ._errors import ScenarioError, SimulationError, SweepError
from ._stepsim import SweepRows
from ._types import (
    Bytes,
    CategoryBytes,
    MemoryColumns,
    ModelState,
    OomInstant,
    Peak,
    PhasePeak,
    RankClass,
    StepTiming,
    SweepRow,
    Throughput,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas

__all__ = [
    "__version__",
    "DEFAULT_MARGIN",
    "simulate",
    "explain",
    "sweep",
    "Report",
    "Explanation",
    "SweepRows",
    "ScenarioError",
    "SweepError",
    "SimulationError",
    "Bytes",
    "CategoryBytes",
    "MemoryColumns",
    "ModelState",
    "OomInstant",
    "Peak",
    "PhasePeak",
    "RankClass",
    "StepTiming",
    "SweepRow",
    "Throughput",
]

#: The package's version: the Rust crate's (the Cargo workspace version).
__version__: str = _stepsim.__version__

#: ``explain``'s default margin: a run that fits but peaks within this fraction of capacity
#: is explained too (``stepsim explain --margin``).
DEFAULT_MARGIN: float = _stepsim.DEFAULT_MARGIN

#: A scenario: a file path, TOML text, or a dict of the scenario's tables.
ScenarioLike = Union[str, "os.PathLike[str]", Mapping[str, Any]]
#: A sweep: a file path or TOML text.
SweepLike = Union[str, "os.PathLike[str]"]

_INLINE = "<inline>"


def _looks_like_toml(text: str) -> bool:
    return "\n" in text or "=" in text or text.lstrip().startswith("[")


def _text_or_path(x: Any, what: str) -> Tuple[str, str]:
    """("path", path) or ("toml", text) for a path or TOML text."""
    if isinstance(x, os.PathLike):
        return "path", os.fsdecode(os.fspath(x))
    if isinstance(x, str):
        # An existing file is a path; text that looks like TOML is TOML; anything else is a
        # path (and a missing file is an error naming it).
        if _looks_like_toml(x) and not os.path.isfile(x):
            return "toml", x
        return "path", x
    kinds = "a path (str or os.PathLike), TOML text" + (" or a dict" if what == "scenario" else "")
    raise TypeError(f"{what}: expected {kinds}, got {type(x).__name__}")


def _plain(x: Any, at: str = "") -> Any:
    """Mappings as dicts and tuples as lists, for json.dumps; an int TOML cannot hold is an
    error naming its field."""
    if isinstance(x, Mapping):
        return {k: _plain(v, f"{at}.{k}" if at else str(k)) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v, f"{at}[{i}]") for i, v in enumerate(x)]
    if isinstance(x, int) and not isinstance(x, bool) and not -(2**63) <= x < 2**63:
        message = f"{x} is out of range: TOML integers are 64-bit signed"
        raise ScenarioError(f"{_INLINE}: field `{at}`: {message}", _INLINE, at, message)
    return x


def _scenario_source(scenario: Any) -> Tuple[str, str]:
    if isinstance(scenario, Mapping):
        tree = _plain(scenario)
        try:
            text = json.dumps(tree, allow_nan=False)
        except (TypeError, ValueError) as e:
            message = f"the dict has no TOML form: {e}"
            raise ScenarioError(f"{_INLINE}: {message}", _INLINE, "", message) from None
        return "json", text
    return _text_or_path(scenario, "scenario")


class Report:
    """A simulation's report: exactly the ``report.json`` of ``stepsim run`` on the same
    scenario (:meth:`to_dict`), with typed properties over it and the memory curve
    (:meth:`memory`).

    Properties return copies: changing one does not change the report. The report keeps
    the simulation's memory samples for :meth:`memory` (about 2.5 kB per simulated task:
    GPT-3 175B's ~1.7 GB); drop the report to free them.
    """

    __slots__ = ("_sim", "_data")

    def __init__(self, sim: _stepsim.Simulation) -> None:
        """Wraps a finished simulation (use :func:`simulate` to make one)."""
        self._sim = sim
        self._data: Dict[str, Any] = json.loads(sim.report_json())

    def _get(self, key: str) -> Any:
        return copy.deepcopy(self._data.get(key))

    # -- the whole report

    def to_dict(self) -> Dict[str, Any]:
        """report.json as a dict: ``json.load(open("report.json"))`` of ``stepsim run``."""
        return cast("Dict[str, Any]", json.loads(self._sim.report_json()))

    def to_json(self) -> str:
        """report.json's text, byte for byte as ``stepsim run`` writes it."""
        return self._sim.report_json()

    def snapshots(self) -> Dict[str, bytes]:
        """Each rank class's allocator as a PyTorch memory snapshot (the pickle
        ``torch.cuda.memory._dump_snapshot()`` writes), by the file name ``stepsim run
        --snapshot`` gives it (``snapshot.pickle``, or ``snapshot-stage-2.pickle`` ... per
        class). ``pickle.loads`` reads one; written to a file, it opens in
        pytorch.org/memory_viz. Needs ``simulate(..., snapshot=True)``.

        Raises:
            ValueError: the report was simulated without ``snapshot=True``.
        """
        files = self._sim.snapshots()
        if not files:
            raise ValueError("no allocator history: simulate(..., snapshot=True) keeps it")
        return dict(files)

    # -- what was simulated

    @property
    def scenario(self) -> str:
        """The scenario's name (its ``name`` field, else the file's stem, else ``"<inline>"``)."""
        return cast("str", self._data["scenario"])

    @property
    def description(self) -> str:
        """The scenario's description."""
        return cast("str", self._data["description"])

    @property
    def job(self) -> str:
        """``"train"`` or ``"inference"``."""
        return cast("str", self._data["job"])

    @property
    def stepsim_version(self) -> str:
        """The simulator's version."""
        return cast("str", self._data["stepsim_version"])

    @property
    def param_count(self) -> int:
        """Parameters of the model."""
        return cast("int", self._data["param_count"])

    @property
    def trainable_params(self) -> int:
        """Parameters that get gradients (all of them, but for LoRA's adapters)."""
        return cast("int", self._data["trainable_params"])

    @property
    def gpus(self) -> int:
        """GPUs of the job."""
        return cast("int", self._data["hardware"]["gpus"])

    @property
    def capacity(self) -> Bytes:
        """Bytes per GPU the allocator may use (device memory less the CUDA context and the
        ``[allocator]`` reservations)."""
        return cast("Bytes", self._get("capacity"))

    # -- the verdict

    @property
    def verdict(self) -> str:
        """``"fits"`` or ``"oom"``, as report.json's ``verdict.verdict`` says: the GPU's
        verdict (:attr:`fits` also asks whether the node holds offloaded state)."""
        return cast("str", self._data["verdict"]["verdict"])

    @property
    def fits(self) -> bool:
        """Whether the job can run: the GPU's verdict is ``"fits"`` and, under offload, the
        node's host memory and NVMe hold the offloaded state (report.json's
        ``offload.host_fits`` and ``offload.nvme_fits``). Offloaded state the node cannot
        hold fails at initialisation whatever the GPU does; a sweep's row calls that an OOM
        at init, and so does explain."""
        offload = self._data.get("offload") or {}
        node = all(offload.get(k, True) is not False for k in ("host_fits", "nvme_fits"))
        return self.verdict == "fits" and node

    @property
    def oom(self) -> Optional[OomInstant]:
        """The GPU's out-of-memory instant (step, phase, layer, op, tensor, the bytes
        requested, allocated and free, what was live by category and the largest live
        tensors), or None when the GPU does not run out of memory."""
        return self._get("verdict") if self.verdict == "oom" else None

    @property
    def headroom(self) -> Optional[Bytes]:
        """Capacity left at the GPU's peak when the GPU's verdict is ``"fits"``, else None."""
        return self._get("verdict").get("headroom") if self.verdict == "fits" else None

    # -- memory

    @property
    def peak(self) -> Optional[Peak]:
        """The peak of allocated memory (up to the OOM instant when it does not fit): when,
        where, allocated and reserved bytes, and ``breakdown`` by category."""
        return cast("Optional[Peak]", self._get("peak"))

    @property
    def peak_breakdown(self) -> List[CategoryBytes]:
        """What was live at the peak, by category, largest first (empty without a peak)."""
        peak = self._data.get("peak")
        return copy.deepcopy(peak["breakdown"]) if peak else []

    @property
    def phase_peaks(self) -> List[PhasePeak]:
        """The highest allocated bytes of each phase of each step (step 0 = initialisation)."""
        return cast("List[PhasePeak]", self._get("phase_peaks"))

    @property
    def model_state(self) -> ModelState:
        """Model state per GPU (report.json's ``model_state_per_gpu``): parameters, master
        weights, gradients, optimizer state, their total and bytes per parameter, and the
        naive average (total model state / GPUs)."""
        return cast("ModelState", self._get("model_state_per_gpu"))

    @property
    def rank_classes(self) -> List[RankClass]:
        """The job's rank classes: GPUs that run the same program (every GPU, or each
        pipeline stage, data-parallel rank under ``[jitter]`` or expert-parallel rank under
        uneven routing), each simulated once."""
        return cast("List[RankClass]", self._get("rank_classes"))

    @overload
    def memory(self, as_frame: Literal[False]) -> MemoryColumns: ...
    @overload
    def memory(self, as_frame: Optional[bool] = None) -> Union[MemoryColumns, pandas.DataFrame]: ...

    def memory(self, as_frame: Optional[bool] = None) -> Union[MemoryColumns, pandas.DataFrame]:
        """The memory curve: memory.csv's columns ``time_s``, ``rank_class``, ``category``,
        ``bytes`` (bytes as Python ints), one row each time a category's bytes change, plus
        the ``allocated``, ``reserved`` and ``active`` totals and ``nvidia_smi`` (reserved plus
        the CUDA context and NCCL's buffers); values hold until the next row of the same rank
        class and category.

        Returns a pandas DataFrame when pandas can be imported, else a dict of lists;
        ``as_frame=False`` always gives the dict, ``as_frame=True`` requires pandas.
        """
        time_s, rank_class, category, nbytes = self._sim.memory_columns()
        cols: MemoryColumns = {"time_s": time_s, "rank_class": rank_class, "category": category, "bytes": nbytes}
        if as_frame is False:
            return cols
        try:
            import pandas as pd
        except ImportError:
            if as_frame:
                raise
            return cols
        return pd.DataFrame(cols)

    def memory_csv(self) -> str:
        """memory.csv's text with every change, byte for byte as ``stepsim run`` writes it
        (``stepsim run --memory-csv full`` past 1,000,000 rows, where the CLI's default is a
        summary)."""
        return self._sim.memory_csv()

    # -- time

    @property
    def throughput(self) -> Optional[Throughput]:
        """The steady-state step (time, tokens/s overall and per GPU, MFU, HFU, whether it is
        compute- or communication-bound), or None (a job that runs out of memory, an
        inference job: see :attr:`inference`)."""
        return cast("Optional[Throughput]", self._get("throughput"))

    def _throughput(self, key: str) -> Optional[float]:
        t = self._data.get("throughput")
        return cast("Optional[float]", t[key] if t else None)

    @property
    def step_time_s(self) -> Optional[float]:
        """Seconds per steady-state step, or None without throughput."""
        return self._throughput("step_time_s")

    @property
    def tokens_per_s(self) -> Optional[float]:
        """Tokens per second of the whole job, or None without throughput."""
        return self._throughput("tokens_per_s")

    @property
    def tokens_per_s_per_gpu(self) -> Optional[float]:
        """Tokens per second per GPU, or None without throughput."""
        return self._throughput("tokens_per_s_per_gpu")

    @property
    def mfu(self) -> Optional[float]:
        """Model FLOPs utilisation (0-1), or None without throughput."""
        return self._throughput("mfu")

    @property
    def steps(self) -> List[StepTiming]:
        """Each step's timing: busy and idle time of the compute and NCCL streams, recompute."""
        return cast("List[StepTiming]", self._get("steps"))

    # -- the rest

    @property
    def inference(self) -> Optional[Dict[str, Any]]:
        """An inference job's figures (TTFT, TPOT, KV cache, the largest batch and context
        that fit), else None."""
        return cast("Optional[Dict[str, Any]]", self._get("inference"))

    @property
    def explanation(self) -> Optional[Dict[str, Any]]:
        """``stepsim explain``'s answer when the report came from :func:`explain`, else None."""
        return cast("Optional[Dict[str, Any]]", self._get("explanation"))

    @property
    def assumptions(self) -> List[str]:
        """The assumptions each number rests on."""
        return cast("List[str]", self._get("assumptions"))

    def __repr__(self) -> str:
        parts = [self.verdict]
        if self.verdict == "fits" and not self.fits:
            parts = ["fits on the GPU, fails at initialisation: the node cannot hold the offloaded state"]
        peak = self._data.get("peak")
        if peak:
            parts.append(f"peak {peak['allocated']['gb']:.2f} GB ({peak['allocated']['gib']:.2f} GiB)")
        if self.step_time_s is not None:
            parts.append(f"{self.step_time_s:.3f} s/step")
        return f"<stepsim.Report {self.scenario}: {', '.join(parts)}>"


class Explanation:
    """``stepsim explain``'s answer: what was live at the OOM (or the peak near capacity) and
    why, and which single change fits at what cost.

    ``str(explanation)`` is the CLI's text; :meth:`to_dict` the structured explanation (also
    in ``report.to_dict()["explanation"]``, as the CLI's report.json carries it).
    ``report.memory()`` holds every rank class, as ``stepsim run``'s memory.csv does (the
    memory.csv ``stepsim explain`` writes has the headline class only).
    """

    __slots__ = ("_json", "text", "report")

    text: str
    report: Report

    def __init__(self, sim: _stepsim.Simulation, explanation_json: str, text: str) -> None:
        """Wraps a finished explanation (use :func:`explain` to make one)."""
        self._json = explanation_json
        #: The rendered explanation, as ``stepsim explain`` prints it.
        self.text = text
        #: The report of the run explained, with its ``explanation``.
        self.report = Report(sim)

    def to_dict(self) -> Dict[str, Any]:
        """The structured explanation: status, summary, the live tensors with their reasons,
        the naive average, the counterfactuals (each change re-simulated) and the answer."""
        return cast("Dict[str, Any]", json.loads(self._json))

    @property
    def status(self) -> str:
        """``"oom"``, ``"near_capacity"`` or ``"fits"``."""
        return cast("str", self.to_dict()["status"])

    @property
    def answer(self) -> str:
        """The answer: the cheapest change that fits, if any."""
        return cast("str", self.to_dict()["answer"])

    @property
    def counterfactuals(self) -> List[Dict[str, Any]]:
        """Each single change, re-simulated: whether it fits, its peak and step time."""
        return cast("List[Dict[str, Any]]", self.to_dict()["counterfactuals"])

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"<stepsim.Explanation {self.report.scenario}: {self.status}>"


def simulate(scenario: ScenarioLike, *, snapshot: bool = False) -> Report:
    """Simulates a scenario, as ``stepsim run`` does (the same checks, the same report).

    Args:
        scenario: a scenario file (``str`` or ``os.PathLike``), the text of a TOML scenario,
            or a dict of its tables. A ``str`` is a path when it names an existing file or
            does not look like TOML (no newline, ``=`` or leading ``[``).
        snapshot: also keep each rank class's allocator history, as ``stepsim run
            --snapshot`` does, for :meth:`Report.snapshots` (PyTorch memory snapshots). The
            report is the same either way.

    Returns:
        The :class:`Report` (``report.to_dict()`` is ``stepsim run``'s report.json).

    Raises:
        ScenarioError: the scenario is invalid (``field`` names the field), or too large for
            a full report.
        SimulationError: an internal error of the simulator.
    """
    kind, payload = _scenario_source(scenario)
    return Report(_stepsim.simulate(kind, payload, bool(snapshot)))


def explain(scenario: ScenarioLike, margin: float = DEFAULT_MARGIN) -> Explanation:
    """Explains an OOM, or a peak within ``margin`` of capacity, as ``stepsim explain`` does:
    what was live and why, and which single change fits at what cost (each re-simulated).

    Args:
        scenario: as for :func:`simulate`.
        margin: the fraction of capacity within which a run that fits is still explained,
            in [0, 1).

    Raises:
        ScenarioError: an invalid scenario, an inference job (explain covers training and
            LoRA fine-tuning), or a job too large to simulate ~16 times.
        ValueError: a margin outside [0, 1).
        SimulationError: an internal error of the simulator.
    """
    kind, payload = _scenario_source(scenario)
    sim, explanation, text = _stepsim.explain(kind, payload, float(margin))
    return Explanation(sim, explanation, text)


def sweep(spec: SweepLike, jobs: Optional[int] = None, *, ordered: bool = False) -> SweepRows:
    """Runs a sweep (a base scenario plus axes, a filter, an objective: the file
    ``stepsim sweep`` takes) and yields its rows as they finish.

    The spec is checked and every configuration enumerated (and the filter applied) before
    this returns: errors are raised here. The simulations then run on ``jobs`` threads
    (default: one per core, or ``RAYON_NUM_THREADS``) in the background while you read.

    Args:
        spec: a sweep file (``str`` or ``os.PathLike``; a relative ``base`` is relative to
            it) or the text of one (a relative ``base`` is relative to the working folder).
        jobs: worker threads.
        ordered: yield rows in configuration order (sweep.csv's order) instead of as they
            finish.

    Returns:
        An iterator of rows (:data:`SweepRow`): dicts keyed by sweep.csv's header (its
        ``columns``) with the values of the CLI's sweep.csv row for that configuration
        (numbers as int or float, an axis value as the sweep file gives it, an empty cell
        as None). ``total`` is the number of rows it will yield.

    Raises:
        SweepError: a bad sweep file, base scenario, configuration, filter or ``jobs``.
        SimulationError: an internal error of the simulator (raised while iterating).
    """
    kind, payload = _text_or_path(spec, "spec")
    if jobs is not None:
        jobs = max(int(jobs), 0)
    return _stepsim.sweep(kind, payload, jobs, ordered)

