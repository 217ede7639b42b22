"""A reported commit is durable: every file flushed before the rename, the parent after it.

Flushed one by one (``fsync``), or all at once by one ``syncfs`` of the file
system that began after the last write under the checkpoint had ended
(``jaxjob._src.base.flush``: on ext4, xfs, btrfs, f2fs; elsewhere, e.g. on a
tmpfs, each file).
"""

import asyncio
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
from etils import epath
from orbax.checkpoint._src.serialization import tensorstore_utils

from jaxjob._src.base import flush
from jaxjob._src.internals import orbax_commit

SAVE = """
import jax.numpy as jnp, numpy as np, jaxjob
ckpt = jaxjob.CheckpointManager(PREFIX, async_save=ASYNC)
# "big": a data file over 1 MiB, which the file table sizes without reading: flushed all the same
big = jnp.ones(300_000)
ckpt.save(0, {"params": {"w": jnp.arange(1000.0)}, "big": big, "cursor": np.arange(3), "step": 1})
ckpt.wait_until_finished()
ckpt.close()
print("SAVED", flush=True)
"""

_PID = re.compile(r"^(?:\[pid\s+(\d+)\]\s+|(\d+)\s+)?(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+)")
_UNFINISHED = re.compile(r"^(\w+\(.*?)\s*<unfinished \.\.\.>$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")


@dataclasses.dataclass(frozen=True)
class Call:
    """One completed system call: its name, arguments, and the lines where it began and ended."""

    name: str
    args: str
    began: int
    ended: int


def parse_strace(text):
    """The successful calls of an ``strace -f`` log, in the order they began.

    A call that another thread's call interrupts is logged in two lines, its
    start (``<unfinished ...>``) and, later, its end (``<... name resumed>``)
    on the same pid: the two are joined. ``began`` and ``ended`` are the line
    numbers of its start and its end, so "A completed before B started" is
    ``a.ended < b.began``.
    """
    calls, open_calls = [], {}
    for number, line in enumerate(text.splitlines()):
        pid_a, pid_b, rest = _PID.match(line).groups()
        pid = pid_a or pid_b or "0"
        began, unfinished, resumed = number, _UNFINISHED.match(rest), _RESUMED.match(rest)
        if unfinished:
            open_calls[pid] = (number, unfinished.group(1))
            continue
        if resumed:
            began, start = open_calls.pop(pid)
            assert start.startswith(resumed.group(1) + "("), (start, line)
            rest = start + resumed.group(2)
        match = _CALL.match(rest)
        if match and match.group(3) != "-1":
            calls.append(Call(match.group(1), match.group(2), began, number))
    assert not open_calls, f"calls never resumed: {open_calls}"
    return sorted(calls, key=lambda c: c.began)


WRITES = ("write", "pwrite64", "writev", "pwritev", "pwritev2")


