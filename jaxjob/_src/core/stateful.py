"""The loader-state data source: any loader with ``get_state()``/``set_state()`` (Grain's).

Its state is kept in a fixed-size ``uint8`` buffer, saved with every
checkpoint (:mod:`jaxjob._src.core.data`).
"""

from __future__ import annotations

import collections.abc
import json
from typing import Any

import jax
import numpy as np

from jaxjob._src.base.checks import is_int

__all__ = ["Stateful", "has_state", "is_iterator"]

_FRESH, _BYTES, _JSON = 0, 1, 2  # the state buffer's tag: the loader's start, bytes, JSON
_HEADER = 5  # tag (1 byte) and payload length (4 bytes, little-endian)


class Stateful:
    """A loader with ``get_state()``/``set_state()`` (e.g. Grain's) whose state is checkpointed.

    ``loader`` is an iterator with ``get_state``/``set_state`` (Grain's
    ``DatasetIterator``, ``ElasticIterator``) or an iterable whose iterator
    has them (Grain's ``DataLoader``, ``MapDataset``/``IterDataset``): it is
    iterated once, on its first use. Its state (bytes, or a JSON-serialisable
    value) is kept in a ``uint8`` buffer of ``max_state_bytes``. The loader is
    asked to ``set_state`` only when the workspace's state is not the one it
    is at (the first epoch after a resume, or a retry after a read failed partway).

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

    __module__ = "jaxjob.data"  # its public path, in reprs, help() and pickles

    def __init__(
        self, loader: Any, *, shared: bool = False, max_state_bytes: int = 1 << 14
    ) -> None:
        if not (has_state(loader) or isinstance(loader, collections.abc.Iterable)):
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
        self._at: np.ndarray | None = None  # the state the iterator is at; None: not known

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
            found = self.loader if has_state(self.loader) and is_iterator(self.loader) else None
            found = found if found is not None else iter(self.loader)
            if not has_state(found):
                raise TypeError(
                    f"Stateful: the iterator of {type(self.loader).__name__} "
                    f"({type(found).__name__}) has no get_state()/set_state()"
                )
            self._iterator = found
            self._start = self._at = self.encode(found.get_state())
        return self._iterator

    def next_batches(self, buffer: np.ndarray, steps: int | None) -> tuple[Any, np.ndarray]:
        """The next ``steps`` batches (stacked) from the state in ``buffer``, and the state after.

        With ``steps=None``: one batch, not stacked.

        Raises:
            ValueError: If the loader runs out of batches.
        """
        iterator = self._iterate()
        buffer = np.asarray(buffer, np.uint8)
        wanted = self._start if int(buffer[0]) == _FRESH else buffer
        if self._at is None or not np.array_equal(wanted, self._at):
            iterator.set_state(self.decode(wanted))
        self._at = None  # a read that fails partway leaves the iterator somewhere unknown
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
        self._at = self.encode(iterator.get_state())
        batch = batches[0] if steps is None else jax.tree.map(lambda *xs: np.stack(xs), *batches)
        return batch, self._at


def has_state(obj: Any) -> bool:
    return callable(getattr(obj, "get_state", None)) and callable(getattr(obj, "set_state", None))


def is_iterator(obj: Any) -> bool:
    return isinstance(obj, collections.abc.Iterator)
