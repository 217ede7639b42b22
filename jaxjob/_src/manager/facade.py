"""The one manager body: DESIGN's methods over a persistent tier and an optional local one.

:class:`~jaxjob.CheckpointManager` and :class:`~jaxjob.MultiNodeCheckpointManager`
build on :class:`ManagerCore` and choose its writers (one node, or one per
node of the job). Its tiers (:class:`~jaxjob._src.manager.tier.Tier`) run the
save rounds, the metadata record and retention; the manager holds the
metadata handler plumbing and the resume decision, and hands out a tier
through :meth:`ManagerCore.tier`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jaxjob._src.base import fs
from jaxjob._src.base.errors import CorruptCheckpointError
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import run_identity
from jaxjob._src.checkpoint.layout import common_epochs, db_name
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.manager.local_copy import LocalCopy
from jaxjob._src.manager.local_tier import LOCAL, PERSISTENT, LocalTier, check_placement
from jaxjob._src.manager.metadata import DiskMetadataHandler, MetadataHandler, MetadataRecord
from jaxjob._src.manager.retention import keep as keep_lib
from jaxjob._src.manager.save.writer import NodeWriter
from jaxjob._src.manager.shared import CheckpointOptions, check_db_type
from jaxjob._src.manager.tier import Tier

__all__ = ["ManagerCore"]

logger = get_logger(__name__)


class ManagerCore:
    """The manager body both managers share, over their tiers.

    Subclasses choose the writers (:meth:`Tier.open
    <jaxjob._src.manager.tier.Tier.open>` on the persistent tier) and provide
    :meth:`node_names`, :meth:`init`, :meth:`get_ckpt_db_name`,
    :meth:`load_blobs_locally` and :attr:`node_managers`.

    Args:
        db_prefix: The persistent tier's directory.
        db_type: Storage type; only ``"orbax"``.
        metadata_handler: The persistent tier's handler (default: on disk).
        options: The options, validated.
        keep: The persistent tier's retention policies.
        local: The local tier's settings, or None: one tier.
        keyed: One writer per node of the job (a multi-node manager).
        writers: The persistent tier's writers, if already made (a node of a
            multi-node manager seen as a single-node one).
    """

    def __init__(
        self,
        db_prefix: str,
        db_type: str,
        metadata_handler: MetadataHandler | None,
        options: CheckpointOptions,
        *,
        keep: keep_lib.Policy | Sequence[keep_lib.Policy] | None = None,
        local: LocalTier | None = None,
        keyed: bool = False,
        writers: Sequence[NodeWriter] | None = None,
    ) -> None:
        policies = keep_lib.normalize(keep)
        if local is not None and not isinstance(local, LocalTier):
            raise TypeError(f"local must be a jaxjob.LocalTier or None, got {local!r}")
        db_prefix = fs.normalize(db_prefix, "db_prefix")
        check_placement(local, db_prefix, timeout_s=options.timeout_s)
        if options.storage_timeout_s is not None:
            fs.set_storage_timeout(db_prefix, options.storage_timeout_s)
        on_disk = not fs.is_remote(db_prefix)
        if on_disk and fs.exists(db_prefix) and not fs.is_dir(db_prefix):
            raise NotADirectoryError(
                f"db_prefix {db_prefix!r} is a file, not a directory; pass the "
                "directory that holds (or will hold) the checkpoints"
            )
        self._db_type = check_db_type(db_type, "db_type")
        self._options = options
        self._path_type: str | None = None
        self._nodes: list[str] = []  # the job's nodes, as set_params got them
        handler = metadata_handler or DiskMetadataHandler()
        self._persistent = Tier(
            PERSISTENT,
            db_prefix,
            options,
            MetadataRecord(handler, db_prefix),
            keep=policies,
            keyed=keyed,
        )
        if writers is not None:
            self._persistent.adopt(writers)
        self._local = None if local is None else LocalCopy(local, self._persistent, self.node_names)
        self._persistent.tagged = local is not None

    @property
    def db_prefix(self) -> str:
        """The directory holding the checkpoints (normalized: absolute, or a bucket URL)."""
        return self._persistent.db_prefix

    @property
    def options(self) -> CheckpointOptions:
        """The options (``timeout_s``, ``host_map``, ...): those given, or the keywords'."""
        return self._options

    @property
    def metadata_handler(self) -> MetadataHandler:
        """The handler deciding resume epochs and receiving stats."""
        return self._persistent.metadata.handler

    def tier(self, name: str) -> Any:
        """The tier ``name``: ``"persistent"`` (``db_prefix``) or ``"local"`` (``local=``).

        A tier saves (``save``), finishes (``finish``, ``wait_until_finished``),
        lists (``committed_epochs``; the local one also ``candidates`` and
        ``lineage``) and forgets (the local one: ``forget``) epochs, and reads
        them back through its ``reader``.

        Returns:
            The tier, or None for ``"local"`` if this manager has no local tier.

        Raises:
            ValueError: If ``name`` is neither.

        Example:
            >>> import tempfile, jaxjob
            >>> ckpt = jaxjob.CheckpointManager(tempfile.mkdtemp())
            >>> ckpt.tier("persistent").committed_epochs(), ckpt.tier("local")
            ([], None)
        """
        if name == PERSISTENT:
            return self._persistent
        if name == LOCAL:
            return self._local
        raise ValueError(f"tier must be {PERSISTENT!r} or {LOCAL!r}, got {name!r}")

    def node_names(self) -> list[str]:
        """The names of the nodes whose checkpoints this manager handles."""
        raise NotImplementedError

    def _checkpoint_nodes(self) -> list[str]:
        """The node names of this manager's checkpoint directories, before or after ``init``."""
        if self._persistent.keyed:
            return self._nodes or self.node_names()
        return self.node_names()  # a single-node manager saves every node's leaves under its own

    def _init_writers(
        self, retrieve_from_epoch: int | None, path_prefix: str | None, path_type: str | None
    ) -> None:
        """Takes each node's lock; with ``retrieve_from_epoch``, reads its leaf names from it."""
        if path_type is not None:
            check_db_type(path_type, "path_type")
        tier = self._persistent
        for writer in tier.writers:
            writer.take_lock()  # an unwritable db_prefix is reported by the first save
            if retrieve_from_epoch is not None:
                _, found = tier.reader.checkpoint(writer, retrieve_from_epoch, path_prefix)
                writer.reader.blob_names = found.state_keys
                if tier.keyed:
                    tier.key_nodes.update(dict.fromkeys(found.state_keys, writer.node_name))

    def blob_list(self) -> list[str]:
        """Names of the leaves this manager saves and loads (every node's).

        Raises:
            RuntimeError: Before ``init(retrieve_from_epoch=...)``, a save or a load.
        """
        self.node_names()  # a multi-node manager: after init
        names: list[str] = []
        for writer in self._persistent.writers:
            if writer.reader.blob_names is None:
                raise RuntimeError(
                    "blob_list() is known only after init from an epoch, save or load"
                )
            names += writer.reader.blob_names
        return names

    def check_db_exists(self, epoch: int) -> bool:
        """Whether every node's checkpoint of ``epoch`` is committed."""
        self.node_names()  # a multi-node manager: after init
        return self._persistent.reader.check_db_exists(epoch)

    def committed_epochs(self) -> list[int]:
        """Epochs committed for every node of this manager, ascending."""
        return self._persistent.committed_epochs(self.node_names())

    def load(
        self,
        epoch: int,
        path_prefix: str | None = None,
        path_type: str | None = None,
        *,
        targets: Mapping[str, Any] | None = None,
    ) -> Workspace:
        """Loads the whole persistent workspace saved at ``epoch`` (a multi-node manager: merged).

        A multi-node manager reads the nodes this process saves (its own and
        those every process shares).

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
        if path_type is not None:
            check_db_type(path_type, "path_type")
        return self._persistent.reader.load(epoch, path_prefix, targets=targets)

    def load_blobs_from_checkpoint(self, blob_names: Iterable[str], epoch: int) -> Workspace:
        """Loads ``blob_names`` from every node's checkpoint of ``epoch`` that holds them."""
        self.node_names()  # a multi-node manager: after init
        return self._persistent.reader.load_blobs(blob_names, epoch)

    def save(
        self, epoch: int, workspace: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None
    ) -> None:
        """Starts saving ``workspace`` as checkpoint ``epoch`` of the persistent tier.

        Returns once the device-to-host copy is done (async) or the
        checkpoint is committed and on stable storage (``async_save=False``).
        Saving an epoch that is already committed replaces it once the new
        one is committed (on object stores, which cannot rename, the old one
        is deleted first). In a multi-process job, call it on every process:
        the processes agree in one exchange whether it can start (and share
        its stats, see :meth:`report_checkpoint_stats`); if one node's save
        cannot start on some process, no node's starts. If the last
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
        self._persistent.save(epoch, workspace, outputs=outputs)

    def wait_until_finished(self) -> None:
        """Blocks until the persistent saves in flight are committed; call it on every process.

        Raises:
            CheckpointSaveError: The first failure, on any process and node.
            HostTimeoutError: If another process does not arrive in time.
        """
        self._persistent.wait_until_finished()

    def collect_checkpoint_stats(self, stats: dict[str, Any]) -> None:
        """Adds the last action's stats to ``stats``, keyed by checkpoint directory."""
        mine = self._persistent.last_stats()
        if not mine:
            logger.info("No checkpoint stats to collect for %s", self.node_names())
        stats.update({db: s.to_json() for db, s in mine.items()})

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Sends every process's stats of the last action to the metadata handler.

        Call it on every process. Each entry has ``hosts`` (each process's
        ``duration_s``, ``bytes`` and ``error``), ``slowest_process``, the longest
        ``duration_s`` and the total ``bytes`` (and ``"tier": "persistent"``
        with a local tier). A save's stats came with its round's exchange (each
        process's ``bytes``, and as ``duration_s`` its time in ``save`` until
        it posted: preparing its part, before waiting on the others), so
        reporting them waits on no other process; a load's are exchanged here.
        """
        self._persistent.report_stats(action_name)

    def set_params(
        self, nodes: Sequence[Any], path_prefix: str | None = None, path_type: str | None = None
    ) -> None:
        """Passes the checkpoint location and the node names to the metadata handler.

        The handler gets this manager's node names (a single-node manager's
        ``node_name``, as in the seed; a multi-node manager's: ``nodes``).
        """
        if path_prefix:
            self._persistent.path_prefix = path_prefix
        if path_type:
            self._path_type = check_db_type(path_type, "path_type")
        self._nodes = [str(n) for n in nodes]
        self.metadata_handler.set_params(
            db_prefix=self.db_prefix,
            db_type=self._db_type,
            node_names=self._checkpoint_nodes(),
            path_prefix=self._persistent.path_prefix,
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
        return self._persistent.reader.verify(epoch, self.node_names())

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
        epoch = self.metadata_handler.last_epoch(user_epoch=user_epoch)
        if user_epoch is not None or epoch is None:
            return epoch
        nodes, prefix = self._checkpoint_nodes(), self.db_prefix
        path_prefix = self._persistent.path_prefix
        run_identity.evidence(db_name(epoch, nodes[0], prefix, path_prefix).rpartition("/")[0])
        committed = common_epochs(prefix, nodes, path_prefix)
        for candidate in [epoch, *(e for e in reversed(committed) if e < epoch)]:
            problems = self._persistent.reader.verify(candidate, nodes, data=False)
            if not problems:
                return candidate
            error = "; ".join(problems)
            logger.warning(
                "The checkpoint of epoch %d is damaged, trying an older one: %s", candidate, error
            )
            stats = {
                db_name(candidate, node, prefix, path_prefix): {"epoch": candidate, "error": error}
                for node in nodes
            }
            self.metadata_handler.report("checkpoint_verify", stats)
        raise CorruptCheckpointError(
            f"every committed checkpoint under {prefix!r} up to epoch {epoch} is "
            "damaged (see the log); restore one by hand or start the job under a new db_prefix"
        )

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Asks the metadata handler whether checkpoints (of ``epoch``) are accessible.

        Without ``epoch`` (the runner asks before each save), the answer is
        also this process's word on the next :meth:`save`, posted in its
        agreement: False there fails that save on every process, writing nothing.
        """
        return self._persistent.metadata.cp_accessible(epoch)

    def write_checkpoint_metadata(self, epoch: int) -> None:
        """Tells the metadata handler that ``epoch`` is saved, once it is committed.

        A record the handler cannot write (``OSError``: EIO, ENOSPC, an
        object store that does not answer) is a failure of that epoch's save,
        kept for the persistent tier's ``take_metadata_failures``; nothing is
        raised here.
        """
        tiers = [self._persistent] if self._local is None else [self._persistent, self._local]
        in_flight = any(tier.has_pending() for tier in tiers)
        self._persistent.metadata.committed(epoch, in_flight=in_flight)

    def close(self) -> None:
        """Waits for pending saves (both tiers) and releases Orbax's resources and the locks."""
        try:
            self._persistent.close()
        finally:
            if self._local is not None:
                self._local.close()
