"""Real small disks for the disk-full tests: a tmpfs of a given size, mounted (root only)."""

import os
import subprocess

import pytest


def mount_tmpfs(path, size, nr_inodes=None):
    """Creates ``path`` and mounts a tmpfs of ``size`` (``"1600k"``) there; skips without root.

    ``nr_inodes``: at most that many files and directories (the root included).
    """
    os.makedirs(path)
    options = f"size={size}" + (f",nr_inodes={nr_inodes}" if nr_inodes else "")
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mount.stderr.decode().strip()}")


def unmount(path):
    """Unmounts the tmpfs at ``path`` (lazily: a process may still hold a file there)."""
    subprocess.run(["umount", "-l", str(path)], check=True)
