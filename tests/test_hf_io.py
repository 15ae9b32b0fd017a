"""transformers GPT-2 folders in and out: every weight format transformers writes (and the
PyTorch layout of hub safetensors) reads into jaxhc's GPT with transformers' logits; what jaxhc
writes loads back into transformers with jaxhc's logits; configs that do not fit are one line."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from jaxhc.model import gpt  # noqa: E402
from jaxhc.model.hf import flatten, from_state_dict  # noqa: E402
from jaxhc.model.hf_io import load_pretrained, save_pretrained  # noqa: E402
from jaxhc.train.config import load  # noqa: E402

CONFIG = dict(vocab_size=96, n_positions=24, n_embd=32, n_layer=2, n_head=4)


@pytest.fixture(scope="module")
def hf():
    return transformers.FlaxGPT2LMHeadModel(transformers.GPT2Config(**CONFIG), seed=2)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, 96, (2, 24)).astype(np.int32)


@pytest.fixture(scope="module")
def hf_logits(hf, tokens):
    return np.asarray(hf(tokens).logits)


def torch_layout(flax_params) -> dict:
    """transformers' PyTorch GPT-2 state dict of its Flax parameters, as hub safetensors hold
    it: Conv1D weights (in, out) where Flax keeps kernels (out, in); ``weight`` for embeddings
    and LayerNorm scales."""
    out = {}
    for key, value in flatten(flax_params).items():
        stem, _, leaf = key.rpartition(".")
        value = np.asarray(value)
        if leaf == "kernel":
            out[f"{stem}.weight"] = np.ascontiguousarray(value.T)
        elif leaf in ("embedding", "scale"):
            out[f"{stem}.weight"] = value
        else:
            out[key] = value
    return out


def ours(folder, tokens):
    cfg, params = load_pretrained(str(folder))
    return cfg, params, np.asarray(jax.jit(gpt.logits, static_argnums=2)(params, tokens, cfg))


@pytest.mark.parametrize("serialization", ["msgpack", "safetensors"])
def test_transformers_flax_folders_load_with_its_logits(
    hf, tokens, hf_logits, tmp_path, serialization
):
    hf.save_pretrained(tmp_path, safe_serialization=serialization == "safetensors")
    assert (
        tmp_path / ("model.safetensors" if serialization == "safetensors" else "flax_model.msgpack")
    ).exists()
    cfg, _, logits = ours(tmp_path, tokens)
    assert (cfg.vocab_size, cfg.block_size, cfg.n_layer) == (96, 24, 2)
    np.testing.assert_allclose(logits, hf_logits, atol=1e-4, rtol=1e-4)


def test_pytorch_layout_safetensors_load_with_its_logits(hf, tokens, hf_logits, tmp_path):
    from safetensors.numpy import save_file

    hf.config.save_pretrained(tmp_path)
    state = {k.removeprefix("transformer."): v for k, v in torch_layout(hf.params).items()}
    state["h.0.attn.bias"] = np.tril(np.ones((1, 1, 24, 24), np.float32))  # a mask buffer
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    _, _, logits = ours(tmp_path, tokens)
    np.testing.assert_allclose(logits, hf_logits, atol=1e-4, rtol=1e-4)


def test_what_jaxhc_writes_transformers_loads_with_the_same_logits(hf, tokens, tmp_path):
    cfg, params, logits = ours_from_model(hf, tokens, tmp_path / "in")
    save_pretrained(str(tmp_path / "out"), cfg, params)
    flax = transformers.FlaxGPT2LMHeadModel.from_pretrained(tmp_path / "out")
    np.testing.assert_allclose(np.asarray(flax(tokens).logits), logits, atol=1e-4, rtol=1e-4)
    try:
        import torch
    except ImportError:
        return
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        got = model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    np.testing.assert_allclose(got, logits, atol=1e-4, rtol=1e-4)


def ours_from_model(hf, tokens, folder):
    hf.save_pretrained(folder)
    return ours(folder, tokens)


def test_pytorch_bin_without_torch_is_one_line(hf, tmp_path):
    try:
        import torch  # noqa: F401

        pytest.skip("torch is installed")
    except ImportError:
        pass
    hf.config.save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="pytorch_model.bin needs PyTorch, which is not installed"):
        load_pretrained(str(tmp_path))


def test_the_run_config_follows_the_checkpoint(hf, tmp_path):
    hf.save_pretrained(tmp_path)
    init = f"init=hf:{tmp_path}"
    cfg = load(None, [init]).model
    assert (cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd) == (
        96,
        24,
        2,
        4,
        32,
    )
    assert load(None, [init, "model.block_size=8", "model.n_layer=2"]).model.block_size == 8
    bad = [
        (
            [init, "model.n_layer=4"],
            f"model.n_layer=4 does not match hf:{tmp_path}, whose config has 2",
        ),
        ([init, "model.block_size=32"], "model.block_size=32 does not match"),
        (["init=gpt2"], "init='gpt2' must be hf:PATH"),
        (["init=hf:/nowhere"], "hf:/nowhere: no such folder"),
    ]
    for overrides, message in bad:
        with pytest.raises(ValueError, match=message):
            load(None, overrides)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(ValueError, match="model_type 'gpt_neox' is not gpt2 or llama"):
        load(None, [init])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "mlp_bias": True}))
    with pytest.raises(ValueError, match="mlp_bias: jaxhc's LLaMA has no biases"):
        load(None, [init])


def test_a_state_dict_that_does_not_fit_is_one_line(hf):
    cfg, _ = load_pretrained_from(hf)
    state = torch_layout(hf.params)
    missing = {k: v for k, v in state.items() if "h.1.mlp.c_fc.bias" not in k}
    with pytest.raises(ValueError, match="ckpt: no h.1.mlp.c_fc.bias"):
        from_state_dict(cfg, missing, "ckpt")
    wrong = {**state, "transformer.wpe.weight": np.zeros((5, 32), np.float32)}
    with pytest.raises(
        ValueError, match=r"ckpt: wpe.weight has shape \[5, 32\], expected \[24, 32\]"
    ):
        from_state_dict(cfg, wrong, "ckpt")
    extra = {**state, "transformer.h.2.ln_1.weight": np.zeros(32, np.float32)}
    with pytest.raises(ValueError, match="unexpected array h.2.ln_1.weight"):
        from_state_dict(cfg, extra, "ckpt")


def load_pretrained_from(hf):
    from jaxhc.model import from_hf_gpt2

    return from_hf_gpt2(hf)
