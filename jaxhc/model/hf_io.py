"""transformers GPT-2 and LLaMA folders on disk: read one into jaxhc, write jaxhc's parameters
as one.

A folder holds ``config.json`` and the weights: ``model.safetensors`` (or its sharded
``model.safetensors.index.json``), ``flax_model.msgpack`` or ``pytorch_model.bin``, looked for in
that order. safetensors are read with numpy (`safetensors.numpy`), so neither PyTorch nor Flax
models are needed; ``pytorch_model.bin`` needs torch and is read only where torch is installed.
What is written is ``config.json`` and ``model.safetensors`` in PyTorch's naming (what
``GPT2LMHeadModel.from_pretrained`` and ``FlaxGPT2LMHeadModel.from_pretrained`` both load; for
LLaMA ``LlamaForCausalLM`` and ``FlaxLlamaForCausalLM``).
"""

from __future__ import annotations

import json
import os

import numpy as np

from jaxhc.model.config import GPTConfig
from jaxhc.model.hf import (
    config_of,
    flatten,
    flax_to_torch_names,
    from_state_dict,
    hf_config,
    to_state_dict,
)
from jaxhc.schema import read_json

__all__ = ["initial_params", "load_pretrained", "read_config", "save_pretrained"]

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
MSGPACK = "flax_model.msgpack"
TORCH_BIN = "pytorch_model.bin"


def read_config(path: str) -> GPTConfig:
    """The GPTConfig of the transformers GPT-2 or LLaMA folder `path` (its config.json)."""
    file = os.path.join(path, CONFIG)
    if not os.path.isdir(path):
        raise ValueError(
            f"hf:{path}: no such folder (a local transformers GPT-2 or LLaMA checkpoint)"
        )
    data = read_json(file, f"hf:{path}: no {CONFIG} there")
    if not isinstance(data, dict):
        raise ValueError(f"{file}: not a JSON object")
    return config_of(data, file)


def load_pretrained(path: str) -> tuple[GPTConfig, dict]:
    """(GPTConfig, jaxhc's single-layout float32 parameters) of a transformers GPT-2 or LLaMA
    folder."""
    cfg = read_config(path)
    return cfg, from_state_dict(cfg, _weights(path), path)


def _weights(path: str) -> dict:
    """The folder's weights in the common form of `jaxhc.model.hf`."""
    safetensors = os.path.join(path, SAFETENSORS)
    index = os.path.join(path, SAFETENSORS_INDEX)
    if os.path.exists(safetensors):
        return _read_safetensors(safetensors)
    if os.path.exists(index):
        try:
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"{index}: not a safetensors index ({e})") from None
        state = {}
        for name in files:
            state.update(_read_safetensors(os.path.join(path, name)))
        return state
    msgpack = os.path.join(path, MSGPACK)
    if os.path.exists(msgpack):
        from flax.serialization import msgpack_restore

        try:
            with open(msgpack, "rb") as f:
                tree = msgpack_restore(f.read())
        except Exception as e:  # msgpack raises its own exception types
            raise ValueError(f"{msgpack}: not a Flax msgpack checkpoint ({e})") from None
        return flax_to_torch_names(flatten(tree))
    torch_bin = os.path.join(path, TORCH_BIN)
    if os.path.exists(torch_bin):
        return _read_torch(torch_bin)
    raise ValueError(f"hf:{path}: no weights there ({SAFETENSORS}, {MSGPACK} or {TORCH_BIN})")


def _read_safetensors(file: str) -> dict:
    from safetensors import safe_open

    try:
        with safe_open(file, framework="np") as f:
            fmt = (f.metadata() or {}).get("format", "pt")
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"{file}: not a readable safetensors file ({e})") from None
    return flax_to_torch_names(state) if fmt == "flax" else state


def _read_torch(file: str) -> dict:
    try:
        import torch
    except ImportError:
        raise ValueError(
            f"{file} needs PyTorch, which is not installed: install torch, or save the "
            "checkpoint as model.safetensors"
        ) from None
    state = torch.load(file, map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}


def save_pretrained(out: str, cfg: GPTConfig, params: dict, eos_id: int | None = None) -> None:
    """Write `params` as the transformers GPT-2 or LLaMA folder `out` (config.json,
    model.safetensors)."""
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    state = to_state_dict(cfg, params)
    save_file(state, os.path.join(out, SAFETENSORS), metadata={"format": "pt"})
    with open(os.path.join(out, CONFIG), "w") as f:
        json.dump(hf_config(cfg, eos_id), f, indent=2)
        f.write("\n")


def initial_params(model: GPTConfig, path: str) -> dict:
    """The parameters of the GPT-2 or LLaMA folder `path` for a run of `model`: its
    architecture (as `jaxhc.train.config` made it follow the folder's), with a context of
    ``model.block_size`` (GPT-2: the first positions' embeddings when it is shorter than the
    checkpoint's)."""
    cfg, params = load_pretrained(path)
    if model.block_size > cfg.block_size:
        raise ValueError(
            f"model.block_size={model.block_size} is longer than the {cfg.block_size} positions "
            f"of hf:{path}"
        )
    for key in ("arch", "vocab_size", "n_layer", "n_head", "n_embd"):
        if getattr(model, key) != getattr(cfg, key):
            raise ValueError(
                f"model.{key}={getattr(model, key)} does not match hf:{path} ({getattr(cfg, key)})"
            )
    for key, ours, theirs in (
        ("n_kv_head", model.kv_heads, cfg.kv_heads),
        ("intermediate_size", model.ffn, cfg.ffn),
        ("tie_word_embeddings", model.tied, cfg.tied),
    ):
        if ours != theirs:
            raise ValueError(f"model.{key}={ours} does not match hf:{path} ({theirs})")
    if "wpe" in params:
        params["wpe"] = np.ascontiguousarray(params["wpe"][: model.block_size])
    return params
