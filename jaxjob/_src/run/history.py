"""The durable history of a run: ``<db_prefix>/.jaxjob/history/<node>.jsonl``, rebuilt on resume.

``JobRunner.history`` keeps one record per epoch. With a checkpoint manager,
process 0 also writes every record to a file beside the checkpoints (local
disk, ``gs://`` or ``s3://``), so that a restarted run's history holds the
whole curve: on resume from epoch ``k`` it is rebuilt from the file's records
of epochs ``1..k``, the epochs that checkpoint covers.

**One file per node set, one writer.** The file is
``<db_prefix>/.jaxjob/history/<n>.jsonl``, ``n`` the first of the manager's
nodes in sorted order: a job writes it only while it holds the lock of every
node it saves (:mod:`jaxjob._src.manager.lock`), that of ``n`` included, so
two live jobs never write one file, and jobs of other node sets under the
same ``db_prefix`` keep their own. Its first line names the node set; a file
of another node set that shares ``n`` is not read (its history is not this
job's) and the next start replaces it.

**Lives.** Each ``train`` is a life with a random id. Once it holds the locks
(after the manager's ``init``), its start rewrites the file (one atomic
replace or upload): a header line naming the life, then the records it
rebuilt (epochs ``1..k``; none from scratch). Every later line it writes is
tagged with its id, and reading keeps only the lines of the header's life.
So the lines of another life (a writer that lost its lock to this one and
has not noticed yet, a killed run's epochs after ``k``) never reach a
rebuild, and ``resume_from_epoch=k`` drops the records above ``k`` for good.

The file is written so that no kill (SIGKILL at any moment) makes that rebuild
wrong:

* Before a save of epoch ``e`` starts (either tier), the records of the
  epochs run since the previous save are written, final, and a first record
  of ``e``: its values, no times yet (one fsynced append on local disk; one
  upload on object stores). After the save returns, the final record of ``e``
  with its times: on local disk appended, not fsynced (only times are at
  stake); on object stores, which cannot append, it goes with the next
  save's upload, or the end of ``train``. So every epoch a committed
  checkpoint covers has its values on storage before that checkpoint can
  commit, also across a machine crash; only the times of the resumed epoch
  go missing if the run dies between its commit and that record's write.
* Reading keeps each epoch's last line of the header's life and the epochs
  ``<= k``. A torn last line (a kill during an append) is skipped.

On object stores each write uploads the life's records from memory (no read
first). On resume every process reads the file itself; process 0 sends only a
digest of its records through the coordination service, and the whole
records only if some process read other ones.

A failed read or write (``OSError``, or ``ValueError`` for a file that is not
UTF-8 JSON) is logged as a warning (once a run) and the write retried with
the next one: the history never stops training.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from jaxjob._src.base import faults, fs
from jaxjob._src.base.log import get_logger
from jaxjob._src.checkpoint.run_identity import RUN_DIR
from jaxjob._src.multihost import hosts
from jaxjob._src.run.agreement import any_process

__all__ = ["HistoryFile", "NoHistory", "history_path", "read_records"]

logger = get_logger(__name__)


def history_path(db_prefix: str, nodes: Sequence[str]) -> str:
    """The history file of the node set ``nodes`` under ``db_prefix``: named by its first node.

    Example:
        >>> history_path("/ckpt", ["trainer_1", "trainer_0"])
        '/ckpt/.jaxjob/history/trainer_0.jsonl'
    """
    return fs.join(db_prefix, RUN_DIR, "history", f"{min(nodes)}.jsonl")


def _parse(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def read_records(text: str, upto: int | None, nodes: Sequence[str]) -> list[dict[str, Any]]:
    r"""The last record of each epoch ``1..upto`` in the history file's ``text``, by epoch.

    Only the lines of the life the first line (the header) names count, and
    only if that header names the node set ``nodes``. Lines that do not parse
    (a torn last line) or hold no int ``"epoch"`` are skipped.

    Example:
        >>> head = {"life": "a", "nodes": ["n"]}
        >>> lines = [head, {"life": "a", "record": {"epoch": 1, "loss": 3.0}},
        ...          {"life": "a", "record": {"epoch": 2, "loss": 9.0}},
        ...          {"life": "b", "record": {"epoch": 2, "loss": 7.0}},  # another life's
        ...          {"life": "a", "record": {"epoch": 2, "loss": 2.0}}]
        >>> text = "".join(json.dumps(line) + "\n" for line in lines) + '{"li'  # a torn line
        >>> read_records(text, upto=2, nodes=["n"])
        [{'epoch': 1, 'loss': 3.0}, {'epoch': 2, 'loss': 2.0}]
        >>> read_records(text, 1, ["n"]), read_records(text, None, ["n"])
        ([{'epoch': 1, 'loss': 3.0}], [])
        >>> read_records(text, 2, ["m"])  # another node set's file
        []
    """
    lines = text.splitlines()
    header = _parse(lines[0]) if lines else None
    if not isinstance(header, dict) or header.get("nodes") != sorted(nodes) or upto is None:
        return []
    life = header.get("life")
    found: dict[int, dict[str, Any]] = {}
    for line in lines[1:]:
        entry = _parse(line)
        if not isinstance(entry, dict) or entry.get("life") != life:
            continue
        record = entry.get("record")
        epoch = record.get("epoch") if isinstance(record, dict) else None
        if type(epoch) is int and 1 <= epoch <= upto:
            found[epoch] = record
    return [found[e] for e in sorted(found)]


def _digest(records: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


class NoHistory:
    """The history store of a runner without a checkpoint manager: nothing is kept.

    Example:
        >>> store = NoHistory()
        >>> store.rebuild(3)
        []
        >>> store.saving({"epoch": 1}), store.saved({"epoch": 1}), store.ran({"epoch": 1})
        (None, None, None)
        >>> store.close()
    """

    def rebuild(self, epoch: int | None) -> list[dict[str, Any]]:
        """No records: the run starts its history empty."""
        return []

    def ran(self, record: Mapping[str, Any]) -> None:
        """Nothing to keep."""

    def saving(self, first: Mapping[str, Any]) -> None:
        """Nothing to write."""

    def saved(self, record: Mapping[str, Any]) -> None:
        """Nothing to write."""

    def close(self) -> None:
        """Nothing to write."""


class HistoryFile:
    """One life of the node set's history file (see the module), written by process 0.

    Call every method on every process (``rebuild`` agrees on the records);
    the others write nothing. Call ``rebuild`` once the manager holds its
    locks (after its ``init``): it starts the life by rewriting the file.

    Args:
        db_prefix: The checkpoint manager's ``db_prefix``.
        nodes: The manager's node names.
        timeout_s: How long ``rebuild`` waits for the other processes.

    Example:
        >>> import tempfile
        >>> store = HistoryFile(tempfile.mkdtemp(), ["local"], timeout_s=10.0)
        >>> store.rebuild(None)  # from scratch
        []
        >>> store.ran({"epoch": 1, "loss": 2.0, "epoch_time_s": 0.1})  # not saved
        >>> store.saving({"epoch": 2, "loss": 1.0})  # before epoch 2's save
        >>> store.saved({"epoch": 2, "loss": 1.0, "epoch_time_s": 0.2})
        >>> store.close()
        >>> for record in HistoryFile(store.db_prefix, ["local"], timeout_s=10.0).rebuild(2):
        ...     print(record)
        {'epoch': 1, 'loss': 2.0, 'epoch_time_s': 0.1}
        {'epoch': 2, 'loss': 1.0, 'epoch_time_s': 0.2}
    """

    def __init__(self, db_prefix: str, nodes: Sequence[str], *, timeout_s: float) -> None:
        self.db_prefix = db_prefix
        self.nodes = sorted(nodes)
        self.path = history_path(db_prefix, self.nodes)
        self.timeout_s = timeout_s
        self.life = uuid.uuid4().hex
        self._remote = fs.is_remote(self.path)
        self._writer = jax.process_index() == 0
        self._records: list[dict[str, Any]] = []  # this life's lineage, epoch by epoch
        self._unwritten: list[Mapping[str, Any]] = []  # lines a failed append left (local)
        self._ran: list[Mapping[str, Any]] = []  # epochs run since the last save
        self._started = False  # the header is written
        self._dirty = False  # records not uploaded yet (object stores)
        self._warned = False

    def rebuild(self, epoch: int | None) -> list[dict[str, Any]]:
        """The stored records of epochs ``1..epoch`` (None: from scratch); starts the life.

        Every process reads the file; process 0's records are the answer.
        Then process 0 rewrites the file: this life's header and those records.
        """
        records = self._agreed(epoch)
        self._records = [dict(r) for r in records]
        self._unwritten, self._ran, self._dirty = [], [], False
        self._started = self._write(self._rewrite, what="rewrite")
        return [dict(r) for r in records]

    def _agreed(self, epoch: int | None) -> list[dict[str, Any]]:
        """Process 0's records: each process reads them itself; a digest checks they agree."""
        mine = self._read(epoch)
        if epoch is None or jax.process_count() == 1:  # from scratch: no records, everywhere
            return mine
        digest = _digest(mine)
        first = hosts.decide("the history's digest", lambda: digest, timeout_s=self.timeout_s)
        if any_process("the history's digest check", digest != first, self.timeout_s):
            return hosts.decide("the history", lambda: mine, timeout_s=self.timeout_s)
        return mine

    def _read(self, epoch: int | None) -> list[dict[str, Any]]:
        if epoch is None:
            return []
        try:
            if not fs.exists(self.path):
                return []
            return read_records(fs.read_text(self.path), epoch, self.nodes)
        except (OSError, ValueError) as err:  # ValueError: not UTF-8
            if self._writer:
                self._warn(
                    "Could not read the history file %s (%s): the history starts at epoch %d",
                    self.path, err, epoch + 1,
                )  # fmt: skip
            return []

    def ran(self, record: Mapping[str, Any]) -> None:
        """Keeps the final record of an epoch that was not saved: written before the next save."""
        self._ran.append(record)
        self._keep(record)

    def saving(self, first: Mapping[str, Any]) -> None:
        """Writes, before a save, the epochs run since the last one and ``first`` (no times yet)."""
        pending, self._ran = [*self._ran, first], []
        self._keep(first)
        self._flush(pending, sync=True)

    def saved(self, record: Mapping[str, Any]) -> None:
        """Writes the final record of the epoch just saved (object stores: with the next write)."""
        faults.point("history.saved")
        self._keep(record)
        if self._remote and self._started:
            self._dirty = True
            return
        self._flush([record], sync=False)

    def close(self) -> None:
        """Writes what an object store's file still lacks (the last saved epoch's times)."""
        if self._dirty or not self._started or self._unwritten:
            self._flush([], sync=True)

    def _keep(self, record: Mapping[str, Any]) -> None:
        if self._records and self._records[-1]["epoch"] == record["epoch"]:
            self._records[-1] = dict(record)
        else:
            self._records.append(dict(record))

    def _flush(self, records: list[Mapping[str, Any]], *, sync: bool) -> None:
        """Writes ``records``: appended on local disk, the whole life uploaded on object stores."""
        if self._remote or not self._started:
            self._started = self._write(self._rewrite, what="rewrite")
            return
        lines = [*self._unwritten, *records]
        if lines:
            self._unwritten = lines
            text = self._lines(lines)
            if self._write(lambda: fs.append_text(self.path, text, sync=sync), what="append"):
                self._unwritten = []

    def _lines(self, records: list[Mapping[str, Any]]) -> str:
        return "".join(json.dumps({"life": self.life, "record": dict(r)}) + "\n" for r in records)

    def _rewrite(self) -> None:
        if not self._remote:
            fs.makedirs(self.path.rsplit("/", 1)[0])
        header = json.dumps({"life": self.life, "nodes": self.nodes}) + "\n"
        fs.write_text(self.path, header + self._lines(self._records))
        self._unwritten, self._dirty = [], False

    def _write(self, write: Callable[[], None], *, what: str) -> bool:
        """Runs ``write`` on process 0; a failure is a warning once a run (retried at each save)."""
        if not self._writer:
            return True
        try:
            write()
        except (OSError, ValueError) as err:
            self._warn(
                "Could not %s the history file %s (%s); retrying at each save. A restart "
                "before a write succeeds resumes with the history the file holds",
                what, self.path, err,
            )  # fmt: skip
            return False
        return True

    def _warn(self, message: str, *args: Any) -> None:
        """Logs ``message`` as a warning the first time in this life, then at DEBUG."""
        log = logger.debug if self._warned else logger.warning
        self._warned = True
        log(message, *args)
