"""Compare training runs: a markdown table and PNG plots (loss vs step, loss vs wire bytes)."""

from __future__ import annotations

import json
import os

import numpy as np


def load_run(path: str) -> dict:
    """A run directory's resolved config and per-step metrics."""
    metrics_path = os.path.join(path, "metrics.jsonl")
    if not os.path.exists(metrics_path):
        raise ValueError(f"{path}: no metrics.jsonl (is it a jaxhc run directory?)")
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise ValueError(f"{metrics_path} has no steps")
    config = {}
    cfg_path = os.path.join(path, "config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path) as f:
            config = json.load(f)
    # A resumed run may repeat steps; the last record of a step wins.
    by_step = {r["step"]: r for r in rows}
    return {
        "path": path,
        "name": os.path.basename(os.path.normpath(path)),
        "config": config,
        "steps": [by_step[s] for s in sorted(by_step)],
    }


def summarize(run: dict, tail: int = 10) -> dict:
    steps = [r for r in run["steps"] if "loss" in r]
    losses = np.array([r["loss"] for r in steps])
    val = [r["val_loss"] for r in steps if r.get("val_loss") is not None]
    raw = sum(sum(r.get("raw_bytes", {}).values()) for r in steps)
    wire = sum(sum(r.get("wire_bytes", {}).values()) for r in steps)
    fallbacks = sum(sum(r.get("fallbacks", {}).values()) for r in steps)
    speed = [r["tokens_per_s"] for r in steps[1:] if "tokens_per_s" in r]  # step 0 compiles
    return {
        "run": run["name"],
        "policy": run["config"].get("compression", "?"),
        "steps": int(steps[-1]["step"]) + 1 if steps else 0,
        "first_loss": float(losses[0]) if len(losses) else float("nan"),
        "final_loss": float(losses[-tail:].mean()) if len(losses) else float("nan"),
        "final_val_loss": float(val[-1]) if val else float("nan"),
        "tokens_per_s": float(np.median(speed)) if speed else float("nan"),
        "wire_mb_per_step": wire / max(len(steps), 1) / 1e6,
        "raw_over_wire": raw / wire if wire else float("nan"),
        "fallbacks": int(fallbacks),
    }


COLUMNS = [
    "run",
    "policy",
    "steps",
    "first_loss",
    "final_loss",
    "final_val_loss",
    "tokens_per_s",
    "wire_mb_per_step",
    "raw_over_wire",
    "fallbacks",
]


def markdown(summaries: list[dict]) -> str:
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(s[c]) for c in COLUMNS) + " |" for s in summaries]
    return "\n".join(lines)


def plot(runs: list[dict], out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for xkey, fname, xlabel in (
        ("step", "loss_vs_step.png", "step"),
        ("wire", "loss_vs_wire.png", "cumulative wire bytes per rank (MB)"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for run in runs:
            steps = [r for r in run["steps"] if "loss" in r]
            if xkey == "step":
                xs = [r["step"] for r in steps]
            else:
                xs = np.cumsum([sum(r.get("wire_bytes", {}).values()) for r in steps]) / 1e6
            ax.plot(xs, [r["loss"] for r in steps], label=run["name"], linewidth=1.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def report(run_dirs: list[str], out_dir: str) -> str:
    """Write report.md and the plots into `out_dir`; return the markdown table."""
    runs = [load_run(d) for d in run_dirs]
    os.makedirs(out_dir, exist_ok=True)
    table = markdown([summarize(r) for r in runs])
    plots = plot(runs, out_dir)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("# jaxhc runs\n\n" + table + "\n\n")
        f.writelines(f"![{os.path.basename(p)}]({os.path.basename(p)})\n" for p in plots)
    return table
