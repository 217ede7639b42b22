"""A save interval chosen from a cost model: Young's and Daly's optimal checkpoint interval.

A job that fails, on average, every ``M`` seconds (its mean time between
failures) and pays ``C`` seconds of training time per save loses, per unit of
time, about ``C / τ`` to saving and ``τ / (2 M)`` to the work redone after a
failure, for saves ``τ`` seconds of computing apart. Young (1974) found the
minimum at ``τ = √(2 C M)``; Daly (2006, "A higher order estimate of the
optimum checkpoint interval for restart dumps") refined it to::

    τ = √(2 C M) · (1 + ⅓ √(C / (2 M)) + (C / (2 M)) / 9) − C    for C < 2 M
    τ = M                                                        otherwise

``C`` is measured: the time the training thread spent in each save (what the
runner records as ``save_time_s``: the blocked part of an async save, and any
wait for the save before it), the median of the last few (epoch 0's, which
includes the first save's set-up, only until another save is measured). ``M`` is the user's
statement of the job's failure rate (``mtbf_hours``). Saves are then due
``τ + C`` seconds after the last one started, on process 0's clock.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics

from jaxjob._src.base.checks import is_int, is_number
from jaxjob._src.base.log import get_logger
from jaxjob._src.run.interval import SaveInterval

__all__ = ["AutoInterval", "daly_interval_s", "save_policy"]

logger = get_logger(__name__)
_CHANGE_LOGGED = 0.25  # an interval that moves by more than this fraction is logged again


def daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's optimal seconds of work between saves costing ``cost_s``, for an MTBF of ``mtbf_s``.

    Example:
        >>> round(daly_interval_s(10.0, 3600.0), 1)  # Young's first order: 268.3
        261.7
        >>> daly_interval_s(10.0, 4.0)  # a save costs more than twice the MTBF
        4.0
    """
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost_s


@dataclasses.dataclass(kw_only=True)
class AutoInterval:
    """The save policy ``JobRunner(save_every=AutoInterval(...))``: saves Daly's interval apart.

    ``JobRunner(job, ckpt, save_every="auto", mtbf_hours=h)`` is the same as
    ``save_every=AutoInterval(mtbf_hours=h)``. Until a save has been measured,
    every epoch is due: a fresh run measures epoch 0's save, a resumed run the
    save of its first epoch. The runner still saves epoch 0, the final epoch
    and a preempted epoch. The
    interval is logged when first known and when it moves by more than 25 %,
    and each epoch's is in ``runner.history`` (``"save_interval_s"``).

    Attributes:
        mtbf_hours: The job's mean time between failures, in hours.
        window: How many of the latest saves' costs the median is taken over.

    Example:
        >>> import jaxjob
        >>> auto = jaxjob.AutoInterval(mtbf_hours=1.0)
        >>> auto.seconds is None, auto.due_by_time(0.0)  # no cost measured yet: due
        (True, True)
        >>> round(auto.record(10.0), 1)  # τ + C: due 271.7 s after the last save started
        271.7
        >>> auto.due_by_time(200.0), auto.due_by_time(300.0), auto.due_by_epochs(100)
        (False, True, False)
        >>> jaxjob.AutoInterval(mtbf_hours=0)
        Traceback (most recent call last):
        ...
        ValueError: mtbf_hours must be a positive number of hours, got 0
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    mtbf_hours: float
    window: int = 5
    _costs: collections.deque[float] = dataclasses.field(init=False, repr=False)
    _logged: float | None = dataclasses.field(default=None, init=False, repr=False)
    _provisional: float | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        hours = self.mtbf_hours
        if not is_number(hours) or not math.isfinite(hours) or hours <= 0:
            raise ValueError(f"mtbf_hours must be a positive number of hours, got {hours!r}")
        if not is_int(self.window) or self.window < 1:
            raise ValueError(f"window must be an int >= 1, got {self.window!r}")
        self._costs = collections.deque(maxlen=self.window)

    @property
    def cost_s(self) -> float | None:
        """The median cost of the latest saves (seconds), or None before the first."""
        return statistics.median(self._costs) if self._costs else self._provisional

    @property
    def seconds(self) -> float | None:
        """Seconds from one save's start to the next one's: Daly's ``τ`` plus the cost."""
        cost = self.cost_s
        if cost is None:
            return None
        return daly_interval_s(cost, self.mtbf_hours * 3600.0) + cost

    def record(self, cost_s: float, *, provisional: bool = False) -> float:
        """Records the cost of a save that just ran; returns the interval it leads to.

        A ``provisional`` cost (the runner's epoch 0 save, which also sets up
        the saver, the lock and the run) counts only until another is recorded.
        """
        if provisional:
            self._provisional = max(0.0, float(cost_s))
        else:
            self._costs.append(max(0.0, float(cost_s)))
        seconds = self.seconds
        if self._logged is None or abs(seconds - self._logged) > _CHANGE_LOGGED * self._logged:
            logger.info(
                "Saving every %.3g s: Daly's interval for a save cost of %.3g s (median of the "
                "last %d saves) and an MTBF of %g h",
                seconds,
                self.cost_s,
                max(1, len(self._costs)),
                self.mtbf_hours,
            )
            self._logged = seconds
        return seconds

    def due_by_epochs(self, epochs_since: int) -> bool:
        """Never: this policy saves on time alone."""
        return False

    def due_by_time(self, seconds_since: float) -> bool:
        """Whether ``seconds_since`` seconds since the last save started make a save due.

        Before any save was measured: True (the save measures its cost).
        """
        seconds = self.seconds
        return seconds is None or seconds_since >= seconds


def save_policy(
    save_every: object,
    mtbf_hours: object,
    every_epochs: int | None,
    every_seconds: float | None,
) -> SaveInterval | AutoInterval:
    """The runner's save policy from its ``save_every*`` and ``mtbf_hours`` arguments.

    Raises:
        ValueError: If they are of the wrong kind or contradict each other.

    Example:
        >>> save_policy("auto", 2.0, 1, None).mtbf_hours
        2.0
        >>> save_policy(None, None, 3, None)
        SaveInterval(every_epochs=3, every_seconds=None)
        >>> save_policy("auto", None, 1, None)
        Traceback (most recent call last):
        ...
        ValueError: save_every='auto' needs mtbf_hours= (the job's mean time between failures)
    """
    if save_every is None:
        if mtbf_hours is not None:
            raise ValueError(
                f"mtbf_hours={mtbf_hours!r} is only used with save_every='auto'; pass both"
            )
        return SaveInterval(every_epochs=every_epochs, every_seconds=every_seconds)
    if not isinstance(save_every, AutoInterval) and save_every != "auto":
        raise ValueError(
            f"save_every must be None, 'auto' or a jaxjob.AutoInterval, got {save_every!r}"
        )
    if every_seconds is not None or every_epochs not in (1, None):
        raise ValueError(
            f"save_every={save_every!r} chooses the interval itself; leave save_every_epochs "
            f"and save_every_seconds at their defaults (got {every_epochs!r} and {every_seconds!r})"
        )
    if isinstance(save_every, AutoInterval):
        if mtbf_hours is not None:
            raise ValueError("pass mtbf_hours to the AutoInterval, not to the runner as well")
        return save_every
    if mtbf_hours is None:
        raise ValueError(
            "save_every='auto' needs mtbf_hours= (the job's mean time between failures)"
        )
    return AutoInterval(mtbf_hours=mtbf_hours)
