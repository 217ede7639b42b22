"""Issue 37's peers: what the machine can do, and what a user could write in 30 lines.

Each works on a flat dict ``{name: array}`` of NumPy or JAX arrays and makes what it
writes durable (every file and the directory that names it fsynced), like a jaxjob
commit:

* :func:`raw1_save`: all leaves' bytes in one file, fsync of the file, rename, fsync
  of the directory ("raw1": the floor of a durable commit of those bytes);
* :func:`safetensors_save` / :func:`safetensors_load`: ``safetensors.numpy`` of the
  same arrays, the saved file fsynced and renamed into place;
* :class:`MinimalWriter`: a minimal async checkpointer (``np.array`` device-to-host
  copy on the caller's thread, one background thread writing ``.npy`` files with an
  fsync each, then the rename of a temporary directory).
"""

import os
import threading

import numpy as np
from common import fsync_path


def host_copy(arrays):
    """``{name: np.ndarray}``: each leaf copied to host memory (``np.array``)."""
    return {name: np.array(value) for name, value in arrays.items()}


def _durable_rename(tmp, path):
    """Renames ``tmp`` to ``path`` and fsyncs the directory that holds it."""
    os.replace(tmp, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def raw1_save(arrays, path):
    """All leaves' bytes, in order, in one file at ``path``: write, fsync, rename, fsync dir."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for value in arrays.values():
            f.write(memoryview(np.ascontiguousarray(value)).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    _durable_rename(tmp, path)


def raw1_load(path, like):
    """The leaves :func:`raw1_save` wrote, read into new arrays shaped like ``like``'s."""
    out = {name: np.empty(np.shape(v), np.asarray(v).dtype) for name, v in like.items()}
    with open(path, "rb", buffering=0) as f:
        for value in out.values():
            f.readinto(memoryview(value).cast("B"))
    return out


def safetensors_save(arrays, path):
    """``safetensors.numpy.save_file`` of the host arrays, fsynced and renamed into place."""
    from safetensors.numpy import save_file

    tmp = path + ".tmp"
    save_file(host_copy(arrays), tmp)
    fsync_path(tmp)
    _durable_rename(tmp, path)


def safetensors_load(path):
    """``safetensors.numpy.load_file``: ``{name: np.ndarray}``."""
    from safetensors.numpy import load_file

    return load_file(path)


class MinimalWriter:
    """A minimal async checkpointer: what a user writes in 30 lines.

    ``save`` copies every leaf to host memory on the caller's thread (``np.array``) and
    returns; one background thread writes each leaf as ``<name>.npy`` (fsync each) into
    ``<root>/<step>.tmp``, fsyncs that directory, renames it to ``<root>/<step>`` and
    fsyncs ``root``. ``wait`` joins the thread and raises what it raised.
    """

    def __init__(self, root):
        self.root = root
        os.makedirs(root, exist_ok=True)
        self._thread, self._error = None, None

    def save(self, step, arrays):
        """Waits for the previous save, copies ``arrays`` to host, starts the write."""
        self.wait()
        host = host_copy(arrays)
        self._thread = threading.Thread(target=self._write, args=(step, host), daemon=True)
        self._thread.start()

    def _write(self, step, host):
        try:
            tmp = os.path.join(self.root, f"{step}.tmp")
            os.makedirs(tmp)
            for name, value in host.items():
                with open(os.path.join(tmp, name + ".npy"), "wb") as f:
                    np.save(f, value)
                    f.flush()
                    os.fsync(f.fileno())
            fsync_path(tmp)
            _durable_rename(tmp, os.path.join(self.root, str(step)))
        except Exception as error:  # handed to the caller by wait()
            self._error = error

    def wait(self):
        """Blocks until the pending save is durable; raises its error, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def load(self, step, names):
        """``{name: np.ndarray}`` of a committed step."""
        directory = os.path.join(self.root, str(step))
        return {name: np.load(os.path.join(directory, name + ".npy")) for name in names}
