"""Data sources whose position is checkpointed state: feed an epoch group with ``Job.add_data``.

``job.add_data("batch", source, steps=k)`` sets ``ws["batch"]`` in every
epoch (``k`` batches stacked, for ``jax.lax.scan``) and keeps the source's
position in the workspace as ``"jaxjob/data/batch"``: saved with every
checkpoint, read back before the first epoch after a resume. A killed and
resumed job reads every sample exactly once per data epoch, in the order an
uninterrupted run reads them.

- :class:`IndexCursor`: NumPy arrays in a seeded order; one global cursor,
  split over the processes. Resumed on another process count, the cursor is
  split over the new processes: no sample is skipped or repeated.
- :class:`Stateful`: any loader with ``get_state()``/``set_state()`` (Grain's
  ``DataLoader``, dataset iterators; a Grain loader may be passed to
  ``add_data`` as it is). One state per process by default: resuming on another
  process count raises, naming the leaves and both counts. ``shared=True``
  (Grain's ``ElasticIterator``): one state for every process, restored on any
  process count.

Example:
    >>> import numpy as np, jaxjob
    >>> source = jaxjob.data.IndexCursor(np.arange(6), batch_size=3, shuffle_seed=0)
    >>> sorted(source.order(0).tolist())
    [0, 1, 2, 3, 4, 5]
"""

from jaxjob._src.core.data import IndexCursor as IndexCursor
from jaxjob._src.core.data import Stateful as Stateful

__all__ = ["IndexCursor", "Stateful"]
