"""A job whose state is a NamedTuple of two same-shape leaves sharded differently, on 4 devices.

python layout_job.py DB_PREFIX EPOCHS LAYOUT

LAYOUT ``a``: a ``(4,)`` mesh ``('d',)``, ``wq`` on ``P('d', None)`` and ``wk`` on
``P(None, 'd')``; ``b``: a ``(2, 2)`` mesh ``('d', 'e')``, ``wq`` on ``P('d', 'e')`` and
``wk`` on ``P('e', 'd')``; beside them, 4 typed PRNG keys sharded over ``'d'`` (stored as
key data, one dimension more). The fields are not in alphabetical order, so a resume that
matched saved shardings to leaves by position in a sorted tree would swap them. Prints one
``RESULT {json}`` line: the last epoch, each leaf's sharding, a digest of the values, and
how many times JAX lowered the init and train programs.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import hashlib
import json
import sys
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxjob

job_start.imported()

LOWERED = job_start.count_lowerings()


class Attn(NamedTuple):
    wq: jax.Array
    wk: jax.Array


def main(db_prefix: str, epochs: int, layout: str) -> None:
    if layout == "a":
        mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
        specs = Attn(P("d", None), P(None, "d"))
    else:
        mesh = jax.make_mesh((2, 2), ("d", "e"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
        specs = Attn(P("d", "e"), P("e", "d"))
    put = Attn(*(NamedSharding(mesh, s) for s in specs))
    keys_on = NamedSharding(mesh, P("d"))

    def init(ws):
        key = jax.random.key(0)
        attn = Attn(jax.random.normal(key, (8, 8)), jax.random.normal(key, (8, 8)) * 2)
        keys = jax.lax.with_sharding_constraint(jax.random.split(key, 4), keys_on)
        return {"attn": jax.tree.map(jax.lax.with_sharding_constraint, attn, put), "keys": keys}

    def train(ws):
        noise = jax.vmap(lambda k: jax.random.normal(k, (2, 8)))(ws["keys"]).reshape(8, 8)
        attn = Attn(ws["attn"].wq @ ws["attn"].wk / 8 + noise, ws["attn"].wk + 0.5 * ws["attn"].wq)
        keys = jax.vmap(lambda k: jax.random.split(k)[0])(ws["keys"])
        return {
            "attn": jax.tree.map(jax.lax.with_sharding_constraint, attn, put),
            "keys": jax.lax.with_sharding_constraint(keys, keys_on),
        }

    job = jaxjob.Job()
    job.init_group.add(init)
    job.epoch_group.add(train)
    jaxjob.epoch_limiter(job, epochs)
    session = jaxjob.Session()
    last = jaxjob.JobRunner(job, jaxjob.CheckpointManager(db_prefix)).train(session)
    attn, keys = session.workspace["attn"], session.workspace["keys"]
    data = b"".join(np.asarray(x).tobytes() for x in [*attn, jax.random.key_data(keys)])
    result = {
        "last": last,
        "shardings": {f: str(getattr(attn, f).sharding.spec) for f in Attn._fields}
        | {"keys": str(keys.sharding.spec)},
        "mesh": list(attn.wq.sharding.mesh.shape.values()),
        "digest": hashlib.sha256(data).hexdigest(),
        "lowered": LOWERED(),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
