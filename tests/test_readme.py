"""The README's example runs as written."""

import os
import re
import subprocess
import sys

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def test_readme_example_runs_and_resumes(tmp_path):
    """The 20-line example trains 20 epochs; re-running it does nothing new."""
    with open(README) as f:
        text = f.read()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    code += "\nprint('LAST', last_epoch, float(params['w'][0]))\n"
    outs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(proc.stdout.split("LAST")[1].split())
    assert outs[0][0] == outs[1][0] == "20"
    assert outs[0][1] == outs[1][1]
    assert abs(float(outs[0][1]) - 1.0) < 0.05  # learns w = [1, 1, 1]
