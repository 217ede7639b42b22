"""What both checkpoint managers share: options, the metadata handler, stats, the resume epoch.

:class:`~jaxjob.CheckpointManager` (one node) and
:class:`~jaxjob.MultiNodeCheckpointManager` (one manager per node, delegating
to single-node managers) both build on :class:`ManagerCore`. The runner talks
to either through the public methods of the :class:`Manager` protocol.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import jax

from jaxjob._src.base import fs
from jaxjob._src.base.errors import CheckpointSaveError, CorruptCheckpointError
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import checksum
from jaxjob._src.checkpoint.hostlocal import HostMap
from jaxjob._src.checkpoint.layout import common_epochs, db_name, is_committed
from jaxjob._src.core.workspace import Workspace
from jaxjob._src.manager import boundary
from jaxjob._src.manager import keep as keep_lib
from jaxjob._src.manager.metadata import METADATA_FILE, DiskMetadataHandler, MetadataHandler
from jaxjob._src.multihost import hosts

__all__ = ["CheckpointOptions", "Manager", "ManagerCore"]

logger = get_logger(__name__)

DB_TYPES = ("orbax",)
DEFAULT_WRITE_TIMEOUT_S = 600.0


def _seconds(value: Any, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{argument} must be a positive number of seconds, got {value!r}")
    return float(value)


def check_db_type(db_type: Any, argument: str) -> str:
    """Returns ``db_type`` if it is a supported storage type.

    Raises:
        ValueError: Naming ``argument`` and the supported types.
    """
    if db_type not in DB_TYPES:
        raise ValueError(f"{argument} must be one of {DB_TYPES}, got {db_type!r}")
    return db_type


def check_owner(owner_process: Any) -> int | None:
    """Returns ``owner_process`` if it is None or a process index of this job.

    Raises:
        ValueError: Naming the valid range.
    """
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointOptions:
    """Keyword options shared by both checkpoint managers, validated once.

    Attributes:
        async_save: False makes ``save`` return only once committed.
        timeout_s: How long any wait on the other processes of a
            ``jax.distributed`` job may take before it fails naming the late
            processes.
        write_timeout_s: How long a background write may take, including
            Orbax's wait for every process's part before the commit.
        host_map: For resuming host-local leaves (NumPy arrays, scalars) on a
            different process count: for each process of this job, the saved
            process whose copy it gets (a callable or a sequence).
        storage_timeout_s: On ``gs://`` and ``s3://``: how long one
            object-store operation may take before the save (or restore)
            fails naming the endpoint; a save or restore of the arrays may
            take that plus their bytes at 1 MiB/s. None:
            ``$JAXJOB_STORAGE_TIMEOUT_S``, else 120 s.

    Example:
        >>> import jaxjob
        >>> jaxjob.CheckpointOptions(timeout_s=0)
        Traceback (most recent call last):
        ...
        ValueError: timeout_s must be a positive number of seconds, got 0
    """

    async_save: bool = True
    timeout_s: float = hosts.DEFAULT_TIMEOUT_S
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    host_map: HostMap | None = None
    storage_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.async_save, bool):
            raise ValueError(f"async_save must be a bool, got {self.async_save!r}")
        object.__setattr__(self, "timeout_s", _seconds(self.timeout_s, "timeout_s"))
        object.__setattr__(
            self, "write_timeout_s", _seconds(self.write_timeout_s, "write_timeout_s")
        )
        if self.storage_timeout_s is not None:
            seconds = _seconds(self.storage_timeout_s, "storage_timeout_s")
            if seconds == float("inf"):
                raise ValueError(
                    "storage_timeout_s must be a positive number of seconds (None: "
                    f"${fs.STORAGE_TIMEOUT_ENV} or 120), got {self.storage_timeout_s!r}"
                )
            object.__setattr__(self, "storage_timeout_s", seconds)
        if self.host_map is not None and not isinstance(self.host_map, Callable | Sequence):
            raise ValueError(
                f"host_map must be None, a callable or a sequence of process indices, got "
                f"{self.host_map!r}"
            )


class Manager(Protocol):
    """The public methods through which the runner drives a checkpoint manager."""

    timeout_s: float
    db_prefix: str
    metadata_handler: MetadataHandler

    def set_params(self, nodes: Sequence[str]) -> None:
        """Passes the checkpoint location and the job's nodes to the metadata handler."""

    def get_resume_from_epoch_id(self, user_epoch: int | None = None) -> int | None:
        """The epoch to resume from, or None for a fresh start."""

    def init(
        self,
        nodes: Sequence[str],
        retrieve_from_epoch: int | None = None,
        *,
        key_nodes: Mapping[str, str] | None = None,
    ) -> None:
        """Prepares to save or load."""

    def saved_shapes(self, epoch: int) -> dict[str, Any]:
        """Shapes and dtypes of the leaves saved at ``epoch``."""

    def load(self, epoch: int, *, targets: Mapping[str, Any] | None = None) -> Workspace:
        """Loads the persistent workspace saved at ``epoch``."""

    def load_outputs(self, epoch: int) -> Workspace:
        """Loads the stop-condition outputs saved with ``epoch``."""

    def load_blobs_locally(
        self, nodes: Sequence[str], blob_names: Iterable[str], epoch: int, session: Any
    ) -> bool:
        """Loads named leaves into ``session.workspace``; False if a checkpoint is missing."""

    def save(self, epoch: int, workspace: Mapping[str, Any], *, outputs: Any = None) -> None:
        """Starts saving ``workspace`` as checkpoint ``epoch``."""

    def write_checkpoint_metadata(self, epoch: int) -> None:
        """Tells the metadata handler that ``epoch`` is saved, once committed."""

    def take_metadata_failures(self) -> list[CheckpointSaveError]:
        """The metadata records that failed since the last call (save failures)."""

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Reports the last action's stats to the metadata handler."""

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Whether checkpoints (of ``epoch``; without it: for the next save) are accessible."""

    def wait_until_finished(self) -> None:
        """Blocks until every save in flight is committed (every process)."""

    @property
    def required_outputs(self) -> tuple[str, ...]:
        """Names of epoch-group outputs to pass to :meth:`save` (e.g. what retention ranks by)."""
        ...

    def finish_local(self) -> list[CheckpointSaveError]:
        """Completes this process's saves in flight without waiting on other processes."""


