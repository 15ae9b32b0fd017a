"""Cluster files (jaxhc.plan.cluster: links, measured collectives per op and group size, codec
speeds, one-line errors) and the search over a cluster (jaxhc.plan.search: ranking, rejections,
the families' best plans, the run's transport). The cost model itself: tests/test_plan_cost.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_plan_cost import CLUSTER, SHAPE

import jaxhc
from jaxhc.plan import cluster as clusters
from jaxhc.plan.comm import Comm, comm_time
from jaxhc.plan.cost import collectives
from jaxhc.plan.search import best_of_families, search, table
from jaxhc.plan.shapes import LLAMA

A100 = Path(__file__).resolve().parent.parent / "configs" / "clusters" / "a100-1024.yaml"
INTRA = {"gbit_s": 1, "latency_us": 1}


def test_the_planner_ranks_for_the_runs_transport(capsys):
    """`jaxhc plan --transport mpi`: the same candidates; a compressed plan's time there is at
    most its XLA time (pipelined codec, fewer agreements), a raw plan's the same."""
    from jaxhc import cli
    from jaxhc.plan.planfile import plans

    rows = {
        t: plans(SHAPE, CLUSTER, 64, 16, codecs=("none", "zfp:8"), transport=t)
        for t in ("xla", "mpi")
    }
    xla = {dataclasses.replace(c.layout, transport="mpi"): c for c in rows["xla"]}
    assert {c.layout for c in rows["mpi"]} == set(xla)
    lossy = [c for c in rows["mpi"] if c.layout.codec != "none" and not c.rejected]
    assert lossy and all(c.comm_seconds < xla[c.layout].comm_seconds for c in lossy)
    raw = [c for c in rows["mpi"] if c.layout.codec == "none"]
    assert all(c.comm_seconds == xla[c.layout].comm_seconds for c in raw)
    argv = ["plan", "--model", "gpt2-small", "--cluster", str(A100)]
    assert cli.main([*argv, "--batch", "1024", "--transport", "mpi", "--top", "1"]) == 0
    assert "| 1 |" in capsys.readouterr().out


MEASURED = {  # links.collectives of a one-node cluster (gbit_s, latency_us), as YAML writes them
    "psum_scatter": {2: {"gbit_s": 8, "latency_us": 100}, 4: {"gbit_s": 16, "latency_us": 50}},
    "all_to_all": {4: {"gbit_s": 4, "latency_us": 20}},
    "psum": {4: {"gbit_s": 20, "latency_us": 30}},
}
NODE = clusters.from_dict(
    {
        "nodes": 1,
        "devices_per_node": 4,
        "memory_gib": 1,
        "links": {"intra": {"gbit_s": 800, "latency_us": 2}, "collectives": MEASURED},
        "codecs": {"zfp:8": {"encode_gb_s": 20, "decode_gb_s": 10}},
    }
)


