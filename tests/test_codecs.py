"""The codec API shared by every codec: spec strings, the identity codec, shard_map types."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxhc.codecs import Identity, Mpc, Zfp, parse


@pytest.mark.parametrize(
    "spec, codec",
    [
        ("none", Identity()),
        ("zfp:8", Zfp(8)),
        ("zfp:12.5", Zfp(12.5)),
        (" ZFP:16 ", Zfp(16)),
        ("mpc", Mpc()),
        ("mpc:0.8", Mpc(budget=0.8)),
        ("mpc:0.8:dim=2", Mpc(dim=2, budget=0.8)),
    ],
)
def test_parse_round_trips(spec, codec):
    assert parse(spec) == codec
    assert parse(codec.spec) == codec
    assert parse(codec) is codec and parse(None) is None


@pytest.mark.parametrize(
    "spec, culprit",
    [
        ("zfp", "'zfp'"),
        ("zfp:x", "'zfp:x'"),
        ("zfp:2", "zfp rate 2"),
        ("lz4", "'lz4'"),
        ("mpc:3", "budget"),
        ("mpc:dim=0", "dim"),
        ("none:1", "'none:1'"),
        (7, "7"),
    ],
)
def test_bad_spec_is_one_line_error_naming_it(spec, culprit):
    with pytest.raises(ValueError) as err:
        parse(spec)
    assert culprit in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.uint8])
def test_identity_round_trip_is_exact(dtype):
    x = jnp.asarray(np.random.default_rng(0).integers(0, 100, (5, 7)), dtype)
    enc = jax.jit(Identity().encode)(x)
    assert enc.payload.shape == (x.nbytes,) and bool(enc.ok)
    np.testing.assert_array_equal(Identity().decode(enc.payload, x.shape, dtype), x)


@pytest.mark.parametrize("codec", [Zfp(8), Mpc(budget=0.9), Identity()])
def test_results_keep_shard_map_varying_type(codec):
    """A decoded shard is still per-device data: replicated out_specs must be refused."""
    mesh = Mesh(np.array(jax.devices("cpu")[:4]), ("x",))
    x = jnp.linspace(0, 1, 4 * 64, dtype=jnp.float32)

    def roundtrip(v):
        return codec.decode(codec.encode(v).payload, v.shape, v.dtype)

    ok = jax.shard_map(roundtrip, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(x)
    assert ok.shape == x.shape
    with pytest.raises(Exception, match="(?i)vary|replicat|invariant"):
        jax.shard_map(roundtrip, mesh=mesh, in_specs=P("x"), out_specs=P())(x)
