"""runner.history survives a restart, and metric writers (JSONL, TensorBoard) get it once."""

import dataclasses
import json
import logging
import os
import pathlib
import struct
import sys

import history_job
import jax.numpy as jnp
import paths
import pytest
import tensorboardX  # the [test] extra has it: the core test needs it, no skip

import jaxjob
import jaxjob._src.manager.lock
from jaxjob import testing
from jaxjob._src.base import fs
from jaxjob._src.run.history import HistoryFile, history_path, read_records

JOB = os.path.join(paths.JOBS, "history_job.py")
EPOCHS = 6


def _events(logdir):
    """The events of the TFRecord files in ``logdir``, files in name order (TensorBoard's)."""
    for name in sorted(n for n in os.listdir(logdir) if "tfevents" in n):
        data, at = pathlib.Path(logdir, name).read_bytes(), 0
        while at + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            yield tensorboardX.proto.event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4


def _tb_scalars(logdir):
    """{tag: {step: value}} as TensorBoard shows the event files (read here, not by jaxjob):
    a SessionLog.START at step s hides the earlier events at steps >= s."""
    shown = {}
    for event in _events(logdir):
        if event.session_log.status == tensorboardX.proto.event_pb2.SessionLog.START:
            shown = {t: {s: v for s, v in d.items() if s < event.step} for t, d in shown.items()}
        for value in event.summary.value:
            shown.setdefault(value.tag, {})[event.step] = value.simple_value
    return {tag: steps for tag, steps in shown.items() if steps}


def _scalar_events(logdir):
    """How many scalar values the event files hold in all (shown or purged)."""
    return sum(len(event.summary.value) for event in _events(logdir))


def _jsonl(path):
    return [json.loads(line) for line in open(path)]


def _history_file(prefix, node="local"):
    return pathlib.Path(history_path(str(prefix), [node]))


def _written(prefix, node="local"):
    """The records in the history file of ``node`` under ``prefix``, line by line (any life)."""
    return [line["record"] for line in _jsonl(_history_file(prefix, node))[1:]]


def _stored(prefix, upto, node="local"):
    """What a rebuild from epoch ``upto`` gets, read without starting a life (no rewrite)."""
    return read_records(fs.read_text(str(_history_file(prefix, node))), upto, [node])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run in this process: its history and its writers' directory."""
    root = tmp_path_factory.mktemp("reference")
    runner = jaxjob.JobRunner(
        history_job.build(EPOCHS),
        jaxjob.CheckpointManager(str(root / "ckpt")),
        progress=["loss"],
        writers=history_job.writers(str(root / "metrics")),
    )
    assert runner.train(jaxjob.Session()) == EPOCHS
    return runner.history


def _values(history):
    return [(r["epoch"], r["loss"]) for r in history]


def test_sigkilled_twice_and_resumed_the_history_equals_an_uninterrupted_runs(
    tmp_path, reference, compile_cache
):
    """Killed at epoch 4's commit (its lines written), then right after epoch 5's save, resumed:
    the history, the JSONL file and TensorBoard's scalars hold each epoch once, with the values
    of an uninterrupted run."""
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics"
    argv = [JOB, str(ckpt), str(metrics)]
    first = testing.run_killed(argv, ckpt, kill_at="save.commit:5", env=compile_cache)
    assert first.killed and first.committed == [0, 1, 2, 3]
    stale = [r["epoch"] for r in _written(ckpt)]
    assert 4 in stale  # the killed run wrote epoch 4's lines before the commit it died in
    second = testing.run_killed(argv, ckpt, kill_at="history.saved:2", env=compile_cache)
    assert second.killed and second.resumed_from == 3 and second.committed[-1] in (4, 5)
    output = testing.run(argv, db_prefix=ckpt, env=compile_cache)
    (line,) = [line for line in output.splitlines() if line.startswith("HISTORY ")]
    history = json.loads(line.removeprefix("HISTORY "))
    assert _values(history) == _values(reference)
    resumed = second.committed[-1]
    for record in history:  # times: all but the resumed epoch's if it died before its record
        timed = record["epoch"] != 5 or resumed == 4
        assert ("epoch_time_s" in record) == timed, record
    assert _values(_jsonl(metrics / "metrics.jsonl")) == _values(reference)
    shown = _tb_scalars(metrics / "tb")
    assert shown["loss"] == pytest.approx(dict(_values(reference)), rel=1e-6)
    assert sorted(shown["epoch_time_s"]) == list(range(1, EPOCHS + 1))
    assert _values(_stored(ckpt, EPOCHS)) == _values(reference)
    assert {r["epoch"] for r in _written(ckpt)} == set(range(1, EPOCHS + 1))


