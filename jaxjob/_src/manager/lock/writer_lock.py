"""One process's hold on the lock of one node: take it, check it, renew it, release it.

The record lies at :func:`lock_path`, in the folder :data:`LOCK_DIR` under
``db_prefix``; a background thread renews its lease every :data:`LEASE_S` / 4
seconds. What the lock guarantees: the package's docstring.
"""

from __future__ import annotations

import dataclasses
import errno
import threading
import time

from jaxjob._src.base import faults, fs
from jaxjob._src.base.errors import CheckpointInUseError
from jaxjob._src.base.log import get_logger
from jaxjob._src.manager.lock.holder import Holder
from jaxjob._src.manager.lock.local_file import LocalRecord
from jaxjob._src.manager.lock.object_store import RemoteRecord
from jaxjob._src.manager.lock.record import Lost, Record

__all__ = ["LEASE_S", "LOCK_DIR", "WriterLock", "lock_path", "record_at"]

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


class WriterLock:
    """This process's hold on the lock of one node under one ``db_prefix``."""

    def __init__(self, db_prefix: str, node_name: str, *, lease_s: float = LEASE_S) -> None:
        self.path = lock_path(db_prefix, node_name)
        self.lease_s = lease_s
        self._record = record_at(self.path)
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
        try:
            self._holder = self._record.change(lambda now: self._claim(now, mine), create=True)
        except Lost:
            raise CheckpointInUseError(
                f"{self.path} was taken by another writer just now"
            ) from None
        self._thread = threading.Thread(
            target=self._renew, name=f"jaxjob-lock {self.path}", daemon=True
        )
        self._thread.start()

    def _claim(self, current: Holder | None, mine: Holder) -> Holder:
        """``mine`` in place of ``current``, unless ``current`` names a live holder."""
        if current is not None and current.alive(self.lease_s, {mine.token}):
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


def record_at(path: str) -> Record:
    """The record of the lock at ``path``: an object on ``gs://`` and ``s3://``, else a file."""
    return RemoteRecord(path) if fs.is_remote(path) else LocalRecord(path)
