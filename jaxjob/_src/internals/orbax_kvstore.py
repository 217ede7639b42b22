"""TensorStore's kvstore specs as Orbax builds them, wrapped: ``s3://``, no per-file fsync, memmap.

Orbax builds every TensorStore kvstore spec in one private module function,
``orbax.checkpoint._src.serialization.tensorstore_utils.build_kvstore_tspec``,
and has no option for what jaxjob needs of it; :func:`install` replaces that
module attribute with :func:`_kvstore_tspec` (Orbax looks it up on its module
at each call), which calls the original and changes the spec it returns:

* **Object stores.** Orbax 0.12 builds specs only for ``gs://`` and local
  paths: ``s3://`` is built as ``gs://`` is, then each ``gcs`` kvstore becomes
  TensorStore's ``s3`` driver (:func:`s3_kvstore`).
* **No fsync of each file under a durable commit.** Under a temporary
  directory that :class:`~jaxjob._src.internals.orbax_commit.DurableRename`
  flushes as a whole at its commit (:func:`skip_fsync_under`), TensorStore's
  ``file_io_sync`` is off.
* **Restore from a RAM disk through a memory map**: TensorStore's
  ``file_io_mode`` ``memmap`` on ``tmpfs`` and ``ramfs``.

Private Orbax names used here: ``tensorstore_utils`` (module) and its
``build_kvstore_tspec`` (replaced).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from orbax.checkpoint._src.serialization import tensorstore_utils

from jaxjob._src.base import mounts
from jaxjob._src.internals import orbax_version

__all__ = ["commit_root", "fsync_again_under", "install", "s3_kvstore", "skip_fsync_under"]

orbax_version.check()

_build_kvstore_tspec = tensorstore_utils.build_kvstore_tspec

# Temporary directories that a DurableRename is writing: every file under them is fsynced by
# its commit, so TensorStore need not fsync them as it writes. A save that fails before its
# commit leaves its entry (a string; only a DurableRename commits there).
_flushed_at_commit: set[str] = set()
_flushed_lock = threading.Lock()


def skip_fsync_under(directory: str) -> None:
    """TensorStore writes the files under ``directory`` without fsync: its commit flushes them.

    A save that fails before its commit leaves the entry (the directory is
    then removed as a failed save's leftovers).
    """
    with _flushed_lock:
        _flushed_at_commit.add(directory)


def fsync_again_under(directory: str) -> None:
    """Ends :func:`skip_fsync_under` (the commit of ``directory`` is done, or failed)."""
    with _flushed_lock:
        _flushed_at_commit.discard(directory)


def commit_root(directory: str) -> str | None:
    """The temporary directory that a DurableRename will flush holding ``directory``, if any."""
    with _flushed_lock:
        for root in _flushed_at_commit:
            if directory == root or directory.startswith(root + "/"):
                return root
    return None


def s3_kvstore(bucket: str, path: str) -> dict[str, Any]:
    """TensorStore's ``s3`` kvstore spec, with endpoint, region and credentials from ``AWS_*``.

    TensorStore does not read ``AWS_ENDPOINT_URL`` itself (S3-compatible
    stores, local test servers).
    """
    spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": path}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        spec["endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        spec["aws_region"] = region
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        spec["aws_credentials"] = {"type": "environment"}
    return spec


def _gcs_to_s3(spec: Any) -> Any:
    if isinstance(spec, dict):
        if spec.get("driver") in ("gcs", "gcs_grpc"):
            return s3_kvstore(spec["bucket"], spec.get("path", ""))
        return {k: _gcs_to_s3(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_gcs_to_s3(v) for v in spec]
    return spec


def _without_file_sync(spec: Any) -> Any:
    """``spec`` with ``file_io_sync`` off in each of its ``file`` kvstores."""
    if isinstance(spec, dict):
        spec = {k: _without_file_sync(v) for k, v in spec.items()}
        return spec | {"file_io_sync": False} if spec.get("driver") == "file" else spec
    if isinstance(spec, list):
        return [_without_file_sync(v) for v in spec]
    return spec


def _memory_mapped(spec: Any) -> Any:
    """``spec`` with each of its ``file`` kvstores reading through ``mmap``."""
    if isinstance(spec, dict):
        spec = {k: _memory_mapped(v) for k, v in spec.items()}
        return spec | {"file_io_mode": {"mode": "memmap"}} if spec.get("driver") == "file" else spec
    if isinstance(spec, list):
        return [_memory_mapped(v) for v in spec]
    return spec


def _kvstore_tspec(directory: Any, name: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """Orbax's TensorStore kvstore spec; ``s3://`` built as Orbax builds ``gs://``, on ``s3``.

    Orbax's own code lays out the spec (OCDBT, per-process directories,
    remote-storage tuning); each ``gcs`` kvstore in it is then replaced.
    Every Orbax caller looks ``build_kvstore_tspec`` up on its module at call
    time, so replacing that one attribute covers them all.

    Under a temporary directory that a DurableRename is writing, the
    local files are written without TensorStore's fsync of each file (and of
    its directory, and of each OCDBT manifest update, one after the other):
    ``DurableRename.finalize`` flushes every file of the tree before the
    commit.

    On a RAM disk (``tmpfs``, ``ramfs``: a local tier on ``/dev/shm``) the
    files are read through a memory map (TensorStore's ``file_io_mode``
    ``memmap``, used for reads of 256 KiB or more): each array is copied once,
    from the mapped pages into its restore buffer. TensorStore's default
    ``pread`` first copies it into a buffer of its own, fresh memory faulted
    in 4 KiB pages (262144 page faults a GiB against ~20000 mapped): that
    doubled the copy and made a restore from ``/dev/shm`` take 1.5-5x a raw
    read of the same bytes, varying with what a page fault cost on the busy
    machine (benchmarks/README.md, "Two tiers"). Disks keep ``pread``: there,
    a read error through a map is a ``SIGBUS`` that kills the process instead
    of an exception naming the damaged leaf. Committed files are never
    rewritten or truncated in place, and a file that retention deletes stays
    readable through its map.

    Other paths (Orbax used directly, without jaxjob) are untouched.
    """
    text = str(directory)
    if text.startswith("s3://"):
        return _gcs_to_s3(_build_kvstore_tspec("gs://" + text[len("s3://") :], name, **kwargs))
    spec = _build_kvstore_tspec(directory, name, **kwargs)
    if "://" in text:
        return spec
    if commit_root(os.path.normpath(text)) is not None:
        spec = _without_file_sync(spec)
    if _ram_backed(text):
        spec = _memory_mapped(spec)
    return spec


@functools.lru_cache(maxsize=256)
def _ram_backed(directory: str) -> bool:
    """:func:`~jaxjob._src.base.mounts.ram_backed`, once per directory.

    Orbax builds a spec per leaf (twice in a save), all under a checkpoint's
    few item directories; each answer resolves the path and reads the mount
    table (~0.1 ms with 20 mounts, more in a container with hundreds).
    """
    return mounts.ram_backed(directory)


def install() -> None:
    """Replaces ``tensorstore_utils.build_kvstore_tspec`` by :func:`_kvstore_tspec` (idempotent)."""
    tensorstore_utils.build_kvstore_tspec = _kvstore_tspec
