"""Who holds a lock, whether it still lives, and the record's bytes (JSON).

:class:`Holder` names the holder (host, boot, PID namespace, pid, start
time, last renewal) and says whether it lives: by its pid only when it runs
on this host, in this boot of its kernel and in this PID namespace
(:meth:`Holder.pid_comparable`), otherwise by its lease.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time
import uuid

import jax

from jaxjob._src.manager.lock.pids import (
    boot_id,
    pid_space,
    pid_start,
    process_alive,
    read_link,
)

__all__ = ["Holder", "encode", "parse"]


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
            jax.process_count(), boot_id(), read_link("/proc/self/ns/pid"),
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
        return process_alive(self.pid, self.pid_start)


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
