"""Error feedback (residual in, residual out) in psum / psum_scatter: the residual algebra against
a numpy + zfpy replay, raw paths, the NaN fallback, and the sum over many steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zfpy
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxhc
from tests._mesh import mesh_of

RATE = 8


def ef_call(mesh, axis, fn, x, r, *, check_vma=True, out_spec=None):
    """shard_map `fn(x, r) -> (out, new_r)` with x and r split over every mesh axis."""
    spec = P(tuple(mesh.axis_names))
    x, r = (jax.device_put(a, NamedSharding(mesh, spec)) for a in (x, r))
    mapped = jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=(spec, spec),
        out_specs=(spec if out_spec is None else out_spec, spec),
        check_vma=check_vma,
    )
    out, new = jax.jit(mapped)(x, r)
    return np.asarray(out), np.asarray(new)


def data(parts, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((parts, *shape)) * np.exp(rng.uniform(-2, 2, (parts, *shape)))
    r = 0.05 * rng.standard_normal((parts, *shape))
    return x.astype(np.float32), r.astype(np.float32)


def zfpy_rows(rows):
    """Each row compressed on its own, as jaxhc's codec does (zfpy is its bit-exact oracle)."""
    return np.stack([zfpy.decompress_numpy(zfpy.compress_numpy(r, rate=RATE)) for r in rows])


