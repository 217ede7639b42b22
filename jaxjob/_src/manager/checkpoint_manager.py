"""The checkpoint manager of one node: a facade over one node writer.

Each epoch goes to ``<db_prefix>/<node_name>.<epoch>/`` through Orbax; the
save protocol is :mod:`jaxjob._src.manager.writer` and
:mod:`jaxjob._src.manager.save_round`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax

from jaxjob._src.checkpoint import storage
from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.checkpoint.layout import check_epoch, check_node_name, db_name, is_committed
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.manager import keep as keep_lib
from jaxjob._src.manager import retention
from jaxjob._src.manager.facade import ManagerCore
from jaxjob._src.manager.local_tier import LocalTier
from jaxjob._src.manager.metadata import MetadataHandler
from jaxjob._src.manager.save_round import Round
from jaxjob._src.manager.shared import (
    DEFAULT_WRITE_TIMEOUT_S,
    CheckpointOptions,
    check_db_type,
    check_owner,
    resolve_options,
)
from jaxjob._src.manager.writer import NodeWriter
from jaxjob._src.multihost import hosts

__all__ = ["CheckpointManager"]


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
            default a :class:`~jaxjob.DiskMetadataHandler` (auto-resume).
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
            may take that plus their bytes at 1 MiB/s. Every way a store
            fails (refused, reset, unresolved name, 5xx) is an ``OSError``
            under the same policy. Threads a store left stuck never hold the
            process: it ends at most this long after the last abandoned call
            (status 1 after an uncaught exception, else 0). None:
            ``$JAXJOB_STORAGE_TIMEOUT_S``, else 120 s.
        owner_process: Makes this node's checkpoints private to one process
            (the caffe2 style, where each process runs its own node): only
            that process saves them, any process may read them, and neither
            waits on the other processes. Its leaves must live on that
            process's devices. None (the default): every process saves its
            part of every checkpoint together (SPMD).
        options: All the options above (but ``owner_process`` and
            ``keep``) as one :class:`~jaxjob.CheckpointOptions`, instead of
            the keyword arguments.
        keep: Which committed epochs to keep: a policy of :mod:`jaxjob.keep`
            or a list of them (their union); None keeps every epoch. The
            newest committed epoch and the epoch being written are never
            deleted; deletion runs after a newer epoch has committed, on one
            process (process 0, or ``owner_process``), and a failed deletion
            is logged and retried after the next commit.
        local: A :class:`~jaxjob.LocalTier`: a second, per-process tier on
            local disk, saved more often than ``db_prefix`` (the persistent
            tier); the runner resumes from the newer of the two (see the
            docs' "Two tiers" guide). In a multi-process job, make the
            manager on every process: they compare their local directories
            (one exchange).

    The manager writes only while it holds the node's lock
    (``<db_prefix>/.jaxjob/<node>.lock``), taken by
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

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

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
        options: CheckpointOptions | None = None,
        local: LocalTier | None = None,
    ) -> None:
        options = resolve_options(
            options,
            async_save=async_save,
            timeout_s=timeout_s,
            write_timeout_s=write_timeout_s,
            host_map=host_map,
            storage_timeout_s=storage_timeout_s,
        )
        super().__init__(db_prefix, db_type, metadata_handler, options, keep=keep, local=local)
        node_name = check_node_name(node_name)
        self._writer = NodeWriter(
            self._db_prefix,
            node_name,
            options,
            owner_process=check_owner(owner_process),
            required_outputs=self.required_outputs,
            committed=self.committed_epochs,
            on_failure=self._metadata_failed,
        )
        self._exchange_stats = not self._writer.private
        if self._keep:
            self._retention = retention.Retention(self._db_prefix, [node_name], self._keep)

    def _make_local(self, directory: str) -> CheckpointManager:
        """This node's manager over the local ``directory``: this process alone writes it."""
        return CheckpointManager(
            directory,
            self._writer.node_name,
            owner_process=jax.process_index() if jax.process_count() > 1 else None,
            **self._local_kwargs(),
        )

    @classmethod
    def _over(cls, writer: NodeWriter, parent: ManagerCore) -> CheckpointManager:
        """A facade over ``writer``, a node of the multi-node manager ``parent``."""
        view = cls.__new__(cls)
        ManagerCore.__init__(
            view, writer.db_prefix, parent._db_type, parent.metadata_handler, parent.options
        )
        view._writer = writer
        view._exchange_stats = not writer.private
        return view

    def __repr__(self) -> str:
        return f"CheckpointManager({self._db_prefix!r}, node_name={self._writer.node_name!r})"

    @property
    def owner_process(self) -> int | None:
        """The process that alone saves this node, or None (every process)."""
        return self._writer.owner_process

    @property
    def node_managers(self) -> list[tuple[str, CheckpointManager]]:
        """``[(node_name, self)]``: the same shape as a multi-node manager's."""
        return [(self._writer.node_name, self)]

    def node_names(self) -> list[str]:
        """``[node_name]``."""
        return [self._writer.node_name]

    def _own_nodes(self) -> list[str]:
        """``[node_name]``: every node's leaves are saved under it."""
        return [self._writer.node_name]

    def _writers(self) -> list[NodeWriter]:
        return [self._writer]

    def _how(self, epoch: int | None) -> Round:
        node = self._writer.node_name
        what = f"the save of epoch {epoch} of node {node!r}"
        if epoch is None:
            what = f"the end of the saves of node {node!r}"
        spmd = not self._writer.private
        exchange = spmd and (epoch is not None or jax.process_count() > 1)
        return Round(what, keyed=False, exchange=exchange, timeout_s=self.timeout_s)

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

        Takes the node's lock (see the class docstring); call it on every process.

        Raises:
            ValueError: If more than one node is given.
            CheckpointInUseError: If another live process writes this node here.
        """
        if nodes is not None and len(nodes) > 1:
            raise ValueError(
                f"CheckpointManager handles one node, got nodes={list(nodes)}; "
                "use MultiNodeCheckpointManager for several"
            )
        self._writer.take_lock()  # an unwritable db_prefix is reported by the first save
        if retrieve_from_epoch is not None:
            _, found = self._checkpoint(retrieve_from_epoch, path_prefix, path_type)
            self._writer.reader.blob_names = found.state_keys

    def blob_list(self) -> list[str]:
        """Names of the leaves this manager saves and loads.

        Raises:
            RuntimeError: Before ``init(retrieve_from_epoch=...)``, a save or a load.
        """
        names = self._writer.reader.blob_names
        if names is None:
            raise RuntimeError("blob_list() is known only after init from an epoch, save or load")
        return list(names)

    def check_db_exists(self, epoch: int) -> bool:
        """Whether this node's checkpoint of ``epoch`` is committed."""
        path = db_name(check_epoch(epoch), self._writer.node_name, self._db_prefix)
        return is_committed(path)

    def _checkpoint(self, epoch: int, path_prefix: str | None = None, path_type=None):
        if path_type is not None:
            check_db_type(path_type, "path_type")
        return self._writer.reader.checkpoint(epoch, path_prefix or self._path_prefix)

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
        self._loading()
        self._writer.reader.blob_names = found.state_keys
        return self._writer.load(path, found, found.state_keys, targets=targets)

    def _verify_nodes(self, epoch: int, nodes: Sequence[str], *, data: bool = True) -> list[str]:
        """Verifies through this manager's cached manifest and reader when it reads alone."""
        alone = self._writer.private or jax.process_count() == 1
        if list(nodes) != [self._writer.node_name] or not alone:
            return super()._verify_nodes(epoch, nodes, data=data)
        return self._writer.reader.verify(epoch, self._path_prefix, data=data)

    def saved_shapes(self, epoch: int) -> dict[str, Any]:
        """Shapes and dtypes of the leaves saved at ``epoch``, reading no array data."""
        return storage.saved_shapes(self._checkpoint(epoch)[1])

    def saved_targets(self, epoch: int) -> dict[tuple[str, ...], Any] | None:
        """The array state leaves of ``epoch`` with their saved shardings, by key path.

        None if this job's devices differ from the saving job's.
        """
        return storage.saved_targets(*self._checkpoint(epoch))

    def load_outputs(self, epoch: int) -> Workspace:
        """Loads the epoch outputs saved with ``epoch`` for the stop conditions."""
        path, found = self._checkpoint(epoch)
        reader = self._writer.reader
        return Workspace(reader.restore(path, found, found.output_keys, item=storage.OUTPUTS))

    def load_blobs_from_checkpoint(self, blob_names: Iterable[str], epoch: int) -> Workspace:
        """Loads those of ``blob_names`` that this node's checkpoint of ``epoch`` holds."""
        path, found = self._checkpoint(epoch)
        self._loading()
        wanted = [n for n in blob_names if n in found.state]
        return self._writer.load(path, found, wanted)

    def load_blobs_locally(
        self, nodes: Sequence[Any], blob_names: Iterable[str], epoch: int, session: Any
    ) -> bool:
        """Loads ``blob_names`` from this node's checkpoint into ``session.workspace``.

        Returns:
            False, loading nothing, if the checkpoint of ``epoch`` is missing.
        """
        self._loading()  # a load: its stats are exchanged when reported
        if not self.check_db_exists(epoch):
            return False
        loaded = self.load_blobs_from_checkpoint(blob_names, epoch)
        session.workspace = session.workspace.set(loaded)
        return True

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
        self._writer.check_process()
        node = self._writer.node_name
        self._save_round(epoch, {node: (workspace, outputs)})
