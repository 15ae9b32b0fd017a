"""The planner's cost model (jaxhc.plan.cost): memory and collectives against jaxhc's exact
counts (which tests/test_plan.py checks against XLA and the ledger) and the stated formulas.
Cluster files and the search over them: tests/test_plan_cluster.py."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from _gpt import CFG
from _tiers import quick

import jaxhc
from jaxhc.model.config import GPTConfig, MeshConfig
from jaxhc.parallel.state import Plan
from jaxhc.plan import amsp_bytes, data_collectives, load_shape, state_bytes
from jaxhc.plan import cluster as clusters
from jaxhc.plan.comm import Comm
from jaxhc.plan.cost import codec_by_policy, collectives, memory
from jaxhc.plan.layout import Layout, trainable
from jaxhc.plan.search import evaluate
from jaxhc.plan.shapes import LLAMA, from_gpt

SHAPE = from_gpt("tiny", CFG)
CLUSTER = clusters.from_dict(
    {
        "name": "test",
        "nodes": 4,
        "devices_per_node": 4,
        "memory_gib": 1,
        "links": {
            "intra": {"gbit_s": 800, "latency_us": 2},
            "inter": {"gbit_s": 80, "latency_us": 10},
        },
        "codecs": {"zfp:8": {"encode_gb_s": 20, "decode_gb_s": 10}},
    }
)
ZDATA = jaxhc.Policy.from_dict({"name": "zdata", "min_bytes": 0, "axes": {"data": "zfp:8"}})


def valid_plans(data, groups):
    """Every trainable (s_p, s_g, s_os) on the data axis nested in `groups`."""
    sizes = sorted({1, *(groups or []), data})
    if groups is None:
        sizes = [1, data]
    return sorted({(p, g, o) for o in sizes for p in sizes if o % p == 0 for g in {p, o}})


def _layout(mesh: MeshConfig, **kw) -> Layout:
    shard = mesh.shard
    p, g, o, levels = shard.resolve(mesh.data)
    return Layout(mesh.data, mesh.tensor, mesh.pipe, mesh.microbatches, p, g, o, levels, **kw)


def test_parameter_counts():
    """GPT-2 and LLaMA shapes count what jaxhc's model holds (a tiny LLaMA with grouped-query
    attention and a tied head too); LLaMA-7B the released checkpoint's count."""
    tiny = GPTConfig(arch="llama", n_layer=2, n_head=4, n_kv_head=1, n_embd=64, vocab_size=96)
    tied = dataclasses.replace(tiny, tie_word_embeddings=True)
    for shape in [load_shape(n) for n in ("gpt2-small", "gpt2-medium", "llama-7b")] + [
        from_gpt("tiny", tiny),
        from_gpt("tied", tied),
    ]:
        assert shape.params() == Plan(shape.gpt, MeshConfig()).layout.size, shape.name
    assert LLAMA["llama-7b"].params() == 6_738_415_616
    assert 12.8e9 < LLAMA["llama-13b"].params() < 13.1e9
    assert 32.0e9 < LLAMA["llama-30b"].params() < 32.6e9
    assert 65.0e9 < LLAMA["llama-65b"].params() < 65.5e9


@pytest.mark.parametrize("tensor", [1, 2])
@pytest.mark.parametrize("data, groups", [(8, None), (8, [2]), (8, [4]), (8, [2, 4]), (4, [2])])
def test_generalised_collectives_are_jaxhcs_for_every_valid_plan(data, groups, tensor):
    """In float32 the cost model's data collectives are `data_collectives`' (equal to the
    ledger's, tests/test_plan.py), raw and under zfp:8, per sub-axis and kind, s_p > 1 included."""
    plans = valid_plans(data, groups)
    assert plans
    for p, g, o in plans:
        shard = {"params": p, "grads": g, "optim": o, "groups": groups}
        mesh = MeshConfig(data, tensor, 1, 1, shard=shard)
        lay = _layout(mesh)
        ours = collectives(SHAPE, lay, 64, 16, CLUSTER, codec_by_policy(ZDATA))
        ours = [c for c in ours if c.axis.startswith("data")]
        fl = Plan(CFG, mesh).layout
        segments = (4 * fl.shared_padded, 4 * fl.layer_padded, fl.layers)
        theirs = data_collectives(mesh, 4 * fl.padded, segments)
        got_raw, got_wire, want_raw, want_wire = (defaultdict(float) for _ in range(4))
        for c in ours:
            got_raw[c.axis, c.kind] += c.count * c.raw
            got_wire[c.axis, c.kind] += c.count * c.wire
        for c in theirs:
            want_raw[c.axis, c.kind] += c.count * c.bytes
            want_wire[c.axis, c.kind] += c.count * c.wire(ZDATA)
        assert dict(got_raw) == pytest.approx(dict(want_raw), rel=1e-12)
        assert dict(got_wire) == pytest.approx(dict(want_wire), rel=1e-12)
        assert [(c.axis, c.op, c.count) for c in ours] == [(c.axis, c.op, c.count) for c in theirs]


