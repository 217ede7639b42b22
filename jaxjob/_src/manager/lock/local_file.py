"""The lock record on local (or network) disk: a file changed under an exclusive ``flock``."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from jaxjob._src.manager.lock.holder import Holder, encode, parse
from jaxjob._src.manager.lock.record import Change

__all__ = ["LocalRecord"]


class LocalRecord:
    """The lock file on local (or network) disk; changes under an exclusive ``flock``.

    A released lock's file is deleted, and its folder with the last lock in
    it. A process that waited for the ``flock`` of a file deleted meanwhile
    sees another inode at the path and starts over. Only taking the lock
    creates the file (and its folder): a renewal or a release of a file that
    is gone raises ``FileNotFoundError``.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> Holder | None:
        """The record as it stands (under a shared ``flock``); None if the file is gone."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return parse(os.pread(fd, 1 << 16, 0).decode(errors="replace"))
        finally:
            os.close(fd)

    def change(self, fn: Change, *, create: bool = False) -> Holder | None:
        """Replaces the record by ``fn(record)`` atomically (None deletes it); returns it.

        Args:
            fn: The change.
            create: Whether to create the lock file and its folder (taking the
                lock); otherwise a missing one raises ``FileNotFoundError``.
        """
        while True:
            fd = self._open(create)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if _same_file(fd, self.path):
                    return self._change(fd, fn)
            finally:
                os.close(fd)  # releases the flock

    def _open(self, create: bool) -> int:
        """Opens the lock file; ``create``: creating it and its folder in the existing db_prefix."""
        if not create:
            return os.open(self.path, os.O_RDWR)
        for _ in range(100):
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.dirname(self.path))
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                pass  # another node's release removed the folder between our mkdir and open
        raise OSError(f"could not create the lock file {self.path}: its folder keeps vanishing")

    def _change(self, fd: int, fn: Change) -> Holder | None:
        new = fn(parse(os.pread(fd, 1 << 16, 0).decode(errors="replace")))
        if new is None:
            os.unlink(self.path)
            try:
                os.rmdir(os.path.dirname(self.path))
            except OSError as err:  # other nodes' locks are in it, or it is gone
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise
            return None
        os.ftruncate(fd, 0)
        os.pwrite(fd, encode(new), 0)
        os.fsync(fd)
        return new


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
