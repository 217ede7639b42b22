"""What the checkpoint checksums cost: a 1 GiB save with and without them, interleaved.

1. Candidate hashes over the same 256 MiB of random float32 (GB/s, one thread):
   jaxjob's (``jaxjob._src.checkpoint.checksum.digest``: CRC-32C through the crc32c package)
   beside the block sums it replaced, which missed reordered and sum-preserving damage.
2. A 1 GiB workspace (4 x 256 MiB random float32) saved by a CheckpointManager,
   with checksums and with them switched off (``checksum.start`` replaced by one
   that hashes nothing, and the file table's entries by sizes alone: no CRC-32C
   or SHA-256 of any file), alternately, ``--repeats`` times each: the time until
   ``save`` returns (async: the device-to-host copy) and until the commit. The
   cost is the median of the paired differences (each run with checksums minus
   the run without beside it; the pairs alternate which runs first), with their
   range: single commits of 1 GiB vary by +-10% here, more than the cost measured.
3. When the background hash finishes, against when the commit does: on local disk
   the leaves are hashed while the commit flushes the written files (fsync), and
   the commit waits for the checksum file only if the hash outlasts the flush.
4. Verifying it: ``CheckpointManager.verify`` (reads and hashes everything).

Usage: python benchmarks/checksum_cost.py [--mib 1024] [--repeats 7]
"""

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np

import jaxjob
from jaxjob._src.base import file_table
from jaxjob._src.checkpoint import checksum


def hash_speeds(mib=256):
    data = np.random.default_rng(0).standard_normal(mib * 2**20 // 4).astype(np.float32)
    view = data.view(np.uint8)
    words = data.view(np.uint64)
    candidates = {
        "crc32c (jaxjob: crc32c)": lambda: checksum.digest(data),
        "4 KiB sums + crc32 (before)": lambda: zlib.crc32(
            np.add.reduce(words.reshape(-1, 512), axis=1).view(np.uint8)
        ),
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
    return checksum.Checksums({})  # nothing to hash


def _size_only(path):
    """A file table entry without hashing the file."""
    return [os.path.getsize(path), 0, None]


def _timed_compute(done):
    original = checksum._compute

    def compute(shards):
        result = original(shards)
        done.append(time.perf_counter())
        return result

    return compute


def _save(ws, checksums):
    """One save: (save() returned, committed, verified, hash finished), seconds from save()."""
    prefix = tempfile.mkdtemp(prefix="jaxjob-crc-")
    original, compute, entry = checksum.start, checksum._compute, file_table.hash_file
    checksum.start = original if checksums else _no_checksums
    file_table.hash_file = entry if checksums else _size_only
    hashed = []
    checksum._compute = _timed_compute(hashed)
    try:
        ckpt = jaxjob.CheckpointManager(prefix)
        start = time.perf_counter()
        ckpt.save(0, ws)
        returned = time.perf_counter() - start
        ckpt.wait_until_finished()
        committed = time.perf_counter() - start
        hash_done = hashed[0] - start if hashed else 0.0
        verifying = time.perf_counter()
        problems = ckpt.verify(0) if checksums else None
        verified = time.perf_counter() - verifying
        ckpt.close()
    finally:
        checksum.start, checksum._compute = original, compute
        file_table.hash_file = entry
        shutil.rmtree(prefix)
    assert not problems
    return returned, committed, verified, hash_done


def save_cost(mib, repeats):
    ws = _workspace(mib)
    jax.block_until_ready(ws)
    _save(ws, True)  # warm-up: compile, first Orbax objects
    runs = {True: [], False: []}
    for i in range(repeats):  # ABBA: neither kind always runs after the other's deletion
        for checksums in (False, True) if i % 2 == 0 else (True, False):
            runs[checksums].append(_save(ws, checksums))
    med = {k: [statistics.median(r[i] for r in v) for i in range(4)] for k, v in runs.items()}
    on, off = med[True], med[False]
    diffs = [a[1] - b[1] for a, b in zip(runs[True], runs[False], strict=True)]
    cost = statistics.median(diffs)
    print(f"  save() returns (s):  without {off[0]:.3f}  with {on[0]:.3f}")
    print(f"  commit (s):          without {off[1]:.3f}  with {on[1]:.3f}")
    print(
        f"  checksum cost: median of {repeats} paired differences {cost:+.3f} s on the commit = "
        f"{100 * cost / off[1]:+.1f}% of the save time (range {min(diffs):+.3f} to "
        f"{max(diffs):+.3f} s)"
    )
    print(f"  background hash finished {on[3]:.3f} s after save(), the commit {on[1]:.3f} s")
    print(f"  verify(0) (reads and hashes {mib} MiB): {on[2]:.3f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print("Hash throughput, 256 MiB, one thread:")
    hash_speeds()
    print(f"Saving {args.mib} MiB ({args.repeats} interleaved pairs, medians):")
    save_cost(args.mib, args.repeats)


if __name__ == "__main__":
    main()
