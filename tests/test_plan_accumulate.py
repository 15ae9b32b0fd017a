"""The planner's gradient accumulation (micro-batches a step), fused attention's memory, NCCL's
ring latency model and the cluster file's split (jaxhc.plan.cluster, jaxhc.plan.clusterfile)."""

from __future__ import annotations

import dataclasses

import pytest

from jaxhc.plan import cluster as clusters
from jaxhc.plan import clusterfile
from jaxhc.plan.cost import collectives, memory
from jaxhc.plan.layout import Layout, device_segments
from jaxhc.plan.search import evaluate, search
from jaxhc.plan.shapes import LLAMA
from jaxhc.plan.steptime import compute, layer_call, overlapped, pass_time
from tests.test_plan_schedule import BASE

AMSP = {"gradients": "all_reduce", "exchange": "broadcast", "nesting": "sizes"}
SHAPE = LLAMA["llama-7b"]


def cluster(**changes):
    return clusters.from_dict({**BASE, **changes})


def lay(sizes, m, levels=(32,), **kw):
    return Layout(32, 1, 1, m, *sizes, levels, precision="mixed", **kw)


def counts(comms):
    return [(c.op, c.ranks, c.count, c.role) for c in comms]


def test_cluster_readers_live_in_clusterfile_and_stay_reachable():
    assert clusters.load is clusterfile.load and clusters.from_dict is clusterfile.from_dict
    assert clusters.local is clusterfile.local
    assert clusters.LOCAL_DEFAULTS is clusterfile.LOCAL_DEFAULTS
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        clusters.nope  # noqa: B018
    c = cluster(schedule={"latency": "crossing", "attention": "fused"})
    assert (c.latency, c.attention) == ("crossing", "fused")
    assert c.to_dict()["schedule"] == {"latency": "crossing", "attention": "fused"}
    assert clusters.from_dict(c.to_dict()) == c
    assert "schedule" not in cluster().to_dict()  # the defaults are not written


@pytest.mark.parametrize(
    "schedule, message",
    [
        ({"latency": "tree"}, "schedule.latency='tree' must be one of inter, crossing"),
        ({"attention": "flash"}, "schedule.attention='flash' must be one of materialized, fused"),
    ],
)
def test_new_schedule_keys_errors_name_the_key(schedule, message):
    with pytest.raises(ValueError, match=message) as e:
        cluster(schedule=schedule)
    assert "\n" not in str(e.value)


def test_accumulation_multiplies_sharded_gathers_and_scatters_not_replicated_reductions():
    """m micro-batches: a sharded parameter (s_p > 1) is gathered for every micro-batch's
    forward and backward and a sharded gradient (s_g > 1) reduce-scattered every micro-batch;
    a replicated gradient is summed locally and all-reduced once, and the reduction over a
    sharded gradient's replicas and the exchange run once a step."""
    c = cluster(schedule=AMSP)
    for m in (1, 4):
        zero3 = counts(collectives(SHAPE, lay((8, 8, 8), m, (8, 32)), 32, 128, c))
        assert zero3 == [
            ("all_gather", 8, 2 * m, "gather"),
            ("psum_scatter", 8, m, "reduce"),
            ("psum", 4, 1, "reduce"),
        ]
        replicated = counts(collectives(SHAPE, lay((1, 1, 8), m, (8, 32)), 32, 128, c))
        assert replicated == [("psum", 32, 1, "reduce"), ("broadcast", 8, 8, "exchange")]
        zero2 = counts(collectives(SHAPE, lay((1, 8, 8), m, (8, 32)), 32, 128, c))
        assert zero2 == [
            ("psum_scatter", 8, m, "reduce"),
            ("psum", 4, 1, "reduce"),
            ("broadcast", 8, 8, "exchange"),
        ]
    # jaxhc's schedule: the sharded gradient's levels per micro-batch, the gathers back once
    jaxhc_ = counts(collectives(SHAPE, lay((1, 32, 32), 4), 32, 128, cluster()))
    assert jaxhc_ == [("psum_scatter", 32, 4, "reduce"), ("all_gather", 32, 1, "exchange")]


