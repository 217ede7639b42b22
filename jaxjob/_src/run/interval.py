"""When the runner saves: every k epochs, every s seconds, or either, since the last save."""

from __future__ import annotations

import dataclasses
import math
import time

from jaxjob._src.base.checks import is_int, is_number

__all__ = ["SaveInterval"]


def _epochs(value: object) -> int | None:
    if value is not None and (not is_int(value) or value < 1):
        raise ValueError(f"save_every_epochs must be None or an int >= 1, got {value!r}")
    return value


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"save_every_seconds must be None or a positive number of seconds, got {value!r}"
        )
    return float(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SaveInterval:
    """The save policy of :class:`~jaxjob.JobRunner`: how far apart regular saves are.

    An epoch is due when ``every_epochs`` epochs, or ``every_seconds`` of
    wall time, have passed since the last save (either one, when both are
    set). The runner always saves epoch 0, the final epoch and a preempted
    epoch, whatever the interval.

    Attributes:
        every_epochs: Epochs between saves; None to save on time alone.
        every_seconds: Seconds between saves; None to save on epochs alone.

    Example:
        >>> interval = SaveInterval(every_epochs=3, every_seconds=60.0)
        >>> interval.due_by_epochs(2), interval.due_by_time(10.0)
        (False, False)
        >>> interval.due_by_epochs(3), interval.due_by_time(61.0)
        (True, True)
        >>> SaveInterval(every_epochs=0)
        Traceback (most recent call last):
        ...
        ValueError: save_every_epochs must be None or an int >= 1, got 0
    """

    every_epochs: int | None = 1
    every_seconds: float | None = None

    def __post_init__(self) -> None:
        _epochs(self.every_epochs)
        object.__setattr__(self, "every_seconds", _seconds(self.every_seconds))
        if self.every_epochs is None and self.every_seconds is None:
            raise ValueError(
                "save_every_epochs and save_every_seconds are both None; set at least one "
                "(save_every_epochs=1 saves every epoch)"
            )

    def due_by_epochs(self, epochs_since: int) -> bool:
        """Whether ``epochs_since`` epochs since the last save make a save due."""
        return self.every_epochs is not None and epochs_since >= self.every_epochs

    def due_by_time(self, seconds_since: float) -> bool:
        """Whether ``seconds_since`` seconds since the last save make a save due."""
        return self.every_seconds is not None and seconds_since >= self.every_seconds


@dataclasses.dataclass
class SaveClock:
    """Where and when the runner last saved (``time.monotonic``)."""

    epoch: int = 0
    at: float = dataclasses.field(default_factory=time.monotonic)

    def saved(self, epoch: int) -> None:
        """Records a save of ``epoch`` now."""
        self.epoch, self.at = epoch, time.monotonic()

    def seconds_since(self) -> float:
        """Seconds since the last save."""
        return time.monotonic() - self.at
