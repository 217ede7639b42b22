"""jaxjob's one handle on Orbax: open, save_async, restore, drain and close checkpoints.

Every Orbax checkpointer jaxjob uses is one :class:`CheckpointIO`: a node
writer's and its reader's (``manager/``), ``jaxjob.restore``'s, ``verify``'s.
It builds the checkpointer and the composite handler of a
``<node>.<epoch>/`` directory (items ``state``, ``outputs``, ``jaxjob``),
starts saves, waits for them (within an object store's bound), reads leaves
and closes. The layers above import it and never Orbax: the uses of Orbax's
internals stay behind it, in ``internals.orbax_*``.

The codec (:mod:`jaxjob._src.checkpoint.codec`) is chosen once, by whoever
makes the handle: a private codec makes this process the only one taking
part in its saves and reads.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxjob._src.base import faults, fs
from jaxjob._src.checkpoint import checksum, codec, settled
from jaxjob._src.checkpoint.manifest import MANIFEST_FILE, MANIFEST_ITEM, OUTPUTS, STATE, Manifest
from jaxjob._src.internals import orbax_checkpointer, orbax_commit, orbax_handlers

__all__ = ["PYTREE_OPTIONS", "CheckpointIO", "composite_handler", "save_args"]

# No zstd: weights barely compress (random float32 not at all, trained bf16/f32 by a few
# percent), while compressing costs a CPU pass on save and on restore (benchmarks/README.md:
# a 1 GiB save to commit about 2x faster). Checkpoints saved compressed still restore.
PYTREE_OPTIONS: dict[str, Any] = {"use_compression": False}

_COPIED = contextvars.ContextVar("jaxjob_save_copied", default=False)


def _pass_copy_point(local: bool) -> None:
    """Passes the fail point of a save's copy as it starts (a local-tier copy's, or not)."""
    if local:  # each point spelled out: the fault kit finds them in the source
        faults.point("local.save.copy")
    else:
        faults.point("save.copy")


@contextlib.contextmanager
def _copied() -> Iterator[None]:
    """Within it, saves do not pass the copy's fail point: their caller passed it."""
    token = _COPIED.set(True)
    try:
        yield
    finally:
        _COPIED.reset(token)


class _Observer:
    """What jaxjob does as a save starts and before its commit: fail points, writes settled.

    ``save.copy`` as the device-to-host copy starts (``local.save.copy`` in a
    local-tier copy, and so on; not within :func:`_copied`); Orbax's background thread
    waits on the returned futures in order, so the first one passes
    ``save.write`` as it starts waiting for the write, the last one
    ``save.commit`` once every write is done and before the commit. The
    writes are waited for together (:class:`~jaxjob._src.checkpoint.settled.Settled`),
    the members of Orbax's chained futures each on its own: a failure surfaces
    once no write of that save runs any more.

    Args:
        local: A local-tier copy's: its fail points are ``local.save.*``.
        shared: A shared save of a multi-process job: a failed write ends its barrier.
    """

    def __init__(self, *, local: bool, shared: bool) -> None:
        self.local = local
        self.shared = shared

    def started(self, directory: Any) -> None:
        """Passes the copy's fail point, unless the caller did."""
        if not _COPIED.get():
            _pass_copy_point(self.local)

    def settle(self, directory: Any, futures: list[Any]) -> list[Any]:
        """The write's fail point and the writes as one, then the commit's fail point."""
        if self.local:  # each point spelled out: the fault kit finds them in the source
            write = settled.FailPoint("local.save.write")
            commit = settled.FailPoint("local.save.commit")
        else:
            write, commit = settled.FailPoint("save.write"), settled.FailPoint("save.commit")
        failed = settled.post_failure(directory) if self.shared else None
        writes = settled.Settled(
            [write, *futures], members=orbax_handlers.members(futures), on_failure=failed
        )
        return [writes, commit]


