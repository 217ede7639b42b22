"""A process that takes a node's lock when told to, for the lock's race and PID namespace tests.

Usage: python lock_racer.py (commands on stdin, one a line; one answer a line on stdout)

* ``take PREFIX AT [LEASE_S]``: at ``time.time() >= AT``, tries to take the lock of node
  ``local`` under ``PREFIX`` (``WriterLock(PREFIX, "local", lease_s=LEASE_S)``, default
  ``LEASE_S``); answers ``won TOKEN`` or ``lost MESSAGE``. A won lock is held (and renewed)
  until ``release``.
* ``release``: releases the lock held, if any; answers ``released``.
* ``die``: exits at once (``os._exit``) between two renewals, the lock neither released nor
  renewed any more: a crashed holder. (A holder killed in the middle of a renewal leaves an
  empty record, which is free at once.)

It starts by answering ``ready PIDNS`` (the PID namespace it runs in). :class:`Racer` starts
and drives one from a test, in a PID namespace of its own if asked (``unshare``, as an
unprivileged user: a container on this host with the same host name).
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import functools
import os
import queue
import subprocess
import sys
import threading
import time

import jaxjob
from jaxjob._src.manager import lock

job_start.imported()


def take(prefix: str, at: float, lease_s: float) -> tuple[str, lock.WriterLock | None]:
    while time.time() < at:
        time.sleep(max(0.0, min(0.001, at - time.time())))
    held = lock.WriterLock(prefix, "local", lease_s=lease_s)
    try:
        held.take()
    except jaxjob.CheckpointInUseError as err:
        return f"lost {err}".replace("\n", " "), None
    return f"won {held._holder.token}", held


def main() -> None:
    print("ready", os.readlink("/proc/self/ns/pid"), flush=True)
    held = None
    for line in sys.stdin:
        command, *args = line.split()
        if command == "take":
            lease_s = float(args[2]) if len(args) > 2 else lock.LEASE_S
            answer, held = take(args[0], float(args[1]), lease_s)
        elif command == "release":
            if held is not None:
                held.release()
            held, answer = None, "released"
        elif command == "die":
            if held is not None:  # not in the middle of rewriting the record
                held._stop.set()
                held._thread.join()
            os._exit(9)
        else:
            answer = f"unknown command {command!r}"
        print(answer, flush=True)


# A new user namespace (root inside, unprivileged outside), a new PID namespace with its own
# /proc, the racer killed with unshare.
UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
UNSHARE += ["--kill-child"]


@functools.cache
def namespaces_work() -> bool:
    """Whether this user may start a process in a PID namespace of its own here."""
    try:
        done = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class Racer:
    """A ``lock_racer.py`` process driven over its pipes; ``namespace``: in a PID namespace of
    its own."""

    def __init__(self, *, namespace: bool = False) -> None:
        self.namespace = namespace
        argv = [sys.executable, os.path.abspath(__file__)]
        self.proc = subprocess.Popen(
            [*UNSHARE, *argv] if namespace else argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.pidns = self.answer(120).split()[1]

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._answers.put(line.rstrip("\n"))
        self._answers.put("exited")

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout_s: float = 60) -> str:
        return self._answers.get(timeout=timeout_s)

    def ask(self, command: str) -> str:
        self.send(command)
        return self.answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the loop ends: the lock held is released at exit
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def race(racers: list[Racer], prefix: str, *, lease_s: float | None = None) -> list[str]:
    """Every racer tries to take the lock under ``prefix`` at the same instant; their answers."""
    at = time.time() + 0.05 + 0.01 * len(racers)
    lease = "" if lease_s is None else f" {lease_s}"
    for racer in racers:
        racer.send(f"take {prefix} {at}{lease}")
    return [racer.answer() for racer in racers]


if __name__ == "__main__":
    main()
