"""What running on several processes costs jaxjob, measured in the same run.

    jaxjob launch -n 2 -- python benchmarks/multiprocess_overhead.py --epochs 30

Process 0 prints the median digits epoch time without and with a checkpoint every
epoch, and the median time of one cross-process wait (``jaxjob.hosts.exchange``,
of which a checkpointed epoch makes four: stop conditions, access check, save
agreement, stats), each as a ratio to the epoch without checkpoints.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import jaxjob  # noqa: E402

jaxjob.distributed.initialize()

import jax  # noqa: E402
from checkpoint_overhead import epoch_times  # noqa: E402


def exchange_times(count):
    times = []
    for i in range(count):
        start = time.perf_counter()
        jaxjob.hosts.exchange(f"benchmark {i}", {"i": i}, timeout_s=60)
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--exchanges", type=int, default=200)
    args = parser.parse_args()
    plain = statistics.median(epoch_times(args.epochs, None))
    # Every process must write to the same directory: process 0 picks it.
    directory = jaxjob.hosts.decide("the directory", tempfile.mkdtemp, timeout_s=60)
    saved = statistics.median(epoch_times(args.epochs, directory))
    wait = statistics.median(exchange_times(args.exchanges))
    if jax.process_index() == 0:
        print(f"processes: {jax.process_count()}, devices: {jax.device_count()}")
        print(f"median s/epoch without checkpoints: {plain:.4f}")
        print(f"median s/epoch with async checkpoint every epoch: {saved:.4f}")
        print(f"ratio (with / without): {saved / plain:.2f}")
        print(f"median s per cross-process wait: {wait:.5f} ({wait / plain:.3f} of an epoch)")
        result = {"processes": jax.process_count(), "plain": plain, "saved": saved, "wait": wait}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
