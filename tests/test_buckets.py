"""A pytree reduced by `jaxhc.psum` / `jaxhc.pmean` in buckets: one message and one agreement vote
per bucket (per dtype up to `bucket_bytes`), results as `jax.lax` gives them leaf by leaf."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxhc
from jaxhc.collectives import _buckets
from tests._mesh import mesh_of, run
from tests._tiers import quick
from tests.test_collectives import _zfp_tolerance

MESHES = ["1d8", "3d-data-pipe"]  # 8 ranks on one axis; 4 ranks over ("data", "pipe")
# Every case of the parametrized families runs under `slow`; the quick suite keeps two of each.


def mixed_tree(devices: int, seed: int = 0) -> dict:
    """float32 and bfloat16 leaves of odd sizes and 0-d, magnitudes 1e-4..1e2, and an int leaf;
    each with a leading device dim (the shards are the rest)."""
    rng = np.random.default_rng(seed)

    def ints(shape, dtype, scale=1.0):
        return jnp.asarray(rng.integers(-8, 9, size=(devices,) + shape) * scale, dtype)

    return {
        "w": ints((5, 7), jnp.float32),
        "b": ints((3,), jnp.float32, 2.0**-13),  # small next to w: its own zfp blocks
        "scalar": ints((), jnp.float32),
        "odd": ints((13,), jnp.float32, 16.0),
        "h": ints((2, 9), jnp.bfloat16),
        "h0": ints((), jnp.bfloat16),
        "steps": ints((4,), jnp.int32),
        "nested": [ints((1,), jnp.float32, 2.0**-6), ints((6,), jnp.bfloat16, 8.0)],
    }


def smooth(tree, seed=1):
    """The tree's float leaves replaced by smooth data of the same magnitude (zfp's test data)."""
    rng = np.random.default_rng(seed)

    def one(a):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            return a
        scale = max(float(jnp.max(jnp.abs(a.astype(jnp.float32)))), 1e-30)
        t = np.linspace(0, 6, a.size).reshape(a.shape)
        return jnp.asarray(scale * (np.sin(t) + 0.01 * rng.standard_normal(a.shape)), a.dtype)

    return jax.tree.map(one, tree)


def parts_of(mesh, axis) -> int:
    names = axis if isinstance(axis, tuple) else (axis,)
    return int(np.prod([mesh.shape[a] for a in names]))


def buckets_of(tree, bucket_bytes) -> int:
    """The number of buckets `_buckets.plan` makes of one shard of `tree` (lossless: no padding)."""
    leaves = [jnp.zeros(a.shape[1:], a.dtype) for a in jax.tree.leaves(tree)]
    return len(_buckets.plan(dict(enumerate(leaves)), bucket_bytes))


def count(primitive: str, fn, *args) -> int:
    """How many times `primitive` occurs in the jaxpr of `fn(*args)` (shard_map bodies included)."""
    return str(jax.make_jaxpr(fn)(*args)).count(f" {primitive}[")


def assert_bits(got, want):
    for (path, g), w in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True
    ):
        assert g.dtype == w.dtype and g.shape == w.shape, (path, g.dtype, w.dtype)
        np.testing.assert_array_equal(
            np.asarray(g, np.float64), np.asarray(w, np.float64), err_msg=str(path)
        )


@pytest.mark.parametrize(
    "mesh_name, codec",
    quick(
        [(m, c) for c in (None, "none", "mpc") for m in MESHES],
        {("1d8", "none"), (MESHES[1], "mpc")},
    ),
)
def test_lossless_tree_equals_lax_in_one_message_per_dtype(mesh_name, codec):
    mesh, axis = mesh_of(mesh_name)
    tree = mixed_tree(mesh.devices.size)
    with jaxhc.accounting.Ledger() as ledger:
        got = jax.block_until_ready(run(lambda t: jaxhc.psum(t, axis, codec=codec), mesh, tree))
        jax.effects_barrier()
    assert_bits(got, run(lambda t: lax.psum(t, axis), mesh, tree))
    # float32, bfloat16, int32: three messages, each recorded once per rank
    per = ledger.per_axis(devices=mesh.size)[",".join(axis) if isinstance(axis, tuple) else axis]
    assert per["calls"] == 3 == buckets_of(tree, _buckets.DEFAULT_BUCKET_BYTES)
    leaves = [a[0] for a in jax.tree.leaves(tree)]
    parts = parts_of(mesh, axis)
    raw = 2 * (parts - 1) / parts * sum(a.size * a.dtype.itemsize for a in leaves)
    assert per["raw_bytes"] == pytest.approx(raw)


@pytest.mark.parametrize(
    "mesh_name, codec",
    quick(
        [(m, c) for c in ("zfp:8", "zfp:8:d2", "q8:b8") for m in MESHES],
        {("1d8", "zfp:8"), (MESHES[1], "q8:b8")},
    ),
)
def test_lossy_tree_meets_each_leafs_bound(mesh_name, codec):
    """Every leaf within the bound it has when sent alone (the zfp psum tests' bound; the
    quantizer's half step per term), though leaves of 1e-4..1e2 share one message: no codec
    block holds values of two leaves."""
    mesh, axis = mesh_of(mesh_name)
    parts = parts_of(mesh, axis)
    tree = smooth(mixed_tree(mesh.devices.size))
    got = run(lambda t: jaxhc.psum(t, axis, codec=codec), mesh, tree)
    want = run(lambda t: lax.psum(t, axis), mesh, tree)
    alone = run(lambda t: jaxhc.psum(t, axis, codec=codec, bucket_bytes=None), mesh, tree)
    for (path, g), w, a, x in zip(
        jax.tree_util.tree_leaves_with_path(got),
        jax.tree.leaves(want),
        jax.tree.leaves(alone),
        jax.tree.leaves(tree),
        strict=True,
    ):
        assert g.dtype == w.dtype and g.shape == w.shape, path
        g, w, a = (np.asarray(v, np.float64) for v in (g, w, a))
        if not jnp.issubdtype(x.dtype, jnp.floating):
            np.testing.assert_array_equal(g, w, err_msg=str(path))
            continue
        big = float(np.max(np.abs(np.asarray(x, np.float64))))
        if codec.startswith("zfp"):
            atol = _zfp_tolerance(x, 8, parts + 1)
        else:  # two quantizations (send, reduced chunk), each within half a step of its block
            atol = big * (parts + 1) / 127
        if x.dtype == jnp.bfloat16:
            atol += np.max(np.abs(w)) * 2.0**-7  # bfloat16's own rounding of the sum
        np.testing.assert_allclose(g, w, rtol=0, atol=atol, err_msg=str(path))
        np.testing.assert_allclose(a, w, rtol=0, atol=atol, err_msg=str(path))


def test_lossy_bucket_is_one_vote_and_one_message():
    """zfp needs agreement votes (a NaN makes it fall back): two per message (before the
    reduce-scatter and before the all-gather), so two per bucket, not two per leaf; the
    compressed payloads travel as one all_to_all per bucket."""
    mesh, axis = mesh_of("1d8")
    tree = smooth(mixed_tree(8))
    spec = jax.P(axis)

    def compiled(bucket_bytes):
        fn = jax.shard_map(
            lambda t: jaxhc.psum(t, axis, codec="zfp:8", bucket_bytes=bucket_bytes),
            mesh=mesh,
            in_specs=spec,
            out_specs=spec,
        )
        return fn

    def messages(bucket_bytes):
        fn = compiled(bucket_bytes)
        votes, sends = count("pmin", fn, tree), count("all_to_all", fn, tree)
        assert votes == 2 * sends, (votes, sends)
        return sends

    floats = sum(1 for a in jax.tree.leaves(tree) if jnp.issubdtype(a.dtype, jnp.floating))
    assert floats == 8 == messages(None)  # each float leaf alone
    assert messages(2**20) == 2  # a float32 and a bfloat16 message
    # 64-byte buckets: the planner's count (small leaves share, larger ones split off)
    small = buckets_of(tree, 64) - 1  # the int32 bucket sends plain
    assert 2 < small < floats
    assert messages(64) == small
    with jaxhc.accounting.Ledger() as ledger:
        jax.block_until_ready(jax.jit(compiled(2**20))(tree))
        jax.effects_barrier()
    assert ledger.per_axis(devices=8)["x"]["calls"] == 3


def test_nan_in_one_leaf_sends_its_bucket_raw():
    mesh, axis = mesh_of("1d8")
    tree = smooth(mixed_tree(8))
    tree["odd"] = tree["odd"].at[3, 5].set(jnp.nan)
    with jaxhc.accounting.Ledger() as ledger:
        got = run(lambda t: jaxhc.psum(t, axis, codec="zfp:8"), mesh, tree)
        jax.block_until_ready(got)
        jax.effects_barrier()
    want = run(lambda t: lax.psum(t, axis), mesh, tree)
    per = ledger.per_axis(devices=8)["x"]
    assert per["calls"] == 3 and per["fallbacks"] == 1  # the float32 bucket only
    for k in ("w", "b", "scalar", "odd"):  # the float32 bucket went raw: exact
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))


def test_policy_min_bytes_applies_to_the_bucket():
    """Eight 256-byte leaves under a 1 KiB min_bytes: alone they go raw; bundled they compress."""
    mesh, axis = mesh_of("1d4")
    policy = jaxhc.Policy.from_dict({"min_bytes": 1024, "axes": {"x": {"codec": "zfp:8"}}})
    rng = np.random.default_rng(3)
    tree = [jnp.asarray(rng.standard_normal((4, 64)), jnp.float32) for _ in range(8)]

    def traffic(bucket_bytes):
        with jaxhc.accounting.Ledger() as ledger:
            got = run(
                lambda t: jaxhc.psum(
                    t, axis, policy=policy, kind="grad", bucket_bytes=bucket_bytes
                ),
                mesh,
                tree,
            )
            jax.block_until_ready(got)
            jax.effects_barrier()
        return got, ledger.per_axis(devices=4)["x"]

    alone, per_leaf = traffic(None)
    bundled, per_bucket = traffic(2**20)
    assert per_leaf["calls"] == 8 and per_leaf["wire_bytes"] == per_leaf["raw_bytes"]
    assert per_bucket["calls"] == 1 and per_bucket["raw_bytes"] == per_leaf["raw_bytes"]
    assert per_bucket["wire_bytes"] < 0.3 * per_bucket["raw_bytes"]
    want = run(lambda t: lax.psum(t, axis), mesh, tree)
    for a, b, w in zip(alone, bundled, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(w))
        np.testing.assert_allclose(b, w, rtol=0, atol=_zfp_tolerance(w, 8, 1))


@pytest.mark.parametrize(
    "check_vma, codec",
    quick(
        [(v, c) for c in (None, "none", "mpc", "zfp:16") for v in (True, False)],
        {(True, "zfp:16"), (False, "mpc")},
    ),
)
def test_gradients_equal_the_per_leaf_ones(check_vma, codec):
    mesh, axis = mesh_of("3d-data-pipe")
    tree = mixed_tree(8, seed=4)
    floats = {k: v for k, v in tree.items() if k not in ("steps",)}

    def grad_of(fn):
        def loss(t):
            out = run(fn, mesh, t, check_vma=check_vma)
            return sum(jnp.sum(jnp.cos(a.astype(jnp.float32)) * a) for a in jax.tree.leaves(out))

        return jax.jit(jax.grad(loss))(floats)

    bucketed = grad_of(lambda t: jaxhc.psum(t, axis, codec=codec))
    per_leaf = grad_of(lambda t: jaxhc.psum(t, axis, codec=codec, bucket_bytes=None))
    if codec == "zfp:16":
        for g, w in zip(jax.tree.leaves(bucketed), jax.tree.leaves(per_leaf), strict=True):
            atol = _zfp_tolerance(w, 16, 8) + float(jnp.max(jnp.abs(w))) * 2.0**-7
            np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=0, atol=atol)
        return
    assert_bits(bucketed, per_leaf)
    assert_bits(bucketed, grad_of(lambda t: lax.psum(t, axis)))


@pytest.mark.parametrize("codec", [None, "mpc"])
def test_jvp_of_a_tree_matches_lax(codec):
    mesh, axis = mesh_of("1d8")
    tree = {k: v for k, v in mixed_tree(8).items() if k != "steps"}
    tangent = jax.tree.map(lambda a: (a / 4).astype(a.dtype), mixed_tree(8, seed=5))
    tangent.pop("steps")

    def forward(f):
        return run(lambda t, u: jax.jvp(f, (t,), (u,)), mesh, tree, tangent)

    with jaxhc.accounting.Ledger() as ledger:
        got = jax.block_until_ready(forward(lambda t: jaxhc.pmean(t, axis, codec=codec)))
        jax.effects_barrier()
    assert_bits(got, forward(lambda t: lax.pmean(t, axis)))
    assert ledger.per_axis(devices=8)["x"]["calls"] == 4  # 2 dtypes x (primal, tangent)


def test_pmean_of_a_tree_matches_lax():
    mesh, axis = mesh_of("3d-data-pipe")
    tree = mixed_tree(8)
    got = run(lambda t: jaxhc.pmean(t, axis, codec="mpc", bucket_bytes=64), mesh, tree)
    assert_bits(got, run(lambda t: lax.pmean(t, axis), mesh, tree))


@pytest.mark.parametrize("codec", [None, "mpc"])
def test_types_follow_the_per_leaf_call(codec):
    """Python numbers fold at trace time; weak types come out as leaf by leaf (as lax's for the
    plain sum); a leaf invariant over another mesh axis stays so (it shares no bucket with leaves
    varying over it), which shard_map's out_specs check would catch."""
    mesh, _ = mesh_of("3d-data-pipe")
    x = mixed_tree(8)["w"]
    seen = {}

    def types(tree):
        return {
            k: v if isinstance(v, int) else (jax.typeof(v), jax.typeof(v).weak_type)
            for k, v in tree.items()
        }

    def body(a):
        over_data = lax.psum(a, "data")  # invariant over "data"
        rank = lax.axis_index("pipe")
        tree = {"n": 2, "weak": rank * 1.5, "weak2": rank * 0.5, "a": a, "d": over_data, "e": a[0]}
        ours = jaxhc.psum(tree, "pipe", codec=codec)
        seen["ours"] = types(ours)
        seen["alone"] = types(jaxhc.psum(tree, "pipe", codec=codec, bucket_bytes=None))
        seen["lax"] = types(lax.psum(tree, "pipe"))
        return ours["a"], ours["d"], ours["weak"][None]

    out = jax.jit(
        jax.shard_map(
            body,
            mesh=mesh,
            in_specs=jax.P(("data", "tensor", "pipe")),
            out_specs=(jax.P(("data", "tensor")), jax.P("tensor"), jax.P(("data", "tensor"))),
        )
    )(x)
    jax.block_until_ready(out)
    assert seen["ours"] == seen["alone"]
    assert seen["ours"]["n"] == 4
    if codec is None:
        assert seen["ours"] == seen["lax"] and seen["ours"]["weak"][1]


def test_bad_bucket_bytes_is_a_one_line_error():
    mesh, axis = mesh_of("1d4")
    tree = mixed_tree(4)
    for bad in (-1, 1.5, "32MiB", True):
        with pytest.raises(ValueError, match=r"bucket_bytes=.* must be a non-negative integer"):
            run(lambda t, b=bad: jaxhc.psum(t, axis, codec="mpc", bucket_bytes=b), mesh, tree)
