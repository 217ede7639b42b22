"""Checkpoint metadata: the handler protocol, the default on-disk handler, a tier's record."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax

from jaxjob._src.base import fs
from jaxjob._src.base.errors import CheckpointSaveError, as_save_error
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint import run_identity
from jaxjob._src.checkpoint.layout import common_epochs

__all__ = ["DiskMetadataHandler", "MetadataHandler", "MetadataRecord"]

logger = get_logger(__name__)
METADATA_FILE = run_identity.LOG_FILE


@runtime_checkable
class MetadataHandler(Protocol):
    """Reads and writes checkpoint metadata in storage of your choice (the seed's five methods)."""

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def set_params(
        self,
        db_prefix: str,
        db_type: str,
        node_names: Sequence[str],
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> None:
        """Tells the handler where the job's checkpoints live."""

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        """The epoch to resume from, or None to start from scratch."""

    def write(self, epoch: int) -> None:
        """Records that ``epoch`` was committed."""

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Whether checkpoint storage (or the checkpoint of ``epoch``) is accessible."""

    def report(self, action_name: str, stats: dict[str, Any]) -> None:
        """Receives the stats of one checkpoint action (save, load, partial load)."""


class DiskMetadataHandler:
    """The default handler: auto-resume from the checkpoint directories themselves.

    ``last_epoch()`` is the latest epoch committed for every node of the job.
    ``write(epoch)`` adds a line to ``<db_prefix>/jaxjob_metadata.jsonl`` on
    process 0, naming the epoch and the prefix's run (the log is the prefix's
    second record of its run, beside ``.jaxjob/run.json``): on local disk an
    append and one fsync (a line torn by a crash stays on its own line), on
    object stores, which cannot append, one upload of the whole file. An
    ``OSError`` there (EIO, ENOSPC, a silent object store) is raised; the
    manager makes it a failure of that epoch's save, which the runner handles
    under ``on_save_error``. ``report`` keeps every action's stats in
    ``history`` and logs them (failures at INFO: the save raises them, or the
    runner logs each as one warning).

    Example:
        >>> import jaxjob
        >>> handler = jaxjob.DiskMetadataHandler()
        >>> handler.set_params(db_prefix="/nonexistent", db_type="orbax", node_names=["local"])
        >>> handler.last_epoch() is None, handler.last_epoch(user_epoch=3)
        (True, 3)
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def __init__(self) -> None:
        self.db_prefix: str | None = None
        self.node_names: list[str] = []
        self.path_prefix: str | None = None
        self.history: list[dict[str, Any]] = []
        self._run: str | None = None  # the prefix's run, read by the first write

    def set_params(
        self,
        db_prefix: str,
        db_type: str,
        node_names: Sequence[str],
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> None:
        """Remembers the checkpoint location and the job's node names."""
        if db_prefix != self.db_prefix:
            self._run = None
        self.db_prefix = db_prefix
        self.node_names = [str(n) for n in node_names]
        self.path_prefix = path_prefix

    def epochs(self) -> list[int]:
        """Epochs committed for every node, ascending."""
        if self.db_prefix is None:
            return []
        return common_epochs(self.db_prefix, self.node_names, self.path_prefix)

    def last_epoch(self, user_epoch: int | None = None) -> int | None:
        """``user_epoch`` if given, else the latest epoch committed for every node."""
        if user_epoch is not None:
            return user_epoch
        epochs = self.epochs()
        return epochs[-1] if epochs else None

    def write(self, epoch: int) -> None:
        """Appends a commit record for ``epoch``, durably."""
        if self.db_prefix is None or jax.process_index() != 0:
            return
        self._run = self._run or self._read_run()
        record = {"event": "commit", "epoch": epoch, "time": time.time()}
        if self._run is not None:
            record["run"] = self._run
        fs.append_text(fs.join(self.db_prefix, METADATA_FILE), json.dumps(record) + "\n")

    def _read_run(self) -> str | None:
        """The prefix's run id; None (the record names none) if its run file is damaged."""
        try:
            return run_identity.read(self.db_prefix)
        except ValueError as err:  # the saves and reads through the prefix say so
            logger.debug("The commit record names no run: %s", err)
            return None

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """With ``epoch``: it is committed for every node. Without: the prefix is writable."""
        if epoch is not None:
            return epoch in self.epochs()
        return self.db_prefix is not None and fs.writable(self.db_prefix)

    def report(self, action_name: str, stats: dict[str, Any]) -> None:
        """Keeps the stats and logs them: at DEBUG, failed actions at INFO.

        A failed save's error is raised, or logged by the runner as one warning.
        """
        self.history.append({"action": action_name, "time": time.time(), "stats": stats})
        failed = {k: v for k, v in stats.items() if isinstance(v, dict) and v.get("error")}
        if failed:
            logger.info("%s failed: %s", action_name, failed)
        else:
            logger.debug("%s: %s", action_name, stats)


class MetadataRecord:
    """A tier's side of its metadata handler: the commit record, deferred until its save commits.

    Args:
        handler: The tier's metadata handler.
        db_prefix: The tier's directory (named in a failed record's error).
    """

    def __init__(self, handler: MetadataHandler, db_prefix: str) -> None:
        self.handler = handler
        self.db_prefix = db_prefix
        self.due: int | None = None  # the epoch whose record waits for its save to commit
        self._failures: list[CheckpointSaveError] = []
        self._accessible = True  # the handler's answer for the next save

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Asks the handler; without ``epoch`` its answer is also kept for the next save."""
        accessible = self.handler.cp_accessible(epoch)
        if epoch is None:
            self._accessible = bool(accessible)
        return accessible

    def take_access(self) -> bool:
        """The last ``cp_accessible()`` answer, for this save only (then True again)."""
        accessible, self._accessible = self._accessible, True
        return accessible

    def committed(self, epoch: int, *, in_flight: bool) -> None:
        """Records ``epoch`` now, or (its save ``in_flight``) once a round finds it committed."""
        if in_flight:
            self.due = epoch
        else:
            self.write(epoch)

    def failed(self, epoch: int) -> None:
        """Drops the deferred record of ``epoch``: its save failed on this process."""
        if self.due == epoch:
            self.due = None

    def flush(self, in_flight: list[int | None], *, committed: bool) -> None:
        """Writes the deferred record once its save committed; drops it if the save failed.

        A record whose save is still in flight (among ``in_flight``) stays deferred.
        """
        due = self.due
        if due is not None and due in in_flight:
            return
        self.due = None
        if due is not None and committed:
            self.write(due)

    def write(self, epoch: int) -> None:
        """Tells the handler that ``epoch`` is committed.

        A record the handler cannot write (``OSError``: EIO, ENOSPC, an object
        store that does not answer) is a failure of that epoch's save, kept
        for :meth:`take_failures`; nothing is raised here.
        """
        try:
            self.handler.write(epoch=epoch)
        except OSError as err:
            failure = as_save_error(epoch, fs.join(self.db_prefix, METADATA_FILE), err)
            logger.debug("metadata record failed: %s", failure)
            self._failures.append(failure)

    def take_failures(self) -> list[CheckpointSaveError]:
        """The records that failed since the last call (each a save failure), oldest first."""
        failures, self._failures = self._failures, []
        return failures
