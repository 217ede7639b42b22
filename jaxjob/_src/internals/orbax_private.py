"""Every use of Orbax's internals, each with why no public API serves (two helpers beside it).

jaxjob uses Orbax's public API (``ocp.Checkpointer``, ``ocp.args``, the
handlers and options) everywhere it can. What it needs beyond that lives
here and in the two modules named below, so an Orbax upgrade is checked in
one folder:

* **Version check.** jaxjob is tested with the Orbax versions in
  :data:`TESTED_ORBAX`; importing it with another one raises an ``ImportError``
  saying which, instead of failing at the first save.
* **Durable commit on local disk** (:class:`DurableRename`). Orbax's atomic
  rename does not fsync the small metadata files nor the parent directory
  after the rename, so a power loss right after a reported commit could lose
  or tear the newest checkpoint. Orbax exposes only the ``TemporaryPath``
  class to change how a save is committed, and its implementation lives in
  ``orbax.checkpoint._src``. Since that commit flushes every file, TensorStore's
  own fsync of each file it writes there is turned off through the kvstore
  spec (below), for those directories only.
* **Object stores.** ``gs://`` works through Orbax unchanged, with the commit
  file (``commit_success.txt``) instead of a rename. ``s3://`` needs the same
  commit file plus TensorStore's ``s3`` driver: Orbax 0.12 builds TensorStore
  specs only for ``gs://`` and local paths (``tensorstore_utils.build_kvstore_tspec``),
  so :func:`_kvstore_tspec` wraps it.
* **Private checkpoints** (one process writes a node's checkpoint alone).
  Orbax's NumPy handler writes only on the primary host, with no option to
  write on the calling process; :class:`_ThisProcessNumpyHandler` overrides it.
* **Checksum files** (:class:`ManifestHandler`). Each process writes its
  checksums beside the manifest, so they commit with the checkpoint: the
  process that commits a local directory from its :class:`DurableRename`,
  hashing while the commit flushes the data; every other one inside Orbax's
  write, once its background thread has computed them. The JSON handler
  writes on the primary host only and has no hook for that; its private
  ``_save_fn`` is overridden.
* **Restore from a RAM disk through a memory map** (:func:`_kvstore_tspec`):
  TensorStore's ``file_io_mode`` is set in the kvstore spec that Orbax builds,
  which has no option for it.
* **Restore without a second copy on CPU**
  (:func:`jaxjob._src.internals.restore_buffers.read_shard`, replacing Orbax's
  private ``serialization._read_shard``): restored shards are read into 64-byte
  aligned buffers, which XLA's CPU client uses in place.
* **Step metadata and saved shardings**
  (:mod:`jaxjob._src.internals.orbax_files`): Orbax writes them in files it has
  no public reader for; :func:`step_metadata_file` says where the first lies.

Replacing Orbax's functions (the two above: ``build_kvstore_tspec`` and
``_read_shard``) is not done at import: :func:`install` does it, once, and
:func:`checkpointer`, which makes every Orbax checkpointer jaxjob uses (the
managers, ``restore``, ``verify``), calls it. Importing this module only checks
the Orbax version and registers the manifest item's save and restore
arguments. JAX's internals (the ``jax.distributed`` client) are in
:mod:`jaxjob._src.internals.jax_private`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib.metadata
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint._src import asyncio_utils
from orbax.checkpoint._src.metadata import checkpoint as checkpoint_metadata
from orbax.checkpoint._src.path import async_path, atomicity, atomicity_types
from orbax.checkpoint._src.serialization import serialization, tensorstore_utils

from jaxjob._src.base import faults, file_table, fs, mounts
from jaxjob._src.base.log import get_logger
from jaxjob._src.internals import commit_barrier
from jaxjob._src.internals.restore_buffers import read_shard

logger = get_logger(__name__)

__all__ = [
    "drain_failed_save",
    "FILE_TABLE",
    "TESTED_ORBAX",
    "DurableRename",
    "ManifestHandler",
    "ManifestRestore",
    "ManifestSave",
    "TabledCommitFile",
    "checkpointer",
    "directories_created_asynchronously",
    "directory_options",
    "install",
    "private_options",
    "private_registry",
    "step_metadata_file",
]

TESTED_ORBAX = ((0, 12, 3), (0, 13, 0))  # [lower, upper): keep in sync with pyproject.toml
COMMIT_FILE = atomicity.COMMIT_SUCCESS_FILE
FILE_TABLE = file_table.CHECKPOINT_TABLE  # written by the commit, just before its marker


def _check_version() -> None:
    installed = importlib.metadata.version("orbax-checkpoint")
    parts = tuple(int(p) for p in installed.split(".")[:3] if p.isdigit())
    low, high = TESTED_ORBAX
    if not low <= parts < high:
        raise ImportError(
            f"jaxjob needs orbax-checkpoint >={'.'.join(map(str, low))},<"
            f"{'.'.join(map(str, high))} (the versions it is tested with), but {installed} "
            "is installed; run: pip install 'orbax-checkpoint>=0.12.3,<0.13'"
        )


_check_version()


# ---- durable commit -------------------------------------------------------------------------


# Temporary directories that a DurableRename is writing: every file under them is fsynced by
# its finalize before the commit, so TensorStore need not fsync them as it writes. A save that
# fails before its finalize leaves its entry (a string; only a DurableRename commits there);
# its deferred checksums are dropped (forget_checksums, and when the directory is made again).
_flushed_at_commit: set[str] = set()
_flushed_lock = threading.Lock()


# Checksum files that a DurableRename writes at its commit, by temporary directory: (the
# folder, the PendingManifest). This process's leaves are hashed while the commit flushes
# the written files, when the CPU waits on the disk; hashed while Orbax wrote, the hash took
# CPU and memory bandwidth from the write (benchmarks/checksum_cost.py).
_checksums_at_commit: dict[str, list[tuple[str, Any]]] = {}


def _commit_root(directory: str) -> str | None:
    """The temporary directory that DurableRename will flush holding ``directory``, if any."""
    with _flushed_lock:
        for root in _flushed_at_commit:
            if directory == root or directory.startswith(root + "/"):
                return root
    return None


def _flushed_at_commit_under(directory: str) -> bool:
    """Whether ``directory`` lies in a temporary directory that DurableRename will flush."""
    return _commit_root(directory) is not None


def _defer_checksums(root: str, directory: str, doc: Any) -> None:
    """Leaves the checksum file of ``doc`` to the commit of ``root``.

    Entries of saves that failed before their commit (their directory is gone:
    removed as a failed save's leftovers) are dropped here too, with the host
    copies they hold, should :func:`forget_checksums` not have been called.
    """
    with _flushed_lock:
        for stale in [r for r in _checksums_at_commit if not os.path.isdir(r)]:
            del _checksums_at_commit[stale]
        _checksums_at_commit.setdefault(root, []).append((directory, doc))


def forget_checksums(path: str) -> None:
    """Drops the checksums deferred to the commit of a save of ``path`` that failed.

    They hold this process's host copies of what it wrote: released at the
    failure, not at the next save (which would hold two sets at once).
    """
    prefix = os.fspath(path) + atomicity_types.TMP_DIR_SUFFIX
    with _flushed_lock:
        for root in [r for r in _checksums_at_commit if r.startswith(prefix)]:
            del _checksums_at_commit[root]


def _write_checksums(root: str, directory: str, doc: Any) -> None:
    """Waits for this process's checksums and writes their file (flushed).

    ``directory`` is where the item was written: under ``root``, in Orbax's
    temporary folder of the item, which has its final name by the commit.
    """
    parts = os.path.relpath(directory, root).split(os.sep)
    folder = os.path.join(root, *(p.split(atomicity_types.TMP_DIR_SUFFIX)[0] for p in parts))
    name, text = doc.checksum_file()
    fs.write_new(os.path.join(folder, name), text)


class DurableRename(atomicity.AtomicRenameTemporaryPath):
    """Orbax's atomic rename, with every file and the rename itself fsynced.

    The files under the temporary directory are flushed before the rename,
    and the parent directory after it, so a checkpoint that is visible under
    its final name is on stable storage. They are flushed concurrently, all
    at once (:func:`jaxjob._src.base.fs.fsync_tree`); so TensorStore, whose writes to
    that directory are flushed then, does not fsync each file as it writes
    it (:func:`_kvstore_tspec`).
    """

    async def create(self) -> epath.Path:
        """Creates the temporary directory; TensorStore's writes under it skip their fsyncs."""
        install()  # the kvstore spec that skips them
        with _flushed_lock:
            _flushed_at_commit.add(os.fspath(self._tmp_path))
            _checksums_at_commit.pop(os.fspath(self._tmp_path), None)  # a failed save's, if any
        return await super().create()

    async def finalize(self) -> None:
        """Writes the checksum and commit files, flushes everything, renames, flushes the parent."""
        try:
            await self._commit()
        finally:
            with _flushed_lock:
                _flushed_at_commit.discard(os.fspath(self._tmp_path))
                _checksums_at_commit.pop(os.fspath(self._tmp_path), None)

    async def _commit(self) -> None:
        await _update_commit_time(self._checkpoint_metadata_store, self._tmp_path)
        tmp, final = os.fspath(self._tmp_path), os.fspath(self._final_path)
        marker = f"Checkpoint commit was successful to {self._final_path}"
        with _flushed_lock:
            deferred = _checksums_at_commit.pop(tmp, [])
        for _, doc in deferred:
            doc.checksums.start()  # hashed while the written files are flushed
        await asyncio.gather(
            asyncio.to_thread(fs.fsync_tree, tmp),
            *(asyncio.to_thread(_write_checksums, tmp, item, doc) for item, doc in deferred),
        )
        await asyncio.to_thread(_write_table, tmp, marker)
        await asyncio.to_thread(fs.write_new, os.path.join(tmp, COMMIT_FILE), marker)
        await asyncio.to_thread(fs.fsync_dir, tmp)
        await asyncio.to_thread(fs.fsync_dir, os.path.dirname(os.path.join(tmp, FILE_TABLE)))
        await async_path.rename(self._tmp_path, self._final_path)
        try:
            faults.point("save.after_rename")
            await asyncio.to_thread(fs.fsync_dir, os.fspath(self._final_path.parent))
        except BaseException:
            await asyncio.to_thread(_uncommit, final, tmp)
            raise


class TabledCommitFile(atomicity.CommitFileTemporaryPath):
    """Orbax's commit file on object stores, with the file table written just before it."""

    async def finalize(self) -> None:
        """Writes the file table, then the commit marker."""
        await _update_commit_time(self._checkpoint_metadata_store, self._tmp_path)
        final = os.fspath(self._final_path)
        marker = f"Checkpoint commit was successful to {self._final_path}"
        await asyncio.to_thread(_write_table, final, marker)
        await asyncio.to_thread(fs.write_new, fs.join(final, COMMIT_FILE), marker)  # bounded


async def _update_commit_time(store: Any, tmp_path: Any) -> None:
    """Orbax's finalize step: the commit time into the step metadata (as Orbax's own commit)."""
    if not store:
        return
    await asyncio.to_thread(store.wait_until_finished)
    await asyncio.to_thread(
        store.update,
        file_path=checkpoint_metadata.step_metadata_file_path(tmp_path),
        commit_timestamp_nsecs=time.time_ns(),
    )
    await asyncio.to_thread(store.wait_until_finished)


def _write_table(directory: str, marker: str) -> None:
    """The file table of a checkpoint about to commit, its marker's text included (flushed)."""
    doc = file_table.table(directory)
    file_table.write(directory, FILE_TABLE, doc, {COMMIT_FILE: marker})


def _uncommit(final: str, tmp: str) -> None:
    """Takes back a rename whose flush failed: the epoch must not stay committed.

    The directory goes back to its temporary name (swept as a leftover); if
    even that fails, its commit marker is removed.
    """
    try:
        os.rename(final, tmp)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(final, COMMIT_FILE))


