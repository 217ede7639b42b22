"""The headline examples run at a small size: an NNX language model in two tiers (preempted,
resumed, evaluated from its parameters), a job under ``jaxjob launch -n 2``, a Grain pipeline
killed and resumed exactly."""

import math
import os
import subprocess
import sys

import numpy as np
import paths
import pytest

import jaxjob
from jaxjob import testing

EXAMPLES = os.path.join(paths.ROOT, "examples")
NNX_LM = os.path.join(EXAMPLES, "nnx_lm.py")

# Runs examples/nnx_lm.py with one more host task at the end of its epoch group (the epoch
# counter already counts the running epoch): in epoch 2 the process sends itself SIGTERM, as a
# scheduler preempting it would.
PREEMPTED_IN_EPOCH_2 = """
import os, signal, sys
sys.path.insert(0, {examples!r})
import nnx_lm

build_job = nnx_lm.build_job


def preempting_job(*args):
    job = build_job(*args)

    def preempt(ws):
        if int(ws["jaxjob/epochs_done"]) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    job.epoch_group.add(preempt, jit=False)
    return job


nnx_lm.build_job = preempting_job
nnx_lm.main({argv!r})
"""


def _python(*args, status=0):
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == status, output[-4000:]
    return output


def _epochs(output):
    """The epochs a run trained, from its progress lines."""
    return [int(line.split()[1]) for line in output.splitlines() if line.startswith("epoch ")]


def _nnx_lm(root, name):
    """nnx_lm's arguments for 3 epochs in ``root/name`` (saved to the durable tier every 2nd
    epoch, to the local tier every epoch)."""
    tiers = ("--ckpt-dir", str(root / name), "--local-dir", str(root / f"{name}-local"))
    return ["--epochs", "3", "--save-every-epochs", "2", *tiers]


@pytest.fixture(scope="module")
def preempted_lm(tmp_path_factory):
    """nnx_lm for 3 epochs, preempted (SIGTERM) in epoch 2, then the same command again."""
    root = tmp_path_factory.mktemp("nnx_lm")
    code = PREEMPTED_IN_EPOCH_2.format(examples=EXAMPLES, argv=_nnx_lm(root, "run"))
    preempted = _python("-c", code, status=1)
    resumed = _python(NNX_LM, *_nnx_lm(root, "run"))
    return root, preempted, resumed


def test_nnx_lm_preempted_resumes_and_evaluates_from_its_parameters(preempted_lm):
    """SIGTERM in epoch 2 saves it to the durable tier and exits with jaxjob.Preempted (epoch 1
    went to the local tier); the same command trains epoch 3 alone, and the durable tier keeps
    its last two epochs; --eval restores the parameters alone into a fresh model: a finite loss
    below a uniform guess's."""
    root, preempted, resumed = preempted_lm
    assert _epochs(preempted) == [1, 2]
    assert "jaxjob.Preempted: preempted: epoch 2 is saved and committed" in preempted
    assert _epochs(resumed) == [3] and "done: epoch 3" in resumed
    assert jaxjob.CheckpointManager(str(root / "run")).committed_epochs() == [2, 3]
    evaluated = _python(NNX_LM, "--eval", "--ckpt-dir", str(root / "run"))
    loss = float(evaluated.split("eval: loss ")[1].split(",")[0])
    assert math.isfinite(loss) and 0 < loss < math.log(256), evaluated


@pytest.mark.slow
def test_nnx_lm_resumed_after_preemption_ends_as_an_uninterrupted_run(preempted_lm):
    """The preempted and resumed run's last checkpoint is bitwise that of an uninterrupted run."""
    root = preempted_lm[0]
    reference = _python(NNX_LM, *_nnx_lm(root, "ref"))
    assert _epochs(reference) == [1, 2, 3] and "done: epoch 3" in reference
    testing.assert_bitwise_equal(jaxjob.restore(root / "ref"), jaxjob.restore(root / "run"))


def test_multiprocess_example_under_launch_resumes_after_a_kill_and_then_is_finished(tmp_path):
    """Under ``jaxjob launch -n 2``, killed in epoch 1's save, the same command resumes from
    epoch 0 and finishes; once more, it trains nothing and says it is done."""
    ckpt = str(tmp_path / "mp")
    argv = [os.path.join(EXAMPLES, "multiprocess.py"), "--epochs", "3", "--ckpt-dir", ckpt]
    kill = testing.kill_and_resume(argv, ckpt, kill_at="save.write:2", processes=2)
    assert kill.killed and kill.committed == [0]
    again = testing.run(argv, processes=2, db_prefix=ckpt)
    assert _epochs(again.replace("[process=0] ", "")) == []
    assert "[process=0] done: epoch 3 on 2 processes" in again
    assert "[process=1] done" not in again
    assert jaxjob.CheckpointManager(ckpt).committed_epochs()[-1] == 3


def test_grain_pipeline_killed_mid_run_resumes_exactly(tmp_path):
    """Killed after epoch 3 trained (before its save), the restart resumes from epoch 2 and ends
    bitwise equal to an uninterrupted run, Grain's iterator state included: each of the 48
    records was trained on exactly twice in 4 epochs (half the records an epoch)."""
    script = os.path.join(EXAMPLES, "grain_pipeline.py")
    reference = testing.run([script, "--epochs", "4", "--ckpt-dir", str(tmp_path / "ref")])
    assert _epochs(reference) == [1, 2, 3, 4]
    argv = [script, "--epochs", "4", "--ckpt-dir", str(tmp_path / "run")]
    kill = testing.kill_and_resume(argv, tmp_path / "run", kill_at="epoch:3")
    assert kill.killed and kill.committed[-1] in (1, 2)  # epoch 2's save may not have committed
    ref, run = jaxjob.restore(tmp_path / "ref"), jaxjob.restore(tmp_path / "run")
    assert "jaxjob/data/batch" in run  # the iterator's state
    np.testing.assert_array_equal(np.asarray(run["seen"]), np.full(48, 2))
    testing.assert_bitwise_equal(ref, run)


@pytest.mark.parametrize("name", ["nnx_lm", "multiprocess", "grain_pipeline"])
def test_example_explains_itself_with_help(name):
    """``--help`` prints the example's one-line summary and its options, and exits 0."""
    output = _python(os.path.join(EXAMPLES, f"{name}.py"), "--help")
    assert "--epochs" in output and "--ckpt-dir" in output
    assert " ".join(output.split()).startswith(f"usage: {name}.py")
