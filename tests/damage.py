"""Corruptions of a committed checkpoint directory, shared by the checksum and crafted tests."""

import os


def largest_data_file(path):
    """The largest data file of the checkpoint's ``state`` item (in an OCDBT ``d/`` directory)."""
    files = [
        os.path.join(root, name)
        for root, _, names in os.walk(os.path.join(path, "state"))
        for name in names
        if os.path.basename(root) == "d"
    ]
    return max(sorted(files), key=os.path.getsize)


def read(file, mode="r"):
    with open(file, mode) as f:
        return f.read()


def write(file, data, mode="w"):
    with open(file, mode) as f:
        f.write(data)


def flip_bytes(path):
    """Inverts 64 bytes in the middle of the largest data file."""
    flip_file(largest_data_file(path))


def flip_file(file):
    """Inverts 64 bytes in the middle of ``file``."""
    data = bytearray(read(file, "rb"))
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    write(file, data, "wb")


def truncate(path):
    """Cuts the largest data file to half its size."""
    file = largest_data_file(path)
    os.truncate(file, os.path.getsize(file) // 2)


def delete(path):
    """Deletes the largest data file."""
    os.remove(largest_data_file(path))


def damage_manifest(path):
    """Changes one letter of the manifest's node name: valid JSON, wrong checksum."""
    file = os.path.join(path, "jaxjob", "manifest.json")
    text = read(file)
    assert '"node": "local"' in text
    write(file, text.replace('"node": "local"', '"node": "locaL"', 1))


def reseal(path):
    """Rewrites the checkpoint's file table to match its files now, as a forger could.

    Tests of crafted checkpoints edit a file, fix its own checksum and then
    this, so that the defences behind the file table are what they exercise.
    """
    from jaxjob._src.base import file_table
    from jaxjob._src.checkpoint import files

    table = file_table.table(path, skip=lambda rel: rel in (files.FILE_TABLE, "commit_success.txt"))
    marker = read(os.path.join(path, "commit_success.txt"))
    file_table.write(path, files.FILE_TABLE, table, {"commit_success.txt": marker})