def test_measured_collectives_time_their_op_and_group_size():
    n = 1 << 20  # float32 values in
    raw = Comm("data", "grad", "psum_scatter", 4, 4, n, 4, 1)
    assert raw.seconds(NODE) == pytest.approx(3 * 50e-6 + 3 / 4 * 4 * n / 2e9)
    pair = dataclasses.replace(raw, ranks=2, span=2)
    assert pair.seconds(NODE) == pytest.approx(1 * 100e-6 + 1 / 2 * 4 * n / 1e9)
    # no figures for all_gather: the intra link, as without the table
    gather = Comm("data", "grad", "all_gather", 4, 4, n // 4, 4, 1)
    assert gather.seconds(NODE) == pytest.approx(3 * 2e-6 + 3 * n / 100e9)
    # zfp:8: the payloads by the all-to-all, the flag's agreement by the psum, plus the codec
    z = dataclasses.replace(raw, codec=jaxhc.codecs.parse("zfp:8"))
    payload = 3 * jaxhc.codecs.parse("zfp:8").payload_bytes(n // 4, "float32")
    assert z.wire == payload + 4 * 3
    assert z.legs() == [("all_to_all", 3, payload), ("psum", 6, 12)]
    expected = 3 * 20e-6 + payload / 0.5e9 + 6 * 30e-6 + 12 / 2.5e9 + 4 * n / 20e9 + 4 * n / 10e9
    assert z.seconds(NODE) == pytest.approx(expected)
    # a compressed all-reduce moves half its payload by the all-to-all, half by the all-gather
    zsum = dataclasses.replace(z, op="psum")
    ops = [op for op, _, _ in zsum.legs()]
    assert ops == ["all_to_all", "all_gather", "psum"]
    assert sum(b for _, _, b in zsum.legs()[:2]) == zsum.wire - 12


@pytest.mark.parametrize("devices", [1, 2, 4, 8, 16])
def test_the_local_cluster_carries_this_machines_measured_groups_that_fit(devices):
    """`--plan auto`'s cluster: LOCAL_DEFAULTS (`jaxhc profile --links` here), a node of the run's
    devices with the measured (op, group) figures whose groups fit it."""
    local = clusters.local(devices)
    for op, groups in clusters.LOCAL_DEFAULTS["links"]["collectives"].items():
        for k, v in groups.items():
            got = local.collective_link(op, k, k)
            if k > devices:
                assert got is None
            else:
                assert got.bandwidth == pytest.approx(v["gbit_s"] * 1e9 / 8)


def test_measured_collectives_apply_inside_a_node_only():
    data = {**NODE.to_dict(), "nodes": 2, "devices_per_node": 4}
    data["links"] = {**data["links"], "inter": {"gbit_s": 8, "latency_us": 10}}
    wide = clusters.from_dict(data)
    inside = Comm("data", "grad", "psum_scatter", 4, 4, 1 << 20, 4, 1)
    across = dataclasses.replace(inside, span=8)
    link = wide.collective_link("psum_scatter", 4, 4)
    assert (link.bandwidth, link.latency) == pytest.approx((2e9, 50e-6))
    assert wide.collective_link("psum_scatter", 4, 8) is None
    assert across.seconds(wide) == pytest.approx(3 * 10e-6 + 3 / 4 * 4 * 2**20 / 1e9)
    assert inside.seconds(wide) == inside.seconds(NODE)


def test_measured_collectives_round_trip_yaml_and_json(tmp_path):
    path = tmp_path / "node.yaml"
    NODE.dump(str(path))
    back = clusters.load(str(path))
    assert back.collectives == NODE.collectives
    assert set(NODE.collectives) == {
        ("psum_scatter", 2),
        ("psum_scatter", 4),
        ("all_to_all", 4),
        ("psum", 4),
    }
    as_json = json.loads(json.dumps(NODE.to_dict()))  # group sizes become strings
    assert clusters.from_dict(as_json).collectives == NODE.collectives


def test_search_ranks_rejects_and_marks():
    rows = search(SHAPE, CLUSTER, 64, 16, codecs=("none", "zfp:8"), model_parallel="all")
    fits = [r for r in rows if not r.rejected]
    times = [r.comm_seconds for r in fits]
    assert fits and all(a <= b * 1.01 for a, b in zip(times, times[1:], strict=False))
    assert {r.layout.tensor * r.layout.pipe for r in fits} == {1, 2, 4, 8, 16}
    smallest = search(SHAPE, CLUSTER, 64, 16)  # model_parallel="min": tensor = pipe = 1 fits
    assert {(r.layout.tensor, r.layout.pipe) for r in smallest} == {(1, 1)}
    odd = search(SHAPE, CLUSTER, 24, 16, model_parallel="all")  # 24 sequences over 16 ranks
    invalid = {r.rejected for r in odd if r.rejected.startswith("invalid")}
    assert "invalid: batch 24 is not divisible by data 16 x microbatches 1" in invalid
    lay = odd[0].layout
    assert not odd[0].rejected and 24 % (lay.data * lay.microbatches) == 0
    fams = best_of_families(rows)
    assert {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "MiCS", "AMSP"} <= set(fams)
    assert fams["ZeRO-3"].trainable == "yes"
    # the best plan's time is what its collectives add up to
    best = fits[0]
    assert best.comm_seconds == pytest.approx(
        comm_time(collectives(SHAPE, best.layout, 64, 16, CLUSTER), CLUSTER)
    )
    # a limit between the DDP and ZeRO-3 memory rejects DDP as out of memory, one line each
    rows = search(SHAPE, CLUSTER, 64, 16, tensors=[1], pipes=[1])
    least = {f: min(r.memory.total for r in rows if r.family == f) for f in ("DDP", "ZeRO-3")}
    ddp, z3 = least["DDP"], least["ZeRO-3"]  # recomputation included
    assert z3 < ddp
    tight = dataclasses.replace(CLUSTER, memory=(ddp + z3) / 2)
    rows = search(SHAPE, tight, 64, 16, tensors=[1], pipes=[1])
    fams = best_of_families(rows)
    assert "DDP" not in fams and "ZeRO-3" in fams
    text = table(rows, top=3, rejected=1000)
    oom = [x for x in text.splitlines() if "out of memory" in x]
    assert oom and all(x.startswith("rejected: ") and x.count("GiB >") == 1 for x in oom)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"nodes": 0}, "nodes=0 must be a positive integer"),
        ({"memory_gib": "lots"}, "memory_gib='lots' must be a number"),
        (
            {"links": {"intra": {"gbit_s": 1, "latency_us": 1}}},
            "cluster key 'links.inter' is missing",
        ),
        (
            {"links": {"intra": {"gbit_s": 1}, "inter": {"gbit_s": 1, "latency_us": 1}}},
            "'links.intra.latency_us' is missing",
        ),
        ({"codecs": {"zfp:1": {"encode_gb_s": 1, "decode_gb_s": 1}}}, "codecs.zfp:1"),
        ({"codecs": {"q8": {"encode_gb_s": 1}}}, "'codecs.q8.decode_gb_s' is missing"),
        ({"color": "blue"}, "unknown cluster key 'color'"),
        (
            {"nodes": 1, "links": {"intra": INTRA, "collectives": {"reduce": {}}}},
            "unknown cluster key 'links.collectives.reduce'",
        ),
        (
            {"nodes": 1, "links": {"intra": INTRA, "collectives": {"psum": []}}},
            "'links.collectives.psum' must be a mapping",
        ),
        (
            {"nodes": 1, "links": {"intra": INTRA, "collectives": {"psum": 5}}},
            "'links.collectives.psum' must be a mapping",
        ),
        (
            {
                "nodes": 1,
                "links": {
                    "intra": INTRA,
                    "collectives": {"psum": {1: {"gbit_s": 1, "latency_us": 1}}},
                },
            },
            "links.collectives.psum.1: a group size must be an integer >= 2",
        ),
        (
            {
                "nodes": 1,
                "links": {
                    "intra": INTRA,
                    "collectives": {"all_gather": {8: {"gbit_s": 1, "latency_us": 1}}},
                },
            },
            "links.collectives.all_gather.8: a group of 8 ranks does not fit a node of 4",
        ),
        (
            {
                "nodes": 1,
                "links": {
                    "intra": INTRA,
                    "collectives": {"all_to_all": {"4": {"gbit_s": 1}}},
                },
            },
            "'links.collectives.all_to_all.4.latency_us' is missing",
        ),
        (
            {
                "nodes": 1,
                "links": {
                    "intra": INTRA,
                    "collectives": {"psum": {4: {"gbit_s": 0, "latency_us": 1}}},
                },
            },
            "links.collectives.psum.4.gbit_s=0.0 must be > 0",
        ),
    ],
)
def test_cluster_file_errors_name_the_key(change, message):
    data = {**CLUSTER.to_dict(), **change}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as e:
        clusters.from_dict(data)
    assert "\n" not in str(e.value)


def test_cluster_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    CLUSTER.dump(str(path))
    back = clusters.load(str(path))
    assert back.to_dict() == CLUSTER.to_dict()
    assert back.intra.bandwidth == pytest.approx(CLUSTER.intra.bandwidth)
    with pytest.raises(ValueError, match="no speed for codec 'q8'"):
        back.speed("q8")
    assert back.speed("zfp:8") == CLUSTER.codecs["zfp:8"]


def test_example_cluster_and_llama_presets():
    a100 = clusters.load("configs/clusters/a100-1024.yaml")
    assert a100.devices == 1024 and a100.memory == 80 * 2**30
    rows = search(LLAMA["llama-7b"], a100, 1024, 2048, precision="mixed", tensors=[1], pipes=[1])
    fits = [r for r in rows if not r.rejected]
    assert fits and all(r.memory.total <= a100.memory for r in fits)
    assert any(r.rejected.startswith("out of memory") for r in rows)  # DDP: 16 psi > 80 GB
