"""The seed's test pipeline (caffe2 checkpoint_test.build_pipeline), ported to jaxjob."""

import jax.numpy as jnp
from jax import lax

import jaxjob

EXPECTED_TOTALS = [103, 115, 136, 145]
NUM_RECORDS = 10
BATCH = 3


def build_pipeline(node_id: int) -> str:
    """Adds node ``trainer_<id>``'s reader pipeline to the current job; returns its total's name."""
    prefix = f"trainer_{node_id}"
    job = jaxjob.Job.current()
    with jaxjob.Node(prefix):

        @job.init_group.task
        def init(ws):
            return {
                f"{prefix}/records": jnp.arange(NUM_RECORDS, dtype=jnp.int32),
                f"{prefix}/cursor": jnp.zeros((), jnp.int32),
                f"{prefix}/total": jnp.array([100], jnp.int32),
            }

        @job.epoch_group.task
        def read_and_add(ws):
            records, cursor = ws[f"{prefix}/records"], ws[f"{prefix}/cursor"]
            index = cursor + jnp.arange(BATCH)
            valid = index < NUM_RECORDS
            batch = jnp.where(valid, records[jnp.minimum(index, NUM_RECORDS - 1)], 0)
            return {
                f"{prefix}/total": ws[f"{prefix}/total"] + batch.sum(),
                f"{prefix}/cursor": jnp.minimum(cursor + BATCH, NUM_RECORDS),
                f"{prefix}/data_finished": lax.bitwise_not(valid.all()),
            }

    job.add_stop_condition(f"{prefix}/data_finished")
    return f"{prefix}/total"
