"""The file table: every file's size and checksums, checked against the directory."""

import json
import os
import random

import crc32c as crc32c_package
import pytest

from jaxjob._src.base import crc32c, file_table

TABLE = "meta/files.json"


def _sealed(tmp_path, files):
    for rel, data in files.items():
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    (tmp_path / "meta").mkdir(exist_ok=True)
    doc = file_table.table(str(tmp_path))
    file_table.write(str(tmp_path), TABLE, doc, {"done.txt": "committed"})
    (tmp_path / "done.txt").write_text("committed")
    return str(tmp_path)


def _self_checked(body: bytes) -> bytes:
    """A record ending in its own CRC-32C, as OCDBT writes its manifests and B-tree nodes."""
    return body + crc32c_package.crc32c(body).to_bytes(4, "little")


def test_crc32c_matches_the_standard_check_value_and_another_implementation():
    """CRC-32C of '123456789' is 0xE3069283; google-crc32c (of the gcs stack) agrees."""
    assert crc32c.of_bytes(b"123456789") == 0xE3069283
    google_crc32c = pytest.importorskip("google_crc32c")
    data = os.urandom(3 * 2**22 + 5)
    assert crc32c.of_bytes(data) == google_crc32c.value(data)
    assert crc32c.of_bytes(data[5:], crc32c.of_bytes(data[:5])) == crc32c.of_bytes(data)


def test_an_intact_directory_has_no_problems(tmp_path):
    """Every file, the marker written after the table included, matches."""
    path = _sealed(tmp_path, {"a": b"x" * 100, "sub/d/" + "0" * 32: os.urandom(200_000)})
    assert file_table.problems(path, TABLE) == {}
    listed = json.loads((tmp_path / TABLE).read_text())["files"]
    assert sorted(listed) == ["a", "done.txt", "sub/d/" + "0" * 32]


def test_a_crc32c_alone_misses_another_self_checked_record_of_the_same_length(tmp_path):
    """Two records ending in their own CRC-32C have one CRC-32C; the SHA-256 tells them apart."""
    one, other = _self_checked(b"epoch 1 manifest"), _self_checked(b"epoch 2 manifest")
    assert one != other and crc32c.of_bytes(one) == crc32c.of_bytes(other)
    path = _sealed(tmp_path, {"manifest.ocdbt": one})
    (tmp_path / "manifest.ocdbt").write_bytes(other)
    assert "fails its checksum" in file_table.problems(path, TABLE)["manifest.ocdbt"]


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda p: p.write_bytes(b"y" * 100), "fails its checksum"),
        (lambda p: p.write_bytes(b"x" * 99), "has 99 bytes, not the 100"),
        (lambda p: p.unlink(), "is missing"),
    ],
)
def test_each_damage_is_one_line_naming_the_file(tmp_path, damage, why):
    """A changed, resized or deleted file is a line naming it."""
    path = _sealed(tmp_path, {"a": b"x" * 100, "b": b"z"})
    damage(tmp_path / "a")
    (line,) = file_table.problems(path, TABLE).values()
    assert line.startswith(f"{os.path.join(path, 'a')!r} {why}")


def test_a_damaged_or_missing_table_is_a_problem(tmp_path):
    """The table checks itself: an edit breaks its own checksum."""
    path = _sealed(tmp_path, {"a": b"x"})
    doc = json.loads((tmp_path / TABLE).read_text())
    doc["files"]["a"][0] = 2
    (tmp_path / TABLE).write_text(json.dumps(doc))
    assert "fails its own checksum" in file_table.problems(path, TABLE)[TABLE]
    (tmp_path / TABLE).unlink()
    assert file_table.problems(path, TABLE) == {TABLE: f"{os.path.join(path, TABLE)!r} is missing"}


def test_a_restore_checks_large_data_files_by_size_only(tmp_path):
    """With data_up_to, a large OCDBT data file's bytes are not read, its size still is."""
    name = "d/" + "1" * 32
    path = _sealed(tmp_path, {name: b"v" * 100_000})
    (tmp_path / name).write_bytes(b"w" * 100_000)
    assert file_table.problems(path, TABLE, data_up_to=65536) == {}
    assert name in file_table.problems(path, TABLE)
    (tmp_path / name).write_bytes(b"w" * 10)
    assert name in file_table.problems(path, TABLE, data_up_to=65536)


def test_a_large_data_file_gets_its_size_only(tmp_path):
    """A data file over SIZE_ONLY_OVER is not hashed again at the commit: its values are."""
    name = "d/" + "2" * 32
    path = _sealed(tmp_path, {name: b"v" * (file_table.SIZE_ONLY_OVER + 1), "m": b"x"})
    listed = json.loads((tmp_path / TABLE).read_text())["files"]
    assert listed[name] == [file_table.SIZE_ONLY_OVER + 1, None, None]
    assert listed["m"][1] is not None and listed["m"][2] is not None
    (tmp_path / name).write_bytes(b"v" * 10)
    assert "has 10 bytes" in file_table.problems(path, TABLE)[name]


@pytest.mark.parametrize(
    "size",
    [
        0,
        1,
        file_table.SHA_UP_TO,
        file_table.SHA_UP_TO + 1,
        file_table._CHUNK,
        file_table._CHUNK + 3,
    ],
)
def test_a_file_hashes_as_its_bytes_whatever_its_size(tmp_path, size):
    """Read in one buffer no larger than the file, or in chunks: the entry of its bytes."""
    data = random.Random(size).randbytes(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert file_table.hash_file(str(path)) == file_table.entry_of(data)
