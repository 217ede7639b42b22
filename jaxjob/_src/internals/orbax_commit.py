"""How a save is committed: a durable rename on local disk, a commit file on object stores.

Orbax exposes only the ``TemporaryPath`` class to change how a save is
committed, and its implementations live in ``orbax.checkpoint._src.path``:

* **Durable commit on local disk** (:class:`DurableRename`). Orbax's atomic
  rename does not fsync the small metadata files nor the parent directory
  after the rename, so a power loss right after a reported commit could lose
  or tear the newest checkpoint. This commit writes its own files unflushed,
  then flushes the whole temporary directory at once (one ``syncfs`` where
  it can: :func:`jaxjob._src.base.flush.flush_tree`), renames it and
  flushes the parent. Since it flushes every file, TensorStore's own fsync
  of each file it writes there is turned off
  (:func:`jaxjob._src.internals.orbax_kvstore.skip_fsync_under`).
* **Object stores** (:class:`TabledCommitFile`): Orbax's commit file
  (``commit_success.txt``) instead of a rename, with the file table written
  just before it.
* **Checksum files at the commit**: the process that commits a local
  directory writes its checksum files from its :class:`DurableRename`,
  hashing once Orbax has written the data (:func:`defer_checksums`).
* **Step metadata**: the commit time is written into Orbax's step metadata
  file (:func:`step_metadata_file` says where it lies).
* **Orbax releases**: commit-file mode is Orbax's ``AtomicityOptions`` from
  0.12.3 on (the checkpointer's ``atomicity_options`` and the composite
  handler's ``CompositeOptions.atomicity_options``); 0.12.1-0.12.2 have
  neither, and the composite handler is given the class that mode chooses
  (``CompositeOptions.temporary_path_class``, :func:`composite_commit_options`);
  on local disk their item directories get the commit marker that later
  releases write (:class:`MarkedRename`).

Private Orbax names used here: ``atomicity`` (``AtomicRenameTemporaryPath``,
``CommitFileTemporaryPath`` subclassed, their ``finalize`` re-implemented,
``create`` overridden, ``_tmp_path``, ``_final_path``,
``_checkpoint_metadata_store`` read; ``COMMIT_SUCCESS_FILE``),
``atomicity_types.TMP_DIR_SUFFIX``, ``async_path.rename`` and ``write_text``, and
``metadata.checkpoint`` (``step_metadata_file_path``, ``MetadataStore``'s
``update`` and ``wait_until_finished``, ``StepMetadata.commit_timestamp_nsecs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from typing import Any

import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint._src.metadata import checkpoint as checkpoint_metadata
from orbax.checkpoint._src.path import async_path, atomicity, atomicity_types

from jaxjob._src.base import faults, file_table, fs
from jaxjob._src.internals import orbax_kvstore, orbax_version

__all__ = [
    "COMMIT_FILE",
    "FILE_TABLE",
    "DurableRename",
    "MarkedRename",
    "TabledCommitFile",
    "commit_file_options",
    "commit_options",
    "composite_commit_options",
    "defer_checksums",
    "forget_checksums",
    "step_metadata_file",
]

orbax_version.check()

COMMIT_FILE = atomicity.COMMIT_SUCCESS_FILE
FILE_TABLE = file_table.CHECKPOINT_TABLE  # written by the commit, just before its marker

# Checksum files that a DurableRename writes at its commit, by temporary directory: (the
# folder, the PendingManifest). This process's leaves are hashed once Orbax has written
# them, while the kernel writes them back; hashed while Orbax wrote, the hash took CPU and
# memory bandwidth from the write (benchmarks/checksum_cost.py). A save that fails
# before its commit leaves its entry, dropped by forget_checksums (and when the directory is
# made again).
_checksums_at_commit: dict[str, list[tuple[str, Any]]] = {}
_checksums_lock = threading.Lock()


def defer_checksums(directory: str, doc: Any) -> bool:
    """Leaves ``doc`` 's checksum file to the commit flushing ``directory``; whether there is one.

    Only a local :class:`DurableRename` that this process runs commits
    there. Entries of saves that failed before their commit (their directory
    is gone: removed as a failed save's leftovers) are dropped here too, with
    the host copies they hold, should :func:`forget_checksums` not have been
    called.
    """
    root = orbax_kvstore.commit_root(directory)
    if root is None:
        return False
    with _checksums_lock:
        for stale in [r for r in _checksums_at_commit if not os.path.isdir(r)]:
            del _checksums_at_commit[stale]
        _checksums_at_commit.setdefault(root, []).append((directory, doc))
    return True


def forget_checksums(path: str) -> None:
    """Drops the checksums deferred to the commit of a save of ``path`` that failed.

    They hold this process's host copies of what it wrote: released at the
    failure, not at the next save (which would hold two sets at once).
    """
    prefix = os.fspath(path) + atomicity_types.TMP_DIR_SUFFIX
    with _checksums_lock:
        for root in [r for r in _checksums_at_commit if r.startswith(prefix)]:
            del _checksums_at_commit[root]


def _take_checksums(tmp: str) -> list[tuple[str, Any]]:
    with _checksums_lock:
        return _checksums_at_commit.pop(tmp, [])


def _write_checksums(root: str, directory: str, doc: Any) -> None:
    """Waits for this process's checksums and writes their file (flushed by the commit).

    ``directory`` is where the item was written: under ``root``, in Orbax's
    temporary folder of the item, which has its final name by the commit.
    """
    parts = os.path.relpath(directory, root).split(os.sep)
    folder = os.path.join(root, *(p.split(atomicity_types.TMP_DIR_SUFFIX)[0] for p in parts))
    name, text = doc.checksum_file()
    fs.write_new(os.path.join(folder, name), text, flush_file=False)


class DurableRename(atomicity.AtomicRenameTemporaryPath):
    """Orbax's atomic rename, with every file and the rename itself flushed.

    The files under the temporary directory are flushed before the rename,
    and the parent directory after it, so a checkpoint that is visible under
    its final name is on stable storage. They are flushed all at once, after
    the commit's own files are written (:func:`jaxjob._src.base.flush.flush_tree`:
    one ``syncfs``, or an ``fsync`` of each, concurrently); so TensorStore,
    whose writes to that directory are flushed then, does not fsync each file
    as it writes it (:mod:`jaxjob._src.internals.orbax_kvstore`).
    """

    async def create(self) -> epath.Path:
        """Creates the temporary directory; TensorStore's writes under it skip their fsyncs."""
        orbax_kvstore.install()  # the kvstore spec that skips them
        orbax_kvstore.skip_fsync_under(os.fspath(self._tmp_path))
        _take_checksums(os.fspath(self._tmp_path))  # a failed save's, if any
        return await super().create()

    async def finalize(self) -> None:
        """Writes the checksum and commit files, flushes everything, renames, flushes the parent."""
        try:
            await self._commit()
        finally:
            orbax_kvstore.fsync_again_under(os.fspath(self._tmp_path))
            _take_checksums(os.fspath(self._tmp_path))

    async def _commit(self) -> None:
        await _update_commit_time(self._checkpoint_metadata_store, self._tmp_path)
        tmp, final = os.fspath(self._tmp_path), os.fspath(self._final_path)
        marker = f"Checkpoint commit was successful to {self._final_path}"
        deferred = _take_checksums(tmp)
        for _, doc in deferred:
            doc.checksums.start()  # hashed while the kernel writes the written files back
        await asyncio.gather(
            *(asyncio.to_thread(_write_checksums, tmp, item, doc) for item, doc in deferred)
        )
        await asyncio.to_thread(_write_table, tmp, marker, flush_file=False)
        commit_file = os.path.join(tmp, COMMIT_FILE)
        await asyncio.to_thread(fs.write_new, commit_file, marker, flush_file=False)
        await asyncio.to_thread(fs.flush_tree, tmp)  # every file and directory entry under tmp
        await async_path.rename(self._tmp_path, self._final_path)
        try:
            faults.point("save.after_rename")
            await asyncio.to_thread(fs.fsync_dir, os.fspath(self._final_path.parent))
        except BaseException:
            await asyncio.to_thread(_uncommit, final, tmp)
            raise


