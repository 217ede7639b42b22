"""The caffe2 style across processes: process i runs its own Node ``trainer_i``.

Usage (every process, under ``jaxjob launch``): ``python mp_private_nodes.py DB_PREFIX EPOCHS``.
Each process saves only ``trainer_i.<epoch>``; after training, process 0 gathers
every node's ``w_i`` with ``load_blobs_locally``. Prints ``RESULT {json}``.
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

job_start.imported()

PREFIX, EPOCHS = sys.argv[1], int(sys.argv[2])
ME = jax.process_index()
NODES = [f"trainer_{i}" for i in range(jax.process_count())]

job = jaxjob.Job(nodes_to_checkpoint=NODES)
with jaxjob.Node(NODES[ME]):
    job.init_group.add(lambda ws: {f"w_{ME}": jnp.full((3,), float(ME)), "key": jax.random.key(ME)})
    job.init_group.add(lambda ws: {"cursor": np.array([ME, 0])}, jit=False)
    jaxjob.epoch_limiter(job, EPOCHS)
job.epoch_group.add(lambda ws: {f"w_{ME}": ws[f"w_{ME}"] * 2 + 1})
job.epoch_group.add(lambda ws: {"cursor": ws["cursor"] + np.array([0, 1])}, jit=False)
ckpt = jaxjob.MultiNodeCheckpointManager(PREFIX, node_processes={n: i for i, n in enumerate(NODES)})
session = jaxjob.Session()
last = jaxjob.JobRunner(job, ckpt).train(session)
ckpt.close()
ws = session.workspace
result = {
    "process": ME,
    "last": last,
    "names": sorted(ws),
    "w": ws[f"w_{ME}"].tolist(),
    "cursor": ws["cursor"].tolist(),
    "key": jax.random.key_data(ws["key"]).tolist(),
}
if ME == 0:  # one process reads every process's node checkpoints, waiting on nobody
    probe = jaxjob.Session()
    names = [f"w_{i}" for i in range(len(NODES))]
    result["gathered"] = ckpt.load_blobs_locally(NODES, names, last, probe)
    result["gathered_w"] = {k: v.tolist() for k, v in sorted(probe.workspace.items())}
    result["missing_epoch"] = ckpt.load_blobs_locally(NODES, names, last + 5, probe)
    restored = jaxjob.restore(PREFIX, node_name=NODES[-1], leaves=[f"w_{len(NODES) - 1}"])
    result["restored_w"] = restored[f"w_{len(NODES) - 1}"].tolist()
print("RESULT", json.dumps(result), flush=True)