@pytest.mark.slow  # three 2-process launches: ~1 minute on a loaded 2-core machine
def test_two_processes_killed_and_resumed_share_one_history_written_once(
    tmp_path, reference, compile_cache
):
    """Under `jaxjob launch -n 2`, killed in epoch 3 and resumed: both processes have the whole
    history; process 0 alone wrote the durable file and the writers (each epoch once)."""
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics"
    argv = [JOB, str(ckpt), str(metrics)]
    options = {"processes": 2, "env": compile_cache}
    kill = testing.run_killed(argv, ckpt, kill_at="epoch:3", **options)
    assert kill.killed and kill.committed[-1] in (1, 2)  # epoch 2's commit may be in flight
    resumed = kill.committed[-1]
    output = testing.run(argv, db_prefix=ckpt, **options)
    lines = [line for line in output.splitlines() if "HISTORY " in line]
    assert len(lines) == 2, output[-3000:]
    for line in lines:
        assert _values(json.loads(line.split("HISTORY ", 1)[1])) == _values(reference)
    assert _values(_jsonl(metrics / "metrics.jsonl")) == _values(reference)
    assert sorted(_tb_scalars(metrics / "tb")["loss"]) == list(range(1, EPOCHS + 1))
    assert _scalar_events(metrics / "tb") == 3 * EPOCHS  # loss and two times, each epoch once
    # one writer: the rewrite at the start (epochs 1..resumed), then 2 lines per epoch
    written = [r["epoch"] for r in _written(ckpt)]
    later = [e for e in range(resumed + 1, EPOCHS + 1) for _ in "ab"]
    assert written == list(range(1, resumed + 1)) + later


def test_resume_rebuilds_the_whole_history_and_a_finished_job_keeps_it(tmp_path):
    """In one process: a run continued to more epochs, or rerun once finished, has every epoch."""
    ckpt = str(tmp_path / "ckpt")
    first = jaxjob.JobRunner(
        history_job.build(2), jaxjob.CheckpointManager(ckpt), progress=["loss"]
    )
    first.train(jaxjob.Session())
    more = jaxjob.JobRunner(history_job.build(3), jaxjob.CheckpointManager(ckpt), progress=["loss"])
    more.train(jaxjob.Session())
    assert more.history[:2] == first.history and [r["epoch"] for r in more.history] == [1, 2, 3]
    again = jaxjob.JobRunner(history_job.build(3), jaxjob.CheckpointManager(ckpt))
    assert again.train(jaxjob.Session()) == 3
    assert again.history == more.history  # finished: no epoch ran, the curve is all there


def test_an_explicit_resume_from_epoch_keeps_the_epochs_it_covers(tmp_path):
    """resume_from_epoch=1 of a 3-epoch run: epochs 2 and 3 are run again, each recorded once."""
    ckpt = str(tmp_path / "ckpt")
    ran = jaxjob.JobRunner(history_job.build(3), jaxjob.CheckpointManager(ckpt), progress=["loss"])
    ran.train(jaxjob.Session())
    again = jaxjob.JobRunner(
        history_job.build(3), jaxjob.CheckpointManager(ckpt), 1, progress=["loss"]
    )
    again.train(jaxjob.Session())
    assert _values(again.history) == _values(ran.history)
    assert _values(_stored(ckpt, 3)) == _values(ran.history)


def test_without_a_manager_each_train_starts_an_empty_history_and_writers_get_it(tmp_path):
    """No checkpoints, no durable history: the writers still get every epoch."""
    runner = jaxjob.JobRunner(
        history_job.build(2), progress=["loss"], writers=[jaxjob.JsonlWriter(tmp_path / "m.jsonl")]
    )
    runner.train(jaxjob.Session())
    runner.train(jaxjob.Session())
    assert [r["epoch"] for r in runner.history] == [1, 2]
    assert _values(_jsonl(tmp_path / "m.jsonl")) == _values(runner.history)


