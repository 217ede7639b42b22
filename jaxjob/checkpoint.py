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

from jaxjob import boundary, hosts, private, storage
from jaxjob.hostlocal import HostMap
from jaxjob.layout import committed_epochs, db_name, is_committed
from jaxjob.metadata import DiskMetadataHandler, MetadataHandler
from jaxjob.workspace import Workspace

__all__ = ["CheckpointManager", "CheckpointSaveError"]

logger = logging.getLogger(__name__)
DB_TYPES = ("orbax",)
DEFAULT_WRITE_TIMEOUT_S = 600.0


class CheckpointSaveError(RuntimeError):
    """A checkpoint save failed; ``epoch``, ``db_name`` and ``processes`` say which one, where.

    ``processes`` lists the processes on which it failed (``[0]`` for a
    single process); every process of the job raises or logs the same error.
    """

    def __init__(
        self, epoch: int, db: str, cause: BaseException | str, processes: list[int] | None = None
    ) -> None:
        self.processes = [jax.process_index()] if processes is None else list(processes)
        what = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        where = f" on processes {self.processes}" if jax.process_count() > 1 else ""
        super().__init__(f"saving checkpoint epoch {epoch} to {db!r} failed{where}: {what}")
        self.epoch = epoch
        self.db_name = db


@dataclasses.dataclass
class _Pending:
    epoch: int
    db: str
    started: float
    write_metadata: bool = False
    superseded: str | None = None


