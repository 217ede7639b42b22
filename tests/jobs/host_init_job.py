"""A host init task placing arrays (a 0-d one among them) on a mesh; resumed from epoch 0.

Runs the job uninterrupted, then again in a fresh db_prefix where epoch 1 dies (checkpoint 0
committed) and a new session resumes from epoch 0. The workspace that epoch 1 starts from and
the final one must be bitwise equal to the uninterrupted run's (types, dtypes, shardings,
bytes); prints ``same`` or raises.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxjob

job_start.imported()

MESH = jax.make_mesh((jax.device_count(),), ("d",))


def init(ws):
    """A host task: what it returns is restored as saved on resume, shardings included."""
    return {
        "scale": jax.device_put(jnp.float32(0.5), NamedSharding(MESH, P())),
        "w": jax.device_put(jnp.arange(8.0), NamedSharding(MESH, P("d"))),
        "step": jnp.int32(0),
        "host": np.float32(1.5),
        "tree": {"n": [1, (2.0, None)], "key": jax.random.key(1), "z": jnp.zeros(3)},
    }


def build(start, dies):
    job = jaxjob.Job()
    job.init_group.add(init, jit=False, name="init")

    def look(ws):  # the workspace epoch 1 starts from (its arrays are donated next)
        if not os.path.exists(start):
            jaxjob.testing.dump_workspace(ws.select(["scale", "w", "step", "host", "tree"]), start)
        if dies:
            dies.pop()
            raise RuntimeError("epoch 1 dies")

    job.epoch_group.add(look, jit=False, name="look")
    job.epoch_group.add(lambda ws: {"w": ws["w"] * ws["scale"], "step": ws["step"] + 1})
    jaxjob.epoch_limiter(job, 2)
    return job


def train(prefix, start, dies):
    session = jaxjob.Session()
    jaxjob.JobRunner(build(start, dies), jaxjob.CheckpointManager(prefix)).train(session)
    return session.workspace


def main(root):
    whole = train(f"{root}/whole", f"{root}/whole-start", [])
    try:
        train(f"{root}/killed", f"{root}/killed-start", ["dies"])
        raise AssertionError("epoch 1 did not die")
    except RuntimeError as err:
        assert str(err) == "epoch 1 dies", err
    resumed = train(f"{root}/killed", f"{root}/resumed-start", [])
    jaxjob.testing.assert_bitwise_equal(f"{root}/whole-start", f"{root}/resumed-start")
    jaxjob.testing.assert_bitwise_equal(whole, resumed)
    print("same")


if __name__ == "__main__":
    main(sys.argv[1])
