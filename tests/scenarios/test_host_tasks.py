"""Host tasks in the epoch group: a data loader feeding a jitted step resumes exactly.

In-process: resuming from an epoch >= 1 with a host task whose outputs a jitted
task reads (it raised a KeyError while tracing the restore targets), and a host
task that changes a traced persistent leaf's dtype, shape or structure (it
raises as it returns, before the save; it used to save checkpoints that could
not be resumed from). In child processes (``loader_job.py``): a NumPy loader, a
Grain ``DataLoader`` and a two-device mesh, killed with SIGKILL at random
epochs and restarted, end bitwise equal to an uninterrupted run.
"""

import json
import os
import random
import re

import jax.numpy as jnp
import numpy as np
import paths
import pytest

import jaxjob
from jaxjob import testing

JOB = os.path.join(paths.JOBS, "loader_job.py")
EPOCHS = 5
DATA = np.arange(60, dtype=np.float32).reshape(30, 2) / 7


def loader_job(epochs, load=None):
    """Init: jitted ``w`` and int32 ``cursor``; epoch: host ``load``, jitted ``train``."""
    job = jaxjob.Job()
    job.init_group.add(
        lambda ws: {"w": jnp.ones(2), "cursor": jnp.zeros((), jnp.int32)}, name="init"
    )

    def slice_batch(ws):
        start = int(ws["cursor"]) % 26
        return {"batch": DATA[start : start + 4], "cursor": ws["cursor"] + 4}

    job.epoch_group.add(load or slice_batch, jit=False, name="load")
    job.epoch_group.add(lambda ws: {"w": ws["w"] * 0.9 + ws["batch"].mean(0)}, name="train")
    jaxjob.epoch_limiter(job, epochs)
    return job


def train(prefix, epochs, load=None):
    session = jaxjob.Session()
    last = jaxjob.JobRunner(loader_job(epochs, load), jaxjob.CheckpointManager(prefix)).train(
        session
    )
    return last, session.workspace


@pytest.mark.parametrize("stop_at", [1, 2])
def test_resume_from_an_epoch_with_a_host_loader(tmp_path, stop_at):
    """Resuming from epoch >= 1 with a host task feeding a jitted one ends as an uninterrupted run.

    It used to raise ``KeyError: "name 'batch' is not in the workspace"`` while
    tracing the epoch group for the restore targets' shardings.
    """
    _, reference = train(str(tmp_path / "ref"), 4)
    assert train(str(tmp_path / "x"), stop_at)[0] == stop_at
    last, resumed = train(str(tmp_path / "x"), 4)
    assert last == 4
    testing.assert_bitwise_equal(reference, resumed)
    assert resumed["cursor"].dtype == jnp.int32 and int(resumed["cursor"]) == 16


def test_explicit_resume_from_an_epoch_with_a_host_loader(tmp_path):
    """``resume_from_epoch=k >= 1`` with a host loader runs epoch k+1 from checkpoint k."""
    prefix = str(tmp_path / "ckpt")
    train(prefix, 3)
    session = jaxjob.Session()
    runner = jaxjob.JobRunner(loader_job(3), jaxjob.CheckpointManager(prefix), resume_from_epoch=2)
    assert runner.train(session) == 3
    assert int(session.workspace["cursor"]) == 12


def as_int64(ws):
    start = int(ws["cursor"]) % 26
    return {"batch": DATA[start : start + 4], "cursor": np.asarray(ws["cursor"], np.int64) + 4}


def test_a_host_task_changing_a_saved_dtype_raises_before_the_save(tmp_path):
    """Turning the jitted int32 cursor into a NumPy int64 raises in epoch 1; epoch 0 resumes."""
    prefix = str(tmp_path / "ckpt")
    pattern = (
        r"task 'load' changed the dtype of the persistent leaf \['cursor'\]: it returned a "
        r"NumPy scalar of dtype int64, shape \(\), expected dtype int32 \(it was a jax.Array "
        r"of dtype int32, shape \(\)\)"
    )
    with pytest.raises(TypeError, match=pattern):
        train(prefix, 3, load=as_int64)
    manager = jaxjob.CheckpointManager(prefix)
    assert manager.committed_epochs() == [0]
    assert train(prefix, 3)[0] == 3  # nothing committed is lost: the fixed job resumes


def test_the_check_holds_after_a_resume(tmp_path):
    """A resumed run knows which leaves are traced: the dtype change raises there too."""
    prefix = str(tmp_path / "ckpt")
    train(prefix, 1)
    with pytest.raises(TypeError, match=r"changed the dtype of the persistent leaf \['cursor'\]"):
        train(prefix, 3, load=as_int64)
    assert jaxjob.CheckpointManager(prefix).committed_epochs() == [0, 1]


def test_a_host_task_changing_a_saved_shape_or_structure_raises(tmp_path):
    """A shape change is a ValueError, a structure change a TypeError, naming the key path."""

    def wider(ws):
        return {"batch": DATA[:4], "cursor": jnp.zeros((1,), jnp.int32)}

    with pytest.raises(ValueError, match=r"changed the shape of the persistent leaf \['cursor'\]"):
        train(str(tmp_path / "a"), 2, load=wider)

    def nested(ws):
        return {"batch": DATA[:4], "cursor": {"at": ws["cursor"]}}

    with pytest.raises(TypeError, match=r"changed the structure of the persistent leaf 'cursor'"):
        train(str(tmp_path / "b"), 2, load=nested)


