"""One ``train``'s epoch records: shown (progress), kept (``history``), stored, written.

Each epoch's record (:mod:`jaxjob._src.run.progress`) goes to the progress
display, ``JobRunner.history``, the run's history file beside the checkpoints
(:mod:`jaxjob._src.run.history`; none without a checkpoint manager) and the
metric writers (:mod:`jaxjob._src.run.writers`; process 0's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from jaxjob._src.run.auto_interval import AutoInterval
from jaxjob._src.run.history import HistoryFile, NoHistory
from jaxjob._src.run.interval import SaveInterval
from jaxjob._src.run.progress import Progress
from jaxjob._src.run.protocol import Manager
from jaxjob._src.run.writers import MetricWriter, MultiWriter

__all__ = ["EpochRecords"]


class EpochRecords:
    """The records of one ``train`` call.

    Args:
        history: The list the records are kept in (``JobRunner.history``, changed in place).
        progress: The names shown after each epoch, or None: nothing is shown.
        writers: The metric writers (only process 0 writes).
        total: The job's epoch limit, if any (the bar's length).

    Attributes:
        progress: The progress display (it also marks failed saves).
        store: The history file, once :meth:`rebuild` found the manager's nodes.
    """

    def __init__(
        self,
        history: list[dict[str, Any]],
        progress: Sequence[str] | None = None,
        writers: Sequence[MetricWriter] = (),
        total: int | None = None,
    ) -> None:
        self.history = history
        first = jax.process_index() == 0
        self.progress = Progress(progress, history, total=total, display=first)
        self._writers = MultiWriter(writers if first else ())
        self.store: HistoryFile | NoHistory = NoHistory()

    def rebuild(self, manager: Manager, epoch: int | None, timeout_s: float) -> None:
        """Starts ``history`` with the records of epochs ``1..epoch`` (None: from scratch).

        Call it once the manager holds its locks. A manager without nodes (a
        runner without a checkpoint manager) keeps no history file.
        """
        nodes = manager.node_names()
        self.store = (
            HistoryFile(manager.db_prefix, nodes, timeout_s=timeout_s) if nodes else NoHistory()
        )
        self.history[:] = self.store.rebuild(epoch)

    def resumed(self) -> None:
        """Gives the writers the rebuilt history."""
        self._writers.resume(self.history)

    def done(
        self,
        epoch: int,
        values: dict[str, float],
        *,
        epoch_time_s: float,
        save_time_s: float,
        saved_to: str | None,
        two_tiers: bool,
        interval: SaveInterval | AutoInterval,
    ) -> None:
        """Records ``epoch``: ``saved_to`` names the tier it was saved to (None: not saved).

        The record names the tier only with ``two_tiers``; with an auto
        ``interval`` it holds the interval then.
        """
        shown = saved_to if two_tiers else None
        record = self.progress.epoch_done(
            epoch, values, epoch_time_s=epoch_time_s, save_time_s=save_time_s, saved_to=shown
        )
        if isinstance(interval, AutoInterval):
            record["save_interval_s"] = interval.seconds
        if saved_to is None:
            self.store.ran(record)
        else:
            self.store.saved(record)
        self._writers.write(record)

    def close(self) -> None:
        """Closes the display, the history file and the writers."""
        self.progress.close()
        self.store.close()
        self._writers.close()
