"""Metric writers: where ``JobRunner`` sends each epoch's history record.

``JobRunner(job, ckpt, progress=["loss"], writers=[jaxjob.JsonlWriter("metrics.jsonl")])``
turns one on. A writer gets, on process 0 only:

1. ``resume(history)`` once at the start of ``train``, with the records the
   run already has (empty from scratch; on resume from epoch ``k``, the
   rebuilt records of epochs ``1..k``). The writer makes its output hold
   exactly those: it keeps what it wrote before for them, drops what a killed
   run wrote for later epochs, and writes those of them it lacks. Nothing it
   already holds is written twice.
2. ``write(record)`` once per epoch run, once the record is final (after the
   epoch's save).
3. ``close()`` when ``train`` returns or raises.

The interface and the composite over it follow CLU's ``metric_writers``.
Writers are opened in ``resume``, so one built on every process of a
multi-process job creates nothing on the others.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from jaxjob._src.base import fs
from jaxjob._src.base.log import get_logger

__all__ = ["JsonlWriter", "MetricWriter", "MultiWriter", "check_writers", "scalars"]

logger = get_logger(__name__)


@runtime_checkable
class MetricWriter(Protocol):
    """Receives a run's history records: ``resume`` once, ``write`` per epoch, ``close``.

    ``JobRunner`` calls them on process 0 only. ``resume(history)`` gets the
    records the run already has (empty from scratch; on resume from epoch
    ``k``, those of epochs ``1..k``): the output must then hold exactly those
    (keep what it holds of them, drop later epochs a killed run wrote, add
    the missing ones). ``write(record)`` gets each epoch's final record, after
    its save. ``close()`` comes when ``train`` returns or raises.

    A record is a dict: ``"epoch"`` (int), the ``progress`` values (floats),
    ``"epoch_time_s"``, ``"save_time_s"`` and, where they apply,
    ``"save_interval_s"``, ``"saved_to"`` (str) and ``"save_failed"`` (list of
    epochs). A record rebuilt on resume may lack the times of its epoch (the
    resumed one, if the run died right after its save).

    Example:
        >>> import jaxjob
        >>> class Printer:
        ...     def resume(self, history):
        ...         print("already run:", [r["epoch"] for r in history])
        ...     def write(self, record):
        ...         print("epoch", record["epoch"], "loss", record["loss"])
        ...     def close(self):
        ...         pass
        >>> isinstance(Printer(), jaxjob.MetricWriter)
        True
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def resume(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Opens the output and makes it hold exactly ``history`` (epochs already run)."""

    def write(self, record: Mapping[str, Any]) -> None:
        """Writes one epoch's final record."""

    def close(self) -> None:
        """Flushes and closes the output; ``resume`` may open it again."""


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's numbers other than ``"epoch"``: what a scalar writer plots.

    Example:
        >>> scalars({"epoch": 2, "loss": 0.5, "saved_to": "local", "save_failed": [2]})
        {'loss': 0.5}
    """
    return {
        k: float(v)
        for k, v in record.items()
        if k != "epoch" and isinstance(v, int | float) and not isinstance(v, bool)
    }


def check_writers(writers: Any) -> tuple[MetricWriter, ...]:
    """Validates ``JobRunner``'s ``writers`` argument.

    Raises:
        TypeError: If it is not a sequence of metric writers.
    """
    if isinstance(writers, str) or not isinstance(writers, Sequence):
        raise TypeError(
            "writers must be a list of metric writers, e.g. [jaxjob.JsonlWriter(path)], "
            f"got {writers!r}"
        )
    bad = [w for w in writers if not isinstance(w, MetricWriter)]
    if bad:
        raise TypeError(
            f"writers: {bad!r} are not metric writers (objects with resume(history), "
            "write(record) and close(), see jaxjob.MetricWriter)"
        )
    return tuple(writers)


class MultiWriter:
    """Sends every call to each of ``writers`` in turn; with none, does nothing.

    An ``OSError`` or ``ValueError`` of one writer (a full disk, an
    unreachable bucket, a file that is not UTF-8) is logged as a warning and
    the others still get the record: metrics never stop training. A writer
    whose ``resume`` failed gets nothing more until the next ``resume``. Other
    exceptions propagate.

    Example:
        >>> writer = MultiWriter([])
        >>> writer.resume([]), writer.write({"epoch": 1}), writer.close()
        (None, None, None)
    """

    def __init__(self, writers: Sequence[MetricWriter]) -> None:
        self.writers = tuple(writers)
        self._open = list(self.writers)

    def resume(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Calls ``resume(history)`` on each writer."""
        self._open = [w for w in self.writers if self._call(w, "resume", history)]

    def write(self, record: Mapping[str, Any]) -> None:
        """Calls ``write(record)`` on each writer."""
        for writer in self._open:
            self._call(writer, "write", record)

    def close(self) -> None:
        """Calls ``close()`` on each writer."""
        for writer in self.writers:
            self._call(writer, "close")

    def _call(self, writer: MetricWriter, method: str, *args: Any) -> bool:
        try:
            getattr(writer, method)(*args)
        except (OSError, ValueError) as err:  # ValueError: a file not UTF-8, not JSON
            logger.warning("Metric writer %r failed in %s: %s", writer, method, err)
            return False
        return True


class JsonlWriter:
    """Writes one JSON line per epoch record to ``path`` (local disk, ``gs://`` or ``s3://``).

    Each line is the full record, e.g. ``{"epoch": 3, "loss": 0.21,
    "epoch_time_s": 0.41, "save_time_s": 0.01}``. On local disk each line is
    appended (it survives a kill of the process; not fsynced: after a machine
    crash, ``resume`` adds back what is missing); on object stores, which
    cannot append, the object is uploaded again with the line added.

    ``resume(history)``: the lines already in the file for the history's
    epochs are kept as they are (the longest run of lines whose epochs match
    the history's, in order), later lines (a killed run's epochs, or another
    run's) are dropped by one atomic rewrite, and the history's records the
    file lacks are appended. So each epoch is in the file exactly once.

    Args:
        path: The file; its directory is created.

    Example:
        >>> import json, os, tempfile
        >>> import jaxjob
        >>> path = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
        >>> writer = jaxjob.JsonlWriter(path)
        >>> writer.resume([])
        >>> writer.write({"epoch": 1, "loss": 0.5})
        >>> writer.write({"epoch": 2, "loss": 0.25})
        >>> writer.close()
        >>> writer.resume([{"epoch": 1, "loss": 0.5}])  # resumed from epoch 1: epoch 2 goes
        >>> [json.loads(line) for line in open(path)]
        [{'epoch': 1, 'loss': 0.5}]
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def __init__(self, path: str) -> None:
        self.path = fs.normalize(path, "path")

    def __repr__(self) -> str:
        return f"JsonlWriter({self.path!r})"

    def resume(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Makes the file hold exactly one line per record of ``history`` (see the class)."""
        fs.makedirs(self.path.rsplit("/", 1)[0])
        lines = self._lines()
        kept = 0
        while kept < min(len(lines), len(history)) and _epoch(lines[kept]) == _epoch_of(
            history[kept]
        ):
            kept += 1
        missing = "".join(_line(r) for r in history[kept:])
        if kept < len(lines):
            fs.write_text(self.path, "".join(line + "\n" for line in lines[:kept]) + missing)
        elif missing:
            fs.append_text(self.path, missing, sync=False)

    def _lines(self) -> list[str]:
        if not fs.exists(self.path):
            return []
        return [line for line in fs.read_text(self.path).splitlines() if line.strip()]

    def write(self, record: Mapping[str, Any]) -> None:
        """Appends the record as one line."""
        fs.append_text(self.path, _line(record), sync=False)

    def close(self) -> None:
        """Nothing to close: every line is on storage once ``write`` returns."""


def _line(record: Mapping[str, Any]) -> str:
    return json.dumps(dict(record)) + "\n"


def _epoch_of(record: Mapping[str, Any]) -> Any:
    return record.get("epoch")


def _epoch(line: str) -> Any:
    """The epoch of a JSON line; None for a torn or foreign line."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record.get("epoch") if isinstance(record, dict) else None
