"""The exceptions stepsim raises (the Rust extension raises these very classes)."""

from __future__ import annotations

__all__ = ["ScenarioError", "SweepError", "SimulationError"]


class ScenarioError(ValueError):
    """A scenario that cannot be simulated, with enough detail to fix it.

    ``str(error)`` is the CLI's message (``<file>: field `<field>`: <message>``).

    Attributes:
        file: the scenario file, or ``"<inline>"`` for a TOML string or a dict.
        field: the dotted path of the offending field (e.g. ``"model.n_heads"``); empty
            for a whole-file error.
        message: what is wrong and what is allowed.
    """

    file: str
    field: str
    message: str

    def __init__(self, text: str, file: str = "", field: str = "", message: str = "") -> None:
        super().__init__(text)
        self.file = file
        self.field = field
        self.message = message or text


class SweepError(ValueError):
    """A sweep file (or its base scenario, or an argument of :func:`stepsim.sweep`) that
    cannot be run.

    ``str(error)`` is the CLI's message. ``file``, ``field`` and ``message`` are read off it
    (best effort: an error of the base scenario names the base's file; an error of no file,
    such as a bad ``jobs``, has ``file == ""`` and the whole text as its message).

    Attributes:
        kind: ``"input"`` (a bad sweep file, base scenario or argument) or ``"output"``.
        file: the file the problem is in, or ``"<inline>"`` for a TOML string.
        field: the dotted field named, or ``""``.
        message: what is wrong.
    """

    kind: str
    file: str
    field: str
    message: str

    def __init__(self, text: str, kind: str = "input", file: str = "", field: str = "", message: str = "") -> None:
        super().__init__(text)
        self.kind = kind
        self.file = file
        self.field = field
        self.message = message or text


class SimulationError(RuntimeError):
    """An internal error of the simulator (a schedule that cannot run, a bug): the CLI's
    exit code 3. Please report it with the scenario."""
