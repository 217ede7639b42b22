"""Object stores (``gs://``, ``s3://``): their client packages, and a time bound on every operation.

Every remote operation of :mod:`jaxjob._src.base.fs` runs through
:func:`bounded`: it fails with :class:`StorageTimeoutError` (a
``TimeoutError``) naming the endpoint when it takes longer than
:func:`storage_timeout_s` (a manager's ``storage_timeout_s=``, else the
environment variable ``JAXJOB_STORAGE_TIMEOUT_S``, default 120 s), so an
endpoint that accepts connections and never answers fails a save instead of
hanging it. A missing client package (``gcsfs``, ``s3fs``) raises
:class:`MissingExtraError` naming the extra to install.

**One class of storage errors.** Whatever a client raises for a store it
cannot reach (botocore's ``EndpointConnectionError``, aiohttp's reset
connections, a name that does not resolve, an HTTP 5xx answer) leaves
:func:`bounded` as an ``OSError``: a :class:`StorageError` naming the
operation, the path and the endpoint, its cause the client's exception. So
every caller's ``except OSError`` (the save-failure policy, the history,
retention, the lock) handles every way a store fails, as for a local disk.

**No stuck call holds the exit.** A call that outlasted its bound is left
running (no client call can be cancelled), and so are the threads it started
(Orbax's ``async_save`` thread, the event loops' executors), which Python
joins when the program ends. Once a call was abandoned, a daemon thread
watches the exit: if the process is still there :func:`storage_timeout_s`
after the last abandonment (and at least :data:`EXIT_GRACE_S` after the
program's end), it flushes the logs and standard streams and ends the
process: status 1 after an uncaught exception, else 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from jaxjob._src.base.checks import is_number

__all__ = [
    "DEFAULT_STORAGE_TIMEOUT_S",
    "MIN_TRANSFER_BYTES_S",
    "REMOTE_SCHEMES",
    "STORAGE_TIMEOUT_ENV",
    "EXIT_GRACE_S",
    "MissingExtraError",
    "StorageError",
    "StorageTimeoutError",
    "answering",
    "as_storage_error",
    "bounded",
    "endpoint",
    "is_remote",
    "require_backend",
    "set_storage_timeout",
    "storage_timeout_s",
    "transfer_bound_s",
]

REMOTE_SCHEMES = ("gs://", "s3://")
STORAGE_TIMEOUT_ENV = "JAXJOB_STORAGE_TIMEOUT_S"
DEFAULT_STORAGE_TIMEOUT_S = 120.0
# The slowest an object store may move a checkpoint's bytes before a save or restore of it
# fails: far below any real store, so only a store that stopped answering reaches the bound.
MIN_TRANSFER_BYTES_S = float(1 << 20)
# scheme -> (the module fsspec needs, the extra that installs it, the endpoint variables, default)
_BACKENDS = {
    "gs://": ("gcsfs", "gcs", ("STORAGE_EMULATOR_HOST",), "https://storage.googleapis.com"),
    "s3://": (
        "s3fs",
        "s3",
        ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        "https://s3.amazonaws.com",
    ),
}
_T = TypeVar("_T")


class MissingExtraError(ImportError):
    """A ``gs://`` or ``s3://`` path was used without the package that reaches it."""

    __module__ = "jaxjob"  # its public name: tracebacks and pickles say jaxjob.X


class StorageError(OSError):
    """An object store failed an operation: refused, reset or timed-out connections, DNS, 5xx.

    Its ``__cause__`` is the client's exception (botocore, aiohttp, gcsfs).
    """

    __module__ = "jaxjob"  # its public name: tracebacks and pickles say jaxjob.X


class StorageTimeoutError(StorageError, TimeoutError):
    """An object-store endpoint did not answer within :func:`storage_timeout_s`."""

    __module__ = "jaxjob"  # its public name: tracebacks and pickles say jaxjob.X


# db_prefix -> seconds, from the managers' ``storage_timeout_s=`` (the longest prefix wins)
_prefix_timeouts: dict[str, float] = {}
_prefix_lock = threading.Lock()


def set_storage_timeout(prefix: str, seconds: float) -> None:
    """Bounds every object-store operation under ``prefix`` by ``seconds`` (a manager's option).

    Raises:
        ValueError: If ``seconds`` is not a positive, finite number.
    """
    if not is_number(seconds):
        raise ValueError(f"storage_timeout_s must be a positive number of seconds, got {seconds!r}")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"storage_timeout_s must be a positive number of seconds, got {seconds!r}")
    with _prefix_lock:
        _prefix_timeouts[prefix.rstrip("/")] = float(seconds)


