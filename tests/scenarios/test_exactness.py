"""Resume is exact: a job killed with SIGKILL and restarted ends bitwise equal to a clean run."""

import os
import signal
import subprocess
import sys
import time

import exact_job
import numpy as np
import paths
import pytest

import jaxjob

SCRIPT = os.path.join(paths.JOBS, "exact_job.py")


def _run(ckpt, out, *extra, expect_kill=False):
    proc = subprocess.run(
        [sys.executable, SCRIPT, str(ckpt), str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if expect_kill:
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("reference")
    _run(base / "ckpt", base / "out.npz")
    with np.load(base / "out.npz") as ref:
        kinds, treedef = " ".join(ref["kinds"]), str(ref["treedef"])
    assert "key<fry>" in kinds and "bfloat16" in kinds and "ScaleByAdamState" in treedef
    return base / "out.npz"


@pytest.mark.parametrize(
    "how", [("--die-in-epoch", "3"), ("--die-after-save", "2"), ("--die-after-save", "0")]
)
def test_sigkill_then_restart_is_bitwise_exact(tmp_path, reference, how):
    """Killed mid-epoch or with a save in flight, the restarted job ends as an uninterrupted one."""
    _run(tmp_path / "ckpt", tmp_path / "dead.npz", *how, expect_kill=True)
    committed = jaxjob.CheckpointManager(str(tmp_path / "ckpt")).committed_epochs()
    assert committed == list(range(len(committed)))  # every earlier epoch intact
    proc = _run(tmp_path / "ckpt", tmp_path / "out.npz")
    assert "finished at epoch 6" in proc.stdout
    exact_job.assert_same_workspace(reference, tmp_path / "out.npz")


def test_external_sigkill_at_a_random_moment(tmp_path, reference):
    """A SIGKILL from outside, while epochs and saves run, loses nothing committed."""
    ckpt = tmp_path / "ckpt"
    args = [sys.executable, SCRIPT, str(ckpt), str(tmp_path / "x.npz"), "--sleep-per-epoch", "0.3"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and not (
        ckpt.exists() and any(p.name.startswith("local.2") for p in ckpt.iterdir())
    ):
        time.sleep(0.05)
    time.sleep(0.15)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    _run(ckpt, tmp_path / "out.npz")
    exact_job.assert_same_workspace(reference, tmp_path / "out.npz")
