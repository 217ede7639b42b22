"""The jaxjob command line: ls."""

import json

import jax.numpy as jnp

import jaxjob
from jaxjob import cli


def test_ls_lists_checkpoints_and_reports_a_missing_directory_in_one_line(tmp_path, capsys):
    """`jaxjob ls DIR` prints a sorted table; `--json` rows; a missing DIR is one line, exit 2."""
    ckpt = jaxjob.CheckpointManager(str(tmp_path))
    for epoch in (0, 1, 10):
        ckpt.save(epoch, {"w": jnp.ones(256)})
    ckpt.close()
    (tmp_path / "local.11.orbax-checkpoint-tmp-5").mkdir()
    assert cli.main(["ls", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[:3] for r in rows[1:]] == [
        ["local", "0", "yes"],
        ["local", "1", "yes"],
        ["local", "10", "yes"],
        ["local", "11", "no"],
    ]
    assert rows[1][4] == "KiB" and rows[1][6] == "s"
    assert cli.main(["ls", "--json", str(tmp_path)]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert [r["epoch"] for r in parsed] == [0, 1, 10, 11] and parsed[0]["size_bytes"] > 1024
    assert cli.main(["ls", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
