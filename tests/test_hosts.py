"""jaxjob.hosts: cross-process exchanges on real processes (jaxjob launch on 127.0.0.1)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import jaxjob

HERE = Path(__file__).parent


def _launch(n, *args):
    argv = [sys.executable, "-m", "jaxjob.cli", "launch", "-n", str(n), "--", sys.executable]
    proc = subprocess.run(
        argv + [str(HERE / "mp_hosts.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _records(output, tag):
    found = {}
    for line in output.splitlines():
        match = re.match(rf"\[process=\d+\] {tag} (.*)", line)
        if match:
            record = json.loads(match.group(1))
            found[record["process"]] = record
    return found


def test_one_process_gets_its_own_payload_back():
    """Alone, exchange returns [payload] and decide returns fn's value without waiting."""
    assert jaxjob.hosts.exchange("alone", {"x": 1}, timeout_s=0.001) == [{"x": 1}]
    assert jaxjob.hosts.decide("alone", lambda: [1, 2], timeout_s=0.001) == [1, 2]


def test_every_process_receives_every_payload_in_process_order():
    """Three processes, 12 exchanges: each gets every process's payload of that call, in order."""
    status, output = _launch(3, 13)
    assert status == 0, output[-4000:]
    results = _records(output, "RESULT")
    assert sorted(results) == [0, 1, 2], output[-4000:]
    expected = [[(call, p) for p in range(3)] for call in range(12)]
    for record in results.values():
        assert [[tuple(post) for post in call] for call in record["seen"]] == expected


def test_timeout_names_the_process_that_never_arrived():
    """Process 0 (the coordinator's host) skips an exchange: the other two raise, naming it."""
    late = 0
    status, output = _launch(3, 4, late)
    assert status == 4, output[-4000:]
    timeouts = _records(output, "TIMEOUT")
    assert sorted(timeouts) == sorted({0, 1, 2} - {late}), output[-4000:]
    for record in timeouts.values():
        assert record["missing"] == [late]
        assert (
            f"timed out after 3 s waiting for processes [{late}] of 3 at the last call"
            in (record["message"])
        )