def storage_timeout_s(path: str | None = None) -> float:
    """How long one object-store operation on ``path`` may take.

    The ``storage_timeout_s=`` of the manager whose ``db_prefix`` holds
    ``path`` (:func:`set_storage_timeout`), else ``$JAXJOB_STORAGE_TIMEOUT_S``,
    else 120 s.

    Raises:
        ValueError: If the variable is set to anything but a positive number of seconds.

    Example:
        >>> storage_timeout_s() > 0
        True
    """
    if path is not None:
        with _prefix_lock:
            matches = [p for p in _prefix_timeouts if path == p or path.startswith(p + "/")]
            if matches:
                return _prefix_timeouts[max(matches, key=len)]
    text = os.environ.get(STORAGE_TIMEOUT_ENV)
    if not text:
        return DEFAULT_STORAGE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise ValueError(
            f"{STORAGE_TIMEOUT_ENV} must be a positive number of seconds, got {text!r}"
        )
    return value


def transfer_bound_s(path: str, nbytes: int) -> float:
    """How long moving ``nbytes`` to or from ``path``'s object store may take.

    :func:`storage_timeout_s` plus the bytes at :data:`MIN_TRANSFER_BYTES_S`
    (1 MiB/s): a save or restore on an object store that stops answering
    fails by then.

    Example:
        >>> transfer_bound_s("gs://b/run", 0) == storage_timeout_s("gs://b/run")
        True
    """
    return storage_timeout_s(path) + nbytes / MIN_TRANSFER_BYTES_S


def endpoint(path: str) -> str:
    """The URL of the object store holding ``path``, as its client is configured."""
    _, _, variables, default = _BACKENDS[path[: path.index("://") + 3]]
    return next((os.environ[v] for v in variables if os.environ.get(v)), default)


_checked: set[str] = set()


def _import_backend(scheme: str) -> None:
    """Imports the fsspec package of ``scheme`` (a static import each: nothing by name)."""
    if scheme == "gs://":
        import gcsfs  # noqa: F401
    else:
        import s3fs  # noqa: F401


def require_backend(path: str) -> None:
    """Checks that the package reaching ``path``'s object store can be imported.

    Raises:
        MissingExtraError: Naming the extra to install (``pip install "jaxjob[gcs]"``).
    """
    scheme = path[: path.index("://") + 3]
    if scheme in _checked:
        return
    module, extra, _, _ = _BACKENDS[scheme]
    try:
        _import_backend(scheme)
    except ImportError as err:
        raise MissingExtraError(
            f"{path!r} needs the {module} package, which is not installed: "
            f'pip install "jaxjob[{extra}]"'
        ) from err
    _checked.add(scheme)


def bounded(path: str, what: str, call: Callable[[], _T], *, timeout_s: float | None = None) -> _T:
    """``call()``, or :class:`StorageTimeoutError` if ``path`` is remote and it outlasts the bound.

    The bound is ``timeout_s``, by default :func:`storage_timeout_s` of
    ``path``. On local disk ``call`` runs here. For an object store it runs in a
    daemon thread (a client stuck on a silent endpoint cannot be cancelled:
    it is left behind, and cannot keep the interpreter from exiting), and a
    client's error for a store it cannot reach is a :class:`StorageError`.

    Raises:
        StorageTimeoutError: Naming the operation, the path and the endpoint.
        StorageError: The client's error, as an ``OSError`` naming the same.
        MissingExtraError: If the object store's package is not installed.
    """
    if not is_remote(path):
        return call()
    require_backend(path)
    if timeout_s is None:
        timeout_s = storage_timeout_s(path)
    outcome: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as err:  # handed to the caller, re-raised there
            outcome.append((False, err))
        finally:
            done.set()

    worker = threading.Thread(target=run, name=f"jaxjob-storage-{what}", daemon=True)
    worker.start()
    if not done.wait(timeout_s):
        abandoned(timeout_s, worker)
        _silent[endpoint(path)] = time.monotonic()
        raise StorageTimeoutError(
            f"the object store at {endpoint(path)} did not answer {what} of {path!r} within "
            f"{timeout_s:g} s; check the endpoint and the network, or set "
            f"storage_timeout_s= (or {STORAGE_TIMEOUT_ENV}) to wait longer"
        )
    _silent.pop(endpoint(path), None)
    ok, value = outcome[0]
    if not ok:
        raise as_storage_error(value, path, what)
    return value


_silent: dict[str, float] = {}  # endpoint -> when a call to it last outlasted its bound


def answering(path: str) -> bool:
    """False if the last call to ``path``'s object store outlasted its bound; True on local disk.

    For what may be skipped when the store is known not to answer (a lock's
    release at exit: it is taken over once its holder is gone anyway).

    Example:
        >>> answering("/tmp/run")
        True
    """
    return not is_remote(path) or endpoint(path) not in _silent


