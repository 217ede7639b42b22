"""Issue 37's figures as the series docs/performance.md plots, from results.json's "peers" entry.

Each group that ``python benchmarks/run.py --rows issue37`` measures (slowdown, blocked, tiny,
restore, rerun, nnx) becomes panels: jaxjob's figure first, then its references measured in the
same run, each as its median and the least and greatest sample, and the issue's target as a
line where the figure has one. :func:`ratios` gives every row of the table with a target as
a ratio to its reference; :func:`not_measured` the rows with no number, and why. The numbers
are those of results.json, unchanged (tests/test_benchmarks_plots.py): the page only draws
them, with :func:`draw` and :func:`draw_ratios`.
"""

import math
from typing import NamedTuple

import peer_table
from peer_table import _fixed, _per_mib, _size, _stat

GROUPS = ("slowdown", "blocked", "tiny", "restore", "rerun", "nnx")
TITLES = {
    "slowdown": "the transformer's loop (56 leaves) saving every epoch",
    "blocked": "saves of many leaves: blocked time, CPU, commit; partial restore",
    "tiny": "a tiny checkpoint",
    "restore": "full restore from the page cache",
    "rerun": "re-run of a finished job: train() to its return",
    "nnx": "one-epoch resume of the flax NNX transformer",
}
NO_PEERS = (
    'This results.json has no issue-37 run (no "peers" entry): '
    "`python benchmarks/run.py --rows issue37` measures it."
)
MINIMAL, ORBAX, RAW1 = "the minimal writer", "Orbax defaults", "raw1 (one file + 2 fsyncs)"
SAFETENSORS = "safetensors + fsync"


class Bar(NamedTuple):
    """One bar: the ``median`` of the samples, ``low`` and ``high`` the least and greatest."""

    label: str
    jaxjob: bool
    median: float
    low: float
    high: float


class Panel(NamedTuple):
    """jaxjob's figure (the first bar) beside its references; the target ``limit`` or None."""

    title: str
    unit: str  # "s", "s/MiB", "n" (a count) or "x" (times the workspace)
    bars: tuple[Bar, ...]
    limit: float | None = None
    limit_label: str = ""


class Ratio(NamedTuple):
    """A row with a target: jaxjob's figure over its reference, the target as such a ratio."""

    label: str
    ratio: float
    target: float
    met: bool


def caption(peers):
    """The machine and the rounds of the run, or :data:`NO_PEERS` without one."""
    if not peers:
        return NO_PEERS
    machine, plan = peers["machine"], peers["plan"]
    rounds = f"{plan['rounds']} round" + "s" * (plan["rounds"] != 1)
    line = (
        f"{machine['cpus']} CPUs, Python {machine['python']}, {machine['platform']}; "
        f"{rounds} (bars: medians, whiskers: min-max of the samples)"
    )
    if peers.get("quick"):
        line += "; a --quick run (tiny sizes, 1 round): these numbers are not figures to quote"
    return line


def panels(peers, group):
    """The panels of ``group`` (one of :data:`GROUPS`); none if this run did not measure it."""
    if not peers or group not in peers["raw"]:
        return []
    found, plan = peers["raw"][group], peers["plan"]
    made = {
        "slowdown": lambda: _slowdown(found),
        "blocked": lambda: [p for size in plan["sizes"] for p in _blocked(found, plan, size)],
        "tiny": lambda: _tiny(found, *plan["tiny"]),
        "restore": lambda: _restore(found, *plan["big"]),
        "rerun": lambda: [_rerun(runs, n) for n, runs in found.items()],
        "nnx": lambda: [_nnx(found)],
    }[group]()
    return [p for p in made if p is not None]


def ratios(peers):
    """Every measured row with a target, as a ratio to its reference (target: a ratio too).

    A row in ``%`` (the epoch's slowdown against not saving) becomes the ratio of the
    epoch times, ``(1 + slowdown) / (1 + the reference's slowdown)``.
    """
    found = []
    for row in _rows(peers):
        value, ref, limit = row["value"], row["reference_value"], row["limit"]
        if row["met"] is None or limit is None or not ref:
            continue
        label = f"{row['figure']} / {row['reference']}"
        if f"/ {row['reference']}" in row["figure"]:  # "peak RSS ... / workspace, ..."
            label = row["figure"]
        if row["unit"] == "%":
            value, ref, limit = 1 + value, 1 + ref, 1 + limit
            label = f"{row['figure'].removesuffix(' / not saving')} / {row['reference']}'s"
        found.append(Ratio(label, value / ref, limit / ref, row["met"]))
    return found


