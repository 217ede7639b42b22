"""Jobs: an init group, an epoch group, a download group, an exit group and stop conditions."""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxjob._src.base.checks import is_int
from jaxjob._src.core import data
from jaxjob._src.core.task import Context, TaskGroup
from jaxjob._src.core.workspace import Workspace

__all__ = ["EPOCH_COUNTER", "Job", "StopCondition", "epoch_limiter"]

EPOCH_COUNTER = "jaxjob/epochs_done"
StopCondition = str | Callable[[Workspace], Any]


class Job(Context):
    """The groups of a training job and the conditions that end its epoch loop.

    The ``init_group`` runs once, when starting from scratch; the keys it
    creates are the persistent state that is checkpointed. The
    ``epoch_group`` runs in a loop until a stop condition holds at the end
    of an epoch. The ``download_group`` and then the ``exit_group`` run once
    at the end. Init and epoch tasks are jitted by default; download and exit
    tasks run on the host by default (they usually do I/O).

    ``with job:`` enters the epoch group, so ``Task(fn)`` inside it adds an
    epoch task, and makes ``Job.current()`` return ``job``.

    Example:
        >>> import jax.numpy as jnp, jaxjob
        >>> job = jaxjob.Job()
        >>> @job.init_group.task
        ... def init(ws):
        ...     return {"x": jnp.zeros(())}
        >>> @job.epoch_group.task
        ... def step(ws):
        ...     return {"x": ws["x"] + 1, "big": ws["x"] + 1 > 2}
        >>> job.add_stop_condition("big")
        >>> job.nodes_to_checkpoint()
        ['local']
    """

    __module__ = "jaxjob"  # its public path, in reprs, help() and pickles

    _kind = "job"

    def __init__(
        self,
        init_group: TaskGroup | None = None,
        epoch_group: TaskGroup | None = None,
        download_group: TaskGroup | None = None,
        exit_group: TaskGroup | None = None,
        stop_conditions: Sequence[StopCondition] | None = None,
        nodes_to_checkpoint: Sequence[str] | None = None,
    ) -> None:
        self.init_group = init_group or TaskGroup(persistent=True, name="init")
        self.init_group.persistent = True
        self.epoch_group = epoch_group or TaskGroup(name="epoch")
        self.download_group = download_group or TaskGroup(jit=False, name="download")
        self.exit_group = exit_group or TaskGroup(jit=False, name="exit")
        self.stop_conditions: list[StopCondition] = []
        for condition in stop_conditions or ():
            self.add_stop_condition(condition)
        self._nodes_to_checkpoint = list(nodes_to_checkpoint) if nodes_to_checkpoint else None
        self._epoch_counter = False
        self._data_sources: dict[str, data.Source] = {}

    def __enter__(self) -> Job:
        super().__enter__()
        self.epoch_group.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.epoch_group.__exit__(*exc_info)
        super().__exit__(*exc_info)

    @classmethod
    def current(cls) -> Job:
        """Returns the innermost job entered with ``with``.

        Raises:
            RuntimeError: If no job is active.
        """
        job = cls._current()
        if job is None:
            raise RuntimeError("Job.current() called outside a `with job:` block")
        return job

    def nodes_to_checkpoint(self) -> list[str]:
        """Node names to checkpoint: the explicit list, or the init group's in first-use order."""
        if self._nodes_to_checkpoint:
            return list(self._nodes_to_checkpoint)
        return self.init_group.used_nodes()

    def add_data(
        self,
        name: str,
        source: Any,
        *,
        steps: int | None = None,
        sharding: jax.sharding.Sharding | None = None,
    ) -> None:
        """Feeds the epoch group ``ws[name]``, the epoch's batches, from a checkpointed source.

        Adds an init task creating the source's state, ``"jaxjob/data/<name>"``
        (persistent: saved with every checkpoint), and a host task to the epoch
        group, at this point of its tasks (add it before the tasks that read
        the batches), that sets ``ws[name]`` and the state after them. After a
        resume the source continues from the state of the checkpoint resumed
        from, so the resumed job reads the samples an uninterrupted one
        would. On another process count an index-based state is split over
        the new processes; a per-process one raises (see :mod:`jaxjob.data`).

        Args:
            name: The workspace name of the batches (an output of each epoch).
            source: A :class:`jaxjob.data.IndexCursor` (NumPy arrays), a
                :class:`jaxjob.data.Stateful`, or a loader with
                ``get_state()``/``set_state()`` (or whose iterator has them:
                a Grain ``DataLoader``), which is wrapped in ``Stateful``.
            steps: How many batches each epoch reads, stacked on a new leading
                axis (for ``jax.lax.scan``); None reads one batch, unstacked.
            sharding: If given, ``ws[name]``'s leaves are global ``jax.Array`` s
                with this sharding, made of every process's rows
                (``jax.make_array_from_process_local_data``; with ``steps``, it
                covers the leading steps axis too, e.g. ``P(None, "batch")``).
                None: this process's rows, as NumPy arrays.

        Raises:
            TypeError: If ``source`` is not a data source, or ``sharding`` not a
                ``jax.sharding.Sharding``.
            ValueError: If ``name`` is not a non-empty string, already fed by
                ``add_data``, or ``steps`` not None or an int >= 1.

        Example:
            >>> import numpy as np, jaxjob
            >>> job = jaxjob.Job()
            >>> source = jaxjob.data.IndexCursor(np.arange(10.0), batch_size=4, shuffle_seed=0)
            >>> job.add_data("batch", source, steps=2)  # ws["batch"]: shape (2, 4)
            >>> [t.name for t in job.init_group.tasks], [t.name for t in job.epoch_group.tasks]
            (['data:batch'], ['data:batch'])
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"add_data: name must be a non-empty string, got {name!r}")
        if name in self._data_sources:
            raise ValueError(
                f"add_data: name {name!r} is already fed by {self._data_sources[name]!r}; "
                "each name takes one source (one init task and one feed task)"
            )
        if steps is not None and (not is_int(steps) or steps < 1):
            raise ValueError(f"add_data: steps must be None or an int >= 1, got {steps!r}")
        if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
            raise TypeError(
                f"add_data: sharding must be a jax.sharding.Sharding or None, got {sharding!r}"
            )
        source = data.as_source(source)
        key = data.STATE_PREFIX + name
        init, jitted = data.init_task(source, key)
        self.init_group.add(init, jit=jitted, name=f"data:{name}")
        feed = data.Feed(name, source, key, steps, sharding)
        self.epoch_group.add(feed, jit=False, name=f"data:{name}")
        self._data_sources[name] = source

    @property
    def data_sources(self) -> Mapping[str, data.Source]:
        """The sources of :meth:`add_data` by name (read-only)."""
        return types.MappingProxyType(self._data_sources)

    def add_stop_condition(self, condition: StopCondition) -> None:
        """Adds a condition checked after every epoch; the loop stops when any holds.

        Args:
            condition: The name of a scalar boolean leaf or epoch output, or a
                callable ``ws -> bool`` of the workspace after the epoch.

        Raises:
            TypeError: If ``condition`` is neither a string nor callable.
        """
        if not (isinstance(condition, str) or callable(condition)):
            raise TypeError(
                "add_stop_condition: condition must be a workspace name (str) or a callable "
                f"ws -> bool, got {type(condition).__name__}"
            )
        self.stop_conditions.append(condition)

    @property
    def epoch_limit(self) -> int | None:
        """The ``num_epochs`` of :func:`epoch_limiter` on this job, or None."""
        limits = [c.num_epochs for c in self.stop_conditions if isinstance(c, _EpochLimit)]
        return limits[-1] if limits else None

    def stop_values(self, ws: Workspace) -> tuple[list[bool], set[str]]:
        """Evaluates the stop conditions on ``ws``.

        Returns:
            The value of each condition, and the names the conditions read.
        """
        recorder = _Recorder(ws)
        values = [_as_bool(condition, recorder) for condition in self.stop_conditions]
        return values, recorder.read


class _Recorder(Workspace):
    """A workspace view that records which names are read."""

    __slots__ = ("read",)

    def __init__(self, ws: Workspace) -> None:
        super().__init__(ws)
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> Any:
        self.read.add(name)
        return super().__getitem__(name)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self.read.add(name)
        return name in self._data


def _as_bool(condition: StopCondition, ws: _Recorder) -> bool:
    if isinstance(condition, str):
        value = ws[condition]
        label = f"stop condition {condition!r}"
    else:
        value = condition(ws)
        label = f"stop condition {getattr(condition, '__name__', condition)!r}"
    shape = np.shape(value)
    if shape not in ((), (1,)):
        raise ValueError(f"{label} must be a scalar boolean, got a value of shape {shape}")
    return bool(np.asarray(value).reshape(()))


class _EpochLimit:
    """Stop condition: the workspace's finished-epoch counter reached ``num_epochs``."""

    def __init__(self, num_epochs: int) -> None:
        self.num_epochs = num_epochs
        self.__name__ = f"epoch_limiter({num_epochs})"

    def __call__(self, ws: Workspace) -> bool:
        return int(ws[EPOCH_COUNTER]) >= self.num_epochs


