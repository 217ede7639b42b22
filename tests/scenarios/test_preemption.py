"""Preemption: a signal makes JobRunner save the running epoch, commit it and raise Preempted."""

import os
import signal
import threading

import exact_job
import jax.numpy as jnp
import pytest
from test_multiprocess_faults import committed, launch, lines

import jaxjob


def _epochs(ckpt):
    return jaxjob.CheckpointManager(str(ckpt)).committed_epochs()


def test_sigterm_saves_the_running_epoch_and_the_restart_is_bitwise_exact(tmp_path):
    """SIGTERM in epoch 2 (saves every 4th epoch): epoch 2 is saved and committed, a second
    SIGTERM during that save is ignored, download and exit do not run, Preempted(2) propagates
    (exit status 1); the restart resumes after 2 and ends bitwise equal to an uninterrupted run."""
    exact_job.run(tmp_path / "ref", tmp_path / "ref.npz")
    interval = ("--save-every-epochs", "4")
    ckpt = tmp_path / "ckpt"
    proc = exact_job.run(
        ckpt, tmp_path / "x.npz", "--term-in-epoch", "2", "--term-again", *interval, expect=1
    )
    assert "PREEMPTED 2" in proc.stdout
    assert "DOWNLOAD RAN" not in proc.stdout and "EXIT RAN" not in proc.stdout
    assert "Received SIGTERM: stopping after this epoch" in proc.stderr
    assert "Received SIGTERM again: ignored while the preempted epoch is saved" in proc.stderr
    assert proc.stderr.strip().endswith(
        "jaxjob.Preempted: preempted: epoch 2 is saved and committed; "
        "run the job again to resume after it"
    )
    assert _epochs(ckpt) == [0, 2]
    proc = exact_job.run(ckpt, tmp_path / "out.npz", *interval)
    assert proc.stdout.splitlines() == ["DOWNLOAD RAN", "EXIT RAN", "finished at epoch 6"]
    assert _epochs(ckpt) == [0, 2, 6]
    exact_job.assert_same_workspace(tmp_path / "ref.npz", tmp_path / "out.npz")


def test_empty_preemption_signals_leave_sigterm_fatal(tmp_path):
    """With preemption_signals=() a SIGTERM in epoch 2 kills the process: epoch 2 is not saved."""
    ckpt = tmp_path / "ckpt"
    args = ("--term-in-epoch", "2", "--no-preemption")
    proc = exact_job.run(ckpt, tmp_path / "x.npz", *args, expect=-signal.SIGTERM)
    assert "PREEMPTED" not in proc.stdout
    assert _epochs(ckpt) in ([0], [0, 1])


def _job(epochs, *, signal_in_epoch=None, log=None):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
    jaxjob.epoch_limiter(job, epochs)

    def host(ws):
        if log is not None:
            log.append(("handler", signal.getsignal(signal.SIGUSR1)))
        if int(ws[jaxjob._src.core.job.EPOCH_COUNTER]) == signal_in_epoch:
            os.kill(os.getpid(), signal.SIGUSR1)

    job.epoch_group.add(host, jit=False)
    if log is not None:
        job.exit_group.add(lambda ws: log.append("exit"), jit=False)
    return job


@pytest.fixture
def previous_handler():
    """A SIGUSR1 handler installed before train, counting its calls; removed afterwards."""
    calls = []

    def handler(signum, frame):
        calls.append(signum)

    old = signal.signal(signal.SIGUSR1, handler)
    yield handler, calls
    signal.signal(signal.SIGUSR1, old)


