"""What ``/proc`` says of a pid: its state and start time, and this boot and PID namespace.

A lock holder's pid decides whether it lives only where that pid means the
same process: on this host, in this boot of its kernel and in this PID
namespace (:func:`pid_space`).
"""

from __future__ import annotations

import os

__all__ = [
    "EXITED_STATES",
    "boot_id",
    "pid_dead",
    "pid_space",
    "pid_start",
    "process_alive",
    "read_link",
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


def read_link(path: str) -> str | None:
    """The target of the symbolic link ``path``; None if it cannot be read."""
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
    if read_link("/proc/self") != str(os.getpid()):
        return None
    boot, namespace = boot_id(), read_link("/proc/self/ns/pid")
    return (boot, namespace) if boot and namespace else None


def process_alive(pid: int, started: str | None) -> bool:
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
