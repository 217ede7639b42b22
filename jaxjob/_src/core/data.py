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
import inspect
import io
import json
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxjob._src.base.checks import is_int
from jaxjob._src.base.log import warn
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
_FRESH, _BYTES, _JSON = 0, 1, 2  # the state buffer's tag: the loader's start, bytes, JSON
_HEADER = 5  # tag (1 byte) and payload length (4 bytes, little-endian)


class IndexCursor:
    """Batches of NumPy arrays in a seeded order, by one global cursor that is checkpointed.

    Data epoch ``e`` visits every sample once, in the order
    ``np.random.default_rng([shuffle_seed, e]).permutation(n)`` (in index
    order without ``shuffle_seed``); a global batch is the next
    ``batch_size`` samples of that stream (it may span two data epochs).
    Process ``p`` of a ``P``-process job gets rows ``p * batch_size // P`` up
    to ``(p + 1) * batch_size // P`` of each global batch. The cursor (data
    epoch, offset) is one value for the whole job: resumed on another process
    count, it is split over the new processes, and no sample is skipped or
    repeated.

    Args:
        data: A NumPy array, or a pytree of them, whose leading axis indexes
            the samples (the same length in every leaf). Each batch reads
            only its rows (a ``np.memmap`` stays on disk); a ``jax.Array`` is
            copied to the host once. Each data epoch's order is a permutation
            of ``len`` indices held in memory (8 bytes a sample).
        batch_size: The global batch size, a multiple of the process count.
        shuffle_seed: The seed of the order, or None for index order.

    Example:
        >>> import numpy as np, jaxjob
        >>> source = jaxjob.data.IndexCursor(np.arange(5), batch_size=2)
        >>> batch, cursor = source.next_batches(np.zeros(2, np.int32), steps=3)
        >>> batch.tolist(), cursor.tolist()
        ([[0, 1], [2, 3], [4, 0]], [1, 1])
    """

    def __init__(self, data: Any, *, batch_size: int, shuffle_seed: int | None = None) -> None:
        lengths = {np.shape(leaf)[0] if np.ndim(leaf) else 0 for leaf in jax.tree.leaves(data)}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(
                "IndexCursor: data must be an array or a pytree of arrays with the same "
                f"non-zero leading length, got leading lengths {sorted(lengths)}"
            )
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"IndexCursor: batch_size must be an int >= 1, got {batch_size!r}")
        if shuffle_seed is not None and not is_int(shuffle_seed):
            raise TypeError(
                f"IndexCursor: shuffle_seed must be an int or None, got {shuffle_seed!r}"
            )
        self.data = jax.tree.map(np.asarray, data)  # a jax.Array: copied to the host once
        self.num_records = lengths.pop()
        self.batch_size = batch_size
        self.shuffle_seed = shuffle_seed
        self._orders: dict[int, np.ndarray] = {}

    def __repr__(self) -> str:
        return (
            f"IndexCursor(<{self.num_records} samples>, batch_size={self.batch_size}, "
            f"shuffle_seed={self.shuffle_seed})"
        )

    def order(self, data_epoch: int) -> np.ndarray:
        """The sample indices of data epoch ``data_epoch``, in the order they are read."""
        if data_epoch not in self._orders:
            if self.shuffle_seed is None:
                found = np.arange(self.num_records)
            else:
                rng = np.random.default_rng([self.shuffle_seed, data_epoch])
                found = rng.permutation(self.num_records)
            self._orders = {k: v for k, v in self._orders.items() if k >= data_epoch - 1}
            self._orders[data_epoch] = found
        return self._orders[data_epoch]

    def indices(self, cursor: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``count`` global sample indices from ``cursor``, and the cursor after them."""
        data_epoch, offset = (int(v) for v in cursor)
        taken: list[np.ndarray] = []
        while count:
            part = self.order(data_epoch)[offset : offset + count]
            taken.append(part)
            count -= len(part)
            offset += len(part)
            if offset == self.num_records:
                data_epoch, offset = data_epoch + 1, 0
        return np.concatenate(taken), np.array([data_epoch, offset], np.int32)

    def next_batches(
        self,
        cursor: np.ndarray,
        steps: int | None,
        *,
        process_index: int | None = None,
        process_count: int | None = None,
    ) -> tuple[Any, np.ndarray]:
        """This process's rows of the next ``steps`` global batches (stacked), and the new cursor.

        Args:
            cursor: ``[data epoch, offset]``.
            steps: How many global batches; None: one batch, not stacked.
            process_index: The process whose rows to read (default: this one).
            process_count: The processes the batches are split over (default: the job's).

        Raises:
            ValueError: If ``batch_size`` is not a multiple of the process count.
        """
        count = jax.process_count() if process_count is None else process_count
        me = jax.process_index() if process_index is None else process_index
        if self.batch_size % count:
            raise ValueError(
                f"IndexCursor: batch_size {self.batch_size} must be a multiple of the process "
                f"count {count}: each process reads an equal part of every global batch"
            )
        taken, cursor = self.indices(cursor, self.batch_size * (steps or 1))
        rows = taken.reshape(steps or 1, count, -1)[:, me].reshape(-1)
        shape = (steps, -1) if steps else (-1,)
        batch = jax.tree.map(lambda a: a[rows].reshape(*shape, *a.shape[1:]), self.data)
        return batch, cursor


class Stateful:
    """A loader with ``get_state()``/``set_state()`` (e.g. Grain's) whose state is checkpointed.

    ``loader`` is an iterator with ``get_state``/``set_state`` (Grain's
    ``DatasetIterator``, ``ElasticIterator``) or an iterable whose iterator
    has them (Grain's ``DataLoader``, ``MapDataset``/``IterDataset``): it is
    iterated once, on its first use. Its state (bytes, or a JSON-serialisable
    value) is kept in a ``uint8`` buffer of ``max_state_bytes``. The loader is
    asked to ``set_state`` only when the workspace's state is not the one it
    left (the first epoch after a resume).

    Args:
        loader: The loader. Each process builds its own (for Grain's
            per-process loaders, over its shard: ``grain.ShardByJaxProcess``).
        shared: False (default): each process has its own state, saved per
            process; resuming on another process count raises. True: every
            process's loader has the same state (Grain's ``ElasticIterator``,
            which re-splits its global batches over the processes it is built
            for): saved once, and restored on any process count (a state
            that differs between processes fails the save).
        max_state_bytes: The size of the state's buffer; a larger state raises.

    Example:
        >>> import jaxjob
        >>> class Counter:  # the smallest loader with a state
        ...     def __init__(self):
        ...         self.n = 0
        ...     def __iter__(self):
        ...         return self
        ...     def __next__(self):
        ...         self.n += 1
        ...         return self.n
        ...     def get_state(self):
        ...         return {"n": self.n}
        ...     def set_state(self, state):
        ...         self.n = state["n"]
        >>> source = jaxjob.data.Stateful(Counter(), max_state_bytes=64)
        >>> batch, state = source.next_batches(source.initial_state(), steps=2)
        >>> batch.tolist(), source.decode(state)
        ([1, 2], {'n': 2})
    """

    def __init__(
        self, loader: Any, *, shared: bool = False, max_state_bytes: int = 1 << 14
    ) -> None:
        if not (_has_state(loader) or isinstance(loader, collections.abc.Iterable)):
            raise TypeError(
                "Stateful: loader must have get_state() and set_state(), or be an iterable whose "
                f"iterator has them (a Grain DataLoader or dataset), got {type(loader).__name__}"
            )
        if not is_int(max_state_bytes) or max_state_bytes <= _HEADER:
            raise ValueError(
                f"Stateful: max_state_bytes must be an int > {_HEADER}, got {max_state_bytes!r}"
            )
        self.loader = loader
        self.shared = bool(shared)
        self.max_state_bytes = max_state_bytes
        self._iterator: Any = None
        self._start: np.ndarray | None = None  # the loader's state before its first batch
        self._left: np.ndarray | None = None  # the state it was left in after its last batches

    def __repr__(self) -> str:
        return f"Stateful({type(self.loader).__name__}, shared={self.shared})"

    def initial_state(self) -> np.ndarray:
        """The buffer meaning "the loader's own start" (all zeros)."""
        return np.zeros(self.max_state_bytes, np.uint8)

    def encode(self, state: Any) -> np.ndarray:
        """``state`` (bytes, or JSON-serialisable) as a buffer of ``max_state_bytes``.

        Raises:
            TypeError: If it is neither bytes nor JSON-serialisable.
            ValueError: If it does not fit in ``max_state_bytes``.
        """
        if isinstance(state, bytes | bytearray):
            tag, payload = _BYTES, bytes(state)
        else:
            try:
                tag, payload = _JSON, json.dumps(state, sort_keys=True).encode()
            except TypeError as err:
                raise TypeError(
                    f"Stateful: {type(self.loader).__name__}.get_state() returned a "
                    f"{type(state).__name__} that is neither bytes nor JSON-serialisable ({err})"
                ) from None
        if len(payload) + _HEADER > self.max_state_bytes:
            raise ValueError(
                f"Stateful: the state of {type(self.loader).__name__} takes {len(payload)} bytes, "
                f"more than max_state_bytes={self.max_state_bytes} allows (less {_HEADER}): pass "
                "a larger max_state_bytes"
            )
        buffer = self.initial_state()
        buffer[0] = tag
        buffer[1:_HEADER] = np.frombuffer(len(payload).to_bytes(4, "little"), np.uint8)
        buffer[_HEADER : _HEADER + len(payload)] = np.frombuffer(payload, np.uint8)
        return buffer

    def decode(self, buffer: np.ndarray) -> Any:
        """The state a buffer holds; None for :meth:`initial_state`'s."""
        buffer = np.asarray(buffer, np.uint8)
        size = int.from_bytes(buffer[1:_HEADER].tobytes(), "little")
        payload = buffer[_HEADER : _HEADER + size].tobytes()
        tag = int(buffer[0])
        if tag == _FRESH:
            return None
        return payload if tag == _BYTES else json.loads(payload)

    def _iterate(self) -> Any:
        if self._iterator is None:
            found = self.loader if _has_state(self.loader) and _is_iterator(self.loader) else None
            found = found if found is not None else iter(self.loader)
            if not _has_state(found):
                raise TypeError(
                    f"Stateful: the iterator of {type(self.loader).__name__} "
                    f"({type(found).__name__}) has no get_state()/set_state()"
                )
            self._iterator = found
            self._start = self.encode(found.get_state())
        return self._iterator

    def next_batches(self, buffer: np.ndarray, steps: int | None) -> tuple[Any, np.ndarray]:
        """The next ``steps`` batches (stacked) from the state in ``buffer``, and the state after.

        With ``steps=None``: one batch, not stacked.

        Raises:
            ValueError: If the loader runs out of batches.
        """
        iterator = self._iterate()
        buffer = np.asarray(buffer, np.uint8)
        if self._left is None or not np.array_equal(buffer, self._left):
            wanted = self._start if int(buffer[0]) == _FRESH else buffer
            if self._left is not None or not np.array_equal(wanted, self._start):
                iterator.set_state(self.decode(wanted))
        batches = []
        for _ in range(steps or 1):
            try:
                batches.append(next(iterator))
            except StopIteration:
                raise ValueError(
                    f"Stateful: {type(self.loader).__name__} ran out after {len(batches)} of "
                    f"{steps or 1} batches: give it enough data for every epoch (for Grain, "
                    "num_epochs=None repeats the data)"
                ) from None
        self._left = self.encode(iterator.get_state())
        batch = batches[0] if steps is None else jax.tree.map(lambda *xs: np.stack(xs), *batches)
        return batch, self._left


Source = IndexCursor | Stateful


def _has_state(obj: Any) -> bool:
    return callable(getattr(obj, "get_state", None)) and callable(getattr(obj, "set_state", None))


def _is_iterator(obj: Any) -> bool:
    return isinstance(obj, collections.abc.Iterator)


def as_source(source: Any) -> Source:
    """``source`` as a data source: an :class:`IndexCursor`, a :class:`Stateful`, or a loader.

    Raises:
        TypeError: If it is none of those (naming what it is).
    """
    if isinstance(source, IndexCursor | Stateful):
        return source
    if _has_state(source) or (
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
    a task may write a log. Only the names the function itself refers to
    are looked at, not those of the functions it calls.

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
    """The (name, value) of the stateless iterators a plain function refers to."""
    if not isinstance(fn, types.FunctionType):
        return []
    found = inspect.getclosurevars(fn)
    named = {**found.globals, **found.nonlocals}
    defaults = inspect.signature(fn).parameters.values()
    named.update({p.name: p.default for p in defaults if p.default is not p.empty})
    return [
        (name, value)
        for name, value in named.items()
        if _is_iterator(value) and not _has_state(value) and not isinstance(value, io.IOBase)
    ]
