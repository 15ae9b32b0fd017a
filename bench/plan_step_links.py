"""The planner's step time against training steps measured across shaped links.

    .venv/bin/python bench/plan_step_links.py --compute 2=PROFILE2.yaml,4=PROFILE4.yaml \
        [--out bench/results/plan_step_links.json]

Each jaxhc run of the committed training files (`RUNS`: `python -m bench.links train` of
configs/experiments/links.yaml, data parallel over P namespace hosts, one MPI rank each, policy
none or zhybrid, ``train.overlap`` on or off, links at 1 Gbit/s or unshaped) against the
planner's prediction of its step (`jaxhc.plan.steptime`: forward, backward and update at the
cluster's compute rates, plus the communication its overlap does not hide) on a cluster of P
nodes of one device, built from other committed measurements of the same rig, nothing fitted
to a training run:

- links: the latency of plan_links_p{P}.json (a 1-byte MPI ping-pong between two hosts); the
  bandwidth of links_mpi.json's plain psum_scatter and all_gather of 64 MiB a rank across the
  same P hosts at the same rate (the ring bytes of both over their best seconds: the two
  collectives the step runs);
- codecs: zfp:8's speeds measured on every rank at once (plan_links_p{P}.json);
- compute: ``compute`` of the cluster file `--compute` gives for P (``jaxhc profile --devices P``:
  P devices of this machine at once, as the P ranks share its cores).

Writes the predicted and measured seconds per run, the predicted and measured wire bytes per
step, and how many runs are within 25 %: of all, and of those started on a quiet machine (a
1-minute load average of at most `QUIET` at the start: the others ran beside other jobs on
the 2 cores, and their medians of one configuration differ by up to 1.8x between files).
Predictions, against measurements taken before.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import _common
import yaml

from jaxhc.model.config import GPTConfig
from jaxhc.plan import cluster as clusters
from jaxhc.plan.comm import comm_bytes
from jaxhc.plan.cost import codec_by_policy, collectives
from jaxhc.plan.layout import Layout
from jaxhc.plan.shapes import from_gpt
from jaxhc.plan.steptime import step_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
RUNS = (
    "train_links_overlap.json",
    "train_links_overlap_steps30.json",
    "train_links_overlap_none.json",
    "train_links_peer_p2.json",
    "train_links_peer_p4.json",
    "train_links_peer.json",
)
CONFIG = os.path.join(ROOT, "configs", "experiments", "links.yaml")
QUIET = 4.0  # 1-minute load average at the start: two runnable jobs per core


def _load(name: str) -> dict:
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def link(hosts: int, rate: str) -> dict:
    """The links' figures for P hosts at `rate` (see the module's docstring)."""
    rows = [
        r
        for r in _load("links_mpi.json")["results"]
        if r["parts"] == hosts and r["link_rate"] == rate and r["codec"] == "lax"
    ]
    ring = {"psum_scatter": (hosts - 1) / hosts, "all_gather": hosts - 1}  # x bytes a rank
    moved = sum(
        ring[r["collective"]] * r["bytes_per_rank"] for r in rows if r["collective"] in ring
    )
    seconds = sum(r["s"] for r in rows if r["collective"] in ring)
    latency = _load(f"plan_links_p{hosts}.json")["calibration"]["link"]["latency_us"]
    return {"gbit_s": moved * 8 / seconds / 1e9, "latency_us": latency}


def cluster(hosts: int, rate: str, profile: dict) -> clusters.Cluster:
    """`profile`: the cluster file given for P (its compute rates, and its codec speeds for
    the codecs the link calibration did not measure)."""
    speeds = _load(f"plan_links_p{hosts}.json")["calibration"]["zfp:8"]
    compute = profile["compute"]
    figures = link(hosts, rate)
    return clusters.from_dict(
        {
            "name": f"{hosts} namespace hosts, {rate}",
            "nodes": hosts,
            "devices_per_node": 1,
            "memory_gib": 1,
            "links": {"intra": figures, "inter": figures},
            "codecs": {**profile.get("codecs", {}), "zfp:8": speeds},
            "compute": compute,
        }
    )


def model() -> GPTConfig:
    with open(CONFIG) as f:
        return GPTConfig(**yaml.safe_load(f)["model"])


def predict(run: dict, overlap: bool, compute: dict) -> dict:
    cfg = model()
    hosts, batch, seq = run["hosts"], 8, cfg.block_size
    shape = from_gpt("links", cfg)
    where = cluster(hosts, run["rate"], compute)
    lay = Layout(hosts, 1, 1, 1, 1, hosts, hosts, (hosts,), transport="mpi", overlap=overlap)
    codec_of = codec_by_policy(run["policy"])
    comms = collectives(shape, lay, batch, seq, where, codec_of)
    step = step_time(shape, lay, batch, seq, where, comms)
    return {
        "compute_s": step.compute.total,
        "comm_s": step.comm,
        "hidden_s": step.hidden,
        "predicted_s": step.seconds,
        "predicted_wire_bytes": comm_bytes(comms),
        "link": where.to_dict()["links"]["inter"],
    }


def rows(compute: dict) -> list[dict]:
    out = []
    for name in RUNS:
        data = _load(name)
        load = data["machine"]["load_average_at_start"]
        for run in data["runs"]:
            if run["system"] != "jaxhc":
                continue
            overlap = run.get("overlap")
            overlap = True if overlap is None else overlap  # the config's: train.overlap
            row = predict(run, overlap, compute[run["hosts"]])
            measured = run["median_step_s"]
            ratio = row["predicted_s"] / measured
            out.append(
                {
                    "file": name,
                    "hosts": run["hosts"],
                    "rate": run["rate"],
                    "policy": run["policy"],
                    "overlap": overlap,
                    "steps": run["steps"],
                    "load_average_at_start": load,
                    **row,
                    "measured_s": measured,
                    "ratio": ratio,
                    "within_25pct": abs(ratio - 1) <= 0.25,
                    "wire_bytes_per_step": run["wire_bytes_per_step"]["data"],
                }
            )
    return out


def parse_compute(text: str) -> dict:
    """{P: the compute rates and codec speeds of the cluster file given for P, and its path}
    from "2=FILE,4=FILE"."""
    out = {}
    for item in text.split(","):
        hosts, _, path = item.partition("=")
        with open(path) as f:
            data = yaml.safe_load(f)
        if "compute" not in (data or {}):
            raise SystemExit(f"--compute: {path} has no compute key (`jaxhc profile` writes it)")
        out[int(hosts)] = {
            "compute": data["compute"],
            "codecs": data.get("codecs", {}),
            "file": path,
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--compute", required=True, help="P=cluster file with compute rates, for each P (2,4)"
    )
    ap.add_argument("--out", default=os.path.join(RESULTS, "plan_step_links.json"))
    args = ap.parse_args(argv)
    compute = parse_compute(args.compute)
    table = rows(compute)
    within = sum(r["within_25pct"] for r in table)
    quiet = [r for r in table if r["load_average_at_start"][0] <= QUIET]
    for r in table:
        print(
            f"{r['file']:36} P={r['hosts']} {r['rate']:8} {r['policy']:7} overlap "
            f"{'on ' if r['overlap'] else 'off'} predicted {r['predicted_s']:.3f} s "
            f"(compute {r['compute_s']:.3f}, comm {r['comm_s']:.3f}, hidden {r['hidden_s']:.3f})"
            f" measured {r['measured_s']:.3f} s: x{r['ratio']:.2f}"
        )
    print(f"{within}/{len(table)} runs within 25 %")
    calm = sum(r["within_25pct"] for r in quiet)
    print(f"{calm}/{len(quiet)} of those started at load <= {QUIET:g}")
    _common.write_json(
        args.out,
        {
            "compute": compute,
            "runs": table,
            "within_25pct": f"{within}/{len(table)}",
            "quiet_load": QUIET,
            "quiet_within_25pct": f"{calm}/{len(quiet)}",
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
