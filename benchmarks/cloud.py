"""A gs:// save and restore against the local fake-gcs-server: a regression check, not speed.

    python benchmarks/cloud.py --mib 16 --repeats 3

Prints ``RESULT {json}``: median seconds of a synchronous jaxjob save to commit and
of a full restore, on gs:// and on local disk, of the same 4-leaf workspace.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import jax  # noqa: E402
import pytest  # noqa: E402
from common import timed, workspace_arrays  # noqa: E402

import jaxjob  # noqa: E402


def round_trip(prefix, ws):
    ckpt = jaxjob.CheckpointManager(prefix, async_save=False)
    save, _ = timed(ckpt.save, 0, ws)
    ckpt.close()
    restore, _ = timed(lambda: jax.block_until_ready(jaxjob.restore(prefix)))
    return save, restore


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from cloud_servers import CloudServers, unique_prefix

    ws = {k: jax.device_put(v) for k, v in workspace_arrays(4, args.mib * 2**18).items()}
    runs = {"gs": [], "local": []}
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as work:
        servers = CloudServers(mp, pathlib.Path(work))
        try:
            for r in range(args.repeats):
                runs["gs"].append(round_trip(unique_prefix(servers.gcs_url), ws))
                runs["local"].append(round_trip(os.path.join(work, f"local{r}"), ws))
        finally:
            servers.close()
    result = {
        f"{where}_{what}": statistics.median(run[i] for run in values)
        for where, values in runs.items()
        for i, what in enumerate(("save", "restore"))
    }
    print("RESULT " + json.dumps(result | {"mib": args.mib}), flush=True)


if __name__ == "__main__":
    main()
