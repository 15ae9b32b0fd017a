"""Benchmark helpers: timing, machine facts, JSON output, tables."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import jax


def timeit(fn, *args, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall seconds of `fn(*args)` (blocked until ready) after `warmup` calls."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine() -> dict:
    return {
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "devices": [str(d) for d in jax.devices()][:8],
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    payload = {"command": " ".join(sys.argv), "machine": machine(), **payload}
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {path}")


def print_table(title: str, columns: list[str], rows: list[list]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(" | ".join(columns))
        for r in rows:
            print(" | ".join(str(v) for v in r))
        return
    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*[str(v) for v in r])
    Console(width=200).print(table)


def markdown_table(columns: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
