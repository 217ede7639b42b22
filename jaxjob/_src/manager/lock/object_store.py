"""The lock record on an object store: every change is conditional on the version read.

A record is read with its version (S3: the ``ETag``; GCS: the generation)
and replaced only while that version stands:

* **created** (no record): S3 ``PutObject`` with ``If-None-Match: *``, GCS
  ``ifGenerationMatch=0``;
* **replaced** (a dead holder's record taken over, one's own renewed): S3
  ``If-Match: <ETag read>``, GCS ``ifGenerationMatch=<generation read>``;
* **deleted** (released): S3 ``DeleteObject`` with ``If-Match``, GCS
  ``ifGenerationMatch``.

When the precondition fails (HTTP 412, or S3's 404 for a replacement of an
object deleted meanwhile, or its 409 for a concurrent conditional write),
another writer changed the record first: :class:`Lost` is raised, unless a
re-read shows that the record is the one this process wrote (a request of
ours retried by the client after its first attempt had landed). fsspec
cannot send these preconditions, so the stores' own clients do: botocore
(which ``jaxjob[s3]`` installs with s3fs) and google-cloud-storage (which
``jaxjob[gcs]`` installs with gcsfs), configured from the same environment
as fsspec; each call is bounded by :func:`jaxjob._src.base.fs.bounded`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from jaxjob._src.base import fs
from jaxjob._src.manager.lock.holder import Holder, encode, parse
from jaxjob._src.manager.lock.record import Change, Lost

__all__ = ["RemoteRecord"]

Version = str | int  # an S3 ETag, a GCS generation


class _Store(Protocol):
    def get(self) -> tuple[bytes | None, Version | None]: ...

    def put(self, data: bytes, version: Version | None) -> None: ...

    def delete(self, version: Version) -> None: ...


class RemoteRecord:
    """The lock object on ``gs://`` or ``s3://``, read and changed conditionally."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._store: _Store = (_S3 if path.startswith("s3://") else _Gcs)(path)

    def read(self) -> Holder | None:
        """The record as it stands (one GET); None if the object is gone."""
        return parse(self._call("a read", self._store.get)[0])

    def change(self, fn: Change, *, create: bool = False) -> Holder | None:
        """Replaces the record by ``fn(record)`` if no one changed it meanwhile; returns it.

        ``fn`` returning its argument itself writes nothing; None deletes the
        record. ``create`` is for the local record's signature: an object
        store has no folders.

        Raises:
            Lost: If another writer changed the record after it was read.
            OSError: If the store failed, or did not answer in time.
        """
        data, version = self._call("a read", self._store.get)
        current = parse(data)
        new = fn(current)
        if new is current:
            return new
        if new is None:
            if version is not None:
                self._call("a conditional delete", lambda: self._store.delete(version))
            return None
        try:
            self._call("a conditional write", lambda: self._store.put(encode(new), version))
        except Lost:
            if self.read() != new:
                raise
        return new

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        return fs.bounded(self.path, f"{what} of the lock", call)


_clients: dict[tuple[str, str], Any] = {}  # (scheme, endpoint) -> the store's client
_clients_lock = threading.Lock()


def _client(scheme: str, path: str, make: Callable[[], Any]) -> Any:
    """One client per store and endpoint (the environment names it, as for fsspec)."""
    key = (scheme, fs.endpoint(path))
    with _clients_lock:
        if key not in _clients:
            _clients[key] = make()
        return _clients[key]


def _split(path: str) -> tuple[str, str]:
    bucket, _, key = path.split("://", 1)[1].partition("/")
    return bucket, key


