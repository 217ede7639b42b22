"""One tier of a manager: its node writers under one directory, saved, finished and listed together.

A manager has a persistent tier (its ``db_prefix``) and, made with
``local=``, a local one (:class:`~jaxjob._src.manager.local_copy.LocalCopy`,
a :class:`Tier` too). A tier holds its node writers
(:class:`~jaxjob._src.manager.save.writer.NodeWriter`, one per node), its
retention, its metadata record
(:class:`~jaxjob._src.manager.metadata.MetadataRecord`) and the run and life
its checkpoints record. It runs their save and end rounds
(:mod:`jaxjob._src.manager.save.save_round`); its
:class:`~jaxjob._src.manager.tier_reader.TierReader` reads them back.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from jaxjob._src.base.errors import CheckpointSaveError, with_earlier
from jaxjob._src.checkpoint import manifest
from jaxjob._src.checkpoint.layout import check_epoch, common_epochs, is_committed
from jaxjob._src.manager import retention
from jaxjob._src.manager.metadata import MetadataRecord
from jaxjob._src.manager.retention import keep as keep_lib
from jaxjob._src.manager.save import boundary, save_round
from jaxjob._src.manager.save.save_round import Round
from jaxjob._src.manager.save.supersede import deleting_process
from jaxjob._src.manager.save.writer import NodeWriter
from jaxjob._src.manager.shared import CheckpointOptions
from jaxjob._src.manager.tier_reader import TierReader

__all__ = ["Tier"]


class Tier:
    """One tier of a manager: the node writers of one directory and what they share.

    Args:
        name: ``"persistent"`` or ``"local"``.
        db_prefix: Its normalized directory.
        options: The manager's options (the local tier's: without ``host_map``).
        metadata: Its metadata record (a null handler's for the local tier).
        keep: Its retention policies (normalized), or None: every epoch is kept.
        keyed: A multi-node tier: its rounds post ``{node: post}``, a save splits
            the workspace by ``key_nodes``, and a load reads this process's own
            nodes and those every process shares.
        alone: This process alone takes part in its rounds (a local tier).
        key_nodes: Which node owns each leaf name (the manager's, shared by its tiers).

    Attributes:
        path_prefix: Where its checkpoints are read from, if not ``db_prefix``.
        life: ``(life id, epoch it resumed from)`` that its checkpoints record.
        run: The run id its checkpoints record; None: that of ``db_prefix``.
        tagged: Its stats carry ``"tier": name`` (a manager of two tiers).
        reader: Reads its checkpoints back.
    """

    def __init__(
        self,
        name: str,
        db_prefix: str,
        options: CheckpointOptions,
        metadata: MetadataRecord,
        *,
        keep: tuple[keep_lib.Policy, ...] | None,
        keyed: bool,
        alone: bool = False,
        key_nodes: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.db_prefix = db_prefix
        self.options = options
        self.metadata = metadata
        self.keep = keep
        self.keyed = keyed
        self.alone = alone
        self.key_nodes = {} if key_nodes is None else key_nodes
        self.path_prefix: str | None = None
        self.life: tuple[str, int | None] = (uuid.uuid4().hex, None)
        self.run: str | None = None
        self.tagged = False
        self.reader = TierReader(self)
        self._writers: list[NodeWriter] = []
        self._retention: retention.Retention | None = None
        self._keep_all = retention.KeepAllNotice(db_prefix) if keep is None else None
        # the last save round's stats; every save and load (alike on every process) resets them
        self._round_stats: tuple[Any, ...] | None = None

    def __repr__(self) -> str:
        return f"<jaxjob tier {self.name!r} of {self.db_prefix!r}>"

    @property
    def required_outputs(self) -> tuple[str, ...]:
        """Epoch-group outputs to pass to :meth:`save`: what ``keep`` ranks by."""
        return keep_lib.metric_names(self.keep)

    @property
    def writers(self) -> list[NodeWriter]:
        """Its node writers, in node order (none before a multi-node manager's ``init``)."""
        return list(self._writers)

    @property
    def failures(self) -> list[CheckpointSaveError]:
        """Every save failure recorded on this process, node by node, in order."""
        return [f for w in self.writers for f in w.failures]

    def nodes(self) -> list[str]:
        """The node names of its writers, in order."""
        return [w.node_name for w in self.writers]

    def open(self, nodes: Sequence[str], owners: Mapping[str, int | None]) -> None:
        """Makes one writer per node of ``nodes`` (``owners``: a node's owner process, if any)."""
        self.adopt(
            [
                NodeWriter(
                    self.db_prefix,
                    name,
                    self.options,
                    owner_process=owners.get(name),
                    required_outputs=self.required_outputs,
                    committed=lambda name=name: self.committed_epochs([name]),
                    on_failure=self.metadata.failed,
                )
                for name in nodes
            ]
        )

    def adopt(self, writers: Sequence[NodeWriter]) -> None:
        """Makes ``writers`` this tier's (and their epochs subject to its retention)."""
        self._writers = list(writers)
        for writer in self._writers:
            writer.tier = self.name  # its manifests say so
        self._retention = None
        if self.keep:
            nodes = [w.node_name for w in self._writers]
            self._retention = retention.Retention(self.db_prefix, nodes, self.keep)

    def set_lineage(self, life: str, resumed_from: int | None) -> None:
        """Names the life (attempt) whose saves follow, and the epoch it resumed from.

        Every later checkpoint's manifest records them. The runner calls it on
        every process with the same ``life`` (process 0's); a manager used
        without a runner is one life of its own.
        """
        self.life = (life, resumed_from)

    def committed_epochs(self, nodes: Sequence[str] | None = None) -> list[int]:
        """Epochs committed for every node of ``nodes`` (default: its writers'), ascending."""
        return common_epochs(self.db_prefix, list(nodes or self.nodes()), self.path_prefix)

    def has_pending(self) -> bool:
        """Whether a save of this process is in flight."""
        return any(w.has_pending() for w in self.writers)

    def save(
        self, epoch: int, workspace: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None
    ) -> None:
        """Saves ``workspace`` as ``epoch``: one save round, then the metadata record and retention.

        Raises:
            This save's problem on any process, else a previous save's failure
            (see :meth:`jaxjob.CheckpointManager.save`).
        """
        items = self._items(epoch, workspace, outputs)
        writers = self.writers
        for writer in writers:
            writer.lineage = self.life
            writer.run = self.run or writer.run
        self._round_stats = None
        outcome = save_round.save_round(
            writers, epoch, items, self.how(epoch), accessible=self.metadata.take_access()
        )
        self._round_stats = outcome.stats
        if self._keep_all is not None and outcome.stats is not None:
            self._keep_all.saved(sum(s.bytes or 0 for p in outcome.stats for s in p.stats.values()))
        self.metadata.flush(self.in_flight(), committed=outcome.previous is None)
        pending = [w.pending_epoch() for w in writers if w.has_pending()]
        self._retain(writing=pending[0] if pending else epoch)  # in flight, or others write it
        if outcome.current is not None:
            raise with_earlier(outcome.current, outcome.previous)
        if outcome.previous is not None:
            raise outcome.previous

    def _items(self, epoch: int, workspace: Mapping[str, Any], outputs: Mapping[str, Any] | None):
        """``{node: (leaves, outputs)}`` of the nodes this process saves."""
        if not self.keyed:
            (writer,) = self.writers
            writer.check_process()
            return {writer.node_name: (workspace, outputs)}
        check_epoch(epoch)
        for name in [*workspace, *(outputs or {})]:  # before any node's save is prepared
            manifest.check_name(name)
        nodes = self.nodes()
        own = [w.node_name for w in self.writers if w.own]

        def owner(key: str) -> str:
            node = self.key_nodes.get(key, nodes[0])
            return node if node in nodes else nodes[0]

        return {
            node: (
                {k: v for k, v in workspace.items() if owner(k) == node},
                outputs if node == own[0] else None,
            )
            for node in own
        }

    def how(self, epoch: int | None) -> Round:
        """How the processes take part in the save round of ``epoch`` (None: the end round)."""
        nodes = self.nodes()
        if self.keyed:
            what = f"the save of epoch {epoch} of nodes {nodes}"
            what = what if epoch is not None else "the end of the node saves"
        else:
            what = f"the save of epoch {epoch} of node {nodes[0]!r}"
            what = what if epoch is not None else f"the end of the saves of node {nodes[0]!r}"
        exchange = self._spmd() and (epoch is not None or jax.process_count() > 1)
        return Round(what, keyed=self.keyed, exchange=exchange, timeout_s=self.options.timeout_s)

    def _spmd(self) -> bool:
        """Whether every process takes part in its rounds (not one process's own node or tier)."""
        return not self.alone and (self.keyed or not self.writers[0].private)

    def in_flight(self) -> list[int | None]:
        """Each writer's epoch in flight (None: none)."""
        return [w.pending_epoch() for w in self.writers]

    def _retain(self, writing: int | None) -> None:
        """Applies ``keep`` to every node together, on the deleting process; never raises."""
        owners = [w.owner_process for w in self.writers]
        if self._retention is not None and jax.process_index() == deleting_process(owners):
            self._retention.apply(writing=writing)

    def wait_until_finished(self) -> None:
        """Blocks until its saves in flight are committed (a round of every process taking part).

        Raises:
            CheckpointSaveError: The first failure, on any process and node.
            HostTimeoutError: If another process does not arrive in time.
        """
        writers = self.writers
        if not writers:
            return
        failure = save_round.end_round(writers, self.how(None))
        self.metadata.flush(self.in_flight(), committed=failure is None)
        self._retain(writing=None)
        if failure is not None:
            raise failure

    def finish(self) -> list[CheckpointSaveError]:
        """Completes this process's saves in flight, waiting on no other process.

        Returns:
            Their failures (recorded, not raised).
        """
        finished = [w.finish() for w in self.writers if w.own]
        failures = [f for f in finished if f is not None]
        self.metadata.flush(self.in_flight(), committed=not failures)
        return failures

    def flush_committed_metadata(self) -> None:
        """Writes the deferred metadata record once its save is committed, without waiting.

        Between persistent saves (local-tier epochs) the persistent save in
        flight is not waited for; its record is written as soon as its commit
        marker is there, so that a kill before the next persistent save still
        resumes from it.
        """
        due = self.metadata.due
        writers = self.writers
        if any(w.private for w in writers):  # another process's node: its commit is its own
            return
        writers = [w for w in writers if w.pending_epoch() == due]
        if due is not None and all(is_committed(w.pending_path()) for w in writers):
            self.metadata.due = None
            self.metadata.write(due)

    def take_metadata_failures(self) -> list[CheckpointSaveError]:
        """The metadata records that failed since the last call (each a save failure), oldest first.

        The runner hands each to its ``on_save_error`` policy.
        """
        return self.metadata.take_failures()

    def last_stats(self) -> dict[str, Any]:
        """Each writer's last action's stats, by checkpoint directory."""
        return {w.last[0]: w.last[1] for w in self.writers if w.last is not None}

    def loading(self) -> None:
        """Marks a load (on every process alike): its stats are exchanged when reported."""
        self._round_stats = None

    def report_stats(self, action_name: str) -> None:
        """Sends every process's stats of its last action to the metadata handler.

        A save's stats came with its round's exchange, so reporting them waits
        on no other process; a load's are exchanged here (see
        :meth:`jaxjob.CheckpointManager.report_checkpoint_stats`). A tier of
        this process alone (the local one) reports this process's stats, if
        any, waiting on no other process.
        """
        mine = self.last_stats()
        agreed, self._round_stats = self._round_stats, None
        if self.alone:  # this process's own tier: its own stats, if it has any
            if not mine:
                return
            stats = boundary.gather_stats(mine, self.options.timeout_s, exchange=False)
        elif agreed is not None:
            stats = boundary.merge_stats(agreed, mine)
        else:
            exchange = not self.writers or self._spmd()
            stats = boundary.gather_stats(mine, self.options.timeout_s, exchange=exchange)
        for entry in stats.values() if self.tagged else ():
            entry["tier"] = self.name
        self.metadata.handler.report(action_name, stats)

    def close(self) -> None:
        """Waits for its saves in flight, then releases Orbax's resources and the locks."""
        try:
            self.wait_until_finished()
        finally:
            for writer in self.writers:
                writer.close()
