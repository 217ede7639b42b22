"""Data sources: an index cursor, loaders with get_state/set_state, and jobs fed by Job.add_data."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxjob
from jaxjob._src.core import data

IDS = np.arange(10)


class Counter:
    """The smallest loader with a state: yields 1, 2, 3...; counts its set_state calls."""

    def __init__(self, state="dict"):
        self.n, self.sets, self.kind = 0, 0, state

    def __iter__(self):
        return self

    def __next__(self):
        self.n += 1
        return np.array([self.n])

    def get_state(self):
        return {"n": self.n} if self.kind == "dict" else str(self.n).encode()

    def set_state(self, state):
        self.sets += 1
        self.n = state["n"] if self.kind == "dict" else int(state.decode())


def test_an_index_cursor_reads_each_sample_once_per_data_epoch():
    """Global batches follow a seeded permutation per data epoch, spanning their boundaries."""
    source = data.IndexCursor(IDS, batch_size=4, shuffle_seed=3)
    taken, cursor = source.indices(np.zeros(2, np.int32), 20)
    assert sorted(taken[:10]) == list(range(10)) and sorted(taken[10:]) == list(range(10))
    assert taken[:10].tolist() != taken[10:].tolist()  # each data epoch has its own order
    assert cursor.tolist() == [2, 0]
    again, _ = source.indices(np.array([0, 8], np.int32), 4)
    assert again.tolist() == [*taken[8:12]]


def test_an_index_cursor_splits_each_global_batch_over_the_processes():
    """Process p of P reads the p-th slice of every global batch; together: the global batches."""
    source = data.IndexCursor({"x": IDS * 10, "y": IDS}, batch_size=4, shuffle_seed=0)
    start = np.array([0, 6], np.int32)
    whole, cursor = source.next_batches(start, 2, process_index=0, process_count=1)
    for count in (2, 4):
        parts = [
            source.next_batches(start, 2, process_index=p, process_count=count)
            for p in range(count)
        ]
        assert all(c.tolist() == cursor.tolist() for _, c in parts)
        rebuilt = np.concatenate([batch["y"] for batch, _ in parts], axis=1)
        assert rebuilt.tolist() == whole["y"].tolist()
        assert parts[0][0]["x"].tolist() == (parts[0][0]["y"] * 10).tolist()
    single, _ = source.next_batches(start, None, process_index=0, process_count=1)
    assert single["y"].shape == (4,)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"data": {"a": IDS, "b": IDS[:3]}}, ValueError, r"leading lengths \[3, 10\]"),
        ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1, got 0"),
        ({"shuffle_seed": 1.5}, TypeError, "shuffle_seed must be an int or None, got 1.5"),
        ({"shuffle_seed": -1}, ValueError, "shuffle_seed must be an int >= 0 or None.*got -1"),
    ],
)
def test_an_index_cursor_refuses_bad_arguments(kwargs, error, match):
    """Unequal lengths, a batch size below 1, a float or negative seed: the argument and value."""
    with pytest.raises(error, match=match):
        data.IndexCursor(**{"data": IDS, "batch_size": 2, **kwargs})


def test_a_batch_size_must_split_over_the_processes():
    """A global batch of 3 on 2 processes cannot be split evenly."""
    source = data.IndexCursor(IDS, batch_size=3)
    with pytest.raises(ValueError, match="batch_size 3 must be a multiple of the process count 2"):
        source.next_batches(np.zeros(2, np.int32), 1, process_index=0, process_count=2)


@pytest.mark.parametrize("kind", ["dict", "bytes"])
def test_a_stateful_loader_is_set_only_when_its_state_is_not_the_one_it_left(kind):
    """Consecutive epochs iterate on; a restored state (a resume) is set once, then iterated on."""
    loader = Counter(kind)
    source = data.Stateful(loader, max_state_bytes=64)
    first, state = source.next_batches(source.initial_state(), 2)
    second, later = source.next_batches(state, 2)
    assert (first.ravel().tolist(), second.ravel().tolist(), loader.sets) == ([1, 2], [3, 4], 0)
    again, after = source.next_batches(state, 2)  # the epoch after ``state`` runs again
    assert (again.ravel().tolist(), loader.sets) == ([3, 4], 1)
    assert np.array_equal(after, later)
    fresh, _ = source.next_batches(source.initial_state(), 1)  # a new run from scratch
    assert (fresh.ravel().tolist(), loader.sets) == ([1], 2)


class FailsOnce(Counter):
    """A Counter whose read of sample ``at`` fails once (a flaky file system)."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def __next__(self):
        batch = super().__next__()
        if self.n == self.at:
            self.at = None
            raise OSError(f"sample {self.n} unreadable")
        return batch


