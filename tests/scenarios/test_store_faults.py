"""Failing object stores: every error class goes to the save policy; nothing holds the exit.

The stores are real servers on 127.0.0.1 (moto, fake-gcs-server, or a tiny
socket server): SIGSTOPped (a store that stops answering), killed (refused
connections), resetting connections, answering 503, or a name that does not
resolve (``.invalid``). No traffic leaves 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import paths
import pytest
from cloud_servers import StoppableServer

pytestmark = pytest.mark.timeout(180)

TIMEOUT_S = 3.0  # the storage_timeout_s of a child whose store stops answering
# ... and of a child's store while it answers (before the fault; a DNS failure fails at once):
# no call may time out there, even on a loaded machine (a 3 s bound failed a save of epoch 0
# before any fault); from the fault on, the child bounds its calls by TIMEOUT_S again
ERROR_TIMEOUT_S = 30.0
EXIT_MARGIN_S = 5.0  # "a few seconds"


def _child_env(server_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "JAXJOB_"))}
    for key in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([paths.ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(JAX_PLATFORMS="cpu", **server_env)
    return env


@pytest.fixture(params=["s3", pytest.param("gcs", marks=pytest.mark.slow)])
def stoppable_server(request, tmp_path):
    """A store in a process of its own (S3: moto; GCS: fake-gcs-server), ended after the test."""
    server = StoppableServer(request.param, tmp_path)
    try:
        yield server
    finally:
        server.stop()


# Epoch 1 commits; the host task of epoch 2 says READY and waits for the test to stop the
# store; the save of epoch 2 then fails (warned), train returns, the script ends.
PAUSED_JOB = """
import logging, sys, time
import jax.numpy as jnp, jaxjob
logging.basicConfig(level=logging.WARNING)
job = jaxjob.Job()
job.init_group.add(lambda ws: {"x": jnp.zeros(3), "n": 0})
job.epoch_group.add(lambda ws: {"x": ws["x"] + 1})

def host(ws):
    if ws["n"] == 1:
        print("READY", flush=True)
        sys.stdin.readline()
    return {"n": ws["n"] + 1}

job.epoch_group.add(host, jit=False)
jaxjob.epoch_limiter(job, 2)
ckpt = jaxjob.CheckpointManager(PREFIX, storage_timeout_s=TIMEOUT)
runner = jaxjob.JobRunner(job, ckpt)
print("RETURNED", runner.train(jaxjob.Session()), len(runner.save_errors), flush=True)
"""


def test_a_store_that_stops_answering_does_not_hold_the_exit(stoppable_server, tmp_path):
    """SIGSTOP on the store mid-run: the save fails, train returns, the process exits in time."""
    prefix = f"{stoppable_server.bucket}/run-{os.getpid()}-{time.monotonic_ns()}"
    script = PAUSED_JOB.replace("PREFIX", repr(prefix)).replace("TIMEOUT", repr(TIMEOUT_S))
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", script],
            env=_child_env(stoppable_server.env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    log = stderr.read_text
    try:
        assert child.stdout.readline().strip() == "READY", log()
        stoppable_server.pause()
        child.stdin.write("go\n")
        child.stdin.flush()
        returned = child.stdout.readline().split()
        train_returned = time.monotonic()
        assert returned[:2] == ["RETURNED", "2"], log()
        assert int(returned[2]) >= 1  # the save of epoch 2 failed, and was warned
        try:
            child.wait(timeout=TIMEOUT_S + EXIT_MARGIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the process did not exit within {TIMEOUT_S + EXIT_MARGIN_S:g} s of train "
                f"returning: {log()[-3000:]}"
            )
        assert time.monotonic() - train_returned < TIMEOUT_S + EXIT_MARGIN_S
        assert child.returncode == 0, log()[-3000:]
        assert "Unable to write checkpoint for epoch 2" in log()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        stoppable_server.resume()


# A TCP proxy on 127.0.0.1 in front of the session's moto server, run inside the child (so
# that s3fs, botocore and TensorStore all reach it). fail(kind) makes the store fail from then
# on: "refused" closes the port, "reset" answers each connection with RST (SO_LINGER 0),
# "503" answers each request 503; connections open at that moment are reset.
PROXY = """
import os, socket, struct, threading
UPSTREAM = os.environ["UPSTREAM"].split("//")[-1].rsplit(":", 1)
MODE = ["pass"]
conns = []
guard = threading.Lock()
server = socket.create_server(("127.0.0.1", 0))
PORT = server.getsockname()[1]

def rst(s):
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    except OSError:
        pass

def pump(src, dst):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.close()
        except OSError:
            pass

def unavailable(conn):
    try:
        head = b""
        while b"\\r\\n\\r\\n" not in head:
            head += conn.recv(65536) or b"\\r\\n\\r\\n"
        body = b"<Error><Code>ServiceUnavailable</Code><Message>down</Message></Error>"
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\\r\\nConnection: close\\r\\n"
                     b"Content-Length: %d\\r\\n\\r\\n%s" % (len(body), body))
    except OSError:
        pass
    conn.close()

def accept(server):
    while True:
        try:
            client = server.accept()[0]
        except OSError:  # closed: refused from now on
            return
        if MODE[0] == "reset":
            rst(client)
        elif MODE[0] == "503":
            threading.Thread(target=unavailable, args=(client,), daemon=True).start()
        else:
            up = socket.create_connection((UPSTREAM[0], int(UPSTREAM[1])))
            with guard:
                conns.extend((client, up))
            threading.Thread(target=pump, args=(client, up), daemon=True).start()
            threading.Thread(target=pump, args=(up, client), daemon=True).start()

