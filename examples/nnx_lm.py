"""Train a small flax NNX transformer language model in two checkpoint tiers, then evaluate it.

The model predicts the next byte of a small text built into this script (no download). Two
checkpoint tiers: --ckpt-dir, the durable one (a shared file system or a bucket), gets the
first and the last epoch and every --save-every-epochs-th, and keeps its last two; a
per-process local tier (--local-dir: fast local disk, a RAM disk such as /dev/shm on a real
machine) gets every other epoch. SIGTERM (a preemption) saves the running epoch to the durable
tier and exits with jaxjob.Preempted; the same command resumes from the newer tier and ends
exactly where an uninterrupted run would:

    python -m pip install -c constraints.txt -e ".[flax]"  # once
    python examples/nnx_lm.py --epochs 10 --ckpt-dir runs/nnx_lm --local-dir runs/nnx_lm_local

Then evaluate the last checkpoint from its parameters alone, in a fresh process, without the
optimizer state or the job: the parameters are restored into a freshly built model.

    python examples/nnx_lm.py --eval --ckpt-dir runs/nnx_lm

The workspace holds the model as NNX state (``nnx.split`` gives the graph definition, which is
code, and the state, a pytree of ``nnx.Param`` that jaxjob saves); ``nnx.merge`` puts them
together again in the tasks and in the evaluation.
"""

from __future__ import annotations

import argparse
import logging
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
import optax
from flax import nnx

import jaxjob

SEQ, BATCH, STEPS = 32, 16, 20  # tokens per sequence, sequences per step, steps per epoch
tx = optax.adamw(3e-3)
log = logging.getLogger("nnx_lm")

_SUBJECTS = ("the checkpoint", "a process", "the job", "every epoch", "the model", "a node")
_VERBS = ("saves", "restores", "resumes", "writes", "reads", "commits")
_OBJECTS = ("its state", "the parameters", "the last epoch", "a local copy", "the optimizer")


def corpus() -> str:
    """A few paragraphs of text, the same on every run: sentences from three short word lists."""
    rng = np.random.default_rng(0)
    sentences = []
    for _ in range(400):
        subject, verb, obj = (str(rng.choice(words)) for words in (_SUBJECTS, _VERBS, _OBJECTS))
        sentences.append(f"{subject} {verb} {obj}.")
    return " ".join(sentences).capitalize()


class Tokens(NamedTuple):
    """The corpus as ids into its sorted byte vocabulary, split 9:1."""

    train: npt.NDArray[np.int32]
    eval: npt.NDArray[np.int32]
    vocab: int  # how many distinct bytes


def tokenize(text: str) -> Tokens:
    data = np.frombuffer(text.encode(), np.uint8)
    vocab = np.unique(data)
    ids = np.searchsorted(vocab, data).astype(np.int32)
    split = len(ids) * 9 // 10
    return Tokens(ids[:split], ids[split:], len(vocab))


class CausalSelfAttention(nnx.Module):
    """Multi-head self-attention in which each position sees itself and the positions before."""

    def __init__(self, d: int, heads: int, *, rngs: nnx.Rngs) -> None:
        self.heads = heads
        self.qkv, self.out = nnx.Linear(d, 3 * d, rngs=rngs), nnx.Linear(d, d, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        *batch, seq, d = x.shape
        qkv = self.qkv(x).reshape(*batch, seq, 3 * self.heads, d // self.heads)
        q, k, v = jnp.split(qkv, 3, axis=-2)
        attended = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.reshape(*batch, seq, d))


class Block(nnx.Module):
    """Pre-norm causal self-attention and an MLP, each with a residual connection."""

    def __init__(self, d: int, heads: int, *, rngs: nnx.Rngs) -> None:
        self.ln1, self.ln2 = nnx.LayerNorm(d, rngs=rngs), nnx.LayerNorm(d, rngs=rngs)
        self.attn = CausalSelfAttention(d, heads, rngs=rngs)
        self.up, self.down = nnx.Linear(d, 4 * d, rngs=rngs), nnx.Linear(4 * d, d, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x))
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class LM(nnx.Module):
    """A decoder-only transformer over byte ids, its output layer tied to its embedding."""

    def __init__(
        self, vocab: int, *, d: int = 32, heads: int = 2, layers: int = 2, rngs: nnx.Rngs
    ) -> None:
        self.embed = nnx.Embed(vocab, d, rngs=rngs)
        self.pos = nnx.Param(jax.random.normal(rngs.params(), (SEQ, d)) * 0.02)
        self.blocks = nnx.List([Block(d, heads, rngs=rngs) for _ in range(layers)])
        self.ln = nnx.LayerNorm(d, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens) + self.pos[: tokens.shape[-1]]
        for block in self.blocks:
            x = block(x)
        return self.embed.attend(self.ln(x))


