"""Two tiers: a local copy every epoch, the persistent tier every 4, resume from the newest intact.

Real processes (one, or two under ``jaxjob launch``), real SIGKILL, a real tmpfs, moto on
127.0.0.1 for s3://. A killed run's directories are copied for each restart scenario (the lock
of a killed writer is taken over), so one kill serves several restarts.
"""

import glob
import os
import shutil
import subprocess
import sys

import disks
import jax
import numpy as np
import paths
import pytest

import jaxjob
from jaxjob import testing

SCRIPT = os.path.join(paths.JOBS, "tier_job.py")
LAUNCH = [sys.executable, "-m", "jaxjob.cli", "launch"]


def _command(args, processes, devices):
    if processes == 1:
        return [sys.executable, SCRIPT, *map(str, args)], {
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"
        }
    launch = [*LAUNCH, "-n", str(processes), "--devices-per-process", str(devices), "--"]
    return [*launch, sys.executable, SCRIPT, *map(str, args)], {}


def _run(args, *, processes=1, devices=2, killed=False):
    command, env = _command(args, processes, devices)
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    output = proc.stdout + proc.stderr
    if killed:
        assert proc.returncode != 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
    else:
        assert proc.returncode == 0, output[-3000:]
    return output


# saved_to of epochs 1..10 in runner.history (a local save every epoch, persistent every 4th)
UNINTERRUPTED_TIERS = (
    "TIERS local local local persistent local local local persistent local persistent\n"
)


def _scenario(root, name, ckpt, local):
    """A copy of a killed run's two tiers under ``root/name``: ``(ckpt, local)``."""
    there = root / name
    shutil.copytree(ckpt, there / "ckpt", symlinks=True)
    shutil.copytree(local, there / "local", symlinks=True)
    return there / "ckpt", there / "local"


def _resumed(output):
    lines = [line for line in output.splitlines() if "Resuming from epoch" in line]
    assert lines, output[-3000:]
    return lines


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """An uninterrupted 10-epoch run and a run killed in epoch 8 (local 7 committed), 2 devices."""
    root = tmp_path_factory.mktemp("tiers1")
    ref = root / "ref"
    output = _run([ref / "ckpt", ref / "local", ref / "out"])
    assert UNINTERRUPTED_TIERS in output
    killed = root / "killed"
    _run([killed / "ckpt", killed / "local", killed / "out", "--kill-in-epoch", 8], killed=True)
    return root, ref, killed


def test_kill_resumes_from_the_local_tier_bitwise(one_process, tmp_path):
    root, ref, killed = one_process
    assert jaxjob.CheckpointManager(str(killed / "ckpt")).committed_epochs() == [0, 4]
    ckpt, local = _scenario(tmp_path, "x", killed / "ckpt", killed / "local")
    output = _run([ckpt, local, tmp_path / "out"])
    (line,) = _resumed(output)
    assert "Resuming from epoch 7 of the local tier" in line
    assert "the persistent tier's newest is 4" in line
    assert UNINTERRUPTED_TIERS in output  # 1-7 rebuilt from the history, then 8, 9, 10 as they ran
    assert jaxjob.CheckpointManager(str(ckpt)).committed_epochs() == [0, 4, 8, 10]
    testing.assert_bitwise_equal(ref / "out", tmp_path / "out")


def test_a_wiped_local_tier_resumes_from_the_persistent_tier_bitwise(one_process, tmp_path):
    root, ref, killed = one_process
    ckpt, local = _scenario(tmp_path, "x", killed / "ckpt", killed / "local")
    shutil.rmtree(local)
    output = _run([ckpt, local, tmp_path / "out"])
    (line,) = _resumed(output)
    assert "Resuming from epoch 4 of the persistent tier" in line
    assert "holds no epoch newer than 4" in line
    testing.assert_bitwise_equal(ref / "out", tmp_path / "out")