def not_measured(peers):
    """``"figure (beside reference): why"`` for each row this run has no number for."""
    rows = [r for r in _rows(peers) if r["why"]]
    return [f"{r['figure']} (beside {r['reference']}): {_why(r)}" for r in rows]


def _why(row):
    return row["why"].removeprefix("not measured: ")


def _rows(peers):
    return peer_table.build_rows(peers["raw"], peers["plan"]) if peers else []


def _bar(label, stat, jaxjob=False):
    if not stat:
        return None
    median = stat["median"]
    return Bar(label, jaxjob, median, stat.get("min", median), stat.get("max", median))


def _panel(title, unit, bars, limit=None, limit_label=""):
    """The bars measured; None when jaxjob's is not (its row says why, in the list)."""
    bars = tuple(b for b in bars if b is not None)
    if not bars or not bars[0].jaxjob:
        return None
    return Panel(title, unit, bars, limit, limit_label)


def _limit(stat, times=1.0, plus=0.0):
    return None if not stat else stat["median"] * times + plus


def _slowdown(found):
    def stat(method, figure):
        return _stat(found, method, figure)

    def bars(figure, *methods):
        names = {"jaxjob": "jaxjob", "plain": "not saving", "minimal": MINIMAL, "orbax": ORBAX}
        return [_bar(names[m], stat(m, figure), m == "jaxjob") for m in ("jaxjob", *methods)]

    plain, minimal = stat("plain", "epoch_s"), stat("minimal", "epoch_s")
    limit = None
    if plain and minimal:
        limit = minimal["median"] + peer_table.SLOWDOWN_PLUS * plain["median"]
    points = f"{peer_table.SLOWDOWN_PLUS * 100:g} %"
    return [
        _panel("epoch time, saving every epoch", "s", bars("epoch_s", "plain", "minimal", "orbax"),
               limit, f"target: {MINIMAL}'s + {points} of not saving"),
        _panel("process CPU per epoch (all threads)", "s", bars("cpu_s", "plain", "minimal")),
        _panel("training thread blocked per save", "s", bars("blocked_s", "minimal", "orbax"),
               _limit(stat("minimal", "blocked_s"), plus=peer_table.BLOCKED_PLUS_S),
               f"target: {MINIMAL}'s + {peer_table.BLOCKED_PLUS_S * 1000:g} ms"),
    ]  # fmt: skip


