"""Policy: presets, YAML files, per-kind overrides, and one-line errors naming the bad key."""

import glob
import os

import jax.numpy as jnp
import numpy as np
import pytest

import jaxhc
from jaxhc import Policy
from jaxhc.codecs import Identity, Mpc, Quant, Zfp
from jaxhc.policy import PRESETS
from tests._mesh import mesh_of, run

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs", "policy")


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(CONFIGS, "*.yaml"))))
def test_every_shipped_yaml_loads_and_matches_its_preset(path):
    policy = Policy.load(path)
    name = os.path.splitext(os.path.basename(path))[0]
    assert policy.name == name
    if name in PRESETS:
        assert policy == Policy.preset(name)


def test_every_preset_has_a_yaml():
    shipped = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(f"{CONFIGS}/*.yaml")}
    assert set(PRESETS) <= shipped


def test_hybrid_presets_choose_codec_per_axis():
    mz = Policy.preset("mzhybrid")
    assert mz.codec_for("data") == Zfp(8)
    assert mz.codec_for("tensor") == Mpc(budget=0.95)
    assert mz.codec_for("pipe") == Mpc(budget=0.95)
    z = Policy.preset("zhybrid")
    assert z.codec_for("data") == Zfp(8) and z.codec_for("tensor") == Zfp(16)
    assert Policy.preset("none").codec_for("data") is None
    assert Policy.preset("identity").codec_for("pipe") == Identity()


def test_kind_overrides_and_tuple_axes():
    p = Policy.from_dict(
        {"axes": {"data": {"codec": "zfp", "rate": 8, "param": "mpc:0.9"}, "tensor": "zfp:16"}}
    )
    assert p.codec_for("data", "grad") == Zfp(8)
    assert p.codec_for("data", "param") == Mpc(budget=0.9)
    # A tuple of axes takes the most faithful codec of its members.
    assert p.codec_for(("data", "tensor")) == Zfp(16)
    assert p.codec_for(("data", "pipe")) is None  # pipe is not listed: plain lax


def test_zfp_block_dims_as_a_key_or_in_the_spec():
    p = Policy.from_dict(
        {"axes": {"data": {"codec": "zfp", "rate": 8, "dims": 3}, "tensor": "zfp:16:d2"}}
    )
    assert p.codec_for("data") == Zfp(8, dims=3) and p.codec_for("tensor") == Zfp(16, dims=2)
    assert p.to_dict()["axes"]["data"] == {"codec": "zfp:8:d3"}
    assert Policy.from_dict(p.to_dict()) == p
    # At equal rates a tuple of axes takes the larger (more accurate) blocks.
    q = Policy.from_dict({"axes": {"data": "zfp:8", "tensor": "zfp:8:d3", "pipe": "zfp:8:d2"}})
    assert q.codec_for(("data", "tensor", "pipe")) == Zfp(8, dims=3)
    assert q.codec_for(("data", "pipe")) == Zfp(8, dims=2)