def test_history_file_and_jsonl_writer_on_s3(s3_prefix):
    """On an object store (moto), which cannot append: the same records, each epoch once; a
    saved epoch's times go with the next save's upload (or close).

    (tests/scenarios/test_cloud.py trains and resumes on gs:// and s3://, history included.)"""
    records = [{"epoch": e, "loss": 1.0 / e, "epoch_time_s": 0.1} for e in (1, 2, 3)]
    path = history_path(s3_prefix, ["local"])
    store = HistoryFile(s3_prefix, ["local"], timeout_s=10.0)
    assert store.rebuild(None) == []
    for record in records:
        store.saving({"epoch": record["epoch"], "loss": record["loss"]})
        store.saved(record)
    assert read_records(fs.read_text(path), 9, ["local"])[-1] == {"epoch": 3, "loss": 1 / 3}
    store.saving({"epoch": 4, "loss": 0.25})  # killed during epoch 4's save
    again = HistoryFile(s3_prefix, ["local"], timeout_s=10.0)
    assert again.rebuild(3) == records  # the start's upload: records 1..3 alone
    assert read_records(fs.read_text(path), 9, ["local"]) == records
    again.saving({"epoch": 4, "loss": 0.2})
    again.saved({"epoch": 4, "loss": 0.2, "epoch_time_s": 0.3})
    again.close()
    assert read_records(fs.read_text(path), 9, ["local"]) == [
        *records,
        {"epoch": 4, "loss": 0.2, "epoch_time_s": 0.3},
    ]
    writer = jaxjob.JsonlWriter(s3_prefix + "/metrics.jsonl")
    writer.resume([])
    for record in records:
        writer.write(record)
    writer.resume(records[:2])
    writer.write(records[2])
    text = fs.read_text(s3_prefix + "/metrics.jsonl")
    assert [json.loads(line) for line in text.splitlines()] == records


def test_the_durable_history_drops_a_killed_runs_later_epochs(tmp_path):
    """Lines after the resumed epoch, a torn last line: the rebuild keeps epochs 1..k, and the
    start of the resumed run rewrites the file with them alone."""
    records = [{"epoch": 1, "loss": 3.0}, {"epoch": 2, "loss": 2.0}, {"epoch": 3, "loss": 9.0}]
    killed = HistoryFile(str(tmp_path), ["local"], timeout_s=10.0)
    killed.rebuild(None)
    for record in records:
        killed.saving(record)
    with open(_history_file(tmp_path), "a") as f:
        f.write('{"life": "')  # torn
    store = HistoryFile(str(tmp_path), ["local"], timeout_s=10.0)
    assert store.rebuild(2) == records[:2]
    assert _written(tmp_path) == records[:2]
    store.saving({"epoch": 3, "loss": 1.5})
    assert _stored(tmp_path, 3)[-1] == {"epoch": 3, "loss": 1.5}
    store.saved({"epoch": 3, "loss": 1.5, "epoch_time_s": 0.1})
    assert _stored(tmp_path, 3) == [*records[:2], {"epoch": 3, "loss": 1.5, "epoch_time_s": 0.1}]


