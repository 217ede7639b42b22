"""The README's main job: examples/digits.py trains, is idempotent when re-run, and continues."""

import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "examples", "digits.py")


def _digits(*args):
    proc = subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_digits_trains_resumes_and_continues(tmp_path):
    """Epochs print; a re-run does nothing new; a larger --epochs continues."""
    ckpt = str(tmp_path / "digits")
    first = _digits("--epochs", "3", "--ckpt-dir", ckpt)
    assert [line.split()[1] for line in first.splitlines() if line.startswith("epoch")] == [
        "1",
        "2",
        "3",
    ]
    assert "done: epoch 3" in first
    again = _digits("--epochs", "3", "--ckpt-dir", ckpt)
    assert not any(line.startswith("epoch") for line in again.splitlines())
    assert (
        again.split("test accuracy")[1].split(",")[0]
        == first.split("test accuracy")[1].split(",")[0]
    )
    more = _digits("--epochs", "4", "--ckpt-dir", ckpt)
    assert [line.split()[1] for line in more.splitlines() if line.startswith("epoch")] == ["4"]
    final_accuracy = float(more.split("test accuracy")[1].split(",")[0])
    assert final_accuracy > 0.8
