"""The node save engine's I/O handle: its codec chosen once, from the node's owner and tier."""

import pytest

import jaxjob
from jaxjob._src.checkpoint import codec
from jaxjob._src.manager.save.writer import NodeWriter


@pytest.mark.parametrize(
    ("owner_process", "tier", "expected"),
    [
        (None, "persistent", codec.SharedCodec),
        (0, "persistent", codec.PrivateCodec),
        (0, "local", codec.LocalCodec),
    ],
)
def test_the_codec_follows_the_owner_and_the_tier_set_before_the_first_save(
    tmp_path, owner_process, tier, expected
):
    """A shared node's codec, a private node's, a private local-tier copy's."""
    writer = NodeWriter(
        str(tmp_path), "local", jaxjob.CheckpointOptions(), owner_process=owner_process
    )
    writer.tier = tier
    assert type(writer.io.codec) is expected and writer.io.tier == tier
    writer.close()


def test_the_tier_cannot_change_once_the_codec_is_chosen(tmp_path):
    """Setting another tier after the first save raises, naming both tiers; the same one is fine."""
    writer = NodeWriter(str(tmp_path), "local", jaxjob.CheckpointOptions(), owner_process=0)
    writer.tier = "local"
    writer.io.open()
    writer.tier = "local"
    with pytest.raises(
        ValueError, match="saves to the 'local' tier since its first save; it cannot"
    ):
        writer.tier = "persistent"
    assert type(writer.io.codec) is codec.LocalCodec
    writer.close()
