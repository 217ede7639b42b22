"""The `long` tier names tests that exist: a renamed test must not leave a stale entry."""

import os
import subprocess
import sys

import long_tier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_long_test_is_collected_and_marked():
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--collect-only",
            "-m",
            "long",
            "-n",
            "0",
            "-p",
            "no:randomly",
            "tests",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    collected = {line.split("@")[0] for line in listed.stdout.splitlines() if "::" in line}
    assert collected == set(long_tier.LONG_TESTS), (
        f"in LONG_TESTS but not collected: {sorted(set(long_tier.LONG_TESTS) - collected)}; "
        f"marked long but not listed: {sorted(collected - set(long_tier.LONG_TESTS))}"
    )
