"""Save interval: which epochs JobRunner saves, and exact resume when epochs were skipped."""

import time

import exact_job
import jax.numpy as jnp
import numpy as np
import pytest

import jaxjob


def _job(epochs, *, sleep_s=0.0, stop_at=None):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1, "done": ws["x"] + 1 >= (stop_at or 10**6)})
    if sleep_s:
        job.epoch_group.add(lambda ws: time.sleep(sleep_s), jit=False)
    job.add_stop_condition("done")
    jaxjob.epoch_limiter(job, epochs)
    return job


def _train(tmp_path, job, **options):
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    last = jaxjob.JobRunner(job, ckpt, **options).train(jaxjob.Session())
    return last, ckpt.committed_epochs()


@pytest.mark.parametrize(
    "epochs, every, stop_at, saved",
    [
        (5, 1, None, [0, 1, 2, 3, 4, 5]),
        (8, 3, None, [0, 3, 6, 8]),  # 8: the final epoch (the epoch limit held)
        (8, 4, None, [0, 4, 8]),
        (9, 4, 6, [0, 4, 6]),  # 6: a stop condition on an output held
        (3, 10, None, [0, 3]),
    ],
)
def test_saved_epochs_follow_save_every_epochs(tmp_path, epochs, every, stop_at, saved):
    """Epoch 0, every k-th epoch since the last save and the final epoch are saved."""
    last, committed = _train(tmp_path, _job(epochs, stop_at=stop_at), save_every_epochs=every)
    assert committed == saved and last == saved[-1]


def test_resume_after_skipped_epochs_runs_them_again(tmp_path):
    """Resuming from the newest committed epoch runs the skipped epochs and counts from there."""
    _train(tmp_path, _job(4), save_every_epochs=3)  # saves 0, 3, 4
    session = jaxjob.Session()
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    runner = jaxjob.JobRunner(_job(9), ckpt, save_every_epochs=3)
    assert runner.train(session) == 9
    assert ckpt.committed_epochs() == [0, 3, 4, 7, 9]  # 7 = 4 + 3: counted from the resume epoch
    assert float(session.workspace["x"]) == 9.0


def test_time_interval_saves_on_process_0s_clock(tmp_path):
    """With 0.5 s epochs and save_every_seconds=1.6, at most 4 epochs pass between saves and
    the epoch right after a save is not saved; the larger epoch interval does not hold them back.

    The first gap is only bounded above: epoch 1 also compiles the epoch program after epoch
    0's first save, which took over 1.1 s once on 2 loaded cores, making epoch 1 due.
    """
    job = _job(9, sleep_s=0.5)
    last, committed = _train(tmp_path, job, save_every_epochs=20, save_every_seconds=1.6)
    assert last == 9 and committed[0] == 0 and committed[-1] == 9
    gaps = np.diff(committed[:-1]).tolist()  # the final save is not due to the clock
    assert gaps and 1 <= gaps[0] <= 4 and all(2 <= gap <= 4 for gap in gaps[1:]), committed
    assert 9 - committed[-2] <= 4


def test_time_interval_alone(tmp_path):
    """save_every_epochs=None saves on time alone: fast epochs are not saved, the final one is."""
    last, committed = _train(tmp_path, _job(6), save_every_epochs=None, save_every_seconds=600)
    assert (last, committed) == (6, [0, 6])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"save_every_epochs": 0}, "save_every_epochs must be None or an int >= 1, got 0"),
        ({"save_every_epochs": 2.0}, "save_every_epochs must be None or an int >= 1, got 2.0"),
        ({"save_every_epochs": True}, "save_every_epochs must be None or an int >= 1, got True"),
        (
            {"save_every_seconds": -1},
            "save_every_seconds must be None or a positive number of seconds, got -1",
        ),
        (
            {"save_every_seconds": float("inf")},
            "save_every_seconds must be None or a positive number of seconds, got inf",
        ),
        (
            {"save_every_epochs": None},
            "save_every_epochs and save_every_seconds are both None; set at least one",
        ),
    ],
)
def test_bad_interval_names_argument_value_and_expectation(options, message):
    """A bad interval raises ValueError naming the argument, the value and what is expected."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        jaxjob.JobRunner(_job(1), **options)


def test_sigkill_with_skipped_epochs_then_restart_is_bitwise_exact(tmp_path):
    """Saving every 4th epoch, a SIGKILL in epoch 6 leaves epochs 0 and 4 (or 0, if 4's async
    write was still in flight): the restart runs the epochs after the newest committed one
    again and ends bitwise equal to an uninterrupted run."""
    exact_job.run(tmp_path / "ref", tmp_path / "ref.npz")
    interval = ("--save-every-epochs", "4")
    exact_job.run(
        tmp_path / "ckpt", tmp_path / "dead.npz", "--die-in-epoch", "6", *interval, expect=-9
    )
    assert jaxjob.CheckpointManager(str(tmp_path / "ckpt")).committed_epochs() in ([0], [0, 4])
    proc = exact_job.run(tmp_path / "ckpt", tmp_path / "out.npz", *interval)
    assert "finished at epoch 6" in proc.stdout
    assert jaxjob.CheckpointManager(str(tmp_path / "ckpt")).committed_epochs() == [0, 4, 6]
    exact_job.assert_same_workspace(tmp_path / "ref.npz", tmp_path / "out.npz")
