"""Data sources whose position is checkpointed state (``Job.add_data``).

A source feeds an epoch group its batches from a host task, and keeps its
position in the workspace under ``"jaxjob/data/<name>"``: that leaf is saved
with every checkpoint and read back before the first epoch after a resume, so
a resumed job reads the samples an uninterrupted one would.

Two kinds, and one rule for a changed process count:

- :class:`IndexCursor` (index-based, NumPy arrays): the position is one global
  cursor, the same on every process, saved once. Each global batch is the
  next ``batch_size`` samples of a seeded order; process ``p`` of ``P`` takes
  its ``p``-th slice of it. Resumed on another process count, the same cursor
  is split over the new processes: no sample is skipped or repeated.
- :class:`Stateful` (any object with ``get_state()``/``set_state()``, e.g.
  Grain's loaders): by default one state per process (a host-local leaf),
  which cannot be re-split: resuming on another process count raises, naming
  the leaves and both counts. With ``shared=True`` (Grain's
  ``ElasticIterator``, whose state is the same on every process) the state is
  saved once and restored on any process count.
"""

from __future__ import annotations

import collections.abc
import io
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxjob._src.base.log import warn
from jaxjob._src.core import reads
from jaxjob._src.core.index_cursor import IndexCursor
from jaxjob._src.core.stateful import Stateful, has_state, is_iterator
from jaxjob._src.core.workspace import Workspace

__all__ = [
    "STATE_PREFIX",
    "IndexCursor",
    "Source",
    "Stateful",
    "as_source",
    "per_process_states",
    "warn_unsaved_iterators",
]

STATE_PREFIX = "jaxjob/data/"

Source = IndexCursor | Stateful


def as_source(source: Any) -> Source:
    """``source`` as a data source: an :class:`IndexCursor`, a :class:`Stateful`, or a loader.

    Raises:
        TypeError: If it is none of those (naming what it is).
    """
    if isinstance(source, IndexCursor | Stateful):
        return source
    if has_state(source) or (
        isinstance(source, collections.abc.Iterable) and not isinstance(source, np.ndarray)
    ):
        return Stateful(source)
    raise TypeError(
        "add_data: source must be a jaxjob.data.IndexCursor (NumPy arrays), a "
        "jaxjob.data.Stateful, or a loader with get_state()/set_state() (a Grain DataLoader or "
        f"dataset iterator), got {type(source).__name__}"
    )


def is_global(source: Source) -> bool:
    """Whether the source's state is one value for every process (saved once, re-split)."""
    return isinstance(source, IndexCursor) or source.shared


def init_task(source: Source, key: str) -> tuple[Callable[[Workspace], Mapping[str, Any]], bool]:
    """The init task creating the source's state leaf, and whether it is jitted.

    A global state comes from a jitted task (a replicated ``jax.Array``,
    saved once, restored on any process count); a per-process state from a
    host task (a NumPy array: one copy per process).
    """
    if isinstance(source, IndexCursor):
        return (lambda ws: {key: jnp.zeros(2, jnp.int32)}), True
    if source.shared:
        return (lambda ws: {key: jnp.zeros(source.max_state_bytes, jnp.uint8)}), True
    return (lambda ws: {key: source.initial_state()}), False


class Feed:
    """The epoch group's host task of a source: the epoch's batches, and the state after them.

    With a ``sharding``, each leaf of the batches is made one global array of
    every process's rows (``jax.make_array_from_process_local_data``).
    """

    def __init__(
        self, name: str, source: Source, key: str, steps: int | None, sharding: Any = None
    ) -> None:
        self.name, self.source, self.key, self.steps = name, source, key, steps
        self.sharding = sharding
        self.__name__ = f"data:{name}"

    def __call__(self, ws: Workspace) -> dict[str, Any]:
        held = ws[self.key]
        state = np.asarray(held.addressable_data(0)) if isinstance(held, jax.Array) else held
        batch, state = self.source.next_batches(state, self.steps)
        if self.sharding is not None:
            batch = jax.tree.map(
                lambda x: jax.make_array_from_process_local_data(self.sharding, np.asarray(x)),
                batch,
            )
        return {self.name: batch, self.key: _like(held, state)}


def _like(held: Any, value: np.ndarray) -> Any:
    """``value`` with the type and placement of ``held`` (a global ``jax.Array`` or NumPy)."""
    if not isinstance(held, jax.Array):
        return value
    return jax.make_array_from_process_local_data(held.sharding, value, held.shape)


def per_process_states(paths: Iterable[str], sources: Mapping[str, Source]) -> list[str]:
    """The state leaves of per-process sources (which cannot be re-split) among key ``paths``.

    Example:
        >>> import numpy as np
        >>> sources = {"a": IndexCursor(np.arange(4), batch_size=2), "b": Stateful([[1]])}
        >>> per_process_states(["['jaxjob/data/a']", "['jaxjob/data/b']", "['w']"], sources)
        ['jaxjob/data/b']
    """
    paths = set(paths)
    keys = (STATE_PREFIX + name for name, source in sources.items() if not is_global(source))
    return sorted(key for key in keys if f"[{key!r}]" in paths)


def warn_unsaved_iterators(tasks: Iterable[Any], warned: set[str]) -> None:
    """Warns once per task about an epoch task reading a Python iterator jaxjob cannot checkpoint.

    An iterator (a generator, ``iter(list)``, ``map``...) without
    ``get_state()``/``set_state()`` that a task's function refers to (a
    closure variable, a global, a default argument) restarts from its
    beginning in a resumed run: the job then reads other samples than an
    uninterrupted one, silently. Open files (iterators too) are left alone:
    a task may write a log. The function's code is read, not run: its
    comprehensions, lambdas and nested functions, and the helper functions
    it calls (to :data:`~jaxjob._src.core.reads.MAX_DEPTH` calls deep; not
    library code), with the globals, closure variables, defaults and module
    or object attributes they name (:mod:`jaxjob._src.core.reads`).

    Args:
        tasks: The epoch group's tasks.
        warned: Task names already warned about in this run; updated.

    Example:
        >>> import warnings, jaxjob
        >>> batches = iter(range(10))
        >>> task = jaxjob.Task(lambda ws: {"x": next(batches)}, name="load")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_unsaved_iterators([task], set())
        >>> str(caught[0].message).split(":")[0]
        "epoch task 'load' reads the Python iterator 'batches' (range_iterator)"
    """
    for task in tasks:
        if task.name in warned:
            continue
        found = _iterators_of(task.fn)
        if found:
            warned.add(task.name)
            var, value = found[0]
            warn(
                f"epoch task {task.name!r} reads the Python iterator {var!r} "
                f"({type(value).__name__}): jaxjob cannot checkpoint its position, so a resumed "
                "run restarts it from its beginning and reads other samples than an "
                "uninterrupted run. Feed the epoch with job.add_data(name, source): a "
                "jaxjob.data.IndexCursor over arrays, or a loader with get_state()/set_state() "
                "(a Grain DataLoader)"
            )


def _iterators_of(fn: Any) -> list[tuple[str, Any]]:
    """The (name, value) of the stateless iterators a task's function or its helpers read."""
    return [
        (name, value)
        for name, value in reads.named_objects(fn)
        if is_iterator(value) and not has_state(value) and not isinstance(value, io.IOBase)
    ]
