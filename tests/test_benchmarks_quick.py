"""benchmarks/run.py --rows (issue 37's peers): every row printed with its number and reference."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import paths
import pytest

ROOT = Path(paths.ROOT)
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import peer_run  # noqa: E402
import peer_table  # noqa: E402

NUMBER = r"[-+]?\d+(\.\d+)?( ms| s| ms/MiB|x| %)?"
VALUE = re.compile(f"^{NUMBER}$")
REFERENCE = re.compile(rf"^.+ \({NUMBER}\)$")
RATIO = re.compile(r"^-?\d+\.\d\d \(-?\d+\.\d\d\)$")


def _run(tmp_path, *args, timeout=600):
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run.py"), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout, json.loads(out.read_text())["peers"]["rows"]


def _table(stdout):
    """The Markdown table's data rows, as lists of cells."""
    lines = [line for line in stdout.splitlines() if line.startswith("| ")][1:]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def _check_measured(stdout, rows, unmeasured=lambda row: False):
    """Each row but the ``unmeasured`` has a number, a reference with its number, a ratio."""
    table = _table(stdout)
    assert len(table) == len(rows) > 0
    for cells, row in zip(table, rows, strict=True):
        if unmeasured(row):
            assert cells[1].startswith("not measured: ") and row["ratio"] is None, cells
            continue
        figure, value, reference, ratio = cells[:4]
        assert VALUE.match(value), cells
        assert REFERENCE.match(reference), cells
        assert row["value"] is not None and row["reference_value"] is not None, row
        if row["unit"] == "%":  # a slowdown against a third figure: no ratio
            assert ratio == "-" and row["ratio"] is None, cells
        else:
            assert RATIO.match(ratio) and row["ratio_min"] is not None, cells


def test_tiny_rows_quick(tmp_path):
    """--quick --rows tiny prints the tiny rows, each with jaxjob's number and the reference's."""
    pytest.importorskip("safetensors", reason="the tiny rows compare with safetensors")
    stdout, rows = _run(tmp_path, "--quick", "--rows", "tiny", timeout=300)
    assert [r for r in rows if "fsyncs" in r["figure"]], "no fsync-count rows"
    traced = peer_run.strace_usable()
    _check_measured(stdout, rows, lambda row: not traced and "strace" in row["figure"])
    assert "tiny" in stdout and "not measured: this run" not in stdout


def test_rows_rejects_an_unknown_group(tmp_path):
    """--rows names what it got and the groups it takes."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run.py"), "--rows", "tiny,bogus"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "--rows: got 'bogus'" in proc.stderr and "issue37" in proc.stderr


def test_strace_counts_each_saves_fsyncs_on_every_thread(tmp_path):
    """count_calls cuts a real strace -f output at the marks and counts fsyncs on all threads."""
    if not peer_run.strace_usable():
        pytest.skip("strace is missing or may not trace a child here")
    script = (
        "import os, threading\n"
        "def sync(n):\n"
        "    fd = os.open(os.path.join(os.environ['D'], 'f'), os.O_CREAT | os.O_WRONLY)\n"
        "    [os.fsync(fd) for _ in range(n)]\n"
        "    os.fdatasync(fd)\n"
        "    os.close(fd)\n"
        "for step, n in enumerate([2, 5]):\n"
        "    os.access(f'/jaxjob-bench-mark/m/{step}/start', os.F_OK)\n"
        "    t = threading.Thread(target=sync, args=(n,)); t.start(); t.join()\n"
        "    os.access(f'/jaxjob-bench-mark/m/{step}/end', os.F_OK)\n"
        "sync(7)\n"  # outside any save: not counted
    )
    trace = tmp_path / "trace.txt"
    calls = "trace=access,faccessat,faccessat2,fsync,fdatasync"
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), "-e", calls, sys.executable, "-c", script],
        check=True,
        timeout=60,
        env={**os.environ, "D": str(tmp_path)},
    )
    assert peer_run.count_calls(trace.read_text()) == {"m": [3, 6]}


def test_rows_not_measured_say_why():
    """Rows benchmarks/ cannot measure yet carry no number and say why."""
    rows = peer_table.build_rows(dict.fromkeys(peer_run.GROUPS, {}), _plan())
    assert rows and all(r["value"] is None and r["why"].startswith("not measured") for r in rows)
    assert all(r["ratio"] is None and r["met"] is None for r in rows)
    assert "not measured" in peer_table.render(rows)


def _plan():
    sys.path.insert(0, str(BENCHMARKS))
    import run

    return json.loads(json.dumps(run.QUICK["peers"]))  # as results.json holds it


@pytest.mark.slow
def test_every_issue37_row_quick(tmp_path):
    """--quick --rows issue37 prints every row of issue 37's table: measured, or saying why not."""
    pytest.importorskip("safetensors", reason="the rows compare with safetensors")
    stdout, rows = _run(tmp_path, "--quick", "--rows", "issue37")
    not_yet = {figure for figure, _, _ in peer_table.NOT_MEASURED}
    traced = peer_run.strace_usable()
    try:
        import torch  # noqa: F401

        torch_missing = False
    except ImportError:
        torch_missing = True

    def unmeasured(row):
        return (
            row["figure"] in not_yet
            or (torch_missing and row["reference"] == "torch.load")
            or (not traced and "strace" in row["figure"])
        )

    _check_measured(stdout, rows, unmeasured)
    # slowdown, 2 sizes of blocked, tiny, restore, 2 sizes of rerun, and those not measured yet
    assert len(rows) == 5 + 2 * 8 + 12 + 5 + 2 * 2 + len(not_yet)
