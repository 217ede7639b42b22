"""Where a local path lies: its file system (the mount table), and its real location.

A checkpoint on a RAM disk (``tmpfs``, ``ramfs``) is read through a memory
map (:mod:`jaxjob._src.internals.orbax_kvstore`): its pages are already in
memory, and a read through a map can fail with no I/O error there.

Two paths name the same directory through a symbolic link (resolved) or a
bind mount (which no link reveals: the directory keeps its device and
inode under the other path). :func:`real_location` and :func:`inside`
compare paths by those, and :func:`machine` names this machine's view of
its files (kernel boot, mount namespace), for processes that compare paths
with each other.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket

__all__ = [
    "RAM_FILESYSTEMS",
    "Location",
    "filesystem_type",
    "inside",
    "machine",
    "ram_backed",
    "real_location",
]

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


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a local path really is: its nearest existing directory, identified, and the rest.

    Attributes:
        real: The path with every symbolic link resolved (its missing tail as given).
        existing: The nearest existing directory of ``real`` (``real`` itself if it exists).
        chain: ``(st_dev, st_ino)`` of ``existing`` and of each directory above it, up to ``/``.
        rest: The components of ``real`` below ``existing`` (not made yet).
    """

    real: str
    existing: str
    chain: tuple[tuple[int, int], ...]
    rest: tuple[str, ...]

    def key(self) -> list[int | str]:
        """The same on one machine for two paths of the same directory (JSON: lists and scalars)."""
        return [*self.chain[0], *self.rest]


def real_location(path: str) -> Location:
    """The real location of the local ``path``, which need not exist yet.

    Example:
        >>> where = real_location("/proc/no/such/dir")
        >>> where.existing, where.rest
        ('/proc', ('no', 'such', 'dir'))
    """
    real = os.path.realpath(os.path.abspath(path))
    existing, rest = real, []
    while not os.path.isdir(existing):
        existing, tail = os.path.split(existing)
        rest.insert(0, tail)
    chain, directory = [], existing
    while True:
        found = os.stat(directory)
        chain.append((found.st_dev, found.st_ino))
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return Location(real, existing, tuple(chain), tuple(rest))


def inside(inner: Location, outer: Location) -> bool:
    """Whether ``inner`` is ``outer`` or lies below it (through any link or bind mount).

    ``outer``'s nearest existing directory must be one of the directories
    above ``inner`` (by device and inode), and ``outer``'s missing tail the
    start of the path from there down to ``inner``.

    Example:
        >>> inside(real_location("/proc/a/b"), real_location("/proc/a"))
        True
        >>> inside(real_location("/proc/ab"), real_location("/proc/a"))
        False
    """
    anchor = outer.chain[0]
    if anchor not in inner.chain:
        return False
    up = inner.chain.index(anchor)  # how many directories inner's existing one is below it
    parts = [part for part in inner.existing.split("/") if part]
    path = (*parts[len(parts) - up :], *inner.rest)
    return path[: len(outer.rest)] == outer.rest


def machine() -> str:
    """This machine's view of its files: host name, kernel boot and mount namespace.

    Two processes with the same answer see the same directory under the same path.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        mounts = os.readlink("/proc/self/ns/mnt")
    except OSError:
        mounts = "?"
    return f"{socket.gethostname()} (boot {boot}, {mounts})"