def _trace(tmp_path, async_save, where=None):
    prefix = (where or tmp_path) / "ckpt"
    log = tmp_path / "strace.txt"
    code = f"PREFIX = {str(prefix)!r}\nASYNC = {async_save}\n" + textwrap.dedent(SAVE)
    traced = ["fsync", "fdatasync", "syncfs", "rename", "renameat", "renameat2", *WRITES]
    cmd = ["strace", "-f", "-y", "-qq", "-e", f"trace={','.join(traced)}"]
    proc = subprocess.run(
        [*cmd, "-o", str(log), sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr[-300:]}")
    assert proc.returncode == 0 and "SAVED" in proc.stdout, proc.stderr[-3000:]
    return prefix, parse_strace(log.read_text())


def _ram_disk():
    """A tmpfs directory of this machine (where a commit fsyncs each file), or None."""
    shm = epath.Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
@pytest.mark.parametrize("disk", ["tmp_path", "tmpfs"])
@pytest.mark.parametrize("async_save", [False, True])
def test_commit_flushes_every_file_then_renames_then_fsyncs_the_parent(tmp_path, async_save, disk):
    """Seen with strace: each file of the checkpoint, its rename, then db_prefix, all flushed."""
    where = None
    if disk == "tmpfs":
        if _ram_disk() is None:
            pytest.skip("no writable /dev/shm")
        where = epath.Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        prefix, calls = _trace(tmp_path, async_save, where)
        _check_commit(prefix, calls, syncfs=flush.syncfs_usable(str(prefix)))
    finally:
        if where is not None:
            shutil.rmtree(where)


def _check_commit(prefix, calls, *, syncfs):
    final = prefix / "local.0"
    renames = [c for c in calls if c.name.startswith("rename") and f'"{final}"' in c.args]
    assert len(renames) == 1, calls
    rename = renames[0]
    tmp_dir = re.search(r'"([^"]*local\.0\.orbax-checkpoint-tmp[^"/]*)"', rename.args)
    assert tmp_dir, rename
    if syncfs:
        _check_one_syncfs(calls, rename, tmp_dir.group(1))
    else:
        _check_each_file_flushed(calls, rename, tmp_dir.group(1), final)
    synced_after = [
        c for c in calls if c.began > rename.ended and c.name == "fsync" and f"<{prefix}>" in c.args
    ]
    assert synced_after, "db_prefix was not fsynced after the commit rename"


def _check_each_file_flushed(calls, rename, tmp_dir, final):
    synced_before = {
        c.args.split("<", 1)[1].rstrip(">")
        for c in calls
        if c.ended < rename.began and c.name in ("fsync", "fdatasync") and "<" in c.args
    }
    files = [
        os.path.relpath(os.path.join(root, f), final)
        for root, _, names in os.walk(final)
        for f in names
    ]
    assert files, "the checkpoint has no files"
    for relative in files:
        assert os.path.join(tmp_dir, relative) in synced_before, relative
    for root, _, _ in os.walk(final):  # and every directory's entries
        relative = os.path.relpath(root, final)
        assert os.path.normpath(os.path.join(tmp_dir, relative)) in synced_before, root


def _check_one_syncfs(calls, rename, tmp_dir):
    """One syncfs of the checkpoint's file system, after every write and rename under it."""
    syncs = [c for c in calls if c.name == "syncfs" and f"<{tmp_dir}>" in c.args]
    assert len(syncs) == 1, [c for c in calls if c.name == "syncfs"]
    sync = syncs[0]
    assert sync.ended < rename.began, (sync, rename)
    under = tmp_dir + "/"
    written = [c for c in calls if c.name in WRITES and f"<{under}" in c.args]
    moved = [c for c in calls if c.name.startswith("rename") and f'"{under}' in c.args]
    assert written, "no write under the temporary directory was seen"
    late = [c for c in written + moved if c.ended > sync.began]
    assert not late, f"written or renamed after the syncfs began: {late[:3]}"


def test_parse_strace_joins_calls_that_other_threads_interrupted():
    """An <unfinished ...> start and its <... resumed> end on the same pid are one call."""
    log = "\n".join(
        [
            "10 fsync(5</d/a> <unfinished ...>",
            "11 fsync(6</d/b>) = 0",
            '12 renameat2(AT_FDCWD, "/d", AT_FDCWD, "/e", RENAME_NOREPLACE <unfinished ...>',
            "10 <... fsync resumed>) = 0",
            "12 <... renameat2 resumed>) = 0",
            "[pid    13] fsync(7</e>) = 0",
            "13 fsync(8</missing>) = -1 EBADF (Bad file descriptor)",
        ]
    )
    calls = parse_strace(log)
    assert [(c.name, c.args.split(",")[0], c.began, c.ended) for c in calls] == [
        ("fsync", "5</d/a>", 0, 3),
        ("fsync", "6</d/b>", 1, 1),
        ("renameat2", "AT_FDCWD", 2, 4),
        ("fsync", "7</e>", 5, 5),
    ]
    rename = calls[2]
    assert calls[0].ended > rename.began  # still running when the rename began: not "before" it


def test_tensorstore_skips_its_own_fsyncs_only_where_the_commit_flushes_everything(tmp_path):
    """Under a DurableRename temporary directory, until its commit; elsewhere Orbax is untouched."""

    def skips_fsync(directory):
        spec = tensorstore_utils.build_kvstore_tspec(str(directory), use_ocdbt=True)
        return '"file_io_sync": false' in json.dumps(spec)

    temporary = orbax_commit.DurableRename.from_final(epath.Path(tmp_path / "local.0"))
    assert not skips_fsync(temporary.get() / "state")
    asyncio.run(temporary.create())
    assert skips_fsync(temporary.get() / "state")
    assert not skips_fsync(tmp_path / "elsewhere")
    asyncio.run(temporary.finalize())
    assert (tmp_path / "local.0" / "commit_success.txt").exists()
    assert not skips_fsync(temporary.get() / "state")


def test_a_commit_whose_last_flush_fails_is_not_committed(tmp_path, monkeypatch):
    """EIO from the flush after the rename: the epoch is taken back, the save fails, none stays."""
    import jax.numpy as jnp

    import jaxjob
    from jaxjob._src.base import faults

    monkeypatch.setenv(faults.FAIL_AT_ENV, "save.after_rename:2")  # the save of epoch 1
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    ckpt.save(0, {"w": jnp.arange(8.0)})
    ckpt.save(1, {"w": jnp.arange(8.0) + 1})
    with pytest.raises(jaxjob.CheckpointSaveError, match="epoch 1 .*injected I/O error at the"):
        ckpt.wait_until_finished()
    assert ckpt.committed_epochs() == [0]
    ckpt.save(2, {"w": jnp.arange(8.0) + 2})
    ckpt.close()
    left = sorted(n for n in os.listdir(tmp_path) if not n.startswith((".", "jaxjob_metadata")))
    assert left == ["local.0", "local.2"]  # epoch 1's taken-back directory is gone
    assert jaxjob.restore(str(tmp_path))["w"][0] == 2