def test_micro_batch_sets_each_plans_accumulation():
    c = cluster(schedule=AMSP)
    rows = search(SHAPE, c, 256, 128, precision="mixed", micro_batch=2, tensors=[1], pipes=[1])
    assert {r.layout.microbatches for r in rows} == {256 // (32 * 2)}
    rows = search(SHAPE, c, 256, 128, precision="mixed", micro_batch=2, tensors=[2], pipes=[1])
    assert {r.layout.microbatches for r in rows} == {256 // (16 * 2)}
    default = search(SHAPE, c, 256, 128, precision="mixed", tensors=[1], pipes=[1])
    assert {r.layout.microbatches for r in default} == {1}


def test_accumulation_runs_a_once_a_step_reduction_in_the_last_backward():
    """AMSP's overlap with m micro-batches: a replicated gradient's all-reduce runs per layer in
    the last micro-batch's backward only; the other passes compute alone."""
    c = cluster(schedule={**AMSP, "overlap": "amsp"}, compute={"tflop_s": 10, "memory_gb_s": 100})
    plan = lay((1, 1, 8), 4, (8, 32))
    comms = collectives(SHAPE, plan, 32 * 4 * 2, 128, c)
    work = compute(SHAPE, plan, 32 * 4 * 2, 128, c.compute)
    total, hidden = overlapped(comms, SHAPE, plan, c, work)
    _, one, layers = device_segments(SHAPE, plan)
    psum = comms[0]
    r = layer_call(psum, c, one / (psum.message))
    b = work.layer_backward
    exposed = pass_time(layers, b, reduce=r) - layers * b
    assert hidden == pytest.approx(layers * r - exposed, rel=1e-9)
    assert 0 < hidden < total


def test_fused_attention_keeps_no_probabilities_and_memory_refuses_what_does_not_fit():
    plan = lay((1, 1, 8), 1, (8, 32))
    full = memory(SHAPE, plan, 32, 4096)
    fused = memory(SHAPE, plan, 32, 4096, attention="fused")
    probs = SHAPE.layers * SHAPE.attention_bytes(1, 4096, 1, 2)
    assert full.activations - fused.activations == probs
    assert fused.params == full.params and fused.optim == full.optim
    # the same plan on 80 GiB: rejected with the probabilities, fits without them
    c = cluster(schedule=AMSP)
    assert evaluate(SHAPE, plan, c, 32, 4096).rejected.startswith("out of memory")
    fits = dataclasses.replace(c, attention="fused")
    assert evaluate(SHAPE, plan, fits, 32, 4096).rejected == ""
    # and a plan whose state alone exceeds the device: DDP's 16 bytes a parameter of 7B
    ddp = lay((1, 1, 1), 1)
    assert evaluate(SHAPE, ddp, fits, 32, 4096).rejected.startswith("out of memory")


def test_crossing_latency_charges_only_node_crossing_ring_steps():
    """NCCL's ring model: a psum over 32 ranks, 4 a node, takes 2 x 31 steps of which 2 x 7
    cross a node boundary; inside a node nothing changes."""
    flat, crossing = cluster(schedule=AMSP), cluster(schedule={**AMSP, "latency": "crossing"})
    plan = lay((1, 1, 4), 1, (4, 32))
    psum, bcast = collectives(SHAPE, plan, 32, 128, flat)
    n = psum.message * psum.itemsize
    wire = 2 * 31 / 32 * n / min(800e9 / 8, 4 * 80e9 / 8)
    assert psum.seconds(flat) == pytest.approx(2 * 31 * 10e-6 + wire)
    assert psum.seconds(crossing) == pytest.approx(2 * 7 * 10e-6 + 2 * 24 * 2e-6 + wire)
    assert bcast.seconds(crossing) == bcast.seconds(flat)  # inside the node


def test_plan_cli_takes_a_micro_batch(capsys, tmp_path):
    from pathlib import Path

    from jaxhc import cli

    path = Path(__file__).resolve().parent.parent / "configs" / "clusters" / "a100-1024-amsp.yaml"
    argv = ["plan", "--model", "llama-7b", "--cluster", str(path), "--batch", "4096"]
    argv += ["--seq", "4096", "--precision", "mixed", "--top", "1", "--rejected", "0"]
    assert cli.main([*argv, "--micro-batch", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "batch 4096 x 4096 tokens, micro-batch 1, mixed" in out[0]
    for extra, message in (
        (["--micro-batch", "0"], "--micro-batch 0 must be > 0"),
        (["--micro-batch", "1", "--mesh", "tensor=1,microbatches=2"], "not both"),
    ):
        assert cli.main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_gathers_of_many_micro_batches_still_hide():
    """With 2 m >= layers (16 micro-batches of a 32-layer model) the gathers are still the
    whole vector's, gathered layer by layer and prefetched: most of them hide."""
    c = cluster(schedule={**AMSP, "overlap": "amsp"}, compute={"tflop_s": 10, "memory_gb_s": 100})
    plan = lay((8, 8, 8), 16, (8, 32))
    comms = collectives(SHAPE, plan, 32 * 16, 128, c)
    assert comms[0].role == "gather" and comms[0].count == 2 * 16 >= SHAPE.layers
    work = compute(SHAPE, plan, 32 * 16, 128, c.compute)
    total, hidden = overlapped(comms, SHAPE, plan, c, work)
    assert hidden > 0.5 * comms[0].seconds(c)
