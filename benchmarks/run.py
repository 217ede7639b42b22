"""jaxjob's benchmark: every figure of issue 11 in one run, as ratios to references of the same run.

    python benchmarks/run.py            # 1 GiB in 4 leaves and 400 x 2.5 MiB, 3 repeats (~15 min)
    python benchmarks/run.py --quick    # small sizes, 1 repeat: checks that every row is printed

Every measurement runs in a fresh child process (clean RSS, no warm caches of
another method); the storage methods alternate within a child, their order
rotated per repeat. Prints one table (value, reference, ratio, target) and
writes all raw numbers to JSON. Machines here are shared and noisy: compare the
ratios, which are measured side by side, not the absolute times.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from common import summary  # noqa: E402
from table import build_rows, render  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

FULL = {
    "big": (4, 256 * 2**20),
    "many": (400, 5 * 2**19),
    "tiny": (10, 64 * 2**10),
    "tiny_later_saves": 9,
    "repeats": 3,
    "processes": (2, 4, 8, 16),
    "exchange": ["--calls", "100", "--blocks", "4"],
    "loop": ["--epochs", "12", "--rounds", "3"],
    "overlap": ["--mib", "1024", "--rounds", "5"],
    "digits": ["--epochs", "20", "--rounds", "1"],
    "digits_mp": ["--epochs", "10", "--exchanges", "100", "--rounds", "2"],
    "cloud": ["--mib", "16", "--repeats", "3"],
    "restart": ["--rounds", "3"],
    "step_slowdown": ["--epochs", "10", "--steps", "4", "--rounds", "3"],
}
QUICK = {
    "big": (4, 16 * 2**20),
    "many": (400, 40 * 2**10),
    "tiny": (10, 64 * 2**10),
    "tiny_later_saves": 3,
    "repeats": 1,
    "processes": (2, 4),
    "exchange": ["--calls", "20", "--blocks", "2"],
    "loop": ["--epochs", "5", "--rounds", "1"],
    "overlap": ["--mib", "64", "--rounds", "2"],
    "digits": ["--epochs", "8", "--rounds", "1"],
    "digits_mp": ["--epochs", "8", "--exchanges", "20"],
    "cloud": ["--mib", "4", "--repeats", "1"],
    "restart": ["--rounds", "1"],
    "step_slowdown": ["--epochs", "5", "--steps", "2", "--rounds", "1"],
}


def child(argv, *, launch=None, timeout=1800):
    """Runs a benchmark script in a fresh process; its ``RESULT`` JSON, or {"error": ...}."""
    command = [sys.executable, *argv]
    if launch:
        command = [sys.executable, "-m", "jaxjob.cli", "launch", "-n", str(launch), "--", *command]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s: {' '.join(argv)}"}
    for line in proc.stdout.splitlines():
        _, tag, rest = line.partition("RESULT ")
        if tag and not line.startswith(("[process=1]", "[process=2]")):
            result = json.loads(rest)
            result["wall_s"] = time.monotonic() - start
            return result
    tail = (proc.stdout + proc.stderr)[-2000:]
    print(f"  {' '.join(argv)} failed ({proc.returncode}):\n{tail}", file=sys.stderr)
    return {"error": f"exit {proc.returncode}: {tail[-300:]}"}


def storage(plan, work, log):
    """Every storage method on the three workspaces, ``repeats`` rounds; then peak RSS."""
    rounds = {name: [] for name in ("big", "many", "tiny")}
    for r in range(plan["repeats"]):
        for name in rounds:
            leaves, leaf_bytes = plan[name]
            spec = {"leaves": leaves, "leaf_bytes": leaf_bytes, "mode": "time", "order": r}
            if name == "tiny":  # the steady state too: a manager's later saves
                spec["later_saves"] = plan["tiny_later_saves"]
            spec["dir"] = tempfile.mkdtemp(dir=work)
            log(f"storage {name} round {r + 1}/{plan['repeats']}")
            rounds[name].append(child([os.path.join(HERE, "storage_bench.py"), json.dumps(spec)]))
            shutil.rmtree(spec["dir"], ignore_errors=True)
    result = {name: _collect(values) for name, values in rounds.items()}
    for name in ("big", "many"):
        leaves, leaf_bytes = plan[name]
        spec = {"leaves": leaves, "leaf_bytes": leaf_bytes, "dir": tempfile.mkdtemp(dir=work)}
        for mode in ("rss-save", "rss-restore"):
            log(f"peak RSS {name} {mode}")
            out = child([os.path.join(HERE, "storage_bench.py"), json.dumps(spec | {"mode": mode})])
            result[name][mode] = out.get("peak_x", out)
        shutil.rmtree(spec["dir"], ignore_errors=True)
    return result


def _collect(rounds):
    """{method: {figure: summary}} over the rounds that succeeded."""
    good = [r for r in rounds if "error" not in r]
    out = {"errors": [r["error"] for r in rounds if "error" in r]}
    for method in good[0] if good else []:
        if method == "wall_s":
            continue
        out[method] = {
            figure: summary([r[method][figure] for r in good]) for figure in good[0][method]
        }
    return out


def machine():
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
    parser.add_argument("--repeats", type=int, help="storage rounds (default: 3, quick: 1)")
    parser.add_argument("--json", help="where to write the raw results")
    parser.add_argument("--dir", help="scratch directory (default: a new one under $TMPDIR)")
    args = parser.parse_args()
    plan = dict(QUICK if args.quick else FULL)
    plan["repeats"] = args.repeats or plan["repeats"]
    json_path = args.json or os.path.join(
        tempfile.gettempdir() if args.quick else HERE,
        "results-quick.json" if args.quick else "results.json",
    )
    work = tempfile.mkdtemp(prefix="jaxjob-bench-", dir=args.dir)
    started = time.monotonic()

    def log(message):
        print(f"[{time.monotonic() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    results = {"quick": args.quick, "machine": machine(), "plan": plan}
    try:
        results["storage"] = storage(plan, work, log)
        results["exchange"] = {}
        for n in plan["processes"]:
            log(f"exchange on {n} processes")
            argv = [os.path.join(HERE, "exchange.py"), *plan["exchange"]]
            results["exchange"][n] = child(argv, launch=n)
        for mode in ("loop", "overlap", "digits"):
            log(mode)
            results[mode] = child([os.path.join(HERE, "loops.py"), mode, work, *plan[mode]])
        log("transformer restart, against plain Orbax")
        argv = [os.path.join(HERE, "restart.py"), os.path.join(work, "restart"), *plan["restart"]]
        results["restart"] = child(argv)
        log("transformer step slowdown: saving every epoch against not saving")
        argv = [os.path.join(HERE, "step_slowdown.py"), os.path.join(work, "slowdown")]
        results["step_slowdown"] = child(argv + plan["step_slowdown"])
        log("digits on 2 processes")
        argv = [os.path.join(HERE, "multiprocess_overhead.py"), *plan["digits_mp"]]
        results["digits_mp"] = child(argv, launch=2)
        log("gs:// against fake-gcs-server")
        results["cloud"] = child([os.path.join(HERE, "cloud.py"), *plan["cloud"]])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["wall_s"] = time.monotonic() - started
    rows = build_rows(results)
    results["rows"] = rows
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)
    print(render(rows))
    print(f"\n{len(rows)} rows; raw results in {json_path}; {results['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
