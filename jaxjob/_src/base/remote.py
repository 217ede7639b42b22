"""Object stores (``gs://``, ``s3://``): their client packages, and a time bound on every operation.

Every remote operation of :mod:`jaxjob._src.base.fs` runs through
:func:`bounded`: it fails with :class:`StorageTimeoutError` (a
``TimeoutError``) naming the endpoint when it takes longer than
:func:`storage_timeout_s` (a manager's ``storage_timeout_s=``, else the
environment variable ``JAXJOB_STORAGE_TIMEOUT_S``, default 120 s), so an
endpoint that accepts connections and never answers fails a save instead of
hanging it. A missing client package (``gcsfs``, ``s3fs``) raises
:class:`MissingExtraError` naming the extra to install.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from jaxjob._src.base.checks import is_number

__all__ = [
    "DEFAULT_STORAGE_TIMEOUT_S",
    "MIN_TRANSFER_BYTES_S",
    "REMOTE_SCHEMES",
    "STORAGE_TIMEOUT_ENV",
    "MissingExtraError",
    "StorageTimeoutError",
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


class StorageTimeoutError(TimeoutError):
    """An object-store endpoint did not answer within :func:`storage_timeout_s`."""


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
    it is left behind, and cannot keep the interpreter from exiting).

    Raises:
        StorageTimeoutError: Naming the operation, the path and the endpoint.
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

    threading.Thread(target=run, name=f"jaxjob-storage-{what}", daemon=True).start()
    if not done.wait(timeout_s):
        raise StorageTimeoutError(
            f"the object store at {endpoint(path)} did not answer {what} of {path!r} within "
            f"{timeout_s:g} s; check the endpoint and the network, or set "
            f"storage_timeout_s= (or {STORAGE_TIMEOUT_ENV}) to wait longer"
        )
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def is_remote(path: str) -> bool:
    """Whether ``path`` is in an object store (``gs://`` or ``s3://``)."""
    return path.startswith(REMOTE_SCHEMES)
