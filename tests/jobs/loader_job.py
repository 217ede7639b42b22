"""A job whose epoch group loads its batches in a host task and trains on them in a jitted one.

python loader_job.py DB_PREFIX OUT EPOCHS LOADER

LOADER is ``numpy`` (a host task slices a NumPy dataset by a saved jax int32
cursor), ``grain`` (a Grain ``DataLoader`` whose iterator state is saved as a
host-local uint8 array) or ``mesh`` (the numpy loader on a two-device mesh with
Explicit axes, where init replicates the parameters and every epoch shards them:
the run prints, per epoch, whether its program received them sharded). Kill it
with ``jaxjob.testing`` (``kill_at="epoch:n"``: after the n-th epoch group of the
run, the batches loaded and trained on, before the save). The final workspace is
written with ``jaxjob.testing.dump_workspace``. It prints how many times JAX lowered
(compiled, or looked up in the compilation cache) each of its init and train programs.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import jaxjob

job_start.imported()

LOWERED = job_start.count_lowerings()

BATCH, STEPS = 8, 3
DATA = np.random.default_rng(0).normal(size=(48, 4)).astype(np.float32)
tx = optax.adam(1e-2)


def init(ws):
    params = {"w": jax.random.normal(jax.random.key(0), (4,)), "b": jnp.zeros(())}
    return {"params": params, "opt_state": tx.init(params)}


def train(ws):
    def step(carry, x):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] + p["b"] - 1.0) ** 2))(
            params
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, opt_state), losses = jax.lax.scan(step, (ws["params"], ws["opt_state"]), ws["batch"])
    return {"params": params, "opt_state": opt_state, "loss": losses.mean()}


def numpy_loader(job):
    job.init_group.add(lambda ws: {"cursor": jnp.zeros((), jnp.int32)}, name="cursor")

    @job.epoch_group.task(jit=False)
    def load(ws):
        start = int(ws["cursor"])
        rows = [(start + i) % len(DATA) for i in range(BATCH * STEPS)]
        return {"batch": DATA[rows].reshape(STEPS, BATCH, -1), "cursor": ws["cursor"] + len(rows)}


def grain_loader(job):
    import grain.python as grain

    sampler = grain.IndexSampler(
        num_records=len(DATA),
        shard_options=grain.NoSharding(),
        shuffle=True,
        num_epochs=None,
        seed=0,
    )
    loader = grain.DataLoader(
        data_source=DATA, sampler=sampler, operations=[grain.Batch(BATCH)], worker_count=0
    )

    @job.init_group.task(jit=False)
    def loader_state(ws):
        return {"loader_state": np.frombuffer(iter(loader).get_state(), np.uint8).copy()}

    @job.epoch_group.task(jit=False)
    def load(ws):
        batches = iter(loader)
        batches.set_state(ws["loader_state"].tobytes())
        batch = np.stack([next(batches) for _ in range(STEPS)])
        return {"batch": batch, "loader_state": np.frombuffer(batches.get_state(), np.uint8).copy()}


def build(loader: str) -> tuple[jaxjob.Job, list[int]]:
    job = jaxjob.Job()
    job.init_group.add(init)
    sharded: list[int] = []
    if loader == "grain":
        grain_loader(job)
    else:
        numpy_loader(job)
    if loader == "mesh":
        job.init_group.add(lambda ws: {"params": jax.sharding.reshard(ws["params"], P())})

        @job.epoch_group.task
        def train_sharded(ws):
            got = jax.typeof(ws["params"]["w"]).sharding.spec == P("x")
            replicated = jax.tree.map(lambda x: jax.sharding.reshard(x, P()), ws["params"])
            out = train(ws.set({"params": replicated}))
            params = jax.tree.map(
                lambda x: jax.sharding.reshard(x, P("x") if x.ndim else P()), out["params"]
            )
            return {**out, "params": params, "input_sharded": jnp.asarray(got)}

        job.epoch_group.add(lambda ws: sharded.append(int(ws["input_sharded"])), jit=False)
    else:
        job.epoch_group.add(train)
    return job, sharded


def main() -> None:
    db_prefix, out, epochs, loader = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    job, sharded = build(loader)
    jaxjob.epoch_limiter(job, epochs)
    mesh = jax.make_mesh((2,), ("x",)) if loader == "mesh" else None
    session = jaxjob.Session()
    last = jaxjob.JobRunner(job, jaxjob.CheckpointManager(db_prefix), mesh=mesh).train(session)
    print(f"finished at epoch {last}", flush=True)
    print("lowered", json.dumps(LOWERED()))
    if loader == "mesh":
        print("input_sharded", sharded, flush=True)
    jaxjob.testing.dump_workspace(session.workspace, out)


if __name__ == "__main__":
    main()
