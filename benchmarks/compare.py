"""Before/after of one benchmark row: two jaxjob checkouts, alternating, in fresh processes.

    python benchmarks/compare.py tiny --before ../main --after . --repeats 5
    python benchmarks/compare.py many --before ../main --after .
    python benchmarks/compare.py loop --before ../main --after .

Each repeat runs this checkout's ``storage_bench.py`` (``tiny``: 10 x 64 KiB,
with 9 later saves of the same manager; ``many``: 400 x 2.5 MiB) or
``loops.py loop`` once per checkout, with ``PYTHONPATH`` set to that
checkout, the order alternating between repeats. Prints each run's numbers
and the medians (min-max) of each variant.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"tiny": (10, 64 * 2**10, ["limits", "jaxjob", "safetensors"], 9),
         "many": (400, 5 * 2**19, ["limits", "jaxjob"], 0)}  # fmt: skip


def _child(argv, root):
    env = {**os.environ, "PYTHONPATH": os.path.abspath(root)}
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    print(proc.stdout[-2000:], proc.stderr[-3000:], file=sys.stderr)
    return None


def _run(kind, root, repeat, work):
    directory = tempfile.mkdtemp(dir=work)
    try:
        if kind == "loop":
            argv = [os.path.join(HERE, "loops.py"), "loop", directory, "--rounds", "1"]
            return _child(argv, root)
        leaves, leaf_bytes, methods, later = SIZES[kind]
        spec = {"leaves": leaves, "leaf_bytes": leaf_bytes, "mode": "time", "order": repeat,
                "dir": directory, "methods": methods, "later_saves": later}  # fmt: skip
        return _child([os.path.join(HERE, "storage_bench.py"), json.dumps(spec)], root)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _figures(kind, result):
    if kind == "loop":
        return {
            "jobrunner s/epoch": result["jobrunner"],
            "hand_orbax s/epoch": result["hand_orbax"],
            "jobrunner / hand_orbax": result["jobrunner"] / result["hand_orbax"],
        }
    j = result["jaxjob"]
    keys = ("blocked", "commit", "blocked_later", "commit_later", "restore", "restore_one")
    found = {f"jaxjob {k}": j[k] for k in keys if k in j}  # later saves: tiny only
    found["blocked / commit"] = j["blocked"] / j["commit"]
    found["commit / write+fsync"] = j["commit"] / result["limits"]["write_fsync"]
    found["restore / page-cache read"] = j["restore"] / result["limits"]["page_cache_read"]
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["tiny", "many", "loop"])
    parser.add_argument("--before", required=True, help="checkout of the old jaxjob")
    parser.add_argument("--after", default=os.path.dirname(HERE), help="checkout of the new")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    variants = {"before": args.before, "after": args.after}
    work = tempfile.mkdtemp(prefix="jaxjob-compare-")
    figures = {name: [] for name in variants}
    try:
        for repeat in range(args.repeats):
            order = list(variants) if repeat % 2 == 0 else list(variants)[::-1]
            for name in order:
                result = _run(args.kind, variants[name], repeat, work)
                print(name, repeat, json.dumps(result), flush=True)
                if result:
                    figures[name].append(_figures(args.kind, result))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, runs in figures.items():
        for figure in runs[0] if runs else []:
            values = [run[figure] for run in runs if figure in run]
            print(f"{name:6s} {figure}: median {statistics.median(values):.4g} "
                  f"(min {min(values):.4g}, max {max(values):.4g}, n={len(values)})")  # fmt: skip


if __name__ == "__main__":
    main()
