"""Restores a checkpoint of ``mp_job.py`` on any topology; prints ``RESTORED {json}`` per process.

Usage: ``python mp_restore.py DB_PREFIX``. ``w`` goes sharded over every device
of the job (one device: the default device); the other leaves to the default
device. The host-local cursor is restored first without a ``host_map`` (an
error unless the process count is the saved one), then with the saved process
``p % 2`` for process ``p``. The same leaves are restored again under a host-memory
budget of 64 bytes (every leaf read alone, the processes reading in step).
"""

import job_start  # first: no garbage collection while the job imports (see it)

# isort: split

import json
import sys

import jaxjob

jaxjob.distributed.initialize()

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from mp_digest import digest  # noqa: E402

job_start.imported()

PREFIX = sys.argv[1]
mesh = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
rows = NamedSharding(mesh, P("d"))
ws = jaxjob.restore(PREFIX, leaves=["w", "opt", "rng"], sharding={"w": rows})
by_leaf = jaxjob.restore(
    PREFIX, leaves=["w", "opt", "rng"], sharding={"w": rows}, max_host_bytes=64
)
try:
    jaxjob.restore(PREFIX, leaves=["cursor"])
    host_map_error = None
except ValueError as err:
    host_map_error = str(err)
cursor = jaxjob.restore(PREFIX, leaves=["cursor"], host_map=lambda p: p % 2)["cursor"]
result = {
    "process": jax.process_index(),
    "digest": digest({k: ws[k] for k in ("w", "opt", "rng")}),
    "budget_digest": digest({k: by_leaf[k] for k in ("w", "opt", "rng")}),
    "w_sharding": ws["w"].sharding == rows,
    "w_shards": len(ws["w"].addressable_shards),
    "cursor": cursor.tolist(),
    "host_map_error": host_map_error,
}
print("RESTORED", json.dumps(result), flush=True)
