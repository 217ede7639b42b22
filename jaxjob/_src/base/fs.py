"""Every path operation of jaxjob: local disk, ``gs://`` and ``s3://``, through ``etils.epath``.

Paths are plain strings in jaxjob's API. :func:`normalize` turns what a user
passes into the canonical string (local paths absolute, ``~`` expanded,
object-store prefixes without a trailing ``/``) and refuses schemes jaxjob
cannot write to, so a ``db_prefix`` never silently becomes a local directory
named ``gs:``. Object stores have no directories, appends or atomic renames:
callers use one object per record and Orbax's commit file instead.

Object stores answer within a bound: every remote operation here runs
through :func:`jaxjob._src.base.remote.bounded` and fails with a
``StorageTimeoutError`` naming the endpoint when it outlasts it; that module
(re-exported here) also names the extra to install for a missing client.

Durability on local disk: :func:`fsync_tree` and :func:`fsync_dir` flush
files and directory entries to stable storage; object stores make an object
durable when its upload returns.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from etils import epath

from jaxjob._src.base import flush
from jaxjob._src.base.flush import flush_pool as flush_pool
from jaxjob._src.base.remote import DEFAULT_STORAGE_TIMEOUT_S as DEFAULT_STORAGE_TIMEOUT_S
from jaxjob._src.base.remote import MIN_TRANSFER_BYTES_S as MIN_TRANSFER_BYTES_S
from jaxjob._src.base.remote import REMOTE_SCHEMES as REMOTE_SCHEMES
from jaxjob._src.base.remote import STORAGE_TIMEOUT_ENV as STORAGE_TIMEOUT_ENV
from jaxjob._src.base.remote import MissingExtraError as MissingExtraError
from jaxjob._src.base.remote import StorageError as StorageError
from jaxjob._src.base.remote import StorageTimeoutError as StorageTimeoutError
from jaxjob._src.base.remote import answering as answering
from jaxjob._src.base.remote import as_storage_error as as_storage_error
from jaxjob._src.base.remote import bounded as bounded
from jaxjob._src.base.remote import endpoint as endpoint
from jaxjob._src.base.remote import is_remote as is_remote
from jaxjob._src.base.remote import require_backend as require_backend
from jaxjob._src.base.remote import set_storage_timeout as set_storage_timeout
from jaxjob._src.base.remote import storage_timeout_s as storage_timeout_s
from jaxjob._src.base.remote import transfer_bound_s as transfer_bound_s

__all__ = [
    "REMOTE_SCHEMES",
    "STORAGE_TIMEOUT_ENV",
    "MissingExtraError",
    "StorageError",
    "StorageTimeoutError",
    "answering",
    "append_text",
    "as_storage_error",
    "bounded",
    "create_only",
    "endpoint",
    "exists",
    "flush_tree",
    "fsync_dir",
    "fsync_tree",
    "is_dir",
    "is_remote",
    "flush_pool",
    "join",
    "list_files",
    "listdir",
    "makedirs",
    "normalize",
    "read_bytes",
    "read_text",
    "remove",
    "require_backend",
    "rename",
    "rmtree",
    "set_storage_timeout",
    "size",
    "storage_timeout_s",
    "transfer_bound_s",
    "writable",
    "write_new",
    "write_text",
]


def normalize(path: Any, argument: str = "path") -> str:
    """The canonical string of a local, ``gs://`` or ``s3://`` path.

    Args:
        path: A ``str`` or ``os.PathLike``.
        argument: The argument's name, for errors.

    Raises:
        TypeError: If ``path`` is not a non-empty path.
        ValueError: If it names a scheme other than ``gs://`` and ``s3://``.

    Example:
        >>> normalize("gs://bucket/run/")
        'gs://bucket/run'
        >>> normalize("~/runs").startswith("/")
        True
    """
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise TypeError(f"{argument} must be a non-empty path (str or os.PathLike), got {path!r}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"{argument} must be a text path, got {path!r}")
    _refuse_malformed_url(text, argument)
    if "://" in text:
        scheme = text.split("://", 1)[0] + "://"
        if scheme not in REMOTE_SCHEMES:
            raise ValueError(
                f"{argument} {text!r} uses the scheme {scheme!r}; jaxjob supports local paths, "
                "gs:// (pip install 'jaxjob[gcs]') and s3:// (pip install 'jaxjob[s3]')"
            )
        return text.rstrip("/")
    return os.path.abspath(os.path.expanduser(text))


# Schemes a path may be meant to have: written without "//", or with a capital, it is refused
# rather than taken as a local directory named "s3:bucket".
_URL_LIKE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<rest>.*)", re.DOTALL)
_KNOWN_SCHEMES = {"gs", "gcs", "s3", "s3a", "s3n", "file", "http", "https", "ftp", "hdfs", "az"}


def _refuse_malformed_url(text: str, argument: str) -> None:
    """Raises if ``text`` reads as a URL of a known scheme, malformed or with an empty bucket."""
    match = _URL_LIKE.fullmatch(text)
    if match is None or match.group("scheme").lower() not in _KNOWN_SCHEMES:
        return
    scheme, rest = match.group("scheme"), match.group("rest")
    expected = "gs://bucket/path or s3://bucket/path, or a local path"
    if not rest.startswith("//") or scheme != scheme.lower():
        raise ValueError(
            f"{argument} {text!r} is not a well-formed URL (expected {expected}); "
            f"did you mean {scheme.lower()}://{rest.lstrip('/')}?"
        )
    if f"{scheme}://" in REMOTE_SCHEMES and not rest[2:].split("/", 1)[0]:
        raise ValueError(f"{argument} {text!r} names no bucket (expected {expected})")


def join(path: str, *names: str) -> str:
    """``path`` joined with ``names`` by ``/``."""
    return "/".join([path.rstrip("/"), *names])


def _p(path: str) -> epath.Path:
    return epath.Path(path)


def exists(path: str) -> bool:
    """Whether a file, object or directory (prefix) exists at ``path``."""
    return bounded(path, "exists", _p(path).exists)


def is_dir(path: str) -> bool:
    """Whether ``path`` is a directory (on object stores: a non-empty prefix)."""
    return bounded(path, "is_dir", _p(path).is_dir)


def listdir(path: str) -> list[str]:
    """Names directly under ``path``; empty if it does not exist or is not a directory."""
    try:
        return bounded(path, "a listing", lambda: sorted(p.name for p in _p(path).iterdir()))
    except (FileNotFoundError, NotADirectoryError):
        return []


def size(path: str) -> int:
    """Bytes of the files under the directory (or prefix) ``path``."""
    return bounded(path, "a listing", lambda: _size(_p(path)))


def _size(path: epath.Path) -> int:
    return sum(_size(c) if c.is_dir() else c.stat().length for c in path.iterdir())


def makedirs(path: str) -> None:
    """Creates the directory ``path`` and its parents (nothing to do on object stores)."""
    if not is_remote(path):
        _p(path).mkdir(parents=True, exist_ok=True)


def rmtree(path: str) -> None:
    """Removes the directory (or prefix) ``path`` and everything under it."""
    bounded(path, "a removal", _p(path).rmtree)


def remove(path: str) -> None:
    """Removes the file or object at ``path``."""
    bounded(path, "a removal", _p(path).unlink)


def rename(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst`` (local disk only: object stores cannot rename atomically)."""
    if is_remote(src):
        raise OSError(f"cannot rename {src!r}: object stores have no atomic rename")
    os.rename(src, dst)


