"""Real multi-process jobs (gloo on 127.0.0.1, no mocks): crash, failed save, late peer, topologies.

Every job is ``mp_job.py`` run by ``jaxjob launch``; each process prints one
JSON line, which these tests compare.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import paths
import pytest

HERE = Path(paths.JOBS)


def _run(argv, *, env=None, timeout=180):
    start = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def launch(n, devices, script, *args, opts=None, timeout=180):
    """Runs ``script`` on ``n`` processes x ``devices`` devices: (status, output, seconds)."""
    argv = [sys.executable, "-m", "jaxjob.cli", "launch", "-n", str(n)]
    argv += ["--devices-per-process", str(devices), "--", sys.executable, str(HERE / script)]
    return _run(
        argv + [str(a) for a in args], env={"MP_JOB": json.dumps(opts or {})}, timeout=timeout
    )


def lines(output, tag):
    """The JSON of each ``tag`` line, by process."""
    found = {}
    for line in output.splitlines():
        match = re.match(rf"(\[process=\d+\] )?{tag} (.*)", line)
        if match:
            record = json.loads(match.group(2))
            found[record["process"]] = record
    return found


def committed(prefix):
    return sorted(
        p.name for p in Path(prefix).iterdir() if p.name.startswith("local.") and "-" not in p.name
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 2-process x 2-device run of 4 epochs."""
    prefix = tmp_path_factory.mktemp("reference")
    status, output, _ = launch(2, 2, "mp_job.py", prefix, 4)
    assert status == 0, output[-4000:]
    return lines(output, "RESULT")


def test_sigkill_mid_epoch_then_relaunch_ends_exactly_as_uninterrupted(tmp_path, reference):
    """Process 1 SIGKILLs itself in epoch 3; relaunching both resumes and ends bitwise equal."""
    status, output, _ = launch(2, 2, "mp_job.py", tmp_path, 4, opts={"kill": [3, 1]})
    assert status == 128 + 9, output[-4000:]
    assert "local.3" not in committed(tmp_path)
    status, output, _ = launch(2, 2, "mp_job.py", tmp_path, 4)
    assert status == 0, output[-4000:]
    resumed = lines(output, "RESULT")
    for process in (0, 1):
        assert resumed[process]["digest"] == reference[process]["digest"]
        assert resumed[process]["cursor"] == [1000 * process + 4, 4]  # its own cursor came back
        assert resumed[process]["last"] == 4 and resumed[process]["w_sharding"]
    assert committed(tmp_path) == [f"local.{e}" for e in range(5)]


def test_save_failing_on_one_process_is_logged_by_every_process(tmp_path, reference):
    """Under "warn", both processes log the failure of process 1's write and go on; process 0
    learns of it at the save's barrier at once (not after its write timeout of 60 s)."""
    opts = {"fail": [2, 1], "timeout_s": 30}
    status, output, _ = launch(2, 2, "mp_job.py", tmp_path, 4, opts=opts)
    assert status == 0, output[-4000:]
    results = lines(output, "RESULT")
    warning = "Unable to write checkpoint for epoch 2: saving checkpoint epoch 2"
    for process in (0, 1):
        assert results[process]["save_errors"] == [2]
        assert results[process]["error_processes"] == [[0, 1]]
        assert results[process]["digest"] == reference[process]["digest"]
        logged = [
            line
            for line in output.splitlines()
            if f"[process={process}]" in line and warning in line
        ]
        assert (
            len(logged) == 1 and "process 1: OSError: injected: disk full on process 1" in logged[0]
        )
        assert "write failed on another process" in logged[0] and "Timed out" not in logged[0]
    assert committed(tmp_path) == ["local.0", "local.1", "local.3", "local.4"]


def test_access_denied_on_one_process_fails_that_save_on_every_process(tmp_path, reference):
    """A metadata handler reporting the checkpoints as not accessible on process 1 at epoch 2
    fails that save on both processes, naming process 1; the other epochs commit."""
    status, output, _ = launch(2, 2, "mp_job.py", tmp_path, 4, opts={"deny": [2, 1]})
    assert status == 0, output[-4000:]
    results = lines(output, "RESULT")
    for process in (0, 1):
        assert results[process]["save_errors"] == [2]
        assert results[process]["error_processes"] == [[1]]
        assert results[process]["digest"] == reference[process]["digest"]
        logged = [
            line
            for line in output.splitlines()
            if f"[process={process}]" in line and "Unable to write checkpoint for epoch 2" in line
        ]
        assert len(logged) == 1 and "failed on processes [1]" in logged[0]
        assert "PermissionError: the metadata handler reports the checkpoints" in logged[0]
    assert committed(tmp_path) == ["local.0", "local.1", "local.3", "local.4"]


def test_per_process_stats_show_which_process_dominated(reference):
    """Each save's report has every process's duration and bytes and names the slowest."""
    for process in (0, 1):
        stats = reference[process]["last_save_stats"]
        hosts = stats["hosts"]
        assert [h["process"] for h in hosts] == [0, 1]
        assert all(h["bytes"] > 0 and h["duration_s"] > 0 for h in hosts)
        assert stats["bytes"] == sum(h["bytes"] for h in hosts)
        slowest = max(hosts, key=lambda h: h["duration_s"])
        assert stats["slowest_process"] == slowest["process"]
        assert stats["duration_s"] == slowest["duration_s"]
    assert reference[0]["last_save_stats"] == reference[1]["last_save_stats"]


