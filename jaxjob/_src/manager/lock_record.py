"""The record of a node's lock: who holds it, and where it is kept.

:class:`Holder` names the holder (host, pid, start time, last renewal) and
says whether it still lives; :class:`LocalRecord` keeps the record in a file
changed under an exclusive ``flock``, :class:`RemoteRecord` in an object
created only if absent (``gs://``, ``s3://``). The lock itself is
:mod:`jaxjob._src.manager.lock`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Callable

import jax

from jaxjob._src.base import fs

__all__ = [
    "EXITED_STATES",
    "Holder",
    "LocalRecord",
    "Lost",
    "RemoteRecord",
    "parse",
    "pid_start",
    "stat_fields",
]


EXITED_STATES = ("Z", "X", "x")  # /proc states of a process that has exited, not yet reaped


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), if readable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a reused pid apart), if known."""
    fields = stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def pid_dead(pid: int) -> bool:
    """Whether ``pid`` is a zombie or dying: it exited (or was killed) but is not reaped yet.

    Such a process holds no files and runs no code: its lock is free, though
    ``kill(pid, 0)`` still succeeds until its parent (or init) reaps it.
    """
    fields = stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] in EXITED_STATES


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lock: host, pid, when it started, when it last renewed, a unique token."""

    host: str
    pid: int
    pid_start: str | None
    started: float
    renewed: float
    token: str
    processes: int = 1

    @classmethod
    def me(cls) -> Holder:
        """A record naming this process, renewed now."""
        now = time.time()
        pid = os.getpid()
        return cls(
            socket.gethostname(), pid, pid_start(pid), now, now, uuid.uuid4().hex,
            jax.process_count(),
        )  # fmt: skip

    def describe(self) -> str:
        """``host 'h', pid 12, started 2026-01-01 10:00:00 UTC``."""
        started = datetime.datetime.fromtimestamp(self.started, datetime.UTC)
        job = f" (process 0 of a {self.processes}-process job)" if self.processes > 1 else ""
        return f"host {self.host!r}, pid {self.pid}{job}, started {started:%Y-%m-%d %H:%M:%S} UTC"

    def alive(self, lease_s: float, mine: set[str]) -> bool:
        """Whether the holder still lives (``mine``: tokens this process holds)."""
        if self.host == socket.gethostname():
            if self.pid == os.getpid():
                return self.token in mine
            if self.pid_start is not None and pid_start(self.pid) not in (None, self.pid_start):
                return False
            if pid_dead(self.pid):
                return False
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return time.time() - self.renewed < lease_s


class LocalRecord:
    """The lock file on local (or network) disk; changes under an exclusive ``flock``.

    A released lock's file is deleted, and its folder with the last lock in
    it. A process that waited for the ``flock`` of a file deleted meanwhile
    sees another inode at the path and starts over.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def change(
        self, fn: Callable[[Holder | None], Holder | None], *, create: bool = False
    ) -> Holder | None:
        """Replaces the record by ``fn(record)`` atomically (None deletes it); returns it.

        Args:
            fn: The change.
            create: Whether to create the lock folder (taking the lock);
                otherwise a missing folder raises ``FileNotFoundError``.
        """
        while True:
            fd = self._open(create)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if _same_file(fd, self.path):
                    return self._change(fd, fn)
            finally:
                os.close(fd)  # releases the flock

    def _open(self, create: bool) -> int:
        """Opens (creating) the lock file; ``create``: and its folder in the existing db_prefix."""
        for _ in range(100):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(os.path.dirname(self.path))
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                if not create:
                    raise
                # another node's release removed the folder between our mkdir and open
        raise OSError(f"could not create the lock file {self.path}: its folder keeps vanishing")

    def _change(self, fd: int, fn: Callable[[Holder | None], Holder | None]) -> Holder | None:
        new = fn(parse(os.pread(fd, 1 << 16, 0).decode(errors="replace")))
        if new is None:
            os.unlink(self.path)
            try:
                os.rmdir(os.path.dirname(self.path))
            except OSError as err:  # other nodes' locks are in it, or it is gone
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise
            return None
        data = json.dumps(dataclasses.asdict(new)).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        return new


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


class RemoteRecord:
    """The lock object on an object store: created only if absent, deleted to release."""

    def __init__(self, path: str) -> None:
        self.path = path

    def change(
        self, fn: Callable[[Holder | None], Holder | None], *, create: bool = False
    ) -> Holder | None:
        """Replaces the record by ``fn(record)`` (None deletes it); returns it.

        ``create`` is for the local record's signature: an object store has no folders.
        """
        current = parse(fs.read_text(self.path)) if fs.exists(self.path) else None
        new = fn(current)
        if new is None:
            fs.remove(self.path)
        elif current is not None and new.token == current.token:
            fs.write_text(self.path, json.dumps(dataclasses.asdict(new)))
        else:
            if current is not None:
                fs.remove(self.path)
            if not _create_only(self.path, json.dumps(dataclasses.asdict(new))):
                raise Lost(self.path)
        return new


class Lost(Exception):
    """Another writer created the lock object between our read and our write."""


def _create_only(path: str, text: str) -> bool:
    """Writes the object ``path`` only if it does not exist; False if it did."""
    import fsspec

    filesystem, _, (key,) = fsspec.get_fs_token_paths(path)
    try:
        if path.startswith("gs://"):
            filesystem.pipe_file(key, text.encode(), mode="create")
        else:
            with filesystem.open(key, "xb") as f:
                f.write(text.encode())
    except FileExistsError:
        return False
    return True


def parse(text: str) -> Holder | None:
    try:
        doc = json.loads(text) if text.strip() else {}
        return Holder(**doc) if doc else None
    except (ValueError, TypeError):
        return None
