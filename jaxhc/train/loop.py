"""The training loop: batches in, sharded steps, metrics.jsonl, checkpoints, a progress bar."""

from __future__ import annotations

import json
import math
import os
import time

import jax
import numpy as np

import jaxhc
from jaxhc.data import VOCAB_SIZE, Batches, corpus_bytes
from jaxhc.model import init_state, make_eval_loss, make_mesh, make_train_step, validate
from jaxhc.policy import Policy
from jaxhc.train.checkpoint import Checkpoints
from jaxhc.train.config import ExperimentConfig


def flops_per_token(cfg, n_params: int) -> float:
    """Training FLOPs per token: 6N for the dense math plus attention (PaLM appendix B)."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def train(cfg: ExperimentConfig, out_dir: str, *, resume: bool = False, progress: bool = True) -> dict:
    """Train `cfg`, writing `metrics.jsonl`, `config.json` and checkpoints into `out_dir`.

    With ``resume=True`` the run continues from the latest checkpoint in `out_dir`; batches depend
    only on (seed, step), so the losses after resuming equal those of an uninterrupted run.
    Returns a summary of the last step.
    """
    if cfg.transport != "xla":
        raise ValueError(f"transport={cfg.transport!r}: run it with `jaxhc train` under mpirun")
    devices = jax.devices()
    validate(cfg.model, cfg.mesh, batch_size=cfg.train.batch_size, n_devices=len(devices))
    if cfg.model.vocab_size < VOCAB_SIZE:
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} must be >= {VOCAB_SIZE} (bytes)")
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    if not resume and os.path.exists(metrics_path) and os.path.getsize(metrics_path):
        raise ValueError(f"--out {out_dir} already holds a run: pass --resume or choose another --out")
    os.makedirs(out_dir, exist_ok=True)

    mesh = make_mesh(cfg.mesh, devices)
    policy = Policy.load(cfg.compression)
    batches = Batches(corpus_bytes(), cfg.train.batch_size, cfg.model.block_size, cfg.train.seed)
    state = init_state(cfg.model, cfg.mesh, cfg.optim, mesh, cfg.train.seed)
    checkpoints = Checkpoints(os.path.join(out_dir, "checkpoints"), keep=cfg.train.keep_checkpoints)
    start = 0
    if resume:
        state = checkpoints.restore(state)
        start = int(jax.device_get(state.step))
        _truncate_metrics(metrics_path, start)
    _write_config(out_dir, cfg, policy, devices)

    step_fn = make_train_step(cfg.model, cfg.mesh, cfg.optim, mesh, policy)
    eval_fn = make_eval_loss(cfg.model, cfg.mesh, mesh, policy)
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(state.params))
    tokens_per_step = cfg.train.batch_size * cfg.model.block_size
    flops = flops_per_token(cfg.model, n_params) * tokens_per_step
    ledger = jaxhc.accounting.Ledger()
    record: dict = {}

    with _Progress(cfg.train.steps, start, enabled=progress) as bar, open(metrics_path, "a") as out:
        for step in range(start, cfg.train.steps):
            tokens = batches.train(step)
            ledger.reset()
            t0 = time.perf_counter()
            with ledger:
                state, metrics = step_fn(state, tokens)
                metrics = jax.device_get(metrics)
            seconds = time.perf_counter() - t0
            loss = float(metrics["loss"])
            if not math.isfinite(loss):
                raise FloatingPointError(f"step {step}: loss is {loss}; stopping (checkpoints kept)")
            traffic = ledger.per_axis(devices=mesh.devices.size)
            record = {
                "step": step,
                "loss": loss,
                "lr": float(metrics["lr"]),
                "grad_norm": float(metrics["grad_norm"]),
                "seconds": seconds,
                "tokens_per_s": tokens_per_step / seconds,
                "model_tflops": flops / seconds / 1e12,
                "raw_bytes": {a: t["raw_bytes"] for a, t in traffic.items()},
                "wire_bytes": {a: t["wire_bytes"] for a, t in traffic.items()},
                "fallbacks": {a: t["fallbacks"] for a, t in traffic.items()},
            }
            last = step + 1 == cfg.train.steps
            if (step + 1) % cfg.train.eval_every == 0 or last:
                record["val_loss"] = float(np.mean([
                    float(eval_fn(state.params, batches.val(i))) for i in range(cfg.train.eval_batches)
                ]))
            out.write(json.dumps(record) + "\n")
            out.flush()
            if (step + 1) % cfg.train.ckpt_every == 0 or last:
                if not checkpoints.save(step + 1, state):
                    bar.note(f"step {step + 1}: state is not finite; checkpoint skipped")
            bar.update(record)
    checkpoints.close()
    return record


def _truncate_metrics(path: str, start: int) -> None:
    """Drop records of steps >= start (written after the checkpoint we resume from)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        keep = [line for line in f if line.strip() and json.loads(line)["step"] < start]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(keep)
    os.replace(tmp, path)


def _write_config(out_dir: str, cfg: ExperimentConfig, policy: Policy, devices) -> None:
    resolved = {**cfg.to_dict(), "policy": policy.to_dict(), "jaxhc": jaxhc.__version__,
                "jax": jax.__version__, "devices": [str(d) for d in devices]}
    tmp = os.path.join(out_dir, "config.json.tmp")
    with open(tmp, "w") as f:
        json.dump(resolved, f, indent=2)
    os.replace(tmp, os.path.join(out_dir, "config.json"))


class _Progress:
    """A rich progress bar: step, loss, tokens/s, wire MB per step per axis, ETA."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.enabled, self.total, self.start = enabled, total, start
        self._progress = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("train", total=self.total, completed=self.start,
                                                 info="compiling...")
        return self

    def update(self, record: dict) -> None:
        if not self._progress:
            return
        wire = " ".join(f"{a}={v / 1e6:.2f}" for a, v in record["wire_bytes"].items() if v)
        info = (f"loss {record['loss']:.4f}  {record['tokens_per_s']:.0f} tok/s  "
                f"wire MB/step {wire or '0'}")
        if "val_loss" in record:
            info += f"  val {record['val_loss']:.4f}"
        self._progress.update(self._task, completed=record["step"] + 1, info=info)

    def note(self, text: str) -> None:
        if self._progress:
            self._progress.console.print(text)

    def __exit__(self, *exc):
        if self._progress:
            self._progress.__exit__(*exc)
