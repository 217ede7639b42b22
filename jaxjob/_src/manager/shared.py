"""What both checkpoint managers accept: their options.

:class:`CheckpointOptions` are the keyword options of both managers, also
accepted as ``options=``. The protocol through which the runner drives either
is :class:`jaxjob._src.run.protocol.Manager`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxjob._src.base import fs
from jaxjob._src.base.checks import is_int, is_number
from jaxjob._src.checkpoint import host_budget
from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.multihost import hosts

__all__ = ["CheckpointOptions", "check_db_type", "check_owner", "resolve_options"]

DB_TYPES = ("orbax",)
DEFAULT_WRITE_TIMEOUT_S = 600.0


def _seconds(value: Any, argument: str) -> float:
    if not is_number(value) or not value > 0:
        raise ValueError(f"{argument} must be a positive number of seconds, got {value!r}")
    return float(value)


def check_db_type(db_type: Any, argument: str) -> str:
    """Returns ``db_type`` if it is a supported storage type.

    Raises:
        ValueError: Naming ``argument`` and the supported types.
    """
    if db_type not in DB_TYPES:
        raise ValueError(f"{argument} must be one of {DB_TYPES}, got {db_type!r}")
    return db_type


def check_owner(owner_process: Any) -> int | None:
    """Returns ``owner_process`` if it is None or a process index of this job.

    Raises:
        ValueError: Naming the valid range.
    """
    if owner_process is not None and (
        not is_int(owner_process) or not 0 <= owner_process < jax.process_count()
    ):
        raise ValueError(
            f"owner_process must be None or a process index in [0, {jax.process_count()}), "
            f"got {owner_process!r}"
        )
    return owner_process


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointOptions:
    """Keyword options shared by both checkpoint managers, validated once.

    Attributes:
        async_save: False makes ``save`` return only once committed.
        timeout_s: How long any wait on the other processes of a
            ``jax.distributed`` job may take before it fails naming the late
            processes.
        write_timeout_s: How long a background write may take, including
            Orbax's wait for every process's part before the commit.
        host_map: For resuming host-local leaves (NumPy arrays, scalars) on a
            different process count: for each process of this job, the saved
            process whose copy it gets (a callable or a sequence).
        storage_timeout_s: On ``gs://`` and ``s3://``: how long one
            object-store operation may take before the save (or restore)
            fails naming the endpoint; a save or restore of the arrays may
            take that plus their bytes at 1 MiB/s. None:
            ``$JAXJOB_STORAGE_TIMEOUT_S``, else 120 s.
        max_host_bytes: A host-memory budget in bytes, for workspaces larger
            than the host memory left beside them. A restore (and a resume)
            reads the leaves in groups of at most this many bytes, and a
            save makes no copy of the workspace larger than it, so that
            either stays within the workspace plus the budget in resident
            memory (a leaf larger than the budget is read alone). It also
            makes glibc's ``malloc`` return freed buffers to the kernel at
            once, process-wide (glibc's ``mallopt``). None: no
            budget, the fastest.

    Example:
        >>> import jaxjob
        >>> jaxjob.CheckpointOptions(timeout_s=0)
        Traceback (most recent call last):
        ...
        ValueError: timeout_s must be a positive number of seconds, got 0
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    async_save: bool = True
    timeout_s: float = hosts.DEFAULT_TIMEOUT_S
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    host_map: HostMap | None = None
    storage_timeout_s: float | None = None
    max_host_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.async_save, bool):
            raise ValueError(f"async_save must be a bool, got {self.async_save!r}")
        object.__setattr__(self, "timeout_s", _seconds(self.timeout_s, "timeout_s"))
        object.__setattr__(
            self, "write_timeout_s", _seconds(self.write_timeout_s, "write_timeout_s")
        )
        if self.storage_timeout_s is not None:
            seconds = _seconds(self.storage_timeout_s, "storage_timeout_s")
            if seconds == float("inf"):
                raise ValueError(
                    "storage_timeout_s must be a positive number of seconds (None: "
                    f"${fs.STORAGE_TIMEOUT_ENV} or 120), got {self.storage_timeout_s!r}"
                )
            object.__setattr__(self, "storage_timeout_s", seconds)
        object.__setattr__(self, "max_host_bytes", host_budget.check_budget(self.max_host_bytes))
        if self.host_map is not None and not isinstance(self.host_map, Callable | Sequence):
            raise ValueError(
                f"host_map must be None, a callable or a sequence of process indices, got "
                f"{self.host_map!r}"
            )


def resolve_options(options: CheckpointOptions | None, **keywords: Any) -> CheckpointOptions:
    """``options``, or the options the keyword arguments give; not both.

    Raises:
        TypeError: If ``options`` is not a :class:`CheckpointOptions`.
        ValueError: If ``options`` is given with a keyword option that is not
            at its default (naming it).

    Example:
        >>> resolve_options(None, timeout_s=5.0).timeout_s
        5.0
        >>> import jaxjob
        >>> resolve_options(jaxjob.CheckpointOptions(), timeout_s=5.0)
        Traceback (most recent call last):
        ...
        ValueError: timeout_s=5.0 given beside options=; set it in the CheckpointOptions instead
    """
    if options is None:
        return CheckpointOptions(**keywords)
    if not isinstance(options, CheckpointOptions):
        raise TypeError(
            f"options must be a jaxjob.CheckpointOptions, got {type(options).__name__}: {options!r}"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(CheckpointOptions)}
    for name, value in keywords.items():
        if value is not defaults[name] and value != defaults[name]:
            raise ValueError(
                f"{name}={value!r} given beside options=; set it in the CheckpointOptions instead"
            )
    return options
