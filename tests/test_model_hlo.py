"""Every cross-device byte of the compiled train step goes through jaxhc's collectives."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

import jaxhc
from jaxhc.parallel import init_state
from tests._gpt import BATCH, OPTIM, SEED, batch, train_step

COLLECTIVE = re.compile(
    r"=\s*(?P<type>\(?[^=]*?)\s+"
    r"(?P<op>all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter|"
    r"collective-broadcast|ragged-all-to-all)(?:-start)?\("
)


COMPUTATION = re.compile(r"^(?P<entry>ENTRY )?%(?P<name>\S+) \(.*\) -> .*\{$")
CALLED = re.compile(
    r"(?P<kind>to_apply|calls|body|condition|true_computation|false_computation)=%(?P<name>[\w.\-]+)"
    r"|branch_computations=\{(?P<branches>[^}]*)\}"
)


def collectives(hlo: str) -> list[tuple[str, str]]:
    """(op, result type) of every collective instruction in an HLO module's text."""
    return [(m["op"], m["type"].strip()) for m in map(COLLECTIVE.search, hlo.splitlines()) if m]


def collectives_by_branching(hlo: str) -> list[tuple[str, str, bool]]:
    """(op, result type, inside a conditional's branch) of every collective an HLO module's entry
    computation reaches, once per place it is called from (a while body counts once)."""
    found, calls, entry, name = {}, {}, None, None
    for line in hlo.splitlines():
        head = COMPUTATION.match(line)
        if head:
            name = head["name"]
            found[name], calls[name] = [], []
            entry = name if head["entry"] else entry
        elif name is not None:
            if m := COLLECTIVE.search(line):
                found[name].append((m["op"], m["type"].strip()))
            for m in CALLED.finditer(line):
                if m["branches"] is not None:
                    calls[name] += [(b.strip().lstrip("%"), True) for b in m["branches"].split(",")]
                else:
                    calls[name].append(
                        (m["name"], m["kind"] in ("true_computation", "false_computation"))
                    )

    def walk(name, branched):
        yield from ((op, t, branched) for op, t in found[name])
        for callee, branch in calls[name]:
            yield from walk(callee, branched or branch)

    return list(walk(entry, False))


