"""The planner's step time (jaxhc.plan.steptime): compute from FLOPs against XLA's own count,
the overlap of a pass against closed forms, what each schedule hides, and the cluster keys."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest
from _gpt import CFG

from jaxhc.model import gpt
from jaxhc.plan import cluster as clusters
from jaxhc.plan.comm import comm_time
from jaxhc.plan.cost import (
    codec_by_policy,
    codec_by_spec,
    collectives,
    error_feedback,
    keeps_own,
)
from jaxhc.plan.layout import Layout, device_params, device_segments
from jaxhc.plan.search import search
from jaxhc.plan.shapes import LLAMA, from_gpt
from jaxhc.plan.steptime import (
    UPDATE_BYTES,
    compute,
    layer_call,
    overlapped,
    pass_time,
    step_time,
)
from jaxhc.policy import Policy

SHAPE = from_gpt("tiny", CFG)
LINK = {"gbit_s": 1, "latency_us": 20}
RATE = {"tflop_s": 0.05, "memory_gb_s": 5}


def hosts(n: int = 4, **extra) -> clusters.Cluster:
    """n nodes of one device at 1 Gbit/s, with compute rates."""
    data = {"name": "hosts", "nodes": n, "devices_per_node": 1, "memory_gib": 16}
    data |= {"links": {"intra": LINK, "inter": LINK}, "compute": RATE}
    speed = {"encode_gb_s": 2, "decode_gb_s": 2}
    data |= {"codecs": {"zfp:8": speed, "q8": speed, "q8:sr": speed}}
    return clusters.from_dict({**data, **extra})


@pytest.mark.parametrize("layers", [1, 2, 5])
@pytest.mark.parametrize("f", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("x", [0.25, 1.0, 3.0])
def test_pass_time_against_closed_forms(layers, f, x):
    """Reductions after each layer: all but the last hide, up to a layer's compute each; gathers
    one layer ahead: a two-stage pipeline, the first gather exposed."""
    assert pass_time(layers, f, reduce=x) == pytest.approx(
        layers * f + layers * x - (layers - 1) * min(f, x)
    )
    assert pass_time(layers, f, gather=x) == pytest.approx(x + f + (layers - 1) * max(f, x))
    assert pass_time(layers, f) == pytest.approx(layers * f)
    # both on one link: never less than the compute with the first gather and the last
    # reduction around it, nor than the link's work
    both = pass_time(layers, f, x, x)
    assert both >= max(layers * f + 2 * x, layers * 2 * x) - 1e-12
    assert both <= layers * (f + 2 * x) + 1e-12


def test_compute_counts_the_matrix_products_xla_counts():
    """Forward FLOPs of a one-layer GPT (XLA's cost analysis counts a scan's body once) against
    XLA's count for its compiled loss, which adds the element-wise work: the planner counts the
    products, a little less. The backward is twice the forward."""
    cfg = dataclasses.replace(CFG, n_layer=1, n_embd=64)
    batch, seq = 4, cfg.block_size
    params = jax.eval_shape(functools.partial(gpt.init_params, cfg), 0)
    tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)
    compiled = jax.jit(functools.partial(gpt.loss, cfg=cfg)).lower(params, tokens).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    lay = Layout(1, 1, 1, 1, 1, 1, 1, (1,))
    rate = clusters.ComputeRate(1.0, 1.0)  # seconds = FLOPs
    shape = from_gpt("one", cfg)
    work = compute(shape, lay, batch, seq, rate)
    assert 0.8 * cost["flops"] <= work.forward <= cost["flops"]
    assert work.backward == pytest.approx(2 * work.forward)
    _, padded = device_params(shape, lay)
    assert work.update == padded * UPDATE_BYTES
    rc = compute(shape, dataclasses.replace(lay, recompute=True), batch, seq, rate)
    assert rc.layer_backward == pytest.approx(3 * work.layer_forward)


def test_compute_per_device_and_pipeline_bubble():
    """Tensor parallelism divides the products; a pipeline of p stages and m micro-batches keeps
    a stage busy m of m + p - 1 slots; the update is the optimizer chunk's."""
    shape, rate = LLAMA["llama-7b"], clusters.ComputeRate(1e12, 1e9)
    one = compute(shape, Layout(8, 1, 1, 1, 1, 8, 8, (8,), precision="mixed"), 64, 512, rate)
    tp = compute(shape, Layout(4, 2, 1, 1, 1, 4, 4, (4,), precision="mixed"), 64, 512, rate)
    assert tp.layer_forward == pytest.approx(one.layer_forward)  # twice the tokens, half each
    pp4 = compute(shape, Layout(2, 1, 4, 4, 1, 2, 2, (2,), precision="mixed"), 64, 512, rate)
    pp8 = compute(shape, Layout(2, 1, 4, 8, 1, 2, 2, (2,), precision="mixed"), 64, 512, rate)
    # m + p - 1 slots of a micro-batch's work: 7 slots of 1/4 the batch, 11 of 1/8
    assert pp8.forward / pp4.forward == pytest.approx((11 / 8) / (7 / 4))
    assert pp4.layer_forward == pytest.approx(one.layer_forward)  # 8 sequences a micro-batch
    _, padded = device_params(shape, Layout(8, 1, 1, 1, 1, 8, 8, (8,), precision="mixed"))
    assert one.update == pytest.approx(padded // 8 * UPDATE_BYTES / 1e9)


def _jaxhc_case(**change):
    lay = Layout(**{**dict(data=4, tensor=1, pipe=1, microbatches=1, params=1, grads=4),
                    **dict(optim=4, levels=(4,), transport="mpi"), **change})  # fmt: skip
    cluster = hosts()
    codec_of = codec_by_spec(lay.codec)
    comms = collectives(SHAPE, lay, 8, CFG.block_size, cluster, codec_of)
    return lay, cluster, comms, step_time(SHAPE, lay, 8, CFG.block_size, cluster, comms)


@pytest.mark.parametrize("codec", ["none", "zfp:8"])
def test_jaxhc_hides_the_started_layer_scatters(codec):
    """MPI, overlap on: each layer's reduce-scatter (a call of its segment) hides behind the
    earlier layers' backward, up to one layer's each; the last started one does not. The step's
    communication is the comm column's with that scatter as its per-layer calls and the shared
    segment's."""
    lay, cluster, comms, t = _jaxhc_case(codec=codec)
    shared, one, layers = device_segments(SHAPE, lay)
    _, padded = device_params(SHAPE, lay)
    scatter = comms[0]
    assert (scatter.op, scatter.role) == ("psum_scatter", "reduce")
    r = dataclasses.replace(scatter, message=one).seconds(cluster)
    assert r == layer_call(scatter, cluster, one / padded)
    assert t.hidden == pytest.approx((layers - 1) * min(r, t.compute.layer_backward))
    assert t.hidden > 0
    rest = dataclasses.replace(scatter, message=shared).seconds(cluster)
    column = comm_time(comms, cluster)
    assert t.comm == pytest.approx(column - scatter.seconds(cluster) + layers * r + rest)
    assert t.comm > column  # more calls: more latencies
    assert t.seconds == pytest.approx(t.compute.total + t.comm - t.hidden)


@pytest.mark.parametrize(
    "change",
    [
        {"transport": "xla"},  # XLA:CPU runs the layers' reductions in program order
        {"overlap": False},  # train.overlap off: the whole vector after the backward
        {"microbatches": 2},  # the step reduces once after the micro-batches
        {"codec": "q8:sr"},  # no fused native call (stochastic rounding): not started
    ],
)
def test_jaxhc_hides_nothing_where_the_step_does_not_overlap(change):
    _, cluster, comms, t = _jaxhc_case(**change)
    assert t.hidden == 0 and t.comm == comm_time(comms, cluster)
    assert t.seconds == pytest.approx(t.compute.total + t.comm)


def test_jaxhc_sharded_parameters_hide_nothing():
    lay = Layout(4, 1, 1, 1, 2, 2, 4, (2, 4), transport="mpi")
    cluster = hosts()
    comms = collectives(SHAPE, lay, 8, CFG.block_size, cluster)
    assert step_time(SHAPE, lay, 8, CFG.block_size, cluster, comms).hidden == 0


def _feedback(codec: str, **flags):
    """A policy with error feedback on "data" under `codec` (`flags`: keep_own)."""
    data = {"codec": codec, "error_feedback": True, **flags}
    return codec_by_policy(Policy.from_dict({"name": "ef", "min_bytes": 0, "axes": {"data": data}}))


@pytest.mark.parametrize("codec", ["zfp:8", "q8"])
def test_jaxhc_hides_the_fused_error_feedback_scatters(codec):
    """Error feedback on MPI: the trainer fuses the gradient reduce-scatter with its residual
    (`MpiTransport.fused_feedback`) and starts it in the backward as without (`train.overlap`):
    the same hiding as the codec without error feedback; with ``keep_own`` the trainer does not
    overlap; a residual without a codec has no native call to start."""
    lay = Layout(4, 1, 1, 1, 1, 4, 4, (4,), codec=codec, transport="mpi")
    cluster, seq = hosts(), CFG.block_size
    ef = _feedback(codec)
    assert error_feedback(lay, cluster, ef) and not keeps_own(lay, cluster, ef)
    comms = collectives(SHAPE, lay, 8, seq, cluster, ef)
    assert [(c.op, c.feedback, c.fused) for c in comms if c.kind == "grad"] == [
        ("psum_scatter", True, True)
    ]
    plain = collectives(SHAPE, lay, 8, seq, cluster, codec_by_spec(codec))
    assert [dataclasses.replace(c, feedback=False) for c in comms] == plain
    with_ef, without = (step_time(SHAPE, lay, 8, seq, cluster, c) for c in (comms, plain))
    assert with_ef == without and with_ef.hidden > 0
    own = _feedback(codec, keep_own=True)
    assert keeps_own(lay, cluster, own)
    kept = collectives(SHAPE, lay, 8, seq, cluster, own)
    t = step_time(SHAPE, lay, 8, seq, cluster, kept, keeps_own=True)
    assert t.hidden == 0 and t.comm == comm_time(kept, cluster)
    unfused = [dataclasses.replace(c, codec=None, fused=False) for c in comms]
    assert step_time(SHAPE, lay, 8, seq, cluster, unfused).hidden == 0  # a plain residual call


def test_amsp_prefetches_gathers_and_hides_reductions():
    """AMSP's schedule: a layer's calls of the gathers (per pass) and of the reductions, through
    `pass_time` forward and backward; `none` hides nothing."""
    cluster = hosts(8, schedule={"gradients": "all_reduce", "overlap": "amsp"})
    shape = LLAMA["llama-7b"]
    lay = Layout(8, 1, 1, 1, 4, 4, 8, (4, 8), precision="mixed")
    comms = collectives(shape, lay, 8, 256, cluster)
    work = compute(shape, lay, 8, 256, cluster.compute)
    _, one, layers = device_segments(shape, lay)
    _, padded = device_params(shape, lay)
    share = one / padded
    gathers = [c for c in comms if c.role == "gather"]
    reduces = [c for c in comms if c.role == "reduce"]
    assert len(gathers) == 1 and gathers[0].count == 2 and all(c.count == 1 for c in reduces)

    def one(c):  # a layer's call: the same collective of its segment
        return dataclasses.replace(c, message=round(c.message * share), count=1).seconds(cluster)

    g, r = one(gathers[0]), sum(one(c) for c in reduces)
    f, b = work.layer_forward, work.layer_backward
    exposed = pass_time(layers, f, g) - layers * f + pass_time(layers, b, g, r) - layers * b
    want = layers * (2 * g + r) - exposed
    total, hid = overlapped(comms, shape, lay, cluster, work)
    assert hid == pytest.approx(want)
    assert 0 < want < total and total > comm_time(comms, cluster)  # a latency per layer call
    off = dataclasses.replace(cluster, overlap="none")
    assert overlapped(comms, shape, lay, off, work) == (comm_time(comms, cluster), 0.0)


def test_search_ranks_by_step_time_and_keeps_the_comm_column():
    """With compute rates the plans rank by step time; their communication (the comm column) is
    what it was without them (and without rates there is no step time)."""
    with_rates = hosts(8)
    without = dataclasses.replace(with_rates, compute=None)
    a = search(SHAPE, with_rates, 16, CFG.block_size, transport="mpi")
    b = search(SHAPE, without, 16, CFG.block_size, transport="mpi")
    comm = {(c.layout, c.comm_seconds) for c in b}
    assert {(c.layout, c.comm_seconds) for c in a} == comm
    fits = [c.step_seconds for c in a if not c.rejected]
    assert fits == sorted(fits, key=lambda s: float(f"{s:.3g}"))
    assert all(c.step_seconds is None for c in b)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"compute": {"tflop_s": 1}}, "cluster key 'compute.memory_gb_s' is missing"),
        ({"compute": {"tflop_s": 0, "memory_gb_s": 1}}, "compute.tflop_s=0.0 must be > 0"),
        ({"compute": {"tflops": 1, "memory_gb_s": 1}}, "unknown cluster key 'compute.tflops'"),
        ({"schedule": {"overlap": "all"}}, "schedule.overlap='all' must be one of jaxhc, amsp"),
    ],
)
def test_compute_and_overlap_keys_errors_name_the_key(change, message):
    with pytest.raises(ValueError, match=message):
        hosts(**change)


def test_compute_round_trips_through_the_file(tmp_path):
    c = hosts(schedule={"overlap": "none"})
    path = tmp_path / "c.yaml"
    c.dump(str(path))
    again = clusters.load(str(path))
    assert again.compute == c.compute and again.overlap == "none"
