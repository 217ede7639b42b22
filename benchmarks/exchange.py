"""Milliseconds per cross-process exchange, old (every process reads every key) vs new.

    jaxjob launch -n 8 -- python benchmarks/exchange.py --calls 100

The old exchange (jaxjob before this benchmark) made N^2 blocking gets per exchange
(each process read each other's key); the new one (``jaxjob.hosts.exchange``) is a
barrier plus one directory read per process. Both run here in alternating blocks;
process 0 prints ``RESULT {json}``.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jaxjob  # noqa: E402

jaxjob.distributed.initialize()

import jax  # noqa: E402

from jaxjob._src.base import jax_private  # noqa: E402


def old_exchange(client, call, payload):
    """The exchange as it was: post, then a blocking get of every process's key."""
    me = jax.process_index()
    client.key_value_set(f"bench/old/{call}/{me}", json.dumps(payload))
    if call >= 2:
        client.key_value_delete(f"bench/old/{call - 2}/{me}")
    return [
        json.loads(client.blocking_key_value_get(f"bench/old/{call}/{p}", 60_000))
        for p in range(jax.process_count())
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()
    client = jax_private.distributed_client()
    times = {"old": [], "new": []}
    call = 0
    jaxjob.hosts.exchange("warm up", {}, timeout_s=120)
    for _ in range(args.blocks):
        start = time.perf_counter()
        for _ in range(args.calls):
            old_exchange(client, call, {"i": call})
            call += 1
        times["old"].append((time.perf_counter() - start) / args.calls)
        start = time.perf_counter()
        for i in range(args.calls):
            jaxjob.hosts.exchange("benchmark", {"i": i}, timeout_s=120)
        times["new"].append((time.perf_counter() - start) / args.calls)
    if jax.process_index() == 0:
        ms = {k: [v * 1000 for v in values] for k, values in times.items()}
        result = {k: statistics.median(v) for k, v in ms.items()}
        result.update(processes=jax.process_count(), blocks=ms)
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