def test_train_step_moves_only_jaxhc_payloads():
    """With the identity codec on every axis (and no size threshold), jaxhc moves uint8 payloads.

    Anything else is a collective jaxhc did not make, except the two plain scalar sums the step
    records itself, gathered to be added in rank order (`zero.psum_scalar`): the loss over
    ("data", "pipe") and the squared gradient norm over all axes.
    """
    cfg, mesh_cfg, mesh, step = train_step("2x2x2", "identity", "float32")
    state = init_state(cfg, mesh_cfg, OPTIM, mesh, SEED)
    found = collectives(step.lower(state, batch(0)).compile().as_text())
    kinds = {op for op, _ in found}
    assert {"all-to-all", "all-gather", "collective-permute"} <= kinds, kinds
    others = [(op, t) for op, t in found if set(re.findall(r"(\w+)\[", t)) != {"u8"}]
    assert sorted(others) == [("all-gather", "f32[4]{0}"), ("all-gather", "f32[8]{0}")], others


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
    layers = cfg.n_layer // mesh_cfg.pipe
    assert calls == {
        # attention and MLP each: exit (psum) forward, enter (psum of the cotangent) backward, on
        # the M ticks a stage holds a micro-batch (none in the S - 1 bubble ticks)
        "tensor/act": 2 * 2 * layers * mesh_cfg.microbatches,
        # each micro-batch crosses the stage boundary forward, its cotangent backward
        "pipe/act": 2 * mesh_cfg.microbatches,
        # wte, ln_f scale and bias: float32 leaves varying over the same axes, exchanged by the
        # end stages as one bucket (one message each way, `jaxhc.psum_pair`'s bucket_bytes)
        "pipe/grad": 1,
        "data/grad": 1,
        "data/param": 1,
        "data,pipe/other": 1,  # the loss
        "data,tensor,pipe/other": 1,  # the squared gradient norm
    }
    micro = cfg.block_size * cfg.n_embd * 4 * (8 // mesh_cfg.data // mesh_cfg.microbatches)
    tensor = ledger.per_axis(devices=mesh.size, by_kind=True)["tensor/act"]
    assert tensor["raw_bytes"] == calls["tensor/act"] * micro  # 2(P-1)/P = 1 for P = 2
    shared = ledger.per_axis(devices=mesh.size, by_kind=True)["pipe/grad"]
    paired = 4 * (cfg.vocab_size + 2) * cfg.n_embd  # wte and ln_f; wpe stays on the first stage
    assert shared["raw_bytes"] == 2 / mesh_cfg.pipe * paired  # 2 of the S stages send


@pytest.mark.parametrize("mesh_name", ["2x2x2", pytest.param("1x2x4", marks=pytest.mark.slow)])
def test_bubble_ticks_hold_no_tensor_collectives(mesh_name):
    """GPipe with M micro-batches on S stages has M + S - 1 ticks; a tick where some stage is in a
    bubble (t < S - 1 or t > M - 1) runs the layers under a conditional, a tick where every stage
    works runs them unconditionally. Each tick's layers hold 4 tensor psums in the compiled step
    (attention and MLP: the forward exit, the backward enter; the scan's body once). Policy none:
    the psums are XLA all-reduces of one micro-batch's activations."""
    cfg, mesh_cfg, mesh, step = train_step(mesh_name, "none", "float32")
    state = init_state(cfg, mesh_cfg, OPTIM, mesh, SEED)
    hlo = step.lower(state, batch(0)).compile().as_text()
    micro, stages = mesh_cfg.microbatches, mesh_cfg.pipe
    rows = BATCH // mesh_cfg.data // micro
    activation = f"f32[{rows},{cfg.block_size},{cfg.n_embd}]"
    found = collectives_by_branching(hlo)
    tensor = [b for op, t, b in found if op == "all-reduce" and t.startswith(activation + "{")]
    ticks = range(micro + stages - 1)
    full = sum(1 for t in ticks if stages - 1 <= t <= micro - 1)
    assert (tensor.count(False), tensor.count(True)) == (4 * full, 4 * (len(ticks) - full))
    # The stage-boundary messages: one ppermute per tick after the first, forward and backward,
    # outside the conditionals (a bubble sends nothing because it is in no pair, not by a branch).
    pipe = [b for op, t, b in found if op == "collective-permute" and t.startswith(activation)]
    assert pipe == [False] * 2 * (len(ticks) - 1)


PAIRS = re.compile(r"source_target_pairs=\{(?P<pairs>(?:\{\d+,\d+\},?)*)\}")


@pytest.mark.parametrize(
    "mesh_name", ["1x1x1", "2x2x2", pytest.param("2x1x4", marks=pytest.mark.slow)]
)
def test_shared_gradients_cross_pipe_once_between_the_end_stages(mesh_name):
    """Per step the shared embeddings' reduction is, for S > 1 stages, one collective-permute of
    the wte and ln_f gradients (one bucket of (V + 2) C values) between the first and the last
    stage of every pipeline, both ways, and nothing else: wpe's gradient stays on the first stage
    (it used to be one all-reduce of (V + T + 2) C values over every stage). None for S = 1."""
    cfg, mesh_cfg, mesh, step = train_step(mesh_name, "none", "float32")
    state = init_state(cfg, mesh_cfg, OPTIM, mesh, SEED)
    hlo = step.lower(state, batch(0)).compile().as_text()
    paired = f"f32[{(cfg.vocab_size + 2) * cfg.n_embd}]" + "{"
    every = f"f32[{(cfg.vocab_size + cfg.block_size + 2) * cfg.n_embd}]" + "{"
    lines = [line for line in hlo.splitlines() if COLLECTIVE.search(line)]
    assert not [line for line in lines if every in line]
    sends = [line for line in lines if COLLECTIVE.search(line)["type"].startswith(paired)]
    assert [COLLECTIVE.search(line)["op"] for line in sends] == ["collective-permute"] * (
        mesh_cfg.pipe > 1
    )
    if mesh_cfg.pipe == 1:
        return
    pairs = re.findall(r"\{(\d+),(\d+)\}", PAIRS.search(sends[0])["pairs"])
    stage = lambda device: np.unravel_index(int(device), mesh.devices.shape)[2]  # noqa: E731
    assert sorted((stage(a), stage(b)) for a, b in pairs) == sorted(
        [(0, mesh_cfg.pipe - 1), (mesh_cfg.pipe - 1, 0)] * (mesh.size // mesh_cfg.pipe)
    )
