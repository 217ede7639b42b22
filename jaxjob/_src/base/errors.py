"""The public exceptions of jaxjob (each subclasses the closest builtin).

Each public exception's ``__module__`` is ``"jaxjob"``, where users import it from:
tracebacks, reprs and pickles name ``jaxjob.Preempted``, never the module that defines it.
"""

from __future__ import annotations

from typing import Any

import jax

__all__ = [
    "CheckpointInUseError",
    "CheckpointSaveError",
    "CorruptCheckpointError",
    "Preempted",
    "as_save_error",
    "pickled",
]


def pickled(err: BaseException) -> tuple[Any, ...]:
    """``err.__reduce__()`` for an exception whose ``__init__`` builds its message.

    Pickle rebuilds an exception by calling its class with ``args`` (its message), which such
    an ``__init__`` refuses or garbles; with this it is rebuilt from its message and attributes,
    in any process.

    Example:
        >>> import pickle
        >>> import jaxjob
        >>> err = pickle.loads(pickle.dumps(jaxjob.Preempted(7)))
        >>> err.epoch, str(err) == str(jaxjob.Preempted(7))
        (7, True)
    """
    return _rebuilt, (type(err), err.args, dict(vars(err)))


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """``cls`` with ``args`` and the attributes ``state``, its ``__init__`` not called."""
    err = cls.__new__(cls, *args)
    err.args = args
    err.__dict__.update(state)
    return err


class CheckpointSaveError(RuntimeError):
    """A checkpoint save failed; ``epoch``, ``db_name`` and ``processes`` say which one, where.

    ``processes`` lists the processes on which it failed (``[0]`` for a
    single process); every process of the job raises or logs the same error.

    Example:
        >>> import jaxjob
        >>> err = jaxjob.CheckpointSaveError(3, "runs/x/local.3", OSError("disk full"))
        >>> str(err)
        "saving checkpoint epoch 3 to 'runs/x/local.3' failed: OSError: disk full"
    """

    __module__ = "jaxjob"

    def __init__(
        self, epoch: int, db: str, cause: BaseException | str, processes: list[int] | None = None
    ) -> None:
        self.processes = [jax.process_index()] if processes is None else list(processes)
        what = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        where = f" on processes {self.processes}" if jax.process_count() > 1 else ""
        super().__init__(f"saving checkpoint epoch {epoch} to {db!r} failed{where}: {what}")
        self.epoch = epoch
        self.db_name = db

    def __reduce__(self) -> tuple[Any, ...]:
        return pickled(self)


def with_earlier(err: BaseException, earlier: CheckpointSaveError | None) -> BaseException:
    """``err`` (this save's problem) carrying ``earlier``, a previous save's failure found with it.

    A save round can find both at once: the previous save failed in the background and this
    one cannot start. Only one exception is raised; its handler reports the earlier failure
    first (:func:`earlier_failure`), so that no failed epoch goes unreported.
    """
    if earlier is not None and earlier is not err:
        err.earlier_failure = earlier  # type: ignore[attr-defined]
    return err


def earlier_failure(err: BaseException) -> CheckpointSaveError | None:
    """The previous save's failure that ``err`` carries (see :func:`with_earlier`), or None."""
    return getattr(err, "earlier_failure", None)


def as_save_error(
    epoch: int, where: str, err: BaseException | str, processes: list[int] | None = None
) -> CheckpointSaveError:
    """``err`` as the :class:`CheckpointSaveError` of the save of ``epoch`` at ``where``.

    A save error is returned as it is; another exception becomes the cause.

    Example:
        >>> failure = as_save_error(3, "runs/x/local.3", OSError("disk full"))
        >>> type(failure.__cause__).__name__, as_save_error(3, "elsewhere", failure) is failure
        ('OSError', True)
    """
    if isinstance(err, CheckpointSaveError):
        return err
    failure = CheckpointSaveError(epoch, where, err, processes)
    failure.__cause__ = err if isinstance(err, BaseException) else None
    return failure


class Preempted(RuntimeError):
    """Training stopped on a preemption signal after saving and committing ``epoch``.

    Let it propagate so the process exits non-zero and the scheduler restarts
    the job, which then resumes after ``epoch``.

    Example:
        >>> import jaxjob
        >>> str(jaxjob.Preempted(7))
        'preempted: epoch 7 is saved and committed; run the job again to resume after it'
    """

    __module__ = "jaxjob"

    def __init__(self, epoch: int) -> None:
        super().__init__(
            f"preempted: epoch {epoch} is saved and committed; run the job again to resume after it"
        )
        self.epoch = epoch

    def __reduce__(self) -> tuple[Any, ...]:
        return pickled(self)


class CheckpointInUseError(RuntimeError):
    """Another live process writes this node under this ``db_prefix``; nothing was written."""

    __module__ = "jaxjob"


class CorruptCheckpointError(ValueError):
    """A checkpoint's bytes do not match what was saved (checksum, truncation, missing file)."""

    __module__ = "jaxjob"