def in_rows(flat, parts):
    """to_rows of jaxhc.collectives._common: P zero-padded chunks, each padded to 4 values."""
    per = -(-flat.size // parts)
    m = -(-per // 4) * 4
    rows = np.zeros((parts, m), flat.dtype)
    padded = np.pad(flat, (0, parts * per - flat.size)).reshape(parts, per)
    rows[:, :per] = padded
    return rows, per


@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("check_vma", [True, False])
def test_psum_scatter_residual_is_what_zfp_lost(parts, check_vma):
    mesh, axis = mesh_of(f"1d{parts}")
    x, r = data(parts, (parts * 6, 10), seed=parts)

    def fn(a, res):
        return jaxhc.psum_scatter(
            a, axis, scatter_dimension=1, tiled=True, codec=f"zfp:{RATE}", residual=res
        )

    out, new = ef_call(mesh, axis, fn, x, r, check_vma=check_vma)
    y = x + r
    decoded = np.stack(
        [zfpy_rows(y[i].reshape(parts, -1)).reshape(y[i].shape) for i in range(parts)]
    )
    np.testing.assert_array_equal(new, y - decoded)  # bit for bit: the same float32 subtraction
    np.testing.assert_allclose(decoded + new, y, rtol=1e-6, atol=1e-6)
    summed = decoded[0]
    for i in range(1, parts):
        summed = summed + decoded[i]  # rank order, float32
    np.testing.assert_array_equal(out, summed.reshape(out.shape))


@pytest.mark.parametrize("parts", [2, 4])
def test_psum_residual_holds_both_encodes(parts):
    """Non-owned chunks keep the first encode's loss; the owner's chunk adds the second's."""
    mesh, axis = mesh_of(f"1d{parts}")
    x, r = data(parts, (37, 3), seed=10 + parts)  # n = 111: padded rows, partial blocks

    def fn(a, res):
        out, new = jaxhc.psum(a[0], axis, codec=f"zfp:{RATE}", residual=res[0])
        return out[None], new[None]

    out, new = ef_call(mesh, axis, fn, x, r, check_vma=False)
    y = (x + r).reshape(parts, -1)
    n = y.shape[1]
    lost, reduced = [], np.zeros(0, np.float32)
    for i in range(parts):
        rows, per = in_rows(y[i], parts)
        dec = zfpy_rows(rows)
        lost.append(rows - dec)
        reduced = dec if i == 0 else reduced + dec  # every chunk's rank-order float32 sum
    gathered = zfpy_rows(reduced)
    for i in range(parts):
        want = lost[i].copy()
        want[i] = want[i] + (reduced[i] - gathered[i])
        np.testing.assert_array_equal(new[i].reshape(-1), want[:, :per].reshape(-1)[:n])
        np.testing.assert_array_equal(out[i].reshape(-1), gathered[:, :per].reshape(-1)[:n])
    # Nothing is lost for good: out + every residual == every input + every old residual.
    total = (x + r).astype(np.float64).sum(0)
    np.testing.assert_allclose(out[0] + new.astype(np.float64).sum(0), total, atol=2e-5)


@pytest.mark.parametrize("codec", [None, "none", "mpc"])
def test_raw_and_lossless_keep_the_residual_zero(codec):
    mesh, axis = mesh_of("1d4")
    x, r = data(4, (16, 8), seed=3)
    r = np.zeros_like(r)

    def fn(a, res):
        return jaxhc.psum(a, axis, codec=codec, residual=res)

    out, new = ef_call(mesh, axis, fn, x, r, out_spec=P())
    assert not new.any()
    want = jax.jit(
        jax.shard_map(lambda a: lax.psum(a, axis), mesh=mesh, in_specs=P("x"), out_specs=P())
    )(x)
    np.testing.assert_array_equal(out, np.asarray(want))


def test_a_raw_transfer_delivers_the_old_residual():
    """Under a policy's min_bytes the message goes raw: x + residual arrives whole."""
    mesh, axis = mesh_of("1d2")
    x, r = data(2, (4, 8), seed=4)

    def fn(a, res):
        return jaxhc.psum_scatter(
            a, axis, scatter_dimension=1, tiled=True, policy="zfp8", kind="grad", residual=res
        )

    out, new = ef_call(mesh, axis, fn, x, r)
    assert not new.any()
    np.testing.assert_array_equal(out.reshape(4, 8), (x + r)[0] + (x + r)[1])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("op", ["psum", "psum_scatter"])
def test_non_finite_input_falls_back_and_clears_the_residual(bad, op):
    """A NaN/Inf on one rank: every rank sends x + residual raw, as the plain collective would, and
    the residual restarts at zero on every rank instead of turning NaN."""
    mesh, axis = mesh_of("1d4")
    x, r = data(4, (8, 8), seed=5)
    x[2, 1, 1] = bad
    ops = {
        "psum": lambda a, res: jaxhc.psum(a, axis, codec=f"zfp:{RATE}", residual=res),
        "psum_scatter": lambda a, res: jaxhc.psum_scatter(
            a, axis, scatter_dimension=1, tiled=True, codec=f"zfp:{RATE}", residual=res
        ),
    }
    out, new = ef_call(mesh, axis, ops[op], x, r, check_vma=False)
    assert np.isfinite(new).all() and not new.any()
    y = (x + r).reshape(4, 8, 8)
    want = y[0] + y[1] + y[2] + y[3]
    if op == "psum_scatter":
        want = want.reshape(out.shape)
    else:
        out = out[0]  # check_vma=False: every rank's copy stacked; they are identical
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)  # NaN where the plain sum has it


def test_bfloat16_residual_also_keeps_the_cast():
    """bf16 data with a float32 residual: the rounding to bf16 is fed back too."""
    mesh, axis = mesh_of("1d2")
    x, r = data(2, (4, 16), seed=6)
    xb = jnp.asarray(x, jnp.bfloat16)

    def fn(a, res):
        return jaxhc.psum_scatter(a, axis, scatter_dimension=1, tiled=True, residual=res)

    out, new = ef_call(mesh, axis, fn, xb, r)
    assert out.dtype == jnp.bfloat16 and new.dtype == np.float32
    y = np.asarray(xb, np.float32) + r
    np.testing.assert_array_equal(new, y - np.asarray(jnp.asarray(y, jnp.bfloat16), np.float32))


@pytest.mark.parametrize("codec, gain", [(f"zfp:{RATE}", 16), ("q4:h", 8)])
def test_over_many_steps_error_feedback_tracks_the_exact_sum(codec, gain):
    """The running sum of EF outputs stays within one step's codec error of the exact sum; without
    EF the per-step errors (biased for a repeated gradient) pile up."""
    parts, steps = 4, 48
    mesh, axis = mesh_of(f"1d{parts}")
    rng = np.random.default_rng(7)
    base = rng.standard_normal((parts, 256)).astype(np.float32)
    noise = 0.1 * rng.standard_normal((steps, parts, 256)).astype(np.float32)
    xs = base[None] + noise  # (steps, parts, n): a steady gradient plus noise

    def run_steps(a):  # a: this rank's (steps, 1, n)
        def step(carry, xt):
            res, acc, plain = carry
            out, res = jaxhc.psum(xt, axis, codec=codec, residual=res)
            return (res, acc + out, plain + jaxhc.psum(xt, axis, codec=codec)), None

        zeros = jnp.zeros(a.shape[1:], jnp.float32)
        (res, acc, plain), _ = lax.scan(step, (zeros, zeros, zeros), a)
        return acc, plain

    mapped = jax.shard_map(
        run_steps, mesh=mesh, in_specs=P(None, "x"), out_specs=P(), check_vma=False
    )
    with_ef, without = (np.asarray(v)[0] for v in jax.jit(mapped)(xs))
    exact = xs.astype(np.float64).sum((0, 1))
    err_ef = np.abs(with_ef - exact).max()
    err_plain = np.abs(without - exact).max()
    # Without EF the error grows with the steps (zfp:8: ~0.35 per step here, 16.6 after 48; q4:h:
    # 10.8); with EF it stays that of a step or two (0.5; q4:h 0.93): what the residuals hold.
    assert err_ef < err_plain / gain, (err_ef, err_plain)


def test_trees_and_bad_residuals():
    mesh, axis = mesh_of("1d2")
    x, r = data(2, (8, 4), seed=8)

    def fn(a, res):
        out, new = jaxhc.psum_scatter(
            {"a": a, "b": 2 * a},
            axis,
            scatter_dimension=1,
            tiled=True,
            codec="zfp:8",
            residual={"a": res, "b": res},
        )
        return out["a"] + out["b"], new["a"] + new["b"]

    out, new = ef_call(mesh, axis, fn, x, r)
    assert out.shape == (2, 4, 4) and np.isfinite(new).all() and new.any()
    cases = [
        (
            lambda a, res: jaxhc.psum(a, axis, codec="zfp:8", residual=res[:, :1]),
            "float32[1, 1, 4]",
        ),
        (
            lambda a, res: jaxhc.psum(a, axis, codec="zfp:8", residual=res.astype(jnp.bfloat16)),
            "bfloat16",
        ),
        (lambda a, res: jaxhc.psum(a.astype(jnp.int32), axis, residual=res), "float input"),
        (lambda a, res: jaxhc.psum([a], axis, codec="zfp:8", residual=(res,)), "tree structure"),
        (
            lambda a, res: jaxhc.psum(a, axis, axis_index_groups=[[0, 1]], residual=res),
            "axis_index_groups",
        ),
    ]
    for fn, culprit in cases:
        with pytest.raises(ValueError) as err:
            ef_call(mesh, axis, fn, x, r, check_vma=False)
        assert culprit in str(err.value) and "\n" not in str(err.value), str(err.value)


# --- the trainer's options: keep_own (reduce-scatter) and param_delta (parameter gathers) -------


def _policy(**data):
    return jaxhc.Policy.from_dict({"name": "t", "min_bytes": 0, "axes": {"data": data}})


@pytest.mark.parametrize("parts", [2, 4])
def test_keep_own_sums_the_own_slice_uncoded_and_codes_only_what_is_sent(parts):
    """zero.scatter_levels under ``keep_own``: rank i's slice of the result is the other ranks'
    zfpy-decoded slices i (their residuals what zfp lost of them) plus its own slice exact, and
    its own slice's residual is zero."""
    from jaxhc.parallel import zero

    mesh, _ = mesh_of(f"1d{parts}")
    mesh = jax.sharding.Mesh(mesh.devices, ("data",))
    x, r = data(parts, (parts * 40,), seed=20 + parts)
    policy = _policy(codec=f"zfp:{RATE}", error_feedback=True, keep_own=True)

    def fn(a, res):
        with jaxhc.context.use(policy=policy):
            out, new = zero.scatter_levels(a[0], [("data", parts)], [res[0]])
        return out[None], new[0][None]

    out, new = ef_call(mesh, "data", fn, x, r)
    out = out.reshape(parts, -1)
    y = (x + r).reshape(parts, parts, -1)  # (rank, slice, values)
    for i in range(parts):
        sent = y[i].copy()
        sent[i] = 0.0
        decoded = zfpy_rows(sent)
        want = sent - decoded
        np.testing.assert_array_equal(new[i].reshape(parts, -1), want)
        assert not new[i].reshape(parts, -1)[i].any()
    for i in range(parts):
        total = np.zeros_like(out[i])
        for j in range(parts):  # rank order, float32; the own row arrives as coded zeros
            row = np.zeros_like(out[i]) if j == i else zfpy_rows(y[j])[i]
            total = total + row
        np.testing.assert_array_equal(out[i], total + y[i, i])
    # Nothing is lost for good: the results and the new residuals hold every input.
    got = out.reshape(-1).astype(np.float64) + new.astype(np.float64).sum(0)
    np.testing.assert_allclose(got, (x + r).astype(np.float64).sum(0), atol=2e-5)


def test_keep_own_and_param_delta_keys_are_checked_in_one_line():
    cases = [
        ({"codec": "zfp:8", "keep_own": True}, "axes.data.keep_own: needs error_feedback: true"),
        ({"codec": "zfp:8", "error_feedback": True, "keep_own": 1}, "keep_own: expected true"),
        ({"codec": "q4:h", "param_delta": "yes"}, "axes.data.param_delta: expected true or false"),
        ({"codec": "q4:h", "param": "mpc", "param_delta": True}, "lossy param codec (zfp, q8, q4)"),
    ]
    for entry, culprit in cases:
        with pytest.raises(ValueError) as err:
            _policy(**entry)
        assert culprit in str(err.value) and "\n" not in str(err.value), str(err.value)
    policy = _policy(codec="q4:h", error_feedback=True, keep_own=True, param_delta=True)
    assert policy.keep_own("data") and policy.param_delta("data")
    assert jaxhc.Policy.from_dict(policy.to_dict()) == policy
    assert not policy.keep_own("tensor") and not policy.param_delta("tensor")
    from _gpt import CFG

    from jaxhc.model.config import MeshConfig, ShardConfig
    from jaxhc.parallel.state import Plan

    sharded = MeshConfig(2, 1, 1, 1, shard=ShardConfig(params=2))
    with pytest.raises(ValueError, match=r"param_delta needs replicated parameters, not mesh"):
        Plan(CFG, sharded, policy=policy)


@pytest.mark.slow  # CI time: trains two runs; the quick suite checks the keys above
def test_param_delta_keeps_the_gathered_copy_near_the_master_copy():
    """ZeRO with 4-bit parameter gathers: sending each step's change keeps the parameters the
    ranks compute with within the coding error of one change of the exact (master) ones, far
    closer than gathering the 4-bit parameters themselves, and the same bits on every rank."""
    from _gpt import CFG, OPTIM, SEED, batch

    from jaxhc.model import MeshConfig
    from jaxhc.parallel import init_state, make_mesh, make_train_step
    from jaxhc.parallel.state import Plan

    mesh_cfg = MeshConfig(2, 1, 1, 1)
    mesh = make_mesh(mesh_cfg, jax.devices()[:2])
    layout = Plan(CFG, mesh_cfg).layout
    gaps = {}
    for delta in (False, True):
        policy = _policy(codec="q4:b64:h", param_delta=delta)
        step = make_train_step(CFG, mesh_cfg, OPTIM, mesh, policy)
        state = init_state(CFG, mesh_cfg, OPTIM, mesh, SEED)
        for i in range(3):
            state, _ = step(state, batch(i, size=8))
        master = np.asarray(state.opt_state["master"]).reshape(-1)
        copies = [
            np.asarray(
                layout.flatten(jax.tree.map(lambda a, d=d: a.addressable_data(d), state.params))
            )
            for d in range(2)
        ]
        np.testing.assert_array_equal(copies[0], copies[1])
        gaps[delta] = np.linalg.norm(copies[0] - master) / np.linalg.norm(master)
    assert gaps[True] < gaps[False] / 20, gaps  # measured: 0.0034 vs 0.107
