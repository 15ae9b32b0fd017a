"""`jaxhc` command line: train, report, sweep, plan and profile; data, generate, eval, export.

    jaxhc data prepare my_texts/ --out data/mine --tokenizer bpe:8192
    jaxhc train --config configs/experiments/default.yaml --compression zhybrid \
        --mesh data=2,tensor=2,pipe=2 --steps 200 --out runs/zhybrid model.n_layer=4
    jaxhc train data.path=data/mine --steps 200 --out runs/mine
    jaxhc generate --run runs/mine --prompt "Once" --max-new-tokens 100
    jaxhc eval --run runs/mine
    jaxhc export --run runs/mine --hf exported/mine
    jaxhc report runs/* --out runs/report
    jaxhc sweep configs/experiments/hybrid-sweep.yaml
    jaxhc profile --out local.yaml
    jaxhc plan --model llama-7b --cluster configs/clusters/a100-1024.yaml --batch 1024
    jaxhc train --plan auto --steps 50
"""

from __future__ import annotations

import argparse
import os
import sys

from jaxhc.launch import host_devices, set_cpu_device_count
from jaxhc.policy import Policy
from jaxhc.train.progress import Progress
from jaxhc.workflow import commands as workflow

LOG_EVERY_HELP = (
    "when output is not a terminal (redirected, mpirun), print a plain progress line every N "
    "steps (default: train.eval_every)"
)
NO_MEMORY_REUSE_HELP = (
    "leave glibc's malloc as it is (by default freed host memory is kept and reused, so large "
    "XLA buffers are not faulted in afresh each step: jaxhc.host_memory)"
)


