"""Real small disks for the disk-full tests: a tmpfs of a given size, mounted (root only)."""

import os
import subprocess

import pytest


def mount_tmpfs(path, size):
    """Creates ``path`` and mounts a tmpfs of ``size`` (``"1600k"``) there; skips without root."""
    os.makedirs(path)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mount.stderr.decode().strip()}")


def unmount(path):
    """Unmounts the tmpfs at ``path`` (lazily: a process may still hold a file there)."""
    subprocess.run(["umount", "-l", str(path)], check=True)
