"""Restarts compile only what they run: no init program for its shapes, the epoch program once.

JAX lowers a program (to StableHLO) each time it compiles it or looks it up in
the persistent compilation cache, so the lowerings counted here are the
programs a restart compiles, whatever the cache holds.
"""

import collections
import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import paths
from jax.sharding import PartitionSpec as P

import jaxjob
from jaxjob._src.checkpoint import manifest, storage

LOWERED: collections.Counter = collections.Counter()  # program name -> lowerings, while counting
TRACED: collections.Counter = collections.Counter()  # function name -> traces, while counting
_COUNTING = [False]


def _count(event, duration, fun_name=None, **kwargs):
    if _COUNTING[0] and event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
        LOWERED[fun_name] += 1
    if _COUNTING[0] and event == "/jax/core/compile/jaxpr_trace_duration":
        TRACED[fun_name] += 1


jax.monitoring.register_event_duration_secs_listener(_count)

TX = optax.adam(0.1)
DATA = np.sin(np.arange(64 * 8, dtype=np.float32)).reshape(64, 8)


def build(epochs):
    """Init: params, Adam state, a host cursor; epoch: a host loader, a jitted step."""
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws):
        w = jax.random.normal(jax.random.key(0), (8, 2))
        return {"w": w, "opt": TX.init(w)}

    job.init_group.add(lambda ws: {"cursor": np.int64(0)}, jit=False, name="cursor")

    @job.epoch_group.task(jit=False)
    def load(ws):
        rows = (int(ws["cursor"]) + np.arange(16)) % len(DATA)
        return {"batch": DATA[rows], "cursor": ws["cursor"] + 16}

    @job.epoch_group.task
    def train(ws):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((ws["batch"] @ w - 1.0) ** 2))(ws["w"])
        updates, opt = TX.update(grad, ws["opt"], ws["w"])
        return {"w": optax.apply_updates(ws["w"], updates), "opt": opt, "loss": loss}

    jaxjob.epoch_limiter(job, epochs)
    return job


def train(prefix, epochs, *, count=False):
    """Trains a freshly built job to ``epochs``; (session, {program: lowerings} if counted)."""
    session = jaxjob.Session()
    runner = jaxjob.JobRunner(build(epochs), jaxjob.CheckpointManager(str(prefix)))
    LOWERED.clear()
    TRACED.clear()
    _COUNTING[0] = count
    try:
        assert runner.train(session) == epochs
    finally:
        _COUNTING[0] = False
    programs = {k: n for k, n in LOWERED.items() if "init" in k or "train" in k}
    return session, programs


def test_a_resume_compiles_no_init_program_and_the_epoch_program_once(tmp_path):
    """Resumed from epoch 2, three more epochs trace and lower one program, the epoch's; they
    end bitwise equal to an uninterrupted run, which lowers init's too."""
    reference, from_scratch = train(tmp_path / "ref", 5, count=True)
    assert from_scratch == {"jit(init)": 1, "jit(init_counter)": 1, "jit(train__count_epoch)": 1}
    train(tmp_path / "run", 2)
    resumed, programs = train(tmp_path / "run", 5, count=True)
    assert programs == {"jit(train__count_epoch)": 1}
    # init is evaluated abstractly (one trace, for the names it sets); the epoch's program is
    # traced once: finding the names it sets is the trace its first call reuses
    assert {k: TRACED[k] for k in ("init", "train__count_epoch")} == {
        "init": 1,
        "train__count_epoch": 1,
    }
    jaxjob.testing.dump_workspace(reference.workspace, str(tmp_path / "a"))
    jaxjob.testing.assert_bitwise_equal(tmp_path / "a", resumed.workspace)


def test_rerunning_a_finished_job_compiles_nothing_and_restores_its_workspace(tmp_path):
    """A finished job run again reads its last checkpoint and stops: nothing lowered."""
    done, _ = train(tmp_path, 3)
    again, programs = train(tmp_path, 3, count=True)
    assert programs == {}
    jaxjob.testing.dump_workspace(done.workspace, str(tmp_path / "a"))
    jaxjob.testing.assert_bitwise_equal(tmp_path / "a", again.workspace)


def test_programs_are_named_after_their_tasks():
    """JAX's logs and profiles name a fused program by its tasks (``jit(train__count_epoch)``)."""
    session = jaxjob.Session()
    names = [getattr(s, "name", None) for s in session.steps(build(1).epoch_group)]
    assert names == [None, "train__count_epoch"]  # the host loader, then the fused program


