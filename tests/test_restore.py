"""jaxjob.restore onto other device counts: leaves saved sharded over 4 devices restore anywhere."""

import os
import subprocess
import sys
import textwrap

SAVE = """
import jax, jax.numpy as jnp, numpy as np, jaxjob
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((4,), ("x",))
w = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("x")))
ckpt = jaxjob.CheckpointManager(PREFIX)
ckpt.save(0, {"params": {"w": w}, "opt": jnp.zeros(3)})
ckpt.close()
"""

RESTORE = """
import jax, jax.numpy as jnp, numpy as np, jaxjob
from jax.sharding import NamedSharding, PartitionSpec as P
ws = jaxjob.restore(PREFIX, leaves=["params"])
w = ws["params"]["w"]
assert sorted(ws) == ["params"], sorted(ws)
assert len(w.sharding.device_set) == 1 and w.sharding.device_set == {jax.devices()[0]}
np.testing.assert_array_equal(np.asarray(w), np.arange(32.0).reshape(8, 4))
if jax.device_count() == 8:
    mesh = jax.make_mesh((8,), ("x",))
    s = NamedSharding(mesh, P("x"))
    w8 = jaxjob.restore(PREFIX, leaves=["params"], sharding=s)["params"]["w"]
    assert w8.sharding == s and len(w8.addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(w8), np.arange(32.0).reshape(8, 4))
print("ok", jax.device_count())
"""


def _python(code, devices, prefix):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    code = f"PREFIX = {str(prefix)!r}\n" + textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_restore_onto_one_and_eight_devices(tmp_path):
    """A checkpoint written on 4 devices restores on 1 device and resharded on 8, values exact."""
    _python(SAVE, 4, tmp_path)
    assert "ok 1" in _python(RESTORE, 1, tmp_path)
    assert "ok 8" in _python(RESTORE, 8, tmp_path)