def _init_counter(ws: Workspace) -> Mapping[str, Any]:
    return {EPOCH_COUNTER: jnp.zeros((), jnp.int32)}


def _count_epoch(ws: Workspace) -> Mapping[str, Any]:
    return {EPOCH_COUNTER: ws[EPOCH_COUNTER] + 1}


def epoch_limiter(job: Job, num_epochs: int) -> None:
    """Stops ``job`` once ``num_epochs`` epochs have finished in total.

    The counter of finished epochs (``"jaxjob/epochs_done"``) is persistent
    state: a resumed job still stops after ``num_epochs`` epochs in all, and
    re-running a finished job with a larger ``num_epochs`` continues it.
    Calling it again on the same job replaces the limit.

    Args:
        job: The job to limit.
        num_epochs: Total number of epochs, at least 1.

    Raises:
        ValueError: If ``num_epochs`` is not a positive integer.

    Example:
        >>> import jaxjob
        >>> job = jaxjob.Job()
        >>> jaxjob.epoch_limiter(job, 3)
        >>> [t.name for t in job.init_group.tasks], [t.name for t in job.epoch_group.tasks]
        (['_init_counter'], ['_count_epoch'])
        >>> jaxjob.epoch_limiter(job, 5)
        >>> job.epoch_limit, len(job.stop_conditions)
        (5, 1)
    """
    if not is_int(num_epochs) or num_epochs < 1:
        raise ValueError(f"epoch_limiter: num_epochs must be an integer >= 1, got {num_epochs!r}")
    if not job._epoch_counter:
        job.init_group.add(_init_counter, jit=True)
        job.epoch_group.add(_count_epoch, jit=True)
        job._epoch_counter = True
    job.stop_conditions = [c for c in job.stop_conditions if not isinstance(c, _EpochLimit)]
    job.add_stop_condition(_EpochLimit(num_epochs))
