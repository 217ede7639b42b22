"""The checkpoint manager of one node: async Orbax saves into epoch-indexed directories."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxjob import storage
from jaxjob.layout import committed_epochs, db_name, is_committed
from jaxjob.metadata import DiskMetadataHandler, MetadataHandler
from jaxjob.workspace import Workspace

__all__ = ["CheckpointManager", "CheckpointSaveError"]

logger = logging.getLogger(__name__)
DB_TYPES = ("orbax",)


class CheckpointSaveError(RuntimeError):
    """A checkpoint save failed; ``epoch`` and ``db_name`` say which one."""

    def __init__(self, epoch: int, db: str, cause: BaseException) -> None:
        super().__init__(
            f"saving checkpoint epoch {epoch} to {db!r} failed: {type(cause).__name__}: {cause}"
        )
        self.epoch = epoch
        self.db_name = db


@dataclasses.dataclass
class _Pending:
    epoch: int
    db: str
    started: float
    write_metadata: bool = False
    superseded: str | None = None


def _check_db_type(db_type: str, argument: str) -> str:
    if db_type not in DB_TYPES:
        raise ValueError(f"{argument} must be one of {DB_TYPES}, got {db_type!r}")
    return db_type


def _prepare_prefix(db_prefix: str) -> None:
    """Creates ``db_prefix``, raising the OSError's own type with an actionable message."""
    try:
        os.makedirs(db_prefix, exist_ok=True)
    except OSError as err:
        raise type(err)(
            f"checkpoint db_prefix {db_prefix!r} is not a writable directory "
            f"({err.strerror or err}); pass a directory you can write to"
        ) from err


