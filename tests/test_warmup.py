"""Compression warm-up (``warmup_steps``): the policy's keys, and the trainer's first steps sending
the data-axis gradients with the warm-up codec before the steady one."""

from __future__ import annotations

import json

import pytest
import yaml
from test_train import EF_POLICY, losses, train

from jaxhc.codecs import Quant
from jaxhc.policy import Policy

STEADY = {
    "name": "q4w",
    "min_bytes": 0,
    "axes": {
        "data": {"codec": "q4:h", "error_feedback": True, "keep_own": True, "param": "q8"},
        "tensor": "mpc:0.95",
        "pipe": "mpc:0.95",
    },
}


def test_warming_swaps_only_the_data_gradients():
    p = Policy.from_dict({**STEADY, "warmup_steps": 3}, name="w")
    assert p.warmup_steps == 3 and p.warmup_codec == Quant(bits=8)
    w = p.warming()
    assert w.warmup_steps == 0 and w.codec_for("data", "grad").spec == "q8"
    assert w.codec_for("data", "param").spec == "q8" and w.codec_for("tensor").spec == "mpc:0.95"
    assert w.error_feedback("data") and w.keep_own("data")
    nested = Policy.from_dict(
        {"axes": {"data": "q4:h", "data.1": "q4:b64"}, "warmup_steps": 1, "warmup_codec": "zfp:8"}
    )
    assert {nested.warming().codec_for(a, "grad").spec for a in ("data", "data.0", "data.1")} == {
        "zfp:8"
    }
    assert nested.warming().codec_for("data.1", "param").spec == "q4:b64"
    for policy in (p, nested, Policy.from_dict({"warmup_codec": "off"})):
        assert Policy.from_dict(policy.to_dict(), name=policy.name) == policy
    assert "warmup_steps" not in Policy.preset("q4_ef").to_dict()


@pytest.mark.parametrize(
    "keys, culprit",
    [
        ({"warmup_steps": -1}, "warmup_steps=-1 must be an integer >= 0"),
        ({"warmup_steps": "5"}, "warmup_steps='5' must be an integer >= 0"),
        ({"warmup_steps": True}, "warmup_steps=True must be an integer >= 0"),
        ({"warmup_codec": "zfp:32"}, "warmup_codec: lossy zfp:32 sends 32 bits"),
        ({"warmup_codec": "zfp:40"}, "warmup_codec: zfp rate 40 is out of range"),
        ({"warmup_codec": "q3"}, "warmup_codec: bad codec spec 'q3'"),
        ({"warmup_steps": 2, "warmup_codec": "none"}, "warmup_codec='none' must be lossy"),
        ({"warmup_steps": 2, "warmup_codec": "off"}, "warmup_codec='off' must be lossy"),
        ({"warmup_step": 2}, "warmup_step"),
    ],
)
def test_bad_warmup_keys_are_one_line_errors(keys, culprit):
    with pytest.raises(ValueError, match="policy q4w: ") as e:
        Policy.from_dict({**STEADY, **keys}, name="w")
    assert culprit in str(e.value) and "\n" not in str(e.value)


def test_without_error_feedback_the_warmup_may_send_raw():
    p = Policy.from_dict({"axes": {"data": "q4:h"}, "warmup_steps": 2, "warmup_codec": "off"})
    assert p.warming().codec_for("data", "grad") is None


def _write(tmp_path, name, policy: dict) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(policy))
    return str(path)


def _records(out) -> list[dict]:
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


@pytest.mark.slow  # CI time (three trainings): the quick suite checks the warm-up policy above
def test_the_first_steps_train_as_the_warmup_policy_then_the_steady_one(tmp_path):
    """Steps 0-1 of a run with ``warmup_steps: 2`` are those of a run of the warm-up policy
    (the same losses, bit for bit, and bytes); from step 2 on its data axis moves the steady
    policy's bytes."""
    warm = {**STEADY, "warmup_steps": 2}
    policy = _write(tmp_path, "warm", warm)
    early = _write(tmp_path, "early", Policy.from_dict(warm).warming().to_dict())
    steady = _write(tmp_path, "steady", STEADY)
    runs = {"warm": (policy, 4), "early": (early, 2), "steady": (steady, 4)}
    for name, (path, steps) in runs.items():
        args = ["--compression", path, f"train.steps={steps}", "optim.total_steps=4"]
        assert train(tmp_path / name, *args) == 0
    w, e, s = (_records(tmp_path / n) for n in runs)
    assert [r["loss"] for r in w[:2]] == [r["loss"] for r in e]
    wire = lambda rs: [r["wire_bytes"]["data"] for r in rs]  # noqa: E731
    assert wire(w[:2]) == wire(e) and wire(w[2:]) == wire(s[2:])
    assert wire(e)[0] > 1.25 * wire(s)[0]  # gradients in q8 before, in q4:h after
    assert w[2]["loss"] != s[2]["loss"]  # the warm-up changed the state the steady steps start on


@pytest.mark.slow  # make test-all (CI time)
def test_a_resume_inside_the_warmup_continues_bit_exactly(tmp_path):
    """Which steps warm up follows the step index, so a run resumed inside its warm-up (at step 2
    of 3) switches at the same step as an uninterrupted one: the same losses, bit for bit."""
    policy = _write(
        tmp_path, "ef", {**yaml.safe_load(EF_POLICY), "warmup_steps": 3, "warmup_codec": "zfp:16"}
    )
    common = ["--compression", policy, "optim.total_steps=4"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert train(full, "train.steps=4", *common) == 0
    assert train(part, "train.steps=2", *common) == 0
    assert train(part, "train.steps=4", "--resume", *common) == 0
    assert losses(part) == losses(full)
    wire = [r["wire_bytes"]["data"] for r in _records(part)]
    assert wire[0] == wire[2] > 1.25 * wire[3]  # gradients in zfp:16, then zfp:8
