"""Local tier placement checks made by every process of a launched job (test_local_tier.py).

Usage: ``python mp_local_tier.py CKPT LOCAL...``: for each LOCAL in turn, every process builds
``CheckpointManager(CKPT, local=LocalTier(LOCAL))`` and prints ``MADE {json}`` if that
returned, or ``REFUSED {json}`` with the ValueError's message; both name the process and LOCAL.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import json
import sys

import jaxjob

jaxjob.distributed.initialize()

import jax  # noqa: E402

job_start.imported()

ME = jax.process_index()
for local in sys.argv[2:]:
    record = {"process": ME, "local": local}
    try:
        manager = jaxjob.CheckpointManager(sys.argv[1], local=jaxjob.LocalTier(local))
    except ValueError as err:
        print("REFUSED " + json.dumps({**record, "message": str(err)}), flush=True)
    else:
        print("MADE " + json.dumps(record), flush=True)
        manager.close()
