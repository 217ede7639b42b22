"""jaxjob.hosts: cross-process exchanges on real processes (jaxjob launch on 127.0.0.1)."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import paths
import pytest

import jaxjob
import jaxjob._src.multihost.launch

HERE = Path(paths.JOBS)


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


DEAD_PEER = """
import json, os, signal, sys, time
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
import pytest

import jaxjob
jaxjob.distributed.initialize(heartbeat_timeout_s=int(sys.argv[1]))
jaxjob.hosts.exchange("the start", {}, timeout_s=60)
if jax.process_index() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
start = time.monotonic()
for what, timeout_s in (("the wait the heartbeat expires in", float(sys.argv[2])), ("the next", 2)):
    try:
        jaxjob.hosts.exchange(what, {}, timeout_s=timeout_s)
    except jaxjob.hosts.HostTimeoutError as err:
        record = {"missing": err.missing, "after": time.monotonic() - start, "message": str(err)}
        print("TIMEOUT " + json.dumps(record))
print("EXIT", flush=True)
"""


def test_a_dead_peer_outside_launch_is_named_at_the_next_wait_not_an_abort(tmp_path):
    """Two processes started by hand, one SIGKILLed: the survivor, waiting while the service's
    heartbeat timeout (3 s) passes, raises HostTimeoutError naming it at its own timeout (10 s),
    again at its next wait, and then exits normally: no C++ abort, and no wait at exit for
    the dead process to say it is leaving (it was up to 30 s)."""
    (tmp_path / "job.py").write_text(DEAD_PEER)
    port = jaxjob._src.multihost.launch._free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "job.py"), "3", "10"],
            env={
                **os.environ,
                "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": str(i),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:
        survivor, _ = procs[0].communicate(timeout=120)
        procs[1].wait(timeout=120)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert procs[1].returncode == -signal.SIGKILL
    assert procs[0].returncode == 0, survivor[-4000:]
    assert "Terminating process" not in survivor and "EXIT" in survivor
    assert "had not finished" not in survivor, survivor[-4000:]
    records = [json.loads(line[len("TIMEOUT ") :]) for line in survivor.splitlines()
               if line.startswith("TIMEOUT ")]  # fmt: skip
    assert [r["missing"] for r in records] == [[1], [1]], survivor[-4000:]
    assert records[0]["after"] >= 10
    assert (
        "timed out after 10 s waiting for processes [1] of 2 at the wait the heartbeat expires in"
        in records[0]["message"]
    )
    assert "timed out after 2 s waiting for processes [1] of 2 at the next" in records[1]["message"]


@pytest.mark.parametrize("bad", [0, 2.5, True])
def test_heartbeat_timeout_is_checked(bad):
    """A heartbeat timeout that is not an int >= 1 is refused, naming the value."""
    with pytest.raises(ValueError, match=rf"heartbeat_timeout_s must be an int >= 1 .*got {bad!r}"):
        jaxjob.distributed.initialize(heartbeat_timeout_s=bad)
