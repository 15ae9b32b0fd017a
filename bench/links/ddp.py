"""One rank of the peer: PyTorch DDP over gloo training jaxhc's experiment, as a user would.

    python -m bench.links.ddp --config configs/experiments/links.yaml --hook fp16 --out DIR

Run once per host by `Cluster.run_distributed` (bench/links/peer.py): the rank, the world size
and the rendezvous address come from its JAXHC_* variables, gloo's interface from
GLOO_SOCKET_IFNAME. The experiment is jaxhc's (`jaxhc.cli.load_config`, the same overrides):
transformers' torch `GPT2LMHeadModel` of its shape, starting from jaxhc's initial parameters for
its seed; each step's global batch is jaxhc's (`jaxhc.data.Batches` for (seed, step)), its rows
split over the ranks as jaxhc splits them (rank r the r-th block); AdamW with jaxhc's betas, eps
and weight decay (matrices and embeddings only), global-norm clipping, and the learning rate of
`jaxhc.parallel.zero.lr_schedule` for every step. Rank 0 writes DIR/metrics.jsonl with the
fields of jaxhc's (the step's seconds the slowest rank's; the wire bytes computed, see
`bench.links.peer.wire_bytes`) and DIR/peer.json (versions, threads, hook settings).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import types

import numpy as np

from .peer import HOOKS, POWERSGD, wire_bytes
from .peer_model import decayed_names, gpt2_config, gpt2_state


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench.links.ddp", description=__doc__)
    ap.add_argument("--config", required=True)
    ap.add_argument("--hook", choices=HOOKS, default="none")
    ap.add_argument("--out", required=True, help="run directory (rank 0 writes it)")
    ap.add_argument("--steps", type=int, help="override train.steps (as jaxhc train --steps)")
    ap.add_argument("--threads", type=int, required=True, help="torch.set_num_threads")
    ap.add_argument(
        "--bucket-cap-mb", type=float, help="DDP's gradient bucket size (default: DDP's, 25)"
    )
    ap.add_argument(
        "--collective-timeout", type=float, default=180.0,
        help="seconds a gloo collective may wait before it fails (a hang becomes an error)",
    )  # fmt: skip
    ap.add_argument("overrides", nargs="*", help="dotted config overrides")
    return ap.parse_args(argv)


def _env(name: str) -> str:
    if name not in os.environ:
        raise SystemExit(f"ddp: {name} is not set (run under Cluster.run_distributed)")
    return os.environ[name]


def _hook(model, hook: str, dist) -> dict:
    """Register DDP communication hook `hook`; returns its settings for the record."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, **POWERSGD)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return dict(POWERSGD)
    return {}


def main(argv=None) -> int:
    args = _args(argv)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers

    from jaxhc.cli import load_config
    from jaxhc.data import Batches, corpus_bytes
    from jaxhc.model import gpt
    from jaxhc.parallel.zero import lr_schedule

    rank, world = int(_env("JAXHC_PROCESS_ID")), int(_env("JAXHC_NUM_PROCESSES"))
    opts = types.SimpleNamespace(
        config=args.config, overrides=args.overrides, compression=None, transport=None,
        steps=args.steps, mesh=f"data={world},tensor=1,pipe=1",
    )  # fmt: skip
    cfg = load_config(opts)
    m, o, t = cfg.model, cfg.optim, cfg.train
    if t.batch_size % world:
        raise SystemExit(f"ddp: train.batch_size={t.batch_size} does not split over {world} ranks")
    torch.set_num_threads(args.threads)
    torch.manual_seed(t.seed)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{_env('JAXHC_COORDINATOR')}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=args.collective_timeout),
    )  # fmt: skip

    config = transformers.GPT2Config(**gpt2_config(m))
    model = transformers.GPT2LMHeadModel(config)
    start = gpt2_state(gpt.init_params(m, t.seed), m)
    missing = model.load_state_dict({k: torch.from_numpy(v) for k, v in start.items()})
    if missing.missing_keys or missing.unexpected_keys:
        raise SystemExit(f"ddp: state dict does not fit the model: {missing}")
    model.train()
    bucket_mb = args.bucket_cap_mb
    if args.hook == "powersgd" and bucket_mb is None:
        # One bucket: with DDP's 25 MiB buckets PowerSGD hung (or a rank aborted) under gloo here
        # at its first compressed step; the all-reduces it chains per bucket in callbacks
        # interleave differently on different ranks.
        bucket_mb = math.ceil(sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20)
        bucket_mb += 1
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    settings = _hook(ddp, args.hook, dist)
    named = list(model.named_parameters())  # the tied lm_head is wte: listed once
    decayed = decayed_names(m.n_layer)
    groups = [
        {"params": [p for n, p in named if n in decayed], "weight_decay": o.weight_decay},
        {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=o.lr, betas=(o.b1, o.b2), eps=o.eps)
    schedule = lr_schedule(o)
    lrs = [float(schedule(s)) for s in range(t.steps)]  # jaxhc's own schedule, read once
    shapes = [tuple(p.shape) for _, p in named]
    params = [p for _, p in named]

    batches = Batches(corpus_bytes(), t.batch_size, m.block_size, t.seed)
    rows = t.batch_size // world
    mine = slice(rank * rows, (rank + 1) * rows)
    tokens_per_step = t.batch_size * m.block_size

    def loss_of(net, tokens):
        x = torch.from_numpy(tokens[mine, :-1].astype(np.int64))
        y = torch.from_numpy(tokens[mine, 1:].astype(np.int64))
        logits = net(input_ids=x).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))

    def across(*values) -> np.ndarray:
        """(ranks, len(values)): every rank's values, gathered (outside the timing)."""
        local = torch.tensor(values, dtype=torch.float64)
        out = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(out, local)
        return torch.stack(out).numpy()

    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        meta = {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "backend": "gloo",
            "hook": args.hook,
            "hook_settings": settings,
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "attention": getattr(model.config, "_attn_implementation", None),
            "parameters": sum(p.numel() for p in params),
            "bucket_cap_mb": bucket_mb or 25,  # DDP's default: 25
        }
        with open(os.path.join(args.out, "peer.json"), "w") as f:
            json.dump(meta, f, indent=1)
    out = open(os.path.join(args.out, "metrics.jsonl"), "w") if rank == 0 else None
    for step in range(t.steps):
        tokens = batches.train(step)
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        t0 = time.perf_counter()
        loss = loss_of(ddp, tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, o.grad_clip) if o.grad_clip else None
        opt.step()
        value = loss.item()
        seconds = time.perf_counter() - t0
        stats = across(seconds, value)
        seconds, value = float(stats[:, 0].max()), float(stats[:, 1].mean())
        if not math.isfinite(value):
            raise SystemExit(f"ddp: step {step}: loss is {value}")
        raw, wire = wire_bytes(shapes, args.hook, world, step=step)
        record = {
            "step": step,
            "loss": value,
            "lr": lrs[step],
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "skipped": False,
            "seconds": seconds,
            "tokens_per_s": tokens_per_step / seconds,
            "raw_bytes": {"data": raw},
            "wire_bytes": {"data": wire},
            "fallbacks": {"data": 0.0},
        }
        if (step + 1) % t.eval_every == 0 or step + 1 == t.steps:
            with torch.no_grad():
                model.eval()
                local = [loss_of(model, batches.val(i)).item() for i in range(t.eval_batches)]
                model.train()
            record["val_loss"] = float(across(*local).mean())
        if out is not None:
            out.write(json.dumps(record) + "\n")
            out.flush()
    if out is not None:
        out.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