def _seconds(value: Any, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{argument} must be a positive number of seconds, got {value!r}")
    return float(value)


def _check_owner(owner_process: Any) -> int | None:
    if owner_process is not None and (
        isinstance(owner_process, bool)
        or not isinstance(owner_process, int)
        or not 0 <= owner_process < jax.process_count()
    ):
        raise ValueError(
            f"owner_process must be None or a process index in [0, {jax.process_count()}), "
            f"got {owner_process!r}"
        )
    return owner_process


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
        timeout_s: How long any wait on the other processes of a
            ``jax.distributed`` job may take (the boundary check before each
            save, the resume decision, the stop conditions, the stats
            exchange) before it fails naming the late processes.
        write_timeout_s: How long a background write may take, including
            Orbax's wait for every process's part before the commit. A
            process whose write failed is waited for that long by the others,
            so the boundary after a save waits up to ``write_timeout_s``
            after the save started plus ``timeout_s``.
        host_map: For resuming host-local leaves (NumPy arrays, scalars) on a
            different process count: for each process of this job, the saved
            process whose copy it gets (a callable or a sequence). Without
            it, a process-count change with host-local leaves is an error.
        owner_process: Makes this node's checkpoints private to one process
            (the caffe2 style, where each process runs its own node): only
            that process saves them, any process may read them, and neither
            waits on the other processes. Its leaves must live on that
            process's devices. None (the default): every process saves its
            part of every checkpoint together (SPMD).

    In a multi-process job every process makes the same calls (SPMD): each
    :meth:`save` first checks, with every other process, that the previous
    save committed everywhere and that this one can start everywhere, so a
    failure on any process is raised (or, by the runner, logged) on all of
    them, and a process that does not arrive within ``timeout_s`` makes the
    others raise :class:`~jaxjob.hosts.HostTimeoutError` naming it.

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
        timeout_s: float = hosts.DEFAULT_TIMEOUT_S,
        write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
        host_map: HostMap | None = None,
        owner_process: int | None = None,
    ) -> None:
        if not isinstance(db_prefix, str | os.PathLike) or not str(db_prefix):
            raise TypeError(f"db_prefix must be a non-empty path, got {db_prefix!r}")
        self.owner_process = _check_owner(owner_process)
        self._private = owner_process is not None
        self.timeout_s = _seconds(timeout_s, "timeout_s")
        self.write_timeout_s = _seconds(write_timeout_s, "write_timeout_s")
        self.host_map = host_map
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
        return storage.saved_shapes(self._existing(epoch), private=self._private)

    def load_outputs(self, epoch: int) -> Workspace:
        """Loads the epoch outputs saved with ``epoch`` for the stop conditions."""
        path = self._existing(epoch)
        manifest = storage.read_manifest(path)
        names = manifest["output_keys"]
        items = storage.restore_items(
            path,
            names,
            item=storage.OUTPUTS_ITEM,
            manifest=manifest,
            host_map=self.host_map,
            private=self._private,
        )
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
            path,
            names,
            targets=targets,
            sharding=sharding,
            manifest=manifest,
            host_map=self.host_map,
            private=self._private,
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
        is already committed replaces it once the new one is committed. In a
        multi-process job, call it on every process.

        Args:
            epoch: The epoch, >= 0.
            workspace: The persistent leaves to save.
            outputs: Epoch outputs the stop conditions read, saved alongside.

        Raises:
            OSError: If ``db_prefix`` is not a writable directory here.
            CheckpointSaveError: If this save cannot start on another
                process, or the previous async save failed on some process
                (raised after this epoch's save has started).
            HostTimeoutError: If another process does not arrive in time.
        """
        self._check_writer()
        started = self._pending.started if self._pending else None
        previous = self._finish_pending()
        workspace, outputs = Workspace(workspace), Workspace(outputs or {})
        path = db_name(epoch, self._node_name, self._db_prefix)
        manifest, problem, digests, superseded = None, None, {}, None
        start = time.perf_counter()
        try:
            manifest = _manifest(epoch, self._node_name, workspace, outputs, self.owner_process)
            kinds = manifest["leaves"]
            workspace, digests = storage.encode(workspace, kinds, private=self._private)
            outputs, output_digests = storage.encode(outputs, kinds, private=self._private)
            digests.update(output_digests)
            _prepare_prefix(self._db_prefix)
            if jax.process_index() == (self.owner_process or 0):
                superseded = _move_aside(path)
        except Exception as err:
            problem = err
        pending = _Pending(epoch, path, start, superseded=superseded)
        previous, problem = self._agree(
            epoch, path, previous, problem, manifest, digests, started=started
        )
        if problem is None:
            problem = self._start(epoch, path, workspace, outputs, manifest, pending)
        else:
            _put_back(path, pending)
            self._record_failure(epoch, path, problem)
        if not self._async_save and problem is None:
            previous = previous or self._finish_pending()
        if problem is not None:
            raise problem
        if previous is not None:
            raise previous

    def _agree(self, epoch, path, previous, problem, manifest, digests=None, *, started=None):
        """Shares with every process how the previous save ended and whether this one can start.

        Returns:
            The previous save's failure on any process and this save's
            problem on any process (each naming those processes), or None.
        """
        leaves = (manifest or {}).get("leaves", {})
        local = {k: v for k, v in leaves.items() if v["kind"] in storage.HOST_LOCAL_KINDS}
        mine = {
            "previous": _text(previous),
            "previous_at": [previous.epoch, previous.db_name] if previous else None,
            "problem": _text(problem),
            "host_local": local,
            "replicated": digests or {},
        }
        what = f"the save of epoch {epoch} of node {self._node_name!r}"
        if epoch is None:
            what = f"the end of the saves of node {self._node_name!r}"
        timeout_s = self.timeout_s
        if started is not None:  # others may still wait, up to write_timeout_s, for that write
            timeout_s += max(0.0, started + self.write_timeout_s - time.perf_counter())
        posts = [mine] if self._private else hosts.exchange(what, mine, timeout_s=timeout_s)
        me = [0] if self._private else [jax.process_index()]
        failed, text = boundary.failures(posts, "previous")
        if failed and failed != me:
            at = posts[failed[0]]["previous_at"]
            previous = self._record_failure(at[0], at[1], text, failed, count=previous is None)
        problems, text = boundary.failures(posts, "problem")
        if problems == me:
            return previous, problem
        if problems:
            return previous, CheckpointSaveError(epoch, path, text, problems)
        disagreement = boundary.mismatch(posts)
        return previous, (ValueError(disagreement) if disagreement else None)

    def _check_writer(self) -> None:
        if self._private and jax.process_index() != self.owner_process:
            raise ValueError(
                f"node {self._node_name!r} is saved by process {self.owner_process} alone "
                f"(owner_process), but save was called on process {jax.process_index()}"
            )

    def _start(self, epoch, path, workspace, outputs, manifest, pending):
        """Starts the Orbax save on every process; returns its failure, if any."""
        self._current_db_name = path
        self._current_stats = {"epoch": epoch, "bytes": storage.nbytes(workspace), "error": None}
        try:
            args = storage.save_args(workspace, outputs, manifest)
            logger.info("Saving epoch %d to %s", epoch, path)
            self._get_checkpointer().save(os.path.abspath(path), args=args)
        except Exception as err:
            _put_back(path, pending)
            return self._record_failure(epoch, path, err)
        self._pending = pending
        self._blob_names = list(workspace)
        self._current_stats["duration_s"] = time.perf_counter() - pending.started
        return None

    def _get_checkpointer(self):
        if self._checkpointer is None:
            handler = storage.composite_handler(self._private)
            kwargs = {}
            if self._private and jax.process_count() > 1:
                kwargs["multiprocessing_options"] = private.options()
            if self._async_save:
                options = ocp.AsyncOptions(
                    timeout_secs=max(1, round(self.write_timeout_s)),
                    # Orbax keys the signals of asynchronous directory creation by a
                    # per-process counter in the job-wide key-value store: the private
                    # saves of two processes would collide.
                    create_directories_asynchronously=not kwargs,
                )
                self._checkpointer = ocp.AsyncCheckpointer(handler, async_options=options, **kwargs)
            else:
                self._checkpointer = ocp.Checkpointer(handler, **kwargs)
        return self._checkpointer

    def _record_failure(
        self,
        epoch: int,
        path: str,
        err: BaseException | str,
        processes: list[int] | None = None,
        *,
        count: bool = True,
    ) -> CheckpointSaveError:
        if isinstance(err, CheckpointSaveError):
            failure = err
        else:
            failure = CheckpointSaveError(epoch, path, err, processes)
            failure.__cause__ = err if isinstance(err, BaseException) else None
        if count:
            self.failures.append(failure)
        else:
            self.failures[-1] = failure
        self._current_db_name, self._current_stats = path, {"epoch": epoch, "error": str(failure)}
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
            _remove(pending.superseded)
        if self._current_db_name == pending.db and self._current_stats is not None:
            self._current_stats["commit_s"] = time.perf_counter() - pending.started
        if pending.write_metadata:
            self._metadata_handler.write(epoch=pending.epoch)
        return None

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight is committed; call it on every process.

        Raises:
            CheckpointSaveError: If it failed on any process.
            HostTimeoutError: If another process does not arrive in time.
        """
        started = self._pending.started if self._pending else None
        failure = self._finish_pending()
        if jax.process_count() > 1 and not self._private:
            failure, _ = self._agree(None, None, failure, None, None, started=started)
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
        """Sends every process's stats of the last action to the metadata handler.

        Call it on every process; see :func:`jaxjob.boundary.gather_stats` for the entries.
        """
        stats: dict[str, Any] = {}
        self.collect_checkpoint_stats(stats)
        stats = boundary.gather_stats(stats, self.timeout_s, exchange=not self._private)
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


def _manifest(
    epoch: int, node: str, state: Workspace, outputs: Workspace, owner: int | None
) -> dict[str, Any]:
    return {
        "owner_process": owner,
        "format": storage.FORMAT,
        "epoch": epoch,
        "node": node,
        "state_keys": list(state),
        "output_keys": list(outputs),
        "leaves": {**storage.describe(state), **storage.describe(outputs)},
        "process_count": jax.process_count(),
        "time": time.time(),
    }


def _text(err: BaseException | None) -> str | None:
    if err is None:
        return None
    cause = err.__cause__ if isinstance(err, CheckpointSaveError) and err.__cause__ else err
    return f"{type(cause).__name__}: {cause}"


def _remove(path: str) -> None:
    try:
        shutil.rmtree(path)
    except OSError as err:
        logger.warning("could not remove the superseded checkpoint %s: %s", path, err)


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
