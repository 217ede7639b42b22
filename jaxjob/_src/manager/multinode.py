"""Checkpointing several logical nodes: a facade over one node writer per node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax

from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import manifest
from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.checkpoint.layout import check_epoch, check_node_name, db_name
from jaxjob._src.core.session import Session
from jaxjob._src.core.task import Node
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.manager import keep as keep_lib
from jaxjob._src.manager import retention
from jaxjob._src.manager.checkpoint_manager import CheckpointManager
from jaxjob._src.manager.facade import ManagerCore
from jaxjob._src.manager.local_tier import LocalTier
from jaxjob._src.manager.metadata import MetadataHandler
from jaxjob._src.manager.save_round import Round
from jaxjob._src.manager.shared import (
    DEFAULT_WRITE_TIMEOUT_S,
    CheckpointOptions,
    check_owner,
    resolve_options,
)
from jaxjob._src.manager.writer import NodeWriter
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
        )
        super().__init__(db_prefix, db_type, metadata_handler, options, keep=keep, local=local)
        self._node_processes = {str(k): check_owner(v) for k, v in (node_processes or {}).items()}
        self._node_writers: list[NodeWriter] | None = None
        self._node_managers: list[tuple[str, CheckpointManager]] = []
        self._key_nodes: dict[str, str] = {}
        self._alone = False  # a local tier's manager: this process alone takes part

    def __repr__(self) -> str:
        return f"MultiNodeCheckpointManager({self._db_prefix!r})"

    def _make_local(self, directory: str) -> MultiNodeCheckpointManager:
        """Every node's manager over the local ``directory``: this process alone writes it."""
        nodes = self.node_names()
        local = MultiNodeCheckpointManager(
            directory,
            node_processes=(
                dict.fromkeys(nodes, jax.process_index()) if jax.process_count() > 1 else None
            ),
            **self._local_kwargs(),
        )
        local._alone = True  # one process's local tier: its rounds exchange nothing
        local.init(nodes, key_nodes=self._key_nodes)
        return local

    @property
    def node_managers(self) -> list[tuple[str, CheckpointManager]]:
        """``(node_name, CheckpointManager)`` pairs, in the job's node order.

        Raises:
            RuntimeError: Before :meth:`init`.
        """
        if self._node_writers is None:
            raise RuntimeError("MultiNodeCheckpointManager: call init(nodes) first")
        return list(self._node_managers)

    def node_names(self) -> list[str]:
        """The job's node names, in order."""
        return [n for n, _ in self.node_managers]

    def _writers(self) -> list[NodeWriter]:
        return list(self._node_writers or [])

    def _how(self, epoch: int | None) -> Round:
        what = f"the save of epoch {epoch} of nodes {self.node_names()}"
        if epoch is None:
            what = "the end of the node saves"
        exchange = not self._alone and (epoch is not None or jax.process_count() > 1)
        return Round(what, keyed=True, exchange=exchange, timeout_s=self.timeout_s)

    def _make_managers(self, nodes: Sequence[Any]) -> None:
        names = [check_node_name(n.name if isinstance(n, Node) else n) for n in nodes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"nodes {names} name {twice} more than once: two managers would write the "
                "same checkpoint directories; give each node once"
            )
        if self._node_writers is not None:
            current = [w.node_name for w in self._node_writers]
            if current != names:
                raise ValueError(
                    f"this MultiNodeCheckpointManager was initialised with nodes {current}, "
                    f"got nodes {names}; use a new manager for another job"
                )
            return
        self._node_writers = [
            NodeWriter(
                self._db_prefix,
                name,
                self.options,
                owner_process=self._node_processes.get(name),
                required_outputs=self.required_outputs,
                committed=lambda name=name: self._committed(name),
                on_failure=self._metadata_failed,
            )
            for name in names
        ]
        self._node_managers = [
            (w.node_name, CheckpointManager._over(w, self)) for w in self._node_writers
        ]
        if self._keep:
            self._retention = retention.Retention(self._db_prefix, names, self._keep)

    def init(
        self,
        nodes: Sequence[Any],
        retrieve_from_epoch: int | None = None,
        path_prefix: str | None = None,
        path_type: str | None = None,
        *,
        key_nodes: Mapping[str, str] | None = None,
    ) -> None:
        """Creates one manager per node; again with the same nodes is a no-op.

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
        first = self._node_writers is None
        self._make_managers(nodes)
        if key_nodes:
            self._key_nodes.update(key_nodes)
        if first or retrieve_from_epoch is not None:
            for name, manager in self.node_managers:
                manager.init([name], retrieve_from_epoch, path_prefix, path_type)
                if retrieve_from_epoch is not None:
                    self._key_nodes.update(dict.fromkeys(manager.blob_list(), name))

    def blob_list(self) -> list[str]:
        """Names of the leaves saved for every node."""
        return [n for _, m in self.node_managers for n in m.blob_list()]

    def get_ckpt_db_name(self, node_name: str, epoch: int) -> str:
        """Checkpoint directory of ``node_name`` at ``epoch``.

        Raises:
            KeyError: If ``node_name`` is not one of this manager's nodes.
        """
        names = [n for n, _ in self.node_managers]
        if str(node_name) not in names:
            raise KeyError(f"node {node_name!r} is not one of this manager's nodes {names}")
        return db_name(epoch, str(node_name), self._db_prefix)

    def check_db_exists(self, epoch: int) -> bool:
        """Whether every node's checkpoint of ``epoch`` is committed."""
        return all(m.check_db_exists(epoch) for _, m in self.node_managers)

    def load(
        self,
        epoch: int,
        path_prefix: str | None = None,
        path_type: str | None = None,
        *,
        targets: Mapping[str, Any] | None = None,
    ) -> Workspace:
        """Loads and merges every node's checkpoint of ``epoch`` (private nodes: its own)."""
        merged: dict[str, Any] = {}
        self._loading()
        for name, manager in self._own_managers():
            ws = manager.load(epoch, path_prefix, path_type, targets=targets)
            self._key_nodes.update(dict.fromkeys(ws, name))
            merged.update(ws)
        return Workspace(merged)

    def saved_shapes(self, epoch: int) -> dict[str, Any]:
        """Shapes and dtypes of the leaves saved at ``epoch`` of the nodes :meth:`load` reads."""
        merged: dict[str, Any] = {}
        for _, manager in self._own_managers():
            merged.update(manager.saved_shapes(epoch))
        return merged

    def saved_targets(self, epoch: int) -> dict[tuple[str, ...], Any] | None:
        """The array leaves of ``epoch`` that :meth:`load` reads, saved shardings, by key path.

        None if any node's checkpoint was saved on other devices.
        """
        merged: dict[tuple[str, ...], Any] = {}
        for _, manager in self._own_managers():
            found = manager.saved_targets(epoch)
            if found is None:
                return None
            merged.update(found)
        return merged

    def load_outputs(self, epoch: int) -> Workspace:
        """Loads the stop-condition outputs saved with ``epoch`` by the nodes ``load`` reads."""
        merged: dict[str, Any] = {}
        for _, manager in self._own_managers():
            merged.update(manager.load_outputs(epoch))
        return Workspace(merged)

    def load_blobs_from_checkpoint(self, blob_names: Iterable[str], epoch: int) -> Workspace:
        """Loads ``blob_names`` from every node's checkpoint of ``epoch`` that holds them."""
        names = list(blob_names)
        merged: dict[str, Any] = {}
        self._loading()
        for _, manager in self.node_managers:
            merged.update(manager.load_blobs_from_checkpoint(names, epoch))
        return Workspace(merged)

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
        self._make_managers(nodes)
        self._loading()  # a load: its stats are exchanged when reported
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

    def _own_managers(self) -> list[tuple[str, CheckpointManager]]:
        """The nodes this process saves and resumes: its own and those every process shares."""
        me = jax.process_index()
        return [(n, m) for n, m in self.node_managers if m.owner_process in (None, me)]

    def _owner(self, name: str) -> str:
        nodes = [n for n, _ in self.node_managers]
        owner = self._key_nodes.get(name, nodes[0])
        return owner if owner in nodes else nodes[0]

    def save(
        self, epoch: int, workspace: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None
    ) -> None:
        """Starts saving each node's leaves of ``workspace`` into its own checkpoint.

        The processes agree on every node's save in one exchange (see
        :meth:`CheckpointManager.save <jaxjob.CheckpointManager.save>`); if
        one node's cannot start on some process, no node's starts.

        Raises:
            CheckpointSaveError: If this epoch's save cannot start (also for
                an unwritable prefix, or :meth:`cp_accessible` False, here), or (after
                this epoch's saves have started) the first failure of a
                previous async save.
        """
        check_epoch(epoch)
        for name in [*workspace, *(outputs or {})]:  # before any node's save is prepared
            manifest.check_name(name)
        own = [w.node_name for w in self._writers() if w.own]
        items = {
            name: (
                {k: v for k, v in workspace.items() if self._owner(k) == name},
                outputs if name == own[0] else None,
            )
            for name in own
        }
        self._save_round(epoch, items)
