"""Flushing local files to stable storage: each file, or the whole file system in one call.

A durable commit flushes every file and directory entry of a checkpoint
before it is renamed into place. :func:`flush_tree` does it in one
``syncfs(2)`` where that call both flushes everything and reports a failed
write-back: Linux 5.8 or later (earlier kernels' ``syncfs`` returns 0 even
when a write-back failed), on a local block file system of
:data:`SYNCFS_FILESYSTEMS`. A tiny checkpoint's ~25 files and directories are
then one call instead of ~25 ``fsync`` (``benchmarks/README.md``).
Elsewhere (network and FUSE file systems, whose ``syncfs`` need not reach
the server; overlay file systems; other kernels) it falls back to
:func:`fsync_tree`, an ``fsync`` of each file and directory, concurrently.

``syncfs`` also flushes what other programs wrote to the same file system;
on a disk that they keep busy with writes, the commit waits for theirs too.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import os
import re
import threading

from jaxjob._src.base import mounts

__all__ = [
    "SYNCFS_FILESYSTEMS",
    "flush_pool",
    "flush_tree",
    "fsync",
    "fsync_dir",
    "fsync_tree",
    "syncfs_usable",
]

# Local block file systems whose syncfs flushes every dirty file and directory of the file
# system, and commits their journal, before it returns.
SYNCFS_FILESYSTEMS = frozenset({"ext4", "xfs", "btrfs", "f2fs"})
_SYNCFS_KERNEL = (5, 8)  # syncfs reports write-back errors from Linux 5.8 on


def fsync(path: str, flags: int = os.O_RDONLY) -> None:
    """Flushes the local file (or, with ``os.O_DIRECTORY``, directory) ``path``."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Flushes the entries of the local directory ``path``."""
    fsync(path, os.O_RDONLY | os.O_DIRECTORY)


# fsync waits on the disk, not the CPU: flushing a checkpoint's files concurrently lets the
# file system commit them together (a tiny checkpoint's ~25 files and directories on a busy
# disk: ~80 ms one by one, ~25 ms at once; on an idle one ~10 ms either way).
_FLUSH_THREADS = 16
_flusher: concurrent.futures.ThreadPoolExecutor | None = None
_flusher_lock = threading.Lock()


def flush_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process's pool of threads that wait on the disk (made on first use)."""
    global _flusher
    with _flusher_lock:
        if _flusher is None:
            _flusher = concurrent.futures.ThreadPoolExecutor(
                _FLUSH_THREADS, thread_name_prefix="jaxjob-fsync"
            )
        return _flusher


def fsync_tree(path: str) -> int:
    """Flushes every file and directory under the local directory ``path``, concurrently.

    Returns once all are flushed; the first failure is raised after every
    flush has ended.

    Returns:
        How many files and directories were flushed.

    Raises:
        OSError: If a flush failed, or ``path`` is not a directory.
    """
    flushes = []
    pool = flush_pool()
    for root, _, files in os.walk(path, onerror=_raise):
        flushes += [pool.submit(fsync, os.path.join(root, name)) for name in files]
        flushes.append(pool.submit(fsync, root, os.O_RDONLY | os.O_DIRECTORY))
    concurrent.futures.wait(flushes)
    for flush in flushes:
        flush.result()
    return len(flushes)


def _raise(err: OSError) -> None:
    raise err


def flush_tree(path: str) -> int:
    """Flushes every file and directory under the local directory ``path``: one call if it can.

    One ``syncfs`` of ``path`` 's file system where :func:`syncfs_usable`,
    else :func:`fsync_tree`.

    Returns:
        How many flush calls it made (1 for a ``syncfs``).

    Raises:
        OSError: If a write-back failed (a full disk, an I/O error).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     open(os.path.join(d, "a"), "w").close()
        ...     flush_tree(d) >= 1
        True
    """
    if not syncfs_usable(path):
        return fsync_tree(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc().syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs failed: {os.strerror(err)}", path)
    finally:
        os.close(fd)
    return 1


def syncfs_usable(path: str) -> bool:
    """Whether one ``syncfs`` flushes everything under the local ``path`` and reports failures.

    Linux 5.8 or later, and ``path`` on a file system of :data:`SYNCFS_FILESYSTEMS`.

    Example:
        >>> syncfs_usable("/proc/self")  # procfs: not a block file system
        False
    """
    if not _kernel_reports_syncfs_errors() or _libc() is None:
        return False
    return mounts.filesystem_type(os.path.realpath(path)) in SYNCFS_FILESYSTEMS


@functools.cache
def _kernel_reports_syncfs_errors() -> bool:
    uname = os.uname()
    found = re.match(r"(\d+)\.(\d+)", uname.release)
    if uname.sysname != "Linux" or found is None:
        return False
    return (int(found.group(1)), int(found.group(2))) >= _SYNCFS_KERNEL


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, if it has ``syncfs``."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "syncfs") else None