def _train_parser(sub) -> None:
    from jaxhc.codecs import SPEC_FORMS
    from jaxhc.policy import PRESETS

    p = sub.add_parser(
        "train", help="train a GPT (on the embedded corpus, or a prepared dataset: data.path=DIR)"
    )
    p.add_argument("--config", help="experiment YAML (default: the built-in small GPT)")
    p.add_argument(
        "--compression",
        help=f"policy preset ({', '.join(PRESETS)}) or a policy YAML path, whose axes name "
        f"codecs as {', '.join(SPEC_FORMS.values())} or off",
    )
    p.add_argument(
        "--init",
        help="hf:PATH: start from a local transformers GPT-2 or LLaMA folder (the model follows "
        "its config)",
    )
    p.add_argument("--mesh", help="e.g. data=2,tensor=2,pipe=2[,microbatches=2]")
    p.add_argument("--steps", type=int, help="training steps (also the schedule's length)")
    p.add_argument("--transport", choices=["xla", "mpi"], help="how collectives move bytes")
    p.add_argument("--out", help="run directory (default: runs/<config name>-<compression>)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--log-every", type=int, help=LOG_EVERY_HELP)
    p.add_argument("--no-memory-reuse", action="store_true", help=NO_MEMORY_REUSE_HELP)
    p.add_argument(
        "--plan",
        help="train with a plan: a YAML written by `jaxhc plan --write`, or "
        "'auto' (the best plan `jaxhc plan` finds for the run's devices as one node, "
        "under the run's compression)",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides such as model.n_layer=4")


def load_config(args):
    from jaxhc.train.config import load, parse_mesh

    overrides = list(args.overrides)
    if args.compression:
        overrides.append(f"compression={args.compression}")
    if args.transport:
        overrides.append(f"transport={args.transport}")
    if getattr(args, "init", None):
        overrides.append(f"init={args.init}")
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


def default_out(cfg) -> str:
    """``runs/<config name>-<policy>``: the run directory without ``--out``."""
    policy = cfg.compression
    policy = policy.name if isinstance(policy, Policy) else os.path.basename(policy)
    return os.path.join("runs", f"{cfg.name}-{policy}")


def train_config(args):
    """The config `jaxhc train` runs: the command line's, under ``--plan`` when given."""
    if args.plan and args.mesh:
        raise ValueError("--plan and --mesh both set the mesh: give one")
    cfg = load_config(args)
    if not args.plan:
        return cfg
    from jaxhc.plan import planfile
    from jaxhc.plan.search import describe

    if args.plan == "auto":
        best = planfile.auto(cfg)
        print(
            f"plan auto: {describe(best.layout)}; predicted communication "
            f"{best.comm_seconds * 1e3:.2f} ms/step",
            flush=True,
        )
        plan = planfile.Plan(mesh=best.layout.mesh_overrides())
    else:
        plan = planfile.Plan.load(args.plan)
    return planfile.apply(cfg, plan)


def cmd_train(args) -> int:
    cfg = train_config(args)
    args.out = args.out or default_out(cfg)
    _check_log_every(args)
    # Before anything starts jax's backends: the README's commands need no XLA_FLAGS on CPU.
    set_cpu_device_count(host_devices(cfg))
    if cfg.transport == "xla":
        from jaxhc.launch import init_distributed

        init_distributed()  # one process: nothing; several: jax.distributed (gloo on CPU)
    _reuse_memory(args)
    out = args.out
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
    from jaxhc.train import sweep as sweeps

    sweep = sweeps.Sweep.load(args.sweep)
    if args.policies:
        sweep = sweep.select(args.policies, args.sweep)
    _check_log_every(args)
    out = args.out or sweep.out
    runs = sweep.runs(args.overrides, out)
    set_cpu_device_count(host_devices(runs[0][1]))  # every run of a sweep has the same mesh
    _reuse_memory(args)
    progress = Progress(enabled=not args.no_progress, log_every=args.log_every)
    print(sweeps.run(runs, out, progress))
    return 0


def _plan_parser(sub) -> None:
    p = sub.add_parser(
        "plan", help="rank sharding plans by predicted communication time under a memory limit"
    )
    p.add_argument(
        "--model",
        required=True,
        help="gpt2-small/medium/large/xl, llama-7b/13b/30b/65b or a model YAML",
    )
    p.add_argument(
        "--cluster",
        required=True,
        help="cluster YAML (configs/clusters/, or written by `jaxhc profile`)",
    )
    p.add_argument("--batch", type=int, required=True, help="sequences per step (global)")
    p.add_argument("--seq", type=int, help="tokens per sequence (default: GPT block_size, 2048)")
    p.add_argument(
        "--micro-batch",
        type=int,
        help="sequences per micro-batch on a data rank: each plan accumulates gradients over "
        "batch / (data x micro-batch) micro-batches (default: one, or pipe with a pipeline)",
    )
    p.add_argument(
        "--precision",
        choices=["float32", "mixed"],
        default="float32",
        help="float32: jaxhc's layout (4+4+12 bytes/param); mixed: AMSP's 2+2+12",
    )
    p.add_argument(
        "--codecs",
        default="none",
        help="codecs to try on the data levels that cross nodes, e.g. none,zfp:8",
    )
    p.add_argument(
        "--compression",
        help="instead of --codecs: a policy (preset or YAML) every plan's traffic moves under",
    )
    p.add_argument("--mesh", help="fix tensor/pipe (and microbatches), e.g. tensor=2,pipe=1")
    p.add_argument(
        "--transport",
        choices=["xla", "mpi"],
        default="xla",
        help="the transport the plan trains on (mpi: fused calls pipeline codec and wire)",
    )
    p.add_argument(
        "--model-parallel",
        choices=["min", "all"],
        default="min",
        help="min (default): only the smallest tensor x pipe at which a plan fits; "
        "all: every size (the model counts communication only)",
    )
    p.add_argument("--top", type=int, default=10, help="fitting plans to print (default 10)")
    p.add_argument("--rejected", type=int, default=10, help="rejected plans to print")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also the best DDP, ZeRO-1/2/3, MiCS and AMSP plans (raw traffic)",
    )
    p.add_argument("--write", help="write the best plan `jaxhc train` takes as a plan YAML")


def _positive(args, *keys) -> None:
    for key in keys:
        v = getattr(args, key)
        if v is not None and not v > 0:
            raise ValueError(f"--{key.replace('_', '-')} {v} must be > 0")