def composite_handler(
    path: str, private: bool, *, local: bool = False
) -> orbax_handlers.CompositeHandler:
    """The Orbax handler of checkpoint directories under ``path``, each item's handler registered.

    With ``private`` (in a multi-process job) this process alone writes or reads it;
    ``local``: a local-tier copy's (its fail points). :class:`CheckpointIO` makes it;
    a benchmark gives it to a plain Orbax checkpointer.
    """
    alone = private and jax.process_count() > 1
    options = orbax_checkpointer.private_options() if alone else None
    registry = orbax_handlers.private_registry() if alone else None

    def pytree() -> ocp.PyTreeCheckpointHandler:
        if not alone:
            return ocp.PyTreeCheckpointHandler(**PYTREE_OPTIONS)
        return ocp.PyTreeCheckpointHandler(
            **PYTREE_OPTIONS | {"use_ocdbt": False},
            multiprocessing_options=options,
            type_handler_registry=registry,
        )

    only_me = {"multiprocessing_options": options} if alone else {}
    handler = orbax_handlers.CompositeHandler(
        composite_options=ocp.CompositeOptions(
            **only_me,
            **orbax_commit.composite_commit_options(path),
            async_options=orbax_checkpointer.directory_options(),
        ),
        **{
            STATE: pytree(),
            OUTPUTS: pytree(),
            MANIFEST_ITEM: orbax_handlers.ManifestHandler(MANIFEST_FILE, **only_me),
        },
    )
    observer = _Observer(local=local, shared=not alone and jax.process_count() > 1)
    handler.started, handler.settle = observer.started, observer.settle
    return handler


def save_args(encoded: Mapping[str, Mapping[str, Any]], manifest: Manifest) -> ocp.args.Composite:
    """Orbax arguments that save one checkpoint directory (trees from ``storage.encode``).

    Starts checksumming the host copies of this process's shards in the
    background; Orbax writes them beside the manifest before the commit.
    """
    sums = checksum.start(encoded, first_replica=manifest.tier == "local")
    doc = checksum.PendingManifest(manifest.to_json(), sums, manifest.epoch)
    items: dict[str, Any] = {MANIFEST_ITEM: orbax_handlers.ManifestSave(doc)}
    for item in (STATE, OUTPUTS):
        if encoded.get(item):  # Orbax refuses an empty tree
            items[item] = ocp.args.PyTreeSave(dict(encoded[item]))
    return ocp.args.Composite(**items)