def links_leaving(path: str) -> list[str]:
    """Symbolic links under the local directory ``path`` that resolve outside it.

    Object stores have no links: always empty there.
    """
    if is_remote(path) or not os.path.isdir(path):
        return []
    root = os.path.realpath(path)
    found = []
    for directory, dirs, files in os.walk(path):
        for name in dirs + files:
            entry = os.path.join(directory, name)
            if os.path.islink(entry):
                target = os.path.realpath(entry)
                if os.path.commonpath([root, target]) != root:
                    found.append(entry)
    return sorted(found)


def read_text(path: str) -> str:
    """The text of the file or object at ``path``."""
    return bounded(path, "a read", _p(path).read_text)


def read_bytes(path: str) -> bytes:
    """The bytes of the file or object at ``path``."""
    return bounded(path, "a read", _p(path).read_bytes)


def list_files(path: str) -> dict[str, int]:
    """Every file (object) under the directory (prefix) ``path``: relative path -> bytes.

    On object stores one recursive listing, never served from a cache.
    """
    if not is_remote(path):
        found = {}
        for root, _, names in os.walk(path):
            for name in names:
                full = os.path.join(root, name)
                found[os.path.relpath(full, path)] = os.stat(full).st_size
        return found

    def listing() -> dict[str, int]:
        store = epath.backend.fsspec_backend.fs(path)
        store.invalidate_cache()
        base = path.split("://", 1)[1].rstrip("/") + "/"
        try:
            found = store.find(path, detail=True)
        finally:  # find fills the listing cache, which later exists() calls would believe
            store.invalidate_cache()
        return {
            name.removeprefix(base): int(info["size"])
            for name, info in found.items()
            if info.get("type", "file") == "file" and name.startswith(base)
        }

    return bounded(path, "a listing", listing)