def test_a_flipped_byte_in_local_7_resumes_from_local_6_bitwise(one_process, tmp_path):
    root, ref, killed = one_process
    ckpt, local = _scenario(tmp_path, "x", killed / "ckpt", killed / "local")
    data = glob.glob(f"{local}/local.7/state/**/d/*", recursive=True)
    biggest = max(data, key=os.path.getsize)
    with open(biggest, "r+b") as f:
        f.seek(os.path.getsize(biggest) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    output = _run([ckpt, local, tmp_path / "out"])
    (line,) = _resumed(output)
    assert "Resuming from epoch 6 of the local tier" in line
    assert "local epoch 7" in output  # why 7 was passed over
    testing.assert_bitwise_equal(ref / "out", tmp_path / "out")
    assert sorted(os.listdir(local)) == ["local.7", "local.9"]  # Last(2); the damaged 7 replaced


def test_another_device_count_resumes_from_the_persistent_tier(one_process, tmp_path):
    """Saved on 2 devices, restarted on 4: the local copies are passed over, saying why."""
    root, ref, killed = one_process
    ckpt, local = _scenario(tmp_path, "x", killed / "ckpt", killed / "local")
    output = _run([ckpt, local, tmp_path / "out"], devices=4)
    (line,) = _resumed(output)
    assert "Resuming from epoch 4 of the persistent tier" in line
    assert "saved by 1 processes on 2 cpu devices (this job: 1 on 4 cpu devices)" in line
    a = jaxjob.restore(str(ref / "ckpt"), leaves=["params", "cursor"])
    b = jaxjob.restore(str(ckpt), leaves=["params", "cursor"])
    np.testing.assert_array_equal(a["params"]["w"], b["params"]["w"])
    assert int(a["cursor"]) == int(b["cursor"]) == 10


def _final_values(ckpt):
    """Every leaf of the final (persistent) checkpoint, as host arrays: the same on any devices
    (the host-local cursor: process 0's copy)."""
    leaves = ["params", "opt_state", "rng", "cursor"]
    restored = dict(jaxjob.restore(str(ckpt), leaves=leaves, host_map=lambda p: 0))
    restored["rng"] = jax.random.key_data(restored["rng"])
    return jax.tree.map(np.asarray, restored)


def test_two_processes_resume_from_one_epoch_of_one_tier(tmp_path, one_process):
    """Process 1 dies in epoch 8: both resume from local 7; with its local copies wiped, from 4.

    Each ends with the values of the uninterrupted one-process run (the job's arithmetic is
    elementwise: the same bits on 2 or 4 devices), compared leaf by leaf and bit for bit.
    """
    _, ref, _ = one_process
    expected = _final_values(ref / "ckpt")
    args = lambda d: [d / "ckpt", f"{d}/local/{{process}}", d / "out"]  # noqa: E731
    killed = tmp_path / "killed"
    _run([*args(killed), "--kill-in-epoch", 8], processes=2, killed=True)
    for name, wipe, resumed in (("keep", False, "7 of the local"), ("wipe", True, "4 of the pers")):
        ckpt, local = _scenario(tmp_path, name, killed / "ckpt", killed / "local")
        if wipe:
            shutil.rmtree(local / "1")
        output = _run(args(tmp_path / name), processes=2)
        lines = _resumed(output)
        assert len(lines) == 2 and all(f"Resuming from epoch {resumed}" in x for x in lines), lines
        if wipe:
            assert "process 1" in lines[0] and "holds no epoch newer than 4" in lines[0]
        found = _final_values(ckpt)
        for (path, a), b in zip(
            jax.tree_util.tree_leaves_with_path(expected), jax.tree.leaves(found), strict=True
        ):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (name, path)


def test_persistent_tier_on_s3_with_the_local_tier_on_a_tmpfs(s3_prefix, tmp_path, one_process):
    root, ref, _ = one_process
    disk = tmp_path / "disk"
    disks.mount_tmpfs(disk, "64m")
    try:
        args = [s3_prefix, disk / "local", tmp_path / "out"]
        _run([*args, "--kill-in-epoch", 8], killed=True)
        output = _run(args)
        (line,) = _resumed(output)
        assert "Resuming from epoch 7 of the local tier" in line
        testing.assert_bitwise_equal(ref / "out", tmp_path / "out")
        assert jaxjob.CheckpointManager(s3_prefix).committed_epochs() == [0, 4, 8, 10]
    finally:
        disks.unmount(disk)


def test_a_full_local_disk_loses_no_persistent_checkpoint(tmp_path, one_process):
    """A local tier too small for one copy: every local save fails, warned; training goes on."""
    root, ref, _ = one_process
    disk = tmp_path / "disk"
    disks.mount_tmpfs(disk, "40k")
    try:
        output = _run([tmp_path / "ckpt", disk / "local", tmp_path / "out"])
        assert "Unable to write checkpoint for epoch 1" in output
        assert "No space left on device" in output
        assert jaxjob.CheckpointManager(str(tmp_path / "ckpt")).committed_epochs() == [0, 4, 8, 10]
        testing.assert_bitwise_equal(ref / "out", tmp_path / "out")
        left = [(d, sorted(fs)) for d, _, fs in os.walk(disk / "local") if "local." in d]
        assert not left, (left, output[-3000:])
    finally:
        disks.unmount(disk)


@pytest.mark.parametrize("kill_at", ["local.save.commit:6", "save.write:2"])
def test_killed_during_a_local_or_a_persistent_save_resumes_bitwise(one_process, tmp_path, kill_at):
    """The fault kit's fail points of either tier's save (``local.save.commit:6`` is epoch 7's
    commit, ``save.write:2`` the write of the persistent epoch 4): the restart resumes from the
    newest epoch the kill left committed on either tier, exactly."""
    root, ref, _ = one_process
    args = [SCRIPT, tmp_path / "ckpt", tmp_path / "local", tmp_path / "out"]
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    kill = testing.run_killed(list(map(str, args)), tmp_path / "ckpt", kill_at=kill_at, env=env)
    assert kill.killed, kill.output[-3000:]
    local = jaxjob.CheckpointManager(str(tmp_path / "local")).committed_epochs()
    newest = max(kill.committed + local)  # what the kill left committed, on either tier
    assert newest >= {"local.save.commit:6": 6, "save.write:2": 2}[kill_at]
    output = _run(args[1:])
    (line,) = _resumed(output)
    tier = "local" if newest in local and newest not in kill.committed else "persistent"
    assert f"Resuming from epoch {newest} of the {tier} tier" in line, (line, kill.committed, local)
    testing.assert_bitwise_equal(ref / "out", tmp_path / "out")