def test_preempted_in_process_restores_the_previous_handler(tmp_path, previous_handler):
    """A watched signal in epoch 2 raises Preempted(2) after committing epoch 2; the exit group
    does not run; the previous handler is back and was not called."""
    handler, calls = previous_handler
    log = []
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    runner = jaxjob.JobRunner(
        _job(5, signal_in_epoch=2, log=log),
        ckpt,
        save_every_epochs=5,
        preemption_signals=[signal.SIGUSR1],
    )
    with pytest.raises(jaxjob.Preempted, match="epoch 2 is saved and committed") as raised:
        runner.train(jaxjob.Session())
    assert raised.value.epoch == 2 and ckpt.committed_epochs() == [0, 2]
    assert "exit" not in log and log[0][1] is not handler  # the runner's handler ran the epochs
    assert signal.getsignal(signal.SIGUSR1) is handler and calls == []
    session = jaxjob.Session()
    runner = jaxjob.JobRunner(_job(5, log=log), ckpt, preemption_signals=[signal.SIGUSR1])
    assert runner.train(session) == 5 and float(session.workspace["x"]) == 5.0
    assert log[-1] == "exit" and signal.getsignal(signal.SIGUSR1) is handler


@pytest.mark.parametrize("where", ["off the main thread", "without a checkpoint manager"])
def test_no_handler_is_installed(tmp_path, previous_handler, where):
    """Off the main thread, or with nothing to save to, train leaves the signal's handler alone."""
    handler, _ = previous_handler
    log, results = [], []
    ckpt = jaxjob.CheckpointManager(str(tmp_path)) if where.startswith("off") else None
    runner = jaxjob.JobRunner(_job(2, log=log), ckpt, preemption_signals=[signal.SIGUSR1])
    if where.startswith("off"):
        thread = threading.Thread(target=lambda: results.append(runner.train(jaxjob.Session())))
        thread.start()
        thread.join()
    else:
        results.append(runner.train(jaxjob.Session()))
    assert results == [2]
    assert [entry[1] for entry in log[:-1]] == [handler, handler] and log[-1] == "exit"


@pytest.mark.parametrize(
    "value, message",
    [
        (signal.SIGTERM, "preemption_signals must be a sequence of signals"),
        ("SIGTERM", "preemption_signals must be a sequence of signals"),
        ((signal.SIGKILL,), r"signals that can be caught .* got <Signals.SIGKILL: 9> in"),
        ((15, "x"), r"signals that can be caught .* got 'x' in \(15, 'x'\)"),
        ((True,), r"signals that can be caught .* got True in"),
    ],
)
def test_bad_preemption_signals_raise(value, message):
    """A bad preemption_signals raises ValueError naming the argument, the value and what fits."""
    with pytest.raises(ValueError, match=message):
        jaxjob.JobRunner(_job(1), preemption_signals=value)


def test_sigterm_to_one_process_stops_both_after_the_same_epoch(tmp_path):
    """2 processes x 2 devices, saving every 3rd epoch: process 1 gets SIGTERM in epoch 2;
    both save epoch 2, raise Preempted(2) and exit 75; relaunched, both end bitwise equal to an
    uninterrupted run."""
    status, output, _ = launch(2, 2, "mp_job.py", tmp_path / "ref", 4)
    assert status == 0, output[-4000:]
    reference = lines(output, "RESULT")
    opts = {"term": [2, 1], "save_every_epochs": 3}
    status, output, _ = launch(2, 2, "mp_job.py", tmp_path / "run", 4, opts=opts)
    assert status == 75, output[-4000:]
    preempted = lines(output, "PREEMPTED")
    assert preempted == {p: {"process": p, "epoch": 2, "seen": 2} for p in (0, 1)}
    assert "[process=0] Processes [1] were preempted: stopping after epoch 2" in output
    assert committed(tmp_path / "run") == ["local.0", "local.2"]
    status, output, _ = launch(
        2, 2, "mp_job.py", tmp_path / "run", 4, opts={"save_every_epochs": 3}
    )
    assert status == 0, output[-4000:]
    resumed = lines(output, "RESULT")
    for process in (0, 1):
        assert resumed[process]["digest"] == reference[process]["digest"]
        assert resumed[process]["cursor"] == [1000 * process + 4, 4]
        assert resumed[process]["last"] == 4
    assert committed(tmp_path / "run") == ["local.0", "local.2", "local.4"]


