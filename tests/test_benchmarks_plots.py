"""benchmarks/peer_plots.py: docs/performance.md plots issue 37's numbers as results.json has them.

The fixture tests/peers_quick.json is the "peers" entry of a real
``python benchmarks/run.py --rows issue37 --quick`` run (1 round; the tiny group's saves and
restores have several samples each, so their whiskers are real).
"""

import contextlib
import io
import json
import math
import sys
from pathlib import Path

import paths
import pytest

BENCHMARKS = Path(paths.ROOT) / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import peer_plots  # noqa: E402
import peer_table  # noqa: E402

FIXTURE = Path(paths.TESTS) / "peers_quick.json"
MIB = 2**20


@pytest.fixture
def peers():
    return json.loads(FIXTURE.read_text())["peers"]


def _triple(stat, scale=1.0):
    return (stat["median"] * scale, stat["min"] * scale, stat["max"] * scale)


def _bars(peers, group):
    """{(panel title, bar label): (median, low, high)} of every bar of ``group``."""
    return {
        (panel.title, bar.label): (bar.median, bar.low, bar.high)
        for panel in peer_plots.panels(peers, group)
        for bar in panel.bars
    }


def test_each_group_draws_jaxjob_first_beside_its_references(peers):
    """Every group of the run has panels; each panel's first bar is jaxjob's, then references."""
    for group in peer_plots.GROUPS:
        found = peer_plots.panels(peers, group)
        assert found, group
        for panel in found:
            assert panel.bars[0].jaxjob and panel.bars[0].label == "jaxjob", panel
            assert len(panel.bars) >= 2 and not any(b.jaxjob for b in panel.bars[1:]), panel
            assert all(b.low <= b.median <= b.high for b in panel.bars), panel


def test_the_tiny_bars_are_the_jsons_samples(peers):
    """The tiny commit and restore: medians and min-max exactly as results.json holds them."""
    tiny, bars = peers["raw"]["tiny"], _bars(peers, "tiny")
    commit, restore = "commit, a manager's later saves (10 x 64 KiB)", "restore (10 x 64 KiB)"
    assert bars[commit, "jaxjob"] == _triple(tiny["jaxjob"]["commit"])
    assert bars[commit, "safetensors + fsync"] == _triple(tiny["safetensors"]["commit"])
    assert bars[commit, "raw1 (one file + 2 fsyncs)"] == _triple(tiny["raw1"]["commit"])
    assert bars[commit, "the minimal writer"] == _triple(tiny["minimal"]["commit"])
    assert bars[restore, "jaxjob"] == _triple(tiny["jaxjob"]["restore"])
    assert bars[restore, "safetensors load"] == _triple(tiny["safetensors"]["restore"])
    assert tiny["jaxjob"]["commit"]["n"] > 1  # whiskers drawn from real samples
    fsyncs = bars["fsyncs per commit (strace -f)", "jaxjob"]
    assert fsyncs == (tiny["syncs"]["jaxjob"]["later"],) * 3


def test_the_blocked_bars_are_the_jsons_per_size(peers):
    """Blocked time and commit as measured; CPU per saved MiB is the CPU over the MiB saved."""
    bars = _bars(peers, "blocked")
    for label, (leaves, leaf_bytes) in peers["plan"]["sizes"].items():
        found = peers["raw"]["blocked"][label]
        size = f"{leaves} leaves ({peer_table._size(leaves * leaf_bytes)})"
        assert bars[f"blocked per save, {size}", "jaxjob"] == _triple(found["jaxjob"]["blocked"])
        assert bars[f"blocked per save, {size}", "Orbax defaults"] == _triple(
            found["orbax"]["blocked"]
        )
        commit = bars[f"save to a durable commit, {size}", "raw1 (one file + 2 fsyncs)"]
        assert commit == _triple(found["raw1"]["commit"])
        per_mib = bars[f"CPU per saved MiB, {size}", "jaxjob"]
        assert per_mib == pytest.approx(
            _triple(found["jaxjob"]["cpu"], MIB / (leaves * leaf_bytes))
        )


def test_every_measured_row_of_the_table_is_drawn_with_its_reference(peers):
    """Each row results.json holds, with a number: its value and its reference's are bars of
    one panel, or the reference is a constant: the panel's target line (15 ms, 4 fsyncs) or
    its axis (the workspace)."""
    drawn_as_parts = ("epoch time / not saving", "extra process CPU per epoch")  # raw parts
    not_drawn = ("fsyncs, a new manager's first save",)
    every = [p for group in peer_plots.GROUPS for p in peer_plots.panels(peers, group)]

    def has(panel, value):
        return any(math.isclose(b.median, value) for b in panel.bars)

    checked = 0
    for row in peers["rows"]:
        if row["why"] or any(part in row["figure"] for part in drawn_as_parts + not_drawn):
            continue
        matches = [
            p
            for p in every
            if has(p, row["value"])
            and (
                has(p, row["reference_value"])
                or (row["limit"] is not None and p.limit == pytest.approx(row["limit"]))
                or (row["reference"] == "workspace" and p.unit == "x")
            )
        ]
        assert matches, row
        checked += 1
    assert checked >= 30


