"""Object-store calls: one class of storage errors, and no stuck call holding the exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import paths
import pytest

from jaxjob._src.base import remote


def test_a_client_error_becomes_a_storage_error_naming_the_endpoint(monkeypatch):
    """botocore's EndpointConnectionError leaves bounded() as an OSError naming the endpoint."""
    pytest.importorskip("s3fs")
    exceptions = pytest.importorskip("botocore.exceptions")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    refused = exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k")

    def call() -> None:
        raise refused

    with pytest.raises(remote.StorageError, match=r"127\.0\.0\.1:9 failed a write of 's3://b/k'"):
        remote.bounded("s3://b/k", "a write", call)
    failure = remote.as_storage_error(refused, "s3://b/k", "a write")
    assert isinstance(failure, OSError) and failure.__cause__ is refused


@pytest.mark.parametrize("err", [KeyError("k"), ValueError("v"), FileNotFoundError("f")])
def test_other_errors_pass_as_they_are(err):
    """A caller's mistake or an OSError already is not rewrapped."""
    assert remote.as_storage_error(err, "s3://b/k", "a read") is err


def test_a_storage_timeout_is_a_storage_error_and_a_timeout():
    """StorageTimeoutError is caught by ``except OSError`` and ``except TimeoutError`` alike."""
    assert issubclass(remote.StorageTimeoutError, remote.StorageError)
    assert issubclass(remote.StorageTimeoutError, TimeoutError)


# A thread-pool worker blocked for good (as one waiting on a silent store is), after a storage
# call was abandoned with a 1 s bound: Python's exit would join the worker forever.
STUCK = """
import concurrent.futures, sys, threading
from jaxjob._src.base import remote
pool = concurrent.futures.ThreadPoolExecutor(1)
pool.submit(threading.Event().wait)
remote.abandoned(1.0)
print("ENDING", flush=True)
if sys.argv[1] == "raise":
    raise RuntimeError("the program failed")
"""


@pytest.mark.parametrize(("ending", "status"), [("return", 0), ("raise", 1)])
def test_a_stuck_worker_does_not_hold_the_exit(ending, status):
    """After an abandoned call, the process ends within its bound, with the program's status."""
    env = {**os.environ, "PYTHONPATH": paths.ROOT, "JAX_PLATFORMS": "cpu"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", STUCK, ending], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "ENDING\n", done.stderr[-3000:]
    assert done.returncode == status, done.stderr[-3000:]
    assert "jaxjob: ending the process" in done.stderr
    assert time.monotonic() - started < 30  # the import, then 1 s (the bound), not forever


# The abandoned call returns (the store answered again) before the program ends; a slow but
# finite thread still runs at the exit, and the program ends with its own status.
RECOVERED = """
import sys, threading, time
from jaxjob._src.base import remote
call = threading.Thread(target=time.sleep, args=(0.2,))
call.start()
remote.abandoned(0.5, call)
call.join()
threading.Thread(target=time.sleep, args=(2.0,)).start()
sys.exit(3)
"""


def test_an_exit_is_left_alone_once_the_abandoned_calls_returned():
    """Once every abandoned call returned, the exit is not forced: a slow thread is waited for
    and ``sys.exit(3)`` keeps its status (a forced exit would end with 0 after 1 s)."""
    env = {**os.environ, "PYTHONPATH": paths.ROOT, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", RECOVERED], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr[-3000:]
    assert "jaxjob: ending the process" not in done.stderr
