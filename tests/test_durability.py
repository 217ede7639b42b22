"""A reported commit is durable: every file fsynced before the rename, the parent after it."""

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

SAVE = """
import jax.numpy as jnp, numpy as np, jaxjob
ckpt = jaxjob.CheckpointManager(PREFIX, async_save=ASYNC)
ckpt.save(0, {"params": {"w": jnp.arange(1000.0)}, "cursor": np.arange(3), "step": 1})
ckpt.wait_until_finished()
ckpt.close()
print("SAVED", flush=True)
"""

_CALL = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\((.*)\)\s+=\s+(-?\d+)")


def _trace(tmp_path, async_save):
    prefix = tmp_path / "ckpt"
    log = tmp_path / "strace.txt"
    code = f"PREFIX = {str(prefix)!r}\nASYNC = {async_save}\n" + textwrap.dedent(SAVE)
    cmd = ["strace", "-f", "-y", "-qq", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2"]
    proc = subprocess.run(
        [*cmd, "-o", str(log), sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr[-300:]}")
    assert proc.returncode == 0 and "SAVED" in proc.stdout, proc.stderr[-3000:]
    calls = []
    for line in log.read_text().splitlines():
        match = _CALL.match(line)
        if match and match.group(3) != "-1":
            calls.append((match.group(1), match.group(2)))
    return prefix, calls


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
@pytest.mark.parametrize("async_save", [False, True])
def test_commit_fsyncs_every_file_then_renames_then_fsyncs_the_parent(tmp_path, async_save):
    """Seen with strace: each file of the checkpoint, its rename, then db_prefix, all flushed."""
    prefix, calls = _trace(tmp_path, async_save)
    final = prefix / "local.0"
    renames = [
        i
        for i, (name, args) in enumerate(calls)
        if name.startswith("rename") and f'"{final}"' in args
    ]
    assert len(renames) == 1, calls
    rename_at = renames[0]
    tmp_dir = re.search(r'"([^"]*local\.0\.orbax-checkpoint-tmp[^"/]*)"', calls[rename_at][1])
    assert tmp_dir, calls[rename_at]
    synced_before = {
        args.split("<", 1)[1].rstrip(">")
        for name, args in calls[:rename_at]
        if name in ("fsync", "fdatasync") and "<" in args
    }
    files = [
        os.path.relpath(os.path.join(root, f), final)
        for root, _, names in os.walk(final)
        for f in names
    ]
    assert files, "the checkpoint has no files"
    for relative in files:
        assert os.path.join(tmp_dir.group(1), relative) in synced_before, relative
    synced_after = [
        args for name, args in calls[rename_at + 1 :] if name == "fsync" and f"<{prefix}>" in args
    ]
    assert synced_after, "db_prefix was not fsynced after the commit rename"
