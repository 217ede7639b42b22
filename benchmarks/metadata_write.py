"""The metadata record a saved epoch writes, against the rewrite it replaced; one ``RESULT`` line.

    python benchmarks/metadata_write.py DIR --records 30

``DiskMetadataHandler.write`` appends one line with one fsync on local disk.
The reference, measured in the same run and alternating with it, is what it
did before: read the whole file, write a copy with the line added, fsync it,
rename it over the file and fsync the directory.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from jaxjob._src.base import fs  # noqa: E402
from jaxjob._src.manager.metadata import METADATA_FILE, DiskMetadataHandler  # noqa: E402


def _rewrite(path, epoch):
    record = {"event": "commit", "epoch": epoch, "time": time.time()}
    lines = fs.read_text(path) if fs.exists(path) else ""
    fs.write_text(path, lines + json.dumps(record) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--records", type=int, default=30)
    args = parser.parse_args()
    append_dir = tempfile.mkdtemp(dir=args.dir)
    rewrite_file = os.path.join(tempfile.mkdtemp(dir=args.dir), METADATA_FILE)
    handler = DiskMetadataHandler()
    handler.set_params(db_prefix=append_dir, db_type="orbax", node_names=["local"])
    append, rewrite = [], []
    for epoch in range(args.records):
        start = time.perf_counter()
        handler.write(epoch)
        append.append(time.perf_counter() - start)
        start = time.perf_counter()
        _rewrite(rewrite_file, epoch)
        rewrite.append(time.perf_counter() - start)
    result = {"append": statistics.median(append), "rewrite": statistics.median(rewrite)}
    result["ratio"] = result["append"] / result["rewrite"]
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
