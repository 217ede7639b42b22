"""Cross-process exchanges for multihost/test_hosts.py, made by every process of a launched job.

Usage: ``python mp_hosts.py CALLS [LATE]``: every process makes CALLS exchanges and prints
``RESULT {json}`` with what it received; with LATE, that process skips the last
exchange and sleeps instead, and the others print ``TIMEOUT {json}``.
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import json
import os
import sys
import time

import jaxjob

jaxjob.distributed.initialize()

import jax  # noqa: E402

job_start.imported()

CALLS = int(sys.argv[1])
LATE = int(sys.argv[2]) if len(sys.argv) > 2 else None
ME = jax.process_index()

seen = []
for call in range(CALLS - 1):
    posts = jaxjob.hosts.exchange(f"call {call}", {"call": call, "from": ME}, timeout_s=60)
    seen.append([(p["call"], p["from"]) for p in posts])
if ME == LATE:
    time.sleep(30)
    sys.exit(0)
try:
    jaxjob.hosts.exchange("the last call", {"from": ME}, timeout_s=3 if LATE is not None else 60)
except jaxjob.hosts.HostTimeoutError as err:
    print("TIMEOUT " + json.dumps({"process": ME, "missing": err.missing, "message": str(err)}))
    sys.stdout.flush()
    os._exit(4)  # jax.distributed's shutdown would wait for the late process
print("RESULT " + json.dumps({"process": ME, "seen": seen}), flush=True)
