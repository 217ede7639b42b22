"""A save round over any number of node writers, with ONE exchange between the processes.

Both managers save through :func:`save_round` and end their saves through
:func:`end_round`: every writer of this process prepares its part (waiting
on no other process), the processes exchange their posts once (a
:class:`~jaxjob._src.manager.records.SavePost` per node), every writer
concludes from every process's post, and then all of them start or none
does. A single-node manager posts its one node's post as it is; a
multi-node manager posts ``{node: post}`` (``keyed``). A node private to
another process (``owner_process``) is concluded from its owner's post.
Which process deletes is one rule, :func:`jaxjob._src.manager.save.supersede.deleting_process`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from jaxjob._src.base.errors import CheckpointSaveError, as_save_error, earlier_failure
from jaxjob._src.manager.records import ProcessStats, SavePost
from jaxjob._src.manager.save.writer import NodeWriter, SavePlan
from jaxjob._src.multihost import hosts

__all__ = ["Round", "Outcome", "end_round", "save_round"]


@dataclasses.dataclass(frozen=True)
class Round:
    """How the processes take part in a round.

    Attributes:
        what: Names the exchange (in timeout errors).
        keyed: Post ``{node: post}`` (a multi-node manager) instead of one post;
            a multi-node round also reports an unwritable prefix as a save error.
        exchange: Whether the processes exchange their posts at all (not for a
            single node private to one process).
        timeout_s: The least time to wait for the other processes.
    """

    what: str
    keyed: bool
    exchange: bool
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a save round concluded.

    Attributes:
        previous: The first failure of a previous save, on any process and node.
        current: Why this round's save did not start (on any process and node).
        stats: Every process's stats of this save, when it could start everywhere.
    """

    previous: CheckpointSaveError | None
    current: BaseException | None
    stats: tuple[ProcessStats, ...] | None


def save_round(
    writers: Sequence[NodeWriter],
    epoch: int,
    items: Mapping[str, tuple[Mapping[str, Any], Mapping[str, Any] | None]],
    how: Round,
    *,
    accessible: bool = True,
) -> Outcome:
    """Saves ``items`` (``{node: (workspace, outputs)}``) of this process's nodes as ``epoch``.

    Waits on the other processes once (unless ``how.exchange`` is False).
    Nothing is raised for a problem of the save: the outcome says it.

    Raises:
        TypeError, ValueError: For a bad ``epoch`` or leaf name (before anything is written).
        CheckpointInUseError: If another live process writes a node here.
        HostTimeoutError: If another process does not arrive in time.
    """
    own = [w for w in writers if w.own]
    plans = {w.node_name: w.prepare(epoch, *items[w.node_name], accessible=accessible) for w in own}
    timeout = max([how.timeout_s, *(p.timeout_s for p in plans.values())])
    posts = _exchange(how, {n: p.post for n, p in plans.items()}, timeout)
    current, elsewhere = _conclude(writers, plans, posts, how)
    stats = None if current is not None else _stats(posts, how)
    previous, current = _start(own, plans, current)
    return Outcome(previous or elsewhere, current, stats)


def end_round(writers: Sequence[NodeWriter], how: Round) -> CheckpointSaveError | None:
    """Completes every save in flight; returns the first failure of the last saves anywhere.

    Raises:
        HostTimeoutError: If another process does not arrive in time.
    """
    own = [w for w in writers if w.own]
    started = [s for s in (w.pending_started() for w in own) if s is not None]
    failures = {w.node_name: w.finish() for w in own}
    if not how.exchange:
        return next((f for f in failures.values() if f is not None), None)
    timeout = max([how.timeout_s, *(w.wait_s(min(started, default=None)) for w in own)])
    mine = {name: SavePost.outcome(failure) for name, failure in failures.items()}
    posts = _exchange(how, mine, timeout)
    found = []
    for writer in writers:
        if writer.own:
            node_posts = [p[writer.node_name] for p in posts if writer.node_name in p]
            found.append(writer.conclude_end(failures[writer.node_name], node_posts))
        else:
            owner = writer.owner_process
            found.append(_elsewhere(posts[owner][writer.node_name], owner)[0])
    return next((f for f in found if f is not None), None)


def _exchange(
    how: Round, mine: Mapping[str, SavePost], timeout_s: float
) -> list[dict[str, SavePost]]:
    """Every process's posts by node (this process's alone without an exchange)."""
    if not how.exchange:
        return [dict(mine)]
    if how.keyed:
        payload: Any = {name: post.to_json() for name, post in mine.items()}
    else:
        (payload,) = [post.to_json() for post in mine.values()]
    received = hosts.exchange(how.what, payload, timeout_s=timeout_s)
    if how.keyed:
        return [{n: SavePost.from_json(p) for n, p in post.items()} for post in received]
    (name,) = mine
    return [{name: SavePost.from_json(post)} for post in received]


def _conclude(writers, plans: Mapping[str, SavePlan], posts, how: Round):
    """Concludes every node's save from the posts, in node order.

    Returns:
        The first node's problem on any process, and the first failure of a
        previous save of another process's private node (or None).
    """
    problems, elsewhere = [], []
    for writer in writers:
        name = writer.node_name
        if name in plans:
            problem = writer.conclude(plans[name], [p[name] for p in posts if name in p])
            if how.keyed and isinstance(problem, OSError):  # its prefix is not writable here
                problem = as_save_error(plans[name].epoch, plans[name].path, problem)
            problems.append(problem)
        elif writer.private:  # another process's own node
            previous, problem = _elsewhere(posts[writer.owner_process][name], writer.owner_process)
            problems.append(problem)
            elsewhere.append(previous)
    first = next((p for p in problems if p is not None), None)
    return first, next((p for p in elsewhere if p is not None), None)


def _stats(posts: list[dict[str, SavePost]], how: Round) -> tuple[ProcessStats, ...]:
    """Each process's stats of its nodes' saves, from its posts."""
    processes = range(len(posts)) if how.exchange else [jax.process_index()]
    return tuple(
        ProcessStats(p, {db: s for post in node.values() for db, s in post.stats.items()})
        for p, node in zip(processes, posts, strict=True)
    )


def _start(own: Sequence[NodeWriter], plans: Mapping[str, SavePlan], current):
    """Starts each node's save, or none if ``current`` (some node's problem) says so.

    Returns:
        The first previous save's failure, and this save's failure.
    """
    previous = None
    for writer in own:
        plan = plans[writer.node_name]
        try:
            writer.start(plan, cancel=current is not None)
        except CheckpointSaveError as err:
            previous = previous or earlier_failure(err)
            if err.epoch != plan.epoch:
                previous = previous or err
            else:
                current = current or err
        except Exception as err:  # this process's own problem, raised as it is
            previous = previous or earlier_failure(err)
            current = current or err
    return previous, current


def _elsewhere(post: SavePost, owner: int):
    """The previous save's failure and this save's problem of process ``owner`` 's own node."""
    previous = problem = None
    if post.previous:
        epoch, db = post.previous_at
        previous = CheckpointSaveError(epoch, db, f"process {owner}: {post.previous}", [owner])
    if post.problem:
        ((db, stats),) = post.stats.items()
        problem = CheckpointSaveError(stats.epoch, db, f"process {owner}: {post.problem}", [owner])
    return previous, problem
