"""What the processes of a job agree on at a checkpoint boundary, and the stats they share."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from jaxjob._src.base.errors import CheckpointSaveError
from jaxjob._src.checkpoint.leaf_spec import UnstorableLeafError
from jaxjob._src.manager.records import ProcessStats, SavePost, Stats, failed_processes
from jaxjob._src.multihost import hosts

__all__ = ["conclude", "gather_stats", "merge_stats", "mismatch"]


def conclude(
    posts: Sequence[SavePost],
    epoch: int | None,
    path: str | None,
    previous: CheckpointSaveError | None,
    problem: BaseException | None,
    *,
    private: bool,
    record: Callable[..., CheckpointSaveError],
) -> tuple[CheckpointSaveError | None, BaseException | None]:
    """The previous save's failure and this save's problem on any process, from one node's posts.

    A previous failure elsewhere is recorded through ``record`` (counted
    once: replacing this process's own record of it). A problem is named
    with the processes it happened on; a leaf refused here is raised as it is.
    """
    me = [0] if private else [jax.process_index()]
    failed, text = failed_processes([p.previous for p in posts])
    if failed and failed != me:
        at = posts[failed[0]].previous_at
        previous = record(at[0], at[1], text, failed, count=previous is None)
    problems, text = failed_processes([p.problem for p in posts])
    if problems == me or isinstance(problem, UnstorableLeafError):
        return previous, problem  # a refused leaf is raised as it is wherever it is refused
    if problems:
        return previous, CheckpointSaveError(epoch, path, text, problems)
    disagreement = mismatch(posts)
    return previous, (ValueError(disagreement) if disagreement else None)


def mismatch(posts: Sequence[SavePost]) -> str | None:
    """Describes the first leaf that the processes' posts disagree on, or None.

    Each post has ``host_local`` (manifest kinds of host-local leaves, which
    must have the same shape and dtype everywhere) and ``replicated``
    (digests of single-process ``jax.Array`` s, which must be equal).
    """
    return _host_local_mismatch(posts) or _replicated_mismatch(posts)


def _host_local_mismatch(posts: Sequence[SavePost]) -> str | None:
    """Describes the first host-local leaf whose kind, shape or dtype differs between processes."""
    for process, post in enumerate(posts[1:], start=1):
        for name in sorted(set(posts[0].host_local) | set(post.host_local)):
            here, there = posts[0].host_local.get(name), post.host_local.get(name)
            if here != there:
                return (
                    f"host-local leaf {name} differs between processes: {_json(here)} on process "
                    f"0, {_json(there)} on process {process}; every process must hold host-local "
                    "leaves of the same shape and dtype"
                )
    return None


def _json(check: Any) -> Any:
    return None if check is None else check.to_json()


def _replicated_mismatch(posts: Sequence[SavePost]) -> str | None:
    """Names the first single-process ``jax.Array`` whose value differs between processes."""
    for process, post in enumerate(posts[1:], start=1):
        for where, digest in sorted(posts[0].replicated.items()):
            if post.replicated.get(where) != digest:
                return (
                    f"workspace leaf {where} is a jax.Array on one device of each process, and "
                    f"its value on process {process} differs from process 0's; make it a global "
                    "array (shard or replicate it over a mesh of all processes' devices) or, "
                    "to keep a copy per process, a NumPy array"
                )
    return None


def gather_stats(
    stats: Mapping[str, Stats], timeout_s: float, *, exchange: bool = True
) -> dict[str, Any]:
    """Every process's stats of the last action, per checkpoint directory (see :func:`merge_stats`).

    With ``exchange=False`` only this process's stats are used.
    """
    mine = ProcessStats(jax.process_index(), dict(stats))
    if not exchange:
        return merge_stats([mine], stats)
    posts = hosts.exchange("the checkpoint stats", mine.to_json(), timeout_s=timeout_s)
    return merge_stats([ProcessStats.from_json(p) for p in posts], stats)


def merge_stats(posts: Sequence[ProcessStats], stats: Mapping[str, Stats]) -> dict[str, Any]:
    """Merges the processes' stats per directory into the JSON metadata handlers get.

    Each entry gets ``hosts`` (each process's ``duration_s``, ``bytes`` and
    ``error``), ``slowest_process`` (the one that dominated), the longest
    ``duration_s``, the total ``bytes`` and every process's errors; its other
    fields come from this process's ``stats``. A directory a process did not
    touch has no entry of that process.

    Example:
        >>> posts = [ProcessStats(0, {"a.1": Stats(1, bytes=4, duration_s=1.0)}),
        ...          ProcessStats(1, {"a.1": Stats(1, bytes=4, duration_s=2.0)})]
        >>> merged = merge_stats(posts, {})["a.1"]
        >>> merged["duration_s"], merged["bytes"], merged["slowest_process"], merged["error"]
        (2.0, 8, 1, None)
    """
    merged: dict[str, Any] = {}
    for db in sorted({db for post in posts for db in post.stats}):
        per = [{"process": p.process, **p.stats[db].to_json()} for p in posts if db in p.stats]
        durations = [h.get("duration_s") or 0.0 for h in per]
        errors = [f"process {h['process']}: {h['error']}" for h in per if h.get("error")]
        own = stats[db].to_json() if db in stats else {k: v for k, v in per[0].items()}
        own.pop("process", None)
        merged[db] = {
            **own,
            "duration_s": max(durations),
            "bytes": sum(h.get("bytes") or 0 for h in per),
            "error": "; ".join(errors) or None,
            "slowest_process": per[max(range(len(per)), key=durations.__getitem__)]["process"],
            "hosts": per,
        }
    return merged
