"""Checkpointing several logical nodes: the manager body over one node writer per node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.checkpoint.layout import check_node_name, db_name
from jaxjob._src.core.session import Session
from jaxjob._src.core.task import Node
from jaxjob._src.manager.checkpoint_manager import CheckpointManager, node_manager
from jaxjob._src.manager.facade import ManagerCore
from jaxjob._src.manager.local_tier import LocalTier
from jaxjob._src.manager.metadata import MetadataHandler
from jaxjob._src.manager.retention import keep as keep_lib
from jaxjob._src.manager.shared import (
    DEFAULT_WRITE_TIMEOUT_S,
    CheckpointOptions,
    check_owner,
    resolve_options,
)
from jaxjob._src.multihost import hosts

__all__ = ["MultiNodeCheckpointManager"]

logger = get_logger(__name__)


class MultiNodeCheckpointManager(ManagerCore):
    """Saves and loads every node of a job: one node writer, and one checkpoint, per node.

    Node ``n``'s checkpoint of epoch ``e`` is ``<db_prefix>/<n>.<e>/`` and holds
    the leaves that ``n``'s init tasks created. Stats of every node are
    reported together, so you can see which node's save dominates.

    Args:
        db_prefix: Directory holding every node's checkpoints.
        db_type: Storage type; only ``"orbax"``.
        metadata_handler: Decides the resume epoch (by default the latest
            epoch committed for every node) and receives the stats.
        async_save: False makes saves return only once committed.
        timeout_s: How long any wait on other processes may take (see
            :class:`~jaxjob.CheckpointManager`).
        write_timeout_s: How long a background write may take (see
            :class:`~jaxjob.CheckpointManager`).
        host_map: How to resume host-local leaves on another process count
            (see :class:`~jaxjob.CheckpointManager`).
        storage_timeout_s: How long an object-store operation may take (see
            :class:`~jaxjob.CheckpointManager`).
        max_host_bytes: A host-memory budget for saves and restores (see
            :class:`~jaxjob.CheckpointOptions`).
        node_processes: The caffe2 style across processes: ``{node: process}``
            for nodes whose checkpoints one process alone saves (each process
            runs its own :class:`~jaxjob.Node`). A process saves and
            resumes only its own nodes (and those not listed, which every
            process saves together); :meth:`load_blobs_locally` reads every
            node's checkpoint on the calling process alone. A save failure of
            any process's node is raised (or logged) on every process.
        keep: Which committed epochs to keep (see
            :class:`~jaxjob.CheckpointManager`); an epoch is
            deleted for every node together, by process 0 (by the nodes' owner
            when ``node_processes`` gives them all to one process).
        options: The options above but ``node_processes`` and ``keep`` as
            one :class:`~jaxjob.CheckpointOptions`.
        local: A :class:`~jaxjob.LocalTier`: a per-process local copy of
            every node, saved more often than ``db_prefix`` (see
            :class:`~jaxjob.CheckpointManager`).

    Each node's writer takes that node's lock (see :class:`~jaxjob.CheckpointManager`);
    the processes agree on every node's save in one exchange.

    Example:
        >>> import tempfile, jax.numpy as jnp, jaxjob
        >>> ckpt = jaxjob.MultiNodeCheckpointManager(tempfile.mkdtemp())
        >>> ckpt.init(["a", "b"], key_nodes={"x": "a", "y": "b"})
        >>> ckpt.save(0, jaxjob.Workspace({"x": jnp.zeros(2), "y": jnp.ones(2)}))
        >>> ckpt.wait_until_finished()
        >>> sorted(ckpt.load(0)), ckpt.get_ckpt_db_name("b", 0).endswith("/b.0")
        (['x', 'y'], True)
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def __init__(
        self,
        db_prefix: str,
        db_type: str = "orbax",
        metadata_handler: MetadataHandler | None = None,
        *,
        async_save: bool = True,
        timeout_s: float = hosts.DEFAULT_TIMEOUT_S,
        write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
        host_map: HostMap | None = None,
        storage_timeout_s: float | None = None,
        max_host_bytes: int | None = None,
        node_processes: Mapping[str, int] | None = None,
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
        super().__init__(
            db_prefix, db_type, metadata_handler, options, keep=keep, local=local, keyed=True
        )
        self._node_processes = {str(k): check_owner(v) for k, v in (node_processes or {}).items()}
        self._node_managers: list[tuple[str, CheckpointManager]] | None = None

    def __repr__(self) -> str:
        return f"MultiNodeCheckpointManager({self.db_prefix!r})"

    @property
    def node_managers(self) -> list[tuple[str, CheckpointManager]]:
        """``(node_name, CheckpointManager)`` pairs, in the job's node order.

        Raises:
            RuntimeError: Before :meth:`init`.
        """
        if self._node_managers is None:
            raise RuntimeError("MultiNodeCheckpointManager: call init(nodes) first")
        return list(self._node_managers)

    def node_names(self) -> list[str]:
        """The job's node names, in order."""
        return [n for n, _ in self.node_managers]

    def _make_writers(self, nodes: Sequence[Any]) -> None:
        names = [check_node_name(n.name if isinstance(n, Node) else n) for n in nodes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"nodes {names} name {twice} more than once: two managers would write the "
                "same checkpoint directories; give each node once"
            )
        if self._node_managers is not None:
            current = self.node_names()
            if current != names:
                raise ValueError(
                    f"this MultiNodeCheckpointManager was initialised with nodes {current}, "
                    f"got nodes {names}; use a new manager for another job"
                )
            return
        self._persistent.open(names, self._node_processes)
        self._node_managers = [
            (w.node_name, node_manager(w, self)) for w in self._persistent.writers
        ]

    def init(
        self,
        nodes: Sequence[Any],
        retrieve_from_epoch: int | None = None,
        path_prefix: str | None = None,
        path_type: str | None = None,
        *,
        key_nodes: Mapping[str, str] | None = None,
    ) -> None:
        """Makes one node writer per node; again with the same nodes is a no-op.

        Args:
            nodes: The job's nodes, in order.
            retrieve_from_epoch: Read each node's leaf names from this epoch.
            path_prefix: Read checkpoints from ``path_prefix + "<node>.<epoch>"``.
            path_type: Storage type of that path; only ``"orbax"``.
            key_nodes: Which node owns each persistent name (the session's
                ``key_nodes`` after the init group ran).

        Raises:
            ValueError: If called again with different nodes.
        """
        first = self._node_managers is None
        self._make_writers(nodes)
        if key_nodes:
            self._persistent.key_nodes.update(key_nodes)
        if first or retrieve_from_epoch is not None:
            self._init_writers(retrieve_from_epoch, path_prefix, path_type)

    def get_ckpt_db_name(self, node_name: str, epoch: int) -> str:
        """Checkpoint directory of ``node_name`` at ``epoch``.

        Raises:
            KeyError: If ``node_name`` is not one of this manager's nodes.
        """
        names = self.node_names()
        if str(node_name) not in names:
            raise KeyError(f"node {node_name!r} is not one of this manager's nodes {names}")
        return db_name(epoch, str(node_name), self.db_prefix)

    def load_blobs_locally(
        self, nodes: Sequence[Any], blob_names: Iterable[str], epoch: int, session: Session
    ) -> bool:
        """Loads ``blob_names`` from every node's checkpoint into ``session.workspace``.

        A name a node's checkpoint lacks is skipped there.

        Returns:
            False, loading nothing, if some node's checkpoint of ``epoch`` is missing.

        Raises:
            KeyError: If no node's checkpoint holds a requested name.
        """
        self._make_writers(nodes)
        self._persistent.loading()  # a load: its stats are exchanged when reported
        if not self.check_db_exists(epoch):
            missing = [n for n, m in self.node_managers if not m.check_db_exists(epoch)]
            logger.info("Checkpoints of nodes %s at epoch %d do not exist", missing, epoch)
            return False
        names = list(blob_names)
        loaded = self.load_blobs_from_checkpoint(names, epoch)
        absent = [n for n in names if n not in loaded]
        if absent:
            raise KeyError(f"no node's checkpoint of epoch {epoch} holds {absent}")
        session.workspace = session.workspace.set(loaded)
        logger.info("Loaded %s from the checkpoints of epoch %d", names, epoch)
        return True