def test_policy_is_hashable_and_round_trips_through_dict():
    p = Policy.preset("mzhybrid")
    assert hash(p) == hash(Policy.from_dict(p.to_dict()))
    assert Policy.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    "data, culprit",
    [
        ({"axes": {"data": {"codec": "zfq"}}}, "axes.data.codec"),
        ({"axes": {"data": {"codec": "zfp"}}}, "rate"),
        ({"axes": {"data": {"codec": "zfp", "rate": 2}}}, "zfp rate 2"),
        ({"axes": {"data": {"codec": "zfp", "rate": 8, "rte": 1}}}, "'rte'"),
        ({"axes": {"data": {"codec": "zfp", "rate": 8, "dims": 4}}}, "axes.data.codec: zfp dims 4"),
        ({"axes": {"data": {"codec": "mpc", "budget": 3}}}, "budget"),
        ({"axes": {"data": "zfp:x"}}, "axes.data"),
        ({"axes": {"data": {"codec": "zfp", "rate": 8, "params": "mpc"}}}, "'params'"),
        ({"min_byte": 3}, "'min_byte'"),
        ({"min_bytes": -1}, "min_bytes"),
        ({"axes": ["data"]}, "axes"),
        ({"axes": {"data": {"codec": "mpc", "error_feedback": True}}}, "axes.data.error_feedback"),
        ({"axes": {"data": {"codec": "none", "error_feedback": True}}}, "lossy grad codec"),
        ({"axes": {"data": {"codec": "zfp:8", "grad": None, "error_feedback": True}}}, "'off'"),
        ({"axes": {"data": {"codec": "zfp", "rate": 8, "error_feedback": 1}}}, "true or false"),
    ],
)
def test_bad_policy_is_one_line_error_naming_the_key(data, culprit):
    with pytest.raises(ValueError) as err:
        Policy.from_dict(data, name="t")
    message = str(err.value)
    assert culprit in message and "\n" not in message


def test_error_feedback_is_for_lossy_grad_traffic():
    p = Policy.from_dict(
        {
            "axes": {
                "data": {"codec": "zfp", "rate": 8, "error_feedback": True},
                "tensor": {"codec": "mpc", "grad": "zfp:16", "error_feedback": True},
                "pipe": "zfp:8",
            }
        }
    )
    assert p.error_feedback("data") and p.error_feedback("tensor")
    assert not p.error_feedback("pipe")  # lossy, but not asked for
    assert not p.error_feedback(("data", "other"))  # the plain axis wins: nothing is lost
    assert Policy.from_dict(p.to_dict()) == p
    assert Policy.preset("mzhybrid_ef").error_feedback("data")
    assert Policy.preset("mzhybrid_ef").codec_for("data") == Zfp(rate=8, dims=3)
    assert Policy.preset("zhybrid_ef").codec_for("tensor", "act", "bfloat16") == Zfp(12, dims=3)
    assert not Policy.preset("mzhybrid").error_feedback("data")


def test_bad_preset_and_kind():
    with pytest.raises(ValueError, match="unknown policy 'zhybird'"):
        Policy.load("zhybird")
    with pytest.raises(ValueError, match="traffic kind 'acts'"):
        Policy.preset("zhybrid").codec_for("data", "acts")


def test_yaml_error_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("axes:\n  tensor: {codec: zfp, rate: 99}\n")
    with pytest.raises(ValueError, match=r"bad.yaml: policy bad: axes.tensor"):
        Policy.load(str(path))


BF16, F16, F32, F64 = (jnp.dtype(d) for d in ("bfloat16", "float16", "float32", "float64"))


def test_codec_per_dtype():
    p = Policy.from_dict(
        {
            "axes": {
                "data": {"float32": {"codec": "zfp", "rate": 8}, "bfloat16": "zfp:12"},
                "tensor": {"codec": "zfp", "rate": 16, "bfloat16": "zfp:12"},
                # a kind override replaces the axis entry for that kind, dtype keys included
                "pipe": {
                    "codec": "zfp:16",
                    "bfloat16": "zfp:12",
                    "act": {"codec": "zfp", "rate": 24, "bfloat16": "q8"},
                    "param": "mpc",
                },
            }
        }
    )
    assert p.codec_for("data", "grad", F32) == Zfp(8)
    assert p.codec_for("data", "grad", BF16) == Zfp(12)
    assert p.codec_for("data", "grad", F64) is None  # dtype keys only: other dtypes go plain
    assert p.codec_for("data") is None
    assert p.codec_for("tensor", "act", F32) == Zfp(16) == p.codec_for("tensor", "act")
    assert p.codec_for("tensor", "act", BF16) == Zfp(12)
    assert p.codec_for("pipe", "grad", BF16) == Zfp(12)
    assert p.codec_for("pipe", "act", BF16) == Quant(8)
    assert p.codec_for("pipe", "act", F32) == Zfp(24)
    assert p.codec_for("pipe", "param", BF16) == Mpc()
    # tuple axes: the most faithful of the members' codecs for that dtype
    assert p.codec_for(("data", "tensor"), "grad", BF16) == Zfp(12)
    assert p.codec_for(("data", "tensor"), "grad", F32) == Zfp(16)
    assert Policy.from_dict(p.to_dict()) == p and hash(Policy.from_dict(p.to_dict())) == hash(p)


