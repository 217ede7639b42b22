"""Counts the cross-process exchanges (``jaxjob.hosts.exchange`` calls) of each epoch of a job.

Usage (every process, under ``jaxjob launch``): ``python mp_exchanges.py DB_PREFIX EPOCHS``.
For each manager (none; ``CheckpointManager``; ``MultiNodeCheckpointManager`` with nodes that
every process saves together, or with each process's own node) and each save interval (every
epoch, or only epoch 0 and the last), it trains a fresh job and records, at the start of each
epoch, how many exchanges this process has made. It prints ``RESULT {json}``: per variant, the
names of the exchanges made between the starts of consecutive epochs (an epoch's end: the
boundary check and, when due, the save).
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import contextlib
import json
import sys

import jaxjob
import jaxjob._src.multihost.hosts

jaxjob.distributed.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

job_start.imported()

PREFIX, EPOCHS = sys.argv[1], int(sys.argv[2])
CALLS: list[str] = []
_exchange = jaxjob._src.multihost.hosts.exchange


def counting_exchange(what, payload, *, timeout_s):
    """jaxjob's own exchange, counted (nothing of JAX's or Orbax's is replaced)."""
    CALLS.append(what)
    return _exchange(what, payload, timeout_s=timeout_s)


jaxjob._src.multihost.hosts.exchange = counting_exchange  # where jaxjob calls it from


ME = jax.process_index()
OWN_NODES = [f"trainer_{p}" for p in range(jax.process_count())]


def build_job(kind):
    """Leaves ``w_a`` and ``w_b``: in the default node, in nodes ``a`` and ``b`` ("multi"),
    or, "private", the caffe2 style: process i runs node ``trainer_i`` alone."""
    if kind == "private":
        job = jaxjob.Job(nodes_to_checkpoint=OWN_NODES)
        with jaxjob.Node(OWN_NODES[ME]):
            job.init_group.add(lambda ws: {"w_a": jnp.zeros(4), "w_b": jnp.ones(4)})
            jaxjob.epoch_limiter(job, EPOCHS)
    else:
        job = jaxjob.Job()
        for node in ("a", "b"):
            with jaxjob.Node(node) if kind == "multi" else contextlib.nullcontext():
                job.init_group.add(lambda ws, node=node: {f"w_{node}": jnp.zeros(4)})
        jaxjob.epoch_limiter(job, EPOCHS)
    job.epoch_group.add(lambda ws: {"w_a": ws["w_a"] + 1, "w_b": ws["w_b"] * 2})
    return job


def manager(kind, prefix):
    if kind == "single":
        return jaxjob.CheckpointManager(prefix, timeout_s=60)
    if kind == "multi":
        return jaxjob.MultiNodeCheckpointManager(prefix, timeout_s=60)
    if kind == "private":
        owners = {node: p for p, node in enumerate(OWN_NODES)}
        return jaxjob.MultiNodeCheckpointManager(prefix, timeout_s=60, node_processes=owners)
    return None


def per_epoch(kind, every):
    """The exchanges between the starts of consecutive epochs (epochs 1 .. EPOCHS - 1 end), and
    for each save's stats report, each checkpoint directory's reporting processes."""
    job = build_job(kind)
    marks = []
    job.epoch_group.add(lambda ws: marks.append(len(CALLS)), jit=False)
    ckpt = manager(kind, f"{PREFIX}/{kind}-{every}")
    jaxjob.JobRunner(job, ckpt, save_every_epochs=every).train(jaxjob.Session())
    reports = []
    if ckpt is not None:
        ckpt.close()
        saves = [
            h["stats"] for h in ckpt.metadata_handler.history if h["action"] == "checkpoint_save"
        ]
        for stats in saves:
            reports.append(
                {
                    db.rsplit("/", 1)[1]: [h["process"] for h in s["hosts"]]
                    for db, s in stats.items()
                }
            )
    exchanges = [CALLS[start:end] for start, end in zip(marks, marks[1:], strict=False)]
    return {"exchanges": exchanges, "reports": reports}


result = {"process": ME}
for kind in ("none", "single", "multi", "private"):
    for every in (1, 1000)[: 1 if kind == "none" else 2]:
        result[f"{kind}/{every}"] = per_epoch(kind, every)
print("RESULT", json.dumps(result), flush=True)
