"""Checks that turn a user's silent mistake into a warning or an error that says what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from jaxjob._src.base.log import warn
from jaxjob._src.core.job import Job
from jaxjob._src.core.session import Program, Session

__all__ = ["check_resume_names", "check_stop_names", "warn_close_outputs"]

CLOSE_CUTOFF = 0.85  # "parms" ~ "params" is 0.91; "params_norm" ~ "params" is 0.71


def warn_close_outputs(outputs: Iterable[str], state: Iterable[str], warned: set[str]) -> None:
    """Warns once per name about an epoch output spelled like a persistent name.

    An epoch task's new name is an output of that epoch, dropped after it:
    ``"parms"`` returned instead of ``"params"`` would train nothing.

    Args:
        outputs: The names the epoch group created.
        state: The persistent names.
        warned: Names already warned about in this run; updated.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_close_outputs(["parms", "loss"], ["params"], set())
        >>> str(caught[0].message).split(";")[0]
        "'parms' is not persistent state"
    """
    state = sorted(state)
    for name in sorted(set(outputs) - warned):
        close = difflib.get_close_matches(name, state, n=1, cutoff=CLOSE_CUTOFF)
        if close:
            warned.add(name)
            warn(
                f"{name!r} is not persistent state; did you mean {close[0]!r}? A name that "
                "only an epoch task returns is an output of that epoch and is dropped after "
                "it; the persistent names are those the init group creates"
            )


def check_resume_names(
    created: Iterable[str], saved: Iterable[str], *, exact: bool, epoch: int, where: str
) -> None:
    """Checks that the init group creates the names the checkpoint resumed from holds.

    Args:
        created: The names the init group's jitted tasks create (traced abstractly).
        saved: The names the checkpoint holds.
        exact: Whether ``created`` is every name the init group creates (no
            host task, whose names cannot be traced); if not, saved names the
            trace lacks are not an error.
        epoch: The epoch resumed from.
        where: The checkpoint directory (or ``db_prefix``).

    Raises:
        ValueError: Naming the names on either side, the epoch and the directory.
    """
    created, saved = set(created), set(saved)
    problems = []
    if created - saved:
        problems.append(f"the init group creates {sorted(created - saved)}, which it lacks")
    if exact and saved - created:
        problems.append(
            f"it holds {sorted(saved - created)}, which the init group no longer creates"
        )
    if problems:
        raise ValueError(
            f"cannot resume from the checkpoint of epoch {epoch} in {where!r}: "
            f"{' and '.join(problems)}. The job's persistent state changed since that checkpoint "
            "was saved: start afresh with another db_prefix, or run the job as it was to resume "
            "it; to carry leaves over, read them with jaxjob.restore in an init task of a new run"
        )


def check_stop_names(job: Job, session: Session) -> None:
    """Raises, before the first epoch, for a stop condition naming nothing the epoch can read.

    The names are the workspace's and those the epoch group's jitted
    program sets (traced abstractly, as its first run would). A host task
    may set any name: with one in the epoch group, only the run can tell.

    Raises:
        KeyError: Naming the stop conditions, the workspace's names and the epoch group's outputs.
    """
    names = [c for c in job.stop_conditions if isinstance(c, str)]
    missing = [n for n in names if n not in session.workspace]
    steps = session.steps(job.epoch_group)
    if not missing or not all(isinstance(step, Program) for step in steps):
        return
    produced = set().union(*(step.set_names(session.workspace) for step in steps))
    missing = [n for n in missing if n not in produced]
    if missing:
        raise KeyError(
            f"stop conditions {missing} name no workspace leaf and no output of the epoch "
            f"group; the workspace holds {sorted(session.workspace)} and the epoch group "
            f"sets {sorted(produced)}: name one of those or pass a callable ws -> bool"
        )
