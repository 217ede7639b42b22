"""Two logical nodes in an SPMD job: every process runs both, MultiNodeCheckpointManager saves
``trainer_0.<epoch>`` and ``trainer_1.<epoch>`` (each process its own shards of each).

Usage (every process, under ``jaxjob launch``): ``python mp_nodes.py DB_PREFIX EPOCHS``.
Prints ``RESULT {json}`` per process, with the leaves ``load_blobs_locally`` gathered.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import json
import sys

import jaxjob

jaxjob.distributed.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

job_start.imported()

PREFIX, EPOCHS = sys.argv[1], int(sys.argv[2])
ME = jax.process_index()
MESH = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
ROWS = NamedSharding(MESH, P("d"))

job = jaxjob.Job()
for i in (0, 1):
    with jaxjob.Node(f"trainer_{i}"):
        job.init_group.add(
            lambda ws, i=i: {f"w_{i}": jax.lax.with_sharding_constraint(jnp.full(8, i + 0.0), ROWS)}
        )
with jaxjob.Node("trainer_1"):
    job.init_group.add(lambda ws: {"cursor": np.array([ME, 0])}, jit=False)
job.epoch_group.add(lambda ws: {"w_0": ws["w_0"] + 1, "w_1": ws["w_1"] * 2})
job.epoch_group.add(lambda ws: {"cursor": ws["cursor"] + np.array([0, 1])}, jit=False)
jaxjob.epoch_limiter(job, EPOCHS)
ckpt = jaxjob.MultiNodeCheckpointManager(PREFIX)
session = jaxjob.Session()
runner = jaxjob.JobRunner(job, ckpt)
last = runner.train(session)
probe = jaxjob.Session()
gathered = runner.load_blobs_from_checkpoints(["w_0", "w_1", "cursor"], last, probe)
missing = runner.load_blobs_from_checkpoints(["w_0"], last + 5, jaxjob.Session())
result = {
    "process": ME,
    "last": last,
    "nodes": [n for n, _ in ckpt.node_managers],
    "gathered": gathered,
    "missing_epoch": missing,
    "w_0": [float(s.data[0]) for s in probe.workspace["w_0"].addressable_shards],
    "w_1": [float(s.data[0]) for s in probe.workspace["w_1"].addressable_shards],
    "cursor": probe.workspace["cursor"].tolist(),
}
print("RESULT", json.dumps(result), flush=True)
