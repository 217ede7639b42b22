"""Which file system a local path lies on, from the mount table (Linux ``/proc/self/mounts``).

A checkpoint on a RAM disk (``tmpfs``, ``ramfs``) is read through a memory
map (:mod:`jaxjob._src.internals.orbax_private`): its pages are already in
memory, and a read through a map can fail with no I/O error there.
"""

from __future__ import annotations

import os
import re

__all__ = ["RAM_FILESYSTEMS", "filesystem_type", "ram_backed"]

RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
_MOUNTS = "/proc/self/mounts"


def _unescape(field: str) -> str:
    r"""A mount table field with its octal escapes (``\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(table: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of each line of the mount table, in its order."""
    found = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            found.append((_unescape(fields[1]), fields[2]))
    return found


def filesystem_type(path: str, table: str | None = None) -> str | None:
    r"""The type of the file system that holds the local ``path`` (``"ext4"``, ``"tmpfs"``).

    The mount that holds a path is the one with the longest mount point above
    it (the last one mounted there, if several are). ``path`` need not exist;
    symbolic links in it are not followed (:func:`ram_backed` resolves them).

    Args:
        path: A local path.
        table: The mount table's text (default: this process's, read now).

    Returns:
        The type, or None where there is no mount table (not Linux).

    Example:
        >>> table = "/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n"
        >>> filesystem_type("/dev/shm/run/0", table), filesystem_type("/dev/shmx", table)
        ('tmpfs', 'ext4')
    """
    if table is None:
        try:
            with open(_MOUNTS) as f:
                table = f.read()
        except OSError:
            return None
    path = os.path.abspath(path)
    best, found = -1, None
    for point, kind in _mounts(table):
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, found = len(point), kind
    return found


def ram_backed(path: str) -> bool:
    """Whether the local ``path`` lies on a RAM disk (``tmpfs`` or ``ramfs``).

    Example:
        >>> ram_backed("/proc/no/such/file")
        False
    """
    return filesystem_type(os.path.realpath(path)) in RAM_FILESYSTEMS
