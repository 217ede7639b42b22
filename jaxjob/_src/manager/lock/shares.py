"""This process's shares of the node locks: one job, one lock; one process, one hold.

:func:`acquire` takes the lock of a node for a whole ``jax.distributed`` job
(process 0 takes it, or the node's owner process; the others learn the
outcome) and gives each manager a :class:`Handle`. Managers of one process
on one node share one :class:`~jaxjob._src.manager.lock.writer_lock.WriterLock`,
released with the last handle, or when the process exits.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading

import jax

from jaxjob._src.base import fs
from jaxjob._src.base.errors import CheckpointInUseError
from jaxjob._src.manager.lock.writer_lock import WriterLock
from jaxjob._src.multihost import hosts

__all__ = ["Handle", "acquire"]


@dataclasses.dataclass
class _Hold:
    """This process's hold on one lock, and how many handles share it."""

    lock: WriterLock
    handles: int = 1


_registry: dict[str, _Hold] = {}  # lock path -> this process's hold on it
_registry_lock = threading.Lock()


class Handle:
    """One manager's share of a lock; :meth:`release` once."""

    def __init__(self, path: str | None) -> None:
        self._path = path

    def holds(self) -> bool:
        """Whether this process holds the lock (process 0 of a job, or a private node's owner)."""
        return self._path is not None

    def lost(self) -> Exception | None:
        """Why this process may not save now, having held the lock; reads the record again.

        Call it before each save: the record is read (:meth:`WriterLock.check`),
        so a lock lost since the last renewal is found before anything is written.

        Returns:
            A :class:`~jaxjob.CheckpointInUseError` if the record is gone or
            names another holder, the ``OSError`` if it could not be read, or None.
        """
        with _registry_lock:
            hold = _registry.get(self._path) if self._path else None
        if hold is None:
            return None
        try:
            hold.lock.check()
        except OSError as err:
            return err
        if hold.lock.lost is None:
            return None
        return CheckpointInUseError(
            f"{self._path}: this process no longer holds the lock of this node "
            f"({hold.lock.lost}); nothing was written. Stop this run"
        )

    def release(self) -> None:
        """Gives this share back; the lock is released with the last share of the process."""
        path, self._path = self._path, None
        if path is None:
            return
        with _registry_lock:
            hold = _registry.get(path)
            if hold is None:
                return
            hold.handles -= 1
            if hold.handles > 0:
                return
            del _registry[path]
        hold.lock.release()


def _take_here(db_prefix: str, node_name: str) -> str:
    """Takes the lock in this process, or shares this process's hold on it; its path."""
    lock = WriterLock(db_prefix, node_name)
    with _registry_lock:
        hold = _registry.get(lock.path)
        if hold is not None:
            hold.handles += 1
            return lock.path
        lock.take()
        _registry[lock.path] = _Hold(lock)
    return lock.path


def acquire(
    db_prefix: str, node_name: str, *, owner_process: int | None, timeout_s: float
) -> Handle:
    """Takes the lock of ``node_name`` under ``db_prefix`` for this job; call it on every process.

    Process 0 (or ``owner_process``, alone) takes it, in the existing
    directory ``db_prefix``; every process raises the same
    :class:`~jaxjob.CheckpointInUseError` if it is held, and an ``OSError``
    if it could not be written.
    """
    if owner_process is not None or jax.process_count() == 1:
        if owner_process is not None and owner_process != jax.process_index():
            return Handle(None)
        return Handle(_take_here(db_prefix, node_name))
    decided = hosts.decide(
        f"the lock of node {node_name!r}",
        lambda: dataclasses.asdict(_Taken.by_process_0(db_prefix, node_name)),
        timeout_s=timeout_s,
    )
    return _Taken(**decided).handle(node_name)


@dataclasses.dataclass(frozen=True)
class _Taken:
    """How process 0's taking of a job's lock went, as every process learns it (one of three)."""

    path: str | None = None  # taken: the lock's path
    refused: str | None = None  # held by a live writer: the CheckpointInUseError's message
    failed: str | None = None  # not written: the OSError's type and message

    @classmethod
    def by_process_0(cls, db_prefix: str, node_name: str) -> _Taken:
        """Takes the lock here, in ``db_prefix`` made if missing; how that went."""
        try:
            fs.makedirs(db_prefix)
            return cls(path=_take_here(db_prefix, node_name))
        except CheckpointInUseError as err:
            return cls(refused=str(err))
        except OSError as err:
            return cls(failed=f"{type(err).__name__}: {err}")

    def handle(self, node_name: str) -> Handle:
        """This process's handle (holding the lock on process 0 only).

        Raises:
            CheckpointInUseError: If a live writer holds the lock.
            OSError: If process 0 could not write it.
        """
        if self.refused is not None:
            raise CheckpointInUseError(self.refused)
        if self.failed is not None:
            raise OSError(f"process 0 could not take the lock of node {node_name!r}: {self.failed}")
        return Handle(self.path if jax.process_index() == 0 else None)


@atexit.register
def _release_all() -> None:
    """Releases every lock this process holds (at exit)."""
    with _registry_lock:
        holds = list(_registry.values())
        _registry.clear()
    for hold in holds:
        hold.lock.release()
