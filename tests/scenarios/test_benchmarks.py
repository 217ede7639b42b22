"""benchmarks/run.py --quick: every row of the table is measured (not a timed test)."""

import json
import subprocess
import sys
from pathlib import Path

import paths
import pytest

ROOT = Path(paths.ROOT)


@pytest.mark.slow
def test_quick_benchmark_prints_every_row(tmp_path):
    """--quick runs every benchmark and prints a table with a value for each of its 56 rows."""
    for module in ("torch", "safetensors"):  # the storage rounds compare with them
        pytest.importorskip(module, reason="needs the [bench] extra: pip install -e '.[bench]'")
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 56
    assert [r["figure"] for r in rows if r["value"] is None or r["ratio"] is None] == []
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 56 and "missing" not in proc.stdout
