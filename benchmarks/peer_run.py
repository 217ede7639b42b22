"""Issue 37's measurements: rounds of ``peer_bench.py`` in fresh processes, and fsync counts.

``run.py --rows ...`` calls :func:`measure` with the plan's ``peers`` part; the rows
are built from what it returns by ``peer_table.py``. Every round is a fresh child
process whose methods run in an order rotated by the round's number; each figure
keeps every sample of every round (``median``, ``min``, ``max``, ``n``).
"""

import collections
import concurrent.futures
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile

from common import summary

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "peer_bench.py")
LOOP = os.path.join(HERE, "peer_loop.py")
RERUN = os.path.join(HERE, "peer_rerun.py")
NNX = os.path.join(HERE, "nnx_resume.py")
GROUPS = ("blocked", "tiny", "restore", "slowdown", "rerun", "nnx")
LOOP_METHODS = ["plain", "jaxjob", "orbax", "minimal"]
SYNCS = ("fsync", "fdatasync", "syncfs", "sync", "sync_file_range", "msync")
THREADS = ("clone", "clone3")  # a thread (or process) started
_CALL = re.compile(r"^\d+\s+(\w+)\((.*)")  # "<... fsync resumed>" lines do not match
_MARK = re.compile(r'"/jaxjob-bench-mark/([^/]+)/(\d+)/(start|end)"')


def _merge(rounds):
    """{method: {figure: summary}} over the rounds' sample lists; errors listed apart."""
    samples = collections.defaultdict(lambda: collections.defaultdict(list))
    for found in rounds:
        for method, figures in found.items():
            if method in ("error", "wall_s"):
                continue
            for figure, values in figures.items():
                if isinstance(values, list):  # not the child's wall_s
                    samples[method][figure] += values
    out = {
        m: {f: summary(v) | {"n": len(v)} for f, v in figs.items()} for m, figs in samples.items()
    }
    out["errors"] = [r["error"] for r in rounds if "error" in r]
    return out


def _rotated(names, r):
    """``names`` rotated by ``r`` places (a round's order)."""
    shift = r % len(names)
    return names[shift:] + names[:shift]


def _rounds(child, spec, rounds, work, log, what):
    found = []
    for r in range(rounds):
        log(f"peers: {what} round {r + 1}/{rounds}")
        directory = tempfile.mkdtemp(dir=work)
        found.append(child([BENCH, json.dumps(spec | {"order": r, "dir": directory})]))
        shutil.rmtree(directory, ignore_errors=True)
    return found


def _blocked(plan, child, work, log):
    """Blocked time, commit, CPU and restores at each size of ``plan["sizes"]``."""
    spec = {"mode": "save", "sizes": plan["sizes"], "saves": plan["saves"]}
    found = _rounds(child, spec, plan["rounds"], work, log, "saves at each size")
    out = {label: _merge([r.get(label, {}) for r in found]) for label in plan["sizes"]}
    for label in out:
        out[label]["errors"] = [r["error"] for r in found if "error" in r]
    return out