class CheckpointIO:
    """One Orbax checkpointer over the checkpoint directories under ``path``.

    Made without touching Orbax: the checkpointer is built by :meth:`open`
    (or the first save or restore) and released by :meth:`close`, after
    which a use opens a new one.

    Args:
        path: Where the checkpoints are, a db_prefix or one checkpoint
            directory: it chooses how a save is committed (a durable rename
            on local disk, a commit file on an object store).
        codec: How the leaves are stored, chosen once by the writer or
            reader; a private one (``codec.private``) makes this process the
            only one taking part.
        tier: ``"local"`` for a local-tier copy: its saves pass the
            ``local.save.*`` fail points instead of ``save.*``.
        write_timeout_s: Saves are written in the background (an Orbax
            ``AsyncCheckpointer``) and may take this long; None: a save is
            written before :meth:`save_async` returns.
    """

    def __init__(
        self,
        path: str,
        codec: codec.Codec,
        *,
        tier: str = "persistent",
        write_timeout_s: float | None = None,
    ) -> None:
        self.path = path
        self.codec = codec
        self.tier = tier
        self.write_timeout_s = write_timeout_s
        self._orbax: ocp.Checkpointer | None = None

    @classmethod
    def alone(cls, path: str) -> CheckpointIO:
        """A handle reading on this process alone, whoever wrote the checkpoint (verify)."""
        return cls(path, codec.PrivateCodec())

    def open(self) -> None:
        """Builds the Orbax checkpointer, if not yet (with jaxjob's replacements installed)."""
        if self._orbax is None:
            handler = composite_handler(self.path, self.codec.private, local=self.tier == "local")
            self._orbax = orbax_checkpointer.checkpointer(
                self.path,
                handler,
                private=self.codec.private,
                async_timeout_s=self.write_timeout_s,
            )

    @property
    def asynchronous(self) -> bool:
        """Whether a checkpointer writing in the background is open (see :meth:`drain`)."""
        return isinstance(self._orbax, ocp.AsyncCheckpointer)

    def _opened(self) -> ocp.Checkpointer:
        self.open()
        return self._orbax

    def pass_copy_point(self) -> None:
        """Passes the fail point of a save's copy (for a save copied before :meth:`save_async`)."""
        _pass_copy_point(self.tier == "local")

    def save_async(
        self,
        path: str,
        encoded: Mapping[str, Mapping[str, Any]],
        manifest: Manifest,
        *,
        nbytes: int | None = None,
        copied: bool = False,
    ) -> float | None:
        """Starts the save of the checkpoint directory ``path`` (on an object store, bounded).

        Orbax's synchronous part of the save (its directory calls, the
        device-to-host copy, and without ``write_timeout_s`` the whole write)
        fails on an object store with
        :class:`~jaxjob._src.base.fs.StorageTimeoutError` naming the endpoint
        after :func:`jaxjob._src.base.fs.transfer_bound_s` of ``nbytes``.

        Args:
            path: The checkpoint directory.
            encoded: Each item's leaves as stored (``storage.encode``).
            manifest: Its manifest.
            nbytes: The bytes this process writes (the object store's bound).
            copied: The caller made the device-to-host copy and passed its
                fail point (:meth:`pass_copy_point`).

        Returns:
            On an object store, the ``time.perf_counter()`` by which the
            background write must have committed (see :meth:`drain`); None on
            local disk.
        """
        saver, args = self._opened(), save_args(encoded, manifest)
        with _copied() if copied else contextlib.nullcontext():
            if not fs.is_remote(path):
                saver.save(path, args=args)
                return None
            started = time.perf_counter()
            bound = fs.transfer_bound_s(path, nbytes or 0)
            fs.bounded(path, "the save", lambda: saver.save(path, args=args), timeout_s=bound)
        return started + bound

    def drain(self, path: str, deadline: float | None = None) -> None:
        """Waits for the background write of ``path``; on an object store until ``deadline``.

        Nothing to wait for without ``write_timeout_s`` or an open checkpointer.

        Raises:
            StorageTimeoutError: Naming the endpoint, if the write has not
                committed by ``deadline`` (at least 1 s from now, for a write
                that is done but whose thread has yet to report it).
            Exception: The write's failure.
        """
        if not self.asynchronous:
            return
        if deadline is None:
            self._orbax.wait_until_finished()
            return
        left = max(1.0, deadline - time.perf_counter())
        fs.bounded(path, "the write", self._orbax.wait_until_finished, timeout_s=left)

    def drain_failed(self) -> None:
        """Waits for what Orbax runs for a save that failed as it started (logged, not raised).

        See :func:`jaxjob._src.internals.orbax_checkpointer.drain_failed_save`.
        """
        if self.asynchronous:
            orbax_checkpointer.drain_failed_save(self._orbax)

    def forget_failed(self, path: str) -> None:
        """Drops the host copies deferred to the commit of the failed save of ``path``."""
        orbax_commit.forget_checksums(path)

    def abandon_if_stuck(self, err: BaseException) -> bool:
        """After an object store stopped answering (``err``): drops the stuck checkpointer.

        Its threads wait on the store and cannot be cancelled, nor is it
        closed; the next use opens a new one (and the lock sweep removes what
        this one left).

        Returns:
            Whether it was dropped (``err`` is a
            :class:`~jaxjob._src.base.fs.StorageTimeoutError`).
        """
        if not isinstance(err, fs.StorageTimeoutError):
            return False
        self._orbax = None
        return True

    def restore(self, path: str, item: str, tree: Mapping[str, Any]) -> dict[str, Any]:
        """Reads the leaves of ``tree`` (stored name -> target) from ``item`` of ``path``.

        Returns:
            Stored name -> the value read, as the target says (an empty ``tree``
            reads nothing).
        """
        if not tree:
            return {}
        tree = dict(tree)
        args = ocp.args.PyTreeRestore(
            item=tree,
            restore_args=ocp.checkpoint_utils.construct_restore_args(tree),
            partial_restore=True,
        )
        return self._opened().restore(path, args=ocp.args.Composite(**{item: args}))[item]

    def close(self) -> None:
        """Releases the Orbax checkpointer (a save in flight is not waited for)."""
        if self._orbax is not None:
            self._orbax.close()
        self._orbax = None

    def __enter__(self) -> CheckpointIO:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
