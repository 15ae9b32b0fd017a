"""Every cross-device byte of the compiled train step goes through jaxhc's collectives."""

from __future__ import annotations

import re

from jaxhc.model import init_state
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