@pytest.mark.parametrize(
    "axes, culprit",
    [
        ({"tensor": {"codec": "zfp", "rate": 8, "bfloat16": "zfp:16"}}, "axes.tensor.bfloat16"),
        ({"data": "zfp:32"}, "axes.data: lossy zfp:32 sends 32 bits per float32 value"),
        ({"pipe": {"codec": "zfp:8", "act": {"float16": "zfp:20"}}}, "axes.pipe.act.float16"),
        ({"pipe": {"codec": "zfp:8", "grad": "zfp:32"}}, "axes.pipe.grad: lossy zfp:32"),
    ],
)
def test_a_lossy_codec_that_saves_nothing_is_an_error_naming_the_key(axes, culprit):
    with pytest.raises(ValueError) as err:
        Policy.from_dict({"axes": axes}, name="t")
    message = str(err.value)
    assert f"policy t: {culprit}" in message and "no fewer than raw" in message
    assert "\n" not in message


def test_a_collective_refuses_a_codec_that_saves_nothing_on_its_dtype():
    """`tensor: zfp:16` is fine for float32, but bfloat16 messages would go lossy at raw size."""
    policy = Policy.from_dict({"axes": {"tensor": "zfp:16"}, "min_bytes": 0}, name="t")
    mesh, axis = mesh_of("3d-tensor")
    x = np.random.default_rng(0).normal(size=(8, 64)).astype(np.float32)
    f32 = run(lambda a: jaxhc.psum(a, axis, policy=policy, kind="act"), mesh, x)
    np.testing.assert_array_equal(f32, run(lambda a: jaxhc.psum(a, axis, codec="zfp:16"), mesh, x))
    with pytest.raises(ValueError) as err:
        run(lambda a: jaxhc.psum(a, axis, policy=policy, kind="act"), mesh, x.astype(BF16))
    assert str(err.value).startswith(
        "policy t: axes.tensor: lossy zfp:16 sends 16 bits per bfloat16 value"
    )


def test_collectives_take_the_codec_of_the_message_dtype():
    """A bfloat16 message under a per-dtype entry equals the same call with that codec."""
    policy = Policy.from_dict(
        {"axes": {"tensor": {"codec": "zfp:16", "bfloat16": "zfp:12"}}, "min_bytes": 0}
    )
    mesh, axis = mesh_of("3d-tensor")
    x = np.random.default_rng(1).normal(size=(8, 64)).astype(BF16)
    got = run(lambda a: jaxhc.psum(a, axis, policy=policy, kind="act"), mesh, x)
    want = run(lambda a: jaxhc.psum(a, axis, codec="zfp:12"), mesh, x)
    other = run(lambda a: jaxhc.psum(a, axis, codec="zfp:8"), mesh, x)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert not np.array_equal(np.asarray(got, np.float32), np.asarray(other, np.float32))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_compresses_every_float_dtype_it_codes(name):
    """No preset sends a lossy payload as large as raw, for any kind or float dtype."""
    policy = Policy.preset(name)
    for axis in ("data", "tensor", "pipe"):
        for kind in ("grad", "param", "act"):
            for dtype in (F32, BF16, F16, F64):
                policy.check_saving(axis, kind, dtype)
                codec = policy.codec_for(axis, kind, dtype)
                if codec is not None and not codec.lossless and codec.supports(dtype):
                    assert codec.payload_bytes(4096, dtype) < 4096 * dtype.itemsize
