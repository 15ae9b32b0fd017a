"""Every cross-device byte of the compiled train step goes through jaxhc's collectives."""

from __future__ import annotations

import re

import jax

import jaxhc
from jaxhc.parallel import init_state
from tests._gpt import OPTIM, SEED, batch, train_step

COLLECTIVE = re.compile(
    r"=\s*(?P<type>\(?[^=]*?)\s+"
    r"(?P<op>all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter|"
    r"collective-broadcast|ragged-all-to-all)(?:-start)?\("
)


def collectives(hlo: str) -> list[tuple[str, str]]:
    """(op, result type) of every collective instruction in an HLO module's text."""
    return [(m["op"], m["type"].strip()) for m in map(COLLECTIVE.search, hlo.splitlines()) if m]


def test_train_step_moves_only_jaxhc_payloads():
    """With the identity codec on every axis (and no size threshold), jaxhc moves uint8 payloads.

    Anything else is a collective jaxhc did not make, except the two plain scalar sums the step
    records itself: the loss over ("data", "pipe") and the squared gradient norm over all axes.
    """
    cfg, mesh_cfg, mesh, step = train_step("2x2x2", "identity", "float32")
    state = init_state(cfg, mesh_cfg, OPTIM, mesh, SEED)
    found = collectives(step.lower(state, batch(0)).compile().as_text())
    kinds = {op for op, _ in found}
    assert {"all-to-all", "all-gather", "collective-permute"} <= kinds, kinds
    others = [(op, t) for op, t in found if set(re.findall(r"(\w+)\[", t)) != {"u8"}]
    assert others == [("all-reduce", "f32[]")] * 2, others


def test_ledger_counts_every_collective_of_a_step():
    """Forward and backward traffic is recorded once per execution (per tick, per layer)."""
    cfg, mesh_cfg, mesh, step = train_step("2x2x2", "identity", "float32")
    state = init_state(cfg, mesh_cfg, OPTIM, mesh, SEED)
    state, metrics = step(state, batch(0))  # compile outside the ledger
    jax.block_until_ready(metrics)
    ledger = jaxhc.accounting.Ledger()
    with ledger:
        jax.block_until_ready(step(state, batch(1)))
        jax.effects_barrier()
    calls = {k: v["calls"] for k, v in ledger.per_axis(devices=mesh.size, by_kind=True).items()}
    ticks = mesh_cfg.microbatches + mesh_cfg.pipe - 1
    layers = cfg.n_layer // mesh_cfg.pipe
    assert calls == {
        # attention and MLP each: exit (psum) forward, enter (psum of the cotangent) backward
        "tensor/act": 2 * 2 * layers * ticks,
        # each micro-batch crosses the stage boundary forward, its cotangent backward
        "pipe/act": 2 * mesh_cfg.microbatches,
        "pipe/grad": 4,  # wte, wpe, ln_f scale and bias
        "data/grad": 1,
        "data/param": 1,
        "data,pipe/other": 1,  # the loss
        "data,tensor,pipe/other": 1,  # the squared gradient norm
    }
    micro = cfg.block_size * cfg.n_embd * 4 * (8 // mesh_cfg.data // mesh_cfg.microbatches)
    tensor = ledger.per_axis(devices=mesh.size, by_kind=True)["tensor/act"]
    assert tensor["raw_bytes"] == calls["tensor/act"] * micro  # 2(P-1)/P = 1 for P = 2
