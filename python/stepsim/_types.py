"""Typed views of report.json's parts (``TypedDict``s: at run time they are plain dicts).

They name the keys every report has; some parts carry more (a pipeline stage's figures,
``[jitter]`` statistics, ...): ``Report.to_dict()`` has everything the CLI writes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict, Union

__all__ = [
    "Bytes",
    "CategoryBytes",
    "OomInstant",
    "Peak",
    "PhasePeak",
    "ModelState",
    "Throughput",
    "ThroughputVerdict",
    "RankClass",
    "StepTiming",
    "MemoryColumns",
    "SweepRow",
]


class Bytes(TypedDict):
    """A byte count, also in GB (1e9 bytes) and GiB (2**30 bytes), rounded to 4 decimals."""

    bytes: int
    gb: float
    gib: float


class CategoryBytes(TypedDict):
    """Bytes of one memory category (``category`` is memory.csv's name, ``label`` the plot's)."""

    category: str
    label: str
    bytes: int
    gb: float
    gib: float


class OomInstant(TypedDict):
    """Where and how the run ran out of memory, and what was live then (the verdict of a
    report that does not fit)."""

    verdict: str
    time_s: float
    step: int
    phase: str
    micro_batch: int
    layer: Optional[int]
    op: str
    tensor: str
    requested: Bytes
    allocated: Bytes
    capacity: Bytes
    free: Bytes
    live_by_category: List[CategoryBytes]
    largest_live: List[Dict[str, Any]]


class Peak(TypedDict):
    """The highest allocated instant (up to the OOM when it does not fit) and what was live."""

    time_s: float
    step: int
    phase: str
    micro_batch: int
    layer: Optional[int]
    op: str
    allocated: Bytes
    reserved: Bytes
    breakdown: List[CategoryBytes]


class PhasePeak(TypedDict):
    """The highest allocated bytes of one phase of one step (step 0 = initialisation)."""

    step: int
    phase: str
    allocated: Bytes
    op: str


class ModelState(TypedDict):
    """Model state per GPU: what the plan holds at rest, and the naive average."""

    parameters: Bytes
    master_weights: Bytes
    gradients: Bytes
    optimizer_state: Bytes
    total: Bytes
    bytes_per_param: float
    bytes_per_param_per_gpu: float
    naive_average: Bytes


class ThroughputVerdict(TypedDict):
    """Whether the step is compute-, communication-, host- or overhead-bound, and why."""

    bound: str
    acceptable: bool
    exposed_comm_fraction: float
    exposed_host_fraction: float
    mfu: float
    reason: str


class _Throughput(TypedDict):
    step_time_s: float
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    model_flops_per_step_per_gpu: float
    verdict: ThroughputVerdict
    assumptions: List[str]


class Throughput(_Throughput, total=False):
    """The steady-state step: time, tokens/s, MFU (model FLOPs utilisation) and HFU; under
    ``[jitter]`` also the step-time statistics over the data-parallel ranks."""

    jitter: Dict[str, Union[int, float]]


class _RankClass(TypedDict):
    ranks: str
    count: int
    note: str


class RankClass(_RankClass, total=False):
    """GPUs that run the same program: every GPU, or a pipeline stage (``stage``: its layers,
    model state and peaks), a data-parallel rank under ``[jitter]`` (``rank``) or an
    expert-parallel rank under uneven routing (``expert_rank``)."""

    stage: Dict[str, Any]
    rank: int
    expert_rank: int


class StepTiming(TypedDict):
    """One step's timing (seconds)."""

    step: int
    start_s: float
    time_s: float
    compute_busy_s: float
    comm_busy_s: float
    host_busy_s: float
    compute_idle_s: float
    recompute_s: float
    exposed_comm_s: float
    exposed_host_s: float
    idle_s: float


class MemoryColumns(TypedDict):
    """memory.csv as columns (a row each time a category's bytes change; values hold until
    the next row of the same rank class and category)."""

    time_s: List[float]
    rank_class: List[str]
    category: List[str]
    bytes: List[int]


#: One row of a sweep, keyed by sweep.csv's header: ``index``, one column per axis (the
#: value as the sweep file gives it), ``gpus``, ``tokens_per_step``, ``verdict`` ("fits" |
#: "oom"), ``oom_step``, ``oom_phase``, ``oom_layer``, ``peak_allocated_gb``,
#: ``peak_reserved_gb``, ``capacity_gb``, ``step_time_s``, ``tokens_per_s``, ``mfu`` and,
#: with a ``token_budget``, ``gpu_hours``; an empty CSV cell is None. (Values are typed
#: ``Any``: each is an int, float, str, bool or None as its column says.)
SweepRow = Dict[str, Any]