class _S3:
    """``s3://`` through botocore: ETags, ``If-None-Match`` and ``If-Match``."""

    _GONE = frozenset({"NoSuchKey", "404"})
    _LOST = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}) | _GONE

    def __init__(self, path: str) -> None:
        self.path = path
        self.bucket, self.key = _split(path)

    def _call(self, doing: str, method: str, **kwargs: Any) -> Any:
        """``method`` of the client; S3's error code, or an OSError, on failure."""
        import botocore.exceptions

        try:
            client = _client("s3://", self.path, self._make)
            return getattr(client, method)(Bucket=self.bucket, Key=self.key, **kwargs)
        except botocore.exceptions.ClientError as err:
            code = err.response.get("Error", {}).get("Code")
            if code in self._LOST:
                raise _Refused(code) from err
            raise _failure(self.path, doing, err) from err
        except botocore.exceptions.BotoCoreError as err:
            raise _failure(self.path, doing, err) from err

    def _make(self) -> Any:
        import botocore.config
        import botocore.session

        timeout = fs.storage_timeout_s(self.path)
        config = botocore.config.Config(
            connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 3}
        )
        return botocore.session.get_session().create_client("s3", config=config)

    def get(self) -> tuple[bytes | None, Version | None]:
        try:
            got = self._call("reading", "get_object")
        except _Refused as err:
            if err.code in self._GONE:
                return None, None
            raise _failure(self.path, "reading", err) from err
        return got["Body"].read(), got["ETag"]

    def put(self, data: bytes, version: Version | None) -> None:
        match = {"IfNoneMatch": "*"} if version is None else {"IfMatch": str(version)}
        try:
            self._call("writing", "put_object", Body=data, ContentType="application/json", **match)
        except _Refused as err:
            raise Lost(self.path) from err

    def delete(self, version: Version) -> None:
        try:
            self._call("deleting", "delete_object", IfMatch=str(version))
        except _Refused as err:
            if err.code not in self._GONE:
                raise Lost(self.path) from err


class _Refused(Exception):
    """S3 refused a request for the state of the object (gone, or another version)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class _Gcs:
    """``gs://`` through google-cloud-storage: generations and ``ifGenerationMatch``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.bucket, self.key = _split(path)

    def _call(self, doing: str, call: Callable[[Any], Any], *, gone: bool = True) -> Any:
        """``call(blob)``; None if the object is gone (and ``gone``), Lost for a new generation."""
        import google.auth.exceptions
        from google.api_core import exceptions

        try:
            blob = _client("gs://", self.path, _gcs_client).bucket(self.bucket).blob(self.key)
            return call(blob)
        except exceptions.NotFound as err:
            if not gone:  # the bucket
                raise _failure(self.path, doing, err) from err
            return None
        except exceptions.PreconditionFailed as err:
            raise Lost(self.path) from err
        except (exceptions.GoogleAPIError, google.auth.exceptions.GoogleAuthError) as err:
            raise _failure(self.path, doing, err) from err

    def get(self) -> tuple[bytes | None, Version | None]:
        timeout = fs.storage_timeout_s(self.path)
        got = self._call(
            "reading", lambda blob: (blob.download_as_bytes(timeout=timeout), blob.generation)
        )
        return (None, None) if got is None else got

    def put(self, data: bytes, version: Version | None) -> None:
        generation = 0 if version is None else int(version)
        timeout = fs.storage_timeout_s(self.path)
        self._call(
            "writing",
            lambda blob: blob.upload_from_string(
                data,
                content_type="application/json",
                if_generation_match=generation,
                timeout=timeout,
            ),
            gone=False,
        )

    def delete(self, version: Version) -> None:
        timeout = fs.storage_timeout_s(self.path)
        self._call(
            "deleting", lambda blob: blob.delete(if_generation_match=int(version), timeout=timeout)
        )


def _gcs_client() -> Any:
    """A google-cloud-storage client: Application Default Credentials, as gcsfs uses.

    Reading and writing objects needs no project: without one in the
    environment the client gets a placeholder.
    """
    from google.cloud import storage

    try:
        return storage.Client()
    except OSError:  # "Project was not passed and could not be determined"
        return storage.Client(project="<none>")


def _failure(path: str, doing: str, err: Exception) -> OSError:
    """A store client's error as an ``OSError`` naming the lock and the endpoint."""
    return OSError(f"{doing} the lock {path} at {fs.endpoint(path)} failed: {err}")