def test_an_epoch_retried_after_a_read_failed_partway_reads_its_samples_again():
    """Epoch 2 fails at sample 4: its retry (from epoch 1's state) reads [3, 4], not [5, 6]."""
    loader = FailsOnce(at=4)
    source = data.Stateful(loader, max_state_bytes=64)
    first, state = source.next_batches(source.initial_state(), 2)
    with pytest.raises(OSError, match="sample 4 unreadable"):
        source.next_batches(state, 2)
    again, _ = source.next_batches(state, 2)
    assert (first.ravel().tolist(), again.ravel().tolist(), loader.sets) == ([1, 2], [3, 4], 1)
    fresh = data.Stateful(FailsOnce(at=2), max_state_bytes=64)  # the first epoch, from the start
    with pytest.raises(OSError, match="sample 2 unreadable"):
        fresh.next_batches(fresh.initial_state(), 2)
    assert fresh.next_batches(fresh.initial_state(), 2)[0].ravel().tolist() == [1, 2]


def test_a_stateful_loader_state_must_fit_and_serialise():
    """A state over max_state_bytes, or neither bytes nor JSON: the loader and how to fix it."""
    source = data.Stateful(Counter(), max_state_bytes=8)
    with pytest.raises(ValueError, match="the state of Counter takes 8 bytes.*max_state_bytes=8"):
        source.encode({"n": 1})
    with pytest.raises(TypeError, match="returned a set that is neither bytes nor JSON"):
        data.Stateful(Counter()).encode({1, 2})


def test_a_loader_that_runs_out_raises():
    """A finite loader: the epoch that lacks batches says how many it got."""
    source = data.Stateful(iter_with_state([np.zeros(1)]), max_state_bytes=64)
    with pytest.raises(ValueError, match="ran out after 1 of 2 batches"):
        source.next_batches(source.initial_state(), 2)


class iter_with_state:  # noqa: N801 (reads like iter())
    """A list iterator with get_state/set_state."""

    def __init__(self, items):
        self.items, self.at = items, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.at == len(self.items):
            raise StopIteration
        self.at += 1
        return self.items[self.at - 1]

    def get_state(self):
        return self.at

    def set_state(self, state):
        self.at = state


def test_add_data_refuses_what_is_not_a_source():
    """An array, a bad name or steps: the argument, what it got and what is expected."""
    job = jaxjob.Job()
    with pytest.raises(TypeError, match="source must be a jaxjob.data.IndexCursor.*got ndarray"):
        job.add_data("batch", IDS)
    with pytest.raises(ValueError, match="name must be a non-empty string, got ''"):
        job.add_data("", data.IndexCursor(IDS, batch_size=2))
    with pytest.raises(ValueError, match="steps must be None or an int >= 1, got 0"):
        job.add_data("batch", data.IndexCursor(IDS, batch_size=2), steps=0)
    with pytest.raises(TypeError, match="loader must have get_state"):
        data.Stateful(3)
    with pytest.raises(
        TypeError, match="sharding must be a jax.sharding.Sharding or None, got 'x'"
    ):
        job.add_data("batch", data.IndexCursor(IDS, batch_size=2), sharding="x")


def test_add_data_refuses_a_name_fed_twice_and_its_sources_are_read_only():
    """A second source for one name would add a second init and feed task for one key."""
    job = jaxjob.Job()
    first = data.IndexCursor(IDS, batch_size=2)
    job.add_data("batch", first)
    with pytest.raises(ValueError, match="name 'batch' is already fed by IndexCursor"):
        job.add_data("batch", data.IndexCursor(IDS, batch_size=5))
    assert [t.name for t in job.init_group.tasks] == ["data:batch"]
    assert [t.name for t in job.epoch_group.tasks] == ["data:batch"]
    assert dict(job.data_sources) == {"batch": first}
    with pytest.raises(TypeError):
        job.data_sources["other"] = first


def test_with_a_sharding_the_batches_are_global_arrays(tmp_path):
    """``sharding=``: every leaf of ``ws[name]`` is a jax.Array with it (all processes' rows)."""
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    job = jaxjob.Job()
    source = data.IndexCursor({"x": IDS.astype(np.float32)}, batch_size=2)
    job.add_data("batch", source, steps=3, sharding=sharding)
    got = []
    job.epoch_group.add(lambda ws: got.append(ws["batch"]["x"]), jit=False)
    jaxjob.epoch_limiter(job, 1)
    jaxjob.JobRunner(job).train(jaxjob.Session())
    assert isinstance(got[0], jax.Array) and got[0].sharding == sharding
    assert got[0].tolist() == [[0, 1], [2, 3], [4, 5]]


def fed_job(source, epochs, seen):
    """Init: ``w``; epoch: the source's batch, a host task recording it, a jitted step."""
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"w": jnp.zeros(())}, name="w")
    job.add_data("batch", source, steps=2)
    job.epoch_group.add(lambda ws: seen.append(np.asarray(ws["batch"]).ravel().tolist()), jit=False)
    job.epoch_group.add(lambda ws: {"w": ws["w"] * 0.5 + ws["batch"].sum()}, name="step")
    jaxjob.epoch_limiter(job, epochs)
    return job


def train(prefix, source, epochs):
    seen: list = []
    session = jaxjob.Session()
    jaxjob.JobRunner(fed_job(source, epochs, seen), jaxjob.CheckpointManager(prefix)).train(session)
    return seen, session.workspace


