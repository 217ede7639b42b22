"""Issue 37's table: each figure beside its reference measured in the same run, ratios median (min).

A row's ``ratio`` is the ratio of the medians, ``ratio_min`` that of the minima (the
least disturbed sample of each, on a shared machine). Rows whose figure this run
did not measure keep ``value`` None and say why in ``why``: no number is made up.
"""

import table

MIB = 2**20

# Issue 37's targets (docs/performance.md draws them beside the figures: peer_plots.py).
BLOCKED_PLUS_S = 0.005  # blocked per save <= the minimal writer's + 5 ms
SLOWDOWN_PLUS = 0.03  # epoch slowdown <= the minimal writer's + 3 points
CPU_PER_MIB_X = 2.0  # CPU per saved MiB <= 2x the minimal writer's
COMMIT_MANY_X = 2.0  # commit of the many leaves <= 2x raw1
PARTIAL_MANY_X = 1.0  # partial restore of the many leaves <= Orbax's
TINY_COMMIT_S = 0.015
TINY_FSYNCS = 4
TINY_RESTORE_S = 0.005
RESTORE_X = 1.5  # full restore <= 1.5x safetensors' load
RESTORE_RSS_X = 1.15  # peak RSS of a full restore <= 1.15x the workspace
BUDGET_PART = 4  # the budget rows' max_host_bytes: the workspace's bytes / 4
RERUN_S = 1.0  # a finished job's re-run <= 1 s after the imports

# The rows that benchmarks/ cannot measure yet, and why.
NOT_MEASURED: list[tuple[str, str, str]] = []  # (figure, reference, why) of rows not measured
NNX_RESUME_X = 1.1  # the NNX transformer's one-epoch resume <= 1.1x plain Orbax's


def _stat(tree, *keys):
    """The summary dict at ``tree[k1][k2]...``, or None."""
    for key in keys:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree if isinstance(tree, dict) and "median" in tree else None


def _fixed(value):
    """A constant reference (a target, the workspace) as a summary."""
    return {"median": value, "min": value, "max": value, "n": 0}


def _row(figure, value, reference, ref, unit="s", target=None, plus=None, why=None):
    """One row; ``target``: ratio of medians at most; ``plus``: value <= reference + plus.

    Rows in ``%`` (a slowdown against a third figure) have no ratio. ``limit`` is the
    target as a value in the row's unit (the reference's median times ``target``, or
    plus ``plus``), None without a target or a reference.
    """
    v, r = value or {}, ref or {}
    with_ratio = v and r and unit != "%"
    ratio = v["median"] / r["median"] if with_ratio and r["median"] else None
    ratio_min = v["min"] / r["min"] if with_ratio and r["min"] else None
    met = None
    if ratio is not None and target is not None:
        met = ratio <= target
    if v and r and plus is not None:
        met = v["median"] <= r["median"] + plus
    missing = why or (None if v and r else "not measured: this run has no figure for it")
    return {
        "figure": figure,
        "value": v.get("median"),
        "value_min": v.get("min"),
        "unit": unit,
        "reference": reference,
        "reference_value": r.get("median"),
        "reference_min": r.get("min"),
        "ratio": ratio,
        "ratio_min": ratio_min,
        "target": _target(target, plus, unit),
        "limit": _limit(r, target, plus),
        "met": met,
        "why": None if v and r else missing,
    }


def _limit(ref, target, plus):
    if not ref or (target is None and plus is None):
        return None
    return ref["median"] * target if target is not None else ref["median"] + plus


def _target(target, plus, unit):
    if target is not None:
        return f"<= {target:g}x"
    if plus is None:
        return None
    return f"<= ref + {plus * 100:g} points" if unit == "%" else f"<= ref + {plus * 1000:g} ms"


def _per_mib(stat, nbytes):
    if not stat:
        return None
    return {k: stat[k] / (nbytes / MIB) for k in ("median", "min", "max")} | {"n": stat["n"]}


def _size(nbytes):
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / MIB:.3g} MiB"


