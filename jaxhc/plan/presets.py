"""Model presets for the planner: the GPT-2 family (OpenAI's sizes, vocabulary padded to 50304)
and LLaMA 7B-65B (`jaxhc.plan.shapes.LLAMA_CONFIGS`)."""

from __future__ import annotations

import os

from jaxhc.model.config import GPTConfig
from jaxhc.schema import read_yaml, structure

MODELS = {
    "gpt2-small": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
}


def _read_mapping(path: str, presets) -> dict:
    """The model mapping of YAML file `path` (a ``model:`` section is accepted); one-line errors
    naming `presets` when `path` is neither a preset nor a YAML file."""
    if not path.endswith((".yaml", ".yml")):
        raise ValueError(f"--model {path!r}: use a preset ({', '.join(presets)}) or a YAML path")
    if not os.path.exists(path):
        raise ValueError(f"--model {path!r} does not exist")
    data = read_yaml(path) or {}
    data = data.get("model", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of model keys")
    return data


def _gpt_config(path: str, data: dict) -> GPTConfig:
    return structure(GPTConfig, data, prefix="model", where=path)


def load_model(name_or_path: str) -> GPTConfig:
    """A preset name or a YAML file of `GPTConfig` keys (a ``model:`` section is accepted).

    >>> model = jaxhc.plan.load_model("gpt2-small")
    >>> model.n_layer, model.n_embd
    (12, 768)
    """
    from jaxhc.plan.shapes import LLAMA_CONFIGS

    presets = {**MODELS, **LLAMA_CONFIGS}
    if name_or_path in presets:
        return presets[name_or_path]
    return _gpt_config(name_or_path, _read_mapping(name_or_path, presets))


SHAPE_KEYS = ("layers", "width", "heads", "ffn", "vocab", "swiglu", "positions", "kv_heads", "tie")


def load_shape(name_or_path: str):
    """The planner's `ModelShape` of a preset (GPT-2 or LLaMA) or a YAML file: GPTConfig keys
    (a model jaxhc trains) or the shape keys layers, width, heads, ffn, vocab[, swiglu,
    positions, kv_heads, tie] (a ``model:`` section is accepted).

    >>> shape = jaxhc.plan.load_shape("llama-7b")
    >>> shape.layers, shape.width, shape.swiglu
    (32, 4096, True)
    """
    from jaxhc.plan.shapes import LLAMA, ModelShape, from_gpt

    if name_or_path in LLAMA:
        return LLAMA[name_or_path]
    if name_or_path in MODELS:
        return from_gpt(name_or_path, MODELS[name_or_path])
    data = _read_mapping(name_or_path, [*MODELS, *LLAMA])
    name = os.path.basename(name_or_path)
    if data and set(data) <= set(SHAPE_KEYS):
        return structure(ModelShape, {**data, "name": name}, kind="model", where=name_or_path)
    return from_gpt(name, _gpt_config(name_or_path, data))
