"""Exactly-once samples: jobs fed by ``Job.add_data``, killed, resumed, on other process counts.

``data_job.py`` logs the sample ids (0..39) every epoch reads on every process; a killed epoch
that runs again logs again, and the last lines of each epoch are those the finished run kept.
From them the tests rebuild what the whole job read and check that every sample is read exactly
once per data epoch, in the order of an uninterrupted run: for a NumPy ``IndexCursor``, a
per-process Grain ``DataLoader`` and Grain's ``ElasticIterator``, on 1 and 2 processes (real
processes under ``jaxjob launch``, gloo on 127.0.0.1), killed with SIGKILL at random fail points,
and resumed on another process count (2 -> 1 -> 2 -> 4).
"""

import json
import os
import random
import shutil
import subprocess
import sys

import paths
import pytest

import jaxjob
from jaxjob import testing

JOB = os.path.join(paths.JOBS, "data_job.py")
NUM, BATCH, STEPS = 40, 4, 3  # as data_job.py
EPOCHS = 8  # 96 samples: two data epochs and part of a third
KILL_POINTS = ("epoch", "save.write", "save.commit")


def argv(base, source, epochs=EPOCHS):
    return [JOB, str(base / "ckpt"), str(base / "log"), str(epochs), source]


def epochs_read(log):
    """Epoch -> (process count, {process: that process's ids per batch}), as the job kept them."""
    kept: dict[int, tuple[int, dict[int, list]]] = {}
    with open(log) as f:
        for line in f:
            entry = json.loads(line)
            count, found = kept.get(entry["epoch"], (entry["count"], {}))
            if count != entry["count"]:  # run again on another process count: start over
                count, found = entry["count"], {}
            found[entry["process"]] = entry["ids"]
            kept[entry["epoch"]] = (count, found)
    assert sorted(kept) == list(range(1, len(kept) + 1)), sorted(kept)
    for epoch, (count, found) in kept.items():
        assert sorted(found) == list(range(count)), (epoch, count, sorted(found))
    return kept


