"""`jaxhc.plan.profile`'s per-op, per-group link figures and codec speeds: ring bytes, fits and
figures from hand-made times, against hand-computed values (the measuring itself runs in
tests/test_plan_cli.py; nothing here is timed)."""

from __future__ import annotations

import math

import pytest

from jaxhc.plan import cluster as clusters
from jaxhc.plan.comm import Comm
from jaxhc.plan.profile import (
    GROUP_OPS,
    codec_figures,
    fit_link,
    group_figures,
    op_seconds,
    ring_bytes,
    rounds,
)


def test_ring_bytes_are_the_cost_models():
    """What the fit divides by the bandwidth is what `Comm` charges for the same call."""
    values = 1 << 20
    assert ring_bytes("all_gather", 4, values) == (3, 3 / 4 * 4 * values)
    assert ring_bytes("psum_scatter", 8, values) == (7, 7 / 8 * 4 * values)
    assert ring_bytes("all_to_all", 2, values) == (1, 1 / 2 * 4 * values)
    assert ring_bytes("psum", 4, values) == (6, 2 * 3 / 4 * 4 * values)
    # an all-gather's values are its output: k x the message Comm counts (a step's Comm is never
    # an all-to-all: that moves a compressed reduce-scatter's payloads, `Comm.legs`)
    assert set(GROUP_OPS) == {"all_gather", "psum_scatter", "all_to_all", "psum"}
    for op in ("all_gather", "psum_scatter", "psum"):
        message = values // 4 if op == "all_gather" else values
        comm = Comm("data", "grad", op, 4, 4, message, 4, 1)
        assert ring_bytes(op, 4, values)[1] == comm.raw


def test_fit_recovers_latency_and_bandwidth():
    values = (2**16, 2**19, 2**21, 2**22)
    lat, bw = 30e-6, 2e9  # 16 Gbit/s
    secs = [steps * lat + wire / bw for steps, wire in (ring_bytes("psum", 4, v) for v in values)]
    fit = fit_link("psum", 4, values, secs)
    assert fit["latency_us"] == pytest.approx(30)
    assert fit["gbit_s"] == pytest.approx(16)
    # figures the cluster file takes back: the same time for the same call
    node = clusters.from_dict(
        {
            "nodes": 1,
            "devices_per_node": 4,
            "memory_gib": 1,
            "links": {"intra": {"gbit_s": 1, "latency_us": 1}, "collectives": {"psum": {4: fit}}},
        }
    )
    comm = Comm("data", "grad", "psum", 4, 4, 2**21, 4, 1)
    assert comm.seconds(node) == pytest.approx(secs[2])


def test_fit_drops_unmeasurable_sizes_and_clamps_latency():
    values = (2**16, 2**19, 2**21)
    wire = [ring_bytes("all_gather", 2, v)[1] for v in values]
    # a difference of two runs that came out 0 is left out; the rest fit exactly
    secs = [0.0, 10e-6 + wire[1] / 1e9, 10e-6 + wire[2] / 1e9]
    fit = fit_link("all_gather", 2, values, secs)
    assert (fit["latency_us"], fit["gbit_s"]) == pytest.approx((10, 8))
    # times below a line through 0 would give a negative latency: 0, bandwidth refitted
    secs = [w / 1e9 - 20e-6 for w in wire]  # the line's intercept: -20 us
    fit = fit_link("all_gather", 2, values, secs)
    assert fit["latency_us"] == 0
    through_zero = sum(w / t for w, t in zip(wire, secs, strict=True)) / sum(
        (w / t) ** 2 for w, t in zip(wire, secs, strict=True)
    )  # min sum (w b / t - 1)^2 over b = 1 / bandwidth
    assert fit["gbit_s"] == pytest.approx(8 / through_zero / 1e9)
    with pytest.raises(ValueError, match="all_gather over 2 ranks: fewer than 2 sizes") as e:
        fit_link("all_gather", 2, values, [0.0, 0.0, 1e-3])
    assert "\n" not in str(e.value)


def test_group_figures_take_each_op_less_its_launch():
    """From hand-made round times: each op's best less the best of its program without the op,
    then the fit; other programs timed in the same rounds are left alone."""
    lat, bw = 20e-6, 1e9
    values = (2**18, 2**19)
    times = {("plan", 0): [1.0, 0.5], ("zfp:8", "encode"): [0.1]}
    for k in (2, 4):
        for v in values:
            steps, wire = ring_bytes("psum_scatter", k, v)
            times[("psum_scatter", k, v)] = [1e-3 + steps * lat + wire / bw, 9.0]
            times[("launch", k, v)] = [2e-3, 1e-3]
    figures = group_figures(times)
    assert set(figures) == {"psum_scatter"} and set(figures["psum_scatter"]) == {2, 4}
    for k in (2, 4):
        fit = figures["psum_scatter"][k]
        assert (fit["latency_us"], fit["gbit_s"]) == pytest.approx((20, 8))
        steps, wire = ring_bytes("psum_scatter", k, 2**19)
        assert fit["seconds"][str(2**19)] == pytest.approx(steps * lat + wire / bw)
    # an all-gather's launch is its program's input size: values / k
    times = {("all_gather", 4, 2**20): [5e-3], ("launch", 4, 2**18): [1e-3]}
    assert op_seconds(times, "all_gather", 4, 2**20) == pytest.approx(4e-3)
    times[("launch", 4, 2**18)] = [6e-3]  # noise: the op's run came out faster than its launch
    assert op_seconds(times, "all_gather", 4, 2**20) == 0


def test_codec_figures_are_raw_bytes_per_second_of_the_best_run():
    facts = {"zfp:8": (2**20, 2**20, 8), "mpc": (2**20, 4 * 2**20, 8)}
    times = {("zfp:8", "encode"): [4e-3, 2e-3], ("zfp:8", "decode"): [8e-3], ("mpc", "encode"): [1]}
    out = codec_figures(times, facts)
    assert out["zfp:8"] == pytest.approx(
        {
            "encode_gb_s": 4 * 2**20 / 2e-3 / 1e9,
            "decode_gb_s": 4 * 2**20 / 8e-3 / 1e9,
            "ratio": 4.0,
            "devices": 8,
        }
    )
    assert math.isnan(out["mpc"]["decode_gb_s"]) and out["mpc"]["ratio"] == 1.0  # did not fit


def test_rounds_run_every_program_once_a_round():
    calls = []
    programs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = rounds(programs, 3)
    assert calls == ["a", "b", "c"] + ["a", "b", "c"] * 3  # a warm-up, then in turn
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
