"""Configuration of the GPT model, the device mesh and the optimizer; one-line validation errors.

Errors name the configuration key they are about (``model.n_head``, ``mesh.tensor``, ...), so the
command line can show them as they are.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxhc._checks import whole_number
from jaxhc.schema import structure

AXES = ("data", "tensor", "pipe")
COMPUTE_DTYPES = ("float32", "bfloat16")


ARCHS = ("gpt2", "llama")
# Keys of the LLaMA architecture alone (None: its default, see the properties of GPTConfig).
LLAMA_KEYS = ("n_kv_head", "intermediate_size", "rope_theta", "tie_word_embeddings")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """A decoder-only transformer: ``arch`` ``gpt2`` or ``llama``.

    ``gpt2``: learned positions, pre-LayerNorm blocks with biases, gelu (tanh) MLP of 4 x
    ``n_embd`` units, tied LM head. ``llama``: rotary positions (``rope_theta``), RMSNorm, SwiGLU
    MLP of ``intermediate_size`` units, ``n_kv_head`` key/value heads (grouped-query attention;
    1: multi-query), no biases, a head tied to the embedding or not (``tie_word_embeddings``).
    ``layer_norm_eps`` is the epsilon of either norm. The `LLAMA_KEYS` stay unset (None) for
    ``gpt2``; for ``llama`` None means: ``n_kv_head = n_head``, ``intermediate_size`` = LLaMA's
    rule (2/3 of 4 x ``n_embd``, rounded up to a multiple of 256), ``rope_theta = 10000``, an
    untied head.

    Parameters are always float32; ``dtype`` is the compute (activation) dtype.
    """

    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dtype: str = "float32"
    layer_norm_eps: float = 1e-5
    arch: str = "gpt2"
    n_kv_head: int | None = None
    intermediate_size: int | None = None
    rope_theta: float | None = None
    tie_word_embeddings: bool | None = None

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
        if self.arch not in ARCHS:
            raise ValueError(f"model.arch={self.arch!r} must be one of {', '.join(ARCHS)}")
        if self.arch == "llama":
            self._check_llama()
        else:
            for key in LLAMA_KEYS:
                if getattr(self, key) is not None:
                    raise ValueError(f"model.{key} is a key of model.arch=llama, not {self.arch}")

    def _check_llama(self):
        for key in ("n_kv_head", "intermediate_size"):
            if getattr(self, key) is not None:
                whole_number(f"model.{key}", getattr(self, key))
        if self.n_head % self.kv_heads:
            raise ValueError(
                f"model.n_head={self.n_head} is not divisible by model.n_kv_head={self.kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"model.n_embd / model.n_head = {self.head_dim} must be even (rotary positions)"
            )
        theta = self.rope_theta
        number = isinstance(theta, (int, float)) and not isinstance(theta, bool)
        if theta is not None and not (number and theta > 1):
            raise ValueError(f"model.rope_theta={theta!r} must be a number > 1")
        if self.tie_word_embeddings not in (None, True, False):
            raise ValueError(
                f"model.tie_word_embeddings={self.tie_word_embeddings!r} must be true or false"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def llama(self) -> bool:
        return self.arch == "llama"

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``n_head`` but for LLaMA's grouped-query attention)."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def ffn(self) -> int:
        """Hidden units of the MLP."""
        if not self.llama:
            return 4 * self.n_embd
        if self.intermediate_size is not None:
            return self.intermediate_size
        return -(-(8 * self.n_embd // 3) // 256) * 256

    @property
    def theta(self) -> float:
        """The rotary base (LLaMA)."""
        return 10000.0 if self.rope_theta is None else float(self.rope_theta)

    @property
    def tied(self) -> bool:
        """Whether the LM head is the token embedding."""
        if self.tie_word_embeddings is None:
            return not self.llama
        return self.tie_word_embeddings


GATHERS = ("layer", "whole", "keep")  # how sharded parameters are gathered (`ShardConfig.gather`)


@dataclasses.dataclass(frozen=True)
class ShardConfig:
    """How parameters, gradients and optimizer state are split over the "data" axis (AMSP).

    ``params``, ``grads``, ``optim``: the size of the group of data ranks that shares one copy of
    each (1: every rank holds all of it; ``mesh.data``: each rank 1/data of it). Unset: ``optim``
    = data, ``grads`` = optim, ``params`` = 1, which is jaxhc's ZeRO (gradients reduce-scattered,
    the optimizer state split over the whole data axis). ``groups``: the nested group sizes of the
    data axis (innermost first; a device's neighbours in a node before other nodes) along which
    gradients are reduced, a group before the next: every plan on the same groups reduces in the
    same order, so its losses are the same bit for bit. Unset: the plan's own sizes.
    ``gather`` (sharded parameters, params > 1): ``layer`` (default) gathers each transformer
    layer's parameters just before it runs, forward and again backward, so a device holds one
    layer's at a time (ZeRO-3); ``whole`` gathers all of them once per step, in fewer, larger
    messages (high-latency links), and holds them through the backward; ``keep`` gathers each
    layer's in the forward, the next layer's while one runs where the transport can start a
    gather, and holds them through the backward (`jaxhc.parallel.keep`: ZeRO-1's bits and memory
    during the step, and the all-gather after ZeRO-1's update overlapped with the next forward).
    """

    params: int | None = None
    grads: int | None = None
    optim: int | None = None
    groups: tuple[int, ...] | None = None
    gather: str = "layer"

    def __post_init__(self):
        for key in ("params", "grads", "optim"):
            if getattr(self, key) is not None:
                whole_number(f"mesh.shard.{key}", getattr(self, key))
        if self.groups is not None:
            if not isinstance(self.groups, (list, tuple)):
                raise ValueError(f"mesh.shard.groups={self.groups!r} must be a list of sizes")
            for g in self.groups:
                whole_number("mesh.shard.groups", g)
            object.__setattr__(self, "groups", tuple(self.groups))
        if self.gather not in GATHERS:
            raise ValueError(
                f"mesh.shard.gather={self.gather!r} must be one of {', '.join(GATHERS)}"
            )

    def resolve(self, data: int) -> tuple[int, int, int, tuple[int, ...]]:
        """(params, grads, optim, levels) on a data axis of `data` ranks, or a one-line error
        naming the rule a size breaks. `levels`: the group sizes the reduction nests over,
        innermost first, ending with `data`.

        >>> ShardConfig(grads=2, optim=4).resolve(8)
        Traceback (most recent call last):
        ValueError: mesh.shard.grads=2 must equal mesh.shard.params=1 or mesh.shard.optim=4 (AMSP)
        """
        optim = data if self.optim is None else self.optim
        grads = optim if self.grads is None else self.grads
        params = 1 if self.params is None else self.params
        sizes = {"params": params, "grads": grads, "optim": optim}
        for key in ("optim", "grads", "params"):  # a default follows optim: name optim first
            size = sizes[key]
            if data % size:
                raise ValueError(f"mesh.shard.{key}={size} does not divide mesh.data={data}")
        for low, high in (("params", "grads"), ("grads", "optim")):
            if sizes[high] % sizes[low]:
                raise ValueError(
                    f"mesh.shard.{low}={sizes[low]} must divide mesh.shard.{high}={sizes[high]} "
                    "(AMSP: params <= grads <= optim, each dividing the next)"
                )
        if grads not in (params, optim):
            raise ValueError(
                f"mesh.shard.grads={grads} must equal mesh.shard.params={params} or "
                f"mesh.shard.optim={optim} (AMSP)"
            )
        if self.groups is None:
            levels = sorted({s for s in sizes.values() if 1 < s < data})
        else:
            levels = list(self.groups)
            # no groups (a plan file's data axis of one level, data 1 included): nothing nested
            nested = zip([1, *levels], [*levels, data], strict=True) if levels else ()
            for low, high in nested:
                if high % low or high == low:
                    raise ValueError(
                        f"mesh.shard.groups={list(self.groups)}: each size must be a proper "
                        f"divisor of the next and of mesh.data={data}"
                    )
            for key in ("optim", "grads", "params"):
                size = sizes[key]
                if size not in (1, data, *levels):
                    raise ValueError(
                        f"mesh.shard.{key}={size} is not 1, mesh.data={data} or one of "
                        f"mesh.shard.groups={list(self.groups)}"
                    )
        return params, grads, optim, (*levels, data)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Devices along each mesh axis, the pipeline's micro-batches per step, and how the
    parameters, gradients and optimizer state are split over "data" (`ShardConfig`)."""

    data: int = 1
    tensor: int = 1
    pipe: int = 1
    microbatches: int = 1
    shard: ShardConfig = ShardConfig()

    def __post_init__(self):
        for key in (*AXES, "microbatches"):
            whole_number(f"mesh.{key}", getattr(self, key))
        shard = self.shard
        if isinstance(shard, dict):
            shard = structure(ShardConfig, shard, prefix="mesh.shard")
        elif shard is None:
            shard = ShardConfig()
        elif not isinstance(shard, ShardConfig):
            raise ValueError(f"mesh.shard={shard!r} must be a mapping (params, grads, optim)")
        object.__setattr__(self, "shard", shard)
        shard.resolve(self.data)  # a one-line error now rather than at the first step

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
    if model is not None and model.llama:
        for key, value in (("n_kv_head", model.kv_heads), ("intermediate_size", model.ffn)):
            if value % mesh.tensor:
                raise ValueError(
                    f"model.{key}={value} is not divisible by mesh tensor={mesh.tensor}"
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