def commit_file_options(path: str) -> ocp.options.AtomicityOptions | None:
    """Orbax's commit-file atomicity for object stores (``path`` remote), else None.

    Object stores cannot rename a directory: a checkpoint is written in place
    and committed by its ``commit_success.txt``. The checkpointer and the
    composite handler both need it, on save and on restore (which then
    refuses a checkpoint without the marker).
    """
    if not fs.is_remote(path):
        return None
    return ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)


def _commit_options(path: str) -> dict[str, Any]:
    """How a checkpoint at ``path`` is committed: durable rename, or a commit file."""
    if fs.is_remote(path):
        return {
            "atomicity_options": commit_file_options(path),
            "temporary_path_class": TabledCommitFile,
        }
    return {"temporary_path_class": DurableRename}


# ---- s3 -------------------------------------------------------------------------------------

_build_kvstore_tspec = tensorstore_utils.build_kvstore_tspec


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

    Under a temporary directory that :class:`DurableRename` is writing, the
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
    if _flushed_at_commit_under(os.path.normpath(text)):
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


# ---- installing the replacements -------------------------------------------------------------

_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Puts jaxjob's replacements of three Orbax functions in place; later calls do nothing.

    ``tensorstore_utils.build_kvstore_tspec`` becomes :func:`_kvstore_tspec`
    (``s3://``; no per-file fsync under a :class:`DurableRename`) and
    ``serialization._read_shard`` becomes
    :func:`jaxjob._src.internals.restore_buffers.read_shard` (64-byte aligned
    restore buffers), and ``asyncio_utils._run_sync_via_new_loop`` becomes
    :func:`_run_to_the_end` (no read left in flight on a closed event loop).
    Orbax looks all three up on their modules at call time.
    :func:`checkpointer` calls it, so every checkpoint jaxjob opens has them
    (and :meth:`DurableRename.create`, whose fsync skipping needs the first).
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        tensorstore_utils.build_kvstore_tspec = _kvstore_tspec
        serialization._read_shard = read_shard
        if hasattr(asyncio_utils, "_run_sync_via_new_loop"):  # Orbax 0.12.5+ (asyncio.run before)
            asyncio_utils._run_sync_via_new_loop = _run_to_the_end
        _installed = True


def _run_to_the_end(coro: Any) -> Any:
    """Orbax's ``asyncio_utils._run_sync_via_new_loop``, closing its loop only once it is idle.

    Orbax runs each synchronous read or write in a fresh event loop and
    closes it as soon as the top coroutine returns. When one of the reads it
    gathers fails (a checkpoint that a live writer's retention deleted
    meanwhile), the others are still in flight: their TensorStore futures
    and worker threads later deliver their results to the closed loop, which
    printed ``RuntimeError: Event loop is closed`` tracebacks (and ``Exception
    ignored`` for the coroutines destroyed pending). Here the loop first runs
    every task left on it to its end (their exceptions retrieved), then closes.
    """
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            _finish_tasks(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _finish_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Runs ``loop`` until no task is left on it (a task may start others meanwhile)."""
    pending = asyncio.all_tasks(loop)
    while pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        pending = asyncio.all_tasks(loop)


# ---- checksum files ------------------------------------------------------------------------


class ManifestHandler(ocp.JsonCheckpointHandler):
    """Orbax's JSON handler for the manifest; every process also writes its checksum file.

    A document with a ``checksum_file()`` method
    (a pending manifest, made by the save) gives this process's
    file: written by the commit of a :class:`DurableRename` that this process runs
    (hashed while the commit flushes the data), else here, waiting in Orbax's
    background thread for its checksums.
    """

    async def _save_fn(self, x: Any, directory: epath.Path) -> None:
        await super()._save_fn(dict(x), directory)
        if not hasattr(x, "checksum_file"):
            return
        root = _commit_root(os.fspath(directory))  # only local DurableRename directories
        if root is not None:  # this process commits it: the file is written at the commit
            _defer_checksums(root, os.fspath(directory), x)
            return
        name, text = await asyncio.to_thread(x.checksum_file)
        await async_path.write_text(directory / name, text)


# Orbax records each item handler's class path (``__module__`` + ``__qualname__``) in every
# checkpoint's ``_CHECKPOINT_METADATA``. Every checkpoint written before the move to
# ``jaxjob._src`` says ``jaxjob.orbax_adapter.ManifestHandler``: keeping that name keeps new
# checkpoints byte-identical to old ones, and ``jaxjob/orbax_adapter.py`` keeps it importable.
ManifestHandler.__module__ = "jaxjob.orbax_adapter"


@ocp.args.register_with_handler(ManifestHandler, for_save=True)
@dataclasses.dataclass
class ManifestSave(ocp.args.JsonSave):
    """Saves the manifest item through :class:`ManifestHandler`."""


# Never constructed by jaxjob (the manifest is read as a file), but not dead: Orbax's composite
# handler accepts ManifestSave for a ManifestHandler item only when the handler has both a save
# and a restore argument registered; without this one every save fails with "does not match with
# any registered handler".
@ocp.args.register_with_handler(ManifestHandler, for_restore=True)
@dataclasses.dataclass
class ManifestRestore(ocp.args.JsonRestore):
    """Restores the manifest item through :class:`ManifestHandler` (registered, never built)."""


# ---- private checkpoints --------------------------------------------------------------------


class _ThisProcessNumpyHandler(ocp.type_handlers.NumpyHandler):
    """Orbax's NumPy handler, writing on the calling process instead of the primary host only."""

    async def _background_serialize(
        self,
        values: Sequence[np.ndarray],
        infos: Sequence[Any],
        args: Sequence[Any] | None = None,
    ) -> None:
        writes = []
        for value, info, arg in zip(values, infos, args or [None] * len(values), strict=True):
            await info.await_path_creation()
            spec = tensorstore_utils.build_array_write_spec(
                info=info,
                arg=arg,
                global_shape=value.shape,
                local_shape=value.shape,
                dtype=value.dtype,
                use_ocdbt=False,
                process_index=None,
                metadata_key=self._metadata_key,
            )
            writes.append(self._open_and_write(value, spec.json, info.ts_context))
        await asyncio.gather(*writes)


def private_registry() -> Any:
    """The Orbax type-handler registry of private items: NumPy arrays and ``jax.Array`` s.

    A ``jax.Array`` (only in a local-tier copy: other private checkpoints
    store NumPy host copies) is written by this process alone, one copy of
    each shard it holds (``primary_host=None``, ``replica_id=None``: the
    replica of its first shard), the way Orbax's own local checkpoints are.
    """
    arrays = ocp.type_handlers.ArrayHandler(
        primary_host=None, replica_id=None, use_replica_parallel=False
    )
    return ocp.type_handlers.create_type_handler_registry(
        (np.ndarray, _ThisProcessNumpyHandler()), (jax.Array, arrays)
    )


def directories_created_asynchronously() -> bool:
    """Whether Orbax creates a save's directories in the background: in a 1-process job only.

    Orbax keys the signals of asynchronous directory creation in the job-wide
    key-value store by a per-process count of saves (of every checkpointer),
    which differs between processes as soon as one saves what another does not
    (a node of its own, a private save): a process then reads another save's
    signals, or none, and writes before the primary host has created the
    directories. In a multi-process job, checkpointers and their composite
    handlers create them before the save returns, behind Orbax's barrier.
    """
    return jax.process_count() == 1


def directory_options() -> ocp.AsyncOptions:
    """A composite handler's ``async_options``: see :func:`directories_created_asynchronously`."""
    return ocp.AsyncOptions(create_directories_asynchronously=directories_created_asynchronously())


def private_options() -> ocp.options.MultiprocessingOptions:
    """Orbax options making this process the only one that takes part."""
    me = jax.process_index()
    return ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me}, barrier_sync_key_prefix=f"jaxjob_private_{me}"
    )


