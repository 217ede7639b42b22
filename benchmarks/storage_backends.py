"""Durable commits and storage backends, measured side by side in one run.

1. The cost of a durable commit: a synchronous jaxjob save of N MiB of float32
   (every file fsynced, renamed, the parent fsynced) against Orbax's own atomic
   rename of the same arrays with the same handler (not fsynced), interleaved.
2. A small save and restore on local disk, gs:// and s3:// (the local emulators
   of the test suite: a regression check, not a speed claim).

Usage: python benchmarks/storage_backends.py [--mib 1024] [--repeats 3] [--no-cloud]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

import jaxjob
from jaxjob._src.checkpoint import codec, io, manifest, run_identity, storage

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def _workspace(mib):
    n = mib * 2**20 // 4 // 4  # random: constant arrays would compress to nothing
    keys = jax.random.split(jax.random.key(0), 4)
    return {f"w{i}": jax.random.normal(k, (n,), jnp.float32) for i, k in enumerate(keys)}


def _durable(prefix, ws):
    ckpt = jaxjob.CheckpointManager(prefix, async_save=False)
    start = time.perf_counter()
    ckpt.save(0, ws)
    took = time.perf_counter() - start
    ckpt.close()
    return took


def _orbax_rename(prefix, ws):
    found, flat = manifest.build(0, "local", ws, {}, None, run=run_identity.ensure(prefix))
    encoded, _ = storage.encode(found, flat, codec.SharedCodec())
    checkpointer = ocp.Checkpointer(io.composite_handler(prefix, False))
    start = time.perf_counter()
    checkpointer.save(os.path.join(prefix, "local.0"), args=io.save_args(encoded, found))
    took = time.perf_counter() - start
    checkpointer.close()
    return took


def durable_cost(mib, repeats):
    ws = _workspace(mib)
    jax.block_until_ready(ws)
    times = {"jaxjob durable": [], "orbax rename": []}
    for _ in range(repeats):
        for name, fn in (("jaxjob durable", _durable), ("orbax rename", _orbax_rename)):
            with tempfile.TemporaryDirectory(dir=os.getcwd()) as d:
                times[name].append(fn(d, ws))
    durable, plain = (statistics.median(times[k]) for k in times)
    print(f"{mib} MiB in 4 leaves, sync save to commit, median of {repeats} (min-max):")
    for name, values in times.items():
        print(
            f"  {name:15s} {statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"
        )
    print(f"  durable / plain rename: {durable / plain:.2f}x (+{durable - plain:.3f} s)")


def _small_round_trip(prefix):
    ws = {"params": {"w": jnp.ones((256, 256)), "b": jnp.zeros(256)}, "step": 3}
    ckpt = jaxjob.CheckpointManager(prefix, async_save=False)
    start = time.perf_counter()
    ckpt.save(0, ws)
    saved = time.perf_counter() - start
    ckpt.close()
    start = time.perf_counter()
    jaxjob.restore(prefix, leaves=["params"])
    return saved, time.perf_counter() - start


def backends(repeats):
    from cloud_servers import CloudServers, unique_prefix

    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as work:
        servers = CloudServers(mp, __import__("pathlib").Path(work))
        try:
            roots = {"local": None, "gs": servers.gcs_url, "s3": servers.s3_url}
            print("small workspace (256 KiB), save to commit / restore, median:")
            for name, root in roots.items():
                runs = []
                for _ in range(repeats):
                    with tempfile.TemporaryDirectory() as d:
                        runs.append(_small_round_trip(unique_prefix(root) if root else d))
                save, load = (statistics.median(r[i] for r in runs) for i in (0, 1))
                print(f"  {name:5s} save {save * 1000:.0f} ms, restore {load * 1000:.0f} ms")
        finally:
            servers.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-cloud", action="store_true")
    args = parser.parse_args()
    durable_cost(args.mib, args.repeats)
    if not args.no_cloud:
        backends(args.repeats)


if __name__ == "__main__":
    main()
