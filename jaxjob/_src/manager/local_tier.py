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

:func:`check_placement` refuses, as the manager is made, a local tier that
overlaps the db_prefix (by real location: links resolved, directories
compared by device and inode, so that a bind mount is seen through too) and
one directory shared by several processes of one machine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax

from jaxjob._src.base import fs, mounts
from jaxjob._src.base.checks import is_int
from jaxjob._src.manager.retention import keep as keep_lib
from jaxjob._src.multihost import hosts

__all__ = ["LOCAL", "PERSISTENT", "LocalTier", "check_placement"]

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
            Without ``{process}``, a job with several processes on one machine
            is refused as its manager is made (one process per machine may
            omit it). The directory must neither hold nor lie inside the
            db_prefix, through links or bind mounts either. ``~`` is expanded.
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

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

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


def check_placement(tier: LocalTier | None, db_prefix: str, *, timeout_s: float) -> None:
    """Refuses a local tier that overlaps ``db_prefix`` or that processes of one machine share.

    The local directories of processes 0, 1 and this one are compared with
    ``db_prefix`` by real location (:func:`~jaxjob._src.base.mounts.inside`):
    neither may hold the other. In a multi-process job every process posts
    its verdict and its directory's real location (one exchange, before any
    lock is taken), and every process raises the same error.

    Raises:
        ValueError: Naming the LocalTier path, the db_prefix or the
            processes, and the real locations.
        HostTimeoutError: If another process does not make its manager in time.
    """
    if tier is None:
        return
    me = jax.process_index()
    where = mounts.real_location(tier.directory(me))
    problem = _overlap(tier, db_prefix, {0, 1, me} if jax.process_count() > 1 else {0, 1})
    if jax.process_count() == 1:
        if problem is not None:
            raise ValueError(problem)
        return
    posts = hosts.exchange(
        "the check of the local tier's directories",
        {"machine": mounts.machine(), "where": where.key(), "real": where.real, "problem": problem},
        timeout_s=timeout_s,
    )
    for process, post in enumerate(posts):
        if post["problem"] is not None:
            raise ValueError(f"{post['problem']} (seen by process {process})")
    sharing: dict[str, list[int]] = {}
    for process, post in enumerate(posts):
        sharing.setdefault(repr((post["machine"], post["where"])), []).append(process)
    for processes in sharing.values():
        if len(processes) > 1:
            raise ValueError(_shared(tier, processes, posts[processes[0]]))


def _overlap(tier: LocalTier, db_prefix: str, processes: set[int]) -> str | None:
    """Why the local directories of ``processes`` and ``db_prefix`` overlap, or None."""
    if fs.is_remote(db_prefix):
        return None  # a bucket is never a local directory
    prefix = mounts.real_location(db_prefix)
    for process in sorted(processes):
        directory = tier.directory(process)
        local = mounts.real_location(directory)
        below, above = mounts.inside(local, prefix), mounts.inside(prefix, local)
        if not (below or above):
            continue
        relation = "is the same directory as" if below and above else "lies inside"
        if above and not below:
            relation = "holds"
        return (
            f"LocalTier path {tier.path!r} overlaps the db_prefix {db_prefix!r}: the two tiers "
            "need directories apart (the local tier's retention would delete persistent "
            f"checkpoints); process {process}'s local directory {directory!r} (really "
            f"{local.real}) {relation} the db_prefix (really {prefix.real}; compared with links "
            "resolved and by device and inode, which a bind mount keeps); put the local tier "
            "elsewhere, e.g. /dev/shm/<run>/{process}"
        )
    return None


def _shared(tier: LocalTier, processes: list[int], post: dict) -> str:
    """The error for ``processes`` of one machine that would share one local directory."""
    named = " and ".join(map(str, processes)) if len(processes) < 4 else f"{processes}"
    fix = (
        f"add {{process}} to the path, e.g. {tier.path.rstrip('/') + '/{process}'!r}"
        if "{process}" not in tier.path
        else "give each process its own directory (no link or bind mount joining them)"
    )
    return (
        f"LocalTier path {tier.path!r} is one directory ({post['real']}) for processes "
        f"{named}, which run on one machine ({post['machine']}): each process writes and "
        f"locks its own local directory; {fix}"
    )