def strace_usable():
    """Whether ``strace -f`` can trace a child here (installed, and ptrace allowed)."""
    if not shutil.which("strace"):
        return False
    probe = ["strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=fsync", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def count_calls(trace_text, names=SYNCS):
    """{label: [calls of ``names`` per save]} from ``strace -f`` output with the bench's marks.

    A save's calls are those between its ``start`` and ``end`` marks, on any thread;
    ``<... resumed>`` lines are not counted again.

    Args:
        trace_text: what ``strace -f -o FILE`` wrote.
        names: the system calls to count (default: the fsync family).

    Returns:
        For each save label of ``peer_bench.py`` (``jaxjob``, ``jaxjob-first``, ...), the
        number of calls in each of its saves, in order.
    """
    counts, current = collections.defaultdict(list), None
    for line in trace_text.splitlines():
        call = _CALL.match(line)
        if not call:
            continue
        name, rest = call.groups()
        mark = _MARK.search(rest) if "access" in name else None
        if mark:
            label, _, edge = mark.groups()
            current = label if edge == "start" else None
            if current:
                counts[current].append(0)
        elif current and name in names:
            counts[current][-1] += 1
    return dict(counts)


def _traced(child, argv, work):
    """(result, trace text) of ``child(argv)`` under ``strace -f`` (fsyncs, thread starts, marks).

    ``--seccomp-bpf``: the child stops only at the traced calls, but ``-f`` also stops
    it at each thread it starts (a jaxjob save starts ~20): times under it are not
    the untraced ones.
    """
    trace = os.path.join(work, "strace.txt")
    calls = ",".join(("access", "faccessat", "faccessat2", *SYNCS, *THREADS))
    prefix = ["strace", "-f", "--seccomp-bpf", "-qq", "-o", trace, "-e", f"trace={calls}"]
    found = child(argv, prefix=prefix)
    if "error" in found or not os.path.exists(trace):
        return found, ""
    with open(trace) as f:
        text = f.read()
    os.remove(trace)
    return found, text


def _per_method(texts, names):
    """{method: {"first": n, "later": median n}}: calls of ``names`` in the traced saves."""
    counts = collections.defaultdict(list)
    for text in texts:
        for label, values in count_calls(text, names).items():
            counts[label] += values
    out = collections.defaultdict(dict)
    for label, values in counts.items():
        method, _, first = label.partition("-")
        out[method]["first" if first else "later"] = statistics.median(values)
    return dict(out)


def _tiny_traced(spec, plan, child, work, log):
    """The tiny rounds, each under ``strace -f``: (results, trace texts)."""
    found, texts = [], []
    for r in range(plan["rounds"]):
        log(f"peers: tiny round {r + 1}/{plan['rounds']}, under strace -f")
        directory = tempfile.mkdtemp(dir=work)
        argv = [BENCH, json.dumps(spec | {"order": r, "dir": directory})]
        result, text = _traced(child, argv, work)
        found.append(result)
        texts.append(text)
        shutil.rmtree(directory, ignore_errors=True)
    return found, texts


def _tiny(plan, child, work, log):
    """Tiny commits and restores; each save's fsyncs and thread starts, by ``strace -f``.

    The counts come from one more child (3 saves a method), not from the timed
    rounds: under ``strace -f`` a jaxjob save took ~3x as long (it stops at each
    thread started). ``--quick`` (``trace_rounds``), which checks the rows rather
    than the speed, traces its one round instead.
    """
    leaves, leaf_bytes = plan["tiny"]
    spec = {"mode": "tiny", "leaves": leaves, "leaf_bytes": leaf_bytes}
    rounds_spec = spec | {"saves": plan["tiny_saves"], "restores": plan["tiny_restores"]}
    if not strace_usable():
        out = _merge(_rounds(child, rounds_spec, plan["rounds"], work, log, "tiny"))
        why = "not measured: strace is missing, or may not trace a child here"
        return out | {"syncs": {"error": why}, "threads": {"error": why}}
    if plan["trace_rounds"]:
        found, texts = _tiny_traced(rounds_spec, plan, child, work, log)
        out = _merge(found)
    else:
        out = _merge(_rounds(child, rounds_spec, plan["rounds"], work, log, "tiny"))
        log("peers: tiny, fsyncs and thread starts counted by strace -f")
        directory = tempfile.mkdtemp(dir=work)
        argv = [BENCH, json.dumps(spec | {"saves": 3, "restores": 1, "order": 0, "dir": directory})]
        found, text = _traced(child, argv, work)
        found, texts = [found], [text]
        shutil.rmtree(directory, ignore_errors=True)
    if not any(texts):
        why = f"not measured: {[r.get('error') for r in found]}"
        return out | {"syncs": {"error": why}, "threads": {"error": why}}
    return out | {"syncs": _per_method(texts, SYNCS), "threads": _per_method(texts, THREADS)}


def _peak_rss(spec, child, log):
    """{method: peak_x} of a full restore, jaxjob's and Orbax's each in a fresh process.

    Also jaxjob's restore and save under ``max_host_bytes`` (``peer_table.BUDGET_PART``).
    Two run at a time: a process's peak RSS does not depend on the clock.
    """
    log("peers: peak RSS of jaxjob's and Orbax's restores, and under a budget (fresh processes)")
    methods = ("jaxjob", "orbax", "jaxjob-budget", "jaxjob-save-budget")
    argv = {m: [BENCH, json.dumps(spec | {"mode": "rss", "method": m})] for m in methods}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        found = dict(zip(argv, pool.map(child, argv.values()), strict=True))
    return {method: result.get("peak_x") for method, result in found.items()}


def _restore(plan, child, work, log):
    """Full restores (rotated, a fresh process per round); then each method's peak RSS."""
    leaves, leaf_bytes = plan["big"]
    spec = {"mode": "restore", "leaves": leaves, "leaf_bytes": leaf_bytes}
    found, rss = [], collections.defaultdict(list)
    for r in range(plan["rounds"]):
        log(f"peers: full restore round {r + 1}/{plan['rounds']}")
        directory = tempfile.mkdtemp(dir=work)
        found.append(child([BENCH, json.dumps(spec | {"order": r, "dir": directory})]))
        if r < plan["rss_rounds"]:
            for method, peak in _peak_rss(spec | {"dir": directory}, child, log).items():
                rss[method] += [] if peak is None else [peak]
        shutil.rmtree(directory, ignore_errors=True)
    out = _merge(found)
    for method, values in rss.items():
        out.setdefault(method, {})["peak_rss_x"] = (
            summary(values) | {"n": len(values)} if values else None
        )
    return out


def _slowdown(plan, child, work, log):
    """The transformer's loop saving every epoch through each method, against not saving.

    Each method in its own fresh process, their order rotated per round; with
    ``one_process`` (``--quick``) all of them in one process, one after the other.
    """
    loop = plan["loop"]
    found = []
    for r in range(loop["rounds"]):
        methods = _rotated(LOOP_METHODS, r)
        for group in [methods] if loop["one_process"] else [[m] for m in methods]:
            log(f"peers: transformer loop round {r + 1}/{loop['rounds']}: {', '.join(group)}")
            directory = tempfile.mkdtemp(dir=work)
            spec = {k: loop.get(k) for k in ("epochs", "steps", "skip", "dim")}
            spec |= {"methods": group, "dir": directory}
            found.append(child([LOOP, json.dumps(spec)]))
            shutil.rmtree(directory, ignore_errors=True)
    return _merge(found)


def _rerun(plan, child, work, log):
    """A finished job's re-run in a fresh process at each leaf count, sizes in rotated order.

    A size that timed out is not run again (the issue saw 3000 leaves run past 500 s).
    """
    rerun, directory = plan["rerun"], tempfile.mkdtemp(dir=work)
    log(f"peers: jobs of {rerun['leaves']} leaves trained to their end (setup)")
    spec = {"mode": "setup", "leaves": rerun["leaves"], "dir": directory}
    setup = child([RERUN, json.dumps(spec)])
    found = {n: [] for n in rerun["leaves"]}
    for r in range(0 if "error" in setup else rerun["rounds"]):
        for n in _rotated(rerun["leaves"], r):
            if any("error" in f for f in found[n]):
                continue
            log(f"peers: re-run of the finished {n}-leaf job, round {r + 1}/{rerun['rounds']}")
            spec = {"mode": "rerun", "leaves": n, "dir": directory}
            found[n].append(child([RERUN, json.dumps(spec)], timeout=rerun["timeout"]))
    shutil.rmtree(directory, ignore_errors=True)
    if "error" in setup:
        return {str(n): {"errors": [setup["error"]]} for n in rerun["leaves"]}
    wrapped = {n: [f if "error" in f else {"job": f} for f in runs] for n, runs in found.items()}
    return {str(n): _merge(runs) for n, runs in wrapped.items()}


def _nnx(plan, child, work, log):
    """The flax NNX transformer's one-epoch resume, jaxjob against plain Orbax (nnx_resume.py).

    Its own fresh processes, alternating; its RESULT as it prints it.
    """
    nnx = plan["nnx"]
    log(f"peers: the NNX transformer's one-epoch resume, {nnx['rounds']} rounds (and Orbax's)")
    argv = [NNX, tempfile.mkdtemp(dir=work), "--rounds", str(nnx["rounds"])]
    argv += ["--epochs", str(nnx["epochs"]), "--steps", str(nnx["steps"])]
    return child(argv, timeout=nnx["timeout"])


def measure(plan, groups, child, work, log):
    """{group: raw figures} for each of ``groups`` (names in :data:`GROUPS`)."""
    steps = {"blocked": _blocked, "tiny": _tiny, "restore": _restore, "slowdown": _slowdown}
    steps |= {"rerun": _rerun, "nnx": _nnx}
    return {group: steps[group](plan, child, work, log) for group in groups}