class _SignallingManager(jaxjob.CheckpointManager):
    """Sends itself SIGUSR1 while the runner waits for the last save to commit."""

    def wait_until_finished(self):
        os.kill(os.getpid(), signal.SIGUSR1)
        super().wait_until_finished()


@pytest.mark.parametrize("when", ["during init", "after the last epoch's boundary"])
def test_signal_outside_the_epochs_stops_at_the_nearest_saved_epoch(tmp_path, when):
    """A signal during init stops after epoch 0; one after the last epoch's stop conditions
    were exchanged, while its save commits, skips the exit group: Preempted(last epoch)."""
    log = []
    job = _job(3, log=log)
    if when == "during init":
        job.init_group.add(lambda ws: os.kill(os.getpid(), signal.SIGUSR1), jit=False)
        ckpt, expected = jaxjob.CheckpointManager(str(tmp_path)), 0
    else:
        ckpt, expected = _SignallingManager(str(tmp_path)), 3
    runner = jaxjob.JobRunner(job, ckpt, preemption_signals=[signal.SIGUSR1])
    with pytest.raises(jaxjob.Preempted) as raised:
        runner.train(jaxjob.Session())
    assert raised.value.epoch == expected and ckpt.committed_epochs()[-1] == expected
    assert "exit" not in log


class _SignalledWhileResuming(jaxjob.CheckpointManager):
    """Sends itself SIGUSR1 as the runner asks which epoch to resume from."""

    def get_resume_from_epoch_id(self, user_epoch=None):
        os.kill(os.getpid(), signal.SIGUSR1)
        return super().get_resume_from_epoch_id(user_epoch)


def test_a_signal_during_the_resume_stops_at_the_resumed_epoch(tmp_path):
    """A preemption signal while the runner decides and restores the resume epoch is honoured
    once the restore is done: Preempted(the resumed epoch), no epoch run, nothing saved again;
    the next run resumes from the same epoch and finishes."""
    runner = jaxjob.JobRunner(
        _job(5, signal_in_epoch=2), jaxjob.CheckpointManager(str(tmp_path)),
        preemption_signals=[signal.SIGUSR1],
    )  # fmt: skip
    with pytest.raises(jaxjob.Preempted):
        runner.train(jaxjob.Session())
    assert _epochs(tmp_path)[-1] == 2
    log = []
    ckpt = _SignalledWhileResuming(str(tmp_path))
    runner = jaxjob.JobRunner(_job(5, log=log), ckpt, preemption_signals=[signal.SIGUSR1])
    with pytest.raises(jaxjob.Preempted) as raised:
        runner.train(jaxjob.Session())
    assert raised.value.epoch == 2 and log == [] and _epochs(tmp_path)[-1] == 2
    session = jaxjob.Session()
    runner = jaxjob.JobRunner(_job(5), jaxjob.CheckpointManager(str(tmp_path)))
    assert runner.train(session) == 5 and float(session.workspace["x"]) == 5.0


class _DenyingHandler(jaxjob.DiskMetadataHandler):
    """Reports the checkpoint directory as not writable from the ``deny_from``-th check on."""

    def __init__(self, deny_from):
        super().__init__()
        self.checks, self.deny_from = 0, deny_from

    def cp_accessible(self, epoch=None):
        self.checks += epoch is None
        return super().cp_accessible(epoch) and self.checks < self.deny_from


def test_failed_save_of_the_preempted_epoch_names_the_newest_committed(tmp_path, caplog):
    """Under on_save_error="warn", if the preempted epoch's save fails, Preempted names the newest
    committed epoch instead, and a warning says so."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path), metadata_handler=_DenyingHandler(3))
    runner = jaxjob.JobRunner(_job(5, signal_in_epoch=2), ckpt, preemption_signals=[signal.SIGUSR1])
    with pytest.raises(jaxjob.Preempted, match="epoch 1 is saved and committed") as raised:
        runner.train(jaxjob.Session())
    assert raised.value.epoch == 1 and ckpt.committed_epochs() == [0, 1]
    assert [err.epoch for err in runner.save_errors] == [2]
    assert "The save of epoch 2 failed; 1 is committed" in caplog.text
