"""A job on a mesh with Explicit axes (jax.make_mesh's default): tasks reshard, JobRunner(mesh=)."""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import sys

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import jaxjob

job_start.imported()

MESH = jax.make_mesh((jax.device_count(),), ("batch",))  # Explicit axes


def build(epochs, specs):
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws):
        return {"params": jax.sharding.reshard(jnp.zeros(2), P())}

    @job.epoch_group.task
    def train_epoch(ws):
        batch = jax.sharding.reshard(jnp.ones((8, 2)), P("batch"))
        return {"params": ws["params"] + batch.sum(0) / 4, "batch": batch}

    job.epoch_group.add(lambda ws: specs.append(ws["batch"].sharding.spec), jit=False)
    jaxjob.epoch_limiter(job, epochs)
    return job


def run(label, epochs, ckpt, **options):
    session, specs = jaxjob.Session(), []
    last = jaxjob.JobRunner(build(epochs, specs), ckpt, **options).train(session)
    params = session.workspace["params"]
    print(label, last, "x", float(params.sum()), "params", params.sharding.spec, "batch", specs[-1])


try:
    run("unused", 1, None)
except ValueError as err:
    print("without mesh: ValueError", "set_mesh" if "set_mesh" in str(err) else str(err))
run("trained", 2, jaxjob.CheckpointManager(sys.argv[1]), mesh=MESH)
run("resumed", 3, jaxjob.CheckpointManager(sys.argv[1]), mesh=MESH)
