"""Issue 37's table: each figure beside its reference measured in the same run, ratios median (min).

A row's ``ratio`` is the ratio of the medians, ``ratio_min`` that of the minima (the
least disturbed sample of each, on a shared machine). Rows whose figure this run
did not measure keep ``value`` None and say why in ``why``: no number is made up.
"""

MIB = 2**20

# The rows that benchmarks/ cannot measure yet, and why.
NOT_MEASURED = [
    (
        "one-epoch resume of the NNX transformer",
        "plain Orbax, 2 compiles each",
        "restart.py (--rows issue11) resumes the plain-JAX transformer against plain Orbax, "
        "not the NNX one",
    ),
]


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

    Rows in ``%`` (a slowdown against a third figure) have no ratio.
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
        "met": met,
        "why": None if v and r else missing,
    }


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
    part, cap = max(1, leaves // 4), (1.0 if target_many else None)
    rows = [
        _row(f"blocked per save, {size}", _stat(j, "blocked"), "minimal writer",
             _stat(m, "blocked"), plus=0.005),
        _row(f"blocked per save, {size}", _stat(j, "blocked"), "Orbax defaults",
             _stat(o, "blocked")),
        _row(f"CPU per saved MiB (all threads), {size}", _per_mib(_stat(j, "cpu"), nbytes),
             "minimal writer", _per_mib(_stat(m, "cpu"), nbytes), "s/MiB", target=2.0),
        _row(f"commit, {size}", _stat(j, "commit"), "raw1 (one file + 2 fsyncs)",
             _stat(raw, "commit"), target=2.0 if target_many else None),
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
        _row(f"{size} commit, a manager's later saves", _stat(j, "commit"), "15 ms",
             _fixed(0.015), target=1.0),
        _row(f"{size} commit, a new manager's first save", _stat(j, "first_commit"),
             "safetensors + fsync, first", _stat(st, "first_commit")),
        _row(f"{size} fsyncs per commit (strace -f)", count("jaxjob"), "4", _fixed(4), "n",
             target=1.0, why=why),
        *[_row(f"{size} fsyncs per commit (strace -f)", count("jaxjob"), name, count(method),
               "n", why=why)
          for method, name in (("safetensors", "safetensors + fsync"), ("raw1", "raw1"),
                               ("minimal", "minimal writer"))],
        _row(f"{size} fsyncs, a new manager's first save (strace -f)",
             count("jaxjob", "first"), "4", _fixed(4), "n", why=why),
        _row(f"{size} threads started per save (strace -f)", count("jaxjob", what="threads"),
             "minimal writer", count("minimal", what="threads"), "n", why=why),
        _row(f"{size} restore", _stat(j, "restore"), "safetensors load", _stat(st, "restore")),
        _row(f"{size} restore", _stat(j, "restore"), "5 ms", _fixed(0.005), target=1.0),
    ]  # fmt: skip


def _restore_rows(leaves, leaf_bytes, found):
    size = f"{_size(leaves * leaf_bytes)} in {leaves} leaves"
    j, o = found.get("jaxjob", {}), found.get("orbax", {})
    torch = _stat(found, "torch", "restore")
    return [
        _row(f"full restore {size} (page cache)", _stat(j, "restore"), "safetensors load",
             _stat(found, "safetensors", "restore"), target=1.5),
        _row(f"full restore {size} (page cache)", _stat(j, "restore"), "torch.load", torch,
             why=None if torch else "not measured: torch is not installed (the [bench] extra)"),
        _row(f"full restore {size}: Orbax", _stat(o, "restore"), "safetensors load",
             _stat(found, "safetensors", "restore")),
        _row(f"peak RSS of a full restore / workspace, {size}", _stat(j, "peak_rss_x"),
             "workspace", _fixed(1.0), "x", target=1.15),
        _row(f"peak RSS of a full restore / workspace, {size}: Orbax", _stat(o, "peak_rss_x"),
             "workspace", _fixed(1.0), "x"),
    ]  # fmt: skip


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
             "minimal writer", _slowdown(found, "minimal"), "%", plus=0.03),
        _row(f"{what}: epoch time / not saving", _slowdown(found, "jaxjob"),
             "Orbax defaults", _slowdown(found, "orbax"), "%"),
        _row(f"{what}: extra process CPU per epoch (all threads)",
             _slowdown(found, "jaxjob", "cpu_s", extra=True), "minimal writer",
             _slowdown(found, "minimal", "cpu_s", extra=True)),
        _row(f"{what}: training thread blocked per save", _stat(found, "jaxjob", "blocked_s"),
             "minimal writer", _stat(found, "minimal", "blocked_s"), plus=0.005),
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
            _row(what, _stat(runs, "job", "rerun_s"), "1 s", _fixed(1.0), target=1.0, why=why),
            _row(what, _stat(runs, "job", "rerun_s"), "the imports (jax, jaxjob) before it",
                 _stat(runs, "job", "import_s"), why=why),
        ]  # fmt: skip
    return rows


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
    if set(peers) >= {"blocked", "tiny", "restore", "slowdown", "rerun"}:
        rows += [
            _row(f, None, ref, None, why=f"not measured: {why}") for f, ref, why in NOT_MEASURED
        ]
    return rows


def _fmt(value, unit):
    if value is None:
        return "-"
    if unit == "n":
        return f"{value:g}"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value * 100:+.1f} %"
    if unit == "s/MiB":
        return f"{value * 1000:.2f} ms/MiB"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def render(rows):
    """The rows as a Markdown table: value, reference (its value), ratio median (min), target."""
    lines = [
        "| figure | jaxjob | reference in the same run | ratio median (min) | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["why"]:
            value, ratio = r["why"], "-"
        else:
            value = _fmt(r["value"], r["unit"])
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
            ratio += "" if r["ratio_min"] is None else f" ({r['ratio_min']:.2f})"
        reference = r["reference"]
        if r["reference_value"] is not None:
            reference += f" ({_fmt(r['reference_value'], r['unit'])})"
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        cells = [r["figure"], value, reference, ratio, r["target"] or "", met]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
