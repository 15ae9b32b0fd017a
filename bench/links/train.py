"""Training across shaped links: `jaxhc train` per policy, and PyTorch DDP per hook beside it,
one rank per host: jaxhc under mpirun (`--transport mpi`) or as one process per host of a
jax.distributed job (`--transport xla`); DDP over gloo as one process per host
(bench/links/peer.py).

For each P (hosts) one cluster; for each link rate (the live cluster reshaped) each policy and then
each peer hook trains the same experiment (seed, data, steps, optimizer) with data = P, back to
back; its metrics.jsonl gives the step times (the median after the first steps, which compile),
tokens/s, the validation loss and the bytes per step on the wire. The runs are merged into one JSON
(rewritten after every run), a markdown table and a PNG (bench/links/train_report.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from . import peer
from .cluster import PREFIX, Cluster
from .rates import rate_label

ROOT = Path(__file__).resolve().parents[2]
POLICIES = "none,zfp8,zfp16,mpc,mzhybrid,zhybrid"
SKIP_STEPS = 3  # the first steps compile (and warm the caches): left out of the timing


def add_arguments(ap: argparse.ArgumentParser, *, peer_only: bool = False) -> None:
    """The options of `train` (jaxhc's policies, `--peer` adds DDP hooks) and of `peer` (DDP's
    hooks alone unless `--policies` adds jaxhc's)."""
    ap.add_argument("--config", default="configs/experiments/links.yaml")
    ap.add_argument("--hosts", default="2,4", help="P values (data = P, one rank per host)")
    ap.add_argument(
        "--rate", "--rates", dest="rate", default="1gbit",
        help="link rates, back to back on each cluster: 100mbit, 1gbit, ... or unshaped",
    )  # fmt: skip
    ap.add_argument(
        "--policies", default="" if peer_only else POLICIES,
        help="jaxhc compression policies" + ("" if peer_only else f" (default {POLICIES})"),
    )  # fmt: skip
    hooks = ",".join(peer.HOOKS)
    ap.add_argument(
        "--peer", "--hooks", dest="peer", metavar="HOOKS", default=hooks if peer_only else "",
        help=f"PyTorch DDP hooks to train after the policies ({hooks}; "
        + (f"default {hooks})" if peer_only else "default: no peer)"),
    )  # fmt: skip
    ap.add_argument(
        "--peer-threads", type=int,
        help="torch threads per DDP rank (default: the cores a rank may run on, as jaxhc's)",
    )  # fmt: skip
    ap.add_argument(
        "--overlap", default="",
        help="train.overlap per jaxhc run, back to back: on, off or on,off (default: the "
        "config's; each layer's gradients reduced in the backward, which on the MPI transport "
        "moves their bytes while the earlier layers' backward runs)",
    )  # fmt: skip
    ap.add_argument("--steps", type=int, help="override train.steps")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_argument(
        "--transport", choices=("mpi", "xla"), default="mpi",
        help="jaxhc's: mpirun across the hosts, or one process per host under jax.distributed",
    )  # fmt: skip
    default = "train_links_peer.json" if peer_only else "train_links.json (_xla.json for xla)"
    ap.add_argument("--out", help=f"JSON (.md, .png beside); default bench/results/{default}")
    ap.set_defaults(peer_only=peer_only)
    ap.add_argument("overrides", nargs="*", help="dotted config overrides (model.n_layer=2 ...)")


def resolve(args: argparse.Namespace) -> dict:
    """The run's hosts, rates, policies and hooks; a bad value is a ValueError (one line)."""
    hosts = []
    for h in str(args.hosts).split(","):
        if not h.strip().isdigit() or int(h) < 2:
            raise ValueError(f"--hosts {args.hosts!r}: expected whole numbers >= 2")
        hosts.append(int(h))
    rates = [rate_label(r) for r in str(args.rate).split(",")]
    policies = [p.strip() for p in str(args.policies).split(",") if p.strip()]
    hooks = peer.parse_hooks(args.peer)
    overlap = [o.strip() for o in str(args.overlap).split(",") if o.strip()] or [None]
    if any(o not in ("on", "off", None) for o in overlap) or len(set(overlap)) < len(overlap):
        raise ValueError(f"--overlap {args.overlap!r}: expected on, off or on,off")
    if not policies and not hooks:
        raise ValueError("nothing to train: give --policies and/or --peer")
    if args.steps is not None and args.steps <= SKIP_STEPS:
        raise ValueError(f"--steps {args.steps}: expected more than the {SKIP_STEPS} untimed ones")
    if args.peer_threads is not None and args.peer_threads < 1:
        raise ValueError(f"--peer-threads {args.peer_threads}: expected a whole number >= 1")
    if hooks and importlib.util.find_spec("torch") is None:
        raise ValueError("--peer needs PyTorch: make setup-peer (pip install -e '.[peer]')")
    return {
        "hosts": hosts, "rates": rates, "policies": policies, "hooks": hooks, "overlap": overlap,
    }  # fmt: skip


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
    from .. import _common  # jax: the machine's facts
    from . import train_report  # matplotlib

    plan = resolve(args)
    xla = args.transport == "xla"
    default = "train_links_peer" if args.peer_only else f"train_links{'_xla' if xla else ''}"
    out = Path(args.out or f"bench/results/{default}.json")
    sub = "peer" if args.peer_only else "train"
    python = os.path.relpath(sys.executable)  # .venv/bin/python from the repository
    result = {"command": " ".join([python, "-m", "bench.links", sub, *sys.argv[2:]])}
    result.update(
        config=args.config, rate=",".join(plan["rates"]), rates=plan["rates"],
        transport=args.transport, overrides=args.overrides, skip_steps=SKIP_STEPS,
        policies=plan["policies"], peer_hooks=plan["hooks"], runs=[],
        overlap=[o for o in plan["overlap"] if o],
    )  # fmt: skip
    if plan["hooks"]:
        result["peer"] = {
            "system": "PyTorch DistributedDataParallel over gloo, transformers GPT2LMHeadModel",
            "threads": args.peer_threads or peer.threads(),
            "threads_note": "set by --peer-threads" if args.peer_threads else peer.THREADS_NOTE,
            "wire_bytes": peer.WIRE_NOTE,
            "powersgd": peer.POWERSGD,
        }
    # Named as the cluster's files are, so that remove_leftovers() keeps it while this run lives.
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-train-") as tmp:
        for hosts in plan["hosts"]:
            with Cluster(hosts, plan["rates"][0]) as cluster:
                for rate in plan["rates"]:
                    cluster.set_rate(rate)
                    for policy in plan["policies"]:
                        for overlap in plan["overlap"]:
                            prefix = os.path.join(tmp, f"p{hosts}-{rate}-{overlap or 'default'}")
                            _add(result, _jaxhc(cluster, policy, args, prefix, overlap), out)
                    for hook in plan["hooks"]:
                        run_dir = os.path.join(tmp, f"p{hosts}-{rate}-ddp-{hook}")
                        row = _peer(cluster, hook, args, run_dir)
                        _add(result, row, out)
    result["machine"] = _common.machine()
    train_report.write(str(out), result)
    return result


def _jaxhc(cluster: Cluster, policy: str, args, prefix: str, overlap: str | None) -> dict:
    run_dir = f"{prefix}-{policy}"
    cmd = [str(Path(sys.executable).parent / "jaxhc"), "train", "--transport", args.transport]
    cmd += ["--config", args.config, "--compression", policy]
    cmd += ["--mesh", f"data={cluster.hosts},tensor=1,pipe=1", "--out", run_dir, "--no-progress"]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    cmd += list(args.overrides)
    if overlap is not None:
        cmd += [f"train.overlap={'true' if overlap == 'on' else 'false'}"]
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1"}
    label = f"jaxhc {policy}" + (f" overlap {overlap}" if overlap else "")
    print(f"P={cluster.hosts} {cluster.rate} {label}: training ...", flush=True)
    load_at_start = os.getloadavg()  # this machine is shared: say how busy
    if args.transport == "xla":  # one process per host, one device each, jax.distributed
        cluster.run_distributed(cmd, timeout=args.timeout, env=env)
    else:
        cluster.run(cmd, timeout=args.timeout, env=env)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    row = {"system": "jaxhc", "policy": policy, "label": label, **summarize(records)}
    if overlap is not None:
        row["overlap"] = overlap == "on"
    return {**_where(cluster), **row, "load_average_at_start": load_at_start}


def _peer(cluster: Cluster, hook: str, args, run_dir: str) -> dict:
    print(f"P={cluster.hosts} {cluster.rate} PyTorch DDP {hook}: training ...", flush=True)
    load_at_start = os.getloadavg()
    got = peer.run_hook(
        cluster, hook, config=args.config, overrides=args.overrides, steps=args.steps,
        run_dir=run_dir, timeout=args.timeout, summarize=summarize,
        torch_threads=args.peer_threads,
    )  # fmt: skip
    row = {"system": "pytorch-ddp", "hook": hook, "label": f"DDP {hook}", **got}
    return {**_where(cluster), **row, "load_average_at_start": load_at_start}


def _where(cluster: Cluster) -> dict:
    return {"hosts": cluster.hosts, "rate": cluster.rate}


def _add(result: dict, row: dict, out: Path) -> None:
    row["load_average_at_end"] = os.getloadavg()
    result["runs"].append(row)
    print(_line(row), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


def _line(s: dict) -> str:
    head = f"  P={s['hosts']} {s['rate']} {s['label']:25s}"
    if "failed" in s:
        return f"{head} failed: {s['failed']}"
    wire = sum(s["wire_bytes_per_step"].values()) / 1e6
    return (
        f"{head} {s['median_step_s']:.3f} s/step {s['tokens_per_s']:.0f} tok/s "
        f"val {s['val_loss']} wire {wire:.1f} MB/step"
    )
