"""What the checkpoint checksums cost: a 1 GiB save with and without them, interleaved.

1. Candidate hashes over the same 256 MiB of random float32 (GB/s, one thread):
   how jaxjob's algorithm (``jaxjob.checksum.digest``: CRC-32 of 4 KiB block sums) was chosen.
2. A 1 GiB workspace (4 x 256 MiB random float32) saved by a CheckpointManager,
   with checksums and with them switched off (``checksum.start`` replaced by one
   that hashes nothing), alternately, ``--repeats`` times each: the time until
   ``save`` returns (async: the device-to-host copy) and until the commit.
3. Verifying it: ``CheckpointManager.verify`` (reads and hashes everything).

Usage: python benchmarks/checksum_cost.py [--mib 1024] [--repeats 3]
"""

import argparse
import concurrent.futures
import hashlib
import shutil
import statistics
import tempfile
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np

import jaxjob
from jaxjob import checksum


def hash_speeds(mib=256):
    data = np.random.default_rng(0).standard_normal(mib * 2**20 // 4).astype(np.float32)
    view = data.view(np.uint8)
    words = data.view(np.uint64)
    candidates = {
        "4 KiB sums + crc32 (jaxjob)": lambda: checksum.digest(data),
        "zlib.crc32": lambda: zlib.crc32(view),
        "zlib.adler32": lambda: zlib.adler32(view),
        "hashlib.sha1": lambda: hashlib.sha1(view).digest(),
        "hashlib.sha256": lambda: hashlib.sha256(view).digest(),
        "hashlib.blake2b": lambda: hashlib.blake2b(view).digest(),
        "hashlib.md5": lambda: hashlib.md5(view).digest(),
        "numpy uint64 sum": lambda: int(np.add.reduce(words, dtype=np.uint64)),
    }
    for name, fn in candidates.items():
        fn()
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        print(f"  {name:28s} {data.nbytes / took / 1e9:6.2f} GB/s")


def _workspace(mib):
    n = mib * 2**20 // 4 // 4  # random: constant arrays would compress to nothing
    keys = jax.random.split(jax.random.key(0), 4)
    return {f"w{i}": jax.random.normal(k, (n,), jnp.float32) for i, k in enumerate(keys)}


def _no_checksums(encoded):
    future = concurrent.futures.Future()
    future.set_result({})
    return future


def _save(ws, checksums):
    prefix = tempfile.mkdtemp(prefix="jaxjob-crc-")
    original = checksum.start
    checksum.start = original if checksums else _no_checksums
    try:
        ckpt = jaxjob.CheckpointManager(prefix)
        start = time.perf_counter()
        ckpt.save(0, ws)
        returned = time.perf_counter() - start
        ckpt.wait_until_finished()
        committed = time.perf_counter() - start
        start = time.perf_counter()
        problems = ckpt.verify(0) if checksums else None
        verified = time.perf_counter() - start
        ckpt.close()
    finally:
        checksum.start = original
        shutil.rmtree(prefix)
    assert not problems
    return returned, committed, verified


def save_cost(mib, repeats):
    ws = _workspace(mib)
    jax.block_until_ready(ws)
    _save(ws, True)  # warm-up: compile, first Orbax objects
    runs = {True: [], False: []}
    for _ in range(repeats):
        for checksums in (False, True):
            runs[checksums].append(_save(ws, checksums))
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in runs.items()}
    on, off = med[True], med[False]
    print(f"  save() returns (s):  without {off[0]:.3f}  with {on[0]:.3f}")
    print(f"  commit (s):          without {off[1]:.3f}  with {on[1]:.3f}")
    print(
        f"  checksum cost: {on[1] - off[1]:+.3f} s on the commit = "
        f"{100 * (on[1] - off[1]) / off[1]:+.1f}% of the save time"
    )
    print(f"  verify(0) (reads and hashes {mib} MiB): {on[2]:.3f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("Hash throughput, 256 MiB, one thread:")
    hash_speeds()
    print(f"Saving {args.mib} MiB ({args.repeats} interleaved repeats, medians):")
    save_cost(args.mib, args.repeats)


if __name__ == "__main__":
    main()
