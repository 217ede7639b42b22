"""A fork server for the suite's Python child processes: JAX and Orbax imported once per worker.

The default tier starts about 300 child processes (killed and restarted jobs, ``jaxjob
launch``, CLI runs), and each spent ~1.2 s of CPU importing JAX, Orbax and NumPy before doing
anything: most of the tier's CPU on two cores. A *zygote* imports them once per pytest process
(no JAX backend, no thread of its own), then forks a real process for each
``python SCRIPT|-m MODULE|-c CODE ...`` that a test starts with :mod:`subprocess`. The child
gets the asked-for argv, environment, working directory, standard streams and session, runs
the program as ``__main__`` and exits as ``python`` would (atexit handlers, exit status,
tracebacks, signals). It is a real process: it has its own pid, it can be SIGKILLed, it holds
its own locks and sockets.

The pytest process stays its parent, so :class:`subprocess.Popen` works unchanged (``wait``,
``poll``, ``kill``, pipes): the zygote forks twice and the middle process exits at once, and
the pytest process is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so the orphaned
program is adopted by it, not by PID 1. Other orphans it adopts (the children of a killed
``jaxjob launch``) are reaped by a background thread, as PID 1 would.

Only what a fork cannot tell apart from a fresh ``python`` goes through the zygote: the same
interpreter, no ``preexec_fn``, ``pass_fds``, user, group or umask change, and the same values
as the zygote for every environment variable read at import (JAX's configuration, ``PYTHON*``,
``XLA_PYTHON_*``, ``TF_*``). ``XLA_FLAGS`` may differ (XLA reads it when the backend starts).
Everything else starts as before. Each child reseeds Python's and NumPy's global random
generators; it shares the zygote's ``hash()`` seed. ``JAXJOB_TEST_ZYGOTE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_MAX_MESSAGE = 1 << 20
# Environment variables whose values the zygote's imports have already read.
_READ_AT_IMPORT = (
    "PYTHON",
    "XLA_PYTHON_",
    "TF_",
    "TENSORSTORE_",
    "ABSL",
    "OPENBLAS",
    "OMP_",
    "EPATH",
)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


# --------------------------------------------------------------------------------------------
# The zygote (``python zygote.py FD``)
# --------------------------------------------------------------------------------------------


def _preload() -> list:
    """Imports what every job imports; returns the root logging handlers those imports added.

    Orbax's import logs through absl, which gives the root logger a handler when it has none
    (``logging.basicConfig()``): see :func:`_replay_orbax_logging`.
    """
    import gc
    import logging

    before = list(logging.root.handlers)

    import chex  # noqa: F401
    import jax
    import jax.numpy  # noqa: F401
    import numpy  # noqa: F401
    import optax  # noqa: F401
    import orbax.checkpoint  # noqa: F401
    from etils import epath  # noqa: F401

    if jax._src.xla_bridge._backends:  # a backend's threads would not survive the fork
        raise RuntimeError("the zygote must not start a JAX backend")
    gc.freeze()  # the children's collections skip what the imports made
    return [h for h in logging.root.handlers if h not in before]


def _replay_orbax_logging(added: list) -> None:
    """Undoes the root handlers that the zygote's Orbax import added, and adds them back as a
    fresh interpreter would: when the program first imports Orbax, if the root logger has no
    handler by then (a program that configures logging first keeps its own configuration)."""
    import builtins
    import logging

    if not added:
        return
    for handler in added:
        logging.root.removeHandler(handler)
    original = builtins.__import__

    def importing(name, *args, **kwargs):
        if name == "orbax" or name.startswith("orbax."):
            builtins.__import__ = original
            if not logging.root.handlers:
                logging.basicConfig()
        return original(name, *args, **kwargs)

    builtins.__import__ = importing


def _serve(sock: socket.socket) -> list[str]:
    """Answers fork requests until the pytest process closes its end.

    Returns only in a forked program's process: the argv it runs after ``python``.
    """
    while True:
        message, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
        if not message:
            os._exit(0)
        request = json.loads(message)
        read, write = os.pipe()
        if _fork_twice() == 0:  # the program's process
            sock.close()
            os.close(read)
            _become(request, fds, write)
            return request["argv"]
        os.close(write)
        for fd in fds:
            os.close(fd)
        data = os.read(read, 4)  # once the program has its session, streams and directory
        os.close(read)
        reply = {"pid": struct.unpack("i", data)[0]} if len(data) == 4 else {"pid": None}
        sock.send(json.dumps(reply).encode())


def _fork_twice() -> int:
    """Forks the program's process through a middle one that exits at once.

    Returns 0 in the program's process (once the subreaper has adopted it), and the middle
    process's pid in the zygote (once it has exited).
    """
    middle = os.fork()
    if middle == 0:
        middle = os.getpid()
        if os.fork() == 0:
            while os.getppid() == middle:  # until adopted: its parent is then the test's
                time.sleep(0.0002)
            return 0
        os._exit(0)
    os.waitpid(middle, 0)
    return middle


def _become(request: dict, fds: list[int], ready: int) -> None:
    """Turns this fork into the requested process: session, streams, directory, environment;
    then writes its pid to ``ready``, as an exec would tell the parent that it went through."""
    if request["new_session"]:
        os.setsid()
    elif request["process_group"] == 0:
        os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.write(ready, struct.pack("i", os.getpid()))
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    import random

    import numpy

    random.seed()
    numpy.random.seed()
    _set_buffering()


def _run(argv: list[str]) -> None:
    """Runs ``python ARGV`` in this process, as the interpreter's own start-up would."""
    import builtins
    import runpy
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(argv[1], alter_argv=True)
        return
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        return
    path = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    main.__file__, main.__cached__ = path, None
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _zygote_main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    _prctl(_PR_SET_PDEATHSIG, 9)  # the zygote ends with its pytest process
    added = _preload()
    sock.send(b"ready")
    argv = _serve(sock)  # returns in a forked program's process only
    _replay_orbax_logging(added)
    _run(argv)


