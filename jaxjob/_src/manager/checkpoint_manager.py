"""The checkpoint manager of one node: async Orbax saves into epoch-indexed directories."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxjob._src.base import fs, preemption
from jaxjob._src.base.errors import CheckpointSaveError
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import checksum, codec, manifest, storage
from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.checkpoint.layout import check_epoch, check_node_name, db_name, is_committed
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.internals import orbax_private
from jaxjob._src.manager import boundary, lock, retention
from jaxjob._src.manager import keep as keep_lib
from jaxjob._src.manager.metadata import MetadataHandler
from jaxjob._src.manager.shared import (
    DEFAULT_WRITE_TIMEOUT_S,
    CheckpointOptions,
    ManagerCore,
    check_db_type,
    check_owner,
)
from jaxjob._src.multihost import hosts

__all__ = ["CheckpointManager"]

logger = get_logger(__name__)


class _OrbaxSaveErrors(logging.Filter):
    """Moves Orbax's tracebacks of a failing jaxjob save from absl's log to jaxjob's DEBUG.

    While a save of this process is in flight, Orbax's background threads log
    each failure at ERROR with its traceback (several records, hundreds of
    lines); jaxjob reports the failure itself, in one line, when it surfaces.
    Other Orbax records, and all of them while no save is in flight, pass.
    """

    def __init__(self) -> None:
        super().__init__()
        self.saving: set[str] = set()  # the directories of this process's saves in flight

    def filter(self, record: logging.LogRecord) -> bool:
        """False (re-logged at DEBUG) for an Orbax traceback during a save."""
        if (
            not self.saving
            or record.levelno < logging.WARNING
            or not record.exc_info
            or f"{os.sep}orbax{os.sep}checkpoint{os.sep}" not in record.pathname
        ):
            return True
        logger.debug("Orbax: %s", record.getMessage(), exc_info=record.exc_info)
        return False


_orbax_errors = _OrbaxSaveErrors()
logging.getLogger("absl").addFilter(_orbax_errors)


@dataclasses.dataclass
class _Pending:
    epoch: int
    db: str
    started: float
    superseded: str | None = None
    deadline: float | None = None  # on object stores: when its background write has failed
    starting: bool = False  # Orbax's save() has not returned: an interrupt may have stopped it


@dataclasses.dataclass
class SavePlan:
    """One process's part of one node's save, prepared before the processes agree to start it.

    ``post`` (JSON) is what this process tells the others: how its previous
    save ended, this save's problem, its host-local leaves' kinds and
    replicated leaves' digests (which must match everywhere) and this save's
    stats. ``timeout_s`` is how long to wait for the others' posts.
    """

    epoch: int
    path: str
    pending: _Pending
    timeout_s: float
    previous: CheckpointSaveError | None = None
    problem: Exception | None = None
    found: manifest.Manifest | None = None
    encoded: Any = None
    digests: dict[str, str] = dataclasses.field(default_factory=dict)
    bytes: int | None = None
    post: dict[str, Any] = dataclasses.field(default_factory=dict)


def _prepare_prefix(db_prefix: str) -> None:
    """Creates ``db_prefix``, raising the OSError's own type with an actionable message."""
    try:
        fs.makedirs(db_prefix)
    except OSError as err:
        raise type(err)(
            f"checkpoint db_prefix {db_prefix!r} is not a writable directory "
            f"({err.strerror or err}); pass a directory you can write to"
        ) from err