def _counting_job(epochs, scale):
    """x counts the epochs; the epoch's ``loss`` is ``scale * x``: each job's values its own."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())}, name="init")
    job.epoch_group.add(lambda ws: {"x": ws["x"] + 1, "loss": scale * (ws["x"] + 1)}, name="count")
    jaxjob.epoch_limiter(job, epochs)
    return job


def test_two_node_names_under_one_db_prefix_keep_separate_histories(tmp_path):
    """Jobs of nodes "a" and "b" under one db_prefix (each holds its own lock): b's start from
    scratch does not wipe a's history, and a's resume rebuilds a's values, not b's."""
    prefix = str(tmp_path)

    def run(node, epochs, scale):
        runner = jaxjob.JobRunner(
            _counting_job(epochs, scale),
            jaxjob.CheckpointManager(prefix, node_name=node),
            progress=["loss"],
        )
        runner.train(jaxjob.Session())
        return [(r["epoch"], r["loss"]) for r in runner.history]

    assert run("a", 2, 1.0) == [(1, 1.0), (2, 2.0)]
    assert run("b", 3, 10.0) == [(1, 10.0), (2, 20.0), (3, 30.0)]
    assert run("a", 3, 1.0) == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert [r["loss"] for r in _stored(prefix, 9, "b")] == [10.0, 20.0, 30.0]
    assert sorted(os.listdir(_history_file(prefix, "a").parent)) == ["a.jsonl", "b.jsonl"]


def test_a_stale_writers_lines_after_a_new_runs_start_are_ignored(tmp_path):
    """A writer that lost its lock (a frozen job whose lease lapsed) still appends after the
    new run's start rewrote the file: its lines, for epochs old and new, reach no rebuild."""
    prefix = str(tmp_path)
    stale = HistoryFile(prefix, ["local"], timeout_s=10.0)
    stale.rebuild(None)
    for epoch in (1, 2, 3):
        stale.saving({"epoch": epoch, "loss": float(epoch)})
        stale.saved({"epoch": epoch, "loss": float(epoch), "epoch_time_s": 0.1})
    new = HistoryFile(prefix, ["local"], timeout_s=10.0)
    assert [r["loss"] for r in new.rebuild(2)] == [1.0, 2.0]  # resumed from epoch 2
    stale.saving({"epoch": 4, "loss": 99.0})  # the stale writer goes on
    new.saving({"epoch": 3, "loss": 3.5})
    stale.saved({"epoch": 4, "loss": 99.0, "epoch_time_s": 0.1})
    stale.saving({"epoch": 3, "loss": 98.0})
    assert 99.0 in [r["loss"] for r in _written(prefix)]  # in the file, after the rewrite
    assert [r["loss"] for r in _stored(prefix, 9)] == [1.0, 2.0, 3.5]
    assert [r["loss"] for r in HistoryFile(prefix, ["local"], timeout_s=10.0).rebuild(4)] == [
        1.0,
        2.0,
        3.5,
    ]


def test_a_second_job_on_a_live_jobs_db_prefix_leaves_its_history_alone(tmp_path):
    """A second job on a db_prefix whose lock a live job (another host) holds fails with
    CheckpointInUseError, from scratch or resuming, and the live job's history file is
    unchanged: the new life starts only once the manager holds its lock."""
    prefix = str(tmp_path)
    first = jaxjob.JobRunner(
        _counting_job(2, 1.0), jaxjob.CheckpointManager(prefix), progress=["loss"]
    )
    first.train(jaxjob.Session())
    first.checkpoint_manager.close()
    before = _history_file(tmp_path).read_bytes()
    holder = dataclasses.replace(jaxjob._src.manager.lock.Holder.me(), host="node-7", pid=4242)
    pathlib.Path(jaxjob._src.manager.lock.lock_path(prefix, "local")).write_text(
        json.dumps(dataclasses.asdict(holder))
    )
    for resume in (None, 1):
        second = jaxjob.JobRunner(
            _counting_job(3, 10.0), jaxjob.CheckpointManager(prefix), resume, progress=["loss"]
        )
        with pytest.raises(jaxjob.CheckpointInUseError, match="node-7"):
            second.train(jaxjob.Session())
    assert _history_file(tmp_path).read_bytes() == before
    assert [r["loss"] for r in _stored(prefix, 2)] == [1.0, 2.0]


def test_an_unwritable_history_file_warns_and_training_goes_on(tmp_path, caplog):
    """The history file is a directory (no write, no read): one warning a run, the job trains."""
    _history_file(tmp_path).mkdir(parents=True)
    runner = jaxjob.JobRunner(history_job.build(2), jaxjob.CheckpointManager(str(tmp_path)))
    with caplog.at_level(logging.WARNING):
        assert runner.train(jaxjob.Session()) == 2  # 3 saves, each writes to the history
    (warning,) = [r.getMessage() for r in caplog.records if "history file" in r.getMessage()]
    assert warning.startswith(f"Could not rewrite the history file {_history_file(tmp_path)}")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert runner.train(jaxjob.Session()) == 2  # resumed (finished): nothing to read back
    assert "Could not read the history file" in caplog.text and runner.history == []