def _blocked(found, plan, label):
    leaves, leaf_bytes = plan["sizes"][label]
    nbytes, many = leaves * leaf_bytes, label == "many"
    size = f"{leaves} leaves ({_size(nbytes)})"
    found = found.get(label, {})
    j, o, m, raw = (found.get(k, {}) for k in ("jaxjob", "orbax", "minimal", "raw1"))
    part = max(1, leaves // 4)
    return [
        _panel(f"blocked per save, {size}", "s",
               [_bar("jaxjob", _stat(j, "blocked"), True), _bar(MINIMAL, _stat(m, "blocked")),
                _bar(ORBAX, _stat(o, "blocked"))],
               _limit(_stat(m, "blocked"), plus=peer_table.BLOCKED_PLUS_S),
               f"target: {MINIMAL}'s + {peer_table.BLOCKED_PLUS_S * 1000:g} ms"),
        _panel(f"CPU per saved MiB, {size}", "s/MiB",
               [_bar("jaxjob", _per_mib(_stat(j, "cpu"), nbytes), True),
                _bar(MINIMAL, _per_mib(_stat(m, "cpu"), nbytes))],
               _limit(_per_mib(_stat(m, "cpu"), nbytes), peer_table.CPU_PER_MIB_X),
               f"target: {peer_table.CPU_PER_MIB_X:g}x {MINIMAL}'s"),
        _panel(f"save to a durable commit, {size}", "s",
               [_bar("jaxjob", _stat(j, "commit"), True), _bar(RAW1, _stat(raw, "commit")),
                _bar(MINIMAL, _stat(m, "commit")), _bar(ORBAX, _stat(o, "commit"))],
               _limit(_stat(raw, "commit"), peer_table.COMMIT_MANY_X) if many else None,
               f"target: {peer_table.COMMIT_MANY_X:g}x raw1's"),
        _panel(f"partial restore ({part} of {leaves} leaves)", "s",
               [_bar("jaxjob", _stat(j, "restore_part"), True),
                _bar("Orbax partial restore", _stat(o, "restore_part")),
                _bar("jaxjob full restore", _stat(j, "restore"))],
               _limit(_stat(o, "restore_part"), peer_table.PARTIAL_MANY_X) if many else None,
               "target: Orbax's"),
    ]  # fmt: skip


def _tiny(found, leaves, leaf_bytes):
    size = f"{leaves} x {leaf_bytes // 1024} KiB"
    j, st, raw, m = (found.get(k, {}) for k in ("jaxjob", "safetensors", "raw1", "minimal"))
    syncs, threads = found.get("syncs", {}), found.get("threads", {})
    traced = not isinstance(syncs.get("error"), str)

    def count(counts, method, label, which="later"):
        value = counts.get(method, {}).get(which) if traced else None
        return None if value is None else _bar(label, _fixed(value), method == "jaxjob")

    peers = (
        ("jaxjob", "jaxjob"),
        ("safetensors", SAFETENSORS),
        ("raw1", RAW1),
        ("minimal", MINIMAL),
    )
    return [
        _panel(f"commit, a manager's later saves ({size})", "s",
               [_bar("jaxjob", _stat(j, "commit"), True), _bar(SAFETENSORS, _stat(st, "commit")),
                _bar(RAW1, _stat(raw, "commit")), _bar(MINIMAL, _stat(m, "commit"))],
               peer_table.TINY_COMMIT_S, f"target: {peer_table.TINY_COMMIT_S * 1000:g} ms"),
        _panel(f"commit, a new manager's first save ({size})", "s",
               [_bar("jaxjob", _stat(j, "first_commit"), True),
                _bar(SAFETENSORS, _stat(st, "first_commit"))]),
        _panel("fsyncs per commit (strace -f)", "n",
               [count(syncs, method, label) for method, label in peers],
               peer_table.TINY_FSYNCS, f"target: {peer_table.TINY_FSYNCS}"),
        _panel("threads started per save (strace -f)", "n",
               [count(threads, "jaxjob", "jaxjob"), count(threads, "minimal", MINIMAL)]),
        _panel(f"restore ({size})", "s",
               [_bar("jaxjob", _stat(j, "restore"), True),
                _bar("safetensors load", _stat(st, "restore"))],
               peer_table.TINY_RESTORE_S, f"target: {peer_table.TINY_RESTORE_S * 1000:g} ms"),
    ]  # fmt: skip


def _restore(found, leaves, leaf_bytes):
    size = f"{_size(leaves * leaf_bytes)} in {leaves} leaves"
    part = peer_table.BUDGET_PART
    safetensors = _stat(found, "safetensors", "restore")
    return [
        _panel(f"full restore, {size}", "s",
               [_bar("jaxjob", _stat(found, "jaxjob", "restore"), True),
                _bar("safetensors load", safetensors),
                _bar("torch.load", _stat(found, "torch", "restore")),
                _bar(ORBAX, _stat(found, "orbax", "restore"))],
               _limit(safetensors, peer_table.RESTORE_X),
               f"target: {peer_table.RESTORE_X:g}x safetensors'"),
        _panel(f"peak RSS of a full restore, {size}", "x",
               [_bar("jaxjob", _stat(found, "jaxjob", "peak_rss_x"), True),
                _bar(ORBAX, _stat(found, "orbax", "peak_rss_x"))],
               peer_table.RESTORE_RSS_X, f"target: {peer_table.RESTORE_RSS_X:g}x"),
        _panel(f"peak RSS of a restore, max_host_bytes = workspace/{part}, {size}", "x",
               [_bar("jaxjob", _stat(found, "jaxjob-budget", "peak_rss_x"), True),
                _bar("jaxjob without a budget", _stat(found, "jaxjob", "peak_rss_x")),
                _bar("workspace + budget", _fixed(1 + 1 / part))],
               1 + 1 / part, "workspace + budget"),
        _panel(f"peak RSS of a save, max_host_bytes = workspace/{part}, {size}", "x",
               [_bar("jaxjob", peer_table.plus_one(found.get("jaxjob-save-budget", {})), True),
                _bar("workspace + budget", _fixed(1 + 1 / part))],
               1 + 1 / part, "workspace + budget"),
    ]  # fmt: skip


def _rerun(runs, leaves):
    return _panel(
        f"{leaves} leaves",
        "s",
        [
            _bar("jaxjob", _stat(runs, "job", "rerun_s"), True),
            _bar("the imports (jax, jaxjob) before it", _stat(runs, "job", "import_s")),
        ],
        peer_table.RERUN_S,
        f"target: {peer_table.RERUN_S:g} s",
    )


def _nnx(found):
    orbax = _stat(found, "orbax", "seconds")
    return _panel(
        f"{found.get('leaves', '?')} leaves, to the epoch's results",
        "s",
        [_bar("jaxjob", _stat(found, "jaxjob", "seconds"), True), _bar("plain Orbax", orbax)],
        _limit(orbax, peer_table.NNX_RESUME_X),
        f"target: {peer_table.NNX_RESUME_X:g}x plain Orbax's",
    )


def _scale(panel):
    """The factor and axis label the panel's values are drawn in."""
    if panel.unit == "s/MiB":
        return 1000, "ms per MiB"
    if panel.unit == "n":
        return 1, "count"
    if panel.unit == "x":
        return 1, "times the workspace"
    largest = max([b.high for b in panel.bars] + [panel.limit or 0])
    return (1, "seconds") if largest >= 1 else (1000, "milliseconds")


def draw(found, title=None):
    """A matplotlib figure of the panels ``found``: up to 4 in a row, else in two rows."""
    import matplotlib.pyplot as plt

    ncols = len(found) if len(found) <= 4 else math.ceil(len(found) / 2)
    nrows = math.ceil(len(found) / ncols)
    height = 0.32 * max(len(p.bars) for p in found) + 1.3
    width = max(3.6 * ncols, 9)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, found, strict=False):
        _draw_panel(ax, panel)
    for ax in axes.flat[len(found) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def _draw_panel(ax, panel):
    factor, axis = _scale(panel)
    bars, names = panel.bars, [b.label for b in panel.bars]
    medians = [b.median * factor for b in bars]
    ax.barh(names, medians, color=["C0" if b.jaxjob else "0.7" for b in bars])
    spread = [(i, b) for i, b in enumerate(bars) if b.low < b.high]  # several samples
    if spread:
        err = [[(b.median - b.low) * factor for _, b in spread]]
        err += [[(b.high - b.median) * factor for _, b in spread]]
        ax.errorbar([medians[i] for i, _ in spread], [i for i, _ in spread], xerr=err,
                    fmt="none", ecolor="black", capsize=3, linewidth=1)  # fmt: skip
    for i, b in enumerate(bars):  # the median, readable where the bar is too short
        ax.text(b.high * factor, i, f" {b.median * factor:.3g}", va="center", fontsize=7)
    if panel.limit is not None:
        ax.axvline(panel.limit * factor, color="black", linestyle="--", linewidth=1)
        axis += f"\n(dashed: {panel.limit_label})"
    ax.margins(x=0.2)
    ax.invert_yaxis()
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel(axis, fontsize=8)
    ax.tick_params(labelsize=8)


def draw_ratios(found):
    """A figure of :func:`ratios`: bars met (blue) or missed (orange), the targets as ticks."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.32 * len(found) + 1))
    names = [r.label[:95] for r in found]
    ax.barh(names, [r.ratio for r in found], color=["C0" if r.met else "C1" for r in found])
    ax.scatter([r.target for r in found], names, marker="|", s=200, color="black", zorder=3)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("ratio to the reference (log scale)")
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    return fig