def test_leaves_of_host_init_tasks_may_change(tmp_path):
    """What a host init task creates is restored as saved: a host epoch task may grow it."""

    def build(epochs):
        job = jaxjob.Job()
        job.init_group.add(lambda ws: {"seen": np.zeros(0, np.int64)}, jit=False, name="seen")
        job.epoch_group.add(
            lambda ws: {"seen": np.append(ws["seen"], len(ws["seen"])).astype(np.float64)},
            jit=False,
            name="grow",
        )
        jaxjob.epoch_limiter(job, epochs)
        return job

    prefix = str(tmp_path / "ckpt")
    jaxjob.JobRunner(build(2), jaxjob.CheckpointManager(prefix)).train(jaxjob.Session())
    session = jaxjob.Session()
    assert jaxjob.JobRunner(build(3), jaxjob.CheckpointManager(prefix)).train(session) == 3
    assert session.workspace["seen"].tolist() == [0.0, 1.0, 2.0]


# ---- real jobs, real kills -----------------------------------------------------------------


def argv(base, loader, epochs=EPOCHS):
    return [JOB, str(base / "ckpt"), str(base / "out"), str(epochs), loader]


def env_of(loader, compile_cache):
    if loader != "mesh":
        return compile_cache
    return {**compile_cache, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


@pytest.fixture(scope="module", params=["numpy", "grain", "mesh"])
def reference(request, tmp_path_factory, compile_cache):
    """An uninterrupted run per loader: (loader, its directory, its output)."""
    if request.param == "grain":
        pytest.importorskip("grain")
    base = tmp_path_factory.mktemp(f"reference_{request.param}")
    output = testing.run(argv(base, request.param), env=env_of(request.param, compile_cache))
    assert f"finished at epoch {EPOCHS}" in output
    return request.param, base, output


def check_same(ref, base):
    compared = testing.assert_checkpoints_equal(ref / "ckpt", base / "ckpt")
    assert compared[-1] == EPOCHS
    testing.assert_bitwise_equal(ref / "out", base / "out")


def test_killed_in_a_random_epoch_resumes_exactly(tmp_path, reference, compile_cache):
    """SIGKILL in a random epoch >= 3 (after its loader ran), restart: checkpoints, end equal."""
    loader, ref, ref_output = reference
    epoch = random.Random(loader).randint(3, EPOCHS)
    env = env_of(loader, compile_cache)
    prefix = tmp_path / "ckpt"
    kill = testing.run_killed(argv(tmp_path, loader), prefix, kill_at=f"epoch:{epoch}", env=env)
    assert kill.killed and kill.committed[-1] >= 1, kill.output[-2000:]
    output = testing.run(argv(tmp_path, loader), env=env, db_prefix=prefix)
    check_same(ref, tmp_path)
    lowered = json.loads(re.search(r"^lowered (.*)$", output, re.M).group(1))
    # Restored with the shardings it was saved with: no init program compiled for them, the
    # epoch's training program once (the reference compiles init, and with "mesh" two trains).
    # Grain's state (a host-local leaf every program receives, unused) grows a byte when its
    # counter gains a digit: JAX traces and lowers the program again for the new input shape.
    assert [n for n in lowered if "init" in n] == [], lowered
    assert loader == "grain" or list(lowered.values()) == [1], lowered
    if loader == "mesh":  # init replicates, each epoch shards: the resumed epochs get them sharded
        resumed = EPOCHS - kill.committed[-1]
        assert f"input_sharded {[1] * resumed}" in output, output[-2000:]
        assert f"input_sharded {[0] + [1] * (EPOCHS - 1)}" in ref_output


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_killed_at_several_random_epochs_resumes_exactly(tmp_path, reference, compile_cache, seed):
    """Killed again and again at random epochs of each restart, the job still ends exactly."""
    loader, ref, _ = reference
    rng, env, prefix = random.Random(seed), env_of(loader, compile_cache), tmp_path / "ckpt"
    for _ in range(3):
        done = jaxjob.CheckpointManager(str(prefix)).committed_epochs()
        left = EPOCHS - (done[-1] if done else 0)
        if left < 2:
            break
        kill = testing.run_killed(
            argv(tmp_path, loader), prefix, kill_at=f"epoch:{rng.randint(1, left)}", env=env
        )
        assert kill.killed
    testing.run(argv(tmp_path, loader), env=env, db_prefix=prefix)
    check_same(ref, tmp_path)


def test_only_groups_whose_results_are_saved_are_checked(tmp_path):
    """The exit group runs after the last save: it may cast the state (an export); Session.run
    checks a non-persistent group only when asked (``keep_traced=True``, as the runner's epochs)."""
    job = loader_job(2)
    exported = []
    job.exit_group.add(lambda ws: exported.append(1) or {"w": np.asarray(ws["w"], np.float16)})
    session = jaxjob.Session()
    assert jaxjob.JobRunner(job, jaxjob.CheckpointManager(str(tmp_path))).train(session) == 2
    assert exported == [1] and session.workspace["w"].dtype == np.float16

    init = jaxjob.TaskGroup(persistent=True)
    init.add(lambda ws: {"x": jnp.zeros(3)})
    host = jaxjob.TaskGroup(jit=False)
    host.add(lambda ws: {"x": np.zeros(3, np.float64)}, name="cast")
    session = jaxjob.Session()
    session.run(init)
    assert session.traced_names == {"x"}
    with pytest.raises(TypeError, match=r"task 'cast' changed the dtype .*\['x'\].*float64"):
        session.run(host, keep_traced=True)
    assert session.run(host)["x"].dtype == np.float64
