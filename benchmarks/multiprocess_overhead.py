"""What running on several processes costs jaxjob, measured in the same run.

    jaxjob launch -n 2 -- python benchmarks/multiprocess_overhead.py --epochs 30

Process 0 prints the median digits epoch time without and with a checkpoint every
epoch, as a ratio, and the median time of one cross-process wait
(``jaxjob.hosts.exchange``) as a fraction of the epoch without checkpoints. It also
counts and times every exchange each epoch makes (the calls to jaxjob's own
``hosts.exchange``, wrapped here): an epoch without a save makes one (the stop
conditions, preemption and process 0's save clock); a saved epoch one more, the
save's agreement, which carries the access check and the stats. The variants
alternate, ``--rounds`` times.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import jaxjob  # noqa: E402
import jaxjob._src.multihost.hosts  # noqa: E402

jaxjob.distributed.initialize()

import digits  # noqa: E402
import jax  # noqa: E402

EXCHANGES = {"count": 0, "seconds": 0.0}
_exchange = jaxjob._src.multihost.hosts.exchange


def counted_exchange(what, payload, *, timeout_s):
    """jaxjob's exchange, counted and timed."""
    start = time.perf_counter()
    try:
        return _exchange(what, payload, timeout_s=timeout_s)
    finally:
        EXCHANGES["count"] += 1
        EXCHANGES["seconds"] += time.perf_counter() - start


jaxjob._src.multihost.hosts.exchange = counted_exchange  # where jaxjob calls it from


def epoch_costs(data, num_epochs, ckpt_dir):
    """Per epoch after the first two (compilation): seconds, exchanges, seconds in exchanges."""
    job = digits.build_job(*data, num_epochs)
    marks = []

    def mark(ws):
        jax.block_until_ready(ws["params"])
        marks.append((time.perf_counter(), EXCHANGES["count"], EXCHANGES["seconds"]))

    job.epoch_group.add(mark, jit=False)
    ckpt = jaxjob.CheckpointManager(ckpt_dir) if ckpt_dir else None
    jaxjob.JobRunner(job, ckpt).train(jaxjob.Session())
    if ckpt is not None:
        ckpt.close()
    return [
        tuple(b - a for a, b in zip(before, after, strict=True))
        for before, after in zip(marks[1:], marks[2:], strict=False)
    ]


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
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    data = digits.load_data()
    # Every process must write to the same directory: process 0 picks it.
    directory = jaxjob.hosts.decide("the directory", tempfile.mkdtemp, timeout_s=60)
    costs = {"plain": [], "saved": []}
    for r in range(args.rounds):
        costs["plain"] += epoch_costs(data, args.epochs, None)
        costs["saved"] += epoch_costs(data, args.epochs, os.path.join(directory, str(r)))
    wait = statistics.median(exchange_times(args.exchanges))
    result = {"processes": jax.process_count(), "wait": wait}
    for variant, rows in costs.items():
        seconds, count, in_exchanges = zip(*rows, strict=True)
        result[variant] = statistics.median(seconds)
        result[f"exchanges_{variant}"] = statistics.median(count)
        result[f"exchange_s_{variant}"] = statistics.median(in_exchanges)
    if jax.process_index() == 0:
        print(f"processes: {jax.process_count()}, devices: {jax.device_count()}")
        for variant in ("plain", "saved"):
            print(
                f"{variant}: median s/epoch {result[variant]:.4f}, exchanges per epoch "
                f"{result[f'exchanges_{variant}']:g} taking "
                f"{result[f'exchange_s_{variant}'] * 1000:.2f} ms"
            )
        print(f"ratio (with / without): {result['saved'] / result['plain']:.2f}")
        share = wait / result["plain"]
        print(f"median s per cross-process wait: {wait:.5f} ({share:.3f} of an epoch)")
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
