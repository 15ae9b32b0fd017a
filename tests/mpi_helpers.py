"""Shared pieces of the MPI tests: meshes, codecs (with skip reasons), programs, inputs."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc.codecs import Codec, Encoded, Identity

AXES = {1: ("data",), 2: ("data", "tensor"), 3: ("pipe", "data", "tensor")}
MESHES = [(2,), (1, 2), (4,), (2, 2), (1, 2, 2)]


class Reference:
    """A value made by rank 0 alone (the XLA transport's reference) and given to every rank by
    `get`. A test makes it before its MPI programs and gets it after them: meanwhile the other
    ranks trace and compile theirs instead of waiting in the broadcast (the MPI suite's time)."""

    def __init__(self, make):
        from mpi4py import MPI

        self._world = MPI.COMM_WORLD
        self._value = make() if self._world.Get_rank() == 0 else None

    def get(self):
        return self._world.bcast(self._value, root=0)


def mesh_shape(shape) -> dict[str, int]:
    return dict(zip(AXES[len(shape)], shape, strict=True))


def mesh_id(shape) -> str:
    return "x".join(map(str, shape))


@dataclasses.dataclass(frozen=True)
class FiniteIdentity(Codec):
    """The identity payload with a lossy codec's promise: `ok` only for finite input.

    It drives the agreement round and the `lax.cond` fallback through the transports without the
    native codecs: a NaN on any rank must send every rank down the raw path.
    """

    lossless = False

    @property
    def spec(self) -> str:
        return "finite-identity"

    def payload_bytes(self, n, dtype):
        return Identity().payload_bytes(n, dtype)

    def encode(self, x):
        enc = Identity().encode(x)
        return Encoded(enc.payload, jnp.isfinite(x).all(), enc.nbytes)

    def decode(self, payload, shape, dtype):
        return Identity().decode(payload, shape, dtype)


CODECS = {
    "raw": None,
    "none": "none",
    "finite": FiniteIdentity(),
    "mpc": "mpc",
    "mpc0.9": "mpc:0.9",
    "zfp8": "zfp:8",
    "q8": "q8",
    "q8sr": "q8:sr",  # no fused MPI call: the unfused algorithms over the MPI transport
}


def mpi_ready() -> str | None:
    """Why MPI runs cannot happen here (None when mpirun, mpi4py and mpi4jax are all there).

    Looks the modules up without importing them: importing mpi4py initializes MPI in this process.
    """
    if shutil.which("mpirun") is None:
        return "mpirun not found (make test installs openmpi-bin)"
    for mod in ("mpi4py", "mpi4jax"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed; `make test` installs the [mpi] extra"
    return None


def skip_unless_fused_under_mpirun() -> None:
    """Skip the calling test module unless it runs under mpirun with the fused MPI collectives
    built (call it before importing mpi4py: that would MPI_Init a process outside mpirun)."""
    import pytest

    if mpi_ready():
        pytest.skip(mpi_ready(), allow_module_level=True)
    if "OMPI_COMM_WORLD_SIZE" not in os.environ:
        pytest.skip("runs under mpirun (make test-mpi)", allow_module_level=True)
    from jaxhc.transport import _mpi_fused

    if not _mpi_fused.available():
        pytest.skip(
            "jaxhc was built without an MPI library (no _jaxhc_mpi)", allow_module_level=True
        )


# --- the per-shard program every transport must agree on ----------------------------------------


def axis_choices(axes, full=True):
    """full: each single axis, then all axes together in mesh order and reversed.

    Otherwise (to keep compile time down where the codec, not the axis mapping, is under test):
    the last axis alone and all axes together, reversed.
    """
    if not full:
        return [axes[-1]] + ([tuple(reversed(axes))] if len(axes) > 1 else [])
    out = [a for a in axes]
    if len(axes) > 1:
        out += [tuple(axes), tuple(reversed(axes))]
    return out


def collectives_body(axes, codec, full=True):
    """A per-shard function running all five collectives over the axis choices."""

    def body(x):
        out = {}
        for ax in axis_choices(axes, full):
            k = ax if isinstance(ax, str) else "+".join(ax)
            parts = jaxhc.axis_size(ax)
            out[f"psum/{k}"] = jaxhc.psum(x, ax, codec=codec)
            out[f"all_gather/{k}"] = jaxhc.all_gather(x, ax, codec=codec)
            out[f"all_gather_tiled/{k}"] = jaxhc.all_gather(x, ax, axis=1, tiled=True, codec=codec)
            out[f"psum_scatter/{k}"] = jaxhc.psum_scatter(
                x, ax, scatter_dimension=1, tiled=True, codec=codec
            )
            shift = [(i, (i + 1) % parts) for i in range(parts)]
            out[f"ppermute/{k}"] = jaxhc.ppermute(x, ax, shift, codec=codec)
            if parts > 1:  # rank 0 only sends, rank 1 only receives, the rest do neither
                out[f"ppermute_partial/{k}"] = jaxhc.ppermute(x, ax, [(0, 1)], codec=codec)
            out[f"all_to_all/{k}"] = jaxhc.all_to_all(x, ax, 1, 0, tiled=True, codec=codec)
            rows = x[:parts] if x.shape[0] >= parts else jnp.tile(x, (parts, 1))[:parts]
            out[f"all_to_all_untiled/{k}"] = jaxhc.all_to_all(rows, ax, 0, 1, codec=codec)
        # every output is stacked per shard (leading dim of 1, out_spec over all axes)
        return {k: v[None] for k, v in out.items()}

    return body


def error_feedback_body(axes, codec):
    """psum and psum_scatter with error feedback from a non-zero residual: outputs, residuals."""

    def body(x):
        out = {}
        old = 0.01 * jnp.sin(x)
        for ax in axis_choices(axes, full=False):
            k = ax if isinstance(ax, str) else "+".join(ax)
            out[f"psum/{k}"], out[f"psum_residual/{k}"] = jaxhc.psum(
                x, ax, codec=codec, residual=old
            )
            out[f"psum_scatter/{k}"], out[f"psum_scatter_residual/{k}"] = jaxhc.psum_scatter(
                x, ax, scatter_dimension=1, tiled=True, codec=codec, residual=old
            )
        return {k: v[None] for k, v in out.items()}

    return body


def buckets_body(axes, codec):
    """psum of a pytree (float32 of several sizes and magnitudes, 0-d, bfloat16, int32): its
    buckets (one message per dtype) and, where the codec is lossy, each leaf's block alignment."""

    def body(x):
        tree = {
            "w": x,
            "b": x[0, :5] * 1e-3,
            "s": x[1, 2],
            "h": x[:, :7].astype(jnp.bfloat16),
            "h2": x[0, 9:].astype(jnp.bfloat16),
            "i": (x[:2] * 100).astype(jnp.int32),
        }
        out = {}
        for ax in axis_choices(axes, full=False):
            k = ax if isinstance(ax, str) else "+".join(ax)
            for name, v in jaxhc.psum(tree, ax, codec=codec).items():
                out[f"psum/{k}/{name}"] = v
        return {k: v[None] for k, v in out.items()}

    return body


def body_specs(axes):
    return P(tuple(axes)), P(tuple(axes))


def global_input(shape, *, dtype=np.float32, rows=4, cols=64, nan_at=None, seed=0):
    """(devices * rows, cols) values spanning magnitudes, so reduction order shows in the bits."""
    n = math.prod(shape)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n * rows, cols)) * np.exp(rng.uniform(-4, 4, (n * rows, cols)))
    x = x.astype(dtype)
    if nan_at is not None:
        x[nan_at * rows, 3] = np.nan
    return x


def loss_body(axes, codec):
    """A scalar per-shard loss through every collective, for gradients (check_vma=False rules)."""

    def body(x):
        total = 0.0
        for ax in axis_choices(axes, full=False):
            parts = jaxhc.axis_size(ax)
            w = jnp.cos(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape))
            total += jnp.sum(jaxhc.psum(x, ax, codec=codec) * w)
            total += jnp.sum(jaxhc.all_gather(x, ax, axis=1, tiled=True, codec=codec) ** 2)
            total += jnp.sum(
                jaxhc.psum_scatter(x * w, ax, scatter_dimension=1, tiled=True, codec=codec)
            )
            shift = [(i, (i + 1) % parts) for i in range(parts)]
            total += jnp.sum(jaxhc.ppermute(x, ax, shift, codec=codec) * w)
            total += jnp.sum(jnp.sin(jaxhc.all_to_all(x, ax, 1, 0, tiled=True, codec=codec)))
        return total

    def grad_body(x):
        return jax.grad(body)(x)

    return grad_body


