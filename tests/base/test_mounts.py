"""The mount table: which file system holds a path, and whether it is a RAM disk."""

import os

import pytest

from jaxjob._src.base import mounts

TABLE = """\
/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,size=1024k 0 0
/dev/vdb /data xfs rw 0 0
tmpfs /data/scratch\\040space tmpfs rw 0 0
none /data ramfs rw 0 0
"""


@pytest.mark.parametrize(
    "path, kind",
    [
        ("/", "ext4"),
        ("/home/user/ckpt", "ext4"),
        ("/dev/shm", "tmpfs"),
        ("/dev/shm/run/0/local.3", "tmpfs"),
        ("/dev/shmother/x", "ext4"),  # a mount point is a whole path segment
        ("/data/scratch space/x", "tmpfs"),  # octal escapes decoded
        ("/data/x", "ramfs"),  # the last mount on a mount point hides the ones below it
        ("/dev/shm/../vda/x", "ext4"),  # normalized
    ],
)
def test_the_longest_mount_point_above_a_path_gives_its_file_system(path, kind):
    """The file system of a path is its innermost mount's, the last one mounted there."""
    assert mounts.filesystem_type(path, TABLE) == kind


def test_a_table_without_a_root_mount_knows_no_other_path():
    """A path under no mount point of the table has no known file system."""
    assert mounts.filesystem_type("/home/x", "tmpfs /dev/shm tmpfs rw 0 0\n") is None


@pytest.mark.skipif(not os.path.exists("/proc/self/mounts"), reason="no Linux mount table")
def test_ram_backed_reads_this_machines_mount_table(tmp_path):
    """A path on a tmpfs of this machine is RAM-backed, through a symbolic link too."""
    if mounts.filesystem_type("/dev/shm") not in mounts.RAM_FILESYSTEMS:
        pytest.skip("/dev/shm is not a RAM disk here")
    assert mounts.ram_backed("/dev/shm/jaxjob-no-such-dir/x")
    (tmp_path / "link").symlink_to("/dev/shm")
    assert mounts.ram_backed(str(tmp_path / "link" / "x"))
    assert mounts.ram_backed(str(tmp_path)) == (
        mounts.filesystem_type(os.path.realpath(tmp_path)) in mounts.RAM_FILESYSTEMS
    )


def test_inside_compares_real_locations_also_below_what_exists(tmp_path):
    """Missing tails compare by component (``ckpt2`` is not inside ``ckpt``); a link is
    resolved; a path is inside itself."""
    inside, real_location = mounts.inside, mounts.real_location
    (tmp_path / "ckpt").mkdir()
    os.symlink(tmp_path / "ckpt", tmp_path / "alias")
    where = {name: real_location(str(tmp_path / name)) for name in ("ckpt", "ckpt2/x", "alias/a/b")}
    assert inside(where["alias/a/b"], where["ckpt"]) and not inside(
        where["ckpt"], where["alias/a/b"]
    )
    assert not inside(where["ckpt2/x"], where["ckpt"]) and inside(where["ckpt"], where["ckpt"])
    new = real_location(str(tmp_path / "new" / "run"))
    assert new.existing == str(tmp_path) and new.rest == ("new", "run")
    assert inside(real_location(str(tmp_path / "new" / "run" / "0")), new)
