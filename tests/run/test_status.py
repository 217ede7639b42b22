"""The run says what it did, one plain line each, at Python's default logging configuration."""

import logging
import os
import subprocess
import sys

import jax.numpy as jnp
import paths
import pytest

import jaxjob
from jaxjob._src.base import status
from jaxjob._src.manager.retention import notice

# A 3-epoch job that configures no logging (Python's default shows WARNING and above only),
# or, with "configured", one that logs at INFO through the root logger's handler.
JOB = """
import logging, sys
import jax.numpy as jnp, jaxjob
if sys.argv[3] == "configured":
    logging.basicConfig(level=logging.INFO)
job = jaxjob.Job()
job.init_group.add(lambda ws: {"w": jnp.zeros(2)}, name="init")
job.epoch_group.add(lambda ws: {"w": ws["w"] + 1}, name="step")
jaxjob.epoch_limiter(job, int(sys.argv[2]))
jaxjob.JobRunner(job, jaxjob.CheckpointManager(sys.argv[1])).train(jaxjob.Session())
"""


def _run(prefix, epochs, logs="default"):
    env = {**os.environ, "PYTHONPATH": paths.ROOT}
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(prefix), str(epochs), logs],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [_message(line) for line in done.stderr.splitlines() if _message(line) is not None]


def _message(line):
    """A status line's message, whichever handler showed it (jaxjob's own, or the root's: importing
    Orbax gives the root logger a handler), else None."""
    for prefix in ("jaxjob: ", "INFO:jaxjob.status:"):
        if line.startswith(prefix):
            return line[len(prefix) :]
    return None


def test_resuming_finished_and_a_lower_limit_each_say_so_without_logging_set_up(tmp_path):
    """A fresh start says nothing; a rerun of the finished job, a larger limit (resumes) and a
    smaller one each print one plain line on stderr, once, with no logging configured."""
    prefix = tmp_path / "run"
    assert _run(prefix, 3) == []
    assert _run(prefix, 3) == [
        f"Resuming from epoch 3 ({prefix})",
        "Already finished at epoch 3: its checkpoint meets a stop condition; nothing to run",
    ]
    assert _run(prefix, 4) == [f"Resuming from epoch 3 ({prefix})"]
    assert _run(prefix, 2) == [
        f"Resuming from epoch 4 ({prefix})",
        "Already finished at epoch 4: epoch_limiter's limit of 2 epochs is below the 4 "
        "epochs done; nothing to run (pass a larger limit to continue)",
    ]


def test_with_logging_configured_each_line_shows_once_through_its_handlers(tmp_path):
    """Logging at INFO through the root logger: the lines come once (not again by jaxjob's)."""
    prefix = tmp_path / "run"
    _run(prefix, 2, "configured")
    assert _run(prefix, 2, "configured") == [
        f"Resuming from epoch 2 ({prefix})",
        "Already finished at epoch 2: its checkpoint meets a stop condition; nothing to run",
    ]


def test_keep_all_says_once_that_it_has_written_past_the_notice_size(tmp_path, monkeypatch, caplog):
    """keep=None: one status line once the run's saves passed the size worth mentioning."""
    monkeypatch.setattr(notice, "KEEP_ALL_NOTICE_BYTES", 3 * 4096)
    caplog.set_level(logging.INFO, logger=status.STATUS)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    for epoch in range(6):
        ckpt.save(epoch, {"w": jnp.ones(1024)})  # 4 KiB a save
    ckpt.close()
    said = [r.getMessage() for r in caplog.records if r.name == status.STATUS]
    assert len(said) == 1 and said[0].startswith("keep=None keeps every epoch"), said
    assert f"under {tmp_path}; pass keep=jaxjob.keep.Last(n)" in said[0]


@pytest.mark.parametrize("keep", [jaxjob.keep.Last(2)])
def test_a_bounded_retention_says_nothing(tmp_path, monkeypatch, caplog, keep):
    """With a keep= policy the size is bounded: no line."""
    monkeypatch.setattr(notice, "KEEP_ALL_NOTICE_BYTES", 4096)
    caplog.set_level(logging.INFO, logger=status.STATUS)
    ckpt = jaxjob.CheckpointManager(str(tmp_path), keep=keep)
    for epoch in range(3):
        ckpt.save(epoch, {"w": jnp.ones(1024)})
    ckpt.close()
    assert [r for r in caplog.records if r.name == status.STATUS] == []