def test_saved_shardings_are_used_only_on_the_devices_that_saved(tmp_path):
    """Another device or process count, or arrays in another memory, make the resume trace its
    own shardings: the saved ones are not offered."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"w": jnp.ones((4, 2)), "n": np.int64(3)})
    ckpt.close()
    path = str(tmp_path / "local.0")
    found = manifest.read(path)
    assert found.devices == {"platform": "cpu", "count": 1, "memory_kinds": ["device"]}
    targets = storage.saved_targets(path, found)
    assert list(targets) == [("w",)]  # the arrays, by key path (not the NumPy scalar)
    assert targets[("w",)].sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0])
    others = [
        dataclasses.replace(found, devices={**found.devices, "count": 8}),
        dataclasses.replace(found, devices={**found.devices, "platform": "gpu"}),
        dataclasses.replace(found, devices={**found.devices, "memory_kinds": ["pinned_host"]}),
        dataclasses.replace(found, process_count=2),
    ]
    assert [storage.saved_targets(path, other) for other in others] == [None] * 4


def _layout_job(prefix, epochs, layout):
    """Runs ``tests/jobs/layout_job.py`` on 4 devices; its RESULT record."""
    output = jaxjob.testing.run(
        [os.path.join(paths.JOBS, "layout_job.py"), str(prefix), str(epochs), layout],
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
    )
    return json.loads(re.search(r"^RESULT (.*)$", output, re.M).group(1))


def test_saved_shardings_go_to_their_own_leaves_and_a_changed_mesh_is_traced(tmp_path):
    """Two same-shape NamedTuple fields (not in alphabetical order) sharded differently, and
    sharded typed PRNG keys, come back each on its own sharding, compiling no init program,
    and end bitwise equal to an uninterrupted run; a resume with another mesh on the same
    devices traces its shardings."""
    reference = _layout_job(tmp_path / "ref", 3, "a")
    _layout_job(tmp_path / "run", 1, "a")
    resumed = _layout_job(tmp_path / "run", 3, "a")
    assert resumed["shardings"] == {  # as this JAX writes a spec (PartitionSpec(...) before 0.10)
        "wq": str(P("d")),
        "wk": str(P(None, "d")),
        "keys": str(P("d")),
    }
    assert resumed["lowered"] == {"jit(train__count_epoch)": 1}
    assert resumed["digest"] == reference["digest"]
    changed = _layout_job(tmp_path / "run", 4, "b")
    assert changed["mesh"] == [2, 2]
    assert changed["shardings"] == {
        "wq": str(P("d", "e")),
        "wk": str(P("e", "d")),
        "keys": str(P("d")),
    }
    assert changed["lowered"]["jit(init__init_counter)"] == 1  # traced for its shardings


TWO_DEVICES = """
import sys
import jax, jax.numpy as jnp, numpy as np, jaxjob
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
rows = NamedSharding(mesh, P("d"))
job = jaxjob.Job()
job.init_group.add(lambda ws: {"x": jax.lax.with_sharding_constraint(jnp.arange(4.0), rows)})
job.init_group.add(lambda ws: {"seen": np.zeros(2)}, jit=False, name="host")  # splits init
job.init_group.add(lambda ws: {"c": jnp.ones(())}, name="c")  # alone: one device, uncommitted
job.epoch_group.add(lambda ws: {"x": ws["x"] + ws["c"], "c": ws["c"] * 2}, name="step")
jaxjob.epoch_limiter(job, 2)
ckpt = sys.argv[1]
done = jaxjob.Session()
jaxjob.JobRunner(job, jaxjob.CheckpointManager(ckpt)).train(done)
again = jaxjob.Session()
jaxjob.JobRunner(job, jaxjob.CheckpointManager(ckpt), resume_from_epoch=0).train(again)
print("SAME", (done.workspace["x"] == again.workspace["x"]).all().item())
"""


def test_a_resume_from_epoch_0_on_two_devices_combines_init_outputs_as_a_fresh_run(tmp_path):
    """Init's one-device output (uncommitted) meets a mesh array in the epoch's program: resumed
    from epoch 0 it moves as in a fresh run (restored committed, it raised "incompatible
    devices")."""
    script = tmp_path / "job.py"
    script.write_text(TWO_DEVICES)
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    output = jaxjob.testing.run([str(script), str(tmp_path / "ckpt")], env=env)
    assert "SAME True" in output
