"""What the processes of a job agree on at a checkpoint boundary, and the stats they share."""

from __future__ import annotations

from typing import Any

import jax

from jaxjob._src.multihost import hosts

__all__ = ["failures", "gather_stats", "merge_stats", "mismatch"]


def failures(posts: list[dict[str, Any]], key: str) -> tuple[list[int], str]:
    """The processes whose post has a message under ``key``, and those messages joined.

    Example:
        >>> failures([{"error": None}, {"error": "OSError: disk full"}], "error")
        ([1], 'process 1: OSError: disk full')
    """
    processes = [p for p, post in enumerate(posts) if post[key]]
    return processes, "; ".join(f"process {p}: {posts[p][key]}" for p in processes)


def mismatch(posts: list[dict[str, Any]]) -> str | None:
    """Describes the first leaf that the processes' posts disagree on, or None.

    Each post has ``host_local`` (manifest kinds of host-local leaves, which
    must have the same shape and dtype everywhere) and ``replicated``
    (digests of single-process ``jax.Array`` s, which must be equal).
    """
    return _host_local_mismatch(posts) or _replicated_mismatch(posts)


def _host_local_mismatch(posts: list[dict[str, Any]]) -> str | None:
    """Describes the first host-local leaf whose kind, shape or dtype differs between processes."""
    for process, post in enumerate(posts[1:], start=1):
        for name in sorted(set(posts[0]["host_local"]) | set(post["host_local"])):
            here, there = posts[0]["host_local"].get(name), post["host_local"].get(name)
            if here != there:
                return (
                    f"host-local leaf {name} differs between processes: {here} on process 0, "
                    f"{there} on process {process}; every process must hold host-local leaves "
                    "of the same shape and dtype"
                )
    return None


def _replicated_mismatch(posts: list[dict[str, Any]]) -> str | None:
    """Names the first single-process ``jax.Array`` whose value differs between processes."""
    for process, post in enumerate(posts[1:], start=1):
        for where, digest in sorted(posts[0]["replicated"].items()):
            if post["replicated"].get(where) != digest:
                return (
                    f"workspace leaf {where} is a jax.Array on one device of each process, and "
                    f"its value on process {process} differs from process 0's; make it a global "
                    "array (shard or replicate it over a mesh of all processes' devices) or, "
                    "to keep a copy per process, a NumPy array"
                )
    return None


def gather_stats(
    stats: dict[str, Any], timeout_s: float, *, exchange: bool = True
) -> dict[str, Any]:
    """Every process's stats of the last action, per checkpoint directory (see :func:`merge_stats`).

    With ``exchange=False`` only this process's stats are used.
    """
    mine = {"stats": stats, "process": jax.process_index()}
    posts = (
        hosts.exchange("the checkpoint stats", mine, timeout_s=timeout_s) if exchange else [mine]
    )
    return merge_stats(posts, stats)


def merge_stats(posts: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    """Merges the processes' stats posts (``{"process": p, "stats": {db: {...}}}``) per directory.

    Each entry gets ``hosts`` (each process's ``duration_s``, ``bytes`` and
    ``error``), ``slowest_process`` (the one that dominated), the longest
    ``duration_s``, the total ``bytes`` and every process's errors; its other
    fields come from this process's ``stats``. A directory a process did not
    touch has no entry of that process.

    Example:
        >>> posts = [{"process": 0, "stats": {"a.1": {"duration_s": 1.0, "bytes": 4}}},
        ...          {"process": 1, "stats": {"a.1": {"duration_s": 2.0, "bytes": 4}}}]
        >>> merged = merge_stats(posts, {})["a.1"]
        >>> merged["duration_s"], merged["bytes"], merged["slowest_process"], merged["error"]
        (2.0, 8, 1, None)
    """
    merged: dict[str, Any] = {}
    for db in sorted({db for post in posts for db in post["stats"]}):
        per = [
            {"process": post["process"], **post["stats"][db]}
            for post in posts
            if db in post["stats"]
        ]
        durations = [h.get("duration_s") or 0.0 for h in per]
        errors = [f"process {h['process']}: {h['error']}" for h in per if h.get("error")]
        merged[db] = {
            **stats.get(db, {k: v for k, v in per[0].items() if k != "process"}),
            "duration_s": max(durations),
            "bytes": sum(h.get("bytes") or 0 for h in per),
            "error": "; ".join(errors) or None,
            "slowest_process": per[max(range(len(per)), key=durations.__getitem__)]["process"],
            "hosts": per,
        }
    return merged