class ManagerCore:
    """The facade both managers share: options, metadata handler plumbing, stats, close.

    Subclasses provide :meth:`node_names`, :meth:`has_pending`,
    :meth:`collect_checkpoint_stats`, :meth:`wait_until_finished` and
    :meth:`_close_orbax`.
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
    ) -> None:
        self._keep = keep_lib.normalize(keep)
        self._db_prefix = fs.normalize(db_prefix, "db_prefix")
        if options.storage_timeout_s is not None:
            fs.set_storage_timeout(self._db_prefix, options.storage_timeout_s)
        local = not fs.is_remote(self._db_prefix)
        if local and fs.exists(self._db_prefix) and not fs.is_dir(self._db_prefix):
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
        self._agreed_stats: list[dict[str, Any]] | None = None  # the last save's, from its posts
        self._accessible = True  # the metadata handler's answer for the next save

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

    def has_pending(self) -> bool:
        """Whether a save of this process is in flight."""
        raise NotImplementedError

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

    def _verify_nodes(self, epoch: int, nodes: Sequence[str]) -> list[str]:
        lines: list[str] = []
        for node in nodes:
            path = db_name(epoch, node, self._db_prefix, self._path_prefix)
            if not is_committed(path):
                raise FileNotFoundError(
                    f"no committed checkpoint for node {node!r} at epoch {epoch} ({path!r}); "
                    f"committed epochs: {common_epochs(self._db_prefix, [node], self._path_prefix)}"
                )
            lines += checksum.verify_checkpoint(path)
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
        """
        epoch = self._metadata_handler.last_epoch(user_epoch=user_epoch)
        if user_epoch is not None or epoch is None:
            return epoch
        nodes = self._checkpoint_nodes()
        committed = common_epochs(self._db_prefix, nodes, self._path_prefix)
        for candidate in [epoch, *(e for e in reversed(committed) if e < epoch)]:
            problems = self._verify_nodes(candidate, nodes)
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
        """Writes the deferred metadata record once its save committed; drops it if it failed."""
        due, self._metadata_due = self._metadata_due, None
        if due is not None and committed:
            self._write_metadata(due)

    def _write_metadata(self, epoch: int) -> None:
        try:
            self._metadata_handler.write(epoch=epoch)
        except OSError as err:
            where = fs.join(self._db_prefix, METADATA_FILE)
            failure = CheckpointSaveError(epoch, where, err)
            failure.__cause__ = err
            logger.debug("metadata record failed: %s", failure)
            self._metadata_failures.append(failure)

    def take_metadata_failures(self) -> list[CheckpointSaveError]:
        """The metadata records that failed since the last call (each a save failure), oldest first.

        The runner hands each to its ``on_save_error`` policy.
        """
        failures, self._metadata_failures = self._metadata_failures, []
        return failures

    def collect_checkpoint_stats(self, stats: dict[str, Any]) -> None:
        """Adds the last action's stats to ``stats``, keyed by checkpoint directory."""
        raise NotImplementedError

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Sends every process's stats of the last action to the metadata handler.

        Call it on every process; see :func:`jaxjob._src.manager.boundary.merge_stats` for
        the entries. A save's stats came with its agreement (each process's
        ``bytes``, and as ``duration_s`` its time in ``save`` until it posted:
        preparing its part, before waiting on the others), so reporting them
        waits on no other process; a load's are exchanged here.
        """
        stats: dict[str, Any] = {}
        self.collect_checkpoint_stats(stats)
        agreed, self._agreed_stats = self._agreed_stats, None
        if agreed is not None:
            stats = boundary.merge_stats(agreed, stats)
        else:
            stats = boundary.gather_stats(stats, self.timeout_s, exchange=self._exchange_stats)
        self._metadata_handler.report(action_name, stats)

    def wait_until_finished(self) -> None:
        """Blocks until the saves in flight are committed."""
        raise NotImplementedError

    def _close_orbax(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Waits for pending saves and releases Orbax's resources."""
        try:
            self.wait_until_finished()
        finally:
            self._close_orbax()
