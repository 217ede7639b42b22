"""Retention policies: which committed epochs a checkpoint manager keeps.

Public as :mod:`jaxjob.keep`, whose docstring says more. A policy selects
from :class:`EpochRecord` s, one per committed epoch, oldest first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from jaxjob._src.base.checks import is_int

__all__ = [
    "Best",
    "EpochRecord",
    "Every",
    "Last",
    "Policy",
    "kept",
    "kept_records",
    "metric_names",
    "normalize",
]


@dataclasses.dataclass(frozen=True)
class EpochRecord:
    """A committed epoch as retention sees it.

    Attributes:
        epoch: The epoch.
        metrics: The scalars its manifests store (what :class:`Best` ranks by).
        readable: False if a manifest of it could not be read: the epoch is kept.
    """

    epoch: int
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    readable: bool = True


def _positive(value: object, argument: str, policy: str) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"{policy}: {argument} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Last:
    """Keeps the ``n`` newest committed epochs.

    Example:
        >>> sorted(kept(Last(2), range(9)))
        [7, 8]
    """

    n: int

    def __post_init__(self) -> None:
        _positive(self.n, "n", "Last")

    def select(self, records: Sequence[EpochRecord]) -> set[int]:
        """The epochs of ``records`` (oldest first) this policy keeps."""
        return {r.epoch for r in records[-self.n :]}


@dataclasses.dataclass(frozen=True)
class Every:
    """Keeps the epochs divisible by ``k`` (epoch 0 included).

    Example:
        >>> sorted(kept(Every(4), range(9)))
        [0, 4, 8]
    """

    k: int

    def __post_init__(self) -> None:
        _positive(self.k, "k", "Every")

    def select(self, records: Sequence[EpochRecord]) -> set[int]:
        """The epochs of ``records`` this policy keeps."""
        return {r.epoch for r in records if r.epoch % self.k == 0}


@dataclasses.dataclass(frozen=True)
class Best:
    """Keeps the ``n`` epochs with the best value of the scalar ``name``.

    ``name`` is an output of the epoch group (or a persistent scalar leaf);
    its value is stored in each checkpoint's manifest, so the ranking
    survives restarts. Epochs saved without it (epoch 0, usually) or with a
    NaN are not ranked. Ties go to the newer epoch.

    Args:
        name: The scalar's name.
        n: How many epochs to keep.
        mode: ``"max"`` (higher is better) or ``"min"``.

    Example:
        >>> metrics = {1: {"acc": 0.5}, 2: {"acc": 0.9}, 3: {"acc": 0.7}}
        >>> sorted(kept(Best("acc"), [1, 2, 3], metrics))
        [2, 3]
    """

    name: str
    n: int = 1
    mode: Literal["max", "min"] = "max"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Best: name must be a non-empty str, got {self.name!r}")
        _positive(self.n, "n", "Best")
        if self.mode not in ("max", "min"):
            raise ValueError(f"Best: mode must be 'max' or 'min', got {self.mode!r}")

    def select(self, records: Sequence[EpochRecord]) -> set[int]:
        """The ``n`` epochs of ``records`` with the best ``name`` in their metrics."""
        sign = 1.0 if self.mode == "max" else -1.0
        ranked = sorted(
            (
                (sign * value, r.epoch)
                for r in records
                if (value := r.metrics.get(self.name)) is not None and not math.isnan(value)
            ),
            reverse=True,
        )
        return {e for _, e in ranked[: self.n]}


Policy = Last | Every | Best
# Their public path, in reprs, help() and pickles; set once the dataclasses exist (a decorator
# reads the module a class's __module__ names, which need not be imported yet).
for _policy in (Last, Every, Best):
    _policy.__module__ = "jaxjob.keep"


def normalize(keep: Policy | Iterable[Policy] | None) -> tuple[Policy, ...] | None:
    """``keep`` as a tuple of policies (None: keep everything).

    Raises:
        ValueError: If ``keep`` is not a policy of :mod:`jaxjob.keep` or a list of them.

    Example:
        >>> normalize(Last(2))
        (Last(n=2),)
    """
    if keep is None:
        return None
    policies = (keep,) if isinstance(keep, Policy) else tuple(keep) if _iterable(keep) else None
    if not policies or not all(isinstance(p, Policy) for p in policies):
        raise ValueError(
            "keep must be None, a policy of jaxjob.keep (Last, Every, Best) or a non-empty "
            f"list of them, got {keep!r}"
        )
    return policies


def _iterable(value: object) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)


def metric_names(policies: Sequence[Policy] | None) -> tuple[str, ...]:
    """The scalar names the :class:`Best` policies rank by, in order, once each."""
    names = [p.name for p in policies or () if isinstance(p, Best)]
    return tuple(dict.fromkeys(names))


def kept(
    keep: Policy | Iterable[Policy] | None,
    epochs: Iterable[int],
    metrics: Mapping[int, Mapping[str, float]] | None = None,
) -> set[int]:
    """The epochs of ``epochs`` that ``keep`` keeps: its policies' union, plus the newest.

    Args:
        keep: A policy, a list of them, or None (everything).
        epochs: Committed epochs.
        metrics: For :class:`Best`: epoch -> {name: value}.
    """
    found = metrics or {}
    records = [EpochRecord(e, found.get(e, {})) for e in sorted(set(epochs))]
    return kept_records(normalize(keep), records)


def kept_records(policies: Sequence[Policy] | None, records: Sequence[EpochRecord]) -> set[int]:
    """The epochs of ``records`` (oldest first) to keep: the policies', the newest, the unread.

    Policies None keep every epoch. Otherwise the union of their selections is
    kept, with the newest epoch and every epoch whose record could not be read.

    Example:
        >>> records = [EpochRecord(1), EpochRecord(2, readable=False), EpochRecord(3)]
        >>> sorted(kept_records((Last(1),), records))
        [2, 3]
    """
    if policies is None:
        return {r.epoch for r in records}
    result = {r.epoch for r in records[-1:]} | {r.epoch for r in records if not r.readable}
    for policy in policies:
        result |= policy.select(records)
    return result
