"""The record of a node's lock: who holds it, whether it lives, and the file keeping it.

:class:`Holder` names the holder (host, boot, PID namespace, pid, start
time, last renewal) and says whether it still lives: by its pid only when it
runs on this host, in this boot of its kernel and in this PID namespace
(:meth:`Holder.pid_comparable`), otherwise by its lease. :class:`LocalRecord`
keeps the record in a file changed under an exclusive ``flock``; the
object-store record is :mod:`jaxjob._src.manager.lock_object`, the lock
itself :mod:`jaxjob._src.manager.lock`.
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

__all__ = [
    "EXITED_STATES",
    "Holder",
    "LocalRecord",
    "Lost",
    "encode",
    "parse",
    "pid_space",
    "pid_start",
    "stat_fields",
]


EXITED_STATES = ("Z", "X", "x")  # /proc states of a process that has exited, not yet reaped


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), if readable.

    ``pid`` may be ``"self"``: this process, whichever PID namespace ``/proc`` shows.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_start(pid: int | str) -> str | None:
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


def _read_link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def boot_id() -> str | None:
    """This boot of the kernel (``/proc/sys/kernel/random/boot_id``), if readable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def pid_space() -> tuple[str, str] | None:
    """This boot and this process's PID namespace (``"pid:[4026531836]"``), if pids can be checked.

    None without ``/proc``, or when the ``/proc`` mounted here is another PID
    namespace's (``/proc/self`` is not ``os.getpid()``): the pids it shows are
    not this process's pids.
    """
    if _read_link("/proc/self") != str(os.getpid()):
        return None
    boot, namespace = boot_id(), _read_link("/proc/self/ns/pid")
    return (boot, namespace) if boot and namespace else None


def _process_alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` (this PID namespace's) runs, still the process started at ``started``."""
    if started is not None and pid_start(pid) not in (None, started):
        return False
    if pid_dead(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lock: host, pid, when it started, when it last renewed, a unique token.

    ``boot_id`` and ``pidns`` say in which boot of the host's kernel and in
    which PID namespace ``pid`` is a pid; a record without them (written by an
    older jaxjob) counts as another namespace's.
    """

    host: str
    pid: int
    pid_start: str | None
    started: float
    renewed: float
    token: str
    processes: int = 1
    boot_id: str | None = None
    pidns: str | None = None

    @classmethod
    def me(cls) -> Holder:
        """A record naming this process, renewed now."""
        now = time.time()
        return cls(
            socket.gethostname(), os.getpid(), pid_start("self"), now, now, uuid.uuid4().hex,
            jax.process_count(), boot_id(), _read_link("/proc/self/ns/pid"),
        )  # fmt: skip

    def describe(self) -> str:
        """``host 'h', pid 12, started 2026-01-01 10:00:00 UTC``."""
        started = datetime.datetime.fromtimestamp(self.started, datetime.UTC)
        job = f" (process 0 of a {self.processes}-process job)" if self.processes > 1 else ""
        here = self.host == socket.gethostname() and pid_space() is not None
        elsewhere = (
            " in another PID namespace or boot" if here and not self.pid_comparable() else ""
        )
        return (
            f"host {self.host!r}, pid {self.pid}{elsewhere}{job}, "
            f"started {started:%Y-%m-%d %H:%M:%S} UTC"
        )

    def pid_comparable(self) -> bool:
        """Whether ``pid`` names a process of this host, boot and PID namespace (checkable here)."""
        space = pid_space()
        return (
            space is not None
            and self.host == socket.gethostname()
            and (self.boot_id, self.pidns) == space
        )

    def alive(self, lease_s: float, mine: set[str]) -> bool:
        """Whether the holder still lives (``mine``: tokens this process holds).

        By its pid where :meth:`pid_comparable` (gone, a zombie, or reused:
        dead at once), else by its lease: renewed less than ``lease_s`` ago.
        """
        if not self.pid_comparable():
            return time.time() - self.renewed < lease_s
        if self.pid == os.getpid():
            return self.token in mine
        return _process_alive(self.pid, self.pid_start)


class LocalRecord:
    """The lock file on local (or network) disk; changes under an exclusive ``flock``.

    A released lock's file is deleted, and its folder with the last lock in
    it. A process that waited for the ``flock`` of a file deleted meanwhile
    sees another inode at the path and starts over. Only taking the lock
    creates the file (and its folder): a renewal or a release of a file that
    is gone raises ``FileNotFoundError``.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> Holder | None:
        """The record as it stands (under a shared ``flock``); None if the file is gone."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return parse(os.pread(fd, 1 << 16, 0).decode(errors="replace"))
        finally:
            os.close(fd)

    def change(
        self, fn: Callable[[Holder | None], Holder | None], *, create: bool = False
    ) -> Holder | None:
        """Replaces the record by ``fn(record)`` atomically (None deletes it); returns it.

        Args:
            fn: The change.
            create: Whether to create the lock file and its folder (taking the
                lock); otherwise a missing one raises ``FileNotFoundError``.
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
        """Opens the lock file; ``create``: creating it and its folder in the existing db_prefix."""
        if not create:
            return os.open(self.path, os.O_RDWR)
        for _ in range(100):
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.dirname(self.path))
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                pass  # another node's release removed the folder between our mkdir and open
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
        os.ftruncate(fd, 0)
        os.pwrite(fd, encode(new), 0)
        os.fsync(fd)
        return new


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


class Lost(Exception):
    """Another writer changed the lock record between this process's read and its write."""


def encode(holder: Holder) -> bytes:
    """The record's bytes (JSON)."""
    return json.dumps(dataclasses.asdict(holder)).encode()


_FIELDS = frozenset(f.name for f in dataclasses.fields(Holder))


def parse(text: str | bytes | None) -> Holder | None:
    """The holder a record names; None for an empty or unreadable one.

    Fields this jaxjob does not know (a newer one's) are ignored; missing
    optional ones (an older one's) take their defaults.
    """
    try:
        doc = json.loads(text) if text and text.strip() else {}
        return Holder(**{k: v for k, v in doc.items() if k in _FIELDS}) if doc else None
    except (ValueError, TypeError, AttributeError):
        return None
