"""jaxhc.context: what collectives trace under (policy, transport, accounting); jit's cache key."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc import Policy

ZFP8 = Policy.from_dict({"min_bytes": 0, "axes": {"data": "zfp:8"}}, name="zfp8-all")
Q4 = Policy.from_dict({"min_bytes": 0, "axes": {"data": "q4"}}, name="q4-all")


def _mesh():
    return Mesh(np.array(jax.devices("cpu")[:4]), ("data",))


def _values(seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((4, 4096)), jnp.float32)


def _jitted(fn, mesh):
    spec = P("data")
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec))


def _put(x, mesh):
    return jax.device_put(x, NamedSharding(mesh, P("data")))


def test_context_policy_is_part_of_the_jit_key():
    """One jitted function called under two policies is traced (and compiled) once per policy and
    gives each policy's own result; going back to a policy reuses its program, not the last one."""
    mesh, x = _mesh(), _values()
    traces = []

    def body(a):
        traces.append(jaxhc.context.policy())
        return jaxhc.psum(a, "data", kind="grad")

    step = _jitted(body, mesh)
    x = _put(x, mesh)

    def reference(policy):
        return np.asarray(
            _jitted(lambda a: jaxhc.psum(a, "data", policy=policy, kind="grad"), mesh)(x)
        )

    with jaxhc.context.use(policy=ZFP8):
        zfp = np.asarray(step(x))
    with jaxhc.context.use(policy=Q4):
        q4 = np.asarray(step(x))
    assert traces == [ZFP8, Q4]
    assert step._cache_size() == 2
    np.testing.assert_array_equal(zfp, reference(ZFP8))
    np.testing.assert_array_equal(q4, reference(Q4))
    assert not np.array_equal(zfp, q4)  # two codecs, two results: neither program was reused

    with jaxhc.context.use(policy=ZFP8):  # an equal policy: the first program, no new trace
        again = np.asarray(step(x))
    with jaxhc.context.use(policy=Policy.from_dict(ZFP8.to_dict(), name="zfp8-all")):
        equal = np.asarray(step(x))
    assert len(traces) == 2 and step._cache_size() == 2
    np.testing.assert_array_equal(again, zfp)
    np.testing.assert_array_equal(equal, zfp)

    plain = np.asarray(step(x))  # outside every context: plain lax.psum
    assert traces[-1] is None and step._cache_size() == 3
    np.testing.assert_array_equal(
        plain, np.asarray(_jitted(lambda a: jax.lax.psum(a, "data"), mesh)(x))
    )


def test_explicit_codec_or_policy_wins_over_the_context():
    mesh, x = _mesh(), _values(1)
    x = _put(x, mesh)
    lax_sum = np.asarray(_jitted(lambda a: jax.lax.psum(a, "data"), mesh)(x))
    q4 = np.asarray(_jitted(lambda a: jaxhc.psum(a, "data", policy=Q4, kind="grad"), mesh)(x))
    with jaxhc.context.use(policy=ZFP8):
        identity = _jitted(lambda a: jaxhc.psum(a, "data", codec="none", kind="grad"), mesh)(x)
        explicit = _jitted(lambda a: jaxhc.psum(a, "data", policy=Q4, kind="grad"), mesh)(x)
        ambient = _jitted(lambda a: jaxhc.psum(a, "data", kind="grad"), mesh)(x)
    np.testing.assert_array_equal(np.asarray(identity), lax_sum)  # the identity codec is exact
    np.testing.assert_array_equal(np.asarray(explicit), q4)
    assert not np.array_equal(np.asarray(ambient), lax_sum)  # the context's zfp:8 is lossy


def test_use_nests_loads_names_and_restores():
    assert jaxhc.context.policy() is None
    with jaxhc.context.use(policy="zhybrid") as outer:
        assert outer.policy == Policy.preset("zhybrid")
        with jaxhc.context.use(policy=None):
            assert jaxhc.context.policy() is None
        with jaxhc.context.use(transport=jaxhc.transport.XlaTransport()) as inner:
            assert inner.policy == outer.policy  # what is not given stays
            assert jaxhc.transport.current() is inner.transport
        assert jaxhc.context.policy() == outer.policy
    assert jaxhc.context.policy() is None
    with pytest.raises(ValueError, match="unknown policy"):
        with jaxhc.context.use(policy="zhybird"):
            pass


def test_accounting_disabled_is_part_of_the_jit_key():
    """A program traced under `accounting.disabled()` has no callbacks; called again inside a
    Ledger without it, it is traced anew and records."""
    mesh, x = _mesh(), _values(2)
    x = _put(x, mesh)
    step = _jitted(lambda a: jaxhc.psum(a, "data", codec="zfp:8"), mesh)
    with jaxhc.accounting.Ledger() as ledger:
        with jaxhc.accounting.disabled():
            jax.block_until_ready(step(x))
        assert ledger.per_axis() == {}
        jax.block_until_ready(step(x))
    assert ledger.per_axis(devices=4)["data"]["calls"] == 1.0


def test_context_transport_is_part_of_the_jit_key():
    """A function first traced on one transport is traced again on another (an MPI transport
    must never run a program traced for XLA's collectives)."""
    mesh, x = _mesh(), _values(3)
    x = _put(x, mesh)
    seen = []

    def body(a):
        seen.append(jaxhc.transport.current())
        return jaxhc.psum(a, "data")

    step = _jitted(body, mesh)
    step(x)
    other = jaxhc.transport.XlaTransport()
    with jaxhc.transport.use(other) as entered:
        assert entered is other
        step(x)
        step(x)
    assert step._cache_size() == 2 and len(seen) == 2 and seen[1] is other
