"""The index-based data source: NumPy arrays in a seeded order, by one global cursor.

Its position (data epoch, offset) is one value for the whole job, saved once
and split over whatever process count resumes it (:mod:`jaxjob._src.core.data`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxjob._src.base.checks import is_int

__all__ = ["IndexCursor"]


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
        shuffle_seed: The seed of the order (an int >= 0), or None for index order.

    Example:
        >>> import numpy as np, jaxjob
        >>> source = jaxjob.data.IndexCursor(np.arange(5), batch_size=2)
        >>> batch, cursor = source.next_batches(np.zeros(2, np.int32), steps=3)
        >>> batch.tolist(), cursor.tolist()
        ([[0, 1], [2, 3], [4, 0]], [1, 1])
    """

    __module__ = "jaxjob.data"  # its public path, in reprs, help() and pickles

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
        if shuffle_seed is not None and shuffle_seed < 0:
            raise ValueError(
                f"IndexCursor: shuffle_seed must be an int >= 0 or None (NumPy seeds are "
                f"non-negative), got {shuffle_seed!r}"
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
