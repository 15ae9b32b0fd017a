"""The planner's view of a model: its shapes only (layers, width, heads, FFN size, vocabulary).

`ModelShape` describes GPT-2 (LayerNorm, gelu MLP of two matrices, learned positions, tied head:
what `jaxhc.model.gpt` trains) and LLaMA (RMSNorm, SwiGLU MLP of three matrices, rotary positions,
untied head), which jaxhc does not train: the planner needs nothing but the counts below.

Parameters per layer: attention 4 h^2 (+ 4 h biases, GPT-2), MLP 2 h f (+ f + h biases, GPT-2)
or 3 h f (SwiGLU), norms 2 x 2h (LayerNorm) or 2 h (RMSNorm). Whole model: L layers, the token
embedding V h, the head V h unless tied, learned positions S h, the final norm.
"""

from __future__ import annotations

import dataclasses

from jaxhc.model.config import GPTConfig


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    width: int
    heads: int
    ffn: int
    vocab: int
    swiglu: bool = False  # LLaMA: RMSNorm, three MLP matrices, no biases, untied head
    positions: int = 0  # learned position rows (GPT-2: block_size)
    gpt: GPTConfig | None = None  # the config jaxhc trains, when it is one

    def __post_init__(self):
        for key in ("layers", "width", "heads", "ffn", "vocab"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model {self.name}: {key}={v!r} must be a positive integer")
        if self.width % self.heads:
            raise ValueError(
                f"model {self.name}: width={self.width} is not divisible by heads={self.heads}"
            )

    @property
    def tied(self) -> bool:
        return not self.swiglu

    def layer_params(self) -> int:
        h, f = self.width, self.ffn
        if self.swiglu:
            return 4 * h * h + 3 * h * f + 2 * h
        return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h

    def embedding_params(self) -> int:
        """Token embedding, head (when untied), positions, final norm."""
        h = self.width
        head = 0 if self.tied else self.vocab * h
        return self.vocab * h + head + self.positions * h + (h if self.swiglu else 2 * h)

    def paired_params(self, positions: bool = False) -> int:
        """Parameters whose gradients a pipeline's first and last stage sum (jaxhc's GPT: the
        tied token embedding, which both read, and the final norm, read by the last stage and
        kept canonical on the first; the positions, the first stage's alone, only with
        `positions`: under a lossy data codec); LLaMA: none counted (its untied embedding and
        head sit on the end stages)."""
        if self.swiglu:
            return 0
        return (
            self.vocab * self.width
            + 2 * self.width
            + (self.positions * self.width if positions else 0)
        )

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params()

    def device_params(self, tensor: int, pipe: int) -> int:
        """Parameters on the busiest device of a tensor x pipe split (Megatron: matrices and the
        vocabulary split over tensor, layers over pipe, embedding and head on the end stages;
        norms and biases counted as split too, a rounding of < 0.1 %)."""
        layers = self.layers // pipe * self.layer_params()
        h = self.width
        embed = self.vocab * h + self.positions * h
        head = 0 if self.tied else self.vocab * h
        ends = embed + head if pipe == 1 else max(embed, head)
        return -(-(layers + ends) // tensor)

    def activation_bytes(self, tokens: int, tensor: int, elem: int, recompute: bool) -> int:
        """Bytes one layer keeps for its backward pass for `tokens` = micro-batch x sequence
        tokens (sequence length `seq` enters through `attention_bytes`): without recomputation,
        the inputs of every matrix product and norm, Q, K, V and the MLP's hidden values (split
        over tensor) in `elem`-byte compute values; with it, the layer input only."""
        h, f, t = self.width, self.ffn, tensor
        if recompute:
            return elem * tokens * h
        attn = 2 * h + 4 * h // t  # norm in, QKV in (replicated), Q K V, projection in (split)
        mlp = 2 * h + (4 if self.swiglu else 2) * f // t  # norm in, MLP in; hidden values
        return elem * tokens * (attn + mlp)

    def attention_bytes(self, batch: int, seq: int, tensor: int, elem: int) -> int:
        """The softmax probabilities of one layer: heads/tensor x batch x seq^2 values."""
        return elem * (self.heads // tensor) * batch * seq * seq


def from_gpt(name: str, cfg: GPTConfig) -> ModelShape:
    return ModelShape(
        name=name,
        layers=cfg.n_layer,
        width=cfg.n_embd,
        heads=cfg.n_head,
        ffn=4 * cfg.n_embd,
        vocab=cfg.vocab_size,
        positions=cfg.block_size,
        gpt=cfg,
    )


# LLaMA (Touvron et al. 2023, Table 2; FFN sizes of the released checkpoints); vocab 32000.
LLAMA = {
    "llama-7b": ModelShape("llama-7b", 32, 4096, 32, 11008, 32000, swiglu=True),
    "llama-13b": ModelShape("llama-13b", 40, 5120, 40, 13824, 32000, swiglu=True),
    "llama-30b": ModelShape("llama-30b", 60, 6656, 52, 17920, 32000, swiglu=True),
    "llama-65b": ModelShape("llama-65b", 80, 8192, 64, 22016, 32000, swiglu=True),
}
