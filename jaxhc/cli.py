"""`jaxhc` command line: train, report, sweep and plan.

    jaxhc train --config configs/experiments/default.yaml --compression zhybrid \
        --mesh data=2,tensor=2,pipe=2 --steps 200 --out runs/zhybrid model.n_layer=4
    jaxhc report runs/* --out runs/report
    jaxhc sweep configs/experiments/hybrid-sweep.yaml
    jaxhc plan --model gpt2-xl --mesh data=64 --node-devices 8 --memory-gib 24
"""

from __future__ import annotations

import argparse
import os
import sys

from jaxhc._compat import set_cpu_device_count
from jaxhc.train.progress import Progress

LOG_EVERY_HELP = (
    "when output is not a terminal (redirected, mpirun), print a plain progress line every N "
    "steps (default: train.eval_every)"
)
NO_MEMORY_REUSE_HELP = (
    "leave glibc's malloc as it is (by default freed host memory is kept and reused, so large "
    "XLA buffers are not faulted in afresh each step: jaxhc.host_memory)"
)


def host_devices(cfg, env=None) -> int:
    """The devices this process needs: one per process under ``--transport mpi`` (mpirun starts
    a process per mesh device); under ``--transport xla`` its share of the mesh (the whole mesh in
    one process; the mesh split evenly over the processes of a `jax.distributed` job started by
    mpirun, srun or jaxhc's JAXHC_* variables)."""
    from jaxhc.launch import ProcessEnv

    if cfg.transport == "mpi":
        return 1
    env = env or ProcessEnv.from_env()
    if cfg.mesh.size % env.num_processes:
        raise ValueError(
            f"mesh size {cfg.mesh.size} is not a multiple of the {env.num_processes} processes "
            f"of this job (started by {env.source}): each process takes an equal share"
        )
    return cfg.mesh.size // env.num_processes


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a GPT on the embedded corpus")
    p.add_argument("--config", help="experiment YAML (default: the built-in small GPT)")
    p.add_argument(
        "--compression",
        help="policy preset (none, zfp8, zfp16, mpc, mzhybrid, "
        "zhybrid, identity) or a policy YAML path",
    )
    p.add_argument("--mesh", help="e.g. data=2,tensor=2,pipe=2[,microbatches=2]")
    p.add_argument("--steps", type=int, help="training steps (also the schedule's length)")
    p.add_argument("--transport", choices=["xla", "mpi"], help="how collectives move bytes")
    p.add_argument("--out", help="run directory (default: runs/<config name>-<compression>)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--log-every", type=int, help=LOG_EVERY_HELP)
    p.add_argument("--no-memory-reuse", action="store_true", help=NO_MEMORY_REUSE_HELP)
    p.add_argument("overrides", nargs="*", help="dotted overrides such as model.n_layer=4")


def load_config(args):
    from jaxhc.train.config import load, parse_mesh

    overrides = list(args.overrides)
    if args.compression:
        overrides.append(f"compression={args.compression}")
    if args.transport:
        overrides.append(f"transport={args.transport}")
    if args.steps is not None:
        overrides += [f"train.steps={args.steps}", f"optim.total_steps={args.steps}"]
    if args.mesh:
        overrides += [f"mesh.{k}={v}" for k, v in parse_mesh(args.mesh).items()]
    return load(args.config, overrides)


def _check_log_every(args) -> None:
    if args.log_every is not None and args.log_every < 1:
        raise ValueError(f"--log-every {args.log_every} must be >= 1")


def _reuse_memory(args) -> None:
    if not args.no_memory_reuse:
        from jaxhc.host_memory import reuse_freed_memory

        reuse_freed_memory()


def cmd_train(args) -> int:
    cfg = load_config(args)
    _check_log_every(args)
    # Before anything starts jax's backends: the README's commands need no XLA_FLAGS on CPU.
    set_cpu_device_count(host_devices(cfg))
    if cfg.transport == "xla":
        from jaxhc.launch import init_distributed

        init_distributed()  # one process: nothing; several: jax.distributed (gloo on CPU)
    _reuse_memory(args)
    out = args.out or os.path.join("runs", f"{cfg.name}-{os.path.basename(cfg.compression)}")
    progress = Progress(enabled=not args.no_progress, log_every=args.log_every)
    if cfg.transport == "mpi":
        from jaxhc.train.mpi import train_mpi

        summary = train_mpi(cfg, out, resume=args.resume, progress=progress)
    else:
        from jaxhc.train.loop import train

        summary = train(cfg, out, resume=args.resume, progress=progress)
    if summary:
        print(
            f"{out}: step {summary['step'] + 1} loss {summary['loss']:.4f}"
            + (f" val {summary['val_loss']:.4f}" if "val_loss" in summary else "")
        )
    return 0


def cmd_report(args) -> int:
    from jaxhc.train.report import report

    dirs = [d for d in args.runs if os.path.exists(os.path.join(d, "metrics.jsonl"))]
    if not dirs:
        raise ValueError(f"no run directories (with metrics.jsonl) among {args.runs}")
    out = args.out or os.path.join(os.path.dirname(os.path.normpath(dirs[0])) or ".", "report")
    print(report(dirs, out))
    print(f"wrote {out}/report.md and plots")
    return 0


