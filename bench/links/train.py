"""Training across shaped links: `jaxhc train` per policy, one rank per host: under mpirun
(`--transport mpi`) or as one process per host of a jax.distributed job (`--transport xla`).

For each P (hosts) one cluster at one link rate; for each policy the same experiment (seed, data,
steps) trains with data = P, and its metrics.jsonl gives the step times (the median after the
first steps, which compile), tokens/s, the validation loss and the bytes per step on the wire.
The runs are merged into one JSON (rewritten after every run), a markdown table and a PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from .cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
POLICIES = "none,zfp8,zfp16,mpc,mzhybrid,zhybrid"
SKIP_STEPS = 3  # the first steps compile (and warm the caches): left out of the timing


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", default="configs/experiments/links.yaml")
    ap.add_argument("--hosts", default="2,4", help="P values (data = P, one rank per host)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--steps", type=int, help="override train.steps")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_argument(
        "--transport", choices=("mpi", "xla"), default="mpi",
        help="mpi: mpirun across the hosts; xla: one process per host under jax.distributed",
    )  # fmt: skip
    ap.add_argument(
        "--out", help="default bench/results/train_links.json (train_links_xla.json for xla)"
    )
    ap.add_argument("overrides", nargs="*", help="dotted config overrides (model.n_layer=2 ...)")


def summarize(records: list[dict]) -> dict:
    """Step timing, tokens/s, losses and per-step wire bytes from one run's metrics.jsonl."""
    timed = records[SKIP_STEPS:] or records
    seconds = statistics.median(r["seconds"] for r in timed)
    tokens = statistics.median(r["tokens_per_s"] * r["seconds"] for r in timed)
    val = [r["val_loss"] for r in records if "val_loss" in r]
    return {
        "steps": len(records),
        "median_step_s": seconds,
        "tokens_per_s": tokens / seconds,
        "final_loss": records[-1]["loss"],
        "val_loss": val[-1] if val else None,
        "wire_bytes_per_step": records[-1]["wire_bytes"],
        "raw_bytes_per_step": records[-1]["raw_bytes"],
        "fallbacks_last_step": records[-1]["fallbacks"],
    }


def run(args) -> dict:
    xla = args.transport == "xla"
    out = Path(args.out or f"bench/results/train_links{'_xla' if xla else ''}.json")
    result = {"command": " ".join([sys.executable, "-m", "bench.links", "train", *sys.argv[2:]])}
    result.update(
        config=args.config, rate=args.rate, transport=args.transport, overrides=args.overrides,
        skip_steps=SKIP_STEPS, runs=[],
    )  # fmt: skip
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1"}
    jaxhc = str(Path(sys.executable).parent / "jaxhc")
    with tempfile.TemporaryDirectory(prefix="jaxhc-train-links-") as tmp:
        for hosts in (int(h) for h in args.hosts.split(",")):
            with Cluster(hosts, args.rate) as cluster:
                for policy in args.policies.split(","):
                    run_dir = os.path.join(tmp, f"p{hosts}-{policy}")
                    cmd = [jaxhc, "train", "--transport", args.transport, "--config", args.config]
                    cmd += ["--compression", policy, "--mesh", f"data={hosts},tensor=1,pipe=1"]
                    cmd += ["--out", run_dir, "--no-progress"]
                    if args.steps:
                        cmd += ["--steps", str(args.steps)]
                    print(f"P={hosts} {args.rate} {policy}: training ...", flush=True)
                    load_at_start = os.getloadavg()  # this machine is shared: say how busy
                    if xla:  # one process per host, one device each, jax.distributed
                        cluster.run_distributed(
                            cmd + list(args.overrides), timeout=args.timeout, env=env
                        )
                    else:
                        cluster.run(cmd + list(args.overrides), timeout=args.timeout, env=env)
                    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                        records = [json.loads(line) for line in f]
                    summary = {"hosts": hosts, "policy": policy, **summarize(records)}
                    summary["load_average_at_start"] = load_at_start
                    summary["load_average_at_end"] = os.getloadavg()
                    result["runs"].append(summary)
                    print(_line(summary), flush=True)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(result, indent=1) + "\n")
    result["markdown"] = markdown(result)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(result["markdown"])
    plot(result, out.with_suffix(".png"))
    return result


def _line(s: dict) -> str:
    wire = sum(s["wire_bytes_per_step"].values()) / 1e6
    return (
        f"  P={s['hosts']} {s['policy']:9s} {s['median_step_s']:.3f} s/step "
        f"{s['tokens_per_s']:.0f} tok/s val {s['val_loss']} wire {wire:.1f} MB/step"
    )


def markdown(result: dict) -> str:
    lines = [
        "| P | policy | s/step (median) | tokens/s | vs none | val loss | vs none | wire MB/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        base = next(
            (b for b in result["runs"] if b["hosts"] == r["hosts"] and b["policy"] == "none"), None
        )
        speed = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "n/a"
        gap = "n/a"
        if base and base["val_loss"] and r["val_loss"]:
            gap = f"{100 * (r['val_loss'] / base['val_loss'] - 1):+.2f} %"
        wire = sum(r["wire_bytes_per_step"].values()) / 1e6
        lines.append(
            f"| {r['hosts']} | {r['policy']} | {r['median_step_s']:.3f} | "
            f"{r['tokens_per_s']:.0f} | {speed} | {r['val_loss']:.4f} | {gap} | {wire:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hosts = sorted({r["hosts"] for r in result["runs"]})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(hosts))
    for i, h in enumerate(hosts):
        runs = [r for r in result["runs"] if r["hosts"] == h]
        xs = [j + i * width for j in range(len(runs))]
        axes[0].bar(xs, [r["tokens_per_s"] for r in runs], width, label=f"P = {h}")
        axes[1].bar(xs, [r["val_loss"] for r in runs], width, label=f"P = {h}")
        labels = [r["policy"] for r in runs]
    for ax, title in zip(axes, ("tokens/s", "validation loss"), strict=True):
        ax.set_xticks([j + width * (len(hosts) - 1) / 2 for j in range(len(labels))], labels)
        ax.set_title(f"{title} ({result['rate']} links)")
        ax.legend()
    lo = min(r["val_loss"] for r in result["runs"])
    axes[1].set_ylim(lo * 0.95, None)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