class MarkedRename(atomicity.AtomicRenameTemporaryPath):
    """An item directory's rename in Orbax 0.12.1-0.12.2, with the commit marker of later releases.

    From 0.12.3 on, Orbax's atomic rename writes ``commit_success.txt`` into
    each item directory before renaming it; the releases before write none.
    This writes it as they do, so a checkpoint's files are the same whichever
    release wrote it (``checkpoint/FORMAT.md``).
    """

    async def finalize(self) -> None:
        """Writes the item's commit marker, then renames the directory (Orbax's)."""
        marker = f"Checkpoint commit was successful to {self._final_path}"
        await async_path.write_text(self._tmp_path / COMMIT_FILE, marker)
        await super().finalize()


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


def _write_table(directory: str, marker: str, *, flush_file: bool = True) -> None:
    """The file table of a checkpoint about to commit, its marker's text included.

    Flushed, unless ``flush_file=False`` (a local commit flushes its whole directory).
    """
    doc = file_table.table(directory)
    file_table.write(directory, FILE_TABLE, doc, {COMMIT_FILE: marker}, flush_file=flush_file)


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
    refuses a checkpoint without the marker). None also in Orbax 0.12.1-0.12.2,
    which have no ``ocp.options.AtomicityOptions``: there :func:`commit_options`
    and :func:`composite_commit_options` choose the commit-file classes
    directly, and jaxjob's own check of the marker refuses an uncommitted
    checkpoint on restore.
    """
    if not fs.is_remote(path) or not orbax_version.has_atomicity_options():
        return None
    return ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)


def commit_options(path: str) -> dict[str, Any]:
    """How a checkpoint at ``path`` is committed (a checkpointer's keyword arguments)."""
    if not fs.is_remote(path):
        return {"temporary_path_class": DurableRename}
    options = {"temporary_path_class": TabledCommitFile}
    atomicity_options = commit_file_options(path)
    if atomicity_options is not None:
        options["atomicity_options"] = atomicity_options
    return options


def composite_commit_options(path: str) -> dict[str, Any]:
    """How a composite handler's items under ``path`` are committed (``CompositeOptions`` fields).

    On an object store each item is written in place (Orbax's commit file):
    said with ``atomicity_options`` where Orbax has them (0.12.3 and later),
    else with the class ``CommitFileTemporaryPath`` that they choose. On local
    disk, Orbax's rename; before 0.12.3 :class:`MarkedRename`, which adds the
    item's commit marker.
    """
    if orbax_version.has_atomicity_options():
        atomicity_options = commit_file_options(path)
        return {} if atomicity_options is None else {"atomicity_options": atomicity_options}
    if fs.is_remote(path):  # Orbax 0.12.1-0.12.2: the class that mode chooses
        return {"temporary_path_class": atomicity.CommitFileTemporaryPath}
    return {"temporary_path_class": MarkedRename}  # Orbax's rename, with the marker it lacks


def step_metadata_file(path: str) -> str:
    """The path of Orbax's step metadata file of the checkpoint at ``path`` (Orbax's private)."""
    return os.fspath(checkpoint_metadata.step_metadata_file_path(epath.Path(path)))