def cmd_plan(args) -> int:
    from jaxhc.plan import cluster as clusters
    from jaxhc.plan import load_shape, planfile
    from jaxhc.plan.search import best_of_families, row, table
    from jaxhc.train.config import parse_mesh

    _positive(args, "batch", "seq", "top", "micro_batch")
    if args.rejected < 0:
        raise ValueError(f"--rejected {args.rejected} must be >= 0")
    shape = load_shape(args.model)
    cluster = clusters.load(args.cluster)
    seq = args.seq or (shape.gpt.block_size if shape.gpt is not None else 2048)
    codecs = tuple(c.strip() for c in args.codecs.split(",") if c.strip()) or ("none",)
    if args.compression and args.codecs != "none":
        raise ValueError("give --codecs or --compression, not both")
    from jaxhc.codecs import parse

    for c in codecs:
        parse(c)  # a bad spec is one line naming it
    rows = planfile.plans(
        shape,
        cluster,
        args.batch,
        seq,
        codecs=codecs,
        compression=args.compression,
        precision=args.precision,
        mesh=parse_mesh(args.mesh) if args.mesh else None,
        model_parallel=args.model_parallel,
        transport=args.transport,
        micro_batch=args.micro_batch,
    )
    n = shape.params()
    count = f"{n / 1e9:.3f} B" if n >= 1e9 else f"{n / 1e6:.3f} M"
    print(
        f"{shape.name} ({count} parameters) on {cluster.name}: "
        f"{cluster.nodes} x {cluster.devices_per_node} devices, "
        f"{cluster.memory / 2**30:g} GiB each; batch {args.batch} x {seq} tokens, "
        + (f"micro-batch {args.micro_batch}, " if args.micro_batch else "")
        + f"{args.precision}; predicted (jaxhc.plan.cost), "
        + ("communication only" if cluster.compute is None else "step s: jaxhc.plan.steptime")
    )
    schedule = cluster.to_dict().get("schedule")
    if schedule:  # the data-axis collectives as the cluster file's schedule runs them
        print("schedule: " + ", ".join(f"{k} {v}" for k, v in schedule.items()))
    print(table(rows, args.top, args.rejected))
    if args.compare:
        from jaxhc.plan.search import HEADER, SEPARATOR

        print("\nbest of each family (raw traffic):")
        print(HEADER.replace("| # |", "| family |"))
        print(SEPARATOR.replace("|---:|", "|---|", 1))
        fams = best_of_families(rows)
        for fam, c in fams.items():
            print(row(fam, c))
        for fam in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "MiCS", "AMSP"):
            if fam not in fams:
                print(f"{fam}: no plan fits")
    if args.write:
        best = planfile.best(rows)
        if best is None:
            raise ValueError("--write: no fitting plan is one `jaxhc train` takes")
        plan = planfile.Plan.from_candidate(best, args.compression, args.model, cluster)
        plan.dump(args.write)
        print(f"wrote {args.write}")
    return 0


def _profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="measure codec speeds (and links) into a cluster YAML")
    p.add_argument("--out", help="write the cluster YAML here (default: print it)")
    p.add_argument("--devices", type=int, default=8, help="local devices (default 8)")
    p.add_argument("--mib", type=float, default=4.0, help="MiB per codec measurement")
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement (best kept)")
    p.add_argument("--codecs", default="zfp:8,zfp:16,q8,mpc", help="codecs to time")
    p.add_argument(
        "--links",
        action="store_true",
        help="also time collectives over the local devices (link and per-op, per-group figures)",
    )


def cmd_profile(args) -> int:
    import yaml

    from jaxhc.codecs import parse
    from jaxhc.plan import cluster as clusters

    _positive(args, "devices", "mib", "repeats")
    specs = [parse(c.strip()).spec for c in args.codecs.split(",") if c.strip()]
    if any(s == "none" for s in specs):
        raise ValueError("--codecs: 'none' has no speed to measure")
    set_cpu_device_count(args.devices)
    from jaxhc.plan.profile import profile

    data = profile(args.devices, args.mib, args.repeats, args.links, specs)
    clusters.from_dict(data, where="profile")  # what the planner will read back
    text = yaml.safe_dump(data, sort_keys=False, width=100)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


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
    sp.add_argument("--policies", help="run only these of the sweep's policies (comma-separated)")
    sp.add_argument("--no-progress", action="store_true")
    sp.add_argument("--log-every", type=int, help=LOG_EVERY_HELP)
    sp.add_argument("--no-memory-reuse", action="store_true", help=NO_MEMORY_REUSE_HELP)
    sp.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    _plan_parser(sub)
    _profile_parser(sub)
    workflow.add_parsers(sub)
    # Overrides may sit between options (argparse stops a "*" positional at the first option).
    args, extra = ap.parse_known_args(argv)
    stray = [
        e
        for e in extra
        if e.startswith("-") or "=" not in e or args.command not in ("train", "sweep")
    ]
    if stray:
        ap.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    try:
        commands = {
            "train": cmd_train,
            "report": cmd_report,
            "sweep": cmd_sweep,
            "plan": cmd_plan,
            "profile": cmd_profile,
            **workflow.COMMANDS,
        }
        return commands[args.command](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"jaxhc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except FloatingPointError as e:  # the run diverged (see train.max_skipped_steps)
        print(f"jaxhc {args.command}: stopped: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
