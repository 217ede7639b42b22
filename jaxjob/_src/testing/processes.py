"""A job's child processes: started in a process group of their own, ended with every member gone.

A run ends only once every process of its group has exited (what is left is
SIGKILLed), so a restart never meets the killed job's processes holding its
lock or its port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from jaxjob._src.base.checks import is_int
from jaxjob._src.manager import lock

__all__ = ["EXIT_WAIT_S", "command", "end_group", "start", "wait"]

EXIT_WAIT_S = 60.0  # how long every process of an ended job may take to exit after SIGKILL


def command(argv: Sequence[str], processes: int) -> list[str]:
    """``python ARGV...``, or ``jaxjob launch -n N -- python ARGV...`` for ``processes`` > 1.

    Raises:
        ValueError: If ``processes`` is not an int >= 1 or ``argv`` is empty.
    """
    if not is_int(processes) or processes < 1:
        raise ValueError(f"processes must be an int >= 1, got {processes!r}")
    if isinstance(argv, str) or not argv:
        raise ValueError(f"argv must be a non-empty list of arguments after python, got {argv!r}")
    program = [sys.executable, *map(str, argv)]
    if processes == 1:
        return program
    return [sys.executable, "-m", "jaxjob.cli", "launch", "-n", str(processes), "--", *program]


def start(command: list[str], env: Mapping[str, str] | None) -> subprocess.Popen:
    """Starts ``command`` in a process group of its own, its stdout and stderr on one pipe."""
    return subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: one killpg reaches every process
    )


def _running_in_group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` still running (a zombie has exited: not listed).

    Read from ``/proc`` on Linux; elsewhere any member, zombies included, counts.
    """
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    found = []
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        fields = lock.stat_fields(pid)  # None: it exited while we looked
        running = fields and len(fields) > 2 and fields[0] not in lock.EXITED_STATES
        if running and int(fields[2]) == pgid:
            found.append(pid)
    return sorted(found)


def end_group(pgid: int, output: list[str], timeout_s: float = EXIT_WAIT_S) -> None:
    """SIGKILLs what is left of process group ``pgid`` and waits until every process exited.

    The launcher of a multi-process job exits before the processes it
    started are gone (killed with it, or left behind); a restart meeting one
    of them would find the node's lock held or the coordinator's port taken.

    Raises:
        AssertionError: If some process still runs ``timeout_s`` after SIGKILL.
    """
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # every process of the group is gone and reaped
        return
    deadline = time.monotonic() + timeout_s
    while running := _running_in_group(pgid):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"processes {running} of the job (process group {pgid}) still run {timeout_s:g} s "
                f"after SIGKILL (stuck in the kernel, e.g. on I/O?). Output:\n"
                f"{''.join(output)[-4000:]}"
            )
        time.sleep(0.02)


def _read_lines(stream: Any, into: list[str]) -> None:
    for line in stream:
        into.append(line)


def wait(proc: subprocess.Popen, timeout_s: float, delay_s: float | None) -> tuple[int, str]:
    """Waits for ``proc``, reading its output, and kills its process group after ``delay_s``.

    It returns only once every process of the group has exited (what is
    left when ``proc`` ends is killed), so a restart meets none of them. A
    process the job started and left running holds its output open: the
    output is read to its end only after that.

    Returns:
        Its exit status and output.

    Raises:
        AssertionError: If it runs past ``timeout_s`` (it is killed), or a
            process of its group does not exit within :data:`EXIT_WAIT_S` of
            SIGKILL, or its output stays open that long after (a process
            that left the group holds it).
    """
    lines: list[str] = []
    reader = threading.Thread(
        target=_read_lines, args=(proc.stdout, lines), name="jaxjob-testing output", daemon=True
    )
    reader.start()
    killing = delay_s is not None and delay_s < timeout_s
    try:
        proc.wait(timeout=delay_s if killing else timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        timed_out = not killing
    end_group(proc.pid, lines)
    reader.join(EXIT_WAIT_S)
    output = "".join(lines)
    if reader.is_alive():
        raise AssertionError(
            f"the job's output stayed open {EXIT_WAIT_S:g} s after every process of its process "
            f"group {proc.pid} exited: a process it started left the group (setsid?) and still "
            f"runs. Output:\n{output[-4000:]}"
        )
    proc.stdout.close()
    if timed_out:
        raise AssertionError(f"the job did not end within {timeout_s} s. Output:\n{output[-4000:]}")
    return proc.returncode, output