class CheckpointManager(ManagerCore):
    """Saves and loads a node's persistent workspace on every epoch boundary.

    Each epoch goes to ``<db_prefix>/<node_name>.<epoch>/`` through Orbax. A save
    is asynchronous by default: :meth:`save` returns once the device-to-host
    copy is done and the write overlaps the next epoch. An epoch is visible
    (listed, resumable) only once Orbax has committed it. A failure of a
    background write is raised, as :class:`CheckpointSaveError`, by the next
    :meth:`save` (after that save has started) or by :meth:`wait_until_finished`.

    Args:
        db_prefix: Directory holding the checkpoints: a local path (``~`` is
            expanded), ``gs://bucket/prefix`` or ``s3://bucket/prefix``.
        node_name: The node whose checkpoints this manager writes.
        db_type: Storage type; only ``"orbax"``.
        metadata_handler: Decides the resume epoch and receives stats; by
            default a :class:`~jaxjob._src.manager.metadata.DiskMetadataHandler` (auto-resume).
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
        storage_timeout_s: On ``gs://`` and ``s3://``: how long one
            object-store operation (a listing, the lock, Orbax's directory
            calls, TensorStore's requests) may take before the save, restore
            or load fails with a ``TimeoutError`` naming the endpoint, under
            the runner's ``on_save_error``; the write or read of the arrays
            may take that plus their bytes at 1 MiB/s. None:
            ``$JAXJOB_STORAGE_TIMEOUT_S``, else 120 s.
        owner_process: Makes this node's checkpoints private to one process
            (the caffe2 style, where each process runs its own node): only
            that process saves them, any process may read them, and neither
            waits on the other processes. Its leaves must live on that
            process's devices. None (the default): every process saves its
            part of every checkpoint together (SPMD).
        keep: Which committed epochs to keep: a policy of :mod:`jaxjob.keep`
            or a list of them (their union); None keeps every epoch. The
            newest committed epoch and the epoch being written are never
            deleted; deletion runs after a newer epoch has committed, on one
            process (process 0, or ``owner_process``), and a failed deletion
            is logged and retried after the next commit.

    The manager writes only while it holds the node's lock
    (``<db_prefix>/.jaxjob/<node>.lock``, see :mod:`jaxjob._src.manager.lock`), taken by
    :meth:`init` or the first :meth:`save`: another live writer of this node
    under this ``db_prefix`` makes them raise
    :class:`~jaxjob.CheckpointInUseError`. Once it holds the lock, it removes
    what killed saves left. :meth:`close` (or the process's exit) releases it.

    In a multi-process job every process makes the same calls (SPMD): each
    :meth:`save` first checks, with every other process, that the previous
    save committed everywhere and that this one can start everywhere, so a
    failure on any process is raised (or, by the runner, logged) on all of
    them, and a process that does not arrive within ``timeout_s`` makes the
    others raise :class:`~jaxjob.hosts.HostTimeoutError` naming it.

    Example:
        >>> import tempfile, jax.numpy as jnp, jaxjob
        >>> ckpt = jaxjob.CheckpointManager(tempfile.mkdtemp())
        >>> ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(3)}))
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
        storage_timeout_s: float | None = None,
        owner_process: int | None = None,
        keep: keep_lib.Policy | Sequence[keep_lib.Policy] | None = None,
    ) -> None:
        options = CheckpointOptions(
            async_save=async_save,
            timeout_s=timeout_s,
            write_timeout_s=write_timeout_s,
            host_map=host_map,
            storage_timeout_s=storage_timeout_s,
        )
        super().__init__(db_prefix, db_type, metadata_handler, options, keep=keep)
        self.owner_process = check_owner(owner_process)
        self._private = owner_process is not None
        self._exchange_stats = not self._private
        self._node_name = check_node_name(node_name)
        self._saver: ocp.Checkpointer | None = None
        self._reader: ocp.Checkpointer | None = None
        self._manifests: dict[str, manifest.Manifest] = {}
        self._blob_names: list[str] | None = None
        self._pending: _Pending | None = None
        self._current_db_name: str | None = None
        self._current_stats: dict[str, Any] | None = None
        self.failures: list[CheckpointSaveError] = []
        self._lock: lock.Handle | None = None
        self._retention = (
            retention.Retention(self._db_prefix, [self._node_name], self._keep)
            if self._keep
            else None
        )

    def __repr__(self) -> str:
        return f"CheckpointManager({self._db_prefix!r}, node_name={self._node_name!r})"

    @property
    def node_managers(self) -> list[tuple[str, CheckpointManager]]:
        """``[(node_name, self)]``: the same shape as a multi-node manager's."""
        return [(self._node_name, self)]

    def node_names(self) -> list[str]:
        """``[node_name]``."""
        return [self._node_name]

    def _own_nodes(self) -> list[str]:
        """``[node_name]``: every node's leaves are saved under it."""
        return [self._node_name]

    def has_pending(self) -> bool:
        """Whether a save of this process is in flight."""
        return self._pending is not None

    def get_ckpt_db_name(self, node_name: str, epoch: int) -> str:
        """Checkpoint directory of ``node_name`` at ``epoch``."""
        return db_name(epoch, node_name, self._db_prefix)

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

        Takes the node's lock (see :mod:`jaxjob._src.manager.lock`); call it on every process.

        Raises:
            ValueError: If more than one node is given.
            CheckpointInUseError: If another live process writes this node here.
        """
        if nodes is not None and len(nodes) > 1:
            raise ValueError(
                f"CheckpointManager handles one node, got nodes={list(nodes)}; "
                "use MultiNodeCheckpointManager for several"
            )
        self._take_lock()  # an unwritable db_prefix is reported by the first save, which retries
        if retrieve_from_epoch is not None:
            _, found = self._checkpoint(retrieve_from_epoch, path_prefix, path_type)
            self._blob_names = found.state_keys

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
        return is_committed(db_name(check_epoch(epoch), self._node_name, self._db_prefix))

    def _checkpoint(
        self, epoch: int, path_prefix: str | None = None, path_type: str | None = None
    ) -> tuple[str, manifest.Manifest]:
        """The committed checkpoint directory of ``epoch`` and its manifest (read once)."""
        if path_type is not None:
            check_db_type(path_type, "path_type")
        epoch = check_epoch(epoch)
        prefix = path_prefix or self._path_prefix
        path = db_name(epoch, self._node_name, self._db_prefix, prefix)
        if path not in self._manifests:
            if not is_committed(path):
                raise FileNotFoundError(
                    f"no committed checkpoint for node {self._node_name!r} at epoch {epoch} "
                    f"({path!r}); committed epochs: {self.committed_epochs()}"
                )
            self._manifests[path] = manifest.read(path)
        return path, self._manifests[path]

    def _get_reader(self) -> ocp.Checkpointer:
        if self._reader is None:
            handler = storage.composite_handler(self._db_prefix, self._private)
            self._reader = orbax_private.checkpointer(
                self._db_prefix, handler, private=self._private
            )
        return self._reader

    def _restore(self, path, found, names, *, item=storage.STATE, targets=None, sharding=None):
        return storage.restore(
            self._get_reader(),
            path,
            found,
            names,
            item=item,
            targets=targets,
            sharding=sharding,
            host_map=self.host_map,
        )

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
            TypeError: If ``epoch`` is not an int (ValueError if negative).
            FileNotFoundError: If ``epoch`` is not committed (lists those that are).
            ValueError: If a target differs from the checkpoint (names the key path).
        """
        path, found = self._checkpoint(epoch, path_prefix, path_type)
        self._blob_names = found.state_keys
        return self._timed_load(path, found, self._blob_names, targets=targets)

    def _verify_nodes(self, epoch: int, nodes: Sequence[str]) -> list[str]:
        """Verifies through this manager's cached manifest and reader when it reads alone."""
        if list(nodes) != [self._node_name] or (jax.process_count() > 1 and not self._private):
            return super()._verify_nodes(epoch, nodes)
        try:
            path, found = self._checkpoint(epoch)
            records = checksum.read_records(path, found)
        except ValueError as err:  # CorruptCheckpointError, or a malformed manifest
            return [str(err)]
        return checksum.check_all(self._get_reader(), path, found, records)

    def saved_shapes(self, epoch: int) -> dict[str, Any]:
        """Shapes and dtypes of the leaves saved at ``epoch``, reading no array data."""
        return storage.saved_shapes(self._checkpoint(epoch)[1])

    def load_outputs(self, epoch: int) -> Workspace:
        """Loads the epoch outputs saved with ``epoch`` for the stop conditions."""
        path, found = self._checkpoint(epoch)
        return Workspace(self._restore(path, found, found.output_keys, item=storage.OUTPUTS))

    def load_blobs_from_checkpoint(self, blob_names: Iterable[str], epoch: int) -> Workspace:
        """Loads those of ``blob_names`` that this node's checkpoint of ``epoch`` holds."""
        path, found = self._checkpoint(epoch)
        wanted = [n for n in blob_names if n in found.state]
        return self._timed_load(path, found, wanted)

    def load_blobs_locally(
        self, nodes: Sequence[Any], blob_names: Iterable[str], epoch: int, session: Any
    ) -> bool:
        """Loads ``blob_names`` from this node's checkpoint into ``session.workspace``.

        Returns:
            False, loading nothing, if the checkpoint of ``epoch`` is missing.
        """
        self._agreed_stats = None  # a load: its stats are exchanged when reported
        if not self.check_db_exists(epoch):
            return False
        loaded = self.load_blobs_from_checkpoint(blob_names, epoch)
        session.workspace = session.workspace.set(loaded)
        return True

    def _timed_load(self, path, found, names, *, targets=None) -> Workspace:
        self._current_db_name, self._agreed_stats = path, None
        start = time.perf_counter()
        logger.info("Loading %s from %s", names, path)
        items = self._restore(path, found, names, targets=targets)
        self._current_stats = {
            "epoch": found.epoch,
            "duration_s": time.perf_counter() - start,
            "bytes": storage.nbytes(items),
            "error": None,
        }
        return Workspace(items)

    def save(
        self, epoch: int, workspace: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None
    ) -> None:
        """Starts saving ``workspace`` as this node's checkpoint of ``epoch``.

        Returns once the device-to-host copy is done (async) or the
        checkpoint is committed and on stable storage (``async_save=False``).
        Saving an epoch that is already committed replaces it once the new
        one is committed (on object stores, which cannot rename, the old one
        is deleted first). In a multi-process job, call it on every process:
        the processes agree in one exchange whether it can start (and share
        its stats, see :meth:`report_checkpoint_stats`). If the last
        :meth:`cp_accessible` (without epoch) said False here, it fails on
        every process, writing nothing.

        Args:
            epoch: The epoch, >= 0.
            workspace: The persistent leaves to save.
            outputs: Epoch outputs the stop conditions read, saved alongside.

        Raises:
            TypeError: If ``epoch`` is not an int.
            ValueError: If ``epoch`` is negative.
            OSError: If ``db_prefix`` is not a writable directory here.
            PermissionError: If :meth:`cp_accessible` said False here.
            UnstorableLeafError: (a TypeError) If a leaf cannot be stored at
                all (a zero-size array; a dtype Orbax lacks: uint2, uint4,
                float8_e4m3), naming its key path, dtype and shape; nothing
                is written and nothing committed is touched.
            CheckpointSaveError: If this save cannot start on another
                process, or the previous async save failed on some process
                (raised after this epoch's save has started).
            CheckpointInUseError: If another live process writes this node here.
            HostTimeoutError: If another process does not arrive in time.
        """
        access = self._take_access()
        plan = self.prepare_save(epoch, workspace, outputs=outputs, accessible=access)
        if self._private:
            posts = [plan.post]
        else:
            posts = hosts.exchange(self._what(plan.epoch), plan.post, timeout_s=plan.timeout_s)
        problem = self.agree_save(plan, posts)
        me = [jax.process_index()] if self._private else range(len(posts))
        self._agreed_stats = None
        if problem is None:  # every process reached the same conclusion
            pairs = zip(me, posts, strict=True)
            self._agreed_stats = [{"process": p, "stats": post["stats"]} for p, post in pairs]
        self.start_save(plan)

    def _what(self, epoch: int | None) -> str:
        if epoch is None:
            return f"the end of the saves of node {self._node_name!r}"
        return f"the save of epoch {epoch} of node {self._node_name!r}"

    def prepare_save(
        self,
        epoch: int,
        workspace: Mapping[str, Any],
        *,
        outputs: Mapping[str, Any] | None = None,
        accessible: bool = True,
    ) -> SavePlan:
        """This process's part of :meth:`save` before the processes agree; waits on no other.

        ``accessible=False`` (the metadata handler's answer) makes it post a
        PermissionError and touch nothing. Otherwise it completes this
        process's save in flight, builds the manifest, encodes the leaves and
        moves a committed checkpoint of ``epoch`` aside. A problem is not
        raised but posted: ``plan.post`` is what this process tells the
        others. :meth:`save` is this, one exchange of the posts,
        :meth:`agree_save` and :meth:`start_save`; a multi-node manager
        makes one exchange for all its nodes.

        Raises:
            TypeError, ValueError: For a bad ``epoch`` or leaf name (on every process alike).
            CheckpointInUseError: If another live process writes this node here.
        """
        epoch = check_epoch(epoch)
        for name in [*workspace, *(outputs or {})]:  # before the lock: nothing is written
            manifest.check_name(name)
        self._check_writer()
        path = db_name(epoch, self._node_name, self._db_prefix)
        if not accessible:  # the metadata handler's verdict: touch nothing, finish nothing
            denied = PermissionError(
                f"the metadata handler reports the checkpoints under {self._db_prefix!r} as "
                "not accessible (cp_accessible() is False); nothing was written"
            )
            pending = _Pending(epoch, path, time.perf_counter())
            return self._plan(SavePlan(epoch, path, pending, self.timeout_s, problem=denied))
        unwritable = self._take_lock()
        started = self._pending.started if self._pending else None
        previous = self._finish_pending()
        pending = _Pending(epoch, path, time.perf_counter())
        plan = SavePlan(epoch, path, pending, self._wait_s(started), previous=previous)
        try:
            if unwritable is not None:
                raise unwritable
            self._encode(plan, workspace, outputs or {})
        except Exception as err:
            plan.problem = err
        return self._plan(plan)

    def _wait_s(self, started: float | None) -> float:
        """``timeout_s`` plus what remains of the write started at ``started`` (others await it)."""
        if started is None:
            return self.timeout_s
        return self.timeout_s + max(
            0.0, started + self.options.write_timeout_s - time.perf_counter()
        )

    def _encode(self, plan: SavePlan, workspace: Mapping[str, Any], outputs: Mapping) -> None:
        """Builds the manifest and the leaves as stored, then moves the path aside."""
        found, flat = manifest.build(
            plan.epoch,
            self._node_name,
            Workspace(workspace),
            Workspace(outputs),
            self.owner_process,
        )
        metrics = retention.metrics_of(self.required_outputs, outputs, workspace)
        plan.found = dataclasses.replace(found, metrics=metrics)
        plan.encoded, plan.digests = storage.encode(plan.found, flat, self._private)
        plan.bytes = storage.nbytes(plan.encoded)
        _prepare_prefix(self._db_prefix)
        self._manifests.pop(plan.path, None)
        if jax.process_index() == (self.owner_process or 0):
            plan.pending.superseded = _move_aside(plan.path)

    def _plan(self, plan: SavePlan) -> SavePlan:
        """Completes ``plan`` with its post: outcome, leaves to check, and this save's stats."""
        local = {
            s.path: {"kind": s.kind, "dtype": s.dtype, "shape": list(s.shape)}
            for s in (plan.found.leaves.values() if plan.found else ())
            if s.host_local
        }
        stats = {
            "epoch": plan.epoch,
            "bytes": plan.bytes,
            "error": _text(plan.problem),
            "duration_s": time.perf_counter() - plan.pending.started,
        }
        plan.post = {
            **_outcome(plan.previous, plan.problem),
            "host_local": local,
            "replicated": plan.digests,
            "stats": {plan.path: stats},
        }
        return plan

    def agree_save(self, plan: SavePlan, posts: Sequence[Mapping[str, Any]]) -> Exception | None:
        """Concludes from every process's ``plan.post`` (in process order) whether the save starts.

        Sets ``plan.previous`` to the previous save's failure on any process
        and ``plan.problem`` to this save's problem on any process (each
        naming those processes), or None.

        Returns:
            ``plan.problem``.
        """
        plan.previous, plan.problem = self._conclude(
            plan.epoch, plan.path, plan.previous, plan.problem, posts
        )
        return plan.problem

    def start_save(self, plan: SavePlan, *, cancel: bool = False) -> None:
        """Starts the agreed save, or gives it up if ``plan.problem`` (or ``cancel``) says so.

        Args:
            plan: From :meth:`prepare_save`, concluded by :meth:`agree_save`.
            cancel: Give it up though it could start (another node's save could not).

        Raises:
            As :meth:`save`: the problem, else (after starting) the previous save's failure.
        """
        problem = plan.problem
        if problem is None and not cancel:
            problem = self._start(plan)
            if not self.options.async_save and problem is None:
                plan.previous = plan.previous or self._finish_pending()
        else:
            _put_back(plan.path, plan.pending)
            if problem is not None:
                self._record_failure(plan.epoch, plan.path, problem)
        self._retain()
        if problem is not None:
            raise problem
        if plan.previous is not None:
            raise plan.previous

    def _agree(self, previous: CheckpointSaveError | None, *, started: float | None):
        """Shares with every process how the last save ended; returns its failure on any process."""
        mine = {**_outcome(previous, None), "host_local": {}, "replicated": {}}
        posts = hosts.exchange(self._what(None), mine, timeout_s=self._wait_s(started))
        previous, _ = self._conclude(None, None, previous, None, posts)
        return previous

    def _conclude(self, epoch, path, previous, problem, posts):
        """The previous save's failure and this save's problem on any process, from the posts.

        Returns:
            Each naming the processes where it happened, or None.
        """
        me = [0] if self._private else [jax.process_index()]
        failed, text = boundary.failures(posts, "previous")
        if failed and failed != me:
            at = posts[failed[0]]["previous_at"]
            previous = self._record_failure(at[0], at[1], text, failed, count=previous is None)
        problems, text = boundary.failures(posts, "problem")
        if problems == me or isinstance(problem, codec.UnstorableLeafError):
            return previous, problem  # a refused leaf is raised as it is wherever it is refused
        if problems:
            return previous, CheckpointSaveError(epoch, path, text, problems)
        disagreement = boundary.mismatch(posts)
        return previous, (ValueError(disagreement) if disagreement else None)

    def _deletes(self) -> bool:
        """Whether this process is the one that deletes (process 0, or the owner)."""
        return jax.process_index() == (self.owner_process or 0)

    def _take_lock(self) -> Exception | None:
        """Takes the node's lock once, then removes what killed saves left.

        Returns:
            The error making ``db_prefix`` unwritable (not holding the lock),
            or the lock lost to another writer, if so.

        Raises:
            CheckpointInUseError: If another live process writes this node here.
        """
        if self._lock is not None:
            return self._lock.lost()
        try:
            if self._private or jax.process_count() == 1:  # else process 0 creates it
                _prepare_prefix(self._db_prefix)
            self._lock = lock.acquire(
                self._db_prefix,
                self._node_name,
                owner_process=self.owner_process,
                timeout_s=self.timeout_s,
            )
        except OSError as err:
            return err
        if self._deletes():
            retention.sweep(self._db_prefix, self._node_name)
        return None

    def _retain(self) -> None:
        """Applies ``keep`` after a commit, on the deleting process; never raises."""
        if self._retention is not None and self._deletes():
            self._retention.apply(writing=self._pending.epoch if self._pending else None)

    def _check_writer(self) -> None:
        if self._private and jax.process_index() != self.owner_process:
            raise ValueError(
                f"node {self._node_name!r} is saved by process {self.owner_process} alone "
                f"(owner_process), but save was called on process {jax.process_index()}"
            )

    def _start(self, plan: SavePlan) -> CheckpointSaveError | None:
        """Starts the Orbax save on every process; returns its failure, if any."""
        epoch, path, pending = plan.epoch, plan.path, plan.pending
        self._current_db_name = path
        self._current_stats = {"epoch": epoch, "bytes": plan.bytes, "error": None}
        deferred = preemption.DeferredInterrupt()
        try:
            args = storage.save_args(plan.encoded, plan.found)
            logger.debug("Saving epoch %d to %s", epoch, path)
            _orbax_errors.saving.add(path)
            pending.starting, self._pending = True, pending  # a KeyboardInterrupt finishes it
            with deferred:  # Ctrl-C is raised once Orbax has started the save
                pending.deadline = storage.start_bounded(self._get_saver(), path, args, plan.bytes)
        except Exception as err:
            self._pending = None
            _orbax_errors.saving.discard(path)
            if not self._abandon_saver(err):  # a silent store: cleaning up would wait again
                self._remove_failed(path)
                _put_back(path, pending)
            failure = self._record_failure(epoch, path, err)
            deferred.raise_if_received()
            return failure
        pending.starting = False
        self._blob_names = plan.found.state_keys
        self._current_stats["duration_s"] = time.perf_counter() - pending.started
        deferred.raise_if_received()  # the save is in flight: train completes it
        return None

    def _get_saver(self) -> ocp.Checkpointer:
        if self._saver is None:
            handler = storage.composite_handler(self._db_prefix, self._private)
            timeout = self.options.write_timeout_s if self.options.async_save else None
            self._saver = orbax_private.checkpointer(
                self._db_prefix, handler, private=self._private, async_timeout_s=timeout
            )
        return self._saver

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
        """Waits for the save in flight; returns its failure, if any (recorded, not raised).

        Interrupted (KeyboardInterrupt), the save stays in flight: the next call waits again.
        """
        pending = self._pending
        if pending is None:
            return None
        deferred = preemption.DeferredInterrupt()
        try:
            if isinstance(self._saver, ocp.AsyncCheckpointer):
                with deferred:  # Ctrl-C is raised once the save is done
                    if pending.deadline is None:
                        self._saver.wait_until_finished()
                    else:  # on an object store
                        storage.wait_bounded(self._saver, pending.db, pending.deadline)
            if pending.starting and not is_committed(pending.db):
                raise RuntimeError(
                    f"a KeyboardInterrupt stopped the start of the save of epoch {pending.epoch}"
                    "; nothing of it was committed"
                )
        except Exception as err:
            self._pending = None
            _orbax_errors.saving.discard(pending.db)
            if not self._abandon_saver(err):  # a silent store: cleaning up would wait again
                self._remove_failed(pending.db)
                _put_back(pending.db, pending)
            self._flush_metadata(committed=False)
            failure = self._record_failure(pending.epoch, pending.db, err)
            if deferred.received:  # the KeyboardInterrupt goes up, not the failure: log it
                logger.warning("Unable to write checkpoint for epoch %d: %s", pending.epoch, err)
            deferred.raise_if_received()
            return failure
        self._pending = None
        _orbax_errors.saving.discard(pending.db)
        if pending.superseded:
            _remove(pending.superseded)
        if self._current_db_name == pending.db and self._current_stats is not None:
            self._current_stats["commit_s"] = time.perf_counter() - pending.started
        self._flush_metadata(committed=True)
        deferred.raise_if_received()
        return None

    def _abandon_saver(self, err: Exception) -> bool:
        """After an object store stopped answering: drops the stuck Orbax saver; whether it did.

        Its threads wait on the store and cannot be cancelled; the next save
        makes a new saver, and the lock sweep removes what this one left.
        """
        if not isinstance(err, fs.StorageTimeoutError):
            return False
        self._saver = None
        return True

    def _remove_failed(self, path: str) -> None:
        if self._deletes():
            retention.remove_failed(path)

    def finish_local(self) -> list[CheckpointSaveError]:
        """Completes this process's save in flight, without waiting on other processes.

        Returns:
            Its failure, if it failed (recorded, not raised).
        """
        failure = self._finish_pending()
        return [failure] if failure is not None else []

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight is committed; call it on every process.

        Raises:
            CheckpointSaveError: If it failed on any process.
            HostTimeoutError: If another process does not arrive in time.
        """
        started = self._pending.started if self._pending else None
        failure = self._finish_pending()
        if jax.process_count() > 1 and not self._private:
            failure = self._agree(failure, started=started)
        self._retain()
        if failure is not None:
            raise failure

    def _close_orbax(self) -> None:
        for checkpointer in (self._saver, self._reader):
            if checkpointer is not None:
                checkpointer.close()
        self._saver = self._reader = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def collect_checkpoint_stats(self, stats: dict[str, Any]) -> None:
        """Adds the last action's stats to ``stats``, keyed by checkpoint directory."""
        if self._current_db_name and self._current_stats is not None:
            stats[self._current_db_name] = dict(self._current_stats)
        else:
            logger.info("No checkpoint stats to collect for %s", self._node_name)


