"""Orbax's per-call event loops close only once idle: readers beside a live writer print nothing."""

import asyncio
import gc
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from orbax.checkpoint._src import asyncio_utils

from jaxjob._src.internals import orbax_reads

NOISE = ("Event loop is closed", "Exception ignored", "was never awaited", "Task was destroyed")


def test_a_failed_gathered_read_leaves_nothing_in_flight_on_a_closed_loop(capfd, monkeypatch):
    """One of the reads Orbax gathers fails while another is in a worker thread: the call
    raises only once that read has finished, and nothing reaches the closed loop later."""
    orbax_reads.install()
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    finished = threading.Event()

    def slow_read():
        time.sleep(0.3)
        finished.set()

    async def fails():
        await asyncio.sleep(0.01)
        raise FileNotFoundError("deleted meanwhile")

    async def both():
        await asyncio.gather(asyncio.to_thread(slow_read), fails())

    with pytest.raises(FileNotFoundError, match="deleted meanwhile"):
        asyncio_utils.run_sync(both())
    assert finished.is_set(), "the loop was closed with a read in flight"
    time.sleep(0.1)
    gc.collect()
    err = capfd.readouterr().err
    assert not [line for line in err.splitlines() if any(n in line for n in NOISE)], err
    assert not unraisable, [str(u.exc_value) for u in unraisable]


WRITER = textwrap.dedent(
    """
    import sys
    import jax.numpy as jnp
    import jaxjob

    prefix, epochs, done = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ckpt = jaxjob.CheckpointManager(prefix, keep=jaxjob.keep.Last(1))
    for epoch in range(epochs):
        leaves = {f"w{i}": jnp.full(20_000, epoch + i, jnp.float32) for i in range(6)}
        ckpt.save(epoch, {**leaves, "step": jnp.int32(epoch)})
    ckpt.close()
    open(done, "w").close()
    """
)

READER = textwrap.dedent(
    """
    import logging, os, sys, time
    import jaxjob

    prefix, done = sys.argv[1], sys.argv[2]
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    restores = 0
    while not os.path.exists(done):
        try:
            ws = jaxjob.restore(prefix)
        except FileNotFoundError:  # nothing committed yet
            time.sleep(0.01)
            continue
        assert ws["w3"][0] == ws["step"] + 3, "a restore mixed two epochs"
        restores += 1
    print("restores:", restores)
    """
)


# jaxjob replaces Orbax's per-read loop runner, which Orbax has from 0.12.5 on; before that each
# read goes through asyncio.run, which jaxjob leaves alone: the noise stays (the restores are
# right), a known limit of the lowest supported releases (0.12.1 to 0.12.4).
@pytest.mark.skipif(
    not hasattr(asyncio_utils, "_run_sync_via_new_loop"),
    reason="Orbax < 0.12.5 reads through asyncio.run, which jaxjob does not replace",
)
def test_restores_beside_a_live_writer_print_no_event_loop_tracebacks(tmp_path):
    """A restore loop (its own process, stderr captured) while a child process saves and
    its retention deletes the epochs being read: every restore is right, stderr holds no
    asyncio traceback."""
    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "reader.py").write_text(READER)
    prefix, done = str(tmp_path / "run"), str(tmp_path / "done")
    writer = subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), prefix, "25", done])
    try:
        reader = subprocess.run(
            [sys.executable, str(tmp_path / "reader.py"), prefix, done],
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        writer.wait(timeout=240)
    assert writer.returncode == 0 and reader.returncode == 0, reader.stderr[-3000:]
    noise = [line for line in reader.stderr.splitlines() if any(n in line for n in NOISE)]
    retried = reader.stdout.count("deleted while it was being restored")
    summary = reader.stdout.splitlines()[-1]
    assert not noise, f"{summary} ({retried} read a deleted epoch):\n{reader.stderr[-3000:]}"