def test_the_slowdown_panels_hold_the_epoch_times_and_the_target(peers):
    """The epoch panel draws each loop's epoch time; its target is the minimal writer's + 3 %
    of not saving, the row's own test (slowdown <= the minimal writer's + 3 points)."""
    found = peers["raw"]["slowdown"]
    bars = _bars(peers, "slowdown")
    epoch = "epoch time, saving every epoch"
    for method, label in [
        ("jaxjob", "jaxjob"),
        ("plain", "not saving"),
        ("orbax", "Orbax defaults"),
    ]:
        assert bars[epoch, label] == _triple(found[method]["epoch_s"])
    (panel,) = [p for p in peer_plots.panels(peers, "slowdown") if p.title == epoch]
    plain, minimal = found["plain"]["epoch_s"]["median"], found["minimal"]["epoch_s"]["median"]
    assert panel.limit == pytest.approx(minimal + 0.03 * plain)
    row = next(r for r in peers["rows"] if r["figure"].endswith("epoch time / not saving"))
    assert row["met"] == (found["jaxjob"]["epoch_s"]["median"] <= panel.limit)


def test_the_ratios_are_the_tables(peers):
    """The summary: each row with a target, its ratio and met as the table has them."""
    ratios = peer_plots.ratios(peers)
    rows = [r for r in peers["rows"] if r["met"] is not None]
    assert len(ratios) == len(rows) > 10
    assert {r.met for r in ratios} == {True, False}  # this run meets some and misses some
    for ratio, row in zip(ratios, rows, strict=True):
        assert ratio.met == row["met"] and (ratio.ratio <= ratio.target) == row["met"], row
        if row["unit"] == "%":  # epoch times: (1 + slowdown) over the reference's
            expected = (1 + row["value"]) / (1 + row["reference_value"])
            assert ratio.ratio == pytest.approx(expected), row
        else:
            assert ratio.ratio == pytest.approx(row["ratio"]), row


def test_rows_not_measured_are_listed_not_drawn(peers):
    """A row with no number (torch not installed) is text with its reason; a measured one
    (the NNX resume, measured by nnx_resume.py) is not listed."""
    peers["raw"]["restore"].pop("torch", None)
    lines = peer_plots.not_measured(peers)
    assert not any(line.startswith("one-epoch resume of the NNX transformer") for line in lines)
    assert any("(beside torch.load): torch is not installed" in line for line in lines)
    assert ("full restore, 16 MiB in 4 leaves", "torch.load") not in _bars(peers, "restore")


def test_without_a_peers_entry_the_section_says_so():
    """No "peers" entry (results.json of an issue-11 run): one line, no panel, no ratio."""
    assert peer_plots.caption(None) == peer_plots.NO_PEERS
    assert "--rows issue37" in peer_plots.NO_PEERS
    assert all(peer_plots.panels(None, group) == [] for group in peer_plots.GROUPS)
    assert peer_plots.ratios(None) == [] and peer_plots.not_measured(None) == []


def test_a_run_of_some_groups_draws_those(peers):
    """--rows tiny: the tiny panels, nothing for the groups the run did not measure."""
    peers["raw"] = {"tiny": peers["raw"]["tiny"]}
    assert [g for g in peer_plots.GROUPS if peer_plots.panels(peers, g)] == ["tiny"]
    assert all(r.label.startswith("tiny") for r in peer_plots.ratios(peers))


def _section_output(results):
    """Runs the page's issue-37 cells on ``results``: (printed text, figures drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.close("all")
    drawn = []
    namespace = {"results": results, "plt": plt}
    heading = "Against the physical limit (issue 37's figures)"
    out = io.StringIO()
    show = plt.show
    plt.show = lambda: drawn.extend(plt.figure(n) for n in plt.get_fignums()) or plt.close("all")
    try:
        with contextlib.redirect_stdout(out):
            for cell in paths.docs_cells("performance.md", heading):
                exec(cell, namespace)
    finally:
        plt.show = show
    return out.getvalue(), drawn


def test_the_page_section_without_peers_is_one_line():
    """docs/performance.md's section, on a results.json with no "peers": one line, no plot."""
    text, drawn = _section_output({"storage": {}})
    assert text == peer_plots.NO_PEERS + "\n" and drawn == []


def test_the_page_section_draws_each_group_and_the_ratios(peers):
    """On the fixture: a figure per group and the summary; the unmeasured rows as text."""
    text, drawn = _section_output({"peers": peers})
    assert len(drawn) == len(peer_plots.GROUPS) + 1
    assert text.startswith("2 CPUs") and "not measured: full restore" in text
    assert "torch is not installed" in text  # the fixture's run had no torch
    tiny = drawn[peer_plots.GROUPS.index("tiny")]
    widths = [bar.get_width() for bar in tiny.axes[0].patches]  # milliseconds
    expected = peers["raw"]["tiny"]
    assert widths[0] == pytest.approx(expected["jaxjob"]["commit"]["median"] * 1000)
    assert widths[1] == pytest.approx(expected["safetensors"]["commit"]["median"] * 1000)


def test_the_peer_table_renders_as_before(peers):
    """peer_table.render (now on table.py's formatting) prints the rows as it did."""
    lines = peer_table.render(peers["rows"]).splitlines()
    assert lines[0] == (
        "| figure | jaxjob | reference in the same run | ratio median (min) | target | met |"
    )
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2] == (
        "| transformer loop saving every epoch: epoch time / not saving | +537.5 % "
        "| minimal writer (+62.4 %) | - | <= ref + 3 points | **no** |"
    )
    assert lines[9] == (
        "| CPU per saved MiB (all threads), 56 leaves (0.875 MiB) | 128.12 ms/MiB "
        "| minimal writer (7.54 ms/MiB) | 17.00 (17.00) | <= 2x | **no** |"
    )
    assert lines[27] == (
        "| tiny (10 x 64 KiB) fsyncs per commit (strace -f) | 2 | 4 (4) | 0.50 (0.50) "
        "| <= 1x | yes |"
    )
