"""Bad configurations and inputs fail early with one-line errors that name the key."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jaxhc.model import GPTConfig, MeshConfig, OptimConfig, validate
from jaxhc.parallel import init_state, make_mesh, make_train_step
from tests._gpt import CFG, OPTIM, SEED, mesh_of


@pytest.mark.parametrize(
    "model,mesh,message",
    [
        (
            GPTConfig(n_head=6, n_embd=48),
            MeshConfig(tensor=4),
            "model.n_head=6 is not divisible by mesh tensor=4",
        ),
        (
            GPTConfig(n_layer=6),
            MeshConfig(pipe=4),
            "model.n_layer=6 is not divisible by mesh pipe=4",
        ),
        (
            GPTConfig(arch="llama", n_head=8, n_kv_head=2, n_embd=64),
            MeshConfig(tensor=4),
            "model.n_kv_head=2 is not divisible by mesh tensor=4",
        ),
        (
            GPTConfig(arch="llama", n_head=4, n_embd=64, intermediate_size=90),
            MeshConfig(tensor=4),
            "model.intermediate_size=90 is not divisible by mesh tensor=4",
        ),
    ],
)
def test_model_must_split_over_the_mesh(model, mesh, message):
    with pytest.raises(ValueError) as e:
        validate(model, mesh)
    assert str(e.value) == message


def test_batch_must_split_into_data_times_microbatches():
    with pytest.raises(ValueError) as e:
        validate(CFG, MeshConfig(data=2, microbatches=4), batch_size=12)
    assert (
        str(e.value) == "train.batch_size=12 is not divisible by mesh data x microbatches = 2 x 4"
    )


def test_train_step_checks_the_batch():
    mesh_cfg, mesh = mesh_of("2x2x2")
    step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, "none")
    state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED)
    tokens = np.zeros((6, CFG.block_size + 1), np.int32)
    with pytest.raises(ValueError, match=r"train.batch_size=6 is not divisible by mesh data x "):
        step(state, tokens)
    with pytest.raises(ValueError, match=r"expected \(batch, 17\)"):
        step(state, np.zeros((8, CFG.block_size), np.int32))


def test_mesh_must_match_the_devices():
    with pytest.raises(ValueError) as e:
        make_mesh(MeshConfig(data=2, tensor=2), jax.devices()[:8])
    assert str(e.value) == "mesh data x tensor x pipe = 2 x 2 x 1 = 4 does not match the 8 devices"
    _, mesh = mesh_of("2x2x2")
    with pytest.raises(ValueError, match="does not match the 8 devices"):
        init_state(CFG, MeshConfig(data=8, pipe=2), OPTIM, mesh, SEED)
    with pytest.raises(ValueError, match="do not match mesh config"):
        init_state(CFG, MeshConfig(data=8), OPTIM, mesh, SEED)


@pytest.mark.parametrize(
    "make,message",
    [
        (
            lambda: GPTConfig(n_embd=30, n_head=4),
            "model.n_embd=30 is not divisible by model.n_head=4",
        ),
        (lambda: GPTConfig(dtype="float16"), "model.dtype='float16' must be one of"),
        (lambda: GPTConfig(n_layer=0), "model.n_layer=0 must be a positive integer"),
        (lambda: MeshConfig(microbatches=0), "mesh.microbatches=0 must be a positive integer"),
        (lambda: OptimConfig(lr=-1.0), "optim.lr=-1.0 must be > 0"),
        (lambda: OptimConfig(b2=1.5), r"optim.b2=1.5 must be in \[0, 1\]"),
        (lambda: dataclasses.replace(OPTIM, total_steps=0), "optim.total_steps=0 must be"),
    ],
)
def test_config_values_are_checked(make, message):
    with pytest.raises(ValueError, match=message):
        make()