# ---- checkpointers --------------------------------------------------------------------------


def checkpointer(
    path: str,
    handler: ocp.CompositeCheckpointHandler,
    *,
    private: bool,
    async_timeout_s: float | None = None,
) -> ocp.Checkpointer:
    """An Orbax checkpointer for checkpoints under ``path`` (a db_prefix or a checkpoint).

    Args:
        path: Where the checkpoints are (chooses how a save is committed).
        handler: The composite handler of a checkpoint directory.
        private: This process alone takes part (in a multi-process job).
        async_timeout_s: Make an ``AsyncCheckpointer`` whose background
            write may take this long; None: a synchronous one. A shared one of
            a multi-process job waits at jaxjob's barriers
            (:mod:`~jaxjob._src.internals.commit_barrier`), which end as soon as
            a process's write fails.
    """
    install()
    kwargs = _commit_options(path)
    alone = private and jax.process_count() > 1
    if alone:
        kwargs["multiprocessing_options"] = private_options()
    if async_timeout_s is None:
        return ocp.Checkpointer(handler, **kwargs)
    shared = not private and jax.process_count() > 1  # its barriers end on a failed write
    options = ocp.AsyncOptions(
        timeout_secs=max(1, round(async_timeout_s)),
        create_directories_asynchronously=directories_created_asynchronously(),
        barrier_sync_fn=commit_barrier.wait if shared else None,
    )
    return ocp.AsyncCheckpointer(handler, async_options=options, **kwargs)


def step_metadata_file(path: str) -> str:
    """The path of Orbax's step metadata file of the checkpoint at ``path`` (Orbax's private)."""
    return os.fspath(checkpoint_metadata.step_metadata_file_path(epath.Path(path)))


def drain_failed_save(saver: ocp.AsyncCheckpointer) -> None:
    """Waits for what Orbax runs in the background for a save that failed as it started.

    Orbax creates a save's directory and writes its metadata in a thread of its own
    (``create_directories_asynchronously``); when the save then fails as it starts, that
    thread is not part of any commit, and its write may fail on the directory jaxjob removes.
    Orbax keeps that error and raises it at the next save, as the next epoch's failure. So the
    failed save and the next one each wait first (a thread still running then is not waited
    for: Orbax gives no handle to it). The error belongs to the failed save, whose failure is
    recorded already: it is logged at DEBUG.
    """
    try:
        saver.wait_until_finished()
    except Exception as err:  # the failed save's own background work: already reported
        logger.debug("the background work of a failed save failed too: %s", err)
