"""The training-across-links outputs: a markdown table and a PNG from the JSON `train.run` writes.

Rows are jaxhc's policies and PyTorch DDP's hooks per (P, link rate); tokens/s is compared with
the baselines of the same P and rate that the run has (jaxhc none, DDP none, DDP fp16). A DDP
hook that failed is a row with its error line.
"""

from __future__ import annotations

import json
from pathlib import Path

from .._common import fmt, markdown_table
from .rates import parse_rate
from .report import cores_note

__all__ = ["BASELINES", "markdown", "plot", "rewrite", "write"]

BASELINES = ("jaxhc none", "DDP none", "DDP fp16")


def _groups(runs: list[dict]) -> list[tuple[int, str]]:
    keys = {(r["hosts"], r["rate"]) for r in runs}
    return sorted(keys, key=lambda k: (k[0], parse_rate(k[1]) or float("inf")))


def _ok(r: dict) -> bool:
    return "failed" not in r


def _rows(result: dict) -> list[dict]:
    """The runs, those of files written before the peer (jaxhc rows without a label, one rate)
    given the fields of today's."""
    out = []
    for r in result["runs"]:
        if "system" not in r:
            r = {"system": "jaxhc", "label": f"jaxhc {r['policy']}", "rate": result["rate"], **r}
        out.append(r)
    return out


def table(result: dict) -> str:
    """Markdown: one row per run, tokens/s against each baseline the run has."""
    runs = _rows(result)
    bases = [b for b in BASELINES if any(r["label"] == b and _ok(r) for r in runs)]
    cols = ["P", "link", "run", "s/step (median)", "tokens/s", *(f"vs {b}" for b in bases)]
    cols += ["final loss", "val loss", "wire MB/step"]
    rows = []
    for hosts, rate in _groups(runs):
        mine = [r for r in runs if (r["hosts"], r["rate"]) == (hosts, rate)]
        base = {r["label"]: r for r in mine if _ok(r) and r["label"] in bases}
        for r in mine:
            if not _ok(r):
                rows.append(
                    [hosts, rate, r["label"], f"failed: {r['failed']}"] + [""] * (len(cols) - 4)
                )
                continue
            speed = [
                fmt(r["tokens_per_s"] / base[b]["tokens_per_s"] if b in base else None, "{:.2f}x")
                for b in bases
            ]
            wire = sum(r["wire_bytes_per_step"].values()) / 1e6
            mark = "*" if r["system"] == "pytorch-ddp" else ""
            rows.append(
                [hosts, rate, r["label"], f"{r['median_step_s']:.3f}", f"{r['tokens_per_s']:.0f}"]
                + speed
                + [fmt(r["final_loss"], "{:.4f}"), fmt(r["val_loss"], "{:.4f}")]
                + [f"{wire:.1f}{mark}"]
            )
    notes = [
        f"Median seconds per step after the first {result['skip_steps']} (which compile); "
        "tokens/s from the same steps; vs X: tokens/s over X's at the same P and link. "
        "jaxhc's wire bytes are counted by its collectives (per rank and step, the last step)."
    ]
    if "peer" in result:
        notes.append(f"\\* DDP's wire MB: {result['peer']['wire_bytes']}.")
    return markdown_table(cols, rows, notes)


def markdown(result: dict) -> str:
    """The whole page: what ran, on what, and the table."""
    peer = result.get("peer")
    title = "jaxhc training across shaped links" + (" beside PyTorch DDP" if peer else "")
    steps = sorted({r["steps"] for r in _rows(result) if _ok(r)})
    over = f" with {' '.join(result['overrides'])}" if result.get("overrides") else ""
    head = [
        f"# {title}",
        f"Command: `{result['command']}`",
        f"Experiment: `{result['config']}`{over}, {'/'.join(map(str, steps))} steps, one rank "
        f"per host, data parallelism over the P hosts; jaxhc over its {result['transport']} "
        "transport.",
    ]
    m = result.get("machine")
    if m:
        head.append(
            f"Machine: {m['cpu']}, {m['cores']} cores; git {m['git']}. "
            + result.get("cores_note", cores_note())
        )
    if peer:
        meta = next((r["peer"] for r in result["runs"] if "peer" in r), {})
        versions = ", ".join(f"{k} {meta[k]}" for k in ("torch", "transformers") if k in meta)
        head.append(
            f"Peer: {peer['system']}{f' ({versions})' if versions else ''}, the same model shape, "
            "initial parameters, token batches, AdamW, clipping and learning-rate schedule; "
            f"{peer['threads']} torch threads per rank ({peer['threads_note']}). PowerSGD: "
            + ", ".join(f"{k} {v}" for k, v in peer["powersgd"].items())
            + "."
        )
    return "\n\n".join([*head, table(result)]) + "\n"


def plot(result: dict, path: Path) -> None:
    """Tokens/s and validation loss per run, bars grouped by (P, link rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in _rows(result) if _ok(r)]
    groups = _groups(runs)
    labels = list(dict.fromkeys(r["label"] for r in runs))
    fig, axes = plt.subplots(1, 2, figsize=(max(11, 1.1 * len(labels) * len(groups) + 3), 4.2))
    width = 0.8 / max(1, len(groups))
    for i, (hosts, rate) in enumerate(groups):
        got = {r["label"]: r for r in runs if (r["hosts"], r["rate"]) == (hosts, rate)}
        xs = [j + i * width for j, name in enumerate(labels) if name in got]
        mine = [got[name] for name in labels if name in got]
        name = f"P = {hosts}, {rate}"
        axes[0].bar(xs, [r["tokens_per_s"] for r in mine], width, label=name)
        axes[1].bar(xs, [r["val_loss"] or 0.0 for r in mine], width, label=name)
    ticks = [j + width * (len(groups) - 1) / 2 for j in range(len(labels))]
    for ax, title in zip(axes, ("tokens/s", "validation loss"), strict=True):
        ax.set_xticks(ticks, labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(title)
        if groups:
            ax.legend(fontsize=8)
    losses = [r["val_loss"] for r in runs if r["val_loss"]]
    if losses:
        axes[1].set_ylim(min(losses) * 0.95, max(losses) * 1.02)
    fig.suptitle("Training across shaped links (namespace hosts sharing one machine's cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(out: str, result: dict) -> None:
    """`out` (JSON), and beside it the markdown and the PNG."""
    result = {**result, "cores_note": result.get("cores_note", cores_note())}
    result["markdown"] = markdown(result)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    Path(out).with_suffix(".md").write_text(result["markdown"])
    plot(result, Path(out).with_suffix(".png"))


def rewrite(path: str) -> None:
    """Redo the markdown and PNG beside a training JSON from its numbers."""
    with open(path) as f:
        result = json.load(f)
    Path(path).with_suffix(".md").write_text(markdown(result))
    plot(result, Path(path).with_suffix(".png"))
