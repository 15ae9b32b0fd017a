"""jaxhc's train step beside a plain JAX + optax step of the same model, batch and dtype.

    python bench/step_overhead.py [--cases links-1,default-1,links-zero8] [--repeats 15]

The plain step is what a user writes without jaxhc: `jaxhc.model.gpt.loss`, `jax.grad`,
`optax.clip_by_global_norm` + `optax.adamw` (the same schedule, betas, weight decay mask), one
`jax.jit` with the parameters and optimizer state donated. Cases:

* ``<config>-1``: one device (mesh data = tensor = pipe = 1), policy none;
* ``<config>-zero8``: ZeRO over data = 8 (policy none) beside the plain program jitted with the
  batch split over 8 devices and everything else replicated (XLA inserts the gradient all-reduce).

Both run in one process that reuses freed host memory (`jaxhc.host_memory`, as `jaxhc train`
does: XLA:CPU's fresh large buffers are otherwise faulted in page by page every step, which on
this machine costs more than the update). Both steps run on the same batches, alternating per
repeat so that a change in the machine's state (other jobs, memory bandwidth) hits both alike;
the JSON keeps every repeat's seconds.
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
import dataclasses
import statistics
import time

import _common
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxhc import host_memory
from jaxhc.data import Batches, corpus_bytes
from jaxhc.model import gpt
from jaxhc.model.config import MeshConfig
from jaxhc.parallel import init_state, make_mesh, make_train_step
from jaxhc.parallel.layout import decay_mask
from jaxhc.parallel.zero import lr_schedule
from jaxhc.train import config as train_config

CONFIGS = {"links": "configs/experiments/links.yaml", "default": "configs/experiments/default.yaml"}
MESHES = {"1": MeshConfig(data=1, tensor=1, pipe=1), "zero8": MeshConfig(data=8, tensor=1, pipe=1)}
# The target ratios (jaxhc's median step over the plain one's), per mesh.
TARGETS = {"1": 1.15, "zero8": 1.3}


def plain_step(cfg, mesh: Mesh | None):
    """The plain JAX + optax train step: (init, step) with `step(params, opt_state, tokens)`."""
    o = cfg.optim
    clip = optax.clip_by_global_norm(o.grad_clip) if o.grad_clip > 0 else optax.identity()
    adamw = optax.adamw(lr_schedule(o), o.b1, o.b2, o.eps, weight_decay=o.weight_decay,
                        mask=decay_mask)  # fmt: skip
    tx = optax.chain(clip, adamw)

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(gpt.loss)(params, tokens, cfg.model)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    if mesh is None:
        return tx.init, jax.jit(step, donate_argnums=(0, 1))
    rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    jitted = jax.jit(step, in_shardings=(rep, rep, rows), out_shardings=(rep, rep, rep),
                     donate_argnums=(0, 1))  # fmt: skip
    return tx.init, jitted


def run_case(name: str, repeats: int, batch: int | None) -> dict:
    config, mesh_name = name.rsplit("-", 1)
    cfg = train_config.load(CONFIGS[config])
    mesh_cfg = MESHES[mesh_name]
    cfg = dataclasses.replace(cfg, mesh=mesh_cfg, compression="none")
    b = batch or cfg.train.batch_size
    devices = jax.devices()[: mesh_cfg.size]
    mesh = make_mesh(mesh_cfg, devices)
    batches = Batches(corpus_bytes(), b, cfg.model.block_size, cfg.train.seed)
    tokens = [np.asarray(batches.train(i)) for i in range(repeats + 2)]

    state = init_state(cfg.model, mesh_cfg, cfg.optim, mesh, cfg.train.seed, policy="none")
    step = make_train_step(cfg.model, mesh_cfg, cfg.optim, mesh, "none")

    init, pstep = plain_step(cfg, mesh if mesh_cfg.size > 1 else None)
    params = gpt.init_params(cfg.model, cfg.train.seed)
    opt_state = init(params)
    if mesh_cfg.size > 1:
        rep = NamedSharding(mesh, P())
        params, opt_state = jax.device_put((params, opt_state), rep)

    def run_jaxhc(t):
        nonlocal state
        state, metrics = step(state, t)
        return metrics["loss"]

    def run_plain(t):
        nonlocal params, opt_state
        params, opt_state, loss = pstep(params, opt_state, jnp.asarray(t))
        return loss

    times = {"jaxhc": [], "plain": []}
    losses = {"jaxhc": [], "plain": []}
    for i, t in enumerate(tokens):
        for key, fn in (("jaxhc", run_jaxhc), ("plain", run_plain)):
            start = time.perf_counter()
            loss = float(jax.block_until_ready(fn(t)))
            if i >= 2:  # the first two compile and warm up
                times[key].append(time.perf_counter() - start)
            losses[key].append(loss)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "case": name,
        "config": CONFIGS[config],
        "mesh": dataclasses.asdict(mesh_cfg),
        "batch_size": b,
        "block_size": cfg.model.block_size,
        "dtype": cfg.model.dtype,
        "parameters": int(sum(x.size for x in jax.tree.leaves(params))),
        "median_s": med,
        "ratio": med["jaxhc"] / med["plain"],
        "target_ratio": TARGETS[mesh_name],
        "seconds": times,
        # The same model and batches: the losses agree to float32 rounding (a check on the pairing).
        "losses": losses,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="links-1,default-1,links-zero8,default-zero8")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--batch-size", type=int, help="override train.batch_size")
    ap.add_argument("--out", default="bench/results/step_overhead.json")
    args = ap.parse_args(argv)
    reused = host_memory.reuse_freed_memory()
    rows, results = [], []
    for name in args.cases.split(","):
        r = run_case(name, args.repeats, args.batch_size)
        results.append(r)
        m = r["median_s"]
        rows.append([name, r["batch_size"], f"{r['parameters'] / 1e6:.1f}M",
                     f"{m['plain'] * 1e3:.1f}", f"{m['jaxhc'] * 1e3:.1f}",
                     f"{r['ratio']:.2f}x", f"{r['target_ratio']:.2f}x"])  # fmt: skip
        _common.write_json(
            args.out, {"repeats": args.repeats, "freed_memory_reused": reused, "results": results}
        )
    columns = ["case", "batch", "params", "plain ms", "jaxhc ms", "ratio", "target"]
    _common.print_table("train step: jaxhc beside plain JAX + optax (median)", columns, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
