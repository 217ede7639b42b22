"""The records of a save round: what processes exchange, and the stats metadata handlers get.

Each record is a frozen dataclass whose ``to_json``/``from_json`` give the
JSON that :func:`jaxjob.hosts.exchange` carries (the keys processes always
exchanged; a failure's stats now also carry ``bytes`` and ``duration_s``,
None). :class:`SavePost` is one process's word on one node's save;
:class:`Stats` one action on one checkpoint directory, tagged with the
:class:`Action` it belongs to (the tag is not exchanged).

Example:
    >>> post = SavePost(problem="OSError: disk full")
    >>> SavePost.from_json(post.to_json()) == post
    True
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from jaxjob._src.base.errors import CheckpointSaveError
from jaxjob._src.base.leaves import Kind

__all__ = ["Action", "LeafCheck", "ProcessStats", "SavePost", "Stats", "error_text"]


class Action(enum.Enum):
    """What a :class:`Stats` record measured."""

    SAVE = "save"
    LOAD = "load"
    FAILURE = "failure"


@dataclasses.dataclass(frozen=True)
class Stats:
    """One process's stats of one action on one checkpoint directory.

    ``commit_s`` (set once an async save committed) is exchanged only when set.
    """

    epoch: int | None
    bytes: int | None = None
    error: str | None = None
    duration_s: float | None = None
    commit_s: float | None = None
    action: Action = Action.SAVE

    def to_json(self) -> dict[str, Any]:
        """The JSON object handed to metadata handlers and exchanged."""
        data = {
            "epoch": self.epoch,
            "bytes": self.bytes,
            "error": self.error,
            "duration_s": self.duration_s,
        }
        if self.commit_s is not None:
            data["commit_s"] = self.commit_s
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stats:
        """The record of a :meth:`to_json` object (another process's save stats)."""
        return cls(
            data.get("epoch"),
            data.get("bytes"),
            data.get("error"),
            data.get("duration_s"),
            data.get("commit_s"),
        )


@dataclasses.dataclass(frozen=True)
class LeafCheck:
    """A host-local leaf's stored kind, dtype and shape: every process must post the same."""

    kind: Kind
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"kind", "dtype", "shape"}`` (the shape as a list)."""
        return {"kind": str(self.kind), "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LeafCheck:
        """The record of a :meth:`to_json` object."""
        return cls(Kind(data["kind"]), data["dtype"], tuple(data["shape"]))


@dataclasses.dataclass(frozen=True)
class SavePost:
    """One process's word on one node's save, posted before the processes start it.

    Attributes:
        previous: How this process's previous save of the node failed, or None.
        previous_at: That save's ``(epoch, directory)``.
        problem: Why this save cannot start here, or None.
        host_local: The host-local leaves' kinds, by key path (must match everywhere).
        replicated: Digests of single-process ``jax.Array`` leaves (must be equal).
        stats: This process's stats of this save, by checkpoint directory.
    """

    previous: str | None = None
    previous_at: tuple[int, str] | None = None
    problem: str | None = None
    host_local: Mapping[str, LeafCheck] = dataclasses.field(default_factory=dict)
    replicated: Mapping[str, str] = dataclasses.field(default_factory=dict)
    stats: Mapping[str, Stats] = dataclasses.field(default_factory=dict)

    @classmethod
    def outcome(
        cls,
        previous: CheckpointSaveError | None,
        problem: BaseException | None = None,
        **fields: Any,
    ) -> SavePost:
        """The post saying how the previous save ended and whether this one can start."""
        at = (previous.epoch, previous.db_name) if previous else None
        return cls(error_text(previous), at, error_text(problem), **fields)

    def to_json(self) -> dict[str, Any]:
        """The exchanged JSON object."""
        return {
            "previous": self.previous,
            "previous_at": list(self.previous_at) if self.previous_at else None,
            "problem": self.problem,
            "host_local": {k: v.to_json() for k, v in self.host_local.items()},
            "replicated": dict(self.replicated),
            "stats": {db: s.to_json() for db, s in self.stats.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SavePost:
        """The record of a :meth:`to_json` object."""
        at = data["previous_at"]
        return cls(
            data["previous"],
            (at[0], at[1]) if at else None,
            data["problem"],
            {k: LeafCheck.from_json(v) for k, v in data["host_local"].items()},
            dict(data["replicated"]),
            {db: Stats.from_json(s) for db, s in data["stats"].items()},
        )


@dataclasses.dataclass(frozen=True)
class ProcessStats:
    """One process's stats of one action, by checkpoint directory."""

    process: int
    stats: Mapping[str, Stats]

    def to_json(self) -> dict[str, Any]:
        """``{"process": p, "stats": {directory: stats}}``."""
        return {"process": self.process, "stats": {d: s.to_json() for d, s in self.stats.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessStats:
        """The record of a :meth:`to_json` object."""
        return cls(data["process"], {d: Stats.from_json(s) for d, s in data["stats"].items()})


def error_text(err: BaseException | None) -> str | None:
    """``"Type: message"`` of what made ``err`` (a save failure: its cause), or None.

    Example:
        >>> error_text(OSError("disk full"))
        'OSError: disk full'
    """
    if err is None:
        return None
    cause = err.__cause__ if isinstance(err, CheckpointSaveError) and err.__cause__ else err
    return f"{type(cause).__name__}: {cause}"


def failed_processes(texts: Sequence[str | None]) -> tuple[list[int], str]:
    """The processes (indices into ``texts``) with a message, and those messages joined.

    Example:
        >>> failed_processes([None, "OSError: disk full"])
        ([1], 'process 1: OSError: disk full')
    """
    processes = [p for p, text in enumerate(texts) if text]
    return processes, "; ".join(f"process {p}: {texts[p]}" for p in processes)