def test_save_failing_on_one_process_raises_on_every_process(tmp_path):
    """Under "raise", both processes raise the same CheckpointSaveError naming process 1, which
    ended process 0's wait at the save's barrier (no write timeout)."""
    opts = {"fail": [2, 1], "timeout_s": 30, "policy": "raise"}
    status, output, _ = launch(2, 2, "mp_job.py", tmp_path, 4, opts=opts)
    assert status == 3, output[-4000:]
    raised = [line for line in output.splitlines() if "] RAISED " in line]
    assert sorted(line[:11] for line in raised) == ["[process=0]", "[process=1]"]
    for line in raised:
        assert "epoch 2" in line and "failed on processes [0, 1]" in line
        assert "process 1: OSError: injected: disk full on process 1" in line
        assert "write failed on another process" in line and "Timed out" not in line


def test_peer_that_never_arrives_times_out_naming_it(tmp_path):
    """Process 1 hangs in epoch 2; process 0 raises within timeout_s=5, naming process 1."""
    status, output, seconds = launch(
        2, 2, "mp_job.py", tmp_path, 4, opts={"hang": [2, 1], "timeout_s": 5}
    )
    assert status == 4, output[-4000:]
    timeouts = [line for line in output.splitlines() if "[process=0] TIMEOUT" in line]
    assert len(timeouts) == 1, output[-4000:]
    assert "TIMEOUT [1] " in timeouts[0]
    waited = float(timeouts[0].split("TIMEOUT [1] ")[1].split()[0])
    assert 5.0 <= waited < 8.0  # timeout_s after it reached the wait, plus the epoch's bookkeeping
    assert (
        "timed out after 5 s waiting for processes [1] of 2 at the stop conditions of epoch 2"
        in timeouts[0]
    )
    assert seconds < 90  # the hung process sleeps 120 s: the job ended by the timeout


def test_restore_two_by_four_on_other_topologies(tmp_path):
    """A 2 process x 4 device checkpoint restores exactly on 1x1, 1x8, 4x2, also under a
    host-memory budget (leaf by leaf); resumes on 4x2 under that budget."""
    status, output, _ = launch(2, 4, "mp_job.py", tmp_path, 2)
    assert status == 0, output[-4000:]
    saved = lines(output, "RESULT")[0]["digest"]
    for devices in (1, 8):
        flags = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
        status, output, _ = _run([sys.executable, str(HERE / "mp_restore.py"), tmp_path], env=flags)
        assert status == 0, output[-4000:]
        restored = lines(output, "RESTORED")[0]
        assert restored["digest"] == saved and restored["w_shards"] == devices
        assert restored["budget_digest"] == saved
        assert restored["cursor"] == [2, 2]
        assert (
            "saved by 2 processes but this job has 1; pass host_map" in restored["host_map_error"]
        )
    status, output, _ = launch(4, 2, "mp_restore.py", tmp_path)
    assert status == 0, output[-4000:]
    restored = lines(output, "RESTORED")
    for process in range(4):
        assert restored[process]["digest"] == saved and restored[process]["w_sharding"]
        assert restored[process]["budget_digest"] == saved
        assert restored[process]["cursor"] == [1000 * (process % 2) + 2, 2]
    opts = {"host_map": "mod2", "max_host_bytes": 64}  # the resume reads leaf by leaf
    status, output, _ = launch(4, 2, "mp_job.py", tmp_path, 3, opts=opts)
    assert status == 0, output[-4000:]
    resumed = lines(output, "RESULT")
    for process in range(4):
        assert resumed[process]["last"] == 3 and resumed[process]["w_sharding"]
        assert resumed[process]["cursor"] == [1000 * (process % 2) + 3, 3]


def _full_metadata_file(prefix):
    """``jaxjob_metadata.jsonl`` is /dev/full: process 0's writes of it fail with ENOSPC."""
    os.symlink("/dev/full", Path(prefix) / "jaxjob_metadata.jsonl")


def test_metadata_enospc_raises_on_every_process(tmp_path):
    """Under "raise", process 0's ENOSPC on the metadata file raises the same error everywhere."""
    _full_metadata_file(tmp_path)
    opts = {"timeout_s": 30, "policy": "raise"}
    status, output, _ = launch(2, 2, "mp_job.py", tmp_path, 4, opts=opts)
    assert status == 3, output[-4000:]
    raised = [line for line in output.splitlines() if "] RAISED " in line]
    assert sorted(line[:11] for line in raised) == ["[process=0]", "[process=1]"], output[-4000:]
    assert len({line[12:] for line in raised}) == 1, raised  # the same error
    for line in raised:
        assert "epoch 0" in line and "jaxjob_metadata.jsonl" in line and "processes [0]" in line
        assert "No space left on device" in line
    assert "HostTimeoutError" not in output


def test_metadata_enospc_is_counted_by_every_process_under_warn(tmp_path, reference):
    """Under "warn", every process counts each failed metadata record and training ends alike."""
    _full_metadata_file(tmp_path)
    status, output, _ = launch(2, 2, "mp_job.py", tmp_path, 4, opts={"timeout_s": 30})
    assert status == 0, output[-4000:]
    results = lines(output, "RESULT")
    for process in (0, 1):
        assert results[process]["save_errors"] == [0, 1, 2, 3, 4]
        assert results[process]["digest"] == reference[process]["digest"]
    assert committed(tmp_path) == [f"local.{e}" for e in range(5)]