def fail(kind):
    MODE[0] = kind
    if kind == "refused":  # shutdown first: a close alone leaves accept() listening
        LISTENING[0].shutdown(socket.SHUT_RDWR)
        LISTENING[0].close()
    with guard:
        for s in conns:
            rst(s)
        conns.clear()

def heal():
    if MODE[0] == "refused":  # listen again on the same port: the clients keep their endpoint
        LISTENING[0] = socket.create_server(("127.0.0.1", PORT))
        threading.Thread(target=accept, args=(LISTENING[0],), daemon=True).start()
    MODE[0] = "pass"

LISTENING = [server]
threading.Thread(target=accept, args=(server,), daemon=True).start()
os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{PORT}"
"""

# Both policies; epochs 0 and 1 are saved (keep=Last(1) deletes 0), then the store fails at
# the start of epoch 2: its save fails (the lock check, the history, the write), and so do
# retention's listing and the lock's renewal and release.
FAILING_JOB = """
import json, logging, time, jax.numpy as jnp, jaxjob
from jaxjob._src.base.remote import set_storage_timeout
logging.basicConfig(level=logging.WARNING)
CURRENT_DB = [None]
def job():
    j = jaxjob.Job()
    j.init_group.add(lambda ws: {"x": jnp.zeros(3), "n": 0})
    j.epoch_group.add(lambda ws: {"x": ws["x"] + 1})
    def host(ws):
        if ws["n"] == 1:
            fail(KIND)
            # the calls that now wait on the failed store (TensorStore retries a refused
            # connection) wait FAULT_TIMEOUT, not the bound of the healthy store before
            set_storage_timeout(CURRENT_DB[0], FAULT_TIMEOUT)
        return {"n": ws["n"] + 1}
    j.epoch_group.add(host, jit=False)
    jaxjob.epoch_limiter(j, 2)
    return j
out = {}
for policy in ("warn", "raise"):
    started = time.monotonic()
    CURRENT_DB[0] = PREFIX + "/" + policy
    ckpt = jaxjob.CheckpointManager(  # saves done before the fault: none waits on it
        CURRENT_DB[0], keep=jaxjob.keep.Last(1), storage_timeout_s=TIMEOUT, async_save=False
    )
    runner = jaxjob.JobRunner(job(), ckpt, on_save_error=policy)
    try:
        out[policy] = {"returned": runner.train(jaxjob.Session())}
    except Exception as err:
        out[policy] = {"raised": type(err).__name__, "text": str(err)}
    ckpt.close()
    out[policy]["errors"] = [[e.epoch, str(e)] for e in runner.save_errors]
    out[policy]["seconds"] = time.monotonic() - started
    heal()  # the store answers again for the next run
print("OUT", json.dumps(out), flush=True)
"""


@pytest.mark.parametrize(
    "kind",
    [
        "refused",
        pytest.param("reset", marks=pytest.mark.slow),
        pytest.param("503", marks=pytest.mark.slow),
    ],
)
def test_every_store_error_goes_to_the_save_policy(cloud_servers, s3_prefix, kind):
    """Refused, reset, 503 mid-run: "warn" logs and counts each save; "raise" raises it.

    Every path meets the failure: the lock's check and renewal, the history
    file, the save, retention's listing, and the lock's release at ``close``.
    """
    env = _child_env(
        {
            "UPSTREAM": os.environ["AWS_ENDPOINT_URL"],
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_MAX_ATTEMPTS": "2",  # the client's own retries: short
            "EPATH_USE_TF": "false",
        }
    )
    script = PROXY + FAILING_JOB.replace("KIND", repr(kind)).replace("PREFIX", repr(s3_prefix))
    script = script.replace("FAULT_TIMEOUT", repr(TIMEOUT_S)).replace(
        "TIMEOUT", repr(ERROR_TIMEOUT_S)
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.split("OUT ", 1)[1])
    warned, raised = out["warn"], out["raise"]
    assert warned.get("returned") == 2, out
    # epochs 0 and 1 were saved (synchronously) before the store failed
    assert [epoch for epoch, _ in warned["errors"]] == [2], out
    assert raised.get("raised") == "CheckpointSaveError", out
    assert "Unable to write checkpoint for epoch 2" in done.stderr  # the policy's warning


def test_a_store_name_that_does_not_resolve_is_a_storage_error(tmp_path):
    """An endpoint under .invalid: train raises an OSError naming the endpoint, not the client's."""
    env = _child_env(
        {
            "AWS_ENDPOINT_URL": "http://jaxjob-test.invalid:9",  # never resolves (RFC 6761)
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_MAX_ATTEMPTS": "1",
            "EPATH_USE_TF": "false",
        }
    )
    script = """
import jax.numpy as jnp, jaxjob
job = jaxjob.Job()
job.init_group.add(lambda ws: {"x": jnp.zeros(3)})
jaxjob.epoch_limiter(job, 1)
ckpt = jaxjob.CheckpointManager("s3://bucket/run", storage_timeout_s=TIMEOUT)
try:
    jaxjob.JobRunner(job, ckpt).train(jaxjob.Session())
except OSError as err:
    print("RAISED", type(err).__name__, err)
"""
    done = subprocess.run(
        [sys.executable, "-c", script.replace("TIMEOUT", repr(ERROR_TIMEOUT_S))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.startswith("RAISED StorageError "), done.stdout + done.stderr[-3000:]
    assert "jaxjob-test.invalid" in done.stdout
