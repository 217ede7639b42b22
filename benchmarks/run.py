"""jaxjob's benchmark: the figures of issues 11 and 37, as ratios to references of the same run.

    python benchmarks/run.py            # 1 GiB in 4 leaves and 400 x 2.5 MiB, 3 repeats (~15 min)
    python benchmarks/run.py --quick    # small sizes, 1 repeat: checks that every row is printed
    python benchmarks/run.py --rows issue37          # issue 37's table: jaxjob beside its peers
    python benchmarks/run.py --rows issue37 --quick  # tiny sizes, 1 round (~30 s of CPU)
    python benchmarks/run.py --rows tiny,restore     # some of its groups; --rows all: both tables

``--rows`` picks the tables: ``issue11`` (the default) and issue 37's groups
``blocked`` (56 and 1000 leaves: blocked time, CPU per saved MiB, commit against raw1,
partial restore against Orbax), ``tiny`` (10 x 64 KiB: commit with its fsyncs, restore,
against safetensors and raw1), ``restore`` (512 MiB against safetensors; peak RSS, also
under ``max_host_bytes``), ``slowdown`` (the transformer's loop saving every epoch through
jaxjob, Orbax and the minimal writer, against not saving), ``rerun`` (a finished job's
re-run at 335 and 3000 leaves) and ``nnx`` (the flax NNX transformer's one-epoch resume
against plain Orbax's, ``nnx_resume.py``).

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

import peer_run  # noqa: E402
import peer_table  # noqa: E402
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
    "peers": {  # issue 37's rows (--rows): sizes of its table, 3 fresh-process rounds
        "sizes": {
            "few": (56, 82 * 2**20 // 56 // 4 * 4),
            "many": (1000, 128 * 2**20 // 1000 // 4 * 4),
        },
        "saves": 5,
        "rounds": 3,
        "tiny": (10, 64 * 2**10),
        "tiny_saves": 9,
        "tiny_restores": 10,
        "trace_rounds": False,  # the fsyncs are counted in one more child, not in the timed rounds
        "big": (8, 64 * 2**20),
        "rss_rounds": 3,
        "loop": {"epochs": 10, "steps": 4, "skip": 2, "rounds": 3, "one_process": False},
        "rerun": {"leaves": [335, 3000], "rounds": 3, "timeout": 300},
        "nnx": {"rounds": 3, "epochs": 2, "steps": 20, "timeout": 1800},
    },
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
    "peers": {
        "sizes": {"few": (56, 16 * 2**10), "many": (100, 4 * 2**10)},
        "saves": 1,
        "rounds": 1,
        "tiny": (10, 64 * 2**10),
        "tiny_saves": 2,
        "tiny_restores": 3,
        "trace_rounds": True,  # quick checks the rows, not the speed: one traced round
        "big": (4, 4 * 2**20),
        "rss_rounds": 1,
        "loop": {"epochs": 2, "steps": 1, "skip": 1, "rounds": 1, "one_process": True, "dim": 96},
        "rerun": {"leaves": [30, 100], "rounds": 1, "timeout": 300},
        "nnx": {"rounds": 1, "epochs": 1, "steps": 2, "timeout": 600},
    },
}
ROWS = {"issue11": ("issue11",), "issue37": peer_run.GROUPS, "all": ("issue11", *peer_run.GROUPS)}


def child(argv, *, launch=None, timeout=1800, prefix=()):
    """Runs a benchmark script in a fresh process; its ``RESULT`` JSON, or {"error": ...}."""
    command = [*prefix, sys.executable, *argv]
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


def issue11(plan, work, log):
    """Issue 11's measurements: {part: raw results}."""
    results = {"storage": storage(plan, work, log), "exchange": {}}
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
    return results


def _groups(parser, text):
    """The measurement groups ``--rows`` names, in a fixed order."""
    names = set()
    for name in text.split(","):
        if name in ROWS:
            names.update(ROWS[name])
        elif name in peer_run.GROUPS:
            names.add(name)
        else:
            choices = ", ".join([*ROWS, *peer_run.GROUPS])
            parser.error(f"--rows: got {name!r}; expected a comma-separated list of {choices}")
    return [g for g in ROWS["all"] if g in names]


def _previous(json_path):
    """The results already at ``json_path`` (kept where this run measures none of theirs)."""
    try:
        with open(json_path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _measure(groups, plan, quick, work, log, results):
    """``results`` with the parts of ``groups`` measured anew (issue 11's, issue 37's)."""
    started = time.monotonic()
    if "issue11" in groups:
        results = {"peers": results["peers"]} if "peers" in results else {}
        results |= {"quick": quick, "machine": machine(), "plan": plan}
        results |= issue11(plan, work, log)
        results["wall_s"] = time.monotonic() - started
        results["rows"] = build_rows(results)
    peer_groups = [g for g in groups if g != "issue11"]
    if peer_groups:
        started = time.monotonic()
        raw = peer_run.measure(plan["peers"], peer_groups, child, work, log)
        results["peers"] = {"quick": quick, "machine": machine(), "plan": plan["peers"]}
        results["peers"] |= {"raw": raw, "wall_s": time.monotonic() - started}
        results["peers"]["rows"] = peer_table.build_rows(raw, plan["peers"])
    return results


def _print(groups, results, quick):
    """Prints the tables this run measured; returns their row count."""
    tables, rows = [], 0
    if "issue11" in groups:
        tables.append(render(results["rows"]))
        rows += len(results["rows"])
    if set(groups) - {"issue11"}:
        tables.append(peer_table.render(results["peers"]["rows"]))
        rows += len(results["peers"]["rows"])
        if quick:
            tables[-1] += (
                "\n\n--quick: tiny sizes, 1 round, the tiny round under strace -f: these numbers"
                "\nshow that every row is measured; they are not figures to quote."
            )
    print("\n\n".join(tables))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
    parser.add_argument("--repeats", type=int, help="storage rounds (default: 3, quick: 1)")
    parser.add_argument("--rows", default="issue11", help="tables or groups (see above)")
    parser.add_argument("--json", help="where to write the raw results (merged into the file)")
    parser.add_argument("--dir", help="scratch directory (default: a new one under $TMPDIR)")
    args = parser.parse_args()
    groups = _groups(parser, args.rows)
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

    try:
        results = _measure(groups, plan, args.quick, work, log, _previous(json_path))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)
    rows = _print(groups, results, args.quick)
    print(f"\n{rows} rows; raw results in {json_path}; {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