EF = jaxhc.Policy.from_dict(
    {"name": "ef", "min_bytes": 0, "axes": {"data": {"codec": "zfp:8", "error_feedback": True}}}
)


@pytest.mark.parametrize(
    "shard",
    [
        {},
        {"optim": 1},
        {"grads": 1, "optim": 4, "groups": [4]},
        {"params": 2, "grads": 2, "optim": 8, "groups": [2]},
        {"params": 8},
        {"params": 2, "grads": 4, "optim": 4, "groups": [2, 4]},
    ],
)
@pytest.mark.parametrize("policy", [None, EF])
def test_float32_state_is_jaxhcs_exact_count(shard, policy):
    mesh = MeshConfig(8, 1, 1, 1, shard=shard)
    want = state_bytes(CFG, mesh, policy)
    got = memory(SHAPE, _layout(mesh), 64, 16, error_feedback=policy is not None)
    assert (got.params, got.grads, got.optim) == (want.params, want.grads, want.optim)


def test_sharded_parameters_follow_the_formulas():
    """s_p > 1 (ZeRO-3) as jaxhc's step runs it (float32): P = 4 psi_pad / s_p; the parameters
    gathered once a step (the forward), (s_p - 1) / s_p n, the gradients reduce-scattered once a
    step, not per micro-batch; the whole gathered vector is a temporary beside the unreduced
    gradient; error-feedback residuals per level. The trainer takes it. Mixed precision keeps the
    layer-wise ZeRO-3 count: gathers forward and backward every micro-batch."""
    mesh = MeshConfig(8, 1, 1, 1)
    padded = Plan(CFG, mesh).layout.padded
    lay = Layout(8, 1, 1, 2, 8, 8, 8, (8,), gather="whole")
    mem = memory(SHAPE, lay, 64, 16)
    assert (mem.params, mem.grads, mem.optim) == (
        4 * padded // 8,
        4 * padded // 8,
        4 * (3 * padded // 8 + 2),
    )
    flat = memory(SHAPE, dataclasses.replace(lay, params=1), 64, 16)
    assert mem.temporaries - flat.temporaries == 4 * padded  # the gathered parameters
    comms = collectives(SHAPE, lay, 64, 16, CLUSTER)
    assert [(c.kind, c.op, c.count) for c in comms] == [
        ("param", "all_gather", 1),
        ("grad", "psum_scatter", 1),
    ]  # nothing to exchange: s_os = s_p
    assert comms[0].raw == 7 / 8 * 4 * padded == comms[1].raw
    nested = Layout(8, 1, 1, 2, 2, 2, 8, (2, 8), gather="whole")
    assert memory(SHAPE, nested, 64, 16, error_feedback=True).optim == memory(
        SHAPE, nested, 64, 16
    ).optim + 4 * (padded + padded // 2)
    ef = evaluate(SHAPE, nested, CLUSTER, 64, 16, codec_by_policy(EF)).memory  # search counts it
    assert ef == memory(SHAPE, nested, 64, 16, error_feedback=True)
    got = [(c.axis, c.kind, c.op, c.message) for c in collectives(SHAPE, nested, 64, 16, CLUSTER)]
    assert got == [
        ("data.1", "param", "all_gather", padded // 2),
        ("data.1", "grad", "psum_scatter", padded),
        ("data.0", "grad", "psum_scatter", padded // 2),
        ("data.0", "grad", "all_gather", padded // 8),  # back outside s_g
        ("data.0", "param", "all_gather", padded // 8),  # the update: outside the s_p group only
    ]
    mixed = collectives(SHAPE, dataclasses.replace(lay, precision="mixed"), 64, 16, CLUSTER)
    assert [(c.kind, c.count) for c in mixed] == [("param", 4), ("grad", 2)]
    assert trainable(SHAPE, lay) == "yes"
    assert trainable(SHAPE, nested) == "yes"
    assert trainable(SHAPE, dataclasses.replace(lay, params=1)) == "yes"
    assert trainable(LLAMA["llama-7b"], lay) == "yes"
    mixed = dataclasses.replace(lay, precision="mixed")
    assert trainable(LLAMA["llama-7b"], mixed) == "not as counted (jaxhc trains float32)"
    assert trainable(dataclasses.replace(SHAPE, gpt=None), lay) == "shapes only"


def test_per_layer_gathers_follow_the_formulas():
    """``gather: layer`` (the default): the shared segment gathered once, each local layer's
    forward and again backward every micro-batch, the gradients reduce-scattered per segment
    (the same bytes as the whole vector); the temporaries hold the shared parameters and two
    gathered layers instead of the whole gathered vector."""
    fl = Plan(CFG, MeshConfig(8, 1, 1, 2)).layout
    lay = Layout(8, 1, 1, 2, 8, 8, 8, (8,))
    comms = collectives(SHAPE, lay, 64, 16, CLUSTER)
    assert [(c.kind, c.op, c.message, c.count) for c in comms] == [
        ("param", "all_gather", fl.shared_padded // 8, 1),
        ("param", "all_gather", fl.layer_padded // 8, 2 * 2 * fl.layers),
        ("grad", "psum_scatter", fl.shared_padded, 1),
        ("grad", "psum_scatter", fl.layer_padded, fl.layers),
    ]
    whole = memory(SHAPE, dataclasses.replace(lay, gather="whole"), 64, 16)
    mem = memory(SHAPE, lay, 64, 16)
    assert whole.temporaries - mem.temporaries == 4 * (
        fl.padded - fl.shared_padded - 2 * fl.layer_padded
    )
    assert (mem.params, mem.grads, mem.optim) == (whole.params, whole.grads, whole.optim)


def test_mixed_precision_is_amsps_count():
    shape = LLAMA["llama-7b"]
    lay = Layout(64, 1, 1, 1, 8, 8, 64, (8, 64), precision="mixed")
    mem = memory(shape, lay, 64, 2048)
    psi = shape.device_params(1, 1)
    from jaxhc.parallel.amsp import ShardPlan
    from jaxhc.parallel.layout import segment_padded

    # the flat vector of its segments, each in 64 pieces of whole codec blocks (FlatLayout's)
    one = shape.layer_params()
    pad = segment_padded(psi - shape.layers * one, 64) + shape.layers * segment_padded(one, 64)

    want = amsp_bytes(pad, ShardPlan(64, 8, 8, 64, ("data.0", "data.1"), (8, 8)))
    assert (mem.params, mem.grads, mem.optim) == (want.params, want.grads, want.optim)


def test_activations_with_and_without_recomputation():
    shape = LLAMA["llama-7b"]
    base = Layout(8, 2, 1, 1, 1, 8, 8, (8,), precision="mixed")
    b, s, h, f, a, t = 8, 2048, 4096, 11008, 32, 2
    per_layer = 2 * b * s * (2 * h + 4 * h // t + 2 * h + 4 * f // t) + 2 * a // t * b * s * s
    full = memory(shape, base, 64, 2048).activations
    assert full == 32 * per_layer
    rc = memory(shape, dataclasses.replace(base, recompute=True), 64, 2048).activations
    assert rc == 32 * 2 * b * s * h + per_layer
    piped = Layout(4, 2, 2, 4, 1, 4, 4, (4,), precision="mixed")  # GPipe: 4 micro-batches alive
    assert memory(shape, piped, 128, 2048).activations == 4 * 16 * per_layer


def test_time_is_latency_bandwidth_and_codec():
    link = CLUSTER.intra
    c = Comm("data", "grad", "psum_scatter", 4, 4, 1 << 20, 4, 1)
    assert c.seconds(CLUSTER) == pytest.approx(
        3 * link.latency + 3 / 4 * 4 * 2**20 / link.bandwidth
    )
    far = dataclasses.replace(c, span=16)
    assert far.seconds(CLUSTER) == pytest.approx(
        3 * CLUSTER.inter.latency + 3 / 4 * 4 * 2**20 / CLUSTER.inter.bandwidth
    )
    # a flat ring with 2 members per node: each step crosses a node boundary once per 2 hops
    two = dataclasses.replace(far, per_node=2)
    assert two.bandwidth(CLUSTER) == 2 * CLUSTER.inter.bandwidth
    assert dataclasses.replace(far, per_node=4).bandwidth(CLUSTER) == 4 * CLUSTER.inter.bandwidth
    flat = Layout(16, 1, 1, 1, 1, 16, 16, (16,))
    assert {c.per_node for c in collectives(SHAPE, flat, 64, 16, CLUSTER)} == {4}
    nested = Layout(16, 1, 1, 1, 1, 16, 16, (4, 16))  # the outer level: one member per node
    assert [c.per_node for c in collectives(SHAPE, nested, 64, 16, CLUSTER)] == [4, 1, 1, 4]
    z = dataclasses.replace(far, codec=jaxhc.codecs.parse("zfp:8"))
    speed = CLUSTER.codecs["zfp:8"]
    codec_s = 4 * 2**20 / speed.encode + 4 * 2**20 / speed.decode
    agree = 2 * 3 * CLUSTER.inter.latency  # zfp may fall back: the flag's all-reduce
    assert z.seconds(CLUSTER) == pytest.approx(
        3 * CLUSTER.inter.latency + z.wire / CLUSTER.inter.bandwidth + codec_s + agree
    )
    assert z.wire < far.raw / 3.9
    lossless = dataclasses.replace(far, codec=jaxhc.codecs.parse("mpc"))  # never falls back
    assert [op for op, _, _ in lossless.legs()] == ["all_to_all"]


def test_fused_mpi_calls_pipeline_codec_and_wire():
    """On the MPI transport a ZFP/MPC psum, reduce-scatter or all-gather is one fused call: its
    S segments (SEGMENT_BYTES raw of a rank's chunk) pipeline codec and wire, max + min / S, and
    only the reduce-scatter agrees on its flags in an extra all-reduce."""
    from jaxhc.transport import MpiTransport

    SEGMENT_BYTES = MpiTransport.SEGMENT_BYTES

    zfp = jaxhc.codecs.parse("zfp:8")
    n = 3 * SEGMENT_BYTES // 4  # float32 values a rank passes in: 3 MiB
    speed, inter = CLUSTER.codecs["zfp:8"], CLUSTER.inter
    gather = Comm("data", "param", "all_gather", 4, 16, n, 4, 2, zfp, fused=True)
    assert gather.legs() == [("all_gather", 3, gather.wire - 12)]  # flags ride in the messages
    wire, codec = (gather.wire - 12) / inter.bandwidth, 4 * n / speed.encode + 16 * n / speed.decode
    pipelined = max(wire, codec) + min(wire, codec) / 3  # its 3 MiB chunk: 3 segments
    assert gather.seconds(CLUSTER) == pytest.approx(2 * (3 * inter.latency + pipelined))
    unfused = dataclasses.replace(gather, fused=False)
    assert unfused.seconds(CLUSTER) == pytest.approx(
        2 * (9 * inter.latency + wire + 12 / inter.bandwidth + codec)
    )
    scatter = Comm("data", "grad", "psum_scatter", 4, 16, n, 4, 1, zfp, fused=True)
    assert [op for op, _, _ in scatter.legs()] == ["psum_scatter", "psum"]  # its agreement
    # which calls fuse: ZFP/MPC/q8 on the MPI transport (error feedback's reduce-scatters too),
    # not q8:sr nor ppermute
    lay = Layout(16, 1, 1, 1, 1, 16, 16, (4, 16), codec="zfp:8", transport="mpi")
    comms = collectives(SHAPE, lay, 64, 16, CLUSTER)
    inside, across = (False, "psum_scatter"), (True, "all_gather")  # inside a node: no codec
    fused = [inside, (True, "psum_scatter"), across, (False, "all_gather")]
    assert [(c.fused, c.op) for c in comms] == fused
    ef = {"codec": "zfp", "rate": 8, "error_feedback": True}
    ef = codec_by_policy(
        jaxhc.Policy.from_dict({"name": "ef", "min_bytes": 0, "axes": {"data": ef}})
    )
    grads = [c for c in collectives(SHAPE, lay, 64, 16, CLUSTER, ef) if c.kind == "grad"]
    assert [(c.fused, c.feedback, c.codec is not None) for c in grads] == [(True, True, True)] * 2
    q8 = dataclasses.replace(lay, codec="q8")
    assert [c.fused for c in collectives(SHAPE, q8, 64, 16, CLUSTER)] == [c[0] for c in fused]
    q8sr = dataclasses.replace(lay, codec="q8:sr")  # draws keyed by a value's index in the row
    assert not any(c.fused for c in collectives(SHAPE, q8sr, 64, 16, CLUSTER))
    xla = dataclasses.replace(lay, transport="xla")
    assert not any(c.fused for c in collectives(SHAPE, xla, 64, 16, CLUSTER))


@pytest.mark.parametrize(
    "data, tensor, pipe, micro",
    quick([(2, 2, 2, 2), (2, 1, 4, 4), (1, 2, 4, 2)], {0}),  # CI time
)
def test_tensor_and_pipe_bytes_are_the_ledgers(data, tensor, pipe, micro):
    """Tensor all-reduces, pipeline sends and the shared gradients' all-reduce over pipe: the
    cost model's raw bytes per device are the ledger's (per axis and kind) for a jaxhc step."""
    import jax
    from _gpt import OPTIM, SEED, batch

    from jaxhc.parallel import init_state, make_mesh, make_train_step

    mc = MeshConfig(data, tensor, pipe, micro)
    mesh = make_mesh(mc, jax.devices()[: mc.size])
    step = make_train_step(CFG, mc, OPTIM, mesh, "none")
    state = init_state(CFG, mc, OPTIM, mesh, SEED, policy="none")
    ledger = jaxhc.accounting.Ledger()
    with ledger:
        jax.block_until_ready(step(state, batch(0, size=16))[1])
    got = ledger.per_axis(devices=mc.size, by_kind=True)
    got = {k: v["raw_bytes"] for k, v in got.items() if k.split("/")[0] in ("tensor", "pipe")}
    got.pop("pipe/other", None)  # the loss's scalars
    lay = Layout(data, tensor, pipe, micro, 1, data, data, (data,))
    want = defaultdict(float)
    for c in collectives(SHAPE, lay, 16, CFG.block_size, CLUSTER):
        if c.axis in ("tensor", "pipe"):
            want[f"{c.axis}/{c.kind}"] += c.count * c.raw
    assert got == pytest.approx(dict(want), rel=1e-12)


@pytest.mark.parametrize(
    "axes, min_bytes, with_wpe",
    [
        ({"data": "zfp:8"}, 0, True),  # a lossy data reduction: wpe joins the pair
        # ... whatever min_bytes sends raw (slow: CI time)
        pytest.param({"data": "zfp:8"}, 1 << 30, True, marks=pytest.mark.slow),
        # the pair compressed, wpe in it (slow: CI time)
        pytest.param({"data": "zfp:8", "pipe": "zfp:8"}, 9000, True, marks=pytest.mark.slow),
        # a lossless data reduction: wte and ln_f alone (slow: CI time)
        pytest.param({"pipe": "zfp:8"}, 0, False, marks=pytest.mark.slow),
    ],
)
def test_the_shared_gradients_pipe_exchange_is_the_ledgers(axes, min_bytes, with_wpe):
    """Pipe 2, tied embeddings: the end stages' exchange of the shared gradients (the positions
    too under a lossy data grad codec, its min_bytes aside: `jaxhc.parallel.grads.pairs`) moves
    the bytes, raw and on the wire, that the planner charges for it."""
    import jax
    from _gpt import OPTIM, SEED, batch

    from jaxhc.parallel import init_state, make_mesh, make_train_step

    policy = jaxhc.Policy.from_dict({"name": "p", "min_bytes": min_bytes, "axes": axes})
    mc = MeshConfig(2, 1, 2, 1)
    mesh = make_mesh(mc, jax.devices()[: mc.size])
    step = make_train_step(CFG, mc, OPTIM, mesh, policy)
    state = init_state(CFG, mc, OPTIM, mesh, SEED, policy=policy)
    with jaxhc.accounting.Ledger() as ledger:
        jax.block_until_ready(step(state, batch(0, size=16))[1])
    got = ledger.per_axis(devices=mc.size, by_kind=True)["pipe/grad"]
    lay = Layout(2, 1, 2, 1, 1, 2, 2, (2,))
    comms = collectives(SHAPE, lay, 16, CFG.block_size, CLUSTER, codec_by_policy(policy))
    (pair,) = [c for c in comms if (c.axis, c.kind) == ("pipe", "grad")]
    shared = CFG.vocab_size * CFG.n_embd + 2 * CFG.n_embd  # wte, ln_f
    wpe = CFG.block_size * CFG.n_embd
    assert pair.raw == 4 * (shared + (wpe if with_wpe else 0))
    assert (got["raw_bytes"], got["wire_bytes"]) == (pair.count * pair.raw, pair.count * pair.wire)
