"""Compare training runs: a markdown table and PNG plots (loss vs step, loss vs wire bytes, and
the compressed gradients' fidelity with the loss gap to the `none` run).

Fidelity columns come from runs trained with ``train.fidelity_every`` > 0 (NaN otherwise): the mean
over the sampled steps of ``grad_rel_err`` and ``grad_cos`` (`jaxhc.parallel.fidelity`). The gaps
compare with the run of policy ``none`` among those reported (NaN without one, or when its number
of steps differs): the final validation loss, and the mean training loss over the last steps,
relative to none's, in percent.
"""

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


def summarize(run: dict, tail: int = 10, baseline: dict | None = None) -> dict:
    """One table row; `baseline` (the `none` run's row) gives the loss gaps."""
    steps = [r for r in run["steps"] if "loss" in r]
    losses = np.array([r["loss"] for r in steps])
    val = [r["val_loss"] for r in steps if r.get("val_loss") is not None]
    raw = sum(sum(r.get("raw_bytes", {}).values()) for r in steps)
    wire = sum(sum(r.get("wire_bytes", {}).values()) for r in steps)
    fallbacks = sum(sum(r.get("fallbacks", {}).values()) for r in steps)
    speed = [r["tokens_per_s"] for r in steps[1:] if "tokens_per_s" in r]  # step 0 compiles
    sampled = [r for r in steps if "grad_rel_err" in r]
    row = {
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
        "grad_rel_err": _mean([r["grad_rel_err"] for r in sampled]),
        "grad_cos": _mean([r["grad_cos"] for r in sampled]),
    }
    comparable = baseline is not None and baseline["steps"] == row["steps"]
    for key in ("final_loss", "final_val_loss"):
        base = baseline[key] if comparable else float("nan")
        row[f"{key}_gap_pct"] = 100 * (row[key] - base) / base
    return row


def _mean(values) -> float:
    return float(np.mean(values)) if values else float("nan")


def baseline_of(runs: list[dict]) -> dict | None:
    """The run whose policy is ``none`` (the first, if several), or None."""
    return next((r for r in runs if r["config"].get("compression") == "none"), None)


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
    "grad_rel_err",
    "grad_cos",
    "final_loss_gap_pct",
    "final_val_loss_gap_pct",
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
    paths.append(plot_fidelity(runs, out_dir, plt))
    return paths


def plot_fidelity(runs: list[dict], out_dir: str, plt, window: int = 10) -> str:
    """fidelity.png: the sampled relative error of the compressed gradients per run, and each
    run's training loss gap to the `none` run at the same steps (a running mean over `window`
    steps, fewer for short runs; in percent)."""
    base = baseline_of(runs)
    base_loss = {r["step"]: r["loss"] for r in base["steps"] if "loss" in r} if base else {}
    fig, (err_ax, gap_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    for run in runs:
        sampled = [r for r in run["steps"] if "grad_rel_err" in r]
        if sampled:
            xs = [r["step"] for r in sampled]
            err_ax.plot(xs, [r["grad_rel_err"] for r in sampled], ".-", label=run["name"])
        both = [r for r in run["steps"] if "loss" in r and r["step"] in base_loss]
        if run is not base and both:
            gap = [100 * (r["loss"] - base_loss[r["step"]]) / base_loss[r["step"]] for r in both]
            width = max(1, min(window, len(gap) // 2))  # short runs still get a curve
            smooth = np.convolve(gap, np.ones(width) / width, mode="valid")
            gap_ax.plot(
                [r["step"] for r in both][len(gap) - len(smooth) :],
                smooth,
                label=run["name"],
                linewidth=1.2,
            )
    err_ax.set(xlabel="step", ylabel="||g - exact|| / ||exact||", title="gradient reduction error")
    if err_ax.has_data():
        err_ax.set_yscale("log")
        err_ax.legend()
    gap_ax.set(
        xlabel="step",
        ylabel="% vs none",
        title="training loss gap to none (running mean)" if base else "no `none` run to compare",
    )
    if gap_ax.has_data():
        gap_ax.axhline(0.0, color="gray", linewidth=0.8)
        gap_ax.legend()
    for ax in (err_ax, gap_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "fidelity.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(run_dirs: list[str], out_dir: str) -> str:
    """Write report.md and the plots into `out_dir`; return the markdown table."""
    runs = [load_run(d) for d in run_dirs]
    os.makedirs(out_dir, exist_ok=True)
    base = baseline_of(runs)
    baseline = summarize(base) if base else None
    table = markdown([summarize(r, baseline=baseline) for r in runs])
    plots = plot(runs, out_dir)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("# jaxhc runs\n\n" + table + "\n\n")
        f.writelines(f"![{os.path.basename(p)}]({os.path.basename(p)})\n" for p in plots)
    return table
