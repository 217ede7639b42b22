"""One writer per node and directory: the lock a checkpoint manager holds while it writes.

The lock of node ``n`` under ``db_prefix`` is the file
``<db_prefix>/.jaxjob/n.lock`` (:func:`lock_path`), a small JSON record
naming its holder (host, boot id, PID namespace, pid, start time) and when
the holder last renewed it. It lies in the folder :data:`LOCK_DIR` so that
nothing of jaxjob's own sits beside the checkpoint directories
``<node>.<epoch>``: a ``glob("n.*")`` finds only those. The folder is
removed with the last lock in it. A manager takes it before its first write
(``init`` or the first ``save``), keeps it while it lives and releases it on
``close()`` or when the process exits. Reading (``load``, ``restore``, the
CLI) never takes it.

* **Another live writer**: taking the lock fails with
  :class:`~jaxjob.CheckpointInUseError` naming the holder, before anything
  is written.
* **A dead holder** is taken over. Its pid decides only when the holder ran
  on this host, in this boot of its kernel and in this PID namespace (the
  record's ``boot_id`` and ``pidns`` are ours, and the ``/proc`` here is
  this namespace's): then at once when that pid is gone, belongs to another
  process since, or is a zombie (killed but not yet reaped by its parent or
  by init, which may take seconds, or never happen in a container without a
  reaping init). Otherwise — another host, another container or pod on this
  host (its pids mean nothing here, even with the same host name), a record
  of an older jaxjob without those fields — only its lease decides: it is
  taken over once not renewed for :data:`LEASE_S` seconds, never while the
  lease is fresh. A background thread renews it every :data:`LEASE_S` / 4
  seconds. Hosts' clocks must agree to well within :data:`LEASE_S`.
* **A lost lock** stops the writer: at the start of every save the holder
  reads the record again (a ``flock``-ed read locally, one GET on an object
  store); if it is gone (the record, ``.jaxjob/`` or the whole ``db_prefix``
  deleted) or names another holder, the save fails with
  :class:`~jaxjob.CheckpointInUseError` before anything is written or
  re-created. The renewal finds the same between saves and stops renewing.
* **One job, one lock**: in a ``jax.distributed`` job process 0 takes it for
  every process (a node private to one process: that process) and the
  others learn the outcome.
* **The same process** may build several managers on one node (a re-run
  notebook cell): they share the lock, which is released when the last of
  them closes. Saving from two of them at once is up to you not to do.

Every read-modify-write of the record happens under an exclusive
``flock`` of the lock file, which the kernel releases if its holder dies
(on network file systems this needs working ``flock``, as NFSv4 has). On
``gs://`` and ``s3://`` every change is conditional on the version read
(:mod:`jaxjob._src.manager.lock_object`): created only if absent, replaced
(taken over, renewed) or deleted only if no one changed it since; of two
processes taking over one dead lock, one wins.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import threading
import time
from typing import Any

import jax

from jaxjob._src.base import faults, fs
from jaxjob._src.base.errors import CheckpointInUseError
from jaxjob._src.base.log import get_logger
from jaxjob._src.manager.lock_object import RemoteRecord
from jaxjob._src.manager.lock_record import (
    EXITED_STATES,
    Holder,
    LocalRecord,
    Lost,
    pid_start,
    stat_fields,
)
from jaxjob._src.multihost import hosts

__all__ = [
    "EXITED_STATES",
    "LEASE_S",
    "LOCK_DIR",
    "Holder",
    "WriterLock",
    "acquire",
    "lock_path",
    "pid_start",
    "stat_fields",
]

logger = get_logger(__name__)

LEASE_S = 60.0
LOCK_DIR = ".jaxjob"  # under db_prefix: the locks of its nodes, outside the ``<node>.*`` names


def lock_path(db_prefix: str, node_name: str) -> str:
    """The lock record of ``node_name`` under ``db_prefix``.

    Example:
        >>> lock_path("/ckpt", "trainer_0")
        '/ckpt/.jaxjob/trainer_0.lock'
    """
    return fs.join(db_prefix, LOCK_DIR, f"{node_name}.lock")


_registry: dict[str, list[Any]] = {}  # lock path -> [WriterLock, managers sharing it]
_registry_lock = threading.Lock()


class WriterLock:
    """This process's hold on the lock of one node under one ``db_prefix``."""

    def __init__(self, db_prefix: str, node_name: str, *, lease_s: float = LEASE_S) -> None:
        self.path = lock_path(db_prefix, node_name)
        self.lease_s = lease_s
        self._record = (RemoteRecord if fs.is_remote(self.path) else LocalRecord)(self.path)
        self._holder: Holder | None = None
        self.lost: str | None = None  # why this process no longer holds the lock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> None:
        """Takes the lock (a dead holder's too).

        Raises:
            CheckpointInUseError: If a live process holds it.
        """
        mine = Holder.me()
        tokens = {mine.token}

        def decide(current: Holder | None) -> Holder:
            if current is not None and current.alive(self.lease_s, tokens):
                raise CheckpointInUseError(
                    f"{self.path} is held by another writer ({current.describe()}); "
                    "another job or a second launch writes this node under this db_prefix. "
                    "Stop it, or write to another db_prefix; a dead holder's lock is taken "
                    "over (same host, boot and PID namespace: once its pid is gone or a "
                    f"zombie; otherwise: once its lease is {self.lease_s:g} s old)"
                )
            if current is not None:
                logger.info(
                    "Taking over the lock %s of a dead writer (%s)", self.path, current.describe()
                )
                faults.point("lock.takeover")
            return mine

        try:
            self._holder = self._record.change(decide, create=True)
        except Lost:
            raise CheckpointInUseError(
                f"{self.path} was taken by another writer just now"
            ) from None
        self._thread = threading.Thread(
            target=self._renew, name=f"jaxjob-lock {self.path}", daemon=True
        )
        self._thread.start()

    def check(self) -> None:
        """Reads the record again: if it is gone or names another holder, the lock is lost.

        Raises:
            OSError: If the record could not be read (an object store that failed or did
                not answer in time); the lock may still be held.
        """
        holder = self._holder
        if holder is None or self.lost is not None:
            return
        current = self._record.read()
        if current is None:
            self._lose(f"{self.path} vanished; was the directory deleted?")
        elif current.token != holder.token:
            self._lose(f"{self.path} was taken over by {current.describe()}")

    def _lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            logger.error("Lost the lock %s: %s", self.path, why)

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 4) and self.lost is None:
            try:
                self._record.change(self._renewed)
            except FileNotFoundError:  # the lock, or its directory, was deleted
                self._lose(f"{self.path} vanished; was the directory deleted?")
            except Lost:
                self._lose(f"{self.path} was changed by another writer since it was read")
            except CheckpointInUseError as err:
                self._lose(str(err))
            except OSError as err:  # retried at the next renewal, within the lease
                logger.error("Could not renew the lock %s: %s", self.path, err)

    def _renewed(self, current: Holder | None) -> Holder:
        if current is None:  # the object is gone (a file that is gone does not open)
            raise FileNotFoundError(errno.ENOENT, "no lock record", self.path)
        if self._holder is None or current.token != self._holder.token:
            raise CheckpointInUseError(f"{self.path} was taken over by {current.describe()}")
        return dataclasses.replace(current, renewed=time.time())

    def release(self) -> None:
        """Stops renewing and removes this process's record (if still its own)."""
        self._stop.set()
        answering = fs.answering(self.path)
        if self._thread is not None:  # a renewal on a silent store: not waited for
            self._thread.join(None if answering else 0)
        holder, self._holder = self._holder, None
        if holder is None or self.lost is not None:  # a lost lock's record is not ours
            return
        if not answering:
            logger.warning(
                "Not releasing the lock %s: its object store stopped answering. The next "
                "writer takes it over once this process is gone (or its lease is %g s old)",
                self.path, self.lease_s,
            )  # fmt: skip
            return
        try:
            self._record.change(
                lambda current: None if current and current.token == holder.token else current
            )
        except (OSError, Lost) as err:
            logger.warning("Could not release the lock %s: %s", self.path, err)


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
            entry = _registry.get(self._path) if self._path else None
        if entry is None:
            return None
        try:
            entry[0].check()
        except OSError as err:
            return err
        if entry[0].lost is None:
            return None
        return CheckpointInUseError(
            f"{self._path}: this process no longer holds the lock of this node "
            f"({entry[0].lost}); nothing was written. Stop this run"
        )

    def release(self) -> None:
        """Gives this share back; the lock is released with the last share of the process."""
        path, self._path = self._path, None
        if path is None:
            return
        with _registry_lock:
            entry = _registry.get(path)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _registry[path]
        entry[0].release()


def _take_here(db_prefix: str, node_name: str) -> str:
    lock = WriterLock(db_prefix, node_name)
    with _registry_lock:
        entry = _registry.get(lock.path)
        if entry is not None:
            entry[1] += 1
            return lock.path
        lock.take()
        _registry[lock.path] = [lock, 1]
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

    def take() -> dict[str, str]:
        try:
            fs.makedirs(db_prefix)
            return {"path": _take_here(db_prefix, node_name)}
        except CheckpointInUseError as err:
            return {"error": str(err)}
        except OSError as err:
            return {"oserror": f"{type(err).__name__}: {err}"}

    outcome = hosts.decide(f"the lock of node {node_name!r}", take, timeout_s=timeout_s)
    if "error" in outcome:
        raise CheckpointInUseError(outcome["error"])
    if "oserror" in outcome:
        raise OSError(
            f"process 0 could not take the lock of node {node_name!r}: {outcome['oserror']}"
        )
    return Handle(outcome["path"] if jax.process_index() == 0 else None)


@atexit.register
def _release_all() -> None:
    with _registry_lock:
        entries = list(_registry.values())
        _registry.clear()
    for lock, _ in entries:
        lock.release()
