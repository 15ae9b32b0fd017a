"""The planner's collective time against a measurement on this machine's 8 CPU devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        .venv/bin/python bench/plan_check.py [--repeats 15] [--out bench/results/plan_check.json]

1. Calibrate (a machine profile, the programs of `jaxhc profile --links`, not the checked ones):
   - zfp:8's encode and decode speed: 4 MiB of float32 on each of the 8 devices at once (they
     share the cores, as a collective's codecs do), `jaxhc.plan.profile.codec_programs`;
   - per collective op (all-gather, reduce-scatter, all-to-all, all-reduce; plain lax
     collectives, float32) and group size k = 2, 4, 8 (8 / k groups of consecutive devices at
     once): one op in a jitted program less the same program without it, at 1, 2, 4 and 8 MiB
     per device (`GROUP_VALUES`; the plans' messages are 1.6 to 13 MB, none of these sizes), and
     a latency + bandwidth fitted through the four (`fit_link`, least squares in relative
     error) into the cluster's ``links.collectives``; ``links.intra`` = the all-gather's k = 8.
   Nothing is fitted to a plan: every figure comes from the programs above.
2. For each plan (data = 8, and data 4 x tensor 2), the data-axis collectives of one train step of
   a GPT of ~3.24 M parameters (`jaxhc.plan.cost.collectives`, the step's order: gradient
   reduce-scatters, all-gathers back, parameter all-gathers; equal to the ledger's bytes), run alone
   through jaxhc's collectives in one jitted shard_map over the nested data sub-axes, raw and under
   zfp:8 on every data level; the update's parameter all-gather gathers a chunk given as an input
   (as the step gathers its optimizer's chunk), not a cut of the gathered gradient (a copy).
3. Every program of 1 and 2 is compiled and run once, then timed in --repeats rounds, each running
   every program once in turn (`jaxhc.plan.profile.rounds`): the machine's other jobs come and go,
   and this way calibration and plans see the same spells of load. A plan's measured time is
   its program's best (or median) run less the best run of the same program without the
   collectives (its launch, ~0.2-0.4 ms, as the profile's op times are taken); the JSON keeps
   both. Plans of one data x tensor shape share one input: the process's footprint slows the
   collectives here (2 GB more made a chain 1.2-1.4x slower).
4. Predicted (the cost model on the calibrated cluster: per op and group size its measured
   figures, a compressed reduce-scatter's payloads at the all-to-all's, the fallback flag's
   agreement at the all-reduce's latency, codec time at the measured speeds) against measured;
   the ledger's wire bytes against the predicted bytes. "within_25pct" compares the best run.

The JSON records the calibration (every op's times and fit), the load average before and after
(this run's own 8 device threads add to the "after").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import write_json  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxhc  # noqa: E402
from jaxhc.host_memory import reuse_freed_memory  # noqa: E402
from jaxhc.model.config import GPTConfig  # noqa: E402
from jaxhc.plan import cluster as clusters  # noqa: E402
from jaxhc.plan import profile  # noqa: E402
from jaxhc.plan.comm import comm_bytes  # noqa: E402
from jaxhc.plan.cost import codec_by_policy, collectives  # noqa: E402
from jaxhc.plan.layout import Layout, device_params  # noqa: E402
from jaxhc.plan.shapes import from_gpt  # noqa: E402

MODEL = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=256)
PLANS = [  # (data, tensor, (s_p, s_g, s_os), levels)
    (8, 1, (1, 8, 8), (8,)),  # jaxhc's ZeRO (AMSP's ZeRO-2), flat
    (8, 1, (1, 1, 1), (8,)),  # DDP
    (8, 1, (1, 1, 8), (8,)),  # ZeRO-1
    (8, 1, (1, 4, 4), (4, 8)),  # MiCS-like: a group of 4
    (8, 1, (1, 1, 4), (4, 8)),
    (8, 1, (1, 2, 2), (2, 4, 8)),
    (8, 1, (1, 8, 8), (2, 4, 8)),
    (4, 2, (1, 4, 4), (4,)),
]
ZDATA = {"name": "zdata", "min_bytes": 0, "axes": {"data": "zfp:8"}}
METHOD = (
    "A machine profile, measured in the same process and rounds as the plans but from other "
    "programs and sizes, nothing fitted to a plan: zfp:8 encode/decode speed = 4 MiB float32 on "
    "each of the 8 devices at once (profile.codec_programs); links.collectives = for each of "
    "all_gather, psum_scatter, all_to_all, psum (plain lax, float32) and group size k = 2, 4, 8 "
    "(8/k groups of consecutive devices at once), one op in a jitted program less the same "
    "program without it at 2**18, 2**19, 2**20, 2**21 float32 per device (the op's larger "
    "buffer), and t = steps x latency + ring bytes / bandwidth fitted through the four (least "
    "squares in relative error; profile.group_programs, fit_link); links.intra = all_gather k=8. "
    "Every program (calibration and plans) timed in --repeats rounds, each running every program "
    "once (profile.rounds); a plan's time = its program's run less the best run of the same "
    "program without the collectives (its launch); best and median."
)


def data_comms(shape, lay: Layout, cluster, policy):
    """The data-axis collectives of one train step (`jaxhc.plan.cost.collectives`) and their
    predicted seconds on `cluster`."""
    codec_of = codec_by_policy(jaxhc.Policy.from_dict(policy) if policy else "none")
    comms = [
        c
        for c in collectives(shape, lay, 8 * lay.data, 64, cluster, codec_of)
        if c.axis.startswith("data")
    ]
    return comms, sum(c.seconds(cluster) for c in comms)


def update_gather(comms) -> int | None:
    """The index of the update's first parameter all-gather (the first "param" collective after
    a gradient one), or None."""
    after = [
        i for i, c in enumerate(comms) if c.kind == "param" and i and comms[i - 1].kind == "grad"
    ]
    return after[0] if after else None


def chain(comms, policy, chunk: bool = False):
    """A per-shard function running `comms` in order through jaxhc's collectives, each as many
    times as the step calls it (`Comm.count`). Each takes the previous one's result, cut to its
    message (the gradient's all-gather back, then the update's
    chunk). With `chunk`, the function takes a second input, the device's updated chunk, which
    the update's first parameter all-gather gathers (`update_gather`), as the train step gathers
    its optimizer's chunk: a cut of the gathered gradient would add a copy the step does not make;
    it returns (the result, a value of the gradients' result).
    """
    pol = jaxhc.Policy.from_dict(policy) if policy else None
    own = update_gather(comms) if chunk else None

    def body(x, *update):
        v, grads = x.reshape(-1), None
        for i, c in enumerate(comms):
            if i == own:
                grads, v = v, update[0].reshape(-1)
            for _ in range(c.count):  # its calls per step (a layer's gathers: 2 x micro-batches)
                if v.shape[0] < c.message:  # after a layer's gather, the gradients' scatter: the
                    v = x.reshape(-1) + 0 * v[0]  # input again, after the previous op
                v = v[: c.message]
                if c.op == "psum_scatter":
                    v = jaxhc.psum_scatter(v, c.axis, tiled=True, policy=pol, kind=c.kind)
                else:
                    v = jaxhc.all_gather(v, c.axis, tiled=True, policy=pol, kind=c.kind)
        if not chunk:
            return v[None]
        # a value of the gradients' result too, or XLA drops their collectives as unused
        return v[None], (v if grads is None else grads)[:1][None]

    return body


def mesh_axes(lay: Layout) -> tuple[str, ...]:
    """The nested data sub-axes, outermost first."""
    return tuple(lay.axis(i) for i in reversed(range(len(lay.levels))))


def program(comms, lay: Layout, policy, inputs: dict):
    """A call running the data collectives `comms` (one jitted program), a call of the same
    program without them (its launch: the first value back) and the ledger's wire bytes of one
    run. Plans of one data x tensor shape share their input (`inputs`): the
    process's footprint slows its collectives (2 GB more made chains 1.2-1.4x slower here)."""
    factors = lay.factors[::-1]  # outermost first
    names = mesh_axes(lay)
    devs = np.asarray(jax.devices()[: lay.data * lay.tensor]).reshape(*factors, lay.tensor)
    mesh = Mesh(devs, (*names, "tensor"))
    _, padded = device_params(from_gpt("m", MODEL), lay)
    spec = P((*names, "tensor"))
    own = update_gather(comms)
    args = []
    for values in (padded, *([] if own is None else [comms[own].message])):
        key = (lay.data, lay.tensor, values)
        if key not in inputs:  # the same devices in the same order for every plan of this shape
            walk = profile.walk(values * lay.data * lay.tensor, seed=len(inputs) + 1)
            inputs[key] = jax.device_put(jnp.asarray(walk), NamedSharding(mesh, spec))
        args.append(inputs[key])
    f = jax.jit(
        jax.shard_map(
            chain(comms, policy, chunk=True),
            mesh=mesh,
            in_specs=(spec,) * len(args),
            out_specs=(spec, spec),
            check_vma=False,
        )
    )
    x = args[0]
    ledger = jaxhc.accounting.Ledger()
    with ledger:
        jax.block_until_ready(f(*args))
    wire = sum(v["wire_bytes"] for v in ledger.per_axis(devices=lay.data * lay.tensor).values())
    launch = jax.jit(
        jax.shard_map(lambda v: v[:1], mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    )
    return (lambda: f(*args)), (lambda: launch(x)), wire


def plan_row(lay: Layout, policy, comms, predicted, best, median, wire, by: str) -> dict:
    """One plan's prediction against its measurement; `by` ("best" or "median") decides
    "within_25pct". Printed as a line too."""
    measured = best if by == "best" else median
    row = {
        "data": lay.data,
        "tensor": lay.tensor,
        "sizes": list(lay.sizes),
        "levels": list(lay.levels),
        "policy": "zfp:8 on data" if policy else "none",
        "predicted_s": predicted,
        "measured_best_s": best,
        "measured_median_s": median,
        "ratio_best": best / predicted,
        "ratio_median": median / predicted,
        "within_25pct": abs(measured / predicted - 1) <= 0.25,
        "predicted_wire_bytes": comm_bytes(comms),
        "ledger_wire_bytes": wire,
    }
    print(
        f"{lay.data}x{lay.tensor} {lay.sizes} {list(lay.levels)} {row['policy']:>14}: predicted "
        f"{predicted * 1e3:8.2f} ms, measured best {best * 1e3:8.2f} median "
        f"{median * 1e3:8.2f} ms (x{measured / predicted:.2f} {by}), wire bytes "
        f"x{wire / comm_bytes(comms):.5f} the predicted",
        flush=True,
    )
    return row


def write_report(out: str, shape, calibration: dict, cluster, rows: list, by: str) -> None:
    within = sum(r["within_25pct"] for r in rows)
    print(f"{within}/{len(rows)} plans within 25 % ({by})")
    write_json(
        out,
        {
            "model": {"parameters": shape.params(), **MODEL.__dict__},
            "calibration": calibration,
            "cluster": cluster.to_dict(),
            "plans": rows,
            "within_25pct": f"{within}/{len(rows)}",
        },
    )


def calibrated(times: dict, facts: dict) -> tuple[dict, object]:
    """The calibration (codec speeds, per-op group figures) from the rounds' times, and the
    one-node cluster it makes."""
    speeds = profile.codec_figures(times, facts)["zfp:8"]
    groups = profile.group_figures(times)
    table = {
        op: {k: {x: f[x] for x in ("gbit_s", "latency_us")} for k, f in by_k.items()}
        for op, by_k in groups.items()
    }
    cluster = clusters.from_dict(
        {
            "name": "this machine (8 host devices, in-process collectives)",
            "nodes": 1,
            "devices_per_node": 8,
            "memory_gib": 1,
            # the flat level figures: all-gathers over the 8 devices (`jaxhc profile --links`)
            "links": {"intra": table["all_gather"][8], "collectives": table},
            "codecs": {"zfp:8": {k: speeds[k] for k in ("encode_gb_s", "decode_gb_s")}},
        }
    )
    return {"collectives": groups, "zfp:8": speeds}, cluster


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="bench/results/plan_check.json")
    args = ap.parse_args(argv)
    reuse_freed_memory()  # as `jaxhc train` and `jaxhc profile` run, before anything is timed
    load_before = os.getloadavg()
    programs, facts = profile.codec_programs(["zfp:8"], mib=4)
    programs.update(profile.group_programs())
    shape = from_gpt("gpt-3m", MODEL)
    node = clusters.local(8)  # the comms depend on the node's shape only, not on its speeds
    cases, inputs = [], {}
    for data, tensor, sizes, levels in PLANS:
        for policy in (None, ZDATA):
            lay = Layout(data, tensor, 1, 1, *sizes, levels)
            comms, _ = data_comms(shape, lay, node, policy)
            call, launch, wire = program(comms, lay, policy, inputs)
            programs[("plan", len(cases))] = call
            programs[("plan launch", len(cases))] = launch
            cases.append((lay, policy, comms, wire))
    times = profile.rounds(programs, args.repeats)
    calibration, cluster = calibrated(times, facts)
    rows = []
    for i, (lay, policy, comms, wire) in enumerate(cases):
        predicted = sum(c.seconds(cluster) for c in comms)
        t, launch = times[("plan", i)], min(times[("plan launch", i)])
        best, median = min(t) - launch, statistics.median(t) - launch
        row = plan_row(lay, policy, comms, predicted, best, median, wire, "best")
        row.update(program_best_s=min(t), program_median_s=statistics.median(t), launch_s=launch)
        rows.append(row)
    calibration["method"] = METHOD
    calibration["load_average"] = {"before": load_before, "after": os.getloadavg()}
    calibration["repeats"] = args.repeats
    write_report(args.out, shape, calibration, cluster, rows, "best")
    return 0


if __name__ == "__main__":
    sys.exit(main())