def global_stream(log, source):
    """The ids of every global batch in order: a process's rows are its slice of each batch
    (IndexCursor: contiguous; ElasticIterator: every count-th sample)."""
    stream = []
    for _, (count, found) in sorted(epochs_read(log).items()):
        for step in range(STEPS):
            rows = [found[p][step] for p in range(count)]
            if source == "numpy":
                stream += [i for row in rows for i in row]
            else:
                stream += [row[k] for k in range(BATCH // count) for row in rows]
    return stream


def process_streams(log):
    """Each process's ids in order (a per-process loader: the count never changes)."""
    streams: dict[int, list[int]] = {}
    for _, (_, found) in sorted(epochs_read(log).items()):
        for process, batches in found.items():
            streams.setdefault(process, []).extend(i for batch in batches for i in batch)
    return streams


def assert_each_sample_once_per_data_epoch(chunks):
    """Every complete data epoch holds each id once; the incomplete last one, no id twice."""
    for number, chunk in enumerate(chunks):
        if len(chunk) == NUM:
            assert sorted(chunk) == list(range(NUM)), f"data epoch {number}: {sorted(chunk)}"
        else:
            assert len(set(chunk)) == len(chunk), f"data epoch {number} repeats: {chunk}"


def check_global(log, reference_log, source):
    """The job read the uninterrupted run's global stream, each sample once per data epoch."""
    stream = global_stream(log, source)
    assert stream == global_stream(reference_log, source)
    assert len(stream) == EPOCHS * STEPS * BATCH
    assert_each_sample_once_per_data_epoch(
        [stream[i : i + NUM] for i in range(0, len(stream), NUM)]
    )
    return len(stream)


def check_per_process(log, reference_log, processes):
    """Each process read its uninterrupted stream; together, each sample once per data epoch."""
    streams = process_streams(log)
    assert streams == process_streams(reference_log)
    shard = NUM // processes
    data_epochs = -(-len(streams[0]) // shard)
    assert_each_sample_once_per_data_epoch(
        [
            [i for p in range(processes) for i in streams[p][d * shard : (d + 1) * shard]]
            for d in range(data_epochs)
        ]
    )
    return sum(len(s) for s in streams.values())


def check(base, reference, source, processes):
    """The checks of ``source``; returns how many sample reads were checked."""
    if source == "grain":
        return check_per_process(base / "log", reference / "log", processes)
    return check_global(base / "log", reference / "log", source)


@pytest.fixture(scope="module")
def references(tmp_path_factory, compile_cache):
    """Uninterrupted runs, made on first use: (source, processes) -> their directory (its
    ``result`` file: process 0's RESULT)."""
    made = {}

    def reference(source, processes):
        if source != "numpy":
            pytest.importorskip("grain")
        if (source, processes) not in made:
            base = tmp_path_factory.mktemp(f"reference_{source}_{processes}")
            output = testing.run(argv(base, source), processes=processes, env=compile_cache)
            (base / "result").write_text(json.dumps(results_of(output, processes)[0]))
            made[source, processes] = base
        return made[source, processes]

    return reference


def results_of(output, processes):
    """Each process's RESULT json, by process."""
    found = [
        json.loads(line.split("RESULT ", 1)[1]) for line in output.splitlines() if "RESULT" in line
    ]
    assert sorted(r["process"] for r in found) == list(range(processes)), output[-2000:]
    return sorted(found, key=lambda r: r["process"])


def kill_at_random(rng, base, env, processes, source):
    """Kills the job (on ``processes`` processes) at a random fail point of its next two epochs;
    with one epoch left, in it: every kill is reached, whatever the kills before it did."""
    prefix = base / "ckpt"
    done = jaxjob.CheckpointManager(str(prefix)).committed_epochs()
    left = EPOCHS - (done[-1] if done else -1)
    point = f"{rng.choice(KILL_POINTS)}:{rng.randint(1, max(1, min(2, left - 1)))}"
    kill = testing.run_killed(
        argv(base, source), prefix, kill_at=point, processes=processes, env=env
    )
    assert kill.killed, kill.output[-2000:]
    return kill


@pytest.mark.parametrize(("source", "processes"), [("numpy", 1), ("grain", 2)])
def test_killed_and_resumed_job_reads_each_sample_once(
    tmp_path, references, compile_cache, source, processes
):
    """One SIGKILL mid-run, then a restart: every sample once per data epoch, in the same order."""
    reference = references(source, processes)
    kill_at_random(random.Random(source), tmp_path, compile_cache, processes, source)
    testing.run(
        argv(tmp_path, source), processes=processes, env=compile_cache, db_prefix=tmp_path / "ckpt"
    )
    assert check(tmp_path, reference, source, processes) == EPOCHS * STEPS * BATCH


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("source", ["numpy", "grain"])
def test_killed_ten_times_at_random_reads_each_sample_once(
    tmp_path, references, compile_cache, source, processes
):
    """Ten SIGKILLs at random fail points (epoch, save write, commit), then a finishing run."""
    reference = references(source, processes)
    rng = random.Random(f"{source}{processes}")
    kills = [kill_at_random(rng, tmp_path, compile_cache, processes, source) for _ in range(10)]
    testing.run(
        argv(tmp_path, source), processes=processes, env=compile_cache, db_prefix=tmp_path / "ckpt"
    )
    assert sum(k.killed for k in kills) == 10
    assert check(tmp_path, reference, source, processes) == EPOCHS * STEPS * BATCH


def run_on(base, source, processes, epochs, env):
    """Runs the job to ``epochs`` on ``processes`` processes; returns each process's RESULT."""
    output = testing.run(
        argv(base, source, epochs), processes=processes, env=env, db_prefix=base / "ckpt"
    )
    found = [
        json.loads(line.split("RESULT ", 1)[1]) for line in output.splitlines() if "RESULT" in line
    ]
    assert sorted(r["process"] for r in found) == list(range(processes)), output[-2000:]
    return found


def elastic_chain(base, reference, source, env):
    """Epochs 1-2 on 2 processes, 3-4 on 1, 5-6 on 2, 7-8 on 4: the 1-process run's stream."""
    for processes, epochs in ((2, 2), (1, 4), (2, 6), (4, 8)):
        results = run_on(base, source, processes, epochs, env)
    assert {r["last"] for r in results} == {EPOCHS}
    assert check_global(base / "log", reference / "log", source) == EPOCHS * STEPS * BATCH
    ref = json.loads((reference / "result").read_text())
    assert {r["acc"] for r in results} == {ref["acc"]}  # the model read the same global batches


def test_an_index_cursor_is_split_over_each_new_process_count(tmp_path, references, compile_cache):
    """2 -> 1 -> 2 -> 4 processes: one global cursor, split anew, reads the uninterrupted stream."""
    elastic_chain(tmp_path, references("numpy", 1), "numpy", compile_cache)


@pytest.mark.slow
def test_grain_elastic_iterator_state_follows_each_new_process_count(
    tmp_path, references, compile_cache
):
    """``Stateful(ElasticIterator, shared=True)``: 2 -> 1 -> 2 -> 4 processes, the same stream."""
    elastic_chain(tmp_path, references("elastic", 1), "elastic", compile_cache)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["numpy", "elastic"])
def test_killed_ten_times_on_changing_process_counts_reads_each_sample_once(
    tmp_path, references, compile_cache, source
):
    """Ten SIGKILLs, each run on 1 or 2 processes at random: the 1-process run's stream."""
    reference = references(source, 1)
    rng = random.Random(source)
    for _ in range(10):
        kill_at_random(rng, tmp_path, compile_cache, rng.choice([1, 2]), source)
    run_on(tmp_path, source, rng.choice([1, 2]), EPOCHS, compile_cache)
    assert check_global(tmp_path / "log", reference / "log", source) == EPOCHS * STEPS * BATCH


def test_a_per_process_loader_on_another_process_count_raises(tmp_path, references):
    """A 2-process Grain DataLoader resumed on 1 process: the error names the leaf and both counts
    (before any epoch runs: nothing is logged, nothing saved)."""
    shutil.copytree(references("grain", 2) / "ckpt", tmp_path / "ckpt")
    command = [sys.executable, *argv(tmp_path, "grain", EPOCHS + 1)]
    failed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0
    assert (
        f"cannot resume the data of epoch {EPOCHS}: the per-process loader states "
        "['jaxjob/data/batch'] (jaxjob.data.Stateful) were saved by 2 processes but this job "
        "has 1" in failed.stderr
    ), failed.stderr[-2000:]
    assert not (tmp_path / "log").exists()
    assert jaxjob.CheckpointManager(str(tmp_path / "ckpt")).committed_epochs()[-1] == EPOCHS
