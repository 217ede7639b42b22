"""save_every="auto": the save interval from the measured save cost and a stated MTBF (Daly)."""

import logging
import math
import time

import jax.numpy as jnp
import pytest

import jaxjob
from jaxjob._src.run.auto_interval import daly_interval_s


def _argmin_of_daly_model(cost, mtbf):
    """The work interval minimising Daly's full model of wall time, ``(e^((τ+C)/M) - 1) / τ``."""
    g = lambda t: math.expm1((t + cost) / mtbf) / t  # noqa: E731
    lo, hi = 1e-9 * mtbf, 10.0 * mtbf
    for _ in range(300):  # golden-section search: g is unimodal on (0, inf)
        a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
        lo, hi = (lo, b) if g(a) < g(b) else (a, hi)
    return (lo + hi) / 2


@pytest.mark.parametrize("ratio", [1e-4, 1e-3, 1e-2, 0.1, 0.5])
def test_daly_interval_is_the_optimum_of_the_failure_model(ratio):
    """Within 0.6% of the numerical optimum up to C = M/2; Young's √(2CM) only at small C/M."""
    mtbf = 3600.0
    cost = ratio * mtbf
    best, chosen = _argmin_of_daly_model(cost, mtbf), daly_interval_s(cost, mtbf)
    assert abs(chosen - best) <= 0.006 * best
    if ratio <= 1e-4:
        assert abs(math.sqrt(2 * cost * mtbf) - best) <= 0.005 * best


def test_a_save_costing_more_than_twice_the_mtbf_saves_once_per_mtbf():
    assert daly_interval_s(100.0, 40.0) == 40.0


def _job(epochs, sleep_s=0.0):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"w": jnp.zeros(1000)})

    def step(ws):
        time.sleep(sleep_s)
        return {"w": ws["w"] + 1}

    job.epoch_group.add(step, jit=False)
    jaxjob.epoch_limiter(job, epochs)
    return job


def _manager(tmp_path):
    return jaxjob.CheckpointManager(str(tmp_path), keep=[jaxjob.keep.Last(100)])


def test_a_long_mtbf_saves_only_the_first_and_final_epochs(tmp_path, caplog):
    """With an MTBF of 1000 h, milliseconds of save cost give an interval of minutes."""
    runner = jaxjob.JobRunner(_job(6), _manager(tmp_path), save_every="auto", mtbf_hours=1000)
    with caplog.at_level(logging.INFO, logger="jaxjob"):
        assert runner.train(jaxjob.Session()) == 6
    assert runner.checkpoint_manager.committed_epochs() == [0, 6]
    auto = runner.save_interval
    assert isinstance(auto, jaxjob.AutoInterval) and auto.cost_s > 0
    seconds = daly_interval_s(auto.cost_s, 1000 * 3600.0) + auto.cost_s
    assert runner.history[-1]["save_interval_s"] == pytest.approx(seconds)
    assert seconds > 60
    assert [r["save_interval_s"] for r in runner.history[:-1]] == [
        runner.history[0]["save_interval_s"]
    ] * 5
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Saving every")]
    assert logged and "MTBF of 1000 h" in logged[0]


def test_an_mtbf_shorter_than_an_epoch_saves_every_epoch(tmp_path):
    """An MTBF of ~4 ms (under the 0.2 s epoch): every epoch is due.

    With ``window=1`` the interval is the last save's cost plus Daly's term (the MTBF itself,
    for a cost over twice the MTBF), and the time since that save started is its cost plus
    an epoch: due whatever the load.
    """
    auto = jaxjob.AutoInterval(mtbf_hours=1e-6, window=1)
    runner = jaxjob.JobRunner(_job(4, sleep_s=0.2), _manager(tmp_path), save_every=auto)
    assert runner.train(jaxjob.Session()) == 4
    assert runner.checkpoint_manager.committed_epochs() == [0, 1, 2, 3, 4]
    for record in runner.history:  # the last save's cost plus the MTBF (3.6 ms): under an epoch
        cost = record["save_time_s"]
        interval = daly_interval_s(cost, 1e-6 * 3600) + cost
        assert record["save_interval_s"] == pytest.approx(interval)
        assert record["save_interval_s"] < record["epoch_time_s"]


def test_the_interval_follows_the_median_of_the_latest_costs():
    auto = jaxjob.AutoInterval(mtbf_hours=1.0, window=3)
    for cost in (9.0, 1.0, 1.0, 1.0):  # the first falls out of the window
        seconds = auto.record(cost)
    assert auto.cost_s == 1.0
    assert seconds == pytest.approx(daly_interval_s(1.0, 3600.0) + 1.0)
    assert not auto.due_by_time(seconds - 0.01) and auto.due_by_time(seconds)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"save_every": "auto"}, r"save_every='auto' needs mtbf_hours= \(the job's mean time"),
        ({"mtbf_hours": 5.0}, r"mtbf_hours=5.0 is only used with save_every='auto'; pass both"),
        (
            {"save_every": "auto", "mtbf_hours": 5.0, "save_every_seconds": 60},
            r"save_every='auto' chooses the interval itself; leave save_every_epochs and "
            r"save_every_seconds at their defaults \(got 1 and 60\)",
        ),
        (
            {"save_every": "auto", "mtbf_hours": 5.0, "save_every_epochs": 3},
            r"\(got 3 and None\)",
        ),
        (
            {"save_every": "hourly"},
            r"save_every must be None, 'auto' or a jaxjob.AutoInterval, got 'hourly'",
        ),
        (
            {"save_every": "auto", "mtbf_hours": -1},
            r"mtbf_hours must be a positive number of hours, got -1",
        ),
        ({"save_every": "auto", "mtbf_hours": float("inf")}, r"got inf"),
        (
            {"save_every": jaxjob.AutoInterval(mtbf_hours=1.0), "mtbf_hours": 2.0},
            r"pass mtbf_hours to the AutoInterval, not to the runner as well",
        ),
    ],
)
def test_bad_arguments_name_what_was_given_and_what_is_expected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        jaxjob.JobRunner(jaxjob.Job(), **kwargs)


def test_window_must_be_a_positive_int():
    with pytest.raises(ValueError, match=r"window must be an int >= 1, got 0"):
        jaxjob.AutoInterval(mtbf_hours=1.0, window=0)


def test_a_resumed_run_measures_its_first_save_then_keeps_the_interval(tmp_path):
    """Resumed, no save has been measured: the first epoch is saved, then the interval rules."""
    ckpt = str(tmp_path / "ckpt")
    jaxjob.JobRunner(_job(2), _manager(ckpt)).train(jaxjob.Session())  # saves 0, 1, 2
    runner = jaxjob.JobRunner(_job(7), _manager(ckpt), save_every="auto", mtbf_hours=1000)
    assert runner.train(jaxjob.Session()) == 7
    assert runner.checkpoint_manager.committed_epochs() == [0, 1, 2, 3, 7]
    assert [r["epoch"] for r in runner.history] == [1, 2, 3, 4, 5, 6, 7]  # 1, 2: rebuilt
    assert runner.history[2]["save_interval_s"] > 60


def test_epoch_0s_cost_counts_only_until_another_save_is_measured():
    """Epoch 0's save also sets up the saver, lock and run: it does not stay in the median."""
    auto = jaxjob.AutoInterval(mtbf_hours=1.0)
    assert auto.record(5.0, provisional=True) == pytest.approx(daly_interval_s(5.0, 3600.0) + 5.0)
    auto.record(0.1)
    assert auto.cost_s == pytest.approx(0.1)