def write_text(path: str, text: str) -> None:
    """Replaces the file at ``path`` by ``text``, atomically and durably.

    On object stores one upload does both; on local disk a temporary file is
    fsynced, renamed over ``path``, and the directory fsynced.
    """
    if is_remote(path):
        bounded(path, "a write", lambda: _p(path).write_text(text))
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def write_new(path: str, text: str, *, flush_file: bool = True) -> None:
    """Writes ``text`` to the new file ``path`` and flushes it (not its directory).

    For files inside a directory that is not visible yet (a checkpoint's
    temporary directory), where no reader can see a torn file: no temporary
    name, no rename. On object stores, one upload. ``flush_file=False``: not
    flushed, for a caller that flushes the whole directory afterwards
    (:func:`flush_tree`).
    """
    if is_remote(path):
        bounded(path, "a write", lambda: _p(path).write_text(text))
        return
    with open(path, "x") as f:
        f.write(text)
        if flush_file:
            f.flush()
            os.fsync(f.fileno())


def create_only(path: str, text: str) -> bool:
    """Writes ``text`` to a new file or object at ``path``, unless one exists there.

    No reader ever sees it partly written: on local disk a temporary file
    is fsynced and hard-linked to ``path`` (which fails if ``path`` exists;
    where links are not supported, an exclusive create); on ``gs://`` a
    create-only upload, on ``s3://`` an exclusive open.

    Returns:
        Whether this call created it (False: it existed).
    """
    if is_remote(path):
        return bounded(path, "a write", lambda: _create_remote(path, text))
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:  # no hard links here (some FUSE and FAT file systems)
        return _create_exclusive(path, text)
    finally:
        os.remove(tmp)
    fsync_dir(os.path.dirname(path))
    return True


def _create_exclusive(path: str, text: str) -> bool:
    try:
        write_new(path, text)
    except FileExistsError:
        return False
    fsync_dir(os.path.dirname(path))
    return True


def _create_remote(path: str, text: str) -> bool:
    import fsspec

    filesystem, _, (key,) = fsspec.get_fs_token_paths(path)
    try:
        if path.startswith("gs://"):
            filesystem.pipe_file(key, text.encode(), mode="create")
        else:
            with filesystem.open(key, "xb") as f:
                f.write(text.encode())
    except FileExistsError:
        return False
    return True


def append_text(path: str, text: str, *, sync: bool = True) -> None:
    """Appends ``text`` to the file at ``path`` (created if missing), durably.

    On local disk the file is appended to and fsynced (its directory too
    when the file is new); a line that a crash tore stays on its own line,
    since ``text`` then starts on a new one. ``sync=False`` skips the fsyncs:
    the text survives the process (a kill), not necessarily the machine.
    Object stores cannot append: the object is read and uploaded again with
    ``text`` added (durable either way).
    """
    if is_remote(path):
        write_text(path, (read_text(path) if exists(path) else "") + text)
        return
    created = not os.path.exists(path)
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                text = "\n" + text
        f.write(text.encode())
        f.flush()
        if sync:
            os.fsync(f.fileno())
    if created and sync:
        fsync_dir(os.path.dirname(path))


def writable(path: str) -> bool:
    """Whether ``path`` is, or could be created as, a writable local directory.

    On object stores this is known only by writing: True.
    """
    if is_remote(path):
        return True
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return os.path.isdir(path) and os.access(path, os.W_OK)


def fsync_dir(path: str) -> None:
    """Flushes the entries of the local directory ``path`` (a no-op on object stores)."""
    if not is_remote(path):
        flush.fsync_dir(path)


def fsync_tree(path: str) -> int:
    """Flushes each file and directory under the local directory ``path`` (see ``base.flush``).

    Returns:
        How many files and directories were flushed (0 on object stores).
    """
    return 0 if is_remote(path) else flush.fsync_tree(path)


def flush_tree(path: str) -> int:
    """Flushes everything under the local directory ``path``, in one call where it can.

    See :func:`jaxjob._src.base.flush.flush_tree`.

    Returns:
        How many flush calls it made (0 on object stores).
    """
    return 0 if is_remote(path) else flush.flush_tree(path)