class CheckpointManager:
    """Saves and loads a node's persistent workspace on every epoch boundary.

    Each epoch goes to ``<db_prefix>/<node_name>.<epoch>/`` through Orbax. A save
    is asynchronous by default: :meth:`save` returns once the device-to-host
    copy is done and the write overlaps the next epoch. An epoch is visible
    (listed, resumable) only once Orbax has committed it. A failure of a
    background write is raised, as :class:`CheckpointSaveError`, by the next
    :meth:`save` (after that save has started) or by :meth:`wait_until_finished`.

    Args:
        db_prefix: Directory holding the checkpoints.
        node_name: The node whose checkpoints this manager writes.
        db_type: Storage type; only ``"orbax"``.
        metadata_handler: Decides the resume epoch and receives stats; by
            default a :class:`~jaxjob.metadata.DiskMetadataHandler` (auto-resume).
        async_save: False makes :meth:`save` return only once committed.

    Example:
        >>> import tempfile, jax.numpy as jnp
        >>> ckpt = CheckpointManager(tempfile.mkdtemp())
        >>> ckpt.save(0, Workspace({"w": jnp.ones(3)}))
        >>> ckpt.wait_until_finished()
        >>> ckpt.committed_epochs(), ckpt.load(0)["w"].tolist()
        ([0], [1.0, 1.0, 1.0])
    """

    def __init__(
        self,
        db_prefix: str,
        node_name: str = "local",
        db_type: str = "orbax",
        metadata_handler: MetadataHandler | None = None,
        *,
        async_save: bool = True,
    ) -> None:
        if not isinstance(db_prefix, str | os.PathLike) or not str(db_prefix):
            raise TypeError(f"db_prefix must be a non-empty path, got {db_prefix!r}")
        self._db_prefix = os.fspath(db_prefix)
        self._node_name = str(node_name)
        self._db_type = _check_db_type(db_type, "db_type")
        self._metadata_handler = metadata_handler or DiskMetadataHandler()
        self._async_save = async_save
        self._checkpointer: ocp.AsyncCheckpointer | None = None
        self._blob_names: list[str] | None = None
        self._path_prefix: str | None = None
        self._path_type: str | None = None
        self._pending: _Pending | None = None
        self._current_db_name: str | None = None
        self._current_stats: dict[str, Any] | None = None
        self.failures: list[CheckpointSaveError] = []

    def __repr__(self) -> str:
        return f"CheckpointManager({self._db_prefix!r}, node_name={self._node_name!r})"

    @property
    def node_managers(self) -> list[tuple[str, CheckpointManager]]:
        """``[(node_name, self)]``: the same shape as a multi-node manager's."""
        return [(self._node_name, self)]

    @property
    def metadata_handler(self) -> MetadataHandler:
        """The handler deciding resume epochs and receiving stats."""
        return self._metadata_handler

    def get_ckpt_db_name(self, node_name: str, epoch: int) -> str:
        """Checkpoint directory of ``node_name`` at ``epoch``."""
        return db_name(epoch, node_name, self._db_prefix)

    def committed_epochs(self) -> list[int]:
        """This node's committed epochs, ascending."""
        return committed_epochs(self._db_prefix, self._node_name)

    def init(
        self,
        nodes: Sequence[str] | None = None,
        retrieve_from_epoch: int | None = None,
        path_prefix: str | None = None,
        path_type: str | None = None,
        *,
        key_nodes: Mapping[str, str] | None = None,
    ) -> None:
        """Prepares to save or load; with ``retrieve_from_epoch`` the leaf names come from it.

        Raises:
            ValueError: If more than one node is given.
        """
        if nodes is not None and len(nodes) > 1:
            raise ValueError(
                f"CheckpointManager handles one node, got nodes={list(nodes)}; "
                "use MultiNodeCheckpointManager for several"
            )
        if retrieve_from_epoch is not None:
            path = self._existing(retrieve_from_epoch, path_prefix, path_type)
            self._blob_names = storage.read_manifest(path)["state_keys"]

    def blob_list(self) -> list[str]:
        """Names of the leaves this manager saves and loads.

        Raises:
            RuntimeError: Before ``init(retrieve_from_epoch=...)``, a save or a load.
        """
        if self._blob_names is None:
            raise RuntimeError("blob_list() is known only after init from an epoch, save or load")
        return list(self._blob_names)

    def check_db_exists(self, epoch: int) -> bool:
        """Whether this node's checkpoint of ``epoch`` is committed."""
        return is_committed(db_name(epoch, self._node_name, self._db_prefix))

    def _existing(self, epoch: int, path_prefix: str | None = None, path_type: str | None = None):
        if path_type is not None:
            _check_db_type(path_type, "path_type")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise TypeError(f"epoch must be a non-negative int, got {epoch!r}")
        prefix = path_prefix or self._path_prefix
        path = db_name(epoch, self._node_name, self._db_prefix, prefix)
        if not is_committed(path):
            committed = committed_epochs(self._db_prefix, self._node_name, prefix)
            raise FileNotFoundError(
                f"no committed checkpoint for node {self._node_name!r} at epoch {epoch} "
                f"({path!r}); committed epochs: {committed}"
            )
        return path

    def load(
        self,
        epoch: int,
        path_prefix: str | None = None,
        path_type: str | None = None,
        *,
        targets: Mapping[str, Any] | None = None,
    ) -> Workspace:
        """Loads the whole persistent workspace saved at ``epoch``.

        Args:
            epoch: A committed epoch.
            path_prefix: Read ``path_prefix + "<node>.<epoch>"`` instead.
            path_type: Storage type of that path; only ``"orbax"``.
            targets: Abstract leaves (from the init group's trace) fixing the
                pytree types, dtypes and shardings of the names they cover.

        Raises:
            FileNotFoundError: If ``epoch`` is not committed (lists those that are).
            ValueError: If a target differs from the checkpoint (names the key path).
        """
        path = self._existing(epoch, path_prefix, path_type)
        manifest = storage.read_manifest(path)
        self._blob_names = list(manifest["state_keys"])
        return self._timed_load(path, self._blob_names, manifest, targets=targets)

    def saved_shapes(self, epoch: int) -> dict[str, Any]:
        """Shapes and dtypes of the leaves saved at ``epoch``, reading no array data."""
        return storage.saved_shapes(self._existing(epoch))

    def load_outputs(self, epoch: int) -> Workspace:
        """Loads the epoch outputs saved with ``epoch`` for the stop conditions."""
        path = self._existing(epoch)
        manifest = storage.read_manifest(path)
        names = manifest["output_keys"]
        items = storage.restore_items(path, names, item=storage.OUTPUTS_ITEM, manifest=manifest)
        return Workspace(items)

    def load_blobs_from_checkpoint(self, blob_names: Iterable[str], epoch: int) -> Workspace:
        """Loads those of ``blob_names`` that this node's checkpoint of ``epoch`` holds."""
        path = self._existing(epoch)
        manifest = storage.read_manifest(path)
        wanted = [n for n in blob_names if n in manifest["state_keys"]]
        return self._timed_load(path, wanted, manifest)

    def _timed_load(self, path, names, manifest, *, targets=None, sharding=None) -> Workspace:
        self._current_db_name = path
        start = time.perf_counter()
        logger.info("Loading %s from %s", names, path)
        items = storage.restore_items(
            path, names, targets=targets, sharding=sharding, manifest=manifest
        )
        self._current_stats = {
            "epoch": manifest["epoch"],
            "duration_s": time.perf_counter() - start,
            "bytes": storage.nbytes(items),
            "error": None,
        }
        return Workspace(items)

    def save(self, epoch: int, workspace: Mapping[str, Any], *, outputs=None) -> None:
        """Starts saving ``workspace`` as this node's checkpoint of ``epoch``.

        Returns once the device-to-host copy is done (async) or the
        checkpoint is committed (``async_save=False``). Saving an epoch that
        is already committed replaces it once the new one is committed.

        Args:
            epoch: The epoch, >= 0.
            workspace: The persistent leaves to save.
            outputs: Epoch outputs the stop conditions read, saved alongside.

        Raises:
            OSError: If ``db_prefix`` is not a writable directory.
            CheckpointSaveError: If the previous async save failed (raised
                after this epoch's save has started).
        """
        previous = self._finish_pending()
        self._start(epoch, Workspace(workspace), Workspace(outputs or {}))
        if not self._async_save:
            previous = previous or self._finish_pending()
        if previous is not None:
            raise previous

    def _start(self, epoch: int, workspace: Workspace, outputs: Workspace) -> None:
        path = db_name(epoch, self._node_name, self._db_prefix)
        self._current_db_name = path
        self._current_stats = {"epoch": epoch, "bytes": storage.nbytes(workspace), "error": None}
        start = time.perf_counter()
        pending = None
        try:
            _prepare_prefix(self._db_prefix)
            pending = _Pending(epoch, path, start, superseded=_move_aside(path))
            args = storage.save_args(
                workspace, outputs, _manifest(epoch, self._node_name, workspace, outputs)
            )
            logger.info("Saving epoch %d to %s", epoch, path)
            self._get_checkpointer().save(os.path.abspath(path), args=args)
        except Exception as err:
            self._record_failure(epoch, path, err)
            _put_back(path, pending)
            raise
        self._pending = pending
        self._blob_names = list(workspace)
        self._current_stats["duration_s"] = time.perf_counter() - start

    def _get_checkpointer(self):
        if self._checkpointer is None:
            handler = storage.composite_handler()
            cls = ocp.AsyncCheckpointer if self._async_save else ocp.Checkpointer
            self._checkpointer = cls(handler)
        return self._checkpointer

    def _record_failure(self, epoch: int, path: str, err: BaseException) -> CheckpointSaveError:
        failure = (
            err if isinstance(err, CheckpointSaveError) else CheckpointSaveError(epoch, path, err)
        )
        failure.__cause__ = failure.__cause__ or err
        self.failures.append(failure)
        stats = {"epoch": epoch, "error": f"{type(err).__name__}: {err}"}
        self._current_db_name, self._current_stats = path, stats
        logger.debug("checkpoint failure recorded: %s", failure)
        return failure

    def _finish_pending(self) -> CheckpointSaveError | None:
        """Waits for the save in flight; returns its failure, if any (recorded, not raised)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            if isinstance(self._checkpointer, ocp.AsyncCheckpointer):
                self._checkpointer.wait_until_finished()
        except Exception as err:
            _put_back(pending.db, pending)
            return self._record_failure(pending.epoch, pending.db, err)
        if pending.superseded:
            shutil.rmtree(pending.superseded, ignore_errors=True)
        if self._current_db_name == pending.db and self._current_stats is not None:
            self._current_stats["commit_s"] = time.perf_counter() - pending.started
        if pending.write_metadata:
            self._metadata_handler.write(epoch=pending.epoch)
        return None

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight is committed.

        Raises:
            CheckpointSaveError: If it failed.
        """
        failure = self._finish_pending()
        if failure is not None:
            raise failure

    def close(self) -> None:
        """Waits for pending saves and releases Orbax's resources."""
        try:
            self.wait_until_finished()
        finally:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None

    def write_checkpoint_metadata(self, epoch: int) -> None:
        """Tells the metadata handler that ``epoch`` is saved, once it is committed."""
        if self._pending is not None and self._pending.epoch == epoch:
            self._pending.write_metadata = True
        else:
            self._metadata_handler.write(epoch=epoch)

    def collect_checkpoint_stats(self, stats: dict[str, Any]) -> None:
        """Adds the last action's stats to ``stats``, keyed by checkpoint directory."""
        if self._current_db_name and self._current_stats is not None:
            stats[self._current_db_name] = dict(self._current_stats)
        else:
            logger.info("No checkpoint stats to collect for %s", self._node_name)

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Sends the last action's stats to the metadata handler."""
        stats: dict[str, Any] = {}
        self.collect_checkpoint_stats(stats)
        self._metadata_handler.report(action_name, stats)

    def get_resume_from_epoch_id(self, user_epoch: int | None = None) -> int | None:
        """The epoch to resume from (``user_epoch`` wins), or None for a fresh start."""
        return self._metadata_handler.last_epoch(user_epoch=user_epoch)

    def set_params(
        self, nodes: Sequence[str], path_prefix: str | None = None, path_type: str | None = None
    ) -> None:
        """Passes the checkpoint location and this node to the metadata handler."""
        if path_prefix:
            self._path_prefix = path_prefix
        if path_type:
            self._path_type = _check_db_type(path_type, "path_type")
        self._metadata_handler.set_params(
            db_prefix=self._db_prefix,
            db_type=self._db_type,
            node_names=[self._node_name],
            path_prefix=self._path_prefix,
            path_type=self._path_type,
        )

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Asks the metadata handler whether checkpoints (of ``epoch``) are accessible."""
        return self._metadata_handler.cp_accessible(epoch)


def _manifest(epoch: int, node: str, state: Workspace, outputs: Workspace) -> dict[str, Any]:
    return {
        "format": storage.FORMAT,
        "epoch": epoch,
        "node": node,
        "state_keys": list(state),
        "output_keys": list(outputs),
        "leaves": {**storage.describe(state), **storage.describe(outputs)},
        "process_count": jax.process_count(),
        "time": time.time(),
    }


def _move_aside(path: str) -> str | None:
    """Renames a committed ``path`` out of the way of a new save; returns where it went."""
    if not os.path.exists(path):
        return None
    aside = f"{path}.superseded-{time.time_ns()}"
    os.rename(path, aside)
    return aside


def _put_back(path: str, pending: _Pending | None) -> None:
    """After a failed save, returns the epoch it was replacing to its place."""
    if pending is not None and pending.superseded and not os.path.exists(path):
        os.rename(pending.superseded, path)
