"""A job fed by ``Job.add_data`` that logs the sample ids each epoch consumes, on any process count.

Usage: ``python data_job.py DB_PREFIX LOG EPOCHS SOURCE`` (under ``jaxjob launch -n N`` for
several processes). The data set is the ids ``0..39`` themselves; a global batch is 4 samples and
an epoch reads 3 batches (a data epoch of 40 samples ends inside an epoch). SOURCE is ``numpy``
(``jaxjob.data.IndexCursor``, shuffled), ``grain`` (a per-process Grain ``DataLoader`` over its
``ShardByJaxProcess`` shard, shuffled, repeated) or ``elastic`` (Grain's ``ElasticIterator``,
``Stateful(shared=True)``). Each epoch its batches are one global array (``add_data(sharding=)``:
every process's rows, one device per process) that a jitted task folds into ``acc``; a host task
appends ``{"epoch": e, "ids": [[...] per batch], "process": p, "count": P}`` (this process's
rows) to ``LOG``. A killed epoch that runs again logs again: the last lines of an epoch are the
ones the finished run kept. Prints ``RESULT {json}``.
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

NUM, BATCH, STEPS = 40, 4, 3
DATA = np.arange(NUM, dtype=np.int32)
PREFIX, LOG, EPOCHS, SOURCE = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ME, COUNT = jax.process_index(), jax.process_count()
MESH = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))


def source():
    if SOURCE == "numpy":
        return jaxjob.data.IndexCursor(DATA, batch_size=BATCH, shuffle_seed=0)
    import grain.python as grain

    if SOURCE == "grain":
        sampler = grain.IndexSampler(
            num_records=NUM,
            shard_options=grain.ShardByJaxProcess(drop_remainder=True),
            shuffle=True,
            num_epochs=None,
            seed=0,
        )
        return grain.DataLoader(
            data_source=DATA,
            sampler=sampler,
            operations=[grain.Batch(BATCH // COUNT)],
            worker_count=0,
        )
    from grain.experimental import ElasticIterator

    dataset = grain.MapDataset.source(DATA).shuffle(seed=0).repeat(None)
    shards = grain.ShardOptions(shard_index=ME, shard_count=COUNT)
    return jaxjob.data.Stateful(ElasticIterator(dataset, BATCH, shards), shared=True)


def log(ws):
    epoch = int(np.asarray(ws["jaxjob/epochs_done"].addressable_data(0))) + 1
    ids = np.asarray(ws["batch"].addressable_data(0)).tolist()  # one device: this process's rows
    line = json.dumps({"epoch": epoch, "process": ME, "count": COUNT, "ids": ids}) + "\n"
    with open(LOG, "a") as f:  # one short O_APPEND write per line: processes do not interleave
        f.write(line)


def fold(ws):
    weights = jnp.arange(1, STEPS + 1, dtype=jnp.float32)[:, None]  # in-batch order: free
    return {"acc": ws["acc"] * 0.5 + jnp.sum(ws["batch"] * weights)}


job = jaxjob.Job()
REPLICATED = NamedSharding(MESH, P())  # an unsharded init output would be one device's array
job.init_group.add(
    lambda ws: {"acc": jax.lax.with_sharding_constraint(jnp.zeros(()), REPLICATED)}, name="acc"
)
job.add_data("batch", source(), steps=STEPS, sharding=NamedSharding(MESH, P(None, "d")))
job.epoch_group.add(log, jit=False)
job.epoch_group.add(fold)
jaxjob.epoch_limiter(job, EPOCHS)
session = jaxjob.Session()
last = jaxjob.JobRunner(job, jaxjob.CheckpointManager(PREFIX)).train(session)
acc = float(np.asarray(session.workspace["acc"].addressable_data(0)))
print("RESULT", json.dumps({"process": ME, "last": last, "acc": acc}), flush=True)
