"""Corruptions of a committed checkpoint directory, shared by the checksum and crafted tests."""

import os


def save_epochs(prefix, workspace, epochs=(0, 1)):
    """Saves ``workspace(epoch)`` as each of ``epochs`` under ``prefix``; returns ``prefix``."""
    import jaxjob

    ckpt = jaxjob.CheckpointManager(str(prefix))
    for epoch in epochs:
        ckpt.save(epoch, jaxjob.Workspace(workspace(epoch)))
    ckpt.close()
    return str(prefix)


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
    os.remove(os.path.join(path, files.FILE_TABLE))
    file_table.write(path, files.FILE_TABLE, table, {"commit_success.txt": marker})


# ---- the corruption matrix: each damage of one file; False when it cannot change the file ----


def _rewrite(file, data):
    before = read(file, "rb")
    if bytes(data) == before:
        return False
    write(file, bytes(data), "wb")
    return True


def flip_one_byte(file, other):
    """Inverts one bit of the byte in the middle."""
    data = bytearray(read(file, "rb"))
    if not data:
        return False
    data[len(data) // 2] ^= 0x01
    return _rewrite(file, data)


def flip_two_bits_keeping_sums(file, other):
    """Sets a bit in one 8-byte word and clears the same bit in another of its 4 KiB block.

    The block's sum of 64-bit words stays the same: the damage a block-sum
    checksum misses.
    """
    data = bytearray(read(file, "rb"))
    words = len(data) // 8
    for i in range(min(words, 512)):
        for j in range(i + 1, min(words, 512)):
            a = int.from_bytes(data[8 * i : 8 * i + 8], "little")
            b = int.from_bytes(data[8 * j : 8 * j + 8], "little")
            for bit in range(64):
                if not a >> bit & 1 and b >> bit & 1:
                    data[8 * i : 8 * i + 8] = (a | 1 << bit).to_bytes(8, "little")
                    data[8 * j : 8 * j + 8] = (b & ~(1 << bit)).to_bytes(8, "little")
                    return _rewrite(file, data)
    return False


def _swap(file, unit):
    data = bytearray(read(file, "rb"))
    count = len(data) // unit
    chunks = [bytes(data[k * unit : (k + 1) * unit]) for k in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            if chunks[i] != chunks[j]:
                data[i * unit : (i + 1) * unit] = chunks[j]
                data[j * unit : (j + 1) * unit] = chunks[i]
                return _rewrite(file, data)
    return False


def swap_two_words(file, other):
    """Swaps two differing 8-byte words."""
    return _swap(file, 8)


def swap_two_sectors(file, other):
    """Swaps two differing 512-byte sectors (files of two sectors or more)."""
    return _swap(file, 512)


def truncate_half(file, other):
    """Cuts the file to half its size."""
    size = os.path.getsize(file)
    if size == 0:
        return False
    os.truncate(file, size // 2)
    return True


def delete_file(file, other):
    """Deletes the file."""
    os.remove(file)
    return True


def zero_fill(file, other):
    """Overwrites every byte with zero."""
    return _rewrite(file, bytes(os.path.getsize(file)))


def replace_with_other_epoch(file, other):
    """Replaces the file by its counterpart in another epoch's checkpoint."""
    if other is None or not os.path.exists(other):
        return False
    return _rewrite(file, read(other, "rb"))


MATRIX = {
    "flip one byte": flip_one_byte,
    "flip two bits keeping block sums": flip_two_bits_keeping_sums,
    "swap two words": swap_two_words,
    "swap two sectors": swap_two_sectors,
    "truncate": truncate_half,
    "delete": delete_file,
    "zero-fill": zero_fill,
    "replace with another epoch's copy": replace_with_other_epoch,
}


def files_of(path):
    """Every file of a checkpoint directory, relative to it."""
    return sorted(
        os.path.relpath(os.path.join(root, name), path)
        for root, _, names in os.walk(path)
        for name in names
    )


def counterpart(rel, path, other_path):
    """The file of ``other_path`` that plays ``rel`` 's part: the same name, else for an OCDBT
    data file (named by a random hash) the one of the same rank by size in the same folder."""
    if os.path.exists(os.path.join(other_path, rel)):
        return os.path.join(other_path, rel)
    folder = os.path.dirname(rel)
    mine = sorted(
        files_of(os.path.join(path, folder)),
        key=lambda f: os.path.getsize(os.path.join(path, folder, f)),
    )
    theirs_dir = os.path.join(other_path, folder)
    if not os.path.isdir(theirs_dir):
        return None
    theirs = sorted(
        files_of(theirs_dir), key=lambda f: os.path.getsize(os.path.join(theirs_dir, f))
    )
    rank = mine.index(os.path.basename(rel))
    return os.path.join(theirs_dir, theirs[rank]) if rank < len(theirs) else None
