"""JobRunner: the train flow, auto-resume of finished jobs, and the save-error policies."""

import sys
import time

import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

import jaxjob
from jaxjob import CheckpointSaveError


def _counting_job(num_epochs, log=None):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
    if log is not None:
        job.exit_group.add(lambda ws: log.append(float(ws["x"])))
    jaxjob.epoch_limiter(job, num_epochs)
    return job


def test_rerun_of_finished_job_is_idempotent_and_larger_limit_continues(tmp_path):
    """Same limit: no new epoch (exit still runs); a larger limit continues from the last epoch."""
    log = []
    assert (
        jaxjob.JobRunner(_counting_job(3, log), jaxjob.CheckpointManager(str(tmp_path))).train(
            jaxjob.Session()
        )
        == 3
    )
    session = jaxjob.Session()
    assert (
        jaxjob.JobRunner(_counting_job(3, log), jaxjob.CheckpointManager(str(tmp_path))).train(
            session
        )
        == 3
    )
    assert log == [3.0, 3.0]
    assert jaxjob.CheckpointManager(str(tmp_path)).committed_epochs() == [0, 1, 2, 3]
    session = jaxjob.Session()
    assert (
        jaxjob.JobRunner(_counting_job(5), jaxjob.CheckpointManager(str(tmp_path))).train(session)
        == 5
    )
    assert float(session.workspace["x"]) == 5.0


def test_stop_condition_on_an_output_is_saved_with_the_checkpoint(tmp_path):
    """A stop condition reading an epoch output is re-evaluated on resume from the saved value."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1, "done": ws["x"] + 1 >= 2})
    job.add_stop_condition(lambda ws: ws["done"])
    assert (
        jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path))).train(jaxjob.Session()) == 2
    )
    session = jaxjob.Session()
    assert jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path))).train(session) == 2
    assert sorted(session.workspace) == ["x"]  # the output is not persistent state


def _inject_background_failure(monkeypatch, fail_on_wait, message):
    """Fault injection: jaxjob's n-th wait on a background write reports a failure.

    Only waits made by jaxjob's I/O handle (jaxjob._src.checkpoint.io) count (Orbax also
    waits inside save()).
    """
    real = ocp.AsyncCheckpointer.wait_until_finished
    calls = []

    def wait(self):
        real(self)
        if sys._getframe(1).f_globals.get("__name__") == "jaxjob._src.checkpoint.io":
            calls.append(1)
            if len(calls) == fail_on_wait:
                raise OSError(message)

    monkeypatch.setattr(ocp.AsyncCheckpointer, "wait_until_finished", wait)


def _fail_background_write_once(monkeypatch):
    """The background write of epoch 0 fails (reported by the wait before epoch 1's save)."""
    _inject_background_failure(monkeypatch, 1, "injected: disk full")


def test_a_background_failure_found_with_a_save_that_cannot_start_is_reported_too(
    tmp_path, monkeypatch
):
    """Epoch 1's write fails in the background and epoch 2's save fails as it starts: the
    round that finds both reports both, in order (one was lost under load on a full disk)."""
    from jaxjob._src.base import faults

    faults.reset()
    monkeypatch.setenv(faults.FAIL_AT_ENV, "save.commit:2,save.copy:3")
    job = _counting_job(4)
    # Epochs of 0.5 s: Orbax's own thread that creates a save's directory and writes its
    # metadata outlives a save that fails as it starts, and its late error is raised at the
    # next save; the next save waits for Orbax first, but not for a thread still running.
    job.epoch_group.add(lambda ws: time.sleep(0.5), jit=False)
    runner = jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path)))
    assert runner.train(jaxjob.Session()) == 4
    assert [e.epoch for e in runner.save_errors] == [1, 2]
    assert runner.checkpoint_manager.committed_epochs() == [0, 3, 4]


def test_async_failure_is_warned_recorded_and_reported(tmp_path, monkeypatch, caplog):
    """Under "warn" a background failure surfaces at the next save: logged, counted, reported."""
    handler = jaxjob.DiskMetadataHandler()
    ckpt = jaxjob.CheckpointManager(str(tmp_path), metadata_handler=handler)
    runner = jaxjob.JobRunner(_counting_job(2), ckpt)
    _fail_background_write_once(monkeypatch)
    assert runner.train(jaxjob.Session()) == 2
    assert [e.epoch for e in runner.save_errors] == [0]
    assert "Unable to write checkpoint for epoch 0" in caplog.text
    assert "injected: disk full" in caplog.text
    errors = [v["error"] for h in handler.history for v in h["stats"].values() if v.get("error")]
    assert errors == ["OSError: injected: disk full"]


def test_async_failure_raises_under_raise_policy(tmp_path, monkeypatch):
    """Under "raise" the background failure of epoch 0 is raised at the next save."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    runner = jaxjob.JobRunner(_counting_job(3), ckpt, on_save_error="raise")
    _fail_background_write_once(monkeypatch)
    with pytest.raises(
        CheckpointSaveError, match="saving checkpoint epoch 0 .* injected: disk full"
    ):
        runner.train(jaxjob.Session())
    assert not ckpt.tier("persistent").has_pending()  # completed before train returned
    assert 1 in ckpt.committed_epochs()  # epoch 1 was in flight when train raised


def test_failure_at_the_end_surfaces(tmp_path, monkeypatch):
    """A failure of the last save surfaces at the end of train under "raise"."""
    runner = jaxjob.JobRunner(
        _counting_job(1), jaxjob.CheckpointManager(str(tmp_path)), on_save_error="raise"
    )
    _inject_background_failure(monkeypatch, 2, "injected: last write lost")
    with pytest.raises(CheckpointSaveError, match="epoch 1 .*last write lost"):
        runner.train(jaxjob.Session())


def test_unwritable_directory_under_raise_policy(tmp_path):
    """A prefix under a regular file raises at the first save under "raise"."""
    (tmp_path / "f").write_text("x")
    runner = jaxjob.JobRunner(
        _counting_job(2), jaxjob.CheckpointManager(str(tmp_path / "f" / "c")), on_save_error="raise"
    )
    with pytest.raises(CheckpointSaveError, match="epoch 0"):
        runner.train(jaxjob.Session())


def test_training_error_completes_pending_saves(tmp_path):
    """If an epoch raises, the save in flight is still committed."""
    job = _counting_job(5)

    def boom(ws):
        if float(ws["x"]) >= 2:
            raise RuntimeError("boom")

    job.epoch_group.add(boom, jit=False)
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    with pytest.raises(RuntimeError, match="boom"):
        jaxjob.JobRunner(job, ckpt).train(jaxjob.Session())
    assert ckpt.committed_epochs() == [0, 1]