def make_model(vocab: int) -> LM:
    return LM(vocab, rngs=nnx.Rngs(0))


def loss_fn(
    graphdef: nnx.GraphDef[LM], params: nnx.State[str, Any], tokens: jax.Array
) -> jax.Array:
    """Mean next-token cross-entropy of ``tokens`` (``[..., SEQ + 1]``)."""
    logits = nnx.merge(graphdef, params)(tokens[..., :-1])
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, tokens[..., 1:]))


def windows(ids: jax.Array, starts: jax.Array) -> jax.Array:
    """The ``SEQ + 1`` tokens from each start: ``starts.shape + (SEQ + 1,)``."""
    return ids[starts[..., None] + jnp.arange(SEQ + 1)]


def eval_windows(ids: npt.NDArray[np.int32]) -> jax.Array:
    """The eval text cut into consecutive, non-overlapping windows."""
    count = (len(ids) - 1) // SEQ
    return windows(jnp.asarray(ids), jnp.arange(count) * SEQ)


def build_job(tokens: Tokens, epochs: int) -> jaxjob.Job:
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: make_model(tokens.vocab)))  # code, not state
    train = jnp.asarray(tokens.train)
    job = jaxjob.Job()

    @job.init_group.task
    def init(ws: jaxjob.Workspace) -> dict[str, Any]:
        _, params = nnx.split(make_model(tokens.vocab))  # the state: a pytree of nnx.Param
        return {"params": params, "opt_state": tx.init(params), "rng": jax.random.key(1)}

    @job.epoch_group.task
    def train_epoch(ws: jaxjob.Workspace) -> dict[str, Any]:
        rng, key = jax.random.split(ws["rng"])
        starts = jax.random.randint(key, (STEPS, BATCH), 0, len(train) - SEQ - 1)

        def step(carry: tuple[nnx.State[str, Any], Any], batch: jax.Array) -> Any:
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn, argnums=1)(graphdef, params, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        carry = (ws["params"], ws["opt_state"])
        (params, opt_state), losses = jax.lax.scan(step, carry, windows(train, starts))
        return {"params": params, "opt_state": opt_state, "rng": rng, "loss": losses.mean()}

    jaxjob.epoch_limiter(job, epochs)
    return job


def train(args: argparse.Namespace) -> None:
    job = build_job(tokenize(corpus()), args.epochs)
    ckpt = jaxjob.CheckpointManager(
        args.ckpt_dir,
        local=jaxjob.LocalTier(args.local_dir + "/{process}", every_epochs=1),  # keeps 2
        keep=jaxjob.keep.Last(2),
    )
    session = jaxjob.Session()
    runner = jaxjob.JobRunner(
        job,
        ckpt,
        progress=["loss"],
        save_every_epochs=args.save_every_epochs,  # to --ckpt-dir; the local tier: the others
        # preemption_signals=(signal.SIGTERM,) is the default: save the epoch, raise Preempted
    )
    last = runner.train(session)  # on SIGTERM: saves the running epoch, raises jaxjob.Preempted
    log.info("done: epoch %d", last)


def evaluate(args: argparse.Namespace) -> float:
    """Restores the newest checkpoint's parameters into a fresh model; returns its eval loss.

    Only the ``params`` leaves are read (no optimizer state), and no job is built.
    """
    tokens = tokenize(corpus())
    graphdef, like = nnx.split(nnx.eval_shape(lambda: make_model(tokens.vocab)))  # no arrays
    restored = jaxjob.restore(args.ckpt_dir, leaves=["params"], target={"params": like})
    model = nnx.merge(graphdef, restored["params"])  # an LM holding the saved parameters
    held_out = eval_windows(tokens.eval)
    logits = model(held_out[:, :-1])
    loss = float(optax.softmax_cross_entropy_with_integer_labels(logits, held_out[:, 1:]).mean())
    log.info("eval: loss %.4f, perplexity %.3f", loss, math.exp(loss))
    return loss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10, help="total epochs (default 10)")
    parser.add_argument("--ckpt-dir", default="runs/nnx_lm", help="the durable checkpoint tier")
    parser.add_argument(
        "--local-dir",
        default="runs/nnx_lm_local",
        help="the local tier, saved every epoch: one directory per process inside it",
    )
    parser.add_argument(
        "--save-every-epochs", type=int, default=5, help="epochs between saves to --ckpt-dir"
    )
    parser.add_argument(
        "--eval", action="store_true", help="evaluate the newest checkpoint in --ckpt-dir"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", force=True)
    for name in ("nnx_lm", "jaxjob"):  # what jaxjob did (resumed, finished) and the results
        logging.getLogger(name).setLevel(logging.INFO)
    if args.eval:
        evaluate(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
