"""A small job for the fault-injection tests, on one process or under ``jaxjob launch -n N``.

Usage: ``python fault_job.py DB_PREFIX OUT_DIR [EPOCHS]``. Trains EPOCHS (6) epochs of a
sharded linear model with Adam, a typed PRNG key, a bfloat16 leaf and host-local state (a
NumPy cursor and a Python int), sleeping 0.1 s per epoch so that kills after a random delay
land anywhere (keeping the last 4 epochs where jaxjob has retention); then writes the final
workspace with ``jaxjob.testing.dump_workspace``.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import sys
import time

import jaxjob
import jaxjob.testing

jaxjob.distributed.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

job_start.imported()

TX = optax.adam(0.05)
MESH = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
ROWS = NamedSharding(MESH, P("d"))


def init(ws):
    w = jax.lax.with_sharding_constraint(jax.random.normal(jax.random.key(0), (8, 4)), ROWS)
    return {"w": w, "opt": TX.init(w), "rng": jax.random.key(1), "ema": jnp.zeros(4, jnp.bfloat16)}


def host_state(ws):
    return {"cursor": np.array([100 * jax.process_index(), 0]), "seen": 0}


def train(ws):
    rng, key = jax.random.split(ws["rng"])
    x = jax.random.normal(key, (16, 8))
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - 1.0) ** 2))(ws["w"])
    updates, opt = TX.update(grad, ws["opt"], ws["w"])
    w = optax.apply_updates(ws["w"], updates)
    ema = (0.9 * ws["ema"] + 0.1 * w.mean(0)).astype(jnp.bfloat16)
    return {"w": w, "opt": opt, "rng": rng, "ema": ema, "loss": loss}


def advance(ws):
    time.sleep(0.1)
    return {"cursor": ws["cursor"] + 1, "seen": ws["seen"] + 1}


def main(db_prefix: str, out: str, epochs: int = 6) -> None:
    job = jaxjob.Job()
    job.init_group.add(init)
    job.init_group.add(host_state, jit=False)
    job.epoch_group.add(train)
    job.epoch_group.add(advance, jit=False)
    jaxjob.epoch_limiter(job, epochs)
    session = jaxjob.Session()
    keep = (
        {"keep": [jaxjob.keep.Last(4)]} if hasattr(jaxjob, "keep") else {}
    )  # retention, once merged
    last = jaxjob.JobRunner(job, jaxjob.CheckpointManager(db_prefix, **keep)).train(session)
    print(f"finished at epoch {last}", flush=True)
    jaxjob.testing.dump_workspace(session.workspace, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
