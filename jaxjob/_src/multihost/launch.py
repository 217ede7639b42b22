"""``jaxjob launch``: start N local processes of one ``jax.distributed`` job on 127.0.0.1.

The processes live no longer than the launcher: on Linux each is started with
``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel kills it the moment the
launcher dies, even by SIGKILL (which no handler of the launcher's could
catch). A relaunch then never meets the previous launch's processes still
holding a node's lock or the coordinator's port. Only the launcher's own
children are covered: a command that starts further processes must stop
them itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

__all__ = ["DRAIN_S", "GRACE_S", "launch"]

# What the launcher tells each process (read by jaxjob.distributed.initialize). Defined here, so
# that the launcher, which only starts processes, imports neither JAX nor Orbax.
ENV_COORDINATOR = "JAXJOB_COORDINATOR"
ENV_NUM_PROCESSES = "JAXJOB_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXJOB_PROCESS_ID"

GRACE_S = 5.0  # after the first failure: SIGTERM to the others, SIGKILL this much later
DRAIN_S = 5.0  # once every process ended: how long their output may take to reach its end
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    """The C library's ``prctl``, resolved in the launcher (not in a forked child), or None."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def _dies_with_launcher() -> Callable[[], None] | None:
    """A ``preexec_fn`` making the kernel SIGKILL the child when the launcher dies (Linux).

    The death signal is tied to the thread that forked the child: :func:`launch`
    forks from the thread that then waits for every child, so it lives as
    long as they do. A launcher that died before the child set its death
    signal is caught by comparing the child's parent with the launcher.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    launcher = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(127)  # cannot tie its life to the launcher's: do not run untied
        if os.getppid() != launcher:  # the launcher died before prctl
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def _free_port() -> int:
    """A TCP port free on every interface, below the kernel's ephemeral range where it can be.

    The coordinator binds the port on every interface once its process starts. A port taken
    from the ephemeral range (``bind(0)``) can meanwhile become the local end of any outgoing
    connection on the machine, and the coordinator then fails to start; ports below the
    range are only ever taken by a bind.
    """
    low = _ephemeral_low()
    choose = random.Random()
    for _ in range(64):
        port = choose.randrange(max(1024, low - 16384), low)
        if _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux; elsewhere IANA's 49152)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _bindable(port: int) -> bool:
    """Whether ``port`` can be bound on every interface, as a gRPC server binds it.

    On IPv6's, which covers IPv4's too, or on IPv4's where the machine has no IPv6.
    """
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, port))
            return True
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return False
    return False


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


def _how(returncode: int) -> str:
    """``exited with status 3``, ``was killed by signal 9 (SIGKILL)``."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "unknown"
    return f"was killed by signal {-returncode} ({name})"


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to every live process, SIGKILL to those still alive ``grace_s`` later; reaps all."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
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
    err: TextIO | None = None,
    grace_s: float = GRACE_S,
) -> int:
    """Runs ``command`` as ``num_processes`` processes of one job; returns the job's exit status.

    Each process gets ``JAXJOB_COORDINATOR`` (127.0.0.1 and a free port),
    ``JAXJOB_NUM_PROCESSES`` and ``JAXJOB_PROCESS_ID``, which
    :func:`jaxjob.distributed.initialize` reads. Each output line is
    prefixed with ``[process=i]``. When a process exits non-zero, one line on
    ``err`` names it and how it ended, the others are stopped (SIGTERM, then
    SIGKILL after ``grace_s``) and its status is returned (128 + N for a
    process killed by signal N). If the launcher dies, even by SIGKILL, the
    kernel kills every process (Linux; see the module). A SIGTERM sent to the
    launcher, the way a scheduler preempts a job, is passed on to every
    process (a :class:`jaxjob.JobRunner` then saves the running epoch and
    raises :class:`jaxjob.Preempted` on every process).

    Raises:
        ValueError: If ``command`` is empty, a count is below 1 or
            ``grace_s`` is negative.
    """
    if not command:
        raise ValueError("command is empty; give the program to run after --")
    if num_processes < 1 or (devices_per_process is not None and devices_per_process < 1):
        raise ValueError(
            f"num_processes and devices_per_process must be >= 1, got "
            f"{num_processes} and {devices_per_process}"
        )
    if isinstance(grace_s, bool) or not grace_s >= 0:
        raise ValueError(f"grace_s must be a number of seconds >= 0, got {grace_s!r}")
    out, err = out or sys.stdout, err or sys.stderr
    port, lock = _free_port(), threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    preexec = _dies_with_launcher()
    try:
        with _forwarding_sigterm(procs):
            for i in range(num_processes):
                procs.append(
                    subprocess.Popen(
                        list(command),
                        env=_env(i, num_processes, port, devices_per_process),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        preexec_fn=preexec,
                    )
                )
            # pumps start after the last fork: no thread of ours runs while a child forks
            pumps.extend(
                threading.Thread(target=_pump, args=(i, p, out, lock), daemon=True)
                for i, p in enumerate(procs)
            )
            for t in pumps:
                t.start()
            status = _wait_first_failure(procs, err, grace_s)
    finally:
        _stop(procs, grace_s)  # an error in the launcher itself: leave no process behind
    _drain(pumps, err)
    return status


def _drain(pumps: list[threading.Thread], err: TextIO) -> None:
    """Lets the processes' output reach its end, for :data:`DRAIN_S` at most.

    A process that started another and left it running leaves it the write
    end of its output: that output ends only when the other process does,
    which the launcher does not wait for.
    """
    deadline = time.monotonic() + DRAIN_S
    for t in pumps:
        t.join(max(0.0, deadline - time.monotonic()))
    open_ = [i for i, t in enumerate(pumps) if t.is_alive()]
    if open_:
        err.write(
            f"jaxjob launch: the output of processes {open_} is still open {DRAIN_S:g} s after "
            "they ended (a process they started holds it); not waiting for it\n"
        )
        err.flush()


def _wait_first_failure(procs: list[subprocess.Popen], err: TextIO, grace_s: float) -> int:
    """Waits for every process; on the first failure reports it and stops the others.

    One thread per process waits for it, so exits are seen in the order they
    happen, and the process named is the one that failed first.
    """
    ended: queue.Queue[tuple[int, int]] = queue.Queue()
    for i, proc in enumerate(procs):
        threading.Thread(
            target=lambda i=i, proc=proc: ended.put((i, proc.wait())),
            name=f"jaxjob-launch wait {i}",
            daemon=True,
        ).start()
    for _ in procs:
        while True:  # a timeout keeps the SIGTERM handler running promptly
            try:
                first, code = ended.get(timeout=0.1)
                break
            except queue.Empty:
                continue
        if code == 0:
            continue
        running = [i for i, p in enumerate(procs) if p.poll() is None]
        stopping = (
            f"; stopping processes {running} (SIGTERM, then SIGKILL after {grace_s:g} s)"
            if running
            else ""
        )
        err.write(
            f"jaxjob launch: process {first} of {len(procs)} failed first: it "
            f"{_how(code)}{stopping}\n"
        )
        err.flush()
        _stop(procs, grace_s)
        return _exit_status(code)
    return 0
