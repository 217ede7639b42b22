"""What both checkpoint managers share: a facade over node writers.

:class:`~jaxjob.CheckpointManager` is a facade over one
:class:`~jaxjob._src.manager.writer.NodeWriter`,
:class:`~jaxjob.MultiNodeCheckpointManager` over one per node; both build on
:class:`ManagerCore`, which runs their save rounds
(:mod:`jaxjob._src.manager.save_round`), the metadata handler plumbing, the
stats, retention and the resume decision.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from jaxjob._src.base import fs
from jaxjob._src.base.errors import (
    CheckpointInUseError,
    CheckpointSaveError,
    CorruptCheckpointError,
    as_save_error,
    with_earlier,
)
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import run_identity, verify
from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.checkpoint.layout import common_epochs, db_name, is_committed
from jaxjob._src.manager import boundary, retention, save_round
from jaxjob._src.manager import keep as keep_lib
from jaxjob._src.manager.local_copy import LocalCopy, LocalMetadata
from jaxjob._src.manager.local_tier import LOCAL, PERSISTENT, LocalTier, check_placement
from jaxjob._src.manager.metadata import METADATA_FILE, DiskMetadataHandler, MetadataHandler
from jaxjob._src.manager.records import ProcessStats, Stats
from jaxjob._src.manager.save_round import Round
from jaxjob._src.manager.shared import CheckpointOptions, check_db_type
from jaxjob._src.manager.supersede import deleting_process
from jaxjob._src.manager.writer import NodeWriter

__all__ = ["ManagerCore"]

logger = get_logger(__name__)


class ManagerCore:
    """The facade both managers share over their node writers.

    It holds the options, the metadata handler plumbing, the stats, the
    resume decision, retention and the save and end rounds. Subclasses
    provide :meth:`node_names`, :meth:`_writers` (this manager's
    :class:`~jaxjob._src.manager.writer.NodeWriter` s, in node order) and
    :meth:`_how` (how the processes take part in a round).
    """

    _exchange_stats = True

    def __init__(
        self,
        db_prefix: str,
        db_type: str,
        metadata_handler: MetadataHandler | None,
        options: CheckpointOptions,
        *,
        keep: keep_lib.Policy | Sequence[keep_lib.Policy] | None = None,
        local: LocalTier | None = None,
    ) -> None:
        self._keep = keep_lib.normalize(keep)
        if local is not None and not isinstance(local, LocalTier):
            raise TypeError(f"local must be a jaxjob.LocalTier or None, got {local!r}")
        self._db_prefix = fs.normalize(db_prefix, "db_prefix")
        check_placement(local, self._db_prefix, timeout_s=options.timeout_s)
        if options.storage_timeout_s is not None:
            fs.set_storage_timeout(self._db_prefix, options.storage_timeout_s)
        on_disk = not fs.is_remote(self._db_prefix)
        if on_disk and fs.exists(self._db_prefix) and not fs.is_dir(self._db_prefix):
            raise NotADirectoryError(
                f"db_prefix {self._db_prefix!r} is a file, not a directory; pass the "
                "directory that holds (or will hold) the checkpoints"
            )
        self._db_type = check_db_type(db_type, "db_type")
        self._metadata_handler = metadata_handler or DiskMetadataHandler()
        self.options = options
        self._path_prefix: str | None = None
        self._path_type: str | None = None
        self._metadata_due: int | None = None
        self._metadata_failures: list[CheckpointSaveError] = []
        self._nodes: list[str] = []
        # the last save round's stats; every save and load call (alike on every process) resets it
        self._round_stats: tuple[ProcessStats, ...] | None = None
        self._accessible = True  # the metadata handler's answer for the next save
        self._retention: retention.Retention | None = None
        self._keep_all = retention.KeepAllNotice(self._db_prefix) if self._keep is None else None
        self._local = None if local is None else LocalCopy(local, self._db_prefix, self._make_local)
        self._lineage: tuple[str, int | None] = (uuid.uuid4().hex, None)  # see set_lineage

    @property
    def db_prefix(self) -> str:
        """The directory holding the checkpoints (normalized: absolute, or a bucket URL)."""
        return self._db_prefix

    @property
    def required_outputs(self) -> tuple[str, ...]:
        """Epoch-group outputs the runner passes to :meth:`save`: what ``keep`` ranks by."""
        return keep_lib.metric_names(self._keep)

    @property
    def timeout_s(self) -> float:
        """How long a wait on the other processes may take."""
        return self.options.timeout_s

    @property
    def host_map(self) -> HostMap | None:
        """How host-local leaves are resumed on another process count."""
        return self.options.host_map

    @property
    def metadata_handler(self) -> MetadataHandler:
        """The handler deciding resume epochs and receiving stats."""
        return self._metadata_handler

    def node_names(self) -> list[str]:
        """The names of the nodes whose checkpoints this manager handles."""
        raise NotImplementedError

    def _writers(self) -> list[NodeWriter]:
        """This manager's node writers, in node order (empty before a multi-node ``init``)."""
        raise NotImplementedError

    def _how(self, epoch: int | None) -> Round:
        """How the processes take part in the save round of ``epoch`` (None: the end round)."""
        raise NotImplementedError

    def has_pending(self) -> bool:
        """Whether a save of this process is in flight (to either tier)."""
        local = self._local_manager()
        return any(w.has_pending() for w in self._writers()) or bool(local and local.has_pending())

    @property
    def failures(self) -> list[CheckpointSaveError]:
        """Every save failure recorded on this process, node by node, in order (persistent tier)."""
        return [f for w in self._writers() for f in w.failures]

    # ---- the local tier ---------------------------------------------------------------------

    @property
    def local_tier(self) -> LocalTier | None:
        """The local tier's settings (``local=``), or None: one tier."""
        return None if self._local is None else self._local.tier

    def _make_local(self, directory: str) -> ManagerCore:
        """A manager of this kind over this process's local ``directory`` (this process alone)."""
        raise NotImplementedError

    def _local_kwargs(self) -> dict[str, Any]:
        """What a manager of this process's local tier is made with, whatever its kind."""
        tier = self.local_tier
        return {
            "metadata_handler": LocalMetadata(),
            "keep": tier.keep if tier is not None else None,
            "options": dataclasses.replace(self.options, host_map=None, storage_timeout_s=None),
        }

    def _local_manager(self) -> ManagerCore | None:
        """The manager of this process's local tier, if it was made."""
        return None if self._local is None else self._local._manager

    def tier_manager(self, tier: str) -> ManagerCore:
        """The manager reading ``tier``: this one (``"persistent"``), or the local one."""
        if tier == PERSISTENT:
            return self
        if tier != LOCAL or self._local is None:
            raise ValueError(f"this manager has no tier {tier!r}; it has {self.tiers()}")
        return self._local.manager

    def tiers(self) -> list[str]:
        """``["persistent"]``, or ``["persistent", "local"]`` with a local tier."""
        return [PERSISTENT] if self._local is None else [PERSISTENT, LOCAL]

    def save_local(
        self, epoch: int, workspace: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None
    ) -> None:
        """Saves ``epoch`` to this process's local tier, waiting on no other process.

        The checkpoint holds this process's shards and host-local leaves; it
        is committed atomically and durably (asynchronously, like
        :meth:`save`). Its stats go to the metadata handler
        (``"checkpoint_save"``, ``"tier": "local"``).

        Raises:
            ValueError: If this manager has no local tier.
            CheckpointSaveError: This save's problem, or a previous local save's failure.
            CheckpointInUseError: If another live process writes this local directory.
        """
        if self._local is None:
            raise ValueError("save_local needs a manager made with local=jaxjob.LocalTier(...)")
        self._flush_committed_metadata()
        try:
            self._local.save(epoch, workspace, outputs, lineage=self._lineage)
        finally:
            self.report_local_stats("checkpoint_save")

    def report_local_stats(self, action_name: str) -> None:
        """Sends this process's stats of its last local-tier action to the metadata handler.

        Each entry has ``"tier": "local"``; no other process is waited on.
        """
        local = self._local_manager()
        mine = local._last_stats() if local is not None else {}
        if mine:
            stats = boundary.gather_stats(mine, self.timeout_s, exchange=False)
            for entry in stats.values():
                entry["tier"] = LOCAL
            self._metadata_handler.report(action_name, stats)

    def forget_local_after(self, epoch: int | None) -> None:
        """Removes this process's local checkpoints newer than ``epoch`` (None: all of them).

        The runner calls it once it knows where the run goes on from (a fresh
        start, or the epoch it resumed from): a newer local epoch is what a
        killed life of the job left, and must never be resumed from later.
        """
        if self._local is not None:
            self._local.forget_after(epoch)

    def local_candidates(self, newer_than: int | None) -> tuple[list[int], list[str]]:
        """This process's local epochs newer than ``newer_than`` it can resume from, newest first.

        Returns:
            ``(epochs, why)``: the candidates, newest first, and one line per
            newer local epoch passed over.
        """
        if self._local is None:
            return [], []
        try:
            return self._local.candidates(newer_than)
        except (OSError, ValueError, CheckpointInUseError) as err:  # another writer's, unreadable
            return [], [f"the local tier cannot be read here: {err}"]

    def finish_local_tier(self) -> list[CheckpointSaveError]:
        """Waits for this process's local save in flight; removes what failed ones left.

        Returns:
            Its failure, if any (recorded, not raised).
        """
        local = self._local_manager()
        if local is None:
            return []
        try:
            local.wait_until_finished()  # one process's tier: waits on no other process
        except CheckpointSaveError as err:
            return [err]
        finally:
            for writer in local._writers():
                writer._retry_failed()  # what failed saves' threads wrote after their cleanup
        return []

    def _committed(self, node: str) -> list[int]:
        return common_epochs(self._db_prefix, [node], self._path_prefix)

    def set_lineage(self, life: str, resumed_from: int | None) -> None:
        """Names the life (attempt) whose saves follow, and the epoch it resumed from.

        Every later checkpoint's manifest, in both tiers, records them. The
        runner calls it on every process with the same ``life`` (process 0's);
        a manager used without a runner is one life of its own.
        """
        self._lineage = (life, resumed_from)

    def local_lineage(self, epochs: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Of each local epoch of ``epochs``: the life that saved it, its replicated leaves' CRCs.

        Returns:
            ``{epoch: {"life": id or None, "whole": {"<key path> of node '<node>'": crc}}}``;
            ``whole`` holds the leaves this process's copy holds whole. An epoch
            whose records do not read is left out.
        """
        return {} if self._local is None else self._local.lineage(epochs)

    def _save_round(
        self, epoch: int, items: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any] | None]]
    ) -> None:
        """Runs one save round over the writers, then the metadata record and retention.

        Raises:
            This save's problem on any process, else a previous save's failure.
        """
        writers = self._writers()
        for writer in writers:
            writer.lineage = self._lineage
        self._round_stats = None
        outcome = save_round.save_round(
            writers, epoch, items, self._how(epoch), accessible=self._take_access()
        )
        self._round_stats = outcome.stats
        if self._keep_all is not None and outcome.stats is not None:
            self._keep_all.saved(sum(s.bytes or 0 for p in outcome.stats for s in p.stats.values()))
        self._flush_metadata(committed=outcome.previous is None)
        pending = [w.pending_epoch() for w in writers if w.has_pending()]
        self._retain(writing=pending[0] if pending else epoch)  # in flight, or others write it
        if outcome.current is not None:
            raise with_earlier(outcome.current, outcome.previous)
        if outcome.previous is not None:
            raise outcome.previous

    def _loading(self) -> None:
        """Marks a load (on every process alike): its stats are exchanged when reported."""
        self._round_stats = None

    def _metadata_failed(self, epoch: int) -> None:
        """Drops the pending metadata record of ``epoch``: its save failed on this process."""
        if self._metadata_due == epoch:
            self._metadata_due = None

    def _retain(self, writing: int | None) -> None:
        """Applies ``keep`` to every node together, on the deleting process; never raises."""
        owners = [w.owner_process for w in self._writers()]
        if self._retention is not None and jax.process_index() == deleting_process(owners):
            self._retention.apply(writing=writing)

    def wait_until_finished(self) -> None:
        """Blocks until the saves in flight are committed; call it on every process.

        Raises:
            CheckpointSaveError: The first failure, on any process and node.
            HostTimeoutError: If another process does not arrive in time.
        """
        writers = self._writers()
        if not writers:
            return
        failure = save_round.end_round(writers, self._how(None))
        self._flush_metadata(committed=failure is None)
        self._retain(writing=None)
        if failure is not None:
            raise failure

    def finish_local(self) -> list[CheckpointSaveError]:
        """Completes this process's saves in flight, without waiting on other processes.

        Returns:
            Their failures (recorded, not raised).
        """
        finished = [w.finish() for w in self._writers() if w.own]
        failures = [f for f in finished if f is not None]
        self._flush_metadata(committed=not failures)
        return failures + self.finish_local_tier()

    def _last_stats(self) -> dict[str, Stats]:
        """Each writer's last action's stats, by checkpoint directory."""
        return {w.last[0]: w.last[1] for w in self._writers() if w.last is not None}

    def collect_checkpoint_stats(self, stats: dict[str, Any]) -> None:
        """Adds the last action's stats to ``stats``, keyed by checkpoint directory."""
        mine = self._last_stats()
        if not mine:
            logger.info("No checkpoint stats to collect for %s", self.node_names())
        stats.update({db: s.to_json() for db, s in mine.items()})

    def _own_nodes(self) -> list[str] | None:
        """The nodes this manager writes whatever the job's nodes are, or None: the job's.

        A :class:`~jaxjob.CheckpointManager` saves every node's leaves under
        its one ``node_name``; a multi-node manager has one node per job node.
        """
        return None

    def _checkpoint_nodes(self) -> list[str]:
        """The node names of this manager's checkpoint directories, before or after ``init``."""
        return self._own_nodes() or self._nodes or self.node_names()

    def committed_epochs(self) -> list[int]:
        """Epochs committed for every node of this manager, ascending."""
        return common_epochs(self._db_prefix, self.node_names(), self._path_prefix)

    def set_params(
        self, nodes: Sequence[Any], path_prefix: str | None = None, path_type: str | None = None
    ) -> None:
        """Passes the checkpoint location and the node names to the metadata handler.

        The handler gets this manager's node names (a single-node manager's
        ``node_name``, as in the seed; a multi-node manager's: ``nodes``).
        """
        if path_prefix:
            self._path_prefix = path_prefix
        if path_type:
            self._path_type = check_db_type(path_type, "path_type")
        self._nodes = [str(n) for n in nodes]
        self._metadata_handler.set_params(
            db_prefix=self._db_prefix,
            db_type=self._db_type,
            node_names=self._checkpoint_nodes(),
            path_prefix=self._path_prefix,
            path_type=self._path_type,
        )

    def verify(self, epoch: int) -> list[str]:
        """Reads this manager's checkpoints of ``epoch`` on this process and checks their checksums.

        Returns:
            One line per damaged leaf or file (naming the leaf, the epoch and
            the file), over every node; empty when intact.

        Raises:
            FileNotFoundError: If a node's checkpoint of ``epoch`` is not committed.

        Example:
            >>> import tempfile, jax.numpy as jnp, jaxjob
            >>> ckpt = jaxjob.CheckpointManager(tempfile.mkdtemp())
            >>> ckpt.save(0, jaxjob.Workspace({"w": jnp.ones(3)}))
            >>> ckpt.wait_until_finished()
            >>> ckpt.verify(0)
            []
        """
        return self._verify_nodes(epoch, self.node_names())

    def _verify_nodes(self, epoch: int, nodes: Sequence[str], *, data: bool = True) -> list[str]:
        lines: list[str] = []
        for node in nodes:
            path = db_name(epoch, node, self._db_prefix, self._path_prefix)
            if not is_committed(path):
                raise FileNotFoundError(
                    f"no committed checkpoint for node {node!r} at epoch {epoch} ({path!r}); "
                    f"committed epochs: {common_epochs(self._db_prefix, [node], self._path_prefix)}"
                )
            prefix = path.rpartition("/")[0]  # the db_prefix, or a path_prefix's folder
            lines += verify.verify_checkpoint(path, data=data, db_prefix=prefix)
        return lines

    def get_resume_from_epoch_id(self, user_epoch: int | None = None) -> int | None:
        """The epoch to resume from (``user_epoch`` wins), or None for a fresh start.

        Without ``user_epoch``, the metadata handler's epoch is verified
        (:meth:`verify`); a damaged one is logged, reported to the metadata
        handler (action ``"checkpoint_verify"``) and passed over for the
        newest older epoch committed for every node that is intact. The
        runner calls this on process 0 only, which reads alone, and shares
        the answer with every process.

        Raises:
            CorruptCheckpointError: If every committed epoch up to the
                handler's is damaged (nothing is overwritten).
            ValueError: If the checkpoints name several runs and nothing
                decides which is the prefix's (jaxjob's lineage rule).
        """
        epoch = self._metadata_handler.last_epoch(user_epoch=user_epoch)
        if user_epoch is not None or epoch is None:
            return epoch
        nodes = self._checkpoint_nodes()
        folder = db_name(epoch, nodes[0], self._db_prefix, self._path_prefix).rpartition("/")[0]
        run_identity.evidence(folder)  # checkpoints of several runs, nothing decides: refuse
        committed = common_epochs(self._db_prefix, nodes, self._path_prefix)
        for candidate in [epoch, *(e for e in reversed(committed) if e < epoch)]:
            problems = self._verify_nodes(candidate, nodes, data=False)  # leaves read anyway
            if not problems:
                return candidate
            error = "; ".join(problems)
            logger.warning(
                "The checkpoint of epoch %d is damaged, trying an older one: %s", candidate, error
            )
            stats = {
                db_name(candidate, node, self._db_prefix, self._path_prefix): {
                    "epoch": candidate,
                    "error": error,
                }
                for node in nodes
            }
            self._metadata_handler.report("checkpoint_verify", stats)
        raise CorruptCheckpointError(
            f"every committed checkpoint under {self._db_prefix!r} up to epoch {epoch} is "
            "damaged (see the log); restore one by hand or start the job under a new db_prefix"
        )

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Asks the metadata handler whether checkpoints (of ``epoch``) are accessible.

        Without ``epoch`` (the runner asks before each save), the answer is
        also this process's word on the next :meth:`save`, posted in its
        agreement: False there fails that save on every process, writing nothing.
        """
        accessible = self._metadata_handler.cp_accessible(epoch)
        if epoch is None:
            self._accessible = bool(accessible)
        return accessible

    def _take_access(self) -> bool:
        """The last ``cp_accessible()`` answer, for this save only (then True again)."""
        accessible, self._accessible = self._accessible, True
        return accessible

    def write_checkpoint_metadata(self, epoch: int) -> None:
        """Tells the metadata handler that ``epoch`` is saved, once it is committed.

        A record the handler cannot write (``OSError``: EIO, ENOSPC, an
        object store that does not answer) is a failure of that epoch's save,
        kept for :meth:`take_metadata_failures`; nothing is raised here.
        """
        if self.has_pending():
            self._metadata_due = epoch
        else:
            self._write_metadata(epoch)

    def _flush_metadata(self, committed: bool) -> None:
        """Writes the deferred metadata record once its save committed; drops it if it failed.

        A record whose save is still in flight (a save refused by
        ``cp_accessible`` finished nothing) stays deferred.
        """
        due = self._metadata_due
        if due is not None and due in [w.pending_epoch() for w in self._writers()]:
            return
        self._metadata_due = None
        if due is not None and committed:
            self._write_metadata(due)

    def _flush_committed_metadata(self) -> None:
        """Writes the deferred metadata record once its save is committed, without waiting.

        Between persistent saves (local-tier epochs) the persistent save in
        flight is not waited for; its record is written as soon as its commit
        marker is there, so that a kill before the next persistent save still
        resumes from it.
        """
        due = self._metadata_due
        writers = self._writers()
        if any(w.private for w in writers):  # another process's node: its commit is its own
            return
        writers = [w for w in writers if w.pending_epoch() == due]
        if due is not None and all(is_committed(w.pending_path()) for w in writers):
            self._metadata_due = None
            self._write_metadata(due)

    def _write_metadata(self, epoch: int) -> None:
        try:
            self._metadata_handler.write(epoch=epoch)
        except OSError as err:
            where = fs.join(self._db_prefix, METADATA_FILE)
            failure = as_save_error(epoch, where, err)
            logger.debug("metadata record failed: %s", failure)
            self._metadata_failures.append(failure)

    def take_metadata_failures(self) -> list[CheckpointSaveError]:
        """The metadata records that failed since the last call (each a save failure), oldest first.

        The runner hands each to its ``on_save_error`` policy.
        """
        failures, self._metadata_failures = self._metadata_failures, []
        return failures

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Sends every process's stats of the last action to the metadata handler.

        Call it on every process. Each entry has ``hosts`` (each process's
        ``duration_s``, ``bytes`` and ``error``), ``slowest_process``, the longest
        ``duration_s`` and the total ``bytes``. A save's stats came with its round's exchange (each
        process's ``bytes``, and as ``duration_s`` its time in ``save`` until
        it posted: preparing its part, before waiting on the others), so
        reporting them waits on no other process; a load's are exchanged here.
        """
        mine = self._last_stats()
        agreed, self._round_stats = self._round_stats, None
        if agreed is not None:
            stats = boundary.merge_stats(agreed, mine)
        else:
            stats = boundary.gather_stats(mine, self.timeout_s, exchange=self._exchange_stats)
        if self._local is not None:
            for entry in stats.values():
                entry["tier"] = PERSISTENT
        self._metadata_handler.report(action_name, stats)

    def close(self) -> None:
        """Waits for pending saves and releases Orbax's resources and the locks."""
        try:
            self.wait_until_finished()
        finally:
            for writer in self._writers():
                writer.close()
            local = self._local_manager()
            if local is not None:
                local.close()