@pytest.mark.parametrize("kind", ["numpy", "stateful"])
def test_a_resumed_job_reads_what_an_uninterrupted_one_reads(tmp_path, kind):
    """Stopped after epoch 2 and resumed with a fresh source: epochs 3-5 read the next samples."""

    def source():
        if kind == "numpy":
            return data.IndexCursor(IDS.astype(np.float32), batch_size=3, shuffle_seed=1)
        return Counter()

    reference, ref_ws = train(str(tmp_path / "ref"), source(), 5)
    first, _ = train(str(tmp_path / "x"), source(), 2)
    rest, ws = train(str(tmp_path / "x"), source(), 5)
    assert first + rest == reference
    jaxjob.testing.assert_bitwise_equal(ref_ws, ws)
    if kind == "numpy":
        assert ws["jaxjob/data/batch"].tolist() == [3, 0]  # 5 epochs x 2 batches x 3 = 3 x 10
        stream = [i for batch in reference for i in batch]
        assert [sorted(stream[i : i + 10]) for i in (0, 10, 20)] == [list(range(10))] * 3


def test_a_grain_data_loader_is_fed_as_it_is(tmp_path):
    """A Grain DataLoader passed to add_data as it is resumes where it stopped."""
    grain = pytest.importorskip("grain.python")

    def loader():
        sampler = grain.IndexSampler(
            num_records=10, shard_options=grain.NoSharding(), shuffle=True, num_epochs=None, seed=0
        )
        return grain.DataLoader(
            data_source=IDS.astype(np.float32),
            sampler=sampler,
            operations=[grain.Batch(3)],
            worker_count=0,
        )

    reference, ref_ws = train(str(tmp_path / "ref"), loader(), 4)
    first, _ = train(str(tmp_path / "x"), loader(), 1)
    rest, ws = train(str(tmp_path / "x"), loader(), 4)
    assert first + rest == reference
    jaxjob.testing.assert_bitwise_equal(ref_ws, ws)


def test_an_epoch_task_reading_a_python_iterator_is_warned_about_once(tmp_path):
    """A generator in a task's closure: one warning naming the task and the iterator per train."""
    batches = (np.full(2, i, np.float32) for i in range(100))
    job = jaxjob.Job()
    job.init_group.add(lambda ws: {"w": jnp.zeros(())}, name="w")

    @job.epoch_group.task(jit=False)
    def load(ws):
        return {"batch": next(batches)}

    job.epoch_group.add(lambda ws: {"w": ws["w"] + ws["batch"].sum()}, name="step")
    jaxjob.epoch_limiter(job, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path))).train(jaxjob.Session())
    messages = [str(w.message) for w in caught if "Python iterator" in str(w.message)]
    assert len(messages) == 1, messages
    assert messages[0].startswith(
        "epoch task 'load' reads the Python iterator 'batches' (generator): jaxjob cannot "
        "checkpoint its position"
    )
    assert "job.add_data(name, source)" in messages[0]


def test_a_job_fed_by_add_data_or_writing_a_file_is_not_warned_about(tmp_path):
    """The sources of add_data keep their position, an open file is written: no warning."""
    with open(tmp_path / "log", "w") as log, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = jaxjob.Task(lambda ws: log.write("epoch\n") and None, jit=False, name="log")
        data.warn_unsaved_iterators([task], set())
        train(str(tmp_path / "ckpt"), Counter(), 1)
    assert not [w for w in caught if "Python iterator" in str(w.message)]


def test_the_data_process_count_error_names_every_host_local_leaf():
    """A per-process loader state resumed on another process count: the error names the data
    state and every other host-local leaf of the checkpoint (DESIGN: every leaf)."""
    from jaxjob._src.checkpoint.hostlocal import ProcessCountError
    from jaxjob._src.run.resume import data_count_error

    job = jaxjob.Job()
    job.add_data("batch", data.Stateful(Counter(), max_state_bytes=64))
    job.add_data("ids", data.IndexCursor(IDS, batch_size=2))
    leaves = ["['jaxjob/data/batch']", "['rng_np']", "['stats']['count']"]
    message = str(data_count_error(ProcessCountError(leaves, 2, 1), job, 3))
    assert "per-process loader states ['jaxjob/data/batch'] (jaxjob.data.Stateful)" in message
    assert "The other host-local leaves [\"['rng_np']\", \"['stats']['count']\"]" in message
    alone = str(data_count_error(ProcessCountError(leaves[:1], 2, 1), job, 3))
    assert "other host-local" not in alone
    assert data_count_error(ProcessCountError(leaves[1:], 2, 1), job, 3) is None


def test_a_train_retried_after_a_load_failed_partway_reads_what_an_uninterrupted_one_reads(
    tmp_path,
):
    """Epoch 1's load fails at the loader's sample 4; train() called again in the same process
    resumes from epoch 0's checkpoint and reads [3, 4] and [5, 6], not the samples after 4."""
    source = data.Stateful(FailsOnce(at=4), max_state_bytes=64)
    with pytest.raises(OSError, match="sample 4 unreadable"):
        train(str(tmp_path), source, 3)
    seen, _ = train(str(tmp_path), source, 3)
    assert seen == [[3, 4], [5, 6]]
