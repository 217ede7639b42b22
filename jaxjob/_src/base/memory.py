"""How much host memory a save may still use, so that a save that cannot fit is refused, not killed.

A save holds, beside the workspace, up to about one more copy of the bytes
it writes while Orbax and TensorStore write them (measured here as a
cgroup's peak usage, the written files' page cache included: 0.65-0.94x
for 384 MiB-1 GiB saves, async or not). Before a save starts, its process
compares :data:`SAVE_OVERHEAD` times those bytes with the memory it may still use: the kernel's
``MemAvailable`` and, inside a container, what its cgroup's limit leaves
(v2 ``memory.max``, v1 ``memory.limit_in_bytes``). A save that cannot fit
fails as a save failure (logged and reported, or raised under
``on_save_error="raise"``) with a message giving both figures; otherwise
the out-of-memory killer would end the job in the middle of the write.
"""

from __future__ import annotations

import ctypes
import os
import threading

from jaxjob._src.base.log import get_logger

__all__ = ["SAVE_OVERHEAD", "available_bytes", "check_room", "return_freed_buffers"]

logger = get_logger(__name__)

SAVE_OVERHEAD = 1.0  # host bytes a save uses beside the workspace, per byte it writes
_V1 = "/sys/fs/cgroup/memory"
_V2 = "/sys/fs/cgroup"


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cgroup_dirs() -> list[str]:
    """This process's memory cgroup directories, innermost first (v2 and v1 mounts)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        mount = _V2 if controllers == "" else _V1 if "memory" in controllers.split(",") else None
        if mount is None:
            continue
        parts = [p for p in path.split("/") if p]
        for start in range(len(parts) + 1):  # the mount may show the cgroup as its root
            candidate = os.path.join(mount, *parts[start:])
            if os.path.isdir(candidate):
                found.append(candidate)
                break
    return found


def _reclaimable(directory: str) -> int:
    """Clean page cache, which a cgroup's usage counts and the kernel reclaims (memory.stat).

    Active and inactive file pages less those dirty, under writeback or
    mapped (the libraries a process runs from: evicted, they fault back in);
    on cgroup v1 the hierarchical (``total_``) figures, as its usage is.
    """
    stat: dict[str, int] = {}
    try:
        with open(os.path.join(directory, "memory.stat")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                stat[key] = int(value)
    except (OSError, ValueError):
        return 0
    prefix = "total_" if "total_inactive_file" in stat else ""
    clean = sum(stat.get(prefix + k, 0) for k in ("active_file", "inactive_file"))
    busy = ("dirty", "writeback", "mapped_file", "file_dirty", "file_writeback", "file_mapped")
    return max(0, clean - sum(stat.get(prefix + k, 0) for k in busy))


def _cgroup_room(reclaim: bool = True) -> int | None:
    """What this process's cgroup limit leaves (reclaimable page cache aside), or None.

    ``reclaim=False``: without counting the reclaimable page cache as room (a
    lower bound, without reading ``memory.stat``).
    """
    rooms = []
    for directory in _cgroup_dirs():
        for limit_file, usage_file in (
            ("memory.max", "memory.current"),
            ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        ):
            limit = _read_int(os.path.join(directory, limit_file))
            usage = _read_int(os.path.join(directory, usage_file))
            if limit is not None and usage is not None and limit < 1 << 60:
                used = usage - (_reclaimable(directory) if reclaim else 0)
                rooms.append(max(0, limit - used))
    return min(rooms) if rooms else None


def available_bytes() -> int | None:
    """Host memory this process may still use: ``MemAvailable`` capped by its cgroup, if known.

    Example:
        >>> room = available_bytes()
        >>> room is None or room >= 0
        True
    """
    return _room(reclaim=True)


def _room(*, reclaim: bool) -> int | None:
    known = [n for n in (_mem_available(), _cgroup_room(reclaim)) if n is not None]
    return min(known) if known else None


def check_room(nbytes: int, what: str, budget: int | None = None) -> None:
    """Raises if a save writing ``nbytes`` from this process would not fit in its memory.

    Under a host-memory ``budget`` (``max_host_bytes``) the save needs at
    most that much beside the workspace.

    Raises:
        MemoryError: Giving the bytes needed and the bytes available.
    """
    need = int(SAVE_OVERHEAD * nbytes)
    need = need if budget is None else min(need, budget)
    lower = _room(reclaim=False)  # enough without reading memory.stat: the usual case
    if lower is None or need <= lower:
        return
    room = available_bytes()
    if room is None or need <= room:
        return
    raise MemoryError(
        f"{what} writes {nbytes / 2**20:.0f} MiB from this process and needs about "
        f"{need / 2**20:.0f} MiB of host memory beside the workspace, but only "
        f"{room / 2**20:.0f} MiB are available (MemAvailable, and the cgroup limit if any): "
        "it was not started, so the job is not killed mid-write; free host memory, raise the "
        "limit, or save less per process"
    )


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_MMAP_THRESHOLD = 2**20  # buffers of 1 MiB or more: mapped, and unmapped when freed
_returned = threading.Lock()
_returning: bool | None = None  # None: not tried yet


def return_freed_buffers() -> bool:
    """Makes glibc's ``malloc`` give freed buffers of 1 MiB or more back to the kernel at once.

    glibc raises its mmap threshold each time a mapped buffer is freed (up
    to 32 MiB), after which buffers of up to that size come from per-thread
    arenas that keep them once freed. TensorStore's read and write buffers
    are freed from its own threads, so a restore's peak resident memory was
    up to 1.7x the workspace while what was in flight was far less
    (``benchmarks/README.md``). A fixed threshold (``mallopt(M_MMAP_THRESHOLD)``,
    what ``MALLOC_MMAP_THRESHOLD_`` sets for a whole program) stops that.
    It is process-wide, so jaxjob sets it only under a host-memory budget
    (``max_host_bytes``), once. Elsewhere than glibc it does nothing.

    Returns:
        Whether the threshold is fixed (False where ``malloc`` is not glibc's).

    Example:
        >>> return_freed_buffers() in (True, False)
        True
    """
    global _returning
    with _returned:
        if _returning is None:
            _returning = _mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
            if not _returning:
                logger.info("malloc is not glibc's: freed buffers are returned as it decides")
        return _returning


def _mallopt(param: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(param, value) == 1