def test_a_damaged_history_file_or_metrics_file_warns_and_training_goes_on(tmp_path, caplog):
    """Bytes that are not UTF-8 in the history file and in a JsonlWriter's file: each is one
    warning naming the file; the run resumes with an empty history and trains."""
    prefix, metrics = str(tmp_path / "ckpt"), tmp_path / "m.jsonl"
    jaxjob.JobRunner(_counting_job(2, 1.0), jaxjob.CheckpointManager(prefix)).train(
        jaxjob.Session()
    )
    _history_file(prefix).write_bytes(b"\xff\xfe not utf-8\n")
    metrics.write_bytes(b"\xff\xfe not utf-8\n")
    runner = jaxjob.JobRunner(
        _counting_job(3, 1.0),
        jaxjob.CheckpointManager(prefix),
        progress=["loss"],
        writers=[jaxjob.JsonlWriter(str(metrics))],
    )
    with caplog.at_level(logging.WARNING):
        assert runner.train(jaxjob.Session()) == 3
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    (read,) = [m for m in messages if "history file" in m]
    assert read.startswith(f"Could not read the history file {_history_file(prefix)}")
    (writer,) = [m for m in messages if "Metric writer" in m]
    assert writer.startswith(f"Metric writer JsonlWriter({str(metrics)!r}) failed in resume")
    assert [r["epoch"] for r in runner.history] == [3]
    assert [r["epoch"] for r in _stored(prefix, 3)] == [3]  # the new life's start rewrote it


def test_jsonl_writer_keeps_its_lines_drops_later_epochs_and_adds_missing_ones(tmp_path):
    """resume(history): lines already written stay byte for byte, a killed run's later lines go,
    and the history's epochs the file lacks are appended: each epoch once."""
    path = tmp_path / "m.jsonl"
    path.write_text(
        "".join(json.dumps({"epoch": e, "written": "before"}) + "\n" for e in (1, 2, 3))
    )
    writer = jaxjob.JsonlWriter(str(path))
    writer.resume([{"epoch": 1}, {"epoch": 2}])
    assert _jsonl(path) == [{"epoch": 1, "written": "before"}, {"epoch": 2, "written": "before"}]
    writer.resume([{"epoch": 1}, {"epoch": 2}, {"epoch": 3, "loss": 0.5}])
    writer.write({"epoch": 4, "loss": 0.25})
    assert [r["epoch"] for r in _jsonl(path)] == [1, 2, 3, 4]
    assert _jsonl(path)[2:] == [{"epoch": 3, "loss": 0.5}, {"epoch": 4, "loss": 0.25}]


def test_tensorboard_writer_purges_later_steps_and_writes_nothing_twice(tmp_path):
    """A resume from epoch 3 after epochs 1..5 were written: TensorBoard shows 1..3 as written,
    then the new 4; the new event file holds no step already shown."""
    logdir = str(tmp_path / "tb")
    writer = jaxjob.TensorBoardWriter(logdir)
    writer.resume([])
    for epoch in range(1, 6):
        writer.write({"epoch": epoch, "loss": float(epoch), "saved_to": "persistent"})
    writer.close()
    assert _scalar_events(logdir) == 5
    history = [{"epoch": e, "loss": float(e)} for e in (1, 2, 3)]
    writer.resume(history)
    writer.write({"epoch": 4, "loss": 40.0})
    writer.close()
    assert _tb_scalars(logdir) == {"loss": {1: 1.0, 2: 2.0, 3: 3.0, 4: 40.0}}
    assert _scalar_events(logdir) == 6  # 5 before, then epoch 4 alone
    writer.resume(history[:2] + [{"epoch": 3, "loss": 3.0, "epoch_time_s": 0.5}])  # 3 lacks a tag
    writer.close()
    assert _tb_scalars(logdir) == {"loss": {1: 1.0, 2: 2.0, 3: 3.0}, "epoch_time_s": {3: 0.5}}


@pytest.mark.parametrize(
    "writers, message",
    [
        ("m.jsonl", r"writers must be a list of metric writers, .* got 'm.jsonl'"),
        ([object()], r"writers: \[<object object at .*>\] are not metric writers"),
    ],
)
def test_writers_must_be_metric_writers(writers, message):
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"x": jnp.zeros(())})
    with pytest.raises(TypeError, match=message):
        jaxjob.JobRunner(job, writers=writers)


def test_tensorboard_writer_names_the_extra_without_tensorboardx(tmp_path, monkeypatch):
    """Without tensorboardX installed, the error says which extra to install."""
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # what `import` finds when it is absent
    with pytest.raises(ImportError, match=r"pip install 'jaxjob\[tensorboard\]'"):
        jaxjob.TensorBoardWriter(str(tmp_path))