# The packages whose exceptions mean "the store failed" (not a caller's mistake); fsspec's
# own errors (FSTimeoutError) too. ``OSError`` and its subclasses pass as they are.
_CLIENT_PACKAGES = (
    "aiobotocore",
    "aiohttp",
    "botocore",
    "fsspec",
    "gcsfs",
    "google",
    "requests",
    "s3fs",
    "urllib3",
)


def as_storage_error(err: BaseException, path: str, what: str) -> BaseException:
    """``err`` as an ``OSError`` if it is an object-store client's exception; else ``err``.

    Example:
        >>> as_storage_error(KeyError("k"), "s3://b/run/x", "a write")  # not the store's
        KeyError('k')
        >>> refused = ConnectionRefusedError(111, "Connection refused")  # an OSError already
        >>> as_storage_error(refused, "s3://b/run/x", "a write") is refused
        True
    """
    if isinstance(err, OSError) or not isinstance(err, Exception):
        return err
    package = type(err).__module__.split(".", 1)[0]
    if package not in _CLIENT_PACKAGES:
        return err
    failure = StorageError(
        f"the object store at {endpoint(path)} failed {what} of {path!r}: "
        f"{type(err).__name__}: {err}"
    )
    failure.__cause__ = err
    return failure


# -- the exit: threads a stuck call left behind do not hold it

# After the program ends, how long the watch waits at least before ending the process.
EXIT_GRACE_S = 1.0
_exit_deadline = 0.0  # time.monotonic() after which the watch ends a process still there
_exit_lock = threading.Lock()
_watching = False
_abandoned: list[threading.Thread] = []  # the threads of calls left running on a silent store


def abandoned(timeout_s: float, thread: threading.Thread | None = None) -> None:
    """Notes that a storage call was left running (in ``thread``): the exit waits ``timeout_s``.

    At the exit, the process is ended only while such a call is still running:
    once they all returned, the store answers again and nothing is stuck.
    """
    global _exit_deadline, _watching
    with _exit_lock:
        _exit_deadline = max(_exit_deadline, time.monotonic() + timeout_s)
        if thread is not None:
            _abandoned.append(thread)
        if _watching:
            return
        _watching = True
    ended = threading.Event()
    # Python's exit first runs these callbacks (the latest registered first: before the
    # thread pools' joins), then joins the other threads; no public hook runs before both.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(ended.set)
    except RuntimeError:  # the exit has begun (a call made by an atexit function)
        register = None
    threading.Thread(
        target=_watch_exit, args=(ended if register else None,), name="jaxjob-exit-watch",
        daemon=True,
    ).start()  # fmt: skip


def _forget_in_child() -> None:
    """A forked child has no watch thread: its first abandoned call starts its own."""
    global _exit_deadline, _exit_lock, _watching
    _exit_deadline, _exit_lock, _watching = 0.0, threading.Lock(), False
    _silent.clear()
    _abandoned.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _watch_exit(program_ended: threading.Event | None) -> None:
    """Once the program has ended and the deadline passed, ends the process if it is still here."""
    if program_ended is not None:
        program_ended.wait()
    else:
        threading.main_thread().join()  # returns once Python's exit has joined the pools
    ended = time.monotonic()
    while (left := max(_exit_deadline, ended + EXIT_GRACE_S) - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
    if _abandoned and not any(t.is_alive() for t in _abandoned):
        return  # every abandoned call returned: the store answers, the exit is not held by it
    # Still here: Python's exit waits for a thread that a stuck call holds (a non-daemon one,
    # or any worker of a thread pool). Letting it run on as a daemon thread is not safe: the
    # interpreter's end kills daemon threads, which aborts one waiting in C++ (TensorStore).
    status = _exit_status()
    stuck = sorted(t.name for t in threading.enumerate() if t is not threading.current_thread())
    _log_stderr(
        f"jaxjob: ending the process (status {status}): an object store stopped answering and "
        f"threads still wait on it: {', '.join(stuck)}"
    )
    _flush_and_exit(status)


def _exit_status() -> int:
    """1 if the program ended on an uncaught exception, else 0.

    The status of a ``sys.exit(n)`` is not kept anywhere Python can read during its exit:
    such a program ends with 0 here.
    """
    uncaught = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return 1 if uncaught is not None else 0


def _log_stderr(message: str) -> None:
    """Writes ``message`` to stderr: logging may be shut down already at this point."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def _flush_and_exit(status: int) -> None:
    """Flushes the log handlers and standard streams, then ends the process with ``status``."""
    with contextlib.suppress(Exception):  # a handler whose stream is gone already
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(status)


def is_remote(path: str) -> bool:
    """Whether ``path`` is in an object store (``gs://`` or ``s3://``)."""
    return path.startswith(REMOTE_SCHEMES)
