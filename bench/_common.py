"""Shared by the benchmark scripts: machine facts, timing, JSON output, tables (rich and markdown).

The scripts import it as `_common` (Python puts the script's folder, bench/, first on sys.path).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

import jax
import numpy as np

_LOAD_AT_START = os.getloadavg()
PACKAGES = ("jax", "jaxlib", "numpy", "zfpy", "mpi4py", "mpi4jax", "jaxhc")


# --- machine ---------------------------------------------------------------------------------


def machine() -> dict:
    """What the numbers depend on: CPU, cores, load, devices, package versions, git commit."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average_at_start": _LOAD_AT_START,
        "load_average_at_end": os.getloadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "devices": f"{len(jax.devices())} x {jax.devices()[0].device_kind}",
        "versions": versions,
        "git": _git_commit(),
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


def _git_commit() -> str | None:
    """HEAD of the checkout these scripts live in, "+dirty" when tracked files have changes."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        run = lambda *a: subprocess.run(  # noqa: E731
            ["git", "-C", here, *a], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = run("status", "--porcelain", "--untracked-files=no")  # new results: not code
        return run("rev-parse", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def command_line() -> str:
    """The command that ran this script (with `mpirun -np N` in front under Open MPI)."""
    cmd = shlex.join([os.path.relpath(sys.executable), *sys.orig_argv[1:]])
    size = os.environ.get("OMPI_COMM_WORLD_SIZE")
    return f"mpirun -np {size} {cmd}" if size else cmd


# --- timing ----------------------------------------------------------------------------------


def timings(fn, repeats: int, *, warmup: int = 1, before=None, calls: int = 1) -> dict:
    """Seconds of `fn()` (which returns what to wait for), after `warmup` calls.

    Returns the best ("s") and the median ("median_s") wall time over `repeats` samples, and the
    least process CPU time ("cpu_s", all threads: less sensitive to other jobs on the machine).
    `before` (e.g. an MPI barrier) runs before each timed sample, outside the timing. A sample is
    `calls` calls dispatched back to back and waited for once, per call: on an accelerator, where
    a call takes less than its dispatch, they queue on the device and the dispatch is hidden.
    """
    for _ in range(warmup):
        jax.block_until_ready(fn())
    wall, cpu = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        t, c = time.perf_counter(), time.process_time()
        for _ in range(calls - 1):
            fn()
        jax.block_until_ready(fn())
        wall.append((time.perf_counter() - t) / calls)
        cpu.append((time.process_time() - c) / calls)
    return {"s": min(wall), "median_s": statistics.median(wall), "cpu_s": min(cpu)}


def time_codec(codec, x: jax.Array, repeats: int, *, calls: int = 1) -> dict:
    """Encode and decode `timings` of a jaxhc codec through the FFI inside `jit` (`calls` per
    sample), and its ratio.

    ratio = raw bytes / bytes the payload really uses (`Encoded.nbytes`: for MPC the compressed
    size of this data, not its static payload size). Checks that decoding gives the input back
    (bit for bit for a lossless codec, the same shape and dtype for a lossy one). When the data
    does not fit a budgeted payload ("fits" false), there is no decode to time ("decode" None).
    """
    encode = jax.jit(lambda v: codec.encode(v))
    decode = jax.jit(lambda p: codec.decode(p, x.shape, x.dtype))
    enc = jax.block_until_ready(encode(x))
    out = {
        "encode": timings(lambda: encode(x).payload, repeats, calls=calls),
        "decode": None,  # a payload over its budget (ok false) must not be decoded
        "ratio": x.nbytes / int(enc.nbytes),
        "payload_bytes": int(enc.payload.nbytes),
        "fits": bool(enc.ok),
    }
    if out["fits"]:
        y = decode(enc.payload)
        if y.shape != x.shape or y.dtype != x.dtype:
            raise AssertionError(
                f"{codec.spec}: decoded {y.dtype}{y.shape} from {x.dtype}{x.shape}"
            )
        if codec.lossless and np.asarray(x).tobytes() != np.asarray(y).tobytes():
            raise AssertionError(f"{codec.spec}: the round trip is not bit-exact")
        out["decode"] = timings(lambda: decode(enc.payload), repeats, calls=calls)
    return out


def gbps(nbytes: float, seconds: float | None) -> float | None:
    return nbytes / seconds / 1e9 if seconds else None


# --- output ----------------------------------------------------------------------------------


def write_json(path: str, payload: dict) -> None:
    """Write `payload` to `path` with the command line and the machine facts in front."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    doc = {"command": command_line(), "machine": machine(), **payload}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")


def fmt(v, spec: str = "{:.2f}") -> str:
    """A number for a table cell ("n/a" for None)."""
    return "n/a" if v is None else spec.format(v)


def _numeric(cell: str) -> bool:
    try:
        float(cell.rstrip("x%"))
        return True
    except ValueError:
        return cell in ("", "n/a", "-")


def print_table(title: str, columns: list[str], rows: list[list], notes=()) -> None:
    """Print with rich, on a console wide enough that no cell wraps; `notes` go under the table.

    Columns whose cells are all numbers are right-aligned, the others (labels) left-aligned.
    """
    from rich.console import Console
    from rich.table import Table

    cells = [[str(v) for v in r] for r in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        right = all(_numeric(r[i]) for r in cells)
        table.add_column(c, justify="right" if right else "left", no_wrap=True, min_width=widths[i])
    for r in cells:
        table.add_row(*r)
    width = max(sum(w + 3 for w in widths) + 1, len(title), *(len(n) + 2 for n in notes))
    # Under mpirun a rank's stdout is a pseudo-terminal even when the job's output is a file.
    plain = "OMPI_COMM_WORLD_SIZE" in os.environ or not sys.stdout.isatty()
    console = Console(width=width, soft_wrap=True, force_terminal=False if plain else None)
    console.print(table)
    for note in notes:
        console.print(f"  {note}", highlight=False, markup=False)
    console.print()


def markdown_table(columns: list[str], rows: list[list], notes=()) -> str:
    """The same table as markdown (for the README), notes as lines under it."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for r in rows]
    return "\n".join([*lines, *(["", *notes] if notes else [])])
