"""Ctrl-C (a real SIGINT) during a save: the save in flight completes, then KeyboardInterrupt."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import paths
import pytest
from children import interruptible_child

import jaxjob
from jaxjob._src.core.job import EPOCH_COUNTER

SCRIPT = os.path.join(paths.JOBS, "interrupt_job.py")
SIZE = 1 << 22  # float32: 16 MiB a checkpoint, so that the signal lands in a save


def _interrupt(ckpt, after_epoch, delay_s, *extra):
    """Runs interrupt_job.py, sends SIGINT ``delay_s`` after it printed ``EPOCH after_epoch``."""
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, str(ckpt), "--size", str(SIZE), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible_child,
    )
    for line in proc.stdout:  # the epoch has run; its save comes next
        if line.strip() == f"EPOCH {after_epoch}":
            break
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, err


def _assert_epochs_intact(ckpt, at_least):
    """Committed epochs are 0..k (k >= at_least), each holding its values; no temporaries."""
    epochs = jaxjob.CheckpointManager(str(ckpt)).committed_epochs()
    assert epochs == list(range(len(epochs))) and epochs[-1] >= at_least, epochs
    leftovers = [n for n in os.listdir(ckpt) if re.fullmatch(r"local\.\d+.+", n)]
    assert leftovers == []
    for epoch in epochs[-2:] if len(epochs) > 1 else epochs:
        w = np.asarray(jaxjob.restore(str(ckpt), epoch=epoch, leaves=["w"])["w"])
        np.testing.assert_array_equal(w, epoch + np.arange(SIZE, dtype=np.float32))


@pytest.mark.parametrize("delay_s", [0.0, 0.01, 0.02, 0.03, 0.05])
def test_sigint_during_a_save_completes_it_then_raises_keyboard_interrupt(tmp_path, delay_s):
    """SIGINT right after epoch 3 (its save, or the wait for epoch 2's): exit as a
    KeyboardInterrupt does, one warning line, no traceback from jaxjob's or Orbax's threads,
    no Orbax ERROR; the epochs committed are 0..k with k >= 2, each intact."""
    code, err = _interrupt(tmp_path / "ckpt", 3, delay_s)
    assert code == -signal.SIGINT, err[-3000:]
    lines = err.splitlines()
    assert not [line for line in lines if re.match(r"(ERROR|CRITICAL)\b", line)], err[-3000:]
    assert "Exception in thread" not in err and "cannot schedule new futures" not in err
    assert err.count("Traceback (most recent call last)") == 1, err[-3000:]
    traceback = err[err.index("Traceback") :]
    assert "orbax" not in traceback and "threading.py" not in traceback, traceback
    assert traceback.rstrip().endswith("KeyboardInterrupt")
    warnings = [line for line in lines if re.match(r"WARNING:(jaxjob|absl)", line)]
    assert len(warnings) == 1 and "Interrupted (KeyboardInterrupt)" in warnings[0], err[-3000:]
    _assert_epochs_intact(tmp_path / "ckpt", 2)


def test_sigint_as_a_preemption_signal(tmp_path):
    """With preemption_signals=(SIGTERM, SIGINT), Ctrl-C preempts: the epoch is saved and
    committed and Preempted propagates (exit status 1)."""
    code, err = _interrupt(tmp_path / "ckpt", 2, 0.0, "--sigint-preempts")
    assert code == 1, err[-3000:]
    assert "Received SIGINT: stopping after this epoch" in err
    assert re.search(r"Preempted: preempted: epoch \d is saved and committed", err)
    _assert_epochs_intact(tmp_path / "ckpt", 2)


ROUNDS = os.path.join(paths.JOBS, "interrupt_rounds.py")


def _interrupt_rounds(root, rounds, seed, *extra):
    """Runs ``rounds`` Ctrl-Cs at random moments in one child (interrupt_rounds.py): its
    records, one a round, each checked by the child on its own session."""
    proc = subprocess.run(
        [sys.executable, ROUNDS, str(root), str(rounds), "--seed", str(seed), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=interruptible_child,
    )
    assert proc.returncode == 0 and "DONE" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
    records = [json.loads(line[6:]) for line in proc.stdout.splitlines() if line[:6] == "ROUND "]
    assert len(records) == rounds, proc.stdout[-3000:]
    bad = [r for r in records if r["problem"] is not None or not r["interrupted"]]
    assert bad == [], bad
    return records


def test_after_ctrl_c_the_session_holds_a_completed_epochs_live_arrays(tmp_path):
    """Ctrl-C at random moments of an epoch, its save or the wait for it (progress on): every
    leaf of session.workspace reads, and it holds an epoch that completed (the newest, or the
    one before it when the interrupted epoch had consumed the arrays: restored from its
    checkpoint); never a donated buffer."""
    _interrupt_rounds(tmp_path, 5, seed=7)


@pytest.mark.slow
def test_after_ctrl_c_the_session_holds_a_completed_epoch_30_times(tmp_path):
    """30 rounds (~25 s on 2 loaded cores); then 10 with a local tier, where the epoch
    restored into the session may be a local one."""
    records = _interrupt_rounds(tmp_path / "one", 30, 33)
    assert any(r["restored"] for r in records) and not all(r["restored"] for r in records)
    _interrupt_rounds(tmp_path / "two", 10, 34, "--local")


def test_ctrl_c_after_an_epoch_consumed_the_arrays_restores_the_last_committed_one(tmp_path):
    """In-process and deterministic: KeyboardInterrupt in epoch 3's host task, after its
    program donated epoch 2's arrays: train raises it, and the session holds epoch 2, restored
    from its checkpoint (live, and not partial)."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"w": jnp.arange(8.0)})
    job.epoch_group.add(lambda ws: {"w": ws["w"] + 1})

    def host(ws):
        if int(ws[EPOCH_COUNTER]) == 2:  # epoch 3: the limiter's task, after this one, counts it
            raise KeyboardInterrupt

    job.epoch_group.add(host, jit=False)
    jaxjob.epoch_limiter(job, 10)
    session = jaxjob.Session()
    ckpt = jaxjob.CheckpointManager(str(tmp_path / "ckpt"))
    with pytest.raises(KeyboardInterrupt):
        jaxjob.JobRunner(job, ckpt).train(session)
    ckpt.close()
    np.testing.assert_array_equal(np.asarray(session.workspace["w"]), np.arange(8.0) + 2)
    assert int(np.asarray(session.workspace[EPOCH_COUNTER])) == 2 and not session.partial
