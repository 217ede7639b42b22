"""A resume from epoch 0 restores what host init tasks set with its saved shardings."""

import os
import subprocess
import sys

import paths
import pytest

JOB = os.path.join(paths.JOBS, "host_init_job.py")


@pytest.mark.parametrize("devices", [1, 4])
def test_host_init_leaves_resumed_from_epoch_0_keep_their_saved_shardings(tmp_path, devices):
    """Arrays a host init task put on a mesh (a 0-d one among them) come back from epoch 0 on
    that mesh, not on the default device: the workspace epoch 1 starts from and the final one
    are bitwise equal to an uninterrupted run's, shardings included (1 and 4 CPU devices)."""
    flags = f"--xla_force_host_platform_device_count={devices}"
    env = {**os.environ, "XLA_FLAGS": flags}
    done = subprocess.run(
        [sys.executable, JOB, str(tmp_path)], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("same"), done.stderr[-3000:]
