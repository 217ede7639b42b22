"""jaxjob launch: environment, output prefixes, exit codes, stopping the others on failure."""

import os
import signal
import subprocess
import sys
import time

import pytest

import jaxjob._src.multihost.launch
import jaxjob.cli
from jaxjob._src.manager import lock


def _launch(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "jaxjob.cli", "launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_prefixes_and_environment():
    """Each process sees its id, the count and a coordinator; its lines are prefixed."""
    code = (
        "import os; e = os.environ; print(e['JAXJOB_PROCESS_ID'], e['JAXJOB_NUM_PROCESSES'], "
        "e['JAXJOB_COORDINATOR'].startswith('127.0.0.1:'))"
    )
    proc = _launch("-n", "3", "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"[process={i}] {i} 3 True" for i in range(3)]


def test_first_failure_status_is_returned_and_others_stopped():
    """A process exiting 3 makes launch return 3 and stop a process that would run for minutes."""
    code = (
        "import os, sys, time; i = int(os.environ['JAXJOB_PROCESS_ID']); "
        "sys.exit(3) if i == 1 else time.sleep(600)"
    )
    start = time.time()
    proc = _launch("-n", "2", "--", sys.executable, "-c", code)
    assert proc.returncode == 3
    assert time.time() - start < 60


def test_signal_death_maps_to_128_plus_signal():
    """A process killed by SIGKILL gives status 137."""
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = _launch("-n", "1", "--", sys.executable, "-c", code)
    assert proc.returncode == 137
    assert "process 0 of 1 failed first: it was killed by signal 9 (SIGKILL)" in proc.stderr


def _gone(pid):
    """Whether ``pid`` has exited: no such process, or a zombie its new parent has not reaped."""
    fields = lock.stat_fields(pid)
    return fields is None or fields[0] in lock.EXITED_STATES


SLEEPER = """
import os, sys, time
print("READY", os.environ["JAXJOB_PROCESS_ID"], os.getpid(), flush=True)
time.sleep(600)
"""


def test_sigkill_of_the_launcher_ends_every_process(tmp_path):
    """kill -9 of `jaxjob launch` (no handler can run) still ends its processes within seconds."""
    (tmp_path / "job.py").write_text(SLEEPER)
    argv = [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2", "--"]
    proc = subprocess.Popen(
        argv + [sys.executable, str(tmp_path / "job.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        ready = [proc.stdout.readline().split() for _ in range(2)]
        pids = [int(line[-1]) for line in ready]
        assert sorted(line[:3] for line in ready) == [
            ["[process=0]", "READY", "0"],
            ["[process=1]", "READY", "1"],
        ]
        assert not any(_gone(pid) for pid in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in pids):
            assert time.monotonic() < deadline, f"processes {pids} outlived the launcher by 10 s"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


STUBBORN = """
import os, signal, sys, time
i, ready = int(os.environ["JAXJOB_PROCESS_ID"]), sys.argv[1]
if i == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops it
    print("PID", os.getpid(), flush=True)
    open(ready, "w").close()
    time.sleep(600)
while not os.path.exists(ready):
    time.sleep(0.01)
sys.exit(1)
"""


def test_first_failure_is_named_and_the_others_are_killed_after_the_grace(tmp_path):
    """Process 1 exits 1: stderr names it, process 0 (ignoring SIGTERM) is SIGKILLed after
    GRACE_S, and launch returns 1."""
    (tmp_path / "job.py").write_text(STUBBORN)
    start = time.monotonic()
    proc = _launch("-n", "2", "--", sys.executable, str(tmp_path / "job.py"), str(tmp_path / "r"))
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    grace = jaxjob._src.multihost.launch.GRACE_S
    assert (
        "jaxjob launch: process 1 of 2 failed first: it exited with status 1; stopping "
        f"processes [0] (SIGTERM, then SIGKILL after {grace:g} s)"
    ) in proc.stderr
    assert grace <= elapsed < 60
    pid = int(proc.stdout.split("[process=0] PID ")[1].split()[0])
    assert _gone(pid)


def test_distributed_initialize_joins_under_launch():
    """Two processes x 2 devices form one jax.distributed job of 4 devices."""
    code = (
        "import jaxjob, jax; jaxjob.distributed.initialize(); "
        "print(jax.process_index(), jax.process_count(), jax.device_count())"
    )
    proc = _launch("-n", "2", "--devices-per-process", "2", "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(
        line
        for line in proc.stdout.splitlines()
        if "] " in line and line.split("] ")[1][:1].isdigit()
    ) == [
        "[process=0] 0 2 4",
        "[process=1] 1 2 4",
    ]


SLOW_DISCONNECT = """
import logging, sys, time
logging.basicConfig(level=logging.DEBUG, format="LOG %(name)s %(message)s", stream=sys.stdout)
import jax, jaxjob
disconnect = jax.distributed.shutdown
def slow_disconnect():  # process 1 disconnects 0.5 s after it said it leaves
    time.sleep(0.5)
    disconnect()
jax.distributed.shutdown = slow_disconnect
jaxjob.distributed.initialize()
print("joined", jax.process_index(), flush=True)
"""


def test_process_0_leaves_once_the_others_have_disconnected(tmp_path):
    """Process 0 keeps the service up until a late disconnect arrives, then leaves at once.

    Were the service gone first, process 1 would abort ("Failed to disconnect from
    coordination service"); were the wait a fixed pause, the debug line of a wait that
    ran out would not tell it apart: the line is absent because the disconnect ended it.
    """
    (tmp_path / "exit.py").write_text(SLOW_DISCONNECT)
    proc = _launch("-n", "2", "--", sys.executable, str(tmp_path / "exit.py"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[process=1] joined 1" in proc.stdout and "[process=0] joined 0" in proc.stdout
    assert "Failed to disconnect" not in proc.stdout + proc.stderr
    assert "still connected" not in proc.stdout


def test_empty_command_is_a_usage_error(capsys):
    """launch with no command returns 2 and says what is missing."""
    assert jaxjob.cli.main(["launch", "-n", "2", "--"]) == 2
    assert "command is empty" in capsys.readouterr().err


@pytest.mark.parametrize("n", ["0", "-1"])
def test_bad_process_count(capsys, n):
    """A process count below 1 returns 2 naming the values."""
    assert jaxjob.cli.main(["launch", "-n", n, "--", "true"]) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_initialize_reads_the_jax_variables_of_another_launcher():
    """Another launcher sets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID."""
    code = (
        "import jax, jaxjob; jax.config.update('jax_cpu_collectives_implementation', 'gloo'); "
        "jaxjob.distributed.initialize(); print('JOINED', jax.process_index(), jax.process_count())"
    )
    port = jaxjob._src.multihost.launch._free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={
                **os.environ,
                "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": str(i),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [out.strip().splitlines()[-1] for out, _ in outputs] == ["JOINED 0 2", "JOINED 1 2"]


LOGGING = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s", stream=sys.stdout)
import jaxjob
jaxjob.distributed.initialize()
import jax.numpy as jnp
ckpt = jaxjob.CheckpointManager(sys.argv[1])
ckpt.save(0, {"x": jnp.ones(2)})
ckpt.close()
"""


def test_every_jaxjob_log_line_names_its_process(tmp_path):
    """In a 2-process job each jaxjob log line carries [process=i] of the process that wrote it."""
    (tmp_path / "log.py").write_text(LOGGING)
    proc = _launch("-n", "2", "--", sys.executable, str(tmp_path / "log.py"), str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if " LOG jaxjob." in line]
    assert {line.split()[0] for line in lines} == {"[process=0]", "[process=1]"}
    for line in lines:
        launcher_prefix, _, _, *message = line.split()
        assert message[0] == launcher_prefix, line


FORWARDED = """
import os, signal, sys, time
i = os.environ["JAXJOB_PROCESS_ID"]
signal.signal(signal.SIGTERM, lambda s, f: (print("GOT SIGTERM", i, flush=True), sys.exit(75)))
print("READY", i, flush=True)
time.sleep(120)
"""


def test_sigterm_to_the_launcher_reaches_every_process(tmp_path):
    """A scheduler's SIGTERM to `jaxjob launch` is passed on to each process; their status comes
    back (75 here), well before the processes' 120 s sleep ends."""
    (tmp_path / "job.py").write_text(FORWARDED)
    argv = [sys.executable, "-m", "jaxjob.cli", "launch", "-n", "2", "--"]
    proc = subprocess.Popen(
        argv + [sys.executable, str(tmp_path / "job.py")], stdout=subprocess.PIPE, text=True
    )
    ready = [proc.stdout.readline() for _ in range(2)]
    assert sorted(ready) == ["[process=0] READY 0\n", "[process=1] READY 1\n"]
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75 and time.monotonic() - start < 30
    assert set(rest.splitlines()) == {"[process=0] GOT SIGTERM 0", "[process=1] GOT SIGTERM 1"}