def _started(popen, call: dict, pid: int) -> None:
    """What Popen's ``_execute_child`` does in the parent once its child has started."""
    popen.pid = pid
    popen._child_created = True
    popen._close_pipe_fds(
        *(call[name] for name in ("p2cread", "p2cwrite", "c2pread", "c2pwrite")),
        *(call[name] for name in ("errread", "errwrite")),
    )


# --------------------------------------------------------------------------------------------
# The pytest side
# --------------------------------------------------------------------------------------------


class _Zygote:
    """A running zygote: its socket and the import-time environment it was started with."""

    def __init__(self, signature: tuple, known: weakref.WeakValueDictionary) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        known[process.pid] = self.process = process
        theirs.close()
        if ours.recv(16) != b"ready":
            raise RuntimeError("the test zygote did not start (see its output above)")
        self.sock, self.signature = ours, signature

    def close(self) -> None:
        """Ends the zygote (it exits when its socket closes); programs it forked go on."""
        self.sock.close()
        self.process.wait()


class _Client:
    """The zygotes of one pytest process, started at the first Python child a test starts."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # one request at a time; held while a pid is unknown
        self.zygotes: dict[tuple, _Zygote] = {}  # by the environment their imports read
        # pid -> the Popen that waits for it: its exit is the Popen's to reap, not the reaper's
        self.known: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def zygote_for(self, env: Mapping) -> _Zygote | None:
        """A zygote whose imports read what a fresh ``python`` with ``env`` would read.

        The process's own environment may change during the run (a session fixture sets
        variables): then a zygote starts from it (the two latest are kept). A child given
        other values than the process's own starts as a fresh ``python``.
        """
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
        if env.get("JAXJOB_TEST_ZYGOTE") == "0":
            return None
        wanted = _signature(env)
        if wanted in self.zygotes:
            return self.zygotes[wanted]
        if wanted != _signature(os.environ):
            return None
        if not self.zygotes:
            _prctl(_PR_SET_CHILD_SUBREAPER, 1)
            threading.Thread(target=self._reap_orphans, name="zygote-reaper", daemon=True).start()
        while len(self.zygotes) >= 2:
            self.zygotes.pop(next(iter(self.zygotes))).close()
        self.zygotes[wanted] = _Zygote(wanted, self.known)
        return self.zygotes[wanted]

    def spawn(self, zygote: _Zygote, popen, call: dict) -> None:
        """Has ``zygote`` fork the program; sets ``popen.pid`` as ``_execute_child`` would."""
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in (call["env"] or os.environ).items()}
        streams = [
            call[name] if call[name] != -1 else default
            for name, default in (("p2cread", 0), ("c2pwrite", 1), ("errwrite", 2))
        ]
        request = {
            "argv": [os.fspath(a) for a in call["args"][1:]],
            "env": env,
            "cwd": os.fspath(call["cwd"]) if call["cwd"] is not None else os.getcwd(),
            "new_session": bool(call["start_new_session"]),
            "process_group": call.get("process_group", -1),
        }
        socket.send_fds(zygote.sock, [json.dumps(request).encode()], streams)
        pid = json.loads(zygote.sock.recv(_MAX_MESSAGE))["pid"]
        if pid is None:
            raise RuntimeError(f"the test zygote could not start {call['args']!r}")
        _started(popen, call, pid)

    def _reap_orphans(self) -> None:
        """Reaps the exited processes this subreaper adopted that no Popen waits for."""
        me = os.getpid()
        while True:
            time.sleep(0.2)
            with self.lock:
                for pid in _zombie_children(me):
                    popen = self.known.get(pid)
                    if popen is not None and popen.returncode is None:
                        continue
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)


def _eligible(call: dict) -> bool:
    """Whether ``Popen(**call)`` runs ``python SCRIPT|-m MODULE|-c CODE`` in a way a fork
    of this interpreter can reproduce."""
    args = call["args"]
    if not isinstance(args, (list, tuple)) or len(args) < 2 or call["shell"]:
        return False
    if call["executable"] not in (None, args[0]) or os.fspath(args[0]) != sys.executable:
        return False
    if call["preexec_fn"] is not None or call["pass_fds"] or call["umask"] >= 0:
        return False
    if any(call[k] is not None for k in ("gid", "gids", "uid")) or not call["close_fds"]:
        return False
    if call["cwd"] is not None and not os.path.isdir(call["cwd"]):
        return False
    argv = [os.fspath(a) for a in args[1:]]
    if argv[0] in ("-m", "-c"):
        return len(argv) >= 2
    return not argv[0].startswith("-") and os.path.isfile(argv[0])


def _signature(env: Mapping[str, str]) -> tuple:
    """The variables of ``env`` that the zygote's imports read, with their values.

    ``PYTHONUNBUFFERED`` is not one: a forked program sets its streams from it
    (:func:`_set_buffering`).
    """
    import jax

    names = {n.upper() for n in jax.config._value_holders}
    return tuple(
        sorted(
            (k, v)
            for k, v in env.items()
            if (k in names or k.startswith(_READ_AT_IMPORT)) and k != "PYTHONUNBUFFERED"
        )
    )


def _set_buffering() -> None:
    """Standard streams buffered as ``python`` sets them up for this environment."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(write_through=unbuffered or stream is sys.stderr)


def _zombie_children(parent: int) -> set[int]:
    zombies = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(b")") + 2 :].split()[:2]
        if state == b"Z" and int(ppid) == parent:
            zombies.add(int(entry))
    return zombies


def install() -> None:
    """Routes this process's eligible Python children through a zygote (Linux only)."""
    if sys.platform != "linux" or os.environ.get("JAXJOB_TEST_ZYGOTE", "1") == "0":
        return
    original = subprocess.Popen._execute_child
    if getattr(original, "zygote", False):
        return
    # JAX's import sets variables of its own (TF_CPP_MIN_LOG_LEVEL), in the zygote as here:
    # imported now, before any test copies os.environ for a child.
    import jax  # noqa: F401

    names = list(inspect.signature(original).parameters)[1:]
    client = _Client()

    def execute_child(self, *args):
        call = dict(zip(names, args, strict=True))
        with client.lock:
            zygote = client.zygote_for(call["env"] or os.environ) if _eligible(call) else None
            if zygote is not None:
                client.spawn(zygote, self, call)
            else:
                original(self, *args)
            client.known[self.pid] = self

    execute_child.zygote = True
    subprocess.Popen._execute_child = execute_child


if __name__ == "__main__":
    _zygote_main()
