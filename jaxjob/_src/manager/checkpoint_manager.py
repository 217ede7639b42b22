"""The checkpoint manager of one node: the manager body over one node writer.

Each epoch goes to ``<db_prefix>/<node_name>.<epoch>/`` through Orbax; the
manager body is :mod:`jaxjob._src.manager.facade`, its tiers
:mod:`jaxjob._src.manager.tier`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.checkpoint.layout import check_node_name, db_name
from jaxjob._src.manager.facade import ManagerCore
from jaxjob._src.manager.local_tier import LocalTier
from jaxjob._src.manager.metadata import MetadataHandler
from jaxjob._src.manager.retention import keep as keep_lib
from jaxjob._src.manager.save.writer import NodeWriter
from jaxjob._src.manager.shared import (
    DEFAULT_WRITE_TIMEOUT_S,
    CheckpointOptions,
    check_owner,
    resolve_options,
)
from jaxjob._src.multihost import hosts

__all__ = ["CheckpointManager", "node_manager"]


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
        max_host_bytes: A host-memory budget in bytes, for a workspace larger
            than the host memory left beside it: restores and resumes read
            the leaves in groups of at most this many bytes, and a save makes
            no copy of the workspace larger than it, so that either stays
            within the workspace plus the budget in resident memory (see
            :class:`~jaxjob.CheckpointOptions`). None: no budget, the fastest.
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
        max_host_bytes: int | None = None,
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
            max_host_bytes=max_host_bytes,
        )
        super().__init__(db_prefix, db_type, metadata_handler, options, keep=keep, local=local)
        node_name = check_node_name(node_name)
        self._persistent.open([node_name], {node_name: check_owner(owner_process)})

    def __repr__(self) -> str:
        return f"CheckpointManager({self.db_prefix!r}, node_name={self.node_names()[0]!r})"

    @property
    def node_managers(self) -> list[tuple[str, CheckpointManager]]:
        """``[(node_name, self)]``: the same shape as a multi-node manager's."""
        return [(self.node_names()[0], self)]

    def node_names(self) -> list[str]:
        """``[node_name]``."""
        return self._persistent.nodes()

    def get_ckpt_db_name(self, node_name: str, epoch: int) -> str:
        """Checkpoint directory of ``node_name`` at ``epoch``."""
        return db_name(epoch, node_name, self.db_prefix)

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
        self._init_writers(retrieve_from_epoch, path_prefix, path_type)

    def load_blobs_locally(
        self, nodes: Sequence[Any], blob_names: Iterable[str], epoch: int, session: Any
    ) -> bool:
        """Loads ``blob_names`` from this node's checkpoint into ``session.workspace``.

        Returns:
            False, loading nothing, if the checkpoint of ``epoch`` is missing.
        """
        self._persistent.loading()  # a load: its stats are exchanged when reported
        if not self.check_db_exists(epoch):
            return False
        loaded = self.load_blobs_from_checkpoint(blob_names, epoch)
        session.workspace = session.workspace.set(loaded)
        return True


def node_manager(writer: NodeWriter, parent: ManagerCore) -> CheckpointManager:
    """A single-node manager over ``writer``, one node of the multi-node manager ``parent``.

    It shares the writer (its lock, its reader, its save in flight) and the
    parent's options and metadata handler.
    """
    view = CheckpointManager.__new__(CheckpointManager)
    ManagerCore.__init__(
        view, writer.db_prefix, "orbax", parent.metadata_handler, parent.options, writers=[writer]
    )
    return view