def _blocked_rows(label, leaves, leaf_bytes, found, target_many):
    """Blocked time, CPU per MiB, commit and restores at one size."""
    size, nbytes = f"{leaves} leaves ({_size(leaves * leaf_bytes)})", leaves * leaf_bytes
    j, o, m, raw = (found.get(k, {}) for k in ("jaxjob", "orbax", "minimal", "raw1"))
    part, cap = max(1, leaves // 4), (PARTIAL_MANY_X if target_many else None)
    rows = [
        _row(f"blocked per save, {size}", _stat(j, "blocked"), "minimal writer",
             _stat(m, "blocked"), plus=BLOCKED_PLUS_S),
        _row(f"blocked per save, {size}", _stat(j, "blocked"), "Orbax defaults",
             _stat(o, "blocked")),
        _row(f"CPU per saved MiB (all threads), {size}", _per_mib(_stat(j, "cpu"), nbytes),
             "minimal writer", _per_mib(_stat(m, "cpu"), nbytes), "s/MiB", target=CPU_PER_MIB_X),
        _row(f"commit, {size}", _stat(j, "commit"), "raw1 (one file + 2 fsyncs)",
             _stat(raw, "commit"), target=COMMIT_MANY_X if target_many else None),
        _row(f"commit, {size}: Orbax defaults", _stat(o, "commit"), "raw1", _stat(raw, "commit")),
        _row(f"commit, {size}: minimal writer", _stat(m, "commit"), "raw1", _stat(raw, "commit")),
        _row(f"partial restore ({part} of {leaves} leaves)", _stat(j, "restore_part"),
             "Orbax partial restore", _stat(o, "restore_part"), target=cap),
        _row(f"partial restore ({part} of {leaves} leaves)", _stat(j, "restore_part"),
             "jaxjob full restore", _stat(j, "restore")),
    ]  # fmt: skip
    return rows


def _tiny_rows(leaves, leaf_bytes, found):
    size = f"tiny ({leaves} x {leaf_bytes // 1024} KiB)"
    j, st, raw = (found.get(k, {}) for k in ("jaxjob", "safetensors", "raw1"))
    syncs = found.get("syncs", {})
    why = syncs.get("error") if isinstance(syncs.get("error"), str) else None

    def count(method, which="later", what="syncs"):
        value = found.get(what, {}).get(method, {}).get(which)
        return None if value is None else _fixed(value)

    return [
        _row(f"{size} commit, a manager's later saves", _stat(j, "commit"),
             "safetensors + fsync", _stat(st, "commit")),
        _row(f"{size} commit, a manager's later saves", _stat(j, "commit"), "raw1",
             _stat(raw, "commit")),
        _row(f"{size} commit, a manager's later saves", _stat(j, "commit"),
             f"{TINY_COMMIT_S * 1000:g} ms", _fixed(TINY_COMMIT_S), target=1.0),
        _row(f"{size} commit, a new manager's first save", _stat(j, "first_commit"),
             "safetensors + fsync, first", _stat(st, "first_commit")),
        _row(f"{size} fsyncs per commit (strace -f)", count("jaxjob"), f"{TINY_FSYNCS}",
             _fixed(TINY_FSYNCS), "n", target=1.0, why=why),
        *[_row(f"{size} fsyncs per commit (strace -f)", count("jaxjob"), name, count(method),
               "n", why=why)
          for method, name in (("safetensors", "safetensors + fsync"), ("raw1", "raw1"),
                               ("minimal", "minimal writer"))],
        _row(f"{size} fsyncs, a new manager's first save (strace -f)",
             count("jaxjob", "first"), f"{TINY_FSYNCS}", _fixed(TINY_FSYNCS), "n", why=why),
        _row(f"{size} threads started per save (strace -f)", count("jaxjob", what="threads"),
             "minimal writer", count("minimal", what="threads"), "n", why=why),
        _row(f"{size} restore", _stat(j, "restore"), "safetensors load", _stat(st, "restore")),
        _row(f"{size} restore", _stat(j, "restore"), f"{TINY_RESTORE_S * 1000:g} ms",
             _fixed(TINY_RESTORE_S), target=1.0),
    ]  # fmt: skip


def _restore_rows(leaves, leaf_bytes, found):
    size = f"{_size(leaves * leaf_bytes)} in {leaves} leaves"
    j, o = found.get("jaxjob", {}), found.get("orbax", {})
    torch = _stat(found, "torch", "restore")
    return [
        _row(f"full restore {size} (page cache)", _stat(j, "restore"), "safetensors load",
             _stat(found, "safetensors", "restore"), target=RESTORE_X),
        _row(f"full restore {size} (page cache)", _stat(j, "restore"), "torch.load", torch,
             why=None if torch else "not measured: torch is not installed (the [bench] extra)"),
        _row(f"full restore {size}: Orbax", _stat(o, "restore"), "safetensors load",
             _stat(found, "safetensors", "restore")),
        _row(f"peak RSS of a full restore / workspace, {size}", _stat(j, "peak_rss_x"),
             "workspace", _fixed(1.0), "x", target=RESTORE_RSS_X),
        _row(f"peak RSS of a full restore / workspace, {size}: Orbax", _stat(o, "peak_rss_x"),
             "workspace", _fixed(1.0), "x"),
        _row(f"peak RSS of a full restore / workspace, {size}, max_host_bytes = workspace/"
             f"{BUDGET_PART}", _stat(found.get("jaxjob-budget", {}), "peak_rss_x"),
             "workspace + budget", _fixed(1 + 1 / BUDGET_PART), "x", target=1.0),
        _row(f"peak RSS of a save beside the workspace / workspace, {size}, max_host_bytes = "
             f"workspace/{BUDGET_PART}", plus_one(found.get("jaxjob-save-budget", {})),
             "workspace + budget", _fixed(1 + 1 / BUDGET_PART), "x", target=1.0),
    ]  # fmt: skip


def plus_one(found):
    """A save's peak RSS growth over the workspace as a peak over nothing (1 + growth)."""
    stat = _stat(found, "peak_rss_x")
    return {k: 1 + v for k, v in stat.items() if k in ("median", "min", "max")} if stat else None


def _slowdown(found, method, figure="epoch_s", extra=False):
    """``method``'s figure against the loop without saves: a fraction slower, or seconds more."""
    value, plain = _stat(found, method, figure), _stat(found, "plain", figure)
    if not value or not plain:
        return None
    if extra:
        return {k: value[k] - plain[k] for k in ("median", "min")} | {"n": value["n"]}
    return {k: value[k] / plain[k] - 1 for k in ("median", "min")} | {"n": value["n"]}


def _slowdown_rows(found):
    """The transformer's loop (56 leaves, 82 MiB) saving every epoch, against not saving."""
    what = "transformer loop saving every epoch"
    return [
        _row(f"{what}: epoch time / not saving", _slowdown(found, "jaxjob"),
             "minimal writer", _slowdown(found, "minimal"), "%", plus=SLOWDOWN_PLUS),
        _row(f"{what}: epoch time / not saving", _slowdown(found, "jaxjob"),
             "Orbax defaults", _slowdown(found, "orbax"), "%"),
        _row(f"{what}: extra process CPU per epoch (all threads)",
             _slowdown(found, "jaxjob", "cpu_s", extra=True), "minimal writer",
             _slowdown(found, "minimal", "cpu_s", extra=True)),
        _row(f"{what}: training thread blocked per save", _stat(found, "jaxjob", "blocked_s"),
             "minimal writer", _stat(found, "minimal", "blocked_s"), plus=BLOCKED_PLUS_S),
        _row(f"{what}: training thread blocked per save", _stat(found, "jaxjob", "blocked_s"),
             "Orbax defaults", _stat(found, "orbax", "blocked_s")),
    ]  # fmt: skip


def _rerun_rows(found):
    """A finished job's re-run (``train()`` deciding there is nothing left) at each size."""
    rows = []
    for n, runs in found.items():
        what = f"re-run of a finished job, {n} leaves: train() to its return"
        errors = runs.get("errors") or []
        why = (
            f"not measured: {errors[0][:160]}"
            if errors and not _stat(runs, "job", "rerun_s")
            else None
        )
        rows += [
            _row(what, _stat(runs, "job", "rerun_s"), f"{RERUN_S:g} s", _fixed(RERUN_S), target=1.0,
                 why=why),
            _row(what, _stat(runs, "job", "rerun_s"), "the imports (jax, jaxjob) before it",
                 _stat(runs, "job", "import_s"), why=why),
        ]  # fmt: skip
    return rows


def _nnx_rows(found):
    """The NNX transformer's one-epoch resume against plain Orbax's (``nnx_resume.py``)."""
    compiles = [_stat(found, k, "compiles") for k in ("jaxjob", "orbax")]
    each = "/".join(f"{c['median']:g}" if c else "?" for c in compiles)
    leaves = found.get("leaves", "?")
    return [
        _row(f"one-epoch resume of the NNX transformer ({leaves} leaves), to its epoch's results",
             _stat(found, "jaxjob", "seconds"), f"plain Orbax (compiles: {each})",
             _stat(found, "orbax", "seconds"), target=NNX_RESUME_X,
             why=f"not measured: {found['error']}" if "error" in found else None),
    ]  # fmt: skip


def build_rows(peers, plan):
    """Every row of issue 37's table from :func:`peer_run.measure`'s results and the plan."""
    rows = _slowdown_rows(peers["slowdown"]) if "slowdown" in peers else []
    if "blocked" in peers:
        for label, (leaves, leaf_bytes) in plan["sizes"].items():
            found = peers["blocked"].get(label, {})
            rows += _blocked_rows(label, leaves, leaf_bytes, found, label == "many")
    if "tiny" in peers:
        rows += _tiny_rows(*plan["tiny"], peers["tiny"])
    if "restore" in peers:
        rows += _restore_rows(*plan["big"], peers["restore"])
    if "rerun" in peers:
        rows += _rerun_rows(peers["rerun"])
    if "nnx" in peers:
        rows += _nnx_rows(peers["nnx"])
    if set(peers) >= {"blocked", "tiny", "restore", "slowdown", "rerun", "nnx"}:
        rows += [
            _row(f, None, ref, None, why=f"not measured: {why}") for f, ref, why in NOT_MEASURED
        ]
    return rows


HEADER = ("figure", "jaxjob", "reference in the same run", "ratio median (min)", "target", "met")


def _cells(r):
    """A row's cells: value (or why not), reference (its value), ratio median (min), target."""
    if r["why"]:
        value, ratio = r["why"], "-"
    else:
        value = table.fmt(r["value"], r["unit"])
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        ratio += "" if r["ratio_min"] is None else f" ({r['ratio_min']:.2f})"
    reference = r["reference"]
    if r["reference_value"] is not None:
        reference += f" ({table.fmt(r['reference_value'], r['unit'])})"
    return [r["figure"], value, reference, ratio, r["target"] or "", table.met_cell(r["met"])]


def render(rows):
    """The rows as a Markdown table: value, reference (its value), ratio median (min), target."""
    return table.render(rows, HEADER, _cells)