def cmd_sweep(args) -> int:
    from jaxhc._checks import read_yaml
    from jaxhc.train.config import load
    from jaxhc.train.loop import train
    from jaxhc.train.report import report

    sweep = read_yaml(args.sweep) or {}
    unknown = set(sweep) - {"base", "policies", "out", "overrides"}
    if unknown:
        raise ValueError(f"{args.sweep}: unknown sweep key {sorted(unknown, key=str)[0]!r}")
    base = sweep.get("base")
    if base is not None and not os.path.isabs(base):
        base = os.path.join(os.path.dirname(os.path.abspath(args.sweep)), base)
    policies = sweep.get("policies") or []
    if not policies:
        raise ValueError(f"{args.sweep}: 'policies' must list at least one policy")
    out = args.out or sweep.get("out", "runs/sweep")
    _check_log_every(args)
    progress = Progress(enabled=not args.no_progress, log_every=args.log_every)
    dirs = []
    for policy in policies:
        cfg = load(
            base,
            list(sweep.get("overrides", [])) + list(args.overrides) + [f"compression={policy}"],
        )
        if not dirs:  # every run of a sweep has the same mesh
            set_cpu_device_count(host_devices(cfg))
            _reuse_memory(args)
        run_dir = os.path.join(out, os.path.splitext(os.path.basename(str(policy)))[0])
        print(f"== {run_dir}", flush=True)
        resume = os.path.exists(os.path.join(run_dir, "checkpoints"))
        if not (resume and _finished(run_dir, cfg)):
            train(cfg, run_dir, resume=resume, progress=progress)
        dirs.append(run_dir)
    print(report(dirs, os.path.join(out, "report")))
    return 0


def _plan_parser(sub) -> None:
    p = sub.add_parser(
        "plan", help="rank sharding plans by communication time under a memory limit"
    )
    p.add_argument("--model", required=True, help="gpt2-small/medium/large/xl or a model YAML")
    p.add_argument("--mesh", required=True, help="e.g. data=64,tensor=1,pipe=1")
    p.add_argument("--node-devices", type=int, default=8, help="devices per node (default 8)")
    p.add_argument("--memory-gib", type=float, default=80.0, help="memory per device (GiB)")
    p.add_argument("--intra-gbps", type=float, default=150.0, help="intra-node GB/s per device")
    p.add_argument("--inter-gbps", type=float, default=12.5, help="inter-node GB/s per device")
    p.add_argument("--compression", help="policy (preset or YAML) the data traffic moves under")


def cmd_plan(args) -> int:
    import dataclasses

    from jaxhc.model.config import MeshConfig
    from jaxhc.plan import Links, candidates, load_model, table
    from jaxhc.train.config import parse_mesh

    for key in ("node_devices", "memory_gib", "intra_gbps", "inter_gbps"):
        if not getattr(args, key) > 0:
            raise ValueError(f"--{key.replace('_', '-')} {getattr(args, key)} must be > 0")
    mesh = dataclasses.replace(MeshConfig(), **parse_mesh(args.mesh))
    links = Links(args.node_devices, args.intra_gbps * 1e9, args.inter_gbps * 1e9)
    memory = args.memory_gib * 2**30
    rows = candidates(load_model(args.model), mesh, links, memory, args.compression)
    print(table(rows))
    return 0


def _finished(run_dir: str, cfg) -> bool:
    from jaxhc.train.checkpoint import Checkpoints

    return Checkpoints(os.path.join(run_dir, "checkpoints")).latest_step() == cfg.train.steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="jaxhc", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    rp = sub.add_parser("report", help="compare runs: markdown table and PNG plots")
    rp.add_argument("runs", nargs="+", help="run directories")
    rp.add_argument("--out", help="where to write report.md and plots")
    sp = sub.add_parser("sweep", help="train several policies on the same seed and data")
    sp.add_argument("sweep", help="sweep YAML (base config, policies, out)")
    sp.add_argument("--out", help="override the sweep's output directory")
    sp.add_argument("--no-progress", action="store_true")
    sp.add_argument("--log-every", type=int, help=LOG_EVERY_HELP)
    sp.add_argument("--no-memory-reuse", action="store_true", help=NO_MEMORY_REUSE_HELP)
    sp.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    _plan_parser(sub)
    # Overrides may sit between options (argparse stops a "*" positional at the first option).
    args, extra = ap.parse_known_args(argv)
    stray = [
        e for e in extra if e.startswith("-") or "=" not in e or args.command in ("report", "plan")
    ]
    if stray:
        ap.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    try:
        commands = {"train": cmd_train, "report": cmd_report, "sweep": cmd_sweep, "plan": cmd_plan}
        return commands[args.command](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"jaxhc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except FloatingPointError as e:  # the run diverged (see train.max_skipped_steps)
        print(f"jaxhc {args.command}: stopped: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
