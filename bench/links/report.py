"""The links benchmark's outputs: JSON (with the command and machine), a markdown table, a PNG.

python -m bench.links report bench/results/links_mpi_unfused.json   # redo the .md and .png
python -m bench.links report bench/results/train_links.json      # (training's: train_report.py)
python -m bench.links compare before.json after.json              # before / after, per cell
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .._common import fmt, markdown_table, write_json
from .rates import parse_rate

CODEC_ORDER = ("lax", "lax-allreduce", "bf16-cast", "none", "zfp:8", "zfp:16", "mpc", "mpc:0.8")
COLLECTIVE_ORDER = ("psum", "all_gather", "psum_scatter", "ppermute", "all_to_all")


def label(codec: str) -> str:
    return "plain" if codec == "lax" else codec


def cores_note() -> str:
    n = len(os.sched_getaffinity(0))
    return (
        f"The hosts are network namespaces of one machine and share its {n} CPU cores: CPU-bound "
        "codecs run slower per rank here than on real hosts (each with its own cores)."
    )


def _key(r: dict) -> tuple:
    return (
        _index(COLLECTIVE_ORDER, r["collective"]),
        r["parts"],
        r["bytes_per_rank"],
        parse_rate(r["link_rate"]) or float("inf"),
        _index(CODEC_ORDER, r["codec"]),
    )


def _index(order, v) -> int:
    return order.index(v) if v in order else len(order)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"


def _case(r: dict) -> tuple:
    return r["collective"], r["parts"], r["bytes_per_rank"], r["link_rate"]


def _ms(s) -> str:
    return fmt(s * 1e3 if s is not None else None, "{:.0f}")


def tables(doc: dict) -> str:
    """Markdown: median ms per codec beside the ring bound, then every number."""
    results = sorted(doc["results"], key=_key)
    codecs = sorted({r["codec"] for r in results}, key=lambda c: _index(CODEC_ORDER, c))
    cases: dict = {}
    for r in results:
        cases.setdefault(_case(r), {})[r["codec"]] = r
    plain = {case: by.get("lax") for case, by in cases.items()}

    pivot_cols = ["collective", "P", "size/rank", "link", "TCP Mbit/s", "ring ms"]
    pivot_cols += [label(c) for c in codecs]
    pivot = []
    for case, by in cases.items():
        first = next(iter(by.values()))
        cells = []
        for c in codecs:
            r, base = by.get(c), plain[case]
            speedup = base["median_s"] / r["median_s"] if r and base and c != "lax" else None
            gain = f" ({speedup:.2f}x)" if speedup else ""
            cells.append(_ms(r["median_s"]) + gain if r else "")
        ring = first["ring_bound_s"]
        tcp = first.get("tcp_bits_per_s")
        pivot.append(
            [*case[:2], _size(case[2]), case[3], fmt(tcp / 1e6 if tcp else None, "{:.0f}")]
            + [_ms(ring), *cells]
        )

    full_cols = ["collective", "P", "size/rank", "link", "codec", "ms median", "ms best"]
    full_cols += ["ring ms", "cpu ms", "raw MiB", "wire MiB", "raw/wire", "fallbacks"]
    full = []
    for r in results:
        raw, wire = r["raw_bytes"], r["wire_bytes"]
        full.append(
            [r["collective"], r["parts"], _size(r["bytes_per_rank"]), r["link_rate"]]
            + [label(r["codec"]), _ms(r["median_s"]), _ms(r["s"]), _ms(r["ring_bound_s"])]
            + [_ms(r["cpu_s"]), fmt(raw / 2**20, "{:.1f}"), fmt(wire / 2**20, "{:.1f}")]
            + [fmt(raw / wire if wire else None), f"{r['fallbacks']:g}"]
        )
    note = (
        "Per rank and call. ms median / best over the repeats (of the ranks, the slowest); "
        "(Nx): plain's median / this codec's. ring ms: raw bytes x 8 / link rate, what a plain "
        "ring collective needs (psum 2(P-1)/P x bytes). cpu ms: process CPU time of one call "
        "(least over the calls, largest rank), MPI's polling while waiting included. "
        "TCP Mbit/s: one stream measured through the link just before the run."
    )
    runs = [
        [r["hosts"], r["link_rate"], fmt(r["tcp_bits_per_s"] / 1e6, "{:.0f}")]
        + [fmt(r["machine"][f"load_average_at_{at}"][0]) for at in ("start", "end")]
        for r in doc.get("runs", [])
    ]
    run_cols = ["P", "link", "TCP Mbit/s", "load at start", "load at end"]
    xla = doc.get("sweep", {}).get("transport", "mpi") == "xla"
    launched = "jax.distributed job" if xla else "mpirun"
    return "\n\n".join(
        [
            "### Median ms per call, per codec (speed-up over plain)",
            markdown_table(pivot_cols, pivot),
            "### Every number",
            markdown_table(full_cols, full),
            note,
            f"### Runs (one {launched} each; 1-minute load average of the machine)",
            markdown_table(run_cols, runs),
        ]
    )


def compare(before: str, after: list[str]) -> str:
    """Markdown: each (collective, P, size, link, codec) measured in `before` and in `after`
    (several later runs: the last one that has a cell wins it), median ms and the speed-up."""
    cells: list[dict] = [{}, {}]
    for i, paths in enumerate(([before], after)):
        for path in paths:
            with open(path) as f:
                for r in json.load(f)["results"]:
                    cells[i][(*_case(r), r["codec"])] = r
    cols = ["collective", "P", "size/rank", "link", "codec", "before ms", "after ms", "speed-up"]
    rows = []
    for key in sorted(set(cells[0]) & set(cells[1]), key=lambda k: _key(cells[1][k])):
        old, new = cells[0][key]["median_s"], cells[1][key]["median_s"]
        rows.append(
            [*key[:2], _size(key[2]), key[3], label(key[4]), _ms(old), _ms(new)]
            + [f"{old / new:.2f}x"]
        )
    return markdown_table(cols, rows)


def plot(doc: dict, path: str) -> None:
    """Median time vs link rate, one line per codec; a panel per (collective, P, size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = sorted(doc["results"], key=_key)
    rates = sorted({r["link_rate"] for r in results}, key=lambda v: parse_rate(v) or float("inf"))
    panels = list(dict.fromkeys(_case(r)[:3] for r in results))  # in _key's order
    codecs = sorted({r["codec"] for r in results}, key=lambda c: _index(CODEC_ORDER, c))
    ncol = min(4, len(panels))
    nrow = -(-len(panels) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow), squeeze=False)
    for ax, (coll, parts, nbytes) in zip(axes.flat, panels, strict=False):
        mine = [r for r in results if _case(r)[:3] == (coll, parts, nbytes)]
        x = {id(r): rates.index(r["link_rate"]) for r in mine}
        for c in codecs:
            pts = [(x[id(r)], r["median_s"] * 1e3) for r in mine if r["codec"] == c]
            if pts:
                ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=label(c))
        ring = sorted({(x[id(r)], r["ring_bound_s"] * 1e3) for r in mine if r["ring_bound_s"]})
        if ring:
            ax.plot(*zip(*ring, strict=True), "k--", marker="_", ms=14, lw=1, label="ring bound")
        ax.set_title(f"{coll}, P={parts}, {_size(nbytes)}/rank", fontsize=10)
        ax.set_xticks(range(len(rates)), rates)
        ax.set_yscale("log")
        ax.set_ylabel("ms per call (median)")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(
        "jaxhc collectives across shaped links\n(namespace hosts sharing one machine's cores)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: str, doc: dict) -> None:
    """`out` (JSON, with this command and machine), and beside it the markdown and the PNG."""
    write_json(out, {**doc, "cores_note": cores_note()})
    with open(out) as f:
        _markdown_and_plot(out, json.load(f))


def rewrite(path: str) -> None:
    """Redo the .md and .png beside a links JSON (the collectives', or training's: then
    bench/links/train_report.py) from its numbers."""
    with open(path) as f:
        doc = json.load(f)
    if "results" not in doc and "runs" in doc:
        from . import train_report

        train_report.rewrite(path)
        return
    _markdown_and_plot(path, doc)


def _markdown_and_plot(path: str, doc: dict) -> None:
    stem = Path(path).with_suffix("")
    m = doc["machine"]
    head = [
        "# jaxhc collectives across shaped links",
        f"Command: `{doc['command']}`",
        f"Machine: {m['cpu']}, {m['cores']} cores, load average {m['load_average_at_start'][0]:.2f}"
        f" at the start, {m['load_average_at_end'][0]:.2f} at the end; git {m['git']}.",
        doc.get("cores_note", cores_note()),
    ]
    Path(f"{stem}.md").write_text("\n\n".join([*head, tables(doc)]) + "\n")
    plot(doc, f"{stem}.png")
