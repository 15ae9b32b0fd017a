"""Model presets for the planner: the GPT-2 family (OpenAI's sizes, vocabulary padded to 50304)
and, as shapes only (`jaxhc.plan.shapes`), LLaMA 7B-65B."""

from __future__ import annotations

import os

import yaml

from jaxhc.model.config import GPTConfig

MODELS = {
    "gpt2-small": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
}


def load_model(name_or_path: str) -> GPTConfig:
    """A preset name or a YAML file of `GPTConfig` keys (a ``model:`` section is accepted)."""
    if name_or_path in MODELS:
        return MODELS[name_or_path]
    if not name_or_path.endswith((".yaml", ".yml")):
        raise ValueError(
            f"--model {name_or_path!r}: use a preset ({', '.join(MODELS)}) or a YAML path"
        )
    if not os.path.exists(name_or_path):
        raise ValueError(f"--model {name_or_path!r} does not exist")
    with open(name_or_path) as f:
        data = yaml.safe_load(f) or {}
    data = data.get("model", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise ValueError(f"{name_or_path}: expected a mapping of model keys")
    try:
        return GPTConfig(**data)
    except TypeError as e:
        raise ValueError(f"{name_or_path}: {e}") from None


SHAPE_KEYS = ("layers", "width", "heads", "ffn", "vocab", "swiglu", "positions")


def load_shape(name_or_path: str):
    """The planner's `ModelShape` of a preset (GPT-2 or LLaMA) or a YAML file: GPTConfig keys
    (a model jaxhc trains) or the shape keys layers, width, heads, ffn, vocab[, swiglu,
    positions] (a ``model:`` section is accepted)."""
    from jaxhc.plan.shapes import LLAMA, ModelShape, from_gpt

    if name_or_path in LLAMA:
        return LLAMA[name_or_path]
    if name_or_path in MODELS:
        return from_gpt(name_or_path, MODELS[name_or_path])
    if not name_or_path.endswith((".yaml", ".yml")):
        names = ", ".join([*MODELS, *LLAMA])
        raise ValueError(f"--model {name_or_path!r}: use a preset ({names}) or a YAML path")
    if not os.path.exists(name_or_path):
        raise ValueError(f"--model {name_or_path!r} does not exist")
    with open(name_or_path) as f:
        data = yaml.safe_load(f) or {}
    data = data.get("model", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise ValueError(f"{name_or_path}: expected a mapping of model keys")
    if data and set(data) <= set(SHAPE_KEYS):
        missing = [k for k in SHAPE_KEYS[:5] if k not in data]
        if missing:
            raise ValueError(f"{name_or_path}: model key {missing[0]!r} is missing")
        return ModelShape(name=os.path.basename(name_or_path), **data)
    return from_gpt(os.path.basename(name_or_path), load_model(name_or_path))