def _outcome(previous: CheckpointSaveError | None, problem: BaseException | None) -> dict:
    """The post of how this process's previous save ended and whether this one can start."""
    return {
        "previous": _text(previous),
        "previous_at": [previous.epoch, previous.db_name] if previous else None,
        "problem": _text(problem),
    }


def _text(err: BaseException | None) -> str | None:
    if err is None:
        return None
    cause = err.__cause__ if isinstance(err, CheckpointSaveError) and err.__cause__ else err
    return f"{type(cause).__name__}: {cause}"


def _remove(path: str) -> None:
    try:
        fs.rmtree(path)
    except OSError as err:
        logger.warning("could not remove the superseded checkpoint %s: %s", path, err)


def _move_aside(path: str) -> str | None:
    """Moves whatever is at ``path`` out of the way of a new save; returns where it went.

    A committed checkpoint is renamed aside on local disk (put back if the new
    save fails, deleted once it commits); on object stores, which cannot
    rename, it is deleted. Anything else at ``path`` is not a checkpoint
    (an interrupted commit-file save): it is deleted.
    """
    if not fs.exists(path):
        return None
    if is_committed(path) and not fs.is_remote(path):
        aside = f"{path}.superseded-{time.time_ns()}"
        fs.rename(path, aside)
        return aside
    if is_committed(path):
        logger.warning(
            "Replacing the committed checkpoint %s: object stores cannot rename, "
            "so the old one is deleted before the new one is written",
            path,
        )
    fs.rmtree(path)
    return None


def _put_back(path: str, pending: _Pending | None) -> None:
    """After a failed save, returns the epoch it was replacing to its place."""
    if pending is not None and pending.superseded and not fs.exists(path):
        fs.rename(pending.superseded, path)
