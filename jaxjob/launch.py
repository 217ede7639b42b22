"""``jaxjob launch``: start N local processes of one ``jax.distributed`` job on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TextIO

from jaxjob.distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

__all__ = ["launch"]

GRACE_S = 10.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(i: int, n: int, port: int, devices: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            ENV_COORDINATOR: f"127.0.0.1:{port}",
            ENV_NUM_PROCESSES: str(n),
            ENV_PROCESS_ID: str(i),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if devices is not None:
        flag = f"--xla_force_host_platform_device_count={devices}"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
    return env


def _pump(i: int, proc: subprocess.Popen, out: TextIO, lock: threading.Lock) -> None:
    for line in proc.stdout:
        with lock:
            out.write(f"[process={i}] {line}")
            out.flush()


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _forwarding_sigterm(procs: list[subprocess.Popen]) -> Iterator[None]:
    """Passes a SIGTERM sent to the launcher (a scheduler's preemption notice) to every process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch(
    command: Sequence[str],
    *,
    num_processes: int,
    devices_per_process: int | None = None,
    out: TextIO | None = None,
) -> int:
    """Runs ``command`` as ``num_processes`` processes of one job; returns the job's exit status.

    Each process gets ``JAXJOB_COORDINATOR`` (127.0.0.1 and a free port),
    ``JAXJOB_NUM_PROCESSES`` and ``JAXJOB_PROCESS_ID``, which
    :func:`jaxjob.distributed.initialize` reads. Each output line is
    prefixed with ``[process=i]``. When a process exits non-zero, the others
    are stopped (SIGTERM, then SIGKILL after 10 s) and its status is returned
    (128 + N for a process killed by signal N). A SIGTERM sent to the
    launcher, the way a scheduler preempts a job, is passed on to every
    process (a :class:`jaxjob.JobRunner` then saves the running epoch and
    raises :class:`jaxjob.Preempted` on every process).

    Raises:
        ValueError: If ``command`` is empty or a count is below 1.
    """
    if not command:
        raise ValueError("command is empty; give the program to run after --")
    if num_processes < 1 or (devices_per_process is not None and devices_per_process < 1):
        raise ValueError(
            f"num_processes and devices_per_process must be >= 1, got "
            f"{num_processes} and {devices_per_process}"
        )
    out = out or sys.stdout
    port, lock = _free_port(), threading.Lock()
    procs: list[subprocess.Popen] = []
    with _forwarding_sigterm(procs):
        procs.extend(
            subprocess.Popen(
                list(command),
                env=_env(i, num_processes, port, devices_per_process),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(num_processes)
        )
        pumps = [
            threading.Thread(target=_pump, args=(i, p, out, lock)) for i, p in enumerate(procs)
        ]
        for t in pumps:
            t.start()
        status = _wait_first_failure(procs)
    for t in pumps:
        t.join()
    return status


def _wait_first_failure(procs: list[subprocess.Popen]) -> int:
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            _stop(procs)
            return _exit_status(failed[0])
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)
