"""The durable history of a run: ``<db_prefix>/jaxjob_history.jsonl``, rebuilt on resume.

``JobRunner.history`` keeps one record per epoch. With a checkpoint manager,
process 0 also writes every record to ``jaxjob_history.jsonl`` beside the
checkpoints (local disk, ``gs://`` or ``s3://``), so that a restarted run's
history holds the whole curve: on resume from epoch ``k`` it is rebuilt from
the file's records of epochs ``1..k``, the epochs that checkpoint covers.

The file is written so that no kill (SIGKILL at any moment) makes that rebuild
wrong:

* Before a save of epoch ``e`` starts (either tier), the records of the
  epochs run since the previous save are written, final, and a first record
  of ``e``: its values, no times yet (appended and fsynced: one fsync per
  save). After the save returns, the final record of ``e`` with its times
  (appended, not fsynced: only times are at stake). So every epoch a
  committed checkpoint covers has its values on storage before that
  checkpoint can commit, also across a machine crash; only the times of the
  resumed epoch go missing if a kill lands between its commit and its final
  record (milliseconds).
* Reading keeps each epoch's last line and the epochs ``<= k``: the lines a
  killed run wrote for epochs after ``k`` are dropped, and once the resumed
  run runs such an epoch again, its own lines come later in the file and win.
* After the resumed run's first save returns (its lock is then held), the
  file is rewritten with the run's records alone (one atomic replace or
  upload): stale lines do not stay.

A torn last line (a kill during an append) is skipped. A failed write
(``OSError``) is logged as a warning (once a run) and retried with the next
write: the history never stops training.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxjob._src.base import faults, fs
from jaxjob._src.base.log import get_logger
from jaxjob._src.multihost import hosts

__all__ = ["HISTORY_FILE", "HistoryFile", "NoHistory", "read_records"]

logger = get_logger(__name__)
HISTORY_FILE = "jaxjob_history.jsonl"


def read_records(text: str, upto: int | None) -> list[dict[str, Any]]:
    r"""The last record of each epoch ``1..upto`` in the JSON lines ``text``, by epoch.

    Lines that do not parse (a torn last line) or hold no int ``"epoch"`` are skipped.

    Example:
        >>> lines = ['{"epoch": 1, "loss": 3.0}', '{"epoch": 2, "loss": 9.0}']
        >>> text = "\n".join([*lines, '{"epoch": 2, "loss": 2.0}', '{"ep'])  # a torn last line
        >>> read_records(text, upto=2)
        [{'epoch': 1, 'loss': 3.0}, {'epoch': 2, 'loss': 2.0}]
        >>> read_records(text, upto=1), read_records(text, upto=None)
        ([{'epoch': 1, 'loss': 3.0}], [])
    """
    found: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        epoch = record.get("epoch") if isinstance(record, dict) else None
        if type(epoch) is int and upto is not None and 1 <= epoch <= upto:
            found[epoch] = record
    return [found[e] for e in sorted(found)]


def _lines(records: list[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(dict(r)) + "\n" for r in records)


class NoHistory:
    """The history store of a runner without a checkpoint manager: nothing is kept.

    Example:
        >>> store = NoHistory()
        >>> store.rebuild(3)
        []
        >>> store.saving({"epoch": 1}), store.saved({"epoch": 1}), store.ran({"epoch": 1})
        (None, None, None)
    """

    def rebuild(self, epoch: int | None) -> list[dict[str, Any]]:
        """No records: the run starts its history empty."""
        return []

    def ran(self, record: Mapping[str, Any]) -> None:
        """Nothing to keep."""

    def saving(self, first: Mapping[str, Any] | None) -> None:
        """Nothing to write."""

    def saved(self, record: Mapping[str, Any] | None) -> None:
        """Nothing to write."""


class HistoryFile:
    """The run's records in ``<db_prefix>/jaxjob_history.jsonl``, written by process 0.

    Call every method on every process (``rebuild`` exchanges process 0's
    records); the others write nothing.

    Args:
        db_prefix: The checkpoint manager's ``db_prefix``.
        timeout_s: How long ``rebuild`` waits for process 0.

    Example:
        >>> import tempfile
        >>> store = HistoryFile(tempfile.mkdtemp(), timeout_s=10.0)
        >>> store.rebuild(None)  # from scratch
        []
        >>> store.saved(None)  # epoch 0 saved
        >>> store.ran({"epoch": 1, "loss": 2.0, "epoch_time_s": 0.1})  # not saved
        >>> store.saving({"epoch": 2, "loss": 1.0})  # before epoch 2's save
        >>> store.saved({"epoch": 2, "loss": 1.0, "epoch_time_s": 0.2})
        >>> for record in HistoryFile(store.db_prefix, timeout_s=10.0).rebuild(2):
        ...     print(record)
        {'epoch': 1, 'loss': 2.0, 'epoch_time_s': 0.1}
        {'epoch': 2, 'loss': 1.0, 'epoch_time_s': 0.2}
    """

    def __init__(self, db_prefix: str, *, timeout_s: float) -> None:
        self.db_prefix = db_prefix
        self.path = fs.join(db_prefix, HISTORY_FILE)
        self.timeout_s = timeout_s
        self._writer = jax.process_index() == 0
        self._records: list[dict[str, Any]] = []  # this run's lineage, epoch by epoch
        self._unwritten: list[Mapping[str, Any]] = []  # lines a failed write left
        self._ran: list[Mapping[str, Any]] = []  # epochs run since the last save
        self._compacted = False
        self._warned = False

    def rebuild(self, epoch: int | None) -> list[dict[str, Any]]:
        """The stored records of epochs ``1..epoch`` (None: from scratch), on every process.

        Raises:
            RuntimeError: On processes other than 0, if process 0 could not read the file.
        """
        records = hosts.decide("the history", lambda: self._read(epoch), timeout_s=self.timeout_s)
        self._records = [dict(r) for r in records]
        self._unwritten, self._ran, self._compacted = [], [], False
        return [dict(r) for r in records]

    def _read(self, epoch: int | None) -> list[dict[str, Any]]:
        if epoch is None:
            return []
        try:
            return read_records(fs.read_text(self.path), epoch) if fs.exists(self.path) else []
        except OSError as err:
            logger.warning(
                "Could not read the history file %s (%s): the history starts at epoch %d",
                self.path, err, epoch + 1,
            )  # fmt: skip
            return []

    def ran(self, record: Mapping[str, Any]) -> None:
        """Keeps the final record of an epoch that was not saved: written before the next save."""
        self._ran.append(record)
        self._keep(record)

    def saving(self, first: Mapping[str, Any] | None) -> None:
        """Writes, before a save, the epochs run since the last one and ``first`` (no times yet)."""
        pending = [*self._ran, *([first] if first is not None else [])]
        self._ran = []
        if first is not None:
            self._keep(first)
        self._append(pending, sync=True)

    def saved(self, record: Mapping[str, Any] | None) -> None:
        """Writes the final record of the epoch just saved (None: epoch 0's save).

        The first time in a run, rewrites the file with the run's records alone.
        """
        faults.point("history.saved")
        if record is not None:
            self._keep(record)
        if self._compacted:
            self._append([record] if record is not None else [], sync=False)
            return
        self._compacted = self._write(self._compact, what="rewrite")

    def _keep(self, record: Mapping[str, Any]) -> None:
        if self._records and self._records[-1]["epoch"] == record["epoch"]:
            self._records[-1] = dict(record)
        else:
            self._records.append(dict(record))

    def _compact(self) -> None:
        if self._records or fs.exists(self.path):
            fs.write_text(self.path, _lines(self._records))
        self._unwritten = []

    def _append(self, records: list[Mapping[str, Any]], *, sync: bool) -> None:
        lines = [*self._unwritten, *records]
        if lines:
            self._unwritten = lines
            text = _lines(lines)
            if self._write(lambda: fs.append_text(self.path, text, sync=sync), what="append"):
                self._unwritten = []

    def _write(self, write: Callable[[], None], *, what: str) -> bool:
        """Runs ``write`` on process 0; a failure is a warning once a run (retried at each save)."""
        if not self._writer:
            return True
        try:
            write()
        except OSError as err:
            log = logger.debug if self._warned else logger.warning
            self._warned = True
            log(
                "Could not %s the history file %s (%s); retrying at each save. A restart "
                "before a write succeeds resumes with the history the file holds",
                what, self.path, err,
            )  # fmt: skip
            return False
        return True
