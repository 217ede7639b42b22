"""The re-run of a finished job: the cost of the resume decision, as the leaf count grows.

    python benchmarks/peer_rerun.py '{"mode": "setup", "leaves": [335, 3000], "dir": "/tmp/x"}'
    python benchmarks/peer_rerun.py '{"mode": "rerun", "leaves": 3000, "dir": "/tmp/x"}'

The job: ``init`` makes ``leaves`` parameters of 1 KiB (``{"params": {"p0000": ...}}``),
each epoch adds one to each; ``epoch_limiter(job, 1)``. ``setup`` trains each job of
``leaves`` to its end under ``<dir>/<leaves>``; ``rerun``, in a fresh process, runs the
finished job again: ``train()`` has no epoch left to run, and returns once it has
decided so. Prints one ``RESULT {json}`` line: the seconds the imports (jax, jaxjob)
took, the seconds ``train()`` took, and the epoch it returned.
"""

import json
import os
import sys
import time

START = time.perf_counter()


def _job(leaves):
    import jax.numpy as jnp

    import jaxjob

    job = jaxjob.Job()

    @job.init_group.task
    def init(ws):
        return {"params": {f"p{i:04d}": jnp.full((256,), i, jnp.float32) for i in range(leaves)}}

    @job.epoch_group.task
    def train_epoch(ws):
        return {"params": {k: v + 1 for k, v in ws["params"].items()}}

    jaxjob.epoch_limiter(job, 1)
    return job


def _train(leaves, directory):
    import jaxjob

    runner = jaxjob.JobRunner(_job(leaves), jaxjob.CheckpointManager(directory))
    return runner.train(jaxjob.Session())


def main():
    spec = json.loads(sys.argv[1])
    import jax  # noqa: F401

    import jaxjob  # noqa: F401

    imported = time.perf_counter()
    if spec["mode"] == "setup":
        for leaves in spec["leaves"]:
            _train(leaves, os.path.join(spec["dir"], str(leaves)))
        print("RESULT " + json.dumps({"setup": spec["leaves"]}), flush=True)
        return
    epoch = _train(spec["leaves"], os.path.join(spec["dir"], str(spec["leaves"])))
    result = {"import_s": [imported - START], "rerun_s": [time.perf_counter() - imported]}
    print("RESULT " + json.dumps(result | {"epoch": [epoch]}), flush=True)


if __name__ == "__main__":
    main()
