"""The local tier: a fast per-process copy of the checkpoints, beside the durable ``db_prefix``.

A checkpoint manager made with ``local=LocalTier(path)`` keeps two tiers:
``db_prefix`` (the persistent tier: local disk, NFS, ``gs://``, ``s3://``),
saved on the runner's ``save_every_*`` schedule, and one directory per
process on its own disk or RAM disk (``path``, where ``{process}`` becomes
the process index), saved on the tier's own schedule. A local checkpoint has
the persistent tier's layout and format (``<path>/<node>.<epoch>/``): each
process writes the shards it holds and its host-local leaves, waiting on no
other process, and commits atomically and durably. Resume takes the newest
epoch that is committed and intact in every process's local tier, or the
persistent tier's when that is newer (or the local one cannot be used).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from jaxjob._src.base import fs
from jaxjob._src.base.checks import is_int
from jaxjob._src.manager import keep as keep_lib

__all__ = ["LOCAL", "PERSISTENT", "LocalTier"]

PERSISTENT = "persistent"  # the tier of db_prefix
LOCAL = "local"  # the tier of LocalTier.path


@dataclasses.dataclass(frozen=True)
class LocalTier:
    """A per-process local copy of the checkpoints, saved more often than ``db_prefix``.

    Pass it as ``local=`` to :class:`~jaxjob.CheckpointManager` or
    :class:`~jaxjob.MultiNodeCheckpointManager`. The runner saves to it when
    ``every_epochs`` epochs or ``every_seconds`` seconds (either; process
    0's clock) have passed since the last save to either tier, except at
    the epochs it saves to ``db_prefix`` (epoch 0, the final epoch, a
    preempted epoch and its ``save_every_*`` schedule), which the local
    tier skips: that epoch is in the durable tier already.

    Args:
        path: A local directory (a RAM disk such as ``/dev/shm/run`` is
            fastest); ``{process}`` in it becomes the process index, so
            that several processes on one machine get their own directories.
            In a multi-process job without ``{process}``, each process still
            needs its own directory (one per host). ``~`` is expanded.
        every_epochs: Save when this many epochs have passed since the last
            save (None: on time alone).
        every_seconds: Save when this much wall time has passed since the
            last save (None: on epochs alone).
        keep: Which committed local epochs to keep (a policy of
            :mod:`jaxjob.keep`, or a list of them); the newest committed one
            is never deleted. None keeps every local epoch.

    Example:
        >>> import jaxjob
        >>> jaxjob.LocalTier("/dev/shm/run/{process}").directory(1)
        '/dev/shm/run/1'
        >>> jaxjob.LocalTier("/dev/shm/run", every_epochs=None)
        Traceback (most recent call last):
        ...
        ValueError: LocalTier needs every_epochs or every_seconds (or both), got neither
    """

    path: str
    every_epochs: int | None = 1
    every_seconds: float | None = None
    keep: keep_lib.Policy | Sequence[keep_lib.Policy] | None = keep_lib.Last(2)

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise TypeError(f"LocalTier path must be a non-empty str, got {self.path!r}")
        if fs.is_remote(self.path) or "://" in self.path:
            raise ValueError(
                f"LocalTier path must be a directory on this machine's disk, got {self.path!r}; "
                "pass an object store as the manager's db_prefix (the persistent tier)"
            )
        try:
            self.path.format(process=0)
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"LocalTier path may hold {{process}} and no other field, got {self.path!r} ({err})"
            ) from None
        every = self.every_epochs
        if every is not None and not (is_int(every) and every >= 1):
            raise ValueError(f"LocalTier every_epochs must be None or an int >= 1, got {every!r}")
        seconds = self.every_seconds
        if seconds is not None and not (
            isinstance(seconds, int | float) and not isinstance(seconds, bool)
            and math.isfinite(seconds) and seconds > 0
        ):  # fmt: skip
            raise ValueError(
                f"LocalTier every_seconds must be None or a positive number, got {seconds!r}"
            )
        if every is None and seconds is None:
            raise ValueError("LocalTier needs every_epochs or every_seconds (or both), got neither")
        object.__setattr__(self, "keep", keep_lib.normalize(self.keep))

    def directory(self, process: int) -> str:
        """The local directory of ``process`` (absolute, ``~`` expanded)."""
        return fs.normalize(self.path.format(process=process), "LocalTier path")
