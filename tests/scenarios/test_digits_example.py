"""The README's main job: examples/digits.py trains, is idempotent when re-run, and continues."""

import os
import subprocess
import sys

import jax
import numpy as np
import paths
import pytest

import jaxjob
from jaxjob._src.base import faults

SCRIPT = os.path.join(paths.ROOT, "examples", "digits.py")


def _digits(*args, kill_at=None):
    env = {**os.environ, **({faults.KILL_AT_ENV: kill_at} if kill_at else {})}
    proc = subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300, env=env
    )
    if kill_at:
        assert proc.returncode == -9, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One process: 10 epochs with a local tier, killed at epoch 2's local save; the same command
    again (it resumes from local epoch 1 and ends at 10); once more (nothing new).

    A resume ends where an uninterrupted run would (bit for bit: tests/scenarios/test_exactness.py,
    test_two_tiers.py and tests/testing/), so the two-process test compares against these
    parameters after epoch 10 instead of training a third single-process run.
    """
    root = tmp_path_factory.mktemp("digits")
    ckpt, local = str(root / "one"), str(root / "local")
    tiers = ("--epochs", "10", "--ckpt-dir", ckpt, "--local-dir", local, "--save-every-epochs", "5")
    killed = _digits(*tiers, kill_at="local.save.copy:2")
    first = _digits(*tiers)
    again = _digits("--epochs", "10", "--ckpt-dir", ckpt)
    return ckpt, killed, first, again


def _epochs(out):
    return [line.split()[1] for line in out.splitlines() if line.startswith("epoch")]


def test_digits_trains_resumes_and_continues(one_process):
    """Killed in epoch 2's local save, it resumes from the local tier's epoch 1 (the persistent
    tier has only epoch 0) and ends at 10; a re-run does nothing new."""
    _, killed, first, again = one_process
    assert _epochs(killed) == ["1"] and "save" in killed and "local" in killed
    assert _epochs(first) == [str(e) for e in range(2, 11)]
    assert "done: epoch 10" in first
    assert _epochs(again) == []
    assert (
        again.split("test accuracy")[1].split(",")[0]
        == first.split("test accuracy")[1].split(",")[0]
    )
    final_accuracy = float(first.split("test accuracy")[1].split(",")[0])
    assert final_accuracy > 0.8


def test_digits_on_two_processes_matches_one_process(one_process, tmp_path):
    """Under `jaxjob launch -n 2` (4 devices, batch sharded) the final parameters match the
    single-process run up to float reassociation: measured max abs difference 1.2e-7 after 10
    epochs (parameters up to 0.75), asserted below 1e-5."""
    one, two = one_process[0], str(tmp_path / "two")
    launch = [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2", "--devices-per-process", "2"]
    proc = subprocess.run(
        [*launch, "--", sys.executable, SCRIPT, "--epochs", "10", "--ckpt-dir", two],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "[process=0] done: epoch 10" in proc.stdout
    assert "[process=1] done" not in proc.stdout  # only process 0 prints
    a = jax.tree.leaves(jaxjob.restore(one, leaves=["params"])["params"])
    b = jax.tree.leaves(jaxjob.restore(two, leaves=["params"])["params"])
    assert len(a) == len(b) == 4
    differences = [
        float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b, strict=True)
    ]
    assert max(differences) < 1e-5, differences