def assert_on_every_rank(bad: list[str]) -> None:
    """Fail on every rank, naming each rank's findings, if any rank found something (a rank that
    failed alone would leave the others waiting in their next collective)."""
    from mpi4py import MPI

    everyone = MPI.COMM_WORLD.allgather(bad)
    lines = [f"rank {r}: {k}" for r, ks in enumerate(everyone) for k in ks]
    assert not lines, "\n".join(lines)


def xla_losses(cfg, steps: int = 2) -> list:
    """The losses of `steps` train steps of `cfg` on the XLA transport (its mesh on this
    process's host devices), on the batches the MPI tests feed (seed 0, 8 rows of 17 tokens)."""
    from jaxhc.parallel import init_state, make_mesh, make_train_step

    mesh = make_mesh(cfg.mesh, jax.devices()[: cfg.mesh.size])
    step = make_train_step(cfg.model, cfg.mesh, cfg.optim, mesh, cfg.policy)
    state = init_state(cfg.model, cfg.mesh, cfg.optim, mesh, cfg.train.seed, policy=cfg.policy)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        tokens = rng.integers(0, cfg.model.vocab_size, (8, 17), dtype=np.int32)
        state, metrics = step(state, tokens)
        losses.append(np.float32(metrics["loss"]))
    return losses


def bits_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def raw_body(axes, ops=jaxhc):
    """The raw (codec=None) collectives on several dtypes, over all axes together, through `ops`:
    jaxhc (either transport), or jax.lax directly (the oracle for the XLA transport)."""
    ax = tuple(axes)

    def body(xs):
        out = {}
        for name, x in xs.items():
            out[f"psum/{name}"] = ops.psum(x, ax)
            out[f"psum_scatter/{name}"] = ops.psum_scatter(x, ax, scatter_dimension=1, tiled=True)
            out[f"all_gather/{name}"] = ops.all_gather(x, ax, axis=1, tiled=True)
            out[f"all_to_all/{name}"] = ops.all_to_all(x, ax, 1, 0, tiled=True)
        return {k: v[None] for k, v in out.items()}

    return body
