"""A TensorBoard metric writer through ``tensorboardX`` (``pip install 'jaxjob[tensorboard]'``).

Each record's numbers (:func:`jaxjob._src.run.writers.scalars`) become scalars
at step = the epoch. On ``resume(history)`` the writer reads the event files
already in ``logdir`` the way TensorBoard does (a ``SessionLog.START`` event
at step ``s`` hides every earlier event at a step ``>= s``) and finds the
history's longest prefix of epochs that TensorBoard already shows. It opens a
new event file with ``purge_step`` just after that prefix (so what a killed
run wrote for later epochs is hidden) and writes the history's remaining
records: every epoch is shown once, and none that was written is written again.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jaxjob._src.base import fs
from jaxjob._src.base.log import get_logger
from jaxjob._src.run.writers import scalars

__all__ = ["TensorBoardWriter", "shown_scalars"]

logger = get_logger(__name__)
EXTRA = "pip install 'jaxjob[tensorboard]'"


def _tensorboardx() -> Any:
    try:
        import tensorboardX
    except ImportError as err:
        raise ImportError(f"TensorBoardWriter needs tensorboardX: {EXTRA}") from err
    return tensorboardX


def _records(data: bytes) -> Iterator[bytes]:
    """The records of a TFRecord file's bytes; stops at a torn one (CRCs are not checked)."""
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        end = at + 12 + length + 4
        if end > len(data):
            return
        yield data[at + 12 : at + 12 + length]
        at = end


def _event_files(logdir: str) -> list[str]:
    return [fs.join(logdir, n) for n in fs.listdir(logdir) if "tfevents" in n]


def shown_scalars(logdir: str) -> dict[str, dict[int, float]]:
    """The scalars TensorBoard shows for ``logdir``: ``{tag: {step: value}}``.

    Event files are read in name order (TensorBoard's); a ``SessionLog.START``
    event at step ``s`` (``purge_step``) hides the earlier events at steps ``>= s``.

    Raises:
        ImportError: Without ``tensorboardX`` (its protocol buffers are read).

    Example:
        >>> import tempfile
        >>> shown_scalars(tempfile.mkdtemp())
        {}
    """
    event_pb2 = _tensorboardx().proto.event_pb2
    shown: dict[str, dict[int, float]] = {}
    for path in sorted(_event_files(logdir)):
        for data in _records(fs.read_bytes(path)):
            event = event_pb2.Event()
            try:
                event.ParseFromString(data)
            except Exception:  # noqa: BLE001 (protobuf's DecodeError: a damaged record)
                break
            if event.HasField("session_log") and event.session_log.status == 1:  # START
                for steps in shown.values():
                    for step in [s for s in steps if s >= event.step]:
                        del steps[step]
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    shown.setdefault(value.tag, {})[event.step] = value.simple_value
    return {tag: steps for tag, steps in shown.items() if steps}


class TensorBoardWriter:
    """Writes each epoch record's numbers as TensorBoard scalars (step = epoch) under ``logdir``.

    The tags are the record's keys: the ``progress`` names, ``epoch_time_s``,
    ``save_time_s`` (and ``save_interval_s``). Needs ``tensorboardX``
    (``pip install 'jaxjob[tensorboard]'``). See the module for resume:
    every epoch is shown once, a killed run's later epochs are purged.

    Args:
        logdir: A local directory (created); point ``tensorboard --logdir`` at it.
        flush_every_epoch: Flush the event file after every record (else
            ``tensorboardX`` flushes every 2 minutes and at ``close``).

    Raises:
        ImportError: Without ``tensorboardX``.

    Example:
        >>> import os, tempfile
        >>> import jaxjob
        >>> logdir = tempfile.mkdtemp()
        >>> writer = jaxjob.TensorBoardWriter(logdir)
        >>> writer.resume([])  # from scratch: nothing run yet
        >>> writer.write({"epoch": 1, "loss": 0.5, "epoch_time_s": 0.1, "save_time_s": 0.01})
        >>> writer.close()
        >>> [name.split(".")[:3] for name in os.listdir(logdir)]
        [['events', 'out', 'tfevents']]
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    def __init__(self, logdir: str, *, flush_every_epoch: bool = True) -> None:
        self._tbx = _tensorboardx()
        self.logdir = fs.normalize(logdir, "logdir")
        self.flush_every_epoch = flush_every_epoch
        self._writer: Any = None

    def __repr__(self) -> str:
        return f"TensorBoardWriter({self.logdir!r})"

    def resume(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Opens a new event file; writes the records of ``history`` TensorBoard does not show."""
        self.close()
        fs.makedirs(self.logdir)
        shown = shown_scalars(self.logdir)
        kept = 0
        while kept < len(history) and _shows(shown, history[kept]):
            kept += 1
        purge = history[kept]["epoch"] if kept < len(history) else _next_epoch(history)
        files = len(_event_files(self.logdir))  # name order = write order within a second
        self._writer = self._tbx.SummaryWriter(
            self.logdir, purge_step=purge if shown else None, filename_suffix=f".{files:05d}"
        )
        for record in history[kept:]:
            self._add(record)
        self._writer.flush()

    def write(self, record: Mapping[str, Any]) -> None:
        """Adds the record's numbers at step ``record["epoch"]``.

        Raises:
            RuntimeError: If ``resume`` was not called first.
        """
        if self._writer is None:
            raise RuntimeError("TensorBoardWriter.write before resume: call resume(history) first")
        self._add(record)
        if self.flush_every_epoch:
            self._writer.flush()

    def _add(self, record: Mapping[str, Any]) -> None:
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=record["epoch"])

    def close(self) -> None:
        """Flushes and closes the event file (if open)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _shows(shown: dict[str, dict[int, float]], record: Mapping[str, Any]) -> bool:
    """Whether TensorBoard shows every number of ``record`` at its epoch."""
    return all(record["epoch"] in shown.get(tag, {}) for tag in scalars(record))


def _next_epoch(history: Sequence[Mapping[str, Any]]) -> int:
    return history[-1]["epoch"] + 1 if history else 1
