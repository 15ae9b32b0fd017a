"""The planner's view of a model: its shapes only (layers, width, heads, FFN size, vocabulary).

`ModelShape` describes GPT-2 (LayerNorm, gelu MLP of two matrices, learned positions, tied head)
and LLaMA (RMSNorm, SwiGLU MLP of three matrices, rotary positions, grouped-query attention, a head
tied or not), both of which `jaxhc.model.gpt` trains (``gpt``: the config, when there is one): the
planner needs nothing but the counts below.

Parameters per layer: attention 2 h^2 + 2 h k (k = h x kv_heads / heads: the key and value
projections; + 4 h biases, GPT-2), MLP 2 h f (+ f + h biases, GPT-2) or 3 h f (SwiGLU), norms
2 x 2h (LayerNorm) or 2 h (RMSNorm). Whole model: L layers, the token embedding V h, the head V h
unless tied, learned positions S h, the final norm.
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
    kv_heads: int | None = None  # key/value heads (None: heads)
    tie: bool | None = None  # a head tied to the embedding (None: GPT-2 yes, LLaMA no)

    def __post_init__(self):
        for key in ("layers", "width", "heads", "ffn", "vocab"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model {self.name}: {key}={v!r} must be a positive integer")
        if self.width % self.heads:
            raise ValueError(
                f"model {self.name}: width={self.width} is not divisible by heads={self.heads}"
            )
        kv = self.kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1):
            raise ValueError(f"model {self.name}: kv_heads={kv!r} must be a positive integer")
        if kv is not None and self.heads % kv:
            raise ValueError(
                f"model {self.name}: heads={self.heads} is not divisible by kv_heads={kv}"
            )

    @property
    def tied(self) -> bool:
        return not self.swiglu if self.tie is None else self.tie

    @property
    def kv_width(self) -> int:
        """The width of the key (and of the value) projection."""
        heads = self.heads if self.kv_heads is None else self.kv_heads
        return self.width // self.heads * heads

    def layer_params(self) -> int:
        h, f = self.width, self.ffn
        attention = 2 * h * h + 2 * h * self.kv_width
        if self.swiglu:
            return attention + 3 * h * f + 2 * h
        return attention + 4 * h + 2 * h * f + f + h + 4 * h

    def embedding_params(self) -> int:
        """Token embedding, head (when untied), positions, final norm."""
        h = self.width
        head = 0 if self.tied else self.vocab * h
        return self.vocab * h + head + self.positions * h + (h if self.swiglu else 2 * h)

    def shared_params(self) -> dict[str, int]:
        """The parameters every pipeline stage holds, by jaxhc's name (`jaxhc.parallel.layout.
        SHARED`): the token embedding, the positions, the final norm, the untied head."""
        h = self.width
        out = {"wte": self.vocab * h, "ln_f": h if self.swiglu else 2 * h}
        if self.positions:
            out["wpe"] = self.positions * h
        if not self.tied:
            out["lm_head"] = self.vocab * h
        return out

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
        ffn=cfg.ffn,
        vocab=cfg.vocab_size,
        swiglu=cfg.llama,
        positions=0 if cfg.llama else cfg.block_size,
        gpt=cfg,
        kv_heads=cfg.kv_heads if cfg.llama else None,
        tie=cfg.tied,
    )


def _llama(n_layer: int, n_embd: int, n_head: int, ffn: int) -> GPTConfig:
    return GPTConfig(
        arch="llama",
        vocab_size=32000,
        block_size=2048,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        intermediate_size=ffn,
        layer_norm_eps=1e-6,
    )


# LLaMA (Touvron et al. 2023, Table 2; FFN sizes of the released checkpoints); vocab 32000,
# context 2048, an untied head: models jaxhc trains (`jaxhc.model.gpt`, ``arch: llama``).
LLAMA_CONFIGS = {
    "llama-7b": _llama(32, 4096, 32, 11008),
    "llama-13b": _llama(40, 5120, 40, 13824),
    "llama-30b": _llama(60, 6656, 52, 17920),
    "llama-65b": _llama(80, 8192, 64, 22016),
}
LLAMA = {name: from_gpt(name, cfg) for name, cfg in LLAMA_CONFIGS.items()}
