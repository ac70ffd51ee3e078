"""The Rust extension behind ``stepsim`` (private: use the functions of ``stepsim``)."""

from typing import Any, Dict, Iterator, List, Optional, Tuple

__version__: str
DEFAULT_MARGIN: float

class Simulation:
    """One finished simulation: its report.json text and what memory.csv is made from."""

    def report_json(self) -> str:
        """report.json's text, exactly as ``stepsim run`` writes it."""
    def memory_csv(self) -> str:
        """memory.csv's text, exactly as ``stepsim run`` writes it."""
    def memory_columns(self) -> Tuple[List[float], List[str], List[str], List[int]]:
        """memory.csv's columns: (time_s, rank_class, category, bytes)."""
    def snapshots(self) -> List[Tuple[str, bytes]]:
        """Each rank class's memory snapshot: (file name, pickle bytes); empty without snapshot."""

class SweepRows(Iterator[Dict[str, Any]]):
    """The rows of a running sweep, as they finish (or in configuration order), each a dict
    keyed by sweep.csv's header. Dropping it (or ``close()``) stops the workers."""

    @property
    def columns(self) -> List[str]:
        """sweep.csv's header, column by column."""
    @property
    def total(self) -> int:
        """Configurations the sweep simulates (those that pass its filter)."""
    def __iter__(self) -> "SweepRows": ...
    def __next__(self) -> Dict[str, Any]: ...
    def close(self) -> None:
        """Stops the sweep: the workers finish the configurations they are on and stop."""

def simulate(kind: str, payload: str, snapshot: bool = False) -> Simulation: ...
def explain(kind: str, payload: str, margin: float) -> Tuple[Simulation, str, str]: ...
def sweep(kind: str, payload: str, jobs: Optional[int] = None, ordered: bool = False) -> SweepRows: ...
