"""Codecs describe themselves: the traits the policy, collectives, buckets, MPI engine and planner
ask of them, and no module outside jaxhc/codecs/ switching on codec classes."""

import pathlib
import re

import jax.numpy as jnp
import pytest

from jaxhc import policy
from jaxhc.codecs import Identity, Mpc, NativeCall, Quant, Zfp, parse
from jaxhc.collectives import _buckets

ROOT = pathlib.Path(__file__).resolve().parents[1]
CODEC_CLASSES = ("Identity", "Mpc", "Quant", "Zfp", "FixedSizeCodec")


def test_no_isinstance_on_codec_classes_outside_the_codecs_package():
    pattern = re.compile(r"isinstance\([^)]*\b(" + "|".join(CODEC_CLASSES) + r")\b")
    found = []
    for path in [*(ROOT / "jaxhc").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        if "codecs" in path.relative_to(ROOT).parts[:2]:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    # bench/codecs.py compares against zfpy, which exists for ZFP alone.
    assert [f for f in found if not f.startswith("bench/codecs.py")] == []


@pytest.mark.parametrize(
    "spec, values",
    [
        ("zfp:8", 4),
        ("zfp:8:d2", 16),
        ("zfp:4:d3", 64),
        ("q8", 256),
        ("q4:b64:h", 64),
        ("mpc", 1),
        ("none", 1),
    ],
)
def test_block_values_align_buckets(spec, values):
    codec = parse(spec) if spec != "none" else Identity()
    assert codec.block_values == values
    assert _buckets.block_values(codec) == values
    assert _buckets.block_values(None) == 1


def test_only_budgeted_or_lossy_codecs_need_an_agreement_round():
    assert not Identity().may_fail
    assert not Mpc().may_fail
    assert Mpc(budget=0.8).may_fail
    assert Zfp(rate=8).may_fail and Quant(bits=4).may_fail


def test_native_calls_are_the_engines_parameters():
    assert Zfp(rate=8).native_call(jnp.float32) == NativeCall("zfp", 32, 1, 0.0)
    assert Zfp(rate=8, dims=2).native_call(jnp.float32) == NativeCall("zfp", 128, 2, 0.0)
    assert Zfp(rate=16).native_call(jnp.float64) == NativeCall("zfp", 64, 1, 0.0)
    assert Mpc(dim=3, budget=0.9).native_call(jnp.float32) == NativeCall("mpc", 0, 3, 0.9)
    assert Mpc().native_call(jnp.float32) == NativeCall("mpc", 0, 1, 0.0)
    assert Quant(bits=8).native_call(jnp.float32) == NativeCall("quant", 0, 0, 0.0, 8, 256)
    assert Quant(4, 64, rotate=True).native_call(jnp.bfloat16) == NativeCall(
        "quant:h", 0, 0, 0.0, 4, 64
    )
    assert Quant(bits=8).native_call(jnp.float16) is None  # the engine takes no float16
    assert Quant(bits=8, stochastic=True).native_call(jnp.float32) is None  # draws keyed by row
    assert Identity().native_call(jnp.float32) is None
    with pytest.raises(ValueError, match="out of range for float32"):
        Zfp(rate=40).native_call(jnp.float32)


def test_fidelity_orders_codecs_from_raw_to_fewest_bits():
    order = [None, Identity(), Mpc(), Zfp(rate=16), Zfp(rate=8), Quant(bits=8), Quant(bits=4)]
    ranks = [policy._fidelity(c) for c in order]
    assert ranks[:3] == [4.0, 3.0, 2.0]
    assert ranks[3] > ranks[4] and ranks[5] > ranks[6]
    assert all(1.0 < r < 2.0 for r in ranks[3:])
