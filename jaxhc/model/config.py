"""Configuration of the GPT model, the device mesh and the optimizer; one-line validation errors.

Errors name the configuration key they are about (``model.n_head``, ``mesh.tensor``, ...), so the
command line can show them as they are.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxhc._checks import whole_number

AXES = ("data", "tensor", "pipe")
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """GPT-2 architecture: learned positions, pre-LayerNorm blocks, gelu (tanh), tied LM head.

    Parameters are always float32; ``dtype`` is the compute (activation) dtype.
    """

    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dtype: str = "float32"
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            whole_number(f"model.{key}", getattr(self, key))
        if self.n_embd % self.n_head:
            raise ValueError(
                f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}"
            )
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"model.dtype={self.dtype!r} must be one of {', '.join(COMPUTE_DTYPES)}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Devices along each mesh axis and the pipeline's micro-batches per step."""

    data: int = 1
    tensor: int = 1
    pipe: int = 1
    microbatches: int = 1

    def __post_init__(self):
        for key in (*AXES, "microbatches"):
            whole_number(f"mesh.{key}", getattr(self, key))

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.tensor, self.pipe)

    @property
    def size(self) -> int:
        return self.data * self.tensor * self.pipe


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW, linear warm-up then cosine decay to ``lr * min_lr_ratio``, global-norm clipping.

    Weight decay applies to matrices and embeddings, not to biases and LayerNorm parameters.
    ``grad_clip=0`` turns clipping off.
    """

    lr: float = 6e-4
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 100
    total_steps: int = 1000
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0

    def __post_init__(self):
        for key in ("lr", "eps"):
            if not getattr(self, key) > 0:
                raise ValueError(f"optim.{key}={getattr(self, key)} must be > 0")
        for key in ("b1", "b2", "min_lr_ratio"):
            if not 0 <= getattr(self, key) <= 1:
                raise ValueError(f"optim.{key}={getattr(self, key)} must be in [0, 1]")
        for key in ("weight_decay", "grad_clip"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"optim.{key}={getattr(self, key)} must be >= 0")
        whole_number("optim.warmup_steps", self.warmup_steps, least=0)
        whole_number("optim.total_steps", self.total_steps)


def validate(
    model: GPTConfig | None,
    mesh: MeshConfig,
    *,
    batch_size: int | None = None,
    n_devices: int | None = None,
    batch_key: str = "train.batch_size",
) -> None:
    """Check that `model` and `batch_size` split over `mesh`, and `mesh` over `n_devices` devices
    (each check runs when its argument is given).

    >>> validate(GPTConfig(n_head=6), MeshConfig(tensor=4))
    Traceback (most recent call last):
    ValueError: model.n_head=6 is not divisible by mesh tensor=4
    """
    if model is not None and model.n_head % mesh.tensor:
        raise ValueError(
            f"model.n_head={model.n_head} is not divisible by mesh tensor={mesh.tensor}"
        )
    if model is not None and model.n_layer % mesh.pipe:
        raise ValueError(f"model.n_layer={model.n_layer} is not divisible by mesh pipe={mesh.pipe}")
    if batch_size is not None and batch_size % (mesh.data * mesh.microbatches):
        raise ValueError(
            f"{batch_key}={batch_size} is not divisible by mesh data x microbatches "
            f"= {mesh.data} x {mesh.microbatches}"
        )
    if n_devices is not None and mesh.size != n_devices:
        raise ValueError(
            f"mesh data x tensor x pipe = {mesh.data} x {mesh.tensor} x {mesh.pipe} = {mesh.size} "
            f"does not match the {n_devices} devices"
        )
