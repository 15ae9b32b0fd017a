"""jaxhc._sum: the one rank-order sum, against XLA:CPU's collectives and the codecs' decode_sum."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxhc._sum import sum_in_rank_order
from jaxhc.codecs import Codec, Identity
from jaxhc.transport.xla import _psum_scatter_across_processes

DTYPES = [jnp.float16, jnp.bfloat16, jnp.float32, jnp.int32]


def _pieces(dtype, parts=4, n=4096):
    rng = np.random.default_rng(0)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.asarray(rng.integers(-1000, 1000, (parts, n)), dtype)
    # Magnitudes spread over many binades, so the accumulation type shows in the rounding.
    values = rng.standard_normal((parts, n)) * np.exp2(rng.integers(-8, 8, (parts, n)))
    return jnp.asarray(values, dtype)


def _on_mesh(fn, pieces):
    mesh = Mesh(np.array(jax.devices("cpu")[: pieces.shape[0]]), ("x",))
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    return np.asarray(jax.jit(mapped)(pieces))


def _bits(x):
    return np.asarray(x).view(np.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_xla_rule_is_xla_cpu_all_reduce(dtype):
    """wide16=False: bitwise XLA:CPU's psum (bfloat16 in float32, float16 in float16)."""
    pieces = _pieces(dtype)
    xla = _on_mesh(lambda a: jax.lax.psum(a, "x"), pieces)[0]
    np.testing.assert_array_equal(_bits(sum_in_rank_order(pieces, wide16=False)), _bits(xla))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_the_two_rules_differ_where_documented(dtype):
    pieces = _pieces(dtype)
    xla_rule, wide = (sum_in_rank_order(pieces, wide16=w) for w in (False, True))
    assert np.array_equal(_bits(xla_rule), _bits(wide)) == (dtype == jnp.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_cross_process_psum_scatter_matches_in_process(dtype):
    """The XLA transport's jax.distributed psum_scatter (an all_to_all and the rank-order sum)
    is bitwise XLA:CPU's in-process reduce-scatter, float16 included."""
    pieces = _pieces(dtype)

    def ours(a):
        return _psum_scatter_across_processes(a[0], "x", 0, True)[None]

    def lax_scatter(a):
        return jax.lax.psum_scatter(a[0], "x", scatter_dimension=0, tiled=True)[None]

    np.testing.assert_array_equal(
        _bits(_on_mesh(ours, pieces)), _bits(_on_mesh(lax_scatter, pieces))
    )


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_wide_rule_is_decode_sum(dtype):
    """wide16=True, `Codec.decode_sum`'s reduction: numpy's float32 sum in rank order, rounded."""
    pieces = _pieces(dtype)
    wide = np.asarray(pieces).astype(np.float32)
    oracle = wide[0]
    for row in wide[1:]:
        oracle = oracle + row
    oracle = oracle.astype(jnp.dtype(dtype))
    codec = Identity()
    payloads = jax.vmap(lambda r: codec.encode(r).payload)(pieces)
    summed = Codec.decode_sum(codec, payloads, pieces.shape[1], dtype)
    np.testing.assert_array_equal(_bits(sum_in_rank_order(pieces, wide16=True)), _bits(oracle))
    np.testing.assert_array_equal(_bits(summed), _bits(oracle))
