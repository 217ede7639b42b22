"""One flush of a checkpoint directory: one syncfs where it flushes and reports, else each file."""

import os
import tempfile

import pytest

from jaxjob._src.base import flush, mounts


def _tree(root):
    os.makedirs(os.path.join(root, "a", "b"))
    for name in ("x", os.path.join("a", "y"), os.path.join("a", "b", "z")):
        with open(os.path.join(root, name), "w") as f:
            f.write(name)


def test_a_block_file_system_is_flushed_by_one_syncfs(tmp_path):
    if mounts.filesystem_type(str(tmp_path)) not in flush.SYNCFS_FILESYSTEMS:
        pytest.skip(f"{tmp_path} is on {mounts.filesystem_type(str(tmp_path))}, not a block fs")
    _tree(str(tmp_path))
    release = tuple(int(n) for n in os.uname().release.split(".")[:2])
    assert flush.syncfs_usable(str(tmp_path)) == (release >= (5, 8))
    assert flush.flush_tree(str(tmp_path)) == (1 if release >= (5, 8) else 8)


def test_elsewhere_each_file_and_directory_is_fsynced():
    """On a tmpfs (as on NFS or FUSE), no syncfs: 3 files and 3 directories, 6 fsyncs."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        _tree(root)
        assert not flush.syncfs_usable(root)
        assert flush.flush_tree(root) == 6


def test_syncfs_is_used_only_on_the_listed_file_systems():
    assert not flush.syncfs_usable("/proc/self")
    assert {"ext4", "xfs"} <= flush.SYNCFS_FILESYSTEMS
    assert not {"nfs", "nfs4", "overlay", "fuse", "tmpfs"} & flush.SYNCFS_FILESYSTEMS


@pytest.mark.parametrize("flush_tree", [flush.flush_tree, flush.fsync_tree])
def test_a_missing_directory_is_not_flushed_silently(tmp_path, flush_tree):
    with pytest.raises(FileNotFoundError):
        flush_tree(str(tmp_path / "missing"))
